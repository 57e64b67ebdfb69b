"""The `.json` members of WebDataset samples, many documents at once (one `wds.sample_json`
each, vectorized): digits with numpy, every member assembled from pieces by one gather."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from prep.formats import wds
from prep.stages.specs import Part, ShardParts
from prep.workfiles.columns import join_pieces
from prep.workfiles.entries import NO_ID, metadata_spans


@dataclass(frozen=True)
class PartNames:
    """Every part's line offset and source (an index into `sources`): what `.json` members name."""

    line_offsets: np.ndarray
    source_of: np.ndarray
    sources: tuple[str, ...]

    @classmethod
    def of(cls, table: ShardParts) -> PartNames:
        """The names of a shard job's packed part table."""
        return cls(np.frombuffer(table.line_offsets, dtype="<i8").astype(np.int64),
                   np.frombuffer(table.source_of, dtype="<u4").astype(np.int64), table.sources)

    @classmethod
    def of_parts(cls, parts: Sequence[Part]) -> PartNames:
        """The names of these parts, each source listed once."""
        numbered: dict[str, int] = {}
        source_of = [numbered.setdefault(part.source, len(numbered)) for part in parts]
        return cls(np.asarray([part.line_offset for part in parts], dtype=np.int64),
                   np.asarray(source_of, dtype=np.int64), tuple(numbered))


def sample_jsons(entries: np.ndarray, ids: bytes, names: PartNames,
                 with_metadata: bool = False) -> tuple[bytes, np.ndarray]:
    """Each document's `.json` member (id or source:line, source, line, tokens with EOS, and
    `with_metadata` its metadata), one after another, and their offsets (one `wds.sample_json` per
    document, vectorized). Only the sources these documents name are encoded: a corpus may have
    hundreds of thousands."""
    part = entries["part"].astype(np.int64)
    lines = names.line_offsets[part] + entries["row"].astype(np.int64) + 1  # record_line: offset + row + 1
    used, source_of = np.unique(names.source_of[part], return_inverse=True)
    has_id = entries["id_len"] != NO_ID
    return sample_members(ids, entries["id_offset"].astype(np.int64), np.where(has_id, entries["id_len"], 0),
                          has_id, [names.sources[at] for at in used.tolist()], source_of.reshape(-1), lines,
                          entries["n_tokens"].astype(np.int64) + 1,
                          metadata_spans(entries) if with_metadata else None)


def document_metadata(entries: np.ndarray, ids: bytes) -> tuple[bytes, np.ndarray]:
    """Each document's metadata (compact JSON, UTF-8), one after another, and their n + 1 offsets."""
    starts, lengths = metadata_spans(entries)
    return join_pieces(np.frombuffer(ids, dtype=np.uint8), starts[:, None], lengths[:, None])


def document_ids(entries: np.ndarray, ids: bytes, names: PartNames) -> tuple[bytes, np.ndarray]:
    """Each document's id as UTF-8 (`<source>:<line>` when it has none), one after another, and
    their n + 1 offsets: the ids the `.json` members name (vectorized, as `sample_members`)."""
    part = entries["part"].astype(np.int64)
    lines = names.line_offsets[part] + entries["row"].astype(np.int64) + 1
    used, source_of = np.unique(names.source_of[part], return_inverse=True)
    sources = [names.sources[at].encode("utf-8", "surrogatepass") + b":" for at in used.tolist()]
    digits, widths = wds.decimal_digits(lines)
    pieces = [ids, b"".join(sources), digits.tobytes()]
    bases = np.cumsum([0] + [len(piece) for piece in pieces])
    source_at = bases[1] + np.cumsum([0] + [len(source) for source in sources])[source_of.reshape(-1)]
    source_len = np.asarray([len(source) for source in sources] or [0], dtype=np.int64)[source_of.reshape(-1)]
    missing = entries["id_len"] == NO_ID
    line_at = bases[2] + (np.arange(len(entries), dtype=np.int64) + 1) * wds.DECIMAL_WIDTH - widths
    starts = np.stack([np.where(missing, source_at, entries["id_offset"].astype(np.int64)), line_at], axis=1)
    lengths = np.stack([np.where(missing, source_len, entries["id_len"].astype(np.int64)),
                        np.where(missing, widths, 0)], axis=1)
    pool = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    return join_pieces(pool, starts.astype(np.int64), lengths.astype(np.int64))


_QUOTE, _BACKSLASH, _SPACE = 0x22, 0x5C, 0x20
_json_string = json.encoder.encode_basestring


def _plain_strings(blob: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Whether each UTF-8 string `blob[start:start + length]` is its own JSON string body, i.e.
    holds no byte `encode_basestring` escapes (a quote, a backslash, a control character)."""
    begin = np.asarray(starts, dtype=np.int64)
    end = begin + np.asarray(lengths, dtype=np.int64)
    special = np.zeros(len(blob) + 1, dtype=np.int64)
    np.cumsum((blob < _SPACE) | (blob == _QUOTE) | (blob == _BACKSLASH), out=special[1:])
    return np.asarray(special[end] == special[begin])


def sample_members(ids: bytes, id_starts: np.ndarray, id_lengths: np.ndarray, has_id: np.ndarray,
                   sources: list[str], source_of: np.ndarray, lines: np.ndarray, tokens: np.ndarray,
                   metadata: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[bytes, np.ndarray]:
    """`wds.sample_json(id or f"{source}:{line}", source, line, tokens, metadata)` of many documents
    at once: document i's id is `ids[id_starts[i]:...]` (UTF-8) when `has_id[i]`, its source
    `sources[source_of[i]]`, its metadata (when given as (starts, lengths)) `ids[starts[i]:...]`.
    Returns the members one after another and their n + 1 offsets. Ids that need escaping are
    spelled by `_json_string` itself."""
    count = len(np.asarray(lines))
    starts, lengths = np.asarray(id_starts, dtype=np.int64), np.asarray(id_lengths, dtype=np.int64)
    present, part = np.asarray(has_id, dtype=bool), np.asarray(source_of, dtype=np.int64)
    raw = np.frombuffer(ids, dtype=np.uint8)
    plain = present & _plain_strings(raw, np.where(present, starts, 0), np.where(present, lengths, 0))
    escaped = np.flatnonzero(present & ~plain)
    extra = [_json_string(ids[int(starts[i]):int(starts[i] + lengths[i])].decode("utf-8")).encode() for i in escaped]
    quoted = [_json_string(source).encode() for source in sources]
    consts = [b'{"id":', b'"', b":", b',"line":', b',"source":', b',"tokens":', b"}", b',"metadata":']
    line_digits, line_widths = wds.decimal_digits(lines)
    token_digits, token_widths = wds.decimal_digits(tokens)
    pieces = [b"".join(consts), b"".join(quoted), ids, b"".join(extra), line_digits.tobytes(), token_digits.tobytes()]
    bases = np.cumsum([0] + [len(piece) for piece in pieces])
    at = np.cumsum([0] + [len(c) for c in consts])  # where each constant is in the pool
    source_at = bases[1] + np.cumsum([0] + [len(q) for q in quoted])[part]
    source_len = np.asarray([len(q) for q in quoted] or [0], dtype=np.int64)[part]
    extra_at = np.zeros(count, dtype=np.int64)
    extra_len = np.zeros(count, dtype=np.int64)
    extra_at[escaped] = bases[3] + np.cumsum([0] + [len(e) for e in extra])[:-1]
    extra_len[escaped] = [len(e) for e in extra]
    rows = np.arange(count, dtype=np.int64) * wds.DECIMAL_WIDTH + wds.DECIMAL_WIDTH
    line_at, token_at = bases[4] + rows - line_widths, bases[5] + rows - token_widths
    missing = ~present
    # Per document: {"id":  open  body  line-if-missing  close  ,"line":  N  ,"source":  S  ,"tokens":  T  }
    table = [
        (np.full(count, at[0]), np.full(count, len(consts[0]))),
        (np.select([plain, missing], [np.full(count, at[1]), source_at], extra_at),
         np.select([plain, missing], [np.ones(count, np.int64), source_len - 1], extra_len)),
        (np.where(plain, bases[2] + starts, at[2]), np.select([plain, missing], [lengths, np.ones(count, np.int64)], 0)),
        (line_at, np.where(missing, line_widths, 0)),
        (np.full(count, at[1]), (plain | missing).astype(np.int64)),
        (np.full(count, at[3]), np.full(count, len(consts[3]))), (line_at, line_widths),
        (np.full(count, at[4]), np.full(count, len(consts[4]))), (source_at, source_len),
        (np.full(count, at[5]), np.full(count, len(consts[5]))), (token_at, token_widths),
        (np.full(count, at[6]), np.ones(count, np.int64)),
    ]
    if metadata is not None:  # ,"metadata":  M  between the line and the source
        table[7:7] = [(np.full(count, at[7]), np.full(count, len(consts[7]))), (bases[2] + metadata[0], metadata[1])]
    pool = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    return join_pieces(pool, np.stack([s for s, _ in table], axis=1).astype(np.int64),
                       np.stack([n for _, n in table], axis=1).astype(np.int64))
