"""Helpers for the built-in steps' tests: an in-process build of a few documents through one step,
and a pipeline's parse error for one step table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prep.config import load_pipeline, parse_pipeline
from prep.errors import ConfigError
from prep.progress import Progress
from prep.runner.build import build
from prep.storage import LocalStore
from tests.helpers import write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor, read_samples

MINIMAL = {"dataset": "tiny", "input": {"paths": ["a.jsonl"]}, "tokenizer": {"path": "t.json"}}


def build_with_step(root: Path, tokenizer: Path, texts: dict[str, str],
                    step: str) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """Build `texts` (by id) with the one `[[steps]]` table `step` (its lines after `[[steps]]`) in
    this process: the snapshot's `stats.steps[0]`, the texts written by id, and the step as the
    resolved config records it."""
    write_jsonl(root / "corpus" / "a.jsonl", [{"id": key, "text": text} for key, text in texts.items()])
    pipeline = write_pipeline(root, tokenizer, ["corpus"], extra=f"\n[[steps]]\n{step}\n")
    result = build(load_pipeline(pipeline), LocalStore(root / "store"), InProcessExecutor(), (), Progress(quiet=True))
    manifest = result.snapshot.manifest
    samples = read_samples(root / "store", manifest)
    written = {json.loads(members["json"])["id"]: members["txt"].decode() for _, members in samples}
    (stats,) = manifest["stats"]["steps"]
    (config,) = manifest["config"]["steps"]
    return stats, written, config


def config_error(table: dict[str, object]) -> str:
    """The one-line error of a pipeline whose only step is `table`."""
    with pytest.raises(ConfigError) as caught:
        parse_pipeline({**MINIMAL, "steps": [table]}, Path("/somewhere"), "p.toml")
    message = str(caught.value)
    assert "\n" not in message
    return message
