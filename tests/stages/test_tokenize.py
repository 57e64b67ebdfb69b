"""The tokenize stage: one task's documents, counts and duplicate-id refusals, batch by batch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import prep.stages.tokenize as tokenize
from prep.errors import InputError
from prep.inputs.sources import discover, hash_source
from prep.stages.intermediate import read_columns
from prep.stages.read import plan_read_tasks
from prep.stages.specs import TokenizeSettings
from prep.tokenizer import load_tokenizer


def _run(tmp_path: Path, tokenizer_path: Path, lines: list[dict[str, object]],
         order_seed: int | None = None) -> tokenize.TokenizeResult:
    folder = tmp_path / "in"
    folder.mkdir(exist_ok=True)
    (folder / "a.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    task = plan_read_tasks(hash_source(discover(("a.jsonl",), folder, "auto")[0]), "text", "id")[0]
    _, info = load_tokenizer(tokenizer_path, "<|endoftext|>", True)
    settings = TokenizeSettings(str(tokenizer_path), info.sha256, "<|endoftext|>", True, "auto", "fail",
                                order_seed=order_seed)
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
    from prep.stages.intermediate import Intermediate
    from prep.stages.keys import order_keys
    from prep.tokenizer import reference_encode_batch

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
