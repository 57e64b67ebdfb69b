"""The keep mask: one definition (prep.workfiles.keepmask), bytes that round-trip, and every reader using it."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prep.errors import IntegrityError
from prep.history import lineage
from prep.workfiles import keepmask
from prep.workfiles.keepmask import MASK_HEADER_BYTES, keep_mask, mask_bytes_for, mask_count, pack_mask, unpack_mask

ROOT = Path(__file__).resolve().parents[2]
# Bit packing that is not the keep mask: Arrow validity bitmaps and the tokenizer's code point table.
OTHER_BIT_PACKING = {"prep/workfiles/columns.py", "prep/tokenizer/unicode.py"}


@settings(max_examples=200, deadline=None)
@given(bits=st.lists(st.booleans(), max_size=200))
def test_pack_then_unpack_gives_the_mask_back(bits: list[bool]) -> None:
    keep = np.array(bits, dtype=bool)
    data = pack_mask(keep)
    assert len(data) == MASK_HEADER_BYTES + mask_bytes_for(len(keep)) == 8 + (len(keep) + 7) // 8
    assert mask_count(data) == len(keep)
    back = unpack_mask(data)
    assert back.dtype == np.bool_ and back.tolist() == bits
    assert pack_mask(back) == data


def test_the_layout_is_pinned() -> None:
    """docs/manifests.md: u64 little-endian count, then packed flags, document 0 most significant, padding 0."""
    keep = np.array([True, False, False, False, False, False, False, True, True, True], dtype=bool)
    assert pack_mask(keep) == bytes([10, 0, 0, 0, 0, 0, 0, 0, 0b1000_0001, 0b1100_0000])
    assert pack_mask(np.zeros(0, dtype=bool)) == bytes(8)


@pytest.mark.parametrize("data", [b"", bytes(7), bytes([9]) + bytes(7) + b"\xff", bytes([1]) + bytes(7),
                                  bytes([1]) + bytes(7) + b"\x80\x00"])
def test_a_mask_of_the_wrong_size_is_refused(data: bytes) -> None:
    with pytest.raises(IntegrityError):
        unpack_mask(data)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bits=st.lists(st.booleans(), max_size=70))
def test_the_mapped_reader_agrees_with_unpack_mask(bits: list[bool], tmp_path: Path) -> None:
    path = tmp_path / "keep"
    path.write_bytes(pack_mask(np.array(bits, dtype=bool)))
    mapped = lineage.PackedMask(path)
    assert mapped.count == len(bits)
    assert mapped.slice(0, len(bits)).tolist() == unpack_mask(path.read_bytes()).tolist()


def test_keep_mask_keeps_the_first_copy() -> None:
    hashes = np.array([[1, 2], [3, 4], [1, 2], [5, 6], [3, 4]], dtype=np.uint64)
    assert keep_mask([hashes[:2], hashes[2:]], exact=True).tolist() == [True, True, False, True, False]
    assert keep_mask([hashes], exact=False).all()


def _bit_packing_modules() -> set[str]:
    found = set()
    for path in sorted((ROOT / "prep").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("packbits", "unpackbits"):
                found.add(path.relative_to(ROOT).as_posix())
    return found


def test_only_dedup_packs_or_unpacks_the_mask() -> None:
    assert _bit_packing_modules() - OTHER_BIT_PACKING == {"prep/workfiles/keepmask.py"}


def test_the_mapped_reader_uses_the_one_definition() -> None:
    for name in ("MASK_HEADER_BYTES", "mask_count", "mask_bytes_for", "unpack_flags"):
        assert vars(lineage)[name] is vars(keepmask)[name]
    tasks = ast.parse((ROOT / "prep/runner/tasks.py").read_text())
    imported = {alias.name for node in ast.walk(tasks) if isinstance(node, ast.ImportFrom)
                and node.module == "prep.workfiles.keepmask" for alias in node.names}
    assert not {"pack_mask", "unpack_mask"} & imported, "builds no longer write a mask (layout 2)"


