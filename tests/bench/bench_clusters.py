"""Benchmark (not a test): the near-duplicate cluster stage's memory per task (issue 42), the
partitioned large-star/small-star rounds against the one-task union-find they replaced, side by
side in one run, on synthetic candidate pairs.

    python -m tests.bench.bench_clusters [--pairs 2,8,32] [--ranges 1,4,16 | 1,4,16/4,16/16] [--workers 2]
        [--pairs-per-object 1000000] [--giant 100000] [--chain 100000] [--workdir /tmp/prep-bench]

(`--ranges`: one list for every size, or one a size separated by `/`. docs/performance.md says what
was run on this machine: 32M pairs on 1 and 4 ranges takes hours of its shared cores.)

Pairs (`--pairs`, millions of distinct candidate pairs; made once under the workdir, reused):
shaped like the bucket stage's output on a web crawl. 90% of the pairs join many small clusters
whose sizes are 1 + a Zipf(2) draw, capped at 1,000 (heavy-tailed: most are pairs, a few hundreds),
each a random recursive tree (every member linked to a random earlier one: stars and short paths,
as overlapping band buckets' stars make them); 5% are giant stars of `--giant` members (one at 2M
pairs, 16 at 32M) centred on a random member; 5% are paths of `--chain` members in random number
order (the rounds' worst case). Every member is a distinct global number `part << 32 | row` drawn
at random from a corpus of 8 times the members in parts of 2**20 rows; each pair's order key high
word is a fixed mix of its number. Each pair goes to 1, 2 or 3 (half, 30%, 20%) distinct pairs
objects (`prep.workfiles.pairs.write_pairs`), as band buckets would find it in 1-3 bands, about
`--pairs-per-object` records an object (a bucket task holds about 2,000,000 band records).

Measured, each task a fresh process reading and writing local files as a worker would, `--workers`
at a time: forked from a fork server that holds the imports and nothing else (as prep's workers
are forked from its zygote; a fresh interpreter a task cost 0.3 CPU s, and there are hundreds of
tasks), it reports its own CPU seconds and its peak RSS, the VmHWM it reads of itself as it ends
(exact where a sampler can miss a short peak at the end; and unlike `getrusage`'s ru_maxrss it
does not count the memory of the process it was started from); the wall is the benchmark's:
- union-find: one task reads every pairs object and joins them with tests/neardup/unionfind.py's
  `clusters` over all pairs at once (what the cluster task did before 6ceda17, and what datatrove's
  cluster stage does: one process over all pairs), then writes the drops object;
- route: one task a pairs object (`prep.stages.starrounds.routed_pairs`): its edges held both ways
  and its documents' nodes. Its memory is the pairs object's, the same whatever the ranges;
- rounds, for each `--ranges` count: a large-star task a range, then (unless every range was
  settled) a small-star task a range, round after round (`star_round`), then a drops task a range
  (`range_drops`), as prep/runner/nearrounds.py plans them; reported: rounds, the largest peak of
  any round or drops task, the tasks' CPU seconds in all and the stages' wall;
- merge: one task merges the ranges' drops objects (`merge_drops`, holding MERGE_BYTES of records).
A task that imports the same modules and does nothing gives the floor every process pays.

Checked: the merged drops object of every range count is byte for byte the union-find's, and its
count is the members less the clusters made. Printed: each range count's largest task peak over
the union-find's; the union-find's and each range count's peak at the largest size over the
smallest; the largest task's peak along the diagonal where the ranges grow with the pairs (a size
on as many ranges as it is times the smallest: 2M on 1 range, 8M on 4, 32M on 16, a fixed number
of edges a range), which must stay about flat.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import os
import resource
import shutil
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]
ROWS_PER_PART = 1 << 20
SPREAD = 8
"""Corpus documents per cluster member: near duplicates are a share of a crawl, spread over it."""
SMALL, GIANT_SHARE, CHAIN_SHARE = 0.90, 0.05, 0.05
MAX_SMALL = 1000
COPIES = (0.5, 0.3, 0.2)
"""The share of pairs found in 1, 2 and 3 band buckets."""


@dataclass(frozen=True)
class Made:
    """A size's pairs objects and what the graph is: members, clusters, distinct pairs, records stored."""

    objects: tuple[Path, ...]
    members: int
    clusters: int
    pairs: int
    records: int


@dataclass(frozen=True)
class Measured:
    """One task run: its wall and CPU seconds, its peak RSS, and what it replied."""

    seconds: float
    cpu: float
    peak: int
    reply: dict[str, Any]


@dataclass(frozen=True)
class Stage:
    """Tasks run `workers` at a time: the wall of them all and each task's measurement."""

    seconds: float
    tasks: tuple[Measured, ...]

    @property
    def cpu(self) -> float:
        return sum(task.cpu for task in self.tasks)

    @property
    def peak(self) -> int:
        return max((task.peak for task in self.tasks), default=0)



def graph(pairs: int, giant: int, chain: int, seed: int) -> tuple[Array, Array, int, int]:
    """Distinct edges (left < right, global numbers) of about `pairs` pairs, the members, the clusters."""
    rng = np.random.default_rng(seed)
    giants = max(1, round(pairs * GIANT_SHARE / giant))
    chains = max(1, round(pairs * CHAIN_SHARE / chain))
    sizes = small_sizes(rng, int(pairs * SMALL))
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    members = int(sizes.sum())
    local = np.arange(members, dtype=np.int64) - np.repeat(starts, sizes)
    child = np.flatnonzero(local)
    parent = child - local[child] + (rng.random(len(child)) * local[child]).astype(np.int64)
    ends = [(parent, child)]
    for _ in range(giants):
        ends.append((np.full(giant - 1, members, dtype=np.int64), members + np.arange(1, giant, dtype=np.int64)))
        members += giant
    for _ in range(chains):
        ends.append((members + np.arange(chain - 1, dtype=np.int64), members + np.arange(1, chain, dtype=np.int64)))
        members += chain
    numbers = spread(rng, members)
    a = numbers[np.concatenate([first for first, _ in ends])]
    b = numbers[np.concatenate([second for _, second in ends])]
    return np.minimum(a, b), np.maximum(a, b), members, len(sizes) + giants + chains


def small_sizes(rng: np.random.Generator, pairs: int) -> Array:
    """Cluster sizes 1 + Zipf(2), capped, whose trees have about `pairs` pairs in all."""
    sizes = 1 + np.minimum(rng.zipf(2.0, size=int(pairs / 1.5) + 1000), MAX_SMALL - 1)
    return sizes[:int(np.searchsorted(np.cumsum(sizes - 1), pairs)) + 1].astype(np.int64)


def spread(rng: np.random.Generator, members: int) -> Array:
    """`members` distinct global numbers `part << 32 | row`, at random over a corpus of SPREAD times as many, shuffled."""
    corpus = members * SPREAD
    drawn = np.unique(rng.integers(0, corpus, size=int(members * 1.2) + 1000))
    chosen = drawn[rng.permutation(len(drawn))[:members]]
    if len(chosen) < members:
        raise SystemExit("too few distinct numbers drawn")
    parts, rows = chosen // ROWS_PER_PART, chosen % ROWS_PER_PART
    return ((parts << 32) | rows).astype(np.uint64)


def key_hi(documents: Array) -> Array:
    """A document's order key high word: a fixed mix of its number, the same in every object."""
    from prep.neardup.stars import route_of

    keys: Array = route_of(np.asarray(documents, dtype=np.uint64) ^ np.uint64(0x5DEECE66D))
    return keys


def made_pairs(workdir: Path, millions: float, per_object: int, giant: int, chain: int) -> Made:
    """The pairs objects of a size (made once under `workdir`, reused)."""
    from prep.workfiles.pairs import CandidatePairs, write_pairs

    folder = workdir / f"clusters-{millions:g}M-{per_object}-{giant}-{chain}"
    done = folder / "made.json"
    if done.exists():
        facts = json.loads(done.read_text())
        return Made(tuple(folder / name for name in facts["objects"]), facts["members"], facts["clusters"],
                    facts["pairs"], facts["records"])
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(int(millions * 1000) + 1)
    left, right, members, clusters = graph(int(millions * 1e6), giant, chain, int(millions * 1000))
    order = np.lexsort((right, left))
    left, right = left[order], right[order]
    copies = 1 + np.searchsorted(np.cumsum(COPIES), rng.random(len(left)), side="right")
    records = int(copies.sum())
    count = max(3, -(-records // per_object))
    first = rng.integers(0, count, size=len(left))
    second = (first + 1 + rng.integers(0, count - 1, size=len(left))) % count
    step = 1 + rng.integers(0, count - 2, size=len(left))
    step += step >= (second - first) % count
    third = (first + step) % count
    names = []
    for bucket in range(count):
        mask = (first == bucket) | ((copies >= 2) & (second == bucket)) | ((copies >= 3) & (third == bucket))
        held_left, held_right = left[mask], right[mask]
        documents = np.unique(np.concatenate([held_left, held_right]))
        names.append(f"pairs-{bucket:04d}.obj")
        write_pairs(folder / names[-1], CandidatePairs(held_left, held_right, documents, key_hi(documents)), {})
    done.write_text(json.dumps({"objects": names, "members": members, "clusters": clusters, "pairs": len(left),
                                "records": records}))
    return made_pairs(workdir, millions, per_object, giant, chain)



def task_main(spec: dict[str, Any], reply_to: Connection) -> None:
    """Run one task of `spec` in this process and send back what it did, with this process's CPU
    seconds and peak RSS."""
    reply = TASKS[spec["kind"]](spec)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open("/proc/self/status") as status:
        reply["peak"] = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    reply["cpu"] = usage.ru_utime + usage.ru_stime
    reply_to.send(reply)


def _noop(spec: dict[str, Any]) -> dict[str, Any]:
    """Import what the tasks import, nothing else: the floor of every task's peak."""
    import prep.stages.starrounds
    import prep.workfiles.drops
    import prep.workfiles.edges
    import prep.workfiles.pairs  # noqa: F401
    import tests.neardup.unionfind  # noqa: F401

    return {}


def _union_find(spec: dict[str, Any]) -> dict[str, Any]:
    """Every pairs object read, their pairs joined at once by the union-find, the drops written."""
    from prep.workfiles.drops import drop_records, write_drops
    from prep.workfiles.pairs import read_pairs
    from tests.neardup.unionfind import clusters

    held = [read_pairs(Path(path)) for path in spec["inputs"]]
    documents = np.concatenate([pairs.documents for pairs in held])
    keys = np.concatenate([pairs.key_hi for pairs in held])
    documents, first = np.unique(documents, return_index=True)
    keys = keys[first]
    joined = clusters(np.concatenate([pairs.left for pairs in held]).astype(np.int64),
                      np.concatenate([pairs.right for pairs in held]).astype(np.int64))
    del held
    dropped = joined.duplicates()
    records = drop_records(dropped, joined.representative_of(dropped), keys[np.searchsorted(documents, dropped)])
    write_drops(Path(spec["out"]), records, {})
    return {"dropped": len(records)}


def _route(spec: dict[str, Any]) -> dict[str, Any]:
    from prep.stages.starrounds import routed_pairs
    from prep.workfiles.edges import write_edges, write_nodes
    from prep.workfiles.pairs import read_pairs

    edges, nodes = routed_pairs(read_pairs(Path(spec["inputs"][0])))
    write_edges(Path(spec["out"]), edges, {})
    write_nodes(Path(spec["nodes"]), nodes, {})
    return {"edges": len(edges)}


def _round(spec: dict[str, Any]) -> dict[str, Any]:
    from prep.stages.starrounds import star_round
    from prep.workfiles.edges import EDGES, read_range, write_edges

    held = read_range([Path(path) for path in spec["inputs"]], EDGES, spec["bucket"], spec["bits"])
    edges, settled = star_round(held, spec["large"])
    write_edges(Path(spec["out"]), edges, {})
    return {"held": len(held), "edges": len(edges), "settled": settled}


def _drops(spec: dict[str, Any]) -> dict[str, Any]:
    from prep.stages.starrounds import range_drops
    from prep.workfiles.drops import write_drops
    from prep.workfiles.edges import EDGES, NODES, read_range

    edges = read_range([Path(path) for path in spec["inputs"]], EDGES, spec["bucket"], spec["bits"])
    nodes = read_range([Path(path) for path in spec["nodes"]], NODES, spec["bucket"], spec["bits"])
    records, sizes = range_drops(edges, nodes)
    write_drops(Path(spec["out"]), records, {})
    return {"held": len(edges), "dropped": len(records)}


def _merge(spec: dict[str, Any]) -> dict[str, Any]:
    from prep.workfiles.drops import merge_drops

    merge_drops(Path(spec["out"]), [Path(path) for path in spec["inputs"]])
    return {}


TASKS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "noop": _noop, "unionfind": _union_find, "route": _route, "round": _round, "drops": _drops, "merge": _merge}


def forks() -> BaseContext:
    """Processes forked from a fork server that holds the tasks' imports and nothing else, as
    prep's workers are forked from its zygote: each task's peak is its own."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["numpy", "prep.stages.starrounds", "prep.workfiles.drops", "prep.workfiles.edges",
                                    "prep.workfiles.pairs", "tests.neardup.unionfind"])
    return context


def run_task(spec: dict[str, Any]) -> Measured:
    """One task in a fresh process, measured."""
    receiving, sending = FORKS.Pipe(duplex=False)
    started = time.perf_counter()
    process = FORKS.Process(target=task_main, args=(spec, sending))  # type: ignore[attr-defined]
    process.start()
    sending.close()
    try:
        reply: dict[str, Any] = receiving.recv()
    except EOFError:
        raise SystemExit(f"task {json.dumps(spec)[:300]} died") from None
    process.join()  # its exit code is not read: when two threads poll one child (another thread's start
    # polls every child) one of them reads 255; the reply is a task's last act, and a failed task sends none
    return Measured(time.perf_counter() - started, float(reply["cpu"]), int(reply["peak"]), reply)


def run_stage(specs: Sequence[dict[str, Any]], workers: int) -> Stage:
    """Tasks `workers` at a time, as a build's workers take them."""
    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        tasks = tuple(pool.map(run_task, specs))
    return Stage(time.perf_counter() - started, tasks)


FORKS = forks()



@dataclass(frozen=True)
class Rounds:
    """One range count's run: its stages (route shared by every range count), rounds, and the merged drops."""

    ranges: int
    rounds: int
    stars: tuple[Stage, ...]
    drops: Stage
    merge: Stage
    digest: str

    @property
    def largest(self) -> int:
        """The largest peak of any round or drops task: what a range's task holds."""
        return max(stage.peak for stage in (*self.stars, self.drops))

    @property
    def held(self) -> int:
        """The most edge records any round task held."""
        return max(int(task.reply["held"]) for stage in self.stars for task in stage.tasks)


def partitioned(work: Path, routed: tuple[list[str], list[str]], ranges: int, workers: int) -> Rounds:
    """The rounds over `ranges` ranges from the routed edges and nodes, each range's drops, their merge."""
    bits = ranges.bit_length() - 1
    folder = work / f"ranges-{ranges}"
    folder.mkdir()
    edges, nodes = routed
    stars: list[Stage] = []
    rounds = 0
    while True:
        rounds += 1
        large = _level(folder, f"large-{rounds}", edges, bits, True, workers)
        stars.append(large)
        if all(task.reply["settled"] for task in large.tasks):
            break
        larger = [str(folder / f"large-{rounds}-{bucket}.obj") for bucket in range(ranges)]
        stars.append(_level(folder, f"small-{rounds}", larger, bits, False, workers))
        edges = [str(folder / f"small-{rounds}-{bucket}.obj") for bucket in range(ranges)]
    drops = run_stage([{"kind": "drops", "inputs": edges, "nodes": nodes, "bucket": bucket, "bits": bits,
                        "out": str(folder / f"drops-{bucket}.obj")} for bucket in range(ranges)], workers)
    merged = folder / "drops.obj"
    merge = run_stage([{"kind": "merge", "inputs": [str(folder / f"drops-{bucket}.obj") for bucket in range(ranges)],
                        "out": str(merged)}], 1)
    digest = sha256(merged)
    shutil.rmtree(folder)
    return Rounds(ranges, rounds, tuple(stars), drops, merge, digest)


def _level(folder: Path, name: str, inputs: list[str], bits: int, large: bool, workers: int) -> Stage:
    """One large-star or small-star round over every range."""
    return run_stage([{"kind": "round", "inputs": inputs, "bucket": bucket, "bits": bits, "large": large,
                       "out": str(folder / f"{name}-{bucket}.obj")} for bucket in range(1 << bits)], workers)


def sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def megabytes(value: float) -> str:
    return f"{value / 2**20:,.0f}"


def compare(args: argparse.Namespace, millions: float) -> dict[str, Any]:
    """One size: the union-find, the route, and the rounds over each range count, printed; their peaks."""
    from prep.runner.nearrounds import EDGES_PER_RANGE
    from prep.stages.cuts import bucket_bits
    from prep.workfiles.indexed import MERGE_BYTES

    started = time.perf_counter()
    made = made_pairs(args.workdir, millions, args.pairs_per_object, args.giant, args.chain)
    label = f"{millions:g}M"
    print(f"{label}: {made.pairs:,} distinct pairs, {made.records:,} records in {len(made.objects)} pairs objects, "
          f"{made.members:,} members in {made.clusters:,} clusters (log2(members)^2 = "
          f"{math.log2(made.members) ** 2:.0f}); the build would use "
          f"{1 << bucket_bits(2 * made.records, EDGES_PER_RANGE)} ranges (made or found in "
          f"{time.perf_counter() - started:.0f} s)", flush=True)
    work = args.workdir / f"clusters-run-{label}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    objects = [str(path) for path in made.objects]
    union = run_stage([{"kind": "unionfind", "inputs": objects, "out": str(work / "unionfind.obj")}], 1)
    expected = sha256(work / "unionfind.obj")
    dropped = int(union.tasks[0].reply["dropped"])
    if dropped != made.members - made.clusters:
        raise SystemExit(f"{label}: the union-find dropped {dropped:,}, not members less clusters "
                         f"{made.members - made.clusters:,}")
    _row(label, "union-find, one task", 1, "", union.seconds, union.cpu, union.peak, union.peak)
    route = run_stage([{"kind": "route", "inputs": [path], "out": str(work / f"edges-{at}.obj"),
                        "nodes": str(work / f"nodes-{at}.obj")} for at, path in enumerate(objects)], args.workers)
    _row(label, "route (every range count)", len(route.tasks), "", route.seconds, route.cpu, route.peak, union.peak)
    routed = ([str(work / f"edges-{at}.obj") for at in range(len(objects))],
              [str(work / f"nodes-{at}.obj") for at in range(len(objects))])
    peaks: dict[str, int] = {"unionfind": union.peak, "route": route.peak}
    for ranges in args.ranges[millions]:
        run = partitioned(work, routed, ranges, args.workers)
        if run.digest != expected:
            raise SystemExit(f"{label}, {ranges} ranges: the drops object differs from the union-find's")
        tasks = sum(len(stage.tasks) for stage in (*run.stars, run.drops, run.merge))
        seconds = sum(stage.seconds for stage in (*run.stars, run.drops, run.merge)) + route.seconds
        cpu = sum(stage.cpu for stage in (*run.stars, run.drops, run.merge)) + route.cpu
        _row(label, f"rounds, {ranges} range{'s' if ranges > 1 else ''}", tasks + len(route.tasks), str(run.rounds),
             seconds, cpu, run.largest, union.peak)
        print(f"{'':>5} {'':<28} largest task held {run.held:,} edge records; merge of {ranges} drops objects: "
              f"{megabytes(run.merge.peak)} MB peak, {run.merge.seconds:.1f} s (MERGE_BYTES "
              f"{megabytes(MERGE_BYTES)} MB); drops identical to the union-find's", flush=True)
        peaks[f"ranges-{ranges}"] = run.largest
        peaks[f"merge-{ranges}"] = run.merge.peak
    shutil.rmtree(work)
    return peaks


def _row(label: str, what: str, tasks: int, rounds: str, seconds: float, cpu: float, peak: int, union: int) -> None:
    print(f"{label:>5} {what:<28} {tasks:>6} {rounds:>6} {seconds:9.1f} {cpu:9.1f} {megabytes(peak):>9} "
          f"{peak / union:7.2f}", flush=True)


def ratios(peaks: dict[float, dict[str, int]], floor: int) -> None:
    """The largest size's peaks over the smallest's, and the diagonal where ranges grow with the pairs."""
    sizes = sorted(peaks)
    small, large = sizes[0], sizes[-1]
    both = [key for key in peaks[small] if key in peaks[large] and not key.startswith("merge")]
    print(f"peak {large:g}M / {small:g}M (pairs x{large / small:g}; every process's floor {megabytes(floor)} MB): "
          + ", ".join(f"{key} {peaks[large][key] / peaks[small][key]:.2f}" for key in both))
    diagonal = [(size, f"ranges-{round(size / small)}") for size in sizes]
    diagonal = [(size, key) for size, key in diagonal if key in peaks[size]]
    if len(diagonal) > 1:
        first = peaks[diagonal[0][0]][diagonal[0][1]]
        print("largest task at a fixed number of pairs a range: " + ", ".join(
            f"{size:g}M on {key[7:]} {megabytes(peaks[size][key])} MB ({peaks[size][key] / first:.2f})"
            for size, key in diagonal) + "; above the floor: " + ", ".join(
            f"{(peaks[size][key] - floor) / max(first - floor, 1):.2f}" for size, key in diagonal))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", default="2,8,32", help="millions of distinct candidate pairs, comma-separated")
    parser.add_argument("--ranges", default="1,4,16", help="range counts (powers of two), comma-separated; or a "
                        "list a size, separated by '/' (1,4,16/4,16: the second size without 1 range)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="tasks run at once")
    parser.add_argument("--pairs-per-object", type=int, default=1_000_000, help="pair records a pairs object holds")
    parser.add_argument("--giant", type=int, default=100_000, help="members of each giant star")
    parser.add_argument("--chain", type=int, default=100_000, help="members of each path")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prep-bench"))
    args = parser.parse_args()
    sizes = [float(size) for size in args.pairs.split(",")]
    lists = [[int(ranges) for ranges in listed.split(",")] for listed in args.ranges.split("/")]
    args.ranges = dict(zip(sizes, lists if len(lists) == len(sizes) else lists[:1] * len(sizes)))
    if len(lists) not in (1, len(sizes)) or any(ranges < 1 or ranges & (ranges - 1) for ranges in sum(lists, [])):
        parser.error("--ranges: powers of two, one list or one a size")
    args.workdir.mkdir(parents=True, exist_ok=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M')} load average {os.getloadavg()[0]:.2f}, {args.workers} workers",
          flush=True)
    floor = run_task({"kind": "noop"}).peak
    print(f"{'pairs':>5} {'what':<28} {'tasks':>6} {'rounds':>6} {'wall s':>9} {'CPU s':>9} {'peak MB':>9} "
          f"{'/ u-f':>7}", flush=True)
    peaks = {size: compare(args, size) for size in sizes}
    ratios(peaks, floor)


if __name__ == "__main__":
    main()
