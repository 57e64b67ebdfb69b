"""Bad Parquet and Arrow inputs: a corrupt file is one InputError naming it, wherever it is first
opened (planning its tasks or reading them); a bad value is a bad record naming its row."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from prep.errors import InputError
from prep.inputs.sources import discover, hash_source
from prep.stages.batches import read_batches
from prep.stages.read import BadRecord, Document, ReadTask, plan_read_tasks, read_documents

TEXTS = [f"text number {i}" for i in range(6)]
IDS = [f"id-{i}" for i in range(6)]


def _good_parquet() -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"id": IDS, "text": TEXTS}), sink)
    return bytes(sink.getvalue())


_CORRUPT: dict[str, Callable[[bytes], bytes]] = {
    "empty": lambda data: b"",
    "magic only": lambda data: b"PAR1",
    "cut in half": lambda data: data[:len(data) // 2],
    "no footer magic": lambda data: data[:-4] + b"XXXX",
    "footer length past the file": lambda data: data[:-8] + (10**9).to_bytes(4, "little") + data[-4:],
    "footer bytes zeroed": lambda data: data[:-12] + bytes(8) + data[-4:],
    "JSON named .parquet": lambda data: b'{"id": "a", "text": "b"}\n',
}


def _tasks(folder: Path, name: str, id_field: str | None = "id") -> list[ReadTask]:
    source = hash_source(discover((name,), folder, "auto")[0])
    return plan_read_tasks(source, "text", id_field)


@pytest.mark.parametrize("kind", sorted(_CORRUPT))
def test_a_corrupt_parquet_file_is_an_input_error_naming_it(tmp_path: Path, kind: str) -> None:
    """The footer is read when the tasks are planned, in the driver: no traceback, no exit 4."""
    (tmp_path / "bad.parquet").write_bytes(_CORRUPT[kind](_good_parquet()))
    with pytest.raises(InputError, match=r"bad\.parquet: cannot read: ") as refused:
        _tasks(tmp_path, "bad.parquet")
    assert refused.value.exit_code == 2


def _write(path: Path, table: pa.Table) -> None:
    """`table` as Parquet, or as an Arrow stream (what a `datasets` save folder holds)."""
    if path.suffix == ".parquet":
        pq.write_table(table, path)
        return
    with ipc.new_stream(str(path), table.schema) as writer:
        writer.write_table(table)


@pytest.mark.parametrize("suffix", ["parquet", "arrow"])
def test_a_column_named_twice_is_an_input_error(tmp_path: Path, suffix: str) -> None:
    table = pa.Table.from_arrays([pa.array(IDS), pa.array(TEXTS), pa.array(TEXTS)], names=["id", "text", "text"])
    path = tmp_path / f"t.{suffix}"
    _write(path, table)
    [task] = _tasks(tmp_path, path.name)
    with pytest.raises(InputError, match=rf"t\.{suffix}: column 'text' appears 2 times"):
        list(read_documents(task, {}))
    with pytest.raises(InputError, match=rf"t\.{suffix}: column 'text' appears 2 times"):
        list(read_batches(task, {}, 100, 1 << 20))


def _strings(values: list[bytes]) -> pa.Array:
    """A string column holding any bytes (Arrow files are not validated on write or read)."""
    offsets = np.cumsum([0] + [len(v) for v in values]).astype("<i4")
    return pa.Array.from_buffers(pa.string(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))])


_BAD_VALUES = {
    "text not UTF-8": ({"text": _strings([t.encode() for t in TEXTS[:3]] + [b"bad \xff"] + [t.encode() for t in TEXTS[4:]])},
                       "text field 'text' is not valid UTF-8 (byte 4)"),
    "id not UTF-8": ({"id": _strings([i.encode() for i in IDS[:3]] + [b"\xc3("] + [i.encode() for i in IDS[4:]])},
                     "id field 'id' is not valid UTF-8 (byte 0)"),
    "boolean id": ({"id": pa.array([True, False, None, True, False, True])}, "missing or non-scalar id field 'id'"),
    "list id": ({"id": pa.array([[i] for i in range(6)])}, "missing or non-scalar id field 'id'"),
}


@pytest.mark.parametrize("suffix", ["parquet", "arrow"])
@pytest.mark.parametrize("kind", sorted(_BAD_VALUES))
def test_a_bad_value_is_a_bad_record_naming_its_row(tmp_path: Path, suffix: str, kind: str) -> None:
    """Both readers report it alike, so `on_error = "skip"` skips it and `fail` names the row."""
    columns, reason = _BAD_VALUES[kind]
    table = pa.table({"id": columns.get("id", pa.array(IDS)), "text": columns.get("text", pa.array(TEXTS))})
    path = tmp_path / f"t.{suffix}"
    _write(path, table)
    [task] = _tasks(tmp_path, path.name)
    documents = list(read_documents(task, {}))
    batched = [item for item in read_batches(task, {}, 100, 1 << 20) if isinstance(item, BadRecord)]
    bad = [item for item in documents if isinstance(item, BadRecord)]
    assert bad and bad == batched and {b.reason for b in bad} == {reason}
    assert 3 in {b.row for b in bad} and len(documents) == len(TEXTS)
    assert bad[0].message(path.name).startswith(f"t.{suffix}: row ")


def test_an_arrow_file_in_the_random_access_format_is_read_like_a_stream(tmp_path: Path) -> None:
    """Its magic `ARROW1` was read as a stream's message length: "Expected to read 1330795073 metadata bytes"."""
    table = pa.table({"id": IDS, "text": TEXTS})
    with ipc.new_file(str(tmp_path / "random.arrow"), table.schema) as writer:
        writer.write_table(table.slice(0, 2))
        writer.write_table(table.slice(2))
    _write(tmp_path / "stream.arrow", table)
    for name in ("random.arrow", "stream.arrow"):
        [task] = _tasks(tmp_path, name)
        documents = list(read_documents(task, {}))
        assert all(isinstance(d, Document) for d in documents)
        assert [(d.row, d.id, d.text) for d in documents if isinstance(d, Document)] == list(zip(range(6), IDS, TEXTS))
    (tmp_path / "cut.arrow").write_bytes((tmp_path / "random.arrow").read_bytes()[:-20])
    [task] = _tasks(tmp_path, "cut.arrow")
    with pytest.raises(InputError, match=r"cut\.arrow: cannot read: "):
        list(read_documents(task, {}))


@pytest.mark.parametrize("data", [b"", b'{"id": "a", "text": "b"}\n' * 50], ids=["empty", "JSON"])
def test_a_file_that_is_no_arrow_says_so(tmp_path: Path, data: bytes) -> None:
    (tmp_path / "t.arrow").write_bytes(data)
    [task] = _tasks(tmp_path, "t.arrow")
    with pytest.raises(InputError, match=r"t\.arrow: cannot read: not an Arrow IPC stream or file \("):
        list(read_batches(task, {}, 100, 1 << 20))
