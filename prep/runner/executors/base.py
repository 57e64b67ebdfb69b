"""What every executor offers the build driver: run task functions in parallel, hand results
back as they complete, and optionally warm workers up. Implementations import only this module."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prep.memory import release_free_memory as release_free_memory  # what workers call after a task

RECYCLE_AFTER = 64
"""Tasks a worker process runs before a fresh one replaces it (the local pool's own, Ray's
`max_calls`; docs/build.md, "Memory"): a bound on whatever a long-lived worker's heap gains
task after task, for builds whose workers run thousands of tasks. Measured at 16M short
documents, a worker's tokenize peak levels off after about ten tasks, so replacing sooner buys
little: after 16 tasks the largest process was as large as with no replacement, and after 8 it
was 341 MB against about 360 but the build took 17% longer. A replacement costs about 0.4 s of
one core for its imports, plus 0.45 s to load the tokenizer in its first tokenize task."""


@dataclass(frozen=True)
class WarmUp:
    """The tokenizer a build's workers load before their first task, while the driver starts
    (its SHA-256 as the driver read it: a worker loads the file once, and checks it)."""

    tokenizer_path: str
    tokenizer_sha256: str
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


class WrappedExecutor:
    """An executor whose every task function is first passed through `wrap` (the build wraps each
    in the driver's code-identity check); everything else is the wrapped executor's."""

    def __init__(self, inner: Executor, wrap: Callable[[Callable[[Any], Any]], Callable[[Any], Any]]) -> None:
        self.inner, self.wrap = inner, wrap
        self.workers = inner.workers
        self.shares_filesystem = inner.shares_filesystem

    def run(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> Generator[tuple[int, Any], None, None]:
        return self.inner.run(self.wrap(fn), items)

    def warm(self, warm_up: WarmUp) -> None:
        self.inner.warm(warm_up)

    def close(self) -> None:
        self.inner.close()
