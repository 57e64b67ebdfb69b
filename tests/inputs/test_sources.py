"""Which local paths are inputs: regular files only (a FIFO or a device would be read forever)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from prep.errors import InputError
from prep.inputs.sources import discover
from tests.helpers import make_records, write_jsonl


@pytest.mark.parametrize("kind", ["fifo", "device", "fifo in a folder"])
def test_an_input_that_is_not_a_regular_file_is_refused_naming_it(tmp_path: Path, kind: str) -> None:
    folder = tmp_path / "corpus"
    write_jsonl(folder / "a.jsonl", make_records(2))
    odd = folder / "b.jsonl"
    if kind == "device":
        odd.symlink_to("/dev/zero")
    else:
        os.mkfifo(odd)
    named = ("corpus",) if kind == "fifo in a folder" else ("corpus/a.jsonl", "corpus/b.jsonl")
    with pytest.raises(InputError, match=r"b\.jsonl: not a regular file") as refused:
        discover(named, tmp_path, "auto")
    assert refused.value.exit_code == 2


def test_a_symlink_to_a_regular_file_is_an_input(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "real.jsonl", make_records(2))
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "real.jsonl")
    [source] = discover(("link.jsonl",), tmp_path, "auto")
    assert source.size == (tmp_path / "real.jsonl").stat().st_size


def _names(paths: tuple[str, ...], folder: Path, declared: str = "auto") -> list[str]:
    return [source.rel for source in discover(paths, folder, declared)]


def test_a_relative_glob_takes_the_pipeline_folder_literally(tmp_path: Path) -> None:
    """A folder named `run[1]` is that folder, not a character class matching `run1`."""
    write_jsonl(tmp_path / "run[1]" / "corpus" / "mine.jsonl", make_records(2))
    write_jsonl(tmp_path / "run1" / "corpus" / "other.jsonl", make_records(2))
    assert _names(("corpus/*.jsonl",), tmp_path / "run[1]") == ["mine.jsonl"]


@pytest.mark.parametrize("sign", ["prep-store.json", "leases/build/run/000000000001.json", "objects/sha256/ab/cd"])
@pytest.mark.parametrize("pattern", [".", "**/*.json*"])
def test_a_store_inside_the_corpus_folder_is_never_read(tmp_path: Path, sign: str, pattern: str) -> None:
    """A build writes its lease before it lists inputs: `paths = ["."]` must not read the store's records."""
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(2))
    marker = tmp_path / "prep-store" / sign
    marker.parent.mkdir(parents=True)
    marker.write_text("{}\n")
    (tmp_path / "prep-store" / "refs").mkdir()
    (tmp_path / "prep-store" / "refs" / "latest.json").write_text("{}\n")
    assert _names((pattern,), tmp_path) == ["a.jsonl"]


def test_a_recursive_glob_does_not_go_round_a_symlink_loop(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(2))
    (tmp_path / "corpus" / "again").symlink_to(tmp_path / "corpus")
    (tmp_path / "elsewhere").mkdir()
    write_jsonl(tmp_path / "elsewhere" / "b.jsonl", make_records(2))
    (tmp_path / "corpus" / "linked").symlink_to(tmp_path / "elsewhere")  # a link that is no loop still counts
    assert _names(("corpus/**/*.jsonl",), tmp_path) == ["a.jsonl", "linked/b.jsonl"]


def _save_dataset(folder: Path, names: list[object]) -> None:
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": name} for name in names]}))
    (folder / "dataset_info.json").write_text('{\n  "citation": ""\n}\n')
    for name in names:
        if isinstance(name, str) and name:
            (folder / name).write_bytes(b"")


def test_a_datasets_save_folder_inside_a_folder_is_read_as_one(tmp_path: Path) -> None:
    """Its state.json and dataset_info.json are not JSON Lines inputs."""
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(2))
    _save_dataset(tmp_path / "corpus" / "saved", ["data-00000-of-00001.arrow"])
    found = discover(("corpus",), tmp_path, "auto")
    assert [(s.rel, s.format) for s in found] == [("a.jsonl", "jsonl"), ("saved/data-00000-of-00001.arrow", "hf")]


def test_a_datasetdict_folder_names_its_splits(tmp_path: Path) -> None:
    for split in ("train", "test"):
        _save_dataset(tmp_path / "dd" / split, ["data-00000-of-00001.arrow"])
    (tmp_path / "dd" / "dataset_dict.json").write_text('{"splits": ["train", "test"]}')
    with pytest.raises(InputError, match=r"dd: a DatasetDict saved with save_to_disk; .*\(test, train\)"):
        discover(("dd",), tmp_path, "auto")
    assert _names(("dd/train",), tmp_path) == ["data-00000-of-00001.arrow"]


@pytest.mark.parametrize(("names", "problem"), [([5], "a filename is 5"), ([None], "a filename is None"),
                                                ([""], "a filename is ''"), ([], "_data_files lists no files")])
def test_a_state_json_without_file_names_is_refused_naming_it(tmp_path: Path, names: list[object],
                                                              problem: str) -> None:
    _save_dataset(tmp_path / "saved", names)
    with pytest.raises(InputError, match=re.escape(f"saved: not a dataset saved with save_to_disk (state.json: {problem}")):
        discover(("saved",), tmp_path, "auto")


def test_a_folder_the_walk_cannot_list_is_an_error_not_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """os.walk passes over a folder it cannot list (chmod 000, as a user other than root): its
    documents silently left out of the build."""
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(2))
    write_jsonl(tmp_path / "corpus" / "locked" / "b.jsonl", make_records(2))
    listing = os.scandir

    def scandir(path: str) -> object:
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return listing(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(InputError, match=r"corpus/locked: cannot read input folder: Permission denied") as refused:
        discover(("corpus",), tmp_path, "auto")
    assert refused.value.exit_code == 2
