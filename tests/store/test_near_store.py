"""A store holding a snapshot built with [dedup.near] is a store like any other: gc keeps the
snapshot and collects the cluster rounds' task records and objects past the grace period, fsck
finds it clean, and `prep copy` carries it to another store, where fsck finds it clean too and
`prep trace` still names the kept document of a near duplicate. (gc refused such a store: its
stages were no snapshot layout.)"""

from __future__ import annotations

import json
from pathlib import Path

from prep.storage import LocalStore
from prep.store import records
from tests.helpers import committed_records, run_prep
from tests.neardup.nearstatsupport import write_sized_corpus


def test_gc_fsck_and_copy_keep_a_near_dup_snapshot_whole(tmp_path: Path, tokenizer_path: Path) -> None:
    write_sized_corpus(tmp_path, tokenizer_path, verify=False)
    store = tmp_path / "store"
    built = json.loads(run_prep("build", tmp_path / "pipeline.toml", "--store", store, "--json").stdout)
    assert [stage["name"] for stage in built["stages"]][:3] == ["tokenize", "near_buckets", "near_route"]
    manifest = json.loads((store / "objects" / "sha256" / built["snapshot"][7:9] / built["snapshot"][7:]).read_bytes())
    assert records.snapshot_layout(manifest, "snapshot") == 3
    local = LocalStore(store)
    rounds = [stage for stage in ("near_route", "near_round", "near_drops") if committed_records(local, stage)]
    assert rounds == ["near_route", "near_round", "near_drops"]
    gc = run_prep("gc", "--store", store, "--grace", "0s", check=False)
    assert gc.returncode == 0, gc.stderr
    assert not [record for stage in rounds[:2] for record in committed_records(local, stage).values()]
    [drops] = [record["outputs"]["drops"] for record in committed_records(local, "near_clusters").values()]
    kept = committed_records(local, "near_drops").values()
    assert kept and all(record["outputs"]["drops"] == drops for record in kept)  # one range: its drops are the merged bytes
    assert run_prep("fsck", "--store", store, check=False).returncode == 0
    dropped = json.loads(run_prep("show", "tiny@latest", "--store", store, "--dropped", "near", "--json").stdout)
    first = dropped["documents"][0]
    target = tmp_path / "copy"
    run_prep("copy", "tiny@latest", "--store", store, "--to", target, "--refs")
    assert run_prep("fsck", "--store", target, check=False).returncode == 0
    traced = run_prep("trace", "tiny@latest", first["document"]["id"], "--store", target, "--json").stdout
    [trace] = json.loads(traced)["documents"]
    assert trace["near_duplicate_of"]["trace"]["document"]["id"] == first["kept"]["id"]
