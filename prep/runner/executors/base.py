"""What every executor offers the build driver: run task functions in parallel, hand results
back as they complete, and optionally warm workers up. Implementations import only this module."""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prep.errors import PrepError
from prep.memory import release_free_memory as release_free_memory  # what workers call after a task

RECYCLE_AFTER = 64
"""Tasks a worker process runs before a fresh one replaces it (the local pool's own, Ray's
`max_calls`; docs/build.md, "Memory"): a bound on whatever a long-lived worker's heap gains
task after task, for builds whose workers run thousands of tasks. Measured at 16M short
documents, a worker's tokenize peak levels off after about ten tasks, so replacing sooner buys
little: after 16 tasks the largest process was as large as with no replacement, and after 8 it
was 341 MB against about 360 but the build took 17% longer. A replacement costs about 0.4 s of
one core for its imports, plus 0.45 s to load the tokenizer in its first tokenize task. The local
pool replaces its workers much sooner (local.FRESH_AFTER) once its zygote can fork replacements
that hold both already."""


@dataclass(frozen=True)
class WarmUp:
    """The tokenizer a build's workers load before their first task, while the driver starts
    (its SHA-256 as the driver read it: a worker loads the file once, and checks it)."""

    tokenizer_path: str
    tokenizer_sha256: str
    eos: str
    encode_special_tokens: bool
    backend: str
    minhash: bool = False
    """Load the compiled MinHash kernel too (prep.neardup.kernel): a near-dup build large enough to use it."""


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


def transportable(exc: Exception) -> Exception:
    """`exc` if it survives a pickle round trip, else a stand-in with its message and exit code (a
    task's exception crosses to the driver pickled, by either executor)."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001 -- any failure to round-trip means: send a stand-in
        pass
    if isinstance(exc, PrepError):  # its nearest ancestor built from the message alone
        base = next(cls for cls in type(exc).__mro__ if issubclass(cls, PrepError) and _plain_constructor(cls))
        stand_in: PrepError = base(exc.message)
        stand_in.exit_code = exc.exit_code
        return stand_in
    text = "".join(traceback.format_exception(exc))
    return RuntimeError(f"{type(exc).__module__}.{type(exc).__qualname__} in a worker (not picklable):\n{text}")


def _plain_constructor(cls: type[PrepError]) -> bool:
    """True when `cls` is built from its message alone (no class up to PrepError redefines __init__)."""
    mro = cls.__mro__
    return all("__init__" not in vars(ancestor) for ancestor in mro[:mro.index(PrepError)])
