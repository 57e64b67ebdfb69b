"""The registered `mds` format end to end: a build writes one MDS shard per shard with the .bin's
token ids and the WebDataset samples' ids and texts, the same bytes every time; `prep pull` adds
`mds/index.json` listing the shards it holds, `prep verify` checks it; `show --at` places a
document at its sample's bytes; StreamingDataset reads a pulled folder with no glue."""

from __future__ import annotations

import json
import signal
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from prep.cli.main import cli
from prep.formats import mds
from prep.formats.mds_reader import ShardReader, decode_sample, parse_index
from prep.runner.build import BuildResult
from tests.formats.test_golden import GOLDEN, golden_build, golden_corpus, word_tokenizer
from tests.formats.test_mds import _run_checker, _streaming_python
from tests.formats.test_registry import build_corpus
from tests.helpers import prep_env, run_prep, write_pipeline
from tests.runner.buildsupport import all_objects_intact, artifact_path, read_samples, read_sequences


def prep(*args: str | Path, exit_code: int = 0) -> str:
    """Run a prep command in this process; its output."""
    result = CliRunner().invoke(cli, [str(arg) for arg in args])
    assert result.exit_code == exit_code, result.output
    return result.output


def built(root: Path, vocab_size: int) -> BuildResult:
    """The golden corpus built with bin, mds and wds."""
    golden_corpus(root)
    return build_corpus(root, '["bin", "mds", "wds"]', vocab_size)


def mds_samples(store: Path, result: BuildResult) -> list[mds.Sample]:
    """Every sample of every MDS shard, in shard order."""
    samples: list[mds.Sample] = []
    for artifact in sorted((a for a in result.snapshot.artifacts if a["format"] == "mds"), key=lambda a: a["path"]):
        with ShardReader(artifact_path(store, artifact)) as reader:
            samples.extend(reader)
    return samples


@pytest.mark.parametrize(("vocab_size", "dtype"), [(1000, "uint16"), (70000, "int32")])
def test_mds_shards_hold_the_bin_tokens_and_the_wds_ids_and_texts(tmp_path: Path, vocab_size: int, dtype: str) -> None:
    result = built(tmp_path, vocab_size)
    store = tmp_path / "store"
    samples = mds_samples(store, result)
    sequences = read_sequences(store, result.snapshot.manifest)
    assert len(samples) == len(sequences) == result.snapshot.manifest["stats"]["documents_written"]
    assert all(sample.tokens.dtype == np.dtype(dtype) and np.array_equal(sample.tokens, sequence)
               for sample, sequence in zip(samples, sequences))
    members = read_samples(store, result.snapshot.manifest)
    assert [(s.id, s.text) for s in samples] == [(json.loads(m["json"])["id"], m["txt"].decode()) for _, m in members]
    golden = GOLDEN[vocab_size, '["bin", "wds"]'][1]
    assert {a["path"]: a["sha256"] for a in result.snapshot.artifacts if a["format"] != "mds"} == golden


def test_mds_shards_are_the_same_bytes_every_build(tmp_path: Path) -> None:
    first, second = built(tmp_path / "one", 1000), built(tmp_path / "two", 1000)
    assert first.snapshot.id == second.snapshot.id and first.snapshot.raw == second.snapshot.raw


def test_a_pulled_folder_has_an_index_of_its_mds_shards_that_verify_checks(tmp_path: Path) -> None:
    result = built(tmp_path, 1000)
    snap, store, dest = result.snapshot.id, tmp_path / "store", tmp_path / "dest"
    shards = [a for a in sorted(result.snapshot.artifacts, key=lambda a: a["path"]) if a["format"] == "mds"]
    prep("pull", snap, dest, "--store", store, "--formats", "mds")
    index = parse_index((dest / "mds" / "index.json").read_bytes(), "index.json")
    assert [(e.basename, e.bytes, e.samples) for e in index] == [
        (a["path"].removeprefix("mds/"), a["size"], a["documents"]) for a in shards]
    assert json.loads(prep("verify", snap, dest, "--store", store, "--json"))["ok"]
    (dest / "mds" / "index.json").write_bytes(b"{}")
    report = json.loads(prep("verify", snap, dest, "--store", store, "--json", exit_code=1))
    assert [(p["path"], p["kind"]) for p in report["problems"]] == [("mds/index.json", "wrong-size")]
    prep("pull", snap, tmp_path / "rank1", "--store", store, "--formats", "mds", "--rank", "1", "--world-size", "2")
    held = sorted(p.name for p in (tmp_path / "rank1" / "mds").glob("*.mds"))
    ranked = parse_index((tmp_path / "rank1" / "mds" / "index.json").read_bytes(), "index.json")
    assert [entry.basename for entry in ranked] == held


def test_show_at_places_a_document_at_its_mds_sample(tmp_path: Path) -> None:
    result = built(tmp_path, 70000)
    store = tmp_path / "store"
    last = max((a for a in result.snapshot.artifacts if a["format"] == "mds"), key=lambda a: a["path"])
    for sequence in (0, last["documents"] - 1):
        at = json.loads(prep("show", result.snapshot.id, "--store", store, "--at", f"{last['path']}:{sequence}",
                             "--text", "--json"))
        place = next(p for p in at["trace"]["placements"] if p["format"] == "mds")
        data = artifact_path(store, last).read_bytes()[place["offset"]:place["offset"] + place["length"]]
        sample = decode_sample(data, np.dtype("<i4"), "sample")
        assert sample.text == at["text"] and sample.id == at["trace"]["document"]["id"]


def test_streaming_dataset_reads_a_pulled_snapshot(tmp_path: Path) -> None:
    python = _streaming_python()
    result = built(tmp_path, 70000)
    prep("pull", result.snapshot.id, tmp_path / "dest", "--store", tmp_path / "store", "--formats", "mds")
    lines = _run_checker(python, {"read": [str(tmp_path / "dest" / "mds")], "write": []}, tmp_path)
    sequences = read_sequences(tmp_path / "store", result.snapshot.manifest)
    assert [line["tokens"] for line in lines[str(tmp_path / "dest" / "mds")]] == [s.tolist() for s in sequences]


@pytest.mark.parametrize("point", ["shard.mid_write:2", "shard.after_write:2", "shard.between_puts:2",
                                   "shard.before_commit:2", "publish.before_refs"])
def test_a_build_killed_at_an_mds_write_point_reruns_to_the_same_snapshot(tmp_path: Path, point: str) -> None:
    golden_corpus(tmp_path)
    pipeline = write_pipeline(tmp_path, word_tokenizer(tmp_path / "t.json", 70000), ["corpus"], shard_size="1KB",
                              formats='["mds"]')
    clean = run_prep("build", pipeline, "--store", tmp_path / "clean", "--workers", "2").stdout.split()[-1]
    crashed = run_prep("build", pipeline, "--store", tmp_path / "store", "--workers", "2", check=False,
                       env=prep_env(PREP_CRASH_AT=point), new_session=True)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert all_objects_intact(tmp_path / "store")
    rerun = run_prep("build", pipeline, "--store", tmp_path / "store", "--workers", "2").stdout.split()[-1]
    assert rerun == clean and all_objects_intact(tmp_path / "store")


def test_the_golden_bytes_do_not_move_with_mds_registered() -> None:
    with tempfile.TemporaryDirectory() as folder:
        assert golden_build(Path(folder), 1000, '["bin", "wds"]') == GOLDEN[1000, '["bin", "wds"]']
