"""prep.data.Reader over real snapshots: windows are slices of the token stream, epochs are
permutations, resumption is exact on any world size, and the state names its content."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.data.permutation import IndexPermutation
from prep.data.reader import Reader
from prep.errors import ConfigError, IntegrityError, UsageError
from tests.helpers import make_records, run_prep, write_jsonl, write_pipeline

SEQ, GLOBAL = 16, 8


@pytest.fixture(scope="module")
def pulled(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> dict[str, Path]:
    """Two datasets built and pulled: `web` (several shards) and `code`."""
    root = tmp_path_factory.mktemp("reader")
    found: dict[str, Path] = {"root": root, "store": root / "store"}
    for name, count, seed in (("web", 300, 1), ("code", 120, 2)):
        write_jsonl(root / name / "corpus" / "a.jsonl", make_records(count, seed=seed, prefix=name))
        pipeline = write_pipeline(root / name, tokenizer_path, dataset=name, shard_size="2KB")
        run_prep("build", pipeline, "--store", found["store"], "--workers", "2")
        run_prep("pull", f"{name}@latest", root / f"{name}-dest", "--store", found["store"])
        found[name] = root / f"{name}-dest"
    return found


def stream(reader: Reader, source: int = 0) -> np.ndarray:
    src = reader.sources[source]
    return np.asarray(src.tokens(0, src.total_tokens), dtype=np.int64)


def test_windows_are_contiguous_slices_and_an_epoch_covers_every_sample_once(pulled: dict[str, Path]) -> None:
    reader = Reader(pulled["web"], seq_len=SEQ, global_batch_size=GLOBAL)
    tokens = stream(reader)
    samples = reader.sizes[0]
    seen = []
    steps = samples // GLOBAL
    for step in range(steps):
        batch = reader.batch(step)
        assert batch.shape == (GLOBAL, SEQ + 1) and batch.dtype == np.int64
        ids = [i for _, _, i in reader.sample_ids(step * GLOBAL, GLOBAL)]
        for row, sample in zip(batch, ids):
            assert (row == tokens[sample * SEQ:sample * SEQ + SEQ + 1]).all()
        seen.extend(ids)
    assert len(set(seen)) == len(seen) == steps * GLOBAL
    assert set(seen) <= set(range(samples))
    whole_epoch = reader.sample_ids(0, samples)
    assert sorted(i for _, _, i in whole_epoch) == list(range(samples)) and {e for _, e, _ in whole_epoch} == {0}
    assert reader.sample_ids(samples, 1)[0][1] == 1  # the next sample opens epoch 1


def test_resume_on_another_world_size_gives_the_same_rows(pulled: dict[str, Path]) -> None:
    """40 steps on 4 ranks, state saved at step 17, resumed on 2 and on 1 rank: row for row the
    uninterrupted run's batches."""
    readers = [Reader(pulled["web"], seq_len=SEQ, global_batch_size=GLOBAL, rank=r, world_size=4, seed=3)
               for r in range(4)]
    iterators = [iter(r) for r in readers]
    full = []
    state = None
    for step in range(40):
        full.append(np.concatenate([next(it) for it in iterators]))
        if step == 16:
            state = json.loads(json.dumps(readers[0].state_dict()))
    assert state is not None and state["samples"] == 17 * GLOBAL
    for world in (2, 1):
        resumed = [Reader(pulled["web"], seq_len=SEQ, global_batch_size=GLOBAL, rank=r, world_size=world, seed=3)
                   for r in range(world)]
        for reader in resumed:
            reader.load_state_dict(state)
        its = [iter(r) for r in resumed]
        for step in range(17, 40):
            assert (np.concatenate([next(it) for it in its]) == full[step]).all(), (world, step)


def test_a_state_over_other_data_or_settings_is_refused(pulled: dict[str, Path]) -> None:
    state = Reader(pulled["web"], seq_len=SEQ, global_batch_size=GLOBAL, seed=1).state_dict()
    mix = _mixture(pulled["root"], '[[source]]\nsnapshot = "web-dest"\nweight = 2\n')
    for other in (Reader(pulled["code"], seq_len=SEQ, global_batch_size=GLOBAL, seed=1),
                  Reader(mix, seq_len=SEQ, global_batch_size=GLOBAL, seed=1),
                  Reader(pulled["web"], seq_len=SEQ, global_batch_size=GLOBAL, seed=2),
                  Reader(pulled["web"], seq_len=SEQ + 1, global_batch_size=GLOBAL, seed=1),
                  Reader(pulled["web"], seq_len=SEQ, global_batch_size=GLOBAL * 2, seed=1)):
        with pytest.raises(UsageError, match="reader state is for"):
            other.load_state_dict(state)


@pytest.mark.parametrize(("settings", "needle"), [
    ({"seed": -1}, "seed must be an integer in [0, 2**64), got -1"),
    ({"seed": 2**64}, "seed must be an integer in [0, 2**64)"),
    ({"seed": 1.5}, "seed must be an integer, got 1.5"),
    ({"seed": "3"}, "seed must be an integer, got '3'"),
    ({"seed": True}, "seed must be an integer, got True"),
    ({"seq_len": 0}, "seq_len must be an integer >= 1, got 0"),
    ({"seq_len": 2.0}, "seq_len must be an integer, got 2.0"),
    ({"rank": -1}, "rank must be an integer >= 0, got -1"),
    ({"rank": 2, "world_size": 2}, "rank 2 is not below world_size 2"),
])
def test_reader_settings_out_of_range_are_refused_when_built(pulled: dict[str, Path], settings: dict[str, Any],
                                                             needle: str) -> None:
    """Regression: a seed of -1 built a reader whose own state its load_state_dict refused (the
    state's schema wants seed >= 0), and 1.5 or "3" were taken until the first batch."""
    options: dict[str, Any] = {"seq_len": SEQ, "global_batch_size": GLOBAL, **settings}
    with pytest.raises(UsageError, match=re.escape(needle)):
        Reader(pulled["web"], **options)
    assert Reader(pulled["web"], seq_len=SEQ, global_batch_size=GLOBAL, seed=2**64 - 1).seed == 2**64 - 1


def test_a_tampered_shard_is_refused_and_nothing_from_it_is_served(pulled: dict[str, Path], tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    run_prep("pull", "web@latest", dest, "--store", pulled["store"])
    victim = sorted((dest / "bin").glob("*.bin"))[0]
    os.chmod(victim, 0o644)
    data = bytearray(victim.read_bytes())
    data[5] ^= 1
    victim.write_bytes(bytes(data))
    reader = Reader(dest, seq_len=SEQ, global_batch_size=GLOBAL)
    with pytest.raises(IntegrityError, match=victim.name):
        for _ in range(reader.sizes[0] // GLOBAL):
            next(iter(reader))


def test_a_snapshot_spec_reads_from_a_local_store(pulled: dict[str, Path]) -> None:
    from_store = Reader("web@latest", seq_len=SEQ, global_batch_size=GLOBAL, store=str(pulled["store"]))
    from_folder = Reader(pulled["web"], seq_len=SEQ, global_batch_size=GLOBAL)
    assert (from_store.batch(3) == from_folder.batch(3)).all()
    assert from_store.state_dict() == from_folder.state_dict()


def _mixture(root: Path, text: str) -> Path:
    path = root / "mix.toml"
    path.write_text(text)
    return path


def test_mixture_weights_hold_within_one_percent_and_reread_epochs_are_new_permutations(
        pulled: dict[str, Path]) -> None:
    mix = _mixture(pulled["root"], 'seed = 7\n[[source]]\nsnapshot = "web-dest"\nweight = 0.7\n'
                                   '[[source]]\nsnapshot = "code-dest"\nweight = 0.3\n')
    reader = Reader(mix, seq_len=SEQ, global_batch_size=GLOBAL)
    for first in (0, 3_333, 25_000):
        ids = reader.sample_ids(first, 10_000)
        share = sum(1 for s, _, _ in ids if s == 0) / 10_000
        assert abs(share - 0.7) <= 0.01
    code = [(e, i) for s, e, i in reader.sample_ids(0, 10_000) if s == 1]
    size = reader.sizes[1]
    epoch0 = [i for e, i in code if e == 0][:size]
    epoch1 = [i for e, i in code if e == 1][:size]
    assert sorted(epoch0) == sorted(epoch1) == list(range(size)) and epoch0 != epoch1


def test_max_epochs_ends_the_mixture(pulled: dict[str, Path]) -> None:
    mix = _mixture(pulled["root"], '[[source]]\nsnapshot = "code-dest"\nmax_epochs = 1\n')
    reader = Reader(mix, seq_len=SEQ, global_batch_size=GLOBAL)
    assert sum(1 for _ in reader) == reader.sizes[0] // GLOBAL


@pytest.mark.parametrize(("text", "needle"), [
    ('[[source]]\nsnapshot = "web-dest"\nwieght = 1\n', "source[0].wieght: unknown key"),
    ('[[source]]\nsnapshot = "web-dest"\nweight = 0\n', "weights must sum to a positive number"),
    ("seed = 1\n", "at least one [[source]]"),
    ('colour = 1\n[[source]]\nsnapshot = "web-dest"\n', "colour: unknown key"),
])
def test_mixture_mistakes_are_one_line_errors(pulled: dict[str, Path], text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        Reader(_mixture(pulled["root"], text), seq_len=SEQ, global_batch_size=GLOBAL)


def test_an_unresolvable_snapshot_in_a_mixture_is_refused(pulled: dict[str, Path]) -> None:
    mix = _mixture(pulled["root"], '[[source]]\nsnapshot = "nope@latest"\n')
    with pytest.raises(Exception, match="nope"):
        Reader(mix, seq_len=SEQ, global_batch_size=GLOBAL, store=str(pulled["store"]))


def test_documents_mode_yields_whole_documents(pulled: dict[str, Path]) -> None:
    reader = Reader(pulled["code"], seq_len=SEQ, global_batch_size=4, mode="documents")
    eos = json.loads((pulled["code"] / ".prep" / "manifest.json").read_text())["tokenizer"]["eos_id"]
    docs = [doc for step in range(reader.sizes[0] // 4) for doc in reader.batch(step)]
    assert len(docs) == reader.sizes[0] - reader.sizes[0] % 4
    assert all(int(doc[-1]) == eos and eos not in doc[:-1].tolist() for doc in docs)


def test_stats_count_what_was_served(pulled: dict[str, Path]) -> None:
    reader = Reader(pulled["web"], seq_len=SEQ, global_batch_size=GLOBAL)
    it = iter(reader)
    for _ in range(3):
        next(it)
    stats = reader.stats()
    assert stats["steps"] == 3 and stats["fetch_seconds"] > 0 and stats["bytes_read"] > 0
    assert sum(stats["samples_per_source"].values()) == 3 * GLOBAL


@settings(max_examples=60, deadline=None)
@given(size=st.integers(0, 5000), seed=st.integers(0, 2**64 - 1))
def test_the_permutation_is_a_bijection(size: int, seed: int) -> None:
    values = IndexPermutation(size, seed)(np.arange(size))
    assert sorted(values.tolist()) == list(range(size))


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_workers_neither_repeat_nor_skip_and_the_state_resumes(pulled: dict[str, Path],
                                                                           workers: int) -> None:
    from torch.utils.data import DataLoader

    from prep.data.torch import ReaderDataset

    reader = Reader(pulled["web"], seq_len=SEQ, global_batch_size=GLOBAL, rank=1, world_size=2, seed=4)
    expected = [reader.batch(step) for step in range(12)]
    dataset = ReaderDataset(pulled["web"], SEQ, GLOBAL, rank=1, world_size=2, seed=4)
    loader = iter(DataLoader(dataset, batch_size=None, num_workers=workers))
    got = [next(loader).numpy() for _ in range(7)]
    state = dataset.state_dict(batches_consumed=7)
    assert all((a == b).all() for a, b in zip(got, expected[:7]))
    resumed = ReaderDataset(pulled["web"], SEQ, GLOBAL, rank=1, world_size=2, seed=4)
    resumed.load_state_dict(state)
    again = iter(DataLoader(resumed, batch_size=None, num_workers=workers))
    assert all((next(again).numpy() == expected[step]).all() for step in range(7, 12))



def test_the_state_validates_against_its_schema_and_a_malformed_one_is_refused(pulled: dict[str, Path]) -> None:
    from prep.manifest.schema import validate

    reader = Reader(pulled["web"], seq_len=SEQ, global_batch_size=GLOBAL)
    state = reader.state_dict()
    validate(state, "prep.reader-state/1", "state")
    for broken in ({**state, "samples": -GLOBAL}, {**state, "extra": 1}, {**state, "schema": "other"}, [state]):
        with pytest.raises(UsageError):
            reader.load_state_dict(broken)  # type: ignore[arg-type]


def test_files_pull_proved_are_not_hashed_again_until_they_change(pulled: dict[str, Path], tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Start-up reads pull's record (DEST/.prep/verified.jsonl) instead of hashing every shard;
    a file whose stat stamp moved since is hashed again (and refused if its bytes changed)."""
    from prep.data import source

    dest = tmp_path / "dest"
    run_prep("pull", "web@latest", dest, "--store", pulled["store"])
    hashed: list[Path] = []
    real = source.digest_file  # type: ignore[attr-defined]
    monkeypatch.setattr(source, "_CHECKED", {})
    def counting(path: Path) -> Any:
        hashed.append(path)
        return real(path)

    monkeypatch.setattr(source, "digest_file", counting)
    reader = Reader(dest, seq_len=SEQ, global_batch_size=GLOBAL)
    for step in range(reader.sizes[0] // GLOBAL):
        reader.batch(step)
    assert hashed == []
    victim = reader.sources[0].shards[0].bin_path
    os.utime(victim, ns=(victim.stat().st_atime_ns, victim.stat().st_mtime_ns + 1))
    monkeypatch.setattr(source, "_CHECKED", {})
    again = Reader(dest, seq_len=SEQ, global_batch_size=GLOBAL)
    for step in range(again.sizes[0] // GLOBAL):
        again.batch(step)
    assert hashed == [victim]


def test_a_file_rewritten_with_its_mtime_set_back_is_hashed_again_in_the_same_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: a process remembered a checked file by size, mtime and inode, so a rewrite
    of the same size with the mtime set back (a new ctime) was served unchecked; and a file
    checked against one SHA-256 passed a check against another."""
    from prep.data import source
    from prep.hashing import digest_file

    monkeypatch.setattr(source, "_CHECKED", {})
    path = tmp_path / "shard.bin"
    path.write_bytes(b"\x01" * 4096)
    right = digest_file(path).sha256
    source.check_file(path, right)
    with pytest.raises(IntegrityError, match="sha256 differs"):
        source.check_file(path, "0" * 64)  # another snapshot's bytes for this path
    before = path.stat()
    time.sleep(0.05)  # past the filesystem clock's tick: the rewrite's ctime must differ
    with open(path, "r+b") as out:
        out.seek(100)
        out.write(b"\x02")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(IntegrityError, match="sha256 differs"):
        source.check_file(path, right)
