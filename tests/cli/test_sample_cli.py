"""`prep sample` writes the sample's data and its pipeline, so the README's quick start
(`prep sample && prep build pipelines/sample.toml`) works in any folder, not only in a checkout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from prep import sample as sample_module
from prep.cli.main import cli
from prep.sample import DEFAULT_FOLDER, pipeline_text
from tests.helpers import run_prep

REPO = Path(__file__).resolve().parents[2]
SMALL = ("--documents", "40", "--vocab-size", "300")


def test_default_pipeline_is_the_repository_sample_pipeline() -> None:
    assert pipeline_text(DEFAULT_FOLDER) == (REPO / "pipelines" / "sample.toml").read_text(encoding="utf-8")


def test_quick_start_works_in_an_empty_folder(tmp_path: Path) -> None:
    run_prep("sample", *SMALL, cwd=tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "pipelines").rglob("*")) == [
        "pipelines/sample-data", "pipelines/sample-data/corpus.jsonl", "pipelines/sample-data/tokenizer.json",
        "pipelines/sample.toml"]
    result = run_prep("build", "pipelines/sample.toml", "--workers", "1", cwd=tmp_path)
    snapshot_id = result.stdout.strip().splitlines()[-1]
    assert snapshot_id.startswith("sha256:")
    assert (tmp_path / "prep-store" / "refs" / "sample" / "latest.json").exists()


def test_pipeline_goes_beside_another_folder_and_builds(tmp_path: Path) -> None:
    run_prep("sample", "data", *SMALL, cwd=tmp_path)
    assert 'paths = ["data/corpus.jsonl"]' in (tmp_path / "sample.toml").read_text(encoding="utf-8")
    run_prep("build", tmp_path / "sample.toml", "--store", tmp_path / "store", "--workers", "1")
    assert (tmp_path / "store" / "refs" / "sample" / "latest.json").exists()


def test_an_existing_pipeline_is_kept(tmp_path: Path) -> None:
    pipeline = tmp_path / "pipelines" / "sample.toml"
    pipeline.parent.mkdir()
    pipeline.write_text("# edited by hand\n", encoding="utf-8")
    result = run_prep("sample", *SMALL, cwd=tmp_path)
    assert pipeline.read_text(encoding="utf-8") == "# edited by hand\n"
    assert "kept the existing" in result.stderr
    assert (tmp_path / "pipelines" / "sample-data" / "corpus.jsonl").exists()


def test_documents_beyond_the_top_level_modules_are_honoured(tmp_path: Path) -> None:
    """--documents 2500 once gave the 2087 docstrings of the top-level modules only; packages come next."""
    result = run_prep("sample", "data", "--documents", "2500", "--vocab-size", "300", cwd=tmp_path)
    lines = (tmp_path / "data" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    ids = [json.loads(line)["id"] for line in lines]
    assert len(ids) == 2500 + 6 and len(set(ids)) == len(ids)
    assert "(2500 docstrings, plus 6 records showing" in result.stderr and "note:" not in result.stderr


def test_fewer_documents_than_asked_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    library = tmp_path / "lib"
    docstring = '"""' + "A module docstring long enough to count as a document of the sample corpus. " * 2 + '"""\n'
    for name in ("alpha.py", "pkg/beta.py", "test/test_gamma.py", "site-packages/other/delta.py"):
        (library / name).parent.mkdir(parents=True, exist_ok=True)
        (library / name).write_text(docstring + f"def f():\n    {docstring}", encoding="utf-8")
    monkeypatch.setattr(sample_module, "stdlib_root", lambda: library)
    assert [doc_id for doc_id, _ in sample_module.stdlib_docstrings(100)] == [
        "alpha.<module>.0", "alpha.f.2", "pkg.beta.<module>.0", "pkg.beta.f.2", "test.test_gamma.<module>.0",
        "test.test_gamma.f.2"]  # top level, packages, tests; never installed packages
    result = CliRunner().invoke(cli, ["sample", str(tmp_path / "out"), "--documents", "10", "--vocab-size", "300"])
    assert result.exit_code == 0, result.output
    assert "(6 docstrings, plus 1 record showing" in result.stderr
    assert "note: 10 documents were asked for, but this Python's standard library has only 6 docstrings" \
        in result.stderr


def test_quiet_sample_prints_nothing(tmp_path: Path) -> None:
    result = run_prep("sample", "data", *SMALL, "--quiet", cwd=tmp_path)
    assert result.stderr == "" and (tmp_path / "sample.toml").exists()
