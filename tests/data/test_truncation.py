"""A shard cut short or unreadable while a reader runs: the batch that reads the lost bytes raises the
one-line prep error naming the file (IntegrityError for a file cut short, StorageIOError for EIO),
never a SIGBUS, for a pulled folder and a cache-backed reader, in tokens and documents mode.

Real truncation runs the reader in a subprocess, so a reader that maps its shards (and dies of
SIGBUS) fails the test with a negative return code rather than killing pytest; a read that meets the
end early and EIO are simulated in process by patching os.pread."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prep.data.reader import Reader
from prep.errors import IntegrityError, StorageIOError
from prep.formats import megatron
from prep.storage import LocalStore
from prep.store import cas
from prep.store.refs import move_ref
from prep.store.snapshots import publish_manifest
from prep.transfer.pull import pull
from tests.snapshot_factory import manifest_for

SEQ, GLOBAL, STEPS = 16, 8, 40
SHARD_TOKENS = (20_000, 20_000)
KEEP = 4_001  # bytes left of the cut shard: token 2000 loses its second byte

READ_SCRIPT = """
import json, os, sys
from prep.cli.main import error_kind, fail
from prep.data.reader import Reader
from prep.errors import PrepError
spec = json.loads(sys.argv[1])
reader = Reader(spec["source"], spec["seq_len"], spec["global"], **spec["options"])
def total(batch):
    return sum(int(doc.sum()) for doc in batch) if isinstance(batch, list) else int(batch.sum())
print(json.dumps({"step": 0, "sum": total(reader.batch(0))}), flush=True)
os.truncate(spec["victim"], spec["keep"])
for step in range(1, spec["steps"]):
    try:
        found = total(reader.batch(step))
    except PrepError as exc:
        try:
            print(json.dumps({"failed": step, "retry": total(reader.batch(step))}), flush=True)
        except PrepError as again:
            print(json.dumps({"failed": step, "retry_error": again.message}), flush=True)
        fail(exc.message, exc.exit_code, error_kind(exc), False)
    print(json.dumps({"step": step, "sum": found}), flush=True)
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> LocalStore:
    """`cut@latest`: two shards of random uint16 documents with valid .idx files, in a local store."""
    root = tmp_path_factory.mktemp("truncation")
    found = LocalStore(root / "store")
    rng = np.random.default_rng(7)
    artifacts: list[dict[str, Any]] = []
    for shard, tokens in enumerate(SHARD_TOKENS):
        ends = np.cumsum(rng.integers(50, 400, size=tokens // 50))
        lengths = np.diff(np.concatenate(([0], ends[ends < tokens], [tokens])))
        prefix = root / "work" / f"{shard:05d}"
        prefix.parent.mkdir(parents=True, exist_ok=True)
        megatron.bin_path(prefix).write_bytes(rng.integers(0, 50000, size=tokens, dtype=np.uint16).tobytes())
        megatron.write_index(megatron.idx_path(prefix), lengths, np.uint16)
        for fmt, path in (("bin", megatron.bin_path(prefix)), ("idx", megatron.idx_path(prefix))):
            digest = cas.put_file(found, path)
            artifacts.append({"path": f"bin/{path.name}", "format": fmt, "shard": shard, "size": digest.size,
                              "sha256": digest.sha256, "documents": len(lengths), "tokens": tokens})
    move_ref(found, "cut", "latest", publish_manifest(found, manifest_for("cut", artifacts)).id)
    return found


def pulled(store: LocalStore, folder: Path) -> Path:
    """A fresh pulled copy (the tests cut its files)."""
    reader = Reader("cut@latest", SEQ, GLOBAL, store=store)
    pull(store, reader.sources[0].snapshot, folder)
    return folder


def total(batch: Any) -> int:
    """A batch's checksum: the sum of its tokens (of its documents, in documents mode)."""
    return sum(int(doc.sum()) for doc in batch) if isinstance(batch, list) else int(batch.sum())


def shards_read(reader: Reader, step: int) -> set[int]:
    """The shards step `step`'s rows touch."""
    ((_, starts, lengths),) = reader.spans(step)
    bounds = reader.sources[0].token_starts
    first = np.searchsorted(bounds, starts, side="right") - 1
    last = np.searchsorted(bounds, starts + lengths - 1, side="right") - 1
    return {shard for a, b in zip(first.tolist(), last.tolist()) for shard in range(a, b + 1)}


def first_cut_step(reader: Reader, shard: int, keep: int) -> int:
    """The first step after step 0 whose rows read a token of `shard` at or past byte `keep`."""
    bounds = reader.sources[0].token_starts
    lost, end = int(bounds[shard]) + keep // 2, int(bounds[shard + 1])
    for step in range(1, STEPS):
        ((_, starts, lengths),) = reader.spans(step)
        if ((starts + lengths > lost) & (starts < end)).any():
            return step
    raise AssertionError("no step reads the cut part: pick another seed")


def scenario(reader: Reader) -> tuple[int, int, list[int]]:
    """(the shard to cut: read by step 0 and every step up to the failing one, that step, the
    expected sums of the steps)."""
    for shard in sorted(shards_read(reader, 0)):
        step = first_cut_step(reader, shard, KEEP)
        if all(shard in shards_read(reader, at) for at in range(step + 1)):
            return shard, step, [total(reader.batch(at)) for at in range(STEPS)]
    raise AssertionError("no shard is read by every step up to its cut: pick another seed")


def run_reader(source: str | Path, victim: Path, **options: Any) -> tuple[subprocess.CompletedProcess[str],
                                                                            list[dict[str, Any]]]:
    """READ_SCRIPT in a subprocess: batch 0, cut `victim` to KEEP bytes, then batches until one fails."""
    spec = {"source": str(source), "seq_len": SEQ, "global": GLOBAL, "options": options, "victim": str(victim),
            "keep": KEEP, "steps": STEPS}
    result = subprocess.run([sys.executable, "-c", READ_SCRIPT, json.dumps(spec)], capture_output=True, text=True,
                            timeout=120, check=False)
    return result, [json.loads(line) for line in result.stdout.splitlines()]


@pytest.mark.parametrize("mode", ["tokens", "documents"])
def test_a_pulled_shard_cut_while_the_reader_runs_fails_that_batch_in_one_line(
        store: LocalStore, tmp_path: Path, mode: str) -> None:
    dest = pulled(store, tmp_path / "dest")
    reference = Reader(dest, SEQ, GLOBAL, mode=mode)
    shard, failing, expected = scenario(reference)
    victim = reference.sources[0].shards[shard].bin_path
    reference.close()
    result, lines = run_reader(dest, victim, mode=mode)
    assert result.returncode == IntegrityError.exit_code, (result.returncode, result.stderr)  # SIGBUS: -7
    assert result.stderr.splitlines() == [
        f"prep: error: {victim}: shard is shorter than its recorded {SHARD_TOKENS[shard] * 2} bytes "
        f"(truncated while being read; {KEEP} bytes now)"]
    assert [line["sum"] for line in lines[:-1]] == expected[:failing]  # every batch before it is whole
    assert lines[-1]["failed"] == failing
    assert lines[-1]["retry_error"] == f"{victim}: does not match the snapshot (sha256 differs); refusing to read it"


def test_a_cache_file_cut_while_pinned_fails_that_batch_and_the_retry_fetches_it_again(
        store: LocalStore, tmp_path: Path) -> None:
    """No prefetch: a read waiting on a prefetch's lock drops the idle pins, and a cut file that is not
    pinned is opened again, found short and fetched again without an error (test_nodecache.py)."""
    reference = Reader("cut@latest", SEQ, GLOBAL, store=store)
    shard, failing, expected = scenario(reference)
    victim = tmp_path / "cache" / "objects" / reference.sources[0].shards[shard].bin_sha256
    result, lines = run_reader("cut@latest", victim, store=str(store.root), cache_dir=str(tmp_path / "cache"),
                               cache_bytes=1 << 20, prefetch_steps=0)
    assert result.returncode == IntegrityError.exit_code, (result.returncode, result.stderr)
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"prep: error: {victim}: shard is shorter than its recorded {SHARD_TOKENS[shard] * 2} "
                           f"bytes (truncated while being read; {KEEP} bytes now; cache file for ")
    assert line.endswith(f" bin/{shard:05d}.bin)")
    assert [line["sum"] for line in lines[:-1]] == expected[:failing]
    assert lines[-1] == {"failed": failing, "retry": expected[failing]}  # the pin was dropped: fetched again
    assert victim.stat().st_size == SHARD_TOKENS[shard] * 2


def open_reader(store: LocalStore, tmp_path: Path, where: str) -> Reader:
    """A reader over a pulled folder, or through a node-local cache."""
    if where == "pulled":
        return Reader(pulled(store, tmp_path / "dest"), SEQ, GLOBAL)
    return Reader("cut@latest", SEQ, GLOBAL, store=store, cache_dir=tmp_path / "cache", cache_bytes=1 << 20,
                  prefetch_steps=0)


def patch_reads(monkeypatch: pytest.MonkeyPatch, victim: Path,
                change: Callable[[Callable[[int, int, int], bytes], int, int, int], bytes]) -> None:
    """os.pread of `victim` (by inode, so a cache file and a pulled one alike) goes through `change`."""
    real, inode = os.pread, victim.stat().st_ino

    def pread(fd: int, size: int, offset: int) -> bytes:
        return change(real, fd, size, offset) if os.fstat(fd).st_ino == inode else real(fd, size, offset)

    monkeypatch.setattr(os, "pread", pread)


def victim_of(reader: Reader, shard: int) -> Path:
    """The shard's .bin as this reader reads it (the cache file, for a cache-backed one)."""
    return reader.sources[0].shards[shard].bin_path


@pytest.mark.parametrize("where", ["pulled", "cache"])
def test_a_read_that_meets_the_end_early_is_an_integrity_error_naming_the_file(
        store: LocalStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    reader = open_reader(store, tmp_path, where)
    shard, failing, expected = scenario(reader)
    for step in range(failing):
        assert total(reader.batch(step)) == expected[step]
    victim = victim_of(reader, shard)
    patch_reads(monkeypatch, victim, lambda real, fd, size, offset: real(fd, size, offset)[:max(0, KEEP - offset)])
    with pytest.raises(IntegrityError, match=rf"^{victim}: shard is shorter than its recorded "
                                             rf"{SHARD_TOKENS[shard] * 2} bytes \(truncated while being read"):
        reader.batch(failing)
    reader.close()


@pytest.mark.parametrize("where", ["pulled", "cache"])
def test_an_io_error_reading_a_shard_is_a_storage_error_naming_the_file_and_passes_when_it_clears(
        store: LocalStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    reader = open_reader(store, tmp_path, where)
    shard, failing, expected = scenario(reader)
    assert total(reader.batch(0)) == expected[0]
    victim = victim_of(reader, shard)

    def failing_disk(real: Callable[[int, int, int], bytes], fd: int, size: int, offset: int) -> bytes:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    patch_reads(monkeypatch, victim, failing_disk)
    with pytest.raises(StorageIOError) as raised:
        reader.batch(1)
    note = "" if where == "pulled" else f"; cache file for {reader.sources[0].id[:19]} bin/{shard:05d}.bin"
    assert str(raised.value) == f"reading shard {victim}: {os.strerror(errno.EIO)}{note}"
    assert raised.value.errno == errno.EIO and raised.value.exit_code == 4
    monkeypatch.undo()
    assert [total(reader.batch(step)) for step in range(1, STEPS)] == expected[1:]
    reader.close()
