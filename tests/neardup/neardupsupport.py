"""Helpers for the near-duplicate tests: batches of texts, and documents with planted word edits."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from prep.neardup.settings import NearDupSettings
from prep.neardup.signatures import packed, signatures
from prep.storage.local import LocalStore
from prep.store import cas
from prep.store.localcopy import local_file
from prep.workfiles.drops import open_drops
from prep.workfiles.pairs import read_pairs
from tests.helpers import write_jsonl

Array = np.ndarray[Any, Any]
VOCABULARY = [f"w{index}" for index in range(5000)]
DEFAULTS = NearDupSettings()


def batch(texts: list[str]) -> tuple[bytes, Array]:
    """`texts` as one UTF-8 buffer and its offsets, as a tokenize batch holds them."""
    return packed([text.encode("utf-8") for text in texts])


def signatures_of(texts: list[str], settings: NearDupSettings = DEFAULTS) -> Array:
    """The signatures of `texts`, in one batch."""
    blob, offsets = batch(texts)
    return signatures(blob, offsets, settings.ngram, settings.permutations, settings.seed)


def document(rng: random.Random, words: int) -> list[str]:
    """`words` words drawn from a 5,000-word vocabulary."""
    return [rng.choice(VOCABULARY) for _ in range(words)]


def edited(rng: random.Random, words: list[str], rate: float) -> list[str]:
    """`words` with each replaced by a fresh word (one not in the vocabulary) with probability `rate`."""
    return [f"x{rng.getrandbits(40)}" if rng.random() < rate else word for word in words]


def true_jaccard(a: list[str], b: list[str], ngram: int = 5) -> float:
    """Jaccard of two word lists' n-gram sets, computed on the words themselves."""
    first = {tuple(a[i:i + ngram]) for i in range(max(1, len(a) - ngram + 1))}
    second = {tuple(b[i:i + ngram]) for i in range(max(1, len(b) - ngram + 1))}
    return len(first & second) / len(first | second)


def planted(rng: random.Random) -> list[list[str]]:
    """Unrelated documents and originals each followed by copies edited at 0 to 12% of words, in input order."""
    docs = [document(rng, rng.randint(40, 120)) for _ in range(60)]
    for _ in range(40):
        words = document(rng, rng.randint(80, 200))
        docs.append(words)
        docs.extend(edited(rng, words, rng.choice([0.0, 0.01, 0.03, 0.08, 0.12])) for _ in range(rng.randint(1, 2)))
    return docs


def chain(rng: random.Random, length: int, words: int = 300, block: int = 25) -> list[list[str]]:
    """`length` documents, each the one before with its own block of `block` words replaced by
    fresh words (disjoint blocks): neighbours share far more shingles than members two apart, so
    with 300 words and blocks of 25 (ngram 5) neighbours' true Jaccard is about 0.82, two apart
    0.67 and three apart 0.55."""
    links = [document(rng, words)]
    for index in range(length - 1):
        start = 10 + index * (block + 10)
        links.append([*links[-1][:start], *(f"x{rng.getrandbits(40)}" for _ in range(block)),
                      *links[-1][start + block:]])
    return links


def chained_files(rng: random.Random, layout: Sequence[str], filler: int = 8) -> tuple[list[list[list[str]]], list[list[int]]]:
    """Input files of unrelated documents and chains (`chain`), and each chain's corpus positions
    in link order. `layout` has a line a file: `.` is `filler` unrelated documents, `b2` the second
    link of chain 2 (`a` the first link, `b` the second, ...)."""
    lengths: dict[int, int] = {}
    for item in (item for line in layout for item in line.split() if item != "."):
        lengths[int(item[1:])] = max(lengths.get(int(item[1:]), 0), ord(item[0]) - ord("a") + 1)
    chains = {number: chain(rng, length) for number, length in lengths.items()}
    positions = {number: [0] * length for number, length in lengths.items()}
    files: list[list[list[str]]] = []
    start = 0
    for line in layout:
        docs: list[list[str]] = []
        for item in line.split():
            if item == ".":
                docs.extend(document(rng, rng.randint(40, 120)) for _ in range(filler))
            else:
                positions[int(item[1:])][ord(item[0]) - ord("a")] = start + len(docs)
                docs.append(chains[int(item[1:])][ord(item[0]) - ord("a")])
        files.append(docs)
        start += len(docs)
    return files, [positions[number] for number in sorted(positions)]


def write_files(folder: Path, files: Sequence[Sequence[list[str]]], first: int = 0) -> list[Path]:
    """`files` as `folder/corpus/part-{i}.jsonl` from i = `first`, records `{"id": "d{position}", "text"}`
    numbered on from the documents of any files before `first` (`files` lists them too)."""
    start = sum(len(docs) for docs in files[:first])
    written = []
    for index in range(first, len(files)):
        written.append(write_jsonl(folder / "corpus" / f"part-{index}.jsonl",
                                   [{"id": f"d{start + at}", "text": " ".join(words)} for at, words in enumerate(files[index])]))
        start += len(files[index])
    return written


def snapshot_drops(store: Path, manifest: Mapping[str, Any], sizes: Sequence[int]) -> dict[int, int]:
    """A snapshot's near-duplicate drops as corpus positions (`sizes`: documents a part, in input
    order): dropped -> kept representative."""
    drops_id = json.loads(cas.get_bytes(LocalStore(store), stage_output(manifest, "near_clusters")))["drops"]
    records = open_drops(local_file(LocalStore(store), drops_id)).read_all()
    return dict(zip(corpus_positions(records["document"], sizes), corpus_positions(records["representative"], sizes)))


def snapshot_pairs(store: Path, manifest: Mapping[str, Any], sizes: Sequence[int]) -> set[tuple[int, int]]:
    """Every band bucket's (verified) candidate pairs of a snapshot, as corpus positions."""
    buckets = json.loads(cas.get_bytes(LocalStore(store), stage_output(manifest, "near_buckets")))["buckets"]
    found: set[tuple[int, int]] = set()
    for bucket in buckets:
        pairs = read_pairs(local_file(LocalStore(store), bucket["pairs"]))
        found.update(zip(corpus_positions(pairs.left, sizes), corpus_positions(pairs.right, sizes)))
    return found


def stage_output(manifest: Mapping[str, Any], name: str) -> str:
    """The manifest object id of a snapshot's stage `name`."""
    return str(next(run for run in manifest["stages"] if run["name"] == name)["output"])


def corpus_positions(numbers: Array, sizes: Sequence[int]) -> list[int]:
    """Global document numbers (`part ordinal << 32 | row`) as positions in the corpus."""
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    numbers = np.asarray(numbers, dtype=np.int64)
    return [int(at) for at in starts[numbers >> 32] + (numbers & 0xFFFFFFFF)]


def is_chain(docs: Sequence[list[str]], links: Sequence[int], threshold: float) -> bool:
    """Whether the documents at `links` form a chain at `threshold` by their true Jaccard:
    neighbours clearly similar (5 points above it, so LSH pairs them), every other pair below it
    (so only the links between join them) yet at least 0.5 (no dissimilar pair in one cluster)."""
    for at, first in enumerate(links):
        for second in links[at + 1:at + 2]:
            if true_jaccard(docs[first], docs[second]) < threshold + 0.05:
                return False
        for second in links[at + 2:]:
            if not 0.5 <= true_jaccard(docs[first], docs[second]) < threshold:
                return False
    return True


def chain_drops(chains: Sequence[Sequence[int]], documents: int) -> dict[int, int]:
    """What near-dup removal must drop of `chains` (positions, link order) in a corpus of the first
    `documents` documents: every link but the first in input order, each with that first."""
    drops = {}
    for links in chains:
        present = sorted(position for position in links if position < documents)
        drops.update({position: present[0] for position in present[1:]})
    return drops


def local_drops(pairs_paths: Sequence[Path], work: Path, range_bits: int) -> Path:
    """The drops object the cluster rounds make of these pairs objects over `2**range_bits`
    ranges, run in this process on local files (`starrounds.drops_in_one_process`)."""
    from prep.stages.starrounds import drops_in_one_process

    drops_in_one_process(pairs_paths, work / "rounds", range_bits, work / "drops")
    return work / "drops"
