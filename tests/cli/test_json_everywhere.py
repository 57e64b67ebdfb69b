"""Every command takes --json: on success stdout is one document of the command's schema, on
failure a prep.error/1 object with the exit code; one test walks all of COMMANDS, so a new
command without a JSON report fails here."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from prep.cli.main import COMMANDS, main
from prep.manifest.schema import validate
from tests.cli.test_main_cli import run_main
from tests.helpers import make_records, write_jsonl, write_pipeline


@dataclass(frozen=True)
class Project:
    """A built dataset `tiny` in `store`, its pipeline, and a pulled copy in `dest`."""

    root: Path
    pipeline: Path
    store: Path
    dest: Path
    document: str


def one_document(out: str, schema_id: str) -> dict[str, object]:
    """stdout holds exactly one JSON document, valid against `schema_id`."""
    document = json.loads(out)
    assert isinstance(document, dict) and document.get("schema") == schema_id, out[:200]
    validate(document, schema_id, "stdout")
    return document


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Project:
    root = tmp_path_factory.mktemp("json-everywhere")
    write_jsonl(root / "corpus" / "a.jsonl", make_records(40, seed=3))
    pipeline = write_pipeline(root, tokenizer_path, shard_size="2KB")
    store, dest = root / "store", root / "dest"
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        for argv in (["build", pipeline, "--store", store, "--workers", "1", "-q"],
                     ["pull", "tiny@latest", dest, "--store", store, "-q"]):
            with pytest.raises(SystemExit) as exited:
                main([str(arg) for arg in argv])
            assert exited.value.code in (0, None)
    return Project(root, pipeline, store, dest, "doc-7")


def _request(p: Project, line: str) -> Path:
    """A deletion request file of one line."""
    path = p.root / f"request-{len(line)}.txt"
    path.write_text(f"# a request\n{line}\n")
    return path


def successes(p: Project) -> dict[str, list[tuple[list[str | Path], str]]]:
    """For each command, invocations that succeed and the schema of what they print."""
    s: list[str | Path] = ["--store", p.store]
    return {
        "build": [(["build", p.pipeline, *s, "--workers", "1"], "prep.build-report/1")],
        "rebuild": [(["rebuild", "tiny@latest", "--inputs", p.root / "corpus", *s, "--workers", "1"],
                     "prep.rebuild-report/1")],
        "show": [(["show", "tiny@latest", *s], "prep.snapshot/1"), (["show", p.dest], "prep.snapshot/1"),
                 (["show", "tiny@latest", "--stats", *s], "prep.stats-report/1")],
        "log": [(["log", "tiny", *s], "prep.log-report/1"), (["log", "tiny", "--builds", *s], "prep.log-report/1")],
        "pull": [(["pull", "tiny@latest", p.dest, *s], "prep.pull-report/1")],
        "verify": [(["verify", "tiny@latest", p.dest, *s], "prep.verify-report/2")],
        "copy": [(["copy", "tiny@latest", "--to", p.root / "copied", *s], "prep.copy-report/1")],
        "diff": [(["diff", "tiny@latest", "tiny@latest", *s], "prep.diff-report/1")],
        "tag": [(["tag", "tiny@latest", "v1", *s], "prep.tag-report/1")],
        "ls": [(["ls", *s], "prep.ls-report/1"), (["ls", "tiny", *s], "prep.ls-report/1")],
        "trace": [(["trace", "tiny@latest", p.document, *s], "prep.trace-report/1"),
                  (["trace", "--all", p.document, *s], "prep.trace-all-report/1")],
        "redact": [(["redact", _request(p, "id:no-such-document"), "--dataset", "tiny", *s], "prep.redact-report/1")],
        "status": [(["status", p.pipeline, *s], "prep.status-report/1")],
        "gc": [(["gc", "--dry-run", *s], "prep.gc-report/2")],
        "fsck": [(["fsck", *s], "prep.fsck-report/1")],
        "hold": [(["hold", "tiny@latest", *s], "prep.hold-report/1")],
        "release": [(["hold", "tiny@latest", *s], "prep.hold-report/1"),
                    (["release", "tiny@latest", *s], "prep.hold-report/1")],
        "sample": [(["sample", p.root / "sample-data", "--documents", "20", "--vocab-size", "300"],
                    "prep.sample-report/1")],
        "consumed": [(["consumed", "tiny@latest", *s, "--samples", "2", "--seq-len", "8"], "prep.consumed-report/1")],
        "drill": [(["drill", "tiny@latest", *s, "--world-size", "1", "--cache-bytes", "10MB", "--steps", "2",
                    "--seq-len", "8", "--global-batch", "1"], "prep.drill-report/1")],
        "init": [(["init", "--store", p.store], "prep.init-report/1")],
        "completion": [(["completion", "bash"], "prep.completion/1")],
    }


def failures(p: Project) -> dict[str, list[str | Path]]:
    """For each command, an invocation that fails for a reason the command itself names (not a usage error)."""
    absent: list[str | Path] = ["--store", p.root / "absent"]
    return {
        "build": ["build", p.root / "no-such-pipeline.toml"],
        "rebuild": ["rebuild", "tiny@latest", "--inputs", p.root / "no-such-folder", "--store", p.store],
        "show": ["show", "tiny@latest", *absent],
        "log": ["log", "tiny", *absent],
        "pull": ["pull", "tiny@latest", p.root / "pulled-again", *absent],
        "verify": ["verify", "tiny@latest", p.dest, *absent],
        "copy": ["copy", "tiny@latest", "--to", p.root / "copied-again", *absent],
        "diff": ["diff", "tiny@latest", "tiny@nope", "--store", p.store],
        "tag": ["tag", "tiny@latest", "latest", "--store", p.store],
        "ls": ["ls", *absent],
        "trace": ["trace", "tiny@latest", "no-such-document", "--store", p.store],
        "redact": ["redact", _request(p, "no-prefix"), "--dataset", "tiny", "--store", p.store],
        "status": ["status", p.root / "no-such-pipeline.toml"],
        "gc": ["gc", *absent],
        "fsck": ["fsck", *absent],
        "hold": ["hold", "tiny@nope", "--store", p.store],
        "release": ["release", "tiny@latest", "--store", p.store],
        "sample": ["sample", p.pipeline],
        "consumed": ["consumed", "tiny@latest", *absent, "--samples", "1", "--seq-len", "8"],
        "drill": ["drill", "tiny@latest", *absent, "--world-size", "1", "--cache-bytes", "1MB", "--steps", "1",
                  "--seq-len", "8", "--global-batch", "1"],
        "init": ["init", "--store", p.store],  # run where a config exists already
        "completion": ["completion", "tcsh"],
    }


def test_every_command_is_walked(project: Project) -> None:
    assert set(successes(project)) == set(COMMANDS) == set(failures(project))


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_json_output_validates_on_success_and_on_failure(project: Project, name: str,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project.root)
    if name == "init":
        monkeypatch.chdir(project.root / "corpus")  # a fresh folder for the success; the failure reruns there
    for argv, schema_id in successes(project)[name]:
        code, out, _err = run_main(capsys, *argv, "--json")
        assert code == 0, (argv, out)
        one_document(out, schema_id)
    code, out, err = run_main(capsys, *failures(project)[name], "--json")
    error = one_document(out, "prep.error/1")
    assert code == error["exit_code"] != 0
    assert err.strip().splitlines()[-1] == f"prep: error: {error['error']}"
