"""What the CLI says around its results (issue 39): config mistakes as one error line, -q silencing
notes, skipped records announced, typo suggestions, plurals and byte counts, help a wheel user can follow."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from prep.cli.main import COMMANDS, cli
from prep.store.layout import object_key
from tests.cli.test_main_cli import run_main
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


def test_counts_of_one_are_singular(project: Path, tokenizer_path: Path) -> None:
    """`1 files`, `1 findings`, `1 duplicates`, `1 of 1 tokenize tasks`: every count goes through plural()."""
    records = make_records(30, seed=1)
    write_jsonl(project / "corpus" / "a.jsonl", [*records, {"id": "copy", "text": records[0]["text"]}])
    write_pipeline(project, tokenizer_path, shard_size="1MB", formats='["wds"]')
    store = ("--store", project / "store")
    status = run_prep("status", project / "pipeline.toml", *store, timeout=60).stdout
    assert "a build would run 1 of 1 tokenize task and 3 of 3 stages" in status and "0 of 1 task committed" in status
    code, out, err = _build(project)
    assert re.search(r"order: done in [\d.]+s, 30 documents kept, 1 duplicate\n", err), err
    shown = run_prep("show", "tiny@latest", *store, timeout=60).stdout
    assert "inputs     1 file, " in shown and "1 duplicate dropped" in shown and "wds: 1 file, " in shown
    pulled = run_prep("pull", "tiny@latest", project / "dest", *store, timeout=60)
    assert ": 1 file copied (" in pulled.stderr, pulled.stderr
    assert "1 of 1 file match" in run_prep("verify", "tiny@latest", project / "dest", *store, timeout=60).stdout
    assert run_prep("gc", "--dry-run", *store, timeout=60).stdout.startswith(f"{project / 'store'}: 1 ref; grace period")
    artifact = json.loads((project / "dest" / ".prep" / "manifest.json").read_text())["artifacts"][0]
    stored = project / "store" / object_key(artifact["sha256"])
    stored.chmod(0o644)
    stored.write_bytes(b"corrupt")
    fsck = run_prep("fsck", *store, check=False, timeout=60)
    assert fsck.returncode == 1 and fsck.stdout.splitlines()[-1] == "1 finding", fsck.stdout
    assert re.search(r"fsck: done in [\d.]+s, \d+ objects, \d+ records, 1 finding\n", fsck.stderr), fsck.stderr
    repaired = run_prep("fsck", "--repair", *store, check=False, timeout=60).stderr
    # the shard stage record, and the pack that committed the shard task naming the object
    assert "fsck: repair removed 2 records and 1 object, restored 0 snapshot markers; 0 unrepairable" in repaired, repaired


def test_a_trace_of_one_token_and_one_byte_is_singular() -> None:
    from prep.cli.render import trace_lines
    from prep.history.lineage import DocumentOrigin, Trace

    found = Trace(DocumentOrigin(0, "a-1", "a.jsonl", 1, "00" * 16, 1, 1, 0, 0), 0, ())
    assert trace_lines(found)[0] == f"document  a-1  (a.jsonl line 1; 1 token + EOS, 1 byte of text, text xxh3-128 {'00' * 16})"


@pytest.mark.parametrize(("typo", "suggestion"), [("biuld", "build"), ("sho", "show"), ("verfiy", "verify")])
def test_a_mistyped_command_gets_a_suggestion(capsys: pytest.CaptureFixture[str], typo: str, suggestion: str) -> None:
    code, out, err = run_main(capsys, typo, "x", "--json")
    message = f"no such command {typo!r}; did you mean {suggestion!r}? (see prep --help)"
    assert (code, err) == (2, f"prep: error: {message}\n")
    assert json.loads(out) == {"schema": "prep.error/1", "error": message, "exit_code": 2, "kind": "usage"}


@pytest.mark.parametrize("command", [[], *([name] for name in sorted(COMMANDS))])
def test_help_points_at_nothing_a_wheel_does_not_install(command: list[str]) -> None:
    """`--store`'s help said `(see docs/cli.md)`: docs/ is not in the wheel."""
    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "docs/" not in result.output and ".md" not in result.output, result.output


def test_drill_prints_byte_counts_as_every_command_does() -> None:
    """`through a 64000000-byte cache`, `fetched 1234567 bytes`: raw counts, and `1 ranks`."""
    from prep.cli.data import drill_lines

    waits = {"p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0, "total": 0.0}
    report = {"settings": {"source": "tiny@latest", "world_size": 1, "steps": 1, "seq_len": 8, "global_batch": 1,
                           "cache_bytes": 64_000_000}, "wall_seconds": 1.0,
              "ranks": [{"rank": 0, "first_batch_seconds": 0.5, "bytes_fetched": 1_234_567, "fetches": 1,
                         "bytes_refetched": 0, "peak_cache_bytes": 999, "fetch_seconds": waits,
                         "fetch_share_after_first_batch": 0.5}],
              "totals": {"bytes_fetched": 1_234_567, "distinct_objects_fetched": 1},
              "duplicates": {"fetches": 1, "bytes": 2048, "objects_fetched_by_several_ranks": 1}}
    lines = drill_lines(report)
    assert lines[0] == "tiny@latest: 1 rank (processes) read 1 step (seq_len 8, global batch 1) through a 64.0 MB cache in 1.00 s"
    assert lines[1].startswith("  rank 0: first batch 0.500 s, fetched 1.2 MB (1 object, 0 B again), peak cache 999 B, ")
    assert lines[2] == "node: 1.2 MB fetched, 1 distinct object, 1 duplicate fetch (2.0 kB; 1 object fetched by several ranks)"


def test_megatron_paths_of_a_wds_only_pull_say_what_the_folder_holds(built: tuple[Path, str], tmp_path: Path) -> None:
    """It said `12 of 12 shards are not in DEST (another rank's share, or an unfinished pull)`."""
    root, snapshot = built
    dest = tmp_path / "dest"
    run_prep("pull", snapshot, dest, "--store", root / "store", "--formats", "wds", timeout=120)
    result = run_prep("show", dest, "--megatron-paths", check=False, timeout=60)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"prep: error: {dest} holds the wds format only (pulled with --formats wds): pull it with "
                             "--formats bin, or without --formats, for Megatron paths\n")
    run_prep("pull", snapshot, dest, "--store", root / "store", "--formats", "bin", timeout=120)
    paths = run_prep("show", dest, "--megatron-paths", timeout=60).stdout.splitlines()
    assert paths and all(Path(f"{path}.bin").is_file() for path in paths)


def test_the_read_back_line_counts_bytes_as_every_command_does() -> None:
    """`(0.0 MB)` for a small snapshot: bytes in their own unit, like every other line."""
    from prep.runner.readback import Readback

    done = Readback(True, objects=4, checked=2, bytes_read=3000, when_written=2, bytes_when_written=153_000)
    assert done.summary() == "read back 2 of 4 objects (3.0 kB) in 0.00 s, 2 more (153.0 kB) from the disk as they were written"
