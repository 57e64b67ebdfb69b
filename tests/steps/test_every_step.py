"""Every built-in step, with a user function beside them, in one pipeline: the same snapshot on
1, 2 and 3 local workers and on Ray (issue 41: same id for every step, any worker count and
executor). Each built-in needs an example table here, so a new one is covered when it registers."""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from pathlib import Path

import pytest

from prep.steps import catalog
from tests.helpers import run_prep, write_jsonl, write_pipeline
from tests.runner.test_ray import _ray_env

EXAMPLES = {
    "length": "min_words = 4",
    "decontaminate": 'paths = ["bench/*.jsonl"]\nngram = 8',
    "gopher_quality": "min_words = 5",
    "gopher_repetition": "",
    "c4": "min_sentences = 2",
    "pii": "",
    "language": 'languages = ["en"]\nmin_score = 0.3',
}
"""A `[[steps]]` table body for each built-in, chosen so a corpus of short English documents
keeps most of its documents (each step still drops some)."""

USER_RULES = '''
def no_digits_seven(document, digit="7"):
    return "has a seven" if digit in document.text else None
'''

PHRASES = (["The old river", "A quiet village", "The new library", "Our small team", "The city council"],
           ["flows past", "looks over", "opens near", "works beside", "brings food to"],
           ["the green hills", "the busy harbour", "the central square", "the north station", "the stone bridge"],
           ["every morning.", "before the rain starts.", "during the summer months.", "after the long winter."])


def _document(rng: random.Random, index: int) -> str:
    sentences = [" ".join(rng.choice(words) for words in PHRASES) for _ in range(rng.randint(1, 7))]
    extra = [f"Write to team{index}@example.org or call 10.0.{index % 250}.1 today."] if index % 5 == 0 else []
    noise = ["lorem ipsum dolor sit amet {x}"] if index % 11 == 0 else []
    return " ".join(sentences + extra + noise + [f"Item {index}."])


def test_every_builtin_step_has_an_example() -> None:
    assert set(catalog.names()) <= set(EXAMPLES), f"add an example table for {set(catalog.names()) - set(EXAMPLES)}"


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Path:
    folder = tmp_path_factory.mktemp("allsteps")
    rng = random.Random(41)
    for name in ("a", "b", "c"):
        write_jsonl(folder / "corpus" / f"{name}.jsonl",
                    [{"id": f"{name}{index}", "text": _document(rng, index)} for index in range(40)])
    (folder / "bench").mkdir()
    (folder / "bench" / "quiz.jsonl").write_text(json.dumps(
        {"question": "The old river flows past the green hills every morning", "answer": "yes"}) + "\n")
    (folder / "userrules_every.py").write_text(USER_RULES)
    tables = [f"[[steps]]\nuse = \"{use}\"\n{EXAMPLES[use]}\n" for use in catalog.names()]
    tables.append('[[steps]]\nuse = "userrules_every:no_digits_seven"\n')
    return write_pipeline(folder, tokenizer_path, ["corpus"], extra="\n" + "\n".join(tables))


def _build(pipeline: Path, store: Path, *extra: str, env: dict[str, str] | None = None) -> str:
    run = run_prep("build", pipeline, "--store", store, *extra, cwd=pipeline.parent, timeout=600, env=env)
    return run.stdout.strip().splitlines()[-1]


def test_the_same_snapshot_on_any_worker_count_and_on_ray(pipeline: Path) -> None:
    """On Ray the CLI starts for itself, in its own process: a second Ray started in one test
    process (test_ray.py's fixture) after another had been shut down there never started its GCS
    (Ray's token authentication keeps the first cluster's token)."""
    ids = {workers: _build(pipeline, pipeline.parent / f"store{workers}", "--workers", str(workers))
           for workers in (1, 2, 3)}
    assert len(set(ids.values())) == 1, ids
    folder = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths < 108 bytes
    try:
        on_ray = _build(pipeline, pipeline.parent / "store-ray", "--workers", "2", "--executor", "ray",
                        env=_ray_env(folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert on_ray == ids[1]
    shown = json.loads(run_prep("show", ids[1], "--json", "--store", pipeline.parent / "store1").stdout)
    steps = shown["stats"]["steps"]
    assert [step["use"] for step in steps] == [*catalog.names(), "userrules_every:no_digits_seven"]
    assert shown["stats"]["documents_read"] > 0 and any(step["dropped"] for step in steps)
