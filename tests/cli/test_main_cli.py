"""The `prep` group itself: one error line for usage errors too (and a prep.error/1 object with
--json), -h everywhere, top-level help that cuts nothing and imports no command, shell completion,
and read-only commands that refuse, creating nothing, a path that is not a prep store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prep.cli.main import COMMANDS, SUMMARIES, main
from prep.manifest.schema import validate
from tests.helpers import prep_env, run_prep

NOT_A_STORE = "is not a prep store (no prep keys there; `prep init` or `prep build` makes one)"


def run_main(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    """The CLI in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exited:
        main([str(arg) for arg in args])
    captured = capsys.readouterr()
    code = exited.value.code
    return code if isinstance(code, int) else 0, captured.out, captured.err


@pytest.mark.parametrize(("args", "message"), [
    (["diff", "x"], "missing argument 'B' (see prep diff --help)"),
    (["sample", "--documents", "5"], "invalid value for '--documents': 5 is not in the range x>=10 (see prep sample --help)"),
    (["bogus"], "no such command 'bogus' (see prep --help)"),
    (["completion", "tcsh"], "invalid value for 'SHELL': 'tcsh' is not one of 'bash', 'zsh', 'fish' "
                             "(see prep completion --help)"),
])
def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert run_main(capsys, *args) == (2, "", f"prep: error: {message}\n")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_reports_an_unknown_option_in_one_line(capsys: pytest.CaptureFixture[str], name: str) -> None:
    code, out, err = run_main(capsys, name, "--no-such-flag")
    assert (code, out) == (2, "")
    assert err.startswith("prep: error: no such option '--no-such-flag'") and err.count("\n") == 1
    assert err.endswith(f" (see prep {name} --help)\n")


@pytest.mark.parametrize("name", ["", *sorted(COMMANDS)])
def test_dash_h_is_help_everywhere(capsys: pytest.CaptureFixture[str], name: str) -> None:
    code, out, err = run_main(capsys, *([name] if name else []), "-h")
    assert (code, err) == (0, "")
    assert out.startswith(f"Usage: prep {name}".rstrip()) and "-h, --help" in out
    assert "-q, --quiet" in out  # every command takes it, whether or not its module declares it


def test_top_level_help_lists_every_command_whole_and_imports_none() -> None:
    probe = ("import sys\nfrom prep.cli.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
             "print('MODULES', sorted(m for m in sys.modules if m.startswith('prep.cli.')))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=prep_env(), check=True)
    help_text, modules = result.stdout.rsplit("MODULES ", 1)
    rows: dict[str, str] = {}
    for line in help_text.split("Commands:\n", 1)[1].splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            name, rows[name] = line.split(None, 1)
        elif line.strip():  # a summary wrapped (not cut) onto the next line
            rows[name] += " " + line.strip()
    assert sorted(rows) == sorted(COMMANDS)
    for name, summary in rows.items():
        assert "..." not in summary and summary.endswith(".")
        if name in SUMMARIES:
            assert summary == SUMMARIES[name]
    unlisted = {COMMANDS[name].split(":")[0] for name in COMMANDS if name not in SUMMARIES}
    assert set(json.loads(modules.replace("'", '"'))) - unlisted <= {"prep.cli.main", "prep.cli.common"}


def test_bare_prep_prints_the_help() -> None:
    result = run_prep()
    assert result.stdout.startswith("Usage: prep") and "Commands:" in result.stdout


@pytest.mark.parametrize(("shell", "marker"), [
    ("bash", "complete -o nosort -F _prep_completion prep"),
    ("zsh", "#compdef prep"),
    ("fish", "complete --no-files --command prep"),
])
def test_completion_prints_the_shell_script(shell: str, marker: str) -> None:
    script = run_prep("completion", shell).stdout
    assert marker in script and f"_PREP_COMPLETE={shell}_complete" in script


def test_completion_lists_commands_and_options() -> None:
    def complete(*words: str) -> list[str]:
        env = prep_env(_PREP_COMPLETE="bash_complete", COMP_WORDS=" ".join(("prep", *words)),
                       COMP_CWORD=str(len(words)))
        return subprocess.run([sys.executable, "-m", "prep.cli.main"], capture_output=True, text=True, env=env,
                              check=True).stdout.splitlines()

    assert complete("sh") == ["plain,show"] and "plain,sample" in complete("s")
    assert complete("") == [f"plain,{name}" for name in sorted(COMMANDS)]
    assert "plain,--json" in complete("show", "--j") and "plain,--dry-run" in complete("gc", "--d")
    assert complete("completion", "") == ["plain,bash", "plain,zsh", "plain,fish"]


JSON_COMMANDS = {
    "show": ["show", "d@latest"],
    "diff": ["diff", "d@a", "d@b"],
    "verify": ["verify", "d@latest", "{dest}"],
    "gc": ["gc"],
    "consumed": ["consumed", "d@latest", "--samples", "1", "--seq-len", "8"],
}


@pytest.mark.parametrize("name", sorted(JSON_COMMANDS))
def test_json_failures_print_an_error_object(tmp_path: Path, name: str) -> None:
    (tmp_path / "dest").mkdir()
    args = [arg.format(dest=tmp_path / "dest") for arg in JSON_COMMANDS[name]]
    cases: list[tuple[list[str | Path], str, str | None]] = [
             ([*args, "--json", "--store", tmp_path / "absent"], "store", f"{tmp_path / 'absent'} {NOT_A_STORE}"),
             ([*args, "--json", "--bogus"], "usage", None),
             ([name, "--json"] if name != "gc" else [name, "--json", "--grace", "soon"], "usage", None)]
    for argv, kind, message in cases:
        result = run_prep(*argv, check=False, cwd=tmp_path)
        error = json.loads(result.stdout)
        validate(error, "prep.error/1", "error")
        assert result.returncode == error["exit_code"] == 2 and error["kind"] == kind
        assert result.stderr == f"prep: error: {error['error']}\n"
        if message is not None:
            assert error["error"] == message
    plain = run_prep(*args, "--store", tmp_path / "absent", check=False, cwd=tmp_path)
    assert plain.stdout == "" and plain.returncode == 2  # no JSON unless asked for


def test_json_after_a_double_dash_is_an_argument_not_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_main(capsys, "show", "--", "--json")
    assert code == 2 and out == "" and err.startswith("prep: error: ")


READ_ONLY = {
    "show": ["show", "d@latest"],
    "log": ["log", "d"],
    "ls": ["ls"],
    "diff": ["diff", "d@a", "d@b"],
    "trace": ["trace", "d@latest", "doc-1"],
    "verify": ["verify", "d@latest", "{dest}"],
    "pull": ["pull", "d@latest", "{dest}"],
    "pull into a new folder": ["pull", "d@latest", "{dest}/new"],
    "consumed": ["consumed", "d@latest", "--samples", "1", "--seq-len", "8"],
    "gc --dry-run": ["gc", "--dry-run"],
    "gc": ["gc"],
    "fsck": ["fsck"],
    "tag": ["tag", "d@latest", "golden"],
}


def tree(root: Path) -> list[tuple[str, int]]:
    """Every path below `root` with its size (0 for folders), to compare before and after."""
    return sorted((p.relative_to(root).as_posix(), p.stat().st_size if p.is_file() else 0) for p in root.rglob("*"))


@pytest.mark.parametrize("name", sorted(READ_ONLY))
def test_commands_refuse_a_path_that_is_not_a_store_and_create_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.delenv("PREP_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "dest").mkdir()  # verify needs it to exist; nobody may write in it
    (tmp_path / "plain-file").write_text("not a store\n")
    (tmp_path / "other" / "data").mkdir(parents=True)  # a folder with files, but no prep keys
    (tmp_path / "other" / "data" / "x.txt").write_text("x")
    args = [arg.format(dest=tmp_path / "dest") for arg in READ_ONLY[name]]
    for store in ("absent", "empty", "plain-file", "other", "absent/deeper"):
        before = tree(tmp_path)
        code, out, err = run_main(capsys, *args, "--store", store)
        assert (code, out, err) == (2, "", f"prep: error: {store} {NOT_A_STORE}\n")
        assert tree(tmp_path) == before
    before = tree(tmp_path)
    assert run_main(capsys, *args) == (2, "", f"prep: error: ./prep-store {NOT_A_STORE}\n")  # the default store
    assert tree(tmp_path) == before


def test_a_store_made_by_init_or_by_any_prep_key_is_a_store(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREP_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert run_main(capsys, "init", "--store", "made")[0] == 0
    assert run_main(capsys, "ls", "--store", "made") == (0, "", f"no refs in {tmp_path / 'made'}\n")
    old = tmp_path / "old" / "refs" / "d"  # a store from before the marker: known by its layout
    old.mkdir(parents=True)
    (old / "latest.json").write_text("{}")
    code, _, err = run_main(capsys, "ls", "--store", "old")
    assert NOT_A_STORE not in err and not (tmp_path / "old" / "tmp").exists()  # opened (the ref is no valid ref)


def test_init_makes_a_project_its_subfolders_use(tmp_path: Path) -> None:
    env = {key: value for key, value in prep_env().items() if key != "PREP_STORE"}
    made = run_prep("init", env=env, cwd=tmp_path)
    assert made.stderr.startswith(f"wrote {tmp_path / '.prep' / 'config.toml'}: ") and made.stdout == ""
    assert (tmp_path / "prep-store" / "prep-store.json").is_file()
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    listed = run_prep("ls", env=env, cwd=sub)
    assert listed.stderr == f"no refs in {tmp_path / 'prep-store'}\n" and not (sub / "prep-store").exists()
    again = run_prep("init", "--store", "elsewhere", env=env, cwd=tmp_path, check=False)
    assert again.returncode == 2 and again.stderr == (
        f"prep: error: {tmp_path / '.prep' / 'config.toml'} exists already (pass --force to replace it)\n")
    assert not (tmp_path / "elsewhere").exists()
    run_prep("init", "--store", "elsewhere", "--force", env=env, cwd=tmp_path)
    assert run_prep("ls", env=env, cwd=sub).stderr == f"no refs in {tmp_path / 'elsewhere'}\n"
    overridden = run_prep("ls", env={**env, "PREP_STORE": str(tmp_path / "absent")}, cwd=sub, check=False)
    assert overridden.stderr == f"prep: error: {tmp_path / 'absent'} {NOT_A_STORE}\n"


def test_a_broken_project_config_is_one_line(tmp_path: Path) -> None:
    (tmp_path / ".prep").mkdir()
    (tmp_path / ".prep" / "config.toml").write_text('store = "x"\nstores = "y"\n')
    result = run_prep("ls", cwd=tmp_path, env={k: v for k, v in prep_env().items() if k != "PREP_STORE"}, check=False)
    assert result.returncode == 2 and result.stderr == (
        f"prep: error: {tmp_path / '.prep' / 'config.toml'}: unknown key 'stores' (allowed: store)\n")


def test_init_with_an_s3_store_writes_only_the_config(tmp_path: Path, s3_bucket: str) -> None:
    from prep.storage import open_store

    run_prep("init", "--store", f"{s3_bucket}/proj", cwd=tmp_path)
    assert f'store = "{s3_bucket}/proj"' in (tmp_path / ".prep" / "config.toml").read_text()
    assert list(open_store(f"{s3_bucket}/proj").list("")) == []
