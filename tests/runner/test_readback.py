"""Read back before a ref moves (issue 16): a corrupt or missing object in the store at publish time
(local and moto S3), or a corrupt manifest object, leaves every ref where it was with exit 3; a
snapshot that passed before pays nothing; --no-readback opts out and the log says so."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from prep import code
from prep.config import load_pipeline
from prep.errors import IntegrityError
from prep.manifest.schema import validate
from prep.progress import Progress
from prep.runner.build import BuildResult, PublishOptions, build
from prep.stages import sink
from prep.storage import open_store
from prep.storage.backend import Store
from prep.store import cas, records
from prep.store import snapshots as build_module  # the build calls snapshots.publish_manifest
from prep.store.layout import readback_key
from prep.store.refs import read_ref
from prep.store.snapshots import Snapshot
from prep.workfiles.intermediate import pread_into
from tests.helpers import forget_commits, make_records, write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor
from tests.s3support import admin_client, new_bucket

Damage = Callable[[Store, Snapshot], str]
"""Spoil one object of a just-stored snapshot in the store; returns what the error must name."""


def build_in_process(pipeline: Path, store: Store, options: PublishOptions | None = None) -> BuildResult:
    code.source_hash.cache_clear()  # others may edit the tree; driver and in-process tasks agree
    return build(load_pipeline(pipeline), store, InProcessExecutor(), progress=Progress(quiet=True), options=options)


def overwrite(store: Store, key: str, data: bytes | None) -> None:
    """Replace (or with None, delete) a stored key behind the store's back: bit rot, a bad disk, a
    gateway that stored other bytes."""
    if store.url.startswith("s3://"):
        bucket, _, prefix = store.url.removeprefix("s3://").partition("/")
        full = f"{prefix}/{key}" if prefix else key
        if data is None:
            admin_client().delete_object(Bucket=bucket, Key=full)
        else:
            admin_client().put_object(Bucket=bucket, Key=full, Body=data)
        return
    path = store.local_path(key)
    assert path is not None
    path.unlink()
    if data is not None:
        path.write_bytes(data)


def flip_artifact(store: Store, snapshot: Snapshot) -> str:
    artifact = next(a for a in snapshot.artifacts if a["format"] == "bin")
    key = cas.object_key(artifact["sha256"])
    data = bytearray(store.get_bytes(key))
    data[len(data) // 2] ^= 0x01
    overwrite(store, key, bytes(data))
    return str(artifact["path"])


def flip_in_place(store: Store, snapshot: Snapshot) -> str:
    """Change a byte of the .tar (read back from the disk as it was written) in its own file."""
    artifact = next(a for a in snapshot.artifacts if a["format"] == "wds")
    path = store.local_path(cas.object_key(artifact["sha256"]))
    if path is None:  # S3: an overwrite is the only way to change it
        data = bytearray(store.get_bytes(cas.object_key(artifact["sha256"])))
        data[600] ^= 0x01
        overwrite(store, cas.object_key(artifact["sha256"]), bytes(data))
        return str(artifact["path"])
    path.chmod(0o644)
    with path.open("r+b") as file:
        file.seek(600)
        byte = file.read(1)
        file.seek(600)
        file.write(bytes([byte[0] ^ 0x01]))
    return str(artifact["path"])


def delete_artifact(store: Store, snapshot: Snapshot) -> str:
    artifact = next(a for a in snapshot.artifacts if a["format"] == "idx")
    overwrite(store, cas.object_key(artifact["sha256"]), None)
    return str(artifact["path"])


def flip_manifest(store: Store, snapshot: Snapshot) -> str:
    overwrite(store, cas.object_key(snapshot.id.removeprefix("sha256:")), snapshot.raw.replace(b'"seed"', b'"sEed"'))
    return "snapshot manifest"


@pytest.fixture
def damaging(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Damage], list[str]]]:
    """Arm a Damage to strike right after the build stores its manifest, before any ref moves."""
    named: list[str] = []

    def arm(damage: Damage) -> list[str]:
        def publish(store: Store, manifest: dict[str, Any]) -> Snapshot:
            snapshot = real(store, manifest)
            named.append(damage(store, snapshot))
            return snapshot
        monkeypatch.setattr(build_module, "publish_manifest", publish)
        return named

    real = build_module.publish_manifest
    yield arm


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Path:
    root = tmp_path_factory.mktemp("readback")
    write_jsonl(root / "corpus" / "a.jsonl", make_records(60, seed=1, prefix="a"))
    write_jsonl(root / "corpus" / "b.jsonl", make_records(60, seed=2, prefix="b"))
    return write_pipeline(root, tokenizer_path, ["corpus/*.jsonl"], shard_size="2KB")


def changed(project: Path, tmp_path: Path) -> Path:
    """The project's pipeline over a corpus with one more file (a new snapshot sharing shards)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (corpus / name).write_bytes((project.parent / "corpus" / name).read_bytes())
    write_jsonl(corpus / "c.jsonl", make_records(30, seed=3, prefix="c"))
    pipeline = tmp_path / "pipeline.toml"
    pipeline.write_text(project.read_text().replace('"corpus/*.jsonl"', f'"{corpus}/*.jsonl"'))
    return pipeline


def s3_store() -> Store:
    """A store in a versioned bucket: an overwrite there is a new version, which every GET (and pull) reads."""
    return open_store(f"{new_bucket(versioned=True)}/prep")


STORES: dict[str, Callable[[Path], Store]] = {
    "local": lambda tmp_path: open_store(str(tmp_path / "store")),
    "s3": lambda tmp_path: s3_store(),
}


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("damage", [flip_artifact, flip_in_place, delete_artifact, flip_manifest])
def test_a_bad_object_at_publish_time_moves_no_ref_and_exits_3(
        where: str, damage: Damage, project: Path, tmp_path: Path, damaging: Callable[[Damage], list[str]],
        request: pytest.FixtureRequest) -> None:
    if where == "s3":
        request.getfixturevalue("s3_endpoint")
    store = STORES[where](tmp_path)
    first = build_in_process(project, store, PublishOptions(tags=("v1",)))
    named = damaging(damage)
    with pytest.raises(IntegrityError) as caught:
        build_in_process(changed(project, tmp_path), store, PublishOptions(tags=("v2",)))
    assert caught.value.exit_code == 3
    message = str(caught.value)
    assert named and named[0] in message and "no ref moved" in message
    assert ("missing" if damage is delete_artifact else "corrupt") in message
    assert "object sha256:" in message
    latest = read_ref(store, "tiny", "latest")
    assert latest is not None and (latest.snapshot, latest.generation) == (first.snapshot.id, 1)
    assert read_ref(store, "tiny", "v2") is None
    assert [info.key for info in store.list("readback/")] == [readback_key(first.snapshot.id)]


def test_the_first_build_reads_every_object_back_and_records_it(project: Path, tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    result = build_in_process(project, store)
    objects = len({a["sha256"] for a in result.snapshot.artifacts}) + 1
    readback = result.readback
    assert readback.ran and readback.checked + readback.when_written == readback.objects == objects
    assert readback.when_written >= 1  # the .bin and .tar files went to the disk directly and were read back
    assert (readback.bytes_read + readback.bytes_when_written
            == len(result.snapshot.raw) + sum(a["size"] for a in result.snapshot.artifacts))
    raw = store.get_bytes(readback_key(result.snapshot.id))
    validate(json.loads(raw), "prep.readback/1")
    record = records.read_readback(store, result.snapshot.id)
    assert record is not None and (record.snapshot, record.objects, record.checked) == (result.snapshot.id, objects, objects)


def test_a_snapshot_that_passed_before_pays_nothing(project: Path, tmp_path: Path,
                                                    damaging: Callable[[Damage], list[str]]) -> None:
    """A second publish of the snapshot (a new tag) reads nothing: not even a spoiled object,
    which only `prep fsck` finds at rest."""
    store = open_store(str(tmp_path / "store"))
    first = build_in_process(project, store)
    damaging(flip_artifact)
    again = build_in_process(project, store, PublishOptions(tags=("v1",)))
    assert again.snapshot.id == first.snapshot.id
    assert again.readback.recorded_before and again.readback.checked == 0


def test_objects_the_previous_snapshot_proved_are_not_read_again(project: Path, tmp_path: Path) -> None:
    """A new snapshot (bin only) of shards the last one proved reads only its own manifest; one
    that also has new objects reads exactly those."""
    store = open_store(str(tmp_path / "store"))
    first = build_in_process(project, store)
    bin_only = project.parent / "bin.toml"  # beside the pipeline: its input paths are relative
    bin_only.write_text(project.read_text().replace('formats = ["bin", "wds"]', 'formats = ["bin"]'))
    second = build_in_process(bin_only, store)
    old = {a["sha256"] for a in first.snapshot.artifacts}
    new = {a["sha256"] for a in second.snapshot.artifacts}
    assert new < old and second.snapshot.id != first.snapshot.id
    assert (second.readback.checked, second.readback.when_written, second.readback.objects) == (1, 0, len(new) + 1)
    third = build_in_process(changed(project, tmp_path), store)
    added = {a["sha256"] for a in third.snapshot.artifacts} - new
    assert third.readback.checked + third.readback.when_written == len(added) + 1


def test_no_readback_opts_out_and_the_log_records_it(project: Path, tmp_path: Path,
                                                     damaging: Callable[[Damage], list[str]]) -> None:
    store = open_store(str(tmp_path / "store"))
    damaging(flip_artifact)
    result = build_in_process(project, store, PublishOptions(readback=False))
    assert read_ref(store, "tiny", "latest") is not None  # moved: the caller chose not to look
    log = json.loads(store.get_bytes(result.log_key))
    validate(log, "prep.build-log/2")
    assert log["readback"]["ran"] is False and log["readback"]["skipped"] == "--no-readback"
    assert records.read_readback(store, result.snapshot.id) is None


def test_no_readback_also_skips_the_read_back_of_shard_files_as_written(project: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The shard tasks read their files back from the disk as they write them, unless the build was
    asked for no read-back; the bytes, and so the snapshot, are the same either way."""
    reads: list[int] = []
    real = pread_into

    def counted(fd: int, view: memoryview, offset: int) -> int:
        reads.append(offset)
        return real(fd, view, offset)

    monkeypatch.setattr(sink, "pread_into", counted)
    checked = build_in_process(project, open_store(str(tmp_path / "checked")))
    assert reads and checked.readback.when_written > 0
    reads.clear()
    unchecked = build_in_process(project, open_store(str(tmp_path / "unchecked")), PublishOptions(readback=False))
    assert not reads and unchecked.snapshot.id == checked.snapshot.id


def test_objects_stored_again_are_read_back_despite_the_record(project: Path, tmp_path: Path,
                                                               damaging: Callable[[Damage], list[str]]) -> None:
    """After gc-like loss (shard objects and their task and stage records gone), a rebuild stores
    the shards again: the snapshot's old read-back record does not vouch for the new bytes."""
    import shutil

    root = tmp_path / "store"
    store = open_store(str(root))
    first = build_in_process(project, store)
    for artifact in first.snapshot.artifacts:
        store.delete(cas.object_key(artifact["sha256"]))
    forget_commits(root, "shard")
    shutil.rmtree(root / "stages" / "shard")
    named = damaging(flip_artifact)
    with pytest.raises(IntegrityError, match="no ref moved") as caught:
        build_in_process(project, store, PublishOptions(tags=("again",)))
    assert named[0] in str(caught.value)
    assert read_ref(store, "tiny", "again") is None
