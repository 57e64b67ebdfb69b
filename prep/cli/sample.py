"""`prep sample [DIR]`: make the built-in sample corpus, tokenizer and pipeline offline."""

from __future__ import annotations

import json
from pathlib import Path

import click

from prep.cli.common import json_option, quiet_option
from prep.progress import is_quiet, plural
from prep.sample import DEFAULT_FOLDER, MIN_CHARS, make_sample, pipeline_path, write_pipeline


def note(message: str) -> None:
    """A line on stderr unless --quiet."""
    if not is_quiet():
        click.echo(message, err=True)


@click.command()
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_FOLDER)
@click.option("--documents", type=click.IntRange(min=10), default=3000, show_default=True,
              help="Docstrings to take from the standard library (about 5,000 exist).")
@click.option("--vocab-size", type=click.IntRange(min=300), default=4096, show_default=True)
@quiet_option
@json_option("prep.sample-report/1")
def sample(folder: Path, documents: int, vocab_size: int, as_json: bool) -> None:
    """Write FOLDER/corpus.jsonl, FOLDER/tokenizer.json (default: pipelines/sample-data) and, beside
    FOLDER, the pipeline sample.toml that builds them, unless that file exists already."""
    made = make_sample(folder, documents, vocab_size)
    extra = made.records - made.documents
    note(f"wrote {made.corpus} ({plural(made.documents, 'docstring')}, plus {plural(extra, 'record')} showing dedup and "
         f"special-token handling) and {made.tokenizer}")
    shortfall = None
    if made.documents < documents:
        shortfall = (f"{documents} documents were asked for, but this Python's standard library has only "
                     f"{made.documents} docstrings of {MIN_CHARS}+ characters")
        note(f"note: {shortfall}")
    pipeline = write_pipeline(folder)
    if as_json:
        click.echo(json.dumps({"schema": "prep.sample-report/1", "corpus": str(made.corpus),
                               "tokenizer": str(made.tokenizer), "pipeline": str(pipeline or pipeline_path(folder)),
                               "pipeline_written": pipeline is not None, "documents": made.documents,
                               "documents_asked": documents, "records": made.records, "shortfall": shortfall}))
    if pipeline is not None:
        note(f"wrote {pipeline}: build it with `prep build {pipeline}`")
    else:
        note(f"kept the existing {pipeline_path(folder)}: build it with `prep build {pipeline_path(folder)}`")
