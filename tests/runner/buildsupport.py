"""Helpers for build tests: run a build through the library API and read its outputs back."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from prep import code
from prep.config import load_pipeline
from prep.formats import megatron, wds
from prep.progress import Progress
from prep.runner.build import BuildResult, build
from prep.runner.executors.pool import LocalExecutor
from prep.runner.tasks import prepare_worker
from prep.storage import LocalStore
from prep.storage.backend import MAX_BODY_BYTES, ObjectInfo
from prep.store import cas
from tests.helpers import make_records, write_jsonl


class InProcessExecutor:
    """Runs tasks one after another in this process, so tests can monkeypatch stage constants."""

    workers = 1
    shares_filesystem = True

    def run(self, fn: Any, items: Any) -> Any:
        for index, item in enumerate(items):
            yield index, fn(item)

    def warm(self, warm_up: Any) -> None:
        pass

    def close(self) -> None:
        pass


class RequestCountingStore(LocalStore):
    """A local store counting the requests a remote one would serve: PUTs, GETs, HEADs and LISTs
    (a listing counts one request per 1,000 keys it yields or part of it, as S3's pages)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.requests: dict[str, int] = {"put": 0, "get": 0, "head": 0, "list": 0}
        self.got: list[str] = []  # every key a GET asked for, in order
        self._lock = threading.Lock()

    def count(self, kind: str) -> None:
        with self._lock:
            self.requests[kind] += 1

    def total(self) -> int:
        return sum(self.requests.values())

    def put_bytes(self, key: str, data: bytes) -> bool:
        self.count("put")
        return super().put_bytes(key, data)

    def get_bytes(self, key: str, limit: int = MAX_BODY_BYTES) -> bytes:
        self.count("get")
        with self._lock:
            self.got.append(key)
        return super().get_bytes(key, limit)

    def head(self, key: str) -> Any:
        self.count("head")
        return super().head(key)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self.count("list")
        for index, info in enumerate(super().list(prefix)):
            if index and index % 1000 == 0:
                self.count("list")
            yield info


def build_local(pipeline: Path, store_dir: Path, workers: int = 1, tags: tuple[str, ...] = ()) -> BuildResult:
    """A build on a fresh pool of spawned local workers (the CLI forks them: test_build runs that
    in a process of its own, since this one may hold other tests' threads). The driver's code
    identity is read afresh first: this long-lived test process may have hashed the tree before
    someone edited it, and the pool's new workers hash it as it is now (they would refuse a stale
    driver, see runner.tasks.CodeChecked)."""
    code.source_hash.cache_clear()
    executor = LocalExecutor(workers, prepare_worker)
    try:
        return build(load_pipeline(pipeline), LocalStore(store_dir), executor, tags, Progress(quiet=True))
    finally:
        executor.close()


def artifact_path(store_dir: Path, artifact: dict[str, Any]) -> Path:
    return store_dir / cas.object_key(artifact["sha256"])


def read_sequences(store_dir: Path, manifest: dict[str, Any]) -> list[np.ndarray]:
    """Every sequence of every .bin shard, in shard order, via the Megatron reader."""
    sequences: list[np.ndarray] = []
    by_shard: dict[int, dict[str, Path]] = {}
    for artifact in manifest["artifacts"]:
        by_shard.setdefault(artifact["shard"], {})[artifact["format"]] = artifact_path(store_dir, artifact)
    for shard in sorted(by_shard):
        files = by_shard[shard]
        if "bin" in files:
            reader = megatron.MegatronReader(bin_file=files["bin"], idx_file=files["idx"])
            sequences.extend(np.array(reader[i]) for i in range(len(reader)))
    return sequences


def read_samples(store_dir: Path, manifest: dict[str, Any]) -> list[tuple[str, dict[str, bytes]]]:
    samples: list[tuple[str, dict[str, bytes]]] = []
    for artifact in sorted(manifest["artifacts"], key=lambda a: a["path"]):
        if artifact["format"] == "wds":
            samples.extend(wds.iter_samples(artifact_path(store_dir, artifact)))
    return samples


def all_objects_intact(store_dir: Path) -> bool:
    for path in (store_dir / "objects" / "sha256").rglob("*"):
        if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() != path.name:
            return False
    return True


def two_file_corpus(root: Path, first: int, second: int) -> Path:
    """`root/corpus/a.jsonl` and `b.jsonl` with `first` and `second` records (seeds 1 and 2); returns root."""
    write_jsonl(root / "corpus" / "a.jsonl", make_records(first, seed=1, prefix="a"))
    write_jsonl(root / "corpus" / "b.jsonl", make_records(second, seed=2, prefix="b"))
    return root
