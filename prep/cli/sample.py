"""`prep sample [DIR]`: make the built-in sample corpus, tokenizer and pipeline offline."""

from __future__ import annotations

import json
from pathlib import Path

import click

from prep.cli.common import json_option, quiet_option
from prep.progress import note, plural
from prep.sample import DEFAULT_FOLDER, MIN_CHARS, make_sample, pipeline_path, write_pipeline


@click.command()
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_FOLDER)
@click.option("--documents", type=click.IntRange(min=10), default=3000, show_default=True,
              help="Docstrings to take from the standard library (about 5,000 exist).")
@click.option("--vocab-size", type=click.IntRange(min=300), default=4096, show_default=True)
@click.option("--force", is_flag=True, help="Replace a corpus or tokenizer in FOLDER that differs from the sample.")
@quiet_option
@json_option("prep.sample-report/1")
def sample(folder: Path, documents: int, vocab_size: int, force: bool, as_json: bool) -> None:
    """Write FOLDER/corpus.jsonl, FOLDER/tokenizer.json (default: pipelines/sample-data) and, beside
    FOLDER, the pipeline sample.toml that builds them, unless that file exists already. A corpus or
    tokenizer there that differs from the sample (edited, say) is refused unless --force."""
    made = make_sample(folder, documents, vocab_size, force)
    extra = made.records - made.documents
    files = (f"{made.corpus} ({plural(made.documents, 'docstring')}, plus {plural(extra, 'record')} showing dedup "
             f"and special-token handling) and {made.tokenizer}")
    note(f"wrote {files}" if made.written else f"{files} already hold this sample: left as they are")
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
