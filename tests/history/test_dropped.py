"""What the document steps dropped, findable afterwards: `prep trace` names the step and its
reason for a dropped document, `prep show --dropped STEP` lists a sample with texts, both from
each part's dropped-documents object (fail closed: a flipped byte is refused)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prep.manifest.schema import validate
from prep.storage import LocalStore
from prep.store import cas
from prep.workfiles.outcomes import TEXTS_PER_STEP
from tests.helpers import run_prep, write_jsonl, write_pipeline
from tests.runner.test_reuse import flip_byte, object_path

STEPS = '\n[[steps]]\nuse = "length"\nmin_words = 3\n\n[[steps]]\nuse = "length"\nmax_chars = 40\n'


@pytest.fixture
def built(tmp_path: Path, tokenizer_path: Path) -> tuple[Path, str]:
    records = [{"id": f"short{n}", "text": f"tiny {n}"} for n in range(TEXTS_PER_STEP + 4)]
    records += [{"id": "long", "text": "a long document " * 10}, {"id": "kept", "text": "three fine words"}]
    write_jsonl(tmp_path / "corpus" / "a.jsonl", records)
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"], extra=STEPS)
    run = run_prep("build", str(pipeline), "--store", str(tmp_path / "store"), "--workers", "1", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    return tmp_path / "store", run.stdout.split()[0]


def _run(store: Path, *args: str) -> tuple[int, str, str]:
    run = run_prep(*args, "--store", str(store), check=False)
    return run.returncode, run.stdout, run.stderr


def test_trace_names_the_step_and_the_reason_of_a_dropped_document(built: tuple[Path, str]) -> None:
    store, snapshot = built
    code, out, _ = _run(store, "trace", "tiny@latest", "long")
    assert code == 0 and out.splitlines() == ["document  long  (a.jsonl line 21)",
                                              "dropped   by step 2 (length): too many chars"]
    code, out, _ = _run(store, "trace", "tiny@latest", "a.jsonl:3", "--json")
    report = json.loads(out)
    validate(report, "prep.trace-report/1")
    assert report["documents"] == [{"id": "short2", "source": "a.jsonl", "line": 3,
                                    "dropped_by": {"step": 0, "use": "length", "reason": "too few words"}}]
    code, _, err = _run(store, "trace", "tiny@latest", "nosuch")
    assert code != 0 and err.startswith("prep: error: ") and "has no document 'nosuch'" in err
    code, out, _ = _run(store, "trace", "tiny@latest", "kept")
    assert code == 0 and "dropped" not in out


def test_show_dropped_lists_a_steps_documents_with_the_texts_it_kept(built: tuple[Path, str]) -> None:
    store, _ = built
    code, out, _ = _run(store, "show", "tiny@latest", "--dropped", "1", "--limit", "3", "--text")
    assert code == 0
    assert out.split("\n\n")[0].splitlines() == ["document  short0  (a.jsonl line 1)",
                                                 "dropped   by step 1 (length): too few words", "tiny 0"]
    code, out, _ = _run(store, "show", "tiny@latest", "--dropped", "1", "--limit", "100", "--json", "--text")
    report = json.loads(out)
    validate(report, "prep.dropped-report/1")
    texts = [entry["text"] for entry in report["documents"]]
    assert len(texts) == TEXTS_PER_STEP + 4 and texts[:TEXTS_PER_STEP] == [f"tiny {n}" for n in range(TEXTS_PER_STEP)]
    assert texts[TEXTS_PER_STEP:] == [None] * 4  # a part keeps the first few texts of each step
    code, out, _ = _run(store, "show", "tiny@latest", "--dropped", "2", "--text")
    assert code == 0 and "a long document a long" in out


@pytest.mark.parametrize(("args", "needle"), [
    (("--dropped", "length"), "--dropped 'length' names several steps of snapshot"),
    (("--dropped", "3"), "--dropped '3' names no step of snapshot"),
    (("--dropped", "1", "--at", "bin/x.bin:0"), "--dropped lists a step's documents: not with --at"),
    (("--text",), "--text and --tokens need --at"),
])
def test_show_dropped_refuses_what_names_no_step(built: tuple[Path, str], args: tuple[str, ...], needle: str) -> None:
    store, _ = built
    code, _, err = _run(store, "show", "tiny@latest", *args)
    assert code == 2 and err.startswith("prep: error: ") and needle in err


def test_a_flipped_step_outcomes_object_is_refused(built: tuple[Path, str]) -> None:
    store, _ = built
    snapshot = json.loads(cas.get_bytes(LocalStore(store), _latest(store)))
    tokenize = next(stage for stage in snapshot["stages"] if stage["name"] == "tokenize")
    (task,) = json.loads(cas.get_bytes(LocalStore(store), tokenize["output"]))["tasks"]
    flip_byte(object_path(store, task["step_outcomes"][1]), 40)  # step 2 dropped "long"
    code, _, err = _run(store, "trace", "tiny@latest", "long")
    assert code == 3 and err.startswith("prep: error: ") and "Traceback" not in err


def _latest(store: Path) -> str:
    return str(json.loads((store / "refs" / "tiny" / "latest.json").read_text())["snapshot"])


def test_diff_documents_says_which_step_dropped_a_removed_document(tmp_path: Path, tokenizer_path: Path) -> None:
    """A stricter step removes documents: `prep diff --documents` names the step and its reason for
    each, and for the documents a looser step lets back in, which step had dropped them."""
    write_jsonl(tmp_path / "corpus" / "a.jsonl", [{"id": "two", "text": "two words"},
                                                  {"id": "four", "text": "four words are here"},
                                                  {"id": "six", "text": "six words are here and there"}])
    specs = []
    for bound in (3, 5, 1):
        pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"], name=f"p{bound}.toml",
                                  extra=f'\n[[steps]]\nuse = "length"\nmin_words = {bound}\n')
        specs.append(run_prep("build", pipeline, "--store", tmp_path / "store", "--workers", "1").stdout.split()[-1])
    code, out, _ = _run(tmp_path / "store", "diff", specs[0], specs[1], "--documents")
    assert code == 1 and "  - a.jsonl  four  (line 2)  dropped by step 1 (length): too few words" in out
    code, out, _ = _run(tmp_path / "store", "diff", specs[1], specs[2], "--documents", "--json")
    report = json.loads(out)
    validate(report, "prep.diff-report/1")
    added = {change["new"]["id"]: change.get("why") for change in report["documents"]["changes"]}
    assert added == {"two": "was dropped by step 1 (length): too few words",
                     "four": "was dropped by step 1 (length): too few words"}
