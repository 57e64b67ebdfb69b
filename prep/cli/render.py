"""Text shared by commands that show documents: `prep trace` and `prep show --at` print traces,
`prep trace` and `prep show --dropped` documents a step dropped."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prep.progress import plural

if TYPE_CHECKING:  # lineage loads pyarrow; only the commands that trace import it, when run
    from prep.history.documents import Trace
    from prep.history.stepdrops import DroppedDocument


def trace_lines(found: Trace, indent: str = "") -> list[str]:
    """A document's origin and where each artifact holds it (or the copy kept instead)."""
    doc = found.document
    lines = [(f"{indent}document  {doc.id}  ({doc.source} line {doc.line}; {plural(doc.tokens, 'token')} + EOS, "
              f"{plural(doc.text_bytes, 'byte')} of text, text xxh3-128 {doc.text_hash})")]
    if found.duplicate_of is not None:
        lines.append(f"{indent}dropped   as an exact duplicate; the snapshot holds its text as:")
        return lines + trace_lines(found.duplicate_of, indent + "  ")
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
