"""The one exception hierarchy of prep; every class carries the exit code the CLI returns."""

from __future__ import annotations

import os
from typing import Any


class PrepError(Exception):
    """Base of every error prep raises on purpose; `exit_code` is what the CLI exits with."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class UsageError(PrepError):
    """The command line itself is wrong (bad SNAP spec, conflicting flags)."""


class ConfigError(PrepError):
    """The pipeline file is wrong: unknown key, wrong type, bad value. Names the key."""


class InputError(PrepError):
    """A corpus file is bad: unreadable, malformed, missing a field. Names the file and line or row."""


class TokenizerError(PrepError):
    """The tokenizer file is missing or unusable, or a backend disagrees with the reference."""


class StoreError(PrepError):
    """The store cannot be reached or used: missing bucket, denied access, bad URL."""


class StorageIOError(StoreError):
    """Reading or writing a file failed (a full disk, EIO): names the operation and the path."""

    exit_code = 4

    def __init__(self, operation: str, path: str | os.PathLike[str], reason: str, errno: int | None = None) -> None:
        super().__init__(f"{operation} {os.fspath(path)}: {reason}")
        self.operation, self.path, self.reason, self.errno = operation, os.fspath(path), reason, errno

    @classmethod
    def from_os_error(cls, operation: str, path: str | os.PathLike[str], exc: OSError) -> StorageIOError:
        """The error for `exc`, raised while `operation` on `path` (e.g. "writing", a file)."""
        return cls(operation, path, exc.strerror or str(exc) or type(exc).__name__, exc.errno)

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its own fields when it crosses a process boundary (the default would
        # call the constructor with the message alone).
        return type(self), (self.operation, self.path, self.reason, self.errno)


class NotFoundError(StoreError):
    """A key, ref, snapshot or object the caller asked for does not exist."""


class RefConflictError(StoreError):
    """A ref moved under us more often than we were willing to retry, or a tag exists elsewhere."""


class StaleRefError(RefConflictError):
    """A ref is not at the generation the caller expected (`--expect`, or what a build saw at its
    start): another publisher moved it, so this one leaves it where it is."""


class ExecutorError(PrepError):
    """The executor lost work it could not recover: a worker died too often, ran out of memory,
    or the cluster went away. The build committed nothing more; rerunning resumes it."""


class ClusterLostError(ExecutorError):
    """The build lost its Ray cluster's head (the GCS): nothing more can be scheduled. What was
    committed stays; the same command on a reachable cluster resumes. Exit 75, sysexits'
    EX_TEMPFAIL ("try again later"), so a scheduler can retry this failure and no other."""

    exit_code = 75


class ForeignCodeError(ExecutorError):
    """A worker runs other code than the driver (another prep source or byte-shaping library), so
    it refuses the task: its bytes would be committed under keys naming the driver's code."""

    exit_code = 5


class IntegrityError(PrepError):
    """Stored bytes do not match their name or record: a corrupt store or a conflicting writer."""

    exit_code = 3


class VerificationFailed(PrepError):
    """Verification or comparison found differences (reported, not an internal failure)."""

    exit_code = 1
