"""`prep sample [DIR]`: make the built-in sample corpus, tokenizer and pipeline offline."""

from __future__ import annotations

from pathlib import Path

import click

from prep.sample import DEFAULT_FOLDER, make_sample, pipeline_path, write_pipeline


@click.command()
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_FOLDER)
@click.option("--documents", type=click.IntRange(min=10), default=3000, show_default=True)
@click.option("--vocab-size", type=click.IntRange(min=300), default=4096, show_default=True)
def sample(folder: Path, documents: int, vocab_size: int) -> None:
    """Write FOLDER/corpus.jsonl, FOLDER/tokenizer.json (default: pipelines/sample-data) and, beside
    FOLDER, the pipeline sample.toml that builds them, unless that file exists already."""
    corpus, tokenizer = make_sample(folder, documents, vocab_size)
    click.echo(f"wrote {corpus} and {tokenizer}", err=True)
    pipeline = write_pipeline(folder)
    if pipeline is not None:
        click.echo(f"wrote {pipeline}: build it with `prep build {pipeline}`", err=True)
    else:
        click.echo(f"kept the existing {pipeline_path(folder)}: build it with `prep build {pipeline_path(folder)}`", err=True)
