"""A document's metadata ([input] metadata_fields): the named fields of its record, as one JSON
object spelled one way (prep.formats.jsonspelling), so equal metadata is equal bytes wherever it came
from. A field the record lacks, or holds as null, is left out; `{}` when it has none of them. A
value with no JSON spelling (NaN or an infinity, binary, a date or time from a table, an integer
too long for `int()`, a string with a lone surrogate) makes the record a bad record naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from prep.formats.jsonspelling import spell
from prep.inputs.jsonvalues import LongInt

EMPTY = b"{}"


def _refuse(value: object) -> object:
    what = "an integer too long for int()" if isinstance(value, LongInt) else f"a {type(value).__name__} value"
    raise TypeError(what)


def value_json(value: Any) -> str:
    """One value's spelling; ValueError says why it has none."""
    try:
        return spell(value, _refuse)
    except TypeError as exc:
        raise ValueError(f"holds {exc}, which JSON cannot spell") from None
    except ValueError:
        raise ValueError("holds NaN or an infinity, which JSON cannot spell") from None


def metadata_json(record: Mapping[str, Any], fields: Sequence[str]) -> bytes:
    """The metadata of a record (a JSON object, or a table row by column): its non-null `fields`
    as a compact JSON object with sorted keys, UTF-8; ValueError names the field it cannot spell."""
    present = {field: value for field in fields if (value := record.get(field)) is not None}
    try:
        return spell(present, _refuse).encode()  # one encode for the object: the spelling of its members joined
    except (TypeError, ValueError, UnicodeEncodeError):
        pass
    for field in sorted(present):  # name the field that has no spelling
        try:
            value_json(present[field]).encode()
        except (ValueError, UnicodeEncodeError) as exc:
            reason = "has an unpaired surrogate" if isinstance(exc, UnicodeEncodeError) else str(exc)
            raise ValueError(f"metadata field {field!r} {reason}") from None
    raise AssertionError("a metadata object with no spelling whose every field has one")


def table_metadata(columns: Mapping[str, Sequence[Any]], fields: Sequence[str], rows: int) -> list[bytes | ValueError]:
    """Each table row's metadata from its columns' Python values (`fields` a table lacks are left
    out), or the ValueError that makes the row a bad record."""
    present = [field for field in fields if field in columns]
    found: list[bytes | ValueError] = []
    for row in range(rows):
        try:
            found.append(metadata_json({field: columns[field][row] for field in present}, present))
        except ValueError as exc:
            found.append(exc)
    return found
