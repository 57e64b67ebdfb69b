"""Text shared by commands that show documents: `prep trace` and `prep show --at` print traces,
`prep trace` and `prep show --dropped` documents a step or near-duplicate removal dropped."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prep.progress import plural

if TYPE_CHECKING:  # lineage loads pyarrow; only the commands that trace import it, when run
    from prep.history.documents import DocumentOrigin, Similarity, Trace
    from prep.history.everywhere import Sweep
    from prep.history.neardrops import NearDropped
    from prep.history.stepdrops import DroppedDocument

SHOWN_CHARACTERS = 2000
"""How much of each text `prep show --dropped near --text` prints (--json prints them whole)."""


def trace_lines(found: Trace, indent: str = "") -> list[str]:
    """A document's origin and where each artifact holds it (or the copy kept instead)."""
    doc = found.document
    lines = [(f"{indent}document  {doc.id}  ({doc.source} line {doc.line}; {plural(doc.tokens, 'token')} + EOS, "
              f"{plural(doc.text_bytes, 'byte')} of text, text xxh3-128 {doc.text_hash})")]
    if found.duplicate_of is not None:
        held = "the snapshot holds its text as" if found.duplicate_of.near_duplicate_of is None else \
            "the copy exact dedup kept, which near-duplicate removal dropped in turn, is"
        lines.append(f"{indent}dropped   as an exact duplicate; {held}:")
        return lines + trace_lines(found.duplicate_of, indent + "  ")
    if found.near_duplicate_of is not None:
        near = found.near_duplicate_of
        lines.extend(f"{indent}{line}" for line in near_lines(near.similarity))
        lines.append(f"{indent}          of its cluster's kept first document, which the snapshot holds as:")
        return lines + trace_lines(near.kept, indent + "  ")
    if found.order_key is not None and found.copy:  # dedup off: equal texts, keys told apart by copy number
        lines.append(f"{indent}key       {found.sample_key}  (WebDataset sample key: order key {found.order_key} "
                     f"+ copy {found.copy})")
    elif found.order_key is not None:  # shards named by key range: the key orders the samples
        lines.append(f"{indent}key       {found.order_key}  (order key, also its WebDataset sample key)")
    else:
        lines.append(f"{indent}position  {found.position} in the shuffled order")
    for place in found.placements:
        span = f"  bytes {place.offset}..{place.offset + place.length}" if place.offset is not None \
            and place.length is not None else ""
        lines.append(f"{indent}  {place.path:<16} sequence {place.sequence}{span}")
    return lines


def dropped_lines(found: DroppedDocument, text: bool = False) -> list[str]:
    """A document a step dropped: where it was read, the step and its reason (and its text, when asked)."""
    lines = [f"document  {found.id}  ({found.source} line {found.line})",
             f"dropped   by step {found.step + 1} ({found.use}): {found.reason}"]
    if found.detail:
        lines.append(f"          {found.detail}")
    if text:
        lines.append(found.text if found.text is not None else
                     "(text not kept: a part keeps the texts of the first 16 documents each step dropped)")
    return lines


def near_lines(similar: Similarity, lead: str = "dropped   as a near duplicate: ") -> list[str]:
    """How similar a near duplicate is to the kept document: the MinHash estimate and the exact
    Jaccard, and a note when either is below the threshold (a chain joined them)."""
    lines = [f"{lead}estimated similarity {similar.estimated:.3f} (MinHash, "
             f"{similar.permutations} permutations), Jaccard {similar.jaccard:.3f} on {similar.ngram}-word "
             f"shingles; threshold {similar.threshold:g}"]
    if min(similar.estimated, similar.jaccard) < similar.threshold:
        lines.append("          below the threshold: clusters join pair by pair (A~B, B~C) on estimates, so a "
                     "member can be less alike to its first")
    return lines


def _named(doc: DocumentOrigin) -> str:
    return f"{doc.id}  ({doc.source} line {doc.line})"


def _shown(text: str | None) -> str:
    """A text cut to SHOWN_CHARACTERS, saying how much more there is."""
    text = text or ""
    more = len(text) - SHOWN_CHARACTERS
    return text if more <= 0 else f"{text[:SHOWN_CHARACTERS]}... ({plural(more, 'more character')})"


def near_dropped_lines(found: NearDropped, text: bool = False) -> list[str]:
    """A document near-duplicate removal dropped, the kept document it duplicates and their
    similarity (and with `text` both texts, one above the other, each cut to SHOWN_CHARACTERS)."""
    lines = [f"document  {_named(found.document)}"]
    if found.exact_copy_of is not None:
        lines += [f"dropped   as an exact duplicate of {_named(found.exact_copy_of)}, by exact dedup first "
                  "(counted among the duplicates)", *near_lines(found.similarity, "near      ")]
    else:
        lines += near_lines(found.similarity)
    lines.append(f"kept      {_named(found.kept)}  (its cluster's first document)")
    if text:
        lines += [f"--- dropped {found.document.id}", _shown(found.text), f"+++ kept {found.kept.id}",
                  _shown(found.kept_text)]
    return lines


def sweep_json(found: Sweep) -> dict[str, Any]:
    """A store-wide search as `prep trace --all --json` and `prep redact --json` report it: the
    query as it grew (the text hashes of documents found by id join it) and every snapshot searched."""
    return {"query": {"ids": sorted(found.query.ids), "text_hashes": sorted(found.query.texts)},
            "snapshots": [entry.to_json() for entry in found.snapshots],
            "holding": len(found.holding)}


def sweep_lines(found: Sweep) -> list[str]:
    """A store-wide search for people: each snapshot holding a match, its refs, and each match's
    trace with the intermediate that holds its text; then how many of the snapshots hold one."""
    lines: list[str] = []
    for entry in found.snapshots:
        if entry.skipped:
            lines.append(f"snapshot  {entry.snapshot}  ({entry.dataset})  not searched: {entry.skipped}")
        if not entry.hits:
            continue
        refs = f"; refs {', '.join(entry.refs)}" if entry.refs else "; no ref names it"
        lines.append(f"snapshot  {entry.snapshot}  ({entry.dataset}{refs})")
        for hit in entry.hits:
            lines.extend(trace_lines(hit.trace, "  "))
            lines.append(f"    matched by {hit.matched}; its text is in intermediate {hit.intermediate}")
    lines.append(f"{plural(len(found.holding), 'snapshot')} of {len(found.snapshots)} hold it")
    return lines
