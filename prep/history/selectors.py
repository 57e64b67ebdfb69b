"""What users type to name snapshots and documents, checked so that bad input is one clear error.

Light (no numpy, no Arrow): the CLI resolves SNAP specs through it before loading anything heavy.
"""

from __future__ import annotations

from prep.errors import IntegrityError, UsageError
from prep.storage.backend import Store
from prep.store.layout import check_name
from prep.store.layout import is_decimal as is_decimal
from prep.store.snapshots import MIN_PREFIX, Snapshot, is_manifest_path, resolve

HEX_DIGITS = frozenset("0123456789abcdef")
ID_PREFIX = "sha256:"
SHA256_HEX_DIGITS = 64




def is_text(text: str) -> bool:
    """Whether `text` encodes as UTF-8 (a command-line argument of other bytes holds lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def resolve_spec(store: Store | None, spec: str) -> Snapshot:
    """The snapshot SPEC names (prep.store.snapshots.resolve; a manifest file needs no store), with
    a UsageError for an id that is no hex and an IntegrityError for a ref value naming no id."""
    if is_manifest_path(spec):
        return resolve(None, spec)
    if "@" not in spec:
        hexpart = spec.removeprefix(ID_PREFIX).lower()
        if len(hexpart) == SHA256_HEX_DIGITS and not set(hexpart) <= HEX_DIGITS:
            raise UsageError(f"{spec!r} is not a snapshot: use DATASET@REF, sha256:<hex>, a hex prefix of at "
                             f"least {MIN_PREFIX} digits, or a manifest file")
        return resolve(store, spec)
    check_name("dataset", spec.partition("@")[0])  # an empty one read as "no ref @latest"
    try:
        return resolve(store, spec)
    except ValueError as exc:  # hazard: the one ValueError resolve lets out is parse_id's, on a ref value
        where = f"{store.url}: " if store is not None else ""
        raise IntegrityError(f"{where}{spec}: the ref value is damaged ({exc}); `prep fsck` lists such "
                             "records") from None
