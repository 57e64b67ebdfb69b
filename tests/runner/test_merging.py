"""The merge level: with more parts than `[build] merge_fan_in`, the parts' entries are merged
into runs before the order stage, and nothing the build makes changes: the same snapshot id
whatever the fan-in, dedup across files and tasks as before, no merge when no bucket must be
ordered, and a damaged run that a later build reuses is remade before it is read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prep.config import load_pipeline
from prep.progress import Progress
from prep.runner import ordering
from prep.runner.build import BuildResult, build
from prep.runner.merging import merge_groups
from prep.stages import merge, read
from prep.storage import LocalStore
from tests.helpers import committed_records, make_records, write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor, all_objects_intact, build_local
from tests.runner.test_reuse import flip_byte, object_path, rot_a_bucket_of_uncommitted_shards, task_outputs

FILES = 7


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """Seven files; the last repeats texts of the first and of the fourth (exact duplicates)."""
    texts = []
    for index in range(FILES - 1):
        records = make_records(25 + 5 * index, seed=index + 1, prefix=f"f{index}")
        write_jsonl(tmp_path / "corpus" / f"{index}.jsonl", records)
        texts.append(records)
    last = make_records(20, seed=99, prefix="last")
    last += [{"id": "dup-a", "text": texts[0][2]["text"]}, {"id": "dup-d", "text": texts[3][7]["text"]}]
    write_jsonl(tmp_path / "corpus" / f"{FILES - 1}.jsonl", last)
    return tmp_path


def _pipeline(corpus: Path, tokenizer_path: Path, fan_in: int | None, shard_size: str = "2KB") -> Path:
    extra = f"\n[build]\nmerge_fan_in = {fan_in}\n" if fan_in else ""
    return write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size=shard_size, extra=extra,
                          name=f"fan-in-{fan_in}-{shard_size}.toml")


def _in_process(pipeline: Path, store: Path) -> BuildResult:
    return build(load_pipeline(pipeline), LocalStore(store), InProcessExecutor(), (), Progress(quiet=True))


@pytest.mark.parametrize("fan_in", [2, 3, 5])
def test_any_fan_in_gives_the_snapshot_of_an_unmerged_build(corpus: Path, tokenizer_path: Path, fan_in: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Several buckets, files split into several parts, slices of a few entries."""
    monkeypatch.setattr(ordering, "DOCUMENTS_PER_BUCKET", 40)
    monkeypatch.setattr(read, "RANGE_BYTES", 2500)
    monkeypatch.setattr(merge, "SLICE_ENTRIES", 16)
    reference = _in_process(_pipeline(corpus, tokenizer_path, None), corpus / "reference")
    assert "merge" not in reference.stages
    merged = _in_process(_pipeline(corpus, tokenizer_path, fan_in), corpus / f"merged-{fan_in}")
    assert merged.snapshot.id == reference.snapshot.id
    assert merged.stages["merge"].ran >= 1 and merged.stages["tokenize"].ran > FILES  # split files
    assert [stage["name"] for stage in merged.snapshot.manifest["stages"]] == ["tokenize", "order", "shard"]
    assert merged.snapshot.manifest["stats"]["duplicates_dropped"] == 2
    log = json.loads((corpus / f"merged-{fan_in}" / merged.log_key).read_text())
    assert log["stages"]["merge"]["ran"] == merged.stages["merge"].ran
    assert all_objects_intact(corpus / f"merged-{fan_in}")


def test_a_rebuild_merges_only_what_changed_and_nothing_when_no_bucket_is_ordered(corpus: Path,
                                                                                 tokenizer_path: Path) -> None:
    pipeline = _pipeline(corpus, tokenizer_path, 2)
    store = corpus / "store"
    first = build_local(pipeline, store, workers=2)
    merges = first.stages["merge"].ran
    assert merges == 5  # 7 parts -> 4 (3 merges, one part passes through) -> 2 (2 merges)
    again = build_local(pipeline, store, workers=2)
    assert again.snapshot.id == first.snapshot.id and "merge" not in again.stages

    write_jsonl(corpus / "corpus" / f"{FILES - 1}.jsonl", make_records(22, seed=7, prefix="edited"))
    edited = build_local(pipeline, store, workers=2)
    assert 0 < edited.stages["merge"].ran < merges and edited.stages["merge"].cached > 0
    assert edited.snapshot.id == build_local(pipeline, corpus / "fresh", workers=2).snapshot.id


def test_a_damaged_run_is_remade_before_an_order_task_reads_it(corpus: Path, tokenizer_path: Path) -> None:
    """Every run and a part's entries object rot: the second round's runs are remade from the
    first's, which are remade first, one of them from the part's entries, remade before that."""
    store = corpus / "store"
    build_local(_pipeline(corpus, tokenizer_path, 2), store, workers=2)
    runs = task_outputs(store, "merge")
    assert runs
    part_entries = [output for output in task_outputs(store, "tokenize") if output not in _intermediates(store)]
    for damaged in [*runs, part_entries[1]]:
        flip_byte(object_path(store, damaged), 100)
    # A new shard size makes every order task run again, reading the runs the merge tasks recorded.
    changed = _pipeline(corpus, tokenizer_path, 2, shard_size="1KB")
    result = build_local(changed, store, workers=2)
    assert result.stages["merge"].ran == 0 and result.stages["merge"].cached == len(runs)
    log = json.loads((store / result.log_key).read_text())
    assert {item["object"] for item in log["recomputed"]} == {*runs, part_entries[1]}
    assert result.snapshot.id == build_local(changed, corpus / "fresh", workers=2).snapshot.id
    assert all_objects_intact(store)


def _intermediates(store: Path) -> set[str]:
    return {record["outputs"]["intermediate"] for record in committed_records(LocalStore(store), "tokenize").values()}


def test_a_damaged_bucket_of_a_merged_build_is_remade_from_the_parts(corpus: Path, tokenizer_path: Path) -> None:
    """Every order task committed, so no merge ran: a bucket object that rotted is remade by an
    order task reading every part's entries, each checked first (one rotted too, and is remade
    before the order task reads it); the same snapshot."""
    pipeline = _pipeline(corpus, tokenizer_path, 2)
    store = corpus / "store"
    first = build_local(pipeline, store, workers=1)
    bucket = rot_a_bucket_of_uncommitted_shards(store)
    part_entries = sorted(set(task_outputs(store, "tokenize")) - _intermediates(store))[0]
    flip_byte(object_path(store, part_entries), 100)
    again = build_local(pipeline, store, workers=2)
    assert again.snapshot.id == first.snapshot.id
    assert "merge" not in again.stages and again.stages["order"].cached == 1 and again.stages["shard"].ran > 0
    recomputed = [item["object"] for item in json.loads((store / again.log_key).read_text())["recomputed"]]
    assert sorted(recomputed) == sorted([bucket, part_entries])
    assert all_objects_intact(store)


@given(count=st.integers(0, 5000), fan_in=st.integers(2, 300))
def test_merge_groups_are_consecutive_even_and_at_most_the_fan_in(count: int, fan_in: int) -> None:
    groups = merge_groups(count, fan_in)
    assert [first for first, _ in groups] == ([0] + [end for _, end in groups[:-1]] if groups else [])
    assert (groups[-1][1] if groups else 0) == count
    sizes = [end - first for first, end in groups]
    assert all(0 < size <= fan_in for size in sizes) and len(groups) == -(-count // fan_in)
    assert not sizes or max(sizes) - min(sizes) <= 1


def test_order_tasks_read_no_stage_manifest_and_name_a_table_of_forty_bytes_a_part(
        corpus: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At the target scale the tokenize stage manifest is hundreds of MB: an order task that
    parsed it would hold memory that follows the corpus. Order tasks read the parts' sources and
    line offsets from one packed table object instead (40 bytes a part), which the job names by
    id (it stays the same few hundred bytes however many parts), and otherwise entries objects."""
    import pickle

    from prep.runner import tasks
    from prep.stages.specs import PartTable
    from prep.store import cas

    monkeypatch.setattr(ordering, "DOCUMENTS_PER_BUCKET", 40)
    monkeypatch.setattr(read, "RANGE_BYTES", 2500)
    reference = _in_process(_pipeline(corpus, tokenizer_path, None), corpus / "reference")
    jobs: list[ordering.OrderJob] = []
    read_whole: list[str] = []
    real_get = cas.get_bytes

    def only_the_table(store: Any, object_id: str) -> bytes:
        read_whole.append(object_id)
        if object_id not in (jobs[-1].parts_table, jobs[-1].check_ids):
            raise AssertionError(f"an order task read object {object_id} whole")
        return real_get(store, object_id)

    def order_job(job: ordering.OrderJob) -> tasks.TaskResult:
        jobs.append(job)
        with monkeypatch.context() as patched:
            patched.setattr(cas, "get_bytes", only_the_table)
            return run_order_job(job)

    run_order_job = ordering.run_order_job
    monkeypatch.setattr(tasks, "_TABLES", {})
    monkeypatch.setattr(ordering, "run_order_job", order_job)
    rebuilt = _in_process(_pipeline(corpus, tokenizer_path, 3), corpus / "store")
    assert rebuilt.snapshot.id == reference.snapshot.id
    parts = rebuilt.stages["tokenize"].ran
    assert len(jobs) > 1 and parts > FILES
    assert len({job.parts_table for job in jobs}) == 1
    checks = [job.check_ids for job in jobs if job.check_ids is not None]
    assert sorted(read_whole) == sorted([jobs[0].parts_table, *checks])  # the part table once a process
    table = PartTable.from_bytes(real_get(LocalStore(corpus / "store"), jobs[0].parts_table))
    assert len(table) == parts and len(table.to_bytes()) == 40 * parts
    assert max(len(pickle.dumps(job)) for job in jobs) < 1200


def test_shard_jobs_carry_forty_four_bytes_a_part_and_each_source_once(corpus: Path, tokenizer_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard job reads from every part, so it is told about every part: in one packed table
    object it names by id, 44 bytes a part and each file's name once (a tuple of part references
    took hundreds of bytes a part, in every job), with the `.json` members it writes unchanged."""
    from prep.runner import sharding, tasks
    from prep.stages.specs import ShardParts
    from prep.store import cas

    monkeypatch.setattr(read, "RANGE_BYTES", 2500)
    reference = _in_process(_pipeline(corpus, tokenizer_path, None), corpus / "reference")
    jobs: list[sharding.AssembleJob] = []

    def assemble_job(job: sharding.AssembleJob) -> tasks.BatchResult:
        jobs.append(job)
        return run_assemble_job(job)

    run_assemble_job = sharding.run_assemble_job
    monkeypatch.setattr(sharding, "run_assemble_job", assemble_job)
    rebuilt = _in_process(_pipeline(corpus, tokenizer_path, None), corpus / "store")
    assert rebuilt.snapshot.id == reference.snapshot.id
    parts = rebuilt.stages["tokenize"].ran
    assert jobs and parts > FILES
    assert len({job.parts_table for job in jobs}) == 1
    table = ShardParts.from_bytes(cas.get_bytes(LocalStore(corpus / "store"), jobs[0].parts_table))
    assert len(table) == parts and len(table.intermediates) + len(table.line_offsets) + len(table.source_of) == 44 * parts
    assert sorted(table.sources) == sorted(f"{index}.jsonl" for index in range(FILES))
    assert ShardParts.from_bytes(table.to_bytes()) == table
    assert any(unit.unit == "wds" for job in jobs for unit in job.units)


@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_a_damaged_part_table_is_stored_again_before_any_task_reads_it(corpus: Path, tokenizer_path: Path,
                                                                       damage: str) -> None:
    """The tables jobs name by id are checked like any reused object: a flipped byte or a lost
    table is replaced from the driver's bytes before the order and shard tasks that read it run
    (the jobs would otherwise fail on a table that does not hash to its name)."""
    from prep.store import cas

    store_dir = corpus / "store"
    first = _in_process(_pipeline(corpus, tokenizer_path, None), store_dir)
    store = LocalStore(store_dir)
    tables = []
    for stage in ("order", "shard"):
        manifest = json.loads(cas.get_bytes(store, first.stages[stage].output))
        tables.append(manifest["parts_table"])
    for object_id in tables:
        if damage == "flip":
            flip_byte(object_path(store_dir, object_id), 5)
        else:
            object_path(store_dir, object_id).unlink()
    rebuilt = _in_process(_pipeline(corpus, tokenizer_path, None, shard_size="3KB"), store_dir)
    assert rebuilt.stages["order"].ran > 0 and rebuilt.stages["shard"].ran > 0
    assert all(cas.check(store, object_id) for object_id in tables)
    assert all_objects_intact(store_dir)


def test_a_damaged_part_table_is_remade_when_only_a_reused_bucket_remade_reads_it(corpus: Path,
                                                                                   tokenizer_path: Path) -> None:
    """Every order task committed, one shard file lost, its bucket and the order part table both
    flipped: the shard is rewritten from a bucket remade by its order task, which reads a table
    stored again first (a table is remade like any reused object, with a warning naming it)."""
    from prep.store import cas

    store_dir = corpus / "store"
    first = _in_process(_pipeline(corpus, tokenizer_path, None), store_dir)
    store = LocalStore(store_dir)
    order = json.loads(cas.get_bytes(store, first.stages["order"].output))
    shard = json.loads(cas.get_bytes(store, first.stages["shard"].output))["shards"][0]
    bucket = next(b["output"] for b in order["buckets"] if b["bucket"] == shard["slices"][0][0])
    flip_byte(object_path(store_dir, order["parts_table"]), 7)
    flip_byte(object_path(store_dir, bucket), 7)
    object_path(store_dir, shard["outputs"]["bin"]).unlink()
    again = _in_process(_pipeline(corpus, tokenizer_path, None), store_dir)
    assert again.snapshot.id == first.snapshot.id
    assert again.stages["order"].ran == 0 and again.stages["shard"].ran == 1
    log = json.loads(store.get_bytes(again.log_key))
    assert {item["what"] for item in log["recomputed"]} >= {"order part table", "bucket " + str(shard["slices"][0][0])}
    assert all_objects_intact(store_dir)
