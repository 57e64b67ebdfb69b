"""Build small published snapshots for tests without running `prep build`.

Artifact bytes are random; every other manifest field is plausible filler that validates
against manifests/snapshot-1.schema.json.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prep.hashing import Digest
from prep.manifest.schema import schema_path
from prep.storage.backend import Store
from prep.store import cas
from prep.store.refs import move_ref
from prep.store.snapshots import Snapshot, publish_manifest

FORMAT_SUFFIX = {"bin": ("bin", "bin"), "idx": ("bin", "idx"), "wds": ("wds", "tar")}


@dataclass(frozen=True)
class Built:
    """A published snapshot and the bytes of each artifact by path."""

    snapshot: Snapshot
    files: dict[str, bytes]


def artifact_path(fmt: str, shard: int) -> str:
    folder, suffix = FORMAT_SUFFIX[fmt]
    return f"{folder}/{shard:05d}.{suffix}"


def _fake_hex(label: str) -> str:
    return hashlib.sha256(label.encode()).hexdigest()


def _code_section() -> dict[str, Any]:
    """The `code` block; newer schema revisions add `dependencies`, so follow the schema."""
    schema = json.loads(schema_path("prep.snapshot/1").read_text())
    code: dict[str, Any] = {"version": "0.1.0", "sha256": _fake_hex("code")}
    if "dependencies" in schema["properties"]["code"].get("properties", {}):
        code["dependencies"] = {}
    return code


def manifest_for(dataset: str, artifacts: Sequence[dict[str, Any]], seed: int = 0,
                 tokenizer: Digest | None = None) -> dict[str, Any]:
    """A schema-valid snapshot manifest listing `artifacts` (entries of the manifest's artifacts),
    carrying the stored `tokenizer` file (None: one built before snapshots carried it)."""
    carried = {"sha256": tokenizer.sha256, "object": tokenizer.id, "bytes": tokenizer.size} if tokenizer else {}
    documents = sum(a["documents"] for a in artifacts if a["format"] != "idx")
    tokens = sum(a["tokens"] for a in artifacts if a["format"] == "bin")
    return {
        "schema": "prep.snapshot/1",
        "dataset": dataset,
        "seed": seed,
        "inputs": {"version": f"sha256:{_fake_hex('inputs')}",
                   "files": [{"path": "corpus/part-0.jsonl", "size": 1234, "sha256": _fake_hex("part-0")}]},
        "code": _code_section(),
        "tokenizer": {"sha256": _fake_hex("tokenizer"), "vocab_size": 50257, "eos": "<|endoftext|>",
                      "eos_id": 50256, "dtype": "uint16", "encode_special_tokens": False, **carried},
        "config": {"seq_len": 2048},
        "stages": [{"name": "tokenize", "key": _fake_hex("tokenize"), "output": f"sha256:{_fake_hex('out')}"}],
        "artifacts": list(artifacts),
        "stats": {"documents_read": documents, "duplicates_dropped": 0, "documents_written": documents,
                  "tokens_written": tokens},
    }


def build_snapshot(
    store: Store,
    work: Path,
    *,
    dataset: str = "demo",
    shard_sizes: Sequence[int] = (40_000, 25_000, 9_000),
    formats: Sequence[str] = ("bin", "idx", "wds"),
    seed: int = 0,
    ref: str | None = "latest",
) -> Built:
    """Write random artifacts (per shard: the .bin of `shard_sizes[i]` bytes, a small .idx,
    a .tar), store them, publish the manifest and point `dataset@ref` at it."""
    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    files: dict[str, bytes] = {}
    for shard, size in enumerate(shard_sizes):
        for fmt in formats:
            length = {"bin": size, "idx": 34 + size // 50, "wds": size // 2 + 512}[fmt]
            data = rng.randbytes(length)
            path = artifact_path(fmt, shard)
            local = work / path.replace("/", "_")
            local.write_bytes(data)
            digest = cas.put_file(store, local)
            files[path] = data
            entries.append({"path": path, "format": fmt, "shard": shard, "size": digest.size,
                            "sha256": digest.sha256, "documents": 10 + shard, "tokens": size // 2})
    tokenizer = cas.put_bytes(store, json.dumps({"fake tokenizer of": dataset}).encode())  # carried, as builds do
    snapshot = publish_manifest(store, manifest_for(dataset, entries, seed, tokenizer))
    if ref is not None:
        move_ref(store, dataset, ref, snapshot.id)
    return Built(snapshot, files)


def many_artifacts(
    store: Store, count: int, *, dataset: str = "many", changed: int = 0, ref: str | None = "latest"
) -> Snapshot:
    """A snapshot of `count` tiny artifacts (per shard a .bin, .idx and .tar), for benchmarks.

    Objects are written straight into the local store's folder, without fsync. The first
    `changed` artifacts hold other bytes than with `changed=0`, so two such snapshots differ
    in exactly those files."""
    entries: list[dict[str, Any]] = []
    made: set[str] = set()
    formats = ("bin", "idx", "wds")
    for index in range(count):
        shard, fmt = divmod(index, len(formats))
        path = artifact_path(formats[fmt], shard)
        data = f"{path}{' changed' if index < changed else ''}\n".encode()
        sha = hashlib.sha256(data).hexdigest()
        local = store.local_path(cas.object_key(sha))
        assert local is not None, "many_artifacts needs a local store"
        if local.parent.name not in made:
            local.parent.mkdir(parents=True, exist_ok=True)
            made.add(local.parent.name)
        if not local.exists():
            local.write_bytes(data)
        entries.append({"path": path, "format": formats[fmt], "shard": shard, "size": len(data), "sha256": sha,
                        "documents": 1, "tokens": len(data) // 2})
    snapshot = publish_manifest(store, manifest_for(dataset, entries))
    if ref is not None:
        move_ref(store, dataset, ref, snapshot.id)
    return snapshot


def derive_snapshot(
    store: Store,
    base: Built,
    work: Path,
    *,
    changed: Sequence[str] = (),
    removed: Sequence[str] = (),
    added: Sequence[tuple[str, str, int]] = (),
    ref: str | None = "latest",
    seed: int = 1,
) -> Built:
    """A new version of `base`: the same bytes at the same paths, except `changed` paths (other
    bytes of the same size), `removed` paths, and `added` (path, format, shard) with random bytes."""
    rng = random.Random(seed)
    work.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    files: dict[str, bytes] = {}

    def store_entry(entry: dict[str, Any], data: bytes) -> None:
        local = work / entry["path"].replace("/", "_")
        local.write_bytes(data)
        digest = cas.put_file(store, local)
        entries.append({**entry, "size": digest.size, "sha256": digest.sha256})
        files[entry["path"]] = data

    for entry in base.snapshot.artifacts:
        path = entry["path"]
        if path in removed:
            continue
        if path in changed:
            store_entry(entry, rng.randbytes(entry["size"]))
        else:
            entries.append(entry)
            files[path] = base.files[path]
    for path, fmt, shard in added:
        store_entry({"path": path, "format": fmt, "shard": shard, "documents": 3, "tokens": 100}, rng.randbytes(700))
    carried = base.snapshot.manifest["tokenizer"]
    tokenizer = Digest(carried["sha256"], carried["bytes"]) if "object" in carried else None
    snapshot = publish_manifest(store, manifest_for(base.snapshot.dataset, entries, seed, tokenizer))
    if ref is not None:
        move_ref(store, base.snapshot.dataset, ref, snapshot.id)
    return Built(snapshot, files)


def pulled_bin_snapshot(root: Path) -> Path:
    """A four-shard bin-only snapshot (40,000 tokens) built into `root/store` and pulled to `root/dest`."""
    from prep.storage import LocalStore
    from prep.transfer.pull import pull

    store = LocalStore(root / "store")
    built = build_snapshot(store, root / "work", shard_sizes=(20_000,) * 4, formats=("bin",))
    pull(store, built.snapshot, root / "dest")
    return root / "dest"
