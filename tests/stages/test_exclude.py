"""The tokenize task's exclusion: a batch less the documents whose id or text hash the table
holds, found by binary search over the stored bytes (the same answer as a set lookup)."""

from __future__ import annotations

import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from prep.inputs.exclusions import Entry, pack
from prep.stages.exclude import Excluder
from prep.stages.textcolumns import TextColumns
from prep.workfiles.columns import to_strings

DOCS = st.lists(st.tuples(st.one_of(st.none(), st.sampled_from([f"d{n}" for n in range(12)])),
                          st.sampled_from(["", "a", "b", "hello", "\x00", "naïve", "x" * 40])),
                max_size=30)


@settings(deadline=None)  # the first example imports numpy and Arrow's kernels
@given(DOCS, st.sets(st.sampled_from([f"d{n}" for n in range(14)])),
       st.sets(st.sampled_from(["", "a", "hello", "\x00", "never"])))
def test_exclusion_drops_exactly_what_a_set_lookup_names(docs: list[tuple[str | None, str]], ids: set[str],
                                                         texts: set[str]) -> None:
    entries = [Entry("id", doc_id) for doc_id in ids] + \
        [Entry("text", xxhash.xxh3_128_hexdigest(text.encode())) for text in texts]
    excluder = Excluder(pack(entries))
    batch = TextColumns.from_rows(list(range(len(docs))), [doc_id for doc_id, _ in docs],
                                  [text.encode() for _, text in docs])
    kept = excluder.apply(batch)
    expected = [(row, doc_id, text) for row, (doc_id, text) in enumerate(docs)
                if doc_id not in ids and text not in texts]
    assert [(int(row), doc_id, kept.data(at).decode()) for at, (row, doc_id) in
            enumerate(zip(kept.rows.tolist(), to_strings(kept.ids)))] == expected
    assert excluder.excluded == len(docs) - len(expected)
    assert excluder.excluded_bytes == sum(len(text.encode()) for doc_id, text in docs) - \
        sum(len(text.encode()) for _, _, text in expected)
