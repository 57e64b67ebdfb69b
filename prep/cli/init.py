"""`prep init [--store URL]`: make the working directory a prep project naming its store."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from prep.cli.common import json_option, quiet_option
from prep.errors import UsageError
from prep.progress import note
from prep.project import DEFAULT_PROJECT_STORE, config_path, write_config
from prep.storage import open_store
from prep.store.marker import mark


@click.command()
@click.option("--store", "store_url", default=DEFAULT_PROJECT_STORE, show_default=True, metavar="URL",
              help="The project's store: a path (relative to this folder) or s3://bucket/prefix.")
@click.option("--force", is_flag=True, help="Replace an existing .prep/config.toml.")
@quiet_option
@json_option("prep.init-report/1")
def init(store_url: str, force: bool, as_json: bool) -> None:
    """Write .prep/config.toml here, so prep commands run in this folder or below use STORE without
    --store; a local store is created (an S3 one is left untouched until the first build)."""
    folder = Path.cwd()
    path = config_path(folder)
    if path.exists() and not force:
        raise UsageError(f"{path} exists already (pass --force to replace it)")
    local = "://" not in store_url
    if local:
        mark(open_store(store_url, base=folder))  # create the store first: a failure writes no config
    write_config(folder, store_url, force)
    if as_json:
        click.echo(json.dumps({"schema": "prep.init-report/1", "config": str(path), "store": store_url,
                               "store_created": local, "overridden_by_env": os.environ.get("PREP_STORE") or None}))
    note(f"wrote {path}: commands in {folder} and below use the store {store_url}")
    if os.environ.get("PREP_STORE"):
        click.echo(f"note: $PREP_STORE ({os.environ['PREP_STORE']}) is set and overrides it", err=True)
