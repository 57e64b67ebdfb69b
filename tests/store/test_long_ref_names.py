"""A ref name too long for a file name (300 characters) is an invalid ref name (exit 2) wherever a
SNAP or a tag is given, never the working folder's `File name too long` (exit 4) from checking
whether a file of that name is there."""

from __future__ import annotations

from pathlib import Path

import pytest

from prep.cli.main import main
from prep.storage import LocalStore
from tests.snapshot_factory import build_snapshot

LONG = "a" * 300


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    build_snapshot(LocalStore(tmp_path / "store"), tmp_path / "work", dataset="ds")
    return tmp_path / "store"


@pytest.mark.parametrize("args", [
    ["show", f"ds@{LONG}"],
    ["tag", f"ds@{LONG}", "v1"], ["tag", f"ds@{LONG}~1", "v1"], ["diff", f"ds@{LONG}", "ds@latest"],
    ["hold", f"ds@{LONG}"]])
def test_a_ref_name_too_long_for_a_file_name_is_an_invalid_ref_name(
        store: Path, args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Regression: `Path(spec).is_file()`, asking whether SNAP named a manifest file, raised
    ENAMETOOLONG: `prep: error: accessing ds@aaa...: File name too long`, exit 4."""
    with pytest.raises(SystemExit) as exited:
        main([*args, "--store", str(store)])
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    assert err.startswith(f"prep: error: invalid ref name '{LONG}': ") and err.count("\n") == 1
