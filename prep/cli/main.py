"""The `prep` command: a lazy click group, so each command imports only what it needs."""

from __future__ import annotations

import importlib
import sys

import click

from prep.errors import PrepError, StorageIOError

# command name -> "module:attribute"; modules are imported only when their command runs.
COMMANDS: dict[str, str] = {
    "build": "prep.cli.build:build",
    "show": "prep.cli.show:show",
    "log": "prep.cli.show:log",
    "pull": "prep.cli.transfer:pull",
    "verify": "prep.cli.transfer:verify",
    "diff": "prep.cli.history:diff",
    "tag": "prep.cli.history:tag",
    "ls": "prep.cli.history:ls",
    "trace": "prep.cli.history:trace",
    "gc": "prep.cli.history:gc",
    "sample": "prep.cli.sample:sample",
    "consumed": "prep.cli.data:consumed",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                return None
            raise
        command = getattr(module, attribute)
        assert isinstance(command, click.Command)
        return command


@click.group(cls=LazyGroup)
@click.version_option(package_name="prep")
def cli() -> None:
    """Turn raw text corpora into training-ready, versioned, verifiable datasets."""


def os_error_message(exc: OSError) -> str:
    """One line for an OSError that reached the CLI: the operation and path(s) it names, and why."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename is None:
        return f"I/O error: {reason}"
    paths = f"{exc.filename}" + (f" -> {exc.filename2}" if exc.filename2 is not None else "")
    return f"accessing {paths}: {reason}"


def main() -> None:
    """Entry point: run the CLI and turn prep errors into one-line messages and exit codes."""
    try:
        code = cli.main(standalone_mode=False)
    except PrepError as exc:
        click.echo(f"prep: error: {exc.message}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:  # usage errors: click prints them, exit 2
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("prep: aborted", err=True)
        sys.exit(130)
    except KeyboardInterrupt:
        click.echo("prep: interrupted", err=True)
        sys.exit(130)
    except OSError as exc:  # last resort: an I/O error no layer below named is still one line
        click.echo(f"prep: error: {os_error_message(exc)}", err=True)
        sys.exit(StorageIOError.exit_code)
    # Without standalone mode click returns a command's ctx.exit(code) instead of exiting.
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
