"""`prep.data.Reader`: deterministic token windows (or documents) from snapshots, resumable
exactly on any world size, with a state that names the content it was reading.

Sample i of a source is the `seq_len + 1` tokens starting at `i * seq_len` of its token stream
(consecutive samples share one boundary token). Each epoch visits every sample once in a seeded
permutation (prep.data.permutation), a new one per epoch. Global sample k comes from the source
the mixture schedule gives it (prep.data.mixture); step s's global batch is samples
[s * G, (s + 1) * G), and rank r of W reads rows [r * m, (r + 1) * m) with m = G // W. So every
batch is a pure function of (sources, seed, seq_len, G, step), whatever W or the worker count.

Which samples a rank's rows of a step are is computed a block of steps ahead while the steps come
at a steady stride (step after step, or a DataLoader worker's every n-th; StepSamples): the sample
permutation costs mostly per call, not per sample, so one call for AHEAD_SAMPLES rows costs about
what one for a small batch does. A step's samples are a pure function of the step, however they
were computed.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from prep.data import checks
from prep.data.checks import MAX_SAMPLES as MAX_SAMPLES  # where ledger, torch and the tests find them
from prep.data.checks import STATE_SCHEMA as STATE_SCHEMA
from prep.data.mixture import MixtureSpec, Schedule, SourceSpec, mixture_hash, parse_mixture
from prep.data.nodecache import CacheOptions, NodeCache
from prep.data.permutation import IndexPermutation
from prep.data.plan import Need, Plan
from prep.data.prefetch import Prefetcher
from prep.data.remote import CachedSource
from prep.data.source import SnapshotSource
from prep.errors import ConfigError, PrepError, UsageError
from prep.project import store_url
from prep.storage import open_store
from prep.storage.backend import Store
from prep.store.marker import open_existing

MODES = ("tokens", "documents")
PLAN_GROWTH = 8  # plan steps computed in one block: the first window, then each time it is this short
AHEAD_SAMPLES = 16384  # rows whose samples one block computes (at least one step's)

SamplesOf = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]


@dataclass
class ReaderStats:
    """What producing batches cost: seconds spent, bytes read, samples served per source."""

    fetch_seconds: float = 0.0
    last_step_seconds: float = 0.0
    steps: int = 0
    bytes_read: int = 0
    samples_per_source: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        mean = self.fetch_seconds / self.steps if self.steps else 0.0
        return {"fetch_seconds": self.fetch_seconds, "fetch_seconds_last_step": self.last_step_seconds,
                "fetch_seconds_per_step": mean, "steps": self.steps, "bytes_read": self.bytes_read,
                "samples_per_source": dict(self.samples_per_source)}


class _Stores:
    """The store snapshot specs resolve in: the one given, else the one the CLI would use
    (prep.project.store_url: $PREP_STORE, the project config found walking up, ./prep-store),
    found on first need and never created."""

    def __init__(self, given: Store | None) -> None:
        self.found = given

    def __call__(self) -> Store:
        if self.found is None:
            self.found = open_existing(store_url())
        return self.found


def _open_sources(source: str | os.PathLike[str], stores: _Stores,
                  cache: NodeCache | None) -> tuple[MixtureSpec, list[SnapshotSource]]:
    """A mixture file, a pulled folder or a snapshot spec, resolved to snapshot sources."""
    path = Path(source)
    if path.suffix == ".toml" and path.is_file():
        mixture = parse_mixture(path)
        sources = [_open_entry(path, index, spec, stores, cache) for index, spec in enumerate(mixture.sources)]
        for opened in sources:  # the process's open-file budget is shared by the mixture's sources
            opened.max_open = max(1, opened.max_open // len(sources))
        return mixture, sources
    return MixtureSpec(0, (SourceSpec(str(source)),)), [_open_one(source, stores, cache)]


def _open_entry(mixture: Path, index: int, spec: SourceSpec, stores: _Stores, cache: NodeCache | None) -> SnapshotSource:
    """A mixture's source `index`; one that does not resolve is a ConfigError naming the file and key
    (a shard that fails its check or cannot be read keeps its own error and exit code)."""
    try:
        return _open_one(_relative(mixture, spec.snapshot), stores, cache)
    except PrepError as exc:
        if exc.exit_code != ConfigError.exit_code:
            raise
        raise ConfigError(f"{mixture}: source[{index}].snapshot: {exc.message}") from None


def missing_folder(source: str) -> bool:
    """Whether `source` names a path that does not exist: it holds a slash or starts with a dot, as no snapshot spec does."""
    return ("/" in source or os.sep in source or source.startswith(".")) and not Path(source).exists()


def _open_one(source: str | os.PathLike[str], stores: _Stores, cache: NodeCache | None) -> SnapshotSource:
    """A pulled folder as it is; a snapshot spec through the node-local cache when there is one."""
    path = Path(source)
    if path.is_dir():
        return SnapshotSource.open(path)
    text = os.fspath(source)
    if missing_folder(text):
        raise UsageError(f"{text}: no such folder (a source is a pulled snapshot folder, a mixture file or a "
                         "snapshot spec such as web@latest)")
    if cache is not None:
        return CachedSource.resolve(text, stores(), cache)
    return SnapshotSource.open(text, stores())


def _cache_for(stores: _Stores, cache: dict[str, Any]) -> NodeCache | None:
    """The node-local cache the options ask for (cache_dir and cache_bytes go together)."""
    if cache.get("cache_dir") is None and cache.get("cache_bytes") is None:
        return None
    if cache.get("cache_dir") is None or cache.get("cache_bytes") is None:
        raise UsageError("a node-local cache needs cache_dir=... and cache_bytes=... together")
    folder = cache["cache_dir"]
    if not isinstance(folder, (str, os.PathLike)):
        raise UsageError(f"cache_dir must be a path, got {folder!r}")
    return NodeCache(stores(), CacheOptions(**{**cache, "cache_dir": Path(folder)}))


def _relative(mixture: Path, spec: str) -> str:
    """A source given as a folder is relative to the mixture file; specs stay as they are."""
    candidate = mixture.parent / spec
    return str(candidate) if candidate.is_dir() else spec


def _pairs(source: np.ndarray, epoch: np.ndarray) -> list[tuple[int, int]]:
    """The distinct (source, epoch) pairs, sorted. Not np.unique: its first call imports numpy.ma,
    20 ms of start-up; and not one packed integer per pair, which aliases past 2**32 epochs."""
    order = np.lexsort((epoch, source))
    sources, epochs = source[order], epoch[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (sources[1:] != sources[:-1]) | (epochs[1:] != epochs[:-1])
    return list(zip(sources[first].tolist(), epochs[first].tolist()))


class Exhausted(Exception):
    """A source has served its max_epochs: the mixture has no next batch."""


class StepSamples:
    """(source, sample) of one rank's rows of a step, from `samples_of(global samples)`."""

    def __init__(self, samples_of: SamplesOf, global_batch_size: int, rank: int, rows: int) -> None:
        self._samples_of, self._global, self._rows = samples_of, global_batch_size, rows
        self._columns = rank * rows + np.arange(rows, dtype=np.int64)
        self._kept: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._last: int | None = None
        self._ahead = 1  # steps in the last block

    def take(self, step: int, planned: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The step's (source, sample): `planned` when given, else kept from a block, else a new block:
        this step alone, or, when it lies a positive stride after the last one, it and the next ones at that stride."""
        stride = step - self._last if self._last is not None else 0
        self._last = step
        found = planned if planned is not None else self._kept.pop(step, None)
        if found is None:  # blocks double while the stride holds: a short read computes little it does not use
            self._ahead = min(2 * self._ahead, max(1, AHEAD_SAMPLES // self._rows)) if stride > 0 else 1
            count = min(self._ahead, (MAX_SAMPLES // self._global - 1 - step) // max(stride, 1) + 1)
            self._kept = self._block(step + max(stride, 1) * np.arange(count, dtype=np.int64))
            found = self._kept.pop(step)
        return found

    def _block(self, steps: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """(source, sample) of `steps` by step; fewer steps (halving) when a later one lies past a
        source's max_epochs, Exhausted when the first does."""
        try:
            source, _, sample = self._samples_of((steps[:, None] * self._global + self._columns).ravel())
        except Exhausted:
            if len(steps) == 1:
                raise
            return self._block(steps[:len(steps) // 2])
        rows = self._rows
        return {at: (source[k * rows:(k + 1) * rows], sample[k * rows:(k + 1) * rows])
                for k, at in enumerate(steps.tolist())}


class Reader:
    """Batches of token windows (numpy int64, shape (G // W, seq_len + 1)) or lists of documents."""

    def __init__(self, source: str | os.PathLike[str], seq_len: int, global_batch_size: int, rank: int = 0,
                 world_size: int = 1, seed: int = 0, store: Store | str | os.PathLike[str] | None = None,
                 mode: str = "tokens",
                 **cache: Any) -> None:
        """`cache`: cache_dir, cache_bytes, prefetch_steps, prefetch_bytes, jobs, policy, horizon
        (prep.data.nodecache.CacheOptions): read snapshot specs straight from `store` through them."""
        if mode not in MODES:
            raise UsageError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        seq_len, global_batch_size, world_size, rank, seed = checks.settings(seq_len, global_batch_size, world_size, rank,
                                                                           seed)
        unknown = sorted(set(cache) - set(CacheOptions.__dataclass_fields__))
        if unknown:
            raise UsageError(f"Reader got an unknown option {unknown[0]!r}")
        stores = _Stores(open_store(os.fspath(store)) if isinstance(store, (str, os.PathLike)) else store)
        self.seq_len, self.global_batch_size, self.seed, self.mode = seq_len, global_batch_size, seed, mode
        self.rank, self.world_size = rank, world_size
        self.rows = global_batch_size // world_size
        self.plan: Plan | None = None
        self._prefetcher: Prefetcher | None = None
        self.cache: NodeCache | None = None
        try:
            self.cache = _cache_for(stores, cache)
            self._open(source, stores)
        except BaseException:
            self.close()  # else a failed reader keeps its cache user and the pins of what it read
            raise
        self._settings = (source, seq_len, global_batch_size,  # the store found, so workers read the same one
                          {"rank": rank, "world_size": world_size, "seed": seed, "store": stores.found, "mode": mode,
                           **cache})

    def _open(self, source: str | os.PathLike[str], stores: _Stores) -> None:
        """Resolve the sources, count their samples, and start the plan when there is a cache (prefetch: at the first batch)."""
        self.mixture, self.sources = _open_sources(source, stores, self.cache)
        self._bounds = [s.document_bounds() for s in self.sources] if self.mode == "documents" else []
        self.sizes = [self._samples_in(index) for index in range(len(self.sources))]
        self._sizes = np.asarray(self.sizes, dtype=np.int64)
        empty = [s.id for s, n in zip(self.sources, self.sizes) if n == 0]
        if empty:
            raise UsageError(f"{empty[0]}: too few tokens for one sample of seq_len {self.seq_len}")
        self.schedule = Schedule([spec.weight for spec in self.mixture.sources])
        self.mixture_id = mixture_hash(self.mixture.seed, [(s.id, spec.weight, spec.max_epochs)
                                                           for s, spec in zip(self.sources, self.mixture.sources)])
        self.consumed = 0  # global samples handed out before the next step
        self._permutations: dict[tuple[int, int], IndexPermutation] = {}
        self._stats = ReaderStats(samples_per_source={s.id: 0 for s in self.sources})
        self._planned: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # step -> (source, sample), from the plan
        self._steps = StepSamples(self._samples_of, self.global_batch_size, self.rank, self.rows)
        if self.cache is not None:
            options = self.cache.options
            self.plan = self.cache.plan = Plan(self._needs_block, max(options.horizon, options.prefetch_steps or 1),
                                               minimum=(options.prefetch_steps or 0) + 1, initial=PLAN_GROWTH,
                                               grow=PLAN_GROWTH)

    def _samples_in(self, source: int) -> int:
        if self.mode == "documents":
            return len(self._bounds[source]) - 1
        return max(0, (self.sources[source].total_tokens - 1) // self.seq_len)

    def _permutation(self, source: int, epoch: int) -> IndexPermutation:
        key = (source, epoch)
        if key not in self._permutations:
            material = f"{self.seed}:{self.mixture.seed}:{self.sources[source].id}:{source}:{epoch}".encode()
            self._permutations = {k: v for k, v in self._permutations.items() if k[0] != source or k[1] >= epoch - 1}
            self._permutations[key] = IndexPermutation(self.sizes[source], int.from_bytes(
                hashlib.sha256(material).digest()[:8], "little"))
        return self._permutations[key]

    def sample_ids(self, first: int, count: int) -> list[tuple[int, int, int]]:
        """(source, epoch, sample index) of global samples [first, first + count); raises
        Exhausted when one of them lies past its source's max_epochs."""
        source, epoch, sample = self._samples(*checks.span(first, count))
        return list(zip(source.tolist(), epoch.tolist(), sample.tolist()))

    def _samples(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._samples_of(np.arange(first, first + count, dtype=np.int64))

    def _samples_of(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(source, epoch, sample index) of the global samples `samples`."""
        source, local = self.schedule.place(samples)
        epoch, position = np.divmod(local, self._sizes[source])
        sample = np.empty(len(samples), dtype=np.int64)
        pairs = _pairs(source, epoch)
        for s, e in pairs:
            cap = self.mixture.sources[s].max_epochs
            if cap is not None and e >= cap:
                raise Exhausted(f"{self.sources[s].id} has served its max_epochs = {cap}")
            chosen = (source == s) & (epoch == e) if len(pairs) > 1 else slice(None)
            sample[chosen] = self._permutation(s, e)(position[chosen])
        return source, epoch, sample

    def window(self, source: int, sample: int) -> np.ndarray:
        """The tokens of one sample (tokens mode) or one document (documents mode)."""
        self._start_prefetch()  # the files it reads stay pinned: its threads answer others' pressure
        if self.mode == "documents":
            bounds = self._bounds[source]
            return self.sources[source].tokens(int(bounds[sample]), int(bounds[sample + 1] - bounds[sample]))
        return self.sources[source].tokens(sample * self.seq_len, self.seq_len + 1)

    def spans(self, step: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """(source, token starts, lengths) of this rank's rows of step `step`, source by source."""
        return self._spans(*self._samples(step * self.global_batch_size + self.rank * self.rows, self.rows)[::2])

    def _spans(self, source: np.ndarray, sample: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
        found = []
        for index in range(len(self.sources)):
            picked = sample[source == index]
            if not len(picked):
                continue
            if self.mode == "documents":
                bounds = self._bounds[index]
                found.append((index, bounds[picked], bounds[picked + 1] - bounds[picked]))
            else:
                found.append((index, picked * self.seq_len, np.full(len(picked), self.seq_len + 1, np.int64)))
        return found

    def _needs_block(self, step: int, count: int) -> list[list[Need]]:
        """The stored objects steps [step, step + count) read through the cache, step by step in
        reading order (the plan's input); fewer lists when the reader ends sooner."""
        rows = ((step + np.arange(count, dtype=np.int64))[:, None] * self.global_batch_size
                + self.rank * self.rows + np.arange(self.rows, dtype=np.int64)).ravel()
        try:
            source, _, sample = self._samples_of(rows)
        except Exhausted:
            return self._needs_block(step, count // 2) if count > 1 else []
        for at in range(count):
            self._planned[step + at] = (source[at * self.rows:(at + 1) * self.rows],
                                        sample[at * self.rows:(at + 1) * self.rows])
        steps = np.repeat(np.arange(count, dtype=np.int64), self.rows)
        needs: list[list[Need]] = [[] for _ in range(count)]
        for index in range(len(self.sources)):
            src = self.sources[index]
            chosen = source == index
            if not isinstance(src, CachedSource) or not chosen.any():
                continue
            ((_, starts, lengths),) = self._spans(np.full(int(chosen.sum()), index, np.int64), sample[chosen])
            first, last = src.shard_span(starts, lengths)
            width = len(src.shards)
            keys = set((steps[chosen] * width + first).tolist()) | set((steps[chosen] * width + last).tolist())
            for at, a, b in zip(steps[chosen][last - first > 1].tolist(), first[last - first > 1].tolist(),
                                last[last - first > 1].tolist()):
                keys.update(at * width + shard for shard in range(a + 1, b))
            for key in sorted(keys):
                needs[key // width].append(src.bin_needs[key % width])
        return needs

    def _advance(self, step: int, after: bool) -> None:
        """Slide the plan to `step` and queue the prefetches its lookahead asks for: after a batch
        (the plan grows, idle pins the step does not need are dropped), or before one that is not
        the step the plan expects (the first, or a jump)."""
        if self.plan is None or self.cache is None:
            return
        if after:
            if self._planned and min(self._planned) < step:  # steps skipped by this reader
                for stale in [at for at in self._planned if at < step]:
                    del self._planned[stale]
            self.plan.advance(step)
            self.cache.settle(self.plan.objects(step))
        elif self.plan.start != step or not self.plan.covers(step):
            self._planned.clear()
            self.plan.advance(step, grow=False)
        else:
            return
        prefetcher = self._start_prefetch()
        if prefetcher is not None:
            prefetcher.kick()

    def _start_prefetch(self) -> Prefetcher | None:
        """The prefetch threads, started by the first read: a reader that never reads (the one a
        DataLoader's main process keeps for its state) runs none. None without a cache."""
        if self._prefetcher is None and self.cache is not None and self.plan is not None:
            options = self.cache.options
            self._prefetcher = Prefetcher(self.cache, self.plan, options.prefetch_steps, options.prefetch_bytes,
                                          options.jobs)
        return self._prefetcher

    def batch(self, step: int) -> Any:
        """This rank's rows of global batch `step` (a pure function of the step)."""
        step = checks.whole("step", step, 0)
        if (step + 1) * self.global_batch_size > MAX_SAMPLES:
            raise UsageError(f"step {step} lies past the last step a reader serves ({MAX_SAMPLES} samples)")
        started = time.perf_counter()
        self._advance(step, after=False)
        source, sample = self._steps.take(step, self._planned.pop(step, None))  # the plan's, or a block's ahead
        result: Any
        if self.mode == "documents":
            result = [self.window(s, i) for s, i in zip(source.tolist(), sample.tolist())]
        elif len(self.sources) == 1:
            result = self.sources[0].windows(sample * self.seq_len, self.seq_len + 1)
        else:
            result = np.empty((self.rows, self.seq_len + 1), dtype=np.int64)
            for index, src in enumerate(self.sources):
                chosen = source == index
                if chosen.any():
                    result[chosen] = src.windows(sample[chosen] * self.seq_len, self.seq_len + 1)
        for index, served in enumerate(np.bincount(source, minlength=len(self.sources)).tolist()):
            self._stats.samples_per_source[self.sources[index].id] += served
        spent = time.perf_counter() - started
        self._stats.fetch_seconds += spent
        self._stats.last_step_seconds = spent
        self._stats.steps += 1
        self._advance(step + 1, after=True)  # fetch ahead while the caller computes
        return result

    def close(self) -> None:
        """Stop prefetching, close the shard files and release the cache (its pins and reservations stop counting)."""
        for source in getattr(self, "sources", ()):
            source.close()
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None
        if self.cache is not None:
            self.cache.close()
            self.cache = None

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its settings and state (a spawned worker opens its own cache user and prefetch
        threads); unpickling refuses, as load_state_dict does, sources that resolve differently by then."""
        return (_restore, (self._settings, self.state_dict()))

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Any]:
        while True:
            step = self.consumed // self.global_batch_size
            try:
                batch = self.batch(step)
            except Exhausted:
                return
            self.consumed += self.global_batch_size
            yield batch

    def stats(self) -> dict[str, Any]:
        """fetch_seconds (total, last step, mean per step), bytes read, samples served per source;
        with a cache, its hits, misses, bytes fetched (and twice), peak size and prefetch lead."""
        self._stats.bytes_read = sum(s.bytes_read for s in self.sources)
        found = self._stats.to_json()
        if self.cache is not None:
            found["cache"] = self.cache.stats.to_json()
        return found

    def state_dict(self) -> dict[str, Any]:
        """Where the run is, O(1) and JSON-serialisable; it names the content it was reading."""
        return {"schema": STATE_SCHEMA, "sources": [s.id for s in self.sources], "mixture": self.mixture_id,
                "seed": self.seed, "seq_len": self.seq_len, "global_batch_size": self.global_batch_size,
                "mode": self.mode, "samples": self.consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a state; refuse one saved over other data or settings (world size may differ)."""
        self.consumed = checks.state_samples(state, self.state_dict())


def _restore(settings: tuple[Any, ...], state: dict[str, Any]) -> Reader:
    """A pickled Reader: opened again from its settings, then resumed at its state."""
    source, seq_len, global_batch_size, options = settings
    reader = Reader(source, seq_len, global_batch_size, **options)
    try:
        reader.load_state_dict(state)
    except BaseException:
        reader.close()
        raise
    return reader
