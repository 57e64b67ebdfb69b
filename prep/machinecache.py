"""This machine's cache folder ($PREP_CACHE, default ~/.cache/prep).

Everything in it is named by content (SHA-256) or by the exact version it derives from, so it
can never serve stale bytes, and it may be deleted at any time.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("PREP_CACHE", Path.home() / ".cache" / "prep"))


def derived_bytes(name: str, make: Callable[[], bytes]) -> bytes:
    """The cached bytes at `name` (a path under the cache root that names everything they
    derive from), made and cached on first use. A cache that cannot be written only costs
    making them again next time."""
    path = cache_root() / name
    try:
        return path.read_bytes()
    except OSError:
        pass
    data = make()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part")
        temp.write_bytes(data)
        os.replace(temp, path)
    except OSError:
        pass
    return data
