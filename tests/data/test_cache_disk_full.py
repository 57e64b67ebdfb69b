"""A full disk under the node-local cache is an I/O failure (StorageIOError, exit 4) naming the
object and the cache file, as every full disk is; it was a UsageError (exit 2), as if the command
line were wrong. Only proven copies stay in the cache."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from prep.data.reader import Reader
from prep.errors import StorageIOError
from prep.storage import LocalStore
from tests.helpers import run_prep
from tests.runner.test_disk_full import IO_EXIT, small_tmpfs
from tests.snapshot_factory import build_snapshot

SEQ, GLOBAL, SHARD = 16, 8, 20_000


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight 20 KB shards (bin only) of `demo@latest` in a local store."""
    root = tmp_path_factory.mktemp("cachefull")
    build_snapshot(LocalStore(root / "store"), root / "work", shard_sizes=(SHARD,) * 8, formats=("bin",))
    return root / "store"


def _complete(cache: Path) -> list[Path]:
    return [path for path in (cache / "objects").iterdir() if not path.name.startswith(".")]


def cas_name(path: Path) -> bool:
    """Whether a cache file holds the bytes its name says."""
    return hashlib.sha256(path.read_bytes()).hexdigest() == path.name


def test_a_full_disk_while_caching_is_an_io_error_naming_the_cache_file(store: Path, tmp_path: Path) -> None:
    """A disk of 64 KiB under a cache_bytes of 1 MB: the fourth 20 KB shard does not fit."""
    with small_tmpfs(tmp_path / "mnt", "64k") as mount:
        with Reader("demo@latest", SEQ, GLOBAL, store=store, cache_dir=mount / "cache", cache_bytes=1 << 20,
                    prefetch_steps=0) as reader, pytest.raises(StorageIOError) as caught:
            for step in range(20):
                reader.batch(step)
        error = caught.value
        assert error.exit_code == IO_EXIT and error.path.startswith(str(mount / "cache" / "objects" / ""))
        assert re.fullmatch(r"caching sha256:[0-9a-f]{12} bin/0000\d\.bin at \S+: No space left on device: free space "
                            r"under the cache folder or lower cache_bytes", str(error)), str(error)
        complete = _complete(mount / "cache")
        assert 1 <= len(complete) < 4 and all(cas_name(path) for path in complete)  # what fitted, each proven


def test_the_cli_exits_4_with_one_line(store: Path, tmp_path: Path) -> None:
    """prep drill through a cache folder on a disk smaller than the shards it reads."""
    with small_tmpfs(tmp_path / "mnt", "64k") as mount:
        result = run_prep("drill", "demo@latest", "--store", store, "--world-size", "1", "--cache-bytes", "1MB",
                          "--steps", "4", "--seq-len", str(SEQ), "--global-batch", str(GLOBAL), "--prefetch-steps",
                          "0", "--cache-dir", mount / "cache", check=False, timeout=120)
        assert result.returncode == IO_EXIT, result.stderr
        assert re.fullmatch(r"prep: error: caching sha256:[0-9a-f]{12} bin/0000\d\.bin at \S+: No space left on device: "
                            r"free space under the cache folder or lower cache_bytes\n", result.stderr), result.stderr
        json_result = run_prep("drill", "demo@latest", "--store", store, "--world-size", "1", "--cache-bytes", "1MB",
                               "--steps", "4", "--seq-len", str(SEQ), "--global-batch", str(GLOBAL), "--json",
                               "--cache-dir", mount / "cache", check=False, timeout=120)
        assert json_result.returncode == IO_EXIT
        assert json.loads(json_result.stdout)["exit_code"] == IO_EXIT
