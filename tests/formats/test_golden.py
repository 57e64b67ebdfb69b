"""Golden artifacts: a fixed corpus builds to the same bytes, path for path, as recorded (bin and
wds, uint16 and int32 token ids, duplicates dropped across files). A change here is a format change.

The manifest's distributions (stats.tokens_per_document, stats.files and stats.shard_sources) are
pinned apart, as values one can read (GOLDEN_DISTRIBUTIONS, and GOLDEN_SHARD_SOURCES by vocabulary,
which decides the shard cuts), and left out of the manifest digest: the digests recorded before the
distributions existed still hold, which proves they added fields and changed nothing else (the
shard stage manifest gained each shard's source mix, but stage outputs are blanked like the code)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from prep.config import load_pipeline
from prep.progress import Progress
from prep.runner.build import build
from prep.storage import LocalStore
from tests.helpers import write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor, artifact_path

EOS = "<|endoftext|>"
WORDS = tuple(f"w{i}" for i in range(97)) + ("größe", "数据", "🙂")


def word_tokenizer(path: Path, vocab_size: int) -> Path:
    """A word-level tokenizer whose words take the top ids of a `vocab_size` vocabulary (int32 past 65,535)."""
    top = vocab_size - len(WORDS)
    vocab = {EOS: 0, "[UNK]": 1} | {f"filler{i}": i for i in range(2, top)} | {w: top + i for i, w in enumerate(WORDS)}
    model = {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    path.write_text(json.dumps({"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
                                "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
                                "post_processor": None, "decoder": None, "model": model}), encoding="utf-8")
    return path


def golden_corpus(root: Path) -> None:
    """Three files of words; the third repeats texts of the first two (dropped as duplicates)."""
    def text(seed: int) -> str:
        return " ".join(WORDS[(seed * 31 + k * 7) % len(WORDS)] for k in range(seed % 23)) + " [x]" * (seed % 3)
    first = [{"id": f"a-{i}", "text": text(i)} for i in range(70)]
    second = [{"id": f"b-{i}", "text": text(1000 + i)} for i in range(50)]
    third = [{"id": f"c-{i}", "text": t["text"]} for i, t in enumerate(first[::9] + second[::11])]
    third.append({"id": "c-new", "text": "w3 w5 " + EOS + " w7"})
    for name, records in (("a", first), ("b", second), ("sub/c", third)):
        write_jsonl(root / "corpus" / f"{name}.jsonl", records)


def golden_build(root: Path, vocab_size: int, formats: str) -> tuple[str, dict[str, str]]:
    """Build the golden corpus: its manifest's digest without the code identity, and every
    artifact's SHA-256 by path (checked against the store's object); its distributions must be
    GOLDEN_DISTRIBUTIONS."""
    golden_corpus(root)
    pipeline = write_pipeline(root, word_tokenizer(root / "tokenizer.json", vocab_size), ["corpus"],
                              shard_size="2KB", formats=formats)
    result = build(load_pipeline(pipeline), LocalStore(root / "store"), InProcessExecutor(), (), Progress(quiet=True))
    digests = {}
    for artifact in result.snapshot.artifacts:
        data = artifact_path(root / "store", artifact).read_bytes()
        digests[artifact["path"]] = hashlib.sha256(data).hexdigest()
        assert digests[artifact["path"]] == artifact["sha256"]
    stats = result.snapshot.manifest["stats"]
    assert {name: stats[name] for name in DISTRIBUTIONS} == {**GOLDEN_DISTRIBUTIONS,
                                                             "shard_sources": GOLDEN_SHARD_SOURCES[vocab_size]}
    return manifest_without_code(result.snapshot.manifest), digests


DISTRIBUTIONS = ("tokens_per_document", "files", "shard_sources")


def manifest_without_code(manifest: dict[str, Any]) -> str:
    """The manifest's SHA-256 with the code identity and the stage keys and outputs it enters
    blanked, and without the distributions (pinned in GOLDEN_DISTRIBUTIONS)."""
    stages = [{**stage, "key": "-", "output": "-"} for stage in manifest["stages"]]
    stats = {name: value for name, value in manifest["stats"].items() if name not in DISTRIBUTIONS}
    blanked = {**manifest, "code": "-", "stages": stages, "stats": stats}
    return hashlib.sha256(json.dumps(blanked, sort_keys=True).encode()).hexdigest()


def _octave(low: int, high: int, documents: int) -> dict[str, int]:
    return {"min": low, "max": high, "documents": documents}


def _file(path: str, read: int, duplicates: int, tokens: int) -> dict[str, object]:
    return {"path": path, "documents_read": read, "bad_records_skipped": 0, "duplicates_dropped": duplicates,
            "documents_written": read - duplicates, "tokens_written": tokens}


GOLDEN_DISTRIBUTIONS: dict[str, Any] = {
    # one empty text (a-0; a-69 repeats it), 77 documents of fewer than 16 tokens, the median 12
    "tokens_per_document": {
        "histogram": [_octave(0, 0, 1), _octave(1, 1, 2), _octave(2, 3, 10), _octave(4, 7, 21), _octave(8, 15, 43),
                      _octave(16, 31, 41)],
        "median": {"min": 12, "max": 12}, "empty": 1, "short": 77, "short_below": 16},
    # sub/c.jsonl repeats 13 texts of the first two files: one document of it is written (c-new)
    "files": [_file("a.jsonl", 70, 1, 897), _file("b.jsonl", 50, 2, 654), _file("sub/c.jsonl", 14, 13, 5)],
}


def _shard_sources(shards: int, shares: dict[int, int]) -> dict[str, Any]:
    """Every shard holds 2 or 3 of the 3 files; `shares`: shards by the decile of their largest source's share."""
    return {"shards": shards, "files_written": 3, "largest_file": {"file": 0, "documents": 69},
            "distinct": [{"min": 1, "max": 1, "shards": 0}, {"min": 2, "max": 3, "shards": shards}],
            "largest_share": [{"min_percent": 10 * k, "max_percent": 10 * k + 10, "shards": shares.get(k, 0)}
                              for k in range(10)]}


GOLDEN_SHARD_SOURCES: dict[int, dict[str, Any]] = {
    # a.jsonl wrote 69 of the 118 documents (58.5%): each shard's largest source is a.jsonl at
    # about that share (a few dozen documents a shard: a spread of a decile or two around it)
    1000: _shard_sources(2, {5: 1, 6: 1}),
    70000: _shard_sources(4, {5: 1, 6: 2, 7: 1}),
}


GOLDEN: dict[tuple[int, str], tuple[str, dict[str, str]]] = {
    (1000, '["bin", "wds"]'): (
        "428db27efdcdb03a4d9cd95878b77b18dbaa7b319d2b819fdb36bb969bd60f51", {
            "bin/0000000000000000.bin": "5cd323c9dd1ea8a1afa32ed709ea924d1462359ca01f03880ac5620e1d35d4c3",
            "bin/0000000000000000.idx": "9f07e20c47a8a598e1f19bbb9e7476305d0bb5601e6d7df82725b1a72f1b8a9c",
            "bin/8000000000000000.bin": "b0e14e756dda37a72ed3efa53e2166a7254cb46226b30fcad54f6fcd4859571a",
            "bin/8000000000000000.idx": "b44aa6e559e1e9b1efa4e641c4359d6efea12bdc9b9eab37feffc17191e86801",
            "wds/0000000000000000.tar": "7cc67606cda5fae376d518be936ef10efc2f136e7f93826859dd5b42a7413922",
            "wds/8000000000000000.tar": "833633520c59c9e9bf1fcda42a8ad462927dc320cd88080a84711cbb0301aae7",
        }),
    (1000, '["wds"]'): (
        "2610b03a200524603af33c546e55cde0cefc7dd4c4f73fdd87dd61ec386eb63c", {
            "wds/0000000000000000.tar": "7cc67606cda5fae376d518be936ef10efc2f136e7f93826859dd5b42a7413922",
            "wds/8000000000000000.tar": "833633520c59c9e9bf1fcda42a8ad462927dc320cd88080a84711cbb0301aae7",
        }),
    (1000, '["bin"]'): (
        "927577388e24be00f7459f6d091998d2bdca661bcbb67c78e29470eeb7c14d8a", {
            "bin/0000000000000000.bin": "5cd323c9dd1ea8a1afa32ed709ea924d1462359ca01f03880ac5620e1d35d4c3",
            "bin/0000000000000000.idx": "9f07e20c47a8a598e1f19bbb9e7476305d0bb5601e6d7df82725b1a72f1b8a9c",
            "bin/8000000000000000.bin": "b0e14e756dda37a72ed3efa53e2166a7254cb46226b30fcad54f6fcd4859571a",
            "bin/8000000000000000.idx": "b44aa6e559e1e9b1efa4e641c4359d6efea12bdc9b9eab37feffc17191e86801",
        }),
    (70000, '["bin", "wds"]'): (
        "526a910b057258e00b4c78bd3e353cbd00ac507b050396bdb8f3b88aba83cadf", {
            "bin/0000000000000000.bin": "a5d0b1839db94021dc6c2eb3f61f30e2a67a8dd0d0f517613ea22340fe63e65d",
            "bin/0000000000000000.idx": "7aacad57e185eae9dca357eb1a7aa57dc8851f995e6b9f718f3283778559ce05",
            "bin/4000000000000000.bin": "80cd680ecc6ac62e2250a5dd1a75a918d84331647e8a8e9f26b5c894525d9735",
            "bin/4000000000000000.idx": "67c77dd7b2b5832c61be14a029f5d44c0520a7b7924e0ba27bb92a88e104135b",
            "bin/8000000000000000.bin": "e00eefafd16b25d0f5d7322583e8b3fda9e78cd19717d370a6d06f818aad51e3",
            "bin/8000000000000000.idx": "e537aae2e708eaef6c3edfbc719af0d9b498a9ed3b304bd6249c8de85850ecb8",
            "bin/c000000000000000.bin": "9402382f9ecf35dc5be4d0dadbf991914dcdddcc85e9bc1d8bea08627ba2b928",
            "bin/c000000000000000.idx": "3acff9add971ff52cd0c4745de14451bdeb5b85169905513ac3a143915ff5617",
            "wds/0000000000000000.tar": "6f9f954efbf5ed18d1a54bed429bde028fb3ddeb7e4d91ddff79308416d9cdfb",
            "wds/4000000000000000.tar": "58781d193fd2c8099b73239da6d1ec31855bc43eab7a7345041597de47079db6",
            "wds/8000000000000000.tar": "12d3257e657da7d9b47002c7d8d166d30eed383c1ed8700cc8d8af99334f19cd",
            "wds/c000000000000000.tar": "97d2ad3b180bd8d85a0cd4207fed0d1233b50a9a9dcdbe5bc4bc1b0e41b4a3bc",
        }),
    (70000, '["wds"]'): (
        "cb0ef19a58c145d04d31fe8c48b7e1c05e6bc80101a181aee9785c780b24e5be", {
            "wds/0000000000000000.tar": "6f9f954efbf5ed18d1a54bed429bde028fb3ddeb7e4d91ddff79308416d9cdfb",
            "wds/4000000000000000.tar": "58781d193fd2c8099b73239da6d1ec31855bc43eab7a7345041597de47079db6",
            "wds/8000000000000000.tar": "12d3257e657da7d9b47002c7d8d166d30eed383c1ed8700cc8d8af99334f19cd",
            "wds/c000000000000000.tar": "97d2ad3b180bd8d85a0cd4207fed0d1233b50a9a9dcdbe5bc4bc1b0e41b4a3bc",
        }),
    (70000, '["bin"]'): (
        "5a31164fdc704596c29bdfc4a975c525cc320c3e172df729a45b0cd0b01bf51a", {
            "bin/0000000000000000.bin": "a5d0b1839db94021dc6c2eb3f61f30e2a67a8dd0d0f517613ea22340fe63e65d",
            "bin/0000000000000000.idx": "7aacad57e185eae9dca357eb1a7aa57dc8851f995e6b9f718f3283778559ce05",
            "bin/4000000000000000.bin": "80cd680ecc6ac62e2250a5dd1a75a918d84331647e8a8e9f26b5c894525d9735",
            "bin/4000000000000000.idx": "67c77dd7b2b5832c61be14a029f5d44c0520a7b7924e0ba27bb92a88e104135b",
            "bin/8000000000000000.bin": "e00eefafd16b25d0f5d7322583e8b3fda9e78cd19717d370a6d06f818aad51e3",
            "bin/8000000000000000.idx": "e537aae2e708eaef6c3edfbc719af0d9b498a9ed3b304bd6249c8de85850ecb8",
            "bin/c000000000000000.bin": "9402382f9ecf35dc5be4d0dadbf991914dcdddcc85e9bc1d8bea08627ba2b928",
            "bin/c000000000000000.idx": "3acff9add971ff52cd0c4745de14451bdeb5b85169905513ac3a143915ff5617",
        }),
}


@pytest.mark.parametrize(("vocab_size", "formats"), sorted(GOLDEN))
def test_the_golden_corpus_builds_to_the_recorded_bytes(tmp_path: Path, vocab_size: int, formats: str) -> None:
    assert golden_build(tmp_path, vocab_size, formats) == GOLDEN[vocab_size, formats]
