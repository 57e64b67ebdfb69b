"""End-to-end properties of `prep build` on a local store."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.helpers import make_records, write_jsonl, write_pipeline
from tests.runner.buildsupport import (
    InProcessExecutor,
    all_objects_intact,
    artifact_path,
    build_local,
    read_samples,
    read_sequences,
)

EOS = "<|endoftext|>"


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    """Three files; the third repeats two texts of the first (exact duplicates) and spells EOS."""
    first = make_records(60, seed=1, prefix="a")
    write_jsonl(tmp_path / "corpus" / "a.jsonl", first)
    write_jsonl(tmp_path / "corpus" / "b.jsonl", make_records(45, seed=2, prefix="b"))
    third = make_records(20, seed=3, prefix="c")
    third += [{"id": "c-dup-1", "text": first[3]["text"]}, {"id": "c-dup-2", "text": first[10]["text"]},
              {"id": "c-eos", "text": f"code that prints {EOS} inside a string"}]
    write_jsonl(tmp_path / "corpus" / "sub" / "c.jsonl", third)
    return tmp_path


def test_worker_count_does_not_change_snapshot_or_bytes(corpus: Path, tokenizer_path: Path) -> None:
    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"])
    one = build_local(pipeline, corpus / "store1", workers=1)
    two = build_local(pipeline, corpus / "store2", workers=2)
    three = build_local(pipeline, corpus / "store3", workers=3)
    assert one.snapshot.id == two.snapshot.id == three.snapshot.id
    assert one.snapshot.raw == two.snapshot.raw
    assert len({a["shard"] for a in one.snapshot.artifacts}) > 2, "expected several shards"
    for artifact in one.snapshot.artifacts:
        assert artifact_path(corpus / "store1", artifact).read_bytes() == artifact_path(corpus / "store2", artifact).read_bytes()


def test_forked_workers_build_the_snapshot_spawned_ones_do(corpus: Path, tokenizer_path: Path) -> None:
    """The CLI forks its local workers (prep.runner.build.make_executor); tests mostly spawn them.
    The forked build runs in a process of its own: this one may hold other tests' threads, and a
    pool forks only from a process without any."""
    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"])
    spawned = build_local(pipeline, corpus / "store1", workers=2)
    run = subprocess.run([sys.executable, "-c", _FORKED_BUILD, str(pipeline), str(corpus / "store2")],
                         capture_output=True, text=True, check=True)
    start_method, snapshot_id, replaced = run.stdout.split()
    assert (start_method, snapshot_id, replaced) == ("fork", spawned.snapshot.id, "0")


def test_workers_replaced_after_every_task_build_the_same_snapshot(corpus: Path, tokenizer_path: Path) -> None:
    """Replacements start during the build, while the driver runs the lease's renewal thread
    (so they are spawned, not forked): every task in a fresh worker gives the same bytes."""
    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"])
    reference = build_local(pipeline, corpus / "store1", workers=2)
    run = subprocess.run([sys.executable, "-c", _FORKED_BUILD, str(pipeline), str(corpus / "store2"), "1"],
                         capture_output=True, text=True, check=True)
    _, snapshot_id, replaced = run.stdout.split()
    assert snapshot_id == reference.snapshot.id
    assert int(replaced) >= reference.stages["tokenize"].ran + reference.stages["order"].ran - 2


_FORKED_BUILD = """
import sys
from pathlib import Path
from prep.config import load_pipeline
from prep.progress import Progress
from prep.runner.build import build, make_executor
from prep.runner.executors import pool
from prep.storage import LocalStore
if len(sys.argv) > 3:
    pool.RECYCLE_AFTER = int(sys.argv[3])
executor = make_executor("local", 2)
try:
    result = build(load_pipeline(Path(sys.argv[1])), LocalStore(Path(sys.argv[2])), executor, (), Progress(quiet=True))
finally:
    executor.close()
print(executor.start_method, result.snapshot.id, executor.replaced)
"""


def test_a_pool_is_spawned_while_another_thread_runs() -> None:
    """A forked child would inherit the locks that thread holds, held forever."""
    import threading

    from prep.runner.executors.pool import LocalExecutor

    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        executor = LocalExecutor(1, fork=True)
        assert executor.start_method == "spawn"
        executor.close()
    finally:
        release.set()
        other.join()


def test_tokens_match_reference_and_formats_agree(corpus: Path, tokenizer_path: Path) -> None:
    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus/*.jsonl", "corpus/sub/*.jsonl"])
    result = build_local(pipeline, corpus / "store", workers=2)
    manifest = result.snapshot.manifest
    reference = Tokenizer.from_file(str(tokenizer_path))
    reference.encode_special_tokens = True
    eos_id = reference.token_to_id(EOS)
    texts_by_id = {}
    for path in sorted((corpus / "corpus").rglob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            texts_by_id[record["id"]] = record["text"]

    sequences = read_sequences(corpus / "store", manifest)
    samples = read_samples(corpus / "store", manifest)
    stats = manifest["stats"]
    assert stats["documents_read"] == len(texts_by_id) == 128
    assert stats["duplicates_dropped"] == 2
    assert stats["documents_written"] == len(sequences) == len(samples) == 126
    assert stats["tokens_written"] == sum(len(s) for s in sequences)
    assert stats["special_token_documents"] == 1
    keys = [key for key, _ in samples]
    assert keys == sorted(set(keys)) and all(len(key) == 32 and int(key, 16) >= 0 for key in keys)
    seen = set()
    for sequence, (_key, members) in zip(sequences, samples):
        meta = json.loads(members["json"])
        text = members["txt"].decode("utf-8")
        assert texts_by_id[meta["id"]] == text
        expected = reference.encode(text, add_special_tokens=False).ids + [eos_id]
        assert sequence.tolist() == expected
        assert np.load(__import__("io").BytesIO(members["tokens.npy"])).tolist() == expected
        assert meta["tokens"] == len(expected)
        seen.add(meta["id"])
    assert "c-dup-1" not in seen and "a-3" in seen  # the first occurrence in input order is kept
    eos_doc = next(s for s, (_, m) in zip(sequences, samples) if json.loads(m["json"])["id"] == "c-eos")
    assert eos_doc.tolist().count(eos_id) == 1, "a literal EOS string must not become the EOS id"
    order = [json.loads(m["json"])["id"] for _, m in samples]
    assert order != sorted(order, key=lambda i: (i[0], int(i.split("-")[-1]) if i.split("-")[-1].isdigit() else 0))


@pytest.mark.parametrize(("per_bucket", "range_bytes"), [(10, 1 << 25), (1000, 2000), (40, 700)])
def test_bucket_count_and_task_size_do_not_change_the_shards(corpus: Path, tokenizer_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch, per_bucket: int,
                                                             range_bytes: int) -> None:
    """Many small buckets and byte-range tasks, or one of each, give the same shard files under
    the same names: shards are content-defined. (The snapshot id also records the stages' task
    lists, so it follows these constants; they are code, not settings.)"""
    from prep.config import load_pipeline
    from prep.progress import Progress
    from prep.runner import ordering
    from prep.runner.build import build
    from prep.stages import read
    from prep.storage import LocalStore

    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="1KB")
    reference = build_local(pipeline, corpus / "reference", workers=1)
    monkeypatch.setattr(ordering, "DOCUMENTS_PER_BUCKET", per_bucket)
    monkeypatch.setattr(read, "RANGE_BYTES", range_bytes)
    other = build(load_pipeline(pipeline), LocalStore(corpus / "other"), InProcessExecutor(), (), Progress(quiet=True))
    assert [(a["path"], a["sha256"]) for a in other.snapshot.artifacts] == \
        [(a["path"], a["sha256"]) for a in reference.snapshot.artifacts]
    assert other.snapshot.manifest["stats"] == reference.snapshot.manifest["stats"]


def test_a_million_documents_make_four_order_tasks() -> None:
    """Not one task that the whole pool waits for (the bucket count never follows the workers)."""
    from prep.runner import ordering
    from prep.stages.cuts import bucket_bits

    assert bucket_bits(1_000_000, ordering.DOCUMENTS_PER_BUCKET) == 2


def test_rebuild_is_all_cache_hits_and_one_changed_file_retokenizes_only_it(corpus: Path, tokenizer_path: Path) -> None:
    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="1KB")
    store = corpus / "store"
    first = build_local(pipeline, store, workers=2)
    again = build_local(pipeline, store, workers=2)
    assert again.snapshot.id == first.snapshot.id
    assert all(run.ran == 0 for run in again.stages.values()), {n: r.ran for n, r in again.stages.items()}
    assert (again.refs[0].action, again.refs[0].generation) == ("unchanged", 1)  # a no-op rebuild moves no ref

    records = make_records(45, seed=2, prefix="b")
    records[5]["text"] = "an edited document"
    write_jsonl(corpus / "corpus" / "b.jsonl", records)
    changed = build_local(pipeline, store, workers=2)
    assert changed.snapshot.id != first.snapshot.id
    assert changed.stages["tokenize"].ran == 1 and changed.stages["tokenize"].cached == 2
    assert "route" not in changed.stages  # tokenize tasks write their parts' entries themselves
    assert changed.stages["order"].ran == 1
    assert all_objects_intact(store)
    # One edited document: at most k + 2 = 3 shards change per format; the rest keep path and bytes.
    before = {(a["path"], a["sha256"]) for a in first.snapshot.artifacts}
    for fmt in ("bin", "idx", "wds"):
        changed_files = [a for a in changed.snapshot.artifacts if a["format"] == fmt and (a["path"], a["sha256"]) not in before]
        assert 1 <= len(changed_files) <= 3, (fmt, len(changed_files))
    assert len({a["shard"] for a in first.snapshot.artifacts}) > 4


def test_a_new_seed_retokenizes_and_builds_what_a_fresh_store_builds(corpus: Path, tokenizer_path: Path) -> None:
    """Intermediates are laid out in the seed's key order, so the seed is part of the tokenize
    key: a second seed in the same store tokenizes again and gives the snapshot a fresh store gives."""
    first = build_local(write_pipeline(corpus, tokenizer_path, ["corpus"], seed=1, name="one.toml"), corpus / "store")
    other = write_pipeline(corpus, tokenizer_path, ["corpus"], seed=2, name="two.toml")
    shared = build_local(other, corpus / "store")
    fresh = build_local(other, corpus / "fresh")
    assert shared.stages["tokenize"].ran == 3 and shared.stages["tokenize"].cached == 0
    assert shared.snapshot.id == fresh.snapshot.id != first.snapshot.id
    assert {a["sha256"] for a in shared.snapshot.artifacts} == {a["sha256"] for a in fresh.snapshot.artifacts}


def test_moving_the_corpus_keeps_the_snapshot_id(corpus: Path, tokenizer_path: Path,
                                                tmp_path_factory: pytest.TempPathFactory) -> None:
    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"])
    original = build_local(pipeline, corpus / "store")
    elsewhere = tmp_path_factory.mktemp("moved")
    import shutil

    shutil.copytree(corpus / "corpus", elsewhere / "deep" / "er" / "corpus")
    moved_pipeline = write_pipeline(elsewhere, tokenizer_path, ["deep/er/corpus"])
    assert build_local(moved_pipeline, elsewhere / "store").snapshot.id == original.snapshot.id


def test_large_jsonl_is_split_into_byte_ranges_with_absolute_lines(tmp_path: Path, tokenizer_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import prep.stages.read as read

    monkeypatch.setattr(read, "RANGE_BYTES", 2000)
    records = make_records(200, seed=9)
    write_jsonl(tmp_path / "corpus" / "big.jsonl", records)
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"], id_field=None, shard_size="1MB")
    from prep.config import load_pipeline
    from prep.progress import Progress
    from prep.runner.build import build
    from prep.storage import LocalStore

    result = build(load_pipeline(pipeline), LocalStore(tmp_path / "store"), InProcessExecutor(), (), Progress(quiet=True))
    assert result.stages["tokenize"].ran > 5
    samples = read_samples(tmp_path / "store", result.snapshot.manifest)
    assert len(samples) == 200
    by_line = {json.loads(m["json"])["line"]: m["txt"].decode() for _, m in samples}
    assert by_line == {i + 1: r["text"] for i, r in enumerate(records)}
    assert all(json.loads(m["json"])["id"] == f"big.jsonl:{json.loads(m['json'])['line']}" for _, m in samples)


def test_order_tasks_that_also_check_a_files_ids_start_first(tmp_path: Path, tokenizer_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Each file split into parts has its ids checked across its parts by one order task, which
    reads every part's ids: those tasks go first."""
    import prep.stages.read as read
    from prep.config import load_pipeline
    from prep.progress import Progress
    from prep.runner import ordering
    from prep.runner.build import build
    from prep.runner.ordering import IdChecks
    from prep.storage import LocalStore
    from prep.store import cas

    class Recording(InProcessExecutor):
        orders: list[Any] = []

        def run(self, fn: Any, items: Any) -> Any:
            self.orders.extend(item for item in items if type(item).__name__ == "OrderJob")
            return super().run(fn, items)

    monkeypatch.setattr(read, "RANGE_BYTES", 2000)
    monkeypatch.setattr(ordering, "DOCUMENTS_PER_BUCKET", 20)
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(3, seed=1, prefix="a"))
    write_jsonl(tmp_path / "corpus" / "b.jsonl", make_records(60, seed=2, prefix="b"))
    write_jsonl(tmp_path / "corpus" / "c.jsonl", make_records(60, seed=3, prefix="c"))
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"], shard_size="1MB")
    store = LocalStore(tmp_path / "store")
    build(load_pipeline(pipeline), store, Recording(), (), Progress(quiet=True))

    def checked(job: Any) -> IdChecks:
        return IdChecks(()) if job.check_ids is None else IdChecks.from_bytes(cas.get_bytes(store, job.check_ids))

    first, second, *rest = (checked(job) for job in Recording.orders)
    assert len(rest) >= 2 and not any(job.check_ids for job in Recording.orders[2:])
    assert [[part.source for part in same] for same in first.files + second.files] == \
        [["b.jsonl"] * len(first.files[0]), ["c.jsonl"] * len(second.files[0])]
    assert len(first.files[0]) > 2 and len(second.files[0]) > 2
    assert [job.bucket for job in Recording.orders[:2]] == [0, 1]  # the i-th split file's check goes to bucket i
    weights = [checked(job).documents for job in Recording.orders]
    assert weights == sorted(weights, reverse=True)


def test_order_and_shard_tasks_free_the_workers_tokenizer_engines(tmp_path: Path, tokenizer_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's engine cache (up to [build] tokenizer_cache) is dropped once it runs a later stage's task."""
    from prep.config import load_pipeline
    from prep.progress import Progress
    from prep.runner.build import build
    from prep.stages import tokenize
    from prep.storage import LocalStore

    class Recording(InProcessExecutor):
        engines_after: list[tuple[str, int]] = []

        def run(self, fn: Any, items: Any) -> Any:
            for index, item in enumerate(items):
                result = fn(item)
                self.engines_after.append((type(item).__name__, len(tokenize._ENGINES)))
                yield index, result

    monkeypatch.setattr(tokenize, "_ENGINES", {})
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(30, seed=5))
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"])
    build(load_pipeline(pipeline), LocalStore(tmp_path / "store"), Recording(), (), Progress(quiet=True))
    after = dict(Recording.engines_after)
    assert after["TokenizeJob"] == 1 and after["OrderJob"] == 0 and after["AssembleJob"] == 0


def test_a_tight_tokenizer_cache_reloads_engines_and_builds_the_same_snapshot(
        tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """[build] tokenizer_cache reaches the workers' tasks and never changes a byte: a build
    whose workers reload their engine every other batch publishes the default build's snapshot."""
    from prep.config import load_pipeline
    from prep.progress import Progress
    from prep.runner.build import build
    from prep.stages import tokenize
    from prep.storage import LocalStore
    from tests.stages.test_tokenize import count_engine_loads

    monkeypatch.setattr(tokenize, "BATCH_DOCUMENTS", 7)
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(40, seed=6))
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"])
    default = build(load_pipeline(pipeline), LocalStore(tmp_path / "default"), InProcessExecutor(), (),
                    Progress(quiet=True))
    with open(pipeline, "a", encoding="utf-8") as out:
        out.write('\n[build]\ntokenizer_cache = "1MB"\n')
    growing = iter(range(10**9, 10**12, 2 * 10**6))  # 2 MB more at every look
    monkeypatch.setattr(tokenize, "resident_bytes", lambda: next(growing))
    monkeypatch.setattr(tokenize, "_ENGINES", {})
    loads = count_engine_loads(monkeypatch)
    shown = io.StringIO()
    store = LocalStore(tmp_path / "tight")
    tight = build(load_pipeline(pipeline), store, InProcessExecutor(), (), Progress(stream=shown, quiet=False))
    assert len(loads) >= 3  # 6 batches: a reload before every second one
    assert tight.snapshot.id == default.snapshot.id
    logged = json.loads(store.get_bytes(tight.log_key))["tasks"]["tokenize"]
    reloads = sum(task["engine_reloads"] for task in logged.values())
    assert reloads == len(loads) - 1
    assert f"tokenizer reloaded {reloads} times ([build] tokenizer_cache)" in shown.getvalue()


def test_duplicate_ids_across_byte_ranges_of_one_file_are_bad_input(tmp_path: Path, tokenizer_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import prep.stages.read as read
    from prep.errors import InputError

    monkeypatch.setattr(read, "RANGE_BYTES", 1500)
    records = make_records(60, seed=4)
    records[-1]["id"] = records[0]["id"]
    write_jsonl(tmp_path / "corpus" / "big.jsonl", records)
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"])
    from prep.config import load_pipeline
    from prep.progress import Progress
    from prep.runner.build import build
    from prep.storage import LocalStore

    with pytest.raises(InputError, match="duplicate id 'doc-0'"):
        build(load_pipeline(pipeline), LocalStore(tmp_path / "store"), InProcessExecutor(), (), Progress(quiet=True))
    assert not (tmp_path / "store" / "refs").exists()


@pytest.mark.parametrize(("repeat", "long_first"), [(False, False), (True, False), (True, True)])
def test_a_split_files_ids_checked_in_partitions_through_a_build(tmp_path: Path, tokenizer_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch, repeat: bool,
                                                                 long_first: bool) -> None:
    """With the ids spilled into partitions (a tiny IDS_PER_PARTITION), a build still refuses a
    repeat across byte ranges, passes a file without one, and leaves no spill in the store; also
    when the first copy sits beside a much longer id than the second (each batch pads its ids to
    its longest: the partition hash once mixed that padding and missed the repeat)."""
    import prep.stages.idcheck as idcheck
    import prep.stages.read as read
    from prep.config import load_pipeline
    from prep.errors import InputError
    from prep.progress import Progress
    from prep.runner.build import build
    from prep.storage import LocalStore

    monkeypatch.setattr(read, "RANGE_BYTES", 1500)
    monkeypatch.setattr(idcheck, "IDS_PER_PARTITION", 7)
    records = make_records(60, seed=4)
    if long_first:
        records[1]["id"] = "a-much-longer-id-than-any-other"
    if repeat:
        records[-1]["id"] = records[0]["id"]
    write_jsonl(tmp_path / "corpus" / "big.jsonl", records)
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"])
    store = tmp_path / "store"
    if repeat:
        with pytest.raises(InputError, match="big.jsonl: duplicate id 'doc-0'"):
            build(load_pipeline(pipeline), LocalStore(store), InProcessExecutor(), (), Progress(quiet=True))
        assert not (store / "refs").exists()
    else:
        build(load_pipeline(pipeline), LocalStore(store), InProcessExecutor(), (), Progress(quiet=True))
    assert not list((store / "tmp").glob("prep-idcheck-*"))


def test_an_input_changed_after_hashing_is_refused(tmp_path: Path) -> None:
    from prep.errors import InputError
    from prep.inputs.sources import check_unchanged, discover

    write_jsonl(tmp_path / "a.jsonl", make_records(3))
    (source,) = discover(("a.jsonl",), tmp_path, "auto")
    check_unchanged(source)
    write_jsonl(tmp_path / "a.jsonl", make_records(4))
    with pytest.raises(InputError, match="changed during the build"):
        check_unchanged(source)


def test_an_input_rewritten_in_place_with_its_mtime_set_back_is_refused(tmp_path: Path) -> None:
    """Regression: only size and mtime were checked after reading, so an input rewritten with
    the same size and its mtime set back was tokenized under the hash of its old bytes."""
    import os
    import time

    from prep.errors import InputError
    from prep.inputs.sources import check_unchanged, discover

    path = tmp_path / "a.jsonl"
    write_jsonl(path, make_records(3))
    (source,) = discover(("a.jsonl",), tmp_path, "auto")
    before = path.stat()
    time.sleep(0.05)  # past the filesystem clock's tick: the rewrite's ctime must differ
    data = bytearray(path.read_bytes())
    data[data.index(b"doc")] = ord("D")
    with open(path, "r+b") as out:
        out.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(InputError, match="changed during the build"):
        check_unchanged(source)


def test_one_shard_written_by_several_workers_is_byte_identical(corpus: Path, tokenizer_path: Path) -> None:
    """Fewer shards than workers: one worker writes the shard's .bin and .idx while another
    writes its .tar. The bytes must not notice."""
    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"], shard_size="1MB")
    one = build_local(pipeline, corpus / "store1", workers=1)
    two = build_local(pipeline, corpus / "store2", workers=2)
    assert len({a["shard"] for a in one.snapshot.artifacts}) == 1
    assert one.snapshot.id == two.snapshot.id
    for artifact in one.snapshot.artifacts:
        assert artifact_path(corpus / "store2", artifact).read_bytes() == artifact_path(corpus / "store1", artifact).read_bytes()
    assert not list((corpus / "store2" / "tmp").glob("assemble-*"))


def test_contiguous_ranges_cover_every_index_once() -> None:
    from prep.runner.planning import contiguous_ranges as _contiguous_ranges

    for documents in ([], [5], [1, 1, 1], [10, 0, 0, 3, 7], [0, 0], list(range(1, 30))):
        for count in (1, 2, 3, 8):
            ranges = _contiguous_ranges(documents, count)
            assert len(ranges) == min(count, len(documents))
            assert all(start < end for start, end in ranges)
            covered = [i for start, end in ranges for i in range(start, end)]
            assert covered == list(range(len(documents)))


def test_inputs_are_hashed_in_the_driver_when_workers_share_its_machine(tmp_path: Path) -> None:
    """The local pool's workers are still starting while the driver hashes; other executors hash on workers."""
    import hashlib

    from prep.inputs.sources import discover
    from prep.runner.planning import hash_inputs

    class Recording(InProcessExecutor):
        def __init__(self, shares: bool) -> None:
            self.shares_filesystem, self.ran = shares, 0

        def run(self, fn: Any, items: Any) -> Any:
            self.ran += len(items)
            return super().run(fn, items)

    for name in "cab":
        write_jsonl(tmp_path / f"{name}.jsonl", make_records(5, seed=ord(name)))
    sources = discover(("*.jsonl",), tmp_path, "auto")
    for shares, jobs in ((True, 0), (False, 1)):
        executor = Recording(shares)
        hashed = hash_inputs(sources, executor)
        assert executor.ran == jobs
        assert [s.rel for s in hashed] == ["a.jsonl", "b.jsonl", "c.jsonl"]
        assert [s.sha256 for s in hashed] == [hashlib.sha256((tmp_path / s.rel).read_bytes()).hexdigest() for s in hashed]


def test_encode_special_tokens_off_lets_text_become_the_special_id(corpus: Path, tokenizer_path: Path) -> None:
    """The option is part of the resolved config (a different snapshot), and with it off a
    literal EOS string is encoded as the EOS id, exactly like the reference with that setting."""
    on = build_local(write_pipeline(corpus, tokenizer_path, ["corpus"]), corpus / "store")
    off_pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"], name="off.toml")
    off_pipeline.write_text(off_pipeline.read_text().replace('backend = "tokenizers"\n',
                                                             'backend = "tokenizers"\nencode_special_tokens = false\n'))
    off = build_local(off_pipeline, corpus / "store")
    assert off.snapshot.id != on.snapshot.id
    assert off.snapshot.manifest["config"]["tokenizer"]["encode_special_tokens"] is False
    reference = Tokenizer.from_file(str(tokenizer_path))
    eos_id = reference.token_to_id(EOS)
    samples = read_samples(corpus / "store", off.snapshot.manifest)
    sequences = read_sequences(corpus / "store", off.snapshot.manifest)
    (eos_doc,) = [seq for seq, (_, m) in zip(sequences, samples) if json.loads(m["json"])["id"] == "c-eos"]
    text = f"code that prints {EOS} inside a string"
    assert eos_doc.tolist() == reference.encode(text, add_special_tokens=False).ids + [eos_id]
    assert eos_doc.tolist().count(eos_id) == 2


def test_workers_load_the_tokenizer_up_front_unless_a_rebuild_looks_unchanged(corpus: Path, tokenizer_path: Path) -> None:
    """The warm-up is a scheduling hint: asked for on a first build and after an input changes size,
    skipped when the latest snapshot has the same config, code, tokenizer and input sizes."""
    from prep.config import load_pipeline
    from prep.progress import Progress
    from prep.runner.build import build
    from prep.storage import LocalStore

    class Recording(InProcessExecutor):
        warmed: list[Any] = []

        def warm(self, warm_up: Any) -> None:
            self.warmed.append(warm_up)

    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"])
    store = LocalStore(corpus / "store")

    def warmed_by_build() -> bool:
        executor = Recording()
        executor.warmed = []
        build(load_pipeline(pipeline), store, executor, (), Progress(quiet=True))
        return bool(executor.warmed)

    assert warmed_by_build()
    assert not warmed_by_build()
    with open(sorted((corpus / "corpus").glob("*.jsonl"))[0], "a") as handle:
        handle.write(json.dumps({"id": "extra", "text": "one more document"}) + "\n")
    assert warmed_by_build()


def test_a_rebuild_that_looks_unchanged_checks_the_latest_artifacts_while_hashing(corpus: Path,
                                                                                  tokenizer_path: Path) -> None:
    """The artifacts it will reuse are re-hashed first (meanwhile the driver hashes the inputs),
    once: the shard stage then trusts them instead of checking them after everything else. Files
    a build proved before (prep.store.proven) are not read at all while their stamps hold."""
    from prep.config import load_pipeline
    from prep.progress import Progress
    from prep.runner.build import build
    from prep.runner.reuse import CheckJob
    from prep.storage import LocalStore
    from prep.store.layout import PROVEN_KEY

    class Recording(InProcessExecutor):
        checked: list[list[str]] = []

        def run(self, fn: Any, items: Any) -> Any:
            self.checked.append([oid for item in items if isinstance(item, CheckJob) for oid in item.object_ids])
            return super().run(fn, items)

    pipeline = write_pipeline(corpus, tokenizer_path, ["corpus"])
    first = build(load_pipeline(pipeline), LocalStore(corpus / "store"), Recording(), (), Progress(quiet=True))
    artifacts = sorted({f"sha256:{a['sha256']}" for a in first.snapshot.artifacts})
    for proof in ("kept", "lost"):
        Recording.checked = []
        if proof == "lost":
            (corpus / "store" / PROVEN_KEY).unlink()
        again = build(load_pipeline(pipeline), LocalStore(corpus / "store"), Recording(), (), Progress(quiet=True))
        assert again.snapshot.id == first.snapshot.id
        assert sorted(oid for batch in Recording.checked for oid in batch) == ([] if proof == "kept" else artifacts)
        assert not any(Recording.checked[1:]), "checked once"


def test_without_dedup_repeated_texts_get_distinct_sample_keys(tmp_path: Path, tokenizer_path: Path) -> None:
    """Equal texts share an order key; with dedup off each further copy's sample key is the
    order key plus its copy number, so no WebDataset reader merges two samples."""
    import webdataset

    records = make_records(20, seed=9, prefix="r") + [{"id": f"copy-{i}", "text": "the same text"} for i in range(4)]
    write_jsonl(tmp_path / "corpus" / "r.jsonl", records)
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"], shard_size="1MB")
    pipeline.write_text(pipeline.read_text().replace("exact = true", "exact = false"))
    result = build_local(pipeline, tmp_path / "store")
    samples = read_samples(tmp_path / "store", result.snapshot.manifest)
    keys = [key for key, _ in samples]
    assert len(keys) == len(set(keys)) == 24 and keys == sorted(keys)
    tar = next(a for a in result.snapshot.artifacts if a["format"] == "wds")
    read = list(webdataset.WebDataset(str(artifact_path(tmp_path / "store", tar)), shardshuffle=False))
    assert len(read) == 24 and sum(1 for s in read if b'"copy-' in s["json"]) == 4


def test_a_library_build_records_the_retention_policy_for_gc(corpus: Path, tokenizer_path: Path) -> None:
    """The runner, not the CLI, commits the policy: a build called as a library keeps rollback targets too."""
    from prep.storage.local import LocalStore
    from prep.store.retention import stored_policy

    pipeline = write_pipeline(corpus, tokenizer_path, extra="\n[retention]\nkeep_last = 4\n", name="kept.toml")
    build_local(pipeline, corpus / "kept-store")
    policy = stored_policy(LocalStore(corpus / "kept-store"), "tiny")
    assert policy is not None and policy.keep_last == 4


def test_another_host_compares_size_and_mtime_but_not_the_ctime_it_sees(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 44: a shared filesystem may show each client another ctime. A worker on another host
    than the one that listed an input compares its size and mtime only, and names itself when they
    differ; the listing host still compares the ctime too."""
    import dataclasses
    import socket

    from prep.errors import InputError
    from prep.inputs.sources import check_unchanged, discover

    write_jsonl(tmp_path / "a.jsonl", make_records(3))
    (source,) = discover(("a.jsonl",), tmp_path, "auto")
    assert source.stamp_host == socket.gethostname()
    other_ctime = dataclasses.replace(source, stamp=(*source.stamp[:2], source.stamp[2] + 1))
    with pytest.raises(InputError, match="changed during the build"):
        check_unchanged(other_ctime)
    elsewhere = dataclasses.replace(other_ctime, stamp_host="listing-host")
    check_unchanged(elsewhere)
    moved = dataclasses.replace(elsewhere, stamp=(source.stamp[0], source.stamp[1] + 1, source.stamp[2]))
    monkeypatch.setattr(socket, "gethostname", lambda: "worker-7")
    with pytest.raises(InputError, match="differs on host worker-7 .*host listing-host listed"):
        check_unchanged(moved)
