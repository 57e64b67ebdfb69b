"""Layout-1 snapshots for tests, now that builds make layout 2 only.

`synthesize_layout1` takes a layout-2 snapshot and publishes the layout-1 snapshot the old build
made of the same tokenize outputs: a dedup keep mask (first occurrence of each text hash in
input order, packed as prep.workfiles.keepmask defines), a shuffle plan and shard specs (the old
planner, kept here: order by a keyed hash of the text hash, shards cut at `shard_size`), and
shards named by position whose files hold the documents in plan order, WebDataset keys being
10-digit global positions. Every stage manifest validates against its schema.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from prep.formats import little_endian, megatron, wds
from prep.formats.units import BIN, IDX, WDS, artifact_path
from prep.manifest import canonical
from prep.stages.specs import Part
from prep.storage.backend import Store
from prep.store import cas, records
from prep.store.localcopy import local_file
from prep.store.refs import move_ref
from prep.store.snapshots import Snapshot, publish_manifest
from prep.workfiles import docnames
from prep.workfiles.intermediate import hash_pairs, read_columns
from prep.workfiles.keepmask import pack_mask
from prep.workfiles.shardplan import ShardSpec

PLAN_DTYPE = np.dtype([("shard", "<i4"), ("pos", "<i8"), ("bin_off", "<i8"), ("tar_off", "<i8")])
"""One row per kept document, in input order (the layout-1 shuffle plan)."""


@dataclass(frozen=True)
class _Doc:
    part: Part
    row: int
    doc_id: str | None
    text: bytes
    tokens: np.ndarray
    text_hash: bytes

    @property
    def line(self) -> int:
        """The document's 1-based line in its file."""
        return docnames.record_line(self.part.format, self.part.line_offset, self.row)

    def sample_json(self) -> bytes:
        """The document's `.json` WebDataset member."""
        return wds.sample_json(docnames.document_id(self.doc_id, self.part.source, self.line), self.part.source,
                               self.line, len(self.tokens) + 1)


def first_occurrences(hashes: list[bytes], exact: bool) -> np.ndarray:
    """The layout-1 keep rule: True for the first document of each text hash in input order."""
    seen: set[bytes] = set()
    keep = []
    for text_hash in hashes:
        keep.append(not exact or text_hash not in seen)
        seen.add(text_hash)
    return np.array(keep, dtype=bool)


def _splitmix64(values: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = values + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _shuffle_keys(hashes: np.ndarray, seed: int) -> np.ndarray:
    seed_mix = _splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))[0]
    return _splitmix64(hashes[:, 0] ^ _splitmix64(hashes[:, 1] ^ seed_mix))


def plan_layout1(kept: list[_Doc], seed: int, shard_size: int, dtype: np.dtype[Any]) -> tuple[np.ndarray, list[ShardSpec]]:
    """The old shuffle stage: every kept document's shard, global position and byte offsets."""
    hashes = hash_pairs(pa.array([doc.text_hash for doc in kept], pa.binary(16))) if kept else np.zeros((0, 2), "<u8")
    order = np.argsort(_shuffle_keys(hashes, seed), kind="stable")
    seq = np.array([len(kept[i].tokens) + 1 for i in order.tolist()], dtype=np.int64)
    spans = wds.sample_spans([len(kept[i].sample_json()) for i in order.tolist()], wds.npy_sizes(seq, dtype),
                             [len(kept[i].text) for i in order.tolist()])
    bytes_cum, tar_cum = (np.concatenate(([0], np.cumsum(values))) for values in (seq * dtype.itemsize, spans))
    plan = np.zeros(len(kept), dtype=PLAN_DTYPE)
    specs: list[ShardSpec] = []
    start = 0
    while start < len(kept):
        end = max(start + 1, int(np.searchsorted(bytes_cum, bytes_cum[start] + shard_size, side="right")) - 1)
        chosen = order[start:end]
        plan["shard"][chosen], plan["pos"][chosen] = len(specs), np.arange(start, end)
        plan["bin_off"][chosen] = bytes_cum[start:end] - bytes_cum[start]
        plan["tar_off"][chosen] = tar_cum[start:end] - tar_cum[start]
        specs.append(ShardSpec(len(specs), start, end - start, int(seq[start:end].sum()),
                               int(bytes_cum[end] - bytes_cum[start]),
                               int(tar_cum[end] - tar_cum[start]) + len(wds.END_OF_ARCHIVE)))
        start = end
    return plan, specs


def _stage(store: Store, snapshot: Snapshot, name: str) -> dict[str, Any]:
    output = next(stage["output"] for stage in snapshot.manifest["stages"] if stage["name"] == name)
    manifest: dict[str, Any] = canonical.loads(cas.get_bytes(store, output))
    return manifest


def _documents(parts: list[Part], dtype: np.dtype[Any]) -> list[_Doc]:
    """Every document of the parts in input order, with its text and tokens."""
    docs = []
    for part in parts:
        table = read_columns(part.path, ["row", "id", "text_hash", "text_offset", "text_bytes", "tokens_offset",
                                         "n_tokens"])
        data = part.path.read_bytes()
        for row in table.to_pylist():
            text = data[row["text_offset"]:row["text_offset"] + row["text_bytes"]]
            tokens = np.frombuffer(data, dtype=dtype, count=row["n_tokens"], offset=row["tokens_offset"])
            docs.append(_Doc(part, row["row"], row["id"], text, tokens, row["text_hash"]))
    return docs


def _shard_files(docs: list[_Doc], spec: ShardSpec, dtype: np.dtype[Any], eos_id: int) -> dict[str, bytes]:
    """The .bin, .idx and .tar bytes of one shard (documents in position order)."""
    sequences = [np.append(doc.tokens, np.array([eos_id], dtype=dtype)).astype(dtype) for doc in docs]
    samples = [wds.sample_bytes(wds.sample_key(position), doc.sample_json(), wds.npy_bytes(sequence), doc.text)
               for position, (doc, sequence) in enumerate(zip(docs, sequences), start=spec.first_pos)]
    return {BIN: b"".join(s.tobytes() for s in sequences),
            IDX: megatron.index_bytes([len(s) for s in sequences], dtype),
            WDS: b"".join(samples) + wds.END_OF_ARCHIVE}


def _npy(plan: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, plan, allow_pickle=False)
    return buffer.getvalue()


def _commit(store: Store, stage: str, snapshot: Snapshot, manifest: dict[str, Any]) -> dict[str, str]:
    key = records.content_key(stage, "layout-1 test fixture", snapshot.id)
    output = records.commit_stage(store, stage, key, manifest)
    records.stage_manifest_names(canonical.loads(cas.get_bytes(store, output)), f"{stage} manifest")  # validates
    return {"name": stage, "key": key, "output": output}


def synthesize_layout1(store: Store, snapshot: Snapshot, ref: str | None = None) -> Snapshot:
    """Publish the layout-1 snapshot of `snapshot`'s tokenize outputs (and point `ref` at it)."""
    manifest = snapshot.manifest
    tasks = _stage(store, snapshot, "tokenize")["tasks"]
    parts = [Part(local_file(store, t["output"]), t["source"], t["format"], int(t["line_offset"]), int(t["documents"]))
             for t in tasks]
    dtype = little_endian(manifest["tokenizer"]["dtype"])
    formats = tuple(manifest["config"]["output"]["formats"])
    docs = _documents(parts, dtype)
    keep = first_occurrences([doc.text_hash for doc in docs], manifest["config"]["dedup"]["exact"])
    kept = [doc for doc, flag in zip(docs, keep.tolist()) if flag]
    plan, specs = plan_layout1(kept, int(manifest["seed"]), int(manifest["config"]["output"]["shard_size"]), dtype)
    artifacts, shards = [], []
    for spec in specs:
        rows = np.flatnonzero(plan["shard"] == spec.index)
        rows = rows[np.argsort(plan["pos"][rows])]
        files = _shard_files([kept[i] for i in rows.tolist()], spec, dtype, int(manifest["tokenizer"]["eos_id"]))
        wanted = [fmt for fmt in (BIN, IDX, WDS) if (WDS if fmt == WDS else BIN) in formats]
        outputs = {fmt: cas.put_bytes(store, files[fmt]) for fmt in wanted}
        artifacts += [{"path": artifact_path(fmt, spec.index), "format": fmt, "shard": spec.index,
                       "size": digest.size, "sha256": digest.sha256, "documents": spec.documents,
                       "tokens": spec.tokens} for fmt, digest in outputs.items()]
        shards.append({**spec.to_json(), "outputs": {fmt: d.id for fmt, d in outputs.items()},
                       "sizes": {fmt: d.size for fmt, d in outputs.items()}})
    dropped = int(len(keep) - keep.sum())
    stages = [next(stage for stage in manifest["stages"] if stage["name"] == "tokenize"),
              _commit(store, "dedup", snapshot, {"outputs": {"keep": cas.put_bytes(store, pack_mask(keep)).id},
                                                 "documents_read": len(keep), "duplicates_dropped": dropped}),
              _commit(store, "shuffle", snapshot, {"outputs": {"plan": cas.put_bytes(store, _npy(plan)).id},
                                                   "shards": [spec.to_json() for spec in specs]}),
              _commit(store, "shard", snapshot, {"shards": shards})]
    stats = {**manifest["stats"], "duplicates_dropped": dropped, "documents_written": int(keep.sum()),
             "tokens_written": sum(spec.tokens for spec in specs)}
    old = publish_manifest(store, {**manifest, "stages": stages, "stats": stats,
                                   "artifacts": sorted(artifacts, key=lambda a: a["path"])})
    if ref is not None:
        move_ref(store, manifest["dataset"], ref, old.id)
    return old

