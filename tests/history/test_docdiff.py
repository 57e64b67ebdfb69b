"""Document-level and snapshot-level diff of real builds: random edits to a corpus are reported
exactly, and nothing else; bounded-memory partitioning gives the same answer as in-memory; a
layout-1 snapshot (tests/history/layout1_factory.py) diffs against layout-2 ones exactly as the
layout-2 snapshot of the same inputs does; and the keep flags computed for layout 2 follow the
dedup rule (the first copy of each text in input order)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import prep.stages.read as read_module
from prep.config import load_pipeline
from prep.errors import InputError
from prep.history.diff import diff_snapshots
from prep.history.docdiff import DocumentChange, DocumentDiff, diff_documents
from prep.history.documents import LAYOUT_KEYED, LAYOUT_POSITIONAL, load_records, task_batches
from prep.history.keep import AllKept, PackedMask, first_occurrence_mask, keep_flags
from prep.progress import Progress
from prep.runner.build import build
from prep.runner.executors.pool import LocalExecutor
from prep.storage import LocalStore
from prep.store.snapshots import Snapshot
from tests.helpers import make_records, write_jsonl, write_pipeline
from tests.history.layout1_factory import first_occurrences, synthesize_layout1
from tests.runner.buildsupport import InProcessExecutor

Corpus = dict[str, list[dict[str, Any]]]
BASE_FILES = {"a.jsonl": 12, "b.jsonl": 9, "c.jsonl": 7}


@dataclass(frozen=True)
class Workspace:
    """One store, one warm executor and a tokenizer, shared by every build of a module."""

    root: Path
    store: LocalStore
    executor: LocalExecutor
    tokenizer: Path

    def build(self, name: str, corpus: Corpus, seed: int = 1234, shard_size: str = "4KB",
              id_field: str | None = "id", dedup: bool = True) -> Snapshot:
        folder = self.root / name
        for file_name, records in corpus.items():
            write_jsonl(folder / "corpus" / file_name, records)
        pipeline = write_pipeline(folder, self.tokenizer, ["corpus"], seed=seed, shard_size=shard_size,
                                  id_field=id_field)
        if not dedup:
            pipeline.write_text(pipeline.read_text().replace("exact = true", "exact = false"))
        return build(load_pipeline(pipeline), self.store, self.executor, (), Progress(quiet=True)).snapshot


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Iterator[Workspace]:
    root = tmp_path_factory.mktemp("docdiff")
    executor = LocalExecutor(1)
    try:
        yield Workspace(root, LocalStore(root / "store"), executor, tokenizer_path)
    finally:
        executor.close()


def base_corpus() -> Corpus:
    return {name: make_records(count, seed=index, prefix=name[0]) for index, (name, count) in enumerate(BASE_FILES.items())}


@pytest.fixture(scope="module")
def base(workspace: Workspace) -> Snapshot:
    snapshot = workspace.build("base", base_corpus())
    assert snapshot.manifest["stats"]["duplicates_dropped"] == 0, "base texts must be unique"
    return snapshot


@pytest.fixture(scope="module")
def base_v1(workspace: Workspace, base: Snapshot) -> Snapshot:
    """The layout-1 snapshot of the base corpus (the same tokenize outputs)."""
    return synthesize_layout1(workspace.store, base)


def run_diff(workspace: Workspace, old: Snapshot, new: Snapshot,
             memory_rows: int = 1_000_000) -> tuple[DocumentDiff, list[DocumentChange]]:
    folder = workspace.root / f"diff-{old.id[7:15]}-{new.id[7:15]}-{memory_rows}"
    folder.mkdir(exist_ok=True)
    result = diff_documents(workspace.store, old, new, folder, memory_rows=memory_rows)
    return result, list(result.changes())


# ----------------------------------------------------------------------------- random edits


@dataclass(frozen=True)
class FileEdit:
    removed: frozenset[int]
    changed: frozenset[int]
    added: int

    @property
    def touches(self) -> bool:
        return bool(self.removed or self.changed or self.added)


@dataclass(frozen=True)
class Edit:
    files: dict[str, FileEdit]
    dropped: str | None
    new_file: bool
    new_seed: bool
    new_shard_size: bool


@st.composite
def file_edits(draw: st.DrawFn, count: int) -> FileEdit:
    removed = draw(st.frozensets(st.integers(0, count - 1), max_size=3))
    changed = draw(st.frozensets(st.integers(0, count - 1).filter(lambda i: i not in removed), max_size=3))
    return FileEdit(removed, changed, draw(st.integers(0, 2)))


@st.composite
def edits(draw: st.DrawFn) -> Edit:
    files = {name: draw(file_edits(count)) for name, count in BASE_FILES.items()}
    return Edit(files, draw(st.sampled_from([None, *BASE_FILES])), draw(st.booleans()), draw(st.booleans()),
                draw(st.booleans()))


def apply(edit: Edit) -> tuple[Corpus, set[tuple[str, str]], set[tuple[str, str]], set[tuple[str, str]]]:
    """The edited corpus and the expected (file, id) sets: added, removed, changed."""
    corpus: Corpus = {}
    added: set[tuple[str, str]] = set()
    removed: set[tuple[str, str]] = set()
    changed: set[tuple[str, str]] = set()
    for name, records in base_corpus().items():
        if name == edit.dropped:
            removed |= {(name, r["id"]) for r in records}
            continue
        change = edit.files[name]
        kept = []
        for index, record in enumerate(records):
            if index in change.removed:
                removed.add((name, record["id"]))
            elif index in change.changed:
                kept.append({"id": record["id"], "text": f"edited {name} {index}: {record['text']}"})
                changed.add((name, record["id"]))
            else:
                kept.append(record)
        fresh = [{"id": f"{name[0]}-new-{j}", "text": f"fresh document {j} of {name}"} for j in range(change.added)]
        added |= {(name, r["id"]) for r in fresh}
        corpus[name] = kept + fresh
    if edit.new_file:
        corpus["d.jsonl"] = [{"id": f"d-{j}", "text": f"a whole new file, line {j}"} for j in range(3)]
        added |= {("d.jsonl", f"d-{j}") for j in range(3)}
    return corpus, added, removed, changed


def line_of(corpus: Corpus, source: str, doc_id: str) -> int:
    return next(index + 1 for index, record in enumerate(corpus[source]) if record["id"] == doc_id)


def as_set(changes: list[DocumentChange], kind: str) -> set[tuple[str, str]]:
    found = set()
    for change in changes:
        if change.change == kind:
            version = change.new or change.old
            assert version is not None
            found.add((change.source, version.id))
    return found


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edit=edits())
def test_diff_reports_exactly_the_edits(workspace: Workspace, base: Snapshot, base_v1: Snapshot, edit: Edit) -> None:
    corpus, added, removed, changed = apply(edit)
    new = workspace.build(f"edit-{abs(hash(repr(edit)))}", corpus, seed=99 if edit.new_seed else 1234,
                          shard_size="3KB" if edit.new_shard_size else "4KB")
    snapshot_diff = diff_snapshots(base, new)

    touched = {name for name, change in edit.files.items() if change.touches and name != edit.dropped}
    expected_files = {(name, "changed") for name in touched}
    expected_files |= {("d.jsonl", "added")} if edit.new_file else set()
    expected_files |= {(edit.dropped, "removed")} if edit.dropped else set()
    assert {(f.path, f.change) for f in snapshot_diff.files} == expected_files
    assert snapshot_diff.files_unchanged == len(BASE_FILES) - len(touched) - (1 if edit.dropped else 0)
    expected_settings = ({"seed"} if edit.new_seed else set()) | ({"config.output.shard_size"} if edit.new_shard_size else set())
    assert {s.key for s in snapshot_diff.settings} == expected_settings
    assert snapshot_diff.identical == (not expected_files and not expected_settings)
    stats = {delta.key: delta for delta in snapshot_diff.stats}
    assert stats["documents_read"].delta == len(added) - len(removed)
    assert stats["duplicates_dropped"].delta == 0
    new_hashes = sorted(a["sha256"] for a in new.artifacts)
    assert sorted(m.sha256 for m in snapshot_diff.artifacts_added + snapshot_diff.artifacts_unchanged) == new_hashes
    old_hashes = sorted(a["sha256"] for a in base.artifacts)
    assert sorted(m.sha256 for m in snapshot_diff.artifacts_removed + snapshot_diff.artifacts_unchanged) == old_hashes

    documents, changes = run_diff(workspace, base, new)
    summary = documents.summary
    assert summary.keyed_by == "id"
    assert as_set(changes, "added") == added
    assert as_set(changes, "removed") == removed
    assert as_set(changes, "changed") == changed
    assert (summary.added, summary.removed, summary.changed) == (len(added), len(removed), len(changed))
    assert summary.unchanged == new.manifest["stats"]["documents_written"] - len(added) - len(changed)
    assert summary.files_skipped == len(BASE_FILES) - len(touched) - (1 if edit.dropped else 0)
    for change in changes:
        if change.old is not None:
            assert change.old.line == line_of(base_corpus(), change.source, change.old.id)
        if change.new is not None:
            assert change.new.line == line_of(corpus, change.source, change.new.id)
        if change.change == "changed":
            assert change.old is not None and change.new is not None and change.old.text_hash != change.new.text_hash

    partitioned, partitioned_changes = run_diff(workspace, base, new, memory_rows=4)
    assert partitioned.summary == summary
    assert sorted(map(repr, partitioned_changes)) == sorted(map(repr, changes))

    from_layout1, layout1_changes = run_diff(workspace, base_v1, new)
    assert from_layout1.summary == summary and layout1_changes == changes


# ------------------------------------------------------------------------- keyed by text


def test_without_id_field_an_edit_is_removed_plus_added(workspace: Workspace) -> None:
    corpus = base_corpus()
    old = workspace.build("text-old", corpus, id_field=None)
    edited = {name: list(records) for name, records in corpus.items()}
    edited["a.jsonl"][2] = {"id": "ignored", "text": "an edited text"}
    del edited["b.jsonl"][0]
    new = workspace.build("text-new", edited, id_field=None)
    documents, changes = run_diff(workspace, old, new)
    assert documents.summary.keyed_by == "text_hash"
    summary = sorted((c.change, c.source, (c.old or c.new).id) for c in changes)  # type: ignore[union-attr]
    assert summary == [("added", "a.jsonl", "a.jsonl:3"), ("removed", "a.jsonl", "a.jsonl:3"),
                       ("removed", "b.jsonl", "b.jsonl:1")]
    assert documents.summary.unchanged == sum(len(r) for r in corpus.values()) - 2
    assert documents.summary.files_skipped == 1


def test_repeated_texts_count_as_copies_without_dedup(workspace: Workspace) -> None:
    records = make_records(5, seed=40, prefix="r")
    old = workspace.build("copies-old", {"a.jsonl": records}, id_field=None, dedup=False)
    new = workspace.build("copies-new", {"a.jsonl": records + [records[1], records[1]]}, id_field=None, dedup=False)
    documents, changes = run_diff(workspace, old, new)
    assert [(c.change, c.copies) for c in changes] == [("added", 2)]
    assert (documents.summary.added, documents.summary.unchanged) == (2, 5)
    back, changes_back = run_diff(workspace, new, old, memory_rows=2)
    assert [(c.change, c.copies) for c in changes_back] == [("removed", 2)]
    assert back.summary.removed == 2


def test_mixed_id_fields_fall_back_to_text_hashes(workspace: Workspace, base: Snapshot) -> None:
    without_ids = workspace.build("no-ids", base_corpus(), id_field=None)
    documents, changes = run_diff(workspace, base, without_ids)
    assert documents.summary.keyed_by == "text_hash"
    assert changes == [] and not documents.summary.differs
    assert {s.key for s in diff_snapshots(base, without_ids).settings} == {"config.input.id_field"}


def test_an_id_repeated_within_a_file_is_refused(workspace: Workspace, base: Snapshot,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    records = make_records(6, seed=41, prefix="x")
    records[4] = {"id": records[1]["id"], "text": "another text under a repeated id"}
    # Split the file into many small tasks: the build's dedup stage refuses the repeated id...
    monkeypatch.setattr(read_module, "RANGE_BYTES", 120)
    with pytest.raises(InputError, match=r"a\.jsonl: duplicate id 'x-1'"):
        workspace.build("repeated", {**base_corpus(), "a.jsonl": records})
    # ...and diff refuses it too, for stores written without that check.
    import prep.stages.idcheck as idcheck_module
    from tests.runner.buildsupport import InProcessExecutor

    monkeypatch.setattr(idcheck_module, "check_unique_ids", lambda *args: None)
    legacy = dataclasses.replace(workspace, executor=InProcessExecutor())  # type: ignore[arg-type]
    repeated = legacy.build("repeated", {**base_corpus(), "a.jsonl": records})
    with pytest.raises(InputError, match=r"a\.jsonl: id 'x-1' appears 2 times \(lines 2, 5\)"):
        run_diff(workspace, base, repeated)
    with pytest.raises(InputError, match="appears 2 times"):
        run_diff(workspace, base, repeated, memory_rows=3)


# --------------------------------------------------------------------- kept documents


def _hashes(workspace: Workspace, snapshot: Snapshot) -> list[bytes]:
    """Every input document's text hash, in input order."""
    records = load_records(workspace.store, snapshot)
    return [bytes(h) for task in records.tasks for batch in task_batches(workspace.store, task, ["text_hash"])
            for h in batch.column("text_hash").to_pylist()]


def with_copies() -> Corpus:
    """The base corpus where c.jsonl repeats two texts of a.jsonl and b.jsonl one of its own."""
    corpus = base_corpus()
    corpus["c.jsonl"] = corpus["c.jsonl"] + [{"id": "c-copy-a", "text": corpus["a.jsonl"][3]["text"]},
                                             {"id": "c-copy-a2", "text": corpus["a.jsonl"][7]["text"]}]
    corpus["b.jsonl"] = corpus["b.jsonl"] + [{"id": "b-copy", "text": corpus["b.jsonl"][0]["text"]}]
    return corpus


@pytest.mark.parametrize("memory_rows", [1_000_000, 2])
def test_layout2_keep_flags_keep_the_first_copy_in_input_order(workspace: Workspace, memory_rows: int,
                                                              tmp_path: Path) -> None:
    snapshot = workspace.build("copies", with_copies())
    assert snapshot.manifest["stats"]["duplicates_dropped"] == 3
    records = load_records(workspace.store, snapshot)
    assert records.layout == LAYOUT_KEYED
    flags = keep_flags(workspace.store, records, tmp_path, memory_rows)
    assert isinstance(flags, PackedMask)
    expected = first_occurrences(_hashes(workspace, snapshot), exact=True)
    assert flags.slice(0, records.documents).tolist() == expected.tolist()
    old = load_records(workspace.store, synthesize_layout1(workspace.store, snapshot))
    assert old.layout == LAYOUT_POSITIONAL
    assert keep_flags(workspace.store, old, tmp_path, memory_rows).slice(0, old.documents).tolist() == expected.tolist()


def test_without_duplicates_nothing_is_read_for_keep_flags(workspace: Workspace, base: Snapshot, tmp_path: Path) -> None:
    flags = keep_flags(workspace.store, load_records(workspace.store, base), tmp_path, 10)
    assert isinstance(flags, AllKept) and flags.ones_between(0, 5) == 5 and list(tmp_path.iterdir()) == []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.integers(0, 6), max_size=60), parts=st.integers(1, 5), chunk=st.integers(1, 7),
       extra=st.integers(0, 9))
def test_first_occurrence_mask_matches_the_rule(texts: list[int], parts: int, chunk: int, extra: int,
                                                tmp_path_factory: pytest.TempPathFactory) -> None:
    """Documents outside the chunks (`extra` after them) stay kept; chunk boundaries and partitions
    do not matter."""
    hashes = [text.to_bytes(8, "little") * 2 for text in texts]
    pairs = np.frombuffer(b"".join(hashes), dtype="<u8").reshape(-1, 2)
    chunks = [(pairs[i:i + chunk], np.arange(i, min(len(texts), i + chunk), dtype=np.int64))
              for i in range(0, len(texts), chunk)]
    mask, dropped = first_occurrence_mask(iter(chunks), len(texts) + extra, parts, tmp_path_factory.mktemp("mask"))
    expected = list(itertools.chain(first_occurrences(hashes, exact=True).tolist(), [True] * extra))
    assert mask.count == len(expected) and mask.slice(0, len(expected)).tolist() == expected
    assert dropped == expected.count(False)


def test_a_copy_dedup_dropped_is_no_document_of_its_file(workspace: Workspace, base: Snapshot, base_v1: Snapshot) -> None:
    """Adding copies of earlier texts adds nothing; removing the first copy makes a later one the
    kept document: removed from its file, added to the copy's file. Either layout on either side."""
    copies = workspace.build("copies", with_copies())
    for old in (base, base_v1):
        documents, changes = run_diff(workspace, old, copies)
        assert changes == [] and documents.summary.files_compared == 2
    edited = with_copies()
    del edited["a.jsonl"][3]
    moved = workspace.build("moved", edited)
    expected = [("removed", "a.jsonl", "a-3"), ("added", "c.jsonl", "c-copy-a")]
    for old in (copies, synthesize_layout1(workspace.store, copies)):
        documents, changes = run_diff(workspace, old, moved, memory_rows=3)
        assert [(c.change, c.source, (c.old or c.new).id) for c in changes] == expected  # type: ignore[union-attr]
        assert documents.summary.files_skipped == 1  # b.jsonl: same bytes, same keep flags
        back, changes_back = run_diff(workspace, moved, old)
        assert sorted((c.change, c.source) for c in changes_back) == [("added", "a.jsonl"), ("removed", "c.jsonl")]


_DIFF_IN_PROCESS = r"""
import atexit, sys
import prep.history.docdiff as docdiff
atexit.register(lambda: print("pandas imported:", "pandas" in sys.modules, file=sys.stderr))
docdiff.diff_documents.__defaults__ = (int(sys.argv[1]), docdiff.SIDES)  # memory_rows: few spill to disk
sys.argv = ["prep", "diff", *sys.argv[2:], "--documents"]
from prep.cli.main import main
main()
"""


@pytest.mark.parametrize("memory_rows", [1_000_000, 10])
@pytest.mark.parametrize("id_field", ["id", None])
def test_a_document_diff_never_imports_pandas(tmp_path: Path, tokenizer_path: Path, id_field: str | None,
                                             memory_rows: int) -> None:
    """pyarrow imports pandas for `pa.array` of Python or numpy values and for its Acero engine
    (`group_by`, `join`): 0.3 s of a diff's 0.6 s. Both keyings (ids, text hashes) avoid it, in
    memory and partitioned through spill files."""
    import subprocess
    import sys

    pytest.importorskip("pandas")  # installed here (datasets needs it): the case that costs
    from tests.helpers import prep_env

    ids = []
    for version, count in (("a", 40), ("b", 45)):
        records = make_records(count, seed=3, prefix="d")
        records[5]["text"] += f" edited in {version}"
        write_jsonl(tmp_path / version / "c.jsonl", records)
        pipeline = write_pipeline(tmp_path, tokenizer_path, [version], id_field=id_field, name=f"{version}.toml")
        ids.append(build(load_pipeline(pipeline), LocalStore(tmp_path / "store"), InProcessExecutor(), (),
                         Progress(quiet=True)).snapshot.id)
    ran = subprocess.run([sys.executable, "-c", _DIFF_IN_PROCESS, str(memory_rows), *ids, "--store", str(tmp_path / "store")],
                         capture_output=True, text=True, env=prep_env(), cwd=Path(__file__).parents[2], check=False)
    assert "pandas imported: False" in ran.stderr, ran.stderr
    assert ("changed" if id_field else "removed") in ran.stdout and "added" in ran.stdout, ran.stdout
