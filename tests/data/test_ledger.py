"""The ledger (prep consumed) over real snapshots: token counts add up to what the reader served,
documents are named as the WebDataset members name them, the digest proves equal data and sees
one edited document, --document answers yes and no, and --state round-trips or is refused."""

from __future__ import annotations

import bisect
import json
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prep.data.ledger import REPORT_SCHEMA, consumed, find
from prep.data.reader import Reader
from prep.errors import UsageError
from prep.formats import wds
from prep.manifest.schema import validate
from tests.helpers import make_records, run_prep, write_jsonl, write_pipeline

SEQ, GLOBAL = 16, 8
EDITED = 7  # the record whose text the second build changes


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> dict[str, Path]:
    """`web` built and pulled (dest-a), rebuilt with one edited document (dest-b), and `plain`
    (bin only, read from the store)."""
    root = tmp_path_factory.mktemp("ledger")
    store = root / "store"
    records = make_records(300, seed=1, prefix="web")
    for dest, corpus in (("dest-a", records), ("dest-b", _edited(records))):
        write_jsonl(root / "web" / "corpus" / "a.jsonl", corpus)
        pipeline = write_pipeline(root / "web", tokenizer_path, dataset="web", shard_size="2KB")
        run_prep("build", pipeline, "--store", store, "--workers", "1")
        run_prep("pull", "web@latest", root / dest, "--store", store)
    write_jsonl(root / "plain" / "corpus" / "a.jsonl", make_records(80, seed=3, prefix="plain"))
    pipeline = write_pipeline(root / "plain", tokenizer_path, dataset="plain", shard_size="2KB", formats='["bin"]')
    run_prep("build", pipeline, "--store", store, "--workers", "1")
    return {"root": root, "store": store, "a": root / "dest-a", "b": root / "dest-b"}


def _edited(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    changed = [dict(record) for record in records]
    changed[EDITED]["text"] = "this one document was edited after the first build"
    return changed


def _reference(reader: Reader, samples: int) -> dict[int, tuple[int, int, int]]:
    """position -> (tokens, windows, first sample), window by window in plain Python."""
    bounds = reader.sources[0].document_bounds().tolist()
    found: dict[int, list[int]] = {}
    for k, (_, _, i) in enumerate(reader.sample_ids(0, samples)):
        start, end = i * SEQ, i * SEQ + SEQ + 1
        document = bisect.bisect_right(bounds, start) - 1
        while document < len(bounds) - 1 and bounds[document] < end:
            entry = found.setdefault(document, [0, 0, k])
            entry[0] += min(end, bounds[document + 1]) - max(start, bounds[document])
            entry[1] += 1
            document += 1
    return {position: (tokens, windows, first) for position, (tokens, windows, first) in found.items()}


def test_token_counts_add_up_to_the_tokens_served(built: dict[str, Path]) -> None:
    reader = Reader(built["a"], seq_len=SEQ, global_batch_size=GLOBAL, seed=2)
    samples = reader.sizes[0] + 3 * GLOBAL  # into the second epoch
    ledger = consumed(reader, samples)
    assert ledger.tokens == sum(d.tokens for d in ledger.documents) == samples * (SEQ + 1)
    assert {d.position: (d.tokens, d.windows, d.first_sample) for d in ledger.documents} == _reference(reader, samples)
    (source,) = ledger.sources
    assert source.samples == samples and source.epochs_reached == 2 and 1 < source.epochs < 2
    report = ledger.to_json()
    validate(report, REPORT_SCHEMA, "ledger")
    assert report["names"] == "wds" and report["schema"] == REPORT_SCHEMA


def test_documents_mode_reads_whole_documents(built: dict[str, Path]) -> None:
    reader = Reader(built["a"], seq_len=SEQ, global_batch_size=4, mode="documents")
    ledger = consumed(reader, 40)
    assert len(ledger.documents) == 40 and all(d.tokens == d.length and d.windows == 1 for d in ledger.documents)
    assert ledger.tokens == sum(d.length for d in ledger.documents)
    validate(ledger.to_json(), REPORT_SCHEMA, "ledger")


def test_documents_are_named_as_the_webdataset_members_name_them(built: dict[str, Path]) -> None:
    reader = Reader(built["a"], seq_len=SEQ, global_batch_size=GLOBAL)
    ledger = consumed(reader, 6 * GLOBAL)
    members: dict[str, tuple[dict[str, Any], np.ndarray]] = {}
    for tar in sorted((built["a"] / "wds").glob("*.tar")):
        for _, sample in wds.iter_samples(tar):
            meta = json.loads(sample[wds.JSON_SUFFIX])
            members[meta["id"]] = (meta, wds.load_npy(sample[wds.TOKENS_SUFFIX]))
    bounds = reader.sources[0].document_bounds()
    for document in ledger.documents:
        meta, tokens = members[document.id]
        assert (document.source, document.line) == (meta["source"], meta["line"])
        start = int(bounds[document.position])
        assert (reader.sources[0].tokens(start, document.length) == tokens).all()


def test_the_digest_is_equal_for_equal_runs_and_changes_with_one_document(built: dict[str, Path]) -> None:
    first = consumed(Reader(built["a"], seq_len=SEQ, global_batch_size=GLOBAL), 10 * GLOBAL)
    snapshot_a = first.sources[0].snapshot
    again = consumed(Reader(snapshot_a, seq_len=SEQ, global_batch_size=GLOBAL, store=str(built["store"])), 10 * GLOBAL)
    assert again.to_json() == first.to_json()  # a pulled folder and the store give one ledger
    edited = consumed(Reader(built["b"], seq_len=SEQ, global_batch_size=GLOBAL), 10 * GLOBAL)
    assert edited.sources[0].snapshot != snapshot_a and edited.digest != first.digest


def test_each_document_hash_sees_exactly_the_edited_document(built: dict[str, Path]) -> None:
    hashes = []
    for folder in ("a", "b"):
        reader = Reader(built[folder], seq_len=SEQ, global_batch_size=1, mode="documents")
        hashes.append({d.id: d.sha256 for d in consumed(reader, reader.sizes[0]).documents})
    assert hashes[0].keys() == hashes[1].keys()
    assert [key for key in hashes[0] if hashes[0][key] != hashes[1][key]] == [f"web-{EDITED}"]


def test_document_query_answers_yes_with_the_samples_and_no(built: dict[str, Path]) -> None:
    reader = Reader(built["a"], seq_len=SEQ, global_batch_size=GLOBAL)
    samples = 4 * GLOBAL
    ledger = consumed(reader, samples)
    inside = max(ledger.documents, key=lambda d: d.windows)
    positions = {d.position for d in ledger.documents if d.id == inside.id}
    bounds = reader.sources[0].document_bounds()
    expected = [k for k, (_, _, i) in enumerate(reader.sample_ids(0, samples))
                if any(bounds[p] < i * SEQ + SEQ + 1 and i * SEQ < bounds[p + 1] for p in positions)]
    query = find(reader, samples, inside.id)
    assert query.touched and [m.samples for m in query.matches] == [tuple(expected)]
    assert query.matches[0].windows == inside.windows == len(expected)
    touched = {d.id for d in ledger.documents}
    outside = next(record["id"] for record in make_records(300, seed=1, prefix="web") if record["id"] not in touched)
    missed = find(reader, samples, outside)
    assert not missed.touched and missed.to_json()["windows"] == 0
    for report in (query.to_json(), missed.to_json()):
        validate(report, REPORT_SCHEMA, "document query")


def test_without_webdataset_files_documents_are_named_by_position(built: dict[str, Path]) -> None:
    reader = Reader("plain@latest", seq_len=SEQ, global_batch_size=GLOBAL, store=str(built["store"]))
    ledger = consumed(reader, 3 * GLOBAL)
    assert ledger.names == "position" and ledger.to_json()["names"] == "position"
    some = ledger.documents[0]
    assert some.id == f"{some.shard}:{some.sequence}" and some.source is None and some.line is None
    assert find(reader, 3 * GLOBAL, some.id).touched
    with pytest.raises(UsageError, match="cannot rule it out"):
        find(reader, 3 * GLOBAL, "plain-3")  # ids are unknown here, so "not touched" would be a guess
    validate(ledger.to_json(), REPORT_SCHEMA, "ledger")


def test_past_the_end_of_a_capped_mixture_is_refused(built: dict[str, Path]) -> None:
    mixture = built["root"] / "capped.toml"
    mixture.write_text('[[source]]\nsnapshot = "dest-a"\nmax_epochs = 1\n')
    reader = Reader(mixture, seq_len=SEQ, global_batch_size=GLOBAL)
    assert consumed(reader, reader.sizes[0]).sources[0].epochs == 1.0
    with pytest.raises(UsageError, match="past the end of the mixture"):
        consumed(reader, reader.sizes[0] + 1)


def test_more_samples_than_a_reader_serves_are_refused_at_once(built: dict[str, Path]) -> None:
    """Past MAX_SAMPLES no reader serves a sample, so the scan would run (practically) forever."""
    reader = Reader(built["a"], seq_len=SEQ, global_batch_size=GLOBAL)

    def stuck(signum: int, frame: object) -> None:
        raise TimeoutError("the ledger scan did not refuse the sample count")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(10)
    try:
        with pytest.raises(UsageError, match=r"samples must be in \[0, 4611686018427387904\], got 100000000000000000000"):
            consumed(reader, 10**20)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _saved_state(built: dict[str, Path], folder: str, steps: int, path: Path) -> dict[str, Any]:
    reader = Reader(built[folder], seq_len=SEQ, global_batch_size=GLOBAL, seed=5)
    iterator = iter(reader)
    for _ in range(steps):
        next(iterator)
    state = reader.state_dict()
    path.write_text(json.dumps(state))
    return state


def test_cli_state_round_trip_prints_the_library_ledger(built: dict[str, Path], tmp_path: Path) -> None:
    state = _saved_state(built, "a", 5, tmp_path / "state.json")
    result = run_prep("consumed", built["a"], "--state", tmp_path / "state.json", "--json")
    report = json.loads(result.stdout)
    validate(report, REPORT_SCHEMA, "prep consumed --json")
    expected = consumed(Reader(built["a"], seq_len=SEQ, global_batch_size=GLOBAL, seed=5), state["samples"])
    assert report == expected.to_json() and report["samples"] == 5 * GLOBAL
    human = run_prep("consumed", built["a"], "--samples", str(5 * GLOBAL), "--seq-len", str(SEQ),
                     "--global-batch", str(GLOBAL), "--seed", "5")
    assert expected.digest in human.stdout and "top documents" in human.stdout
    inside = expected.documents[0].id
    answer = run_prep("consumed", built["a"], "--state", tmp_path / "state.json", "--document", inside, "--json")
    assert json.loads(answer.stdout)["touched"] is True


def test_cli_refuses_a_state_for_other_data_in_one_line(built: dict[str, Path], tmp_path: Path) -> None:
    state = _saved_state(built, "b", 2, tmp_path / "other.json")
    mine = Reader(built["a"], seq_len=SEQ, global_batch_size=GLOBAL, seed=5).state_dict()
    result = run_prep("consumed", built["a"], "--state", tmp_path / "other.json", check=False)
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prep: error: ")
    assert state["sources"][0] in lines[0] and mine["sources"][0] in lines[0]
    both = run_prep("consumed", built["a"], "--state", tmp_path / "other.json", "--samples", "8", check=False)
    assert both.returncode == 2 and "do not also pass --samples" in both.stderr


def test_a_numpy_sample_count_gives_the_report_of_the_same_int(built: dict[str, Path]) -> None:
    """Regression: numpy's int64 reached the report as it was, and json.dumps of it raised TypeError."""
    reader = Reader(built["a"], seq_len=SEQ, global_batch_size=GLOBAL, seed=2)
    ledger = consumed(reader, np.int64(5 * GLOBAL))  # type: ignore[arg-type]
    assert type(ledger.samples) is int and json.loads(json.dumps(ledger.to_json())) == consumed(reader, 5 * GLOBAL).to_json()
