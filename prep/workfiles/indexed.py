"""Indexed record objects: fixed-size records sorted by a u64 field, with a prefix index over its
top bits, so that any bucket of them is one read (the layout of a part's entries, for the bands
and drops objects of near-duplicate removal).

Layout: the head of `entries.object_head` (magic, header length, canonical JSON header with
`count` and `index_bits`), the index (`prefix_index`: 2**index_bits + 1 cumulative counts of
`width` bytes), then `count` records of the format's dtype, back to back, nothing after them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prep.errors import IntegrityError
from prep.hashing import Digest, HashingWriter
from prep.workfiles.entries import (
    bucket_prefixes,
    descriptor,
    index_bits_for,
    index_length,
    object_head,
    prefix_index,
    read_head,
    read_prefix_range,
    valid_index_bits,
)
from prep.workfiles.intermediate import io_errors, pread_into
from prep.workfiles.keys import bucket_of

MERGE_BYTES = 64 * 2**20
"""Records `merge_indexed` holds at once, over all its inputs."""
COPY_BYTES = 8 * 2**20


@dataclass(frozen=True)
class RecordFormat:
    """One kind of indexed record object: its magic, schema, record type, the u64 field records
    are sorted and indexed by (first of the sort), and the bytes of each index count."""

    magic: bytes
    schema: str
    dtype: np.dtype[Any]
    key: str
    width: int
    what: str


def write_indexed(path: Path, form: RecordFormat, records: np.ndarray, header: dict[str, Any]) -> Digest:
    """Write `records` (already sorted) as an indexed record object with `header`'s fields added."""
    if len(records) >= 1 << (8 * form.width):
        raise ValueError(f"{len(records)} records do not fit a {form.width}-byte index")
    bits = index_bits_for(len(records))
    head = {**header, "schema": form.schema, "count": len(records), "index_bits": bits}
    with io_errors("writing", path), HashingWriter(path, durable=False) as out:
        out.write(object_head(form.magic, head))
        out.write(prefix_index(records[form.key], bits, form.width).data)
        out.write(np.ascontiguousarray(records, dtype=form.dtype).view(np.uint8).data)
    return out.close()


@dataclass(frozen=True)
class IndexedFile:
    """An indexed record object opened for reading: its header and where its index and records start."""

    path: Path
    form: RecordFormat
    header: dict[str, Any]
    index_at: int
    records_at: int

    @classmethod
    def open(cls, path: Path, form: RecordFormat, fd: int | None = None) -> IndexedFile:
        """Read the header (through `fd` if given); IntegrityError when the file is not one of
        `form`, or its size is not what its header says."""
        header, start = read_head(path, form.magic, form.what, fd)
        if header.get("schema") != form.schema:
            raise IntegrityError(f"{path}: {form.what} of schema {header.get('schema')!r}, not {form.schema!r}")
        bits = valid_index_bits(header, path, form.what)
        opened = cls(path, form, header, start, start + index_length(bits, form.width))
        with descriptor(path, fd) as handle, io_errors("reading", path):
            size = os.fstat(handle).st_size
        if size != opened.records_at + header["count"] * form.dtype.itemsize:
            raise IntegrityError(f"{path}: {size} bytes, not the {form.what} its header says")
        return opened

    def read(self, first: int, count: int, fd: int | None = None) -> np.ndarray:
        """Records [first, first + count)."""
        if first < 0 or count < 0 or first + count > self.header["count"]:
            raise IntegrityError(f"{self.path}: records {first}..{first + count} out of range")
        records = np.empty(count, dtype=self.form.dtype)
        with descriptor(self.path, fd) as opened, io_errors("reading", self.path):
            done = pread_into(opened, records.view(np.uint8).data, self.records_at + first * self.form.dtype.itemsize)
        if done != records.nbytes:
            raise IntegrityError(f"{self.path}: shorter than its header says")
        return records

    def read_all(self, fd: int | None = None) -> np.ndarray:
        """Every record, checked sorted by the key field."""
        records = self.read(0, self.header["count"], fd)
        _check_sorted(self.path, records[self.form.key])
        return records

    def read_bucket(self, bucket: int, bits: int, fd: int | None = None) -> np.ndarray:
        """The records whose key's top `bits` bits are `bucket` (two index reads and one of the
        records); IntegrityError when what the index points at is not that bucket, sorted."""
        index_bits = int(self.header["index_bits"])
        prefixes = bucket_prefixes(bucket, bits, index_bits)
        first, end = read_prefix_range(self.path, self.index_at, self.form.width, self.header["count"], prefixes, fd)
        records = self.read(first, end - first, fd)
        keys = records[self.form.key]
        _check_sorted(self.path, keys)
        if len(keys) and not np.all((bucket_of(keys[[0, -1]], index_bits) >= prefixes[0]) &
                                    (bucket_of(keys[[0, -1]], index_bits) < prefixes[1])):
            raise IntegrityError(f"{self.path}: its index points outside bucket {bucket} of {2**bits}")
        if bits > index_bits:  # a coarser prefix: keep the bucket's own (one run, the keys being sorted)
            records = records[bucket_of(keys, bits) == bucket]
        return records


def _check_sorted(path: Path, keys: np.ndarray) -> None:
    """IntegrityError unless `keys` never decrease (a damaged record, most often)."""
    if len(keys) > 1 and bool((keys[1:] < keys[:-1]).any()):
        raise IntegrityError(f"{path}: its records are out of order")


def merge_indexed(paths: Sequence[Path], form: RecordFormat, order: tuple[str, ...], path: Path,
                  header: dict[str, Any]) -> Digest:
    """Write the records of the objects at `paths` (each sorted by the fields `order`, the key
    first; no record in two) as one object, byte for byte what `write_indexed` makes of all of
    them at once, holding MERGE_BYTES of records: merged into a scratch file beside `path` while
    the index is counted, then written after the head and index."""
    inputs = [IndexedFile.open(source, form) for source in paths]
    count = sum(int(opened.header["count"]) for opened in inputs)
    if count >= 1 << (8 * form.width):
        raise ValueError(f"{count} records do not fit a {form.width}-byte index")
    bits = index_bits_for(count)
    index = np.zeros((1 << bits) + 1, dtype=f"<u{form.width}")
    scratch = path.with_name(path.name + ".records")
    try:
        with io_errors("writing", scratch), open(scratch, "xb") as body:
            for chunk in _merged(inputs, order):
                index[1:] += np.bincount(bucket_of(chunk[form.key], bits), minlength=1 << bits).astype(index.dtype)
                body.write(chunk.view(np.uint8).data)
        np.cumsum(index, out=index)
        with io_errors("writing", path), HashingWriter(path, durable=False) as out, open(scratch, "rb") as body:
            out.write(object_head(form.magic, {**header, "schema": form.schema, "count": count, "index_bits": bits}))
            out.write(index.data)
            while block := body.read(COPY_BYTES):
                out.write(block)
        return out.close()
    finally:
        scratch.unlink(missing_ok=True)


def _merged(inputs: Sequence[IndexedFile], order: tuple[str, ...]) -> Iterator[np.ndarray]:
    """The records of `inputs` in `order`, a chunk at a time: each round takes from every input's
    held records those up to the first of the last records held of the inputs not read to their end."""
    chunk = max(1024, MERGE_BYTES // max(1, len(inputs)) // (inputs[0].form.dtype.itemsize if inputs else 1))
    read = [0] * len(inputs)
    held = [np.zeros(0, dtype=opened.form.dtype) for opened in inputs]
    last: np.ndarray | None = None
    while True:
        for at, opened in enumerate(inputs):
            if not len(held[at]) and read[at] < opened.header["count"]:
                held[at] = opened.read(read[at], min(chunk, opened.header["count"] - read[at]))
                read[at] += len(held[at])
                if len(held[at]) > 1 and not bool(_later(held[at][1:], held[at][:-1], order).all()):
                    raise IntegrityError(f"{opened.path}: its records are out of order or repeated")
        if not any(len(records) for records in held):
            return
        ends = [records[-1:] for at, records in enumerate(held) if read[at] < inputs[at].header["count"]]
        bound = _in_order(np.concatenate(ends), order)[:1] if ends else None
        taken = []
        for at, records in enumerate(held):
            cut = len(records) if bound is None else int(np.count_nonzero(~_later(records, bound, order)))
            taken.append(records[:cut])
            held[at] = records[cut:]
        merged = _in_order(np.concatenate(taken), order)
        following = merged if last is None else np.concatenate([last, merged])
        if len(following) > 1 and not bool(_later(following[1:], following[:-1], order).all()):
            raise IntegrityError(f"{inputs[0].path.parent}: two of the {inputs[0].form.what}s merged hold one record")
        last = following[-1:]
        yield merged


def _in_order(records: np.ndarray, order: tuple[str, ...]) -> np.ndarray:
    """`records` sorted by the fields `order`."""
    ordered: np.ndarray = records[np.lexsort(tuple(records[name] for name in reversed(order)))]
    return ordered


def _later(records: np.ndarray, than: np.ndarray, order: tuple[str, ...]) -> np.ndarray:
    """Whether each of `records` comes strictly after the one of `than` beside it (or its one
    record) by the fields `order`."""
    later = np.zeros(len(records), dtype=bool)
    tied = np.ones(len(records), dtype=bool)
    for name in order:
        later |= tied & (records[name] > than[name])
        tied &= records[name] == than[name]
    return later
