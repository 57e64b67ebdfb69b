"""A document's metadata spelled from its record: the configured fields present and not null, one
compact JSON object with sorted keys whatever the record's key order; values JSON cannot spell
name their field."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.formats.jsonspelling import spell
from prep.inputs.jsonvalues import LongInt
from prep.inputs.metadata import metadata_json, table_metadata

FIELDS = ("url", "license", "source")
_values = st.recursive(st.none() | st.booleans() | st.integers(-2**80, 2**80) | st.floats(allow_nan=False,
                                                                                           allow_infinity=False)
                       | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                       max_leaves=10)


def _surrogate_free(value: Any) -> bool:
    try:
        spell(value).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@given(st.dictionaries(st.sampled_from([*FIELDS, "text", "other"]), _values, max_size=5))
@settings(max_examples=200)
def test_metadata_is_the_present_fields_spelled_one_way(record: dict[str, Any]) -> None:
    expected = {key: value for key, value in record.items() if key in FIELDS and value is not None}
    if not _surrogate_free(expected):
        with pytest.raises(ValueError, match=r"metadata field '\w+' has an unpaired surrogate"):
            metadata_json(record, FIELDS)
        return
    found = metadata_json(record, FIELDS)
    assert json.loads(found) == expected
    assert found == spell(expected).encode()
    assert found == json.dumps(dict(reversed(list(expected.items()))), sort_keys=True, separators=(",", ":"),
                               ensure_ascii=False).encode()


@pytest.mark.parametrize(("value", "reason"), [
    (math.nan, "NaN or an infinity"), (math.inf, "NaN or an infinity"), ([1, {"x": -math.inf}], "NaN or an infinity"),
    (b"raw", "a bytes value"), (LongInt("9" * 5000), "an integer too long for int()"), ("\udc80", "unpaired surrogate"),
])
def test_a_value_json_cannot_spell_names_its_field(value: object, reason: str) -> None:
    with pytest.raises(ValueError, match=r"^metadata field 'license' ") as caught:
        metadata_json({"license": value, "url": "u"}, FIELDS)
    assert reason in str(caught.value)


def test_escapes_and_numbers_are_spelled_as_json_does() -> None:
    record = {"url": "a\"b\\c\n\u2028 ü 😀", "license": [1, 2.5, 1e100, -0.0, None, True], "source": {"b": 1, "a": {}}}
    assert metadata_json(record, FIELDS) == ('{"license":[1,2.5,1e+100,-0.0,null,true],"source":{"a":{},"b":1},'
                                             '"url":"a\\"b\\\\c\\n\u2028 ü 😀"}').encode()
    assert metadata_json({}, FIELDS) == b"{}"


def test_table_rows_leave_out_missing_columns_and_nulls() -> None:
    found = table_metadata({"url": ["a", None], "source": [{"n": 1}, b"x"]}, FIELDS, 2)
    assert found[0] == b'{"source":{"n":1},"url":"a"}'
    assert isinstance(found[1], ValueError) and "metadata field 'source'" in str(found[1])
