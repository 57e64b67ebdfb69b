"""Which local paths are inputs: regular files only (a FIFO or a device would be read forever)."""

from __future__ import annotations

import os
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
