"""A new output format is one registration: a toy format (each shard's texts, one a line) defined
here, with no edit elsewhere, is built, shown, pulled, verified, traced and diffed."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from click.testing import CliRunner, Result

from prep.cli.main import cli
from prep.config import load_pipeline
from prep.errors import ConfigError
from prep.formats import registry
from prep.formats.registry import ArtifactFormat, DocumentSizes, OutputFormat, ShardCounts
from prep.hashing import HashingWriter
from prep.progress import Progress
from prep.runner.build import BuildResult, build
from prep.stages.shard import PartReader, ShardSource
from prep.stages.sink import Written
from prep.storage import LocalStore
from tests.formats.test_golden import golden_corpus, word_tokenizer
from tests.helpers import write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor, artifact_path


def line_spans(sizes: DocumentSizes) -> npt.NDArray[np.int64]:
    """A document's bytes in a toy file: its text and a newline."""
    return sizes.text_bytes + 1


def toy_weight(shard: ShardCounts) -> int:
    """The toy file's bytes."""
    return shard.text_bytes + shard.documents


def write_toy(source: ShardSource, reader: PartReader, dtype: np.dtype[Any], eos_id: int,
              paths: Mapping[str, Path], read_back: bool) -> dict[str, Written]:
    """The shard's texts in key order, each followed by a newline."""
    with HashingWriter(paths["toy"]) as out:
        for docs in source.windows():
            spans = docs.text_bytes + 1
            targets = np.cumsum(spans) - spans
            payload = np.full(int(spans.sum()), ord("\n"), dtype=np.uint8)
            reader.gather(payload, docs.part, docs.text_offset, docs.text_bytes, targets)
            out.write(payload.tobytes())
    return {"toy": Written(paths["toy"], out.close(), read_back=False)}


TOY = OutputFormat("toy", (ArtifactFormat("toy", "toy", "txt", "toy", line_spans),),
                   writer=f"{__name__}:write_toy", weight=toy_weight)


@pytest.fixture()
def toy() -> Iterator[OutputFormat]:
    """The toy format, registered for one test."""
    registry.register(TOY)
    try:
        yield TOY
    finally:
        registry.unregister(TOY.name)


def build_corpus(root: Path, formats: str, vocab_size: int = 1000) -> BuildResult:
    """Build the golden corpus (in this process, so the workers see this module's registration)."""
    pipeline = write_pipeline(root, word_tokenizer(root / "tokenizer.json", vocab_size), ["corpus"], shard_size="2KB",
                              formats=formats)
    return build(load_pipeline(pipeline), LocalStore(root / "store"), InProcessExecutor(), (), Progress(quiet=True))


def prep(*args: str | Path, exit_code: int = 0) -> Result:
    """Run a prep command in this process (where the toy format is registered)."""
    result = CliRunner().invoke(cli, [str(arg) for arg in args])
    assert result.exit_code == exit_code, result.output
    return result


def test_a_registered_format_is_built_beside_bin_with_the_same_documents(tmp_path: Path, toy: OutputFormat) -> None:
    golden_corpus(tmp_path)
    built = build_corpus(tmp_path, '["bin", "toy"]')
    toys = [a for a in built.snapshot.artifacts if a["format"] == "toy"]
    bins = [a for a in built.snapshot.artifacts if a["format"] == "bin"]
    assert [a["path"].removesuffix(".txt") for a in toys] == [a["path"].replace("bin/", "toy/", 1)[:-4] for a in bins]
    texts = b"".join(artifact_path(tmp_path / "store", a).read_bytes() for a in toys).decode().split("\n")[:-1]
    assert len(texts) == built.snapshot.manifest["stats"]["documents_written"] == sum(a["documents"] for a in toys)
    assert built.snapshot.manifest["config"]["output"]["formats"] == ["bin", "toy"]


def test_the_toy_shards_are_shown_pulled_verified_traced_and_diffed(tmp_path: Path, toy: OutputFormat) -> None:
    golden_corpus(tmp_path)
    first = build_corpus(tmp_path, '["bin", "toy"]')
    store = tmp_path / "store"
    toys = [a for a in first.snapshot.artifacts if a["format"] == "toy"]
    shown = prep("show", first.snapshot.id, "--store", store).output.splitlines()
    assert f"artifacts  toy: {len(toys)} files, " in "\n".join(shown)
    prep("pull", first.snapshot.id, tmp_path / "dest", "--store", store, "--formats", "toy")
    pulled = sorted(p.relative_to(tmp_path / "dest").as_posix() for p in (tmp_path / "dest").rglob("*.*")
                    if ".prep" not in p.parts)
    assert pulled == sorted(a["path"] for a in toys)
    verified = json.loads(prep("verify", first.snapshot.id, tmp_path / "dest", "--store", store, "--formats", "toy",
                               "--json").output)
    assert verified["ok"] and verified["formats"] == ["toy"]
    at = json.loads(prep("show", first.snapshot.id, "--store", store, "--at", f"{toys[-1]['path']}:2", "--text",
                         "--json").output)
    place = next(p for p in at["trace"]["placements"] if p["format"] == "toy")
    line = (tmp_path / "dest" / toys[-1]["path"]).read_bytes()[place["offset"]:place["offset"] + place["length"]]
    assert line == at["text"].encode() + b"\n" and place["sequence"] == 2
    write_jsonl(tmp_path / "corpus" / "d.jsonl", [{"id": "d-0", "text": "w1 w2 w3 w4 w5 w6"}])
    second = build_corpus(tmp_path, '["bin", "toy"]')
    diff = json.loads(prep("diff", first.snapshot.id, second.snapshot.id, "--store", store, "--json",
                           exit_code=1).output)["artifacts"]
    toy_paths = {kind: [e.get("new_path", e.get("old_path")) for e in diff[kind]["entries"] if e["format"] == "toy"]
                 for kind in ("added", "removed", "unchanged")}
    assert toy_paths["added"] == toy_paths["removed"] == [toys[-1]["path"]]
    assert toy_paths["unchanged"] == [a["path"] for a in toys[:-1]]


def test_a_format_nobody_registered_is_refused_when_the_pipeline_is_read(tmp_path: Path) -> None:
    """config asks the registry (prep.formats sits below prep.config): nothing runs, nothing is written."""
    golden_corpus(tmp_path)
    path = write_pipeline(tmp_path, word_tokenizer(tmp_path / "t.json", 1000), ["corpus"], formats='["bin", "toy"]')
    with pytest.raises(ConfigError, match=r"pipeline.toml: output.formats: unknown format 'toy' \(use bin, mds, wds\)"):
        load_pipeline(path)
    assert not (tmp_path / "store").exists()


def test_a_format_must_not_clash_with_a_registered_one() -> None:
    clashes = [OutputFormat("idx", TOY.artifacts, TOY.writer, toy_weight),
               OutputFormat("toy2", (ArtifactFormat("toy2", "wds", "tar", "toy"),), TOY.writer, toy_weight),
               OutputFormat("Toy", TOY.artifacts, TOY.writer, toy_weight)]
    for clash in clashes:
        with pytest.raises(ValueError):
            registry.register(clash)
    assert registry.names() == ("bin", "mds", "wds")
