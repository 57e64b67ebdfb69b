"""The one spelling of documents' metadata (docs/build.md, "Metadata"): compact JSON, keys sorted
at every level, UTF-8 without `\\u` escapes but those `json` needs, floats as their shortest
round-trip repr, no NaN or infinities. Reading spells each document's metadata so; every format
that carries it writes these bytes (or, for MDS, streaming's own spelling of the same object)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any


def spell(value: Any, default: Callable[[Any], Any] | None = None) -> str:
    """`value` in the metadata spelling; `default` as json.dumps takes it (TypeError without one
    for a value JSON has no type for; ValueError for NaN or an infinity)."""
    return _encoder(default).encode(value)


@functools.cache
def _encoder(default: Callable[[Any], Any] | None) -> json.JSONEncoder:
    """One encoder per `default`, made once: json.dumps with options builds one a call, which costs
    more than spelling a small object."""
    return json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                            default=default)
