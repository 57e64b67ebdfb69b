"""`prep show`: SNAP --json prints the manifest byte for byte (manifest files read canonically), --at a
sample key or shard position with --text/--tokens/--json, pulled folders and --megatron-paths; `prep log`
marks collected snapshots and --builds lists builds with their skipped records."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from prep.formats import wds
from prep.manifest.schema import validate
from prep.storage.local import LocalStore
from prep.store import cas
from prep.store.snapshots import resolve
from tests.helpers import make_records, run_prep, write_jsonl, write_pipeline
from tests.runner.buildsupport import read_sequences
from tests.snapshot_factory import Built, build_snapshot


def prep_bytes(*args: str | Path) -> subprocess.CompletedProcess[bytes]:
    """Run the real `prep` command and keep its stdout as bytes."""
    command = [sys.executable, "-m", "prep.cli.main", *map(str, args)]
    environment = {k: v for k, v in os.environ.items() if k != "PREP_STORE"}
    return subprocess.run(command, capture_output=True, env=environment, check=False)


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Built]:
    """A store holding one small snapshot, demo@latest."""
    root = tmp_path_factory.mktemp("show-cli")
    store = LocalStore(root / "store")
    return store.root, build_snapshot(store, root / "work", shard_sizes=(3_000,))


@pytest.mark.parametrize("spec", ["demo@latest", "id", "prefix"])
def test_show_json_writes_exactly_the_stored_bytes(published: tuple[Path, Built], spec: str) -> None:
    store, built = published
    snap = {"id": built.snapshot.id, "prefix": built.snapshot.id[7:19]}.get(spec, spec)
    result = prep_bytes("show", snap, "--store", store, "--json")
    assert result.returncode == 0, result.stderr
    assert result.stdout == built.snapshot.raw and not result.stdout.endswith(b"\n")
    assert f"sha256:{hashlib.sha256(result.stdout).hexdigest()}" == built.snapshot.id
    assert result.stderr == b""


def test_show_json_of_a_saved_manifest_round_trips(published: tuple[Path, Built], tmp_path: Path) -> None:
    store, built = published
    saved = tmp_path / "m.json"
    saved.write_bytes(prep_bytes("show", "demo@latest", "--store", store, "--json").stdout)
    again = prep_bytes("show", saved, "--json")
    assert again.returncode == 0 and again.stdout == built.snapshot.raw and again.stderr == b""


def test_a_pretty_printed_manifest_shows_its_canonical_bytes_and_says_so(
    published: tuple[Path, Built], tmp_path: Path
) -> None:
    _, built = published
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(json.loads(built.snapshot.raw), indent=2) + "\n")
    shown = prep_bytes("show", pretty, "--json")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == built.snapshot.raw
    note = shown.stderr.decode()
    assert note.count("\n") == 1 and note.startswith("prep: note: ")
    assert str(pretty) in note and "not byte-for-byte canonical" in note and built.snapshot.id in note
    summary = prep_bytes("show", pretty)
    assert summary.returncode == 0 and f"snapshot   {built.snapshot.id}" in summary.stdout.decode()


@pytest.mark.parametrize("content", [b"just some text\n", b'{"schema": "prep.snapshot/1"}', b"{}{}", b"\x00\x01"])
def test_a_file_that_is_not_a_manifest_is_refused_in_one_line(tmp_path: Path, content: bytes) -> None:
    bad = tmp_path / "notes.json"
    bad.write_bytes(content)
    result = prep_bytes("show", bad, "--json", "--store", tmp_path / "absent")
    assert result.returncode == 2
    error = json.loads(result.stdout)  # with --json, a failure is a prep.error/1 object on stdout
    validate(error, "prep.error/1", "stdout")
    assert error["exit_code"] == 2 and f"{bad}: not a canonical prep manifest" in error["error"]
    message = result.stderr.decode()
    assert message.startswith("prep: error: ") and message.count("\n") == 1, message
    assert f"{bad}: not a canonical prep manifest" in message
    assert not (tmp_path / "absent").exists()


@dataclasses.dataclass(frozen=True)
class Project:
    """A built pipeline with an id field, two skipped bad records and three formats' shards."""

    root: Path
    store: Path
    snapshot: str
    texts: dict[str, str]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Project:
    root = tmp_path_factory.mktemp("show-at")
    records = make_records(30, seed=8, prefix="s")
    write_jsonl(root / "corpus" / "a.jsonl", records)
    with open(root / "corpus" / "a.jsonl", "a") as out:
        out.write('{"id": "y", "text": broken}\n{"id": "z"}\n')
    pipeline = write_pipeline(root, tokenizer_path, shard_size="2KB", extra_input='on_error = "skip"\n')
    built = run_prep("build", pipeline, "--store", root / "store", "--workers", "1").stdout.split()[-1]
    return Project(root, root / "store", built, {r["id"]: r["text"] for r in records})


def _samples(project: Project) -> list[tuple[str, str, int, dict[str, bytes]]]:
    """(key, tar path, sequence, members) of every WebDataset sample, from the store's files."""
    snapshot = resolve(LocalStore(project.store), project.snapshot)
    found: list[tuple[str, str, int, dict[str, bytes]]] = []
    for artifact in (a for a in snapshot.artifacts if a["format"] == "wds"):
        path = project.store / cas.object_key(artifact["sha256"])
        found.extend((key, artifact["path"], n, members) for n, (key, members) in enumerate(wds.iter_samples(path)))
    return found


def test_show_at_a_sample_key_prints_its_text_tokens_and_json(project: Project) -> None:
    samples = _samples(project)
    assert len(samples) == 30 and len({path for _, path, _, _ in samples}) > 1
    key, path, sequence, members = samples[0]  # every spelling once, on the first sample
    doc_id = json.loads(members["json"])["id"]
    base = ("show", project.snapshot, "--store", project.store, "--at", key)
    assert run_prep(*base, "--text").stdout == project.texts[doc_id] + "\n"  # the corpus' own text
    tokens = [int(t) for t in run_prep(*base, "--tokens").stdout.split()]
    assert tokens == wds.load_npy(members["tokens.npy"]).tolist()
    assert run_prep(*base).stdout == run_prep(*base[:-1], f"{path}:{sequence}").stdout
    for key, path, sequence, members in (samples[0], samples[13], samples[-1]):  # the JSON, across shards
        doc_id = json.loads(members["json"])["id"]
        base = ("show", project.snapshot, "--store", project.store, "--at", key)
        report = json.loads(run_prep(*base, "--text", "--tokens", "--json").stdout)
        validate(report, "prep.show-at/1", "show --at --json")
        assert report["trace"]["sample_key"] == key and report["trace"]["document"]["id"] == doc_id
        assert report["text"] == project.texts[doc_id]
        assert report["tokens"] == wds.load_npy(members["tokens.npy"]).tolist()
        by_path = json.loads(run_prep(*base[:-1], f"{path}:{sequence}", "--json").stdout)
        assert by_path["trace"] == report["trace"] and "text" not in by_path and "tokens" not in by_path


def test_show_at_refuses_what_names_no_document(project: Project) -> None:
    base = ("show", project.snapshot, "--store", project.store)
    for args, message in (((*base, "--at", "0" * 32), "no document with sample key"),
                          ((*base, "--at", "nonsense"), "expected a WebDataset sample key"),
                          ((*base, "--text"), "--text and --tokens need --at"),
                          ((*base, "--root", "x"), "--root goes with --megatron-paths")):
        result = run_prep(*args, check=False)
        assert result.returncode == 2 and result.stderr.startswith("prep: error: ") and message in result.stderr


def test_show_counts_skipped_records_and_log_builds_lists_their_reasons(project: Project) -> None:
    shown = run_prep("show", project.snapshot, "--store", project.store).stdout
    assert "documents  32 read, 2 bad records skipped, 0 duplicates dropped, 30 written" in shown
    builds = run_prep("log", "tiny", "--builds", "--store", project.store).stdout
    assert "  skipped  2 bad records:" in builds and "a.jsonl:31: " in builds and "a.jsonl:32: " in builds
    assert "tokenize 1 ran/0 cached" in builds and f"snapshot {project.snapshot}" in builds
    report = json.loads(run_prep("log", "tiny", "--builds", "--json", "--store", project.store).stdout)
    validate(report, "prep.log-report/1", "log --json")
    [build] = report["builds"]
    assert build["skipped"] == 2 and len(build["skip_reasons"]) == 2 and not build["collected"]
    assert build["host"] and build["stages"]["tokenize"] == {"ran": 1, "cached": 0}


def test_log_marks_a_collected_snapshot(tmp_path: Path, tokenizer_path: Path) -> None:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(5, seed=1, prefix="o"))
    pipeline = write_pipeline(tmp_path, tokenizer_path)
    first = run_prep("build", pipeline, "--store", tmp_path / "store", "--workers", "1").stdout.split()[-1]
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(6, seed=1, prefix="o"))
    second = run_prep("build", pipeline, "--store", tmp_path / "store", "--workers", "1").stdout.split()[-1]
    (tmp_path / "store" / cas.object_key(first.removeprefix("sha256:"))).unlink()  # its manifest object
    lines = run_prep("log", "tiny", "--store", tmp_path / "store").stdout.splitlines()
    assert [line.endswith("(collected)") for line in lines] == [False, True]
    assert second in lines[0] and first in lines[1]
    report = json.loads(run_prep("log", "tiny", "--json", "--store", tmp_path / "store").stdout)
    validate(report, "prep.log-report/1", "log --json")
    assert [(g["snapshot"], g["collected"]) for g in report["generations"]] == [(second, False), (first, True)]
    assert report["builds"] is None
    builds = json.loads(run_prep("log", "tiny", "--builds", "--json", "--store", tmp_path / "store").stdout)["builds"]
    assert [(b["snapshot"], b["collected"]) for b in builds] == [(second, False), (first, True)]


def test_show_dest_and_megatron_paths_load_in_megatron(project: Project, tmp_path: Path) -> None:
    dest = tmp_path / "pulled"
    run_prep("pull", project.snapshot, dest, "--store", project.store)
    snapshot = resolve(LocalStore(project.store), project.snapshot)
    shown = run_prep("show", dest).stdout
    assert shown.startswith(f"snapshot   {snapshot.id}\n") and f"pulled     {dest.resolve()}" in shown
    assert f"present    {len(snapshot.artifacts)} of {len(snapshot.artifacts)} files" in shown
    prefixes = run_prep("show", dest, "--megatron-paths").stdout.split()
    bins = sorted((a for a in snapshot.artifacts if a["format"] == "bin"), key=lambda a: a["path"])
    assert len(bins) > 1 and prefixes == [str(dest.resolve() / a["path"].removesuffix(".bin")) for a in bins]
    sequences = [seq.tolist() for seq in read_sequences(project.store, snapshot.manifest)]
    try:
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    except ImportError:
        pytest.skip("megatron-core is not installed")
    loaded = [IndexedDataset(prefix) for prefix in prefixes]
    assert [np.asarray(ds[i]).tolist() for ds in loaded for i in range(len(ds))] == sequences
    rooted = run_prep("show", project.snapshot, "--store", project.store, "--megatron-paths", "--root", "/data/x")
    assert rooted.stdout.split() == [f"/data/x/{a['path'].removesuffix('.bin')}" for a in bins]
    bare = run_prep("show", project.snapshot, "--store", project.store, "--megatron-paths", check=False)
    assert bare.returncode == 2 and "needs --root DIR" in bare.stderr


def test_megatron_paths_of_a_rank_share_list_only_the_shards_present(project: Project, tmp_path: Path) -> None:
    dest = tmp_path / "rank0"
    run_prep("pull", project.snapshot, dest, "--store", project.store, "--rank", "0", "--world-size", "2")
    listed = run_prep("show", dest, "--megatron-paths")
    prefixes = listed.stdout.split()
    assert prefixes and all(Path(p + ".bin").is_file() and Path(p + ".idx").is_file() for p in prefixes)
    total = sum(a["format"] == "bin" for a in resolve(LocalStore(project.store), project.snapshot).artifacts)
    assert len(prefixes) < total and f"{total - len(prefixes)} of {total} shards are not in" in listed.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    refused = run_prep("show", empty, check=False)
    assert refused.returncode == 2 and "no pulled snapshot" in refused.stderr


def test_log_of_a_dataset_the_store_does_not_know_is_an_error(project: Project) -> None:
    """Regression: a misspelt dataset printed "no refs" and exited 0, as if it existed empty."""
    for extra in ([], ["--builds"], ["--json"]):
        result = run_prep("log", "tiyn", *extra, "--store", project.store, check=False)
        assert result.returncode == 2, result.stderr
        assert "no dataset 'tiyn': no ref and no build log names it" in result.stderr.strip().splitlines()[-1]
        assert "Traceback" not in result.stderr
