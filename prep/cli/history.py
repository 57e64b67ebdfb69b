"""`prep diff`, `prep tag`, `prep ls` and `prep trace`: history and lineage commands."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import click

from prep.cli.common import echo_json, json_option, open_store_option, store_option
from prep.cli.nearstats import diff_size_lines
from prep.cli.render import dropped_lines, sweep_json, sweep_lines, trace_lines
from prep.errors import NotFoundError, UsageError
from prep.history.diff import ABSENT, NEAR_SIZES, REPORT_SCHEMA, SnapshotDiff, diff_snapshots
from prep.history.selectors import resolve_spec
from prep.progress import human_bytes, note
from prep.storage.backend import Store
from prep.store.layout import check_name
from prep.store.refs import list_refs
from prep.store.snapshots import Snapshot, is_manifest_path, load_snapshot

if TYPE_CHECKING:  # the document-level modules load pyarrow; import them only when used
    from prep.history.docdiff import DocumentChange, DocumentDiff

CHANGES_SHOWN = 50
CHANGE_MARKS = {"added": "+", "removed": "-", "changed": "~"}


def _value(value: Any) -> str:
    return "(absent)" if value is ABSENT else json.dumps(value, ensure_ascii=False)


def _short(object_id: str) -> str:
    return object_id.removeprefix("sha256:")[:12]


def _label(spec: str, snapshot_id: str) -> str:
    """A diff side as given, followed by its id unless the spec already is the id."""
    return spec if spec.removeprefix("sha256:") == snapshot_id.removeprefix("sha256:") else f"{spec}  {snapshot_id}"


def diff_lines(diff: SnapshotDiff, old_spec: str, new_spec: str) -> list[str]:
    """The human summary of a snapshot diff: inputs, settings, artifacts, stats."""
    lines = [f"--- {_label(old_spec, diff.old_id)}", f"+++ {_label(new_spec, diff.new_id)}"]
    counts = {change: len(diff.files_by_change(change)) for change in ("added", "removed", "changed")}
    lines.append(f"inputs     {counts['added']} added, {counts['removed']} removed, {counts['changed']} changed, "
                 f"{diff.files_unchanged} unchanged")
    for shown, entry in enumerate(diff.files):
        if shown == CHANGES_SHOWN:
            lines.append(f"  ... {len(diff.files) - shown} more (use --json for all)")
            break
        sides = [side for side in (entry.old, entry.new) if side is not None]
        sizes = " -> ".join(human_bytes(side.size) for side in sides)
        hashes = " -> ".join(side.sha256[:12] for side in sides)
        lines.append(f"  {CHANGE_MARKS[entry.change]} {entry.path}  {sizes}  sha256 {hashes}")
    lines.append(f"settings   {len(diff.settings)} changed")
    lines.extend(f"  {entry.key}: {_value(entry.old)} -> {_value(entry.new)}" for entry in diff.settings)
    parts = [(name, matches) for name, matches in (("added", diff.artifacts_added), ("removed", diff.artifacts_removed),
                                                    ("unchanged", diff.artifacts_unchanged))]
    lines.append("artifacts  " + ", ".join(f"{len(matches)} {name} ({human_bytes(sum(m.size for m in matches))})"
                                           for name, matches in parts))
    moved = [delta for delta in diff.stats if (delta.delta or delta.old is None or delta.new is None)
             and not delta.key.startswith(NEAR_SIZES)]  # cluster sizes: their table below
    lines.append("stats      " + ("; ".join(f"{d.key} {_count(d.old)} -> {_count(d.new)} ({d.delta:+d})" for d in moved)
                                 or "unchanged"))
    return lines + diff_size_lines(diff.stats)


def _count(value: int | None) -> str:
    return "(absent)" if value is None else str(value)


def _change_line(change: DocumentChange) -> str:
    version = change.new or change.old
    assert version is not None
    where = f"line {change.old.line} -> {change.new.line}" if change.old and change.new else f"line {version.line}"
    copies = f", {change.copies} copies" if change.copies > 1 else ""
    why = f"  {change.why}" if change.why else ""
    return f"  {CHANGE_MARKS[change.change]} {change.source}  {version.id}  ({where}{copies}){why}"


def explained(changes: Iterator[DocumentChange], store: Store, old: Snapshot, new: Snapshot,
              work_dir: Path) -> Iterator[DocumentChange]:
    """The changes, a removed document told why when a step or near-duplicate removal of the new
    snapshot dropped it, an added one when one of the old snapshot had (`dropped by step N (use):
    reason` or `dropped as a near duplicate of ID (SOURCE line N)`, and for an added one `was
    dropped ...`)."""
    from prep.history.neardrops import NearLookup
    from prep.history.stepdrops import DropLookup

    steps, near = (DropLookup(store, old), DropLookup(store, new)), (NearLookup(store, old, work_dir),
                                                                      NearLookup(store, new, work_dir))

    def why_missing(side: int, source: str, doc_id: str) -> str | None:
        return steps[side].why(source, doc_id) or near[side].why(source, doc_id)

    for change in changes:
        if change.change == "removed" and change.old is not None:
            why = why_missing(1, change.source, change.old.id)
        elif change.change == "added" and change.new is not None:
            found = why_missing(0, change.source, change.new.id)
            why = f"was {found}" if found else None
        else:
            why = None
        yield replace(change, why=why) if why else change


def document_lines(documents: DocumentDiff, changes: Iterator[DocumentChange]) -> Iterator[str]:
    summary = documents.summary
    yield (f"documents  {summary.added} added, {summary.removed} removed, {summary.changed} changed, "
           f"{summary.unchanged} unchanged (keyed by {summary.keyed_by}; files: {summary.files_compared} compared, "
           f"{summary.files_skipped} skipped as unchanged)")
    total = summary.added + summary.removed + summary.changed
    for shown, change in enumerate(changes):
        if shown == CHANGES_SHOWN:
            yield f"  ... {total - shown} more (use --json for all)"
            return
        yield _change_line(change)


def write_report(report: dict[str, Any], documents: DocumentDiff | None, changes: Iterator[DocumentChange],
                 out: TextIO) -> None:
    """Write a prep.diff-report/1, streaming document changes from their spill file."""
    if documents is None:
        out.write(json.dumps(report, ensure_ascii=False) + "\n")
        return
    text = json.dumps({**report, "documents": {**documents.summary.to_json(), "changes": []}}, ensure_ascii=False)
    assert text.endswith("[]}}")
    out.write(text[:-4] + "[")
    out.writelines(("," if index else "") + json.dumps(change.to_json(), ensure_ascii=False)
                   for index, change in enumerate(changes))
    out.write("]}}\n")


def _side(spec: str, snapshot: Snapshot) -> dict[str, str]:
    return {"spec": spec, "snapshot": snapshot.id, "dataset": snapshot.dataset}


@click.command()
@click.argument("old_spec", metavar="A")
@click.argument("new_spec", metavar="B")
@store_option
@click.option("--json", "as_json", is_flag=True, help="Print a prep.diff-report/1 JSON document.")
@click.option("--documents", is_flag=True, help="Also diff documents: ids added, removed, and with changed text.")
def diff(old_spec: str, new_spec: str, store_url: str | None, as_json: bool,
         documents: bool) -> None:
    """Compare snapshots A and B. Exit 0 when identical, 1 when different, 2 on error."""
    needs_store = documents or not (is_manifest_path(old_spec) and is_manifest_path(new_spec))
    store = open_store_option(store_url) if needs_store else None
    old, new = resolve_spec(store, old_spec), resolve_spec(store, new_spec)
    snapshot_diff = diff_snapshots(old, new)
    with tempfile.TemporaryDirectory(prefix="prep-diff-") as work:
        document_diff = None
        if documents:
            from prep.history.docdiff import diff_documents

            assert store is not None
            document_diff = diff_documents(store, old, new, Path(work), labels=(old_spec, new_spec))
        changes = explained(document_diff.changes(), store, old, new, Path(work)) if document_diff and store \
            else iter(())
        if as_json:
            report = {"schema": REPORT_SCHEMA, "old": _side(old_spec, old), "new": _side(new_spec, new),
                      **snapshot_diff.to_json()}
            write_report(report, document_diff, changes, sys.stdout)
        else:
            click.echo("\n".join(diff_lines(snapshot_diff, old_spec, new_spec)))
            for line in document_lines(document_diff, changes) if document_diff else []:
                click.echo(line)
            if snapshot_diff.identical:
                click.echo("identical")
    if not snapshot_diff.identical:
        sys.exit(1)  # like diff(1)


@click.command()
@click.argument("args", nargs=-1, metavar="SNAP NAME | -d DATASET@NAME")
@click.option("-d", "--delete", is_flag=True, help="Delete tag DATASET@NAME (recorded in its history).")
@click.option("--force", is_flag=True, help="Move a tag that names another snapshot (tags stay put otherwise).")
@click.option("--expect", default=None, metavar="GEN",
              help="Move (or delete) the tag only if it is at generation GEN (0 or 'none': it must not exist).")
@click.option("--no-readback", is_flag=True, help="Do not read the snapshot's objects back before tagging.")
@store_option
@json_option("prep.tag-report/1")
def tag(args: tuple[str, ...], delete: bool, force: bool, expect: str | None, no_readback: bool,
        store_url: str | None, as_json: bool) -> None:
    """Point tag DATASET@NAME at snapshot SNAP (its dataset is the snapshot's), or delete one with -d.

    An existing tag naming another snapshot is refused (exit 2) unless --force; re-tagging the
    snapshot it names is a no-op; `latest` is reserved for builds. Every object of SNAP is read
    back from the store before the tag moves (exit 3 naming a corrupt or missing one)."""
    from prep.store.leases import waiting_for_gc
    from prep.store.tags import delete_tag, parse_expect, set_tag, still_stored

    wanted = parse_expect(expect) if expect is not None else None
    if len(args) != (1 if delete else 2):
        raise UsageError("usage: prep tag SNAP NAME, or prep tag -d DATASET@NAME")
    store = open_store_option(store_url)
    if delete:
        dataset, _, name = args[0].partition("@")
        if not name:
            raise UsageError(f"{args[0]!r}: name the tag to delete as DATASET@NAME")
        check_name("dataset", dataset)
        gone = delete_tag(store, dataset, name, expect=wanted).ref
        if as_json:
            echo_json({"schema": "prep.tag-report/1", "action": "deleted", "ref": gone.to_json()})
            return
        click.echo(f"deleted {gone.dataset}@{gone.name} (was {gone.snapshot}; generation {gone.generation})")
        return
    snapshot = load_snapshot(store, resolve_spec(store, args[0]).id)  # a manifest file must be in the store too
    move = set_tag(store, snapshot.dataset, args[1], snapshot.id, force=force, expect=wanted,
                   prove=(lambda: still_stored(store, snapshot.id)) if no_readback else lambda: _read_back(store, snapshot),
                   on_wait=lambda key: click.echo(f"prep: {waiting_for_gc(key)}", err=True))
    ref = move.ref
    if move.history_pending:
        click.echo(f"prep: warning: the history record of generation {ref.generation} is not stored "
                   f"({move.history_pending}); the tag's next move stores it", err=True)
    if as_json:
        pending = {"history_pending": move.history_pending} if move.history_pending else {}
        echo_json({"schema": "prep.tag-report/1", "action": "moved" if move.moved else "unchanged",
                   "ref": ref.to_json(), **pending})
        return
    state = "" if move.moved else "; already there, nothing moved"
    click.echo(f"{ref.dataset}@{ref.name} -> {ref.snapshot} (generation {ref.generation}{state})")


def _read_back(store: Store, snapshot: Snapshot) -> None:
    """Prove every object of `snapshot` reads back intact before a tag names it (prep.runner.readback)."""
    from prep.runner.readback import passed_before, read_back, thread_checker
    from prep.store.refs import read_ref

    latest = read_ref(store, snapshot.dataset, "latest")
    readback = read_back(store, snapshot, thread_checker(store), passed_before(store, latest.snapshot if latest else None))
    note(f"prep: {readback.summary()}")


@click.command(name="ls")
@click.argument("dataset", required=False)
@store_option
@json_option("prep.ls-report/1")
def ls(dataset: str | None, store_url: str | None, as_json: bool) -> None:
    """List datasets and their refs: generation, time moved, snapshot."""
    if dataset is not None:
        check_name("dataset", dataset)  # '' listed every dataset's refs
    store = open_store_option(store_url)
    refs = list_refs(store, dataset)
    if as_json:
        echo_json({"schema": "prep.ls-report/1", "store": store.url, "dataset": dataset,
                   "refs": [ref.to_json() for ref in refs]})
        return
    if not refs:
        click.echo(f"no refs in {store.url}" + (f" for dataset {dataset!r}" if dataset else ""), err=True)
        return
    width = max(len(f"{ref.dataset}@{ref.name}") for ref in refs)
    for ref in refs:
        click.echo(f"{ref.dataset + '@' + ref.name:<{width}}  gen {ref.generation:<4} {ref.time}  {ref.snapshot}")


TRACE_SCHEMA = "prep.trace-report/1"  # manifests/trace-report-1.schema.json
ALL_SCHEMA = "prep.trace-all-report/1"  # manifests/trace-all-report-1.schema.json


@click.command()
@click.argument("args", nargs=-1, metavar="SNAP DOC_ID | --all DOC_ID_OR_TEXT_HASH")
@store_option
@click.option("--all", "everywhere", is_flag=True,
              help="Search every snapshot of the store for the document or a copy of its text.")
@click.option("--json", "as_json", is_flag=True, help=f"Print a {TRACE_SCHEMA} (--all: {ALL_SCHEMA}) JSON document.")
def trace(args: tuple[str, ...], store_url: str | None, everywhere: bool, as_json: bool) -> None:
    """Which artifacts, at which positions, hold document DOC_ID (an id, SOURCE:ID, or SOURCE:LINE,
    the 1-based line or record of SOURCE, with or without an id field) in snapshot SNAP.

    With --all: every snapshot of the store (all datasets) holding the document named by
    `id:ID`, `text:HASH` (its text's xxh3-128, 32 hex digits) or a bare id (also read as a text
    hash when it is 32 hex digits), or any copy of its text; and the intermediates holding it."""
    if everywhere:
        if len(args) != 1:
            raise UsageError("usage: prep trace --all DOC_ID_OR_TEXT_HASH")
        _trace_all(args[0], store_url, as_json)
        return
    if len(args) != 2:
        raise UsageError("usage: prep trace SNAP DOC_ID, or prep trace --all DOC_ID_OR_TEXT_HASH")
    snap, doc_id = args
    from prep.history.lineage import trace as trace_document
    from prep.history.stepdrops import find_dropped

    store = open_store_option(store_url)
    snapshot = resolve_spec(store, snap)
    try:
        found = [(entry.to_json(), trace_lines(entry)) for entry in trace_document(store, snapshot, doc_id)]
    except NotFoundError as missing:  # not in the snapshot: perhaps a document step dropped it
        found = [(entry.to_json(), dropped_lines(entry)) for entry in find_dropped(store, snapshot, doc_id)]
        if not found and "exclude" in snapshot.manifest:  # no record names what a deletion request dropped
            raise NotFoundError(f"{missing}; it was built with deletion requests ([input] exclude), which leave "
                                "no trace of the documents they drop (docs/deletion.md)") from None
        if not found:
            raise
    if as_json:
        click.echo(json.dumps({"schema": TRACE_SCHEMA, "snapshot": snapshot.id, "spec": doc_id,
                               "documents": [report for report, _ in found]}, ensure_ascii=False))
        return
    click.echo("\n\n".join("\n".join(lines) for _, lines in found))


def _trace_all(spec: str, store_url: str | None, as_json: bool) -> None:
    """`prep trace --all`: the report of every snapshot holding the document or a copy of its text."""
    from prep.history.everywhere import Query, sweep

    try:
        query = Query.parse(spec)
    except ValueError as exc:
        raise UsageError(f"trace --all: {exc}") from None
    store = open_store_option(store_url)
    found = sweep(store, query)
    if as_json:
        echo_json({"schema": ALL_SCHEMA, "store": store.url, "spec": spec, **sweep_json(found)})
        return
    click.echo("\n".join(sweep_lines(found)))
