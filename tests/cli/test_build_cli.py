"""`prep build` through the real CLI: output contract and bad-input errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import make_records, run_prep, write_jsonl, write_pipeline


@pytest.fixture()
def project(tmp_path: Path, tokenizer_path: Path) -> Path:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(30, seed=1))
    write_pipeline(tmp_path, tokenizer_path)
    return tmp_path


def test_build_prints_snapshot_id_last_and_progress_on_stderr(project: Path) -> None:
    result = run_prep("build", project / "pipeline.toml", "--store", project / "store", "--workers", "1", "--tag", "v1")
    snapshot_id = result.stdout.strip().splitlines()[-1]
    assert snapshot_id.startswith("sha256:") and len(snapshot_id) == 71
    assert "tokenize" in result.stderr and "shard" in result.stderr
    shown = run_prep("show", "tiny@v1", "--store", project / "store")
    assert snapshot_id in shown.stdout and "documents" in shown.stdout
    raw = run_prep("show", snapshot_id[7:19], "--store", project / "store", "--json")
    import hashlib

    assert "sha256:" + hashlib.sha256(raw.stdout.encode().rstrip(b"\n")).hexdigest() == snapshot_id
    history = run_prep("log", "tiny", "--store", project / "store")
    assert history.stdout.count(snapshot_id) == 2  # latest and v1


def test_store_comes_from_env_then_pipeline(project: Path) -> None:
    pipeline = project / "pipeline.toml"
    pipeline.write_text('store = "from-file"\n' + pipeline.read_text())
    run_prep("build", pipeline, "--workers", "1")
    assert (project / "from-file" / "refs" / "tiny" / "latest.json").exists()
    from tests.helpers import prep_env

    run_prep("build", pipeline, "--workers", "1", env=prep_env(PREP_STORE=str(project / "from-env")))
    assert (project / "from-env" / "refs" / "tiny" / "latest.json").exists()


def _expect_input_error(project: Path, *needles: str, pipeline: str = "pipeline.toml") -> None:
    result = run_prep("build", project / pipeline, "--store", project / "store", "--workers", "1", check=False)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("prep: error:")]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not (project / "store" / "refs").exists() or not any((project / "store" / "refs").rglob("*.json"))
    assert not (project / "store" / "snapshots").exists() or not any((project / "store" / "snapshots").iterdir())


def test_malformed_json_line_names_file_and_line(project: Path) -> None:
    with open(project / "corpus" / "a.jsonl", "a") as out:
        out.write('{"id": "x", "text": "fine"}\n{"id": "y", "text": broken}\n')
    _expect_input_error(project, "a.jsonl:32", "malformed JSON")


def test_missing_text_field(project: Path) -> None:
    with open(project / "corpus" / "a.jsonl", "a") as out:
        out.write('{"id": "x", "body": "no text"}\n')
    _expect_input_error(project, "a.jsonl:31", "missing text field 'text'")


def test_invalid_utf8(project: Path) -> None:
    with open(project / "corpus" / "a.jsonl", "ab") as out:
        out.write(b'{"id": "x", "text": "caf\xe9"}\n')
    _expect_input_error(project, "a.jsonl:31", "invalid UTF-8")


def test_unreadable_file(project: Path) -> None:
    (project / "corpus" / "b.jsonl").mkdir()  # a folder where a file should be: fails to open even as root
    pipeline = project / "pipeline.toml"
    text = pipeline.read_text()
    pipeline.write_text(text.replace('paths = ["corpus/*.jsonl"]', 'paths = ["corpus/a.jsonl", "corpus/b.jsonl/"]'))
    result = run_prep("build", pipeline, "--store", project / "store", "--workers", "1", check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr


def test_missing_input_path(project: Path) -> None:
    pipeline = project / "pipeline.toml"
    pipeline.write_text(pipeline.read_text().replace("corpus/*.jsonl", "corpus/nothing-*.jsonl"))
    _expect_input_error(project, "input.paths", "nothing-*.jsonl")


def test_missing_tokenizer(project: Path) -> None:
    pipeline = project / "pipeline.toml"
    text = pipeline.read_text()
    start = text.index('path = "', text.index("[tokenizer]"))
    end = text.index("\n", start)
    pipeline.write_text(text[:start] + 'path = "missing-tokenizer.json"' + text[end:])
    _expect_input_error(project, "missing-tokenizer.json", "not found")


def test_empty_corpus_names_the_input_files(project: Path) -> None:
    (project / "corpus" / "a.jsonl").write_text("\n\n")
    _expect_input_error(project, "no documents in 1 input file: ", str(project / "corpus" / "a.jsonl"))


def test_empty_corpus_of_many_files_names_the_first_few(project: Path) -> None:
    for index in range(7):
        (project / "corpus" / f"e{index}.jsonl").write_text("\n")
    (project / "corpus" / "a.jsonl").write_text("")
    _expect_input_error(project, "no documents in 8 input files: ", "e3.jsonl", "and 3 more")


def test_unknown_config_key(project: Path) -> None:
    pipeline = project / "pipeline.toml"
    pipeline.write_text(pipeline.read_text().replace("[dedup]\n", "[dedup]\nfuzzy = true\n"))
    _expect_input_error(project, "dedup.fuzzy", "unknown key")


def test_wrong_type_names_key(project: Path) -> None:
    pipeline = project / "pipeline.toml"
    pipeline.write_text(pipeline.read_text().replace("seed = 1234", 'seed = "1234"'))
    _expect_input_error(project, "seed", "expected int")


def test_skip_policy_counts_bad_records(project: Path) -> None:
    with open(project / "corpus" / "a.jsonl", "a") as out:
        out.write('{"id": "y", "text": broken}\n{"id": "z"}\n')
    pipeline = project / "pipeline.toml"
    pipeline.write_text(pipeline.read_text().replace('id_field = "id"\n', 'id_field = "id"\non_error = "skip"\n'))
    result = run_prep("build", pipeline, "--store", project / "store", "--workers", "1")
    shown = run_prep("show", result.stdout.split()[-1], "--store", project / "store", "--json")
    import json

    stats = json.loads(shown.stdout)["stats"]
    assert stats["bad_records_skipped"] == 2 and stats["documents_read"] == 30
    logs = list((project / "store" / "logs" / "tiny").glob("*.json"))
    skipped = json.loads(logs[0].read_text())["skipped"]
    assert skipped["total"] == 2 and [(s["file"], s["line"]) for s in skipped["listed"]] == [("a.jsonl", 31), ("a.jsonl", 32)]


def test_a_no_op_rebuild_says_up_to_date_and_moves_no_ref(project: Path) -> None:
    args = ("build", project / "pipeline.toml", "--store", project / "store", "--workers", "1")
    first = run_prep(*args, "--tag", "v1")
    again = run_prep(*args, "--tag", "v1")
    assert again.stdout == first.stdout
    assert "up to date" in again.stderr and "published" not in again.stderr
    history = run_prep("log", "tiny", "--store", project / "store").stdout
    assert history.count(" gen 1 ") == 2 and " gen 2 " not in history


def test_expect_a_stale_generation_exits_2_and_moves_nothing(project: Path) -> None:
    args = ("build", project / "pipeline.toml", "--store", project / "store", "--workers", "1")
    refused = run_prep(*args, "--expect", "1", check=False)  # no latest yet: it is absent, not at 1
    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == \
        "prep: error: tiny@latest is absent, not generation 1 as expected; left unmoved; nothing built"
    assert run_prep(*args, "--expect", "none").returncode == 0
    assert run_prep(*args, "--expect", "seven", check=False).returncode == 2
    reserved = run_prep(*args, "--tag", "latest", check=False)
    assert reserved.returncode == 2 and "reserved" in reserved.stderr
