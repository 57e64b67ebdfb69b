"""The project config `.prep/config.toml`: which store the commands run below a folder use.

Like git and DVC, a command finds it by walking up from the working directory to the filesystem
root; the first `.prep/config.toml` found wins. A relative local store path in it is relative to
the project folder (the one holding `.prep/`), so every subfolder names the same store.
"""

from __future__ import annotations

import json
import os
import threading
import tomllib
from dataclasses import dataclass
from pathlib import Path

from prep.errors import ConfigError, UsageError

CONFIG_DIR = ".prep"
CONFIG_NAME = "config.toml"
DEFAULT_PROJECT_STORE = "prep-store"
DEFAULT_STORE = "./prep-store"  # the store when no option, $PREP_STORE, project or pipeline names one
_KEYS = ("store",)


@dataclass(frozen=True)
class Project:
    """A found project: its folder, its config file and the store URL as the file spells it."""

    root: Path
    config_path: Path
    store: str

    @property
    def store_url(self) -> str:
        """The store URL with a relative local path made absolute against the project folder."""
        if "://" in self.store or Path(self.store).expanduser().is_absolute():
            return self.store
        return str(self.root / self.store)


def config_path(folder: Path) -> Path:
    """Where the project config of `folder` lives: folder/.prep/config.toml."""
    return folder / CONFIG_DIR / CONFIG_NAME


def find_config(start: Path) -> Path | None:
    """The first .prep/config.toml in `start` or one of its parents, or None."""
    folder = start.absolute()
    for candidate in (folder, *folder.parents):
        path = config_path(candidate)
        if path.is_file():
            return path
    return None


def load_project(path: Path) -> Project:
    """Parse a project config strictly: a string `store` is required and no other key is allowed."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the project config: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    unknown = sorted(set(data) - set(_KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r} (allowed: {', '.join(_KEYS)})")
    store = data.get("store")
    if not isinstance(store, str) or not store:
        raise ConfigError(f"{path}: `store` must be a non-empty string (a path or s3://bucket/prefix)")
    return Project(root=path.parent.parent, config_path=path, store=store)


def find_project(start: Path | None = None) -> Project | None:
    """The project the working directory (or `start`) is in, or None outside any project."""
    path = find_config(start if start is not None else Path.cwd())
    return load_project(path) if path is not None else None


def store_url(option: str | None = None, pipeline_store: str | None = None) -> str:
    """Which store to use: `option` (--store, Reader's store=), then $PREP_STORE, then the project
    config found above the working directory, then the pipeline file's `store` (build only), then ./prep-store."""
    if option:
        return option
    if os.environ.get("PREP_STORE"):
        return os.environ["PREP_STORE"]
    project = find_project()
    if project is not None:
        return project.store_url
    return pipeline_store or DEFAULT_STORE


def config_text(store: str) -> str:
    """The body of a project config naming `store`."""
    quoted = json.dumps(store, ensure_ascii=False)  # a JSON string is a valid TOML basic string
    return ("# The store prep commands use below this folder (a relative path is relative to it);\n"
            "# --store and $PREP_STORE override it. Written by `prep init`.\n"
            f"store = {quoted}\n")


def write_config(folder: Path, store: str, force: bool = False) -> Path:
    """Write folder/.prep/config.toml atomically; refuses to replace one unless `force` (create-only
    by a hard link, so of two `prep init` at once one wins and the other is refused)."""
    path = config_path(folder)
    refused = UsageError(f"{path} exists already (pass --force to replace it)")
    if path.exists() and not force:
        raise refused
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f"{CONFIG_NAME}.{os.getpid()}.{threading.get_ident()}.part")
    try:
        temp.write_text(config_text(store), encoding="utf-8")
        if force:
            temp.replace(path)
        else:
            try:
                os.link(temp, path)
            except FileExistsError:
                raise refused from None
    finally:
        temp.unlink(missing_ok=True)
    return path
