"""`prep show SNAP --json` prints the manifest byte for byte; manifest files are read canonically."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prep.manifest.schema import validate
from prep.storage.local import LocalStore
from tests.snapshot_factory import Built, build_snapshot


def prep_bytes(*args: str | Path) -> subprocess.CompletedProcess[bytes]:
    """Run the real `prep` command and keep its stdout as bytes."""
    command = [sys.executable, "-m", "prep.cli.main", *map(str, args)]
    environment = {k: v for k, v in os.environ.items() if k != "PREP_STORE"}
    return subprocess.run(command, capture_output=True, env=environment, check=False)


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Built]:
    """A store holding one small snapshot, demo@latest."""
    root = tmp_path_factory.mktemp("show-cli")
    store = LocalStore(root / "store")
    return store.root, build_snapshot(store, root / "work", shard_sizes=(3_000,))


@pytest.mark.parametrize("spec", ["demo@latest", "id", "prefix"])
def test_show_json_writes_exactly_the_stored_bytes(published: tuple[Path, Built], spec: str) -> None:
    store, built = published
    snap = {"id": built.snapshot.id, "prefix": built.snapshot.id[7:19]}.get(spec, spec)
    result = prep_bytes("show", snap, "--store", store, "--json")
    assert result.returncode == 0, result.stderr
    assert result.stdout == built.snapshot.raw and not result.stdout.endswith(b"\n")
    assert f"sha256:{hashlib.sha256(result.stdout).hexdigest()}" == built.snapshot.id
    assert result.stderr == b""


def test_show_json_of_a_saved_manifest_round_trips(published: tuple[Path, Built], tmp_path: Path) -> None:
    store, built = published
    saved = tmp_path / "m.json"
    saved.write_bytes(prep_bytes("show", "demo@latest", "--store", store, "--json").stdout)
    again = prep_bytes("show", saved, "--json")
    assert again.returncode == 0 and again.stdout == built.snapshot.raw and again.stderr == b""


def test_a_pretty_printed_manifest_shows_its_canonical_bytes_and_says_so(
    published: tuple[Path, Built], tmp_path: Path
) -> None:
    _, built = published
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(json.loads(built.snapshot.raw), indent=2) + "\n")
    shown = prep_bytes("show", pretty, "--json")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == built.snapshot.raw
    note = shown.stderr.decode()
    assert note.count("\n") == 1 and note.startswith("prep: note: ")
    assert str(pretty) in note and "not byte-for-byte canonical" in note and built.snapshot.id in note
    summary = prep_bytes("show", pretty)
    assert summary.returncode == 0 and f"snapshot   {built.snapshot.id}" in summary.stdout.decode()


@pytest.mark.parametrize("content", [b"just some text\n", b'{"schema": "prep.snapshot/1"}', b"{}{}", b"\x00\x01"])
def test_a_file_that_is_not_a_manifest_is_refused_in_one_line(tmp_path: Path, content: bytes) -> None:
    bad = tmp_path / "notes.json"
    bad.write_bytes(content)
    result = prep_bytes("show", bad, "--json", "--store", tmp_path / "absent")
    assert result.returncode == 2
    error = json.loads(result.stdout)  # with --json, a failure is a prep.error/1 object on stdout
    validate(error, "prep.error/1", "stdout")
    assert error["exit_code"] == 2 and f"{bad}: not a canonical prep manifest" in error["error"]
    message = result.stderr.decode()
    assert message.startswith("prep: error: ") and message.count("\n") == 1, message
    assert f"{bad}: not a canonical prep manifest" in message
    assert not (tmp_path / "absent").exists()
