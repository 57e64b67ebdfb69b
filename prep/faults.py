"""Crash injection for tests: `PREP_CRASH_AT=point[:n[:self]]` kills with SIGKILL the n-th time
(default 1st) this process reaches `point` under that setting: the whole process group, or with
`:self` only this process (a Ray worker, say). With `PREP_CRASH_ONCE=marker` only the process that
atomically creates `marker` dies, so a retried task does not die again. A no-op otherwise. Hits
are counted per setting (point, n, scope and marker): a long-lived worker (a Ray worker serving
several builds) counts afresh for each new one, not on from what an earlier one left."""

from __future__ import annotations

import os
import signal
from collections import Counter

_hits: Counter[tuple[str, str]] = Counter()


def armed(point: str) -> bool:
    """Whether PREP_CRASH_AT names `point`: a caller that overlaps work may settle it first, so an
    injected kill finds what came before it done, as the crash tests count on."""
    return os.environ.get("PREP_CRASH_AT", "").partition(":")[0] == point


def crash_point(point: str) -> None:
    spec = os.environ.get("PREP_CRASH_AT")
    if not spec:
        return
    name, _, rest = spec.partition(":")
    if name != point:
        return
    nth, _, scope = rest.partition(":")
    setting = (spec, os.environ.get("PREP_CRASH_ONCE", ""))
    _hits[setting] += 1
    if _hits[setting] != int(nth or 1) or not _claim_crash():
        return
    if scope == "self":
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        os.killpg(os.getpgid(0), signal.SIGKILL)


def _claim_crash() -> bool:
    """True unless PREP_CRASH_ONCE names a marker that some process already created."""
    marker = os.environ.get("PREP_CRASH_ONCE")
    if not marker:
        return True
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True
