"""Canonical JSON: sorted keys, no insignificant whitespace, UTF-8, no floats.

Identical content gives identical bytes, so a manifest's SHA-256 is its identity.
"""

from __future__ import annotations

import json
from typing import Any


def _reject_floats(value: Any, path: str = "$") -> None:
    if isinstance(value, float):
        raise TypeError(f"{path}: floats are not allowed in canonical JSON")
    if isinstance(value, dict):
        for key, item in value.items():
            _reject_floats(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _reject_floats(item, f"{path}[{index}]")


def dumps(value: Any) -> bytes:
    """Serialize `value` canonically."""
    _reject_floats(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def loads(data: bytes) -> Any:
    return json.loads(data.decode("utf-8"))
