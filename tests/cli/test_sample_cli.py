"""`prep sample` writes the sample's data and its pipeline, so the README's quick start
(`prep sample && prep build pipelines/sample.toml`) works in any folder, not only in a checkout."""

from __future__ import annotations

from pathlib import Path

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
