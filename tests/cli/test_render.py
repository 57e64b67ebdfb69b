"""Shared rendering lives in prep.cli.render: `show` and `history` both use it, neither imports the other."""

from __future__ import annotations

import ast
from pathlib import Path

from prep.cli import history, render, show
from prep.cli.render import SHOWN_CHARACTERS
from prep.history.documents import Similarity
from prep.history.lineage import DocumentOrigin, Placement, Trace
from prep.history.neardrops import NearDropped

ROOT = Path(__file__).resolve().parents[2]


def _imported_modules(module: str) -> set[str]:
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
    found = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    return found | {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}


def test_show_and_history_do_not_import_each_other() -> None:
    assert "prep.cli.history" not in _imported_modules("prep.cli.show")
    assert "prep.cli.show" not in _imported_modules("prep.cli.history")
    assert vars(show)["trace_lines"] is render.trace_lines and vars(history)["trace_lines"] is render.trace_lines
    assert not _imported_modules("prep.cli.render") & {"prep.cli.show", "prep.cli.history"}


def test_trace_lines_follow_a_dropped_copy_to_the_kept_one() -> None:
    kept = Trace(DocumentOrigin(0, "a-1", "a.jsonl", 1, "00" * 16, 12, 3, 0, 0), 5,
                 (Placement("bin/00000.bin", "bin", 0, 5, 40, 8), Placement("bin/00000.idx", "idx", 0, 5, None, None)))
    dropped = Trace(DocumentOrigin(9, "b-1", "b.jsonl", 4, "00" * 16, 12, 3, 1, 3), None, (), kept)
    assert render.trace_lines(dropped) == [
        f"document  b-1  (b.jsonl line 4; 3 tokens + EOS, 12 bytes of text, text xxh3-128 {'00' * 16})",
        "dropped   as an exact duplicate; the snapshot holds its text as:",
        f"  document  a-1  (a.jsonl line 1; 3 tokens + EOS, 12 bytes of text, text xxh3-128 {'00' * 16})",
        "  position  5 in the shuffled order",
        "    bin/00000.bin    sequence 5  bytes 40..48",
        "    bin/00000.idx    sequence 5",
    ]


def test_trace_lines_of_a_layout2_snapshot_show_the_order_key() -> None:
    """Shards named by key range: no global position, the order key is the sample key."""
    key = "3a" + "0" * 29 + "1"
    kept = Trace(DocumentOrigin(0, "a-1", "a.jsonl", 1, "11" * 16, 12, 3, 0, 0), 2,
                 (Placement("bin/3a00000000000000.bin", "bin", 4, 2, 16, 8),
                  Placement("wds/3a00000000000000.tar", "wds", 4, 2, 6144, 3072)), order_key=key)
    assert kept.sample_key == key
    assert render.trace_lines(kept) == [
        f"document  a-1  (a.jsonl line 1; 3 tokens + EOS, 12 bytes of text, text xxh3-128 {'11' * 16})",
        f"key       {key}  (order key, also its WebDataset sample key)",
        "  bin/3a00000000000000.bin sequence 2  bytes 16..24",
        "  wds/3a00000000000000.tar sequence 2  bytes 6144..9216",
    ]


def test_near_dropped_lines_cut_long_texts_and_say_when_below_the_threshold() -> None:
    dropped = DocumentOrigin(3, "b-1", "b.jsonl", 4, "11" * 16, 9000, 3, 0, 3)
    kept = DocumentOrigin(0, "a-1", "a.jsonl", 1, "00" * 16, 12, 3, 0, 0)
    found = NearDropped(dropped, kept, Similarity(0.6875, 0.625, 0.7, 5, 128), None, "x" * (SHOWN_CHARACTERS + 7), "kept")
    assert render.near_dropped_lines(found, text=True) == [
        "document  b-1  (b.jsonl line 4)",
        "dropped   as a near duplicate: estimated similarity 0.688 (MinHash, 128 permutations), Jaccard 0.625 on "
        "5-word shingles; threshold 0.7",
        "          below the threshold: clusters join pair by pair (A~B, B~C) on estimates, so a member can be less "
        "alike to its first",
        "kept      a-1  (a.jsonl line 1)  (its cluster's first document)",
        "--- dropped b-1", "x" * SHOWN_CHARACTERS + "... (7 more characters)", "+++ kept a-1", "kept"]
