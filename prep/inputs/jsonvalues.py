"""A JSON Lines record as Python's `json` reads it, except integers longer than Python converts
(`sys.get_int_max_str_digits()`, 4,300 digits by default): json.loads refuses a line holding one,
where Arrow's block reader reads the line (it skips the fields it does not read), so the same line
was a document or a bad record depending on its block. Such an integer is kept as its digits."""

from __future__ import annotations

import json
import sys
from typing import Any


class LongInt:
    """An integer too long for int(), kept as its digits (json's spelling of it, and Python's)."""

    __slots__ = ("digits",)

    def __init__(self, digits: str) -> None:
        self.digits = digits

    def __str__(self) -> str:
        return self.digits


LongInt.__name__ = "int"  # the type error messages name (`text field 'text' is int, not a string`)


def _integer(digits: str) -> int | LongInt:
    """json's integer `digits` as int(), or as a LongInt past the conversion limit."""
    limit = sys.get_int_max_str_digits()
    return int(digits) if not limit or len(digits) - digits.startswith("-") <= limit else LongInt(digits)


def loads(text: str) -> Any:
    """`text` read by json.loads, an integer of any length taken."""
    return json.loads(text, parse_int=_integer)
