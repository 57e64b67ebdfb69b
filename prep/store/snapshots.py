"""Finding and loading snapshot manifests: by ref, by id, by unique prefix, or from a file."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from prep.errors import IntegrityError, NotFoundError, UsageError
from prep.manifest import canonical
from prep.manifest.schema import validate
from prep.regular import read_regular
from prep.storage.backend import MAX_BODY_BYTES, Store
from prep.store import cas
from prep.store.layout import SNAPSHOTS_PREFIX, history_key, is_decimal, is_marker_key, marker_sha, snapshot_marker_key
from prep.store.refs import Ref, read_history_record, read_ref

SNAPSHOT_SCHEMA = "prep.snapshot/1"
MIN_PREFIX = 4


class ManifestFileError(UsageError):
    """A file given as SNAP that is no prep.snapshot/1 manifest in any JSON spelling (exit 2)."""


@dataclass(frozen=True)
class Snapshot:
    """A loaded snapshot manifest: its id, parsed content and the exact stored bytes."""

    id: str
    manifest: dict[str, Any]
    raw: bytes
    # True for a manifest file whose own bytes were not canonical (pretty-printed, a trailing
    # newline, ...): `raw` is then its canonical encoding, the bytes whose SHA-256 is `id`.
    reencoded: bool = False

    @property
    def dataset(self) -> str:
        return str(self.manifest["dataset"])

    @property
    def artifacts(self) -> list[dict[str, Any]]:
        return list(self.manifest["artifacts"])


def parse_manifest(raw: bytes, source: str) -> Snapshot:
    """Parse and validate stored manifest bytes; the id is the SHA-256 of exactly these bytes."""
    try:
        manifest = canonical.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{source}: not a JSON manifest ({exc})") from None
    validate(manifest, SNAPSHOT_SCHEMA, source)
    return Snapshot(id=f"sha256:{hashlib.sha256(raw).hexdigest()}", manifest=manifest, raw=raw)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object hook refusing repeated keys, which would make the content ambiguous."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"key {key!r} appears twice in one object")
        result[key] = value
    return result


def _no_float(text: str) -> NoReturn:
    """A JSON float hook: a snapshot manifest holds integers only."""
    raise ValueError(f"number {text} is not an integer, and canonical JSON holds no floats")


def _no_constant(text: str) -> NoReturn:
    """A JSON constant hook refusing NaN, Infinity and -Infinity, which JSON itself does not have."""
    raise ValueError(f"{text} is not JSON")


def read_manifest_content(path: Path) -> dict[str, Any]:
    """A manifest file's content, checked as read_manifest_file checks it (strict JSON, the
    prep.snapshot/1 schema) but not encoded canonically: for readers that need no id."""
    return _read_manifest(path)[0]


def _read_manifest(path: Path) -> tuple[dict[str, Any], bytes]:
    source = str(path)

    def refuse(reason: str) -> NoReturn:
        raise ManifestFileError(f"{source}: not a canonical prep manifest ({reason})")

    try:
        data = read_regular(path, MAX_BODY_BYTES)  # a FIFO put there meanwhile: an error, never a hang
    except OSError as exc:
        raise ManifestFileError(f"{source}: cannot read the manifest file ({exc.strerror or exc})") from None
    try:
        manifest = json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys, parse_float=_no_float,
                              parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        refuse(f"not UTF-8: {exc}")
    except ValueError as exc:
        refuse(f"not JSON: {exc}")
    try:
        validate(manifest, SNAPSHOT_SCHEMA, source)
    except IntegrityError as exc:
        refuse(exc.message.removeprefix(f"{source}: "))
    if not isinstance(manifest, dict):  # the schema already demands an object
        refuse("not a JSON object")
    return manifest, data


def read_manifest_file(path: Path) -> Snapshot:
    """Load a manifest file in any JSON spelling; its id is the SHA-256 of its canonical encoding."""
    manifest, data = _read_manifest(path)
    try:
        raw = canonical.dumps(manifest)
    except (TypeError, UnicodeError) as exc:
        raise ManifestFileError(f"{path}: not a canonical prep manifest (cannot be encoded canonically: {exc})") from None
    snapshot_id = f"sha256:{hashlib.sha256(raw).hexdigest()}"
    return Snapshot(id=snapshot_id, manifest=manifest, raw=raw, reencoded=raw != data)


def reencoded_note(spec: str, snapshot: Snapshot) -> str | None:
    """The one line to print on stderr when SPEC's file was read through its canonical encoding."""
    if not snapshot.reencoded:
        return None
    return (f"prep: note: {spec} is not byte-for-byte canonical; its content is snapshot {snapshot.id} "
            f"(the SHA-256 of its canonical encoding, not of the file)")


def publish_manifest(store: Store, manifest: dict[str, Any]) -> Snapshot:
    """Store a snapshot manifest as a content-addressed object and index it."""
    validate(manifest, SNAPSHOT_SCHEMA, "new snapshot manifest")
    raw = canonical.dumps(manifest)
    digest = cas.put_bytes(store, raw)
    store.put_bytes(snapshot_marker_key(digest.id), b"")  # so ids can be listed and found by prefix
    return Snapshot(id=digest.id, manifest=manifest, raw=raw)


def load_snapshot(store: Store, snapshot_id: str) -> Snapshot:
    try:
        raw = cas.get_bytes(store, snapshot_id)
    except NotFoundError:
        raise NotFoundError(f"{store.url}: no snapshot {snapshot_id}") from None
    return parse_manifest(raw, snapshot_id)


def list_snapshot_ids(store: Store, prefix: str = "") -> list[str]:
    """The ids of the snapshots whose markers start with `prefix` (stray keys there name none)."""
    return [f"sha256:{marker_sha(info.key)}" for info in store.list(SNAPSHOTS_PREFIX + prefix)
            if is_marker_key(info.key)]


def is_manifest_path(spec: str) -> bool:
    """Whether SPEC names a manifest file; one that also reads as a ref or an id is refused as ambiguous."""
    if not os.path.isfile(spec):  # False for a name too long to be a file's, so a long ref name is checked as one
        return False
    if os.sep not in spec and "/" not in spec and _reads_as_snapshot_name(spec):
        raise UsageError(f"{spec!r} is both a file here and a snapshot name: write ./{spec} for the file")
    return True


def _reads_as_snapshot_name(spec: str) -> bool:
    """Whether SPEC has the shape of `dataset@ref` or of a snapshot id or hex prefix."""
    if "@" in spec:
        return True
    hexpart = spec.removeprefix("sha256:").lower()
    return len(hexpart) >= MIN_PREFIX and all(c in "0123456789abcdef" for c in hexpart)


def _generation(store: Store, dataset: str, name: str, generation: int) -> Ref | None:
    """One recorded generation of a ref, from its create-only history record."""
    try:
        return read_history_record(store, history_key(dataset, name, generation))
    except NotFoundError:
        return None


def _resolve_ref(store: Store, spec: str) -> Snapshot:
    """`dataset@ref` or `dataset@ref~N`: the ref's value now, or N generations ago (git-like)."""
    dataset, name = spec.split("@", 1)
    name, tilde, back_text = name.partition("~")
    if tilde and not is_decimal(back_text):
        raise UsageError(f"{spec!r}: after ~ comes a number of generations back, like {dataset}@{name}~2")
    back = int(back_text or 0)
    ref = read_ref(store, dataset, name)
    if ref is None:
        raise NotFoundError(f"{store.url}: no ref {dataset}@{name}")
    if back >= ref.generation:
        raise NotFoundError(f"{store.url}: {spec}: {dataset}@{name} has taken only {ref.generation} "
                            f"generations, so ~{ref.generation - 1} is the oldest")
    value = _generation(store, dataset, name, ref.generation - back) if back else ref
    if value is None:
        raise NotFoundError(f"{store.url}: {spec}: generation {ref.generation - back} of {dataset}@{name} is "
                            "not in the store's history")
    if value.deleted:
        raise NotFoundError(f"{store.url}: {spec}: generation {value.generation} of {dataset}@{name} is its "
                            "deletion (prep tag -d), which names no snapshot")
    try:
        snapshot = load_snapshot(store, value.snapshot)
    except NotFoundError:
        raise NotFoundError(f"{store.url}: {spec} is snapshot {value.snapshot}, which is no longer stored "
                            "(collected by prep gc; keep it with [retention] or prep hold)") from None
    if snapshot.dataset != dataset:  # builds and prep tag only ever point a ref at its own dataset's snapshot
        raise IntegrityError(f"{store.url}: {spec} names snapshot {snapshot.id} of dataset {snapshot.dataset!r}, "
                             f"not {dataset!r}: the ref record was written by something other than prep; "
                             "`prep fsck` lists it")
    return snapshot


def resolve(store: Store | None, spec: str) -> Snapshot:
    """Load the snapshot named by SPEC: `dataset@ref`, `dataset@ref~N` (N generations ago),
    `sha256:<hex>`, a unique hex prefix, or the path of a manifest file (which needs no store;
    see read_manifest_file)."""
    if is_manifest_path(spec):
        return read_manifest_file(Path(spec))
    if store is None:
        raise UsageError(f"{spec!r} is not a manifest file, and no store was given")
    if "@" in spec:
        return _resolve_ref(store, spec)
    hexpart = spec.removeprefix("sha256:").lower()
    if len(hexpart) == 64:
        return load_snapshot(store, f"sha256:{hexpart}")
    if len(hexpart) < MIN_PREFIX or any(c not in "0123456789abcdef" for c in hexpart):
        raise UsageError(f"{spec!r} is not a snapshot: use DATASET@REF, sha256:<hex>, a hex prefix of at least "
                         f"{MIN_PREFIX} digits, or a manifest file")
    matches = list_snapshot_ids(store, hexpart)
    if not matches:
        raise NotFoundError(f"{store.url}: no snapshot id starts with {hexpart}")
    if len(matches) > 1:
        raise UsageError(f"{spec!r} is ambiguous: {len(matches)} snapshots start with it")
    return load_snapshot(store, matches[0])
