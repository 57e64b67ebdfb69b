"""The code identity recorded in manifests and stage keys.

It covers prep's own source and the versions of the libraries whose behaviour shapes output
bytes (tokenizers decides tokens; pyarrow and numpy write intermediates and plans), so an
upgrade of any of them is never served a stale cached result.
"""

from __future__ import annotations

import functools
import hashlib
import os
from importlib import metadata
from pathlib import Path

import prep

BYTE_SHAPING_DEPENDENCIES = ("tokenizers", "pyarrow", "numpy")


@functools.cache
def source_hash() -> str:
    """SHA-256 over every .py file of the package: relative path, NUL, bytes, NUL."""
    root = Path(prep.__file__).parent
    hasher = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        hasher.update(path.relative_to(root).as_posix().encode() + b"\0")
        hasher.update(path.read_bytes() + b"\0")
    return hasher.hexdigest()


@functools.cache
def dependency_versions() -> dict[str, str]:
    return {name: metadata.version(name) for name in BYTE_SHAPING_DEPENDENCIES}


_CACHED = (source_hash, dependency_versions)


def _forget() -> None:
    """Drop the cached identity, so that this (forked) process computes its own."""
    for cached in _CACHED:
        cached.cache_clear()


# A forked worker hashes the code on disk itself, as a spawned one does: an upgrade that landed
# after the driver hashed must make the worker refuse the driver's tasks (runner.tasks.check_code).
os.register_at_fork(after_in_child=_forget)


def code_identity() -> dict[str, object]:
    """The `code` object of a manifest."""
    return {"version": prep.__version__, "sha256": source_hash(), "dependencies": dependency_versions()}


def describe_code(identity: dict[str, object]) -> str:
    """A code identity in one phrase: version, source hash prefix and the byte-shaping libraries."""
    sha = str(identity.get("sha256", "?"))[:12]
    deps = identity.get("dependencies")
    libraries = ", ".join(f"{name} {version}" for name, version in sorted(deps.items())) if isinstance(deps, dict) else "?"
    return f"prep {identity.get('version', '?')} (source sha256 {sha}; {libraries})"
