"""`prep show SNAP --stats`: a snapshot's distributions drawn as terminal bars, as a JSON report, or
as one self-contained HTML page (inline CSS bars, no script, no external asset)."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click

from prep.cli.nearstats import cluster_size_rows, near_summary
from prep.errors import NotFoundError, StorageIOError, UsageError
from prep.history.diff import NEAR_CLUSTERS
from prep.progress import plural

STATS_SCHEMA = "prep.stats-report/1"  # manifests/stats-report-1.schema.json
BAR_WIDTH = 40
EIGHTHS = " ▏▎▍▌▋▊▉█"
FILE_COLUMNS = (("documents_read", "read"), ("bad_records_skipped", "skipped"), ("dropped_by_steps", "by steps"),
                ("duplicates_dropped", "duplicates"), ("near_duplicates_dropped", "near dups"),
                ("documents_written", "written"), ("tokens_written", "tokens"))


def distributions(snapshot_id: str, manifest: Mapping[str, Any]) -> Mapping[str, Any]:
    """The manifest's stats, NotFoundError when it records no distributions (a snapshot built before them)."""
    stats: Mapping[str, Any] = manifest["stats"]
    if "tokens_per_document" not in stats:
        raise NotFoundError(f"snapshot {snapshot_id[:19]} records no distributions (built before prep recorded "
                            "them): rebuild it to have them; `prep show` lists its counts")
    return stats


def stats_report(snapshot_id: str, manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The `--stats --json` report: the snapshot's stats and checks exactly as its manifest records them."""
    return {"schema": STATS_SCHEMA, "snapshot": snapshot_id, "dataset": manifest["dataset"],
            "stats": dict(distributions(snapshot_id, manifest)), "checks": manifest.get("checks")}


def check_stats_options(stats: bool, html_file: Path | None, others: Mapping[str, bool]) -> None:
    """UsageError for `--html` without `--stats`, or `--stats` with an option (by name) that shows something else."""
    if html_file is not None and not stats:
        raise UsageError("--html FILE goes with --stats")
    given = [name for name, on in others.items() if on]
    if stats and given:
        raise UsageError(f"--stats shows the snapshot's distributions: not with {', '.join(given)}")


def show_stats(snapshot_id: str, manifest: Mapping[str, Any], as_json: bool, html_file: Path | None) -> None:
    """Print the distributions (bars, or the JSON report), or write them to `html_file` as one page."""
    if html_file is not None:
        page = html_page(snapshot_id, manifest)
        try:
            html_file.write_text(page, encoding="utf-8")
        except OSError as exc:
            raise StorageIOError.from_os_error("writing", html_file, exc) from None
        if as_json:
            click.echo(json.dumps(stats_report(snapshot_id, manifest), ensure_ascii=False))
        return
    if as_json:
        click.echo(json.dumps(stats_report(snapshot_id, manifest), ensure_ascii=False))
    else:
        click.echo("\n".join(terminal_lines(snapshot_id, manifest)))


def bar(count: int, most: int, width: int = BAR_WIDTH) -> str:
    """`count` of `most` as a bar of `width` cells in eighths of a cell; any count above 0 shows."""
    if most <= 0 or count <= 0:
        return ""
    eighths = max(1, round(count * width * 8 / most))
    return "█" * (eighths // 8) + (EIGHTHS[eighths % 8] if eighths % 8 else "")


def histogram_rows(stats: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(label, documents) per octave of tokens per document: `0`, `1`, `2-3`, `4-7`, ..."""
    return [(str(o["min"]) if o["min"] == o["max"] else f"{o['min']}-{o['max']}", int(o["documents"]))
            for o in stats["tokens_per_document"]["histogram"]]


def tokens_summary(stats: Mapping[str, Any]) -> str:
    """One line: documents, median, empty and short ones."""
    tokens = stats["tokens_per_document"]
    median = tokens["median"]
    spelled = str(median["min"]) if median["min"] == median["max"] else f"{median['min']}-{median['max']}"
    written = int(stats["documents_written"])
    return (f"{written} documents, median {spelled} tokens, {tokens['empty']} empty, {tokens['short']} under "
            f"{tokens['short_below']} tokens ({_share(int(tokens['short']), written)})")


def file_rows(stats: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The per-file table: headers and one row of cells per input file (columns the build has)."""
    files = stats["files"]
    columns = [(key, title) for key, title in FILE_COLUMNS if any(key in entry for entry in files)]
    rows = [[entry["path"], *(_cell(entry.get(key)) for key, _ in columns)] for entry in files]
    return ["file", *(title for _, title in columns)], rows


def check_lines(checks: Sequence[Mapping[str, Any]] | None) -> list[str]:
    """One line per judged check: its key, limit, what was measured, passed or failed."""
    lines = []
    for check in checks or ():
        counts = f" ({check['count']} of {check['of']})" if "count" in check else ""
        lines.append(f"{check['name']} = {check['limit']}: measured {check['measured']}{counts}, "
                     f"{'passed' if check['passed'] else 'FAILED'}")
    return lines


def terminal_lines(snapshot_id: str, manifest: Mapping[str, Any]) -> list[str]:
    """The distributions as text: the histogram in bars, the per-file table, the shards' mix of
    input files (when recorded), the checks."""
    stats = distributions(snapshot_id, manifest)
    rows = histogram_rows(stats)
    lines = [f"snapshot   {snapshot_id}", f"tokens per document: {tokens_summary(stats)}", *_bar_lines(rows)]
    headers, cells = file_rows(stats)
    lines += ["files", *_table(headers, cells)]
    if "shard_sources" in stats:
        lines.append(f"input files per shard: {sources_summary(stats)}")
        lines += _bar_lines(distinct_rows(stats))
        lines.append("shards by their largest input file's share of their documents")
        lines += _bar_lines(share_rows(stats))
    if NEAR_CLUSTERS in stats:
        lines.append(f"near-duplicate clusters by size: {near_summary(stats)}")
        lines += _bar_lines(cluster_size_rows(stats))
    checks = check_lines(manifest.get("checks"))
    if checks:
        lines += ["checks", *(f"  {line}" for line in checks)]
    return lines


def html_page(snapshot_id: str, manifest: Mapping[str, Any]) -> str:
    """One self-contained HTML page of the same charts: CSS bars, tables, no script or external asset."""
    stats = distributions(snapshot_id, manifest)
    bars = _bar_table(histogram_rows(stats))
    headers, cells = file_rows(stats)
    files = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr>\n" + "\n".join(
        "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in cells)
    checks = "".join(f"<li>{html.escape(line)}</li>" for line in check_lines(manifest.get("checks")))
    title = html.escape(f"{manifest['dataset']} {snapshot_id[:19]}")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>\n<style>{_CSS}"
            f"</style></head>\n<body><h1>{title}</h1>\n<p><code>{html.escape(snapshot_id)}</code></p>\n"
            f"<h2>Tokens per document</h2>\n<p>{html.escape(tokens_summary(stats))}</p>\n"
            f"{bars}<h2>Input files</h2>\n<table>\n{files}\n</table>\n" + _sources_html(stats) + _near_html(stats)
            + (f"<h2>Checks</h2>\n<ul>{checks}</ul>\n" if checks else "") + "</body></html>\n")


def sources_summary(stats: Mapping[str, Any]) -> str:
    """One line: shards, input files written from, and the largest file's share of the documents
    (what a well-mixed shard's largest source holds about)."""
    sources = stats["shard_sources"]
    largest = sources["largest_file"]
    files = stats["files"]
    name = files[largest["file"]]["path"] if largest["file"] < len(files) else f"file {largest['file']}"
    share = _share(int(largest["documents"]), int(stats["documents_written"]))
    return (f"{plural(int(sources['shards']), 'shard')}, {plural(int(sources['files_written']), 'input file')} "
            f"written from; the largest, {name}, has {share} of the documents")


def distinct_rows(stats: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(label, shards) per log2 bin of input files a shard holds: `1`, `2-3`, `4-7`, ..."""
    return [(str(b["min"]) if b["min"] == b["max"] else f"{b['min']}-{b['max']}", int(b["shards"]))
            for b in stats["shard_sources"]["distinct"]]


def share_rows(stats: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(label, shards) per decile of the largest input file's share of a shard: `0-10%`, ..."""
    return [(f"{b['min_percent']}-{b['max_percent']}%", int(b["shards"])) for b in stats["shard_sources"]["largest_share"]]


def _near_html(stats: Mapping[str, Any]) -> str:
    """The near-duplicate clusters by size, for a build with [dedup.near]; nothing otherwise."""
    if NEAR_CLUSTERS not in stats:
        return ""
    return (f"<h2>Near-duplicate clusters by size</h2>\n<p>{html.escape(near_summary(stats))}</p>\n"
            + _bar_table(cluster_size_rows(stats)))


def _bar_lines(rows: list[tuple[str, int]]) -> list[str]:
    """A histogram's rows as labelled terminal bars, scaled to the largest count."""
    most = max((count for _, count in rows), default=0)
    width = max((len(label) for label, _ in rows), default=1)
    return [f"  {label:>{width}} │{bar(count, most):<{BAR_WIDTH}} {count}" for label, count in rows]


def _bar_table(rows: list[tuple[str, int]]) -> str:
    """A histogram's rows as an HTML table of CSS bars, scaled to the largest count."""
    most = max((count for _, count in rows), default=0)
    cells = "\n".join(f'<tr><th>{html.escape(label)}</th><td class="bar"><div style="width:{_percent(count, most)}">'
                      f"</div></td><td>{count}</td></tr>" for label, count in rows)
    return f"<table class=\"histogram\">\n{cells}\n</table>\n"


def _sources_html(stats: Mapping[str, Any]) -> str:
    """The input files per shard section (none for a snapshot built before prep recorded it)."""
    if "shard_sources" not in stats:
        return ""
    return (f"<h2>Input files per shard</h2>\n<p>{html.escape(sources_summary(stats))}</p>\n"
            f"{_bar_table(distinct_rows(stats))}<h3>Shards by their largest input file's share</h3>\n"
            f"{_bar_table(share_rows(stats))}")


_CSS = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{padding:2px 8px;"
        "text-align:right}td:first-child{text-align:left}.histogram td.bar{width:30em}"
        ".histogram .bar div{background:#4a78b5;height:1em}")


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Columns aligned: the first left, the rest right."""
    widths = [max(len(row[index]) for row in [headers, *rows]) for index in range(len(headers))]
    return ["  " + "  ".join(cell.ljust(widths[0]) if index == 0 else cell.rjust(widths[index])
                             for index, cell in enumerate(row)) for row in [headers, *rows]]


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return "+".join(str(item) for item in value)
    return str(value)


def _share(count: int, total: int) -> str:
    return f"{100 * count / total:.1f}%" if total else "0%"


def _percent(count: int, most: int) -> str:
    return f"{100 * count / most:.2f}%" if most else "0%"
