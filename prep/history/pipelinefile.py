"""A snapshot's pipeline as it was built, written back as a TOML pipeline file (`prep show --pipeline`).

The manifest's `config` (`Pipeline.resolved()`) holds every setting that shaped the output; it
holds no paths as written, so the file names the input files the manifest lists and the tokenizer
file a pull puts beside the shards. Step settings go back to the types their step class declares
(a float is recorded as its decimal string). A snapshot older than a piece of `config` gets what
it records, and a comment for what it does not. `prep rebuild` reads that file back
(`rebuilt_pipeline`), its input files and tokenizer re-pointed.
"""

from __future__ import annotations

import glob
import tomllib
import typing
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from prep.config import DedupConfig, InputConfig, OutputConfig, Pipeline, TokenizerConfig, parse_pipeline
from prep.manifest.tomltext import toml_key, toml_line, toml_value
from prep.neardup.settings import NearDupSettings
from prep.steps import catalog
from prep.steps.protocol import SettingError

FUNCTION_SETTINGS = ("args", "metadata")
"""What a `module:function` step's table sets; its `code` is computed when the pipeline is read."""


def pipeline_text(snapshot_id: str, manifest: Mapping[str, Any], tokenizer_path: str) -> str:
    """The pipeline file of the snapshot: `dataset`, `seed`, then one table per section, each step last."""
    config = manifest.get("config")
    config = config if isinstance(config, dict) else {}
    head = [f"# The pipeline snapshot {snapshot_id} was built from (prep show --pipeline).",
            toml_line("dataset", manifest["dataset"]), toml_line("seed", manifest["seed"])]
    sections = [input_lines(manifest, config.get("input")), tokenizer_lines(manifest, config, tokenizer_path),
                dedup_lines(config.get("dedup")),
                table_lines("output", config.get("output"), OutputConfig),
                *(step_lines(step, bool(manifest.get("step_sources"))) for step in config.get("steps", ())),
                *([checks_lines(manifest["checks"])] if isinstance(manifest.get("checks"), list) else [])]
    return "\n".join(head + [line for section in sections for line in ("", *section)]) + "\n"


def rebuilt_pipeline(snapshot_id: str, manifest: Mapping[str, Any], inputs: Path, tokenizer: Path) -> Pipeline:
    """The snapshot's pipeline, parsed back from the file `pipeline_text` writes: its input files
    by their recorded names under `inputs` (the pipeline's folder, so a function step's module is
    also looked for there, after the import path), its tokenizer file at `tokenizer`."""
    text = pipeline_text(snapshot_id, manifest, str(tokenizer))
    return parse_pipeline(tomllib.loads(text), inputs.absolute(), f"the pipeline of {snapshot_id}")


def _settings(table: Mapping[str, Any], kind: type | None = None, skip: tuple[str, ...] = ()) -> list[str]:
    """`key = value` for each recorded setting, in the order `kind` declares its fields (the rest
    after); an unset (null) one is left out: its default is unset."""
    order = {field.name: index for index, field in enumerate(fields(kind))} if kind is not None else {}
    keys = sorted(table, key=lambda key: order.get(key, len(order)))
    return [toml_line(key, table[key]) for key in keys if table[key] is not None and key not in skip]


def table_lines(name: str, recorded: object, kind: type) -> list[str]:
    """`[name]` with its recorded settings, or a comment when the snapshot records none."""
    if not isinstance(recorded, dict):
        return [f"[{name}]", f"# not recorded by this snapshot (built before its manifest held [{name}])"]
    return [f"[{name}]", *_settings(recorded, kind)]


def dedup_lines(recorded: object) -> list[str]:
    """`[dedup]` with its recorded settings, then `[dedup.near]` when the snapshot removed near
    duplicates, each setting typed back as `NearDupSettings` declares it (the threshold is
    recorded as its decimal string, which the table refuses)."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("near"), dict):
        return table_lines("dedup", recorded, DedupConfig)
    hints = typing.get_type_hints(NearDupSettings)
    near = {key: typed_back(value, hints[key]) if key in hints else value for key, value in recorded["near"].items()}
    exact = table_lines("dedup", {key: value for key, value in recorded.items() if key != "near"}, DedupConfig)
    return [*exact, "", "[dedup.near]", *_settings(near, NearDupSettings)]


def input_lines(manifest: Mapping[str, Any], recorded: object) -> list[str]:
    """`[input]`: the input files the manifest lists, then the recorded settings."""
    files = [literal_path(str(entry["path"])) for entry in manifest["inputs"]["files"]]
    lines = table_lines("input", recorded, InputConfig)
    return [lines[0], "# The files the snapshot read (sha256 in its manifest), relative to the folder that held them",
            "# all: write them relative to this file's folder, or absolute, to build from them.",
            toml_line("paths", files), *lines[1:]]


def literal_path(name: str) -> str:
    """An input file's recorded name as an `input.paths` entry naming that file alone: its glob
    characters escaped (`a[1].jsonl` would read `a1.jsonl`), and a leading `~` kept from naming
    a home folder."""
    escaped = glob.escape(name)
    return f"[~]{escaped[1:]}" if escaped.startswith("~") else escaped  # "./~" is normalised back to "~"


def tokenizer_lines(manifest: Mapping[str, Any], config: Mapping[str, Any], path: str) -> list[str]:
    """`[tokenizer]`: `path` where a pull puts the carried file (its sha256 in a comment), eos and
    encode_special_tokens (from the manifest's tokenizer where `config` lacks them)."""
    tokenizer = manifest["tokenizer"]
    sha256 = f"sha256:{tokenizer['sha256']}"
    comment = (f"# {sha256}: the snapshot carries it, `prep pull` puts it here" if tokenizer.get("object")
               else f"# must be the tokenizer file of {sha256} (the snapshot does not carry it)")
    recorded = config.get("tokenizer")
    settings = {key: tokenizer.get(key) for key in ("eos", "encode_special_tokens")}
    settings.update(recorded if isinstance(recorded, dict) else {})
    return ["[tokenizer]", comment, toml_line("path", path), *_settings(settings, TokenizerConfig)]


def step_lines(step: Mapping[str, Any], carried: bool = False) -> list[str]:
    """`[[steps]]` as its table would set it: a built-in step's settings typed as its class declares
    them; a function step's `args` and `metadata`, its recorded code identity and whether the
    snapshot carries its package's sources (`carried`) in comments."""
    use = str(step.get("use"))
    settings = {key: value for key, value in step.items() if key != "use"}
    lines = ["[[steps]]", toml_line("use", use)]
    if ":" in use:
        where = ("# the snapshot carries its package's sources (step_sources): `prep rebuild` imports them from the store"
                 if carried else "# the snapshot does not carry its package's sources (built before snapshots stored "
                                 "them): the module must be importable where this file is built")
        return [*lines, *_settings(settings, skip=("code",)),
                f"# code sha256 {settings.get('code')} (its module, the package modules it imports, their distributions)",
                where]
    try:
        kind = catalog.step_kind(use)
    except SettingError:
        return [*lines, f"# no step {use!r} here: its settings as recorded", *_settings(settings)]
    hints = typing.get_type_hints(kind)
    settable = {field.name for field in fields(kind) if field.init and not field.metadata.get("derived")}
    derived = [f"# found when the pipeline was read: {key} = {toml_value(value)}"
               for key, value in settings.items() if key not in settable]
    typed = {key: typed_back(value, hints[key]) for key, value in settings.items() if key in settable}
    return [*lines, *_settings(typed, kind), *derived]


def checks_lines(checks: list[Mapping[str, Any]]) -> list[str]:
    """`[checks]` as the manifest's judged checks record them: each limit back as the TOML float of
    its decimal (or its integer), a per-step check as the dotted key it was given."""
    lines = ["[checks]"]
    for check in checks:
        name, limit = str(check["name"]), check["limit"]
        head, dot, step = name.partition(".")
        key = f"{toml_key(head)}.{toml_key(step)}" if dot else toml_key(name)
        lines.append(f"{key} = {toml_value(float(limit) if isinstance(limit, str) else limit)}")
    return lines


def typed_back(value: object, hint: object) -> object:
    """A recorded setting as its field's type holds it: a float's decimal string as the float,
    a tuple's list with its items typed back."""
    if typing.get_origin(hint) is tuple and isinstance(value, list):
        item = typing.get_args(hint)[0]
        return [typed_back(element, item) for element in value]
    allowed = typing.get_args(hint) or (hint,)
    if float in allowed and str not in allowed and isinstance(value, str):
        return float(value)
    return value
