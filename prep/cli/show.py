"""`prep show SNAP|DEST` (summary, --json, --at, --megatron-paths, --pipeline) and `prep log DATASET`."""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from prep.cli import statsview
from prep.cli.common import json_option, open_store_option, store_option
from prep.cli.nearstats import near_lines
from prep.cli.render import dropped_lines, near_dropped_lines, trace_lines
from prep.cli.statsview import STATS_SCHEMA
from prep.errors import NotFoundError, UsageError
from prep.formats.megatron_spec import BIN
from prep.formats.units import artifact_format, required_formats
from prep.history.naming import AT_EXAMPLES
from prep.history.pipelinefile import pipeline_text
from prep.history.selectors import resolve_spec
from prep.manifest.canonical import dumps
from prep.progress import human_bytes, plural
from prep.storage.backend import Store
from prep.store.snapshots import Snapshot, is_manifest_path, read_manifest_file, reencoded_note
from prep.transfer.paths import TOKENIZER_NAME

if TYPE_CHECKING:  # the lineage modules load pyarrow; import them only when used
    from prep.history.builds import BuildRecord, Generation
    from prep.history.neardrops import NearDropped
    from prep.neardup.settings import NearDupSettings

DROPPED_SCHEMA = "prep.dropped-report/1"  # manifests/dropped-report-1.schema.json
NEAR_DROPPED_SCHEMA = "prep.near-dropped-report/1"  # manifests/near-dropped-report-1.schema.json
SHOW_AT_SCHEMA = "prep.show-at/1"  # manifests/show-at-1.schema.json
PREP_DIR, MANIFEST_NAME, SHARE_NAME = ".prep", "manifest.json", "share.json"  # a pulled folder (prep.transfer)


def document_counts(stats: dict[str, Any]) -> str:
    """The documents line: records read (bad ones skipped and those steps dropped included), duplicates, written."""
    skipped = int(stats.get("bad_records_skipped", 0))
    by_steps = sum(int(step["dropped"]) for step in stats.get("steps", ()))
    read = int(stats["documents_read"]) + skipped + by_steps
    steps = f"{by_steps} dropped by steps, " if "steps" in stats else ""
    return (f"documents  {read} read, {plural(skipped, 'bad record')} skipped, {steps}"
            f"{plural(int(stats['duplicates_dropped']), 'duplicate')} dropped, {_near(stats)}"
            f"{stats['documents_written']} written")


def _near(stats: dict[str, Any]) -> str:
    """`N near duplicates dropped, ` for a build with [dedup.near], else nothing."""
    if "near_duplicates_dropped" not in stats:
        return ""
    return f"{plural(int(stats['near_duplicates_dropped']), 'near duplicate')} dropped, "


def step_lines(stats: dict[str, Any]) -> list[str]:
    """One line per document step, numbered from 1 as `prep show --dropped` and `prep trace` number
    them: documents in, kept, dropped (by reason) and changed."""
    lines = []
    for index, step in enumerate(stats.get("steps", ()), start=1):
        reasons = ", ".join(f"{reason} {count}" for reason, count in step["reasons"].items())
        lines.append(f"step       {index} {step['use']}: {step['documents']} in ({human_bytes(step['text_bytes'])}), "
                     f"{step['kept']} kept, {step['dropped']} dropped" + (f" ({reasons})" if reasons else "")
                     + f", {step['changed']} changed")
    return lines


def summary_lines(snapshot_id: str, manifest: dict[str, Any]) -> list[str]:
    """The human summary of a snapshot: inputs, tokenizer, code, counts, artifacts, stages."""
    stats, tok = manifest["stats"], manifest["tokenizer"]
    by_format: dict[str, list[int]] = {}
    for artifact in manifest["artifacts"]:
        entry = by_format.setdefault(artifact["format"], [0, 0])
        entry[0] += 1
        entry[1] += artifact["size"]
    lines = [
        f"snapshot   {snapshot_id}",
        f"dataset    {manifest['dataset']}   seed {manifest['seed']}",
        f"inputs     {plural(len(manifest['inputs']['files']), 'file')}, "
        f"{human_bytes(sum(f['size'] for f in manifest['inputs']['files']))}, version {manifest['inputs']['version'][:23]}",
        f"tokenizer  sha256:{tok['sha256'][:16]}  vocab {tok['vocab_size']}  eos {tok['eos']!r}={tok['eos_id']}  {tok['dtype']}",
        f"code       prep {manifest['code']['version']}  sha256:{manifest['code']['sha256'][:16]}",
        document_counts(stats),
        *near_lines(stats),
        *step_lines(stats),
        f"tokens     {stats['tokens_written']}",
        *(f"checks     {line}" for line in statsview.check_lines(manifest.get("checks"))),
    ]
    for fmt, (count, size) in sorted(by_format.items()):
        lines.append(f"artifacts  {fmt}: {plural(count, 'file')}, {human_bytes(size)}")
    width = max([9, *(len(stage["name"]) for stage in manifest["stages"])])  # near_clusters is 13
    for stage in manifest["stages"]:
        lines.append(f"stage      {stage['name']:<{width}} key {stage['key'][:16]}  output {stage['output'][:23]}")
    return lines


def pulled_manifest(spec: str) -> Path | None:
    """DEST/.prep/manifest.json when SPEC is a folder (a pulled one, else a UsageError); None otherwise."""
    if not os.path.isdir(spec):  # never raises: a ref spec too long for a file name is no folder
        return None
    folder = Path(spec)
    manifest = folder / PREP_DIR / MANIFEST_NAME
    if not manifest.is_file():
        raise UsageError(f"{spec}: a folder, but no pulled snapshot ({PREP_DIR}/{MANIFEST_NAME} is missing: "
                         "`prep pull` writes it last)")
    return manifest


def _share_record(dest: Path) -> dict[str, Any] | None:
    """DEST/.prep/share.json as a pull recorded it (None when absent or unreadable: it only informs)."""
    try:
        record = json.loads((dest / PREP_DIR / SHARE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _share_line(dest: Path) -> str | None:
    """What DEST/.prep/share.json says the folder holds, when a pull recorded it."""
    record = _share_record(dest)
    if record is None:
        return None
    rank, world = record.get("rank"), record.get("world_size")
    formats = record.get("formats")
    where = f"rank {rank} of {world}" if rank is not None else "the whole snapshot"
    return f"share      {where}, formats {', '.join(map(str, formats)) if formats else 'all'}"


def dest_lines(dest: Path, snapshot: Snapshot) -> list[str]:
    """What a pulled folder holds: where, its share, and how many of the artifacts are present."""
    present = [a for a in snapshot.artifacts if (dest / a["path"]).is_file()]
    check = f"prep verify {dest}/{PREP_DIR}/{MANIFEST_NAME} {dest}"
    lines = [f"pulled     {dest.resolve()}",
             f"present    {len(present)} of {plural(len(snapshot.artifacts), 'file')}, "
             f"{human_bytes(sum(a['size'] for a in present))} (verify with `{check}`)"]
    share = _share_line(dest)
    return lines + ([share] if share else [])


def megatron_prefixes(snapshot: Snapshot, root: Path, absolute: bool) -> tuple[list[str], int]:
    """Each shard's `.bin` path without `.bin` under `root` (Megatron's --data-path takes these);
    for a pulled folder (`absolute`), only shards whose .bin and .idx are both there, and how many are not."""
    prefixes, missing = [], 0
    extensions = [f".{artifact_format(fmt).extension}" for fmt in required_formats(BIN)]
    for artifact in sorted((a for a in snapshot.artifacts if a["format"] == BIN), key=lambda a: a["path"]):
        prefix = artifact["path"].removesuffix(extensions[0])
        if absolute and not all((root / f"{prefix}{ext}").is_file() for ext in extensions):
            missing += 1
            continue
        prefixes.append(str(root.resolve() / prefix) if absolute else os.path.join(root, prefix))
    return prefixes, missing


def _print_megatron_paths(snapshot: Snapshot, dest: Path | None, root: Path | None) -> None:
    if dest is None and root is None:
        raise UsageError("--megatron-paths of a store snapshot needs --root DIR (the folder it is pulled into), "
                         "or give the pulled folder itself: prep show DEST --megatron-paths")
    pulled = dest is not None and root is None
    formats = (_share_record(dest) or {}).get("formats") if dest is not None and pulled else None
    if isinstance(formats, list) and BIN not in formats:
        held = ", ".join(map(str, formats))
        raise UsageError(f"{dest} holds the {held} format only (pulled with --formats {held}): pull it with "
                         "--formats bin, or without --formats, for Megatron paths")
    prefixes, missing = megatron_prefixes(snapshot, dest or root or Path("."), pulled)
    if not prefixes and not any(a["format"] == BIN for a in snapshot.artifacts):
        raise NotFoundError(f"snapshot {snapshot.id[:19]} has no Megatron (.bin/.idx) artifacts")
    if missing:
        click.echo(f"prep: note: {missing} of {missing + len(prefixes)} shards are not in {dest} "
                   "(another rank's share, or an unfinished pull); listed only those present", err=True)
    if not prefixes:
        raise NotFoundError(f"{dest}: none of the snapshot's .bin/.idx pairs are in this folder")
    click.echo("\n".join(prefixes))


def _show_pipeline(snapshot: Snapshot, as_json: bool) -> None:
    """Print the pipeline the snapshot was built from: a TOML pipeline file, or with `as_json` its `config`."""
    if as_json:
        click.echo(dumps(snapshot.manifest["config"]).decode())
    else:
        click.echo(pipeline_text(snapshot.id, snapshot.manifest, f"{PREP_DIR}/{TOKENIZER_NAME}"), nl=False)


def _check_options(text: bool, tokens: bool, at: str | None, dropped_step: str | None, megatron_paths: bool,
                   root: Path | None, as_json: bool, pipeline: bool) -> None:
    """UsageError for options that do not go together."""
    if tokens and at is None or text and at is None and dropped_step is None:
        raise UsageError("--text and --tokens need --at KEY|PATH:N (--text also goes with --dropped STEP)")
    if dropped_step is not None and (at is not None or megatron_paths or tokens):
        raise UsageError("--dropped lists a step's documents: not with --at, --tokens or --megatron-paths")
    if root is not None and not megatron_paths:
        raise UsageError("--root goes with --megatron-paths")
    if megatron_paths and (at is not None or as_json):
        raise UsageError("--megatron-paths prints paths only: not with --at or --json")
    if pipeline and (at is not None or dropped_step is not None or megatron_paths):
        raise UsageError("--pipeline prints the pipeline file: not with --at, --dropped or --megatron-paths")


def _show_at(store: Store, snapshot: Snapshot, at: str, text: bool, tokens: bool, as_json: bool) -> None:
    """Print the document `--at` names: its trace, and its text and tokens when asked."""
    from prep.history.content import document_content
    from prep.history.documents import load_records
    from prep.history.lineage import locate_at

    found = locate_at(store, snapshot, at)
    content = document_content(store, load_records(store, snapshot), found.document) if text or tokens else None
    if as_json:
        report: dict[str, Any] = {"schema": SHOW_AT_SCHEMA, "snapshot": snapshot.id, "at": at, "trace": found.to_json()}
        if content is not None:
            report.update({k: v for k, v in content.to_json().items() if (text, tokens)[k == "tokens"]})
        click.echo(json.dumps(report, ensure_ascii=False))
        return
    if content is None:
        click.echo("\n".join(trace_lines(found)))
    if content is not None and text:
        click.echo(content.text)
    if content is not None and tokens:
        click.echo(" ".join(map(str, content.tokens)))


def write_near_report(snapshot_id: str, settings: NearDupSettings, found: Iterable[NearDropped]) -> None:
    """Print a prep.near-dropped-report/1, its documents one by one as they are found."""
    recorded = {key: value for key, value in settings.key_fields().items() if key != "unicode"}
    head = {"schema": NEAR_DROPPED_SCHEMA, "snapshot": snapshot_id, "step": "near",
            "settings": {**recorded, "threshold": settings.threshold}, "documents": []}
    text = json.dumps(head, ensure_ascii=False)
    click.echo(text[:-2], nl=False)  # without the closing `]}`
    for index, entry in enumerate(found):
        click.echo(("," if index else "") + json.dumps(entry.to_json(), ensure_ascii=False), nl=False)
    click.echo("]}")


def _show_near_dropped(store: Store, snapshot: Snapshot, limit: int, text: bool, as_json: bool) -> None:
    """Print the first `limit` documents near-duplicate removal dropped, in the drops object's
    order, each with the kept document it duplicates and their similarity (both texts with `text`)."""
    from prep.history.documents import load_records
    from prep.history.neardrops import NearDrops, near_dropped, no_near_dedup
    from prep.history.stepdrops import step_uses

    drops = NearDrops.load(store, load_records(store, snapshot))
    if drops is None:
        raise no_near_dedup(snapshot, step_uses(snapshot))
    found = near_dropped(drops, text)
    if as_json:
        write_near_report(snapshot.id, drops.settings, itertools.islice(found, limit))
        return
    shown = 0
    for shown, entry in enumerate(itertools.islice(found, limit), start=1):
        click.echo(("\n" if shown > 1 else "") + "\n".join(near_dropped_lines(entry, text)))
    if not shown:
        click.echo(f"near-duplicate removal dropped no document of snapshot {snapshot.id[:19]}")


def _show_dropped(store: Store, snapshot: Snapshot, step: str, limit: int, text: bool, as_json: bool) -> None:
    """Print the first `limit` documents step `step` dropped (their texts, where kept, with `text`);
    `near` names near-duplicate removal (a step whose `use` is `near` is named by its number)."""
    from prep.history.neardrops import NEAR
    from prep.history.stepdrops import dropped_by

    if step == NEAR:
        _show_near_dropped(store, snapshot, limit, text, as_json)
        return
    found = dropped_by(store, snapshot, step, limit)
    if as_json:
        click.echo(json.dumps({"schema": DROPPED_SCHEMA, "snapshot": snapshot.id, "step": step,
                               "documents": [{**entry.to_json(), **({"text": entry.text} if text else {})}
                                             for entry in found]}, ensure_ascii=False))
        return
    if not found:
        click.echo(f"step {step} of snapshot {snapshot.id[:19]} dropped no document")
    click.echo("\n\n".join("\n".join(dropped_lines(entry, text)) for entry in found))


@click.command()
@click.argument("snap", metavar="SNAP|DEST")
@store_option
@json_option("prep.snapshot/1 (the manifest exactly as stored), with --at " + SHOW_AT_SCHEMA + ", with --dropped "
             + DROPPED_SCHEMA + " (--dropped near: " + NEAR_DROPPED_SCHEMA + "), with --pipeline the manifest's config "
             "(part of prep.snapshot/1), with --stats " + STATS_SCHEMA)
@click.option("--at", "at", default=None, metavar="KEY|PATH:N",
              help="Show one document: a WebDataset sample key (as in the .tar), or sequence N (0-based) of "
                   f"artifact PATH, e.g. {AT_EXAMPLES}.")
@click.option("--text", is_flag=True, help="With --at: print the document's text (instead of where it is); with "
                                          "--dropped: each document's text, where kept.")
@click.option("--tokens", is_flag=True, help="With --at: print its token ids as its .bin holds them (EOS last).")
@click.option("--megatron-paths", is_flag=True, help="Print each shard's .bin path without .bin, for Megatron's --data-path.")
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="With --megatron-paths: the folder the snapshot is (to be) pulled into.")
@click.option("--dropped", "dropped_step", default=None, metavar="STEP",
              help="List documents step STEP (its number in [[steps]], from 1, or its `use`) dropped, and why; "
                   "`near`: those near-duplicate removal dropped, each with the kept document it duplicates.")
@click.option("--limit", type=click.IntRange(min=1), default=10, show_default=True,
              help="With --dropped: list at most this many.")
@click.option("--pipeline", is_flag=True,
              help="Print the pipeline the snapshot was built from, as a TOML pipeline file (its input files and "
                   "tokenizer as a pull places them).")
@click.option("--stats", "show_stats", is_flag=True,
              help="Draw the snapshot's distributions: tokens per document (octave bars), per input file counts, "
                   "checks; with --json the " + STATS_SCHEMA + " report.")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="With --stats: write them to FILE as one self-contained HTML page.")
def show(snap: str, store_url: str | None, as_json: bool, at: str | None, text: bool, tokens: bool,
         megatron_paths: bool, root: Path | None, dropped_step: str | None, limit: int, pipeline: bool,
         show_stats: bool, html_file: Path | None) -> None:
    """Show a snapshot (DATASET@REF, sha256:<hex>, a unique hex prefix, a manifest file) or a pulled folder."""
    _check_options(text, tokens, at, dropped_step, megatron_paths, root, as_json, pipeline)
    statsview.check_stats_options(show_stats, html_file, {"--at": at is not None, "--dropped": dropped_step is not None,
                                                          "--megatron-paths": megatron_paths, "--pipeline": pipeline})
    manifest_file = pulled_manifest(snap)
    dest = Path(snap) if manifest_file is not None else None
    spec = str(manifest_file) if manifest_file is not None else snap
    store = None if is_manifest_path(spec) and at is None and dropped_step is None else open_store_option(store_url)
    snapshot = read_manifest_file(manifest_file) if manifest_file else resolve_spec(store, spec)
    note = reencoded_note(spec, snapshot)
    if note is not None:
        click.echo(note, err=True)
    if megatron_paths:
        _print_megatron_paths(snapshot, dest, root)
    elif show_stats:
        statsview.show_stats(snapshot.id, snapshot.manifest, as_json, html_file)
    elif pipeline:
        _show_pipeline(snapshot, as_json)
    elif at is not None:
        assert store is not None
        _show_at(store, snapshot, at, text, tokens, as_json)
    elif dropped_step is not None:
        assert store is not None
        _show_dropped(store, snapshot, dropped_step, limit, text, as_json)
    elif as_json:
        click.echo(snapshot.raw, nl=False)  # bytes go to stdout's binary buffer untouched
    else:
        click.echo("\n".join(summary_lines(snapshot.id, snapshot.manifest)
                             + (dest_lines(dest, snapshot) if dest is not None else [])))


def generation_line(generation: Generation) -> str:
    """One generation of one ref, marked when its snapshot was collected (or the ref deleted)."""
    ref = generation.ref
    marks = [mark for mark, on in (("(collected)", generation.collected), ("(ref deleted)", ref.deleted)) if on]
    return f"{ref.time}  {ref.dataset}@{ref.name:<12} gen {ref.generation:<4} {ref.snapshot}" + \
        "".join(f"  {mark}" for mark in marks)


def build_lines(build: BuildRecord) -> list[str]:
    """One build: when, where, how, what ran or was reused per stage, and the records it skipped."""
    entry = build.to_json()
    unknown = "(not recorded)"
    lines = [f"build      {entry['started']}  {entry['seconds']} s  host {entry['host']}  snapshot {entry['snapshot']}"
             + ("  (collected)" if build.collected else ""),
             f"  run      executor {entry['executor'] or unknown}  workers {entry['workers'] or unknown}  "
             f"tokenizer backend {entry['tokenizer_backend'] or unknown}",
             "  stages   " + ", ".join(f"{name} {run['ran']} ran/{run['cached']} cached"
                                      for name, run in entry["stages"].items())]
    listed = entry["skip_reasons"]
    lines.append(f"  skipped  {plural(entry['skipped'], 'bad record')}"
                 + (":" if listed else ""))
    lines.extend(f"    {reason}" for reason in listed)
    if len(listed) < entry["skipped"]:
        lines.append(f"    ... {entry['skipped'] - len(listed)} more not listed in the build log")
    return lines


@click.command()
@click.argument("dataset")
@store_option
@click.option("--builds", "show_builds", is_flag=True,
              help="List builds instead: time, host, duration, executor, workers, cache hits, skipped records.")
@json_option("prep.log-report/1")
def log(dataset: str, store_url: str | None, show_builds: bool, as_json: bool) -> None:
    """The snapshots DATASET's refs have pointed to, newest first; collected ones are marked."""
    from prep.history.builds import REPORT_SCHEMA, builds, generations

    store = open_store_option(store_url)
    entries = generations(store, dataset)
    found = builds(store, dataset) if show_builds else None
    if not entries and not (found if found is not None else builds(store, dataset)):  # a typo, say
        raise NotFoundError(f"{store.url}: no dataset {dataset!r}: no ref and no build log names it "
                            "(`prep ls` lists the datasets)")
    if as_json:
        click.echo(json.dumps({"schema": REPORT_SCHEMA, "dataset": dataset, "store": store.url,
                               "generations": [entry.to_json() for entry in entries],
                               "builds": None if found is None else [build.to_json() for build in found]},
                              ensure_ascii=False))
        return
    if found is not None:
        if not found:
            click.echo(f"no build logs for dataset {dataset!r} in {store.url}", err=True)
        else:
            click.echo("\n".join(line for build in found for line in build_lines(build)))
        return
    if not entries:  # built, but every ref it had is gone with its history
        click.echo(f"no refs for dataset {dataset!r} in {store.url}", err=True)
        return
    click.echo("\n".join(generation_line(entry) for entry in entries))
