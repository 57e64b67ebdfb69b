"""`prep rebuild SNAP --inputs DIR`: build a snapshot again from what its store carries, and prove its id.

The pipeline is the one its manifest records (read back by the caller, prep.history.pipelinefile),
the tokenizer file and the user step modules are the ones the snapshot carries, each read from
its object and checked by hash into a private folder (the modules' folder first on the import
path, for the driver and the workers it forks), and the input files are found under DIR by their
recorded names and checked against their recorded sizes and hashes before anything runs. The
build runs under a build lease like any other and publishes nothing: no ref moves, no log is
written. The same id proves the snapshot; another names the first thing that differs.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from prep.code import code_identity
from prep.config import Pipeline
from prep.errors import InputError, IntegrityError, NotFoundError, VerificationFailed
from prep.hashing import digest_bytes, digest_descriptor, parse_id
from prep.manifest import canonical
from prep.progress import Progress
from prep.regular import open_regular
from prep.runner.build import check_lease, run_pipeline
from prep.runner.driver import Runner
from prep.runner.executors.base import Executor, WrappedExecutor
from prep.runner.stage import StageRun
from prep.runner.tasks import CodeChecked
from prep.steps.stepsources import is_carried_path
from prep.storage.backend import Store
from prep.store import snapshots
from prep.store.layout import object_key
from prep.store.leases import build_lease, waiting_for_gc
from prep.store.snapshots import Snapshot

TOKENIZER_FILE = "tokenizer.json"
MODULES_FOLDER = "steps"


@dataclass(frozen=True)
class Carried:
    """The files a snapshot carries, written out: its tokenizer file, and the folder of its step modules."""

    tokenizer: Path
    modules: Path


@dataclass(frozen=True)
class Rebuilt:
    """A rebuild's outcome: the snapshot asked for, the one the build made, and what differs (None: nothing)."""

    snapshot: str
    rebuilt: str
    difference: str | None
    stages: Mapping[str, StageRun] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The `prep.rebuild-report/1` document (manifests/rebuild-report-1.schema.json)."""
        return {"schema": "prep.rebuild-report/1", "snapshot": self.snapshot, "rebuilt": self.rebuilt,
                "same": self.difference is None, "difference": self.difference,
                "stages": [{"name": run.name, "ran": run.ran, "cached": run.cached} for run in self.stages.values()]}


PipelineOf = Callable[[Snapshot, Path, Path], Pipeline]
"""The pipeline a snapshot records, its inputs under a folder, its tokenizer file at a path."""


def rebuild(store: Store, snapshot: Snapshot, inputs: Path, pipeline_of: PipelineOf,
            executor_of: Callable[[], Executor], progress: Progress) -> Rebuilt:
    """Write out what the snapshot carries, check the inputs under `inputs`, read its pipeline back
    (`pipeline_of`), build it on the executor `executor_of` starts (after the step modules are on
    the import path, so its workers inherit it) and compare; publishes nothing."""
    if snapshot.manifest.get("exclude"):
        raise InputError(f"{snapshot.id}: built with [input] exclude lists, whose entries a snapshot never "
                         "stores (deletion requests: docs/deletion.md); it cannot be rebuilt from the store alone")
    with carried_files(store, snapshot) as carried:
        check_inputs(snapshot, inputs)
        pipeline = pipeline_of(snapshot, inputs, carried.tokenizer)
        check_config(snapshot, pipeline.resolved())
        executor = executor_of()
        try:
            return _run(store, snapshot, pipeline, executor, progress)
        finally:
            executor.close()


def _run(store: Store, snapshot: Snapshot, pipeline: Pipeline, executor: Executor, progress: Progress) -> Rebuilt:
    """Run the pipeline's stages under a build lease; the outcome against `snapshot` (the same
    manifest is stored again, a no-op in the store it came from; another is not stored)."""
    code = code_identity()
    checked = WrappedExecutor(executor, lambda fn: CodeChecked(fn, code))
    with build_lease(store, on_wait=lambda key: progress.info(waiting_for_gc(key))) as lease:
        runner = Runner(store, checked, progress, code)
        built = run_pipeline(pipeline, runner)
        rebuilt = digest_bytes(canonical.dumps(built.manifest)).id
        difference = None if rebuilt == snapshot.id else first_difference(snapshot.manifest, built.manifest)
        if difference is None:
            check_lease(store, lease)
            snapshots.publish_manifest(store, built.manifest)
    return Rebuilt(snapshot.id, rebuilt, difference, runner.stages)


def check_inputs(snapshot: Snapshot, inputs: Path) -> None:
    """InputError naming the first input file the manifest records that is missing under `inputs`
    or whose size or SHA-256 differs from the recorded one; IntegrityError for a recorded name
    outside `inputs` (absolute, or through `..`), before any file is read."""
    if not inputs.is_dir():
        raise InputError(f"{inputs}: not a folder (--inputs names the folder holding the snapshot's input files)")
    for entry in snapshot.manifest["inputs"]["files"]:
        if not _stays_inside(str(entry["path"])):
            raise IntegrityError(f"{snapshot.id}: input file path {entry['path']!r} is not a relative path inside the "
                                 "folder of its inputs (prep records none such); nothing was read")
        path = inputs / str(entry["path"])
        try:
            size, sha256 = _size_and_sha256(path, int(entry["size"]))
        except OSError as exc:
            raise InputError(f"{path}: input file {entry['path']} of {snapshot.id} cannot be read "
                             f"({exc.strerror or exc})") from None
        if size != entry["size"] or sha256 != entry["sha256"]:
            raise InputError(f"{path}: input file {entry['path']} differs from the one {snapshot.id} was built from "
                             f"({size} bytes, sha256 {sha256[:12] or '-'}; recorded {entry['size']} bytes, "
                             f"sha256 {str(entry['sha256'])[:12]})")


def _stays_inside(name: str) -> bool:
    """Whether a recorded input name, joined to a folder, names a file below it: relative, no `..`."""
    pure = PurePosixPath(name)
    return bool(name) and not pure.is_absolute() and ".." not in pure.parts


def _size_and_sha256(path: Path, expected: int) -> tuple[int, str]:
    """Regular file `path`'s size and, when it is `expected`, its SHA-256 ("" otherwise), both of
    the one descriptor opened; OSError "not a regular file" for a FIFO, a device or a folder."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        return size, digest_descriptor(fd).sha256 if size == expected else ""
    finally:
        os.close(fd)


@contextmanager
def carried_files(store: Store, snapshot: Snapshot) -> Iterator[Carried]:
    """The snapshot's tokenizer file and step modules, each read from its object (checked by hash)
    into a private temporary folder, removed afterwards; the modules' folder is first on sys.path
    meanwhile. NotFoundError names what an older snapshot does not carry."""
    folder = Path(tempfile.mkdtemp(prefix="prep-rebuild-"))
    try:
        carried = Carried(folder / TOKENIZER_FILE, folder / MODULES_FOLDER)
        carried.tokenizer.write_bytes(_carried_bytes(store, snapshot, snapshot.manifest["tokenizer"], "tokenizer file"))
        carried.modules.mkdir()
        for entry in step_source_entries(snapshot):
            target = carried.modules / str(entry["path"])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(_carried_bytes(store, snapshot, entry, f"step source {entry['path']}"))
        sys.path.insert(0, str(carried.modules))
        try:
            yield carried
        finally:
            sys.path.remove(str(carried.modules))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def step_source_entries(snapshot: Snapshot) -> Sequence[Mapping[str, Any]]:
    """The manifest's `step_sources`; NotFoundError when the snapshot has function steps but carries
    none of their sources (built before they were stored), or names a path outside its folder."""
    entries: Sequence[Mapping[str, Any]] = snapshot.manifest.get("step_sources", ())
    steps = snapshot.manifest["config"].get("steps", ())
    functions = [str(step["use"]) for step in steps if ":" in str(step.get("use", ""))]
    if functions and not entries:
        raise NotFoundError(f"{snapshot.id}: the snapshot does not carry the source of step {functions[0]} (built "
                            "before snapshots stored step sources); it cannot be rebuilt from the store alone")
    for entry in entries:
        if not is_carried_path(str(entry["path"])):
            raise IntegrityError(f"{snapshot.id}: step source path {entry['path']!r} is not a relative path inside "
                                 "its package")
    return entries


def _carried_bytes(store: Store, snapshot: Snapshot, entry: Mapping[str, Any], what: str) -> bytes:
    """The bytes of a carried file's object, proven by hash; NotFoundError when the manifest names
    no object (an older snapshot) or the store lacks it; IntegrityError when it does not hash to its name."""
    object_id = entry.get("object")
    if not object_id:
        raise NotFoundError(f"{snapshot.id}: the snapshot does not carry its {what} (built before snapshots stored "
                            "it); it cannot be rebuilt from the store alone")
    sha = parse_id(str(object_id))
    try:
        data = store.get_bytes(object_key(sha))
    except NotFoundError:
        raise NotFoundError(f"{store.url}: the {what} of {snapshot.id} (object {object_id}) is not in the store") from None
    except IntegrityError as exc:  # not a regular file (a FIFO, a folder), or too large: never read
        raise IntegrityError(f"{store.url}: the {what} of {snapshot.id}: object {object_id} cannot be read "
                             f"({exc.message})") from None
    if digest_bytes(data).sha256 != sha:
        raise IntegrityError(f"{store.url}: the {what} of {snapshot.id}: object {object_id} does not hash to its "
                             "name (corrupt)")
    return data


def check_config(snapshot: Snapshot, resolved: Mapping[str, Any]) -> None:
    """VerificationFailed naming the first setting where the pipeline read back here resolves other
    than the snapshot records (a step's code identity: an installed library of another version)."""
    check_step_code(snapshot, resolved)
    difference = _first_value_difference("config", snapshot.manifest["config"], resolved)
    if difference is not None:
        raise VerificationFailed(f"{snapshot.id}: its pipeline resolves differently here, so the rebuild cannot give "
                                 f"the same snapshot: {difference}; nothing was built")


def check_step_code(snapshot: Snapshot, resolved: Mapping[str, Any]) -> None:
    """VerificationFailed naming the first function step whose code identity, as the carried
    sources give it here, is not the one the snapshot records, with the carried files it covers."""
    recorded_steps = snapshot.manifest["config"].get("steps", ())
    for recorded, here in zip(recorded_steps, resolved.get("steps", ()), strict=False):
        use = str(recorded.get("use", ""))
        if ":" not in use or here.get("use") != use or here.get("code") == recorded.get("code"):
            continue
        package = use.partition(":")[0].partition(".")[0]
        carried = [str(entry["path"]) for entry in step_source_entries(snapshot)
                   if str(entry["module"]).partition(".")[0] == package]
        raise VerificationFailed(
            f"{snapshot.id}: step {use}: its code here (its carried sources {', '.join(carried) or 'none'} and the "
            f"installed distributions they import) is sha256 {str(here.get('code'))[:12]}, recorded "
            f"{str(recorded.get('code'))[:12]}: a carried source is not the one the step was built with, or an "
            "installed library differs; nothing was built")


def first_difference(target: Mapping[str, Any], rebuilt: Mapping[str, Any]) -> str:
    """What first differs between two snapshot manifests: an artifact (by path, in the target's
    order), else the first other key that differs."""
    made = {str(artifact["path"]): artifact for artifact in rebuilt["artifacts"]}
    for artifact in target["artifacts"]:
        other = made.get(str(artifact["path"]))
        if other is None:
            return f"artifact {artifact['path']}: not made by the rebuild"
        if other["sha256"] != artifact["sha256"]:
            return f"artifact {artifact['path']}: sha256 {str(other['sha256'])[:12]}, recorded {str(artifact['sha256'])[:12]}"
    extra = sorted(set(made) - {str(artifact["path"]) for artifact in target["artifacts"]})
    if extra:
        return f"artifact {extra[0]}: made by the rebuild, not in the snapshot"
    return _first_value_difference("manifest", target, rebuilt) or "the manifest's bytes"


def _first_value_difference(where: str, recorded: object, rebuilt: object) -> str | None:
    """The first key path (in sorted order) whose values differ, with both values; None when equal."""
    if recorded == rebuilt:
        return None
    if isinstance(recorded, Mapping) and isinstance(rebuilt, Mapping):
        for key in sorted(set(recorded) | set(rebuilt)):
            found = _first_value_difference(f"{where}.{key}", recorded.get(key), rebuilt.get(key))
            if found is not None:
                return found
    if isinstance(recorded, list) and isinstance(rebuilt, list) and len(recorded) == len(rebuilt):
        for index, (one, other) in enumerate(zip(recorded, rebuilt, strict=True)):
            found = _first_value_difference(f"{where}[{index}]", one, other)
            if found is not None:
                return found
    return f"{where}: {_short(rebuilt)} here, recorded {_short(recorded)}"


def _short(value: object) -> str:
    """A value in at most 80 characters of JSON."""
    text = canonical.dumps(value).decode() if value is not None else "absent"
    return text if len(text) <= 80 else text[:77] + "..."
