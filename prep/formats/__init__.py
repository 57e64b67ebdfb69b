"""Byte-reproducible shard formats: Megatron .bin/.idx (`megatron`) and WebDataset tar (`wds`).

This module holds the token-array rule both formats share: token ids become fixed-width
little-endian integers, never silently wrapped. (The dtype itself comes from
`prep.tokenizer.token_dtype`: uint16 up to 65,535 ids, else int32.)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy loads on first use: the build driver imports prep.formats.units, never numpy
    import numpy as np
    import numpy.typing as npt


def little_endian(dtype: npt.DTypeLike) -> np.dtype[Any]:
    """`dtype` with little-endian byte order, so written bytes do not depend on the host."""
    import numpy as np

    resolved = np.dtype(dtype)
    if resolved.kind not in "iuf" or resolved.shape or resolved.names is not None:
        raise ValueError(f"token dtype must be a plain integer or float type, got {resolved}")
    return resolved.newbyteorder("<") if resolved.itemsize > 1 else resolved


def as_tokens(tokens: npt.ArrayLike, dtype: npt.DTypeLike | None = None) -> npt.NDArray[Any]:
    """`tokens` as a C-contiguous 1-D little-endian array of `dtype` (default: its own dtype).

    Refuses ids that `dtype` cannot hold instead of letting them wrap around silently.
    """
    import numpy as np

    array = np.asarray(tokens)
    if array.ndim != 1:
        raise ValueError(f"tokens must be a 1-D array, got shape {array.shape}")
    if array.size == 0 and array.dtype == np.float64 and dtype is not None:
        array = array.astype(np.int64)  # np.asarray([]) is float64; an empty list is no float data
    target = little_endian(array.dtype if dtype is None else dtype)
    if array.dtype.kind == "f" and target.kind != "f":
        raise ValueError(f"tokens must be integers, got {array.dtype}")
    if array.size and target.kind in "iu" and not np.can_cast(array.dtype, target, "safe"):
        limits = np.iinfo(target)
        low, high = int(array.min()), int(array.max())
        if low < limits.min or high > limits.max:
            raise ValueError(f"token ids {low}..{high} do not fit in {target}")
    return np.ascontiguousarray(array, dtype=target)
