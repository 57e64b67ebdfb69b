"""Every command on a store holding a snapshot built with [dedup.near] (issue 42), through the
real CLI on one module-scoped store (tiny@plain without near-dup removal, tiny@verify with
`verify`, tiny@latest without): a build again is a no-op, status, show, log, ls, tag, diff,
trace, pull, verify, consumed, the reader, rebuild, redact, an exclusion of a cluster's kept
document, gc with a hold, fsck --repair of damaged round records and objects, and an S3 store
(build, gc, fsck, copy). Every --json output validates against its schema.

`prep log --builds` refused every store a near-dup build had logged into (its stages were no
build-log stages) and `prep rebuild` (and a pipeline written by `prep show --pipeline`) refused
the recorded threshold, a decimal string; `prep status` listed no near stage. The tests below
failed on each."""

from __future__ import annotations

import json
import shutil
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from prep.config import parse_pipeline
from prep.data import Reader
from prep.manifest.schema import validate
from prep.store.layout import object_key
from tests.helpers import run_prep, unpack
from tests.neardup.nearstatsupport import write_sized_corpus
from tests.s3support import new_bucket


@dataclass(frozen=True)
class NearStore:
    """The built store, the folder of its pipelines and corpus, and the snapshots by tag."""

    root: Path
    store: Path
    snapshots: dict[str, str]
    drops: list[dict[str, Any]]  # every near-dropped document of tiny@latest, as --dropped near --json lists them

    def prep(self, *args: str | Path, check: bool = True, store: Path | str | None = None) -> Any:
        """`prep ARGS --store STORE --json -q`: its JSON document, validated against its schema."""
        result = run_prep(*args, "--store", store or self.store, "--json", "-q", check=check)
        document = json.loads(result.stdout)
        validate(document, document["schema"], f"prep {' '.join(map(str, args))}")
        return document

    @property
    def near(self) -> str:
        return self.snapshots["latest"]

    def dropped(self, exact: bool) -> dict[str, Any]:
        """A near-dropped document that exact dedup dropped first (`exact`) or that is only alike."""
        return next(drop for drop in self.drops if (drop["exact_copy_of"] is not None) == exact)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> NearStore:
    root = tmp_path_factory.mktemp("nearcommands")
    store = root / "store"
    snapshots = {}
    for name, near, verify in (("plain", False, False), ("verify", True, True), ("latest", True, False)):
        write_sized_corpus(root, tokenizer_path, verify=verify, near=near, name=f"{name}.toml")
        tags = ("--tag", name) if name != "latest" else ()
        snapshots[name] = run_prep("build", root / f"{name}.toml", "--store", store, *tags, "-q").stdout.strip()
    listed = run_prep("show", "tiny@latest", "--store", store, "--dropped", "near", "--limit", "1000", "--json")
    return NearStore(root, store, snapshots, json.loads(listed.stdout)["documents"])


def test_a_second_build_reuses_everything_and_every_build_log_reads_back(built: NearStore) -> None:
    report = built.prep("build", built.root / "latest.toml")
    assert report["snapshot"] == built.near and report["up_to_date"]
    assert [stage["name"] for stage in report["stages"] if stage["ran"]] == []
    status = built.prep("status", built.root / "latest.toml")
    assert status["up_to_date"] and status["latest"] == built.near
    assert [stage["name"] for stage in status["stages"]] == ["tokenize", "near_buckets", "near_clusters", "order",
                                                             "shard"]
    for log in (built.store / "logs" / "tiny").glob("*.json"):
        data = json.loads(log.read_text())
        validate(data, data["schema"], str(log))
    logged = built.prep("log", "tiny", "--builds")
    assert len(logged["builds"]) == 4 and built.near in [entry["snapshot"] for entry in logged["generations"]]
    newest = logged["builds"][0]
    assert newest["snapshot"] == built.near
    # the cluster task is found committed before any round: no round is planned
    assert list(newest["stages"]) == ["tokenize", "near_buckets", "near_clusters", "order", "shard"]
    first = logged["builds"][1]  # the first build of latest.toml
    assert list(first["stages"]) == ["tokenize", "near_buckets", "near_route", "near_round", "near_drops",
                                     "near_clusters", "order", "shard"]


def test_show_ls_and_tag_read_the_near_dup_snapshot(built: NearStore, tmp_path: Path) -> None:
    lines = run_prep("show", built.near, "--store", built.store).stdout.splitlines()
    stages = [line for line in lines if line.startswith("stage ")]
    assert [line.split()[1] for line in stages] == ["tokenize", "near_buckets", "near_clusters", "order", "shard"]
    assert len({line.index(" key ") for line in stages}) == 1  # one column
    page = tmp_path / "stats.html"
    run_prep("show", built.near, "--stats", "--html", page, "--store", built.store)
    assert page.read_text().lstrip().lower().startswith("<!doctype html")
    report = built.prep("show", built.near, "--stats")
    sizes = report["stats"]["near_clusters"]["sizes"]
    assert report["snapshot"] == built.near and sizes
    labels = [str(item["max"]) if item["min"] == item["max"] else f"{item['min']}-{item['max']}" for item in sizes]
    assert "<h2>Near-duplicate clusters by size</h2>" in page.read_text()
    assert all(f"<th>{label}</th>" in page.read_text() for label in labels)
    text = run_prep("show", built.near, "--stats", "--store", built.store).stdout.splitlines()
    at = next(index for index, line in enumerate(text) if line.startswith("near-duplicate clusters by size: "))
    bars = text[at + 1:at + 1 + len(sizes)]
    assert [line.split("│")[0].strip() for line in bars] == labels
    assert [int(line.rsplit(" ", 1)[1]) for line in bars] == [int(item["clusters"]) for item in sizes]
    at = built.prep("show", built.near, "--at", "bin/0000000000000000.bin:0")
    assert at["snapshot"] == built.near and at["trace"]["placements"]
    assert built.near in [ref["snapshot"] for ref in built.prep("ls")["refs"]]
    assert built.prep("tag", built.near, "kept")["ref"]["snapshot"] == built.near
    run_prep("tag", "-d", "tiny@kept", "--store", built.store)


def test_show_pipeline_writes_a_pipeline_that_builds_the_same_settings(built: NearStore) -> None:
    text = run_prep("show", built.near, "--pipeline", "--store", built.store).stdout
    pipeline = parse_pipeline(tomllib.loads(text), built.root / "corpus", "shown")
    mine = parse_pipeline(tomllib.loads((built.root / "latest.toml").read_text()), built.root, "latest.toml")
    assert pipeline.dedup == mine.dedup and pipeline.dedup.near is not None
    assert pipeline.dedup.near.threshold == 0.7


def test_rebuild_proves_the_near_dup_snapshot_from_the_store(built: NearStore) -> None:
    report = built.prep("rebuild", built.snapshots["verify"], "--inputs", built.root / "corpus")
    assert report["same"] and report["rebuilt"] == built.snapshots["verify"]


def test_diff_against_a_plain_and_another_near_snapshot(built: NearStore) -> None:
    plain = built.prep("diff", "tiny@plain", built.near, "--documents", check=False)
    changes = plain["documents"]["changes"]
    near_only = {drop["document"]["id"] for drop in built.drops if drop["exact_copy_of"] is None}
    assert {change["old"]["id"] for change in changes} == near_only and plain["documents"]["removed"] == len(near_only)
    assert all(change["change"] == "removed" and "near duplicate" in change["why"] for change in changes)
    other = built.prep("diff", built.near, "tiny@verify", "--documents", check=False)
    assert {"config.dedup.near.verify"} == {entry["key"] for entry in other["provenance"]["settings"]}
    assert not other["identical"]


def test_trace_names_what_kept_each_document(built: NearStore) -> None:
    alike, exact = built.dropped(exact=False), built.dropped(exact=True)
    [kept] = built.prep("trace", built.near, alike["kept"]["id"])["documents"]
    assert kept["placements"] and not kept.get("near_duplicate_of")
    [near] = built.prep("trace", built.near, alike["document"]["id"])["documents"]
    assert not near["placements"]
    assert near["near_duplicate_of"]["trace"]["document"]["id"] == alike["kept"]["id"]
    [copy] = built.prep("trace", built.near, exact["document"]["id"])["documents"]
    assert not copy["placements"] and copy["duplicate_of"]["placements"]
    everywhere = built.prep("trace", "--all", alike["document"]["id"])
    assert {entry["snapshot"] for entry in everywhere["snapshots"]} >= set(built.snapshots.values())


def test_pull_verify_consumed_and_the_reader_see_only_kept_documents(built: NearStore, tmp_path: Path) -> None:
    dest = tmp_path / "pulled"
    built.prep("pull", built.near, dest)
    assert built.prep("verify", built.near, dest)["ok"]
    written = built.prep("show", built.near)["stats"]["documents_written"]
    reader = Reader(dest, seq_len=64, global_batch_size=1, mode="documents")
    epoch = [tuple(batch[0].tolist()) for _, batch in zip(range(written), reader)]
    assert len(set(epoch)) == written
    alike = built.dropped(exact=False)
    consumed = built.prep("consumed", dest, "--samples", written, "--mode", "documents", "--seq-len", "64",
                          "--document", alike["kept"]["id"])
    assert consumed["touched"] and consumed["windows"] == 1
    gone = run_prep("consumed", dest, "--samples", written, "--mode", "documents", "--seq-len", "64",
                    "--document", alike["document"]["id"], check=False)
    assert gone.returncode == 2


def test_redact_then_exclude_the_kept_document_of_a_cluster(built: NearStore, tmp_path: Path) -> None:
    """Deleting a cluster's kept document: the next build keeps another member, trace says so, and
    once gc collects the older snapshots (one held until released) redact finds it nowhere."""
    store = tmp_path / "store"
    shutil.copytree(built.store, store)
    members = Counter(drop["kept"]["id"] for drop in built.drops)
    first = members.most_common(1)[0][0]
    cluster = {drop["document"]["id"] for drop in built.drops if drop["kept"]["id"] == first}
    request = built.root / "request.txt"
    request.write_text(f"id:{first}\n")
    redacted = built.prep("redact", request, "--dataset", "tiny", store=store, check=False)
    assert not redacted["clean"]
    pipeline = (built.root / "latest.toml").read_text()
    pipeline = pipeline.replace('id_field = "id"\n', 'id_field = "id"\nexclude = ["request.txt"]\n')
    (built.root / "excluded.toml").write_text(pipeline)
    excluded = built.prep("build", built.root / "excluded.toml", store=store)["snapshot"]
    missing = run_prep("trace", excluded, first, "--store", store, check=False)
    assert missing.returncode == 2 and "deletion requests" in missing.stderr
    after = built.prep("show", excluded, "--dropped", "near", "--limit", "1000", store=store)["documents"]
    kept = {drop["kept"]["id"]: drop["document"]["id"] for drop in after
            if drop["document"]["id"] in cluster and drop["exact_copy_of"] is None}
    assert kept and set(kept) <= cluster  # another member keeps the cluster
    [now_kept, dropped] = next(iter(kept.items()))
    assert built.prep("trace", excluded, now_kept, store=store)["documents"][0]["placements"]
    [trace] = built.prep("trace", excluded, dropped, store=store)["documents"]
    assert trace["near_duplicate_of"]["trace"]["document"]["id"] == now_kept and not trace["placements"]
    built.prep("hold", built.near, "--reason", "audit", store=store)
    for tag in ("plain", "verify"):
        run_prep("tag", "-d", f"tiny@{tag}", "--store", store)
    built.prep("gc", "--grace", "0s", "--keep-last", "1", "--keep-within", "0s", store=store)
    alike = built.dropped(exact=False)
    [held] = built.prep("trace", built.near, alike["document"]["id"], store=store)["documents"]
    assert held["near_duplicate_of"]["trace"]["document"]["id"] == alike["kept"]["id"]
    run_prep("release", built.near, "--store", store)
    built.prep("gc", "--grace", "0s", "--keep-last", "1", "--keep-within", "0s", store=store)
    assert run_prep("show", built.near, "--store", store, check=False).returncode == 2
    assert built.prep("redact", request, "--dataset", "tiny", store=store)["clean"]
    assert run_prep("fsck", "--store", store, check=False).returncode == 0


def _damage_rounds(store: Path) -> list[str]:
    """Flip a byte of every small-star round's edges object (the drops task reads the last one)
    and delete the settled large-star round's record, the drops task's and the cluster task's
    (found, it would spare the build every round): a rerun must read the damaged edges. The
    flipped objects' keys. (Every stage's packs are unpacked into single records first, as a
    store committed one record a task holds them, so records can go one by one.)"""
    for stage in sorted(path.name for path in (store / "packs").iterdir()):
        unpack(store, stage)
    flipped = []
    for path in (store / "tasks" / "near_round").glob("*.json"):
        record = json.loads(path.read_text())
        if record["summary"].get("settled"):
            path.unlink()
        elif "settled" not in record["summary"]:
            edges = store / object_key(record["outputs"]["edges"].removeprefix("sha256:"))
            edges.chmod(0o644)
            data = bytearray(edges.read_bytes())
            data[len(data) // 2] ^= 0xFF
            edges.write_bytes(bytes(data))
            flipped.append(edges.relative_to(store).as_posix())
    for stage in ("near_drops", "near_clusters"):
        for path in (store / "tasks" / stage).glob("*.json"):
            path.unlink()
    assert flipped
    return flipped


def test_damaged_cluster_rounds_are_recomputed_and_fsck_repairs_them(built: NearStore, tmp_path: Path) -> None:
    store = tmp_path / "store"  # the rounds of one build only
    assert built.prep("build", built.root / "latest.toml", store=store)["snapshot"] == built.near
    damaged = _damage_rounds(store)
    rebuilt = built.prep("build", built.root / "latest.toml", store=store)
    assert rebuilt["snapshot"] == built.near and rebuilt["up_to_date"]
    assert built.prep("log", "tiny", "--builds", store=store)["builds"][0]["recomputed"] == len(damaged)
    assert built.prep("fsck", store=store)["clean"]
    flipped = _damage_rounds(store)
    found = built.prep("fsck", store=store, check=False)
    assert not found["clean"] and {finding["key"] for finding in found["findings"]} == set(flipped)
    repaired = built.prep("fsck", "--repair", store=store, check=False)
    assert set(repaired["repair"]["removed_objects"]) == set(flipped) and not repaired["repair"]["unrepairable"]
    assert built.prep("fsck", store=store)["clean"]
    assert built.prep("build", built.root / "latest.toml", store=store)["snapshot"] == built.near
    assert built.prep("fsck", store=store)["clean"]


@pytest.mark.usefixtures("s3_endpoint")
def test_an_s3_store_builds_collects_checks_and_receives_a_near_dup_snapshot(built: NearStore) -> None:
    store = f"{new_bucket()}/store"
    built.prep("build", built.root / "latest.toml", store=store)
    built.prep("gc", "--grace", "0s", store=store)
    assert built.prep("fsck", store=store)["clean"]
    again = built.prep("build", built.root / "latest.toml", store=store)
    assert again["snapshot"] == built.near and again["up_to_date"]
    copied = f"{new_bucket()}/copy"
    built.prep("copy", built.near, "--to", copied, "--refs")
    assert built.prep("fsck", store=copied)["clean"]
    alike = built.dropped(exact=False)
    [trace] = built.prep("trace", "tiny@latest", alike["document"]["id"], store=copied)["documents"]
    assert trace["near_duplicate_of"]["trace"]["document"]["id"] == alike["kept"]["id"]
