"""JSON Schema validation of manifests and reports against the schemas in manifests/.

The schemas live once, in the repository's top-level manifests/ folder; the build maps that folder
into the wheel as the package data prep/_schemas/ (pyproject.toml), where an installed prep loads
them. A source checkout or an editable install has no prep/_schemas/ and reads manifests/ itself.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prep.errors import IntegrityError

if TYPE_CHECKING:
    import jsonschema

PACKAGED_SCHEMAS = "_schemas"  # prep/_schemas/ in a wheel
REPO_SCHEMAS = Path(__file__).resolve().parents[2] / "manifests"  # their home in the repository


@functools.cache
def schema_dir() -> Traversable:
    """The folder holding every `<kind>-<N>.schema.json`: the installed package's, else the checkout's."""
    packaged = resources.files("prep") / PACKAGED_SCHEMAS
    return packaged if packaged.is_dir() else REPO_SCHEMAS


def schema_path(schema_id: str) -> Traversable:
    """`prep.snapshot/1` -> manifests/snapshot-1.schema.json (prep/_schemas/ when installed)."""
    kind, version = schema_id.removeprefix("prep.").split("/")
    return schema_dir() / f"{kind}-{version}.schema.json"


@functools.cache
def _schema(schema_id: str) -> Any:
    return json.loads(schema_path(schema_id).read_text(encoding="utf-8"))


@functools.cache
def _validator(schema_id: str) -> jsonschema.protocols.Validator:
    import jsonschema  # a tenth of a second: imported when first needed

    schema = _schema(schema_id)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


# ---------------------------------------------------------------- the fast path
#
# jsonschema walks a 100,000-artifact manifest in about 6 s. The manifests' schemas use a small
# subset of JSON Schema, which compiles to plain Python checks that answer in a fraction of that.
# A compiled check may be stricter than jsonschema, never looser: it accepts only what every
# keyword allows, treats a keyword it does not know as "ask jsonschema", and whenever it says no,
# jsonschema runs and has the last word (and names the violation).

Check = Callable[[Any], bool]
_ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "$comment", "title", "description", "default", "examples"})
_SCALARS = (str, int, bool, type(None))
_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float),
                                       "boolean": (bool,), "null": (type(None),), "object": (dict,),
                                       "array": (list,)}


class _Unsupported(Exception):
    """The schema uses a keyword or form the fast path does not implement."""


def _exact(value: Any) -> Check:
    return lambda instance: type(instance) is type(value) and instance == value


def _bound(name: str, value: Any) -> Check | None:
    """The size and number bounds (minLength, minimum, maximum, minProperties, minItems,
    maxItems) as checks; None for any other keyword."""
    if name == "minLength":
        return lambda instance: type(instance) is not str or len(instance) >= value
    if name == "minimum":
        return lambda instance: type(instance) not in (int, float) or instance >= value
    if name == "maximum":
        return lambda instance: type(instance) not in (int, float) or instance <= value
    if name == "minProperties":
        return lambda instance: type(instance) is not dict or len(instance) >= value
    if name == "minItems":
        return lambda instance: type(instance) is not list or len(instance) >= value
    if name == "maxItems":
        return lambda instance: type(instance) is not list or len(instance) <= value
    return None


def _keyword(name: str, value: Any, schema: dict[str, Any], root: dict[str, Any]) -> Check:
    """One keyword as a check; each applies only to its instance type, like JSON Schema's."""
    bound = _bound(name, value)
    if bound is not None:
        return bound
    if name == "type":
        kinds = tuple(t for kind in ([value] if isinstance(value, str) else value) for t in _TYPES[kind])
        return lambda instance: type(instance) in kinds
    if name in ("const", "enum"):
        options = [value] if name == "const" else list(value)
        if not all(type(option) in _SCALARS for option in options):
            raise _Unsupported(name)
        if all(type(option) is str for option in options):
            strings = frozenset(options)
            return lambda instance: type(instance) is str and instance in strings
        checks = [_exact(option) for option in options]
        return lambda instance: any(check(instance) for check in checks)
    if name == "pattern":
        regex = re.compile(value)  # jsonschema uses re.search too
        return lambda instance: type(instance) is not str or regex.search(instance) is not None
    if name == "required":
        keys = list(value)
        return lambda instance: type(instance) is not dict or all(key in instance for key in keys)
    if name in ("properties", "additionalProperties"):
        return _object_check(schema, root) if name == "properties" or "properties" not in schema else _always
    if name == "patternProperties" and "properties" not in schema and "additionalProperties" not in schema:
        return _object_check(schema, root)
    if name == "items":
        item, skip = _compile(value, root), len(schema.get("prefixItems", ()))  # past prefixItems only
        return lambda instance: type(instance) is not list or all(item(entry) for entry in instance[skip:])
    if name == "prefixItems":
        places = [_compile(sub, root) for sub in value]
        return lambda instance: type(instance) is not list or all(check(entry) for check, entry in zip(places, instance))
    if name == "$ref" and isinstance(value, str) and value.startswith("#/$defs/"):
        return _compile(root["$defs"][value.removeprefix("#/$defs/")], root)
    if name == "dependentRequired":
        needs = {key: list(required) for key, required in value.items()}
        return lambda instance: type(instance) is not dict or all(
            all(other in instance for other in required) for key, required in needs.items() if key in instance)
    if name == "allOf":
        dispatch = _dispatch(value, root)
        if dispatch is not None:
            return dispatch
        parts = [_compile(sub, root) for sub in value]
        return lambda instance: all(part(instance) for part in parts)
    if name == "oneOf":
        return _one_of(value, root)
    if name == "if":
        return _conditional(value, schema, root)
    if name in ("then", "else", "patternProperties"):
        return _always  # `if` checks its branches; `properties` (or `_object_check`) the patterns
    raise _Unsupported(name)


def _one_of(branches: Any, root: dict[str, Any]) -> Check:
    """`oneOf` whose branches each declare one type, no two of which overlap: then at most one can
    match, and "exactly one" is "any" (a stricter branch can only make the answer stricter)."""
    kinds = [branch.get("type") if isinstance(branch, dict) else None for branch in branches]
    python = [_TYPES.get(kind, ()) if isinstance(kind, str) else () for kind in kinds]
    if not all(python) or any(set(a) & set(b) for at, a in enumerate(python) for b in python[at + 1:]) \
            or "number" in kinds and "integer" in kinds:
        raise _Unsupported("oneOf")
    checks = [_compile(branch, root) for branch in branches]
    return lambda instance: any(check(instance) for check in checks)


def _conditional(condition: Any, schema: dict[str, Any], root: dict[str, Any]) -> Check:
    """`if`/`then`/`else`. Its condition must be answered exactly (a stricter answer would take the
    wrong branch), so only the form the schemas use is compiled: properties whose values are string
    or boolean constants (an absent property, or an instance not an object, meets the condition;
    a constant matches only a value of its own type: `true` is not 1)."""
    if not isinstance(condition, dict) or condition.keys() != {"properties"}:
        raise _Unsupported("if")
    wanted = {}
    for key, sub in condition["properties"].items():
        if not isinstance(sub, dict) or sub.keys() != {"const"} or type(sub["const"]) not in (str, bool):
            raise _Unsupported("if")
        wanted[key] = sub["const"]
    then = _compile(schema.get("then", True), root)
    otherwise = _compile(schema.get("else", True), root)

    def met(instance: Any) -> bool:
        return type(instance) is not dict or all(key not in instance or (type(instance[key]) is type(const)
                                                                         and instance[key] == const)
                                                 for key, const in wanted.items())

    return lambda instance: then(instance) if met(instance) else otherwise(instance)


def _branch(branch: Any) -> tuple[str, str, Any] | None:
    """(property, string constant, `then`) of an `if`/`then` branch whose condition is one property's
    string constant, no `else`; None for any other form."""
    if not isinstance(branch, dict) or branch.keys() != {"if", "then"} or not isinstance(branch["if"], dict) \
            or branch["if"].keys() != {"properties"} or not isinstance(branch["if"]["properties"], dict):
        return None
    [(name, sub), *rest] = branch["if"]["properties"].items() or [("", None)]
    if rest or not isinstance(sub, dict) or sub.keys() != {"const"} or type(sub["const"]) is not str:
        return None
    return name, sub["const"], branch["then"]


def _dispatch(branches: Any, root: dict[str, Any]) -> Check | None:
    """`allOf` of `_branch`es on one property (task records: a branch a stage) as one lookup: an
    object whose property is a string meets the conditions of that value only, so only their
    branches apply; one without the property meets every condition, so every branch applies
    (and a non-string value none). None for any other form."""
    parsed = [_branch(branch) for branch in branches] if isinstance(branches, list) else []
    names = {found[0] for found in parsed if found}
    if not parsed or None in parsed or len(names) != 1:
        return None
    [name] = names
    thens: dict[str, list[Check]] = {}
    for _, constant, then in filter(None, parsed):
        thens.setdefault(constant, []).append(_compile(then, root))
    every = [check for checks in thens.values() for check in checks]

    def check(instance: Any) -> bool:
        if type(instance) is not dict or name not in instance:
            return all(then(instance) for then in every)
        value = instance[name]
        return type(value) is not str or all(then(instance) for then in thens.get(value, ()))

    return check


def _always(_instance: Any) -> bool:
    return True


def _object_check(schema: dict[str, Any], root: dict[str, Any]) -> Check:
    """`properties` with `additionalProperties` (False, True or a schema) as one check."""
    known = {key: _compile(sub, root) for key, sub in schema.get("properties", {}).items()}
    patterns = [(re.compile(pattern).search, _compile(sub, root))
                for pattern, sub in schema.get("patternProperties", {}).items()]
    extra = schema.get("additionalProperties", True)
    other: Check | None = None if extra is False else _compile(extra, root)

    def check(instance: Any) -> bool:
        if type(instance) is not dict:
            return True
        for key, item in instance.items():
            matched = [sub for search, sub in patterns if search(key)] if patterns else []
            sub = known.get(key)
            if sub is None and not matched:
                sub = other  # additionalProperties: keys neither named nor matched by a pattern
                if sub is None:
                    return False
            if sub is not None and not sub(item) or not all(each(item) for each in matched):
                return False
        return True

    return check


def _leaf(schema: dict[str, Any]) -> Check | None:
    """One fused check for the commonest leaves: a bounded integer, a string with a pattern or a
    minimum length (half the calls of checking type and bound apart)."""
    rest = {key: value for key, value in schema.items() if key not in _ANNOTATIONS}
    kind = rest.pop("type", None)
    if kind == "integer" and rest.keys() == {"minimum"} and type(rest["minimum"]) is int:
        low = rest["minimum"]
        return lambda instance: type(instance) is int and instance >= low
    if kind == "string" and rest.keys() == {"pattern"}:
        search = re.compile(rest["pattern"]).search
        return lambda instance: type(instance) is str and search(instance) is not None
    if kind == "string" and rest.keys() == {"minLength"} and type(rest["minLength"]) is int:
        length = rest["minLength"]
        return lambda instance: type(instance) is str and len(instance) >= length
    return None


def _compile(schema: Any, root: dict[str, Any]) -> Check:
    if schema is True or schema is False:
        return _always if schema else lambda _instance: False
    if not isinstance(schema, dict):
        raise _Unsupported(repr(schema))
    leaf = _leaf(schema)
    if leaf is not None:
        return leaf
    checks = [_keyword(name, value, schema, root) for name, value in schema.items() if name not in _ANNOTATIONS]
    checks = [check for check in checks if check is not _always]  # `then`, `else`: their `if` checks them
    if len(checks) <= 2:  # most subschemas: one type and one bound; spare the loop
        first, second = (checks + [_always, _always])[:2]
        return lambda instance: first(instance) and second(instance)
    return lambda instance: all(check(instance) for check in checks)


@functools.cache
def _fast_check(schema_id: str) -> Check | None:
    """The compiled check of a schema, or None when it uses anything the fast path lacks."""
    schema = _schema(schema_id)
    try:
        return _compile(schema, schema)
    except (_Unsupported, KeyError, TypeError, RecursionError, re.error):
        return None


def conforms(document: Any, schema_id: str) -> bool:
    """True only if `document` matches the schema, by the fast path (False: ask jsonschema)."""
    check = _fast_check(schema_id)
    return check is not None and check(document)


def validate(document: Any, schema_id: str, source: str = "manifest") -> None:
    """Raise IntegrityError naming the first violation when `document` breaks its schema."""
    if conforms(document, schema_id):
        return
    errors = sorted(_validator(schema_id).iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(part) for part in first.absolute_path) or "(root)"
        raise IntegrityError(f"{source}: does not match {schema_id} at {where}: {first.message}")
