"""The history and lineage commands through the real CLI: output, JSON reports validated against
their schemas, and exit statuses (diff: 0 identical, 1 different, 2 error), on layout-2 builds
and on a layout-1 snapshot of the same inputs (tiny@layout1, tests/history/layout1_factory.py)."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from prep.cli.main import main
from prep.manifest.schema import validate
from prep.storage import LocalStore
from prep.store.snapshots import resolve
from tests.helpers import make_records, prep_env, run_prep, write_jsonl, write_pipeline
from tests.history.layout1_factory import synthesize_layout1


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


def prep(*args: str | Path, check: bool = True) -> Ran:
    """Run `prep` in this process through main(), as the console script does (without the
    interpreter start-up); `check` asserts exit status 0."""
    with CliRunner().isolation() as (out, err, _), pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["prep", *map(str, args)])
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 0
        sys.stdout.flush()
        ran = Ran(code, out.getvalue().decode(), err.getvalue().decode())
    if check:
        assert ran.returncode == 0, f"prep {' '.join(map(str, args))} exited {ran.returncode}: {ran.stderr}"
    return ran


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Path:
    """tiny@v1, then tiny@latest with one document edited, one removed and one added; tiny@layout1
    is the layout-1 snapshot of v1's inputs."""
    root = tmp_path_factory.mktemp("history-cli")
    records = make_records(30, seed=5, prefix="d")
    write_jsonl(root / "v1" / "corpus" / "docs.jsonl", records)
    edited = [*records[:3], {"id": "d-3", "text": "an edited third document"}, *records[5:],
              {"id": "d-new", "text": "a document added in v2"}]
    write_jsonl(root / "v2" / "corpus" / "docs.jsonl", edited)
    store = root / "store"
    for version, extra in (("v1", ("--tag", "v1")), ("v2", ())):
        pipeline = write_pipeline(root / version, tokenizer_path, shard_size="2KB")
        run_prep("build", pipeline, "--store", store, "--workers", "1", *extra)
    local = LocalStore(store)
    synthesize_layout1(local, resolve(local, "tiny@v1"), ref="layout1")
    return store


def test_diff_exit_status_and_summary(store: Path) -> None:
    same = prep("diff", "tiny@v1", "tiny@v1", "--store", store)
    assert same.stdout.rstrip().endswith("identical")
    different = run_prep("diff", "tiny@v1", "tiny@latest", "--store", store, "--documents", check=False)
    assert different.returncode == 1, different.stderr
    text = different.stdout
    assert "inputs     0 added, 0 removed, 1 changed, 0 unchanged" in text
    assert "  ~ docs.jsonl" in text
    assert "documents  1 added, 1 removed, 1 changed, 28 unchanged (keyed by id" in text
    assert "  - docs.jsonl  d-4  (line 5)" in text
    assert "  ~ docs.jsonl  d-3  (line 4 -> 4)" in text
    assert "  + docs.jsonl  d-new  (line 30)" in text
    missing = prep("diff", "tiny@v1", "tiny@nope", "--store", store, check=False)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [f"prep: error: {store}: no ref tiny@nope"]


def test_diff_json_reports_validate(store: Path) -> None:
    plain = prep("diff", "tiny@v1", "tiny@latest", "--store", store, "--json", check=False)
    assert plain.returncode == 1
    report = json.loads(plain.stdout)
    validate(report, "prep.diff-report/1", "diff report")
    assert "documents" not in report and report["identical"] is False
    assert [entry["change"] for entry in report["provenance"]["files"]] == ["changed"]
    stats = {entry["key"]: entry for entry in report["stats"]}
    assert stats["documents_read"]["delta"] == 0 and stats["documents_written"]["delta"] == 0

    detailed = json.loads(prep("diff", "tiny@v1", "tiny@latest", "--store", store, "--json", "--documents",
                                   check=False).stdout)
    validate(detailed, "prep.diff-report/1", "diff report")
    documents = detailed["documents"]
    assert (documents["added"], documents["removed"], documents["changed"]) == (1, 1, 1)
    assert sorted((c["change"], (c.get("new") or c["old"])["id"]) for c in documents["changes"]) == \
        [("added", "d-new"), ("changed", "d-3"), ("removed", "d-4")]

    same = json.loads(prep("diff", "tiny@v1", "tiny@v1", "--store", store, "--json", "--documents").stdout)
    validate(same, "prep.diff-report/1", "diff report")
    assert same["identical"] is True and same["documents"]["changes"] == []


def test_diff_of_manifest_files_needs_no_store(store: Path, tmp_path: Path) -> None:
    for name in ("v1", "latest"):
        manifest = prep("show", f"tiny@{name}", "--store", store, "--json").stdout
        (tmp_path / f"{name}.json").write_text(manifest)
    result = prep("diff", tmp_path / "v1.json", tmp_path / "latest.json", "--store", tmp_path / "absent",
                      check=False)
    assert result.returncode == 1 and "settings   0 changed" in result.stdout
    assert not (tmp_path / "absent").exists()
    elsewhere = prep("diff", tmp_path / "v1.json", tmp_path / "latest.json", "--documents", "--store",
                     tmp_path / "other", check=False)
    assert elsewhere.returncode == 2  # --documents needs the stage manifests: a store, and "other" is none
    assert elsewhere.stderr == f"prep: error: {tmp_path / 'other'} is not a prep store (no prep keys there; " \
        "`prep init` or `prep build` makes one)\n"
    assert not (tmp_path / "other").exists()


def test_tag_ls_and_trace(store: Path) -> None:
    tagged = prep("tag", "tiny@latest", "golden", "--store", store).stdout
    assert tagged.startswith("tiny@golden -> sha256:") and "(generation 1)" in tagged
    listing = prep("ls", "--store", store).stdout.splitlines()
    assert [line.split()[0] for line in listing] == ["tiny@golden", "tiny@latest", "tiny@layout1", "tiny@v1"]
    assert all(" gen " in line and "sha256:" in line for line in listing)
    assert "no refs" in prep("ls", "other", "--store", store).stderr
    assert prep("tag", "tiny@latest", "bad name", "--store", store, check=False).returncode == 2

    traced = prep("trace", "tiny@latest", "d-new", "--store", store).stdout
    assert traced.startswith("document  d-new  (docs.jsonl line 30;")
    key = re.search(r"^key       ([0-9a-f]{32})  \(order key, also its WebDataset sample key\)$", traced, re.M)
    assert key is not None, traced
    places = re.findall(r"^  ((?:bin|wds)/[0-9a-f]{16}\.(?:bin|idx|tar)) sequence (\d+)", traced, re.M)
    assert sorted(path.rsplit(".", 1)[1] for path, _ in places) == ["bin", "idx", "tar"]
    assert len({sequence for _, sequence in places}) == 1
    assert prep("trace", "tiny@latest", "d-4", "--store", store, check=False).returncode == 2

    tar, sequence = next((path, number) for path, number in places if path.endswith(".tar"))
    at = prep("show", "tiny@latest", "--store", store, "--at", f"{tar}:{sequence}").stdout
    assert at == traced
    first = prep("show", "tiny@latest", "--store", store, "--at", f"{tar}:0").stdout
    assert first.startswith("document  d-") and f"{tar} sequence 0" in first
    missing = prep("show", "tiny@latest", "--store", store, "--at", "wds/00000.tar:0", check=False)
    assert missing.returncode == 2 and "has no artifact 'wds/00000.tar'" in missing.stderr


def test_layout1_snapshots_stay_readable(store: Path) -> None:
    traced = prep("trace", "tiny@layout1", "d-4", "--store", store).stdout
    assert traced.startswith("document  d-4  (docs.jsonl line 5;")
    position = re.search(r"^position  (\d+) in the shuffled order$", traced, re.M)
    assert position is not None, traced
    places = re.findall(r"^  ((?:bin|wds)/\d{5}\.(?:bin|idx|tar)) +sequence (\d+)", traced, re.M)
    assert len(places) == 3 and len({sequence for _, sequence in places}) == 1
    tar, sequence = next((path, number) for path, number in places if path.endswith(".tar"))
    assert prep("show", "tiny@layout1", "--store", store, "--at", f"{tar}:{sequence}").stdout == traced
    assert "wds/00000.tar    sequence 0" in prep("show", "tiny@layout1", "--store", store, "--at", "wds/00000.tar:0").stdout
    same = run_prep("diff", "tiny@layout1", "tiny@v1", "--store", store, "--documents", check=False)
    assert same.returncode == 1, same.stderr  # other stages and artifacts, the same documents
    assert "documents  0 added, 0 removed, 0 changed, 30 unchanged (keyed by id; files: 0 compared, 1 skipped" \
        in same.stdout
    edited = run_prep("diff", "tiny@layout1", "tiny@latest", "--store", store, "--documents", check=False)
    assert "documents  1 added, 1 removed, 1 changed, 28 unchanged (keyed by id" in edited.stdout
    assert "  ~ docs.jsonl  d-3  (line 4 -> 4)" in edited.stdout


def test_at_help_names_both_shard_naming_schemes() -> None:
    text = prep("show", "--help").stdout
    assert "bin/0000000000000000.bin:0" in " ".join(text.split()) and "bin/00000.bin:0" in text


def test_diff_header_names_each_side_once(store: Path) -> None:
    """Given by id, a side's header shows the id once; given by ref, the ref and then its id."""
    old_id = "sha256:" + hashlib.sha256(prep("show", "tiny@v1", "--json", "--store", store).stdout.encode()).hexdigest()
    header = prep("diff", old_id, "tiny@latest", "--store", store, check=False).stdout.splitlines()[:2]
    assert header[0] == f"--- {old_id}"
    assert header[1].startswith("+++ tiny@latest  sha256:") and header[1].count("sha256:") == 1


@pytest.mark.parametrize(("count", "shown"), [(0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (926_600, "926.6 kB"),
                                              (1_300_000_000, "1.3 GB"), (2 * 10**15, "2.0 PB")])
def test_one_byte_style_everywhere(count: int, shown: str) -> None:
    from prep.progress import human_bytes

    assert human_bytes(count) == shown


def test_trace_names_documents_by_source_line_with_an_id_field_and_prints_json(store: Path) -> None:
    by_line = prep("trace", "tiny@latest", "docs.jsonl:30", "--store", store).stdout
    assert by_line.startswith("document  d-new  (docs.jsonl line 30;")
    assert by_line == prep("trace", "tiny@latest", "d-new", "--store", store).stdout
    # v2 (latest) removed d-4, so its line 5 holds d-5; v1 (and its layout-1 copy) still has d-4 there
    for snap, doc_id, key in (("tiny@latest", "d-5", r"^[0-9a-f]{32}$"), ("tiny@layout1", "d-4", r"^[0-9]{10}$")):
        report = json.loads(prep("trace", snap, "docs.jsonl:5", "--json", "--store", store).stdout)
        validate(report, "prep.trace-report/1", "trace --json")
        [found] = report["documents"]
        assert (found["document"]["id"], found["document"]["line"], report["spec"]) == (doc_id, 5, "docs.jsonl:5")
        assert re.match(key, found["sample_key"]) and len(found["placements"]) == 3 and found["duplicate_of"] is None
    missing = prep("trace", "tiny@latest", "docs.jsonl:99", "--json", "--store", store, check=False)
    assert missing.returncode == 2 and "no document 'docs.jsonl:99'" in missing.stderr
    validate(json.loads(missing.stdout), "prep.error/1", "trace --json failure")
    for line in ("0", str(2**63), "9" * 30):  # no line 0; beyond int64 (a traceback before)
        beyond = prep("trace", "tiny@latest", f"docs.jsonl:{line}", "--store", store, check=False)
        assert beyond.returncode == 2 and beyond.stderr.startswith("prep: error: snapshot ")
        assert beyond.stderr.endswith(f" has no document 'docs.jsonl:{line}'\n") and beyond.stderr.count("\n") == 1


@pytest.mark.parametrize("spec", ["docs.jsonl:5", "d-5"])  # found by line, by id
def test_trace_and_show_at_never_import_pandas(store: Path, spec: str) -> None:
    """pandas costs a command 0.3 s and 38 MB; pyarrow imports it for `pa.scalar` and `to_pylist`."""
    pytest.importorskip("pandas")
    traced = run_prep("trace", "tiny@latest", spec, "--json", "--store", store, env=prep_env(PYTHONVERBOSE="1"))
    key = json.loads(traced.stdout)["documents"][0]["sample_key"]
    shown = run_prep("show", "tiny@latest", "--at", key, "--text", "--store", store, env=prep_env(PYTHONVERBOSE="1"))
    for ran in (traced, shown):
        assert re.search(r"^import 'pyarrow'", ran.stderr, re.M)  # the verbose listing this check reads
        assert not re.search(r"^import 'pandas'", ran.stderr, re.M)


@pytest.fixture
def own_store(store: Path, tmp_path: Path) -> Path:
    """A copy of the module's store that a test may move tags in."""
    import shutil

    copy = tmp_path / "store"
    shutil.copytree(store, copy, symlinks=True)
    return copy


def ref_line(store: Path, name: str) -> str:
    return next((line for line in prep("ls", "tiny", "--store", store).stdout.splitlines()
                 if line.startswith(f"tiny@{name} ")), "")


def test_tags_stay_put_unless_forced(own_store: Path) -> None:
    v1 = ref_line(own_store, "v1")
    refused = prep("tag", "tiny@latest", "v1", "--store", own_store, check=False)
    assert refused.returncode == 2 and refused.stderr.startswith("prep: error: tiny@v1 names sha256:")
    assert "use --force" in refused.stderr and len(refused.stderr.splitlines()) == 1
    assert ref_line(own_store, "v1") == v1
    same = prep("tag", "tiny@v1", "v1", "--store", own_store)
    assert "nothing moved" in same.stdout and ref_line(own_store, "v1") == v1
    stale = prep("tag", "tiny@latest", "v1", "--force", "--expect", "7", "--store", own_store, check=False)
    assert stale.returncode == 2 and "not generation 7" in stale.stderr and ref_line(own_store, "v1") == v1
    forced = prep("tag", "tiny@latest", "v1", "--force", "--expect", "1", "--store", own_store)
    assert "(generation 2)" in forced.stdout
    body = json.loads((own_store / "refs" / "tiny" / "v1.json").read_text())
    validate(body, "prep.ref/1")
    assert body["command"] == "tag" and body["user"] and body["host"]


def test_latest_is_reserved_and_tags_can_be_deleted(own_store: Path) -> None:
    reserved = prep("tag", "tiny@v1", "latest", "--store", own_store, check=False)
    assert reserved.returncode == 2 and "reserved" in reserved.stderr
    assert prep("tag", "-d", "tiny@latest", "--store", own_store, check=False).returncode == 2
    assert prep("tag", "-d", "v1", "--store", own_store, check=False).returncode == 2  # needs DATASET@NAME
    deleted = prep("tag", "-d", "tiny@v1", "--store", own_store)
    assert deleted.stdout.startswith("deleted tiny@v1 (was sha256:") and "generation 2" in deleted.stdout
    assert ref_line(own_store, "v1") == ""
    assert prep("show", "tiny@v1", "--store", own_store, check=False).returncode == 2
    history = [line for line in prep("log", "tiny", "--store", own_store).stdout.splitlines() if "tiny@v1 " in line]
    assert len(history) == 2 and " gen 2 " in history[0]
    assert prep("tag", "-d", "tiny@v1", "--store", own_store, check=False).returncode == 2  # already gone
    again = prep("tag", "tiny@latest", "v1", "--expect", "none", "--store", own_store)
    assert "(generation 3)" in again.stdout


def test_tag_reads_the_snapshot_back_first(own_store: Path) -> None:
    """A store without read-back records (written before them) and a flipped shard byte: exit 3
    naming the artifact, and no tag; --no-readback tags anyway."""
    import shutil

    shutil.rmtree(own_store / "readback")
    snapshot = resolve(LocalStore(own_store), "tiny@v1")
    artifact = snapshot.artifacts[0]
    path = own_store / "objects" / "sha256" / artifact["sha256"][:2] / artifact["sha256"]
    data = bytearray(path.read_bytes())
    path.unlink()
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))
    failed = prep("tag", "tiny@v1", "audited", "--store", own_store, check=False)
    assert failed.returncode == 3
    assert failed.stderr.startswith("prep: error: ") and artifact["path"] in failed.stderr
    assert "no ref moved" in failed.stderr and ref_line(own_store, "audited") == ""
    assert not (own_store / "readback").exists() or not any((own_store / "readback").iterdir())
    prep("tag", "tiny@v1", "audited", "--no-readback", "--store", own_store)
    assert ref_line(own_store, "audited") != ""
