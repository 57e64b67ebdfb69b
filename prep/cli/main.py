"""The `prep` command: a lazy click group, so each command imports only what it needs, and the one
error format: `prep: error: <one line>` on stderr (and, with --json, a prep.error/1 object on stdout)."""

from __future__ import annotations

import contextlib
import difflib
import importlib
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

import click

from prep import progress
from prep.cli.common import quiet_option, report_printed
from prep.errors import PrepError, StorageIOError

# command name -> "module:attribute"; modules are imported only when their command runs.
COMMANDS: dict[str, str] = {
    "build": "prep.cli.build:build",
    "rebuild": "prep.cli.build:rebuild",
    "show": "prep.cli.show:show",
    "log": "prep.cli.show:log",
    "pull": "prep.cli.transfer:pull",
    "verify": "prep.cli.transfer:verify",
    "copy": "prep.cli.transfer:copy_command",
    "diff": "prep.cli.history:diff",
    "tag": "prep.cli.history:tag",
    "ls": "prep.cli.history:ls",
    "trace": "prep.cli.history:trace",
    "redact": "prep.cli.deletion:redact",
    "status": "prep.cli.status:status",
    "gc": "prep.cli.store:gc",
    "fsck": "prep.cli.store:fsck_command",
    "hold": "prep.cli.store:hold",
    "release": "prep.cli.store:release",
    "sample": "prep.cli.sample:sample",
    "consumed": "prep.cli.data:consumed",
    "drill": "prep.cli.data:drill",
    "init": "prep.cli.init:init",
    "completion": "prep.cli.completion:completion",
}


# The one-line summaries `prep --help` lists, so it imports no command module and cuts none; a
# command missing here is imported for its own short help.
SUMMARIES: dict[str, str] = {
    "build": "Build a pipeline into the store and publish a snapshot.",
    "rebuild": "Build a snapshot again from its store and prove the same id.",
    "show": "Summarize a snapshot, or print its manifest.",
    "log": "The snapshots a dataset's refs pointed to, newest first.",
    "pull": "Copy a snapshot's files to a folder, verifying them.",
    "verify": "Prove a folder holds exactly a snapshot's bytes.",
    "copy": "Copy a snapshot to another store, proving every object.",
    "diff": "What changed between two snapshots, and why.",
    "tag": "Point DATASET@NAME at a snapshot.",
    "ls": "List datasets and their refs.",
    "trace": "Where a document landed in a snapshot's shards.",
    "redact": "What of a dataset still holds a deletion request's documents.",
    "status": "What a build would run and reuse, without running it.",
    "gc": "Delete what no retention rule keeps, past a grace period.",
    "fsck": "Re-hash everything the store's refs and records reach.",
    "hold": "Keep a snapshot from garbage collection.",
    "release": "Let garbage collection collect a held snapshot again.",
    "sample": "Write the sample corpus, tokenizer and pipeline.",
    "consumed": "Which documents a training run's first N samples read.",
    "drill": "A load drill: ranks read a source through one node cache.",
    "init": "Make this folder a project that names its store.",
    "completion": "Print the shell completion script (bash, zsh, fish).",
}
EXIT_STDOUT_CLOSED = 128 + signal.SIGPIPE  # 141, as a shell reports a command SIGPIPE killed
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class LazyGroup(click.Group):
    """A group whose commands are imported only when run; each gets -q/--quiet if it lacks it."""

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
        if not any(param.name == "quiet" for param in command.params):
            quiet_option(command)
        return command

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        """click's, with the closest command suggested for an unknown name (`prep biuld`)."""
        name = args[0] if args else ""
        if name not in COMMANDS and not name.startswith("-") and not ctx.resilient_parsing:
            close = difflib.get_close_matches(name, sorted(COMMANDS), n=1)
            raise click.UsageError(f"no such command {name!r}" + (f"; did you mean {close[0]!r}?" if close else ""), ctx)
        return super().resolve_command(ctx, args)

    def summary(self, ctx: click.Context, name: str) -> str:
        """The command's one-line summary, from SUMMARIES or else its own (uncut) short help."""
        if name in SUMMARIES:
            return SUMMARIES[name]
        command = self.get_command(ctx, name)
        return command.get_short_help_str(limit=200) if command is not None else ""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The Commands section of `prep --help`: every command with its whole summary."""
        with formatter.section("Commands"):
            formatter.write_dl([(name, self.summary(ctx, name)) for name in self.list_commands(ctx)])

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[Any]:
        """Command names with their summaries, importing no command module."""
        from click.shell_completion import CompletionItem

        names = [name for name in self.list_commands(ctx) if name.startswith(incomplete)]
        options = [item for item in super().shell_complete(ctx, incomplete) if item.type != "plain"]
        return [CompletionItem(name, help=self.summary(ctx, name)) for name in names] + options


@click.group(cls=LazyGroup, context_settings=CONTEXT)
@click.version_option(package_name="prep")
@quiet_option
def cli() -> None:
    """Turn raw text corpora into training-ready, versioned, verifiable datasets."""


def os_error_message(exc: OSError) -> str:
    """One line for an OSError that reached the CLI: the operation and path(s) it names, and why."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename is None:
        return f"I/O error: {reason}"
    paths = f"{exc.filename}" + (f" -> {exc.filename2}" if exc.filename2 is not None else "")
    return f"accessing {paths}: {reason}"


def wants_json(args: Sequence[str]) -> bool:
    """Whether the command line asks for --json (before any `--`), read from argv itself so even a
    usage error that stops parsing answers in JSON."""
    for arg in args:
        if arg == "--":
            return False
        if arg == "--json":
            return True
    return False


def usage_message(exc: click.UsageError) -> str:
    """click's message on one line, lower-cased like prep's own, with a pointer to the help."""
    text = " ".join(exc.format_message().split()).rstrip(".")
    if len(text) > 1 and text[0].isupper() and text[1].islower():
        text = text[0].lower() + text[1:]
    path = exc.ctx.command_path if exc.ctx is not None else "prep"
    return f"{text} (see {path} --help)"


def error_kind(exc: BaseException) -> str:
    """`config` for ConfigError, `storage_io` for StorageIOError: the kind a JSON error names."""
    name = type(exc).__name__.removesuffix("Error") or "prep"
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def fail(message: str, exit_code: int, kind: str, as_json: bool) -> NoReturn:
    """Print the one error line (and the JSON error object) and exit with `exit_code`."""
    progress.end_line()
    # Hazard: stderr or stdout may be what failed (a full disk, a closed pipe); the exit code stays.
    progress.write(sys.stderr, f"prep: error: {message}\n")
    if as_json and not report_printed():
        with contextlib.suppress(OSError, ValueError):
            click.echo(json.dumps({"schema": "prep.error/1", "error": message, "exit_code": exit_code, "kind": kind}))
            sys.stdout.flush()
    sys.exit(exit_code)


def _exit_flushed(code: int) -> NoReturn:
    """Exit with `code` once stdout is flushed; a reader that closed it early (`| head`) makes it
    EXIT_STDOUT_CLOSED, silently, not a traceback at shutdown nor a code that means a mismatch."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _exit_stdout_closed()
    sys.exit(code)


def _exit_stdout_closed() -> NoReturn:
    """Exit EXIT_STDOUT_CLOSED with stdout's descriptor on /dev/null, so the interpreter's last
    flush has nowhere to fail."""
    with contextlib.suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    sys.exit(EXIT_STDOUT_CLOSED)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's stop, `kill`): unwound like Ctrl-C, so running tasks remove their
    partial files and the workers are shut down rather than orphaned."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


def main(args: Sequence[str] | None = None) -> None:
    """Entry point: run the CLI and turn every error into one line and its exit code."""
    argv = list(sys.argv[1:] if args is None else args)
    as_json = wants_json(argv)
    progress.set_quiet(False)  # set by -q/--quiet while parsing; a second main() in one process starts afresh
    report_printed(reset=True)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    stdout = sys.stdout
    try:
        code = cli.main(args=argv, prog_name="prep", standalone_mode=False)
    except SystemExit as exc:
        # click answers a write to a closed stdout (EPIPE) by swapping sys.stdout and exiting 1,
        # which is `verify`'s and `diff`'s "differences found".
        if exc.code == 1 and sys.stdout is not stdout:
            _exit_stdout_closed()
        raise
    except PrepError as exc:
        fail(" ".join(exc.message.splitlines()), exc.exit_code, error_kind(exc), as_json)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.NoArgsIsHelpError as exc:  # bare `prep`: the help, as `prep --help` gives it
        click.echo(exc.ctx.get_help() if exc.ctx is not None else cli.get_help(click.Context(cli)))
        sys.exit(0)
    except click.UsageError as exc:
        fail(usage_message(exc), exc.exit_code, "usage", as_json)
    except click.ClickException as exc:
        fail(" ".join(exc.format_message().split()), exc.exit_code, "error", as_json)
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:  # click turns an interrupt into Abort
        if isinstance(exc, Terminated) or isinstance(exc.__cause__, Terminated):
            fail("terminated (SIGTERM)", 128 + signal.SIGTERM, "interrupted", as_json)
        fail("interrupted", 130, "interrupted", as_json)
    except OSError as exc:  # last resort: an I/O error no layer below named is still one line
        fail(os_error_message(exc), StorageIOError.exit_code, "storage_io", as_json)
    # Without standalone mode click returns a command's ctx.exit(code) instead of exiting.
    _exit_flushed(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
