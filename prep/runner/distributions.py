"""A snapshot's distributions: the order tasks' token lengths and per-part counts summed (memory
follows the parts and a thousand lengths, never the documents), the stats fields made of them
(`tokens_per_document`, `files`), and the measures [checks] are judged on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prep.errors import IntegrityError
from prep.quality.gate import Measures
from prep.quality.lengths import SHORT_BELOW, TokenLengths
from prep.runner.tokenizing import TokenizedPart

PART_COLUMNS = ("duplicates", "near_duplicates", "documents", "tokens")


@dataclass(frozen=True)
class OrderQuality:
    """Summed over the order buckets: the kept documents' token lengths, and per part (by
    ordinal) the PART_COLUMNS counts (near duplicates all 0 without [dedup.near])."""

    lengths: TokenLengths
    parts: Mapping[str, tuple[int, ...]]


def order_quality(parts: int, summaries: Sequence[tuple[str, Mapping[str, Any]]]) -> OrderQuality:
    """The sum of the order tasks' (key, summary) over a corpus of `parts` parts, in plain Python
    (the driver loads no numpy); IntegrityError for a summary without them or naming a part the
    corpus lacks (a record of other code)."""
    lengths = TokenLengths()
    totals = {name: [0] * parts for name in PART_COLUMNS}
    for key, summary in summaries:
        try:
            lengths += TokenLengths.from_json(summary["token_lengths"])
            _add_parts(totals, summary["parts"], parts)
        except (KeyError, TypeError, ValueError) as exc:
            raise IntegrityError(f"task record order/{key}: no usable token lengths or part counts ({exc}); "
                                 "remove it and rebuild") from None
    return OrderQuality(lengths, {name: tuple(column) for name, column in totals.items()})


def _add_parts(totals: dict[str, list[int]], counts: Mapping[str, Any], parts: int) -> None:
    """Add one bucket's per-part columns to `totals`; ValueError for a part out of range or a
    column of another length."""
    ordinals = [int(ordinal) for ordinal in counts["part"]]
    if any(not 0 <= ordinal < parts for ordinal in ordinals):
        raise ValueError("a part ordinal out of range")
    for name, column in totals.items():
        values = counts.get(name, [0] * len(ordinals) if name == "near_duplicates" else None)
        if values is None or len(values) != len(ordinals):
            raise ValueError(f"parts.{name} does not list every part")
        for ordinal, value in zip(ordinals, values):
            column[ordinal] += int(value)


def distribution_stats(quality: OrderQuality, parts: Sequence[TokenizedPart], near: bool) -> dict[str, Any]:
    """The stats' `tokens_per_document` and `files` (per input file, in input order)."""
    lengths = quality.lengths
    low, high = lengths.median()
    return {
        "tokens_per_document": {
            "histogram": [{"min": lo, "max": hi, "documents": count} for lo, hi, count in lengths.histogram()],
            "median": {"min": low, "max": high},
            "empty": lengths.below(1),
            "short": lengths.below(SHORT_BELOW),
            "short_below": SHORT_BELOW,
        },
        "files": file_stats(quality, parts, near),
    }


def file_stats(quality: OrderQuality, parts: Sequence[TokenizedPart], near: bool) -> list[dict[str, Any]]:
    """Per input file (its parts summed): as the stats' totals, documents read (those the steps
    kept), bad records skipped, documents a deletion request excluded (with [input] exclude), documents
    each step dropped, duplicates and near duplicates
    dropped, documents and tokens written."""
    files: dict[str, dict[str, Any]] = {}
    for ordinal, part in enumerate(parts):
        entry = files.setdefault(part.source, {"path": part.source, "documents_read": 0, "bad_records_skipped": 0,
                                               **({"dropped_by_steps": [0] * len(part.steps)} if part.steps else {}),
                                               "duplicates_dropped": 0,
                                               **({"near_duplicates_dropped": 0} if near else {}),
                                               "documents_written": 0, "tokens_written": 0})
        entry["documents_read"] += part.documents
        entry["bad_records_skipped"] += part.bad_records
        if part.excluded is not None:
            entry["excluded"] = entry.get("excluded", 0) + part.excluded
        for index, counts in enumerate(part.steps or ()):
            entry["dropped_by_steps"][index] += counts.dropped
        entry["duplicates_dropped"] += quality.parts["duplicates"][ordinal]
        if near:
            entry["near_duplicates_dropped"] += quality.parts["near_duplicates"][ordinal]
        entry["documents_written"] += quality.parts["documents"][ordinal]
        entry["tokens_written"] += quality.parts["tokens"][ordinal]
    return list(files.values())


def measures(stats: Mapping[str, Any]) -> Measures:
    """What [checks] judge, from a snapshot's stats (docs/build.md, "Checks")."""
    steps = stats.get("steps", ())
    skipped = int(stats.get("bad_records_skipped", 0))
    deduplicated = int(stats["documents_read"])
    by_steps = sum(int(step["dropped"]) for step in steps)
    return Measures(
        records=deduplicated + by_steps + skipped, skipped=skipped, deduplicated=deduplicated,
        duplicates=int(stats["duplicates_dropped"]) + int(stats.get("near_duplicates_dropped", 0)),
        written=int(stats["documents_written"]),
        median_tokens=int(stats["tokens_per_document"]["median"]["min"]),
        steps=tuple((int(step["documents"]), int(step["dropped"])) for step in steps))
