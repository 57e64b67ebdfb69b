"""Merge: several consecutive parts' (or earlier runs') entries objects into one *run*, sorted by
order key, then part, then row, with a prefix index like a part's. With many parts the build
merges them, in as many rounds as needed, until at most `[build] merge_fan_in` runs are left;
then each order task reads its bucket from those runs instead of from every part, so the reads
of the order stage grow with the corpus, not with its square (docs/build.md, "merge").

A run numbers its parts from its own first part, so it depends on its inputs alone; whoever
reads it adds that part's ordinal. A merge task holds one key slice of its inputs at a time
(about SLICE_ENTRIES entries), never the inputs whole: the slices are key prefixes, read from
each input with its index, and written one after another; the ids go to a spool file beside
the output and follow the entries and the index, which is complete only once every slice is
written.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from prep.errors import IntegrityError
from prep.hashing import Digest, HashingWriter
from prep.workfiles.entries import (
    INDEXED,
    EntryFile,
    concat_numbered,
    descriptor,
    entries_head,
    index_bits_for,
    key_order,
    regroup_ids,
    spanned,
    take_entries,
)
from prep.workfiles.intermediate import io_errors
from prep.workfiles.keys import bucket_of

SLICE_ENTRIES = 1 << 18
"""About how many entries a merge task holds at once (some 50 MB while sorting them)."""


def slice_bits_for(count: int, index_bits: int, slice_entries: int = SLICE_ENTRIES) -> int:
    """How many key-prefix bits cut `count` entries into slices of about `slice_entries` (keys
    are uniform), never finer than the output's index."""
    slices = -(-count // max(1, slice_entries))
    return min(index_bits, max(0, slices - 1).bit_length())


def read_slice(inputs: Sequence[tuple[EntryFile, int, int]], prefix: int, bits: int) -> tuple[np.ndarray, bytes]:
    """The entries of key prefix `prefix` (of `bits` bits) of every input (file, descriptor, its
    first part's ordinal within the run), in key order then (part, row), and their ids in that order."""
    gathered, blob = concat_numbered((first_part, source, *source.read_bucket(prefix, bits, fd))
                                     for source, fd, first_part in inputs)
    return regroup_ids(take_entries(gathered, key_order(gathered)), blob)


def merge_runs(inputs: Sequence[tuple[Path, int]], out_path: Path,
               slice_entries: int = SLICE_ENTRIES) -> tuple[Digest, dict[str, Any]]:
    """Merge entries objects of kind part or run, each with its first part's ordinal counted from
    the first input's (0), into one run at `out_path`; returns its digest and summary. The
    inputs must be consecutive in input order: ties between equal keys go to the lower part."""
    with ExitStack() as stack:
        opened = []
        for path, first_part in inputs:
            fd = stack.enter_context(descriptor(path))
            source = EntryFile.open(path, fd)
            if source.header.get("kind") not in INDEXED:
                raise IntegrityError(f"{path}: a {source.header.get('kind')} entries object cannot be merged")
            opened.append((source, fd, first_part))
        count = sum(int(source.header["count"]) for source, _, _ in opened)
        parts = max((first + int(source.header.get("parts", 1)) for source, _, first in opened), default=0)
        bits = index_bits_for(count)
        # Reads of the inputs raise errors naming their own files (EntryFile): OSErrors here are writes.
        stack.enter_context(io_errors("writing", out_path))
        spool = stack.enter_context(open(out_path.with_name(out_path.name + ".ids"), "w+b"))
        stack.callback(os.unlink, spool.name)
        with HashingWriter(out_path, durable=False) as out:
            out.write(entries_head({"schema": "prep.entries/1", "kind": "run", "index_bits": bits, "parts": parts,
                                    "count": count}))
            counts = _write_slices(opened, bits, slice_bits_for(count, bits, slice_entries), out, spool)
            if int(counts.sum()) != count:
                raise IntegrityError(f"{out_path}: merging {len(inputs)} entries objects gave {int(counts.sum())} "
                                     f"entries, their headers say {count}")
            index = np.zeros(len(counts) + 1, dtype=f"<u{INDEXED['run']}")
            np.cumsum(counts, out=index[1:])
            out.write(index.tobytes())
            spool.seek(0)
            shutil.copyfileobj(spool, out, 1 << 20)
        digest = out.close()
    return digest, {"documents": count, "parts": parts, "inputs": len(inputs)}


def _write_slices(opened: Sequence[tuple[EntryFile, int, int]], bits: int, slice_bits: int, out: HashingWriter,
                  spool: Any) -> np.ndarray:
    """Write every key slice's entries to `out` and their ids to `spool` (offsets run on across
    slices); returns the entries counted by `bits`-bit key prefix."""
    counts = np.zeros(1 << bits, dtype=np.int64)
    width = 1 << (bits - slice_bits)  # index prefixes per slice
    written_ids = 0
    for prefix in range(1 << slice_bits):
        entries, ids = read_slice(opened, prefix, slice_bits)
        if not len(entries):
            continue
        entries["id_offset"][spanned(entries)] += np.uint64(written_ids)
        out.write(entries.view(np.uint8).data)
        spool.write(ids)
        written_ids += len(ids)
        within = bucket_of(entries["key_hi"], bits) - prefix * width
        if within.min() < 0 or within.max() >= width:  # an input's index disagrees with its keys
            raise IntegrityError(f"an entries object's index puts keys outside key slice {prefix} of {1 << slice_bits}")
        counts[prefix * width:(prefix + 1) * width] += np.bincount(within, minlength=width)
    return counts

