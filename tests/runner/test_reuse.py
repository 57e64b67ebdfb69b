"""Reused results are checked before use: a flipped byte in any stored object a build reuses is
found, the object is recomputed, and the build publishes exactly what a clean build publishes."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prep import hashing
from prep.errors import IntegrityError
from prep.storage import LocalStore
from prep.store import cas, proven, records
from prep.store.layout import PROVEN_KEY
from prep.store.snapshots import load_snapshot
from tests.helpers import committed_records, forget_commits, make_records, run_prep, write_jsonl, write_pipeline
from tests.runner.buildsupport import all_objects_intact, build_local, two_file_corpus


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    return two_file_corpus(tmp_path, 80, 50)


def flip_byte(path: Path, offset: int) -> None:
    """Change one byte of a read-only store object in place, as bit rot would."""
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0x20
    path.write_bytes(bytes(data))
    os.chmod(path, 0o444)


def object_path(store_dir: Path, object_id: str) -> Path:
    return store_dir / cas.object_key(hashing.parse_id(object_id))


def task_outputs(store_dir: Path, stage: str) -> list[str]:
    found = []
    for _, record in sorted(committed_records(LocalStore(store_dir), stage).items()):
        found.extend(record["outputs"].values())
    return found


def clean_snapshot(corpus: Path, pipeline: Path, name: str) -> str:
    return build_local(pipeline, corpus / f"clean-{name}", workers=1).snapshot.id


def build_log(store_dir: Path, key: str) -> dict[str, Any]:
    return dict(json.loads((store_dir / key).read_text()))


@pytest.mark.parametrize("region", ["text", "tokens", "metadata"])
def test_corrupt_intermediate_is_recomputed_when_a_later_stage_reuses_it(corpus: Path, tokenizer_path: Path,
                                                                         region: str) -> None:
    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="4KB")
    store_dir = corpus / "store"
    build_local(pipeline, store_dir, workers=2)
    intermediate = object_path(store_dir, task_outputs(store_dir, "tokenize")[0])
    size = intermediate.stat().st_size
    flip_byte(intermediate, {"text": 3, "tokens": size // 2, "metadata": size - 40}[region])

    # Shards are content-defined: a shard_size that halves them makes the shard jobs run.
    changed = write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="1KB")
    result = build_local(changed, store_dir, workers=2)
    assert result.stages["tokenize"].cached == 2 and result.stages["tokenize"].ran == 0
    assert result.snapshot.id == clean_snapshot(corpus, changed, region)
    assert all_objects_intact(store_dir)
    log = build_log(store_dir, result.log_key)
    assert [entry["object"] for entry in log["recomputed"]] == [task_outputs(store_dir, "tokenize")[0]]


def test_corrupt_shard_object_is_rewritten_by_a_rebuild(corpus: Path, tokenizer_path: Path) -> None:
    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"])
    store_dir = corpus / "store"
    first = build_local(pipeline, store_dir, workers=1)
    artifact = first.snapshot.artifacts[1]
    flip_byte(store_dir / cas.object_key(artifact["sha256"]), 100)

    again = build_local(pipeline, store_dir, workers=2)
    assert again.snapshot.id == first.snapshot.id
    assert again.stages["shard"].ran == 1
    assert all_objects_intact(store_dir)


def rot_a_bucket_of_uncommitted_shards(store_dir: Path) -> str:
    """Forget the shard stage's commits and packs (as a build killed before them would) and flip a
    byte of the first bucket object; returns its id."""
    forget_commits(store_dir, "shard")
    shutil.rmtree(store_dir / "stages" / "shard")
    bucket = task_outputs(store_dir, "order")[0]
    flip_byte(object_path(store_dir, bucket), 90)
    return bucket


def test_corrupt_bucket_objects_are_recomputed_when_shard_jobs_need_them(corpus: Path, tokenizer_path: Path) -> None:
    """A build killed before committing its shards leaves route and order committed; if their
    objects rot meanwhile, the rerun recomputes them before any shard job reads them."""
    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"])
    store_dir = corpus / "store"
    first = build_local(pipeline, store_dir, workers=1)
    rot_a_bucket_of_uncommitted_shards(store_dir)

    again = build_local(pipeline, store_dir, workers=2)
    assert again.snapshot.id == first.snapshot.id
    assert again.stages["order"].cached == 1 and again.stages["shard"].ran > 0
    assert all_objects_intact(store_dir)


def test_corrupt_part_entries_are_recomputed_before_the_order_reads_them(corpus: Path, tokenizer_path: Path) -> None:
    """A part's entries object (a tokenize output only the order stage reads) that rotted is
    found before any order task reads it and recomputed by its tokenize task."""
    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"])
    store_dir = corpus / "store"
    build_local(pipeline, store_dir, workers=1)
    entries = [record["outputs"]["entries"] for _, record in sorted(committed_records(LocalStore(store_dir), "tokenize").items())]
    flip_byte(object_path(store_dir, entries[0]), 100)

    nodedup = write_pipeline(corpus, tokenizer_path, ["corpus"], extra="", formats='["bin"]')
    text = nodedup.read_text().replace("exact = true", "exact = false")
    nodedup.write_text(text)
    result = build_local(nodedup, store_dir, workers=1)
    assert result.stages["order"].ran >= 1 and result.stages["tokenize"].cached == 2
    assert [item["object"] for item in build_log(store_dir, result.log_key)["recomputed"]] == [entries[0]]
    assert result.snapshot.id == clean_snapshot(corpus, nodedup, "entries")
    assert all_objects_intact(store_dir)


def test_intermediates_an_id_check_reads_are_checked_before_it_reads_them(tmp_path: Path, tokenizer_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """An order task that checks a split file's ids reads that file's intermediates: a rotted one
    is found and recomputed before the check reads it, not afterwards by the shard stage."""
    import prep.stages.idcheck as idcheck
    import prep.stages.read as read
    from prep.config import load_pipeline
    from prep.progress import Progress
    from prep.runner.build import build
    from tests.runner.buildsupport import InProcessExecutor

    monkeypatch.setattr(read, "RANGE_BYTES", 2000)
    write_jsonl(tmp_path / "corpus" / "big.jsonl", make_records(60, seed=4))
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"], formats='["bin"]')
    store_dir = tmp_path / "store"
    build(load_pipeline(pipeline), LocalStore(store_dir), InProcessExecutor(), (), Progress(quiet=True))
    intermediates = [record["outputs"]["intermediate"]
                     for _, record in sorted(committed_records(LocalStore(store_dir), "tokenize").items())]
    assert len(intermediates) > 2
    flip_byte(object_path(store_dir, intermediates[1]), 40)

    read_intact: list[bool] = []
    real = idcheck.check_unique_ids

    def checking(source: str, paths: Any, spill_dir: Path | None = None) -> None:
        paths = list(paths)
        read_intact.extend(hashing.digest_file(path).sha256 == path.name for path in paths)
        real(source, paths, spill_dir)

    monkeypatch.setattr(idcheck, "check_unique_ids", checking)
    nodedup = pipeline.with_name("nodedup.toml")
    nodedup.write_text(pipeline.read_text().replace("exact = true", "exact = false"))
    result = build(load_pipeline(nodedup), LocalStore(store_dir), InProcessExecutor(), (), Progress(quiet=True))
    assert read_intact and all(read_intact), read_intact
    assert result.stages["order"].ran >= 1 and all_objects_intact(store_dir)


@pytest.mark.parametrize("stage", ["tokenize", "order", "shard"])
def test_corrupt_stage_manifest_is_rebuilt_from_task_records(corpus: Path, tokenizer_path: Path, stage: str) -> None:
    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"])
    store_dir = corpus / "store"
    first = build_local(pipeline, store_dir, workers=1)
    record = next((store_dir / "stages" / stage).glob("*.json"))
    flip_byte(object_path(store_dir, json.loads(record.read_text())["output"]), 5)

    again = build_local(pipeline, store_dir, workers=1)
    assert again.snapshot.id == first.snapshot.id
    assert all_objects_intact(store_dir)


def test_corrupt_snapshot_manifest_is_replaced_when_the_same_snapshot_is_published(corpus: Path,
                                                                                  tokenizer_path: Path) -> None:
    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"])
    store_dir = corpus / "store"
    first = build_local(pipeline, store_dir, workers=1)
    flip_byte(object_path(store_dir, first.snapshot.id), 10)
    with pytest.raises(IntegrityError):
        load_snapshot(LocalStore(store_dir), first.snapshot.id)

    again = build_local(pipeline, store_dir, workers=1)
    assert again.snapshot.id == first.snapshot.id
    assert load_snapshot(LocalStore(store_dir), first.snapshot.id).raw == first.snapshot.raw


def test_missing_intermediate_is_recomputed(corpus: Path, tokenizer_path: Path) -> None:
    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="4KB")
    store_dir = corpus / "store"
    build_local(pipeline, store_dir, workers=1)
    object_path(store_dir, task_outputs(store_dir, "tokenize")[1]).unlink()

    changed = write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="5KB")
    assert build_local(changed, store_dir, workers=1).snapshot.id == clean_snapshot(corpus, changed, "missing")


def test_cli_rebuild_over_a_corrupt_intermediate_warns_and_publishes_clean_shards(corpus: Path,
                                                                                 tokenizer_path: Path) -> None:
    """The issue's drill: flip a byte in an intermediate, change only shard_size, rebuild."""
    store_dir = corpus / "store"
    run_prep("build", write_pipeline(corpus, tokenizer_path, ["corpus"]), "--store", store_dir, "--workers", "2")
    flip_byte(object_path(store_dir, task_outputs(store_dir, "tokenize")[0]), 7)
    changed = write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="2KB")
    result = run_prep("build", changed, "--store", store_dir, "--workers", "2")
    assert "is corrupt or missing" in result.stderr and "recomputing it" in result.stderr
    assert result.stdout.split()[-1] == clean_snapshot(corpus, changed, "cli")


def test_an_object_that_cannot_be_recomputed_is_an_integrity_error(corpus: Path, tokenizer_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Recomputing must give the recorded bytes; a task that gives others is refused with exit 3."""
    from prep.runner import tasks, tokenizing

    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="4KB")
    store_dir = corpus / "store"
    build_local(pipeline, store_dir, workers=1)
    flip_byte(object_path(store_dir, task_outputs(store_dir, "tokenize")[0]), 3)
    real: Callable[[Any], tasks.TaskResult] = tokenizing.run_tokenize_job

    def drifting(job: Any) -> tasks.TaskResult:
        result = real(job)
        return tasks.TaskResult({"intermediate": cas.put_bytes(LocalStore(store_dir), b"other").id}, result.summary, {})

    monkeypatch.setattr("prep.runner.tokenizing.run_tokenize_job", drifting)
    from prep.config import load_pipeline
    from prep.progress import Progress
    from prep.runner.build import build
    from tests.runner.buildsupport import InProcessExecutor

    changed = write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="5KB")
    with pytest.raises(IntegrityError, match="not deterministic"):
        build(load_pipeline(changed), LocalStore(store_dir), InProcessExecutor(), (), Progress(quiet=True))
    assert records.read_task_record(LocalStore(store_dir), "tokenize", "0" * 64) is None


def test_a_corrupt_cached_download_is_fetched_again(s3_bucket: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers on an S3 store read objects through a local cache: a cached copy is re-hashed
    the first time a process uses it, and a corrupt one is downloaded again."""
    from prep.storage import open_store
    from prep.store import localcopy

    monkeypatch.setattr(localcopy, "_CHECKED", set())
    store = open_store(f"{s3_bucket}/store")
    data = os.urandom(100_000)
    object_id = cas.put_bytes(store, data).id
    cached = localcopy.local_file(store, object_id)
    assert cached.read_bytes() == data
    localcopy._CHECKED.clear()  # a new process
    flip_byte(cached, 500)
    assert localcopy.local_file(store, object_id).read_bytes() == data


def test_a_driver_failure_leaves_no_intermediate_staged_by_tasks_in_flight(tmp_path: Path, tokenizer_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """When the driver fails while tokenize tasks still run, it waits for them and removes the
    intermediates they leave in the staging folder for it (nothing will ever store them)."""
    from prep.runner import driver as build_module

    for index in range(6):
        write_jsonl(tmp_path / "corpus" / f"f{index}.jsonl", make_records(40, seed=index, prefix=f"f{index}"))
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"])
    real = build_module.publish_staged  # type: ignore[attr-defined]

    def failing_once(store: Any, result: Any) -> Any:
        if not failing_once.failed:  # type: ignore[attr-defined]
            failing_once.failed = True  # type: ignore[attr-defined]
            raise OSError(28, "No space left on device (injected)")
        return real(store, result)

    failing_once.failed = False  # type: ignore[attr-defined]
    monkeypatch.setattr(build_module, "publish_staged", failing_once)
    with pytest.raises(OSError, match="injected"):
        build_local(pipeline, tmp_path / "store", workers=2)
    assert not list((tmp_path / "store" / "tmp").glob("tokenize-*"))


def count_trusted(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The objects the build's guard trusts by their proven stamps instead of re-hashing them."""
    trusted: set[str] = set()
    real = proven.unchanged

    def recording(store: Any, object_ids: Any, known: Any) -> set[str]:
        found = real(store, object_ids, known)
        trusted.update(found)
        return found

    monkeypatch.setattr(proven, "unchanged", recording)
    return trusted


def test_a_rebuild_with_nothing_changed_reads_no_shard_file_again(corpus: Path, tokenizer_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The shard files were read back from the disk as they were written: their stamps then prove
    them to the next build, which reads none of them (20 TB at the target scale)."""
    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="4KB")
    store_dir = corpus / "store"
    first = build_local(pipeline, store_dir, workers=2)
    trusted = count_trusted(monkeypatch)
    again = build_local(pipeline, store_dir, workers=2)
    assert again.snapshot.id == first.snapshot.id
    shard_files = {f"sha256:{artifact['sha256']}" for artifact in first.snapshot.artifacts}
    assert len(shard_files) > 2 and shard_files <= trusted


def test_a_shard_file_rewritten_under_its_old_mtime_is_hashed_and_recomputed(corpus: Path, tokenizer_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A proven stamp covers the file's ctime, which no writer can set back."""
    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"])
    store_dir = corpus / "store"
    first = build_local(pipeline, store_dir, workers=1)
    path = store_dir / cas.object_key(first.snapshot.artifacts[1]["sha256"])
    before = path.stat()
    flip_byte(path, 100)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns
    again = build_local(pipeline, store_dir, workers=2)
    assert again.snapshot.id == first.snapshot.id and again.stages["shard"].ran == 1
    assert all_objects_intact(store_dir)


@pytest.mark.parametrize("damage", ["removed", "torn", "garbage"])
def test_a_lost_or_damaged_proof_record_means_hashing_again(corpus: Path, tokenizer_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="4KB")
    store_dir = corpus / "store"
    first = build_local(pipeline, store_dir, workers=1)
    record = store_dir / PROVEN_KEY
    lines = record.read_bytes().splitlines(keepends=True)
    if damage == "removed":
        record.unlink()
    else:
        record.write_bytes(b"".join(line[:len(line) // 2] if damage == "torn" else b'{"object": 1}\n'
                                    for line in lines))
    trusted = count_trusted(monkeypatch)
    again = build_local(pipeline, store_dir, workers=1)
    assert again.snapshot.id == first.snapshot.id
    assert not trusted
    assert len(proven.load(LocalStore(store_dir))) >= len(first.snapshot.artifacts)  # proven again


def test_intermediates_re_hashed_by_one_rebuild_are_trusted_by_the_next(corpus: Path, tokenizer_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A build hashes its intermediates as they are written, never from the disk: the first
    rebuild whose shard jobs read them re-hashes them and records their stamps; later ones do not."""
    store_dir = corpus / "store"
    build_local(write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="4KB"), store_dir, workers=1)
    intermediates = set(task_outputs(store_dir, "tokenize"))  # and the parts' entries, which order tasks read
    trusted = count_trusted(monkeypatch)
    build_local(write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="2KB"), store_dir, workers=1)
    assert not intermediates & trusted
    trusted.clear()
    build_local(write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="1KB"), store_dir, workers=1)
    assert intermediates <= trusted
