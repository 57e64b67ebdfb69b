"""Reaching the Ray cluster's head, and noticing when it is gone (`prep build --executor ray`).

Hazard: when the driver's core worker cannot reach the head's GCS for Ray's
`gcs_rpc_server_reconnect_timeout_s` (60 s by default) it logs a fatal line and calls `_Exit(1)`:
the build would end with Ray's message, no `prep: error:` line and no cleanup. So the driver
asks Ray to wait longer (RAY_RECONNECT_SECONDS) and watches the GCS address itself, stopping the
build with ClusterLostError once it has accepted no connection for HEAD_LOST_AFTER seconds.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from prep import progress
from prep.errors import ClusterLostError

PROBE_SECONDS = 10.0  # how long a cluster address may take to accept a connection
HEAD_LOST_AFTER = 10.0  # seconds the head may refuse connections before the build stops
CHECK_EVERY = 1.0  # seconds between two probes of the head (also how long one probe may take)
RECONNECT_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"
RAY_RECONNECT_SECONDS = 120  # Ray's own wait before it ends the driver: past our notice and unwinding
CLOSE_GRACE = 20.0  # how long closing Ray may take once the head is lost, before the driver exits itself

T = TypeVar("T")


def unreachable_reason(address: str, timeout: float = PROBE_SECONDS) -> str | None:
    """Why nothing accepts a connection at a `host:port` or `ray://host:port` address, or None
    (also for `auto`, `local` and other forms Ray resolves itself)."""
    # Hazard: ray.init retries a GCS address that refuses connections for ever, printing a
    # warning every few seconds, so a mistyped address would look like a hung build.
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not host or not (port.isascii() and port.isdigit()):  # isdigit alone takes '²'
        return None
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__
    return None


def outlast_ray_reconnect() -> None:
    """Have Ray wait RAY_RECONNECT_SECONDS for a lost GCS before it ends this process (read when
    the core worker starts, so call it before ray.init); a value the user set is kept."""
    os.environ.setdefault(RECONNECT_ENV, str(RAY_RECONNECT_SECONDS))


class HeadWatch:
    """Probes the head's GCS address every CHECK_EVERY seconds on a daemon thread; once it has
    not accepted a connection for `lost_after` seconds, `check()` raises ClusterLostError."""

    def __init__(self, address: str, lost_after: float = HEAD_LOST_AFTER) -> None:
        self.address = address
        self.lost_after = lost_after
        self._down_since: float | None = None
        self._lost: ClusterLostError | None = None
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._watch, name="prep-ray-head-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        """The thread: probe until stopped or until the head counts as lost."""
        while self._lost is None and not self._stopped.wait(CHECK_EVERY):
            self.probe()

    def probe(self) -> str | None:
        """Probe the head once, noting when it started refusing; why it refuses, or None."""
        reason = unreachable_reason(self.address, timeout=CHECK_EVERY)
        with self._lock:  # the watch thread and the driver's both probe
            if reason is None:
                self._down_since = None
                return None
            now = time.monotonic()
            if self._down_since is None:
                self._down_since = now
            if now - self._down_since >= self.lost_after and self._lost is None:
                self._lost = ClusterLostError(
                    f"lost the Ray cluster's head at {self.address}: its GCS has not answered for "
                    f"{self.lost_after:g} s ({reason}); committed work is kept, rerun to resume")
        return reason

    @property
    def lost(self) -> ClusterLostError | None:
        """The error to stop with, once the head counts as lost."""
        return self._lost

    def check(self) -> None:
        """Raise ClusterLostError once the head counts as lost."""
        if self._lost is not None:
            raise self._lost

    def confirm_lost(self) -> ClusterLostError | None:
        """After a Ray error: None if the head answers now, else wait until it counts as lost (the
        error is its doing) or answers again."""
        while self._lost is None and self.probe() is not None:
            time.sleep(CHECK_EVERY)
        return self._lost

    def call(self, fn: Callable[[], T]) -> T:
        """fn() run on a daemon thread while the head is watched: a Ray call that waits on a lost
        GCS (ray.nodes(), a probe task) is left behind with ClusterLostError instead of blocking."""
        self.check()
        outcome: list[T] = []
        failure: list[BaseException] = []

        def target() -> None:
            try:
                outcome.append(fn())
            except BaseException as exc:  # handed to the caller's thread as it is
                failure.append(exc)

        thread = threading.Thread(target=target, name="prep-ray-call", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(CHECK_EVERY)
            self.check()
        if failure:
            raise failure[0]
        return outcome[0]

    def stop(self) -> None:
        """End the watch (the executor closes)."""
        self._stopped.set()


@contextlib.contextmanager
def exit_if_stuck(error: ClusterLostError | None, grace: float = CLOSE_GRACE) -> Iterator[None]:
    """While closing Ray after the head was lost: if that takes over `grace` seconds (a call waiting
    on the dead GCS), write the one error line and end the process with its exit code."""
    if error is None:
        yield
        return

    def give_up() -> None:
        progress.end_line()
        progress.write(sys.stderr, f"prep: error: {error}\n")
        os._exit(error.exit_code)

    timer = threading.Timer(grace, give_up)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
