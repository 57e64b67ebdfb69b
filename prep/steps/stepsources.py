"""The source files of user step modules that a snapshot carries, named by paths inside their package.

A `module:function` step's code identity covers its module and the modules of its top-level
package those import (prep.steps.function.closure); those files, and the `__init__.py` of every
package above them (importing a module runs them), are what `prep rebuild` writes back into a
folder of its own and imports. Each is named by its path relative to the folder its top-level
package sits in (`pkg/rules.py`), never where this machine keeps it, so the manifest is the same
on any machine. Nothing outside the step's own top-level package is carried.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from prep.errors import ConfigError
from prep.steps.function import FunctionStep, closure, identity_of
from prep.steps.protocol import DocumentStep


@dataclass(frozen=True)
class StepSource:
    """One file of a user step's package: its module's name, its relative path and its bytes."""

    module: str
    path: str
    data: bytes


def step_sources(steps: Sequence[DocumentStep]) -> list[StepSource]:
    """The files of every function step's package a snapshot carries, sorted by path (none for a
    pipeline without function steps); ConfigError when a step's code is no longer what its code
    identity names (edited since the pipeline was read)."""
    found: dict[str, StepSource] = {}
    for step in steps:
        if isinstance(step, FunctionStep):
            for source in _sources_of(step):
                found.setdefault(source.path, source)
    return [found[path] for path in sorted(found)]


def _sources_of(step: FunctionStep) -> list[StepSource]:
    """The step's closure and the package `__init__.py` files above it, checked against `step.code`."""
    module = importlib.import_module(step.function.partition(":")[0])
    modules = closure(module)
    if identity_of({name: data for name, (_, data) in modules.modules.items()}, modules.outside) != step.code:
        raise ConfigError(f"step {step.function}: its code changed during the build (its module or a module of its "
                          "package was edited); rerun the build")
    files = dict(modules.modules)
    for name in list(files):
        for parent in _parents(name):
            path = getattr(sys.modules.get(parent), "__file__", None)
            if path is not None and parent not in files:
                files[parent] = (Path(path), Path(path).read_bytes())
    return [StepSource(name, relative_path(name, path), data) for name, (path, data) in files.items()]


def _parents(name: str) -> list[str]:
    """The packages above module `name` (`a.b.c`: `a`, `a.b`)."""
    parts = name.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts))]


def relative_path(name: str, path: Path) -> str:
    """Where module `name`'s file sits relative to the folder holding its top-level package
    (`pkg.rules` at /x/pkg/rules.py: `pkg/rules.py`); ConfigError when the file is not where its
    name puts it (a module a loader made up), since it could not be imported back from there."""
    parts = name.split(".")
    is_package = path.stem == "__init__"
    root = path.parents[len(parts) if is_package else len(parts) - 1]
    relative = PurePosixPath(path.relative_to(root).as_posix())
    if list(relative.with_suffix("").parts) != [*parts, *(["__init__"] if is_package else [])]:
        raise ConfigError(f"step module {name}: its file {path.name} is not where its name puts it; "
                          "a snapshot cannot carry it")
    return str(relative)


def is_carried_path(path: str) -> bool:
    """Whether `path` may name a carried file: relative, with no `..`, `.` or empty part (so writing
    it under a folder stays in that folder)."""
    pure = PurePosixPath(path)
    return bool(path) and not pure.is_absolute() and "\\" not in path and \
        all(part not in ("", ".", "..") for part in path.split("/"))
