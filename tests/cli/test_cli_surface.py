"""What the CLI says around its results (issue 39): config mistakes as one error line, -q silencing
notes, skipped records announced, typo suggestions, plurals and byte counts, help a wheel user can follow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import make_records, run_prep, write_jsonl, write_pipeline


@pytest.fixture()
def project(tmp_path: Path, tokenizer_path: Path) -> Path:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(30, seed=1))
    write_pipeline(tmp_path, tokenizer_path)
    return tmp_path


def _build(project: Path, *args: str, check: bool = True) -> tuple[int, str, str]:
    result = run_prep("build", project / "pipeline.toml", "--store", project / "store", "--workers", "1", *args,
                      check=check, timeout=120)
    return result.returncode, result.stdout, result.stderr


def _error_line(stderr: str) -> str:
    """The one `prep: error:` line, and no traceback."""
    lines = [line for line in stderr.splitlines() if line.startswith("prep: error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_an_id_field_that_is_the_text_field_is_a_config_error(project: Path) -> None:
    """It was an IndexError traceback from the tokenize tasks, exit 1, and no JSON with --json."""
    write_pipeline(project, Path("unused"), id_field="text")
    code, out, err = _build(project, "--json", check=False)
    assert code == 2
    assert _error_line(err).startswith(f"prep: error: {project / 'pipeline.toml'}: input.id_field: must name another "
                                       "field than input.text_field ('text')")
    assert json.loads(out) == {"schema": "prep.error/1", "error": _error_line(err).removeprefix("prep: error: "),
                               "exit_code": 2, "kind": "config"}
    assert not (project / "store").exists()
