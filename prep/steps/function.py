"""User code as a document step: `use = "module:function"` with `args`, keyed by its code.

The function gets one `StepDocument` (its id, text, source file and line) and the step's `args` as keyword
arguments, and answers True or None (keep), False (drop: reason "returned False"), a str (drop,
with that reason: a short fixed phrase, since each distinct reason is a key of the snapshot's
stats), or a changed document (a StepDocument, or a mapping with "text") whose text replaces the
document's; a mapping's "metadata" (a mapping) sets those metadata keys, each one listed in the
step's `metadata` setting. Its module is found on sys.path or in the pipeline file's folder and imported in each
worker. Its code identity, which enters the tokenize task key, is the SHA-256 of the source of its
module and of every module of the same top-level package that those import (followed through
every import statement, guarded or not), and the versions of the installed distributions they
import: an edit recomputes the step and what follows it. A worker whose copy of that code differs
from the driver's refuses to run it.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import json
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import ClassVar

from prep.steps.protocol import Change, DocumentStep, Drop, Outcome, SettingError, StepDocument

SPEC = re.compile(r"(?P<module>[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*):(?P<name>[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*)")
"""`package.module:function` (a dotted attribute path after the colon)."""
REJECTED = "returned False"

_LOADED: dict[str, Callable[..., object]] = {}


@dataclass(frozen=True)
class FunctionStep(DocumentStep):
    """A step that calls a user's function on each document."""

    use: ClassVar[str] = "function"
    function: str
    args: tuple[tuple[str, object], ...] = ()
    code: str = ""
    metadata: tuple[str, ...] = ()  # the metadata keys the function may set
    search_path: str = field(default="", compare=False)  # the pipeline's folder: where, not what

    @property
    def name(self) -> str:
        return self.function

    def settings(self) -> dict[str, object]:
        """Its arguments, and its code identity: the resolved config records both, so `prep diff`
        shows an edit to the function's code as a change of the step."""
        return {**({"args": dict(self.args)} if self.args else {}),
                **({"metadata": list(self.metadata)} if self.metadata else {}), "code": self.code}

    def code_identity(self) -> str:
        return self.code

    def metadata_keys(self) -> tuple[str, ...]:
        return self.metadata

    def apply(self, document: StepDocument) -> Outcome:
        answer = _loaded(self)(document, **dict(self.args))
        return outcome_of(answer, document.text)


def outcome_of(answer: object, text: str) -> Outcome:
    """A user function's answer as a step outcome; TypeError for an answer of no meaning."""
    if answer is None or answer is True:
        return None
    if answer is False:
        return Drop(REJECTED)
    if isinstance(answer, str):
        return Drop(answer)
    if isinstance(answer, Mapping):
        changed, metadata = answer.get("text", text), answer.get("metadata", {})
        if answer and set(answer) <= {"text", "metadata"} and isinstance(changed, str) and isinstance(metadata, Mapping):
            return _changed(None if changed == text else changed, metadata)
    elif isinstance(changed := getattr(answer, "text", None), str):
        return None if changed == text else changed
    raise TypeError(f"answered {type(answer).__name__}: a step function returns True, False, a reason (str) or a "
                    "changed document (with a str `text`, or a mapping with `text` and/or a `metadata` mapping)")


def _changed(text: str | None, metadata: Mapping[object, object]) -> Outcome:
    """A mapping answer's outcome: its new text (None: the same), with the metadata it sets."""
    if not metadata:
        return text
    return Change.of(text, **{str(key): value for key, value in metadata.items()})


def function_step(use: str, table: Mapping[str, object], base_dir: Path | None) -> FunctionStep:
    """The step a `[[steps]]` table with `use = "module:function"` configures; SettingError names
    the key (`use` for a function that cannot be imported, `args` for arguments that are not a table)."""
    if not SPEC.fullmatch(use):
        raise SettingError("use", f"{use!r} is not module:function")
    unknown = sorted(set(table) - {"use", "args", "metadata"})
    if unknown:
        raise SettingError(unknown[0], "unknown key (a function step takes `args`, a table of keyword arguments, "
                                       "and `metadata`, the keys it sets)")
    args = table.get("args", {})
    if not isinstance(args, Mapping):
        raise SettingError("args", f"expected a table of keyword arguments, got {args!r}")
    keys = _metadata_keys(table.get("metadata", []))
    search = str(base_dir.resolve()) if base_dir is not None else ""
    step = FunctionStep(use, tuple(sorted((str(key), value) for key, value in args.items())), "", keys, search)
    try:
        _loaded(step, check=False)
        module = sys.modules[use.partition(":")[0]]
    except SettingError:
        raise
    except Exception as exc:  # the user's module: any error on import is named, never a traceback
        raise SettingError("use", f"cannot import {use}: {type(exc).__name__}: {exc}") from None
    return FunctionStep(step.function, step.args, code_identity(module), keys, search)


def _metadata_keys(value: object) -> tuple[str, ...]:
    """`metadata`: the distinct metadata keys (non-empty strings) the function may set."""
    if not isinstance(value, list) or not all(isinstance(key, str) and key for key in value):
        raise SettingError("metadata", f"expected a list of metadata keys (non-empty strings), got {value!r}")
    if len(set(value)) != len(value):
        raise SettingError("metadata", f"lists a key twice: {value!r}")
    return tuple(value)


def _loaded(step: FunctionStep, check: bool = True) -> Callable[..., object]:
    """The step's function, imported once per process; with `check`, its code must be the driver's."""
    if step.function not in _LOADED:
        if step.search_path and step.search_path not in sys.path:
            sys.path.append(step.search_path)
        module_name, _, attribute = step.function.partition(":")
        module = importlib.import_module(module_name)
        found: object = module
        for part in attribute.split("."):
            found = getattr(found, part, None)
        if not callable(found):
            raise SettingError("use", f"{step.function}: {module_name} has no function {attribute!r}")
        if check and code_identity(module) != step.code:
            raise RuntimeError(f"the code of step {step.function} here differs from the driver's (run the same "
                               f"version of {module_name} on every node)")
        _LOADED[step.function] = found
    return _LOADED[step.function]


def code_identity(module: ModuleType) -> str:
    """SHA-256 over the sources of `module` and of the modules of its top-level package it imports
    (transitively), and the versions of the installed distributions those import."""
    found = closure(module)
    return identity_of({name: data for name, (_, data) in found.modules.items()}, found.outside)


@dataclass(frozen=True)
class Closure:
    """The modules of a step's top-level package its module imports (itself included), each with
    its file and source bytes; and the top-level names it imports from outside that package."""

    modules: dict[str, tuple[Path, bytes]]
    outside: frozenset[str]


def closure(module: ModuleType) -> Closure:
    """The import closure of `module` within its top-level package (every import statement followed)."""
    top = module.__name__.partition(".")[0]
    sources: dict[str, tuple[Path, bytes]] = {}
    outside: set[str] = set()
    todo = [module.__name__]
    while todo:
        name = todo.pop()
        found = sys.modules.get(name) or _import_or_none(name)
        path = getattr(found, "__file__", None)
        if name in sources or found is None or path is None:
            continue
        source = Path(path).read_bytes()
        sources[name] = (Path(path), source)
        for imported in _imports(source, name, path.endswith("__init__.py")):
            root = imported.partition(".")[0]
            if root == top:
                todo.append(imported)
            elif root not in sys.stdlib_module_names:
                outside.add(root)
    return Closure(sources, frozenset(outside))


def identity_of(sources: Mapping[str, bytes], outside: frozenset[str]) -> str:
    """The code identity of these module sources (by module name) and the installed versions of
    the distributions that provide the `outside` top-level names."""
    distributions = metadata.packages_distributions()
    versions = {dist: metadata.version(dist) for root in outside for dist in distributions.get(root, ())}
    modules = {name: hashlib.sha256(data).hexdigest() for name, data in sorted(sources.items())}
    identity = {"modules": modules, "distributions": dict(sorted(versions.items()))}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def _import_or_none(name: str) -> ModuleType | None:
    """The module `name`, or None when it is not one (an attribute imported `from` a module)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _imports(source: bytes, module: str, is_package: bool) -> set[str]:
    """Every module name an import statement of `source` may name, relative ones resolved."""
    package = module if is_package else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1] if package else []
                base = ".".join([*parts, base] if base else parts)
            if base:
                names.add(base)
                names.update(f"{base}.{alias.name}" for alias in node.names)
    return names
