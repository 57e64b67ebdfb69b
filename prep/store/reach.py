"""Reachability: the objects that snapshots, stage manifests and commit records declare, grown
from roots. One walk shared by garbage collection (what to keep), fsck (what to check) and
`prep copy` (what to copy).

What a record or manifest names is what its type declares (`prep.store.records`), never an id
that merely appears in its text. Each object is noted with what reached it first (`Via`), so a
report can say which snapshot or record a damaged object belongs to. What the walk cannot read
(missing, corrupt, of unknown shape) goes to `Reach.problem`: gc refuses (raises), fsck records.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from prep import hashing
from prep.errors import IntegrityError, NotFoundError, PrepError
from prep.manifest import canonical
from prep.storage.backend import Store
from prep.store import cas, records

IO_THREADS = 8
MISSING, CORRUPT, INVALID = "missing", "corrupt", "invalid"
STAGE_OUTPUT_KIND = {"tokenize": "intermediate", "dedup": "mask", "shuffle": "plan", "route": "route entries",
                     "order": "bucket", "shard": "shard"}
"""What the objects a stage manifest names are, by stage, for reports."""
Item = TypeVar("Item")
Result = TypeVar("Result")


def parallel(function: Callable[[Item], Result], items: Iterable[Item], jobs: int = IO_THREADS) -> list[Result]:
    """`function` over `items` on `jobs` threads, results in item order (store I/O, not CPU)."""
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(function, items))


@dataclass(frozen=True)
class Via:
    """What an object is and what reached it first: `kind` like "artifact bin/00000.bin" or
    "stage manifest (tokenize)", `by` like "tiny@latest" or "tasks/tokenize/<key>.json"."""

    kind: str
    by: str


@dataclass(frozen=True)
class Problem:
    """Something the walk could not follow: a missing, corrupt or invalid object or record."""

    problem: str  # MISSING, CORRUPT or INVALID
    kind: str
    key: str
    by: str
    detail: str
    sha: str | None = None  # the object's SHA-256 hex (None for a record)


def _part_entries(manifest: dict[str, Any]) -> dict[str, str]:
    """The parts' entries objects a (validated) tokenize manifest names, as "part entries": its
    other objects are intermediates, the stage's usual kind."""
    if manifest.get("stage") != "tokenize":
        return {}
    return {hashing.parse_id(task["entries"]): "part entries" for task in manifest["tasks"] if task.get("entries")}


def _loads(raw: bytes, source: str) -> Any:
    """Parse canonical JSON; IntegrityError naming `source` for bytes that are not JSON."""
    try:
        return canonical.loads(raw)
    except ValueError as exc:
        raise IntegrityError(f"{source}: not JSON ({exc}); gc refuses to guess what it named") from None


class Reach:
    """The reached object SHA-256s, grown from roots by following the ids records and manifests
    declare. `required` marks a walk from a ref: what it needs must exist."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.kept: set[str] = set()
        self.via: dict[str, Via] = {}
        self.read: set[str] = set()  # objects read whole and proven by their hash during the walk
        self.shapes: dict[str, records.StageShape | None] = {}  # stage manifests read (None: unreadable)
        self.children: dict[str, frozenset[str]] = {}  # stage manifest sha -> the object shas it names
        self._lock = threading.Lock()

    def problem(self, found: Problem, required: bool, error: PrepError | None) -> None:
        """gc's rule: refuse (raise) for anything corrupt or of unknown shape, and for what a ref
        needs that is missing; a missing object nothing current needs is simply not followed."""
        if error is not None:
            raise error
        if required:
            raise IntegrityError(found.detail)

    def note(self, sha: str, kind: str, by: str) -> None:
        """Keep `sha`, remembering the first kind and reacher it was seen as."""
        with self._lock:
            self.kept.add(sha)
            self.via.setdefault(sha, Via(kind, by))

    def names(self, names: records.Names, by: str, required: bool, kind: str = "object") -> None:
        """Keep what `names` holds, and follow the stage manifests among it."""
        for object_id in sorted(names.objects):
            self.note(hashing.parse_id(object_id), kind, by)
        for ref in sorted(names.manifests, key=lambda ref: (ref.object_id, ref.stage, ref.layout or 0)):
            self.stage_manifest(ref, by, required)

    def _get(self, sha: str, kind: str, by: str, required: bool) -> bytes | None:
        """An object's bytes, proven by their hash; None (after `problem`) when missing or corrupt."""
        key = cas.object_key(sha)
        try:
            raw = cas.get_bytes(self.store, f"sha256:{sha}")
        except NotFoundError:
            detail = (f"{self.store.url}: {kind} sha256:{sha}, reached from {by}, is missing"
                      + ("; gc refuses to guess what it named" if kind.startswith("stage manifest") else ""))
            self.problem(Problem(MISSING, kind, key, by, detail, sha), required, None)
            return None
        except IntegrityError as exc:
            self.problem(Problem(CORRUPT, kind, key, by, exc.message, sha), required, exc)
            return None
        self.read.add(sha)
        return raw

    def stage_manifest(self, ref: records.ManifestRef, by: str, required: bool) -> None:
        """Keep a stage manifest and what it names; each one read once, checked against every name for it."""
        sha = hashing.parse_id(ref.object_id)
        kind = f"stage manifest ({ref.stage})"
        self.note(sha, kind, by)
        if sha not in self.shapes:
            self.shapes[sha] = self._follow(sha, kind, by, required)
        shape = self.shapes[sha]
        if shape is not None:
            source = f"{self.store.url}: stage manifest {ref.object_id}"
            self._checked(lambda: records.check_named(shape, ref, source), kind, sha, by, required)
        elif required and sha not in self.read:
            detail = f"{self.store.url}: {kind} sha256:{sha}, reached from {by}, is missing or unreadable"
            self.problem(Problem(MISSING, kind, cas.object_key(sha), by, detail, sha), True, None)

    def _checked(self, check: Callable[[], Any], kind: str, sha: str, by: str, required: bool) -> Any:
        """Run a shape check; an IntegrityError is an INVALID problem (gc re-raises it)."""
        try:
            return check()
        except IntegrityError as exc:
            self.problem(Problem(INVALID, kind, cas.object_key(sha), by, exc.message, sha), required, exc)
            return None

    def _follow(self, sha: str, kind: str, by: str, required: bool) -> records.StageShape | None:
        """Read a stage manifest and keep what it names; its shape, or None when it is unreadable."""
        raw = self._get(sha, kind, by, required)
        if raw is None:
            return None
        source = f"{self.store.url}: stage manifest sha256:{sha}"

        def parse() -> tuple[records.Names, records.StageShape, dict[str, str]]:
            manifest = _loads(raw, source)
            return records.stage_manifest_names(manifest, source), records.stage_shape(manifest), _part_entries(manifest)

        parsed: tuple[records.Names, records.StageShape, dict[str, str]] | None = self._checked(parse, kind, sha, by,
                                                                                                 required)
        if parsed is None:
            return None
        named, shape, kinds = parsed
        self.children[sha] = frozenset(hashing.parse_id(object_id) for object_id in named.objects)
        output_kind = STAGE_OUTPUT_KIND.get(shape.stage, "object")
        for child in sorted(self.children[sha]):
            self.note(child, f"{kinds.get(child, output_kind)} ({shape.stage} output)",
                      f"stage manifest sha256:{sha[:12]} of {by}")
        return shape

    def snapshot(self, sha: str, by: str, required: bool) -> None:
        """Keep a snapshot manifest, its artifacts and its stages (each snapshot followed once)."""
        if sha in self.kept:
            return
        raw = self._get(sha, "snapshot manifest", by, required)
        if raw is None:
            return
        self.note(sha, "snapshot manifest", by)
        source = f"{self.store.url}: snapshot sha256:{sha}"
        manifest = self._checked(lambda: _loads(raw, source), "snapshot manifest", sha, by, required)
        names = self._checked(lambda: records.snapshot_names(manifest, source), "snapshot manifest", sha, by,
                              required) if manifest is not None else None
        if names is None:
            return
        label = f"snapshot sha256:{sha[:12]} ({by})"
        for artifact in manifest["artifacts"]:
            self.note(str(artifact["sha256"]), f"artifact {artifact['path']}", label)
        tokenizer = manifest["tokenizer"].get("object")
        if tokenizer:
            self.note(hashing.parse_id(str(tokenizer)), "tokenizer file", label)
        for entry in manifest.get("step_sources", ()):
            self.note(hashing.parse_id(str(entry["object"])), f"step source {entry['path']}", label)
        self.names(names, label, required)
