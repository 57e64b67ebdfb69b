"""`prep consumed SOURCE`: which documents the first N global samples of a training run touched;
`prep drill SOURCE`: a load drill of W ranks reading from the store through the node-local cache."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from prep.cli.common import open_store_option, resolve_store_url, store_option
from prep.errors import UsageError
from prep.progress import human_bytes, plural
from prep.storage.backend import Store

if TYPE_CHECKING:  # prep.data loads numpy; import it only when the command runs
    from prep.data.ledger import DocumentQuery, DocumentUse, Ledger
    from prep.data.reader import Reader

TOP_DOCUMENTS = 10
SAMPLES_SHOWN = 20
_SETTINGS = ("seq_len", "global_batch_size", "seed", "mode")


def _store_for(source: str, store_url: str | None) -> Store | None:
    """The store a source needs: none for a pulled folder, nor for a mixture when no store exists, nor
    for a folder that does not exist (the reader names it)."""
    from prep.data.reader import missing_folder

    path = Path(source)
    if path.is_dir() or missing_folder(source):
        return None
    url = resolve_store_url(store_url)
    if path.suffix == ".toml" and store_url is None and "://" not in url and not Path(url).exists():
        return None  # a mixture of pulled folders; opening the default store would create it
    return open_store_option(store_url)


def _read_state(path: Path) -> dict[str, Any]:
    """A saved Reader.state_dict(), with the settings the reader needs checked for type."""
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: cannot read the reader state: {exc}") from None
    if not isinstance(state, dict):
        raise UsageError(f"{path}: not a prep reader state (expected a JSON object)")
    for key in (*_SETTINGS, "samples"):
        value = state.get(key)
        if key == "mode" and not isinstance(value, str) or key != "mode" and (type(value) is not int or value < 0):
            raise UsageError(f"{path}: not a prep reader state: {key} is {value!r}")
    return state


def _open(source: str, store_url: str | None, state_path: Path | None, options: dict[str, Any]) -> tuple[Reader, int]:
    """The reader SOURCE resolves to with the settings given (or the state's), and N."""
    from prep.data.reader import Reader

    given = sorted(name for name, value in options.items() if value is not None)
    store = _store_for(source, store_url)
    if state_path is not None:
        if given:
            flag = given[0].replace("_", "-")
            raise UsageError(f"--state gives the sample count and reader settings; do not also pass --{flag}")
        state = _read_state(state_path)
        reader = Reader(source, seq_len=state["seq_len"], global_batch_size=state["global_batch_size"],
                        seed=state["seed"], mode=state["mode"], store=store)
        try:
            reader.load_state_dict(state)
        except UsageError as exc:
            raise UsageError(f"{state_path} does not match {source}: {exc.message}") from None
        return reader, reader.consumed
    mode = options["mode"] or "tokens"
    if options["samples"] is None or options["seq_len"] is None and mode == "tokens":
        raise UsageError("give --samples N and --seq-len L (or --state STATE.json)")
    reader = Reader(source, seq_len=options["seq_len"] or 1, global_batch_size=options["global_batch"] or 1,
                    seed=options["seed"] or 0, mode=mode, store=store)
    return reader, int(options["samples"])


def _where(document: DocumentUse) -> str:
    """An input file and line, or the document's place in the snapshot when named by position."""
    if document.source is not None:
        return f"{document.source} line {document.line}"
    return f"{document.snapshot[:19]} position {document.position}"


def ledger_lines(ledger: Ledger, source: str) -> list[str]:
    """The human summary of a ledger: settings, sources, digest, the top documents."""
    lines = [f"{source}: the first {ledger.samples} samples ({ledger.mode} mode, seq_len {ledger.seq_len}, global "
             f"batch {ledger.global_batch_size}, seed {ledger.seed}) read {ledger.tokens} tokens from "
             f"{len(ledger.documents)} documents"]
    for use in ledger.sources:
        lines.append(f"  {use.snapshot[:19]}  {use.samples} samples, {use.tokens} tokens, {use.documents} documents, "
                     f"{use.epochs:.3f} epochs ({use.epochs_reached} started), names from {use.names}")
    if ledger.names != "wds":
        lines.append("  (documents without a WebDataset .tar at hand are named SHARD_PATH:SEQUENCE)")
    lines.append(f"digest {ledger.digest}")
    top = sorted(ledger.documents, key=lambda d: (-d.tokens, d.first_sample))[:TOP_DOCUMENTS]
    if top:
        lines.append("top documents by tokens read:")
    lines.extend(f"  {d.tokens:>8} tokens {d.windows:>6} windows  {d.id}  ({_where(d)})" for d in top)
    if len(ledger.documents) > len(top):
        lines.append(f"  ... {len(ledger.documents) - len(top)} more (--json lists every document)")
    return lines


def query_lines(query: DocumentQuery) -> list[str]:
    """The human answer to --document: touched or not, how often, by which global samples."""
    if not query.touched:
        return [f"{query.document}: not touched by the first {query.samples} samples"]
    lines = []
    for match in query.matches:
        samples = list(match.samples or ())
        shown = ", ".join(map(str, samples[:SAMPLES_SHOWN])) + (", ..." if len(samples) > SAMPLES_SHOWN else "")
        lines.append(f"{query.document}: touched by {match.windows} of the first {query.samples} samples, "
                     f"{match.tokens} of its {match.length} tokens read ({_where(match)}); global samples {shown}")
    return lines


@click.command()
@click.argument("source")
@click.option("--samples", type=click.IntRange(min=0), default=None, help="Global samples consumed: the first N.")
@click.option("--state", "state_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A saved Reader.state_dict() (JSON): N and the reader settings come from it.")
@store_option
@click.option("--seq-len", type=click.IntRange(min=1), default=None, help="The reader's seq_len.")
@click.option("--global-batch", type=click.IntRange(min=1), default=None, help="The reader's global batch size (default 1).")
@click.option("--seed", type=click.IntRange(min=0), default=None, help="The reader's seed (default 0).")
@click.option("--mode", type=click.Choice(["tokens", "documents"]), default=None, help="The reader's mode (default tokens).")
@click.option("--document", "document_id", default=None, metavar="ID",
              help="Answer only whether (how often, at which global samples) document ID was touched.")
@click.option("--json", "as_json", is_flag=True, help="Print a prep.consumed-report/1 JSON report on stdout.")
def consumed(source: str, samples: int | None, state_path: Path | None, store_url: str | None, seq_len: int | None,
             global_batch: int | None, seed: int | None, mode: str | None, document_id: str | None,
             as_json: bool) -> None:
    """Which documents the first N global samples a prep.data.Reader over SOURCE (a pulled folder,
    a snapshot spec or a mixture file) touched, with a digest over what they read."""
    from prep.data.ledger import consumed as ledger_of
    from prep.data.ledger import find

    options = {"samples": samples, "seq_len": seq_len, "global_batch": global_batch, "seed": seed, "mode": mode}
    reader, count = _open(source, store_url, state_path, options)
    if document_id is not None:
        query = find(reader, count, document_id)
        click.echo(json.dumps(query.to_json(), indent=2, ensure_ascii=False) if as_json else "\n".join(query_lines(query)))
        return
    ledger = ledger_of(reader, count)
    click.echo(json.dumps(ledger.to_json(), indent=2, ensure_ascii=False) if as_json else "\n".join(ledger_lines(ledger, source)))


def _size(value: str, flag: str) -> int:
    """A byte count like 512MB or 2GiB (a bare integer is bytes) for a size flag."""
    from prep.config import parse_size
    from prep.errors import ConfigError

    try:
        return parse_size(int(value) if value.isdigit() else value, flag)
    except ConfigError as exc:
        raise UsageError(exc.message) from None


def drill_lines(report: dict[str, Any]) -> list[str]:
    """The human summary of a drill: one line per rank, then the node's totals and duplicates."""
    settings = report["settings"]
    lines = [f"{settings['source']}: {plural(settings['world_size'], 'rank')} (processes) read "
             f"{plural(settings['steps'], 'step')} (seq_len {settings['seq_len']}, global batch "
             f"{settings['global_batch']}) through a {human_bytes(settings['cache_bytes'])} cache in "
             f"{report['wall_seconds']:.2f} s"]
    for rank in report["ranks"]:
        waits = rank["fetch_seconds"]
        lines.append(f"  rank {rank['rank']}: first batch {rank['first_batch_seconds']:.3f} s, fetched "
                     f"{human_bytes(rank['bytes_fetched'])} ({plural(rank['fetches'], 'object')}, "
                     f"{human_bytes(rank['bytes_refetched'])} again), peak cache {human_bytes(rank['peak_cache_bytes'])}, "
                     f"fetch_seconds p50 {waits['p50']:.4f} p90 "
                     f"{waits['p90']:.4f} p99 {waits['p99']:.4f} max {waits['max']:.4f} total {waits['total']:.3f} "
                     f"({rank['fetch_share_after_first_batch']:.1%} of wall after the first batch)")
    totals, duplicates = report["totals"], report["duplicates"]
    lines.append(f"node: {human_bytes(totals['bytes_fetched'])} fetched, "
                 f"{plural(totals['distinct_objects_fetched'], 'distinct object')}, "
                 f"{plural(duplicates['fetches'], 'duplicate fetch', 'duplicate fetches')} ({human_bytes(duplicates['bytes'])}; "
                 f"{plural(duplicates['objects_fetched_by_several_ranks'], 'object')} fetched by several ranks)")
    return lines


@click.command()
@click.argument("source")
@store_option
@click.option("--world-size", type=click.IntRange(min=1), required=True, help="Ranks to simulate (one process each).")
@click.option("--cache-bytes", "cache_bytes", required=True, metavar="SIZE",
              help="The node-local cache's bound shared by the ranks, e.g. 64GB.")
@click.option("--steps", type=click.IntRange(min=1), required=True, help="Steps each rank reads.")
@click.option("--seq-len", type=click.IntRange(min=1), required=True, help="The reader's seq_len.")
@click.option("--global-batch", type=click.IntRange(min=1), required=True, help="The global batch size.")
@click.option("--seed", type=click.IntRange(min=0), default=0, help="The reader's seed (default 0).")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The cache folder (default: a fresh temporary one, removed afterwards).")
@click.option("--prefetch-steps", type=click.IntRange(min=0), default=None,
              help="Steps to prefetch ahead (default: as far as the plan and the cache allow).")
@click.option("--jobs", type=click.IntRange(min=1), default=4, help="Parallel fetches per rank (default 4).")
@click.option("--json", "as_json", is_flag=True, help="Print a prep.drill-report/1 JSON report on stdout.")
def drill(source: str, store_url: str | None, world_size: int, cache_bytes: str, steps: int, seq_len: int,
          global_batch: int, seed: int, cache_dir: Path | None, prefetch_steps: int | None, jobs: int,
          as_json: bool) -> None:
    """A load drill: WORLD_SIZE ranks read STEPS steps of SOURCE (a snapshot spec or mixture read
    from the store, or a pulled folder) through one node-local cache, without training."""
    from prep.data.drill import DrillConfig
    from prep.data.drill import drill as run

    if global_batch % world_size:
        raise UsageError(f"--global-batch {global_batch} is not a multiple of --world-size {world_size}")
    store = _store_for(source, store_url)
    config = DrillConfig(source, store.url if store is not None else None, world_size, _size(cache_bytes, "--cache-bytes"),
                         steps, seq_len, global_batch, str(cache_dir) if cache_dir is not None else None, seed,
                         prefetch_steps, jobs)
    report = run(config)
    click.echo(json.dumps(report, indent=2) if as_json else "\n".join(drill_lines(report)))
