"""Options and helpers shared by the CLI commands."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from prep import progress
from prep.project import DEFAULT_STORE, store_url
from prep.storage import open_store
from prep.storage.backend import Store
from prep.store.marker import open_existing

F = TypeVar("F", bound=Callable[..., Any])


def store_option(function: F) -> F:
    """--store URL (default: $PREP_STORE, the project config, then ./prep-store)."""
    return click.option("--store", "store_url", default=None, metavar="URL",
                        help="Store location: a path or s3://bucket/prefix. Default: $PREP_STORE, else the "
                             "store a .prep/config.toml here or in a parent folder names (`prep init` writes one), "
                             f"else (build, status) the pipeline's `store`, else {DEFAULT_STORE}.")(function)


def _set_quiet(_ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """Silence progress for the rest of the process (an option of the group and of commands)."""
    if value:
        progress.set_quiet(True)


def quiet_option(function: F) -> F:
    """-q/--quiet: no progress on stderr (errors still print). Needs no parameter in the callback."""
    return click.option("-q", "--quiet", is_flag=True, expose_value=False, is_eager=True, callback=_set_quiet,
                        help="Print no progress on stderr (errors still print).")(function)


def json_option(schema_id: str) -> Callable[[F], F]:
    """--json (parameter `as_json`): print a `schema_id` document on stdout; a failure then prints a
    prep.error/1 object there instead (prep/cli/main.py), with the same exit code."""
    return click.option("--json", "as_json", is_flag=True,
                        help=f"Print a {schema_id} JSON document on stdout (on failure a prep.error/1 one).")


_REPORT_PRINTED = [False]


def echo_json(document: Any, indent: int | None = None, sort_keys: bool = False) -> None:
    """Print a command's JSON report on stdout; a failure after it (verify finding problems) then
    prints only its stderr line, so stdout stays one JSON document."""
    click.echo(json.dumps(document, indent=indent, sort_keys=sort_keys, ensure_ascii=False))
    _REPORT_PRINTED[0] = True


def report_printed(reset: bool = False) -> bool:
    """Whether this run already printed its JSON report (main() resets it per run)."""
    printed = _REPORT_PRINTED[0]
    if reset:
        _REPORT_PRINTED[0] = False
    return printed


def resolve_store_url(option: str | None, pipeline_store: str | None = None) -> str:
    """--store, then $PREP_STORE, then the project config found above the working directory,
    then the pipeline file's `store` (build only), then ./prep-store (prep.project.store_url, which
    prep.data.Reader follows too)."""
    return store_url(option, pipeline_store)


def open_store_option(option: str | None) -> Store:
    """The store a reading command names; `prep: error: URL is not a prep store` (exit 2), with
    nothing created, when it is none."""
    return open_existing(resolve_store_url(option))


def open_store_for_writing(option: str | None, pipeline_store: str | None = None) -> Store:
    """The store a writing command (build) names, created on its first write if it is new."""
    return open_store(resolve_store_url(option, pipeline_store))
