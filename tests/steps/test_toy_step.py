"""A document step defined in this test module only, registered here, with no edit elsewhere: it
drops documents containing "x" and upper-cases those containing "shout", in an in-process build."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from prep.config import load_pipeline
from prep.errors import InputError
from prep.progress import Progress
from prep.runner.build import build
from prep.steps import catalog
from prep.steps.protocol import DocumentStep, Drop, Outcome, SettingError, StepDocument
from prep.storage import LocalStore
from tests.helpers import write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor, build_local, read_samples


@dataclass(frozen=True)
class NoLetter(DocumentStep):
    """Drops documents containing `letter`; upper-cases those containing `shout`."""

    use: ClassVar[str] = "toy_no_letter"
    letter: str = "x"
    shout: str = "shout"

    def check(self) -> None:
        if len(self.letter) != 1:
            raise SettingError("letter", f"must be one character, got {self.letter!r}")

    def apply(self, document: StepDocument) -> Outcome:
        if self.letter in document.text:
            return Drop(f"has {self.letter}")
        return document.text.upper() if self.shout in document.text else None


@pytest.fixture
def registered() -> Iterator[None]:
    catalog.register(NoLetter)
    yield
    catalog.unregister(NoLetter.use)


TEXTS = {"a": "plain words here", "b": "a fox jumps", "c": "please shout this", "d": "six of them", "e": "calm day",
         "f": "one two three four"}


def test_a_step_defined_in_a_test_runs_in_a_build(tmp_path: Path, tokenizer_path: Path, registered: None) -> None:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", [{"id": key, "text": text} for key, text in TEXTS.items()])
    steps = '\n[[steps]]\nuse = "toy_no_letter"\n\n[[steps]]\nuse = "length"\nmax_words = 3\n'
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"], extra=steps)
    result = build(load_pipeline(pipeline), LocalStore(tmp_path / "store"), InProcessExecutor(), (), Progress(quiet=True))
    written = {members["txt"].decode() for _, members in read_samples(tmp_path / "store", result.snapshot.manifest)}
    assert written == {"plain words here", "PLEASE SHOUT THIS", "calm day"}
    toy, length = result.snapshot.manifest["stats"]["steps"]
    assert (toy["use"], toy["documents"], toy["dropped"], toy["changed"]) == ("toy_no_letter", 6, 2, 1)
    assert toy["reasons"] == {"has x": 2}
    assert (length["documents"], length["kept"], length["reasons"]) == (4, 3, {"too many words": 1})
    assert result.snapshot.manifest["config"]["steps"][0] == {"use": "toy_no_letter", "letter": "x", "shout": "shout"}


def test_a_test_step_settings_are_checked(tmp_path: Path, tokenizer_path: Path, registered: None) -> None:
    pipeline = write_pipeline(tmp_path, tokenizer_path, extra='\n[[steps]]\nuse = "toy_no_letter"\nletter = "xy"\n')
    with pytest.raises(Exception, match=r"steps\[0\]\.letter: must be one character, got 'xy'"):
        load_pipeline(pipeline)


def test_a_name_is_registered_once_and_well_formed(registered: None) -> None:
    assert catalog.register(NoLetter) is NoLetter and "toy_no_letter" in catalog.names()

    @dataclass(frozen=True)
    class Other(NoLetter):
        """Another class under the toy's name."""

    with pytest.raises(ValueError, match="'toy_no_letter' is registered by NoLetter already"):
        catalog.register(Other)

    @dataclass(frozen=True)
    class Badly(NoLetter):
        """A name that is no name."""

        use: ClassVar[str] = "Bad Name"

    with pytest.raises(ValueError, match="step name 'Bad Name' must match"):
        catalog.register(Badly)


def test_spawned_workers_run_a_test_step_they_import_by_its_class(tmp_path: Path, tokenizer_path: Path,
                                                                  registered: None) -> None:
    """Workers get the configured step objects with their task (their class pickled by name), so a
    spawned worker imports this module and never asks the registry: the same snapshot as in-process."""
    write_jsonl(tmp_path / "corpus" / "a.jsonl", [{"id": key, "text": text} for key, text in TEXTS.items()])
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"], extra='\n[[steps]]\nuse = "toy_no_letter"\n')
    spawned = build_local(pipeline, tmp_path / "store1", workers=2)
    here = build(load_pipeline(pipeline), LocalStore(tmp_path / "store2"), InProcessExecutor(), (), Progress(quiet=True))
    assert spawned.snapshot.id == here.snapshot.id
    assert spawned.snapshot.manifest["stats"]["steps"][0]["reasons"] == {"has x": 2}


@dataclass(frozen=True)
class Raises(DocumentStep):
    """A step whose code fails on one document, or answers with what no step may answer."""

    use: ClassVar[str] = "toy_raises"
    answer_number: bool = False

    def apply(self, document: StepDocument) -> Outcome:
        if "fox" in document.text:
            if self.answer_number:
                return 3  # type: ignore[return-value]  # what the test checks is refused
            raise KeyError("no fox allowed")
        return None


@pytest.mark.parametrize(("setting", "needle"), [
    ("", "step 'toy_raises' on document 'b': KeyError: 'no fox allowed'"),
    ("answer_number = true", "step 'toy_raises' on document 'b': answered int; a step returns None (keep), Drop(reason)"),
])
def test_a_step_that_raises_is_named_with_its_document(tmp_path: Path, tokenizer_path: Path,
                                                        setting: str, needle: str) -> None:
    """User code that raises is one InputError naming the step and the document, nothing published."""
    catalog.register(Raises)
    try:
        write_jsonl(tmp_path / "corpus" / "a.jsonl", [{"id": key, "text": text} for key, text in TEXTS.items()])
        pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"], extra=f'\n[[steps]]\nuse = "toy_raises"\n{setting}\n')
        store = LocalStore(tmp_path / "store")
        with pytest.raises(InputError, match=re.escape(needle)):
            build(load_pipeline(pipeline), store, InProcessExecutor(), (), Progress(quiet=True))
        assert list(store.list("refs/")) == []
    finally:
        catalog.unregister(Raises.use)
