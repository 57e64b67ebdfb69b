"""An intermediate's texts read back by row: `read_text_sizes` gives each asked row's text size
from the span columns alone, the same as the length of what `read_texts` reads, in the order
asked, whatever the batches' key-order layout; a row the part does not hold is an IntegrityError."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.errors import IntegrityError
from prep.workfiles.intermediate import IntermediateWriter, read_text_sizes, read_texts


def write_part(path: Path, texts: list[bytes], batch: int, order_seed: int | None) -> None:
    """An intermediate of these texts (rows 0, 1, ...), `batch` documents a batch."""
    with IntermediateWriter(path, np.dtype(np.uint16), durable=False, order_seed=order_seed) as writer:
        for low in range(0, len(texts), batch):
            chunk = texts[low:low + batch]
            writer.write_batch(range(low, low + len(chunk)), [None] * len(chunk), chunk,
                               [hashlib.blake2b(text, digest_size=16).digest() for text in chunk],
                               [False] * len(chunk), [np.zeros(1, np.uint16)] * len(chunk))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=30), st.integers(1, 8),
       st.one_of(st.none(), st.integers(0, 2**32)), st.data())
def test_text_sizes_are_the_lengths_of_the_texts_read_in_the_order_asked(
        texts: list[bytes], batch: int, order_seed: int | None, data: st.DataObject) -> None:
    rows = np.array(data.draw(st.lists(st.integers(0, len(texts) - 1), max_size=40)), dtype=np.int64)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "part"
        write_part(path, texts, batch, order_seed)
        sizes = read_text_sizes(path, rows)
        assert read_texts(path, rows) == [texts[row] for row in rows.tolist()]
    assert sizes.tolist() == [len(texts[row]) for row in rows.tolist()]


def test_a_row_the_part_does_not_hold_is_an_integrity_error(tmp_path: Path) -> None:
    write_part(tmp_path / "part", [b"one", b"two"], 1, 3)
    with pytest.raises(IntegrityError, match="no document at some of rows"):
        read_text_sizes(tmp_path / "part", np.array([1, 2], dtype=np.int64))
