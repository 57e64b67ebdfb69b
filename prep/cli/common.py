"""Options and helpers shared by the CLI commands."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from prep.storage import open_store
from prep.storage.base import Store

DEFAULT_STORE = "./prep-store"
F = TypeVar("F", bound=Callable[..., Any])


def store_option(function: F) -> F:
    """--store URL (default: $PREP_STORE, then ./prep-store)."""
    return click.option("--store", "store_url", default=None, metavar="URL",
                        help=f"Store location: a path or s3://bucket/prefix. Default: $PREP_STORE or {DEFAULT_STORE}.")(function)


def resolve_store_url(option: str | None, pipeline_store: str | None = None) -> str:
    """--store beats $PREP_STORE, which beats the pipeline file's `store`, then the default."""
    return option or os.environ.get("PREP_STORE") or pipeline_store or DEFAULT_STORE


def open_store_option(option: str | None) -> Store:
    return open_store(resolve_store_url(option))
