"""A snapshot carries its tokenizer file: the build stores it as an object the manifest names (gc
keeps it, fsck checks it), `prep pull` puts it at DEST/.prep/tokenizer.json and `prep verify`
checks it there, so a training or evaluation node decodes the tokens with nothing but the pulled
folder. A snapshot built before carried none: pull says so and still works."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from prep.config import load_pipeline
from prep.errors import InputError
from prep.progress import Progress
from prep.runner.build import BuildResult, build, store_tokenizer
from prep.storage import LocalStore
from prep.store import cas
from prep.transfer.pull import PullResult, install_tokenizer
from prep.transfer.shares import Share
from prep.transfer.verify import carried
from tests.helpers import make_records, run_prep, write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor, read_samples, read_sequences


@pytest.fixture
def built(tmp_path: Path, tokenizer_path: Path) -> BuildResult:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(30, seed=3, prefix="t"))
    pipeline = write_pipeline(tmp_path, tokenizer_path, ["corpus"], shard_size="2KB")
    return build(load_pipeline(pipeline), LocalStore(tmp_path / "store"), InProcessExecutor(), (), Progress(quiet=True))


def test_the_store_holds_the_tokenizer_file_and_gc_keeps_it(built: BuildResult, tmp_path: Path,
                                                            tokenizer_path: Path) -> None:
    tokenizer = built.snapshot.manifest["tokenizer"]
    store = LocalStore(tmp_path / "store")
    assert tokenizer["object"] == f"sha256:{tokenizer['sha256']}" and tokenizer["bytes"] == tokenizer_path.stat().st_size
    run_prep("gc", "--grace", "0s", "--store", tmp_path / "store")
    assert cas.get_bytes(store, tokenizer["object"]) == tokenizer_path.read_bytes()
    assert "clean" in run_prep("fsck", "--store", tmp_path / "store").stdout


def test_a_pulled_folder_decodes_its_tokens_with_its_own_tokenizer(built: BuildResult, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    report = json.loads(run_prep("pull", built.snapshot.id, dest, "--store", tmp_path / "store", "--json").stdout)
    assert report["tokenizer"] == ".prep/tokenizer.json" and report["warnings"] == []
    tokenizer = Tokenizer.from_file(str(dest / ".prep" / "tokenizer.json"))
    texts = [sample["txt"].decode() for _, sample in read_samples(tmp_path / "store", built.snapshot.manifest)]
    sequences = read_sequences(tmp_path / "store", built.snapshot.manifest)
    assert len(sequences) == len(texts) > 1
    eos = built.snapshot.manifest["tokenizer"]["eos_id"]
    for sequence, text in zip(sequences, texts):
        assert int(sequence[-1]) == eos
        assert tokenizer.decode([int(token) for token in sequence[:-1]]) == text
    assert run_prep("verify", built.snapshot.id, dest, "--store", tmp_path / "store").returncode == 0


def test_verify_finds_a_changed_tokenizer_copy(built: BuildResult, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    run_prep("pull", built.snapshot.id, dest, "--store", tmp_path / "store")
    copy = dest / ".prep" / "tokenizer.json"
    data = bytearray(copy.read_bytes())
    data[len(data) // 2] ^= 0x01
    copy.write_bytes(bytes(data))
    checked = run_prep("verify", built.snapshot.id, dest, "--store", tmp_path / "store", "--json", check=False)
    problems = json.loads(checked.stdout)["problems"]
    assert checked.returncode == 1 and [(p["path"], p["kind"]) for p in problems] == [(".prep/tokenizer.json",
                                                                                        "wrong-hash")]
    copy.unlink()
    again = run_prep("pull", built.snapshot.id, dest, "--store", tmp_path / "store")  # a pull puts it back
    assert again.returncode == 0 and copy.exists()


def test_a_snapshot_without_its_tokenizer_is_pulled_and_says_so(built: BuildResult, tmp_path: Path) -> None:
    older = json.loads(json.dumps(built.snapshot.manifest))
    del older["tokenizer"]["object"], older["tokenizer"]["bytes"]
    assert install_tokenizer(LocalStore(tmp_path / "store"), tmp_path / "dest", older) is None
    assert carried(older) == []
    result = PullResult(built.snapshot.id, tmp_path / "dest", Share(0, 1, ()), 0, 0, 0, 0, 0, 0, 0, 0,
                        None, 0, 0.0)
    assert any("built before snapshots carried their tokenizer file" in warning for warning in result.warnings)


def test_a_tokenizer_changed_during_the_build_is_refused(tmp_path: Path, tokenizer_path: Path) -> None:
    changed = tmp_path / "tokenizer.json"
    changed.write_bytes(tokenizer_path.read_bytes() + b" ")
    with pytest.raises(InputError, match="tokenizer file changed during the build"):
        store_tokenizer(LocalStore(tmp_path / "store"), changed, "0" * 64)
