"""What near-duplicate removal dropped, findable afterwards (issue 42): `prep trace` of a dropped
document names its cluster's kept first document (its trace too) and their similarity, also
through an exact copy; `prep show --dropped near` lists the drops object's records; both read the
drops object fail closed, and a snapshot built without [dedup.near] has nothing to list."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prep.history.neardrops import no_near_dedup
from prep.manifest.schema import validate
from prep.neardup.settings import NearDupSettings
from prep.storage import LocalStore
from prep.store import cas
from prep.store.localcopy import local_file
from prep.store.snapshots import Snapshot
from prep.workfiles.drops import open_drops
from tests.cli.test_main_cli import run_main
from tests.helpers import run_prep, write_jsonl, write_pipeline
from tests.neardup.neardupsupport import document, edited, planted, signatures_of, true_jaccard
from tests.runner.test_reuse import flip_byte, object_path

FILES = 3
SETTINGS = NearDupSettings(threshold=0.7, ngram=5, permutations=128, bands=32, rows=4, seed=0, verify=True)
NEAR = '\n[dedup.near]\nthreshold = 0.7\nngram = 5\npermutations = 128\nbands = 32\nrows = 4\nverify = true\n'


@dataclass(frozen=True)
class Built:
    """The planted corpus built with [dedup.near]: its store, snapshot, documents (by position,
    named d<position>) and drops (dropped position -> representative position, in the drops
    object's order)."""

    store: Path
    snapshot: str
    docs: list[list[str]]
    drops: dict[int, int]
    drops_id: str
    chain_end: int  # C of a chain A~B~C: its representative A may be less alike than the threshold


def corpus_docs() -> tuple[list[list[str]], int]:
    """The planted corpus, then a chain (A, B edited from A, C edited from B) and exact copies of
    some of its later documents (of originals, and of edited copies near-duplicate removal
    drops); and the position of C."""
    docs = planted(random.Random(11))
    rng = random.Random(0)  # Jaccard A~B 0.77, B~C 0.80, A~C 0.63
    chain = [document(rng, 200)]
    chain += [edited(rng, chain[0], 0.03)]
    chain += [edited(rng, chain[1], 0.03)]
    copies = [list(docs[at]) for at in range(61, len(docs), 5)]
    return docs + chain + copies, len(docs) + 2


def earlier_copy(docs: list[list[str]], at: int) -> int | None:
    """The first document with the text of document `at`, when it is an earlier one."""
    return next((before for before in range(at) if docs[before] == docs[at]), None)


def read_drops(store: Path, snapshot: str, sizes: list[int]) -> tuple[dict[int, int], str]:
    """The snapshot's drops as corpus positions (one part a file), in the object's order, and its id."""
    manifest = json.loads(cas.get_bytes(LocalStore(store), snapshot))
    stages = {stage["name"]: stage for stage in manifest["stages"]}
    assert len(json.loads(cas.get_bytes(LocalStore(store), stages["tokenize"]["output"]))["tasks"]) == FILES
    drops_id = str(json.loads(cas.get_bytes(LocalStore(store), stages["near_clusters"]["output"]))["drops"])
    records = open_drops(local_file(LocalStore(store), drops_id)).read_all()
    starts = np.concatenate([[0], np.cumsum(sizes)])

    def position(number: Any) -> int:
        return int(starts[int(number) >> 32] + (int(number) & 0xFFFFFFFF))

    return {position(d): position(r) for d, r in zip(records["document"], records["representative"])}, drops_id


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Built:
    root = tmp_path_factory.mktemp("near-trace")
    docs, chain_end = corpus_docs()
    bounds = [len(docs) * index // FILES for index in range(FILES + 1)]
    for index in range(FILES):
        write_jsonl(root / "corpus" / f"part-{index}.jsonl",
                    [{"id": f"d{at}", "text": " ".join(docs[at])} for at in range(bounds[index], bounds[index + 1])])
    pipeline = write_pipeline(root, tokenizer_path, shard_size="8KB", extra=NEAR)
    snapshot = run_prep("build", pipeline, "--store", root / "store", "--workers", "2").stdout.split()[-1]
    drops, drops_id = read_drops(root / "store", snapshot, [bounds[i + 1] - bounds[i] for i in range(FILES)])
    return Built(root / "store", snapshot, docs, drops, drops_id, chain_end)


def expected_similarity(a: list[str], b: list[str]) -> tuple[float, float]:
    """The MinHash estimate and the exact Jaccard, computed from the corpus's own words."""
    sigs = signatures_of([" ".join(a), " ".join(b)], SETTINGS)
    return float(np.mean(sigs[0] == sigs[1])), true_jaccard(a, b, SETTINGS.ngram)


def _trace(capsys: pytest.CaptureFixture[str], built: Built, doc: str, *args: str) -> tuple[int, str, str]:
    return run_main(capsys, "trace", built.snapshot, doc, "--store", built.store, *args)


def test_every_dropped_document_traces_to_its_representative(built: Built, capsys: pytest.CaptureFixture[str]) -> None:
    kinds = {"near": 0, "copy of kept": 0, "copy of near": 0}
    for dropped, kept in built.drops.items():
        code, out, err = _trace(capsys, built, f"d{dropped}", "--json")
        assert code == 0, err
        report = json.loads(out)
        validate(report, "prep.trace-report/1", "trace --json")
        (trace,) = report["documents"]
        assert trace["placements"] == [] and trace["sample_key"] is None
        copy = trace["duplicate_of"]
        if copy is not None:  # exact dedup removed it first: the copy it kept is the first of its text
            assert built.docs[int(copy["document"]["id"][1:])] == built.docs[dropped]
            trace = copy
        near = trace.get("near_duplicate_of")
        if near is None:  # an exact copy of the representative itself
            assert copy is not None and trace["document"]["id"] == f"d{kept}" and trace["placements"]
            kinds["copy of kept"] += 1
            continue
        kinds["copy of near" if copy is not None else "near"] += 1
        assert near["trace"]["document"]["id"] == f"d{kept}" and near["trace"]["placements"]
        assert near["trace"]["duplicate_of"] is None and near["trace"]["sample_key"] is not None
        estimated, jaccard = expected_similarity(built.docs[dropped], built.docs[kept])
        assert (near["estimated_similarity"], near["jaccard"]) == (estimated, jaccard)
        assert (near["threshold"], near["ngram"], near["permutations"]) == (0.7, 5, 128)
    assert all(kinds.values()), kinds


def test_the_text_trace_names_the_kept_document_and_says_when_a_chain_is_below_the_threshold(
        built: Built, capsys: pytest.CaptureFixture[str]) -> None:
    assert built.drops.get(built.chain_end) == built.chain_end - 2, "C should be dropped, its representative A"
    first = next(at for at in built.drops if earlier_copy(built.docs, at) is None)
    for at in [first, built.chain_end]:
        kept = built.drops[at]
        code, out, _ = _trace(capsys, built, f"d{at}")
        estimated, jaccard = expected_similarity(built.docs[at], built.docs[kept])
        lines = out.splitlines()
        assert code == 0 and lines[0].startswith(f"document  d{at}  (")
        assert lines[1] == (f"dropped   as a near duplicate: estimated similarity {estimated:.3f} (MinHash, 128 "
                            f"permutations), Jaccard {jaccard:.3f} on 5-word shingles; threshold 0.7")
        below = min(estimated, jaccard) < 0.7
        assert below or at != built.chain_end  # C's representative is A, Jaccard 0.63
        assert ("below the threshold" in lines[2]) is below
        assert lines[2 + below] == "          of its cluster's kept first document, which the snapshot holds as:"
        assert lines[3 + below].startswith(f"  document  d{kept}  (") and "bin/" in out and "wds/" in out


def test_show_dropped_near_lists_exactly_the_drops(built: Built, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "show", built.snapshot, "--store", built.store, "--dropped", "near",
                              "--limit", "100000", "--json")
    assert code == 0, err
    report = json.loads(out)
    validate(report, "prep.near-dropped-report/1", "show --dropped near --json")
    listed = [(int(entry["document"]["id"][1:]), int(entry["kept"]["id"][1:])) for entry in report["documents"]]
    assert listed == list(built.drops.items())
    assert report["settings"] == {"threshold": 0.7, "ngram": 5, "permutations": 128, "bands": 32, "rows": 4,
                                  "seed": 0, "verify": True}
    for (dropped, kept), entry in zip(listed, report["documents"]):
        assert (entry["estimated_similarity"], entry["jaccard"]) == expected_similarity(built.docs[dropped],
                                                                                        built.docs[kept])
        earlier = earlier_copy(built.docs, dropped)
        assert (entry["exact_copy_of"] or {}).get("id") == (None if earlier is None else f"d{earlier}")
        assert "text" not in entry


def test_show_dropped_near_with_texts(built: Built, capsys: pytest.CaptureFixture[str]) -> None:
    (dropped, kept), *_ = built.drops.items()
    code, out, _ = run_main(capsys, "show", built.snapshot, "--store", built.store, "--dropped", "near",
                            "--limit", "1", "--json", "--text")
    (entry,) = json.loads(out)["documents"]
    assert code == 0 and (entry["text"], entry["kept_text"]) == (" ".join(built.docs[dropped]), " ".join(built.docs[kept]))
    code, out, _ = run_main(capsys, "show", built.snapshot, "--store", built.store, "--dropped", "near",
                            "--limit", "2", "--text")
    first = out.split("\n\n")[0].splitlines()
    assert code == 0 and len(out.split("\n\n")) == 2
    assert first[0].startswith(f"document  d{dropped}  (") and first[1].startswith("dropped   as a near duplicate")
    assert f"--- dropped d{dropped}" in first and f"+++ kept d{kept}" in first
    assert " ".join(built.docs[dropped]) in first and " ".join(built.docs[kept]) in first


def located(built: Built, at: int) -> str:
    """`d<at> (part-<file>.jsonl line <line>)`: where document `at` was read."""
    bounds = [len(built.docs) * index // FILES for index in range(FILES + 1)]
    file = next(index for index in range(FILES) if at < bounds[index + 1])
    return f"d{at} (part-{file}.jsonl line {at - bounds[file] + 1})"


def test_diff_documents_says_which_documents_near_duplicate_removal_dropped(
        built: Built, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = write_pipeline(built.store.parent, tokenizer_path, dataset="plain", shard_size="8KB", name="plain.toml")
    run_prep("build", plain, "--store", built.store, "--workers", "1")
    near = {at: kept for at, kept in built.drops.items() if earlier_copy(built.docs, at) is None}
    code, out, err = run_main(capsys, "diff", "plain@latest", built.snapshot, "--documents", "--json",
                              "--store", built.store)
    report = json.loads(out)
    validate(report, "prep.diff-report/1", "diff --json")
    assert code == 1 and report["documents"]["removed"] == len(near) and report["documents"]["added"] == 0
    assert {change["old"]["id"]: change["why"] for change in report["documents"]["changes"]} == \
        {f"d{at}": f"dropped as a near duplicate of {located(built, kept)}" for at, kept in near.items()}
    code, out, _ = run_main(capsys, "diff", built.snapshot, "plain@latest", "--documents", "--store", built.store)
    added = [line for line in out.splitlines() if line.startswith("  + ")]
    assert code == 1 and len(added) == len(near)
    assert all(line.endswith(f"  was dropped as a near duplicate of {located(built, near[int(line.split()[2][1:])])}")
               for line in added)


def test_a_corrupt_drops_object_is_refused(built: Built, tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(built.store, store)
    flip_byte(object_path(store, built.drops_id), 100)
    dropped = next(iter(built.drops))
    for args in (("trace", built.snapshot, f"d{dropped}"), ("show", built.snapshot, "--dropped", "near")):
        run = run_prep(*args, "--store", store, check=False)
        assert run.returncode == 3 and run.stdout == ""
        assert run.stderr.count("\n") == 1 and run.stderr.startswith("prep: error: ")
        assert "near-duplicate drops object" in run.stderr and built.drops_id in run.stderr


def test_a_step_named_near_is_named_by_its_number() -> None:
    snapshot = Snapshot("sha256:" + "0" * 64, {}, b"")
    assert str(no_near_dedup(snapshot, ["length", "near"])).endswith(
        "no near-duplicate removal to list (its step 2 has use 'near': name it by its number)")


def test_dropped_near_of_a_snapshot_without_near_dedup_is_one_line(tmp_path: Path, tokenizer_path: Path) -> None:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", [{"id": "a", "text": "one two three"}, {"id": "b", "text": "four"}])
    snapshot = run_prep("build", write_pipeline(tmp_path, tokenizer_path), "--store", tmp_path / "store",
                        "--workers", "1").stdout.split()[-1]
    run = run_prep("show", snapshot, "--store", tmp_path / "store", "--dropped", "near", check=False)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == (f"prep: error: snapshot {snapshot[:19]} was built without [dedup.near]: it has no "
                          "near-duplicate removal to list\n")
