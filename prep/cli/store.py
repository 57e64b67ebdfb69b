"""`prep gc`, `prep fsck`, `prep hold` and `prep release`: keeping a store healthy and its versions kept."""

from __future__ import annotations

import json
import sys

import click

from prep.cli.common import json_option, open_store_option, store_option
from prep.errors import IntegrityError
from prep.progress import Progress, human_bytes, plural
from prep.store.fsck import DEFAULT_JOBS, FsckReport, fsck, unrepairable_reason
from prep.store.gc import CATEGORIES, DEFAULT_GRACE, GcReport, collect_garbage
from prep.store.holds import place_hold, release_hold
from prep.store.reach import CORRUPT, INVALID, MISSING
from prep.store.retention import RULES, Override, Policy, parse_duration
from prep.store.snapshots import load_snapshot, resolve

DANGLING_SHOWN = 20


def gc_lines(report: GcReport) -> list[str]:
    """The human gc report: policies, what each rule kept, then kept and deleted by category."""
    verb = "would delete" if report.dry_run else "deleted"
    width = len(verb)
    lines = [f"{report.store}: {plural(report.refs, 'ref')}; grace period {report.grace_seconds} s"
             + ("; dry run, nothing deleted" if report.dry_run else "")]
    for dataset, policy in report.policies.items():
        lines.append(f"policy {dataset}: keep last {policy.keep_last}, keep within {policy.keep_within} s "
                     f"({policy.source})")
    for rule in RULES:
        kept = [entry for entry in report.rules if entry.rule == rule]
        lines.append(f"rule {rule:<11} keeps {plural(len({entry.snapshot for entry in kept}), 'snapshot')}"
                     + (": " + ", ".join(entry.by for entry in kept[:5]) + (" ..." if len(kept) > 5 else "")
                        if kept else ""))
    for name, tally in report.kept.items():
        lines.append(f"{'kept':<{width}}  {name:<10} {tally.count:>8}  {human_bytes(tally.bytes)}")
    for name in CATEGORIES:
        tally = report.deleted[name]
        lines.append(f"{verb}  {name:<10} {tally.count:>8}  {human_bytes(tally.bytes)}")
    lines.append(f"{'would free' if report.dry_run else 'freed'} {plural(report.freed.count, 'key')}, "
                 f"{human_bytes(report.freed.bytes)}")
    return lines


def _override(keep_last: int | None, keep_within: str | None) -> Override | None:
    """The policy parts gc flags give (each replaces that part of every dataset's policy), checked."""
    if keep_last is None and keep_within is None:
        return None
    override = Override(keep_last, parse_duration(keep_within) if keep_within is not None else None)
    override.apply(Policy())  # UsageError now for a bad value, not after reading the store
    return override


@click.command()
@store_option
@click.option("--dry-run", is_flag=True, help="Report what would be deleted and what each rule keeps; delete nothing.")
@click.option("--grace", default=DEFAULT_GRACE, show_default=True, metavar="DURATION",
              help="Only delete what is older than this (30m, 6h, 2d); must exceed the longest build.")
@click.option("--keep-last", type=int, default=None, metavar="N",
              help="Keep the last N generations of every ref (overrides each dataset's [retention]).")
@click.option("--keep-within", default=None, metavar="DURATION",
              help="Keep every snapshot a ref took, or that was published, within DURATION (overrides [retention]).")
@json_option("prep.gc-report/2")
def gc(store_url: str | None, dry_run: bool, grace: str, keep_last: int | None, keep_within: str | None,
       as_json: bool) -> None:
    """Delete objects and records no retention rule keeps, once older than the grace period."""
    policy = _override(keep_last, keep_within)
    grace_seconds = parse_duration(grace)
    store = open_store_option(store_url)
    report = collect_garbage(store, grace_seconds, dry_run, policy)
    if as_json:
        click.echo(json.dumps(report.to_json()))
    else:
        click.echo("\n".join(gc_lines(report)))


def fsck_lines(report: FsckReport) -> list[str]:
    """The human fsck report: counts, each finding by problem and kind, dangling objects, repairs."""
    checked = report.checked
    lines = [f"{report.store}{' dataset ' + report.dataset if report.dataset else ''}: checked "
             f"{plural(checked['objects'], 'object')} ({human_bytes(checked['bytes'])}) and "
             f"{plural(checked['records'], 'record')}; {plural(report.collected, 'generation')} in history collected by gc"]
    for problem in (CORRUPT, MISSING, INVALID):
        found = [f for f in report.findings if f.problem == problem]
        lines.append(f"{problem:<8} {len(found)}")
        lines.extend(f"  {f.kind}  {f.key}  (reached from {f.by})" for f in found)
    lines.append(f"dangling {plural(len(report.dangling), 'object')} ({human_bytes(sum(d.size for d in report.dangling))}), "
                 "nothing reaches them: prep gc collects them")
    lines.extend(f"  {d.key}" for d in report.dangling[:DANGLING_SHOWN])
    if report.repair is not None:
        lines.append(f"repair: removed {plural(len(report.repair.records), 'record')} and "
                     f"{plural(len(report.repair.objects), 'object')}; "
                     "rebuild to recompute them")
        lines.extend(f"  removed {key}" for key in (*report.repair.records, *report.repair.objects))
        lines.extend(f"  restored {key} (from its snapshot manifest)" for key in report.repair.restored)
        why = {found.key: unrepairable_reason(found) for found in report.findings}
        lines.extend(f"  unrepairable {key}: {why.get(key, 'restore it from a copy of the store')}"
                     for key in report.repair.unrepairable)
    lines.append("clean" if report.clean else plural(len(report.findings), "finding"))
    return lines


@click.command()
@store_option
@click.option("--dataset", default=None, metavar="NAME", help="Check only what this dataset's refs, history and holds reach.")
@click.option("--jobs", type=click.IntRange(min=1), default=DEFAULT_JOBS, show_default=True,
              help="Objects hashed in parallel.")
@click.option("--repair", is_flag=True,
              help="Delete the task and stage records naming damaged objects, and corrupt objects, so a rebuild recomputes them.")
@json_option("prep.fsck-report/1")
def fsck_command(store_url: str | None, dataset: str | None, jobs: int, repair: bool, as_json: bool) -> None:
    """Re-hash every object the store's refs, history, holds and records reach. Exit 0 when clean,
    1 with findings, 2 when it could not run."""
    store = open_store_option(store_url)
    report = fsck(store, dataset, jobs, Progress(), repair)
    if report.gc_running is not None:
        click.echo(f"prep: warning: a gc ran during this check ({report.gc_running}): objects it deleted "
                   "show as missing; check again when no gc runs", err=True)
    if as_json:
        click.echo(json.dumps(report.to_json()))
    else:
        click.echo("\n".join(fsck_lines(report)))
    if not report.clean:
        sys.exit(1)


@click.command()
@click.argument("snap")
@store_option
@click.option("--reason", default="", metavar="TEXT", help="Why it is held (recorded in the hold).")
@json_option("prep.hold-report/1")
def hold(snap: str, store_url: str | None, reason: str, as_json: bool) -> None:
    """Keep snapshot SNAP from garbage collection whatever the refs and retention say, until released."""
    store = open_store_option(store_url)
    snapshot = load_snapshot(store, resolve(store, snap).id)  # a manifest file must be in the store too
    placed, new = place_hold(store, snapshot, reason)
    if as_json:
        click.echo(json.dumps({"schema": "prep.hold-report/1", "action": "held" if new else "already-held",
                               "hold": placed.to_json()}))
        return
    click.echo(f"held {placed.snapshot} ({placed.dataset})" if new else
               f"{placed.snapshot} was already held since {placed.time}" + (f": {placed.reason}" if placed.reason else ""))


@click.command()
@click.argument("snap")
@store_option
@json_option("prep.hold-report/1")
def release(snap: str, store_url: str | None, as_json: bool) -> None:
    """Remove the hold on snapshot SNAP (a full id or anything `prep show` takes), so gc may collect it."""
    store = open_store_option(store_url)
    hex_part = snap.removeprefix("sha256:")
    if len(hex_part) == 64 and all(c in "0123456789abcdef" for c in hex_part):
        snapshot_id = f"sha256:{hex_part}"  # a held snapshot always exists, but name it without reading it
    else:
        snapshot_id = resolve(store, snap).id
    released = release_hold(store, snapshot_id)
    if isinstance(released, IntegrityError):
        click.echo(f"prep: warning: {released.message}; removed it", err=True)
        if as_json:
            click.echo(json.dumps({"schema": "prep.hold-report/1", "action": "released", "hold": None,
                                   "snapshot": snapshot_id, "unreadable": released.message}))
            return
        click.echo(f"released {snapshot_id} (its hold record was unreadable)")
        return
    if as_json:
        click.echo(json.dumps({"schema": "prep.hold-report/1", "action": "released", "hold": released.to_json()}))
        return
    click.echo(f"released {released.snapshot} ({released.dataset})")
