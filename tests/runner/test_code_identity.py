"""Every task carries the driver's code identity, and a worker running other code refuses it
(issue 16), so its bytes are never committed under this code's keys. The Ray case is in test_ray.py."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import prep
from prep.code import code_identity, describe_code
from prep.errors import ForeignCodeError
from prep.runner.executors.pool import LocalExecutor
from prep.runner.tasks import CodeChecked, check_code
from tests.helpers import make_records, prep_env, write_jsonl, write_pipeline

REPO = Path(__file__).resolve().parents[2]
FOREIGN_EXIT = 5  # ForeignCodeError.exit_code

# The driver computes its identity, then the package on disk changes (an upgrade landing while a
# build runs): the pool's spawned workers import, and hash, the changed code.
UPGRADE_THEN_BUILD = """
import sys
from pathlib import Path
import prep
from prep.code import code_identity
print(code_identity()["sha256"], file=sys.stderr)
shard = Path(prep.__file__).parent / "stages" / "shard.py"
shard.write_text(shard.read_text() + "\\n# upgraded while the build ran\\n")
from prep.cli.main import main
sys.argv = ["prep", *sys.argv[1:]]
main()
"""


def package_copy(folder: Path) -> Path:
    """A copy of prep's source (and its schemas) to put first on PYTHONPATH."""
    shutil.copytree(REPO / "prep", folder / "prep", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "manifests", folder / "manifests")
    return folder


def double(value: int) -> int:
    return value * 2


def test_a_task_runs_when_the_identities_match() -> None:
    assert CodeChecked(double, code_identity())(21) == 42
    check_code(code_identity())


def test_another_identity_is_refused_naming_both_and_the_host() -> None:
    other = {**code_identity(), "sha256": "0" * 64}
    with pytest.raises(ForeignCodeError) as caught:
        CodeChecked(double, other)(21)
    message = str(caught.value)
    assert caught.value.exit_code == FOREIGN_EXIT
    assert describe_code(other) in message and describe_code(code_identity()) in message
    assert socket.gethostname() in message


def test_a_pool_worker_refuses_a_driver_of_other_code() -> None:
    """The refusal crosses the process boundary as itself (a one-line error, not a broken pool)."""
    other = {**code_identity(), "dependencies": {"tokenizers": "0.0.1"}}
    pool = LocalExecutor(1)
    try:
        with pytest.raises(ForeignCodeError, match="tokenizers 0.0.1"):
            list(pool.run(CodeChecked(double, other), [1, 2]))
    finally:
        pool.close()


def test_local_workers_running_upgraded_code_refuse_and_no_ref_moves(tmp_path: Path, tokenizer_path: Path) -> None:
    copy = package_copy(tmp_path / "copy")
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(30, seed=1))
    pipeline = write_pipeline(tmp_path, tokenizer_path)
    store = tmp_path / "store"
    ran = subprocess.run([sys.executable, "-c", UPGRADE_THEN_BUILD, "build", str(pipeline), "--store", str(store),
                          "--workers", "1"], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                         env=prep_env(PYTHONPATH=str(copy)))
    driver = ran.stderr.splitlines()[0]
    last = ran.stderr.splitlines()[-1]
    assert ran.returncode == FOREIGN_EXIT, ran.stderr
    assert last.startswith("prep: error: worker on host ") and "refuses the task" in last
    assert f"the driver prep {prep.__version__} (source sha256 {driver[:12]}" in last
    assert "Traceback" not in ran.stderr
    assert not (store / "refs").exists() and not list(store.glob("tasks/*/*.json")) and not list(store.glob("packs/*/*/*.json"))
