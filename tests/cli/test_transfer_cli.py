"""`prep pull`, `prep verify` and `prep copy` as users run them: output, JSON report and exit codes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from prep.manifest.schema import validate
from prep.storage.local import LocalStore
from prep.store.snapshots import publish_manifest
from tests.snapshot_factory import Built, build_snapshot, derive_snapshot, manifest_for


def prep(*args: str | Path | int, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "prep.cli.main", *map(str, args)]
    environment = {k: v for k, v in os.environ.items() if k != "PREP_STORE"} | (env or {})
    return subprocess.run(command, capture_output=True, text=True, env=environment, cwd=cwd, check=False)


@pytest.fixture(scope="module")
def pulled(tmp_path_factory: pytest.TempPathFactory) -> tuple[LocalStore, Built, Path]:
    """A snapshot pulled by the CLI, with the store given through $PREP_STORE."""
    root = tmp_path_factory.mktemp("cli")
    store = LocalStore(root / "store")
    built = build_snapshot(store, root / "work")
    dest = root / "dest"
    result = prep("pull", "demo@latest", dest, "--jobs", "2", env={"PREP_STORE": str(store.root)})
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert re.search(r"pulled sha256:[0-9a-f]{64} into .*: 9 files copied .* MB/s", result.stderr)
    return store, built, dest


def test_verify_passes_and_prints_a_digest(pulled: tuple[LocalStore, Built, Path]) -> None:
    store, built, dest = pulled
    result = prep("verify", "demo@latest", dest, "--store", store.root)
    assert result.returncode == 0, result.stderr
    assert re.search(r"9 of 9 files match, .* GB/s", result.stdout)
    digests = re.findall(r"^verification digest: ([0-9a-f]{64})$", result.stdout, re.MULTILINE)
    assert len(digests) == 1
    by_id = prep("verify", built.snapshot.id[:20], dest, "--store", store.root, "--jobs", "1")
    assert by_id.returncode == 0 and digests[0] in by_id.stdout


def test_verify_from_the_manifest_copy_needs_no_store(pulled: tuple[LocalStore, Built, Path], tmp_path: Path) -> None:
    _, _, dest = pulled
    absent = tmp_path / "no-store"
    result = prep("verify", dest / ".prep/manifest.json", dest, "--store", absent, "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    validate(report, "prep.verify-report/2", "report")
    assert report["ok"] and report["mode"] == "full" and report["digest"]
    assert not absent.exists()



def _digest(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    digests = re.findall(r"^verification digest: ([0-9a-f]{64})$", result.stdout, re.MULTILINE)
    assert len(digests) == 1, result.stdout
    return str(digests[0])


@pytest.mark.parametrize("spelling", ["as-shown", "newline", "json.tool"])
def test_verify_prints_one_digest_whatever_the_manifest_file_spelling(
    pulled: tuple[LocalStore, Built, Path], tmp_path: Path, spelling: str
) -> None:
    store, built, dest = pulled
    expected = _digest(prep("verify", "demo@latest", dest, "--store", store.root))
    shown = subprocess.run([sys.executable, "-m", "prep.cli.main", "show", "demo@latest", "--store", str(store.root),
                            "--json"], capture_output=True, check=True).stdout
    saved = tmp_path / "m.json"
    saved.write_bytes(shown)
    if spelling == "newline":
        saved.write_bytes(shown + b"\n")
    elif spelling == "json.tool":
        pretty = subprocess.run([sys.executable, "-m", "json.tool", str(saved)], capture_output=True, check=True)
        saved.write_bytes(pretty.stdout)
    assert (saved.read_bytes() == built.snapshot.raw) == (spelling == "as-shown")
    result = prep("verify", saved, dest, "--store", tmp_path / "absent")
    assert _digest(result) == expected
    assert f"verified {built.snapshot.id}:" in result.stdout
    assert ("not byte-for-byte canonical" in result.stderr) == (spelling != "as-shown")
    report = json.loads(prep("verify", saved, dest, "--json").stdout)
    assert report["digest"] == expected and report["snapshot"] == built.snapshot.id
    assert not (tmp_path / "absent").exists()


@pytest.mark.parametrize("command", ["verify", "pull"])
def test_a_file_that_is_not_a_manifest_is_refused(
    pulled: tuple[LocalStore, Built, Path], tmp_path: Path, command: str
) -> None:
    store, _, dest = pulled
    bad = tmp_path / "notes.txt"
    bad.write_text("not a manifest at all\n")
    result = prep(command, bad, dest if command == "verify" else tmp_path / "dest", "--store", store.root)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("prep: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert f"{bad}: not a canonical prep manifest" in result.stderr
    assert not (tmp_path / "dest").exists()


def test_quick_says_so_and_prints_no_digest(pulled: tuple[LocalStore, Built, Path]) -> None:
    _, _, dest = pulled
    result = prep("verify", dest / ".prep/manifest.json", dest, "--quick")
    assert result.returncode == 0
    assert "quick check (presence and size only; contents NOT hashed)" in result.stdout
    assert "digest" not in result.stdout


def test_problems_exit_1_with_a_json_report(pulled: tuple[LocalStore, Built, Path], tmp_path: Path) -> None:
    _, _, original = pulled
    dest = tmp_path / "dest"
    subprocess.run(["cp", "-a", str(original), str(dest)], check=True)
    (dest / "bin/00002.idx").unlink()
    (dest / "wds/extra.tar").write_bytes(b"extra")
    result = prep("verify", dest / ".prep/manifest.json", dest, "--json", "--rank", "0", "--world-size", "1")
    assert result.returncode == 1
    report = json.loads(result.stdout)  # one document: the report, no prep.error/1 object after it
    validate(report, "prep.verify-report/2", "report")
    assert [(p["kind"], p["path"]) for p in report["problems"]] == [("missing", "bin/00002.idx"), ("extra", "wds/extra.tar")]
    assert report["digest"] is None and (report["rank"], report["world_size"]) == (0, 1)
    assert result.stderr.startswith("prep: error: ") and result.stderr.count("\n") == 1
    human = prep("verify", dest / ".prep/manifest.json", dest)
    assert human.returncode == 1
    assert "missing" in human.stdout and "2 problems found" in human.stdout and "digest" not in human.stdout


def test_pull_by_rank_then_verify_by_rank(pulled: tuple[LocalStore, Built, Path], tmp_path: Path) -> None:
    store, _, _ = pulled
    for rank in range(2):
        dest = tmp_path / f"rank{rank}"
        assert prep("pull", "demo@latest", dest, "--store", store.root, "--rank", rank, "--world-size", 2).returncode == 0
        result = prep("verify", dest / ".prep/manifest.json", dest, "--rank", rank, "--world-size", 2)
        assert result.returncode == 0, result.stdout
        assert f"(rank {rank} of 2)" in result.stdout


@pytest.mark.parametrize(
    "arguments",
    [
        ["--rank", "1"],
        ["--world-size", "2"],
        ["--rank", "2", "--world-size", "2"],
        ["--jobs", "0"],
    ],
)
def test_usage_errors_exit_2(pulled: tuple[LocalStore, Built, Path], arguments: list[str], tmp_path: Path) -> None:
    _, _, dest = pulled
    for command in ("verify", "pull"):
        result = prep(command, dest / ".prep/manifest.json", dest, *arguments, cwd=tmp_path)
        assert result.returncode == 2, (command, result.stderr)
    assert list(tmp_path.iterdir()) == []  # no default store was created on the way out


def test_verify_exits_2_when_it_cannot_run(pulled: tuple[LocalStore, Built, Path], tmp_path: Path) -> None:
    store, _, dest = pulled
    assert prep("verify", "demo@latest", tmp_path / "absent", "--store", store.root).returncode == 2
    assert prep("verify", "demo@nosuchref", dest, "--store", store.root).returncode == 2
    tampered = tmp_path / "manifest.json"
    tampered.write_bytes(json.dumps({"schema": "prep.snapshot/1", "artifacts": "oops"}).encode())
    result = prep("verify", tampered, dest)
    assert result.returncode == 2 and "manifest refused" in result.stderr


@pytest.mark.parametrize("path", ["/tmp/evil.bin", "../evil.bin"])
def test_escaping_manifests_are_refused_by_both_commands(tmp_path: Path, path: str) -> None:
    store = LocalStore(tmp_path / "store")
    entry = {"path": path, "format": "bin", "shard": 0, "size": 1, "sha256": "0" * 64, "documents": 1, "tokens": 1}
    snapshot = publish_manifest(store, manifest_for("evil", [entry]))
    (tmp_path / "dest").mkdir()
    for command in ("pull", "verify"):
        result = prep(command, snapshot.id, tmp_path / "dest", "--store", store.root)
        assert result.returncode == 2, result.stderr
        assert "manifest refused" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "evil.bin").exists()


def test_pull_reports_reuse_leftovers_and_prune(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    old = build_snapshot(store, tmp_path / "work-old", ref="v1")
    derive_snapshot(store, old, tmp_path / "work-new", changed=["bin/00000.bin"], removed=["wds/00002.tar"], ref="v2")
    dest = tmp_path / "dest"
    assert prep("pull", "demo@v1", dest, "--store", store.root).returncode == 0
    kept = prep("pull", "demo@v2", dest, "--store", store.root)
    assert kept.returncode == 0, kept.stderr
    assert re.search(r": 1 file copied \(.*\), 7 reused as already valid \(.*; 0 of them re-hashed\), 1 file of the "
                     r"previous snapshot left in place .*--prune", kept.stderr), kept.stderr
    extra = prep("verify", "demo@v2", dest, "--store", store.root)
    assert extra.returncode == 1 and re.search(r"^extra +wds/00002.tar", extra.stdout, re.MULTILINE)
    assert prep("pull", "demo@v1", dest, "--store", store.root).returncode == 0
    pruned = prep("pull", "demo@v2", dest, "--store", store.root, "--prune")
    assert pruned.returncode == 0 and "warning" not in pruned.stderr
    assert re.search(r"1 file copied .*, 7 reused as already valid .*, 1 file pruned \(", pruned.stderr), pruned.stderr
    assert prep("verify", "demo@v2", dest, "--store", store.root).returncode == 0


def test_prune_without_an_earlier_manifest_warns_and_deletes_nothing(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    build_snapshot(store, tmp_path / "work")
    dest = tmp_path / "dest"
    (dest / "bin").mkdir(parents=True)
    (dest / "bin/00009.bin").write_bytes(b"someone's")
    result = prep("pull", "demo@latest", dest, "--store", store.root, "--prune")
    assert result.returncode == 0, result.stderr
    assert re.search(r"^prep: warning: --prune deleted nothing: .*manifest.json does not exist", result.stderr,
                     re.MULTILINE), result.stderr
    assert (dest / "bin/00009.bin").read_bytes() == b"someone's"


def test_pull_by_formats_and_rank_then_verify_by_the_record(pulled: tuple[LocalStore, Built, Path],
                                                             tmp_path: Path) -> None:
    store, built, _ = pulled
    dest = tmp_path / "rank0-bin"
    result = prep("pull", "demo@latest", dest, "--store", store.root, "--rank", 0, "--world-size", 2,
                  "--formats", "bin", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    validate(report, "prep.pull-report/1", "report")
    assert (report["rank"], report["world_size"], report["formats"]) == (0, 2, ["bin"])
    assert "(rank 0 of 2, formats bin)" in result.stderr and "kB" in result.stderr
    assert {p.suffix for p in dest.rglob("*") if p.is_file() and ".prep" not in p.parts} == {".bin", ".idx"}
    assert not (dest / "wds").exists()
    record = json.loads((dest / ".prep/share.json").read_text())
    validate(record, "prep.share/1", "share record")
    check = prep("verify", dest / ".prep/manifest.json", dest, "--json")
    assert check.returncode == 0, check.stderr + check.stdout
    verified = json.loads(check.stdout)
    validate(verified, "prep.verify-report/2", "report")
    assert (verified["rank"], verified["world_size"], verified["formats"], verified["share_from"]) == (0, 2, ["bin"],
                                                                                                        "record")
    assert verified["expected"] == report["share"]
    human = prep("verify", dest / ".prep/manifest.json", dest)
    assert "(rank 0 of 2, formats bin) as recorded in" in human.stdout
    for flags in (["--rank", "1", "--world-size", "2"], ["--formats", "wds"], ["--formats", "bin,wds"]):
        conflict = prep("verify", dest / ".prep/manifest.json", dest, *flags)
        assert conflict.returncode == 2 and conflict.stdout == ""
        assert re.match(r"prep: error: .* conflicts with .*share\.json: this folder holds rank 0 of 2, formats bin",
                        conflict.stderr), conflict.stderr


def test_an_empty_share_is_a_warning_and_a_json_field(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    build_snapshot(store, tmp_path / "work", shard_sizes=(40_000,))
    dest = tmp_path / "rank1"
    result = prep("pull", "demo@latest", dest, "--store", store.root, "--rank", 1, "--world-size", 2, "--json")
    assert result.returncode == 0, result.stderr
    warning = "rank 1 of 2 holds no files: 1 shard for 2 ranks"
    assert f"prep: warning: {warning}\n" in result.stderr and "0 files copied" in result.stderr
    report = json.loads(result.stdout)
    validate(report, "prep.pull-report/1", "report")
    assert report["warnings"] == [warning] and report["share"] == {"files": 0, "bytes": 0}
    check = prep("verify", dest / ".prep/manifest.json", dest, "--json")
    assert check.returncode == 0 and f"prep: warning: {warning}" in check.stderr
    assert json.loads(check.stdout)["warnings"] == [warning]
    whole = tmp_path / "rank0"
    first = prep("pull", "demo@latest", whole, "--store", store.root, "--rank", 0, "--world-size", 2)
    assert first.returncode == 0 and "warning" not in first.stderr
    assert {p.suffix for p in whole.rglob("*") if p.is_file() and ".prep" not in p.parts} == {".bin", ".idx", ".tar"}


@pytest.mark.parametrize(("formats", "message"), [("idx", "unknown format 'idx'"), ("bin,tar", "unknown format 'tar'")])
def test_bad_formats_are_one_line_errors(pulled: tuple[LocalStore, Built, Path], tmp_path: Path, formats: str,
                                         message: str) -> None:
    store, _, _ = pulled
    for command in ("pull", "verify"):
        result = prep(command, "demo@latest", tmp_path, "--store", store.root, "--formats", formats)
        assert result.returncode == 2 and message in result.stderr and result.stderr.count("\n") == 1


def test_copy_refuses_a_snapshot_the_source_cannot_prove(pulled: tuple[LocalStore, Built, Path], tmp_path: Path) -> None:
    """The factory's snapshot lists only a tokenize stage, no layout gc knows (and a stage manifest
    its store never held): gc refuses to guess what such a snapshot keeps, so copy refuses it,
    naming the object, before writing anything."""
    store, built, _ = pulled
    target = tmp_path / "second"
    result = prep("copy", "demo@latest", "--store", store.root, "--to", target, "--json")
    assert result.returncode == 3
    error = json.loads(result.stdout)
    validate(error, "prep.error/1", "stdout")
    assert result.stderr == f"prep: error: {error['error']}\n"
    assert f"snapshot manifest {built.snapshot.id}, reached from demo@latest, is invalid" in error["error"]
    assert error["error"].endswith("copy refused, nothing was copied")
    assert not list(LocalStore(target).list("objects/"))
    same = prep("copy", "demo@latest", "--store", store.root, "--to", store.root)
    assert same.returncode == 2 and same.stderr.startswith("prep: error: ") and "is the same" in same.stderr
    assert prep("copy", "demo@latest", "--store", store.root).returncode == 2  # --to is required
