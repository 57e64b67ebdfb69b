"""The optional fast JSON parser (pysimdjson) changes no result: for any line, valid or not, the
reader yields the same Document or the same error as with json.loads alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import prep.stages.read as read
from prep.inputs.sources import SourceFile, discover, hash_source
from prep.stages.read import BadRecord, Document, ReadTask, plan_read_tasks, read_documents

pytest.importorskip("simdjson")


def _task(text_field: str = "text", id_field: str | None = "id") -> ReadTask:
    return ReadTask(SourceFile("a.jsonl", "a.jsonl", 0, "jsonl"), 0, 0, 0, text_field, id_field)


def _outcome(parse: Any, raw: bytes, task: ReadTask) -> Document | tuple[str, str]:
    """The line's Document, or the type and text of the error it raises."""
    try:
        return read._line_document(parse, raw, 7, task)
    except Exception as exc:  # noqa: BLE001 -- RecursionError too must be the same
        return type(exc).__name__, str(exc) if isinstance(exc, ValueError) else ""


def assert_same(raw: bytes, task: ReadTask) -> Document | tuple[str, str]:
    parse = read.fast_line_parser()
    assert parse is not None
    expected = _outcome(None, raw, task)
    assert _outcome(parse, raw, task) == expected
    return expected


# --- JSON text generated token by token: valid, or (wild) with anything JSON forbids ------------

ANY_CHAR = st.characters(exclude_categories=())  # every code point, lone surrogates included
TEXT_CHAR = st.one_of(st.characters(), st.sampled_from(["a", " ", "é", "\x00", "\x7f", "\u2028", "😀", '"', "\\", "/", "\n"]))
_SHORT = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str, how: int) -> str:
    """`char` escaped as \\uXXXX (how 1 lower, 2 upper hex; a surrogate pair for astral characters),
    with its short escape (3), raw where JSON allows it (0), or raw even where it does not (4)."""
    code = ord(char)
    if how in (1, 2):
        units = [code] if code < 0x10000 else [0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)]
        return "".join(f"\\u{unit:04x}" if how == 1 else f"\\u{unit:04X}" for unit in units)
    if how == 3 and char in _SHORT:
        return _SHORT[char]
    if how != 4 and (char in '"\\' or code < 0x20):
        return _SHORT.get(char, f"\\u{code:04x}")
    return char


def _strings(wild: bool) -> st.SearchStrategy[str]:
    chars = st.one_of(TEXT_CHAR, ANY_CHAR) if wild else TEXT_CHAR
    pieces = st.lists(st.tuples(chars, st.sampled_from([0, 0, 0, 1, 2, 3, 4] if wild else [0, 0, 0, 1, 2, 3])), max_size=12)
    valid = pieces.map(lambda items: '"' + "".join(_escape(char, how) for char, how in items) + '"')
    if not wild:
        return valid
    bad = st.sampled_from(['"\\x"', '"\\u12"', '"\\ud800"', '"\\udc00\\ud800"', '"a\\ud83d"', '"\\U0001f600"', '"\\', '"a'])
    return st.one_of(valid, valid, bad)


VALID_NUMBERS = st.one_of(
    st.integers().map(str),
    st.integers(-(10**40), 10**40).map(str),
    st.sampled_from(["-0", "0", "-0.0", "1e400", "-1e400", "1e-400", "5e-324", "1.7976931348623157e308", "9007199254740993",
                     "18446744073709551615", "18446744073709551616", "-9223372036854775808", "-9223372036854775809"]),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.from_regex(r"-?(0|[1-9][0-9]{0,25})(\.[0-9]{1,20})?([eE][-+]?[0-9]{1,4})?", fullmatch=True),
)
BAD_NUMBERS = st.sampled_from(["NaN", "Infinity", "-Infinity", "01", "1.", ".5", "+1", "-", "1e", "0x10", "1_000", "nan", "inf"])
VALID_SPACE = st.sampled_from(["", "", "", " ", "  ", "\t", "\r", " \r\n\t"])
BAD_SPACE = st.sampled_from(["\x0b", "\x0c", "\xa0", "\u3000"])


TASKS = st.sampled_from([_task(), _task(id_field=None), _task("t\u00e9xt", "meta"), _task("", "text")])


def _join(open_: str, close: str, items: list[str], spaces: list[str]) -> str:
    spaced = [spaces[i % len(spaces)] + item + spaces[(i + 1) % len(spaces)] for i, item in enumerate(items)]
    return open_ + ",".join(spaced) + close


@st.composite
def raw_lines(draw: st.DrawFn) -> tuple[bytes, ReadTask]:
    """A JSON Lines line as UTF-8 and a task to read it: a record, valid but for at most one kind of
    wildness: tokens JSON forbids (lone surrogates become invalid UTF-8), text before or after the
    value, a value that is not an object, or a changed byte."""
    wild = draw(st.sampled_from(["", "", "", "", "", "tokens", "tokens", "prefix", "suffix", "value", "byte"]))
    strings = _strings(wild == "tokens")
    numbers = st.one_of(VALID_NUMBERS, VALID_NUMBERS, BAD_NUMBERS) if wild == "tokens" else VALID_NUMBERS
    literals = st.sampled_from(["true", "false", "null", "True", "nul"] if wild == "tokens" else ["true", "false", "null"])
    spaces = st.lists(st.one_of(VALID_SPACE, VALID_SPACE, BAD_SPACE) if wild == "tokens" else VALID_SPACE, min_size=1, max_size=3)
    keys = st.one_of(st.sampled_from(['"text"', '"id"', '"\\u0074ext"', '"i\\u0064"', '"meta"', '"t\\u00e9xt"', '""']), strings)

    def containers(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        members = st.lists(st.tuples(keys, children), max_size=4).map(lambda pairs: [f"{k}:{v}" for k, v in pairs])
        return st.one_of(st.builds(_join, st.just("["), st.just("]"), st.lists(children, max_size=4), spaces),
                         st.builds(_join, st.just("{"), st.just("}"), members, spaces))

    values = st.recursive(st.one_of(strings, numbers, literals), containers, max_leaves=8)
    task = draw(TASKS)
    mostly = draw(st.integers(0, 9)) > 1  # most lines have the fields the task wants, of the right type
    text_key = json.dumps(task.text_field) if mostly else draw(keys)
    fields = [(text_key.replace("t", "\\u0074", draw(st.integers(0, 1))), draw(strings if mostly else values))]
    if task.id_field is not None and (mostly or draw(st.booleans())):
        fields.append((json.dumps(task.id_field), draw(st.one_of(strings, numbers) if mostly else values)))
    fields += draw(st.lists(st.tuples(keys, values), max_size=3))
    fields = draw(st.permutations(fields))
    body = _join("{", "}", [f"{key}{draw(spaces)[0]}:{value}" for key, value in fields], draw(spaces))
    if wild == "prefix":
        body = draw(st.sampled_from(["\ufeff", "\ufeff ", " \ufeff", "\ufeff\ufeff", "\x0b", "\x00", "x", ","])) + body
    elif wild == "suffix":
        body += draw(st.sampled_from(["\ufeff", "\x0b", "\x00", ",", "}", "]", " x", " {}", "\\"]))
    elif wild == "value":
        body = draw(values)
    raw = body.encode("utf-8", "surrogatepass")
    if wild == "byte" and raw:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1:]
    return raw, task


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(line=raw_lines())
def test_fast_and_json_paths_agree_on_generated_lines(line: tuple[bytes, ReadTask]) -> None:
    assert_same(*line)


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=40), task=TASKS)
def test_fast_and_json_paths_agree_on_arbitrary_bytes(raw: bytes, task: ReadTask) -> None:
    assert_same(raw, task)


def _scalar_json() -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(ANY_CHAR, max_size=20))


JSON_VALUES = st.recursive(_scalar_json(), lambda children: st.one_of(
    st.lists(children, max_size=4), st.dictionaries(st.text(ANY_CHAR, max_size=5), children, max_size=4)), max_leaves=10)


@settings(max_examples=400, deadline=None)
@given(text=st.text(ANY_CHAR), doc_id=_scalar_json(), extra=st.dictionaries(st.text(max_size=5), JSON_VALUES, max_size=3),
       ensure_ascii=st.booleans(), first=st.booleans())
@example(text="", doc_id="\ud800", extra={}, ensure_ascii=True, first=True)  # an escaped lone surrogate id (issue 11)
@example(text="a", doc_id="b", extra={"text": 0}, ensure_ascii=False, first=True)  # extra overrides the text
def test_fast_and_json_paths_agree_on_dumped_records(text: str, doc_id: Any, extra: dict[str, Any], ensure_ascii: bool,
                                                    first: bool) -> None:
    record = {"text": text, "id": doc_id, **extra} if first else {**extra, "id": doc_id, "text": text}
    dumped = json.dumps(record, ensure_ascii=ensure_ascii)
    outcome = assert_same(dumped.encode("utf-8", "surrogatepass"), _task())
    # A Document only when the record's own values allow it: escaped (ensure_ascii) or not, a lone
    # surrogate in the id or text is refused; unescaped anywhere, it makes the line invalid UTF-8.
    # `extra` may hold "id" or "text" too, so the expected values are the record's, not the drawn ones.
    record_id, record_text = record["id"], record["text"]
    if (isinstance(record_id, str) and isinstance(record_text, str) and not _has_surrogate([record_id, record_text])
            and (ensure_ascii or not _has_surrogate(record))):
        assert outcome == Document(7, record_id, record_text, record_text.encode("utf-8"))


def _has_surrogate(value: Any) -> bool:
    """Whether a JSON value (keys included) holds a lone surrogate."""
    if isinstance(value, str):
        return any(0xD800 <= ord(char) < 0xE000 for char in value)
    if isinstance(value, dict):
        return any(_has_surrogate(key) or _has_surrogate(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(item) for item in value)
    return False


@pytest.mark.parametrize("raw", [
    b'{"text": "a", "text": "b"}', b'{"text": 1, "text": "b"}', b'{"text": "a", "text": 2}', b'{"text": "x", "id": 1, "id": "2"}',
    b'{"text": "\\ud800"}', b'{"text": "x\\udc00y"}', b'{"text": "\\ud83d\\ude00"}', b'{"text": "x", "id": "\\udfff"}',
    b'{"text": NaN}', b'{"text": "x", "n": NaN}', b'{"text": "x", "id": Infinity}', b'{"text": "x", "id": -Infinity}',
    b'{"text": "x", "id": 1e400}', b'{"text": "x", "id": 12345678901234567890123}', b'{"text": "x", "id": -0}',
    b'{"text": "x", "id": -0.0}', b'{"text": "x", "id": 0.1}', b'{"text": "x", "id": 1E5}', b'{"text": "x", "id": true}',
    b'{"text": "x", "id": null}', b'{"text": "x", "id": [1]}', b'{"text": "x", "id": 18446744073709551615}',
    b'{"text": "x", "n": 1' + b"0" * 5000 + b'}', b'\xef\xbb\xbf{"text": "x"}', b'\xef\xbb\xbf {"text": "x"}',
    b'{"text": "\xff"}', b'{"text": "\xed\xa0\x80"}', b'{"text": "\xc0\x80"}', b'{"text": "\xf4\x90\x80\x80"}',
    b'{"text": "a\x01"}', b'{"text": "x"} {}', b'{"text": "x",}', b'[{"text": "x"}]', b'"text"', b'{"id": "x"}',
    b'{"text": "x"}\x0b', b'{"text": "x"}\r',
])
@pytest.mark.parametrize("id_field", ["id", None])
def test_fast_and_json_paths_agree_on_hard_cases(raw: bytes, id_field: str | None) -> None:
    assert_same(raw, _task(id_field=id_field))


@pytest.mark.parametrize("depth", [1, 50, 99, 100, 101, 500, 990, 1000, 1023, 1024, 1025, 3000])
def test_deep_nesting_goes_to_json(depth: int) -> None:
    """json.loads raises RecursionError near 1000 levels, where simdjson still parses."""
    nested = b"[" * depth + b"]" * depth
    for raw in (b'{"text": "x", "a": ' + nested + b"}", b'{"a": ' + nested + b', "text": "x", "id": "i"}', nested):
        assert_same(raw, _task())


@pytest.mark.parametrize("raw, doc_id", [
    (b'{"id": "code/00000000", "text": "a\\n\\"b\\"\\u00e9\\ud83d\\ude00 \xc3\xa9"}', "code/00000000"),
    (b'{"text": "a", "id": 42, "meta": {"source": ["x", {"y": null}], "n": 1.5e300}}', "42"),
    (b'  {"text" : "a" , "id":-7}\r', "-7"),
    (b'{"text": "a", "id": "first", "id": "last"}', "last"),
])
def test_the_fast_parser_takes_clean_lines(raw: bytes, doc_id: str) -> None:
    parse = read.fast_line_parser()
    assert parse is not None
    document = read._fast_document(parse, raw, 7, _task())
    assert document is not None and document.id == doc_id
    assert document == assert_same(raw, _task())


@pytest.mark.parametrize("raw", [b'{"text": "x", "id": 1.5}', b'\xef\xbb\xbf{"text": "x"}', b'{"text": "\\ud800"}',
                                 b'{"text": "x", "a": ' + b"[" * 101 + b"]" * 101 + b"}"])
def test_the_fast_parser_leaves_doubtful_lines_to_json(raw: bytes) -> None:
    parse = read.fast_line_parser()
    assert parse is not None
    assert read._fast_document(parse, raw, 7, _task()) is None


def test_long_lines_go_to_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(read, "_MAX_FAST_LINE_BYTES", 64)
    parse = read.fast_line_parser()
    assert parse is not None
    short, long = b'{"text": "x", "id": "a"}', b'{"text": "' + b"x" * 64 + b'", "id": "a"}'
    assert read._fast_document(parse, short, 7, _task()) is not None
    assert read._fast_document(parse, long, 7, _task()) is None
    assert isinstance(assert_same(long, _task()), Document)


def _read_file(path: Path, monkeypatch: pytest.MonkeyPatch, fast: bool) -> list[Document | BadRecord]:
    if not fast:
        monkeypatch.setattr(read, "fast_line_parser", lambda: None)
    (source,) = [hash_source(s) for s in discover((path.name,), path.parent, "auto")]
    try:
        return [item for task in plan_read_tasks(source, "text", "id") for item in read_documents(task, {})]
    finally:
        monkeypatch.undo()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(lines=st.lists(raw_lines(), max_size=12))
def test_whole_files_read_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: list[tuple[bytes, ReadTask]]) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"\n".join(raw.replace(b"\n", b" ") for raw, _ in lines) + b"\n")
    assert _read_file(path, monkeypatch, fast=True) == _read_file(path, monkeypatch, fast=False)


def test_invalid_utf8_and_malformed_lines_keep_their_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"text": "ok", "id": 1}\n{"text": "caf\xe9"}\n{"text": "x",}\n\xef\xbb\xbf{"text": "x", "id": 2}\n'
                     b'{"text": "\\ud800", "id": 3}\n{"text": "x", "id": 1.0}\n')
    for fast in (True, False):
        items = _read_file(path, monkeypatch, fast)
        assert [item.message("a.jsonl") for item in items if isinstance(item, BadRecord)] == [
            "a.jsonl:2: invalid UTF-8 at byte 13",
            "a.jsonl:3: malformed JSON: Expecting property name enclosed in double quotes at column 14",
            "a.jsonl:4: malformed JSON: Unexpected UTF-8 BOM (decode using utf-8-sig) at column 1",
            "a.jsonl:5: text has an unpaired surrogate at character 0"]
        assert [(item.id, item.text) for item in items if isinstance(item, Document)] == [("1", "ok"), ("1.0", "x")]


def test_float_ids_read_as_json_reads_them() -> None:
    for literal in ("0.1", "1e22", "1E-7", "-0.0", "5e-324", "123456789.123456789"):
        outcome = assert_same(b'{"text": "x", "id": ' + literal.encode() + b"}", _task())
        assert isinstance(outcome, Document) and outcome.id == str(float(literal))


def test_a_line_nested_deeper_than_json_can_recurse_is_a_bad_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: json's RecursionError escaped the reader as a traceback; now the line is named."""
    deep = b'{"text": "x", "id": "d", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    path = tmp_path / "deep.jsonl"
    path.write_bytes(b'{"text": "ok", "id": "a"}\n' + deep + b"\n")
    for fast in (True, False):
        items = _read_file(path, monkeypatch, fast)
        assert isinstance(items[0], Document)
        assert items[1] == BadRecord(1, "malformed JSON: nested too deeply to read", line=2)
