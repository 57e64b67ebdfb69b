"""Writing TOML (v1.0) for JSON-like values: strings, integers, floats, booleans, arrays and inline tables.

Python reads TOML (`tomllib`) but does not write it; this is the little a pipeline file needs.
`tomllib.loads` of what these functions write gives back the same values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_string(text: str) -> str:
    """A basic string: quotes, backslashes and control characters escaped (TOML allows no other raw)."""
    return '"' + "".join(_ESCAPES.get(char, f"\\u{ord(char):04X}" if _control(char) else char)
                         for char in text) + '"'


def _control(char: str) -> bool:
    """A character a basic string may not hold as itself: U+0000 to U+001F and U+007F."""
    return ord(char) < 0x20 or ord(char) == 0x7F


def toml_key(key: str) -> str:
    """A key: bare when it can be, else quoted."""
    return key if BARE_KEY.fullmatch(key) else toml_string(key)


def toml_float(number: float) -> str:
    """A float as TOML spells it: the shortest decimal that reads back the same, or inf/nan."""
    if math.isnan(number):
        return "nan"
    if math.isinf(number):
        return "inf" if number > 0 else "-inf"
    return repr(number)  # always holds "." or "e": "1.0", "1e-05", "1e+16" are TOML floats


def toml_value(value: object) -> str:
    """A value on one line; TypeError for what TOML cannot hold (None, say)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return toml_float(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{toml_key(str(key))} = {toml_value(item)}" for key, item in value.items()) + "}"
    raise TypeError(f"TOML has no value for {type(value).__name__} {value!r}")


def toml_line(key: str, value: object, comment: str = "") -> str:
    """`key = value`, with a trailing `# comment` when one is given."""
    return f"{toml_key(key)} = {toml_value(value)}" + (f"  # {comment}" if comment else "")
