"""`[dedup.near]` settings: defaults, the band choice against an independent integration, errors naming the key."""

from __future__ import annotations

import pytest

from prep.errors import ConfigError
from prep.neardup.settings import NearDupSettingError, NearDupSettings, optimal_bands, parse_settings


def _area_error(threshold: float, bands: int, rows: int, weight: float, steps: int = 4000) -> float:
    """The weighted error by the trapezoid rule: false positive area below the threshold weighted
    1 - `weight`, false negative area above it weighted `weight`."""
    def collide(s: float) -> float:
        return float(1 - (1 - s**rows) ** bands)

    def area(f: object, low: float, high: float) -> float:
        width = (high - low) / steps
        values = [f(low + i * width) for i in range(steps + 1)]  # type: ignore[operator]
        return float(width * (sum(values) - (values[0] + values[-1]) / 2))

    return (1 - weight) * area(collide, 0, threshold) + weight * area(lambda s: 1 - collide(s), threshold, 1)


@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.8, 0.85, 0.9, 0.95])
@pytest.mark.parametrize("permutations", [64, 128, 256])
@pytest.mark.parametrize(("verify", "weight"), [(True, 0.9), (False, 0.5)])
def test_derived_bands_are_the_published_optimum(threshold: float, permutations: int, verify: bool, weight: float) -> None:
    divisors = [b for b in range(1, permutations + 1) if permutations % b == 0]
    expected = min(divisors, key=lambda b: _area_error(threshold, b, permutations // b, weight))
    bands, rows = optimal_bands(threshold, permutations, verify)
    assert (bands, rows) == (expected, permutations // expected)
    assert parse_settings({"threshold": threshold, "permutations": permutations, "verify": verify}).bands == bands


def test_defaults() -> None:
    """Without verify, the precise banding (8 x 16) that finds a pair at the threshold one time in
    five; with it, the bands that find it with probability 0.95 (16 x 8), verify rejecting the rest."""
    settings = parse_settings({})
    assert settings == NearDupSettings(0.8, 5, 128, 8, 16, 0, False) == NearDupSettings()
    assert settings.bands * settings.rows == settings.permutations
    assert settings.key_fields() == {"threshold": "0.8", "ngram": 5, "permutations": 128, "bands": 8, "rows": 16,
                                     "seed": 0, "verify": False, "unicode": settings.key_fields()["unicode"]}
    verified = parse_settings({"verify": True})
    assert (verified.bands, verified.rows) == (16, 8)


def test_given_bands_rows_and_one_of_them() -> None:
    assert parse_settings({"bands": 32, "rows": 4}).bands == 32
    one = parse_settings({"bands": 16})
    assert (one.bands, one.rows) == (16, 8)
    other = parse_settings({"rows": 4, "permutations": 256})
    assert (other.bands, other.rows) == (64, 4)
    assert parse_settings({"threshold": 0.5, "ngram": 3, "seed": 7, "verify": True}).key_fields()["threshold"] == "0.5"


@pytest.mark.parametrize(("table", "key", "words"), [
    ({"threshold": 1.0}, "threshold", "within (0, 1)"),
    ({"threshold": 0}, "threshold", "within (0, 1)"),
    ({"threshold": float("nan")}, "threshold", "within (0, 1)"),
    ({"threshold": "0.8"}, "threshold", "expected int or float"),
    ({"ngram": 0}, "ngram", ">= 1"),
    ({"ngram": True}, "ngram", "expected int"),
    ({"permutations": 0}, "permutations", ">= 1"),
    ({"permutations": 16_385}, "permutations", "<= 16384"),
    ({"bands": 16, "rows": 4}, "bands", "bands x rows must equal permutations (128), got 16 x 4"),
    ({"bands": 3}, "bands", "must divide permutations"),
    ({"rows": 0}, "rows", ">= 1"),
    ({"seed": -1}, "seed", ">= 0"),
    ({"seed": 2**64}, "seed", "[0, 2**64)"),
    ({"verify": 1}, "verify", "expected bool"),
    ({"treshold": 0.8}, "treshold", "unknown key"),
])
def test_a_bad_setting_is_one_line_naming_its_key(table: dict[str, object], key: str, words: str) -> None:
    with pytest.raises(NearDupSettingError) as caught:
        parse_settings(table, "pipe.toml")
    message = str(caught.value)
    assert message.startswith(f"pipe.toml: dedup.near.{key}: ") and words in message and "\n" not in message
    assert caught.value.key == key
    assert isinstance(caught.value, ConfigError) and caught.value.exit_code == 2
