"""`prep status PIPELINE`: what a build would run and what it would reuse (reads only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from prep.cli.common import json_option, resolve_store_url, store_option
from prep.config import load_pipeline
from prep.progress import plural
from prep.storage import open_store

if TYPE_CHECKING:  # the status module loads the planning code; import it only when run
    from prep.runner.status import BuildStatus

CHANGE_MARKS = {"added": "+", "removed": "-", "changed": "~"}
PARTS_SHOWN = 20


def status_lines(status: BuildStatus) -> list[str]:
    """The human report: the verdict, input changes, tokenize tasks to run, each stage's state."""
    todo = [part for part in status.parts if not part.committed]
    running = [stage.name for stage in status.stages if stage.state != "reused"]
    if status.up_to_date:
        assert status.latest is not None
        verdict = f"up to date: a build would publish {status.latest.id} ({status.dataset}@latest) again"
    else:
        verdict = (f"a build would run {len(todo)} of {plural(len(status.parts), 'tokenize task')} and "
                   f"{len(running)} of {plural(len(status.stages), 'stage')}" + (f" ({', '.join(running)})" if running else ""))
    counts = {change: sum(entry.change == change for entry in status.inputs)
              for change in ("changed", "added", "removed", "unchanged")}
    against = f"{status.dataset}@latest {status.latest.id}" if status.latest else "no latest snapshot"
    lines = [f"status     {status.dataset}: {verdict}",
             f"inputs     {', '.join(f'{n} {change}' for change, n in counts.items())} (against {against})"]
    lines.extend(f"  {CHANGE_MARKS[entry.change]} {entry.path}" for entry in status.inputs if entry.change in CHANGE_MARKS)
    lines.append(f"tokenize   {len(status.parts) - len(todo)} of {plural(len(status.parts), 'task')} committed")
    lines.extend(f"  would run  {part.source} part {part.part}" for part in todo[:PARTS_SHOWN])
    if len(todo) > PARTS_SHOWN:
        lines.append(f"  ... {len(todo) - PARTS_SHOWN} more (use --json for all)")
    width = max([9, *(len(stage.name) for stage in status.stages)])  # near_clusters is 13
    for stage in status.stages:
        key = f"key {stage.key[:16]}  " if stage.key else ""
        lines.append(f"stage      {stage.name:<{width}} {stage.state:<10} {key}({stage.reason})")
    return lines


@click.command()
@click.argument("pipeline", type=click.Path(dir_okay=False, path_type=Path))
@store_option
@json_option("prep.status-report/1")
def status(pipeline: Path, store_url: str | None, as_json: bool) -> None:
    """What `prep build PIPELINE` would run and what it would reuse, without running or writing anything."""
    from prep.runner.status import build_status

    config = load_pipeline(pipeline)
    pipeline_store = config.store
    if pipeline_store and "://" not in pipeline_store:
        pipeline_store = str(config.base_dir / pipeline_store)  # relative to the pipeline file, as build reads it
    store = open_store(resolve_store_url(store_url, pipeline_store))  # a store not built yet reads as empty
    report = build_status(config, store, lambda line: click.echo(line, err=True))
    if as_json:
        click.echo(json.dumps(report.to_json(), ensure_ascii=False))
    else:
        click.echo("\n".join(status_lines(report)))
