"""JSON Schema validation of manifests and reports against the schemas in manifests/."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prep.errors import IntegrityError

if TYPE_CHECKING:
    import jsonschema

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "manifests"


def schema_path(schema_id: str) -> Path:
    """`prep.snapshot/1` -> manifests/snapshot-1.schema.json."""
    kind, version = schema_id.removeprefix("prep.").split("/")
    return SCHEMA_DIR / f"{kind}-{version}.schema.json"


@functools.cache
def _validator(schema_id: str) -> jsonschema.protocols.Validator:
    import jsonschema  # a tenth of a second: imported when first needed

    schema = json.loads(schema_path(schema_id).read_text())
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


def validate(document: Any, schema_id: str, source: str = "manifest") -> None:
    """Raise IntegrityError naming the first violation when `document` breaks its schema."""
    errors = sorted(_validator(schema_id).iter_errors(document), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        where = "/".join(str(part) for part in first.absolute_path) or "(root)"
        raise IntegrityError(f"{source}: does not match {schema_id} at {where}: {first.message}")
