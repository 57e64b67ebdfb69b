"""A deletion request end to end, through the real CLI on a real store (docs/deletion.md): `prep
trace --all` finds the documents in every version, a build with `[input] exclude` no longer holds
them and rewrites only the shards that did, and once the refs move and gc runs with a policy
that keeps no older version, no file of the store holds their text, their token ids or their ids."""

from __future__ import annotations

import gzip
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
import zstandard
from tokenizers import Tokenizer

from prep.inputs.exclusions import pack, parse_entry
from prep.manifest.schema import validate
from prep.store.layout import snapshot_marker_key
from tests.helpers import make_records, random_text, run_prep, write_jsonl, write_pipeline

TARGETS = ("erase-me-one", "erase-me-two")  # listed by id; a third document is listed by its text hash
BY_TEXT = "erase-me-three"
COPY = "copy-of-one"  # another id holding erase-me-one's text: found by trace --all, excluded by text


def _text(seed: int) -> str:
    """A long text no other document holds (random words, sixty of them)."""
    return random_text(random.Random(seed), 60) + f" marker{seed}"


def _scan_store(store: Path, needles: list[bytes]) -> list[tuple[str, int]]:
    """Every (file, needle index) where a file of the store, decompressed when zstd or gzip,
    holds a needle."""
    found: list[tuple[str, int]] = []
    for path in sorted(p for p in store.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if data.startswith(b"\x28\xb5\x2f\xfd"):
            data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
        elif data.startswith(b"\x1f\x8b"):
            data = gzip.decompress(data)
        found.extend((str(path.relative_to(store)), index) for index, needle in enumerate(needles) if needle in data)
    return found


def _json(*args: str | Path, code: int = 0) -> dict[str, Any]:
    result = run_prep(*args, "--json", check=False)
    assert result.returncode == code, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    validate(document, document["schema"], "stdout")
    return document


def _held(report: dict[str, Any]) -> dict[str, set[str]]:
    """Per snapshot id, the ids of the documents a trace --all report found in it."""
    return {entry["snapshot"]: {hit["document"]["id"] for hit in entry["documents"]} for entry in report["snapshots"]}


def _bin_shards(manifest: dict[str, Any]) -> dict[str, str]:
    return {a["path"]: a["sha256"] for a in manifest["artifacts"] if a["format"] == "bin"}


@pytest.fixture()
def project(tmp_path: Path, tokenizer_path: Path) -> dict[str, Any]:
    """Two files, the three documents to erase among the records, and a copy of one's text."""
    first = make_records(70, seed=11, prefix="a")
    first[10:13] = [{"id": TARGETS[0], "text": _text(1)}, {"id": TARGETS[1], "text": _text(2)},
                    {"id": BY_TEXT, "text": _text(3)}]
    second = make_records(50, seed=12, prefix="b")
    second[20] = {"id": COPY, "text": _text(1)}
    write_jsonl(tmp_path / "corpus" / "a.jsonl", first)
    write_jsonl(tmp_path / "corpus" / "b.jsonl", second)
    return {"root": tmp_path, "store": tmp_path / "store", "tokenizer": tokenizer_path,
            "texts": [_text(seed) for seed in (1, 2, 3)]}


def _build(project: dict[str, Any], extra_input: str = "", *tags: str) -> dict[str, Any]:
    pipeline = write_pipeline(project["root"], project["tokenizer"], shard_size="1KB", extra_input=extra_input)
    flags = [arg for tag in tags for arg in ("--tag", tag)]
    run_prep("build", pipeline, "--store", project["store"], "--workers", "1", "-q", *flags)
    return {**_json("show", "tiny@latest", "--store", project["store"]), "id": _latest(project["store"])}


def _latest(store: Path) -> str:
    """The snapshot tiny@latest names."""
    refs = _json("ls", "tiny", "--store", store)["refs"]
    return str(next(ref["snapshot"] for ref in refs if ref["name"] == "latest"))


def test_a_request_is_traced_in_every_version_excluded_and_collected(project: dict[str, Any]) -> None:
    store, texts = project["store"], project["texts"]
    one = _build(project, "", "release")
    write_jsonl(project["root"] / "corpus" / "c.jsonl", make_records(30, seed=13, prefix="c"))
    two = _build(project)
    text_hash = xxhash.xxh3_128_hexdigest(texts[2].encode())

    # trace --all finds each listed document in both versions; by id, its copy under another id too
    for spec, ids in ((TARGETS[0], {TARGETS[0], COPY}), (f"id:{TARGETS[1]}", {TARGETS[1]}),
                      (f"text:{text_hash}", {BY_TEXT})):
        report = _json("trace", "--all", spec, "--store", store)
        assert _held(report) == {one["id"]: ids, two["id"]: ids}, spec
        assert report["holding"] == 2
    copy_hash = xxhash.xxh3_128_hexdigest(texts[0].encode())
    request = project["root"] / "removals.txt"
    request.write_text(f"# deletion request 2026-12\nid:{TARGETS[0]}\n\nid:{TARGETS[1]}\n  text:{text_hash}  \n"
                       f"text:{copy_hash}\n")
    before = _json("redact", request, "--dataset", "tiny", "--store", store, code=1)
    assert not before["clean"] and {ref["name"] for ref in before["refs"]} == {"latest", "release"}
    assert {entry["snapshot"] for entry in before["history"]} == {one["id"], two["id"]}

    three = _build(project, 'exclude = ["removals.txt"]\n')
    assert three["stats"]["excluded"] == 4 and three["exclude"]["sha256"] == hashlib.sha256(
        pack([entry for line in request.read_text().splitlines() if (entry := parse_entry(line))])).hexdigest()
    assert three["exclude"]["files"] == [{"path": "removals.txt", "entries": 4,
                                          "sha256": hashlib.sha256(request.read_bytes()).hexdigest()}]
    assert {f["path"]: f.get("excluded") for f in three["stats"]["files"]} == {"a.jsonl": 3, "b.jsonl": 1,
                                                                             "c.jsonl": 0}
    assert three["stats"]["documents_written"] == two["stats"]["documents_written"] - 3  # one and its copy: one kept
    assert _held(_json("trace", "--all", TARGETS[0], "--store", store))[three["id"]] == set()
    gone = run_prep("trace", "tiny@latest", TARGETS[1], "--store", store, check=False)
    assert gone.returncode == 2 and "built with deletion requests ([input] exclude)" in gone.stderr
    pipeline = project["root"] / "pipeline.toml"
    status = _json("status", pipeline, "--store", store)  # the table's id is in the keys status computes
    assert [stage["key"] for stage in status["stages"]] == [stage["key"] for stage in three["stages"]]

    # only the shards that held the documents were rewritten (a merge with a sibling at most)
    old, new = _bin_shards(two), _bin_shards(three)
    holding = {place["path"] for entry in before["search"]["snapshots"] if entry["snapshot"] == two["id"]
               for hit in entry["documents"] for place in hit["placements"] if place["format"] == "bin"}
    rewritten = {path for path, sha in new.items() if old.get(path) != sha}
    untouched = {path for path in old if path not in holding}
    assert len(old) > 8 and 1 <= len(rewritten) <= len(holding) <= 4
    assert len(untouched - set(new)) <= len(holding)  # a sibling merged into its parent's range
    assert all(new[path] == old[path] for path in untouched & set(new) - rewritten)

    # tokens as the .bin holds them (the dtype the snapshot records)
    dtype = np.dtype(three["tokenizer"]["dtype"]).newbyteorder("<")
    tokenizer = Tokenizer.from_file(str(project["tokenizer"]))
    tokens = [np.asarray(tokenizer.encode(text).ids, dtype=dtype).tobytes() for text in texts]
    needles = [text.encode() for text in texts] + tokens + [doc_id.encode() for doc_id in (*TARGETS, BY_TEXT)]
    assert {index for _, index in _scan_store(store, needles)} == set(range(len(needles)))  # the scan sees them

    run_prep("tag", "-d", "tiny@release", "--store", store)
    run_prep("gc", "--store", store, "--grace", "0s", "--keep-last", "1", "-q")
    after = _json("redact", request, "--dataset", "tiny", "--store", store)
    assert after["clean"] and after["search"]["holding"] == 0 and not after["objects"]["holding"]
    assert _scan_store(store, needles) == []
    assert _latest(store) == three["id"]
    run_prep("fsck", "--store", store, "-q")

    lost = "sha256:" + "0" * 64  # a marker whose manifest is not stored: named as not searched, the rest searched
    (store / snapshot_marker_key(lost)).write_bytes(b"")
    report = _json("trace", "--all", TARGETS[0], "--store", store)
    assert [(entry["snapshot"], "skipped" in entry) for entry in report["snapshots"]] == [(lost, True),
                                                                                         (three["id"], False)]


def test_a_bad_exclude_line_fails_before_any_task_naming_file_and_line(project: dict[str, Any]) -> None:
    (project["root"] / "removals.txt").write_text(f"id:{TARGETS[0]}\n# fine\n{TARGETS[1]}\n")
    pipeline = write_pipeline(project["root"], project["tokenizer"], extra_input='exclude = ["removals.txt"]\n')
    result = run_prep("build", pipeline, "--store", project["store"], check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"prep: error: removals.txt:3: {TARGETS[1]!r}: expected id:<document id> or text:<32 hex digits>"]
    assert not (project["store"] / "tasks").exists() or not any((project["store"] / "tasks").rglob("*.json"))
    (project["root"] / "removals.txt").write_text("text:abc\n")
    assert "removals.txt:1: 'text:abc': a text hash is 32 hex digits" in run_prep(
        "build", pipeline, "--store", project["store"], check=False).stderr
    (project["root"] / "removals.txt").unlink()
    missing = run_prep("build", pipeline, "--store", project["store"], check=False)
    assert missing.returncode == 2 and "prep: error: removals.txt: cannot read the exclude list" in missing.stderr
