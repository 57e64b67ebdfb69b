"""A FIFO or a symlink to /dev/zero where a shard's `.bin` should be, in a pulled folder and in a
store read in place: the Reader and `prep consumed` refuse it in one line (IntegrityError, exit 3)
and never hang hashing or reading it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from prep.data import source
from prep.data.reader import Reader
from prep.data.source import PULLED_MANIFEST
from prep.errors import IntegrityError
from prep.storage import LocalStore
from prep.store import cas
from prep.store.snapshots import read_manifest_file
from tests.bench.bench_reader import make_snapshot
from tests.helpers import run_prep, within

SEQ, GLOBAL = 16, 4
NOT_REGULAR = "not a regular file (a FIFO, a device or a folder); refusing to read it"


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-shard bin+idx snapshot published in `snapshot-store` and pulled into `snapshot`."""
    root = tmp_path_factory.mktemp("hostile-files")
    make_snapshot(root / "snapshot", 20_000)
    return root


def planted(made: Path, tmp_path: Path, where: str, what: str) -> tuple[list[str], Path]:
    """A copy of the pulled folder or the store with a FIFO or a /dev/zero symlink at the shard's
    `.bin`: (the source and options for `prep consumed`, the path planted)."""
    copy = shutil.copytree(made / ("snapshot" if where == "pulled" else "snapshot-store"), tmp_path / where)
    snapshot = read_manifest_file(made / "snapshot" / PULLED_MANIFEST)
    (bin_artifact,) = [a for a in snapshot.manifest["artifacts"] if a["format"] == "bin"]
    if where == "pulled":
        victim, args = copy / bin_artifact["path"], [str(copy)]
    else:
        found = LocalStore(copy).local_path(cas.object_key(bin_artifact["sha256"]))
        assert found is not None
        victim, args = found, [snapshot.id, "--store", str(copy)]
    victim.chmod(0o644)
    victim.unlink()
    os.mkfifo(victim) if what == "fifo" else victim.symlink_to("/dev/zero")
    return args, victim


@pytest.mark.parametrize("what", ["fifo", "devzero"])
@pytest.mark.parametrize("where", ["pulled", "store"])
def test_the_reader_refuses_a_fifo_or_device_at_a_shard(made: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         where: str, what: str) -> None:
    """Regression: the first batch hashed whatever was at the shard's path, so a FIFO (no writer)
    blocked it for ever and /dev/zero was hashed for ever."""
    monkeypatch.setattr(source, "_CHECKED", {})
    args, victim = planted(made, tmp_path, where, what)
    with within(20):
        reader = Reader(args[0], seq_len=SEQ, global_batch_size=GLOBAL, store=args[2] if len(args) > 1 else None)
        with pytest.raises(IntegrityError) as refused:
            reader.batch(0)
    assert refused.value.message == f"{victim}: {NOT_REGULAR}"
    assert refused.value.exit_code == 3


@pytest.mark.parametrize("what", ["fifo", "devzero"])
@pytest.mark.parametrize("where", ["pulled", "store"])
def test_prep_consumed_refuses_a_fifo_or_device_at_a_shard_in_one_line(made: Path, tmp_path: Path, where: str,
                                                                        what: str) -> None:
    """Regression: `prep consumed` hung on the same shard (the subprocess is killed after 60 s)."""
    args, victim = planted(made, tmp_path, where, what)
    result = run_prep("consumed", *args, "--samples", "8", "--seq-len", str(SEQ), check=False, timeout=60)
    assert result.returncode == 3, result.stderr
    assert result.stderr == f"prep: error: {victim}: {NOT_REGULAR}\n"
    assert result.stdout == ""
