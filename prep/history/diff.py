"""Snapshot-level diff: what differs between two snapshot manifests, without reading any artifact.

Reports provenance (input files; every changed setting as a flattened key such as
`config.output.shard_size`), artifacts matched by content hash, and stats deltas. Stage keys and
the input version are consequences of these and are not reported separately.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from prep.store.snapshots import Snapshot

REPORT_SCHEMA = "prep.diff-report/1"
NEAR_CLUSTERS = "near_clusters"  # the stats object of a build with [dedup.near] (manifests/snapshot-1.schema.json)
NEAR_SIZES = f"{NEAR_CLUSTERS}.sizes["  # its size bins' stats keys, `near_clusters.sizes[3-4]` (min-max, as histograms' keys)
SETTING_SECTIONS = ("schema", "dataset", "seed", "code", "tokenizer", "config")


class _Absent:
    """Marks a key one side does not have (distinct from a JSON null)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


@dataclass(frozen=True)
class SettingChange:
    """A setting whose value differs; `old` or `new` is ABSENT when one side lacks the key."""

    key: str
    old: Any = ABSENT
    new: Any = ABSENT

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"key": self.key}
        if self.old is not ABSENT:
            entry["old"] = self.old
        if self.new is not ABSENT:
            entry["new"] = self.new
        return entry


@dataclass(frozen=True)
class InputFile:
    path: str
    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True)
class FileChange:
    """An input file added (only `new`), removed (only `old`) or changed (both, other bytes)."""

    path: str
    old: InputFile | None
    new: InputFile | None

    @property
    def change(self) -> str:
        return "changed" if self.old and self.new else "added" if self.new else "removed"

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"change": self.change, "path": self.path}
        for name, side in (("old", self.old), ("new", self.new)):
            if side is not None:
                entry[name] = {"size": side.size, "sha256": side.sha256}
        return entry


@dataclass(frozen=True)
class ArtifactMatch:
    """An artifact of A, B or both (same content hash); paths may differ between snapshots."""

    sha256: str
    size: int
    format: str
    old_path: str | None
    new_path: str | None

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"sha256": self.sha256, "size": self.size, "format": self.format}
        if self.old_path is not None:
            entry["old_path"] = self.old_path
        if self.new_path is not None:
            entry["new_path"] = self.new_path
        return entry


@dataclass(frozen=True)
class StatDelta:
    key: str
    old: int | None
    new: int | None

    @property
    def delta(self) -> int:
        return (self.new or 0) - (self.old or 0)

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"key": self.key, "delta": self.delta}
        if self.old is not None:
            entry["old"] = self.old
        if self.new is not None:
            entry["new"] = self.new
        return entry


@dataclass(frozen=True)
class SnapshotDiff:
    """Everything `prep diff` reports about two manifests."""

    old_id: str
    new_id: str
    files: tuple[FileChange, ...]
    files_unchanged: int
    settings: tuple[SettingChange, ...]
    artifacts_added: tuple[ArtifactMatch, ...]
    artifacts_removed: tuple[ArtifactMatch, ...]
    artifacts_unchanged: tuple[ArtifactMatch, ...]
    stats: tuple[StatDelta, ...]

    @property
    def identical(self) -> bool:
        return self.old_id == self.new_id

    def files_by_change(self, change: str) -> list[FileChange]:
        return [entry for entry in self.files if entry.change == change]

    def to_json(self) -> dict[str, Any]:
        """The provenance, artifacts and stats sections of a prep.diff-report/1."""
        def total(matches: tuple[ArtifactMatch, ...]) -> dict[str, Any]:
            return {"count": len(matches), "bytes": sum(m.size for m in matches),
                    "entries": [m.to_json() for m in matches]}

        return {
            "identical": self.identical,
            "provenance": {
                "files": [entry.to_json() for entry in self.files],
                "files_unchanged": self.files_unchanged,
                "settings": [entry.to_json() for entry in self.settings],
            },
            "artifacts": {"added": total(self.artifacts_added), "removed": total(self.artifacts_removed),
                          "unchanged": total(self.artifacts_unchanged)},
            "stats": [entry.to_json() for entry in self.stats],
        }


def flatten(value: Any, prefix: str) -> dict[str, Any]:
    """Nested objects as dotted keys (`config.output.shard_size`); lists, scalars and empty
    objects are leaves (an empty object is a value a manifest holds, unlike an absent key)."""
    if not isinstance(value, dict) or not value:
        return {prefix: value}
    flat: dict[str, Any] = {}
    for key in sorted(value):
        flat.update(flatten(value[key], f"{prefix}.{key}" if prefix else str(key)))
    return flat


def diff_settings(old: dict[str, Any], new: dict[str, Any]) -> list[SettingChange]:
    """Every flattened provenance setting whose value differs, in section order."""
    changes: list[SettingChange] = []
    for section in SETTING_SECTIONS:
        flat_old = flatten(old[section], section) if section in old else {}
        flat_new = flatten(new[section], section) if section in new else {}
        keys = sorted(set(flat_old) | set(flat_new))
        for key in keys:
            before, after = flat_old.get(key, ABSENT), flat_new.get(key, ABSENT)
            if _empty_object(before, after) and any(other.startswith(f"{key}.") for other in keys):
                continue  # an empty object that gained (or lost) keys: those keys are the change
            if before is ABSENT or after is ABSENT or not _same_json(before, after):
                changes.append(SettingChange(key, before, after))
    return changes


def _empty_object(before: Any, after: Any) -> bool:
    """Whether one side is an empty object and the other has no value at its key."""
    return (before is ABSENT and isinstance(after, dict) and not after) or \
        (after is ABSENT and isinstance(before, dict) and not before)


def _same_json(a: Any, b: Any) -> bool:
    """Whether two JSON values are the same value of the same types all the way down: `1` is not
    `true` nor `1.0`, at the top or inside a list (where `==` alone calls them equal)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    return bool(a == b)


def diff_files(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> tuple[list[FileChange], int]:
    """Input files added, removed or changed (by path), and how many are unchanged."""
    before = {f["path"]: InputFile(f["path"], f["size"], f["sha256"]) for f in old}
    after = {f["path"]: InputFile(f["path"], f["size"], f["sha256"]) for f in new}
    changes = [FileChange(path, before.get(path), after.get(path)) for path in sorted(set(before) | set(after))
               if before.get(path) != after.get(path)]
    return changes, len(set(before) & set(after)) - sum(1 for c in changes if c.change == "changed")


def match_artifacts(old: list[dict[str, Any]], new: list[dict[str, Any]]
                    ) -> tuple[list[ArtifactMatch], list[ArtifactMatch], list[ArtifactMatch]]:
    """(added, removed, unchanged) artifacts, matched by content hash (repeats pair up in path order)."""
    pending: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for artifact in sorted(old, key=lambda a: a["path"]):
        pending[artifact["sha256"]].append(artifact)
    added: list[ArtifactMatch] = []
    unchanged: list[ArtifactMatch] = []
    for artifact in sorted(new, key=lambda a: a["path"]):
        match = pending[artifact["sha256"]].pop(0) if pending[artifact["sha256"]] else None
        entry = ArtifactMatch(artifact["sha256"], artifact["size"], artifact["format"],
                              match["path"] if match else None, artifact["path"])
        (unchanged if match else added).append(entry)
    removed = [ArtifactMatch(a["sha256"], a["size"], a["format"], a["path"], None)
               for left in pending.values() for a in left]
    return added, sorted(removed, key=lambda m: m.old_path or ""), unchanged


def diff_stats(old: dict[str, Any], new: dict[str, Any]) -> list[StatDelta]:
    """Every stats count of either side, sorted; each document step's counts as `steps[i].use.count`,
    near-duplicate counts as `near_clusters.count` and `near_clusters.sizes[min-max]`."""
    flat_old, flat_new = _stat_counts(old), _stat_counts(new)
    return [StatDelta(key, flat_old.get(key), flat_new.get(key)) for key in sorted(set(flat_old) | set(flat_new))]


def _stat_counts(stats: dict[str, Any]) -> dict[str, int]:
    """A manifest's stats as counts by key: `steps[0].length.dropped`, `steps[0].length.reasons.too few words`,
    `near_clusters.clusters`, `near_clusters.sizes[3-4]`, and the distributions' (`_distribution_counts`);
    a stat of another shape is left out."""
    counts = {key: value for key, value in stats.items() if isinstance(value, int) and not isinstance(value, bool)}
    for index, step in enumerate(stats.get("steps", ())):
        prefix = f"steps[{index}].{step['use']}"
        counts.update({f"{prefix}.{name}": int(value) for name, value in step.items() if name not in ("use", "reasons")})
        counts.update({f"{prefix}.reasons.{reason}": int(value) for reason, value in step["reasons"].items()})
    near = stats.get(NEAR_CLUSTERS, {})
    counts.update({f"{NEAR_CLUSTERS}.{name}": int(value) for name, value in near.items() if name != "sizes"})
    counts.update({f"{NEAR_SIZES}{int(item['min'])}-{int(item['max'])}]": int(item["clusters"])
                   for item in near.get("sizes", ())})
    return counts | _distribution_counts(stats)


def _distribution_counts(stats: dict[str, Any]) -> dict[str, int]:
    """`tokens_per_document.median.min`, `.empty`, `.short`, `.histogram[4-7]` (documents of the
    octave), the shards' source mix (`shard_sources.distinct[2-3]`, `shard_sources.largest_share[50-60%]`:
    shards), and per input file `files[a.jsonl].documents_written`, `files[a.jsonl].dropped_by_steps[0]`."""
    counts: dict[str, int] = {}
    tokens = stats.get("tokens_per_document")
    if isinstance(tokens, dict):
        counts.update({f"tokens_per_document.median.{end}": int(tokens["median"][end]) for end in ("min", "max")})
        counts.update({f"tokens_per_document.{name}": int(tokens[name]) for name in ("empty", "short")})
        counts.update({f"tokens_per_document.histogram[{o['min']}-{o['max']}]": int(o["documents"])
                       for o in tokens["histogram"]})
    mix = stats.get("shard_sources")
    if isinstance(mix, dict):
        counts.update({f"shard_sources.{name}": int(mix[name]) for name in ("shards", "files_written")})
        counts.update({f"shard_sources.distinct[{b['min']}-{b['max']}]": int(b["shards"]) for b in mix["distinct"]})
        counts.update({f"shard_sources.largest_share[{b['min_percent']}-{b['max_percent']}%]": int(b["shards"])
                       for b in mix["largest_share"]})
    for entry in stats.get("files", ()):
        prefix = f"files[{entry['path']}]"
        for name, value in entry.items():
            if isinstance(value, list):
                counts.update({f"{prefix}.{name}[{index}]": int(item) for index, item in enumerate(value)})
            elif name != "path":
                counts[f"{prefix}.{name}"] = int(value)
    return counts


def diff_snapshots(old: Snapshot, new: Snapshot) -> SnapshotDiff:
    """Compare two manifests: provenance, artifacts by content hash, and stats."""
    a, b = old.manifest, new.manifest
    files, files_unchanged = diff_files(a["inputs"]["files"], b["inputs"]["files"])
    added, removed, unchanged = match_artifacts(a["artifacts"], b["artifacts"])
    return SnapshotDiff(old.id, new.id, tuple(files), files_unchanged, tuple(diff_settings(a, b)),
                        tuple(added), tuple(removed), tuple(unchanged), tuple(diff_stats(a["stats"], b["stats"])))
