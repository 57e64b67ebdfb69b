"""The end of a build: the snapshot manifest assembled from the committed stages, the refs moved
by compare-and-swap from the generations seen at the start, and the build log (what may differ
between two builds of one snapshot, so none of it is in the id)."""

from __future__ import annotations

import json
import re
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prep import hashing
from prep.errors import RefConflictError, StaleRefError
from prep.formats.units import artifact_format, named_artifact_path, unit_formats, units_for
from prep.inputs.exclusions import Exclusions
from prep.inputs.sources import SourceFile
from prep.quality.sourcemix import shard_sources
from prep.runner.distributions import distribution_stats
from prep.runner.sharding import Sharded, ShardOut
from prep.runner.stage import StageRun
from prep.runner.tokenizing import StepCounts, TokenizedPart
from prep.storage.backend import Store
from prep.store.layout import log_key
from prep.store.refs import Mover, read_ref, read_ref_value, stale_ref, update_ref
from prep.store.snapshots import Snapshot
from prep.store.tags import tag_expectation

SNAPSHOT_SCHEMA = "prep.snapshot/1"  # manifests/snapshot-1.schema.json


def artifacts(shards: Sequence[ShardOut], formats: tuple[str, ...]) -> list[dict[str, Any]]:
    """The snapshot's artifact list: every file of every shard, sorted by path."""
    listed = []
    for shard in shards:
        outputs, sizes = dict(shard.outputs), dict(shard.sizes)
        for fmt in (fmt for unit in units_for(formats) for fmt in unit_formats(unit)):
            if fmt not in outputs and artifact_format(fmt).with_metadata:  # a build without metadata fields
                continue
            listed.append({
                "path": named_artifact_path(fmt, shard.plan.name), "format": fmt, "shard": shard.plan.index,
                "size": sizes[fmt], "sha256": hashing.parse_id(outputs[fmt]),
                "documents": shard.plan.documents, "tokens": shard.plan.tokens,
            })
    return sorted(listed, key=lambda a: a["path"])


def build_stats(sharded: Sharded) -> dict[str, Any]:
    """The snapshot's `stats`: documents and tokens in and out, and each document step's counts."""
    parts = sharded.ordered.tokenized.parts
    steps = step_stats(parts)
    return {
        "documents_read": sum(part.documents for part in parts),
        "duplicates_dropped": sharded.ordered.duplicates_dropped,
        **_near_stats(sharded),
        "documents_written": sum(shard.plan.documents for shard in sharded.shards),
        "tokens_written": sum(shard.plan.tokens for shard in sharded.shards),
        "bad_records_skipped": sum(part.bad_records for part in parts),
        **_excluded_stats(parts),
        "special_token_documents": sum(part.special_token_documents for part in parts),
        **({"steps": [counts.to_json() for counts in steps]} if steps else {}),
        **_distributions(sharded),
    }


def _excluded_stats(parts: Sequence[TokenizedPart]) -> dict[str, int]:
    """`excluded`: the documents deletion requests dropped, only for a build with [input] exclude."""
    counts = [part.excluded for part in parts if part.excluded is not None]
    return {"excluded": sum(counts)} if counts else {}


def _shard_sources(sharded: Sharded, files: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`shard_sources`: the aggregate of the shards' source mixes (prep/quality/sourcemix.py)."""
    return shard_sources([(shard.plan.documents, shard.sources) for shard in sharded.shards],
                         [int(entry["documents_written"]) for entry in files])


def _distributions(sharded: Sharded) -> dict[str, Any]:
    """`tokens_per_document` and `files` (prep/runner/distributions.py), and `shard_sources`."""
    ordered = sharded.ordered
    stats = distribution_stats(ordered.quality, ordered.tokenized.parts, ordered.near_duplicates_dropped is not None)
    return {**stats, "shard_sources": _shard_sources(sharded, stats["files"])}


def _near_stats(sharded: Sharded) -> dict[str, object]:
    """`near_duplicates_dropped` and `near_clusters`, only for a build with [dedup.near] (others
    keep their manifests, and so their ids)."""
    ordered = sharded.ordered
    near = ordered.near_duplicates_dropped
    counts = {} if ordered.near is None else {"near_clusters": ordered.near.to_json()}
    return {} if near is None else {"near_duplicates_dropped": near, **counts}


def step_stats(parts: Sequence[TokenizedPart]) -> list[StepCounts]:
    """Each document step's counts summed over the tokenize tasks, in pipeline order (none: [])."""
    total: list[StepCounts] = []
    for part in parts:
        for index, counts in enumerate(part.steps or ()):
            if index == len(total):
                total.append(counts)
            else:
                total[index] += counts
    return total


def snapshot_manifest(*, dataset: str, seed: int, version: str, sources: list[SourceFile], code: dict[str, Any],
                      tokenizer: dict[str, Any], config: dict[str, Any], stages: list[StageRun],
                      shards: Sequence[ShardOut], formats: tuple[str, ...], stats: dict[str, Any],
                      checks: list[dict[str, object]] | None = None,
                      step_sources: Sequence[dict[str, Any]] = (),
                      exclusions: Exclusions | None = None) -> dict[str, Any]:
    """The `prep.snapshot/1` manifest of a build (schema: manifests/snapshot-1.schema.json); `checks`
    (the [checks] judged) only for a pipeline that declares some, `step_sources` only when it has
    some (a pipeline without function steps), `exclude` (the deletion requests' SHA-256s, never
    their entries) only for one with [input] exclude, so other pipelines keep their ids."""
    return {
        "schema": SNAPSHOT_SCHEMA,
        "dataset": dataset,
        "seed": seed,
        "inputs": {"version": version, "files": [s.to_json() for s in sources]},
        "code": code,
        "tokenizer": tokenizer,
        "config": config,
        "stages": [{"name": run.name, "key": run.key, "output": run.output} for run in stages],
        "artifacts": artifacts(shards, formats),
        "stats": stats,
        **({"checks": checks} if checks is not None else {}),
        **({"step_sources": list(step_sources)} if step_sources else {}),
        **({"exclude": exclusions.to_json()} if exclusions is not None else {}),
    }


SKIPPED_LISTED = 1000  # skipped records a build log lists; `skipped.total` counts them all
LOG_SCHEMA = "prep.build-log/2"  # manifests/build-log-2.schema.json (logs of version 1 stay readable)


@dataclass(frozen=True)
class RefOutcome:
    """What a build did to one ref: moved it, found it already naming the snapshot (unchanged), or
    declined to move it over a value another publisher set while this build ran."""

    name: str
    action: str
    generation: int
    previous: str | None
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "action": self.action, "generation": self.generation,
                "previous": self.previous, **({"reason": self.reason} if self.reason else {})}


@dataclass(frozen=True)
class RefPlan:
    """The refs a build publishes (`latest`, then its tags), the live generation each had when the
    build started, and the caller's `--expect` (for `latest`) and `--force`."""

    dataset: str
    tags: tuple[str, ...]
    seen: dict[str, int]
    expect: int | None = None
    force: bool = False
    latest_snapshot: str | None = None  # what `latest` named at the start
    stale: str = ""  # why `expect` did not hold at the start

    @classmethod
    def note(cls, store: Store, dataset: str, tags: tuple[str, ...], expect: int | None, force: bool) -> RefPlan:
        """Note each ref's generation now, and whether `expect` is stale (see `check_expect`)."""
        values = {name: read_ref_value(store, dataset, name) for name in ("latest", *tags)}
        seen = {name: ref.live if ref else 0 for name, ref in values.items()}
        stale = ""
        if expect is not None and seen["latest"] != expect:
            stale = f"{stale_ref(dataset, 'latest', expect, values['latest'])}; nothing built"
        latest = values["latest"]
        return cls(dataset, tags, seen, expect, force, latest.snapshot if latest and not latest.deleted else None,
                   stale)

    def check_expect(self, latest_looks_built: bool) -> None:
        """StaleRefError (exit 2) before anything is built for an `expect` stale at the start,
        unless `latest` looks like the snapshot this build makes: a rerun of a build killed once
        it had moved `latest` finds the ref up to date (the swap refuses any other snapshot)."""
        if self.stale and not latest_looks_built:
            raise StaleRefError(self.stale)

    def pending(self, store: Store, snapshot_id: str) -> list[str]:
        """The refs that do not name `snapshot_id` yet; RefConflictError (nothing moved) for a tag
        that names another snapshot, unless `force`."""
        todo = []
        for name in ("latest", *self.tags):
            current = read_ref(store, self.dataset, name)
            if current is not None and current.snapshot == snapshot_id:
                continue
            if name != "latest":
                tag_expectation(current, snapshot_id, force=self.force, expect=None)
            todo.append(name)
        return todo

    def expected(self, name: str) -> int | None:
        if name == "latest" and self.expect is not None:
            return self.expect
        return None if self.force else self.seen[name]


def publish_refs(store: Store, plan: RefPlan, snapshot_id: str, warn: Callable[[str], None]) -> list[RefOutcome]:
    """Move the plan's refs to `snapshot_id` by compare-and-swap from the generations noted at the
    start. A ref another publisher moved meanwhile is left alone and recorded as declined: `latest`
    with a warning (with `--expect` a StaleRefError naming the stored snapshot: exit 2), a tag
    silently here, since the caller asked for it by name and reports it as a failure (`declined_tags`)."""
    outcomes = []
    mover = Mover.here("build")
    for name in ("latest", *plan.tags):
        try:
            move = update_ref(store, plan.dataset, name, snapshot_id, expect=plan.expected(name), mover=mover)
        except StaleRefError as exc:
            if name == "latest" and plan.expect is not None:  # the first ref tried: no ref moved to it
                raise StaleRefError(f"{exc}; the snapshot {snapshot_id} is stored but not published") from None
            now = read_ref_value(store, plan.dataset, name)
            outcomes.append(RefOutcome(name, "declined", now.generation if now else 0, now.snapshot if now else None,
                                       str(exc)))
            if name == "latest":
                warn(f"warning: {exc}: another publisher moved it while this build ran (use --force to move it anyway)")
            continue
        ref = move.ref
        if move.history_pending:
            warn(f"warning: {plan.dataset}@{name} moved to generation {ref.generation}, but its history record "
                 f"is not stored ({move.history_pending}); the ref's next move stores it")
        outcomes.append(RefOutcome(name, "moved" if move.moved else "unchanged", ref.generation,
                                   ref.previous if move.moved else ref.snapshot))
    return outcomes


def declined_tags(dataset: str, snapshot_id: str, outcomes: list[RefOutcome]) -> RefConflictError | None:
    """The error (exit 2) for `--tag` names a build left on what another publisher set while it ran:
    a tag is asked for by name, so a script must not go on as if it named this snapshot."""
    declined = [outcome for outcome in outcomes if outcome.action == "declined" and outcome.name != "latest"]
    if not declined:
        return None
    where = "; ".join(f"{dataset}@{o.name} names {o.previous} (generation {o.generation})" for o in declined)
    return RefConflictError(f"{where}, set by another publisher while this build ran; the snapshot {snapshot_id} "
                            f"is stored but not tagged (use --force to move the tag anyway)")


def skipped_records(parts: Sequence[TokenizedPart]) -> dict[str, Any]:
    """Records skipped under on_error = "skip": the total and the first SKIPPED_LISTED as file, line (or row), reason."""
    listed: list[dict[str, Any]] = []
    for part in parts:
        for message in part.bad_record_examples:
            if len(listed) == SKIPPED_LISTED:
                break
            listed.append(_skip_entry(part.source, message))
    return {"total": sum(part.bad_records for part in parts), "listed": listed}


def _skip_entry(source: str, message: str) -> dict[str, Any]:
    """`file:line: reason` (or `file: row N: reason`, `file: reason`, see prep.stages.read.BadRecord) split up."""
    rest = message[len(source):] if source and message.startswith(source) else ""
    if found := re.fullmatch(r":(\d+): (.*)", rest, re.S):
        return {"file": source, "line": int(found.group(1)), "reason": found.group(2)}
    if found := re.fullmatch(r": row (\d+): (.*)", rest, re.S):
        return {"file": source, "row": int(found.group(1)), "reason": found.group(2)}
    if rest.startswith(": "):
        return {"file": source, "reason": rest[2:]}
    return {"file": None, "reason": message}


@dataclass(frozen=True)
class BuildFacts:
    """What a build log records beside the stages: when, where, by whom, on what, and what it did."""

    started: float
    backend: str
    workers: int
    readback: dict[str, Any]
    refs: list[RefOutcome]


def build_log_key(dataset: str, started: float) -> tuple[str, str]:
    """A build's start stamp (whole seconds) and fresh log key. `prep log` lists logs in key
    order, so the key's 12 hex digits begin with the start's microseconds (5 digits): two builds
    that start within one second list in start order (a random suffix could swap them)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(started))
    micro = min(int(started % 1 * 1_000_000), 999_999)
    return stamp, log_key(dataset, stamp, f"{micro:05x}{uuid.uuid4().hex[:7]}")


def write_log(store: Store, dataset: str, snapshot: Snapshot, stages: dict[str, StageRun], sources: list[SourceFile],
              parts: Sequence[TokenizedPart], facts: BuildFacts, extra: dict[str, Any]) -> str:
    """Store a build's log record (`prep.build-log/2`) under a fresh name; returns its key."""
    stamp, key = build_log_key(dataset, facts.started)
    record = {
        "schema": LOG_SCHEMA,
        "snapshot": snapshot.id,
        "dataset": dataset,
        "started": stamp,
        "seconds": round(time.time() - facts.started, 3),
        "host": socket.gethostname(),
        "user": Mover.here("build").user,
        "executor": {"backend": facts.backend, "workers": facts.workers},
        "stages": {n: {"key": r.key, "ran": r.ran, "cached": r.cached} for n, r in stages.items()},
        "inputs": [{"path": s.rel, "location": s.location, "etag": s.etag, "version_id": s.version_id}
                   for s in sources],
        "refs": [outcome.to_json() for outcome in facts.refs],
        "skipped": skipped_records(parts),
        "readback": facts.readback,
        **extra,
    }
    store.put_bytes(key, json.dumps(record, sort_keys=True, indent=1).encode())
    return key
