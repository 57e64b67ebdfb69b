"""A corpus of near-duplicate clusters of planted sizes (2 to 17 documents) for the tests of what
near-duplicate removal records (the cluster task's size distribution, the snapshot's stats and
what `prep show` and `prep diff` print of them), and that distribution counted in plain Python."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from tests.helpers import write_jsonl, write_pipeline
from tests.neardup.neardupsupport import document, edited

PLANTED_SIZES = (2, 2, 2, 2, 3, 3, 4, 5, 6, 8, 9, 12, 17)
"""Each planted cluster's size: its original and size - 1 copies, each edited at 0 to 3% of words."""
NEAR = ("\n[dedup.near]\nthreshold = 0.7\nngram = 5\npermutations = 128\nbands = 32\nrows = 4\n"
        "verify = {verify}\n")
FILES = 2


def sized_clusters(rng: random.Random) -> list[list[str]]:
    """Unrelated documents, then each planted cluster's original followed by its copies, the
    clusters interleaved by shuffling the copies' places after their originals."""
    docs = [document(rng, rng.randint(40, 120)) for _ in range(40)]
    for size in PLANTED_SIZES:
        original = document(rng, rng.randint(150, 250))
        docs.append(original)
        docs.extend(edited(rng, original, rng.choice([0.0, 0.01, 0.03])) for _ in range(size - 1))
    return docs


def plain_distribution(sizes: Iterable[int]) -> dict[str, object]:
    """Clusters of these sizes as `stats.near_clusters` records them (docs/manifests.md), counted
    one cluster at a time: bin k holds 2**(k-1) + 1 .. 2**k, bins 1 to the largest size's."""
    sizes = list(sizes)
    by_bin = Counter((size - 1).bit_length() for size in sizes)
    return {"largest": max(sizes, default=0),
            "sizes": [{"min": 2 ** (k - 1) + 1, "max": 2**k, "clusters": by_bin[k]}
                      for k in range(1, max(by_bin, default=0) + 1)]}


def sizes_of_drops(representatives: Iterable[int]) -> list[int]:
    """Each cluster's size from its drops' representatives: 1 kept + the documents dropped for it."""
    return [dropped + 1 for dropped in Counter(int(number) for number in representatives).values()]


def write_sized_corpus(root: Path, tokenizer: Path, verify: bool = True, near: bool = True,
                       name: str = "pipeline.toml") -> list[list[str]]:
    """The corpus in FILES input files under `root/corpus` and a pipeline `root/name` (with
    [dedup.near] unless `near` is false); returns the documents in input order."""
    docs = sized_clusters(random.Random(42))
    bounds = [len(docs) * index // FILES for index in range(FILES + 1)]
    for index in range(FILES):
        write_jsonl(root / "corpus" / f"part-{index}.jsonl",
                    [{"id": f"d{at}", "text": " ".join(docs[at])} for at in range(bounds[index], bounds[index + 1])])
    extra = NEAR.format(verify=str(verify).lower()) if near else ""
    write_pipeline(root, tokenizer, shard_size="16KB", extra=extra, name=name)
    return docs
