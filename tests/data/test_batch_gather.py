"""The reader's batch path: rows read as runs of nearby windows (one pread per run and shard) and
placed by one numpy assignment give exactly the stream's slices, in the caller's order, for any
shard layout; sample ids computed a block of steps ahead are the ids of each step alone."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.data.permutation import IndexPermutation
from prep.data.pread import GAP_BYTES, TokenFile, fill, plan_rows, read_pieces
from prep.data.reader import Reader
from tests.snapshot_factory import pulled_bin_snapshot

DTYPE = np.dtype("<u2")


def read_rows(shards: list[np.ndarray], starts: np.ndarray, length: int, out_dtype: Any) -> tuple[np.ndarray, int]:
    """Rows of `length` tokens at `starts` of the shards' stream through plan_rows, read_pieces and
    fill (the shards written as files first), and how many preads that took."""
    token_starts = np.concatenate(([0], np.cumsum([len(s) for s in shards]))).astype(np.int64)
    with tempfile.TemporaryDirectory() as folder:
        files = {}
        for index, tokens in enumerate(shards):
            path = Path(folder) / f"{index}.bin"
            path.write_bytes(tokens.astype(DTYPE).tobytes())
            files[index] = TokenFile(os.open(path, os.O_RDONLY), path, path.stat().st_size)
        reads = plan_rows(token_starts, starts, length, DTYPE.itemsize)
        out = np.empty((len(starts), length), dtype=out_dtype)
        fill(out, reads, read_pieces(files, reads.pieces), DTYPE)
        for file in files.values():
            file.close()
    return out, len(reads.pieces.shards)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), sizes=st.lists(st.integers(0, 400), min_size=1, max_size=5),
       length=st.integers(1, 64), spread=st.sampled_from([1, 8, 2000]))
def test_rows_are_the_streams_slices_in_the_callers_order(data: st.DataObject, sizes: list[int], length: int,
                                                          spread: int) -> None:
    """Any shard layout (empty shards too), rows crossing shards, overlapping, repeated, nearby or
    far apart (`spread`: the gap between neighbours' starts, at most), in any order."""
    total = sum(sizes)
    if total < length:
        sizes, total = [*sizes, length], total + length
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    shards = [rng.integers(0, 65536, size=n, dtype=np.int64) for n in sizes]
    stream = np.concatenate(shards)
    count = data.draw(st.integers(0, 40))
    starts = np.minimum(np.cumsum(rng.integers(0, spread + 1, size=count)), total - length)
    rng.shuffle(starts)
    for out_dtype in (np.int64, DTYPE):
        got, _ = read_rows(shards, starts.astype(np.int64), length, out_dtype)
        expected = np.asarray([stream[s:s + length] for s in starts.tolist()], dtype=out_dtype).reshape(count, length)
        assert got.dtype == out_dtype and (got == expected).all()


def test_nearby_rows_are_one_read_and_rows_a_gap_apart_are_two() -> None:
    """Rows closer than GAP_BYTES are read by one pread (a run); further apart, one each."""
    stream = np.arange(40_000, dtype=np.int64) % 65536
    length, near, far = 16, 16 + GAP_BYTES // DTYPE.itemsize, 17 + GAP_BYTES // DTYPE.itemsize
    for step, reads in ((near, 1), (far, 3)):
        starts = np.asarray([2 * step, 0, step], dtype=np.int64)
        got, preads = read_rows([stream], starts, length, np.int64)
        assert preads == reads
        assert (got == np.stack([stream[s:s + length] for s in starts.tolist()])).all()


def test_a_row_outside_the_stream_is_an_index_error() -> None:
    token_starts = np.asarray([0, 10, 20], dtype=np.int64)
    for starts in ([-1], [5, 15]):
        with pytest.raises(IndexError, match="tokens outside 0..20"):
            plan_rows(token_starts, np.asarray(starts, dtype=np.int64), 6, 2)


@pytest.fixture(scope="module")
def dest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pulled four-shard snapshot (bin only, 40,000 tokens)."""
    return pulled_bin_snapshot(tmp_path_factory.mktemp("batch-gather"))


def stream_of(dest: Path) -> np.ndarray:
    """The snapshot's token stream, read straight from its files."""
    return np.concatenate([np.fromfile(dest / "bin" / f"{shard:05d}.bin", dtype=DTYPE) for shard in range(4)])


def test_a_dense_batch_reads_runs_not_rows(dest: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: every row was its own pread; 64 windows over 40,000 tokens lie mostly within a
    page of each other, so a batch now takes a pread per run (and shard), with the same rows."""
    reader = Reader(dest, seq_len=16, global_batch_size=64)
    calls: list[int] = []
    real = os.pread

    def counting(fd: int, size: int, offset: int) -> bytes:
        calls.append(size)
        return real(fd, size, offset)

    monkeypatch.setattr(os, "pread", counting)  # read_pieces looks os.pread up at each call
    batch = reader.batch(0)
    stream = stream_of(dest)
    ids = [i for _, _, i in reader.sample_ids(0, 64)]
    assert (batch == np.stack([stream[i * 16:i * 16 + 17] for i in ids]).astype(np.int64)).all()
    assert len(calls) <= 16, f"{len(calls)} preads for 64 rows"


@pytest.mark.parametrize("stride", [1, 3])
def test_samples_computed_a_block_ahead_are_each_steps_own(dest: Path, monkeypatch: pytest.MonkeyPatch,
                                                           stride: int) -> None:
    """Regression: every batch computed its sample ids alone (a permutation call or more per step,
    most of a small batch's time). Steps read in order (or every `stride`-th, as a DataLoader worker
    reads them) now compute them in growing blocks; the rows are those of each step read alone,
    across epochs too, and a jump back reads right."""
    calls: list[int] = []
    real = IndexPermutation.__call__

    def counting(self: IndexPermutation, indices: np.ndarray) -> np.ndarray:
        calls.append(len(indices))
        return real(self, indices)

    monkeypatch.setattr(IndexPermutation, "__call__", counting)
    reader = Reader(dest, seq_len=16, global_batch_size=8, rank=1, world_size=2, seed=5)
    steps = [*range(0, 600 * stride, stride), 7, 8, 9]  # 600 steps of 4 rows cross an epoch of 2,499 samples
    batches = [reader.batch(step) for step in steps]
    assert len(calls) <= 30, f"{len(calls)} permutation calls for {len(steps)} steps"
    for step, batch in zip(steps[::37] + steps[-3:], batches[::37] + batches[-3:]):
        alone = Reader(dest, seq_len=16, global_batch_size=8, rank=1, world_size=2, seed=5)
        assert (alone.batch(step) == batch).all(), step
