"""Deletion-request lists: the line syntax (id:/text:, blanks and comments), errors naming
FILE:LINE, and the packed table (sorted, distinct, no id in it)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prep.errors import InputError
from prep.inputs.exclusions import Entry, id_hash, load_exclusions, pack, parse_entry, read_entries, unpack
from tests.helpers import within

HASHES = st.binary(min_size=16, max_size=16).map(bytes.hex)
IDS = st.text(min_size=1, max_size=30).map(str.strip).filter(lambda text: bool(text) and "\n" not in text
                                                             and "\r" not in text)


def test_the_two_entry_kinds_comments_and_blanks() -> None:
    assert parse_entry("id:doc-1") == Entry("id", "doc-1")
    assert parse_entry("  id:a b:c  ") == Entry("id", "a b:c")  # an id keeps its inner spaces and colons
    assert parse_entry("text:" + "AB" * 16) == Entry("text", "ab" * 16)
    assert parse_entry("") is None and parse_entry("   ") is None and parse_entry("  # id:x") is None
    for bad, why in (("doc-1", "expected id:"), ("id:", "an empty id"), ("text:abc", "32 hex digits"),
                     ("text:" + "g" * 32, "32 hex digits"), ("sha256:" + "0" * 64, "expected id:")):
        with pytest.raises(ValueError, match=why):
            parse_entry(bad)


def test_errors_name_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "list.txt"
    path.write_bytes(b"id:a\n\n# c\nid:b\nplain\n")
    with pytest.raises(InputError, match=r"^removals\.txt:5: 'plain': expected id:"):
        read_entries(path, "removals.txt")
    path.write_bytes(b"id:a\nid:\xff\n")
    with pytest.raises(InputError, match=r"^removals\.txt:2: not UTF-8 text$"):
        read_entries(path, "removals.txt")
    with pytest.raises(InputError, match=r"^gone\.txt: cannot read the exclude list"):
        read_entries(tmp_path / "gone.txt", "gone.txt")


def test_a_fifo_named_as_a_list_is_refused_not_read_for_ever(tmp_path: Path) -> None:
    """Regression: the list was read with `read_bytes`, which blocks for ever on a FIFO."""
    os.mkfifo(tmp_path / "list.txt")
    with within(10), pytest.raises(InputError, match=r"^removals\.txt: cannot read the exclude list: not a regular file"):
        read_entries(tmp_path / "list.txt", "removals.txt")


def test_an_id_entry_needs_an_id_field(tmp_path: Path) -> None:
    (tmp_path / "list.txt").write_text("text:" + "0" * 32 + "\nid:x\n")
    with pytest.raises(InputError, match=r"^list\.txt:2: an id entry, but the pipeline names no input\.id_field"):
        load_exclusions(["list.txt"], tmp_path, has_ids=False)
    found = load_exclusions(["list.txt"], tmp_path, has_ids=True)
    assert found is not None and [(f.path, f.entries) for f in found.files] == [("list.txt", 2)]
    assert found.files[0].sha256 == hashlib.sha256((tmp_path / "list.txt").read_bytes()).hexdigest()
    assert load_exclusions([], tmp_path, has_ids=True) is None


@given(st.lists(IDS, max_size=20), st.lists(HASHES, max_size=20))
def test_the_table_holds_each_hash_once_sorted_and_no_id(ids: list[str], texts: list[str]) -> None:
    entries = [Entry("id", doc_id) for doc_id in ids] + [Entry("text", text) for text in texts]
    table = pack(entries + entries[:3])  # a repeat is one entry of the table
    id_column, text_column = unpack(table)
    held_ids = [bytes(id_column[at:at + 16]) for at in range(0, len(id_column), 16)]
    held_texts = [bytes(text_column[at:at + 16]) for at in range(0, len(text_column), 16)]
    assert held_ids == sorted({id_hash(doc_id) for doc_id in ids})
    assert held_texts == sorted({bytes.fromhex(text) for text in texts})
    assert not any(doc_id.encode() in table for doc_id in ids if len(doc_id.encode()) >= 8)
    for bad in (table[:-1], b"NOTATABL" + table[8:], b""):
        with pytest.raises(ValueError):
            unpack(bad)
