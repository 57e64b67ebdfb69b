"""What a Reader is given, checked before it is used: its settings, a state to resume from, a range
of global samples. Every refusal is a UsageError naming the key and value (shown short: a hostile
state may hold a megabyte string or a list nested past the recursion limit)."""

from __future__ import annotations

import reprlib
from typing import Any

import numpy as np

from prep.errors import IntegrityError, UsageError
from prep.manifest.schema import validate

STATE_SCHEMA = "prep.reader-state/1"
# Global samples a reader serves at most: every index it computes stays well inside int64 (a
# tampered state or a stray step would otherwise overflow numpy's arithmetic, silently or not).
MAX_SAMPLES = 1 << 62
_INTEGERS = ("seed", "seq_len", "global_batch_size", "samples")
_SHORT = reprlib.Repr()  # Python 3.11's takes no keywords
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict = 3, 80, 80, 4, 4


def shown(value: object) -> str:
    """A repr of `value` short enough for a one-line error, whatever its size or depth."""
    return _SHORT.repr(value)


def whole(name: str, value: object, low: int = 1, high: int | None = None) -> int:
    """`value` as an int in [low, high) (numpy integers too), else a UsageError naming it: a
    setting of 1.5 or "3" would fail mid-run, and a seed of 2**64 would read as seed 0 does (the
    permutation keeps 64 bits), as the state file's schema and the mixture file refuse them."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise UsageError(f"{name} must be an integer, got {value!r}")
    number = int(value)
    if number < low or (high is not None and number >= high):
        bounds = f"in [{low}, 2**64)" if high == 2**64 else f">= {low}"
        raise UsageError(f"{name} must be an integer {bounds}, got {number}")
    return number


def settings(seq_len: object, global_batch_size: object, world_size: object, rank: object,
             seed: object) -> tuple[int, int, int, int, int]:
    """A Reader's (seq_len, global_batch_size, world_size, rank, seed), checked."""
    seq_len, global_batch_size, world_size, rank, seed = (
        whole("seq_len", seq_len), whole("global_batch_size", global_batch_size),
        whole("world_size", world_size), whole("rank", rank, 0), whole("seed", seed, 0, 2**64))
    if global_batch_size > MAX_SAMPLES:  # not one step would lie below the last sample a reader serves
        raise UsageError(f"global_batch_size must be at most {MAX_SAMPLES}, got {global_batch_size}")
    if rank >= world_size:
        raise UsageError(f"rank {rank} is not below world_size {world_size}")
    if global_batch_size % world_size:
        raise UsageError(f"global_batch_size {global_batch_size} is not a multiple of world_size {world_size}")
    return seq_len, global_batch_size, world_size, rank, seed


def span(first: object, count: object) -> tuple[int, int]:
    """Global samples [first, first + count) as ints, refused unless they lie in [0, MAX_SAMPLES]."""
    start, size = whole("first", first, 0), whole("count", count, 0)
    if start + size > MAX_SAMPLES:
        raise UsageError(f"samples [{start}, {start + size}) lie past the last sample a reader serves ({MAX_SAMPLES})")
    return start, size


def sample_count(samples: object) -> int:
    """`samples` as an int in [0, MAX_SAMPLES]: past it no reader serves a sample (a scan would never end)."""
    count = whole("samples", samples, 0)
    if count > MAX_SAMPLES:
        raise UsageError(f"samples must be in [0, {MAX_SAMPLES}], got {count}")
    return count


def _shape(state: dict[Any, Any], mine: dict[str, Any]) -> None:
    """Refuse a state whose keys or value types are not those of `mine` (a bool, a float such as
    16.0, a numpy or torch scalar are not the integers the schema means)."""
    extra = [key for key in state if key not in mine]
    if extra:
        raise UsageError(f"reader state has an unknown key {shown(extra[0])}")
    missing = [key for key in mine if key not in state]
    if missing:
        raise UsageError(f"reader state lacks the key {missing[0]!r}")
    for key in _INTEGERS:
        if type(state[key]) is not int:
            raise UsageError(f"reader state {key} must be an integer, got {shown(state[key])}")
    for key in ("mixture", "mode"):
        if type(state[key]) is not str:
            raise UsageError(f"reader state {key} must be a string, got {shown(state[key])}")
    sources = state["sources"]
    if type(sources) is not list or not all(type(source) is str for source in sources):
        raise UsageError(f"reader state sources must be a list of snapshot ids, got {shown(sources)}")


def state_samples(state: object, mine: dict[str, Any]) -> int:
    """The samples consumed of `state`, once it is checked to be a reader state over the data and
    settings of `mine` (a reader's own state_dict(); world size may differ)."""
    if not isinstance(state, dict):
        raise UsageError(f"not a prep reader state: expected a dict, got a {type(state).__name__}")
    if state.get("schema") != STATE_SCHEMA:
        raise UsageError(f"not a prep reader state: schema {shown(state.get('schema'))}, expected {STATE_SCHEMA}")
    _shape(state, mine)
    for key in ("sources", "mixture", "seed", "seq_len", "global_batch_size", "mode"):
        if state[key] != mine[key]:
            raise UsageError(f"reader state is for {key} {shown(state[key])}, this reader has {mine[key]!r}")
    try:
        validate(state, STATE_SCHEMA, "reader state")
    except IntegrityError as exc:
        raise UsageError(str(exc)) from None
    samples: int = state["samples"]
    if not 0 <= samples <= MAX_SAMPLES or samples % mine["global_batch_size"]:
        raise UsageError(f"reader state has an invalid sample count {samples!r}")
    return samples
