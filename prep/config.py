"""The pipeline file (TOML): strict parsing into frozen values, and the resolved config.

Unknown keys and wrong types are errors naming the key. The resolved config is what a snapshot
records: it holds every setting that changes output bytes and nothing machine-specific
(no absolute paths, no store location, no worker count).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from prep.errors import ConfigError, UsageError
from prep.formats import registry
from prep.neardup.settings import NearDupSettings, parse_settings
from prep.quality.gate import Checks, parse_checks
from prep.steps import catalog
from prep.steps.protocol import DocumentStep, SettingError
from prep.store.layout import MAX_NAME_CHARS, valid_name
from prep.store.retention import Policy, check_policy, parse_duration

FORMATS = ("auto", "jsonl", "parquet", "text", "hf")
BACKENDS = ("auto", "tokenizers", "gigatoken")
ON_ERROR = ("fail", "skip")
SEED_LIMIT = 2**64  # the shuffle mixes the seed as an unsigned 64-bit integer
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
DEFAULT_TOKENIZER_CACHE = 256 * 2**20
# The largest record a build reads (a JSON line, a text value, a text file): a larger one is a bad
# record, never read whole, so that one record cannot take a worker's memory (docs/build.md).
DEFAULT_MAX_DOCUMENT_BYTES = 64 * 2**20
"""How far a tokenize worker may grow past its size once its tokenizer encoded a first batch
before the tokenizer is loaded afresh (prep.stages.tokenize): a bound on its pre-token cache."""
DEFAULT_MERGE_FAN_IN, MIN_MERGE_FAN_IN, MAX_MERGE_FAN_IN = 128, 2, 512
"""[build] merge_fan_in: its default and bounds (a task holds that many entries objects open at once)."""
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


@dataclass(frozen=True)
class InputConfig:
    paths: tuple[str, ...]
    format: str = "auto"
    text_field: str = "text"
    id_field: str | None = None
    on_error: str = "fail"
    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES
    metadata_fields: tuple[str, ...] = ()  # carried into every format's per-document metadata
    exclude: tuple[str, ...] = ()  # deletion requests: lists of ids and text hashes a build drops (prep.inputs.exclusions)


@dataclass(frozen=True)
class TokenizerConfig:
    path: str
    eos: str = "<|endoftext|>"
    encode_special_tokens: bool = True
    backend: str = "auto"


@dataclass(frozen=True)
class DedupConfig:
    exact: bool = True
    near: NearDupSettings | None = None  # [dedup.near]: near-duplicate removal (docs/build.md)


@dataclass(frozen=True)
class OutputConfig:
    shard_size: int = 256 * 10**6
    formats: tuple[str, ...] = ("bin", "wds")


@dataclass(frozen=True)
class BuildConfig:
    """How a build runs, never what it makes: kept out of `resolved()`, free to change between builds."""

    tokenizer_cache: int = DEFAULT_TOKENIZER_CACHE
    merge_fan_in: int = DEFAULT_MERGE_FAN_IN


@dataclass(frozen=True)
class Pipeline:
    """A parsed pipeline file; relative paths resolve against `base_dir` (the file's folder)."""

    source: str
    base_dir: Path
    dataset: str
    seed: int
    store: str | None
    input: InputConfig
    tokenizer: TokenizerConfig
    dedup: DedupConfig
    output: OutputConfig
    retention: Policy = Policy()  # not output-affecting: kept out of `resolved()`
    build: BuildConfig = BuildConfig()  # nor is this
    steps: tuple[DocumentStep, ...] = ()  # [[steps]], in order: run on each document before tokenizing
    checks: Checks = Checks()  # [checks]: what must hold to publish; no output depends on it (no task key)

    def tokenizer_path(self) -> Path:
        path = Path(self.tokenizer.path).expanduser()
        return path if path.is_absolute() else self.base_dir / path

    def metadata_keys(self) -> tuple[str, ...]:
        """The keys a document's metadata may hold in this build's outputs, in order: the one value
        every format's metadata columns follow: `input.metadata_fields`, then the keys each step sets."""
        return self.input.metadata_fields + tuple(key for step in self.steps for key in step.metadata_keys())

    def _near(self) -> dict[str, Any]:
        """`[dedup.near]` as resolved (its key fields), only when set: other pipelines keep their ids."""
        if self.dedup.near is None:
            return {}
        return {"near": {key: value for key, value in self.dedup.near.key_fields().items() if key != "unicode"}}

    def resolved(self) -> dict[str, Any]:
        """Every output-affecting setting, machine-independent, as recorded in manifests (`steps`
        and `input.metadata_fields` only when some are configured, so a pipeline without them
        records what it always did)."""
        steps = {"steps": catalog.resolved(self.steps)} if self.steps else {}
        metadata = {"metadata_fields": list(self.input.metadata_fields)} if self.input.metadata_fields else {}
        keys = self.metadata_keys()
        steps_set = {"metadata_keys": list(keys)} if keys != self.input.metadata_fields else {}
        return {
            "input": {
                "format": self.input.format,
                "text_field": self.input.text_field,
                "id_field": self.input.id_field,
                "on_error": self.input.on_error,
                "max_document_bytes": self.input.max_document_bytes,
                **metadata,
            },
            "tokenizer": {
                "eos": self.tokenizer.eos,
                "encode_special_tokens": self.tokenizer.encode_special_tokens,
            },
            "dedup": {"exact": self.dedup.exact, **self._near()},
            "output": {"shard_size": self.output.shard_size, "formats": list(self.output.formats)},
            **steps,
            **steps_set,
        }


def recorded_metadata_keys(resolved: Any) -> tuple[str, ...]:
    """The metadata keys of the build whose resolved config (a manifest's `config`) is `resolved`:
    what `Pipeline.metadata_keys` was for it (recorded whole when steps set some)."""
    if not isinstance(resolved, dict):
        return ()
    keys = resolved.get("metadata_keys", resolved.get("input", {}).get("metadata_fields", []))
    return tuple(str(key) for key in keys)


def parse_size(value: object, key: str) -> int:
    """'256MB' -> 256_000_000, '1MiB' -> 1_048_576; a bare integer is bytes."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a size like \"256MB\", got {value!r}")
    if isinstance(value, int):
        number, unit = Fraction(value), ""
    elif isinstance(value, str) and (match := _SIZE.match(value)):
        number, unit = Fraction(match.group(1)), match.group(2).upper()  # exact: no float rounding or overflow
    else:
        raise ConfigError(f"{key}: expected a size like \"256MB\" or \"1GiB\", got {value!r}")
    if unit not in _UNITS:
        raise ConfigError(f"{key}: unknown size unit {unit!r} (use B, KB, MB, GB, KiB, MiB, GiB)")
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise ConfigError(f"{key}: size must be positive, got {value!r}")
    return size


class _Table:
    """Typed, key-checked access to one TOML table; every error names the full key."""

    def __init__(self, data: dict[str, Any], prefix: str, source: str) -> None:
        self.data, self.prefix, self.source = data, prefix, source
        self.used: set[str] = set()

    def _name(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def _fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {self._name(key)}: {message}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ..., required: bool = False) -> Any:
        self.used.add(key)
        if key not in self.data:
            if required or default is ...:
                raise self._fail(key, "missing required key")
            return default
        value = self.data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise self._fail(key, f"expected {names}, got {type(value).__name__} {value!r}")
        return value

    def nonempty(self, key: str, default: str | None = None, required: bool = False) -> str | None:
        """A string that, when given, holds more than whitespace (an empty path would mean the folder)."""
        value: str | None = self.get(key, str, default, required=required)
        if value is not None and not value.strip():
            raise self._fail(key, f"must not be empty, got {value!r}")
        return value

    def size(self, key: str, default: str | int) -> int:
        """A size like "256MB" or a number of bytes; errors name the file and the key."""
        value = self.get(key, (str, int), default)
        try:
            return parse_size(value, self._name(key))
        except ConfigError as exc:
            raise ConfigError(f"{self.source}: {exc.message}") from None

    def choice(self, key: str, options: tuple[str, ...], default: str) -> str:
        value: str = self.get(key, str, default)
        if value not in options:
            raise self._fail(key, f"must be one of {', '.join(options)}; got {value!r}")
        return value

    def table(self, key: str, required: bool = False) -> _Table:
        value = self.get(key, dict, None if not required else ..., required=required)
        return _Table(value or {}, f"{self._name(key)}.", self.source)

    def finish(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise self._fail(unknown[0], "unknown key")


def _string_list(table: _Table, key: str, default: tuple[str, ...] | None) -> tuple[str, ...]:
    value = table.get(key, (list, str), default if default is not None else ...)
    items = [value] if isinstance(value, str) else list(value)
    for index, item in enumerate(items):
        if not isinstance(item, str) or not item.strip():
            expected = "expected str" if not isinstance(item, str) else "expected a non-empty str"
            raise ConfigError(f"{table.source}: {table.prefix}{key}[{index}]: {expected}, got {item!r}")
    return tuple(items)


def load_pipeline(path: Path) -> Pipeline:
    """Read and validate a pipeline file."""
    source = str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{source}: pipeline file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{source}: cannot read pipeline file: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML: {exc}") from None
    return parse_pipeline(data, path.parent.absolute(), source)


def parse_pipeline(data: dict[str, Any], base_dir: Path, source: str = "pipeline") -> Pipeline:
    root = _Table(data, "", source)
    dataset = root.get("dataset", str, required=True)
    if not valid_name(dataset):
        raise ConfigError(f"{source}: dataset: {dataset!r} is not a valid name (letters, digits, '.', '_', '-'; "
                          f"at most {MAX_NAME_CHARS}, starting with a letter or digit)")
    seed = root.get("seed", int, 0)
    if not 0 <= seed < SEED_LIMIT:
        raise ConfigError(f"{source}: seed: must be an integer in [0, 2**64), got {seed}")
    store = root.nonempty("store")

    input_config = _input(root.table("input", required=True), source)
    tok = root.table("tokenizer", required=True)
    tokenizer = TokenizerConfig(
        path=str(tok.nonempty("path", required=True)),
        eos=tok.get("eos", str, "<|endoftext|>"),
        encode_special_tokens=tok.get("encode_special_tokens", bool, True),
        backend=tok.choice("backend", BACKENDS, "auto"),
    )
    tok.finish()

    dd = root.table("dedup")
    dedup = DedupConfig(exact=dd.get("exact", bool, True), near=_near(dd.get("near", dict, None), source))
    dd.finish()

    output = _output(root.table("output"), source)
    retention = _retention(root.table("retention"))
    build = _build(root.table("build"))
    steps = _steps(root.get("steps", list, []), source, base_dir)
    checks = parse_checks(root.get("checks", dict, {}), [step.name for step in steps], source)
    root.finish()
    _check_metadata_keys(input_config.metadata_fields, steps, source)
    return Pipeline(source, base_dir, dataset, seed, store, input_config, tokenizer, dedup, output, retention, build,
                    steps, checks)


def _near(table: dict[str, Any] | None, source: str) -> NearDupSettings | None:
    """The `[dedup.near]` settings, checked (NearDupSettingError names the key); None when absent."""
    if table is None:
        return None
    return parse_settings(table, source)


def _check_metadata_keys(fields: tuple[str, ...], steps: tuple[DocumentStep, ...], source: str) -> None:
    """ConfigError naming the step that sets a metadata key the input or an earlier step provides."""
    seen = {field: "input.metadata_fields" for field in fields}
    for index, step in enumerate(steps):
        for key in step.metadata_keys():
            if key in seen:
                raise ConfigError(f"{source}: steps[{index}]: sets metadata {key!r}, which {seen[key]} provides "
                                  "already: each metadata key has one source")
            seen[key] = f"steps[{index}] ({step.name})"


def _steps(tables: list[object], source: str, base_dir: Path) -> tuple[DocumentStep, ...]:
    """`[[steps]]`: the document steps in order, each a table naming its kind (`use`) and its
    settings, or user code (`use = "module:function"`, found on sys.path or in `base_dir`)."""
    steps = []
    for index, table in enumerate(tables):
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: steps[{index}]: expected a table ([[steps]]), got {table!r}")
        try:
            steps.append(catalog.parse_step(table, base_dir))
        except SettingError as exc:
            raise ConfigError(f"{source}: steps[{index}].{exc.key}: {exc.message}") from None
    return tuple(steps)


def _input(inp: _Table, source: str) -> InputConfig:
    """`[input]`: paths (at least one), format, text and id fields, on_error, max_document_bytes,
    metadata fields, exclude lists (read by the build, not here)."""
    paths = _string_list(inp, "paths", None)
    if not paths:
        raise ConfigError(f"{source}: input.paths: at least one path is required")
    id_field = inp.get("id_field", str, None) or None
    text_field = inp.get("text_field", str, "text")
    if id_field == text_field:
        raise inp._fail("id_field", f"must name another field than input.text_field ({text_field!r}): a document's id "
                                    "is not its text; leave id_field out to name documents by file and line")
    input_config = InputConfig(
        paths=paths,
        format=inp.choice("format", FORMATS, "auto"),
        text_field=text_field,
        id_field=id_field,
        on_error=inp.choice("on_error", ON_ERROR, "fail"),
        max_document_bytes=inp.size("max_document_bytes", DEFAULT_MAX_DOCUMENT_BYTES),
        metadata_fields=_metadata_fields(inp, text_field, id_field),
        exclude=_string_list(inp, "exclude", ()),
    )
    inp.finish()
    if input_config.metadata_fields and input_config.format == "text":
        raise inp._fail("metadata_fields", "text input has no fields: leave metadata_fields out, or read JSON Lines, "
                                           "Parquet or Arrow")
    return input_config


def _metadata_fields(inp: _Table, text_field: str, id_field: str | None) -> tuple[str, ...]:
    """`[input] metadata_fields`: distinct field names, none of them the text or the id field."""
    fields = _string_list(inp, "metadata_fields", ())
    for field in fields:
        if field in (text_field, id_field):
            which = "text_field" if field == text_field else "id_field"
            raise inp._fail("metadata_fields", f"{field!r} is input.{which}: a document's metadata holds other fields")
        if fields.count(field) > 1:
            raise inp._fail("metadata_fields", f"{field!r} is listed {fields.count(field)} times")
    return fields


def _output(out: _Table, source: str) -> OutputConfig:
    """`[output]`: formats (format names, each at most once) and shard_size."""
    formats = _string_list(out, "formats", OutputConfig.formats)
    unknown = registry.unknown(formats)
    if unknown:
        raise ConfigError(f"{source}: output.formats: unknown format {unknown[0]!r} (use {', '.join(registry.names())})")
    if not formats or len(set(formats)) != len(formats):
        raise ConfigError(f"{source}: output.formats: list each format at most once, at least one")
    output = OutputConfig(
        shard_size=out.size("shard_size", "256MB"),
        formats=tuple(sorted(formats)),
    )
    out.finish()
    return output


def _build(table: _Table) -> BuildConfig:
    """`[build]`: tokenizer_cache (a size: how far a worker may grow from its tokenizer's cache)
    and merge_fan_in (how many entries objects an order or merge task reads at most)."""
    fan_in = table.get("merge_fan_in", int, DEFAULT_MERGE_FAN_IN)
    if not MIN_MERGE_FAN_IN <= fan_in <= MAX_MERGE_FAN_IN:
        raise table._fail("merge_fan_in", f"must be {MIN_MERGE_FAN_IN} to {MAX_MERGE_FAN_IN}, got {fan_in}")
    config = BuildConfig(tokenizer_cache=table.size("tokenizer_cache", DEFAULT_TOKENIZER_CACHE), merge_fan_in=fan_in)
    table.finish()
    return config


def _retention(table: _Table) -> Policy:
    """`[retention]`: keep_last (generations of each ref, at least 1) and keep_within (a duration
    like "30d"); what gc keeps of this dataset once a build has recorded it in the store."""
    keep_last = table.get("keep_last", int, 1)
    keep_within = table.get("keep_within", str, "0s")
    table.finish()
    if keep_last < 1:
        raise table._fail("keep_last", f"must be at least 1 (the current generation), got {keep_last}")
    try:
        seconds = parse_duration(keep_within)
    except UsageError:
        raise table._fail("keep_within", f"expected a duration like \"30d\", \"12h\" or \"90m\", got {keep_within!r}") from None
    return check_policy(keep_last, seconds, "pipeline")
