"""JSON Schema validation of manifests and reports against the schemas in manifests/.

The schemas live once, in the repository's top-level manifests/ folder; the build maps that folder
into the wheel as the package data prep/_schemas/ (pyproject.toml), where an installed prep loads
them. A source checkout or an editable install has no prep/_schemas/ and reads manifests/ itself.
"""

from __future__ import annotations

import functools
import json
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
def _validator(schema_id: str) -> jsonschema.protocols.Validator:
    import jsonschema  # a tenth of a second: imported when first needed

    schema = json.loads(schema_path(schema_id).read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


def validate(document: Any, schema_id: str, source: str = "manifest") -> None:
    """Raise IntegrityError naming the first violation when `document` breaks its schema."""
    errors = sorted(_validator(schema_id).iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(part) for part in first.absolute_path) or "(root)"
        raise IntegrityError(f"{source}: does not match {schema_id} at {where}: {first.message}")
