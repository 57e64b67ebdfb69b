"""Bounded parallel reads that keep their order: what S3 multipart reads and uploads and the
transfer's ranged fetches share."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def in_sequence(tasks: Iterator[Callable[[], T]], jobs: int, thread_name: str = "prep-io",
             check: Callable[[], None] | None = None) -> Iterator[T]:
    """Run up to `jobs` tasks at once in threads, yielding their results in task order (memory:
    `jobs` results); `check` runs after each submission and may raise to stop early."""
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix=thread_name)
    pending: deque[Future[T]] = deque()
    try:
        for task in tasks:
            pending.append(pool.submit(task))
            if len(pending) >= jobs:
                yield pending.popleft().result()
            if check is not None:
                check()
        while pending:
            yield pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
