"""What every executor offers the build driver: run task functions in parallel, hand results
back as they complete, and optionally warm workers up. Implementations import only this module."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class WarmUp:
    """The tokenizer a build's workers load before their first task, while the driver starts."""

    tokenizer_path: str
    eos: str
    encode_special_tokens: bool
    backend: str


class Executor(Protocol):
    """Runs `fn(item)` for every item; yields (index, result) as tasks complete.

    The first task error is raised after pending tasks are cancelled."""

    workers: int
    shares_filesystem: bool  # workers see the driver's local files (same machine or shared mount)

    def run(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Generator[tuple[int, Any], None, None]: ...

    def warm(self, warm_up: WarmUp) -> None:
        """Have idle workers load the build's tokenizer before tasks need it (a hint)."""
        ...

    def close(self) -> None: ...


Prepare = Callable[[WarmUp | None], None]
"""A function a worker runs before its first task (imports; with a WarmUp, the tokenizer too)."""
