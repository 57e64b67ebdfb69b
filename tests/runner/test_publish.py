"""How a build moves refs (issue 16, 17): compare-and-swap from the generations it saw at its start
(`--expect`, racing builders, `--force`), no-op rebuilds, tags that stay put, and the build log."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prep import code
from prep.cli.main import main
from prep.config import load_pipeline
from prep.errors import RefConflictError, StaleRefError, UsageError
from prep.manifest.schema import validate
from prep.progress import Progress
from prep.runner import publish as publish_module
from prep.runner.build import BuildResult, PublishOptions, build
from prep.runner.tokenizing import TokenizedPart
from prep.storage import LocalStore
from prep.storage.backend import Store
from prep.store import snapshots as build_module  # the build calls snapshots.publish_manifest
from prep.store.refs import move_ref, read_ref, ref_history, update_ref
from prep.store.snapshots import Snapshot, load_snapshot
from tests.helpers import make_records, write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor


def build_in_process(pipeline: Path, store: Store, options: PublishOptions | None = None,
                     progress: Progress | None = None) -> BuildResult:
    code.source_hash.cache_clear()  # others may edit the tree; driver and in-process tasks agree
    return build(load_pipeline(pipeline), store, InProcessExecutor(), progress=progress or Progress(quiet=True),
                 options=options)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Path:
    root = tmp_path_factory.mktemp("publish")
    write_jsonl(root / "corpus" / "a.jsonl", make_records(50, seed=1, prefix="a"))
    write_pipeline(root, tokenizer_path, ["corpus/*.jsonl"], seed=99, name="other.toml")
    return write_pipeline(root, tokenizer_path, ["corpus/*.jsonl"])


def other(project: Path) -> Path:
    """The same corpus with another seed: another snapshot of the dataset."""
    return project.parent / "other.toml"


def generations(store: Store) -> dict[str, int]:
    return {ref.name: ref.generation for ref in ref_history(store, "tiny") if ref == read_ref(store, "tiny", ref.name)}


def test_a_no_op_rebuild_leaves_every_ref_untouched_and_says_up_to_date(project: Path, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    store = LocalStore(tmp_path / "store")
    first = build_in_process(project, store, PublishOptions(tags=("v1",)))
    before = generations(store)
    again = build_in_process(project, store, PublishOptions(tags=("v1",)), Progress())
    assert again.snapshot.id == first.snapshot.id
    assert generations(store) == before == {"latest": 1, "v1": 1}
    assert [o.action for o in again.refs] == ["unchanged", "unchanged"]
    assert len(ref_history(store, "tiny")) == 2
    assert "up to date" in capsys.readouterr().err
    assert again.readback.skipped == "no ref moves"


def test_a_stale_expect_builds_nothing_and_moves_nothing(project: Path, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    build_in_process(project, store)
    with pytest.raises(StaleRefError, match="generation 1 .*, not generation 3 .*nothing built") as caught:
        build_in_process(other(project), store, PublishOptions(expect=3))
    assert caught.value.exit_code == 2
    assert generations(store) == {"latest": 1}
    assert build_in_process(other(project), store, PublishOptions(expect=1)).refs[0].generation == 2
    with pytest.raises(StaleRefError, match="not absent"):
        build_in_process(project, store, PublishOptions(expect=0))


def test_expect_is_checked_again_by_the_swap(project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another publisher moves `latest` after the build checked --expect: the swap refuses (exit 2)."""
    store = LocalStore(tmp_path / "store")
    first = build_in_process(project, store)
    interfere(monkeypatch, lambda: move_ref(store, "tiny", "latest", f"sha256:{'e' * 64}"))
    with pytest.raises(StaleRefError):
        build_in_process(other(project), store, PublishOptions(expect=1))
    latest = read_ref(store, "tiny", "latest")
    assert latest is not None and latest.generation == 2 and latest.snapshot != first.snapshot.id


def interfere(monkeypatch: pytest.MonkeyPatch, action: Callable[[], Any]) -> None:
    """Run `action` once, right after the build stores its manifest (while it has not moved refs)."""
    real = build_module.publish_manifest

    def publish(store: Store, manifest: dict[str, Any]) -> Snapshot:
        snapshot = real(store, manifest)
        monkeypatch.setattr(build_module, "publish_manifest", real)
        action()
        return snapshot
    monkeypatch.setattr(build_module, "publish_manifest", publish)


def test_two_builders_racing_move_latest_once_and_the_other_says_so(project: Path, tmp_path: Path, tokenizer_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Both builds note generation 1, then meet before publishing: one moves latest, the other
    stores its snapshot, leaves latest at the newer value, warns, and logs that it declined."""
    store = LocalStore(tmp_path / "store")
    build_in_process(project, store)
    corpus = [str(project.parent / "corpus" / "*.jsonl")]
    pipelines = {seed: write_pipeline(tmp_path, tokenizer_path, corpus, seed=seed, name=f"{seed}.toml") for seed in (5, 6)}
    meet = threading.Barrier(2, timeout=120)
    real = build_module.publish_manifest

    def publish(store: Store, manifest: dict[str, Any]) -> Snapshot:
        meet.wait()  # both have noted their refs' generations and built their snapshots
        return real(store, manifest)
    monkeypatch.setattr(build_module, "publish_manifest", publish)
    results: dict[int, BuildResult] = {}

    def run(seed: int) -> None:
        results[seed] = build(load_pipeline(pipelines[seed]), store, InProcessExecutor(), progress=Progress(quiet=True))

    threads = [threading.Thread(target=run, args=(seed,)) for seed in pipelines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    by_action = {result.refs[0].action: seed for seed, result in results.items()}
    assert sorted(by_action) == ["declined", "moved"]
    winner, loser = results[by_action["moved"]], results[by_action["declined"]]
    latest = read_ref(store, "tiny", "latest")
    assert latest is not None and (latest.snapshot, latest.generation) == (winner.snapshot.id, 2)
    assert store.exists(f"snapshots/{loser.snapshot.id.removeprefix('sha256:')}")  # stored, not named
    log = json.loads(store.get_bytes(loser.log_key))
    validate(log, "prep.build-log/2")
    assert log["refs"][0]["action"] == "declined" and log["refs"][0]["generation"] == 2
    monkeypatch.setattr(build_module, "publish_manifest", real)
    forced = build_in_process(pipelines[by_action["declined"]], store, PublishOptions(force=True))
    assert (forced.refs[0].action, forced.refs[0].generation) == ("moved", 3)


def test_a_racing_publisher_is_declined_with_a_warning_and_force_moves_over_it(
        project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    store = LocalStore(tmp_path / "store")
    build_in_process(project, store)
    newer = f"sha256:{'e' * 64}"
    interfere(monkeypatch, lambda: move_ref(store, "tiny", "latest", newer))
    declined = build_in_process(other(project), store, progress=Progress())
    assert declined.refs[0].action == "declined"
    assert "warning: tiny@latest" in capsys.readouterr().err
    latest = read_ref(store, "tiny", "latest")
    assert latest is not None and (latest.snapshot, latest.generation) == (newer, 2)
    interfere(monkeypatch, lambda: move_ref(store, "tiny", "latest", f"sha256:{'f' * 64}"))
    forced = build_in_process(other(project), store, PublishOptions(force=True))
    assert forced.refs[0].action == "moved"
    latest = read_ref(store, "tiny", "latest")
    assert latest is not None and (latest.snapshot, latest.generation) == (forced.snapshot.id, 4)


def test_a_tag_naming_another_snapshot_stays_unless_forced(project: Path, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    first = build_in_process(project, store, PublishOptions(tags=("v1",)))
    with pytest.raises(RefConflictError, match="tags stay put"):
        build_in_process(other(project), store, PublishOptions(tags=("v1",)))
    # Nothing moved, latest included: every ref is checked before the first one moves.
    assert generations(store) == {"latest": 1, "v1": 1}
    v1 = read_ref(store, "tiny", "v1")
    assert v1 is not None and v1.snapshot == first.snapshot.id
    moved = build_in_process(other(project), store, PublishOptions(tags=("v1",), force=True))
    assert [(o.name, o.action, o.generation) for o in moved.refs] == [("latest", "moved", 2), ("v1", "moved", 2)]
    with pytest.raises(UsageError, match="reserved"):
        build_in_process(project, store, PublishOptions(tags=("latest",)))


def test_a_tag_another_publisher_moves_during_the_build_fails_the_command(
        project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression: a --tag that another publisher moved while the build ran was left with a warning
    and exit 0, so `prep build --tag v1 && train tiny@v1` trained on someone else's snapshot. Now:
    latest still moves, the tag stays, the JSON report says declined, one error line, exit 2."""
    store = LocalStore(tmp_path / "store")
    build_in_process(project, store)
    newer = f"sha256:{'e' * 64}"

    def racing_update_ref(store: Store, dataset: str, name: str, snapshot: str, **options: Any) -> Any:
        if name == "v1":  # after the checks before read-back, before this tag's swap: the race
            move_ref(store, dataset, name, newer)
        return update_ref(store, dataset, name, snapshot, **options)
    monkeypatch.setattr(publish_module, "update_ref", racing_update_ref)
    with pytest.raises(SystemExit) as exited:
        main(["build", str(other(project)), "--store", str(store.root), "--workers", "1", "--tag", "v1", "--json"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert exited.value.code == 2 and report["schema"] == "prep.build-report/1"
    assert [(ref["name"], ref["action"]) for ref in report["refs"]] == [("latest", "moved"), ("v1", "declined")]
    assert captured.err.endswith(f"prep: error: tiny@v1 names {newer} (generation 1), set by another publisher while "
                            f"this build ran; the snapshot {report['snapshot']} is stored but not tagged (use --force "
                            "to move the tag anyway)\n") and captured.err.count("prep: error") == 1
    v1, latest = read_ref(store, "tiny", "v1"), read_ref(store, "tiny", "latest")
    assert v1 is not None and v1.snapshot == newer
    assert latest is not None and latest.snapshot == report["snapshot"]


def test_an_expect_lost_at_the_swap_names_the_snapshot_it_stored(
        project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Regression: a build whose --expect another publisher beat between its check and its swap
    exited 2 naming only the ref, so the snapshot it had stored (its id printed nowhere) was lost
    to the caller. Now the one error line names it, as a declined --tag's does; no ref moved."""
    store = LocalStore(tmp_path / "store")
    build_in_process(project, store)
    newer, stored = f"sha256:{'e' * 64}", []

    def racing_update_ref(store: Store, dataset: str, name: str, snapshot: str, **options: Any) -> Any:
        move_ref(store, dataset, name, newer)  # after read-back, before the swap: the race
        stored.append(snapshot)
        return update_ref(store, dataset, name, snapshot, **options)
    monkeypatch.setattr(publish_module, "update_ref", racing_update_ref)
    with pytest.raises(SystemExit) as exited:
        main(["build", str(other(project)), "--store", str(store.root), "--workers", "1", "--expect", "1",
              "--tag", "v1"])
    captured = capsys.readouterr()
    assert exited.value.code == 2 and captured.out == "" and stored
    assert captured.err.endswith(f"prep: error: tiny@latest is generation 2 ({newer}), not generation 1 as expected; "
                                 f"left unmoved; the snapshot {stored[0]} is stored but not published\n")
    assert captured.err.count("prep: error") == 1
    assert load_snapshot(store, stored[0]).dataset == "tiny" and read_ref(store, "tiny", "v1") is None
    latest = read_ref(store, "tiny", "latest")
    assert latest is not None and latest.snapshot == newer


def test_the_build_log_says_who_ran_what_where_and_what_it_skipped(tmp_path: Path, tokenizer_path: Path) -> None:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_records(20, seed=1))
    with open(tmp_path / "corpus" / "a.jsonl", "a", encoding="utf-8") as out:
        out.write('{"id": "broken", "text": \n')
        out.write('{"id": "no-text"}\n')
    pipeline = write_pipeline(tmp_path, tokenizer_path, extra_input='on_error = "skip"\n')
    store = LocalStore(tmp_path / "store")
    result = build_in_process(pipeline, store)
    log = json.loads(store.get_bytes(result.log_key))
    validate(log, "prep.build-log/2")
    assert log["executor"] == {"backend": "InProcessExecutor", "workers": 1}
    assert log["user"] and log["host"] and log["seconds"] >= 0 and log["started"]
    assert log["skipped"]["total"] == 2
    assert [(s["file"], s["line"]) for s in log["skipped"]["listed"]] == [("a.jsonl", 21), ("a.jsonl", 22)]
    assert all(s["reason"] and not s["reason"].startswith("a.jsonl") for s in log["skipped"]["listed"])
    assert log["stages"]["tokenize"] == {"key": log["stages"]["tokenize"]["key"], "ran": 1, "cached": 0}
    readback = log["readback"]
    assert readback["ran"] is True and readback["checked"] + readback["when_written"] == readback["objects"]
    assert log["refs"] == [{"name": "latest", "action": "moved", "generation": 1, "previous": None}]


def _part(source: str, bad: list[str]) -> TokenizedPart:
    """A tokenized part of `source` that skipped the records `bad` names."""
    return TokenizedPart(source, "0" * 64, "jsonl", 0, 0, 1, "0" * 64, "sha256:" + "1" * 64, "sha256:" + "2" * 64, 0,
                         (), 0, 0, 0, len(bad), 0, 0, tuple(bad), None)


def test_skipped_records_listed_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from prep.runner import publish

    monkeypatch.setattr(publish, "SKIPPED_LISTED", 3)
    entries = [_part("x.jsonl", [f"x.jsonl:{n}: bad" for n in range(5)]), _part("y.parquet", ["y.parquet: row 4: null text"])]
    skipped = publish.skipped_records(entries)
    assert skipped["total"] == 6 and len(skipped["listed"]) == 3
    assert publish.skipped_records(entries[1:])["listed"] == [{"file": "y.parquet", "row": 4, "reason": "null text"}]


def test_build_logs_of_one_second_list_in_start_order() -> None:
    """`prep log --builds` lists logs by key; builds of a tiny corpus start less than a second apart."""
    import re

    from prep.runner.publish import build_log_key

    started = [1_700_000_000.9, 1_700_000_000.25, 1_700_000_000.000001, 1_700_000_000.5]
    keys = [build_log_key("tiny", t)[1] for t in started]
    assert sorted(keys) == [keys[2], keys[1], keys[3], keys[0]]
    assert all(re.fullmatch(r"logs/tiny/20231114T221320Z-[0-9a-f]{12}\.json", key) for key in keys)
