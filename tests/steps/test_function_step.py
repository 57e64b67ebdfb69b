"""User code as a document step (`use = "module:function"`): found beside the pipeline, run in
every worker, keyed by its code (its module, the package modules it imports, the distributions
they import), and every way it can fail is one line naming the step."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from prep.config import load_pipeline
from prep.errors import ConfigError, InputError
from prep.progress import Progress
from prep.runner.build import BuildResult, build
from prep.steps import function
from prep.steps.function import FunctionStep, outcome_of
from prep.steps.protocol import Drop, StepDocument
from prep.storage import LocalStore
from tests.helpers import user_package, write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor, build_local, read_samples

TEXTS = {"a": "keep me please", "b": "spam spam spam", "c": "loud words here", "d": "a quiet one", "e": "spam again"}

RULES = '''
from . import helpers
import numpy


def keep(document, word="spam", shout="loud"):
    if helpers.has(document.text, word):
        return "has " + word
    if shout in document.text:
        return {"text": document.text.upper()}
    return True


def broken(document):
    if document.text.startswith("spam"):
        raise KeyError("no spam here")
    return None


def odd(document):
    return 3


def placed(document):
    return document.source == "a.jsonl" and document.line == int(document.id[1:]) + 1 or "misplaced"
'''
HELPERS = '''
def has(text, word):
    return word in text
'''


@pytest.fixture
def package(tmp_path: Path) -> Iterator[str]:
    """A fresh user package beside the pipeline."""
    with user_package(tmp_path, "userfilters", {"rules.py": RULES, "helpers.py": HELPERS}) as name:
        yield name


def _pipeline(tmp_path: Path, tokenizer_path: Path, step: str) -> Path:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", [{"id": key, "text": text} for key, text in TEXTS.items()])
    return write_pipeline(tmp_path, tokenizer_path, ["corpus"], extra=f"\n[[steps]]\n{step}\n")


def _build(pipeline: Path, store: Path) -> BuildResult:
    return build(load_pipeline(pipeline), LocalStore(store), InProcessExecutor(), (), Progress(quiet=True))


def test_a_function_beside_the_pipeline_filters_and_maps(tmp_path: Path, tokenizer_path: Path, package: str) -> None:
    pipeline = _pipeline(tmp_path, tokenizer_path, f'use = "{package}.rules:keep"\nargs = {{ word = "spam" }}')
    result = _build(pipeline, tmp_path / "store")
    written = {members["txt"].decode() for _, members in read_samples(tmp_path / "store", result.snapshot.manifest)}
    assert written == {"keep me please", "LOUD WORDS HERE", "a quiet one"}
    (counts,) = result.snapshot.manifest["stats"]["steps"]
    assert (counts["use"], counts["dropped"], counts["changed"], counts["reasons"]) == \
        (f"{package}.rules:keep", 2, 1, {"has spam": 2})
    (recorded,) = result.snapshot.manifest["config"]["steps"]
    assert recorded == {"use": f"{package}.rules:keep", "args": {"word": "spam"}, "code": recorded["code"]}
    assert re.fullmatch(r"[0-9a-f]{64}", recorded["code"])


def test_it_sees_each_documents_source_and_line_in_every_part(tmp_path: Path, tokenizer_path: Path, package: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("prep.stages.read.RANGE_BYTES", 300)  # a file of many parts: lines counted past the first
    write_jsonl(tmp_path / "corpus" / "a.jsonl", [{"id": f"n{n}", "text": f"document number {n}"} for n in range(60)])
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"], extra=f'\n[[steps]]\nuse = "{package}.rules:placed"\n')
    result = _build(pipeline, tmp_path / "store")
    assert result.stages["tokenize"].ran > 3
    (counts,) = result.snapshot.manifest["stats"]["steps"]
    assert (counts["documents"], counts["dropped"]) == (60, 0)


def test_spawned_workers_import_it_from_the_pipeline_folder(tmp_path: Path, tokenizer_path: Path,
                                                            package: str) -> None:
    pipeline = _pipeline(tmp_path, tokenizer_path, f'use = "{package}.rules:keep"')
    spawned = build_local(pipeline, tmp_path / "store1", workers=2)
    assert spawned.snapshot.id == _build(pipeline, tmp_path / "store2").snapshot.id


def test_an_edit_to_a_module_it_imports_recomputes_it_and_nothing_else_does(tmp_path: Path, tokenizer_path: Path,
                                                                            package: str) -> None:
    pipeline = _pipeline(tmp_path, tokenizer_path, f'use = "{package}.rules:keep"')
    first = _build(pipeline, tmp_path / "store")
    again = _build(pipeline, tmp_path / "store")
    assert again.snapshot.id == first.snapshot.id and again.stages["tokenize"].ran == 0
    (tmp_path / package / "helpers.py").write_text(HELPERS + "\n# an edit that changes no outcome\n")
    for module in [m for m in sys.modules if m.startswith(package)]:
        del sys.modules[module]
    function._LOADED.clear()
    edited = _build(pipeline, tmp_path / "store")
    assert edited.stages["tokenize"].ran == 1 and edited.snapshot.id != first.snapshot.id
    assert edited.snapshot.manifest["artifacts"] == first.snapshot.manifest["artifacts"]
    diff = subprocess.run([sys.executable, "-m", "prep.cli.main", "diff", first.snapshot.id, edited.snapshot.id,
                           "--store", str(tmp_path / "store")], capture_output=True, text=True, check=False,
                          cwd=Path(__file__).resolve().parents[2])
    assert "settings   1 changed" in diff.stdout and '"code": "' in diff.stdout  # the step's code moved


def test_the_code_identity_follows_the_package_and_the_distributions_it_imports(tmp_path: Path,
                                                                                package: str) -> None:
    sys.path.append(str(tmp_path.resolve()))
    module = __import__(f"{package}.rules", fromlist=["keep"])
    before = function.code_identity(module)
    (tmp_path / package / "unrelated.py").write_text("x = 1\n")  # imported by nothing: no change
    assert function.code_identity(module) == before
    (tmp_path / package / "helpers.py").write_text(HELPERS + "\n")
    assert function.code_identity(module) != before
    assert "numpy" in function._imports(RULES.encode(), f"{package}.rules", False)


@pytest.mark.parametrize(("step", "needle"), [
    ('use = "nosuchmodule_xyz:keep"', "steps[0].use: cannot import nosuchmodule_xyz:keep: ModuleNotFoundError"),
    ('use = "PKG.rules:missing"', "steps[0].use: PKG.rules:missing: PKG.rules has no function 'missing'"),
    ('use = "PKG.rules:keep"\nargs = 3', "steps[0].args: expected a table of keyword arguments, got 3"),
    ('use = "PKG.rules:keep"\nword = "x"', "steps[0].word: unknown key"),
    ('use = "not a spec:x y"', "steps[0].use: 'not a spec:x y' is not module:function"),
])
def test_bad_function_settings_are_one_line_naming_the_key(tmp_path: Path, tokenizer_path: Path, package: str,
                                                           step: str, needle: str) -> None:
    pipeline = _pipeline(tmp_path, tokenizer_path, step.replace("PKG", package))
    with pytest.raises(ConfigError, match=re.escape(needle.replace("PKG", package))):
        load_pipeline(pipeline)


@pytest.mark.parametrize(("name", "needle"), [
    ("broken", "step 'PKG.rules:broken' on document 'b': KeyError: 'no spam here'"),
    ("odd", "step 'PKG.rules:odd' on document 'a': TypeError: answered int"),
])
def test_user_code_that_raises_is_named_with_the_document_and_nothing_is_published(
        tmp_path: Path, tokenizer_path: Path, package: str, name: str, needle: str) -> None:
    pipeline = _pipeline(tmp_path, tokenizer_path, f'use = "{package}.rules:{name}"')
    store = LocalStore(tmp_path / "store")
    with pytest.raises(InputError, match=re.escape(needle.replace("PKG", package))):
        build(load_pipeline(pipeline), store, InProcessExecutor(), (), Progress(quiet=True))
    assert list(store.list("refs/")) == []


def test_the_cli_reports_a_raising_function_in_one_line_with_exit_2(tmp_path: Path, tokenizer_path: Path,
                                                                     package: str) -> None:
    pipeline = _pipeline(tmp_path, tokenizer_path, f'use = "{package}.rules:broken"')
    run = subprocess.run([sys.executable, "-m", "prep.cli.main", "build", str(pipeline), "--store",
                          str(tmp_path / "store"), "--workers", "1"], capture_output=True, text=True, check=False,
                         cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if not line.startswith("[")]  # progress lines aside
    assert len(errors) == 1 and errors[0].startswith("prep: error: a.jsonl: ")
    assert f"step '{package}.rules:broken' on document 'b': KeyError: 'no spam here'" in errors[0]
    assert "Traceback" not in run.stderr


def test_a_worker_with_other_code_refuses_the_step(tmp_path: Path, package: str) -> None:
    step = FunctionStep(f"{package}.rules:keep", (), "0" * 64, search_path=str(tmp_path.resolve()))
    with pytest.raises(RuntimeError, match="differs from the driver's"):
        step.apply(StepDocument("a", "text"))


@pytest.mark.parametrize(("answer", "outcome"), [
    (True, None), (None, None), (False, Drop("returned False")), ("too short", Drop("too short")),
    ({"text": "new"}, "new"), ({"text": "same"}, None), (StepDocument("x", "other"), "other"),
])
def test_answers_become_outcomes(answer: object, outcome: object) -> None:
    assert outcome_of(answer, "same") == outcome


@pytest.mark.parametrize("answer", [3, {"txt": "x"}, {"text": 3}, b"bytes"])
def test_answers_of_no_meaning_are_refused(answer: object) -> None:
    with pytest.raises(TypeError, match="a step function returns True, False"):
        outcome_of(answer, "same")


def test_with_on_error_skip_a_raising_function_drops_and_lists_the_document(tmp_path: Path, tokenizer_path: Path,
                                                                           package: str) -> None:
    """`on_error = "skip"`: the documents the function raised on are dropped (reason `raised
    KeyError`, counted once: by the step, not again as bad records) and listed in the build log
    with the bad records; the build publishes, and prep show counts each document once."""
    write_jsonl(tmp_path / "corpus" / "a.jsonl", [{"id": key, "text": text} for key, text in TEXTS.items()])
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"], extra_input='on_error = "skip"\n',
                              extra=f'\n[[steps]]\nuse = "{package}.rules:broken"\n')
    result = _build(pipeline, tmp_path / "store")
    stats = result.snapshot.manifest["stats"]
    (counts,) = stats["steps"]
    assert (counts["dropped"], counts["reasons"], stats["bad_records_skipped"]) == (2, {"raised KeyError": 2}, 0)
    log = json.loads(LocalStore(tmp_path / "store").get_bytes(result.log_key))
    assert [entry["reason"] for entry in log["skipped"]["listed"]] == [
        f"step '{package}.rules:broken' on document '{doc}': KeyError: 'no spam here'" for doc in ("b", "e")]
    assert stats["documents_read"] == 3
    shown = subprocess.run([sys.executable, "-m", "prep.cli.main", "show", result.snapshot.id, "--store",
                            str(tmp_path / "store")], capture_output=True, text=True, check=True).stdout
    assert "documents  5 read, 0 bad records skipped, 2 dropped by steps, 0 duplicates dropped, 3 written" in shown
