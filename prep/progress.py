"""How prep reports to a person while it works: one line per stage with counts, bytes, rates and
an ETA (redrawn in place on a terminal, plain lines at most every few seconds in a log), a redrawn
byte meter for transfers, and the one style of counts every command prints."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import TextIO

METER_INTERVAL_TTY = 0.5
METER_INTERVAL_LOG = 10.0
STAGE_INTERVAL_TTY = 0.2
STAGE_INTERVAL_LOG = 5.0
_CLEAR = "\r\x1b[K"  # carriage return, then erase to the end of the line
_quiet = False
_open_line: list[TextIO] = []  # the stream whose last line is being redrawn (no newline yet)


def set_quiet(value: bool) -> None:
    """Make every Progress made without an explicit `quiet` silent (or not): `--quiet` sets it."""
    global _quiet
    _quiet = value


def is_quiet() -> bool:
    """Whether `--quiet` was given: a command's own notes on stderr are silenced with its progress."""
    return _quiet


def note(message: str) -> None:
    """A command's own line on stderr (a summary, what it kept), silenced like progress by `--quiet`."""
    if not _quiet:
        write(sys.stderr, f"{message}\n")


def end_line() -> None:
    """End a redrawn line left open (a stage that failed), so an error prints on a line of its own."""
    while _open_line:
        write(_open_line.pop(), "\n")


def write(stream: TextIO, text: str) -> None:
    """Write and flush progress text; a stream that fails (a full log disk, a closed pipe) only loses
    the text: progress is advisory, and a build must not stop because no one reads it."""
    with contextlib.suppress(OSError, ValueError):
        stream.write(text)
        stream.flush()


def is_tty(stream: TextIO) -> bool:
    """Whether `stream` is a terminal (a stream without isatty is not)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`1 file`, `0 files`, `2 tasks`: `count` with `noun`, or its plural (`nouns`, else noun + s)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def eta(seconds: float) -> str:
    """A remaining time as `42s`, `7m05s` or `2h13m`."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


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
    """Progress of one command on stderr (nothing when quiet). On a terminal each stage is one line
    redrawn in place and kept once the stage is done; elsewhere lines are printed at most every
    STAGE_INTERVAL_LOG seconds, plus each stage's start and final line."""

    def __init__(self, stream: TextIO | None = None, quiet: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.quiet = _quiet if quiet is None else quiet
        self.tty = is_tty(self.stream)
        self.started = time.perf_counter()
        self._stage_started = self.started
        self._last = 0.0
        self._base: tuple[float, int] | None = None  # (time, tasks done) at the stage's first tick
        self._live = ""  # the line being redrawn on a terminal
        self._lock = threading.Lock()

    def stage(self, name: str, detail: str = "") -> None:
        """A stage starts: its line (the live one on a terminal)."""
        with self._lock:
            self._stage_started = time.perf_counter()
            self._base = None
            self._show(f"{name}: {detail}" if detail else f"{name}: started", live=True)

    def tick(self, name: str, done: int, total: int, cached: int, nbytes: int = 0, force: bool = False) -> None:
        """Tasks done of `total` and bytes so far; throttled unless `force`."""
        now = time.perf_counter()
        with self._lock:
            if self._base is None:
                self._base = (now, done)
            interval = STAGE_INTERVAL_TTY if self.tty else STAGE_INTERVAL_LOG
            if not force and now - self._last < interval and (done < total or not self.tty):
                return
            self._last = now
            self._show(f"{name}: {done}/{total} tasks ({cached} cached){self._rates(now, done, total, nbytes)}",
                       live=True)

    def _rates(self, now: float, done: int, total: int, nbytes: int) -> str:
        """`, 12.3 MB, 4.1 MB/s, ETA 7s`: bytes and their rate since the stage started, and the time
        left at the rate tasks finished since the first tick (none before one finished)."""
        elapsed = max(now - self._stage_started, 1e-9)
        text = f", {human_bytes(nbytes)}, {rate(nbytes, elapsed, 1e6, 'MB/s')}" if nbytes else ""
        started, first = self._base or (now, done)
        if first < done < total:
            text += f", ETA {eta((total - done) * (now - started) / (done - first))}"
        return text

    def done(self, name: str, detail: str) -> None:
        """A stage ends: its final line, kept."""
        with self._lock:
            elapsed = time.perf_counter() - self._stage_started
            self._show(f"{name}: done in {elapsed:.1f}s, {detail}", live=False)

    def meter(self, verb: str, total_files: int, total_bytes: int) -> ByteMeter:
        """A byte meter for a transfer of `total_files` files, on this progress's stream."""
        return ByteMeter(self.stream, self.quiet, verb, total_files, total_bytes)

    def info(self, message: str) -> None:
        """A line of its own (a warning, the published refs), kept above a live line."""
        with self._lock:
            live, self._live = self._live, ""
            if live and not self.quiet:
                write(self.stream, _CLEAR)
            self._show(message, live=False)
            if live:
                self._show(live, live=True, stamped=True)

    def _show(self, message: str, live: bool, stamped: bool = False) -> None:
        """Print `message` as a kept line, or (live, on a terminal) as the line redrawn in place."""
        if self.quiet:
            return
        line = message if stamped else f"[{time.perf_counter() - self.started:7.1f}s] {message}"
        if not self.tty:
            write(self.stream, f"{line}\n")
            return
        self._live = line if live else ""
        write(self.stream, f"{_CLEAR}{line}" + ("" if live else "\n"))
        _open_line[:] = [self.stream] if live else []


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
        line = (f"{self.verb}: {self.files_done} of {plural(self.total_files, 'file')}, {human_bytes(self.bytes_done)} of "
                f"{human_bytes(self.total_bytes)}, {rate(self.bytes_done, now - self.started, 1e6, 'MB/s')}")
        write(self.stream, f"\r{line}\x1b[K" if self.tty else f"{line}\n")

    def finish(self) -> None:
        if self.tty and self.last != self.started:
            write(self.stream, "\r\x1b[K")
