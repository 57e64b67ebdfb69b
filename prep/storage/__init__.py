"""Store backends and the one registry that maps a store URL to a backend."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from prep.errors import StoreError
from prep.storage.backend import ObjectInfo, RefValue, Store
from prep.storage.local import LocalStore

__all__ = ["ObjectInfo", "RefValue", "Store", "LocalStore", "open_store", "register_scheme"]

_SCHEMES: dict[str, Callable[[str], Store]] = {}


def register_scheme(scheme: str, factory: Callable[[str], Store]) -> None:
    """Make `scheme://...` URLs open with `factory(url)`."""
    _SCHEMES[scheme] = factory


def _open_s3(url: str) -> Store:
    from prep.storage.s3 import S3Store  # boto3 is an optional extra

    return S3Store.from_url(url)


register_scheme("s3", _open_s3)


def open_store(url: str | Path, base: Path | None = None) -> Store:
    """Open the store at `url`: a local path (relative to `base`) or a registered scheme."""
    text = os.fspath(url)
    if "://" in text:
        scheme = text.split("://", 1)[0]
        factory = _SCHEMES.get(scheme)
        if factory is None:
            raise StoreError(f"unsupported store URL scheme {scheme!r} in {text!r}")
        return factory(text)
    path = Path(text).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    return LocalStore(path)
