"""`prep show SNAP` and `prep log DATASET`."""

from __future__ import annotations

from typing import Any

import click

from prep.cli.common import open_store_option, store_option
from prep.cli.render import trace_lines
from prep.history.naming import AT_EXAMPLES
from prep.progress import human_bytes
from prep.store.refs import ref_history
from prep.store.snapshots import is_manifest_path, reencoded_note, resolve


def summary_lines(snapshot_id: str, manifest: dict[str, Any]) -> list[str]:
    stats, tok = manifest["stats"], manifest["tokenizer"]
    by_format: dict[str, list[int]] = {}
    for artifact in manifest["artifacts"]:
        entry = by_format.setdefault(artifact["format"], [0, 0])
        entry[0] += 1
        entry[1] += artifact["size"]
    lines = [
        f"snapshot   {snapshot_id}",
        f"dataset    {manifest['dataset']}   seed {manifest['seed']}",
        f"inputs     {len(manifest['inputs']['files'])} files, "
        f"{human_bytes(sum(f['size'] for f in manifest['inputs']['files']))}, version {manifest['inputs']['version'][:23]}",
        f"tokenizer  sha256:{tok['sha256'][:16]}  vocab {tok['vocab_size']}  eos {tok['eos']!r}={tok['eos_id']}  {tok['dtype']}",
        f"code       prep {manifest['code']['version']}  sha256:{manifest['code']['sha256'][:16]}",
        f"documents  {stats['documents_read']} read, {stats['duplicates_dropped']} duplicates dropped, "
        f"{stats['documents_written']} written",
        f"tokens     {stats['tokens_written']}",
    ]
    for fmt, (count, size) in sorted(by_format.items()):
        lines.append(f"artifacts  {fmt}: {count} files, {human_bytes(size)}")
    for stage in manifest["stages"]:
        lines.append(f"stage      {stage['name']:<9} key {stage['key'][:16]}  output {stage['output'][:23]}")
    return lines


@click.command()
@click.argument("snap")
@store_option
@click.option("--json", "as_json", is_flag=True,
              help="Print the manifest exactly as stored (no newline added): its SHA-256 is the snapshot id.")
@click.option("--at", "at", default=None, metavar="PATH:N",
              help=f"Show the document stored as sequence N (0-based) of artifact PATH, e.g. {AT_EXAMPLES}.")
def show(snap: str, store_url: str | None, as_json: bool, at: str | None) -> None:
    """Show a snapshot: DATASET@REF, sha256:<hex>, a unique hex prefix, or a manifest file."""
    store = None if is_manifest_path(snap) and at is None else open_store_option(store_url)
    snapshot = resolve(None if is_manifest_path(snap) else store, snap)
    note = reencoded_note(snap, snapshot)
    if note is not None:
        click.echo(note, err=True)
    if at is not None:
        from prep.history.lineage import locate, parse_at

        assert store is not None
        click.echo("\n".join(trace_lines(locate(store, snapshot, *parse_at(at)))))
        return
    if as_json:
        click.echo(snapshot.raw, nl=False)  # bytes go to stdout's binary buffer untouched
        return
    click.echo("\n".join(summary_lines(snapshot.id, snapshot.manifest)))


@click.command()
@click.argument("dataset")
@store_option
def log(dataset: str, store_url: str | None) -> None:
    """The snapshots DATASET's refs have pointed to, newest first."""
    store = open_store_option(store_url)
    entries = ref_history(store, dataset)
    if not entries:
        click.echo(f"no refs for dataset {dataset!r} in {store.url}", err=True)
        return
    for ref in entries:
        click.echo(f"{ref.time}  {ref.dataset}@{ref.name:<12} gen {ref.generation:<4} {ref.snapshot}")
