"""Crash injection for tests: `PREP_CRASH_AT=point[:n]` kills the whole process group with
SIGKILL the n-th time (default 1st) this process reaches `point`. A no-op otherwise."""

from __future__ import annotations

import os
import signal
from collections import Counter

_hits: Counter[str] = Counter()


def crash_point(point: str) -> None:
    spec = os.environ.get("PREP_CRASH_AT")
    if not spec:
        return
    name, _, nth = spec.partition(":")
    if name != point:
        return
    _hits[point] += 1
    if _hits[point] == int(nth or 1):
        os.killpg(os.getpgid(0), signal.SIGKILL)
