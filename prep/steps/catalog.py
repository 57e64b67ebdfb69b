"""The document step registry: each step kind (`use`) is one registered DocumentStep class.

The built-in steps register themselves from their own modules (BUILTIN, loaded on first use); a
new step is one module whose class is decorated with `register`. Only the driver asks the
registry (parsing `[[steps]]`): workers get the configured step objects with their tasks, their
class pickled by name, so a step registered in a test module alone runs in any worker that can
import that module. This module loads no numpy: the driver reads it.
"""

from __future__ import annotations

import importlib
import re
import typing
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import TypeVar

from prep.steps.protocol import DocumentStep, SettingError

S = TypeVar("S", bound=type[DocumentStep])

BUILTIN = ("prep.steps.c4", "prep.steps.decontaminate", "prep.steps.gopher_quality", "prep.steps.gopher_repetition",
           "prep.steps.language", "prep.steps.length", "prep.steps.pii")
"""The modules of the built-in steps (each registers its own)."""
NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
"""What a step's name (`use`) looks like."""

_STEPS: dict[str, type[DocumentStep]] = {}
_LOADED: list[bool] = []


def _all() -> dict[str, type[DocumentStep]]:
    """Every step kind by name, the built-ins loaded first."""
    if not _LOADED:
        _LOADED.append(True)
        for module in BUILTIN:
            importlib.import_module(module)
    return _STEPS


def register(kind: S) -> S:
    """Add a step class under its `use` (again: a no-op), a class decorator; ValueError when the
    name is malformed or another class has it."""
    steps = _all()
    if not NAME.fullmatch(kind.use):
        raise ValueError(f"step name {kind.use!r} must match {NAME.pattern}")
    if steps.get(kind.use, kind) is not kind:
        raise ValueError(f"step {kind.use!r} is registered by {steps[kind.use].__qualname__} already")
    steps[kind.use] = kind
    return kind


def unregister(use: str) -> None:
    """Remove the step kind `use` (a test's own step, once the test is done)."""
    _all().pop(use, None)


def names() -> tuple[str, ...]:
    """Every registered step kind's name, sorted."""
    return tuple(sorted(_all()))


def step_kind(use: str) -> type[DocumentStep]:
    """The step class named `use`; SettingError on `use` names the known ones."""
    found = _all().get(use)
    if found is None:
        raise SettingError("use", f"unknown step {use!r} (use {', '.join(names()) or 'none registered'})")
    return found


def parse_step(table: Mapping[str, object], base_dir: Path | None = None) -> DocumentStep:
    """The step a `[[steps]]` table configures; SettingError names the first bad key. A `use` of
    the form `module:function` is user code (prep.steps.function), found on sys.path or in
    `base_dir`, the pipeline file's folder."""
    use = table.get("use")
    if not isinstance(use, str):
        raise SettingError("use", f"expected str naming a step, got {use!r}")
    if ":" in use:
        from prep.steps.function import function_step

        return function_step(use, table, base_dir)
    kind = step_kind(use)
    hints = typing.get_type_hints(kind)
    known = {field.name for field in fields(kind) if field.init and not field.metadata.get("derived")}
    values: dict[str, object] = {}
    for key, value in table.items():
        if key == "use":
            continue
        if key not in known:
            raise SettingError(key, "unknown key")
        values[key] = _typed(key, value, hints[key])
    step = kind(**values)
    step.check()
    return step.resolve(base_dir)


def _typed(key: str, value: object, hint: object) -> object:
    """`value` when it is of the type `hint` allows (bool is no int here; an int is a float; a TOML
    list is a `tuple[X, ...]` of checked items); else SettingError."""
    if typing.get_origin(hint) is tuple:
        item = typing.get_args(hint)[0]
        if not isinstance(value, list):
            raise SettingError(key, f"expected a list of {getattr(item, '__name__', item)}, got {value!r}")
        return tuple(_typed(f"{key}[{index}]", element, item) for index, element in enumerate(value))
    allowed = tuple(t for t in typing.get_args(hint) if t is not type(None)) or (hint,)
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) and bool not in allowed or not isinstance(value, allowed):
        names = " or ".join(getattr(t, "__name__", str(t)) for t in allowed)
        raise SettingError(key, f"expected {names}, got {type(value).__name__} {value!r}")
    return value


def settings_of(step: DocumentStep) -> dict[str, object]:
    """The step's settings by name, as the resolved config and its task keys record them."""
    return step.settings()


def code_sha256(step: DocumentStep) -> str:
    """The code identity of the step (its module's source hash; for user code, its whole closure)."""
    return step.code_identity()


def key_fields(steps: tuple[DocumentStep, ...]) -> list[dict[str, object]]:
    """What of the steps a tokenize task key names: each one's kind, code and settings, in order."""
    return [{"use": step.name, "code": code_sha256(step), "settings": settings_of(step)} for step in steps]


def resolved(steps: tuple[DocumentStep, ...]) -> list[dict[str, object]]:
    """The steps as the resolved config records them: each one's kind and settings, in order."""
    return [{"use": step.name, **settings_of(step)} for step in steps]
