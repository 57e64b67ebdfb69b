"""Background fetches in plan order: after each step the reader names the coming objects (within
the lookahead, in steps or bytes) and up to `jobs` daemon threads fetch the absent ones into the
node-local cache, so the next batches find their shards there.

A prefetch that cannot get room without evicting a file needed sooner stops the round; a failed
prefetch (a corrupt object, say) is dropped, and the read that needs the object fetches it itself
and raises the error there, naming it.
"""

from __future__ import annotations

import queue
import threading

from prep.data.nodecache import NodeCache
from prep.data.plan import Need, Plan

JOIN_SECONDS = 30.0  # how long close() waits for a fetch under way before leaving it to finish alone
PRESSURE_POLL_SECONDS = 0.1  # how often an idle thread checks whether another user waits for room


class Prefetcher:
    """Daemon threads fetching the plan's next objects; `kick` after each step."""

    def __init__(self, cache: NodeCache, plan: Plan, steps: int | None, max_bytes: int | None, jobs: int) -> None:
        self.cache, self.plan = cache, plan
        self.steps, self.max_bytes = steps, max_bytes
        self._queue: queue.Queue[Need | None] = queue.Queue()
        self._queued: set[str] = set()
        self._mutex = threading.Lock()
        self._threads = [threading.Thread(target=self._work, name=f"prep-prefetch-{n}", daemon=True)
                         for n in range(max(1, jobs))]
        for thread in self._threads:
            thread.start()

    def kick(self) -> None:
        """Queue the coming objects that are neither cached nor queued, in the order they are needed."""
        if self.steps == 0 or self.max_bytes == 0 or self.plan.within(self.cache.held()):
            return
        # what lies past a cache's worth of coming objects cannot stay until it is read: not asked for
        room = min(self.max_bytes, self.cache.limit) if self.max_bytes is not None else self.cache.limit
        for need in self.plan.upcoming(self.steps, room):
            with self._mutex:
                if need.sha256 in self._queued or self.cache.has(need.sha256):
                    continue
                self._queued.add(need.sha256)
            self._queue.put(need)

    def _work(self) -> None:
        """Fetch what is queued; between fetches, answer another user's pressure: the reader may idle
        for long between steps (a DataLoader worker whose batches are all queued), and its idle
        pins would hold the room that user waits for until it gives up."""
        while True:
            try:
                need = self._queue.get(timeout=PRESSURE_POLL_SECONDS)
            except queue.Empty:
                if self.cache.stop.is_set():
                    return
                self.cache.answer_pressure()
                continue
            if need is None or self.cache.stop.is_set():
                return
            try:
                self.cache.prefetch(need)
            except Exception:  # noqa: BLE001 - the read that needs it fetches it again and raises
                pass
            finally:
                with self._mutex:
                    self._queued.discard(need.sha256)

    def close(self) -> None:
        """Stop the threads (a fetch under way is cancelled at its next chunk)."""
        self.cache.stop.set()
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=JOIN_SECONDS)
