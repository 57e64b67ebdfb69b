"""The fast schema path (prep.manifest.schema) covers every task and stage record a build commits,
so the driver's commit and lookup of a record cost tens of microseconds, not jsonschema's
milliseconds, and it accepts nothing jsonschema refuses."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.config import load_pipeline
from prep.manifest.schema import _validator, conforms
from prep.progress import Progress
from prep.runner.build import build
from prep.storage.local import LocalStore
from tests.helpers import make_records, write_jsonl, write_pipeline
from tests.manifest.jsonmutation import mutated
from tests.runner.buildsupport import InProcessExecutor

STEPS = '\n[[steps]]\nuse = "length"\nmin_words = 3\n\n[checks]\nmin_documents = 1\nmax_skipped_fraction = 0.5\n'
RECORDS = {"task": "prep.task/1", "stage": "prep.stage-record/1", "pack": "prep.task-pack/1"}


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> list[tuple[str, Any]]:
    """The snapshot manifest and every commit record of a build with a document step, `[checks]`,
    every format, and a copy of a text in two files: (schema, record)."""
    root = tmp_path_factory.mktemp("records")
    for index in range(2):
        write_jsonl(root / "corpus" / f"p{index}.jsonl",
                    [*make_records(30, seed=index, prefix=f"p{index}"), {"id": f"same{index}", "text": "one two three four"}])
    pipeline = write_pipeline(root, tokenizer_path, shard_size="2KB", extra=STEPS, formats='["bin", "wds", "mds"]')
    result = build(load_pipeline(pipeline), LocalStore(root / "store"), InProcessExecutor(), (), Progress(quiet=True))
    found = [("prep.snapshot/1", result.snapshot.manifest)] + [(RECORDS[folder.rstrip("s")], json.loads(path.read_text()))
             for folder in ("tasks", "stages", "packs") for path in sorted((root / "store" / folder).rglob("*.json"))]
    found += [("prep.task/1", body) for schema, pack in list(found) if schema == "prep.task-pack/1"
              for body in pack["records"].values()]  # the records tasks are committed by, in groups
    assert {record.get("stage") for _, record in found} >= {"tokenize", "steps", "order", "shard"}
    assert "checks" in result.snapshot.manifest
    return found


def test_every_record_a_build_commits_passes_the_fast_path(records: list[tuple[str, Any]]) -> None:
    assert all(conforms(record, schema) for schema, record in records)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_fast_path_accepts_no_record_jsonschema_refuses(records: list[tuple[str, Any]], data: st.DataObject) -> None:
    schema, record = data.draw(st.sampled_from(records))
    broken = mutated(record, data)
    if conforms(broken, schema):
        assert not list(_validator(schema).iter_errors(broken))


def _first(records: list[tuple[str, Any]], stage: str, has: str) -> dict[str, Any]:
    return copy.deepcopy(next(record for schema, record in records
                              if schema == "prep.task/1" and record["stage"] == stage and has in record["outputs"]))


def test_the_stage_condition_and_paired_outputs_are_checked_as_jsonschema_does(records: list[tuple[str, Any]]) -> None:
    """`if` on the stage picks its definition; `dependentRequired` pairs .bin with .idx."""
    unpaired = _first(records, "shard", "bin")
    del unpaired["outputs"]["idx"]
    lacking = _first(records, "tokenize", "intermediate")
    del lacking["summary"]["documents"]
    for broken in (unpaired, lacking):
        assert list(_validator("prep.task/1").iter_errors(broken)) and not conforms(broken, "prep.task/1")
    other = {**lacking, "stage": "bench", "outputs": {"anything": "sha256:" + "0" * 64}, "summary": {}}
    assert not list(_validator("prep.task/1").iter_errors(other)) and conforms(other, "prep.task/1")
    # Without a stage every branch applies, a stage of another type none: as jsonschema says, one lookup.
    for stage in (None, 7, ["tokenize"]):
        odd = {key: value for key, value in _first(records, "tokenize", "intermediate").items() if key != "stage"}
        if stage is not None:
            odd["stage"] = stage
        assert not conforms(odd, "prep.task/1") and list(_validator("prep.task/1").iter_errors(odd))
