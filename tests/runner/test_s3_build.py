"""`prep` end to end on S3 (moto's real HTTP server): every command on an s3:// store, inputs
read from s3:// prefixes and globs, racing builders, a build killed mid multipart upload, and
builds of different configs racing for one ref."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from prep import code
from prep.config import load_pipeline
from prep.errors import StoreError
from prep.manifest.schema import validate
from prep.progress import Progress
from prep.runner import driver
from prep.runner.build import BuildResult, build
from prep.runner.driver import Runner
from prep.storage import LocalStore, open_store
from prep.storage.backend import Store
from prep.store import cas
from prep.store.refs import HISTORY_PREFIX
from prep.store.snapshots import load_snapshot, resolve
from tests.helpers import committed_records, make_records, prep_env, write_jsonl, write_pipeline
from tests.runner.buildsupport import InProcessExecutor
from tests.s3support import RequestHook, admin_client, new_bucket

pytestmark = pytest.mark.usefixtures("s3_endpoint")

FILES = ("a/part-0.jsonl", "b/part-1.jsonl")
PUBLISHED = re.compile(r"published (sha256:[0-9a-f]{64}) as tiny@latest \(generation (\d+)\)")
HOOK_WAIT_SECONDS = 120.0  # a safety net against a hung test, never reached when the race happens


@dataclass(frozen=True)
class Project:
    """A tiny two-file corpus on local disk and a pipeline reading it."""

    root: Path
    tokenizer: Path
    pipeline: Path

    @property
    def corpus(self) -> Path:
        return self.root / "corpus"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Project:
    root = tmp_path_factory.mktemp("s3build")
    for index, name in enumerate(FILES):
        write_jsonl(root / "corpus" / name, make_records(40, seed=index, prefix=f"p{index}"))
    return Project(root, tokenizer_path, write_pipeline(root, tokenizer_path, ["corpus/*/*.jsonl"]))


def bucket_of(url: str) -> str:
    return url.removeprefix("s3://").partition("/")[0]


def upload_corpus(project: Project, url: str) -> None:
    """Copy the local corpus below `s3://bucket/prefix`, keeping relative names."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    for name in FILES:
        admin_client().put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=(project.corpus / name).read_bytes())


def s3_pipeline(project: Project, folder: Path, paths: list[str], store: str | None = None,
                seed: int = 1234) -> Path:
    """A pipeline over `paths`; with `store`, the store is named in the file itself."""
    folder.mkdir(parents=True, exist_ok=True)
    path = write_pipeline(folder, project.tokenizer, paths, seed=seed)
    if store is not None:
        path.write_text(f'store = "{store}"\n' + path.read_text())
    return path


def start(*args: str | Path, **env: str) -> subprocess.Popen[str]:
    """Start the real CLI; several started together run at the same time."""
    return subprocess.Popen([sys.executable, "-m", "prep.cli.main", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=prep_env(**env), start_new_session=True)


def finish(process: subprocess.Popen[str], expect: int | None = 0) -> subprocess.CompletedProcess[str]:
    """Wait for a started command; with `expect`, assert its exit status (showing stderr)."""
    try:
        stdout, stderr = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # its own session: the command and its workers
        raise
    if expect is not None:
        assert process.returncode == expect, f"{process.args!r} exited {process.returncode}:\n{stderr}"
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def run(*args: str | Path, expect: int | None = 0, **env: str) -> subprocess.CompletedProcess[str]:
    return finish(start(*args, **env), expect)


def build_in_process(pipeline: Path, store_url: str) -> BuildResult:
    """A build in this process, code identity read afresh (others edit the tree meanwhile)."""
    code.source_hash.cache_clear()
    return build(load_pipeline(pipeline), open_store(store_url), InProcessExecutor(), progress=Progress(quiet=True))


@pytest.fixture
def hooks(request: pytest.FixtureRequest) -> list[RequestHook]:
    """The server's request hooks (tests.s3support's s3_request_hooks, emptied after the test)."""
    hooks: list[RequestHook] = request.getfixturevalue("s3_request_hooks")
    return hooks


def versions(url: str) -> Iterator[dict[str, Any]]:
    """Every version and delete marker below `s3://bucket/prefix`."""
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    pages = admin_client().get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix)
    for page in pages:
        yield from page.get("Versions", [])
        yield from ({**marker, "DeleteMarker": True} for marker in page.get("DeleteMarkers", []))


def history(store: Store) -> list[dict[str, Any]]:
    """The ref records under history/tiny/latest/, by generation."""
    return [json.loads(store.get_bytes(info.key)) for info in store.list(f"{HISTORY_PREFIX}tiny/latest/")]


def assert_complete(store: Store, snapshot_id: str) -> None:
    """The snapshot's manifest and every artifact it names are in the store, at the right size."""
    for artifact in load_snapshot(store, snapshot_id).artifacts:
        info = store.head(cas.object_key(artifact["sha256"]))
        assert info is not None and info.size == artifact["size"], artifact["path"]


def test_every_command_on_an_s3_store(project: Project, tmp_path: Path) -> None:
    """build (store named in the pipeline file) gives the snapshot a local build gives, and show,
    log, ls, diff, trace, tag, gc, pull and verify all work on it."""
    s3_bucket = new_bucket()
    store = f"{s3_bucket}/team-a"
    upload_corpus(project, f"{s3_bucket}/raw/corpus")
    pipeline = s3_pipeline(project, tmp_path / "remote", [f"{s3_bucket}/raw/corpus/"], store=store)
    local_store = tmp_path / "local-store"
    builds = [start("build", project.pipeline, "--store", local_store, "--workers", "1"),
              start("build", pipeline, "--workers", "1", "--tag", "v1")]
    local_id, snapshot_id = (finish(process).stdout.split()[-1] for process in builds)
    assert snapshot_id == local_id

    missing = f"s3://missing-{bucket_of(s3_bucket)}/store"
    first_bin = next(a["path"] for a in load_snapshot(LocalStore(local_store), local_id).artifacts if a["format"] == "bin")
    readers = [
        start("show", "tiny@latest", "--store", store),
        start("log", "tiny", PREP_STORE=store),
        start("ls", "--store", store),
        start("diff", "tiny@v1", snapshot_id, "--documents", "--store", store),
        start("trace", snapshot_id, "p1-7", "--store", store),
        start("show", snapshot_id, "--at", f"{first_bin}:0", "--store", store),
        start("ls", "--store", missing),
        start("tag", "tiny@v1", "stable", "--store", store),
    ]
    show, log, ls, diff, trace, at, error, tagged = (finish(p, code) for p, code in zip(readers, [0] * 6 + [2, 0]))
    assert f"snapshot   {snapshot_id}" in show.stdout and "inputs     2 files" in show.stdout
    for name in ("latest", "v1"):
        assert re.search(rf"Z  tiny@{name}\s+gen 1\s+{snapshot_id}", log.stdout), log.stdout
        assert re.search(rf"tiny@{name}\s+gen 1\s+\S+\s+{snapshot_id}", ls.stdout), ls.stdout
    assert "documents  0 added, 0 removed, 0 changed, 80 unchanged" in diff.stdout
    assert diff.stdout.rstrip().endswith("identical")
    assert "document  p1-7  (b/part-1.jsonl line 8;" in trace.stdout and "bin/" in trace.stdout
    assert re.search(r"^key       [0-9a-f]{32}  ", trace.stdout, re.M), trace.stdout
    assert at.stdout.startswith("document  p") and f"{first_bin} sequence 0" in at.stdout
    assert error.stderr == f"prep: error: s3://missing-{bucket_of(s3_bucket)}: bucket does not exist\n"
    assert tagged.stdout.strip() == f"tiny@stable -> {snapshot_id} (generation 1)"

    garbage = cas.put_bytes(open_store(store), b"reached by no ref")
    collected = json.loads(run("gc", "--grace", "0s", "--json", "--store", store).stdout)
    assert collected["deleted"]["objects"]["count"] == 1 and collected["kept"]["objects"]["count"] > 10
    assert open_store(store).head(cas.object_key(garbage.sha256)) is None

    dest = tmp_path / "dest"
    run("pull", "tiny@stable", dest, "--store", store)
    verified = run("verify", "tiny@stable", dest, "--store", store)
    assert f"verified {snapshot_id}" in verified.stdout
    artifacts = resolve(LocalStore(local_store), snapshot_id).artifacts
    assert {a["format"] for a in artifacts} == {"bin", "idx", "wds"}
    for artifact in artifacts:
        local_bytes = (local_store / cas.object_key(artifact["sha256"])).read_bytes()
        assert (dest / artifact["path"]).read_bytes() == local_bytes, artifact["path"]


def test_inputs_are_named_by_key_below_the_prefix(project: Project, tmp_path: Path) -> None:
    """A corpus copied to another bucket and prefix (listed by glob there) gives the same
    snapshot; the log record keeps each object's ETag, and its VersionId in a versioned bucket."""
    s3_versioned_bucket, s3_bucket = new_bucket(versioned=True), new_bucket()
    versioned, plain = bucket_of(s3_versioned_bucket), bucket_of(s3_bucket)
    admin_client().put_object(Bucket=versioned, Key=f"data/v1/{FILES[0]}", Body=b'{"id": "old", "text": "x"}\n')
    upload_corpus(project, f"{s3_versioned_bucket}/data/v1")  # the latest versions are the corpus
    for name in FILES:
        admin_client().copy_object(Bucket=plain, Key=f"elsewhere/deeper/{name}",
                                   CopySource={"Bucket": versioned, "Key": f"data/v1/{name}"})
    first = build_in_process(s3_pipeline(project, tmp_path / "v", [f"{s3_versioned_bucket}/data/v1/"]),
                             f"{s3_versioned_bucket}/store")
    copied = [f"{s3_bucket}/elsewhere/deeper/a/*.jsonl", f"{s3_bucket}/elsewhere/deeper/b/part-1.jsonl"]
    second = build_in_process(s3_pipeline(project, tmp_path / "p", copied), f"{s3_bucket}/store")
    assert first.snapshot.id == second.snapshot.id

    expected = [{"path": name, "size": (project.corpus / name).stat().st_size,
                 "sha256": hashlib.sha256((project.corpus / name).read_bytes()).hexdigest()} for name in FILES]
    assert first.snapshot.manifest["inputs"]["files"] == expected
    latest = {v["Key"]: v for v in versions(f"{s3_versioned_bucket}/data/") if v["IsLatest"]}
    for result, bucket, prefix, versioned_bucket in ((first, versioned, "data/v1", True),
                                                     (second, plain, "elsewhere/deeper", False)):
        log = json.loads(open_store(f"s3://{bucket}/store").get_bytes(result.log_key))
        validate(log, "prep.build-log/2")
        recorded = []
        for name in FILES:
            head = admin_client().head_object(Bucket=bucket, Key=f"{prefix}/{name}")
            version = latest[f"{prefix}/{name}"]["VersionId"] if versioned_bucket else None
            recorded.append({"path": name, "location": f"s3://{bucket}/{prefix}/{name}", "etag": head["ETag"],
                             "version_id": version})
        assert log["inputs"] == recorded


class ReplaceOnFirstRangedRead:
    """Overwrites an input object when a ranged GET of it (a tokenize read; hashing reads the
    whole object) first arrives, before the server answers it."""

    def __init__(self, bucket: str, key: str) -> None:
        self.bucket, self.key, self.fired = bucket, key, False

    def __call__(self, environ: dict[str, Any]) -> None:
        ranged = environ["REQUEST_METHOD"] == "GET" and "HTTP_RANGE" in environ
        if ranged and environ["PATH_INFO"] == f"/{self.bucket}/{self.key}" and not self.fired:
            self.fired = True
            admin_client().put_object(Bucket=self.bucket, Key=self.key, Body=b'{"id": "new", "text": "y"}\n')


def test_an_input_replaced_during_the_build_is_read_as_hashed(project: Project, hooks: list[RequestHook],
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When tasks read S3 (no local spool: a full disk, or another node): in a versioned bucket
    they read the version that was hashed; otherwise reads are pinned to the hashed ETag, so the
    build stops with a one-line error instead of mixing two contents."""
    import prep.inputs.sources

    monkeypatch.setattr(prep.inputs.sources, "SPOOL_HEADROOM", 1 << 62)  # no disk is that free: no spool
    reference = build_in_process(project.pipeline, str(tmp_path / "reference"))
    for url, keeps_version in ((new_bucket(versioned=True), True), (new_bucket(), False)):
        upload_corpus(project, f"{url}/corpus")
        hook = ReplaceOnFirstRangedRead(bucket_of(url), f"corpus/{FILES[0]}")
        hooks[:] = [hook]
        pipeline = s3_pipeline(project, tmp_path / bucket_of(url), [f"{url}/corpus/"])
        if keeps_version:
            assert build_in_process(pipeline, f"{url}/store").snapshot.id == reference.snapshot.id
        else:
            with pytest.raises(StoreError, match=rf"^{url}/corpus/{FILES[0]}: object changed while being read$"):
                build_in_process(pipeline, f"{url}/store")
        assert hook.fired


class CountInputReads:
    """Counts GET requests per input object key."""

    def __init__(self, bucket: str) -> None:
        self.bucket, self.gets = bucket, Counter[str]()

    def __call__(self, environ: dict[str, Any]) -> None:
        path = environ["PATH_INFO"]
        if environ["REQUEST_METHOD"] == "GET" and path.startswith(f"/{self.bucket}/corpus/"):
            self.gets[path.removeprefix(f"/{self.bucket}/")] += 1


def test_each_s3_input_is_read_once(project: Project, hooks: list[RequestHook], tmp_path: Path) -> None:
    """Hashing tees every input into a local spool that the tokenize tasks read, so a build
    reads each input object from S3 exactly once, and the spool is gone afterwards."""
    from prep.inputs.sources import spool_path

    url = new_bucket()
    upload_corpus(project, f"{url}/corpus")
    counter = CountInputReads(bucket_of(url))
    hooks[:] = [counter]
    pipeline = s3_pipeline(project, tmp_path, [f"{url}/corpus/"])
    result = build_in_process(pipeline, f"{url}/store")
    assert counter.gets == {f"corpus/{name}": 1 for name in FILES}
    assert all(not spool_path(f["sha256"]).exists() for f in result.snapshot.manifest["inputs"]["files"])


def test_racing_builders_write_each_object_once(project: Project) -> None:
    """Three builds of one pipeline at once: one snapshot, one ref generation (the later builds find
    it up to date), and a single version of every object (single PUTs and multipart completions alike)."""
    store = f"{new_bucket(versioned=True)}/store"
    builders = [start("build", project.pipeline, "--store", store, "--workers", "1",
                      PREP_S3_MULTIPART_THRESHOLD="2KiB") for _ in range(3)]
    ids = {finish(process).stdout.split()[-1] for process in builders}
    assert len(ids) == 1
    (snapshot_id,) = ids

    by_key: dict[str, list[dict[str, Any]]] = {}
    for version in versions(store + "/"):
        by_key.setdefault(version["Key"].removeprefix("store/"), []).append(version)
    content = {key: found for key, found in by_key.items() if key.startswith(cas.OBJECTS_PREFIX)}
    assert len(content) > 10
    assert any("-" in found[0]["ETag"] for found in content.values()), "expected multipart uploads too"
    written_twice = {key: len(found) for key, found in by_key.items()
                     if len(found) != 1 and not key.startswith(("refs/", "leases/"))}
    assert written_twice == {}
    assert not any(version.get("DeleteMarker") for key, found in by_key.items() if not key.startswith("leases/")
                   for version in found)  # leases are deleted when released
    # The first build moves latest; the others find it naming their snapshot already and leave it.
    assert len(by_key["refs/tiny/latest.json"]) == 1
    assert len(by_key[f"readback/{snapshot_id.removeprefix('sha256:')}.json"]) == 1

    records = history(open_store(store))
    assert [(r["generation"], r["snapshot"]) for r in records] == [(1, snapshot_id)]


def test_build_killed_mid_multipart_upload_converges(project: Project, tmp_path: Path) -> None:
    """SIGKILL after some parts of a multipart upload were sent; the rerun publishes the
    snapshot an uninterrupted build does, and every stored object hashes to its name."""
    s3_bucket = new_bucket()
    store_url = f"{s3_bucket}/store"
    crashed = run("build", project.pipeline, "--store", store_url, "--workers", "1", expect=None,
                  PREP_S3_MULTIPART_THRESHOLD="1KiB", PREP_CRASH_AT="s3.mid_multipart:3")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    store = open_store(store_url)
    assert store.head("refs/tiny/latest.json") is None
    orphans = admin_client().list_multipart_uploads(Bucket=bucket_of(s3_bucket)).get("Uploads", [])
    assert orphans, "the kill should have left a multipart upload unfinished"

    rerun = run("build", project.pipeline, "--store", store_url, "--workers", "1",
                PREP_S3_MULTIPART_THRESHOLD="1KiB")
    reference = build_in_process(project.pipeline, str(tmp_path / "reference"))
    assert rerun.stdout.split()[-1] == reference.snapshot.id
    for info in store.list(cas.OBJECTS_PREFIX):
        assert cas.check(store, info.key.rsplit("/", 1)[-1]), info.key


class ForcedRefCollision:
    """Makes two builders collide on `refs/tiny/latest.json`: the first ref write waits until the
    second writer sends its own (so both read the ref before either wrote it), and the second
    waits until the first writer went on to its history record (so the first write won)."""

    def __init__(self, bucket: str) -> None:
        self.ref = f"/{bucket}/store/refs/tiny/latest.json"
        self.first_history = f"/{bucket}/store/{HISTORY_PREFIX}tiny/latest/{1:016d}.json"
        self.ref_writes = 0
        self._lock = threading.Lock()
        self._second_arrived, self._first_moved_on = threading.Event(), threading.Event()

    def __call__(self, environ: dict[str, Any]) -> None:
        if environ["PATH_INFO"] == self.first_history:
            self._first_moved_on.set()
        if environ["PATH_INFO"] != self.ref or environ["REQUEST_METHOD"] != "PUT":
            return
        with self._lock:
            self.ref_writes += 1
            number = self.ref_writes
        if number == 1:
            self._second_arrived.wait(HOOK_WAIT_SECONDS)
        elif number == 2:
            self._second_arrived.set()
            self._first_moved_on.wait(HOOK_WAIT_SECONDS)


@pytest.mark.parametrize("force", [False, True])
def test_different_configs_racing_for_a_ref_lose_no_generation(project: Project, hooks: list[RequestHook],
                                                                tmp_path: Path, force: bool) -> None:
    """Two pipelines (different seeds) move tiny@latest at once. The loser of the compare-and-swap
    re-reads: without --force it finds a newer value than it saw at its start and leaves it (a
    warning, exit 0); with --force it takes the next generation. History loses no generation, each
    names the snapshot its build printed, and both snapshots are complete."""
    bucket_url = new_bucket(versioned=True)
    store_url = f"{bucket_url}/store"
    collision = ForcedRefCollision(bucket_of(bucket_url))
    hooks.append(collision)
    pipelines = [s3_pipeline(project, tmp_path / f"seed{seed}", [str(project.corpus / "*/*.jsonl")], seed=seed)
                 for seed in (1, 2)]
    extra = ("--force",) if force else ()
    builders = [start("build", pipeline, "--store", store_url, "--workers", "1", *extra) for pipeline in pipelines]
    results = [finish(process) for process in builders]
    published = sorted((int(found[2]), found[1]) for r in results if (found := PUBLISHED.search(r.stderr)))
    built = {r.stdout.split()[-1] for r in results}
    assert len(built) == 2 and {snapshot for _, snapshot in published} <= built
    store = open_store(store_url)
    records = history(store)
    assert [(r["generation"], r["snapshot"]) for r in records] == published
    current = json.loads(store.get_bytes("refs/tiny/latest.json"))
    assert (current["generation"], current["snapshot"]) == published[-1]
    for snapshot_id in built:
        assert_complete(store, snapshot_id)
    if force:
        assert [generation for generation, _ in published] == [1, 2]
        assert collision.ref_writes == 3  # two writes won, one lost and was retried
        assert records[1]["previous"] == records[0]["snapshot"]
        return
    assert [generation for generation, _ in published] == [1]
    assert collision.ref_writes == 2  # the loser's swap failed, and it did not try again
    loser = next(r for r in results if not PUBLISHED.search(r.stderr))
    assert "warning: tiny@latest is generation 1" in loser.stderr and "--force" in loser.stderr


def test_a_prefix_skips_hidden_and_marker_objects_like_a_local_folder(project: Project) -> None:
    from prep.inputs.sources import discover

    url = new_bucket()
    upload_corpus(project, f"{url}/corpus")
    bucket = bucket_of(url)
    admin_client().put_object(Bucket=bucket, Key="corpus/_SUCCESS", Body=b"")
    admin_client().put_object(Bucket=bucket, Key="corpus/.part-0.jsonl.crc", Body=b"x")
    found = [source.rel for source in discover((f"{url}/corpus/",), project.root, "auto")]
    assert found == sorted(FILES)


def _five_parts_merged_in_pairs(tmp_path: Path, tokenizer_path: Path) -> tuple[str, Path]:
    """A five-file corpus: the snapshot id of a local build that merges nothing, and a pipeline
    that merges its parts in pairs (`merge_fan_in = 2`: three merge tasks)."""
    for index in range(5):
        write_jsonl(tmp_path / "corpus" / f"{index}.jsonl", make_records(12, seed=index, prefix=f"m{index}"))
    local = build_in_process(write_pipeline(tmp_path, tokenizer_path, ["corpus"]), str(tmp_path / "local"))
    merged = write_pipeline(tmp_path, tokenizer_path, ["corpus"], extra="\n[build]\nmerge_fan_in = 2\n",
                            name="merged.toml")
    return local.snapshot.id, merged


def test_merged_runs_on_an_s3_store_give_the_local_unmerged_snapshot(tmp_path: Path, tokenizer_path: Path) -> None:
    """Five parts merged in pairs on an S3 store: runs stored, read back by the order tasks (and
    the merge records collected by gc past the grace period); the snapshot of a local build
    that merged nothing."""
    unmerged, merged = _five_parts_merged_in_pairs(tmp_path, tokenizer_path)
    store_url = f"{new_bucket()}/store"
    result = build_in_process(merged, store_url)
    assert result.snapshot.id == unmerged and result.stages["merge"].ran == 3
    store = open_store(store_url)
    assert len(committed_records(store, "merge")) == 3
    run("gc", "--grace", "0s", "--store", store_url)
    assert not committed_records(store, "merge")
    assert build_in_process(merged, store_url).snapshot.id == unmerged


def test_racing_merged_builders_write_each_object_once(tmp_path: Path, tokenizer_path: Path) -> None:
    """Three builds that merge (fan-in 2 over five parts) at once on one S3 store: the snapshot
    of an unmerged local build, one version of every object and record (merge records and runs
    included), and a store that fsck finds clean."""
    unmerged, merged = _five_parts_merged_in_pairs(tmp_path, tokenizer_path)
    store = f"{new_bucket(versioned=True)}/store"
    builders = [start("build", merged, "--store", store, "--workers", "1") for _ in range(3)]
    assert {finish(process).stdout.split()[-1] for process in builders} == {unmerged}
    by_key: dict[str, int] = {}
    for version in versions(store + "/"):
        key = version["Key"].removeprefix("store/")
        by_key[key] = by_key.get(key, 0) + 1
    assert len(committed_records(open_store(store), "merge")) == 3
    assert {key: count for key, count in by_key.items() if count != 1 and not key.startswith(("refs/", "leases/"))} == {}
    run("fsck", "--store", store)


class CountStoreRequests:
    """A server hook counting the requests under the store's prefix: PUTs and GETs by the folder
    of their key (`tasks`, `packs`, `objects`, ...), and LISTs."""

    def __init__(self, bucket: str) -> None:
        self.bucket, self.counts = bucket, Counter[str]()

    def __call__(self, environ: dict[str, Any]) -> None:
        path, method = environ["PATH_INFO"], environ["REQUEST_METHOD"]
        if "prefix=" in environ.get("QUERY_STRING", "") and method == "GET":
            self.counts["LIST"] += 1
        elif path.startswith(f"/{self.bucket}/store/"):
            self.counts[f"{method} {path.removeprefix(f'/{self.bucket}/store/').split('/')[0]}"] += 1


def test_a_first_build_on_s3_commits_in_groups_and_asks_nothing_a_task(hooks: list[RequestHook]) -> None:
    """300 toy tasks on S3 (issue 44): planning lists the stage's records (sixteen LISTs) instead of
    a 404 GET a task, the commits are a few pack PUTs instead of a PUT a task, and a resume plans
    from the packs (a GET a pack) and runs nothing."""
    from tests.runner.test_stage import CODE, Uppering

    url = new_bucket()
    store = open_store(f"{url}/store")
    counter = CountStoreRequests(bucket_of(url))
    hooks[:] = [counter]
    texts = tuple(f"text {index}" for index in range(300))
    first = Runner(store, InProcessExecutor(), Progress(quiet=True), CODE)
    started = time.monotonic()
    objects = first.run_stage(Uppering(), texts).objects
    elapsed = time.monotonic() - started
    packs = counter.counts["PUT packs"]
    assert first.stages["upper"].ran == 300 and counter.counts["PUT objects"] == 300
    # a group at most every GROUP_SECONDS, and the stage's last (CI on 5505945, under load: 36 in
    # about 7 s, against a fixed bound of 30)
    assert 1 <= packs <= elapsed / driver.GROUP_SECONDS + 2 and packs < 300 and counter.counts["PUT tasks"] == 0, \
        (counter.counts, elapsed)
    assert counter.counts["GET tasks"] == 0 and counter.counts["LIST"] <= 2 + 16 + 1, counter.counts
    counter.counts.clear()
    again = Runner(store, InProcessExecutor(), Progress(quiet=True), CODE)
    assert again.run_stage(Uppering(), texts).objects == objects and again.stages["upper"].ran == 0
    assert counter.counts["GET packs"] == packs and counter.counts["GET tasks"] == 0, counter.counts
    assert not {key for key in counter.counts if key.startswith("PUT")}, counter.counts
