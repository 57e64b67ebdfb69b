"""Where a Reader finds its sources: a snapshot spec without store= resolves in the store the CLI
would use ($PREP_STORE, the project config found walking up, ./prep-store), a missing folder is
named as missing, and a mixture source that does not resolve names the file and its key."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from prep.data.reader import Reader
from prep.errors import ConfigError, StoreError, UsageError
from prep.project import write_config
from prep.storage import LocalStore
from tests.helpers import run_prep
from tests.snapshot_factory import build_snapshot

SEQ, GLOBAL = 16, 8


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A two-shard snapshot `demo@latest` in a local store, and the rows its step 3 reads."""
    root = tmp_path_factory.mktemp("sources")
    store = LocalStore(root / "store")
    build_snapshot(store, root / "work", shard_sizes=(20_000, 20_000), formats=("bin",))
    with Reader("demo@latest", SEQ, GLOBAL, store=store) as reader:
        rows = reader.batch(3)
    return {"root": root, "store": root / "store", "rows": rows}


def _reads_the_store(stored: dict[str, Any]) -> Reader:
    """A reader of `demo@latest` given no store=, checked to read the rows the store holds."""
    reader = Reader("demo@latest", SEQ, GLOBAL)
    assert np.array_equal(reader.batch(3), stored["rows"])
    return reader


def test_prep_store_in_the_environment_is_the_readers_store(stored: dict[str, Any], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path, str(tmp_path / "not-a-store"))  # the environment comes first, as in the CLI
    monkeypatch.setenv("PREP_STORE", str(stored["store"]))
    _reads_the_store(stored).close()


def test_the_project_config_above_the_working_directory_names_the_store(stored: dict[str, Any], tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    write_config(tmp_path, str(stored["store"]))
    (tmp_path / "deep" / "er").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "deep" / "er")
    reader = _reads_the_store(stored)
    monkeypatch.chdir(tmp_path.parent)  # a pickled reader (a spawned worker) reads the store found, wherever it runs
    restored = pickle.loads(pickle.dumps(reader))
    assert np.array_equal(restored.batch(3), stored["rows"])
    reader.close()
    restored.close()


def test_prep_store_in_the_working_directory_is_the_last_resort(stored: dict[str, Any], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "prep-store").symlink_to(stored["store"])
    monkeypatch.chdir(tmp_path)
    _reads_the_store(stored).close()


def test_no_store_anywhere_is_one_error_and_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match=r"^\./prep-store is not a prep store"):
        Reader("demo@latest", SEQ, GLOBAL)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["/no/such/dir", "missing/dest", "./dest"])
def test_a_folder_that_does_not_exist_is_named_as_missing(name: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """It said a snapshot spec needs store=..., as if the path were a spec."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=rf"^{re.escape(name)}: no such folder"):
        Reader(name, SEQ, GLOBAL)
    with pytest.raises(UsageError, match=rf"^{re.escape(name)}: no such folder"):
        Reader(name, SEQ, GLOBAL, store=tmp_path)


def _mixture(root: Path, sources: list[str]) -> Path:
    path = root / "mix.toml"
    path.write_text("".join(f'[[source]]\nsnapshot = "{source}"\n' for source in sources))
    return path


@pytest.mark.parametrize(("sources", "key", "detail"), [
    (["nope@latest"], "source[0].snapshot", "no ref"),
    (["demo@latest", "nope@latest"], "source[1].snapshot", "no ref"),
    (["demo@latest", "sub/dest"], "source[1].snapshot", "sub/dest: no such folder"),
    (["demo@latest", "ffffffffffff"], "source[1].snapshot", "no snapshot id starts with ffffffffffff"),
])
def test_a_mixture_source_that_does_not_resolve_names_the_file_and_key(stored: dict[str, Any], tmp_path: Path,
                                                                       sources: list[str], key: str, detail: str) -> None:
    mix = _mixture(tmp_path, sources)
    with pytest.raises(ConfigError) as caught:
        Reader(mix, SEQ, GLOBAL, store=stored["store"])
    message = str(caught.value)
    assert message.startswith(f"{mix}: {key}: ") and detail in message and "\n" not in message, message


def test_the_cli_names_the_mixture_file_and_key_in_one_line(stored: dict[str, Any], tmp_path: Path) -> None:
    mix = _mixture(tmp_path, ["demo@latest", "nope@latest"])
    result = run_prep("consumed", mix, "--samples", "1", "--seq-len", str(SEQ), "--store", stored["store"],
                      check=False, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"prep: error: {mix}: source[1].snapshot: ") and result.stderr.count("\n") == 1
