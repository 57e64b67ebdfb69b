"""The `[[steps]]` table of a pipeline file: one-line errors naming the key, and what the resolved config holds."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from prep.config import Pipeline, parse_pipeline
from prep.errors import ConfigError
from prep.stages.specs import TokenizeSettings
from prep.steps import catalog, length
from prep.steps.length import LengthFilter
from prep.steps.protocol import SettingError
from tests.helpers import run_prep, write_jsonl, write_pipeline

MINIMAL = {"dataset": "tiny", "input": {"paths": ["a.jsonl"]}, "tokenizer": {"path": "t.json"}}


def _parse(steps: object) -> Pipeline:
    return parse_pipeline({**MINIMAL, "steps": steps}, Path("/somewhere"), "p.toml")


@pytest.mark.parametrize(("steps", "message"), [
    ([{"use": "lenght"}], "p.toml: steps[0].use: unknown step 'lenght' "
     "(use c4, decontaminate, gopher_quality, gopher_repetition, language, length, pii)"),
    ([{"min_words": 3}], "p.toml: steps[0].use: expected str naming a step, got None"),
    ([{"use": "length"}, {"use": "length", "min_word": 3}], "p.toml: steps[1].min_word: unknown key"),
    ([{"use": "length", "min_words": "20"}], "p.toml: steps[0].min_words: expected int, got str '20'"),
    ([{"use": "length", "max_chars": True}], "p.toml: steps[0].max_chars: expected int, got bool True"),
    ([{"use": "length", "max_chars": 1.5}], "p.toml: steps[0].max_chars: expected int, got float 1.5"),
    ([{"use": "length", "min_chars": -1}], "p.toml: steps[0].min_chars: must be >= 0, got -1"),
    ([{"use": "length", "min_words": 5, "max_words": 4}], "p.toml: steps[0].min_words: must be <= max_words (4), got 5"),
    (["length"], "p.toml: steps[0]: expected a table ([[steps]]), got 'length'"),
    ({"use": "length"}, "p.toml: steps: expected list"),
])
def test_bad_steps_are_one_line_errors_naming_the_key(steps: object, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _parse(steps)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_steps_parse_in_order_and_enter_the_resolved_config_only_when_given() -> None:
    pipeline = _parse([{"use": "length", "min_words": 2}, {"use": "length", "max_chars": 10}])
    assert pipeline.steps == (LengthFilter(min_words=2), LengthFilter(max_chars=10))
    assert pipeline.resolved()["steps"] == [
        {"use": "length", "min_chars": None, "max_chars": None, "min_words": 2, "max_words": None},
        {"use": "length", "min_chars": None, "max_chars": 10, "min_words": None, "max_words": None}]
    assert "steps" not in parse_pipeline(dict(MINIMAL), Path("/x"), "p.toml").resolved()


def test_the_cli_refuses_a_bad_step_with_exit_2_before_any_task(tmp_path: Path, tokenizer_path: Path) -> None:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", [{"id": "a", "text": "one two"}])
    pipeline = write_pipeline(tmp_path, tokenizer_path, extra='\n[[steps]]\nuse = "length"\nmin_words = -3\n')
    result = run_prep("build", pipeline, "--store", tmp_path / "store", check=False)
    assert result.returncode == 2, result.stderr
    assert "steps[0].min_words: must be >= 0, got -3" in result.stderr
    assert not (tmp_path / "store" / "tasks").exists()


def test_the_tokenize_key_names_each_step_its_code_and_settings_only_when_some_are_given() -> None:
    plain = TokenizeSettings("t.json", "ab" * 32, "<eos>", True, "auto", "fail")
    assert "steps" not in plain.key_fields()
    step = LengthFilter(min_words=3)
    fields = TokenizeSettings("t.json", "ab" * 32, "<eos>", True, "auto", "fail", steps=(step,)).key_fields()
    code = catalog.code_sha256(step)
    assert fields == {**plain.key_fields(), "steps": [{"use": "length", "code": code, "settings": {
        "min_chars": None, "max_chars": None, "min_words": 3, "max_words": None}}]}
    assert code == hashlib.sha256(Path(length.__file__).read_bytes()).hexdigest()


def test_list_and_float_settings_are_typed_item_by_item() -> None:
    """A `tuple[X, ...]` setting takes a TOML list, each item checked and named by its index; a
    float setting takes an integer too."""
    from prep.steps.catalog import _typed

    assert _typed("languages", ["en", "fr"], tuple[str, ...]) == ("en", "fr")
    assert _typed("min_score", 1, float) == 1.0 and isinstance(_typed("min_score", 1, float), float)
    with pytest.raises(SettingError, match=r"languages\[1\]: expected str, got int 3"):
        _typed("languages", ["en", 3], tuple[str, ...])
    with pytest.raises(SettingError, match="languages: expected a list of str, got 'en'"):
        _typed("languages", "en", tuple[str, ...])
    with pytest.raises(SettingError, match="min_score: expected float, got bool True"):
        _typed("min_score", True, float)
