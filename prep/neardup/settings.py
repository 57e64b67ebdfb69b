"""The `[dedup.near]` settings: parsed from the pipeline's TOML table, checked, bands and rows derived.

Imported by the build driver (it checks a pipeline before any task runs), so it loads no numpy.
Bands and rows, when the table gives neither, are the (b, r) with b * r == permutations that
minimise the LSH S-curve's weighted false positive and false negative areas around the threshold
(the published method of datasketch's `_optimal_param`), integrated in decimal arithmetic precise
enough that every machine makes the same choice. The weights follow `verify`: see
`FALSE_NEGATIVE_WEIGHT`.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, localcontext

from prep.errors import ConfigError

PREFIX = "dedup.near."
"""Where the settings live in a pipeline file: every error names its key under it."""
SEED_LIMIT = 2**64
MAX_PERMUTATIONS = 16_384
"""More would take the band choice over 10 s and a signature over 64 KiB a document."""
UNICODE_VERSION = unicodedata.unidata_version
"""The Unicode version of the running Python's NFC and lowercasing, which `signatures` applies: a
task key records it, since another version may normalize some text differently."""
FALSE_NEGATIVE_WEIGHT = {True: Decimal("0.9"), False: Decimal("0.5")}
"""The derivation's weight of the false negative area (the false positive area's is 1 minus it), by
`verify`. Without it (the default) every band collision joins a cluster, so both errors weigh the
same (datasketch's default; 128 permutations at 0.8: 8 bands of 16 rows, a pair at 0.8 found with
probability 0.20, at 0.9 with 0.81). With `verify` a collision below the threshold costs one exact
Jaccard and is rejected, while a pair above it that shares no band is a duplicate kept for good:
missed pairs weigh 9 to 1 (16 x 8 at 0.8: a pair at 0.8 found with probability 0.95)."""
KEYS = ("threshold", "ngram", "permutations", "bands", "rows", "seed", "verify")
MAX_ROUNDS = 256
"""The cluster rounds' limit (prep/neardup/stars.py, here for the numpy-free driver): large-star
and small-star rounds end within O(log² n) of each (Kiveris et al.), so past this many something
is wrong with the edges, not slow."""


class NearDupSettingError(ConfigError):
    """A `[dedup.near]` setting that cannot be used: `<source>: dedup.near.<key>: <why>` (exit 2)."""

    def __init__(self, source: str, key: str, message: str) -> None:
        super().__init__(f"{source}: {PREFIX}{key}: {message}")
        self.source, self.key, self.reason = source, key, message


@dataclass(frozen=True)
class NearDupSettings:
    """MinHash LSH settings; bands * rows == permutations always holds."""

    threshold: float = 0.8
    ngram: int = 5
    permutations: int = 128
    bands: int = 8  # optimal_bands(0.8, 128, verify=False), as parse_settings derives them
    rows: int = 16
    seed: int = 0
    verify: bool = False

    def key_fields(self) -> dict[str, object]:
        """What enters a task key: every setting, the float as its shortest decimal string (canonical
        JSON holds no floats), as `DocumentStep.settings` records a step's, and `UNICODE_VERSION`."""
        return {"threshold": repr(self.threshold), "ngram": self.ngram, "permutations": self.permutations,
                "bands": self.bands, "rows": self.rows, "seed": self.seed, "verify": self.verify,
                "unicode": UNICODE_VERSION}


def parse_settings(table: Mapping[str, object], source: str = "pipeline") -> NearDupSettings:
    """The settings of a `[dedup.near]` table; NearDupSettingError names the first bad key."""
    read = _Reader(table, source)
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise read.fail(unknown[0], "unknown key")
    threshold = read.number("threshold", 0.8)
    if not 0 < threshold < 1:
        raise read.fail("threshold", f"must be within (0, 1), got {threshold}")
    ngram = read.at_least("ngram", 5, 1)
    permutations = read.at_least("permutations", 128, 1)
    if permutations > MAX_PERMUTATIONS:
        raise read.fail("permutations", f"must be <= {MAX_PERMUTATIONS}, got {permutations}")
    seed = read.at_least("seed", 0, 0)
    if seed >= SEED_LIMIT:
        raise read.fail("seed", f"must be an integer in [0, 2**64), got {seed}")
    verify = bool(read.typed("verify", bool, False))
    bands, rows = _bands_and_rows(read, threshold, permutations, verify)
    return NearDupSettings(threshold, ngram, permutations, bands, rows, seed, verify)


@dataclass(frozen=True)
class _Reader:
    """Typed access to the table's keys, each error naming the key."""

    table: Mapping[str, object]
    source: str

    def fail(self, key: str, message: str) -> NearDupSettingError:
        return NearDupSettingError(self.source, key, message)

    def typed(self, key: str, kind: type | tuple[type, ...], default: object) -> object:
        """`table[key]` (or `default`), which must be of `kind`; a bool is no number here."""
        value = self.table.get(key, default)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise self.fail(key, f"expected {' or '.join(k.__name__ for k in kinds)}, got {type(value).__name__} {value!r}")
        return value

    def number(self, key: str, default: float) -> float:
        """A float setting (an integer is taken as one)."""
        value = self.typed(key, (int, float), default)
        assert isinstance(value, (int, float))
        return float(value)

    def at_least(self, key: str, default: int, low: int) -> int:
        """An integer setting that must be >= `low`."""
        value = self.typed(key, int, default)
        assert isinstance(value, int)
        if value < low:
            raise self.fail(key, f"must be >= {low}, got {value}")
        return value


def _bands_and_rows(read: _Reader, threshold: float, permutations: int, verify: bool) -> tuple[int, int]:
    """Given bands and rows (their product must be `permutations`), one of them (the other is
    `permutations` divided by it, which must divide evenly), or neither (`optimal_bands`)."""
    bands = read.at_least("bands", 1, 1) if "bands" in read.table else None
    rows = read.at_least("rows", 1, 1) if "rows" in read.table else None
    if bands is None and rows is None:
        return optimal_bands(threshold, permutations, verify)
    if bands is not None and rows is not None:
        if bands * rows != permutations:
            raise read.fail("bands", f"bands x rows must equal permutations ({permutations}), got {bands} x {rows}")
        return bands, rows
    given, key = (bands, "bands") if bands is not None else (rows, "rows")
    assert given is not None
    if permutations % given:
        raise read.fail(key, f"must divide permutations ({permutations}), got {given}")
    return (given, permutations // given) if key == "bands" else (permutations // given, given)


@functools.cache
def optimal_bands(threshold: float, permutations: int, verify: bool) -> tuple[int, int]:
    """The (bands, rows) with bands * rows == permutations (every permutation is used; datasketch
    also allows fewer) minimising the weighted false positive and false negative areas of the
    S-curve 1 - (1 - s^rows)^bands around `threshold` (weights: `FALSE_NEGATIVE_WEIGHT`); the
    fewest bands wins a tie. Decimal arithmetic (the threshold as its shortest decimal), exactly
    specified, so the choice is the same everywhere."""
    t, weight = Decimal(repr(threshold)), FALSE_NEGATIVE_WEIGHT[verify]
    best: tuple[Decimal, int, int] | None = None
    for bands in range(1, permutations + 1):
        if permutations % bands == 0:
            rows = permutations // bands
            error = weighted_error(t, bands, rows, weight)
            if best is None or error < best[0]:
                best = (error, bands, rows)
    assert best is not None
    return best[1], best[2]


def weighted_error(t: Decimal, bands: int, rows: int, weight: Decimal) -> Decimal:
    """(1 - weight) ∫_0^t P(s) ds + weight ∫_t^1 (1 - P(s)) ds for P(s) = 1 - (1 - s^rows)^bands,
    the probability that two documents of Jaccard s share a band: the false positive and false
    negative areas.
    The integrals' binomial terms reach 2^bands and cancel, so the precision is 0.302 x bands
    digits (log10 2 of them per band) plus 40 beyond the result's."""
    with localcontext() as context:
        context.prec = int(bands * 0.302) + 60
        below, whole = _integral(t, bands, rows), _integral(Decimal(1), bands, rows)
        return +((1 - weight) * (t - below) + weight * (whole - below))


def _integral(x: Decimal, bands: int, rows: int) -> Decimal:
    """∫_0^x (1 - s^rows)^bands ds = Σ_k (-1)^k C(bands, k) x^(rows k + 1) / (rows k + 1)."""
    total, power, step, binomial = Decimal(0), x, x**rows, Decimal(1)
    for k in range(bands + 1):
        term = binomial * power / (rows * k + 1)
        total += -term if k % 2 else term
        power *= step
        binomial = binomial * (bands - k) / (k + 1)  # C(bands, k + 1), exact: it has fewer digits than the precision
    return total
