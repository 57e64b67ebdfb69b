"""The order tasks' distributions summed by the driver: per part and per length, and a record that
lacks them or names a part the corpus lacks refused (fail closed), never summed into the stats."""

from __future__ import annotations

from typing import Any

import pytest

from prep.errors import IntegrityError
from prep.quality.lengths import TokenLengths
from prep.runner.distributions import order_quality


def summary(parts: list[int], documents: list[int], exact: list[int], **more: Any) -> dict[str, Any]:
    return {"token_lengths": {"exact": exact, "octaves": []},
            "parts": {"part": parts, "duplicates": [1] * len(parts), "documents": documents,
                      "tokens": [10 * d for d in documents], **more}}


def test_buckets_sum_per_part_and_per_length() -> None:
    quality = order_quality(3, [("k1", summary([0, 2], [4, 1], [0, 2])), ("k2", summary([2], [5], [1, 0, 3]))])
    assert quality.lengths == TokenLengths((1, 2, 3))
    assert quality.parts == {"duplicates": (1, 0, 2), "near_duplicates": (0, 0, 0), "documents": (4, 0, 6),
                             "tokens": (40, 0, 60)}


@pytest.mark.parametrize("bad", [
    {"parts": {"part": [], "duplicates": [], "documents": [], "tokens": []}},  # no token_lengths
    summary([3], [1], []),  # part 3 of a corpus of 3
    summary([0, 1], [1], []),  # a column shorter than the parts
    summary([0], [1], [-1]),  # a negative count
    summary([0], [1], [], near_duplicates=[1, 2]),
])
def test_a_record_without_usable_distributions_is_an_integrity_error(bad: dict[str, Any]) -> None:
    with pytest.raises(IntegrityError, match=r"^task record order/k9: no usable token lengths or part counts"):
        order_quality(3, [("k1", summary([0], [1], [1])), ("k9", bad)])
