"""A snapshot carries its user step modules' sources, and `prep rebuild SNAP --inputs DIR` builds it
again from the store alone: in a second store holding only the snapshot's objects, with the user
package gone from disk and never on this test's import path, it proves the same id; a changed or
missing input, a corrupt carried object, an older snapshot that does not carry them and a manifest
the rebuild does not reproduce are each refused, naming what."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from prep import hashing
from prep.manifest import canonical
from prep.manifest.schema import validate
from prep.runner.rebuild import first_difference
from prep.storage import LocalStore
from prep.store import records
from prep.store.layout import object_key, snapshot_marker_key
from prep.store.snapshots import Snapshot, resolve
from tests.helpers import make_records, run_prep, user_package, write_jsonl, write_pipeline

RULES = '''
import json

from . import helpers


def mark(document, word="a"):
    """Drop short documents, upper-case those holding `word`: what it did shows in the shards."""
    if helpers.words(document.text) < 4:
        return "short"
    return {"text": document.text.upper()} if word in document.text.split() else True
'''
HELPERS = "def words(text):\n    return len(text.split())\n"
UNUSED = "raise RuntimeError('never imported, never carried')\n"


def user_step_project(root: Path, tokenizer: Path) -> tuple[Path, str]:
    """A pipeline beside a two-module user package (rules imports helpers; a third module no one
    imports), its corpus under root/corpus (a.jsonl, more/b.jsonl), built by the CLI into
    root/store; the package is then removed from disk. The pipeline and the package's name."""
    records = make_records(40, seed=11)
    write_jsonl(root / "corpus" / "a.jsonl", records[:25])
    write_jsonl(root / "corpus" / "more" / "b.jsonl", records[25:])
    with user_package(root, "rebuildsteps", {"rules.py": RULES, "helpers.py": HELPERS, "unused.py": UNUSED}) as name:
        pipeline = write_pipeline(root, tokenizer, ["corpus/**/*.jsonl"], shard_size="2KB",
                                  extra=f'\n[[steps]]\nuse = "{name}.rules:mark"\nargs = {{ word = "a" }}\n')
        run_prep("build", pipeline, "--store", root / "store", "--workers", "2")
        package = root / name
        files = {path.relative_to(root).as_posix(): path.read_bytes() for path in sorted(package.rglob("*.py"))}
        shutil.rmtree(package)
    (root / "package.json").write_text(json.dumps({k: v.decode() for k, v in files.items()}))
    return pipeline, name


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> tuple[Path, str]:
    """A store holding a snapshot of a pipeline with a user step; the root and the package's name."""
    root = tmp_path_factory.mktemp("rebuild")
    _, name = user_step_project(root, tokenizer_path)
    return root, name


def package_files(root: Path) -> dict[str, bytes]:
    """The user package's files as they were at the build, by path relative to the pipeline's folder."""
    return {path: text.encode() for path, text in json.loads((root / "package.json").read_text()).items()}


def carried_keys(snapshot: Snapshot) -> list[str]:
    """The keys a store needs to rebuild `snapshot`: its manifest and marker, its artifacts and carried files."""
    named = records.snapshot_names(snapshot.manifest, "test")
    return [object_key(hashing.parse_id(snapshot.id)), snapshot_marker_key(snapshot.id),
            *(object_key(hashing.parse_id(object_id)) for object_id in sorted(named.objects))]


def second_store(source: Path, snapshot: Snapshot, target: Path) -> LocalStore:
    """A fresh store holding only `snapshot`'s objects, copied file by file from `source`."""
    store, copy = LocalStore(source), LocalStore(target)
    for key in carried_keys(snapshot):
        path = store.local_path(key)
        assert path is not None
        copy.put_bytes(key, path.read_bytes())
    return copy


@pytest.fixture
def copied(built: tuple[Path, str], tmp_path: Path) -> Iterator[tuple[Path, Snapshot, Path]]:
    """A second store with only the snapshot's objects; its path, the snapshot and the inputs folder."""
    root, _ = built
    snapshot = resolve(LocalStore(root / "store"), "tiny@latest")
    second_store(root / "store", snapshot, tmp_path / "second")
    inputs = tmp_path / "inputs"
    shutil.copytree(root / "corpus", inputs)
    yield tmp_path / "second", snapshot, inputs


def test_the_snapshot_carries_its_step_package_by_relative_path(built: tuple[Path, str]) -> None:
    root, name = built
    store = LocalStore(root / "store")
    snapshot = resolve(store, "tiny@latest")
    entries = snapshot.manifest["step_sources"]
    files = package_files(root)
    assert [(e["module"], e["path"]) for e in entries] == [
        (name, f"{name}/__init__.py"), (f"{name}.helpers", f"{name}/helpers.py"), (f"{name}.rules", f"{name}/rules.py")]
    for entry in entries:
        path = store.local_path(object_key(hashing.parse_id(entry["object"])))
        assert path is not None and path.read_bytes() == files[entry["path"]] and entry["bytes"] == len(files[entry["path"]])
    assert f"{name}/unused.py" in files, "a module no step imports is not carried"
    assert str(root) not in snapshot.raw.decode(), "no machine path in the manifest"


def test_rebuild_in_a_second_store_proves_the_same_id_with_the_carried_code(
        copied: tuple[Path, Snapshot, Path], built: tuple[Path, str]) -> None:
    second, snapshot, inputs = copied
    root, name = built
    assert not (root / name).exists() and name not in sys.modules and importlib.util.find_spec(name) is None, \
        "the user package is nowhere but in the store"
    result = run_prep("rebuild", snapshot.id, "--inputs", inputs, "--store", second, "--workers", "2")
    assert result.stdout.strip() == snapshot.id
    again = run_prep("rebuild", snapshot.id[:16], "--inputs", inputs, "--store", second, "--json")
    report = json.loads(again.stdout)
    validate(report, "prep.rebuild-report/1", "rebuild report")
    assert report["same"] and report["rebuilt"] == snapshot.id and report["difference"] is None
    assert not (second / "refs").exists(), "a rebuild moves no ref"


def test_the_first_rebuild_ran_every_stage(copied: tuple[Path, Snapshot, Path]) -> None:
    second, snapshot, inputs = copied
    report = json.loads(run_prep("rebuild", snapshot.id, "--inputs", inputs, "--store", second, "--json").stdout)
    assert report["same"] and all(stage["ran"] > 0 and stage["cached"] == 0 for stage in report["stages"])
    assert [stage["name"] for stage in report["stages"]][0] == "tokenize"


@pytest.mark.parametrize("change", ["edited", "missing"])
def test_a_changed_or_missing_input_is_refused_before_anything_runs(copied: tuple[Path, Snapshot, Path],
                                                                  change: str) -> None:
    second, snapshot, inputs = copied
    target = inputs / "more" / "b.jsonl"
    if change == "edited":
        target.write_bytes(target.read_bytes().replace(b"doc-30", b"doc-99"))
    else:
        target.unlink()
    before = sorted(path for path in second.rglob("*"))
    result = run_prep("rebuild", snapshot.id, "--inputs", inputs, "--store", second, check=False)
    assert result.returncode == 2
    line, = result.stderr.strip().splitlines()
    assert line.startswith("prep: error: ") and "more/b.jsonl" in line
    assert ("differs" if change == "edited" else "cannot be read") in line
    assert sorted(path for path in second.rglob("*")) == before, "nothing ran, nothing was stored"


def test_a_corrupt_step_source_object_is_refused(copied: tuple[Path, Snapshot, Path], built: tuple[Path, str]) -> None:
    second, snapshot, inputs = copied
    _, name = built
    entry = next(e for e in snapshot.manifest["step_sources"] if e["path"].endswith("rules.py"))
    path = LocalStore(second).local_path(object_key(hashing.parse_id(entry["object"])))
    assert path is not None
    path.chmod(0o644)
    path.write_bytes(path.read_bytes().replace(b"short", b"shirt"))
    result = run_prep("rebuild", snapshot.id, "--inputs", inputs, "--store", second, check=False)
    assert result.returncode == 3
    line, = result.stderr.strip().splitlines()
    assert f"step source {name}/rules.py" in line and entry["object"] in line and "does not hash" in line


def test_a_missing_carried_object_is_named(copied: tuple[Path, Snapshot, Path]) -> None:
    second, snapshot, inputs = copied
    tokenizer = snapshot.manifest["tokenizer"]["object"]
    path = LocalStore(second).local_path(object_key(hashing.parse_id(tokenizer)))
    assert path is not None
    path.unlink()
    result = run_prep("rebuild", snapshot.id, "--inputs", inputs, "--store", second, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"prep: error: {second}: the tokenizer file of {snapshot.id} (object {tokenizer}) is not in the store"]


@pytest.mark.parametrize("missing", ["step sources", "tokenizer"])
def test_an_older_snapshot_names_what_it_does_not_carry(copied: tuple[Path, Snapshot, Path], tmp_path: Path,
                                                         missing: str) -> None:
    second, snapshot, inputs = copied
    manifest = json.loads(snapshot.raw)
    if missing == "step sources":
        del manifest["step_sources"]
    else:
        del manifest["tokenizer"]["object"], manifest["tokenizer"]["bytes"]
    old = tmp_path / "old.json"
    old.write_bytes(canonical.dumps(manifest))
    result = run_prep("rebuild", old, "--inputs", inputs, "--store", second, check=False)
    assert result.returncode == 2
    line, = result.stderr.strip().splitlines()
    expected = ("does not carry the source of step rebuildsteps" if missing == "step sources"
                else "does not carry its tokenizer file (built before snapshots stored it)")
    assert expected in line, line


def test_a_snapshot_built_with_exclude_lists_is_refused_before_anything_runs(copied: tuple[Path, Snapshot, Path],
                                                                              tmp_path: Path) -> None:
    """Deletion requests are recorded by hash only, so no store holds what such a build dropped."""
    second, snapshot, inputs = copied
    manifest = json.loads(snapshot.raw)
    manifest["exclude"] = {"sha256": "0" * 64, "files": [{"path": "removals.txt", "sha256": "1" * 64, "entries": 3}]}
    requested = tmp_path / "requested.json"
    requested.write_bytes(canonical.dumps(manifest))
    result = run_prep("rebuild", requested, "--inputs", inputs, "--store", second, check=False)
    assert result.returncode == 2
    line, = result.stderr.strip().splitlines()
    assert "built with [input] exclude lists" in line and "cannot be rebuilt from the store alone" in line
    assert not (second / "tasks").exists()


def test_a_rebuild_that_differs_exits_1_naming_the_first_artifact(copied: tuple[Path, Snapshot, Path],
                                                                  tmp_path: Path) -> None:
    second, snapshot, inputs = copied
    manifest = json.loads(snapshot.raw)
    artifact = manifest["artifacts"][1]
    artifact["sha256"] = "0" * 64
    claimed = tmp_path / "claimed.json"
    claimed.write_bytes(canonical.dumps(manifest))
    result = run_prep("rebuild", claimed, "--inputs", inputs, "--store", second, "--json", check=False)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    validate(report, "prep.rebuild-report/1", "rebuild report")
    assert report["rebuilt"] == snapshot.id and not report["same"]
    assert report["difference"].startswith(f"artifact {artifact['path']}: sha256 ")
    line = result.stderr.strip().splitlines()[-1]  # after the build's progress lines
    assert line.startswith(f"prep: error: rebuilt {snapshot.id}, not sha256:") and artifact["path"] in line


def test_the_first_difference_is_an_artifact_then_a_manifest_field(built: tuple[Path, str]) -> None:
    root, _ = built
    recorded = json.loads(resolve(LocalStore(root / "store"), "tiny@latest").raw)
    other = json.loads(json.dumps(recorded))
    other["code"]["version"] = "9.9"
    other["stats"]["documents_read"] += 1
    assert first_difference(recorded, other) == f'manifest.code.version: "9.9" here, recorded "{recorded["code"]["version"]}"'
    other["artifacts"] = other["artifacts"][:-1]
    assert first_difference(recorded, other) == f"artifact {recorded['artifacts'][-1]['path']}: not made by the rebuild"
    assert first_difference(other, recorded) == f"artifact {recorded['artifacts'][-1]['path']}: made by the rebuild, " \
                                                "not in the snapshot"


def test_a_rebuild_in_the_store_that_built_it_reuses_its_tasks_and_moves_no_ref(built: tuple[Path, str]) -> None:
    root, _ = built
    ref = root / "store" / "refs" / "tiny" / "latest.json"
    before = ref.read_bytes()
    report = json.loads(run_prep("rebuild", "tiny@latest", "--inputs", root / "corpus", "--store", root / "store",
                                 "--json").stdout)
    assert report["same"] and all(stage["ran"] == 0 for stage in report["stages"])
    assert ref.read_bytes() == before


def test_a_rebuild_on_a_store_holding_only_a_prep_copy_gives_the_same_artifacts(built: tuple[Path, str],
                                                                                 tmp_path: Path) -> None:
    """Issue 43: `prep copy` to a second store carries all a rebuild needs; there every stage runs
    again (no task record is copied) and makes the same manifest, so the same artifacts."""
    root, _ = built
    snapshot = resolve(LocalStore(root / "store"), "tiny@latest")
    run_prep("copy", "tiny@latest", "--to", tmp_path / "copy", "--store", root / "store")
    assert not (tmp_path / "copy" / "tasks").exists()
    inputs = tmp_path / "inputs"
    shutil.copytree(root / "corpus", inputs)
    report = json.loads(run_prep("rebuild", snapshot.id, "--inputs", inputs, "--store", tmp_path / "copy",
                                 "--json").stdout)
    assert report["same"] and report["rebuilt"] == snapshot.id
    assert all(stage["ran"] > 0 and stage["cached"] == 0 for stage in report["stages"])
    rebuilt = resolve(LocalStore(tmp_path / "copy"), snapshot.id)
    assert [a["sha256"] for a in rebuilt.artifacts] == [a["sha256"] for a in snapshot.artifacts]
    run_prep("fsck", "--store", tmp_path / "copy")
