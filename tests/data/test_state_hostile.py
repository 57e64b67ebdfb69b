"""Reader states, sample ranges and mixtures under hostile input: every refusal a prep error naming
the key and value in one short line, never a raw TypeError, RecursionError or OverflowError, and
never a wrong value taken silently; resuming on any world size gives the uninterrupted run's rows."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.data.ledger import consumed, find
from prep.data.reader import MAX_SAMPLES, Reader
from prep.errors import ConfigError, UsageError
from tests.snapshot_factory import pulled_bin_snapshot

SEQ, GLOBAL = 16, 8


@pytest.fixture(scope="module")
def dest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pulled four-shard snapshot (bin only)."""
    return pulled_bin_snapshot(tmp_path_factory.mktemp("state-hostile"))


def _nested(depth: int) -> list[Any]:
    """A list nested `depth` deep: its repr passes the recursion limit."""
    outer: list[Any] = []
    inner = outer
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return outer


def _torch_value(value: int) -> Any:
    torch = pytest.importorskip("torch")
    return torch.tensor(value)


@pytest.mark.parametrize(("key", "value", "needle"), [
    ("seq_len", float(SEQ), f"reader state seq_len must be an integer, got {float(SEQ)}"),
    ("seed", 0.0, "reader state seed must be an integer, got 0.0"),
    ("global_batch_size", float(GLOBAL), f"reader state global_batch_size must be an integer, got {float(GLOBAL)}"),
    ("samples", True, "reader state samples must be an integer, got True"),
    ("samples", float("nan"), "reader state samples must be an integer, got nan"),
    ("samples", np.int64(GLOBAL), "reader state samples must be an integer, got"),
    ("samples", "tensor", "reader state samples must be an integer, got tensor(8)"),
    ("mixture", None, "reader state mixture must be a string, got None"),
    ("sources", "deep", "reader state sources must be a list of snapshot ids, got [[[[...]]]]"),
    ("sources", ["x" * 1_000_000], "reader state is for sources ['xxx"),
    ("extra", 1, "reader state has an unknown key 'extra'"),
])
def test_a_malformed_state_is_a_short_usage_error_naming_the_key(dest: Path, key: str, value: Any, needle: str) -> None:
    """Regression: jsonschema takes 16.0 for the integer 16, so a float seq_len, seed or batch size
    loaded silently; a nested list past the recursion limit raised RecursionError from the error
    message's repr; a megabyte string made a megabyte message."""
    reader = Reader(dest, SEQ, GLOBAL)
    value = _torch_value(GLOBAL) if value == "tensor" else _nested(5_000) if value == "deep" else value
    with pytest.raises(UsageError, match=re.escape(needle)) as raised:
        reader.load_state_dict({**reader.state_dict(), key: value})
    assert len(str(raised.value)) < 400 and reader.consumed == 0


@pytest.mark.parametrize(("state", "needle"), [
    ("state", "not a prep reader state: expected a dict, got a str"),
    (None, "not a prep reader state: expected a dict, got a NoneType"),
    ({"schema": _nested(5_000)}, "not a prep reader state: schema [[[[...]]]]"),
])
def test_what_is_not_a_state_is_refused_in_one_line(dest: Path, state: Any, needle: str) -> None:
    with pytest.raises(UsageError, match=re.escape(needle)):
        Reader(dest, SEQ, GLOBAL).load_state_dict(state)


def test_a_state_lacking_a_key_names_it(dest: Path) -> None:
    reader = Reader(dest, SEQ, GLOBAL)
    state = {key: value for key, value in reader.state_dict().items() if key != "samples"}
    with pytest.raises(UsageError, match="reader state lacks the key 'samples'"):
        reader.load_state_dict(state)


def test_a_state_through_a_torch_checkpoint_resumes(dest: Path) -> None:
    torch = pytest.importorskip("torch")
    reader = Reader(dest, SEQ, GLOBAL, seed=5)
    state = {**reader.state_dict(), "samples": 3 * GLOBAL}
    buffer = io.BytesIO()
    torch.save({"data": state}, buffer)
    buffer.seek(0)
    resumed = Reader(dest, SEQ, GLOBAL, rank=1, world_size=2, seed=5)
    resumed.load_state_dict(torch.load(buffer, weights_only=True)["data"])
    assert (resumed.batch(3) == reader.batch(3)[GLOBAL // 2:]).all() and resumed.consumed == 3 * GLOBAL


def test_a_global_batch_past_the_last_sample_is_refused_when_built(dest: Path) -> None:
    """Regression: a reader of global_batch_size 2**63 was built, and refused every step it was asked."""
    with pytest.raises(UsageError, match=f"global_batch_size must be at most {MAX_SAMPLES}, got {2**63}"):
        Reader(dest, SEQ, 2**63)


@pytest.mark.parametrize(("first", "count", "needle"), [
    (-5, 3, "first must be an integer >= 0, got -5"),
    (1.5, 1, "first must be an integer, got 1.5"),
    (0, -3, "count must be an integer >= 0, got -3"),
    (True, 1, "first must be an integer, got True"),
    (2**63, 1, "lie past the last sample a reader serves"),
    (MAX_SAMPLES, 1, "lie past the last sample a reader serves"),
])
def test_sample_ids_out_of_range_are_refused(dest: Path, first: Any, count: Any, needle: str) -> None:
    """Regression: first -5 returned samples of epoch -1, 1.5 was taken as 1, 2**63 raised OverflowError."""
    with pytest.raises(UsageError, match=re.escape(needle)):
        Reader(dest, SEQ, GLOBAL).sample_ids(first, count)


@pytest.mark.parametrize("samples", [1.5, True, "3", None, 2.0])
def test_a_ledger_of_a_sample_count_that_is_not_an_integer_is_refused(dest: Path, samples: Any) -> None:
    """Regression: "3" and None raised TypeError, 1.5 a TypeError from range(), True was taken as 1."""
    reader = Reader(dest, SEQ, GLOBAL)
    for call in (lambda: consumed(reader, samples), lambda: find(reader, samples, "bin/00000.bin:0")):
        with pytest.raises(UsageError, match="samples must be an integer, got"):
            call()


def test_a_dataset_state_past_the_last_sample_is_refused_before_it_reaches_a_checkpoint(dest: Path) -> None:
    """Regression: state_dict(2**62) returned a state that load_state_dict then refused."""
    pytest.importorskip("torch")
    from prep.data.torch import ReaderDataset

    dataset = ReaderDataset(dest, SEQ, GLOBAL)
    with pytest.raises(UsageError, match="puts the state past the last sample a reader serves"):
        dataset.state_dict(batches_consumed=MAX_SAMPLES // GLOBAL + 1)
    last = dataset.state_dict(batches_consumed=MAX_SAMPLES // GLOBAL)
    ReaderDataset(dest, SEQ, GLOBAL).load_state_dict(last)


def test_a_weight_too_large_for_a_float_is_a_config_error(dest: Path, tmp_path: Path) -> None:
    """Regression: weight = 10**400 (TOML integers are unbounded in tomllib) raised OverflowError."""
    path = tmp_path / "mixture.toml"
    path.write_text(f'[[source]]\nsnapshot = "{dest}"\nweight = {10**400}\n')
    with pytest.raises(ConfigError, match=r"source\[0\]\.weight: expected a finite number >= 0"):
        Reader(path, SEQ, GLOBAL)


@settings(max_examples=20)
@given(seed=st.integers(0, 2**64 - 1), saved_world=st.sampled_from([1, 2, 4, 8]),
       world=st.sampled_from([1, 2, 4, 8]), step=st.integers(0, 2_000))
def test_a_state_resumes_on_any_world_size_with_the_same_rows(dest: Path, seed: int, saved_world: int, world: int,
                                                              step: int) -> None:
    """A state saved by any rank of one world size, through JSON, resumes on another world size at
    the same global rows as one uninterrupted reader (the same inputs give the same batches)."""
    saver = Reader(dest, SEQ, GLOBAL, rank=saved_world - 1, world_size=saved_world, seed=seed)
    saver.load_state_dict({**saver.state_dict(), "samples": step * GLOBAL})
    state = json.loads(json.dumps(saver.state_dict()))
    whole = Reader(dest, SEQ, GLOBAL, seed=seed)
    expected = [whole.batch(at) for at in (step, step + 1)]
    ranks = [Reader(dest, SEQ, GLOBAL, rank=rank, world_size=world, seed=seed) for rank in range(world)]
    for reader in ranks:
        reader.load_state_dict(state)
    iterators = [iter(reader) for reader in ranks]
    for rows in expected:
        assert (np.concatenate([next(it) for it in iterators]) == rows).all()
    assert (Reader(dest, SEQ, GLOBAL, seed=seed).batch(step) == expected[0]).all()
