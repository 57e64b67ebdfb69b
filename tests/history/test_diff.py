"""Snapshot-level diff on manifests alone: settings flattened and compared exactly, input files
and artifacts matched, stats deltas, and the report's JSON matching prep.diff-report/1."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from prep.history.diff import (
    ABSENT,
    diff_settings,
    diff_snapshots,
    flatten,
    match_artifacts,
)
from prep.manifest import canonical
from prep.manifest.schema import validate
from prep.store.snapshots import Snapshot
from tests.snapshot_factory import artifact_path, manifest_for


def snapshot_of(manifest: dict[str, Any]) -> Snapshot:
    raw = canonical.dumps(manifest)
    return Snapshot(f"sha256:{hashlib.sha256(raw).hexdigest()}", manifest, raw)


def artifact(fmt: str, shard: int, label: str, size: int = 100) -> dict[str, Any]:
    return {"path": artifact_path(fmt, shard), "format": fmt, "shard": shard, "size": size,
            "sha256": hashlib.sha256(label.encode()).hexdigest(), "documents": 3, "tokens": 40}


def base_manifest() -> dict[str, Any]:
    manifest = manifest_for("demo", [artifact("bin", 0, "b0"), artifact("idx", 0, "i0"), artifact("wds", 0, "w0")])
    manifest["config"] = {"input": {"id_field": "id", "text_field": "text"}, "dedup": {"exact": True},
                          "output": {"shard_size": 1000, "formats": ["bin", "wds"]}}
    return manifest


def test_flatten_names_nested_keys_with_dots() -> None:
    assert flatten({"output": {"shard_size": 5, "formats": ["bin"]}, "seed": 1}, "config") == \
        {"config.output.formats": ["bin"], "config.output.shard_size": 5, "config.seed": 1}
    assert flatten(7, "seed") == {"seed": 7}


def test_settings_distinguish_absent_null_and_type() -> None:
    old, new = base_manifest(), base_manifest()
    new["config"]["input"]["id_field"] = None
    new["config"]["dedup"]["exact"] = 1
    del new["config"]["input"]["text_field"]
    new["config"]["extra"] = {"knob": False}
    changes = {c.key: (c.old, c.new) for c in diff_settings(old, new)}
    assert changes == {"config.input.id_field": ("id", None), "config.dedup.exact": (True, 1),
                       "config.input.text_field": ("text", ABSENT), "config.extra.knob": (ABSENT, False)}
    as_json = {c.key: c.to_json() for c in diff_settings(old, new)}
    assert as_json["config.input.text_field"] == {"key": "config.input.text_field", "old": "text"}
    assert as_json["config.input.id_field"] == {"key": "config.input.id_field", "old": "id", "new": None}


def test_settings_compare_list_items_by_type_too() -> None:
    """[1, 0] and [true, false] are different JSON (and different manifests) though Python's == says equal."""
    old, new = base_manifest(), base_manifest()
    old["config"]["extra"] = {"flags": [1, 0], "rows": [{"x": 1}], "same": [1, True, None, "a"]}
    new["config"]["extra"] = {"flags": [True, False], "rows": [{"x": True}], "same": [1, True, None, "a"]}
    changes = {c.key: (c.old, c.new) for c in diff_settings(old, new)}
    assert changes == {"config.extra.flags": ([1, 0], [True, False]), "config.extra.rows": ([{"x": 1}], [{"x": True}])}


def test_an_empty_object_is_a_setting_unlike_an_absent_key() -> None:
    """`{}` against no key at all is reported; an empty object that gained keys reports the keys."""
    old, new = base_manifest(), base_manifest()
    new["config"]["extra"] = {}
    new["tokenizer"]["nested"] = {"empty": {}}
    new["code"]["dependencies"] = {"numpy": "2.0"}
    changes = {c.key: (c.old, c.new) for c in diff_settings(old, new)}
    assert changes == {"config.extra": (ABSENT, {}), "tokenizer.nested.empty": (ABSENT, {}),
                       "code.dependencies.numpy": (ABSENT, "2.0")}
    assert {c.key for c in diff_settings(new, old)} == set(changes)
    assert flatten({"a": {}, "b": {"c": 1}}, "config") == {"config.a": {}, "config.b.c": 1}


SETTING_PATHS = [("seed",), ("dataset",), ("code", "version"), ("code", "dependencies", "numpy"),
                 ("tokenizer", "vocab_size"), ("tokenizer", "encode_special_tokens"),
                 ("config", "output", "shard_size"), ("config", "output", "formats"), ("config", "input", "id_field")]
VALUES = st.one_of(st.integers(0, 5), st.booleans(), st.none(), st.text(max_size=3), st.lists(st.integers(0, 2), max_size=2))


@settings(max_examples=150, deadline=None)
@given(edits=st.dictionaries(st.sampled_from(SETTING_PATHS), VALUES, max_size=4))
def test_settings_report_exactly_the_edited_keys(edits: dict[tuple[str, ...], Any]) -> None:
    old = base_manifest()
    new = copy.deepcopy(old)
    for path, value in edits.items():
        parent = new
        for part in path[:-1]:
            parent = parent.setdefault(part, {})
        parent[path[-1]] = value
    flat_old = {key: value for section in ("seed", "dataset", "code", "tokenizer", "config")
                for key, value in flatten(old[section], section).items()}
    expected = {".".join(path) for path, value in edits.items()
                if ".".join(path) not in flat_old or flat_old[".".join(path)] != value
                or type(flat_old[".".join(path)]) is not type(value)}
    assert {change.key for change in diff_settings(old, new)} == expected


def test_files_artifacts_and_stats() -> None:
    old, new = base_manifest(), base_manifest()
    old["inputs"]["files"] = [{"path": "a.jsonl", "size": 10, "sha256": "1" * 64},
                              {"path": "b.jsonl", "size": 20, "sha256": "2" * 64},
                              {"path": "c.jsonl", "size": 30, "sha256": "3" * 64}]
    new["inputs"]["files"] = [{"path": "a.jsonl", "size": 10, "sha256": "1" * 64},
                              {"path": "b.jsonl", "size": 21, "sha256": "4" * 64},
                              {"path": "d.jsonl", "size": 40, "sha256": "5" * 64}]
    new["artifacts"] = [artifact("bin", 0, "b0"), artifact("idx", 0, "i-new", 60),
                        artifact("wds", 0, "w0"), artifact("bin", 1, "b0")]
    new["stats"]["documents_read"] += 2
    diff = diff_snapshots(snapshot_of(old), snapshot_of(new))
    assert [(f.path, f.change) for f in diff.files] == [("b.jsonl", "changed"), ("c.jsonl", "removed"),
                                                        ("d.jsonl", "added")]
    assert diff.files_unchanged == 1
    assert [(m.new_path, m.size) for m in diff.artifacts_added] == [("bin/00000.idx", 60), ("bin/00001.bin", 100)]
    assert [m.old_path for m in diff.artifacts_removed] == ["bin/00000.idx"]
    assert [(m.old_path, m.new_path) for m in diff.artifacts_unchanged] == [("bin/00000.bin", "bin/00000.bin"),
                                                                            ("wds/00000.tar", "wds/00000.tar")]
    assert {d.key: d.delta for d in diff.stats}["documents_read"] == 2
    assert not diff.identical and diff.settings == ()
    report = {"schema": "prep.diff-report/1", "old": {"spec": "a", "snapshot": diff.old_id, "dataset": "demo"},
              "new": {"spec": "b", "snapshot": diff.new_id, "dataset": "demo"}, **diff.to_json()}
    validate(report, "prep.diff-report/1", "report")


def test_artifacts_are_matched_by_content_even_when_renamed() -> None:
    moved = artifact("wds", 0, "same")
    renamed = {**moved, "path": "wds/00007.tar", "shard": 7}
    added, removed, unchanged = match_artifacts([moved], [renamed])
    assert (added, removed) == ([], [])
    assert [(m.old_path, m.new_path) for m in unchanged] == [("wds/00000.tar", "wds/00007.tar")]


def test_identical_manifests() -> None:
    diff = diff_snapshots(snapshot_of(base_manifest()), snapshot_of(base_manifest()))
    assert diff.identical and diff.files == () and diff.settings == () and diff.artifacts_added == ()
    assert all(delta.delta == 0 for delta in diff.stats)


def test_the_distributions_diff_as_counts_and_an_older_side_shows_them_absent() -> None:
    """Regression: the distributions (tokens_per_document, files) crashed diff_stats, which read
    every stat as an integer (`prep diff` of any two new snapshots: TypeError)."""
    old, new = base_manifest(), base_manifest()
    octave = {"min": 4, "max": 7, "documents": 3}
    new["stats"]["tokens_per_document"] = {"histogram": [{"min": 0, "max": 0, "documents": 0}, octave],
                                           "median": {"min": 5, "max": 5}, "empty": 0, "short": 3, "short_below": 16}
    new["stats"]["files"] = [{"path": "a.jsonl", "documents_read": 3, "bad_records_skipped": 0,
                              "dropped_by_steps": [2], "duplicates_dropped": 0, "documents_written": 3,
                              "tokens_written": 18}]
    newer = copy.deepcopy(new)
    newer["stats"]["files"][0]["dropped_by_steps"] = [5]
    newer["stats"]["tokens_per_document"]["histogram"][1]["documents"] = 4
    deltas = {d.key: (d.old, d.new) for d in diff_snapshots(snapshot_of(new), snapshot_of(newer)).stats
              if d.old != d.new}
    assert deltas == {"files[a.jsonl].dropped_by_steps[0]": (2, 5), "tokens_per_document.histogram[4-7]": (3, 4)}
    against_old = {d.key: (d.old, d.new) for d in diff_snapshots(snapshot_of(old), snapshot_of(new)).stats}
    assert against_old["tokens_per_document.median.min"] == (None, 5)
    assert against_old["files[a.jsonl].tokens_written"] == (None, 18)


def test_the_shards_source_mix_diffs_as_shard_counts_per_bin() -> None:
    old, new = base_manifest(), base_manifest()
    mix = {"shards": 4, "files_written": 2, "largest_file": {"file": 0, "documents": 9},
           "distinct": [{"min": 1, "max": 1, "shards": 1}, {"min": 2, "max": 3, "shards": 3}],
           "largest_share": [{"min_percent": 10 * k, "max_percent": 10 * (k + 1), "shards": int(k == 5) * 4}
                             for k in range(10)]}
    new["stats"]["shard_sources"] = mix
    newer = copy.deepcopy(new)
    newer["stats"]["shard_sources"]["distinct"][0]["shards"] = 0
    newer["stats"]["shard_sources"]["shards"] = 3
    deltas = {d.key: (d.old, d.new) for d in diff_snapshots(snapshot_of(new), snapshot_of(newer)).stats
              if d.old != d.new}
    assert deltas == {"shard_sources.distinct[1-1]": (1, 0), "shard_sources.shards": (4, 3)}
    against_old = {d.key: (d.old, d.new) for d in diff_snapshots(snapshot_of(old), snapshot_of(new)).stats}
    assert against_old["shard_sources.largest_share[50-60%]"] == (None, 4)
