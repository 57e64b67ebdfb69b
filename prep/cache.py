"""This machine's cache folder ($PREP_CACHE, default ~/.cache/prep).

Everything in it is named by content (SHA-256) or by the exact version it derives from, so it
can never serve stale bytes, and it may be deleted at any time.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("PREP_CACHE", Path.home() / ".cache" / "prep"))
