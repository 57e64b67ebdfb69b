"""`prep completion bash|zsh|fish`: print click's completion script for the shell."""

from __future__ import annotations

import json

import click
from click.shell_completion import get_completion_class

from prep.cli.common import json_option

SHELLS = ("bash", "zsh", "fish")


@click.command()
@click.argument("shell", type=click.Choice(SHELLS), metavar="SHELL")
@json_option("prep.completion/1")
def completion(shell: str, as_json: bool) -> None:
    """Print the completion script for SHELL; e.g. `eval "$(prep completion bash)"` in ~/.bashrc."""
    from prep.cli.main import cli  # the group this script completes (main imports this module lazily)

    completer = get_completion_class(shell)
    assert completer is not None  # click ships all three
    script = completer(cli, {}, "prep", "_PREP_COMPLETE").source()
    click.echo(json.dumps({"schema": "prep.completion/1", "shell": shell, "script": script}) if as_json else script)
