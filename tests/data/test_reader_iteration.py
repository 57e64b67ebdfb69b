"""What docs/data.md promises about iterating a Reader: it never ends by itself (epochs follow each
other, each in a new permutation), its batches are int64 rows of seq_len + 1 tokens, and only a
mixture source's max_epochs ends it."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from prep.data.reader import Reader
from prep.storage import LocalStore
from tests.snapshot_factory import build_snapshot

SEQ, GLOBAL = 16, 8


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`demo@latest`: 2,000 uint16 tokens, so 124 samples of seq_len 16 (15 batches of 8 per epoch)."""
    root = tmp_path_factory.mktemp("iteration")
    build_snapshot(LocalStore(root / "store"), root / "work", shard_sizes=(4_000,), formats=("bin",))
    return root / "store"


def test_iteration_goes_on_past_an_epoch_in_int64_batches(store: Path) -> None:
    with Reader("demo@latest", SEQ, GLOBAL, store=store) as reader:
        per_epoch = reader.sizes[0] // GLOBAL
        batches = list(itertools.islice(reader, 3 * per_epoch))
    assert len(batches) == 3 * per_epoch
    assert all(batch.dtype == np.int64 and batch.shape == (GLOBAL, SEQ + 1) for batch in batches)
    first, second = (np.concatenate(batches[k * per_epoch:(k + 1) * per_epoch]) for k in (0, 1))
    assert not np.array_equal(first, second)  # the next epoch is another permutation


def test_only_max_epochs_ends_the_iteration(store: Path, tmp_path: Path) -> None:
    mixture = tmp_path / "mix.toml"
    mixture.write_text('[[source]]\nsnapshot = "demo@latest"\nmax_epochs = 2\n')
    with Reader(mixture, SEQ, GLOBAL, store=store) as reader:
        assert sum(1 for _ in reader) == 2 * reader.sizes[0] // GLOBAL
