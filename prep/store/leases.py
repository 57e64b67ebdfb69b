"""Leases: how builds and garbage collection keep out of each other's way (docs/history.md).

A lease is a key `layout.lease_key(kind, run, expires)`; its name alone tells until when it is
held. Its holder renews it by creating a later-expiring key and deleting the earlier one. gc
holds a `gc` lease and refuses to start while a live `build` lease exists; builds hold a `build`
lease and wait while a gc lease lives. Each writes its own lease before looking for the other's.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from prep.errors import NotFoundError, StoreError
from prep.storage.backend import ObjectInfo, Store
from prep.store.layout import lease_folder, lease_key, leases_prefix, parse_lease_key

BUILD, GC = "build", "gc"
DEFAULT_LEASE_SECONDS = 600
MAX_LEASE_SECONDS = DEFAULT_LEASE_SECONDS
"""No holder takes a longer lifetime, so a lease key the store wrote longer ago than this (and
RENEWAL_SLACK_SECONDS) was not renewed in time: lapsed, whatever date its name holds."""
RENEWAL_SLACK_SECONDS = 60
WAIT_POLL_SECONDS = 5.0


@dataclass(frozen=True)
class LeaseInfo:
    """A lease as listed: `leases/<kind>/<run>/<expires epoch>.json`; the name alone tells liveness."""

    key: str
    kind: str
    run: str
    expires: int
    written: float = 0.0  # when the store wrote the key, by the store's clock (0: not known)

    def live(self, now: float, store_now: float | None = None) -> bool:
        """Before its expiry, and (when the store's time is known) written within a lifetime: a
        name dated far ahead (a holder's clock gone wrong, a key made by hand) would otherwise
        keep gc out, or builds waiting, until that date."""
        if store_now is not None and self.written and store_now - self.written > MAX_LEASE_SECONDS + RENEWAL_SLACK_SECONDS:
            return False
        return now < self.expires


def parse_lease(info: ObjectInfo) -> LeaseInfo | None:
    """The lease a listed key is, or None for a key under leases/ that is no lease."""
    parsed = parse_lease_key(info.key)
    return None if parsed is None else LeaseInfo(info.key, *parsed, written=info.mtime)


def read_leases(store: Store, kind: str | None = None) -> list[LeaseInfo]:
    """Every lease key in the store (of one kind), oldest expiry first."""
    found = (parse_lease(info) for info in store.list(leases_prefix(kind)))
    return sorted((lease for lease in found if lease is not None), key=lambda lease: lease.expires)


def process_scope() -> str | None:
    """What makes a pid meaningful: this boot of this machine and this PID namespace (Linux);
    None where that cannot be told, and then no lease is ever judged abandoned by its pid."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None
    return f"{socket.gethostname()}/{boot}/{namespace}"


def _holder_is_dead(store: Store, lease: LeaseInfo) -> bool:
    """True when the lease's holder ran in this process scope (same boot, same PID namespace)
    and its process is gone, so a killed build releases its lease at once instead of at expiry.
    A lease from anywhere else counts as held (a pid means nothing across hosts or containers)."""
    try:
        body = json.loads(store.get_bytes(lease.key))
    except NotFoundError:  # released while we looked, or renewed: then its later key is the lease
        later = [found for info in store.list(lease_folder(lease.kind, lease.run))
                 if (found := parse_lease(info)) is not None and found.expires > lease.expires]
        return not later or _holder_is_dead(store, max(later, key=lambda found: found.expires))
    except ValueError:
        return False
    scope = process_scope()
    if scope is None or not isinstance(body, dict) or body.get("scope") != scope:
        return False  # a body of another shape is no holder we can judge: held
    return _pid_is_gone(body.get("pid"))


def _pid_is_gone(pid: object) -> bool:
    """True only for a real process id (a positive int) that no process has now."""
    if type(pid) is not int or pid < 1:  # 0 and negatives name process groups; True is an int
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False


def held(store: Store, lease: LeaseInfo, now: float, store_now: float | None = None) -> bool:
    """True while the lease has not expired (LeaseInfo.live) and its holder may still be running."""
    return lease.live(now, store_now) and not _holder_is_dead(store, lease)


def live_leases(store: Store, kind: str, now: float | None = None, store_now: float | None = None) -> list[LeaseInfo]:
    """Leases not yet expired whose holder may still be running; `store_now` (Lease.store_now)
    also lapses those the store wrote longer ago than any lifetime."""
    moment = time.time() if now is None else now
    return [lease for lease in read_leases(store, kind) if held(store, lease, moment, store_now)]


class Lease:
    """Holds `leases/<kind>/<run>/<expires>.json` while in use, renewing it from a thread: each
    renewal creates a later-expiring key, then deletes the previous one."""

    def __init__(self, store: Store, kind: str, seconds: int = DEFAULT_LEASE_SECONDS) -> None:
        if not 0 < seconds <= MAX_LEASE_SECONDS:  # others judge a lease's age by MAX_LEASE_SECONDS
            raise ValueError(f"a lease lasts 1 to {MAX_LEASE_SECONDS} s, not {seconds}")
        self.store, self.kind, self.seconds = store, kind, seconds
        self.run = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:12]}"
        self.key = ""
        self.expires = 0
        self._stamp: tuple[float, float] | None = None  # the store's mtime of our key, monotonic time then
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _write(self) -> None:
        expires = int(time.time()) + self.seconds
        key = lease_key(self.kind, self.run, expires)
        body = {"kind": self.kind, "run": self.run, "host": socket.gethostname(), "pid": os.getpid(),
                "scope": process_scope(), "expires": expires}
        self.store.put_bytes(key, json.dumps(body, sort_keys=True).encode())
        written = self.store.head(key)
        self._stamp = (written.mtime, time.monotonic()) if written is not None and written.mtime else None
        previous, self.key, self.expires = self.key, key, expires
        if previous and previous != key:
            self.store.delete(previous)

    def store_now(self) -> float | None:
        """The store's time now, from its stamp on our own latest key (so a local clock that is
        off does not matter); None when the store gave no stamp."""
        stamp = self._stamp
        return None if stamp is None else stamp[0] + (time.monotonic() - stamp[1])

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / 4):
            try:
                self._write()
            except Exception:  # noqa: BLE001, S112 - a failed renewal shows as `lapsed`
                continue

    @property
    def lapsed(self) -> bool:
        """True once the lease may have expired (renewals failed): stop acting under it."""
        return time.time() >= self.expires - 1

    def __enter__(self) -> Self:
        self._write()
        self._thread = threading.Thread(target=self._renew, name=f"prep-lease-{self.kind}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.store.delete(self.key)
            self.store.remove_empty_folder(lease_folder(self.kind, self.run))  # else one folder per run stays
        except StoreError:
            if exc is None:
                raise
            # Not released (the store failing as the work did): it lapses by itself, and the error
            # that ended the work, with its exit code, is the one the caller must hear.


def waiting_for_gc(key: str) -> str:
    """What a build or tag waiting for a running gc says (once), naming the gc's lease."""
    return f"waiting for garbage collection to finish ({key})"


@contextmanager
def build_lease(store: Store, timeout: float | None = None, poll: float | None = None,
                on_wait: Callable[[str], None] | None = None) -> Iterator[Lease]:
    """What a build holds from before its first cache lookup until its refs moved: a build lease,
    taken first, then a wait while any gc holds a live lease (StoreError after `timeout`);
    `on_wait` hears the gc lease's key once, when the wait begins (a silent wait looks hung)."""
    poll = WAIT_POLL_SECONDS if poll is None else poll
    with Lease(store, BUILD) as lease:
        waited = 0.0
        while running := live_leases(store, GC, store_now=lease.store_now()):
            if timeout is not None and waited >= timeout:
                raise StoreError(f"{store.url}: garbage collection is running ({running[0].key}); try again later")
            if not waited and on_wait is not None:
                on_wait(running[0].key)
            time.sleep(poll)
            waited += poll
        yield lease
