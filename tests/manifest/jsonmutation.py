"""Near misses of valid JSON documents, for checking that the fast schema path accepts nothing
jsonschema refuses: a value perturbed, replaced, deleted or a key added, anywhere in a document."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**64), st.floats(allow_nan=True),
                        st.text(max_size=70), st.sampled_from(["a" * 64, "sha256:" + "0" * 64, "bin", "", "0" * 64 + "\n"]),
                        st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))


def locations(value: Any, where: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON document: the paths of its object keys and list items."""
    found = [where]
    if isinstance(value, dict):
        for key, item in value.items():
            found += locations(item, (*where, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += locations(item, (*where, index))
    return found


def perturbed(value: Any, choice: int) -> Any:
    """A near miss of the same type: a negative number, a string one character off, ..."""
    if isinstance(value, bool):
        return [not value, int(value)][choice % 2]
    if isinstance(value, int):
        return [-1 - value, float(value), str(value), value + 1][choice % 4]
    if isinstance(value, str):
        return [value + "\n", value[:-1], "", value.upper(), value + "0", None][choice % 6]
    return [[], {}, None][choice % 3]


def mutated(document: Any, data: st.DataObject) -> Any:
    """A copy of `document` with one to three of its places perturbed, replaced, deleted or added to."""
    result = copy.deepcopy(document)
    for _ in range(data.draw(st.integers(1, 3))):
        places = locations(result)[1:]
        if not places:
            break
        where = data.draw(st.sampled_from(places))
        parent = result
        for step in where[:-1]:
            parent = parent[step]
        action = data.draw(st.sampled_from(["perturb", "replace", "delete", "add"]))
        if action == "perturb":
            parent[where[-1]] = perturbed(parent[where[-1]], data.draw(st.integers(0, 11)))
        elif action == "replace":
            parent[where[-1]] = data.draw(JSON_VALUES)
        elif action == "delete":
            del parent[where[-1]]
        elif isinstance(parent, dict):
            parent[data.draw(st.text(max_size=8))] = data.draw(JSON_VALUES)
        else:
            parent.append(data.draw(JSON_VALUES))
    return result
