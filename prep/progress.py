"""How prep reports to a person while it works: stage lines with counts and rates, a redrawn
byte meter for transfers, and the one style of byte counts every command prints."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

METER_INTERVAL_TTY = 0.5
METER_INTERVAL_LOG = 10.0


def human_bytes(count: int) -> str:
    """Byte counts in decimal SI units, the one style every command prints: 512 B, 926.6 kB, 1.3 GB."""
    if count < 1000:
        return f"{count} B"
    size = count / 1000
    for unit in ("kB", "MB", "GB", "TB"):
        if size < 1000:
            return f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} PB"


def rate(count: int, seconds: float, unit: float, name: str) -> str:
    """A throughput like `312.45 MB/s`: `count` per second in units of `unit` bytes."""
    return f"{count / unit / max(seconds, 1e-9):.2f} {name}"


class Progress:
    """Progress of one command on stderr (nothing when quiet)."""

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

    def meter(self, verb: str, total_files: int, total_bytes: int) -> ByteMeter:
        """A byte meter for a transfer of `total_files` files, on this progress's stream."""
        return ByteMeter(self.stream, self.quiet, verb, total_files, total_bytes)

    def info(self, message: str) -> None:
        self._emit(message)

    def _emit(self, message: str) -> None:
        if not self.quiet:
            print(f"[{time.perf_counter() - self.started:7.1f}s] {message}", file=self.stream, flush=True)


class ByteMeter:
    """Thread-safe byte counter of a transfer that redraws one line (every 0.5 s on a terminal,
    every 10 s in a log); made by `Progress.meter`."""

    def __init__(self, stream: TextIO, quiet: bool, verb: str, total_files: int, total_bytes: int) -> None:
        self.stream, self.quiet = stream, quiet
        self.verb, self.total_files, self.total_bytes = verb, total_files, total_bytes
        self.bytes_done = self.files_done = 0
        self.started = self.last = time.monotonic()
        self.tty = stream.isatty()
        self._lock = threading.Lock()

    def add(self, count: int) -> None:
        with self._lock:
            self.bytes_done += count
            self._show()

    def file_done(self, _artifact: object) -> None:
        with self._lock:
            self.files_done += 1
            self._show()

    def _show(self) -> None:
        now = time.monotonic()
        if self.quiet or now - self.last < (METER_INTERVAL_TTY if self.tty else METER_INTERVAL_LOG):
            return
        self.last = now
        line = (f"{self.verb}: {self.files_done} of {self.total_files} files, {human_bytes(self.bytes_done)} of "
                f"{human_bytes(self.total_bytes)}, {rate(self.bytes_done, now - self.started, 1e6, 'MB/s')}")
        self.stream.write(f"\r{line}\x1b[K" if self.tty else f"{line}\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.tty and self.last != self.started:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
