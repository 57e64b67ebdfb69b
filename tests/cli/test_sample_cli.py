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


def test_the_quick_start_runs_twice_in_a_row(tmp_path: Path) -> None:
    """`prep sample && prep build pipelines/sample.toml` again (CI's and the README's quick start):
    the files already hold the sample, are left as they are, and the rebuild is up to date."""
    data = tmp_path / "pipelines" / "sample-data"
    build = ("build", "pipelines/sample.toml", "--workers", "1")
    run_prep("sample", *SMALL, cwd=tmp_path)
    first = run_prep(*build, cwd=tmp_path).stdout
    stamps = {path.name: path.stat().st_mtime_ns for path in data.iterdir()}
    again = run_prep("sample", *SMALL, cwd=tmp_path)
    assert again.stderr.startswith(f"{Path('pipelines/sample-data/corpus.jsonl')} (40 docstrings, ")
    assert "already hold this sample: left as they are" in again.stderr
    assert {path.name: path.stat().st_mtime_ns for path in data.iterdir()} == stamps
    assert run_prep(*build, cwd=tmp_path).stdout == first


@pytest.mark.parametrize("name", ["corpus.jsonl", "tokenizer.json"])
def test_an_edited_sample_file_is_refused_unless_forced(tmp_path: Path, name: str) -> None:
    """`prep sample` wrote its corpus and tokenizer over an edited one (it kept only sample.toml)."""
    run_prep("sample", "data", *SMALL, cwd=tmp_path)
    edited = tmp_path / "data" / name
    edited.write_bytes(edited.read_bytes() + b"\n")
    before = {path.name: path.read_bytes() for path in (tmp_path / "data").iterdir()}
    refused = run_prep("sample", "data", *SMALL, "--json", cwd=tmp_path, check=False)
    message = (f"{Path('data') / name} differs from the sample this would write (edited, or made with other --documents "
               "or --vocab-size); nothing was written: pass --force to replace it")
    assert (refused.returncode, refused.stderr) == (2, f"prep: error: {message}\n")
    assert json.loads(refused.stdout) == {"schema": "prep.error/1", "error": message, "exit_code": 2, "kind": "usage"}
    assert {path.name: path.read_bytes() for path in (tmp_path / "data").iterdir()} == before
    forced = run_prep("sample", "data", *SMALL, "--force", cwd=tmp_path)
    assert forced.stderr.startswith(f"wrote {Path('data') / 'corpus.jsonl'} ")
    assert edited.read_bytes() == before[name][:-1]


def test_other_sizes_than_the_existing_sample_are_refused(tmp_path: Path) -> None:
    run_prep("sample", "data", *SMALL, cwd=tmp_path)
    refused = run_prep("sample", "data", "--documents", "41", "--vocab-size", "300", cwd=tmp_path, check=False)
    assert refused.returncode == 2 and refused.stderr.startswith(f"prep: error: {Path('data') / 'corpus.jsonl'} differs")
