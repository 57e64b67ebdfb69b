"""Object files of a local store proven intact by hashing, with the stamp each file had then.

A rebuild reuses every shard its previous build wrote; re-hashing them all made a rebuild with
nothing to do read the whole dataset (20 TB at the target scale). So when a build hashes an
object's file from the disk, the driver records the file's stamp (device, inode, size, mtime,
ctime) in `proven/objects.jsonl`, and a later build trusts an object whose file still has that
stamp without reading it, as `prep pull` trusts its own record. Any write, truncation,
replacement or `touch` of the file changes its stamp (ctime cannot be set back), so such a file
is hashed again; rot below the filesystem is what `prep fsck` finds. So is the one change a stamp
cannot show, as in git's "racily clean" case: a rewrite of the same size within the same tick of
the filesystem's clock (a few ms) as the file's last change, which leaves both times as they
were; only a writer racing prep on the store's own object files could make one. (Linux 6.13 and
later close it on ext4, xfs, btrfs and tmpfs: once a file's times were read, its next change gets
a fine-grained time.)

The record is advisory: lines are appended whole and never fsynced, torn or malformed lines are
ignored, and a missing record only means hashing again. Stores without local files keep none.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from prep.errors import PrepError
from prep.storage.backend import Store
from prep.store.cas import FileStamp, file_stamp
from prep.store.layout import PROVEN_KEY

COMPACT_FACTOR = 4  # rewrite the record once it holds this many lines per object it names


def _path(store: Store) -> Path | None:
    return store.local_path(PROVEN_KEY)


def _parse(line: bytes) -> tuple[str, FileStamp] | None:
    try:
        entry = json.loads(line)
        return str(entry["object"]), FileStamp(*(int(value) for value in entry["stamp"]))
    except (ValueError, KeyError, TypeError):
        return None


def _lines(store: Store) -> list[bytes]:
    """The record's lines, read as every key is; none when it does not read (a FIFO or a huge file there)."""
    try:
        return store.get_bytes(PROVEN_KEY).splitlines()
    except PrepError:
        return []


def load(store: Store) -> dict[str, FileStamp]:
    """The last stamp recorded for each object (nothing for a store without local files); a
    record grown past COMPACT_FACTOR lines per object is rewritten with one line each."""
    path = _path(store)
    if path is None:
        return {}
    lines = _lines(store)
    current = dict(entry for line in lines if (entry := _parse(line)) is not None)
    if len(lines) > COMPACT_FACTOR * max(1, len(current)):
        with contextlib.suppress(OSError):
            _rewrite(path, current)
    return current


def _line(object_id: str, stamp: FileStamp) -> bytes:
    return json.dumps({"object": object_id, "stamp": list(stamp)}, separators=(",", ":")).encode() + b"\n"


def record(store: Store, stamps: Mapping[str, FileStamp]) -> None:
    """Append these proven stamps (never reading the record: a build appends once per shard
    job). Best effort: a record that cannot be written only means hashing again."""
    path = _path(store)
    if path is None or not stamps:
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+b") as out:  # O_APPEND: concurrent builds' lines do not interleave
            end = out.seek(0, os.SEEK_END)
            torn = end > 0 and os.pread(out.fileno(), 1, end - 1) != b"\n"
            out.write((b"\n" if torn else b"") +  # a torn last line must not swallow the first new one
                      b"".join(_line(object_id, stamp) for object_id, stamp in sorted(stamps.items())))


def forget(store: Store, object_ids: Iterable[str]) -> None:
    """Drop deleted objects from the record (gc), so that it names only what the store holds."""
    path, gone = _path(store), set(object_ids)
    if path is None or not gone or not path.exists():
        return
    with contextlib.suppress(OSError):
        _rewrite(path, {object_id: stamp for object_id, stamp in load(store).items() if object_id not in gone})


def _rewrite(path: Path, current: Mapping[str, FileStamp]) -> None:
    """Replace the record with one line per object. Temporaries of earlier rewrites are removed
    first: no listing, gc or scrub looks here, so one left by a killed rewrite would stay forever
    (one of a rewrite still running only fails that rewrite, which is harmless)."""
    for stale in path.parent.glob(f"{path.name}.*.tmp"):
        stale.unlink(missing_ok=True)
    temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        temp.write_bytes(b"".join(_line(object_id, stamp) for object_id, stamp in sorted(current.items())))
        os.replace(temp, path)
    except OSError:  # a full disk: the old record stays as it was
        temp.unlink(missing_ok=True)
        raise


def unchanged(store: Store, object_ids: Iterable[str], known: Mapping[str, FileStamp]) -> set[str]:
    """The objects among `object_ids` whose file still has the stamp `known` records for it."""
    return {object_id for object_id in object_ids
            if (stamp := known.get(object_id)) is not None and file_stamp(store, object_id) == stamp}


def check_stamped(store: Store, object_ids: Sequence[str],
                  check: Callable[[Sequence[str]], Iterable[str]]) -> tuple[list[str], dict[str, FileStamp]]:
    """Run `check` (re-hash, return the bad ones) over `object_ids`: (the bad ones, sorted; the
    stamps of the files that passed and kept the stamp they had before the check, to record)."""
    before = {object_id: file_stamp(store, object_id) for object_id in object_ids}
    bad = sorted(check(object_ids)) if object_ids else []
    failed = set(bad)
    return bad, {object_id: stamp for object_id, stamp in before.items()
                 if stamp is not None and object_id not in failed and file_stamp(store, object_id) == stamp}
