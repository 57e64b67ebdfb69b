"""The per-shard metadata file beside a Megatron `.bin` (`bin/<shard>.metadata.parquet`), written
only in a build with metadata fields: one row per document in the `.bin`'s order.

Columns: `id` (the document's id, or `<source>:<line>` as its `.json` member names it), then one
per metadata key of the build, in the build's key order, each value the JSON text of the
document's value for that key (prep.formats.jsonspelling spells it), null when the document has none.
JSON text rather than typed columns: a key's values may have any JSON type, and mixed types in
one column would need a type chosen from the values a shard happens to hold, so two shards
(or two builds cutting shards differently) could type one key two ways.

The bytes follow from the rows and WRITER_OPTIONS, every writer option pyarrow has pinned here
(no compression, dictionary, statistics, page index or checksums, no Arrow schema), row groups
of exactly ROW_GROUP_ROWS rows (the last fewer) however the rows arrive, and pyarrow's own
version, which the file names in its `created_by` and which every manifest's code identity
records (prep.code.BYTE_SHAPING_DEPENDENCIES).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ID_COLUMN = "id"
ROW_GROUP_ROWS = 1 << 16
WRITER_OPTIONS: MappingProxyType[str, Any] = MappingProxyType({
    "version": "2.6", "use_dictionary": False, "compression": "none", "write_statistics": False,
    "data_page_version": "1.0", "data_page_size": 1 << 20, "write_batch_size": 1024, "store_schema": False,
    "write_page_index": False, "write_page_checksum": False, "use_byte_stream_split": False,
    "use_compliant_nested_type": True, "use_content_defined_chunking": False, "dictionary_pagesize_limit": 1 << 20,
    "max_rows_per_page": 20000,
})
"""Every ParquetWriter option that could change the bytes, pinned (defaults change between versions);
an older pyarrow that lacks one is given the others (the bytes follow the version anyway)."""


@functools.cache
def writer_options() -> dict[str, Any]:
    """WRITER_OPTIONS this pyarrow's ParquetWriter takes (`data_page_size` goes through its **options)."""
    known = set(inspect.signature(pq.ParquetWriter.__init__).parameters) | {"data_page_size"}
    return {name: value for name, value in WRITER_OPTIONS.items() if name in known}


def schema(keys: tuple[str, ...]) -> pa.Schema:
    """The file's schema: the id, then a nullable string per metadata key."""
    if ID_COLUMN in keys:
        raise ValueError(f"a metadata key may not be {ID_COLUMN!r}: the sidecar's first column is the document id")
    return pa.schema([pa.field(ID_COLUMN, pa.string(), nullable=False),
                      *(pa.field(key, pa.string()) for key in keys)])


def columns(ids: list[str], metadata: Iterable[bytes], keys: tuple[str, ...]) -> dict[str, list[str | None]]:
    """The rows of some documents as columns: ids, then each key's JSON text per document;
    ValueError for metadata holding a key the build does not declare."""
    values: dict[str, list[str | None]] = {key: [] for key in keys}
    for document in metadata:
        found = dict(members(document.decode("utf-8", "surrogatepass")))
        unknown = set(found) - set(values)
        if unknown:
            raise ValueError(f"a document's metadata has key {sorted(unknown)[0]!r}, which the build does not declare")
        for key, column in values.items():
            column.append(found.get(key))
    return {ID_COLUMN: list(ids), **values}


_DECODER = json.JSONDecoder()


def members(spelled: str) -> Iterator[tuple[str, str]]:
    """Each key of a metadata object in the metadata spelling, with its value's text as it is spelled
    there: the spelling of the value itself, since the object's is the spelling of its members
    joined (no parse and spell again)."""
    at = 1
    if spelled[at:] == "}":
        return
    while True:
        key, end = _DECODER.raw_decode(spelled, at)
        _, after = _DECODER.raw_decode(spelled, end + 1)  # past the ":"
        yield str(key), spelled[end + 1:after]
        if spelled[after] == "}":
            return
        at = after + 1  # past the ","


class SidecarWriter:
    """Writes one shard's metadata file front to back, rows in batches of any size, row groups of
    exactly ROW_GROUP_ROWS."""

    def __init__(self, path: Path, keys: tuple[str, ...]) -> None:
        self.schema = schema(keys)
        self.keys = keys
        self._writer = pq.ParquetWriter(str(path), self.schema, **writer_options())
        self._pending: list[pa.Table] = []
        self._rows = 0

    def write(self, ids: list[str], metadata: Iterable[bytes]) -> None:
        """Append these documents' rows (their ids and metadata objects, in order)."""
        table = pa.table(columns(ids, metadata, self.keys), schema=self.schema)
        self._pending.append(table)
        self._rows += table.num_rows
        if self._rows >= ROW_GROUP_ROWS:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        pending = pa.concat_tables(self._pending) if self._pending else self.schema.empty_table()
        whole = pending.num_rows if final else pending.num_rows - pending.num_rows % ROW_GROUP_ROWS
        for start in _starts(whole):
            self._writer.write_table(pending.slice(start, min(ROW_GROUP_ROWS, whole - start)),
                                     row_group_size=ROW_GROUP_ROWS)
        rest = pending.slice(whole)
        self._pending, self._rows = ([rest] if rest.num_rows else []), rest.num_rows

    def close(self) -> None:
        """Write the rows left (a last, smaller row group) and the footer."""
        self._flush(final=True)
        self._writer.close()

    def abort(self) -> None:
        """Close without finishing the rows (the caller removes the file)."""
        self._writer.close()


def _starts(rows: int) -> Iterator[int]:
    return iter(range(0, rows, ROW_GROUP_ROWS))
