"""`prep.transfer.verify`: every corruption kind is caught and named; unsafe manifests are refused."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prep.errors import InputError, UsageError
from prep.manifest.schema import validate
from prep.storage.local import LocalStore
from prep.store.snapshots import Snapshot, publish_manifest, resolve
from prep.transfer.pull import pull
from prep.transfer.shares import artifacts_of, partial_name
from prep.transfer.verify import (
    PROBLEM_KINDS,
    REPORT_SCHEMA,
    VerifyResult,
    verification_digest,
    verify,
)
from tests.snapshot_factory import Built, build_snapshot, manifest_for


@dataclass(frozen=True)
class Pulled:
    store: LocalStore
    built: Built
    dest: Path

    @property
    def snapshot(self) -> Snapshot:
        return self.built.snapshot


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Pulled:
    root = tmp_path_factory.mktemp("verify")
    store = LocalStore(root / "store")
    built = build_snapshot(store, root / "work")
    pull(store, built.snapshot, root / "dest")
    return Pulled(store, built, root / "dest")


@pytest.fixture
def pulled(pristine: Pulled, tmp_path: Path) -> Pulled:
    """A fresh copy of a pulled snapshot that a test may damage."""
    dest = tmp_path / "dest"
    shutil.copytree(pristine.dest, dest, symlinks=True)
    return Pulled(pristine.store, pristine.built, dest)


def kinds(result: VerifyResult) -> list[tuple[str, str]]:
    return [(problem.kind, problem.path) for problem in result.problems]


def check_report(result: VerifyResult) -> None:
    validate(result.to_json(), REPORT_SCHEMA, "verify report")


def test_a_clean_pull_verifies_with_a_digest(pulled: Pulled) -> None:
    result = verify(pulled.snapshot, pulled.dest)
    assert result.ok and result.problems == ()
    assert len(result.matched) == len(pulled.built.files)
    carried = pulled.snapshot.manifest["tokenizer"]["bytes"]  # DEST/.prep/tokenizer.json is checked too
    assert result.bytes_read == sum(len(data) for data in pulled.built.files.values()) + carried
    check_report(result)
    assert result.to_json()["digest"] == result.digest


def test_digest_follows_the_documented_byte_construction(pulled: Pulled) -> None:
    expected = hashlib.sha256()
    expected.update(b"prep.verify-digest/1\n" + pulled.snapshot.id.encode() + b"\n")
    for path in sorted(pulled.built.files, key=str.encode):
        sha = hashlib.sha256(pulled.built.files[path]).hexdigest()
        expected.update(f"{path}\0{sha}\n".encode())
    assert verify(pulled.snapshot, pulled.dest).digest == expected.hexdigest()
    assert verification_digest(pulled.snapshot.id, artifacts_of(pulled.snapshot.manifest)) == expected.hexdigest()


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 1)


def _extend(path: Path) -> None:
    with open(path, "ab") as handle:
        handle.write(b"\0")


def _make_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _make_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _make_dangling_symlink(path: Path) -> None:
    path.unlink()
    path.symlink_to(path.with_name("vanished.bin"))


# Unreadable as root too: chmod 000 does not stop root, but no one can read a directory,
# a FIFO with no writer (opened O_NONBLOCK, refused as not a regular file) or a dangling symlink.
DAMAGE: list[tuple[str, Callable[[Path], None], str]] = [
    ("flipped byte", _flip_byte, "wrong-hash"),
    ("truncation", _truncate, "wrong-size"),
    ("extension", _extend, "wrong-size"),
    ("deletion", Path.unlink, "missing"),
    ("replaced by a directory", _make_directory, "unreadable"),
    ("replaced by a FIFO", _make_fifo, "unreadable"),
    ("replaced by a dangling symlink", _make_dangling_symlink, "unreadable"),
]


@pytest.mark.parametrize(("damage", "kind"), [(d[1], d[2]) for d in DAMAGE], ids=[d[0] for d in DAMAGE])
def test_each_corruption_is_caught_and_named(pulled: Pulled, damage: Callable[[Path], None], kind: str) -> None:
    damage(pulled.dest / "bin/00001.bin")
    result = verify(pulled.snapshot, pulled.dest)
    assert kinds(result) == [(kind, "bin/00001.bin")]
    assert not result.ok and result.digest is None
    assert "bin/00001.bin" not in {a.path for a in result.matched}
    check_report(result)


def test_quick_mode_sees_sizes_but_not_contents(pulled: Pulled) -> None:
    _flip_byte(pulled.dest / "bin/00000.bin")
    _truncate(pulled.dest / "wds/00002.tar")
    result = verify(pulled.snapshot, pulled.dest, quick=True)
    assert kinds(result) == [("wrong-size", "wds/00002.tar")]
    assert result.bytes_read == 0 and result.digest is None
    assert result.to_json()["mode"] == "quick"
    check_report(result)


def test_a_passing_quick_check_prints_no_digest(pulled: Pulled) -> None:
    result = verify(pulled.snapshot, pulled.dest, quick=True)
    assert result.ok and result.digest is None
    check_report(result)


def test_extra_files_in_artifact_folders_are_reported_but_not_elsewhere(pulled: Pulled) -> None:
    (pulled.dest / "bin/stray.bin").write_bytes(b"x")
    (pulled.dest / "wds/nested").mkdir()
    (pulled.dest / "wds/nested/deep.tar").write_bytes(b"y")
    (pulled.dest / "bin/link").symlink_to(pulled.dest / "wds")
    (pulled.dest / "notes.txt").write_text("outside the artifact folders")
    (pulled.dest / "other").mkdir()
    (pulled.dest / "other/file").write_text("also outside")
    (pulled.dest / ".prep/cache").write_text("ignored")
    result = verify(pulled.snapshot, pulled.dest)
    assert kinds(result) == [("extra", "bin/link"), ("extra", "bin/stray.bin"), ("extra", "wds/nested/deep.tar")]
    check_report(result)


def test_a_file_where_an_artifact_folder_belongs_is_extra(pulled: Pulled) -> None:
    shutil.rmtree(pulled.dest / "wds")
    (pulled.dest / "wds").write_bytes(b"in the way")
    result = verify(pulled.snapshot, pulled.dest)
    expected = [("extra", "wds")] + [("missing", f"wds/0000{shard}.tar") for shard in range(3)]
    assert sorted(kinds(result)) == sorted(expected)
    check_report(result)


def test_a_renamed_file_is_named_as_such(pulled: Pulled) -> None:
    os.rename(pulled.dest / "wds/00001.tar", pulled.dest / "wds/00001.tar.bak")
    result = verify(pulled.snapshot, pulled.dest)
    assert kinds(result) == [("renamed", "wds/00001.tar")]
    assert result.problems[0].found_at == "wds/00001.tar.bak"
    check_report(result)
    quick = verify(pulled.snapshot, pulled.dest, quick=True)  # without hashing: missing + extra
    assert kinds(quick) == [("missing", "wds/00001.tar"), ("extra", "wds/00001.tar.bak")]


def test_a_complete_partial_file_is_extra_never_the_artifact_renamed(pulled: Pulled) -> None:
    """Regression: a killed pull's partial holding all of the artifact's bytes was reported as the
    artifact `renamed` to it, where a temporary must only ever be `extra`."""
    sha = next(str(a["sha256"]) for a in pulled.snapshot.artifacts if a["path"] == "wds/00001.tar")
    partial = partial_name(pulled.dest / "wds/00001.tar", sha)
    os.rename(pulled.dest / "wds/00001.tar", partial)
    result = verify(pulled.snapshot, pulled.dest)
    assert sorted(kinds(result)) == [("extra", f"wds/{partial.name}"), ("missing", "wds/00001.tar")]
    check_report(result)


def test_a_file_changing_while_hashed_is_reported(pulled: Pulled) -> None:
    target = pulled.dest / "bin/00000.bin"

    def append_once(_count: int) -> None:
        if target.stat().st_size == pulled.built.snapshot.artifacts[0]["size"]:
            with open(target, "ab") as handle:
                handle.write(b"late write")

    result = verify(pulled.snapshot, pulled.dest, jobs=1, on_bytes=append_once)
    assert ("changed-during-read", "bin/00000.bin") in kinds(result)
    check_report(result)


def test_a_write_into_bytes_already_hashed_with_the_mtime_set_back_is_a_change(tmp_path: Path) -> None:
    """Regression: the stamp compared around the read lacked the ctime, so a write behind the
    read position with the mtime set back gave the old bytes' digest, unchanged, and pull
    recorded it against the new file's stamp."""
    import time

    from prep.transfer.verify import READ_SIZE, hash_file

    target = tmp_path / "shard.bin"
    target.write_bytes(bytes(3 * READ_SIZE))
    before = target.stat()
    time.sleep(0.05)  # past the filesystem clock's tick: the write's ctime must differ
    written: list[int] = []

    def write_behind(_count: int) -> None:
        if not written:
            with open(target, "r+b") as handle:
                handle.write(b"\x01")
            os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
            written.append(1)

    found = hash_file(target, on_bytes=write_behind)
    assert written and found.digest.sha256 == hashlib.sha256(bytes(3 * READ_SIZE)).hexdigest()
    assert found.changed


def test_rank_shares_verify_separately_and_other_ranks_files_are_not_extra(pulled: Pulled) -> None:
    everything = {a.path for a in artifacts_of(pulled.snapshot.manifest)}
    seen: set[str] = set()
    digests = set()
    for rank in range(3):
        result = verify(pulled.snapshot, pulled.dest, rank=rank, world_size=3)
        assert result.ok, kinds(result)
        seen |= {a.path for a in result.share.artifacts}
        digests.add(result.digest)
        report = result.to_json()
        assert (report["rank"], report["world_size"]) == (rank, 3)
        check_report(result)
    assert seen == everything and len(digests) == 3
    os.unlink(pulled.dest / "bin/00000.bin")
    failing = [verify(pulled.snapshot, pulled.dest, rank=rank, world_size=3).ok for rank in range(3)]
    assert failing.count(False) == 1


def test_every_problem_kind_fits_the_report_schema(pulled: Pulled) -> None:
    _flip_byte(pulled.dest / "bin/00000.bin")
    _truncate(pulled.dest / "bin/00000.idx")
    os.unlink(pulled.dest / "bin/00001.idx")
    _make_fifo(pulled.dest / "bin/00002.bin")
    os.rename(pulled.dest / "wds/00001.tar", pulled.dest / "wds/moved.tar")
    (pulled.dest / "wds/junk").write_bytes(b"junk")
    result = verify(pulled.snapshot, pulled.dest)
    check_report(result)
    assert {kind for kind, _ in kinds(result)} == set(PROBLEM_KINDS) - {"changed-during-read"}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_single_changed_byte_is_found(pristine: Pulled, data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(sorted(pristine.built.files)))
    offset = data.draw(st.integers(min_value=0, max_value=len(pristine.built.files[path]) - 1))
    xor = data.draw(st.integers(min_value=1, max_value=255))
    with tempfile.TemporaryDirectory() as scratch:
        dest = Path(scratch) / "dest"
        shutil.copytree(pristine.dest, dest)
        with open(dest / path, "r+b") as handle:
            handle.seek(offset)
            byte = handle.read(1)[0]
            handle.seek(offset)
            handle.write(bytes([byte ^ xor]))
        assert kinds(verify(pristine.snapshot, dest, jobs=2)) == [("wrong-hash", path)]


def test_verify_needs_only_the_manifest_copy_in_dest(pulled: Pulled) -> None:
    manifest_file = pulled.dest / ".prep/manifest.json"
    assert manifest_file.read_bytes() == pulled.snapshot.raw
    from_file = resolve(None, str(manifest_file))  # no store at all
    assert from_file.id == pulled.snapshot.id
    assert verify(from_file, pulled.dest).digest == verify(pulled.snapshot, pulled.dest).digest



def _spellings(raw: bytes) -> dict[str, bytes]:
    """The same manifest as stored, with a newline appended, and pretty-printed."""
    pretty = json.dumps(json.loads(raw), indent=4).encode()
    return {"as-stored": raw, "newline": raw + b"\n", "pretty": pretty, "pretty-crlf": pretty.replace(b"\n", b"\r\n")}


@pytest.mark.parametrize("spelling", ["as-stored", "newline", "pretty", "pretty-crlf"])
def test_a_manifest_file_has_the_snapshot_id_whatever_its_json_spelling(pulled: Pulled, spelling: str) -> None:
    manifest_file = pulled.dest.parent / "m.json"
    manifest_file.write_bytes(_spellings(pulled.snapshot.raw)[spelling])
    from_file = resolve(None, str(manifest_file))
    assert from_file.id == pulled.snapshot.id and from_file.raw == pulled.snapshot.raw
    assert from_file.reencoded == (spelling != "as-stored")
    assert verify(from_file, pulled.dest).digest == verify(pulled.snapshot, pulled.dest).digest


NOT_MANIFESTS = {
    "text": b"hello, world\n",
    "empty": b"",
    "not-utf8": b"\xff\xfe{}",
    "other-json": b'{"a": 1}',
    "json-array": b"[1, 2]",
}


def _tweaked(raw: bytes, how: str) -> bytes:
    """A manifest that parses as JSON but has no single canonical encoding."""
    text = raw.decode()
    if how == "duplicate-key":
        return text.replace('{"artifacts"', '{"artifacts":[],"artifacts"', 1).encode()
    if how == "float":
        return text.replace('"seed":0', '"seed":0.0', 1).encode()
    if how == "nan":
        return text.replace('"seed":0', '"seed":NaN', 1).encode()
    assert how == "lone-surrogate"
    return text.replace('"eos":"<|endoftext|>"', '"eos":"<|endoftext|>\\ud800"', 1).encode()


@pytest.mark.parametrize("content", [*NOT_MANIFESTS, "duplicate-key", "float", "nan", "lone-surrogate", "schema"])
def test_a_file_that_cannot_be_a_canonical_manifest_is_refused(pulled: Pulled, content: str) -> None:
    raw = pulled.snapshot.raw
    if content in NOT_MANIFESTS:
        data = NOT_MANIFESTS[content]
    elif content == "schema":
        data = json.dumps(dict(json.loads(raw), artifacts="oops")).encode()
    else:
        data = _tweaked(raw, content)
        assert data != raw
    bad = pulled.dest.parent / "bad.json"
    bad.write_bytes(data)
    with pytest.raises(UsageError, match=r"bad\.json: not a canonical prep manifest") as caught:
        resolve(None, str(bad))
    assert caught.value.exit_code == 2 and "\n" not in caught.value.message


# ---------------------------------------------------------------- refused manifests


def hostile_snapshot(store: LocalStore, path: str) -> Snapshot:
    entry = {"path": path, "format": "bin", "shard": 0, "size": 1, "sha256": "0" * 64, "documents": 1, "tokens": 1}
    return publish_manifest(store, manifest_for("hostile", [entry]))


@pytest.mark.parametrize(
    "path", ["/etc/passwd", "../escape.bin", "bin/../../escape.bin", "bin/./x.bin", "bin//x.bin", ".prep/manifest.json"]
)
def test_unsafe_paths_are_refused(tmp_path: Path, path: str) -> None:
    store = LocalStore(tmp_path / "store")
    snapshot = hostile_snapshot(store, path)
    (tmp_path / "dest").mkdir()
    with pytest.raises(InputError, match="manifest refused"):
        verify(snapshot, tmp_path / "dest")
    with pytest.raises(InputError, match="manifest refused"):
        pull(store, snapshot, tmp_path / "dest")


def test_a_symlink_outside_dest_is_blamed_on_dest_not_on_the_manifest(pulled: Pulled, tmp_path: Path) -> None:
    """The manifest is sound; the symlink planted in DEST is what is refused, and the message says so."""
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(b"not an artifact")
    artifact = pulled.dest / pulled.snapshot.artifacts[0]["path"]
    artifact.unlink()
    artifact.symlink_to(target)
    for run in (lambda: verify(pulled.snapshot, pulled.dest), lambda: pull(pulled.store, pulled.snapshot, pulled.dest)):
        with pytest.raises(InputError, match="remove the symlink, or use another DEST") as caught:
            run()
        assert str(caught.value).startswith(f"{pulled.dest}: ") and "manifest refused" not in str(caught.value)
    assert target.read_bytes() == b"not an artifact"


def test_a_symlinked_folder_pointing_outside_dest_is_refused(pulled: Pulled, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    shutil.move(pulled.dest / "wds", outside)
    (pulled.dest / "wds").symlink_to(outside)
    with pytest.raises(InputError, match="resolves outside"):
        verify(pulled.snapshot, pulled.dest)
    with pytest.raises(InputError, match="resolves outside"):
        pull(pulled.store, pulled.snapshot, pulled.dest)
    before = sorted(p.name for p in outside.iterdir())
    assert before == ["00000.tar", "00001.tar", "00002.tar"]


def test_a_symlink_inside_dest_is_allowed(pulled: Pulled) -> None:
    os.rename(pulled.dest / "wds", pulled.dest / "wds-real")
    (pulled.dest / "wds").symlink_to("wds-real")
    assert verify(pulled.snapshot, pulled.dest).ok


def test_duplicate_paths_are_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    entry = {"path": "bin/x.bin", "format": "bin", "shard": 0, "size": 1, "sha256": "0" * 64, "documents": 1, "tokens": 1}
    snapshot = publish_manifest(store, manifest_for("dup", [entry, dict(entry, shard=1)]))
    with pytest.raises(InputError, match="listed twice"):
        verify(snapshot, tmp_path)
