"""Project discovery: .prep/config.toml found by walking up, parsed strictly, its store relative to
the project folder; and the store precedence --store, $PREP_STORE, project, pipeline, ./prep-store."""

from __future__ import annotations

from pathlib import Path

import pytest

from prep.cli.common import resolve_store_url
from prep.errors import ConfigError, UsageError
from prep.project import DEFAULT_STORE, config_path, config_text, find_config, find_project, load_project, write_config


def test_found_from_any_subfolder_and_relative_to_the_project(tmp_path: Path) -> None:
    write_config(tmp_path, "stores/main")
    deep = tmp_path / "a" / "b" / "c"
    deep.mkdir(parents=True)
    project = find_project(deep)
    assert project is not None and project.root == tmp_path and project.config_path == config_path(tmp_path)
    assert project.store == "stores/main" and project.store_url == str(tmp_path / "stores" / "main")
    nested = tmp_path / "a"
    write_config(nested, "s3://bucket/prefix")
    inner = find_project(deep)
    assert inner is not None and inner.root == nested and inner.store_url == "s3://bucket/prefix"  # nearest wins


def test_absent_up_to_the_filesystem_root(tmp_path: Path) -> None:
    (tmp_path / ".prep").mkdir()  # a pulled folder's .prep/ holds a manifest, not a config
    (tmp_path / ".prep" / "manifest.json").write_text("{}")
    assert find_config(tmp_path) is None and find_project(tmp_path) is None


@pytest.mark.parametrize("store", ["/abs/store", "with \"quotes\" and \\ backslash", "dé/ünïcode", "~/x"])
def test_any_store_spelling_round_trips(tmp_path: Path, store: str) -> None:
    write_config(tmp_path, store)
    assert load_project(config_path(tmp_path)).store == store
    assert config_text(store).endswith("\n")


@pytest.mark.parametrize(("body", "message"), [
    ('store = "a"\nremote = "b"\n', "unknown key 'remote' (allowed: store)"),
    ("store = 3\n", "`store` must be a non-empty string"),
    ('store = ""\n', "`store` must be a non-empty string"),
    ("", "`store` must be a non-empty string"),
    ("store = \n", "not valid TOML"),
    ("store = \"\xff\"\n", "cannot read the project config"),
])
def test_a_bad_config_is_one_error_naming_the_file(tmp_path: Path, body: str, message: str) -> None:
    path = config_path(tmp_path)
    path.parent.mkdir()
    path.write_bytes(body.encode("latin-1"))
    with pytest.raises(ConfigError) as caught:
        find_project(tmp_path)
    assert caught.value.message.startswith(f"{path}: ") and message in caught.value.message


def test_write_refuses_to_replace_unless_forced(tmp_path: Path) -> None:
    write_config(tmp_path, "one")
    with pytest.raises(UsageError, match="exists already"):
        write_config(tmp_path, "two")
    assert load_project(config_path(tmp_path)).store == "one"
    write_config(tmp_path, "two", force=True)
    assert load_project(config_path(tmp_path)).store == "two"
    assert sorted(p.name for p in (tmp_path / ".prep").iterdir()) == ["config.toml"]  # no temporary left


def test_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PREP_STORE", raising=False)
    assert resolve_store_url(None) == DEFAULT_STORE
    assert resolve_store_url(None, "/from/pipeline") == "/from/pipeline"
    write_config(tmp_path, "project-store")
    monkeypatch.chdir(tmp_path / ".prep")  # any folder below the project
    assert resolve_store_url(None, "/from/pipeline") == str(tmp_path / "project-store")
    monkeypatch.setenv("PREP_STORE", "/from/env")
    assert resolve_store_url(None, "/from/pipeline") == "/from/env"
    assert resolve_store_url("/from/option", "/from/pipeline") == "/from/option"


def test_two_inits_at_once_one_wins(tmp_path: Path) -> None:
    """Create-only: many writers racing for one folder leave exactly one config, whole, and refuse the rest."""
    from concurrent.futures import ThreadPoolExecutor

    def attempt(index: int) -> str:
        try:
            write_config(tmp_path, f"store-{index}")
            return "won"
        except UsageError:
            return "refused"

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(attempt, range(32)))
    assert outcomes.count("won") == 1
    winner = outcomes.index("won")
    assert load_project(config_path(tmp_path)).store == f"store-{winner}"
    assert sorted(p.name for p in (tmp_path / ".prep").iterdir()) == ["config.toml"]
