"""The decontamination step: a benchmark n-gram planted anywhere in a document, under any case,
spacing or punctuation, drops it; sharing only shorter runs never does; the benchmark files are
checked when the pipeline is read and their contents enter the key."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.config import load_pipeline
from prep.errors import ConfigError, InputError
from prep.progress import Progress
from prep.runner.build import BuildResult, build
from prep.steps import decontaminate
from prep.steps.decontaminate import Decontaminate, ngram_hashes
from prep.steps.protocol import Drop, StepDocument
from prep.storage import LocalStore
from tests.helpers import write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor, build_local

QUESTION = "which river flows through the ancient city of rome and reaches the tyrrhenian sea near ostia"
ANSWER = "the tiber river"
FILLER = " ".join(f"word{index}" for index in range(400))


def _bench(folder: Path, name: str = "mmlu.jsonl", items: list[dict[str, object]] | None = None) -> Path:
    path = folder / "bench" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(item) + "\n" for item in (items or [{"question": QUESTION, "answer": ANSWER}])))
    return path


def _step(folder: Path, ngram: int = 13) -> Decontaminate:
    return Decontaminate(paths=("bench/*.jsonl",), ngram=ngram).resolve(folder)


def test_a_planted_ngram_mid_document_is_found_under_any_case_spacing_and_punctuation(tmp_path: Path) -> None:
    _bench(tmp_path)
    words = QUESTION.split()
    planted = "Which River,\n flows THROUGH the Ancient city of\tRome -- and reaches the Tyrrhenian"  # 13 words
    assert len(re.findall(r"\w+", planted)) == 13
    step = _step(tmp_path)
    document = StepDocument("d", f"{FILLER} {planted} {FILLER}")
    assert step.apply(document) == Drop("contaminated: bench/mmlu.jsonl",
                                        f'bench/mmlu.jsonl line 1: "{" ".join(words[:13])}"')
    twelve = " ".join(words[:12])
    assert step.apply(StepDocument("e", f"{FILLER} {twelve} {FILLER} {' '.join(words[1:13])[:-1]}")) is None


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 12), st.integers(0, 100))
def test_runs_shorter_than_the_ngram_never_hit(length: int, start: int) -> None:
    """A document that shares any run of fewer than 13 words with an item, however many such runs, is kept."""
    words = (QUESTION + " " + ANSWER).split()
    runs = [" ".join(words[at:at + length]) for at in range(0, len(words) - length + 1, 13)]
    text = f"{FILLER[start:]} " + " filler ".join(runs)
    table = set(ngram_hashes(QUESTION, 13).tolist()) | set(ngram_hashes(ANSWER, 13).tolist())
    assert table and not set(ngram_hashes(text, 13).tolist()) & table
    assert len(ngram_hashes(" ".join(words[:length]), 13)) == 0


@pytest.mark.parametrize(("setup", "table", "needle"), [
    (None, 'paths = []', "steps[0].paths: name at least one benchmark file"),
    (None, 'paths = ["bench/none*.jsonl"]', "steps[0].paths: 'bench/none*.jsonl' matches no file"),
    ("notjson", 'paths = ["bench/*.jsonl"]', "steps[0].paths: bench/bad.jsonl:2: not JSON Lines"),
    ("array", 'paths = ["bench/*.jsonl"]', "steps[0].paths: bench/bad.jsonl:1: not a JSON object"),
    ("fifo", 'paths = ["bench/*.jsonl"]', "steps[0].paths: bench/bad.jsonl: cannot read it"),
    (None, 'paths = ["bench/*.jsonl"]\nngram = 0', "steps[0].ngram: must be >= 1, got 0"),
    (None, 'paths = ["bench/*.jsonl"]\nfields = "question"', "steps[0].fields: expected a list of str"),
    (None, 'paths = ["bench/*.jsonl"]\nfiles = []', "steps[0].files: unknown key"),
])
def test_bad_settings_and_benchmark_files_are_one_line_naming_the_key(tmp_path: Path, tokenizer_path: Path,
                                                                      setup: str | None, table: str,
                                                                      needle: str) -> None:
    _bench(tmp_path)
    bad = tmp_path / "bench" / "bad.jsonl"
    if setup == "notjson":
        bad.write_text('{"question": "fine"}\n{not json\n')
    elif setup == "array":
        bad.write_text('["question"]\n')
    elif setup == "fifo":
        os.mkfifo(bad)
    pipeline = write_pipeline(tmp_path, tokenizer_path, extra=f'\n[[steps]]\nuse = "decontaminate"\n{table}\n')
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_pipeline(pipeline)


def _corpus(folder: Path) -> None:
    planted = QUESTION.upper().replace(" ", "  ")
    write_jsonl(folder / "corpus" / "a.jsonl", [
        {"id": "clean", "text": "an ordinary document about rivers and seas"},
        {"id": "dirty", "text": f"intro words here. {planted}. outro words"},
        {"id": "short", "text": "which river flows through the ancient city"},
        {"id": "other", "text": "the answer to two plus two is four"},
    ])


def _build(pipeline: Path, store: Path) -> BuildResult:
    return build(load_pipeline(pipeline), LocalStore(store), InProcessExecutor(), (), Progress(quiet=True))


def test_a_build_drops_the_contaminated_documents_and_counts_them_per_benchmark_file(tmp_path: Path,
                                                                                   tokenizer_path: Path) -> None:
    _bench(tmp_path)
    _bench(tmp_path, "arith.jsonl", [{"question": "what is two plus two", "answer": "the answer to two plus two is four"}])
    _corpus(tmp_path)
    step = '\n[[steps]]\nuse = "decontaminate"\npaths = ["bench/*.jsonl"]\nngram = 8\n'
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"], extra=step)
    result = _build(pipeline, tmp_path / "store")
    (counts,) = result.snapshot.manifest["stats"]["steps"]
    assert (counts["documents"], counts["dropped"]) == (4, 2)
    assert counts["reasons"] == {"contaminated: bench/arith.jsonl": 1, "contaminated: bench/mmlu.jsonl": 1}
    recorded = result.snapshot.manifest["config"]["steps"][0]
    assert [file["name"] for file in recorded["files"]] == ["bench/arith.jsonl", "bench/mmlu.jsonl"]
    assert build_local(pipeline, tmp_path / "store2", workers=2).snapshot.id == result.snapshot.id


def test_a_changed_benchmark_file_recomputes_and_one_changed_under_a_build_is_refused(tmp_path: Path,
                                                                                    tokenizer_path: Path) -> None:
    bench = _bench(tmp_path)
    _corpus(tmp_path)
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"],
                              extra='\n[[steps]]\nuse = "decontaminate"\npaths = ["bench/mmlu.jsonl"]\n')
    first = _build(pipeline, tmp_path / "store")
    assert _build(pipeline, tmp_path / "store").stages["tokenize"].ran == 0
    bench.write_text(json.dumps({"question": "an unrelated question about something else entirely here"}) + "\n")
    changed = _build(pipeline, tmp_path / "store")
    assert changed.stages["tokenize"].ran == 1 and changed.snapshot.id != first.snapshot.id
    assert changed.snapshot.manifest["stats"]["steps"][0]["dropped"] == 0
    loaded = load_pipeline(pipeline)
    decontaminate._TABLES.clear()  # as in a fresh worker
    bench.write_text(json.dumps({"question": QUESTION}) + "\n")  # after the pipeline was read
    with pytest.raises(InputError, match="benchmark file bench/mmlu.jsonl .* changed since the pipeline was read"):
        build(loaded, LocalStore(tmp_path / "store3"), InProcessExecutor(), (), Progress(quiet=True))


def test_trace_of_a_contaminated_document_names_the_benchmark_line_and_the_shared_words(
        tmp_path: Path, tokenizer_path: Path) -> None:
    from tests.helpers import run_prep

    _bench(tmp_path, "quiz.jsonl", [{"question": "nothing shared here at all"}, {"question": QUESTION}])
    _corpus(tmp_path)
    step = '\n[[steps]]\nuse = "decontaminate"\npaths = ["bench/*.jsonl"]\nngram = 8\n'
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"], extra=step)
    run_prep("build", pipeline, "--store", tmp_path / "store", "--workers", "1")
    trace = run_prep("trace", "tiny@latest", "dirty", "--store", tmp_path / "store").stdout.splitlines()
    assert trace[1:] == ["dropped   by step 1 (decontaminate): contaminated: bench/quiz.jsonl",
                         '          bench/quiz.jsonl line 2: "which river flows through the ancient city of"']
    report = json.loads(run_prep("trace", "tiny@latest", "dirty", "--json", "--store", tmp_path / "store").stdout)
    assert report["documents"][0]["dropped_by"]["detail"].startswith("bench/quiz.jsonl line 2: ")
