"""What makes a location a prep store, so commands that only read never create or touch one.

A store is recognized by its marker key (written by `prep init`) or, for stores made before the
marker existed and stores a build wrote, by any key under one of the layout's prefixes. An empty
folder, a missing path or an S3 prefix holding no prep keys is not a store.
"""

from __future__ import annotations

from pathlib import Path

from prep.errors import StoreError
from prep.storage import Store, open_store
from prep.store import layout

MARKER_KEY = "prep-store.json"
MARKER_BODY = b'{"schema": "prep.store/1"}\n'
# Cheapest first: refs and snapshots are few; objects may be many (a local list walks them all).
_PREFIXES = (layout.REFS_PREFIX, layout.SNAPSHOTS_PREFIX, layout.HISTORY_PREFIX, layout.STAGES_PREFIX,
             layout.TASKS_PREFIX, layout.PACKS_PREFIX, layout.LOGS_PREFIX, layout.LEASES_PREFIX,
             layout.OBJECTS_PREFIX)


def is_store(store: Store) -> bool:
    """True when `store` holds the marker or any key of the store layout; reads only."""
    if store.head(MARKER_KEY) is not None:
        return True
    return any(next(iter(store.list(prefix)), None) is not None for prefix in _PREFIXES)


def mark(store: Store) -> bool:
    """Write the marker (create-only), making `store` a store before anything is built into it."""
    return store.put_bytes(MARKER_KEY, MARKER_BODY)


def open_existing(url: str | Path) -> Store:
    """The store at `url` for a command that must not create one: StoreError (exit 2) when the
    location is not a prep store, with nothing written there."""
    store = open_store(url)
    if not is_store(store):
        raise StoreError(f"{url} is not a prep store (no prep keys there; `prep init` or `prep build` makes one)")
    return store
