"""Builds with the length filter: exactly the documents out of bounds are dropped, counted in the
manifest, the same for any worker count; a changed setting recomputes tokenize and what follows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prep.config import load_pipeline
from prep.manifest.schema import validate
from prep.progress import Progress
from prep.runner.build import BuildResult, build
from prep.storage import LocalStore
from tests.helpers import run_prep, write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor, build_local, read_samples

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon")


def _text(index: int) -> str:
    """A distinct text of `index % 40 + 1` words."""
    return " ".join(WORDS[(index + k) % len(WORDS)] for k in range(index % 40)) + f" n{index}"


def _corpus(root: Path) -> dict[str, str]:
    """Two files of 60 and 50 documents; their texts by id."""
    texts = {}
    for name, first, count in (("a", 0, 60), ("b", 60, 50)):
        records = [{"id": f"{name}-{i}", "text": _text(i)} for i in range(first, first + count)]
        write_jsonl(root / "corpus" / f"{name}.jsonl", records)
        texts.update({record["id"]: record["text"] for record in records})
    return texts


def _pipeline(root: Path, tokenizer: Path, step: str) -> Path:
    return write_pipeline(root, tokenizer, ["corpus"], shard_size="2KB", extra=f'\n[[steps]]\nuse = "length"\n{step}\n')


def _build(pipeline: Path, store: Path) -> BuildResult:
    return build(load_pipeline(pipeline), LocalStore(store), InProcessExecutor(), (), Progress(quiet=True))


def _written_ids(store: Path, manifest: dict[str, Any]) -> set[str]:
    return {json.loads(members["json"])["id"] for _, members in read_samples(store, manifest)}


def test_a_build_drops_exactly_the_documents_out_of_bounds(tmp_path: Path, tokenizer_path: Path) -> None:
    texts = _corpus(tmp_path)
    pipeline = _pipeline(tmp_path, tokenizer_path, "min_words = 10\nmax_chars = 150")
    one = build_local(pipeline, tmp_path / "store1", workers=1)
    two = build_local(pipeline, tmp_path / "store2", workers=2)
    assert one.snapshot.id == two.snapshot.id
    too_few = {i for i, text in texts.items() if len(text.split()) < 10}
    too_long = {i for i, text in texts.items() if len(text) > 150} - too_few
    assert too_few and too_long
    manifest = one.snapshot.manifest
    assert _written_ids(tmp_path / "store1", manifest) == set(texts) - too_few - too_long
    validate(manifest, "prep.snapshot/1")
    dropped = too_few | too_long
    assert manifest["stats"]["steps"] == [{
        "use": "length", "documents": len(texts), "text_bytes": sum(len(t.encode()) for t in texts.values()),
        "kept": len(texts) - len(dropped), "dropped": len(dropped),
        "dropped_bytes": sum(len(texts[i].encode()) for i in dropped), "changed": 0,
        "reasons": {"too few words": len(too_few), "too many chars": len(too_long)}}]
    assert manifest["stats"]["documents_read"] == manifest["stats"]["documents_written"] == len(texts) - len(dropped)
    assert manifest["config"]["steps"][0]["min_words"] == 10
    shown = run_prep("show", "tiny@latest", "--store", tmp_path / "store1").stdout
    assert f"{len(dropped)} dropped by steps" in shown
    assert (f"step       1 length: {len(texts)} in" in shown
            and f"{len(dropped)} dropped (too few words {len(too_few)}, too many chars {len(too_long)})" in shown)


def test_changing_a_setting_recomputes_tokenize_and_what_follows(tmp_path: Path, tokenizer_path: Path) -> None:
    _corpus(tmp_path)
    store = tmp_path / "store"
    first = _build(_pipeline(tmp_path, tokenizer_path, "min_words = 10"), store)
    run_prep("tag", "tiny@latest", "v1", "--store", store)
    second = _build(_pipeline(tmp_path, tokenizer_path, "min_words = 20"), store)
    tokenize = second.stages["tokenize"]
    assert tokenize.ran == first.stages["tokenize"].ran > 0 and tokenize.cached == 0
    assert all(run.ran > 0 for name, run in second.stages.items() if name != "tokenize" and run.ran + run.cached)
    assert second.snapshot.manifest["inputs"] == first.snapshot.manifest["inputs"]
    again = _build(_pipeline(tmp_path, tokenizer_path, "min_words = 10"), store)
    assert again.snapshot.id == first.snapshot.id and again.stages["tokenize"].ran == 0
    report = json.loads(run_prep("diff", "tiny@v1", second.snapshot.id, "--store", store, "--json", check=False).stdout)
    validate(report, "prep.diff-report/1")
    stats = {entry["key"]: entry for entry in report["stats"]}
    moved = second.snapshot.manifest["stats"]["steps"][0]["dropped"] - first.snapshot.manifest["stats"]["steps"][0]["dropped"]
    assert moved > 0 and stats["steps[0].length.dropped"]["delta"] == moved
    assert stats["steps[0].length.reasons.too few words"]["delta"] == moved
    assert stats["steps[0].length.kept"]["delta"] == -moved
    settings = {entry["key"]: entry for entry in report["provenance"]["settings"]}
    assert settings["config.steps"]["old"][0]["min_words"] == 10 and settings["config.steps"]["new"][0]["min_words"] == 20


def test_a_build_whose_steps_drop_every_document_says_so(tmp_path: Path, tokenizer_path: Path) -> None:
    texts = _corpus(tmp_path)
    result = run_prep("build", _pipeline(tmp_path, tokenizer_path, "min_chars = 100000"), "--store", tmp_path / "store",
                      "--workers", "1", check=False)
    assert result.returncode == 2, result.stderr
    assert f"the corpus has no documents left by [[steps]] (they dropped all {len(texts)} read)" in result.stderr
