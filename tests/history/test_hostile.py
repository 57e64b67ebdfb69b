"""Hostile input to the history commands: every byte read back from the store is proven before it
is believed (intermediates, keep masks, shuffle plans), a missing object is an integrity error
naming it, and malformed specs or damaged ref values give one `prep: error:` line, never a
traceback."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from prep.errors import IntegrityError, NotFoundError, UsageError
from prep.history.docdiff import diff_documents
from prep.history.documents import find_documents, load_records, stage_manifest
from prep.history.lineage import locate_at, parse_at, trace
from prep.storage import LocalStore
from prep.store.snapshots import Snapshot, resolve
from tests.helpers import make_records, run_prep, write_jsonl, write_pipeline
from tests.history.layout1_factory import synthesize_layout1
from tests.runner.buildsupport import build_local

NOT_HEX = "z" * 64


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Path:
    """A store with demo@v1 (layout 2), demo@layout1 (layout 1, the same tokenize outputs) and
    demo@latest, with one document of v1 edited."""
    root = tmp_path_factory.mktemp("hostile")
    records = make_records(12, seed=9, prefix="d")
    write_jsonl(root / "corpus" / "docs.jsonl", records)
    pipeline = write_pipeline(root, tokenizer_path, ["corpus"], dataset="demo")
    v1 = build_local(pipeline, root / "store", tags=("v1",)).snapshot
    synthesize_layout1(LocalStore(root / "store"), v1, ref="layout1")
    write_jsonl(root / "corpus" / "docs.jsonl", [*records[:5], {"id": "d-5", "text": "edited"}, *records[6:]])
    build_local(pipeline, root / "store")
    return root / "store"


@pytest.fixture
def store(built: Path, tmp_path: Path) -> LocalStore:
    """A copy of the built store, free to damage (at a path of its own: no object of it is proven yet)."""
    shutil.copytree(built, tmp_path / "store")
    return LocalStore(tmp_path / "store")


def _object(store: LocalStore, object_id: str) -> Path:
    sha = object_id.removeprefix("sha256:")
    path = store.root / "objects" / "sha256" / sha[:2] / sha
    path.chmod(0o644)
    return path


def _flip(store: LocalStore, object_id: str, at: int = 0) -> None:
    path = _object(store, object_id)
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def _intermediate(store: LocalStore, snapshot: Snapshot) -> str:
    return str(stage_manifest(store, snapshot, "tokenize")["tasks"][0]["output"])


def _diff(store: LocalStore, snapshot: Snapshot, work: Path) -> None:
    diff_documents(store, snapshot, resolve(store, "demo@latest"), work)


def _trace(store: LocalStore, snapshot: Snapshot, _: Path) -> None:
    trace(store, snapshot, "d-3")


def _show_at(store: LocalStore, snapshot: Snapshot, _: Path) -> None:
    shard = min(a["path"] for a in snapshot.artifacts if a["format"] == "bin")
    locate_at(store, snapshot, f"{shard}:0")


READERS: dict[str, Callable[[LocalStore, Snapshot, Path], None]] = {
    "diff --documents": _diff, "trace": _trace, "show --at": _show_at}


@pytest.mark.parametrize("ref", ["v1", "layout1"])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_flipped_byte_in_an_intermediate_is_an_integrity_error(store: LocalStore, tmp_path: Path, ref: str,
                                                                 reader: str) -> None:
    """A text byte nobody looks at (the diff reads only row, id and text hash) still fails closed."""
    snapshot = resolve(store, f"demo@{ref}")
    _flip(store, _intermediate(store, snapshot))
    with pytest.raises(IntegrityError, match=r"the tokenize intermediate of docs\.jsonl \(object sha256:[0-9a-f]{64}\) "
                                             "does not hash to its name"):
        READERS[reader](store, snapshot, tmp_path)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_missing_intermediate_is_an_integrity_error_naming_it(store: LocalStore, tmp_path: Path, reader: str) -> None:
    snapshot = resolve(store, "demo@v1")
    _object(store, _intermediate(store, snapshot)).unlink()
    with pytest.raises(IntegrityError, match=r"the tokenize intermediate of docs\.jsonl .* is missing from the store"):
        READERS[reader](store, snapshot, tmp_path)


@pytest.mark.parametrize(("stage", "output", "what", "reader"),
                         [("dedup", "keep", "dedup keep mask", "diff --documents"),
                          ("dedup", "keep", "dedup keep mask", "trace"), ("shuffle", "plan", "shuffle plan", "trace"),
                          ("shuffle", "plan", "shuffle plan", "show --at")])
@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_a_damaged_layout1_mask_or_plan_is_an_integrity_error(store: LocalStore, tmp_path: Path, stage: str,
                                                              output: str, what: str, reader: str, damage: str) -> None:
    snapshot = resolve(store, "demo@layout1")
    object_id = str(stage_manifest(store, snapshot, stage)["outputs"][output])
    if damage == "flip":
        _flip(store, object_id, at=-1)
    else:
        _object(store, object_id).unlink()
    problem = "does not hash to its name" if damage == "flip" else "is missing from the store"
    with pytest.raises(IntegrityError, match=f"the {what} of snapshot .*{problem}"):
        READERS[reader](store, snapshot, tmp_path)


@pytest.mark.parametrize("spec", ["docs.jsonl:²", "docs.jsonl:٣", "docs.jsonl:３"])
def test_a_line_number_is_ascii_digits(store: LocalStore, spec: str) -> None:
    """'²' made int() raise (a traceback); '٣' and '３' named line 3."""
    records = load_records(store, resolve(store, "demo@latest"))
    with pytest.raises(NotFoundError, match="has no document"):
        find_documents(store, records, spec)
    with pytest.raises(UsageError, match="expected a WebDataset sample key"):
        parse_at(f"bin/0000000000000000.bin:{spec.rpartition(':')[2]}")


def _prep(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return run_prep(*args, check=False)


def _one_error_line(ran: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert ran.returncode == code, ran.stderr
    assert "Traceback" not in ran.stderr
    assert ran.stderr.splitlines() == [line for line in ran.stderr.splitlines() if line.startswith("prep: error: ")]
    assert text in ran.stderr


@pytest.mark.parametrize("spec", [NOT_HEX, f"sha256:{NOT_HEX}", f"sha256:{'a' * 63}g"])
@pytest.mark.parametrize("command", [("diff", "{spec}", "demo@latest"), ("show", "{spec}"), ("trace", "{spec}", "d-1"),
                                     ("tag", "{spec}", "x")])
def test_a_64_digit_spec_that_is_not_hex_is_a_usage_error(store: LocalStore, spec: str, command: tuple[str, ...]) -> None:
    args = [part.format(spec=spec) for part in command]
    _one_error_line(_prep(*args, "--store", store.root), 2, f"{spec!r} is not a snapshot")
    ran = _prep(*args, "--store", store.root, "--json")
    assert json.loads(ran.stdout) == {"schema": "prep.error/1", "error": ran.stderr.strip().removeprefix("prep: error: "),
                                      "exit_code": 2, "kind": "usage"}


def _damage_ref(store: LocalStore, key: str, **fields: object) -> None:
    path = store.root / key
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def test_a_ref_value_naming_no_snapshot_id_is_an_integrity_error(store: LocalStore) -> None:
    _damage_ref(store, "refs/demo/layout1.json", snapshot="garbage")
    for args in (("diff", "demo@layout1", "demo@latest"), ("tag", "demo@layout1", "x")):
        _one_error_line(_prep(*args, "--store", store.root), 3, "refs/demo/layout1.json: malformed ref record")


@pytest.mark.parametrize(("field", "value"), [("snapshot", "sha256:zz"), ("previous", "x"), ("generation", 0)])
def test_a_history_record_its_schema_refuses_fails_prep_log(store: LocalStore, field: str, value: object) -> None:
    """A snapshot that is no id made `prep log` raise a traceback; the others made its --json invalid."""
    _damage_ref(store, "history/demo/v1/0000000000000001.json", **{field: value})
    _one_error_line(_prep("log", "demo", "--store", store.root), 3,
                    "history/demo/v1/0000000000000001.json: malformed ref record")
    ran = _prep("log", "demo", "--store", store.root, "--json")
    assert json.loads(ran.stdout)["schema"] == "prep.error/1" and ran.returncode == 3


@pytest.mark.parametrize("doc_id", ["\udcff", "docs.jsonl:\udcff", "d-1\udcff"])
def test_a_doc_id_of_bytes_that_are_not_utf8_names_no_document(store: LocalStore, doc_id: str) -> None:
    """The argument's bytes reach Python as lone surrogates, which Arrow cannot encode: a traceback."""
    with pytest.raises(NotFoundError, match="is not UTF-8 text"):
        find_documents(store, load_records(store, resolve(store, "demo@v1")), doc_id)
    _one_error_line(_prep("trace", "demo@v1", doc_id, "--store", store.root), 2, "(it is not UTF-8 text)")


@pytest.mark.parametrize("args", [("ls", ""), ("tag", "-d", "@v1"), ("diff", "@latest", "demo@v1"), ("show", "@latest"),
                                  ("trace", "@v1", "d-1")])
def test_an_empty_dataset_name_is_invalid(store: LocalStore, args: tuple[str, ...]) -> None:
    """`prep ls ''` listed every dataset's refs; the others answered "no ref @latest"."""
    _one_error_line(_prep(*args, "--store", store.root), 2, "invalid dataset name ''")


def test_a_ref_naming_another_datasets_snapshot_is_an_integrity_error(store: LocalStore) -> None:
    """Regression: a ref record of dataset `other` (written by some other tool: builds and prep tag
    only point a ref at its own dataset's snapshot) naming demo's snapshot was followed as if it were
    other's, so `prep diff other@v1 ...` and `prep pull other@v1` served another dataset."""
    body = json.loads((store.root / "refs/demo/v1.json").read_text())
    (store.root / "refs/other").mkdir()
    (store.root / "refs/other/v1.json").write_text(json.dumps({**body, "dataset": "other"}))
    with pytest.raises(IntegrityError, match="of dataset 'demo', not 'other'"):
        resolve(store, "other@v1")
    _one_error_line(_prep("show", "other@v1", "--store", store.root), 3, "of dataset 'demo', not 'other'")


@pytest.mark.parametrize("spec", ["demo@v1", "sha256:abcd", "abcdef12"])
def test_a_file_named_like_a_snapshot_spec_is_ambiguous(store: LocalStore, tmp_path: Path, spec: str) -> None:
    """Regression: a file in the working folder named like a ref or an id (a manifest saved as
    `demo@v1`) silently took the place of the store's snapshot of that name."""
    work = tmp_path / "work"
    work.mkdir()
    (work / spec).write_bytes(resolve(store, "demo@latest").raw)
    ran = run_prep("show", spec, "--store", store.root, check=False, cwd=work)
    _one_error_line(ran, 2, f"{spec!r} is both a file here and a snapshot name: write ./{spec} for the file")
    shown = run_prep("show", f"./{spec}", "--json", cwd=work)
    assert json.loads(shown.stdout) == json.loads(resolve(store, "demo@latest").raw)
