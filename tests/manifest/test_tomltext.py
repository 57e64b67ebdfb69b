"""The TOML writer: what it writes, tomllib reads back as the same values."""

from __future__ import annotations

import math
import tomllib

import pytest

from prep.manifest.tomltext import toml_line, toml_value

VALUES: list[object] = [
    "plain", "", 'quote " and back\\slash', "tab\t new\n line\r feed\f bell\x07 del\x7f nul\x00 esc\x1b",
    "naïve 数据 🙂", "\u2028 line separator", 0, -7, 2**63 - 1, True, False, 0.1, -2.5, 1e-05, 1e16, 3.0,
    [], [1, 2], ["a", ["b", 1.5]], {}, {"a": 1, "b c": "d", "ü": [True]}, {"nested": {"x": "y"}},
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_values_read_back_the_same(value: object) -> None:
    text = toml_line("key", value)
    assert "\n" not in text
    read = tomllib.loads(text)["key"]
    assert read == value and type(read) is type(value)


@pytest.mark.parametrize("number", [math.inf, -math.inf, math.nan])
def test_infinities_and_nan(number: float) -> None:
    read = tomllib.loads(toml_line("x", number))["x"]
    assert read == number or math.isnan(read) and math.isnan(number)


def test_keys_are_quoted_when_they_must_be_and_comments_follow() -> None:
    text = toml_line("a.b", 1, "one") + "\n" + toml_line("", 2) + "\n" + toml_line("snake_case-9", 3)
    assert tomllib.loads(text) == {"a.b": 1, "": 2, "snake_case-9": 3}
    assert text.splitlines()[0] == '"a.b" = 1  # one'


def test_none_is_no_toml_value() -> None:
    with pytest.raises(TypeError, match="NoneType"):
        toml_value([None])
