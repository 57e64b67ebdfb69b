"""`prep sample DIR`: make the built-in sample corpus and tokenizer offline."""

from __future__ import annotations

from pathlib import Path

import click

from prep.sample import make_sample


@click.command()
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path), default=Path("pipelines/sample-data"))
@click.option("--documents", type=click.IntRange(min=10), default=3000, show_default=True)
@click.option("--vocab-size", type=click.IntRange(min=300), default=4096, show_default=True)
def sample(folder: Path, documents: int, vocab_size: int) -> None:
    """Write FOLDER/corpus.jsonl and FOLDER/tokenizer.json (default: pipelines/sample-data)."""
    corpus, tokenizer = make_sample(folder, documents, vocab_size)
    click.echo(f"wrote {corpus} and {tokenizer}", err=True)
