"""`prep redact`: what of a dataset still holds the documents a deletion request lists (read-only)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from prep.cli.common import echo_json, json_option, open_store_option, store_option
from prep.cli.render import sweep_json, sweep_lines
from prep.inputs.exclusions import read_entries
from prep.progress import plural
from prep.store.layout import check_name

if TYPE_CHECKING:  # the search loads pyarrow: imported when the command runs
    from prep.history.redaction import Redaction

REDACT_SCHEMA = "prep.redact-report/1"  # manifests/redact-report-1.schema.json


@click.command()
@click.argument("request", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--dataset", required=True, metavar="NAME", help="The dataset whose snapshots, refs and history to check.")
@store_option
@json_option(REDACT_SCHEMA)
def redact(request: Path, dataset: str, store_url: str | None, as_json: bool) -> None:
    """Report every snapshot of DATASET, ref, tag and history entry that still holds a document
    REQUEST lists (its syntax is [input] exclude's: `id:ID` or `text:HASH` a line), which
    retention rule keeps each, and which objects holding the texts gc would delete once no rule
    keeps them. Changes nothing. Exit 0 when nothing holds them any more, 1 when something does."""
    from prep.history.redaction import redact as compose

    check_name("dataset", dataset)
    entries = [entry for _, entry in read_entries(request, str(request)).entries]
    store = open_store_option(store_url)
    report = compose(store, entries, dataset)
    if as_json:
        echo_json({"schema": REDACT_SCHEMA, "store": store.url, "request": {"path": str(request),
                   "entries": len(entries)}, **report.to_json(), "search": sweep_json(report.found)})
    else:
        click.echo("\n".join(_lines(report)))
    if not report.clean:
        raise SystemExit(1)


def _lines(report: Redaction) -> list[str]:
    """The report for people: the search, then refs, history, rules and objects."""
    from prep.history.redaction import PULLED_COPIES

    lines = sweep_lines(report.found)
    lines.extend(f"ref       {ref.dataset}@{ref.name} -> {ref.snapshot} (generation {ref.generation})"
                 for ref in report.refs)
    lines.extend(f"history   {ref.dataset}@{ref.name} generation {ref.generation} ({ref.time}) -> {ref.snapshot}"
                 for ref in report.history)
    lines.extend(f"kept      {kept.snapshot} by {kept.rule} ({kept.by})" for kept in report.rules)
    held = report.objects
    lines.append(f"objects   {plural(len(held.all), 'object')} hold the texts or tokens: {len(held.kept)} kept by "
                 f"the rules above, {len(held.removable)} that gc deletes once past its grace period")
    lines.append(f"pulled    {PULLED_COPIES}")
    lines.append("clean: nothing of the dataset holds the listed documents" if report.clean else
                 "not clean: move the refs, untag, and run gc with a policy that keeps no older version")
    return lines
