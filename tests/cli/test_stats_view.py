"""`prep show SNAP --stats`: the distributions as terminal bars, as a prep.stats-report/1 report,
and as one self-contained HTML page; a snapshot built before distributions says it has none."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from prep.cli.statsview import bar, html_page, terminal_lines
from prep.history.pipelinefile import checks_lines
from prep.manifest.schema import validate
from prep.quality.gate import parse_checks
from prep.storage.local import LocalStore
from tests.helpers import make_records, run_prep, write_jsonl, write_pipeline
from tests.snapshot_factory import build_snapshot


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> tuple[Path, dict[str, Any]]:
    """A store with tiny@latest built from two files (the second repeating 3 texts of the first), a
    length step and [checks]; and its manifest."""
    root = tmp_path_factory.mktemp("stats-view")
    records = make_records(40, seed=11, prefix="a") + [{"id": "empty", "text": ""}]
    write_jsonl(root / "corpus" / "a.jsonl", records)
    write_jsonl(root / "corpus" / "b.jsonl", [{**r, "id": f"b-{i}"} for i, r in enumerate(records[:3])])
    pipeline = write_pipeline(root, tokenizer_path, extra='\n[[steps]]\nuse = "length"\nmax_words = 55\n'
                                                         '\n[checks]\nmin_documents = 10\nmax_duplicate_fraction = 0.5\n')
    run_prep("build", pipeline, "--store", root / "store", "--workers", "1")
    shown = run_prep("show", "tiny@latest", "--store", root / "store", "--json")
    return root / "store", json.loads(shown.stdout)


def test_the_terminal_view_draws_one_bar_per_octave_and_a_row_per_file(built: tuple[Path, dict[str, Any]]) -> None:
    store, manifest = built
    stats = manifest["stats"]
    out = run_prep("show", "tiny@latest", "--store", store, "--stats").stdout.splitlines()
    octaves = stats["tokens_per_document"]["histogram"]
    drawn = [line for line in out[:out.index("files")] if "│" in line]
    assert len(drawn) == len(octaves)
    most = max(octave["documents"] for octave in octaves)
    for line, octave in zip(drawn, octaves):
        label = str(octave["min"]) if octave["min"] == octave["max"] else f"{octave['min']}-{octave['max']}"
        assert re.fullmatch(rf"\s+{label} │([█▏▎▍▌▋▊▉]*)\s* {octave['documents']}", line), line
        cells = line.split("│")[1].rstrip(" 0123456789")
        assert (len(cells) == 40) == (octave["documents"] == most) and (cells == "") == (octave["documents"] == 0)
    median = stats["tokens_per_document"]["median"]["min"]
    assert f"median {median} tokens, 1 empty" in out[1]
    rows = {line.split()[0]: line.split()[1:] for line in out if line.startswith("  a.jsonl") or line.startswith("  b.jsonl")}
    a, b = stats["files"]
    assert rows["b.jsonl"] == [str(b["documents_read"]), "0", "0", "3", str(b["documents_written"]),
                               str(b["tokens_written"])]
    assert rows["a.jsonl"][-1] == str(a["tokens_written"])
    assert f"  min_documents = 10: measured {stats['documents_written']}, passed" in out


def test_the_terminal_view_draws_the_shards_mix_of_input_files(built: tuple[Path, dict[str, Any]]) -> None:
    """A bar per bin of input files a shard holds, then one per decile of its largest file's share."""
    store, manifest = built
    sources = manifest["stats"]["shard_sources"]
    out = run_prep("show", "tiny@latest", "--store", store, "--stats").stdout.splitlines()
    header = next(index for index, line in enumerate(out) if line.startswith("input files per shard: "))
    largest = manifest["stats"]["files"][sources["largest_file"]["file"]]["path"]
    share = 100 * sources["largest_file"]["documents"] / manifest["stats"]["documents_written"]
    assert sources["files_written"] == 1 and largest == "a.jsonl"  # b.jsonl only repeats texts of a.jsonl
    assert out[header] == (f"input files per shard: {sources['shards']} shard{'s' * (sources['shards'] != 1)}, "
                           f"1 input file written from; the largest, a.jsonl, has {share:.1f}% of the documents")
    distinct = out[header + 1:header + 1 + len(sources["distinct"])]
    assert [line.split("│")[0].strip() for line in distinct] == ["1", "2-3"][:len(sources["distinct"])]
    assert [int(line.split()[-1]) for line in distinct] == [b["shards"] for b in sources["distinct"]]
    at = header + 1 + len(distinct)
    assert out[at] == "shards by their largest input file's share of their documents"
    deciles = out[at + 1:at + 11]
    assert [line.split("│")[0].strip() for line in deciles] == [f"{10 * k}-{10 * k + 10}%" for k in range(10)]
    assert [int(line.split()[-1]) for line in deciles] == [b["shards"] for b in sources["largest_share"]]
    assert sum(b["shards"] for b in sources["largest_share"]) == sources["shards"] >= 1


def test_a_snapshot_built_before_the_source_mix_shows_the_rest(built: tuple[Path, dict[str, Any]]) -> None:
    _, manifest = built
    stats = {name: value for name, value in manifest["stats"].items() if name != "shard_sources"}
    older = {**manifest, "stats": stats}
    full = terminal_lines("sha256:" + "0" * 64, manifest)
    start = next(index for index, line in enumerate(full) if line.startswith("input files per shard"))
    assert terminal_lines("sha256:" + "0" * 64, older) == full[:start] + full[full.index("checks"):]
    page = html_page("sha256:" + "0" * 64, older)
    assert "per shard" not in page and "a.jsonl" in page


def test_the_json_report_is_the_manifests_stats_and_checks(built: tuple[Path, dict[str, Any]]) -> None:
    store, manifest = built
    report = json.loads(run_prep("show", "tiny@latest", "--store", store, "--stats", "--json").stdout)
    validate(report, "prep.stats-report/1")
    assert report["stats"] == manifest["stats"] and report["checks"] == manifest["checks"]
    assert report["stats"]["shard_sources"]["shards"] == len({a["shard"] for a in manifest["artifacts"]})
    assert [check["name"] for check in report["checks"]] == ["max_duplicate_fraction", "min_documents"]


def test_the_html_page_is_self_contained(built: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    store, manifest = built
    page_file = tmp_path / "stats.html"
    ran = run_prep("show", "tiny@latest", "--store", store, "--stats", "--html", page_file)
    assert ran.stdout == ""
    page = page_file.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"<script|<link|<img|src=|href=|url\(|@import|https?:", page, re.I)
    stats = manifest["stats"]
    sources = stats["shard_sources"]
    assert page.count('<td class="bar">') == len(stats["tokens_per_document"]["histogram"]) + \
        len(sources["distinct"]) + len(sources["largest_share"])
    assert "<h2>Input files per shard</h2>" in page and "<th>90-100%</th>" in page
    assert "width:100.00%" in page and "a.jsonl" in page and "min_documents = 10" in page


def test_bad_stats_options_and_a_snapshot_without_distributions_exit_2(tmp_path: Path,
                                                                       built: tuple[Path, dict[str, Any]]) -> None:
    store, _ = built
    for args, message in ((["--html", str(tmp_path / "x.html")], "--html FILE goes with --stats"),
                          (["--stats", "--pipeline"], "--stats shows the snapshot's distributions: not with --pipeline")):
        ran = run_prep("show", "tiny@latest", "--store", store, *args, check=False)
        assert ran.returncode == 2 and ran.stderr.startswith(f"prep: error: {message}") and not (tmp_path / "x.html").exists()
    old = LocalStore(tmp_path / "old")
    build_snapshot(old, tmp_path / "work")
    ran = run_prep("show", "demo@latest", "--store", old.root, "--stats", "--json", check=False)
    assert ran.returncode == 2 and "records no distributions (built before prep recorded them)" in ran.stderr
    assert json.loads(ran.stdout)["schema"] == "prep.error/1"


@pytest.mark.parametrize(("count", "most", "drawn"), [(0, 10, ""), (1, 1000, "▏"), (10, 10, "█" * 40), (5, 10, "█" * 20),
                                                      (3, 64, "█▉"), (7, 0, "")])
def test_bars_are_drawn_in_eighths_and_any_document_shows(count: int, most: int, drawn: str) -> None:
    assert bar(count, most) == drawn


def test_show_pipeline_writes_the_checks_back_as_they_parse(built: tuple[Path, dict[str, Any]]) -> None:
    """The printed pipeline's [checks] parse to the checks the manifest judged (so a rebuild from it
    records the same), a per-step one as its dotted key."""
    store, manifest = built
    text = run_prep("show", "tiny@latest", "--store", store, "--pipeline").stdout
    assert "[checks]\nmax_duplicate_fraction = 0.5\nmin_documents = 10\n" in text
    table = tomllib.loads(text)["checks"]
    checks = parse_checks(table, ["length"], "printed")
    assert [check.to_json() for check in checks.checks] == [
        {key: value for key, value in check.items() if key in ("name", "limit", "step")}
        for check in manifest["checks"]]
    per_step = checks_lines([{"name": "max_dropped_fraction.my.step:fn", "limit": "1.0"}])
    assert parse_checks(tomllib.loads("\n".join(per_step))["checks"], ["my.step:fn"]).checks[0].step == 0
