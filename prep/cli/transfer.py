"""`prep pull SNAP DEST`, `prep verify SNAP DEST` and `prep copy SNAP --to URL`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from prep.cli.common import echo_json, json_option, open_store_option, store_option
from prep.errors import IntegrityError, UsageError, VerificationFailed
from prep.formats.units import unit_names
from prep.progress import Progress, human_bytes, note, plural, rate
from prep.store.snapshots import ManifestFileError, Snapshot, is_manifest_path, reencoded_note, resolve
from prep.transfer.shares import Share, check_rank, parse_formats
from prep.transfer.verify import DEFAULT_JOBS, VerifyResult

if TYPE_CHECKING:
    from prep.transfer.copy import CopyResult
    from prep.transfer.pull import PullResult

F = TypeVar("F", bound=Callable[..., Any])


def rank_options(function: F) -> F:
    """--rank R --world-size W (together), --formats bin,wds and --jobs N."""
    function = click.option("--formats", "formats", multiple=True, metavar="|".join(unit_names()),
                            help="Only these formats (repeatable or a comma list; bin brings its idx).")(function)
    function = click.option("--jobs", type=click.IntRange(min=1), default=DEFAULT_JOBS, show_default=True,
                            help="Files transferred or hashed in parallel.")(function)
    function = click.option("--world-size", type=click.IntRange(min=1), default=None,
                            help="Number of ranks sharing the snapshot (with --rank).")(function)
    return click.option("--rank", type=click.IntRange(min=0), default=None,
                        help="Handle only this rank's share (with --world-size).")(function)


def _check_share(rank: int | None, world_size: int | None, formats: tuple[str, ...]) -> tuple[str, ...] | None:
    """Reject bad share options before any store is opened (a local one would be created);
    the parsed --formats."""
    if (rank is None) != (world_size is None):
        raise UsageError("--rank and --world-size must be given together")
    if rank is not None and world_size is not None:
        check_rank(rank, world_size)
    return parse_formats(formats)


def _warn(warnings: list[str]) -> None:
    for warning in warnings:
        click.echo(f"prep: warning: {warning}", err=True)


@click.command()
@click.argument("snap")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@store_option
@rank_options
@click.option("--prune", is_flag=True,
              help="Then delete the files DEST's previous snapshot named that SNAP does not (nothing else).")
@click.option("--json", "as_json", is_flag=True, help="Print a prep.pull-report/1 JSON report on stdout.")
def pull(snap: str, dest: Path, store_url: str | None, rank: int | None, world_size: int | None, jobs: int,
         formats: tuple[str, ...], prune: bool, as_json: bool) -> None:
    """Copy a snapshot's artifacts (or one rank's share of some formats) to DEST, verified by
    SHA-256, reusing files already valid; rerun to resume, even mid-file."""
    from prep.transfer.pull import pull as run_pull
    from prep.transfer.shares import artifacts_of, share_of

    selected = _check_share(rank, world_size, formats)
    store = open_store_option(store_url)
    snapshot = resolve(store, snap)
    _note(snap, snapshot)
    share = share_of(artifacts_of(snapshot.manifest), rank, world_size, selected, snapshot.id)
    progress = Progress().meter("pull", len(share.artifacts), share.size)
    try:
        result = run_pull(store, snapshot, dest, rank=rank, world_size=world_size, formats=selected, jobs=jobs,
                          prune_old=prune, on_bytes=progress.add, on_file=progress.file_done)
    finally:
        progress.finish()
    _warn(result.warnings)
    if as_json:
        echo_json(result.to_json(), indent=2, sort_keys=True)
    note(_pull_line(result))


def _share_text(share: Share, ranked: bool) -> str:
    """` (rank 1 of 4, formats bin)`, or nothing for the whole snapshot in every format."""
    parts = ([f"rank {share.rank} of {share.world_size}"] if ranked else []) + (
        [f"formats {','.join(share.formats)}"] if share.formats else [])
    return f" ({', '.join(parts)})" if parts else ""


def _pull_line(result: PullResult) -> str:
    """The one summary line of a pull."""
    pruned = f"{plural(result.files_pruned, 'file')} pruned ({human_bytes(result.bytes_pruned)}), " if result.files_pruned else ""
    left = (f"{plural(result.files_left, 'file')} of the previous snapshot left in place (not named by this one; "
            f"--prune removes them), " if result.files_left else "")
    count = result.files_resumed
    resumed = (f"; {count} resumed from {'a partial file' if count == 1 else 'partial files'}, "
               f"{human_bytes(result.bytes_resumed)} kept" if count else "")
    temps = result.temporaries_removed
    return (f"pulled {result.snapshot_id}{_share_text(result.share, result.ranked)} into {result.dest}: "
            f"{plural(result.files_copied, 'file')} copied ({human_bytes(result.bytes_copied)}{resumed}), "
            f"{result.files_reused} reused as already valid ({human_bytes(result.bytes_reused)}; "
            f"{result.files_rehashed} of them re-hashed), {pruned}{left}"
            f"{plural(temps, 'stale temporary', 'stale temporaries')} removed, {result.seconds:.2f} s, "
            f"{rate(result.bytes_fetched, result.seconds, 1e6, 'MB/s')}")


def _note(snap: str, snapshot: Snapshot) -> None:
    """Say on stderr when a manifest file's id comes from its canonical encoding, not its bytes."""
    note = reencoded_note(snap, snapshot)
    if note is not None:
        click.echo(note, err=True)


def _human_report(result: VerifyResult) -> list[str]:
    lines = [f"{p.kind:<20} {p.path}  ({p.detail})" for p in result.problems]
    share = _share_text(result.share, result.ranked)
    if result.from_record and share:
        share = f"{share} as recorded in {result.dest}/.prep/share.json"
    matched = result.matched
    if result.quick:
        lines.append(f"quick check (presence and size only; contents NOT hashed){share}: "
                     f"{len(matched)} of {plural(len(result.share.artifacts), 'file')} match, "
                     f"{human_bytes(sum(a.size for a in matched))} of {human_bytes(result.share.size)}")
    else:
        lines.append(f"verified {result.snapshot_id}{share}: {len(matched)} of {plural(len(result.share.artifacts), 'file')} "
                     f"match, {human_bytes(sum(a.size for a in matched))} of {human_bytes(result.share.size)}; hashed "
                     f"{human_bytes(result.bytes_read)} in {result.seconds:.2f} s, "
                     f"{rate(result.bytes_read, result.seconds, 1e9, 'GB/s')}")
    if result.problems:
        lines.append(f"{plural(len(result.problems), 'problem')} found")
    if result.digest is not None:
        lines.append(f"verification digest: {result.digest}")
    return lines


@click.command()
@click.argument("snap")
@click.argument("dest", type=click.Path(exists=True, file_okay=False, path_type=Path))
@store_option
@rank_options
@click.option("--json", "as_json", is_flag=True, help="Print a prep.verify-report/2 JSON report on stdout.")
@click.option("--quick", is_flag=True, help="Check presence and size only; do not hash.")
def verify(snap: str, dest: Path, store_url: str | None, rank: int | None, world_size: int | None, jobs: int,
           formats: tuple[str, ...], as_json: bool, quick: bool) -> None:
    """Check DEST against a snapshot (SNAP may be DEST/.prep/manifest.json), or the share
    DEST/.prep/share.json says it holds: exit 0 when everything matches, 1 when anything is
    wrong, 2 when it could not run."""
    from prep.transfer.shares import artifacts_of, share_of
    from prep.transfer.verify import planned_share
    from prep.transfer.verify import verify as run_verify

    selected = _check_share(rank, world_size, formats)
    try:
        snapshot = resolve(None if is_manifest_path(snap) else open_store_option(store_url), snap)
    except (IntegrityError, ManifestFileError) as exc:  # verify's contract: a manifest it cannot trust is exit 2
        raise UsageError(f"manifest refused: {exc.message}") from None
    _note(snap, snapshot)
    spec, _ = planned_share(snapshot, dest, rank, world_size, selected)
    share = share_of(artifacts_of(snapshot.manifest), spec.rank, spec.world_size, spec.formats, snapshot.id)
    progress = Progress().meter("verify", len(share.artifacts), share.size)
    try:
        result = run_verify(snapshot, dest, rank=rank, world_size=world_size, formats=selected, jobs=jobs,
                            quick=quick, on_bytes=progress.add, on_file=progress.file_done)
    finally:
        progress.finish()
    _warn([share.warning] if share.warning else [])
    if as_json:
        echo_json(result.to_json(), indent=2, sort_keys=True)
    else:
        click.echo("\n".join(_human_report(result)))
    if not result.ok:
        raise VerificationFailed(f"{dest}: {plural(len(result.problems), 'problem')} against {result.snapshot_id}")


@click.command("copy")
@click.argument("snap")
@click.option("--to", "target_url", required=True, metavar="URL",
              help="The store to copy to: a path or s3://bucket/prefix (a new one is created).")
@store_option
@click.option("--refs", is_flag=True,
              help="Then move the refs that name SNAP on the source the same way on the target (compare-and-swap).")
@click.option("--jobs", type=click.IntRange(min=1), default=DEFAULT_JOBS, show_default=True,
              help="Objects copied in parallel.")
@json_option("prep.copy-report/1")
def copy_command(snap: str, target_url: str, store_url: str | None, refs: bool, jobs: int, as_json: bool) -> None:
    """Copy snapshot SNAP (its manifest, artifacts, tokenizer, stage manifests and what they name)
    to another store, create-only, every object hashed on arrival; rerun to resume."""
    from prep.storage import open_store
    from prep.store.leases import waiting_for_gc
    from prep.store.snapshots import load_snapshot
    from prep.transfer.copy import copy_snapshot

    source = open_store_option(store_url)
    snapshot = load_snapshot(source, resolve(source, snap).id)  # a manifest file must be in the store too
    result = copy_snapshot(source, open_store(target_url), snapshot, label=snap, refs=refs, jobs=jobs,
                           progress=Progress(),
                           on_wait=lambda key: click.echo(f"prep: {waiting_for_gc(key)}", err=True))
    if as_json:
        echo_json(result.to_json(), indent=2, sort_keys=True)
    note(_copy_line(result))


def _copy_line(result: CopyResult) -> str:
    """The one summary line of a copy."""
    refs = "".join(f", {ref.dataset}@{ref.name} {'moved to' if ref.moved else 'already at'} generation "
                   f"{ref.generation}" for ref in result.refs)
    return (f"copied {result.snapshot_id} ({result.dataset}) from {result.source} to {result.target}: "
            f"{plural(result.copied, 'object')} copied ({human_bytes(result.bytes_copied)}), {result.present} already "
            f"there ({human_bytes(result.bytes_present)}; {result.rehashed} of them re-hashed){refs}, "
            f"{result.seconds:.2f} s, {rate(result.bytes_copied, result.seconds, 1e6, 'MB/s')}")
