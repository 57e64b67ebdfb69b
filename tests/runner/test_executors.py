"""Workers give free memory back after every task, whether it returned or raised."""

from __future__ import annotations

import sys

import pytest

from prep import memory
from prep.runner.executors import local


def test_every_task_ends_by_releasing_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(local, "release_free_memory", lambda: calls.append("released"))
    assert local._call(lambda item: item * 2, 21) == 42  # noqa: SLF001
    with pytest.raises(ValueError, match="bad"):
        local._call(lambda item: (_ for _ in ()).throw(ValueError("bad")), 0)  # noqa: SLF001
    assert calls == ["released", "released"]


def test_releasing_needs_neither_arrow_nor_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "pyarrow", raising=False)
    monkeypatch.setattr(memory, "_malloc_trim", lambda: None)
    memory.release_free_memory()  # nothing to call: no error


def test_releasing_trims_the_c_heap_and_arrow_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa

    trimmed: list[int] = []
    monkeypatch.setattr(memory, "_malloc_trim", lambda: trimmed.append)
    released: list[bool] = []

    class Pool:
        def release_unused(self) -> None:
            released.append(True)

    monkeypatch.setattr(pa, "default_memory_pool", lambda: Pool())
    memory.release_free_memory()
    assert trimmed == [0] and released == [True]
