"""A torch IterableDataset over prep.data.Reader that DataLoader workers split with no repeat and
no skip: worker w of n produces global steps start + w, start + w + n, ..., and DataLoader's
in-order round robin hands them to the training loop in step order. Its state is the Reader's,
computed from the number of batches the loop consumed, so it survives `num_workers > 0`.
Use with `DataLoader(dataset, batch_size=None, num_workers=n)`: each item is already this rank's batch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from prep.data.checks import whole
from prep.data.reader import MAX_SAMPLES, Exhausted, Reader
from prep.errors import UsageError


class ReaderDataset(IterableDataset[Any]):
    """This rank's batches of a Reader, as torch tensors (documents mode: lists of tensors)."""

    def __init__(self, source: Any, seq_len: int, global_batch_size: int, **options: Any) -> None:
        self._args = (source, seq_len, global_batch_size)
        self._options = options
        self._reader: Reader | None = Reader(source, seq_len, global_batch_size, **options)  # validates now
        self._start_step = 0

    def __getstate__(self) -> dict[str, Any]:
        """A spawned worker gets the settings and start step, not this process's reader: it opens its own."""
        return {**self.__dict__, "_reader": None}

    def _main_reader(self) -> Reader:
        if self._reader is None:
            self._reader = Reader(*self._args, **self._options)
        return self._reader

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        reader = Reader(*self._args, **self._options)
        try:  # closed when the loop stops early too: a leaked reader keeps its pins, threads and cache user
            yield from self._batches(reader, self._start_step + worker, workers)
        finally:
            reader.close()

    @staticmethod
    def _batches(reader: Reader, step: int, stride: int) -> Iterator[Any]:
        """Steps step, step + stride, ... of `reader` as tensors, until the reader ends."""
        while True:
            try:
                batch = reader.batch(step)
            except Exhausted:
                return
            yield [torch.from_numpy(doc.astype("int64")) for doc in batch] if reader.mode == "documents" \
                else torch.from_numpy(batch)
            step += stride

    def state_dict(self, batches_consumed: int) -> dict[str, Any]:
        """The Reader state after the training loop has consumed `batches_consumed` batches from here."""
        consumed = whole("batches_consumed", batches_consumed, 0)  # else a bad state reaches the checkpoint
        reader = self._main_reader()
        state = reader.state_dict()
        state["samples"] = (self._start_step + consumed) * reader.global_batch_size
        if state["samples"] > MAX_SAMPLES:  # a state no reader would load
            raise UsageError(f"batches_consumed {consumed} puts the state past the last sample a reader serves")
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Start the next iteration where `state` says (refused when it names other data)."""
        reader = self._main_reader()
        reader.load_state_dict(state)
        self._start_step = reader.consumed // reader.global_batch_size
