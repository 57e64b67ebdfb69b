"""The reader's future, object by object: which stored files each coming step needs, in the order
it reads them, so the node-local cache can evict the file needed furthest ahead (Belady) and
prefetch the next ones.

A batch is a pure function of the step (prep.data.reader), so the plan is exact: it is computed
for `horizon` steps past the current one and slid forward as the reader advances. A jump (a
resumed or a torch worker's reader) rebuilds it from the new step.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_HORIZON = 256


@dataclass(frozen=True)
class Need:
    """One stored object a step reads: its content hash, its size, and a name for messages."""

    sha256: str
    size: int
    what: str


class Plan:
    """Needs of steps [start, start + horizon), and for each object the steps that read it."""

    def __init__(self, needs_block: Callable[[int, int], list[list[Need]]], horizon: int = DEFAULT_HORIZON,
                 minimum: int = 0, initial: int | None = None, grow: int = 1) -> None:
        # needs_block(step, count): the needs of up to `count` steps from `step`; none past the end
        self._needs_block = needs_block
        self.horizon = max(1, horizon)
        # A new window gets `initial` steps (at least `minimum`), so the first batch does not wait
        # for the whole horizon; then, whenever it is `grow` steps short, `grow` more in one block.
        self.minimum = min(self.horizon, max(1, minimum))
        self.initial = max(self.minimum, min(self.horizon, initial if initial is not None else self.horizon))
        self.grow = max(1, grow)
        self.start = 0
        self._steps: deque[list[Need]] = deque()
        self._objects: deque[frozenset[str]] = deque()  # each step's objects, by sha256
        self._uses: dict[str, deque[int]] = {}
        self._sizes: dict[str, Need] = {}  # each object in the window, by sha256
        self._ended = False
        self._lock = threading.Lock()

    def advance(self, step: int, grow: bool = True) -> None:
        """Make `step` the current step. The window always holds `minimum` steps from it; with
        `grow`, an empty one gets `initial` steps and one `grow` steps short of the horizon `grow` more."""
        with self._lock:
            if step < self.start or step > self.start + len(self._steps):
                self._steps.clear()
                self._objects.clear()
                self._uses.clear()
                self._sizes.clear()
                self.start, self._ended = step, False
            while self.start < step:
                self._steps.popleft()
                for sha in self._objects.popleft():
                    uses = self._uses[sha]
                    uses.popleft()
                    if not uses:
                        del self._uses[sha]
                        del self._sizes[sha]
                self.start += 1
            target = self.minimum
            if grow and not self._steps:
                target = self.initial
            elif grow and len(self._steps) + self.grow <= self.horizon:
                target = max(target, len(self._steps) + self.grow)
            while not self._ended and len(self._steps) < target:
                at = self.start + len(self._steps)
                block = self._needs_block(at, target - len(self._steps))
                self._ended = not block
                for needs in block:
                    self._steps.append(needs)
                    self._objects.append(frozenset(need.sha256 for need in needs))
                    for need in needs:
                        self._sizes[need.sha256] = need
                        uses = self._uses.setdefault(need.sha256, deque())
                        if not uses or uses[-1] != at:  # once per step, as _objects counts it
                            uses.append(at)
                    at += 1

    def needs(self, step: int) -> list[Need]:
        """What step `step` reads, if it is inside the window (else nothing is known: [])."""
        with self._lock:
            at = step - self.start
            return list(self._steps[at]) if 0 <= at < len(self._steps) else []

    def covers(self, step: int) -> bool:
        """Whether step `step` is inside the window (its needs are known)."""
        with self._lock:
            return 0 <= step - self.start < len(self._steps)

    def objects(self, step: int) -> frozenset[str]:
        """The objects step `step` reads (none outside the window)."""
        with self._lock:
            at = step - self.start
            return self._objects[at] if 0 <= at < len(self._objects) else frozenset()

    def within(self, objects: frozenset[str]) -> bool:
        """Whether every object the window reads is one of `objects`."""
        with self._lock:
            return len(self._sizes) <= len(objects) and self._sizes.keys() <= objects

    def next_use(self, sha256: str) -> int | None:
        """The first step at or after the current one that reads the object, None if none in the horizon."""
        with self._lock:
            uses = self._uses.get(sha256)
            return uses[0] if uses else None

    def upcoming(self, steps: int | None, max_bytes: int | None) -> list[Need]:
        """Distinct objects in the order the next `steps` steps read them (from the current one),
        stopping once their sizes add up to `max_bytes`; walks the steps, so the work is what it returns."""
        found: list[Need] = []
        seen: set[str] = set()
        total = 0
        with self._lock:
            for offset, needs in enumerate(self._steps):
                if (steps is not None and offset >= steps) or len(seen) == len(self._sizes):
                    break
                for need in needs:
                    if need.sha256 in seen:
                        continue
                    if max_bytes is not None and total + need.size > max_bytes and found:
                        return found
                    seen.add(need.sha256)
                    found.append(need)
                    total += need.size
        return found
