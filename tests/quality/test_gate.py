"""[checks] as the pipeline file gives them: every bad key or value one ConfigError naming it, steps
named as `prep show --dropped` names them; and a check judged exactly against its decimal limit."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from prep.config import parse_pipeline
from prep.errors import ConfigError
from prep.quality.gate import Check, Checks, Measures, failure, judge

MINIMAL = {"dataset": "tiny", "input": {"paths": ["a.jsonl"]}, "tokenizer": {"path": "t.json"}}
STEPS: list[dict[str, Any]] = [{"use": "length", "min_words": 3}, {"use": "language", "languages": ["en"]},
                               {"use": "length", "max_chars": 9}]


def parsed(checks: dict[str, Any], steps: list[dict[str, Any]] | None = None) -> Checks:
    data = {**MINIMAL, "checks": checks, **({"steps": steps} if steps else {})}
    return parse_pipeline(data, Path("/p"), "p.toml").checks


@pytest.mark.parametrize(("checks", "message"), [
    ({"max_skiped_fraction": 0.1}, "p.toml: checks.max_skiped_fraction: unknown key (use max_skipped_fraction, "),
    ({"max_skipped_fraction": 1.5}, "p.toml: checks.max_skipped_fraction: must be from 0 to 1, got 1.5"),
    ({"max_skipped_fraction": -0.0001}, "p.toml: checks.max_skipped_fraction: must be from 0 to 1, got -0.0001"),
    ({"max_duplicate_fraction": float("nan")}, "p.toml: checks.max_duplicate_fraction: must be from 0 to 1, got nan"),
    ({"max_duplicate_fraction": "0.3"}, "p.toml: checks.max_duplicate_fraction: expected a fraction from 0 to 1, got str"),
    ({"max_duplicate_fraction": True}, "p.toml: checks.max_duplicate_fraction: expected a fraction from 0 to 1, got bool"),
    ({"min_documents": 10.0}, "p.toml: checks.min_documents: expected an integer, got float 10.0"),
    ({"min_documents": -1}, "p.toml: checks.min_documents: must be >= 0, got -1"),
    ({"min_tokens_per_doc_p50": 2000}, "p.toml: checks.min_tokens_per_doc_p50: must be at most 1024"),
    ({"max_dropped_fraction": 0.5}, "p.toml: checks.max_dropped_fraction: expected a table of step = fraction"),
    ({"max_dropped_fraction": {"pii": 0.5}}, "p.toml: checks.max_dropped_fraction.pii: names no step (the [[steps]] "
                                             "are: 1 (length), 2 (language), 3 (length))"),
    ({"max_dropped_fraction": {"4": 0.5}}, "p.toml: checks.max_dropped_fraction.4: names no step"),
    ({"max_dropped_fraction": {"length": 0.5}}, "p.toml: checks.max_dropped_fraction.length: names several steps: "
                                                "use its number"),
    ({"max_dropped_fraction": {"2": 0.5, "language": 0.1}}, "p.toml: checks.max_dropped_fraction.language: step 2 "
                                                            "has a check already (checks.max_dropped_fraction.2)"),
    ({"max_dropped_fraction": {"1": {"x": 0.5}}}, "p.toml: checks.max_dropped_fraction.1: expected a fraction"),
])
def test_every_bad_check_is_one_error_naming_its_key(checks: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parsed(checks, STEPS)
    assert raised.value.message.startswith(message) and "\n" not in raised.value.message


def test_checks_parse_in_a_fixed_order_with_steps_by_number_or_use() -> None:
    checks = parsed({"max_dropped_fraction": {"3": 0.25, "language": 1}, "min_documents": 5,
                     "max_skipped_fraction": 0.001}, STEPS)
    assert checks.checks == (Check("max_skipped_fraction", "0.001"), Check("min_documents", 5),
                             Check("max_dropped_fraction.language", "1.0", 1), Check("max_dropped_fraction.3", "0.25", 2))
    assert not parsed({}) and not parse_pipeline(dict(MINIMAL), Path("/p"), "p.toml").checks


def test_checks_change_no_resolved_setting() -> None:
    """[checks] change no output: the resolved config (and so no task key) holds them."""
    plain = parse_pipeline(dict(MINIMAL), Path("/p"), "p.toml")
    assert parse_pipeline({**MINIMAL, "checks": {"min_documents": 3}}, Path("/p"), "p.toml").resolved() == plain.resolved()


MEASURES = Measures(records=1000, skipped=1, deduplicated=999, duplicates=300, written=699, median_tokens=50,
                    steps=((999, 0),))


@pytest.mark.parametrize(("check", "passed", "measured"), [
    (Check("max_skipped_fraction", "0.001"), True, Fraction(1, 1000)),  # exactly at the decimal limit: holds
    (Check("max_skipped_fraction", "0.0009"), False, Fraction(1, 1000)),
    (Check("max_duplicate_fraction", "0.3"), False, Fraction(300, 999)),
    (Check("min_documents", 699), True, 699),
    (Check("min_documents", 700), False, 699),
    (Check("min_tokens_per_doc_p50", 50), True, 50),
    (Check("min_tokens_per_doc_p50", 51), False, 50),
    (Check("max_dropped_fraction.1", "0", 0), True, Fraction(0)),
])
def test_a_check_is_judged_exactly(check: Check, passed: bool, measured: int | Fraction) -> None:
    [result] = judge(Checks((check,)), MEASURES)
    assert (result.passed, result.measured) == (passed, measured)


def test_the_failure_names_every_failed_check_with_its_measured_value_on_one_line() -> None:
    results = judge(Checks((Check("max_skipped_fraction", "0.0009"), Check("min_documents", 1),
                            Check("min_documents", 700))), MEASURES)
    error = failure("p.toml", results)
    assert error is not None and error.exit_code == 2
    assert error.message == ("p.toml: 2 of 3 [checks] failed, nothing published (the built objects are kept: a rerun "
                             "reuses them): checks.max_skipped_fraction = 0.0009: measured 0.001 (1 of 1000), above "
                             "the maximum; checks.min_documents = 700: measured 699, below the minimum")
    assert failure("p.toml", results[1:2]) is None
