"""prep.workfiles.outcomes: a step's outcomes over a part, written batch by batch, read back as the
same outcomes (texts and metadata) and notes batch by batch (what a later build replays), refused when they name a
document the part does not reach."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.errors import IntegrityError
from prep.steps.protocol import Change, Drop, Outcome
from prep.workfiles.outcomes import TEXTS_PER_STEP, OutcomesReplay, OutcomesWriter, read_outcomes

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                           | st.text(max_size=6), lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
changes = st.builds(lambda text, metadata: Change.of(text, **metadata), st.none() | st.text(max_size=12),
                    st.dictionaries(st.text(min_size=1, max_size=6), json_values, min_size=1, max_size=3))
outcomes = st.one_of(st.none(), st.builds(Drop, st.text(min_size=1, max_size=8), st.text(max_size=8)),
                     st.text(max_size=12), changes)
batches = st.lists(st.lists(st.tuples(outcomes, st.one_of(st.none(), st.text(min_size=1, max_size=8))), max_size=6),
                   max_size=5)


def _write(path: Path, plan: list[list[tuple[Outcome, str | None]]]) -> list[np.ndarray]:
    """Write the batches of `plan` ((outcome, note) per document, rows numbered on); their rows."""
    writer = OutcomesWriter(path, durable=False)
    rows, at = [], 0
    for batch in plan:
        numbers = list(range(at, at + len(batch)))
        at += len(batch) + 1  # a gap: a document an earlier step dropped
        notes = {index: note for index, (outcome, note) in enumerate(batch) if note is not None and outcome is not None}
        texts = [f"text of {n}".encode() for n in numbers]
        writer.add(numbers, pa.array([f"id{n}" for n in numbers], pa.string()), [outcome for outcome, _ in batch],
                   texts.__getitem__, notes)
        rows.append(np.asarray(numbers, dtype=np.int64))
    writer.close()
    return rows


@settings(deadline=None)
@given(plan=batches)
def test_replayed_outcomes_are_those_written(tmp_path_factory: pytest.TempPathFactory,
                                             plan: list[list[tuple[Outcome, str | None]]]) -> None:
    path = tmp_path_factory.mktemp("outcomes") / "step0"
    rows = _write(path, plan)
    replay = OutcomesReplay(path.read_bytes(), "test")
    for batch, numbers in zip(plan, rows):
        got, notes = replay.take(numbers)
        assert got == [outcome for outcome, _ in batch]
        assert notes == {index: note for index, (outcome, note) in enumerate(batch)
                         if note is not None and outcome is not None}
    replay.finish()


def test_only_the_first_texts_of_dropped_documents_are_kept(tmp_path: Path) -> None:
    plan: list[list[tuple[Outcome, str | None]]] = [[(Drop("short"), None)] * (TEXTS_PER_STEP + 3), [("NEW", None)]]
    _write(tmp_path / "step0", plan)
    rows = [row for batch in read_outcomes(tmp_path / "step0") for row in batch.to_pylist()]
    assert [row["text"] for row in rows[:TEXTS_PER_STEP]] == [f"text of {n}" for n in range(TEXTS_PER_STEP)]
    assert [row["text"] for row in rows[TEXTS_PER_STEP:-1]] == [None] * 3
    assert rows[-1]["reason"] is None and rows[-1]["text"] == "NEW"  # a changed document keeps its new text


def test_a_replay_naming_a_document_the_part_does_not_reach_is_refused(tmp_path: Path) -> None:
    _write(tmp_path / "step0", [[(None, None), (Drop("x"), None)], [(Drop("y"), None)]])
    replay = OutcomesReplay((tmp_path / "step0").read_bytes(), "test")
    with pytest.raises(IntegrityError, match="names row 1"):
        replay.take(np.asarray([0, 2], dtype=np.int64))  # row 1 was dropped before this step: not here
    replay = OutcomesReplay((tmp_path / "step0").read_bytes(), "test")
    replay.take(np.asarray([0, 1], dtype=np.int64))
    with pytest.raises(IntegrityError, match="past this part's documents"):
        replay.finish()
    with pytest.raises(IntegrityError, match="not a step outcomes file"):
        OutcomesReplay(b"not arrow at all", "test")
