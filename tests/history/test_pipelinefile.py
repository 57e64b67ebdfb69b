"""The `[dedup]` table `prep show --pipeline` and `prep rebuild` write from a manifest's config:
any near-duplicate settings a snapshot records read back as the same settings (the threshold is
recorded as its decimal string; the table wrote it so, which `[dedup.near]` refused)."""

from __future__ import annotations

import tomllib

from hypothesis import given
from hypothesis import strategies as st

from prep.history.pipelinefile import dedup_lines
from prep.neardup.settings import SEED_LIMIT, NearDupSettings, parse_settings

settings = st.builds(
    lambda threshold, ngram, bands, rows, seed, verify: NearDupSettings(threshold, ngram, bands * rows, bands, rows,
                                                                        seed, verify),
    st.floats(min_value=0.0, max_value=1.0, exclude_min=True, exclude_max=True), st.integers(1, 64),
    st.integers(1, 64), st.integers(1, 64), st.integers(0, SEED_LIMIT - 1), st.booleans())


@given(settings, st.booleans())
def test_recorded_near_settings_read_back_as_themselves(near: NearDupSettings, exact: bool) -> None:
    recorded = {key: value for key, value in near.key_fields().items() if key != "unicode"}  # as Pipeline.resolved()
    table = tomllib.loads("\n".join(dedup_lines({"exact": exact, "near": recorded})) + "\n")["dedup"]
    assert table["exact"] is exact
    assert parse_settings(table["near"], "shown") == near


def test_a_dedup_table_without_near_settings_is_written_as_before() -> None:
    assert dedup_lines({"exact": False}) == ["[dedup]", "exact = false"]
    assert dedup_lines(None)[0] == "[dedup]" and dedup_lines(None)[1].startswith("# not recorded")
