"""Changing one document step recomputes that step and those after it, never those before it: a
build replays the earlier steps from the outcomes an earlier build committed, and what it makes is
byte for byte what a build that ran every step makes (same snapshot id)."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from prep.config import load_pipeline
from prep.progress import Progress
from prep.runner.build import BuildResult, build
from prep.storage import LocalStore
from tests.helpers import prep_env, run_prep, user_package, write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor, build_local
from tests.runner.test_reuse import flip_byte, object_path

LOGGED = '''
from pathlib import Path


def _called(name, document):
    with open(Path(__file__).with_name("calls-" + name), "a") as log:
        log.write((document.id or "?") + "\\n")


def short(document, most=60):
    _called("short", document)
    return len(document.text) <= most or "too long"


def shout(document, word="loud"):
    _called("shout", document)
    return {"text": document.text.upper()} if word in document.text else True


def banned(document, word="spam"):
    _called("banned", document)
    if "boom" in document.text:
        raise ValueError("boom")
    return word not in document.text.lower() or "banned word"
'''
TEXTS = [f"document {n} is loud" if n % 3 == 0 else f"document {n} has spam" if n % 4 == 0
         else f"document {n} " + "long " * 20 if n % 5 == 0 else f"document {n} is quiet" for n in range(40)]


@pytest.fixture
def package(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A user module of three logged steps beside the pipelines."""
    with user_package(tmp_path, "reusesteps", {"logged.py": LOGGED}) as name:
        yield tmp_path / name, name


def _pipeline(root: Path, tokenizer_path: Path, package: str, steps: list[str], name: str,
              texts: list[str] = TEXTS, on_error: str = "fail") -> Path:
    write_jsonl(root / "corpus" / "a.jsonl", [{"id": f"d{n}", "text": text} for n, text in enumerate(texts)])
    extra = "".join(f'\n[[steps]]\nuse = "{package}.logged:{step}"\n' for step in steps)
    pipeline = write_pipeline(root, tokenizer_path, ["corpus"], name=name, extra=extra)
    if on_error != "fail":
        pipeline.write_text(pipeline.read_text().replace("[input]\n", f'[input]\non_error = "{on_error}"\n', 1))
    return pipeline


def _build(pipeline: Path, store: Path) -> BuildResult:
    return build(load_pipeline(pipeline), LocalStore(store), InProcessExecutor(), (), Progress(quiet=True))


def _calls(folder: Path) -> dict[str, int]:
    """How many documents each logged step was asked about so far."""
    return {name: len(path.read_text().splitlines()) if (path := folder / f"calls-{name}").exists() else 0
            for name in ("short", "shout", "banned")}


def _changed(calls: dict[str, int], before: dict[str, int]) -> set[str]:
    return {name for name in calls if calls[name] != before[name]}


def test_changing_a_step_reruns_it_and_the_steps_after_it_only(tmp_path: Path, tokenizer_path: Path,
                                                               package: tuple[Path, str]) -> None:
    folder, name = package
    first = _pipeline(tmp_path, tokenizer_path, name, ["short", "shout", "banned"], "first.toml")
    _build(first, tmp_path / "store")
    assert _changed(_calls(folder), dict.fromkeys(("short", "shout", "banned"), 0)) == {"short", "shout", "banned"}

    last_changed = first.with_name("last.toml")
    last_changed.write_text(first.read_text().replace('logged:banned"', 'logged:banned"\nargs = { word = "quiet" }'))
    before = _calls(folder)
    replayed = _build(last_changed, tmp_path / "store")
    assert _changed(_calls(folder), before) == {"banned"} and replayed.stages["tokenize"].ran == 1

    middle_changed = first.with_name("middle.toml")
    middle_changed.write_text(first.read_text().replace('logged:shout"', 'logged:shout"\nargs = { word = "quiet" }'))
    before = _calls(folder)
    middle = _build(middle_changed, tmp_path / "store")
    assert _changed(_calls(folder), before) == {"shout", "banned"}

    for pipeline, built in ((last_changed, replayed), (middle_changed, middle)):  # what running every step makes
        fresh = _build(pipeline, tmp_path / f"fresh-{pipeline.stem}")
        assert built.snapshot.id == fresh.snapshot.id
        assert built.snapshot.manifest["stats"] == fresh.snapshot.manifest["stats"]
    quiet = sum(1 for text in TEXTS if len(text) <= 60 and "quiet" in text)
    assert replayed.snapshot.manifest["stats"]["steps"][2]["reasons"] == {"banned word": quiet}

    before = _calls(folder)
    again = _build(last_changed, tmp_path / "store")
    assert again.snapshot.id == replayed.snapshot.id and _calls(folder) == before  # up to date: nothing runs


def test_a_step_added_at_the_end_replays_those_before_it(tmp_path: Path, tokenizer_path: Path,
                                                        package: tuple[Path, str]) -> None:
    folder, name = package
    _build(_pipeline(tmp_path, tokenizer_path, name, ["short", "shout"], "two.toml"), tmp_path / "store")
    before = _calls(folder)
    three = _pipeline(tmp_path, tokenizer_path, name, ["short", "shout", "banned"], "three.toml")
    built = _build(three, tmp_path / "store")
    assert _changed(_calls(folder), before) == {"banned"}
    assert built.snapshot.id == _build(three, tmp_path / "fresh").snapshot.id


def test_reordered_steps_run_again_and_change_the_id(tmp_path: Path, tokenizer_path: Path,
                                                     package: tuple[Path, str]) -> None:
    folder, name = package
    first = _build(_pipeline(tmp_path, tokenizer_path, name, ["short", "shout"], "a.toml"), tmp_path / "store")
    before = _calls(folder)
    swapped = _build(_pipeline(tmp_path, tokenizer_path, name, ["shout", "short"], "b.toml"), tmp_path / "store")
    assert _changed(_calls(folder), before) == {"short", "shout"} and swapped.snapshot.id != first.snapshot.id


def test_skipped_documents_are_listed_the_same_when_replayed(tmp_path: Path, tokenizer_path: Path,
                                                             package: tuple[Path, str]) -> None:
    """on_error = "skip": the documents a replayed step raised on are dropped and listed with the
    bad records exactly as when it ran."""
    folder, name = package
    texts = [*TEXTS[:10], "boom one", *TEXTS[10:20], "boom two"]
    _build(_pipeline(tmp_path, tokenizer_path, name, ["banned", "short"], "a.toml", texts, "skip"), tmp_path / "store")
    changed = _pipeline(tmp_path, tokenizer_path, name, ["banned", "shout"], "b.toml", texts, "skip")
    before = _calls(folder)
    replayed = _build(changed, tmp_path / "store")
    assert _changed(_calls(folder), before) == {"shout"}
    fresh = _build(changed, tmp_path / "fresh")
    assert replayed.snapshot.id == fresh.snapshot.id
    stats = replayed.snapshot.manifest["stats"]
    assert stats == fresh.snapshot.manifest["stats"]
    assert stats["steps"][0]["reasons"]["raised ValueError"] == 2


def _stage_output(result: BuildResult, stage: str) -> str:
    return str(next(entry["output"] for entry in result.snapshot.manifest["stages"] if entry["name"] == stage))


def test_a_corrupt_outcomes_object_is_never_replayed(tmp_path: Path, tokenizer_path: Path,
                                                     package: tuple[Path, str]) -> None:
    """A flipped byte in a committed step outcomes object: the build runs that step again instead
    (outcomes are a cache) and still makes what a build that ran every step makes."""
    folder, name = package
    first = _build(_pipeline(tmp_path, tokenizer_path, name, ["short", "shout", "banned"], "a.toml"),
                   tmp_path / "store")
    tokenize = json.loads((object_path(tmp_path / "store", _stage_output(first, "tokenize"))).read_bytes())
    flip_byte(object_path(tmp_path / "store", tokenize["tasks"][0]["step_outcomes"][1]), 30)  # shout's
    changed = _pipeline(tmp_path, tokenizer_path, name, ["short", "shout", "short"], "b.toml")
    before = _calls(folder)
    built = _build(changed, tmp_path / "store")
    assert _changed(_calls(folder), before) == {"shout", "short"}
    assert _calls(folder)["short"] - before["short"] < len(TEXTS)  # the first short replayed; only the last ran
    assert built.snapshot.id == _build(changed, tmp_path / "fresh").snapshot.id


def test_spawned_workers_replay_to_the_same_snapshot(tmp_path: Path, tokenizer_path: Path,
                                                     package: tuple[Path, str]) -> None:
    folder, name = package
    for index in range(3):  # three input files: three tasks
        write_jsonl(tmp_path / "corpus" / f"b{index}.jsonl",
                    [{"id": f"b{index}-{n}", "text": text} for n, text in enumerate(TEXTS)])
    build_local(_pipeline(tmp_path, tokenizer_path, name, ["short", "shout"], "a.toml"), tmp_path / "store", workers=2)
    changed = _pipeline(tmp_path, tokenizer_path, name, ["short", "banned"], "b.toml")
    before = _calls(folder)
    replayed = build_local(changed, tmp_path / "store", workers=2)
    assert _changed(_calls(folder), before) == {"banned"}
    assert replayed.snapshot.id == _build(changed, tmp_path / "fresh").snapshot.id


def test_a_build_killed_after_committing_outcomes_reruns_to_the_same_snapshot(tmp_path: Path, tokenizer_path: Path,
                                                                             package: tuple[Path, str]) -> None:
    """Killed after a task committed its steps' outcomes but before its own record: the rerun
    replays them (the changed step runs no more) and ends where an uninterrupted build does."""
    folder, name = package
    for index in range(3):
        write_jsonl(tmp_path / "corpus" / f"b{index}.jsonl",
                    [{"id": f"b{index}-{n}", "text": text} for n, text in enumerate(TEXTS)])
    first = _pipeline(tmp_path, tokenizer_path, name, ["short", "shout"], "a.toml")
    run_prep("build", first, "--store", tmp_path / "store", "--workers", "1", cwd=tmp_path)
    changed = _pipeline(tmp_path, tokenizer_path, name, ["short", "banned"], "b.toml")
    crashed = run_prep("build", changed, "--store", tmp_path / "store", "--workers", "1", check=False, cwd=tmp_path,
                       env=prep_env(PREP_CRASH_AT="tokenize.before_commit:2"), new_session=True)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    before = _calls(folder)
    rerun = run_prep("build", changed, "--store", tmp_path / "store", "--workers", "1", cwd=tmp_path)
    assert _calls(folder)["short"] == before["short"]
    assert _calls(folder)["banned"] - before["banned"] < 4 * len(TEXTS)  # the killed task's steps replayed
    fresh = run_prep("build", changed, "--store", tmp_path / "fresh", "--workers", "1", cwd=tmp_path)
    assert rerun.stdout.split()[-1] == fresh.stdout.split()[-1]
