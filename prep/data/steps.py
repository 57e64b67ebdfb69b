"""Which samples a rank's rows of a step are, computed a block of steps ahead while the steps come
at a steady stride (step after step, or a DataLoader worker's every n-th): the sample permutation
costs mostly per call, not per sample, so one call for AHEAD_SAMPLES rows costs about what one for a
small batch does. A step's samples are a pure function of the step, however they were computed."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from prep.data.checks import MAX_SAMPLES

AHEAD_SAMPLES = 16384  # rows whose samples one block computes (at least one step's)

SamplesOf = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]


class Exhausted(Exception):
    """A source has served its max_epochs: the mixture has no next batch."""


class StepSamples:
    """(source, sample) of one rank's rows of a step, from `samples_of(global samples)`."""

    def __init__(self, samples_of: SamplesOf, global_batch_size: int, rank: int, rows: int) -> None:
        self._samples_of, self._global, self._rows = samples_of, global_batch_size, rows
        self._columns = rank * rows + np.arange(rows, dtype=np.int64)
        self._kept: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._last: int | None = None
        self._ahead = 1  # steps in the last block

    def take(self, step: int, planned: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The step's (source, sample): `planned` when given, else kept from a block, else a new block:
        this step alone, or, when it lies a positive stride after the last one, it and the next ones at that stride."""
        stride = step - self._last if self._last is not None else 0
        self._last = step
        found = planned if planned is not None else self._kept.pop(step, None)
        if found is None:  # blocks double while the stride holds: a short read computes little it does not use
            self._ahead = min(2 * self._ahead, max(1, AHEAD_SAMPLES // self._rows)) if stride > 0 else 1
            count = min(self._ahead, (MAX_SAMPLES // self._global - 1 - step) // max(stride, 1) + 1)
            self._kept = self._block(step + max(stride, 1) * np.arange(count, dtype=np.int64))
            found = self._kept.pop(step)
        return found

    def _block(self, steps: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """(source, sample) of `steps` by step; fewer steps (halving) when a later one lies past a
        source's max_epochs, Exhausted when the first does."""
        try:
            source, _, sample = self._samples_of((steps[:, None] * self._global + self._columns).ravel())
        except Exhausted:
            if len(steps) == 1:
                raise
            return self._block(steps[:len(steps) // 2])
        rows = self._rows
        return {at: (source[k * rows:(k + 1) * rows], sample[k * rows:(k + 1) * rows])
                for k, at in enumerate(steps.tolist())}
