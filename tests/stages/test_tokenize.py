"""The tokenize stage: one task's documents, counts and duplicate-id refusals, batch by batch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import prep.stages.tokenize as tokenize
from prep.config import DEFAULT_TOKENIZER_CACHE
from prep.errors import InputError
from prep.inputs.sources import discover, hash_source
from prep.stages.read import plan_read_tasks
from prep.stages.specs import TokenizeSettings
from prep.tokenizer import load_tokenizer
from prep.tokenizer.engine import TokenizerEngine
from prep.workfiles.intermediate import read_columns


@pytest.fixture(autouse=True)
def _a_worker_past_its_first_tasks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test here runs in a worker that trims between batches, whatever tasks its process ran
    before, unless it says otherwise (tokenize.UNTRIMMED_TASKS)."""
    monkeypatch.setattr(tokenize, "_TASKS", {"count": tokenize.UNTRIMMED_TASKS})


def _run(tmp_path: Path, tokenizer_path: Path, lines: list[dict[str, object]],
         order_seed: int | None = None, tokenizer_cache: int = DEFAULT_TOKENIZER_CACHE) -> tokenize.TokenizeResult:
    folder = tmp_path / "in"
    folder.mkdir(exist_ok=True)
    (folder / "a.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    task = plan_read_tasks(hash_source(discover(("a.jsonl",), folder, "auto")[0]), "text", "id")[0]
    _, info = load_tokenizer(tokenizer_path, "<|endoftext|>", True)
    settings = TokenizeSettings(str(tokenizer_path), info.sha256, "<|endoftext|>", True, "auto", "fail",
                                order_seed=order_seed, tokenizer_cache=tokenizer_cache)
    out = tmp_path / "part.int"
    out.unlink(missing_ok=True)
    return tokenize.run_tokenize(task, settings, out, durable=False)


@pytest.mark.parametrize("batch", [1, 2, 3, 100])
@pytest.mark.parametrize("second", [1, 2, 4])
def test_a_repeated_id_is_refused_in_any_batch(tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               batch: int, second: int) -> None:
    """The line named is the repeat's, whether it shares a batch with the first copy or not;
    documents without ids never clash; nothing is left behind."""
    monkeypatch.setattr(tokenize, "BATCH_DOCUMENTS", batch)
    lines: list[dict[str, object]] = [{"id": f"d{i}", "text": f"text {i}"} for i in range(5)]
    lines[second]["id"] = "d0"
    with pytest.raises(InputError, match=rf"duplicate id 'd0' \(row/line {second + 1} of this part\)"):
        _run(tmp_path, tokenizer_path, lines)
    assert not (tmp_path / "part.int").exists()


@pytest.mark.parametrize("batch", [1, 2, 100])
def test_counts_and_columns_do_not_depend_on_batches(tmp_path: Path, tokenizer_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch, batch: int) -> None:
    """Special-token spellings are flagged per document (not across a neighbour's boundary);
    the summary counts what the table holds."""
    monkeypatch.setattr(tokenize, "BATCH_DOCUMENTS", batch)
    texts = ["plain", "a <|endoftext|> b", "ends <|endo", "ftext|> starts", "naïve <|endoftext|>", ""]
    result = _run(tmp_path, tokenizer_path, [{"id": f"d{i}", "text": text} for i, text in enumerate(texts)])
    table = read_columns(result.path, ["special", "text_bytes", "n_tokens", "row"])
    assert table.column("special").to_pylist() == [False, True, False, False, True, False]
    assert table.column("text_bytes").to_pylist() == [len(t.encode()) for t in texts]
    assert table.column("row").to_pylist() == list(range(len(texts)))
    assert result.summary["special_token_documents"] == 2
    assert result.summary["documents"] == len(texts)
    assert result.summary["text_bytes"] == sum(len(t.encode()) for t in texts)
    assert result.summary["tokens"] == int(np.sum(table.column("n_tokens").to_pylist()))


@pytest.mark.parametrize("batch", [7, 65536, 5, 40])
@pytest.mark.parametrize("seed", [None, 0, 12345])
def test_every_document_sits_at_its_offsets_with_the_reference_tokens(tmp_path: Path, tokenizer_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch, batch: int,
                                                                      seed: int | None) -> None:
    """Batch after batch, the batch's tokens, then its texts, each in the order of the seed's keys'
    high halves (input order without a seed, ties in input order), wherever batches are cut;
    rows stay in input order."""
    from prep.tokenizer import reference_encode_batch
    from prep.workfiles.intermediate import Intermediate
    from prep.workfiles.keys import order_keys

    monkeypatch.setattr(tokenize, "BATCH_DOCUMENTS", batch)
    texts = [f"document {i} " + "é" * (i % 5) + " words " * (i % 13) for i in range(40)] + ["", "x", "document 0 "]
    result = _run(tmp_path, tokenizer_path, [{"id": i, "text": text} for i, text in enumerate(texts)], seed)
    table = read_columns(result.path, ["id", "text_offset", "text_bytes", "tokens_offset", "n_tokens"]).to_pylist()
    tokenizer, info = load_tokenizer(tokenizer_path, "<|endoftext|>", True)
    expected = reference_encode_batch(tokenizer, texts, np.dtype(info.dtype))
    data = result.path.read_bytes()
    width = np.dtype(info.dtype).itemsize
    for row, text, tokens in zip(table, texts, expected):
        assert data[row["text_offset"]:row["text_offset"] + row["text_bytes"]] == text.encode()
        found = np.frombuffer(data, dtype=np.dtype(info.dtype).newbyteorder("<"), count=row["n_tokens"],
                              offset=row["tokens_offset"])
        assert found.tolist() == tokens.tolist()
    base = 0
    for record_batch in Intermediate(result.path).batches():
        rows = record_batch.to_pylist()
        laid = list(range(len(rows)))
        if seed is not None:
            hashes = np.frombuffer(b"".join(row["text_hash"] for row in rows), dtype="<u8").reshape(-1, 2)
            hi, _ = order_keys(hashes, seed)
            laid = sorted(laid, key=lambda i: (int(hi[i]), i))
        token_ends = base + np.cumsum([rows[i]["n_tokens"] * width for i in laid])
        assert [rows[i]["tokens_offset"] for i in laid] == [base, *token_ends[:-1].tolist()]
        text_ends = int(token_ends[-1]) + np.cumsum([rows[i]["text_bytes"] for i in laid])
        assert [rows[i]["text_offset"] for i in laid] == [int(token_ends[-1]), *text_ends[:-1].tolist()]
        base = int(text_ends[-1])
    assert len(table) == len(texts)
    assert [row["id"] for row in table] == [str(i) for i in range(len(texts))]


def count_engine_loads(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """A list that gets the arguments of every TokenizerEngine made from now on."""
    loads: list[object] = []
    create = TokenizerEngine.create

    def counted(*args: Any) -> Any:
        loads.append(args)
        return create(*args)

    monkeypatch.setattr(TokenizerEngine, "create", counted)
    return loads


def test_a_worker_that_outgrew_its_engine_loads_it_afresh_with_the_same_tokens(
        tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gigatoken's pre-token cache has no bound: once the worker, at the start of a task, grew
    [build] tokenizer_cache past its size at the start of the engine's second task, the engine is
    dropped and loaded again; tokens never change."""
    lines: list[dict[str, object]] = [{"id": f"d{i}", "text": f"word{i} and more words {i * 7}"} for i in range(40)]
    resident = [10**9]
    monkeypatch.setattr(tokenize, "resident_bytes", lambda: resident[0])
    monkeypatch.setattr(tokenize, "_ENGINES", {})
    results: list[Any] = []
    engines: list[TokenizerEngine] = []
    for _ in range(5):  # 1.0 GB; 1.1 GB: measured; 1.2 GB: kept; 1.3 GB: grew 200 MB, loaded again; 1.4 GB: kept
        result = _run(tmp_path, tokenizer_path, lines, tokenizer_cache=150 * 10**6)
        results.append(read_columns(result.path, ["n_tokens", "tokens_offset"]))
        engines.extend(loaded.engine for loaded in tokenize._ENGINES.values())
        resident[0] += 10**8
    assert all(result.equals(results[0]) for result in results)
    assert [id(engine) for engine in engines] == [id(engines[0])] * 3 + [id(engines[3])] * 2
    assert engines[3] is not engines[0] and engines[3].checked["batches"] >= engines[0].checked["batches"] > 0


def test_an_engine_outgrown_within_a_task_is_loaded_again_between_its_batches(
        tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task whose batches keep growing the worker reloads the engine between them and writes
    the same bytes as a task that never did."""
    lines: list[dict[str, object]] = [{"id": f"d{i}", "text": f"text {i} of {i * 13}"} for i in range(40)]
    monkeypatch.setattr(tokenize, "BATCH_DOCUMENTS", 5)
    expected = _run(tmp_path, tokenizer_path, lines).digest
    growing = iter(range(10**9, 10**11, 10**8))  # 100 MB more at every look
    monkeypatch.setattr(tokenize, "resident_bytes", lambda: next(growing))
    monkeypatch.setattr(tokenize, "_ENGINES", {})
    loads = count_engine_loads(monkeypatch)
    assert _run(tmp_path, tokenizer_path, lines, tokenizer_cache=150 * 10**6).digest == expected
    # 8 batches: the first sets the size, the third finds 200 MB more and reloads, the fourth
    # sets the size again, the sixth reloads; the task's start looks once more.
    assert len(loads) == 3


def test_a_first_batchs_working_set_is_not_counted_as_cache_growth(
        tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's size is taken once the engine encoded a batch, so the memory a batch itself
    needs never makes the engine reload (a tight bound reloaded it before every batch)."""
    lines: list[dict[str, object]] = [{"id": f"d{i}", "text": f"text {i}"} for i in range(30)]
    monkeypatch.setattr(tokenize, "BATCH_DOCUMENTS", 5)
    monkeypatch.setattr(tokenize, "_ENGINES", {})
    resident = [10**9]
    monkeypatch.setattr(tokenize, "resident_bytes", lambda: resident[0])
    loads = count_engine_loads(monkeypatch)
    encode = TokenizerEngine.encode_columns

    def working(self: TokenizerEngine, *args: Any) -> Any:
        resident[0] = 12 * 10**8  # a batch's buffers: 200 MB more, then steady
        return encode(self, *args)

    monkeypatch.setattr(TokenizerEngine, "encode_columns", working)
    _run(tmp_path, tokenizer_path, lines, tokenizer_cache=150 * 10**6)
    assert len(loads) == 1


@pytest.mark.parametrize("change", ["edited", "removed"])
def test_a_reload_that_finds_the_tokenizer_changed_fails_and_leaves_nothing_staged(
        tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    """A reload reads the tokenizer file again: changed or gone since the build pinned it, the
    task stops with one line naming the file, and its partial outputs are removed."""
    from prep.errors import PrepError

    copy = tmp_path / "tokenizer.json"
    copy.write_bytes(tokenizer_path.read_bytes())
    lines: list[dict[str, object]] = [{"id": f"d{i}", "text": f"text {i}"} for i in range(30)]
    monkeypatch.setattr(tokenize, "BATCH_DOCUMENTS", 5)
    monkeypatch.setattr(tokenize, "_ENGINES", {})
    growing = iter(range(10**9, 10**12, 10**8))
    monkeypatch.setattr(tokenize, "resident_bytes", lambda: next(growing))
    encode = TokenizerEngine.encode_columns

    def then_change(self: TokenizerEngine, *args: Any) -> Any:
        if change == "edited":
            copy.write_bytes(copy.read_bytes().replace(b'"<|endoftext|>"', b'"<|endoftext|>" ', 1))
        else:
            copy.unlink(missing_ok=True)
        return encode(self, *args)

    monkeypatch.setattr(TokenizerEngine, "encode_columns", then_change)
    changed = r"tokenizer\.json: (tokenizer file changed during the build|tokenizer file not found)"
    with pytest.raises(PrepError, match=changed) as failed:
        _run(tmp_path, copy, lines, tokenizer_cache=150 * 10**6)
    assert failed.value.exit_code == 2
    assert not (tmp_path / "part.int").exists() and not (tmp_path / "part.int.entries").exists()


def test_an_engine_is_kept_while_the_worker_does_not_grow(tmp_path: Path, tokenizer_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tokenize, "resident_bytes", lambda: 10**9)
    monkeypatch.setattr(tokenize, "_ENGINES", {})
    lines: list[dict[str, object]] = [{"id": "a", "text": "some text"}]
    first = _run(tmp_path, tokenizer_path, lines)
    engine = next(iter(tokenize._ENGINES.values())).engine
    _run(tmp_path, tokenizer_path, lines)
    assert next(iter(tokenize._ENGINES.values())).engine is engine and first.summary["documents"] == 1


def test_dropped_engines_are_closed_and_a_later_task_loads_one_again(
        tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What an order or shard task does first: free the worker's engines (and their caches)."""
    monkeypatch.setattr(tokenize, "_ENGINES", {})
    lines: list[dict[str, object]] = [{"id": "a", "text": "some text"}, {"id": "b", "text": "more text"}]
    first = _run(tmp_path, tokenizer_path, lines).digest
    engine = next(iter(tokenize._ENGINES.values())).engine
    closed: list[object] = []
    monkeypatch.setattr(type(engine.backend), "close", lambda self: closed.append(self))
    tokenize.drop_engines()
    assert tokenize._ENGINES == {} and closed == [engine.backend]
    tokenize.drop_engines()  # nothing loaded: nothing to do
    assert _run(tmp_path, tokenizer_path, lines).digest == first
    assert next(iter(tokenize._ENGINES.values())).engine is not engine


def test_a_parts_entries_are_its_metadata_sorted_by_key(tmp_path: Path, tokenizer_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The entries a task writes (sorted from its batches' key runs) hold exactly what sorting
    its metadata from scratch gives, over several batches and repeated texts."""
    from prep.workfiles.entries import PART_COLUMNS, EntryFile, part_entries

    monkeypatch.setattr(tokenize, "BATCH_DOCUMENTS", 7)
    lines: list[dict[str, object]] = [{"id": f"d{i}", "text": f"text {i % 23} here"} for i in range(60)]
    result = _run(tmp_path, tokenizer_path, lines, order_seed=5)
    assert result.entries is not None
    entry_file = EntryFile.open(result.entries[0])
    written, ids = entry_file.read(0, entry_file.header["count"])
    expected, expected_ids = part_entries(read_columns(result.path, list(PART_COLUMNS)), 5)
    assert written.tobytes() == expected.tobytes() and ids == expected_ids


def test_the_heap_is_trimmed_after_every_batch(tmp_path: Path, tokenizer_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch's freed buffers must not stay resident as holes under the next batch's (a task's
    peak grew with the tasks its worker had run)."""
    lines: list[dict[str, object]] = [{"id": f"d{i}", "text": f"text {i}"} for i in range(40)]
    monkeypatch.setattr(tokenize, "BATCH_DOCUMENTS", 5)
    _run(tmp_path, tokenizer_path, lines[:1])  # the engine loaded (and the heap trimmed after it) beforehand
    trims: list[int] = []
    monkeypatch.setattr(tokenize, "trim_heap", lambda: trims.append(len(trims)))
    _run(tmp_path, tokenizer_path, lines)
    assert len(trims) == 8


def test_a_young_worker_trims_between_batches_only_from_its_fifth_task(
        tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local pool's workers run at most UNTRIMMED_TASKS tasks once its zygote forks them, too few
    for holes to build up: they skip the trim (and its page faults) between batches; a worker that
    lives on trims after every batch from then on."""
    lines: list[dict[str, object]] = [{"id": f"d{i}", "text": f"text {i}"} for i in range(40)]
    monkeypatch.setattr(tokenize, "BATCH_DOCUMENTS", 5)
    _run(tmp_path, tokenizer_path, lines[:1])  # the engine loaded beforehand
    monkeypatch.setattr(tokenize, "_TASKS", {"count": 0})
    trims: list[int] = []
    monkeypatch.setattr(tokenize, "trim_heap", lambda: trims.append(len(trims)))
    digests = set()
    for _ in range(tokenize.UNTRIMMED_TASKS):
        digests.add(_run(tmp_path, tokenizer_path, lines).digest)
    assert trims == []
    digests.add(_run(tmp_path, tokenizer_path, lines).digest)
    assert len(trims) == 8 and len(digests) == 1


def test_a_task_that_does_not_trim_between_batches_trims_before_it_blames_the_tokenizer(
        tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The holes a young worker's batches leave are not the tokenizer's cache: once the worker looks
    grown past [build] tokenizer_cache, the heap is trimmed and measured again before any reload."""
    lines: list[dict[str, object]] = [{"id": f"d{i}", "text": f"text {i}"} for i in range(40)]
    monkeypatch.setattr(tokenize, "BATCH_DOCUMENTS", 5)
    monkeypatch.setattr(tokenize, "_TASKS", {"count": 0})
    monkeypatch.setattr(tokenize, "_ENGINES", {})
    resident = [10**9]

    def trimmed() -> None:
        resident[0] = 10**9  # the holes given back: at rest again

    def encode(self: TokenizerEngine, *args: Any, _encode: Any = TokenizerEngine.encode_columns) -> Any:
        resident[0] += 2 * 10**8  # each batch leaves 200 MB of holes behind
        return _encode(self, *args)

    monkeypatch.setattr(tokenize, "resident_bytes", lambda: resident[0])
    monkeypatch.setattr(tokenize, "trim_heap", trimmed)
    monkeypatch.setattr(TokenizerEngine, "encode_columns", encode)
    loads = count_engine_loads(monkeypatch)
    _run(tmp_path, tokenizer_path, lines, tokenizer_cache=150 * 10**6)
    assert len(loads) == 1  # loaded once, never again: every look past the bound found holes


def test_a_warm_up_loads_the_tokenizer_once_and_only_the_file_the_driver_hashed(
        tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, info = load_tokenizer(tokenizer_path, "<|endoftext|>", True)
    loads: list[Path] = []

    def counted(path: Path, eos: str, encode_special_tokens: bool) -> Any:
        loads.append(path)
        return load_tokenizer(path, eos, encode_special_tokens)

    monkeypatch.setattr(tokenize, "load_tokenizer", counted)
    tokenize.drop_engines()
    try:
        tokenize.warm_engine(str(tokenizer_path), info.sha256, "<|endoftext|>", True, "auto")
        assert loads == [tokenizer_path] and len(tokenize._ENGINES) == 1
        tokenize.drop_engines()
        tokenize.warm_engine(str(tokenizer_path), "0" * 64, "<|endoftext|>", True, "auto")  # the file changed since
        assert len(loads) == 2 and not tokenize._ENGINES  # loaded, found other bytes, kept nothing
    finally:
        tokenize.drop_engines()



def test_a_tokenizer_that_differs_on_a_worker_names_its_host(tmp_path: Path, tokenizer_path: Path) -> None:
    """A worker whose copy of the tokenizer file is not the one the driver hashed (another node's
    file, or one edited meanwhile) names its host and both hashes, so the node can be found."""
    import re
    import socket

    (tmp_path / "a.jsonl").write_text(json.dumps({"id": "d", "text": "some text"}) + "\n", encoding="utf-8")
    task = plan_read_tasks(hash_source(discover(("a.jsonl",), tmp_path, "auto")[0]), "text", "id")[0]
    settings = TokenizeSettings(str(tokenizer_path), "ab" * 32, "<|endoftext|>", True, "auto", "fail")
    with pytest.raises(InputError, match=rf"tokenizer file changed during the build, or differs on host "
                                         rf"{re.escape(socket.gethostname())} \(sha256 [0-9a-f]{{12}} there, "
                                         r"abababababab where the build hashed it\)"):
        tokenize.run_tokenize(task, settings, tmp_path / "part.int", durable=False)
    assert not (tmp_path / "part.int").exists()
