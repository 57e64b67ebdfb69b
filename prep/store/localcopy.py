"""Objects as local files: the store's own file, or a verified download in this machine's cache.

The cache is `$PREP_CACHE/objects/<h2>/<hex>` (docs/store.md, "Outside the store"), keyed by
content hash, so it never serves stale bytes and may be deleted at any time.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

from prep import hashing
from prep.errors import IntegrityError
from prep.machinecache import cache_root
from prep.storage.backend import Store
from prep.store.layout import object_key

DOWNLOAD_CHUNK = 8 << 20

_CHECKED: set[Path] = set()  # cache files (and store files, by verified_local_file) this process has re-hashed


def cache_dir() -> Path:
    """This machine's cache of downloaded objects."""
    return cache_root() / "objects"


def local_file(store: Store, object_id: str) -> Path:
    """A local file holding the object: the store's own file, or a verified cached download.

    A cached file is re-hashed the first time a process uses it (a corrupt one is replaced by a
    fresh download), so it never serves other bytes."""
    sha = hashing.parse_id(object_id)
    local = store.local_path(object_key(sha))
    if local is not None:
        return local
    target = cache_dir() / sha[:2] / sha
    if target in _CHECKED or (target.exists() and _cached_copy_intact(target, sha)):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{sha}.{uuid.uuid4().hex}.part")
    hasher = hashlib.sha256()
    with store.open(object_key(sha)) as source, open(temp, "wb") as sink:
        while chunk := source.read(DOWNLOAD_CHUNK):
            hasher.update(chunk)
            sink.write(chunk)
    if hasher.hexdigest() != sha:
        temp.unlink(missing_ok=True)
        raise IntegrityError(f"{store.url}: object {object_id} does not hash to its name")
    os.replace(temp, target)
    _CHECKED.add(target)
    return target


def verified_local_file(store: Store, object_id: str) -> Path:
    """`local_file`, and a store's own file re-hashed too (once per process): for readers that show
    a user what an object holds and so must never trust a flipped byte of the store itself."""
    path = local_file(store, object_id)
    if path not in _CHECKED:
        if hashing.digest_file(path).sha256 != hashing.parse_id(object_id):
            raise IntegrityError(f"{store.url}: object {object_id} does not hash to its name")
        _CHECKED.add(path)
    return path


def _cached_copy_intact(path: Path, sha: str) -> bool:
    """Re-hash a cached object; a corrupt copy is deleted (the caller downloads it again)."""
    try:
        intact = hashing.digest_file(path).sha256 == sha
    except FileNotFoundError:
        return False
    if intact:
        _CHECKED.add(path)
    else:
        path.unlink(missing_ok=True)
    return intact
