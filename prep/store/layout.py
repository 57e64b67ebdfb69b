"""The store's key layout (docs/store.md, "Keys"): every key prefix and key of a store, built here only.

Backends (prep.storage) know nothing of this layout; everything above them takes its keys from
this module, so the layout can be read, checked and changed in one place.
"""

from __future__ import annotations

import re

from prep import hashing
from prep.errors import UsageError

OBJECTS_PREFIX = "objects/sha256/"
TASKS_PREFIX = "tasks/"
STAGES_PREFIX = "stages/"
SNAPSHOTS_PREFIX = "snapshots/"
REFS_PREFIX = "refs/"
HISTORY_PREFIX = "history/"
LOGS_PREFIX = "logs/"
LEASES_PREFIX = "leases/"
READBACK_PREFIX = "readback/"
RETENTION_PREFIX = "retention/"
HOLDS_PREFIX = "holds/"
PACKS_PREFIX = "packs/"
# A local store's advisory record of object files proven by hashing, with their stat stamps
# (prep.store.proven): no record or object, so gc and scrub never walk it (gc drops what it collects).
PROVEN_KEY = "proven/objects.jsonl"
RECORD_SUFFIX = ".json"
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # datasets and ref names, matched whole
MAX_NAME_CHARS = 200
"""Longer names are refused: a local store keeps a ref as `<name>.json.lock` beside `<name>.json`,
and a file name has at most 255 bytes; one limit for every store, so any store's names copy to any other."""


def valid_name(name: str) -> bool:
    """Whether `name` may name a dataset or ref (whole-string match: `$` would let a final newline in)."""
    return len(name) <= MAX_NAME_CHARS and NAME_PATTERN.fullmatch(name) is not None


def check_name(kind: str, name: str) -> str:
    """`name` itself when it is a valid dataset or ref name; UsageError otherwise."""
    if not valid_name(name):
        raise UsageError(f"invalid {kind} name {name!r}: use letters, digits, '.', '_' or '-' "
                         f"(at most {MAX_NAME_CHARS}, starting with a letter or digit)")
    return name


def object_key(sha256_hex: str) -> str:
    """Where an object with this SHA-256 lives: `objects/sha256/<h2>/<hex>`."""
    return f"{OBJECTS_PREFIX}{sha256_hex[:2]}/{sha256_hex}"


def object_sha(key: str) -> str:
    """The SHA-256 hex an object key names (the inverse of `object_key`)."""
    return key.rsplit("/", 1)[-1]


def task_record_prefix(stage: str) -> str:
    """`tasks/<stage>/`: the stage's single task records."""
    return f"{TASKS_PREFIX}{stage}/"


def task_record_key(stage: str, key: str) -> str:
    """`tasks/<stage>/<task key>.json`."""
    return f"{task_record_prefix(stage)}{key}{RECORD_SUFFIX}"


def stage_record_key(stage: str, key: str) -> str:
    """`stages/<stage>/<stage key>.json`."""
    return f"{STAGES_PREFIX}{stage}/{key}{RECORD_SUFFIX}"


def pack_stage_prefix(stage: str) -> str:
    """`packs/<stage>/`: every task record pack of the stage."""
    return f"{PACKS_PREFIX}{stage}/"


def pack_prefix(stage: str, anchor: str) -> str:
    """`packs/<stage>/<anchor>/`: the task record packs of plans whose smallest task key is `anchor`."""
    return f"{pack_stage_prefix(stage)}{anchor}/"


def pack_key(stage: str, anchor: str, plan: str, sha256_hex: str) -> str:
    """`packs/<stage>/<anchor>/<plan>-<hex>.json`: a pack of plan `plan`, named by the SHA-256 of its bytes."""
    return f"{pack_prefix(stage, anchor)}{plan}-{sha256_hex}{RECORD_SUFFIX}"


def parse_pack_key(key: str) -> tuple[str, str, str, str] | None:
    """(stage, anchor, plan, sha256 hex) of a pack key, or None for a key that is no pack's."""
    parts = key[len(PACKS_PREFIX):].split("/") if key.startswith(PACKS_PREFIX) else []
    if len(parts) != 3 or not parts[2].endswith(RECORD_SUFFIX):
        return None
    plan, _, sha = parts[2].removesuffix(RECORD_SUFFIX).partition("-")
    if not (parts[0] and is_sha_hex(parts[1]) and is_sha_hex(plan) and is_sha_hex(sha)):
        return None
    return parts[0], parts[1], plan, sha


def snapshot_marker_key(snapshot_id: str) -> str:
    """`snapshots/<hex>`: the create-only marker of a published snapshot manifest."""
    return f"{SNAPSHOTS_PREFIX}{hashing.parse_id(snapshot_id)}"


def marker_sha(key: str) -> str:
    """The snapshot's SHA-256 hex a marker key names (the inverse of `snapshot_marker_key`)."""
    return key[len(SNAPSHOTS_PREFIX):]


def is_sha_hex(text: str) -> bool:
    """Whether `text` is a SHA-256 as keys spell it (64 lowercase hex digits); a stray key under
    `snapshots/` or `holds/` is not, and names nothing."""
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def is_marker_key(key: str) -> bool:
    """Whether a key listed under `snapshots/` is a snapshot marker (its name a SHA-256 hex)."""
    return key.startswith(SNAPSHOTS_PREFIX) and is_sha_hex(marker_sha(key))


def refs_prefix(dataset: str | None = None) -> str:
    """`refs/`, or `refs/<dataset>/` for the refs of one dataset."""
    return REFS_PREFIX + (f"{check_name('dataset', dataset)}/" if dataset else "")


def ref_key(dataset: str, name: str) -> str:
    """`refs/<dataset>/<name>.json`, the current value of `dataset@name`."""
    return f"{refs_prefix(dataset)}{check_name('ref', name)}{RECORD_SUFFIX}"


def history_prefix(dataset: str) -> str:
    """`history/<dataset>/`: every generation any ref of the dataset has taken."""
    return f"{HISTORY_PREFIX}{check_name('dataset', dataset)}/"


def history_key(dataset: str, name: str, generation: int) -> str:
    """`history/<dataset>/<name>/<generation:016d>.json`."""
    return f"{HISTORY_PREFIX}{dataset}/{name}/{generation:016d}{RECORD_SUFFIX}"


def logs_prefix(dataset: str) -> str:
    """`logs/<dataset>/`: the build logs of one dataset."""
    return f"{LOGS_PREFIX}{check_name('dataset', dataset)}/"


def log_key(dataset: str, stamp: str, suffix: str) -> str:
    """`logs/<dataset>/<YYYYMMDDTHHMMSSZ>-<12 hex>.json`, one build log."""
    return f"{LOGS_PREFIX}{dataset}/{stamp}-{suffix}{RECORD_SUFFIX}"


def readback_sha(key: str) -> str:
    """The snapshot's SHA-256 hex a read-back record key names (the inverse of `readback_key`)."""
    return key[len(READBACK_PREFIX):].removesuffix(RECORD_SUFFIX)


def readback_key(snapshot_id: str) -> str:
    """`readback/<hex>.json`: the create-only record that every object of a snapshot read back intact."""
    return f"{READBACK_PREFIX}{hashing.parse_id(snapshot_id)}{RECORD_SUFFIX}"


def leases_prefix(kind: str | None = None) -> str:
    """`leases/`, or `leases/<kind>/` for the leases of one kind (build, gc)."""
    return LEASES_PREFIX + (f"{kind}/" if kind else "")


def lease_folder(kind: str, run: str) -> str:
    """`leases/<kind>/<run>/`: one run's lease keys (one at a time, renewed under new names)."""
    return f"{leases_prefix(kind)}{run}/"


def lease_key(kind: str, run: str, expires: int) -> str:
    """`leases/<kind>/<run>/<expires epoch, 12 digits>.json`."""
    return f"{lease_folder(kind, run)}{expires:012d}{RECORD_SUFFIX}"


def is_decimal(text: str) -> bool:
    """Whether `text` is one or more ASCII digits (str.isdigit also takes '٣' and '²', which int() refuses)."""
    return text.isascii() and text.isdigit()


def parse_lease_key(key: str) -> tuple[str, str, int] | None:
    """(kind, run, expires) of a lease key, or None for a key that is no lease."""
    parts = key[len(LEASES_PREFIX):].split("/") if key.startswith(LEASES_PREFIX) else []
    if len(parts) != 3 or not parts[2].endswith(RECORD_SUFFIX) or not is_decimal(parts[2][:-len(RECORD_SUFFIX)]):
        return None
    return parts[0], parts[1], int(parts[2][:-len(RECORD_SUFFIX)])


def retention_key(dataset: str, generation: int) -> str:
    """`retention/<dataset>/<generation:016d>.json`: one create-only version of a dataset's retention policy."""
    return f"{RETENTION_PREFIX}{check_name('dataset', dataset)}/{generation:016d}{RECORD_SUFFIX}"


def hold_key(snapshot_id: str) -> str:
    """`holds/<hex>.json`: the create-only hold that keeps a snapshot from garbage collection."""
    return f"{HOLDS_PREFIX}{hashing.parse_id(snapshot_id)}{RECORD_SUFFIX}"
