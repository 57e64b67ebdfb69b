"""`prep pull SNAP DEST` and `prep verify SNAP DEST`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from prep.cli.common import open_store_option, store_option
from prep.errors import IntegrityError, UsageError, VerificationFailed
from prep.progress import Progress, human_bytes, rate
from prep.store.snapshots import ManifestFileError, Snapshot, is_manifest_path, reencoded_note, resolve
from prep.transfer.shares import check_rank
from prep.transfer.verify import DEFAULT_JOBS, VerifyResult

if TYPE_CHECKING:
    from prep.transfer.pull import PullResult

F = TypeVar("F", bound=Callable[..., Any])


def rank_options(function: F) -> F:
    """--rank R --world-size W (together) and --jobs N."""
    function = click.option("--jobs", type=click.IntRange(min=1), default=DEFAULT_JOBS, show_default=True,
                            help="Files transferred or hashed in parallel.")(function)
    function = click.option("--world-size", type=click.IntRange(min=1), default=None,
                            help="Number of ranks sharing the snapshot (with --rank).")(function)
    return click.option("--rank", type=click.IntRange(min=0), default=None,
                        help="Handle only this rank's share (with --world-size).")(function)


def _check_rank(rank: int | None, world_size: int | None) -> None:
    """Reject bad rank options before any store is opened (a local one would be created)."""
    if (rank is None) != (world_size is None):
        raise UsageError("--rank and --world-size must be given together")
    if rank is not None and world_size is not None:
        check_rank(rank, world_size)


@click.command()
@click.argument("snap")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@store_option
@rank_options
@click.option("--prune", is_flag=True,
              help="Then delete the files DEST's previous snapshot named that SNAP does not (nothing else).")
def pull(snap: str, dest: Path, store_url: str | None, rank: int | None, world_size: int | None, jobs: int,
         prune: bool) -> None:
    """Copy a snapshot's artifacts to DEST, verified by SHA-256, reusing files already valid;
    rerun to resume."""
    from prep.transfer.pull import pull as run_pull
    from prep.transfer.shares import artifacts_of, share_of

    _check_rank(rank, world_size)
    store = open_store_option(store_url)
    snapshot = resolve(store, snap)
    _note(snap, snapshot)
    share = share_of(artifacts_of(snapshot.manifest), rank, world_size)
    progress = Progress().meter("pull", len(share.artifacts), share.size)
    try:
        result = run_pull(store, snapshot, dest, rank=rank, world_size=world_size, jobs=jobs, prune_old=prune,
                          on_bytes=progress.add, on_file=progress.file_done)
    finally:
        progress.finish()
    if result.prune_warning is not None:
        click.echo(f"prep: warning: --prune deleted nothing: {result.prune_warning}", err=True)
    click.echo(_pull_line(result), err=True)


def _pull_line(result: PullResult) -> str:
    """The one summary line of a pull."""
    pruned = f"{result.files_pruned} pruned ({human_bytes(result.bytes_pruned)}), " if result.files_pruned else ""
    left = (f"{result.files_left} files of the previous snapshot left in place (not named by this one; "
            f"--prune removes them), " if result.files_left else "")
    return (f"pulled {result.snapshot_id} into {result.dest}: {result.files_copied} files copied "
            f"({human_bytes(result.bytes_copied)}), {result.files_reused} reused as already valid "
            f"({human_bytes(result.bytes_reused)}; {result.files_rehashed} of them re-hashed), {pruned}{left}"
            f"{result.temporaries_removed} stale temporaries removed, {result.seconds:.2f} s, "
            f"{rate(result.bytes_copied, result.seconds, 1e6, 'MB/s')}")


def _note(snap: str, snapshot: Snapshot) -> None:
    """Say on stderr when a manifest file's id comes from its canonical encoding, not its bytes."""
    note = reencoded_note(snap, snapshot)
    if note is not None:
        click.echo(note, err=True)


def _human_report(result: VerifyResult) -> list[str]:
    lines = [f"{p.kind:<20} {p.path}  ({p.detail})" for p in result.problems]
    share = f" (rank {result.share.rank} of {result.share.world_size})" if result.ranked else ""
    matched = result.matched
    if result.quick:
        lines.append(f"quick check (presence and size only; contents NOT hashed){share}: "
                     f"{len(matched)} of {len(result.share.artifacts)} files match, "
                     f"{human_bytes(sum(a.size for a in matched))} of {human_bytes(result.share.size)}")
    else:
        lines.append(f"verified {result.snapshot_id}{share}: {len(matched)} of {len(result.share.artifacts)} files "
                     f"match, {human_bytes(sum(a.size for a in matched))} of {human_bytes(result.share.size)}; hashed "
                     f"{human_bytes(result.bytes_read)} in {result.seconds:.2f} s, "
                     f"{rate(result.bytes_read, result.seconds, 1e9, 'GB/s')}")
    if result.problems:
        lines.append(f"{len(result.problems)} problems found")
    if result.digest is not None:
        lines.append(f"verification digest: {result.digest}")
    return lines


@click.command()
@click.argument("snap")
@click.argument("dest", type=click.Path(exists=True, file_okay=False, path_type=Path))
@store_option
@rank_options
@click.option("--json", "as_json", is_flag=True, help="Print a prep.verify-report/1 JSON report on stdout.")
@click.option("--quick", is_flag=True, help="Check presence and size only; do not hash.")
def verify(snap: str, dest: Path, store_url: str | None, rank: int | None, world_size: int | None, jobs: int,
           as_json: bool, quick: bool) -> None:
    """Check DEST against a snapshot (SNAP may be DEST/.prep/manifest.json): exit 0 when
    everything matches, 1 when anything is wrong, 2 when it could not run."""
    from prep.transfer.shares import artifacts_of, share_of
    from prep.transfer.verify import verify as run_verify

    _check_rank(rank, world_size)
    try:
        snapshot = resolve(None if is_manifest_path(snap) else open_store_option(store_url), snap)
    except (IntegrityError, ManifestFileError) as exc:  # verify's contract: a manifest it cannot trust is exit 2
        raise UsageError(f"manifest refused: {exc.message}") from None
    _note(snap, snapshot)
    share = share_of(artifacts_of(snapshot.manifest), rank, world_size)
    progress = Progress().meter("verify", len(share.artifacts), share.size)
    try:
        result = run_verify(snapshot, dest, rank=rank, world_size=world_size, jobs=jobs, quick=quick,
                            on_bytes=progress.add, on_file=progress.file_done)
    finally:
        progress.finish()
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2, sort_keys=True))
    else:
        click.echo("\n".join(_human_report(result)))
    if not result.ok:
        raise VerificationFailed(f"{dest}: {len(result.problems)} problems against {result.snapshot_id}")
