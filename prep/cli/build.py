"""`prep build PIPELINE` and `prep rebuild SNAP --inputs DIR`."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import click

from prep.cli.common import echo_json, json_option, open_store_option, resolve_store_url, store_option
from prep.config import load_pipeline
from prep.errors import VerificationFailed
from prep.progress import Progress, note, plural
from prep.runner.build import PublishOptions, make_executor
from prep.storage import open_store
from prep.store.tags import check_tag_name, parse_expect


@click.command()
@click.argument("pipeline", type=click.Path(dir_okay=False, path_type=Path))
@store_option
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes running tasks (default: the number of cores).")
@click.option("--tag", "tags", multiple=True, metavar="NAME",
              help="Also point DATASET@NAME at the snapshot (a tag naming another snapshot needs --force).")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="Run tasks in a local process pool or on a Ray cluster.")
@click.option("--ray-address", default=None, metavar="ADDR", help="Ray cluster address (default: a local instance).")
@click.option("--expect", "expect", default=None, metavar="GEN",
              help="Move DATASET@latest only if it is at generation GEN (0 or 'none': it must not exist); "
                   "else exit 2 and it stays.")
@click.option("--force", is_flag=True,
              help="Move refs another build moved while this one ran, and --tag names that point elsewhere.")
@click.option("--no-readback", is_flag=True,
              help="Do not read the snapshot's objects back from the store before moving refs, nor shard "
                   "files as they are written (the log says so).")
@json_option("prep.build-report/1")
def build(pipeline: Path, store_url: str | None, workers: int | None, tags: tuple[str, ...], executor: str,
          ray_address: str | None, expect: str | None, force: bool, no_readback: bool, as_json: bool) -> None:
    """Build PIPELINE into the store and publish a snapshot; prints the snapshot id.

    If another publisher moved `latest` while the build ran, it is left alone (a warning line,
    exit 0) unless --force; a --tag left that way, or a stale --expect, exits 2. A rebuild with
    nothing changed moves no ref."""
    config = load_pipeline(pipeline)
    for tag in tags:
        check_tag_name(tag)
    options = PublishOptions(tags, parse_expect(expect) if expect is not None else None, force, not no_readback)
    pipeline_store = config.store
    if pipeline_store and "://" not in pipeline_store:
        pipeline_store = str(config.base_dir / pipeline_store)  # relative to the pipeline file
    url = resolve_store_url(store_url, pipeline_store)
    store = open_store(url)
    if executor == "ray":  # Ray takes seconds to start or reach, and prints nothing meanwhile
        address = ray_address or os.environ.get("RAY_ADDRESS")
        note(f"connecting to the Ray cluster at {address} ..." if address else "starting Ray (a local instance) ...")
    pool = make_executor(executor, workers or os.cpu_count() or 1, ray_address)
    try:
        from prep.runner.build import build as run_build  # heavy: imported while the workers start
        from prep.runner.publish import declined_tags

        result = run_build(config, store, pool, progress=None, options=options)
    finally:
        pool.close()
    _note_skipped(config.dataset, url, int(result.snapshot.manifest["stats"].get("bad_records_skipped", 0)))
    if as_json:
        echo_json({"schema": "prep.build-report/1", "snapshot": result.snapshot.id, "dataset": config.dataset,
                   "up_to_date": all(ref.action == "unchanged" for ref in result.refs),
                   "refs": [ref.to_json() for ref in result.refs],
                   "stages": [{"name": run.name, "ran": run.ran, "cached": run.cached} for run in result.stages.values()],
                   "readback": result.readback.to_json(), "log": result.log_key,
                   **({"checks": [check.to_json() for check in result.checks]} if config.checks else {})})
    else:
        click.echo(result.snapshot.id)
    if (declined := declined_tags(config.dataset, result.snapshot.id, result.refs)) is not None:
        raise declined


def _note_skipped(dataset: str, url: str, count: int) -> None:
    """Say that records were skipped (input.on_error = "skip") and the command that lists them."""
    if count:
        store = "" if url == resolve_store_url(None) else f" --store {shlex.quote(url)}"
        note(f"prep: skipped {plural(count, 'bad record')} (input.on_error = \"skip\"): "
             f"`prep log {dataset} --builds{store}` lists them")


@click.command()
@click.argument("snap")
@click.option("--inputs", required=True, type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="The folder holding the snapshot's input files, by the names its manifest records "
                   "(`prep show SNAP --pipeline` lists them); each is checked against its recorded hash first.")
@store_option
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Worker processes running tasks (default: the number of cores).")
@json_option("prep.rebuild-report/1")
def rebuild(snap: str, inputs: Path, store_url: str | None, workers: int | None, as_json: bool) -> None:
    """Build SNAP again from what the store carries, and prove the same snapshot id; prints it.

    The pipeline is the one SNAP's manifest records, the tokenizer file and the step modules are
    the ones it carries (each checked by hash), the inputs are DIR's files. No ref moves. A
    different result exits 1 naming the first artifact (or manifest field) that differs; an
    input file that is missing or differs, or a snapshot built before it carried its tokenizer and
    step sources, exits 2 naming it."""
    from prep.history.pipelinefile import rebuilt_pipeline
    from prep.history.selectors import resolve_spec
    from prep.runner.rebuild import rebuild as run_rebuild

    store = open_store_option(store_url)
    snapshot = resolve_spec(store, snap)
    result = run_rebuild(store, snapshot, inputs,
                         lambda target, folder, tokenizer: rebuilt_pipeline(target.id, target.manifest, folder, tokenizer),
                         lambda: make_executor("local", workers or os.cpu_count() or 1), Progress())
    if as_json:
        echo_json(result.to_json())
    else:
        click.echo(result.rebuilt)
    if result.difference is not None:
        raise VerificationFailed(f"rebuilt {result.rebuilt}, not {snapshot.id}: {result.difference}")
