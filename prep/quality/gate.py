"""`[checks]`: what a build must measure before it publishes (docs/build.md, "Checks").

Parsed with the pipeline (imported by prep.config, so it loads no numpy), each check judged
against the build's measures once its stages are done. A fraction's limit is the decimal the
pipeline file spells (0.001 is exactly 1/1000) and a measured fraction is compared to it exactly,
as a ratio of counts; the manifest records both as decimal strings (canonical JSON holds no
floats), with the counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from prep.errors import ConfigError, PrepError
from prep.quality.lengths import EXACT_BELOW
from prep.store.layout import is_decimal

PREFIX = "checks."
FRACTIONS = ("max_skipped_fraction", "max_duplicate_fraction")
MINIMUMS = ("min_documents", "min_tokens_per_doc_p50")
PER_STEP = "max_dropped_fraction"
KEYS = (*FRACTIONS, *MINIMUMS, PER_STEP)


class ChecksFailedError(PrepError):
    """A build's [checks] did not hold: nothing was published (exit 2)."""


@dataclass(frozen=True)
class Check:
    """One declared check: its key in [checks], its limit (a decimal fraction's text, or an
    integer), and for a per-step check the step's index in [[steps]] (from 0)."""

    name: str
    limit: str | int
    step: int | None = None

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "limit": self.limit, **({"step": self.step + 1} if self.step is not None else {})}


@dataclass(frozen=True)
class Checks:
    """The pipeline's [checks], in a fixed order (KEYS, then steps by index); none when absent."""

    checks: tuple[Check, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.checks)


@dataclass(frozen=True)
class Measures:
    """What checks are judged on, from the build's stats: records the readers met, bad ones
    skipped, documents that reached dedup and the duplicates (exact and near) it dropped, documents
    written, the median tokens per written document (its lower bound), and per step (documents
    it saw, documents it dropped)."""

    records: int
    skipped: int
    deduplicated: int
    duplicates: int
    written: int
    median_tokens: int
    steps: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class CheckResult:
    """A check judged: the measured value (an integer, or a fraction `count` / `of`) and whether it holds."""

    check: Check
    measured: int | Fraction
    count: int | None = None
    of: int | None = None

    @property
    def passed(self) -> bool:
        if isinstance(self.check.limit, str):
            return self.measured <= Fraction(self.check.limit)
        return self.measured >= self.check.limit

    def measured_text(self) -> str:
        """The measured value as the manifest and messages spell it (a fraction to 6 significant digits)."""
        if isinstance(self.measured, Fraction):
            return f"{float(self.measured):.6g}"
        return str(self.measured)

    def to_json(self) -> dict[str, object]:
        counts = {"count": self.count, "of": self.of} if self.count is not None else {}
        measured: object = self.measured_text() if isinstance(self.measured, Fraction) else self.measured
        return {**self.check.to_json(), "measured": measured, **counts, "passed": self.passed}

    def describe(self) -> str:
        """`name: measured (count of N) above/below the limit L`, for the error line."""
        counts = f" ({self.count} of {self.of})" if self.count is not None else ""
        side = "above the maximum" if isinstance(self.check.limit, str) else "below the minimum"
        return f"checks.{self.check.name} = {self.check.limit}: measured {self.measured_text()}{counts}, {side}"


def judge(checks: Checks, measures: Measures) -> list[CheckResult]:
    """Each declared check with what the build measured for it."""
    return [_judge(check, measures) for check in checks.checks]


def _judge(check: Check, measures: Measures) -> CheckResult:
    if check.step is not None:
        seen, dropped = measures.steps[check.step]
        return _fraction(check, dropped, seen)
    if check.name == "max_skipped_fraction":
        return _fraction(check, measures.skipped, measures.records)
    if check.name == "max_duplicate_fraction":
        return _fraction(check, measures.duplicates, measures.deduplicated)
    if check.name == "min_documents":
        return CheckResult(check, measures.written)
    return CheckResult(check, measures.median_tokens)


def _fraction(check: Check, count: int, of: int) -> CheckResult:
    """`count` / `of` (0 when `of` is 0: nothing met, nothing dropped)."""
    return CheckResult(check, Fraction(count, of) if of else Fraction(0), count, of)


def failure(source: str, results: Sequence[CheckResult]) -> ChecksFailedError | None:
    """The one-line error listing every check that did not hold, None when all did."""
    failed = [result.describe() for result in results if not result.passed]
    if not failed:
        return None
    return ChecksFailedError(f"{source}: {len(failed)} of {len(results)} [checks] failed, nothing published "
                             f"(the built objects are kept: a rerun reuses them): " + "; ".join(failed))


def parse_checks(table: Mapping[str, object], step_uses: Sequence[str], source: str = "pipeline") -> Checks:
    """The [checks] table; a ConfigError names the first bad key (`checks.KEY: why`)."""
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise _fail(source, unknown[0], f"unknown key (use {', '.join(KEYS)})")
    checks = [Check(key, _decimal(source, key, table[key])) for key in FRACTIONS if key in table]
    checks += [Check(key, _count(source, key, table[key])) for key in MINIMUMS if key in table]
    if "min_tokens_per_doc_p50" in table and int(checks[-1].limit) > EXACT_BELOW:
        raise _fail(source, "min_tokens_per_doc_p50", f"must be at most {EXACT_BELOW} (the median is exact below "
                                                      f"{EXACT_BELOW} tokens only), got {checks[-1].limit}")
    per_step = table.get(PER_STEP, {})
    if not isinstance(per_step, dict):
        raise _fail(source, PER_STEP, f"expected a table of step = fraction (a step's number from 1 or its use), "
                                      f"got {per_step!r}")
    return Checks((*checks, *_step_checks(per_step, step_uses, source)))


def _step_checks(table: Mapping[str, object], uses: Sequence[str], source: str) -> list[Check]:
    """`max_dropped_fraction.STEP`: STEP a step's number (from 1) or its unique `use`, as
    `prep show --dropped` names steps; each step at most once."""
    by_step: dict[int, Check] = {}
    for step, value in table.items():
        key = f"{PER_STEP}.{step}"
        index = _step_index(step, uses)
        if index is None:
            listed = ", ".join(f"{number} ({use})" for number, use in enumerate(uses, start=1)) or "none"
            why = "names several steps: use its number" if uses.count(step) > 1 else "names no step"
            raise _fail(source, key, f"{why} (the [[steps]] are: {listed})")
        if index in by_step:
            raise _fail(source, key, f"step {index + 1} has a check already ({PREFIX}{by_step[index].name})")
        by_step[index] = Check(key, _decimal(source, key, value), index)
    return [by_step[index] for index in sorted(by_step)]


def _step_index(step: str, uses: Sequence[str]) -> int | None:
    if is_decimal(step) and 1 <= int(step) <= len(uses):
        return int(step) - 1
    return uses.index(step) if uses.count(step) == 1 else None


def _decimal(source: str, key: str, value: object) -> str:
    """A fraction in [0, 1], as the shortest decimal text of its float (what `prep show --pipeline`
    writes back and reads as the same)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(source, key, f"expected a fraction from 0 to 1, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise _fail(source, key, f"must be from 0 to 1, got {value!r}")
    return repr(float(value))  # an integer 0 or 1 too: "1.0", as the float it equals


def _count(source: str, key: str, value: object) -> int:
    """A count: an integer >= 0."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(source, key, f"expected an integer, got {type(value).__name__} {value!r}")
    if value < 0:
        raise _fail(source, key, f"must be >= 0, got {value}")
    return value


def _fail(source: str, key: str, message: str) -> ConfigError:
    return ConfigError(f"{source}: {PREFIX}{key}: {message}")
