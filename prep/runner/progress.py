"""Stage-by-stage progress lines on stderr with counts and rates."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, stream: TextIO | None = None, quiet: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.started = time.perf_counter()
        self._stage_started = self.started
        self._last = 0.0

    def stage(self, name: str, detail: str = "") -> None:
        self._stage_started = time.perf_counter()
        self._emit(f"{name}: {detail}" if detail else f"{name}: started")

    def tick(self, name: str, done: int, total: int, cached: int, nbytes: int = 0, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self._last < 1.0 and done < total:
            return
        self._last = now
        elapsed = max(now - self._stage_started, 1e-9)
        rate = f", {nbytes / elapsed / 1e6:.1f} MB/s" if nbytes else ""
        self._emit(f"{name}: {done}/{total} tasks ({cached} cached){rate}")

    def done(self, name: str, detail: str) -> None:
        elapsed = time.perf_counter() - self._stage_started
        self._emit(f"{name}: done in {elapsed:.1f}s, {detail}")

    def info(self, message: str) -> None:
        self._emit(message)

    def _emit(self, message: str) -> None:
        if not self.quiet:
            print(f"[{time.perf_counter() - self.started:7.1f}s] {message}", file=self.stream, flush=True)
