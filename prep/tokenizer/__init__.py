"""Tokenizer loading and the reference encoding.

The reference encoding of a document is `tokenizers`' `encode(text, add_special_tokens=False)`
with `encode_special_tokens` on, so text that spells a special token stays plain text.
Other backends (see `prep.tokenizer.backends`) must reproduce it exactly.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prep.errors import TokenizerError
from prep.machinecache import derived_bytes
from prep.regular import open_regular

if TYPE_CHECKING:  # both load in tenths of a second; the build driver needs neither
    import numpy as np
    from tokenizers import Tokenizer

UINT16_MAX_VOCAB = 65535
# Part of the cached description's key: bumped whenever load_tokenizer describes a file differently
# (2: vocab_size counts up to the largest id), so no worker's cache serves an older description.
DESCRIPTION_RULES = 2


@dataclass(frozen=True)
class TokenizerInfo:
    """What a snapshot records about its tokenizer."""

    sha256: str
    vocab_size: int
    eos: str
    eos_id: int
    dtype: str
    encode_special_tokens: bool
    special_tokens: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "sha256": self.sha256,
            "vocab_size": self.vocab_size,
            "eos": self.eos,
            "eos_id": self.eos_id,
            "dtype": self.dtype,
            "encode_special_tokens": self.encode_special_tokens,
        }


def token_dtype(vocab_size: int) -> np.dtype[np.generic]:
    """uint16 when every id fits (at most 65,535 ids), else int32 (Megatron has no uint32)."""
    import numpy as np

    return np.dtype(np.uint16) if vocab_size <= UINT16_MAX_VOCAB else np.dtype(np.int32)


class UnencodableDocument(TokenizerError):
    """The reference tokenizer fails on a document (an unknown character and no unk token, say)."""

    def __init__(self, source: str, reason: str, index: int, name: str | None = None) -> None:
        where = name if name is not None else f"{index} of the batch"
        super().__init__(f"{source}: the tokenizer cannot encode document {where}: {reason}")
        self.source, self.reason, self.index, self.name = source, reason, index, name

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.source, self.reason, self.index, self.name))

    def at(self, index: int, name: str | None = None) -> UnencodableDocument:
        """The same failure, of document `index` of an enclosing batch (or of the document `name`)."""
        return UnencodableDocument(self.source, self.reason, index, name)


def first_line(exc: BaseException) -> str:
    """An exception's first line of text, or its type's name (the libraries raise multi-line text)."""
    return next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


def id_space(tokenizer: Tokenizer) -> int:
    """How many ids the tokenizer can emit: one past its largest id (ids need not be contiguous)."""
    largest = max(tokenizer.get_vocab(with_added_tokens=True).values(), default=-1)
    return max(tokenizer.get_vocab_size(with_added_tokens=True), largest + 1)


def read_tokenizer_file(path: Path) -> bytes:
    """The bytes of a tokenizer file; TokenizerError for anything but a regular file (a FIFO
    would block the build forever, a device never end)."""
    try:
        fd = open_regular(path)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        raise TokenizerError(f"{path}: not a regular file; the tokenizer must be a file") from None
    with open(fd, "rb") as handle:
        return handle.read()


def load_tokenizer(path: Path, eos: str, encode_special_tokens: bool = True) -> tuple[Tokenizer, TokenizerInfo]:
    """Load a Hugging Face tokenizers JSON file and describe it."""
    from tokenizers import Tokenizer

    try:
        data = read_tokenizer_file(path)
    except FileNotFoundError:
        raise TokenizerError(f"{path}: tokenizer file not found") from None
    except OSError as exc:
        raise TokenizerError(f"{path}: cannot read tokenizer: {exc.strerror}") from None
    try:
        tokenizer = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as exc:  # tokenizers raises bare Exception subclasses
        raise TokenizerError(f"{path}: not a valid tokenizers file: {first_line(exc)}") from None
    dropout = getattr(tokenizer.model, "dropout", None)
    if dropout:  # the reference would skip random merges: other tokens on every run
        raise TokenizerError(f"{path}: model.dropout is {dropout:g}: BPE dropout makes the tokens random "
                             f"(set it to null)")
    eos_id = tokenizer.token_to_id(eos)
    if eos_id is None:
        raise TokenizerError(f"{path}: EOS token {eos!r} is not in the vocabulary")
    tokenizer.encode_special_tokens = encode_special_tokens
    vocab_size = id_space(tokenizer)
    specials = tuple(
        sorted(token.content for token in tokenizer.get_added_tokens_decoder().values() if token.special)
    )
    info = TokenizerInfo(
        sha256=hashlib.sha256(data).hexdigest(),
        vocab_size=vocab_size,
        eos=eos,
        eos_id=eos_id,
        dtype=token_dtype(vocab_size).name,
        encode_special_tokens=encode_special_tokens,
        special_tokens=specials,
    )
    return tokenizer, info


def describe_tokenizer(path: Path, eos: str, encode_special_tokens: bool = True) -> TokenizerInfo:
    """`load_tokenizer`'s TokenizerInfo alone, cached under the file's SHA-256 (parsing a large
    vocabulary takes tenths of a second; the build driver needs only this description)."""
    try:
        data = read_tokenizer_file(path)
    except OSError:
        return load_tokenizer(path, eos, encode_special_tokens)[1]  # which reports the error
    sha256 = hashlib.sha256(data).hexdigest()
    key = hashlib.sha256(json.dumps([sha256, eos, encode_special_tokens, DESCRIPTION_RULES]).encode()).hexdigest()

    def describe() -> bytes:
        info = load_tokenizer(path, eos, encode_special_tokens)[1]
        if info.sha256 != sha256:
            raise TokenizerError(f"{path}: tokenizer file changed while it was read")
        return json.dumps(dataclasses.asdict(info)).encode()

    try:
        fields = json.loads(derived_bytes(f"tokenizer-info/{key}.json", describe))
        return TokenizerInfo(**{**fields, "special_tokens": tuple(fields["special_tokens"])})
    except (ValueError, TypeError, KeyError):  # a damaged cache entry: describe afresh
        return load_tokenizer(path, eos, encode_special_tokens)[1]


def reference_encode_batch(tokenizer: Tokenizer, texts: list[str], dtype: np.dtype[np.generic]) -> list[np.ndarray]:
    """Encode texts with the reference settings; no special tokens are added."""
    import numpy as np

    encodings = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    return [np.asarray(encoding.ids, dtype=dtype) for encoding in encodings]


def contains_special(text: str, special_tokens: tuple[str, ...]) -> bool:
    """True when the text spells any special token literally."""
    return any(token in text for token in special_tokens)
