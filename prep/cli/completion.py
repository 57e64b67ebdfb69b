"""`prep completion bash|zsh|fish`: print click's completion script for the shell."""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

SHELLS = ("bash", "zsh", "fish")


@click.command()
@click.argument("shell", type=click.Choice(SHELLS), metavar="SHELL")
def completion(shell: str) -> None:
    """Print the completion script for SHELL; e.g. `eval "$(prep completion bash)"` in ~/.bashrc."""
    from prep.cli.main import cli  # the group this script completes (main imports this module lazily)

    completer = get_completion_class(shell)
    assert completer is not None  # click ships all three
    click.echo(completer(cli, {}, "prep", "_PREP_COMPLETE").source())
