"""Shared token rule: token arrays become little-endian fixed-width ids, never wrapped."""

from __future__ import annotations

import numpy as np
import pytest

from prep.formats import as_tokens, little_endian


def test_little_endian_normalises_byte_order_and_rejects_non_numbers() -> None:
    assert little_endian(">u2").str == "<u2"
    assert little_endian(np.uint8).str == "|u1"
    with pytest.raises(ValueError):
        little_endian("U5")


def test_as_tokens_converts_and_checks_range() -> None:
    converted = as_tokens([1, 2, 65_535], np.uint16)
    assert converted.dtype.str == "<u2" and converted.tolist() == [1, 2, 65_535]
    assert as_tokens([], np.int32).dtype.str == "<i4"
    assert as_tokens(np.array([5], dtype=">i4")).tobytes() == b"\x05\x00\x00\x00"
    with pytest.raises(ValueError, match="do not fit"):
        as_tokens([65_536], np.uint16)
    with pytest.raises(ValueError, match="do not fit"):
        as_tokens([-1], np.uint16)
    with pytest.raises(ValueError, match="integers"):
        as_tokens([1.5], np.int32)
    with pytest.raises(ValueError, match="1-D"):
        as_tokens([[1, 2]], np.int32)
