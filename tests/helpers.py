"""Shared test helpers: small corpora, pipelines, and running the real `prep` CLI."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
         "sigma tau upsilon phi chi psi omega data shard token corpus train model loss step batch "
         "größe naïve café 数据 トークン данные 🙂").split()


def random_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)) + rng.choice([".", "!", "?", "\n"])


def make_records(count: int, seed: int = 0, prefix: str = "doc") -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"id": f"{prefix}-{i}", "text": random_text(rng, rng.randint(3, 60))} for i in range(count)]


def write_jsonl(path: Path, records: Iterable[Mapping[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def write_pipeline(folder: Path, tokenizer: Path, paths: list[str] | None = None, *, dataset: str = "tiny",
                   seed: int = 1234, id_field: str | None = "id", shard_size: str = "4KB",
                   backend: str = "tokenizers", extra_input: str = "", extra: str = "",
                   name: str = "pipeline.toml", formats: str = '["bin", "wds"]') -> Path:
    paths = paths or ["corpus/*.jsonl"]
    id_line = f'id_field = "{id_field}"\n' if id_field else ""
    text = (f'dataset = "{dataset}"\nseed = {seed}\n\n[input]\npaths = {json.dumps(paths)}\n{id_line}{extra_input}\n'
            f'[tokenizer]\npath = "{tokenizer}"\neos = "<|endoftext|>"\nbackend = "{backend}"\n\n'
            f'[dedup]\nexact = true\n\n[output]\nshard_size = "{shard_size}"\nformats = {formats}\n{extra}')
    path = folder / name
    path.write_text(text)
    return path


def prep_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREP_") or k == "PREP_CACHE"}
    env.update(extra)
    return env


def run_prep(*args: str | Path, env: Mapping[str, str] | None = None, check: bool = True,
             cwd: Path | None = None, timeout: float = 300, new_session: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess; `check` asserts exit 0 and shows stderr otherwise."""
    result = subprocess.run([sys.executable, "-m", "prep.cli.main", *map(str, args)], capture_output=True,
                            text=True, env=dict(env) if env is not None else prep_env(), cwd=cwd,
                            timeout=timeout, start_new_session=new_session)
    if check:
        assert result.returncode == 0, f"prep {' '.join(map(str, args))} exited {result.returncode}:\n{result.stderr}"
    return result


def one_error(result: subprocess.CompletedProcess[str]) -> str:
    """The one `prep: error:` line of a failed run's stderr (progress lines, which start with "[",
    aside); asserts there is no other line and no traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if not line.startswith("[")]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("prep: error: "), errors[0]
    return errors[0]


@contextmanager
def within(seconds: int) -> Iterator[None]:
    """Fail (rather than hang the test run) when the block takes longer than `seconds`: a read of
    a FIFO or a device that should have been refused."""
    def stuck(signum: int, frame: object) -> None:
        raise TimeoutError(f"still blocked after {seconds} s (reading a FIFO or a device?)")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


_PACKAGES = itertools.count()


@contextmanager
def user_package(folder: Path, prefix: str, modules: Mapping[str, str]) -> Iterator[str]:
    """A fresh package of user step modules (file name -> source) in `folder`, beside the pipeline:
    a new name each time, since imported modules stay imported; they are forgotten on exit (the
    imports, the step loader's cache, the folder on sys.path) so no later test sees them."""
    name = f"{prefix}{next(_PACKAGES)}_{abs(hash(folder)) % 10**6}"
    (folder / name).mkdir()
    (folder / name / "__init__.py").write_text("")
    for file_name, source in modules.items():
        (folder / name / file_name).write_text(source)
    try:
        yield name
    finally:
        from prep.steps import function

        for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[module]
        for key in [k for k in function._LOADED if k.startswith(name + ".")]:
            del function._LOADED[key]
        if str(folder.resolve()) in sys.path:
            sys.path.remove(str(folder.resolve()))


def committed_records(store: Any, stage: str) -> dict[str, dict[str, Any]]:
    """Every committed task record of `stage` in `store` (a prep Store), by task key: single
    records under tasks/ and those packs hold (the driver commits tasks in groups, a pack each)."""
    found: dict[str, dict[str, Any]] = {}
    for info in store.list(f"packs/{stage}/"):
        found.update(json.loads(store.get_bytes(info.key))["records"])
    for info in store.list(f"tasks/{stage}/"):
        found[info.key.rsplit("/", 1)[-1].removesuffix(".json")] = json.loads(store.get_bytes(info.key))
    return found


def unpack(store_dir: Path, stage: str) -> None:
    """Turn the packs of `stage` in the local store at `store_dir` into single task records at
    tasks/<stage>/<key>.json, as a store committed one record a task holds them: for tests that
    edit a record by hand (an edit inside a pack breaks its hash, and the pack is ignored whole)."""
    from prep.manifest import canonical
    from prep.storage import LocalStore

    store = LocalStore(store_dir)
    for info in list(store.list(f"packs/{stage}/")):
        for key, record in json.loads(store.get_bytes(info.key))["records"].items():
            store.put_bytes(f"tasks/{stage}/{key}.json", canonical.dumps(record))
        store.delete(info.key)


def forget_commits(store_dir: Path, stage: str) -> None:
    """Remove every task commit of `stage` (single records and packs) from the local store at
    `store_dir`, as a build killed before committing them would have left it."""
    import shutil

    for folder in ("tasks", "packs"):
        shutil.rmtree(store_dir / folder / stage, ignore_errors=True)
