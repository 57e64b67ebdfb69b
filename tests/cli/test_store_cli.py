"""The store-care commands through the real CLI: gc (retention flags, the rule report), fsck (exit
0 clean, 1 findings, 2 could not run; its JSON validated), hold and release."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from prep.manifest.schema import validate
from prep.storage import LocalStore
from prep.store import cas
from prep.store.snapshots import resolve
from tests.cli.test_history_cli import prep, store  # noqa: F401  (the module fixture: tiny@v1, tiny@latest)


def test_gc_report(store: Path) -> None:  # noqa: F811
    report = json.loads(prep("gc", "--store", store, "--dry-run", "--json", "--grace", "0").stdout)
    validate(report, "prep.gc-report/2", "gc report")
    assert report["dry_run"] is True and report["refs"] >= 2
    assert report["deleted"]["objects"]["count"] == 0, "every build of this store is still ref'd"
    assert {entry["by"] for entry in report["rules"]["refs"]} >= {"tiny@v1", "tiny@latest"}
    # Each build recorded its pipeline's policy: here the default, no [retention] table.
    assert report["policies"]["tiny"] == {"keep_last": 1, "keep_within_seconds": 0, "source": "store"}
    text = prep("gc", "--store", store, "--grace", "1d").stdout
    assert "grace period 86400 s" in text and "freed 0 keys" in text and "rule refs" in text
    bad = prep("gc", "--store", store, "--grace", "soon", check=False)
    assert bad.returncode == 2 and "invalid duration 'soon'" in bad.stderr


def test_gc_flags_override_every_policy(store: Path) -> None:  # noqa: F811
    report = json.loads(prep("gc", "--store", store, "--dry-run", "--json", "--keep-last", "5",
                             "--keep-within", "1h").stdout)
    validate(report, "prep.gc-report/2", "gc report")
    assert report["policies"]["tiny"] == {"keep_last": 5, "keep_within_seconds": 3600, "source": "flags"}
    assert {entry["by"] for entry in report["rules"]["keep_last"]} >= {"tiny@latest~0", "tiny@latest~1"}
    for args, message in ((("--keep-last", "0"), "keep_last must be at least 1"),
                          (("--keep-within", "forever"), "invalid duration 'forever'")):
        bad = prep("gc", "--store", store, "--dry-run", *args, check=False)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr


def test_fsck_exit_codes_and_report(store: Path, tmp_path: Path) -> None:  # noqa: F811
    clean = prep("fsck", "--store", store, "--json")
    report = json.loads(clean.stdout)
    validate(report, "prep.fsck-report/1", "fsck report")
    assert report["clean"] is True and report["findings"] == [] and report["checked"]["objects"] > 0
    assert "fsck" in clean.stderr, "progress goes to stderr"
    assert prep("fsck", "--store", store, "--dataset", "tiny").stdout.rstrip().endswith("clean")

    nowhere = prep("fsck", "--store", tmp_path / "nothing-here", check=False)
    assert nowhere.returncode == 2 and "not a prep store" in nowhere.stderr
    unknown = prep("fsck", "--store", store, "--dataset", "other", check=False)
    assert unknown.returncode == 2 and "no dataset 'other'" in unknown.stderr


def test_fsck_exits_1_naming_a_flipped_artifact(store: Path, tmp_path: Path) -> None:  # noqa: F811
    import shutil

    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    local = LocalStore(copy)
    artifact = resolve(local, "tiny@latest").artifacts[0]
    path = local.local_path(cas.object_key(artifact["sha256"]))
    assert path is not None
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    found = prep("fsck", "--store", copy, "--json", check=False)
    assert found.returncode == 1
    report = json.loads(found.stdout)
    validate(report, "prep.fsck-report/1", "fsck report")
    assert [(f["problem"], f["kind"]) for f in report["findings"]] == [("corrupt", f"artifact {artifact['path']}")]
    assert "tiny@latest" in report["findings"][0]["reached_by"]
    assert "corrupt  1" in prep("fsck", "--store", copy, check=False).stdout


def test_hold_and_release(store: Path) -> None:  # noqa: F811
    missing = prep("hold", "sha256:" + "0" * 64, "--store", store, check=False)
    assert missing.returncode == 2 and "no snapshot" in missing.stderr
    snapshot = resolve(LocalStore(store), "tiny@v1").id
    assert prep("hold", "tiny@v1", "--store", store, "--reason", "audit 2026").stdout.startswith(f"held {snapshot}")
    again = prep("hold", snapshot, "--store", store).stdout
    assert "already held" in again and "audit 2026" in again
    report = json.loads(prep("gc", "--store", store, "--dry-run", "--json").stdout)
    assert report["rules"]["holds"] == [{"snapshot": snapshot, "dataset": "tiny", "by": "hold: audit 2026"}]
    assert prep("release", "tiny@v1", "--store", store).stdout.startswith(f"released {snapshot}")
    twice = prep("release", snapshot, "--store", store, check=False)
    assert twice.returncode == 2 and "is not held" in twice.stderr


def test_every_snap_argument_takes_ancestry(store: Path) -> None:  # noqa: F811
    """`tiny@latest~1` is v1 (the first build), through the CLI's one resolve."""
    v1 = resolve(LocalStore(store), "tiny@v1").id
    shown = prep("show", "tiny@latest~1", "--json", "--store", store).stdout
    assert "sha256:" + hashlib.sha256(shown.encode()).hexdigest() == v1
    assert prep("diff", "tiny@latest~1", "tiny@v1", "--store", store).stdout.rstrip().endswith("identical")
    beyond = prep("show", "tiny@latest~9", "--store", store, check=False)
    assert beyond.returncode == 2 and "has taken only 2 generations" in beyond.stderr


def test_an_unreadable_hold_can_be_released(store: Path) -> None:  # noqa: F811
    """Regression: release read the hold to report it, so a damaged one (which stops gc) could not be released."""
    snapshot = resolve(LocalStore(store), "tiny@v1").id
    prep("hold", "tiny@v1", "--store", store)
    path = store / "holds" / f"{snapshot.removeprefix('sha256:')}.json"
    path.chmod(0o644)
    path.write_bytes(b"junk")
    released = prep("release", "tiny@v1", "--store", store, "--json", check=False)
    assert released.returncode == 0, released.stderr
    assert "unreadable hold record" in released.stderr and not path.exists()
    report = json.loads(released.stdout)
    assert (report["action"], report["hold"], report["snapshot"]) == ("released", None, snapshot)
    assert "unreadable hold record" in report["unreadable"]
    validate(report, "prep.hold-report/1", "release --json")
    assert prep("gc", "--store", store, "--dry-run").returncode == 0
