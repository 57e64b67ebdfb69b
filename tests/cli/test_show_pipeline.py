"""`prep show SNAP --pipeline`: the pipeline a snapshot was built from, as a TOML file that
`prep.config` parses back to the same resolved config (input files and tokenizer re-pointed);
`--json` prints the manifest's `config`; an older manifest prints what it records."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prep.config import load_pipeline, parse_pipeline
from prep.progress import Progress
from prep.runner.build import build
from prep.storage import LocalStore
from tests.helpers import make_records, run_prep, user_package, write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor

RULES = '''
from . import helpers


def mark(document, word="spam", times=1, loud=False, note=""):
    return {"metadata": {"mark": helpers.count(document.text, word) * times}}
'''
BENCH = {"question": "what is the capital of the small country beside the big lake", "answer": "none"}
PIPELINES = {
    "plain": ("", ""),
    "metadata_fields": ('metadata_fields = ["lang"]\non_error = "skip"\nmax_document_bytes = "1MiB"\n', ""),
    "float settings": ("", '[[steps]]\nuse = "gopher_quality"\nmin_words = 2\nmin_mean_word_length = 2.5\n'
                           "max_symbol_word_ratio = 0.125\nmin_alpha_words_ratio = 0.1\nmin_stop_words = 0\n"
                           '[[steps]]\nuse = "length"\nmin_chars = 3\n'
                           '[[steps]]\nuse = "gopher_repetition"\nmax_dup_line_fraction = 1\n'),
    "function": ("", '[[steps]]\nuse = "{package}.rules:mark"\nargs = {{ word = "beta", times = 3, loud = true, '
                     'note = "tab\\there \\"quoted\\" \\u00e9" }}\nmetadata = ["mark"]\n'),
    "decontaminate": ("", '[[steps]]\nuse = "decontaminate"\npaths = ["bench/*.jsonl"]\nfields = ["question"]\n'
                          "ngram = 8\n"),
}


@pytest.fixture
def package(tmp_path: Path) -> Iterator[str]:
    """A fresh user package beside the pipeline."""
    helpers = "def count(text, word):\n    return text.count(word)\n"
    with user_package(tmp_path, "showsteps", {"rules.py": RULES, "helpers.py": helpers}) as name:
        yield name


def _built(root: Path, tokenizer: Path, kind: str, package: str) -> dict[str, Any]:
    """Build the pipeline `kind` names in this process; its snapshot manifest."""
    records = [{**record, "lang": "en"} for record in make_records(30, seed=5)]
    write_jsonl(root / "corpus" / "a.jsonl", records[:20])
    write_jsonl(root / "corpus" / "more" / "b.jsonl", records[20:])
    write_jsonl(root / "bench" / "qa.jsonl", [BENCH])
    extra_input, extra = PIPELINES[kind]
    pipeline = write_pipeline(root, tokenizer, ["corpus/**/*.jsonl"], extra_input=extra_input,
                              extra="\n" + extra.format(package=package))
    result = build(load_pipeline(pipeline), LocalStore(root / "store"), InProcessExecutor(), (), Progress(quiet=True))
    return result.snapshot.manifest


@pytest.mark.parametrize("kind", sorted(PIPELINES))
def test_the_printed_pipeline_parses_back_to_the_recorded_config(tmp_path: Path, tokenizer_path: Path, package: str,
                                                                 kind: str) -> None:
    manifest = _built(tmp_path, tokenizer_path, kind, package)
    shown = run_prep("show", "tiny@latest", "--store", tmp_path / "store", "--pipeline")
    assert shown.stderr == ""
    data = tomllib.loads(shown.stdout)
    assert data["input"]["paths"] == ["a.jsonl", "more/b.jsonl"]  # relative to corpus/, the folder holding them
    assert data["tokenizer"]["path"] == ".prep/tokenizer.json"
    assert f"# sha256:{manifest['tokenizer']['sha256']}: the snapshot carries it" in shown.stdout
    data["input"]["paths"] = [str(tmp_path / "corpus" / path) for path in data["input"]["paths"]]
    data["tokenizer"]["path"] = str(tokenizer_path)
    assert parse_pipeline(data, tmp_path, "shown.toml").resolved() == manifest["config"]
    as_json = run_prep("show", "tiny@latest", "--store", tmp_path / "store", "--pipeline", "--json")
    assert json.loads(as_json.stdout) == manifest["config"]


def test_steps_are_written_with_their_types_and_what_was_found_in_comments(tmp_path: Path, tokenizer_path: Path,
                                                                           package: str) -> None:
    _built(tmp_path, tokenizer_path, "float settings", package)
    shown = run_prep("show", "tiny@latest", "--store", tmp_path / "store", "--pipeline").stdout
    assert "min_mean_word_length = 2.5\n" in shown and "max_dup_line_fraction = 1.0\n" in shown
    assert "max_chars" not in shown  # an unset bound stays unset
    (steps_dir := tmp_path / "again").mkdir()
    _built(steps_dir, tokenizer_path, "decontaminate", package)
    shown = run_prep("show", "tiny@latest", "--store", steps_dir / "store", "--pipeline").stdout
    assert 'paths = ["bench/*.jsonl"]\n' in shown
    assert '# found when the pipeline was read: files = [{name = "bench/qa.jsonl", sha256 = "' in shown


def test_a_function_steps_code_identity_is_a_comment(tmp_path: Path, tokenizer_path: Path, package: str) -> None:
    manifest = _built(tmp_path, tokenizer_path, "function", package)
    shown = run_prep("show", manifest["dataset"] + "@latest", "--store", tmp_path / "store", "--pipeline").stdout
    (step,) = manifest["config"]["steps"]
    assert f"# code sha256 {step['code']} (" in shown
    assert "# the snapshot carries its package's sources (step_sources)" in shown
    del manifest["step_sources"]
    (old := tmp_path / "old.json").write_text(json.dumps(manifest))
    assert "# the snapshot does not carry its package's sources (built before" in run_prep("show", old, "--pipeline").stdout
    assert 'args = {loud = true, note = "tab\\there \\"quoted\\" é", times = 3, word = "beta"}' in shown
    assert "code =" not in shown


def test_an_older_manifest_prints_what_it_records(tmp_path: Path, tokenizer_path: Path, package: str) -> None:
    manifest = _built(tmp_path, tokenizer_path, "plain", package)
    for key in ("object", "bytes"):
        del manifest["tokenizer"][key]
    del manifest["config"]["input"], manifest["config"]["dedup"], manifest["config"]["tokenizer"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(manifest))
    shown = run_prep("show", old, "--pipeline")
    data = tomllib.loads(shown.stdout)
    assert data["input"] == {"paths": ["a.jsonl", "more/b.jsonl"]} and data["dedup"] == {}
    assert data["tokenizer"] == {"path": ".prep/tokenizer.json", "eos": "<|endoftext|>", "encode_special_tokens": True}
    assert "# not recorded by this snapshot (built before its manifest held [dedup])" in shown.stdout
    assert f"must be the tokenizer file of sha256:{manifest['tokenizer']['sha256']} (the snapshot does not" in shown.stdout
    data["input"]["paths"] = [str(tmp_path / "corpus" / "a.jsonl")]
    data["tokenizer"]["path"] = str(tokenizer_path)
    assert parse_pipeline(data, tmp_path).resolved()["output"] == manifest["config"]["output"]


@pytest.mark.parametrize("other", [["--at", "x:0"], ["--dropped", "1"], ["--megatron-paths", "--root", "d"]])
def test_pipeline_goes_with_no_other_view(tmp_path: Path, other: list[str]) -> None:
    result = run_prep("show", "tiny@latest", "--store", tmp_path, "--pipeline", *other, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "prep: error: --pipeline prints the pipeline file: not with --at, --dropped or --megatron-paths"]
