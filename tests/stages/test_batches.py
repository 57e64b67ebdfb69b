"""read_batches (columns, JSON Lines through Arrow's block parser) reads exactly what the per-line
reader read_documents reads: the same documents, bad records and messages, in the same order,
whatever the lines hold, the task's byte range or the block size."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import prep.inputs.lines as line_reader
import prep.stages.batches as batches_module
import prep.stages.jsonblocks as jsonblocks
import prep.stages.read as read
from prep.inputs.sources import discover, hash_source
from prep.stages.batches import read_batches
from prep.stages.read import BadRecord, Document, ReadTask, plan_read_tasks, read_documents
from prep.stages.textcolumns import TextColumns
from prep.workfiles.columns import to_strings
from tests.helpers import make_records

RECORDS = make_records(40, seed=11)

# Lines on which Arrow's parser and json disagree, or that json reads in its own way.
HAZARDS = [
    b"", b"   ", b"\x0c", b'{"text": 5, "id": "n"}', b"not json", b'{"text": "\\ud800 lone", "id": "s"}',
    b'{"id": "x"}', b'{"text": null, "id": "n"}', b'{"text": "a", "text": "b", "id": "dup"}',
    b'{"text": "a", "id": "1", "x": "\xff"}', b'{"text": "a", "id": "2", "x": "\xed\xa0\x80"}',
    b'\xef\xbb\xbf{"text": "bom", "id": "b"}', b'{"text": "two", "id": "t1"} {"text": "objs", "id": "t2"}',
    b'{"text": "deep", "id": "d", "x": ' + b"[" * 150 + b"]" * 150 + b"}",
    b'{"text": "deeper", "id": "e", "x": ' + b"[" * 1200 + b"]" * 1200 + b"}",
    b"[1, 2]", b'"just a string"', b'{"text": "nan", "id": "f", "x": NaN}', b'{"text": "x", "id": 7}',
    b'{"text": "x", "id": 1.5}', b'{"text": "x", "id": true}', b'{"text": "x", "id": 123456789012345678901234567890}',
    b'{"text": "crlf", "id": "c"}\r', b'{"text": "a\\u0000b\\u2028", "id": "u"}', b'{"text": "x", "id": -0}',
    b'{"text": "tab\tinside", "id": "t"}', b'{"text": "x", "id": "1",}', b'{"meta": {"text": 1}, "text": "ok", "id": "m"}',
    b'{"\\u0074ext": "escaped key", "id": "k"}', b'{"text": "\xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80", "id": "w"}',
    b'{"text": "long int", "id": "L", "x": ' + b"9" * 5000 + b"}", b'{"text": "x", "id": -' + b"9" * 4301 + b"}",
]


def _flatten(items: list[TextColumns | BadRecord]) -> list[Document | BadRecord]:
    """The batches' documents and the bad records, in the order read_documents gives them."""
    found: list[Document | BadRecord] = []
    for item in items:
        if isinstance(item, BadRecord):
            found.append(item)
            continue
        texts = item.texts()
        found.extend(Document(int(row), doc_id, texts[i], item.data(i))
                     for i, (row, doc_id) in enumerate(zip(item.rows.tolist(), to_strings(item.ids))))
    return found


def _tasks(tmp_path: Path, data: bytes, id_field: str | None = "id", name: str = "f.jsonl") -> list[ReadTask]:
    (tmp_path / name).write_bytes(data)
    return plan_read_tasks(hash_source(discover((name,), tmp_path, "auto")[0]), "text", id_field)


def _assert_same(task: ReadTask, limits: tuple[int, int] = (7, 300)) -> list[TextColumns | BadRecord]:
    stats_one: dict[str, int] = {}
    stats_batched: dict[str, int] = {}
    expected = list(read_documents(task, stats_one))
    batches = list(read_batches(task, stats_batched, *limits))
    found = _flatten(batches)
    assert [d for d in found if isinstance(d, Document)] == [d for d in expected if isinstance(d, Document)]
    assert [b for b in found if isinstance(b, BadRecord)] == [b for b in expected if isinstance(b, BadRecord)]
    assert stats_batched == stats_one
    for at, item in enumerate(batches):  # no batch before a bad record holds a document read after it
        if isinstance(item, BadRecord):
            assert all(int(b.rows[-1]) < item.row for b in batches[:at] if isinstance(b, TextColumns))
    for batch in batches:
        if isinstance(batch, TextColumns):
            assert 0 < len(batch) <= limits[0]
            assert int(batch.offsets[-2]) < limits[1]  # the bytes before the document that closed it
    return batches


@pytest.fixture(params=["fast", "json"])
def json_parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The per-line fallback with the optional fast parser (when installed), then with json alone."""
    if request.param == "fast":
        pytest.importorskip("simdjson")
    else:
        monkeypatch.setattr(read, "fast_line_parser", lambda: None)
    return str(request.param)


@pytest.mark.parametrize("limits", [(1, 1 << 20), (3, 1 << 20), (1000, 50), (1000, 1 << 20)])
def test_batches_hold_the_same_documents_and_bad_records(tmp_path: Path, json_parser: str,
                                                         limits: tuple[int, int]) -> None:
    """A bad record comes as soon as it is read; batches close where the per-document rule closes them."""
    lines = [json.dumps(r, ensure_ascii=False).encode() for r in RECORDS[:12]]
    lines[3:3] = HAZARDS
    batches = _assert_same(_tasks(tmp_path, b"\n".join(lines) + b"\n\n")[0], limits)
    assert sum(isinstance(item, BadRecord) for item in batches) >= 10


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(picks=st.lists(st.one_of(st.integers(0, len(HAZARDS) - 1), st.integers(100, 139)), max_size=40),
       block=st.sampled_from([16, 64, 200, 1 << 20]), range_bytes=st.sampled_from([50, 333, 1 << 20]),
       id_field=st.sampled_from(["id", None]), final_newline=st.booleans())
def test_any_lines_read_as_the_per_line_reader_reads_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         picks: list[int], block: int, range_bytes: int,
                                                         id_field: str | None, final_newline: bool) -> None:
    """Clean and hazardous lines mixed, split into byte ranges and into blocks smaller than a line."""
    lines = [HAZARDS[i] if i < 100 else json.dumps(RECORDS[i - 100], ensure_ascii=i % 2 == 0).encode() for i in picks]
    data = b"\n".join(lines) + (b"\n" if final_newline else b"")
    monkeypatch.setattr(jsonblocks, "BLOCK_BYTES", block)
    monkeypatch.setattr(read, "RANGE_BYTES", range_bytes)
    for task in _tasks(tmp_path, data, id_field):
        _assert_same(task)


def test_clean_blocks_skip_the_per_line_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ordinary lines, string or integer ids, are read by Arrow alone (the fast path is really taken)."""
    records = [{"text": r["text"], "id": i if i % 50 else str(i), "meta": {"n": [i]}} for i, r in enumerate(RECORDS)]
    plain = b"".join(json.dumps(r).encode() + b"\n" for r in records[1:49])
    expected_lines = [json.dumps(r).encode() for r in records[1:49]]

    def refuse(*args: object) -> None:
        raise AssertionError("the per-line reader was used")

    monkeypatch.setattr(jsonblocks, "line_rows", refuse)
    task = _tasks(tmp_path, plain)[0]
    found = _flatten(list(read_batches(task, {}, 1000, 1 << 20)))
    assert [(d.id, d.text) for d in found if isinstance(d, Document)] == [
        (str(json.loads(line)["id"]), json.loads(line)["text"]) for line in expected_lines]


def _count_per_line_blocks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of lines of each block the block reader hands to the per-line reader, as it goes."""
    used: list[int] = []
    original = read.line_rows

    def spy(task: ReadTask, parse: object, lines: list[bytes], first_local: int = 0) -> object:
        used.append(len(lines))
        return original(task, parse, lines, first_local)  # type: ignore[arg-type]

    monkeypatch.setattr(jsonblocks, "line_rows", spy)
    return used


def test_a_bad_line_sends_only_its_block_to_the_per_line_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = [json.dumps(r).encode() for r in RECORDS]
    data = b"\n".join(good[:20] + [b"not json"] + good[20:]) + b"\n"
    used = _count_per_line_blocks(monkeypatch)
    monkeypatch.setattr(jsonblocks, "BLOCK_BYTES", 400)
    _assert_same(_tasks(tmp_path, data)[0])
    assert len(used) == 1 and used[0] < len(good) // 2


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=25),
       trailing_newline=st.booleans(), cuts=st.lists(st.integers(0, 800), max_size=5),
       block=st.sampled_from([1, 7, 64, 1 << 20]))
def test_line_blocks_hold_the_lines_of_their_range(lines: list[bytes], trailing_newline: bool, cuts: list[int],
                                                   block: int) -> None:
    """iter_line_blocks gives exactly iter_lines_in_range's lines, each block whole lines."""
    data = b"\n".join(lines) + (b"\n" if trailing_newline and lines else b"")
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    for start, end in zip(bounds, bounds[1:]):
        items = list(line_reader.iter_line_blocks(io.BytesIO(data), start, end, block))
        blocks = [item for item in items if isinstance(item, bytes)]
        assert len(blocks) == len(items), "no bound, no long line"
        assert all(b.endswith(b"\n") for b in blocks[:-1])
        joined = b"".join(blocks)
        found = joined.split(b"\n") if joined else []
        if joined.endswith(b"\n"):
            found.pop()
        assert found == list(line_reader.iter_lines_in_range(io.BytesIO(data), start, end))


def test_rebatch_cuts_where_the_per_document_rule_cuts() -> None:
    from prep.stages.textcolumns import rebatch

    rng = np.random.default_rng(5)
    texts = [bytes(rng.integers(97, 123, size=int(n), dtype=np.uint8)) for n in rng.integers(0, 40, size=300)]
    chunks: list[TextColumns | BadRecord] = []
    at = 0
    for size in rng.integers(1, 50, size=100).tolist():
        part = texts[at:at + size]
        chunks.append(TextColumns.from_rows(range(at, at + len(part)), [None] * len(part), part))
        at += len(part)
        if at >= len(texts):
            break
    for max_documents, max_bytes in [(1, 10**6), (5, 10**6), (1000, 1), (1000, 100), (13, 77)]:
        expected, batch, size = [], [], 0
        for index, text in enumerate(texts[:at]):
            batch.append(index)
            size += len(text)
            if size >= max_bytes or len(batch) >= max_documents:
                expected.append(batch)
                batch, size = [], 0
        expected += [batch] if batch else []
        found = [b.rows.tolist() for b in rebatch(chunks, max_documents, max_bytes) if isinstance(b, TextColumns)]
        assert found == expected


@settings(max_examples=300, deadline=None)
@given(data=st.lists(st.sampled_from([0x41, 0x00, 0x7F, 0x80, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xED, 0xEF, 0xF0,
                                      0xF4, 0xF5, 0xFF, 0xA0, 0x9F, 0x8F, 0x90]), max_size=12).map(bytes))
def test_utf8_validation_agrees_with_python(data: bytes) -> None:
    try:
        data.decode("utf-8")
        valid = True
    except UnicodeDecodeError:
        valid = False
    assert jsonblocks.valid_utf8(data) is valid


def _invalid_utf8_strings(values: list[bytes]) -> pa.Array:
    offsets = np.cumsum([0] + [len(v) for v in values]).astype("<i4")
    return pa.Array.from_buffers(pa.string(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))])


@pytest.mark.parametrize("kind", ["strings", "nulls", "integer ids", "float ids", "large strings", "bad utf8"])
def test_parquet_batches_match_its_documents(tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Record batches whose values are all usable are taken as columns, the others document by document."""
    texts: pa.Array = pa.array([r["text"] for r in RECORDS])
    ids: pa.Array = pa.array([r["id"] for r in RECORDS])
    if kind == "nulls":
        texts = pa.array([r["text"] for r in RECORDS[:-1]] + [None])
    elif kind == "integer ids":
        ids = pa.array(list(range(-3, len(RECORDS) - 3)), pa.int64())
    elif kind == "float ids":
        ids = pa.array([i + 0.5 for i in range(len(RECORDS))])
    elif kind == "large strings":
        texts = texts.cast(pa.large_string())
    elif kind == "bad utf8":
        texts = _invalid_utf8_strings([r["text"].encode() for r in RECORDS[:-1]] + [b"bad \xff here"])
    pq.write_table(pa.table({"text": texts, "id": ids}), tmp_path / "t.parquet", row_group_size=7)
    source = hash_source(discover(("t.parquet",), tmp_path, "auto")[0])
    taken: list[int] = []
    original = read.batch_documents

    def spy(task: ReadTask, batch: pa.RecordBatch, first_row: int) -> object:
        taken.append(first_row)
        return original(task, batch, first_row)

    monkeypatch.setattr(batches_module, "batch_documents", spy)
    for task in plan_read_tasks(source, "text", "id"):
        batches = _assert_same(task, (5, 1 << 20))
        if kind == "bad utf8":  # a bad record naming its row, skippable like any other
            bad = [item for item in batches if isinstance(item, BadRecord)]
            assert bad == [BadRecord(len(RECORDS) - 1, "text field 'text' is not valid UTF-8 (byte 4)")]
    assert taken == {"strings": [], "integer ids": [], "large strings": [], "nulls": [0],
                     "float ids": [0], "bad utf8": [0]}[kind]


def _depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


_TRICKY = st.text(alphabet='ab{}[]"\\\\/\n', max_size=8)
_JSON = st.recursive(st.none() | st.integers() | _TRICKY,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TRICKY, inner, max_size=3),
                     max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(value=st.dictionaries(_TRICKY, _JSON, max_size=4), ascii_only=st.booleans())
def test_nesting_depth_ignores_brackets_in_strings(value: dict[str, object], ascii_only: bool) -> None:
    line = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert jsonblocks.nesting_depth(np.frombuffer(line, dtype=np.uint8)) == _depth(value)


def test_long_documents_full_of_brackets_stay_on_the_fast_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Code-like texts hold hundreds of brackets; only real nesting sends a block line by line."""
    code = "int main() { if (a[1]) { return b[2]; } }\n" * 200
    lines = [json.dumps({"id": str(i), "text": code + str(i), "meta": [[1]]}).encode() for i in range(30)]

    def refuse(*args: object) -> None:
        raise AssertionError("the per-line reader was used")

    monkeypatch.setattr(jsonblocks, "line_rows", refuse)
    monkeypatch.setattr(jsonblocks, "LONG_LINE_BYTES", 1 << 20)  # Arrow even for long lines
    _assert_same(_tasks(tmp_path, b"\n".join(lines) + b"\n")[0], (1000, 1 << 20))


def test_blocks_of_long_lines_go_line_by_line_with_simdjson(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("simdjson")
    used = _count_per_line_blocks(monkeypatch)
    long_lines = [json.dumps({"id": str(i), "text": "word " * 400}).encode() for i in range(20)]
    _assert_same(_tasks(tmp_path, b"\n".join(long_lines) + b"\n")[0], (1000, 1 << 20))
    assert used == [20]


def test_an_integer_too_long_for_int_is_read_in_any_block(tmp_path: Path, json_parser: str) -> None:
    """json.loads refuses integers over 4,300 digits, which Arrow's block reader takes in a field it
    skips: the line was a document in a clean block and a bad record in any other."""
    long_int = b"9" * 5000
    clean = [b'{"text": "a", "id": "1"}', b'{"text": "b", "id": "2", "x": ' + long_int + b"}",
             b'{"text": "c", "id": ' + long_int + b"}"]
    for lines in (clean, clean + [b"not json"]):
        [task] = _tasks(tmp_path, b"\n".join(lines) + b"\n")
        found = _flatten(_assert_same(task))
        assert [(d.id, d.text) for d in found if isinstance(d, Document)] == [("1", "a"), ("2", "b"), ("9" * 5000, "c")]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"\xef", b"\xbb", b"\xbf", b"\xef\xbb\xbf", b"a", b"\n", b"\xef\xbc\x8c"]), max_size=12))
def test_the_bom_search_finds_what_bytes_finds(pieces: list[bytes]) -> None:
    """numpy's search for a BOM (first byte, then the next two) agrees with `in` on bytes, at any
    position, split or not, and beside other characters that start with its first byte."""
    data = b"".join(pieces)
    assert jsonblocks._has_bom(np.frombuffer(data, dtype=np.uint8)) is (b"\xef\xbb\xbf" in data)


def _openings_expected(block: bytes) -> list[int] | None:
    """Each line's `{` and `[` when every line is valid UTF-8 without a BOM and has a `{`, spelled plainly."""
    if b"\xef\xbb\xbf" in block or not jsonblocks.valid_utf8(block):
        return None
    lines = block.split(b"\n") if block else []  # an empty block has no line to count (Arrow then reads no row)
    lines = lines[:-1] if block.endswith(b"\n") else lines
    if not all(b"{" in line for line in lines):
        return None
    return [line.count(b"{") + line.count(b"[") for line in lines]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b'{"text": "a"}', b'  {"text": "[{"}', b"[1]", b"", b'\t{"x": [[1]]}',
                                 b'{"t": "\xef\xbb\xbf"}', b'{"t": "\xc3\xa9"}', b"{\xff}"]), min_size=1, max_size=8),
       st.booleans())
def test_a_block_is_taken_only_when_every_line_holds_an_object(lines: list[bytes], newline_at_end: bool) -> None:
    """Lines starting with `{` are not counted twice; any other line (blank, an array, `{` after
    white space) is counted, and a block with a line without `{` is refused."""
    block = b"\n".join(lines) + (b"\n" if newline_at_end else b"")
    bounds = jsonblocks._line_bounds(np.frombuffer(block, dtype=np.uint8))
    found = jsonblocks._object_lines(block, bounds)
    assert (None if found is None else found.tolist()) == _openings_expected(block)
