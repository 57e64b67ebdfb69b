"""What the CLI says around its results (issue 39): config mistakes as one error line, -q silencing
notes, skipped records announced, typo suggestions, plurals and byte counts, help a wheel user can follow."""

from __future__ import annotations

import json
import re
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


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> tuple[Path, str]:
    """A project built once into its store (bin and wds): (folder, snapshot id)."""
    root = tmp_path_factory.mktemp("surface")
    write_jsonl(root / "corpus" / "a.jsonl", make_records(30, seed=2))
    write_pipeline(root, tokenizer_path)
    return root, _build(root)[1].split()[-1]


@pytest.mark.parametrize("where", ["group", "command"])
def test_quiet_pull_prints_no_summary(built: tuple[Path, str], tmp_path: Path, where: str) -> None:
    """`pulled ... into DEST: ...` printed with -q too."""
    root, snapshot = built
    quiet = ("-q", "pull") if where == "group" else ("pull", "-q")
    result = run_prep(*quiet, snapshot, tmp_path / "dest", "--store", root / "store", timeout=120)
    assert (result.stdout, result.stderr) == ("", "")
    assert (tmp_path / "dest" / ".prep" / "manifest.json").is_file()
    loud = run_prep("pull", snapshot, tmp_path / "dest", "--store", root / "store", timeout=120)
    assert loud.stderr.startswith(f"pulled {snapshot} into {tmp_path / 'dest'}: 0 files copied")


def test_tag_says_what_an_earlier_read_back_means_and_quiet_silences_it(built: tuple[Path, str]) -> None:
    """`read-back: all 4 objects passed before` said nothing a user could act on, and -q kept it."""
    root, snapshot = built
    loud = run_prep("tag", snapshot, "loud", "--store", root / "store", timeout=120)
    assert loud.stdout == f"tiny@loud -> {snapshot} (generation 1)\n"
    assert re.fullmatch(r"prep: read-back: all \d+ objects were already read back by an earlier build or tag; "
                        r"not read again\n", loud.stderr), loud.stderr
    quiet = run_prep("tag", snapshot, "quiet", "--store", root / "store", "-q", timeout=120)
    assert (quiet.stdout, quiet.stderr) == (f"tiny@quiet -> {snapshot} (generation 1)\n", "")


def test_quiet_init_prints_nothing(tmp_path: Path) -> None:
    """`wrote .prep/config.toml: ...` printed with -q too."""
    result = run_prep("init", "-q", cwd=tmp_path, timeout=60)
    assert (result.stdout, result.stderr) == ("", "") and (tmp_path / ".prep" / "config.toml").is_file()


def test_a_build_that_skipped_records_says_how_many_and_where_they_are_listed(project: Path, tokenizer_path: Path) -> None:
    """Under input.on_error = "skip" nothing on a build's output said that records were dropped."""
    with open(project / "corpus" / "a.jsonl", "a") as corpus:
        corpus.write('{"id": "y", "text": broken}\n{"id": "z"}\n')
    write_pipeline(project, tokenizer_path, extra_input='on_error = "skip"\n')
    code, out, err = _build(project)
    store = project / "store"
    lines = [line for line in err.splitlines() if "skipped" in line]
    assert lines == [f"prep: skipped 2 bad records (input.on_error = \"skip\"): `prep log tiny --builds --store {store}` "
                     "lists them"], err
    assert out.startswith("sha256:") and len(out.split()) == 1
    listed = run_prep("log", "tiny", "--builds", "--store", store, timeout=60).stdout
    assert "skipped  2 bad records:" in listed and "a.jsonl:31" in listed
    assert _build(project, "-q")[2] == ""
