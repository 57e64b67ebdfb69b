"""Ids unique within a file across its parts: the same verdict and first repeat as a Python set,
in memory or spilled by id hash into partitions, and a spill that hits a full disk says so."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from prep.errors import InputError, StorageIOError
from prep.stages import idcheck
from prep.workfiles.intermediate import IntermediateWriter
from tests.runner.test_disk_full import fill_up, small_tmpfs


def _unique_ids_reference(source: str, parts: list[list[str | None]]) -> None:
    """The check as one Python set (what check_unique_ids did before it sorted rows)."""
    seen: set[str] = set()
    for doc_id in (doc_id for part in parts for doc_id in part):
        if doc_id is None:
            return
        if doc_id in seen:
            raise InputError(f"{source}: duplicate id {doc_id!r}")
        seen.add(doc_id)


def _parts(folder: Path, parts: list[list[str | None]], batch: int = 1 << 16) -> list[Path]:
    """Intermediates holding these ids, `batch` documents per metadata batch."""
    paths = []
    for index, ids in enumerate(parts):
        path = folder / f"{uuid.uuid4().hex}-{index}.part"
        with IntermediateWriter(path, np.dtype(np.uint16)) as writer:
            for low in range(0, len(ids), batch):
                chunk = ids[low:low + batch]
                writer.write_batch(list(range(low, low + len(chunk))), chunk, [b"t"] * len(chunk),
                                   [bytes(16)] * len(chunk), [False] * len(chunk), [np.zeros(1, np.uint16)] * len(chunk))
        paths.append(path)
    return paths


_ID = st.one_of(st.none(), st.sampled_from(["a", "a\0", "b", "ab", "é", "", "x" * 30, "a" * 8, "a" * 16]),
                st.text(max_size=12).filter(lambda t: not any("\ud800" <= c <= "\udfff" for c in t)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# A repeat in a batch whose longest id is shorter than its first occurrence's batch's (found by
# hypothesis: the partition hash mixed each batch's padding, so the two copies were never compared).
@example(parts=[["a", "a\x00", "x" * 30, "a", None]], per_partition=1, batch=3)
@given(parts=st.lists(st.lists(_ID, max_size=12), min_size=1, max_size=3),
       per_partition=st.sampled_from([1, 2, 5, idcheck.IDS_PER_PARTITION]), batch=st.sampled_from([1, 3, 1 << 16]))
def test_unique_ids_agree_with_a_python_set(tmp_path: Path, parts: list[list[str | None]], per_partition: int,
                                            batch: int) -> None:
    """Same verdict and the same first duplicate as a set, across parts, up to the first missing
    id, whether the ids are checked at once or spilled into partitions."""
    paths = _parts(tmp_path, parts, batch)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(idcheck, "IDS_PER_PARTITION", per_partition)
        try:
            _unique_ids_reference("f.jsonl", parts)
        except InputError as expected:
            with pytest.raises(InputError) as found:
                idcheck.check_unique_ids("f.jsonl", paths, tmp_path)
            assert str(found.value) == str(expected)
        else:
            idcheck.check_unique_ids("f.jsonl", paths, tmp_path)
    assert not list(tmp_path.glob("prep-idcheck-*")), "the spill folder is removed"


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The number of ids each in-memory check held."""
    sizes: list[int] = []
    real = idcheck._first_repeat

    def counting(positions: Any, lengths: Any, blob: bytes) -> Any:
        sizes.append(len(lengths))
        return real(positions, lengths, blob)

    monkeypatch.setattr(idcheck, "_first_repeat", counting)
    yield sizes


def test_a_large_file_is_checked_a_partition_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       held: list[int]) -> None:
    """4,000 ids with 500 per partition: eight partitions, none holding more than about its share,
    and a repeat that crosses parts and batches is still found, as the first one in file order."""
    monkeypatch.setattr(idcheck, "IDS_PER_PARTITION", 500)
    ids: list[str | None] = [f"doc-{i:06d}" for i in range(4000)]
    paths = _parts(tmp_path, [ids[:1500], ids[1500:]], batch=700)
    idcheck.check_unique_ids("big.jsonl", paths, tmp_path)
    assert len(held) == 8 and sum(held) == 4000 and max(held) < 2 * 500
    repeated = ids[:3000] + ["doc-000123"] + ids[3001:3500] + ["doc-000007"] + ids[3501:]
    paths = _parts(tmp_path, [repeated[:1500], repeated[1500:]], batch=700)
    with pytest.raises(InputError, match=r"^big\.jsonl: duplicate id 'doc-000123'$"):
        idcheck.check_unique_ids("big.jsonl", paths, tmp_path)


def test_a_spill_that_fills_the_disk_names_it_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(idcheck, "IDS_PER_PARTITION", 100)
    paths = _parts(tmp_path, [[f"an-id-long-enough-to-need-room-{i:08d}" for i in range(3000)]])
    with small_tmpfs(tmp_path / "spill", "256k") as spill:
        filler = fill_up(spill)
        filler.write_bytes(b"")  # room for the folder and a little, not for the ids
        (spill / "keep").write_bytes(bytes(200 * 1024))
        with pytest.raises(StorageIOError, match="spill/prep-idcheck-") as failed:
            idcheck.check_unique_ids("f.jsonl", paths, spill)
        assert failed.value.exit_code == 4
        assert sorted(path.name for path in spill.iterdir()) == ["filler", "keep"]
