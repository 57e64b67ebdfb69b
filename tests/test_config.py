"""The pipeline file: sizes, defaults, strict keys and types, and what the resolved config holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from prep.config import parse_pipeline, parse_size
from prep.errors import ConfigError

MINIMAL = {"dataset": "tiny", "input": {"paths": ["a.jsonl"]}, "tokenizer": {"path": "t.json"}}


@pytest.mark.parametrize(("text", "expected"), [
    ("256MB", 256 * 10**6), ("1MiB", 2**20), ("1.5GB", 1_500_000_000), ("2 GiB", 2 * 2**30),
    ("4096", 4096), (4096, 4096), ("10kb", 10_000), ("3KiB", 3 * 1024), ("1TB", 10**12),
])
def test_sizes_accept_decimal_and_binary_units(text: object, expected: int) -> None:
    assert parse_size(text, "output.shard_size") == expected


@pytest.mark.parametrize("text", ["", "MB", "12 parsecs", "-5MB", "0", True, 1.5, "1e6"])
def test_bad_sizes_name_the_key(text: object) -> None:
    with pytest.raises(ConfigError, match="output.shard_size"):
        parse_size(text, "output.shard_size")


def test_defaults_and_resolved_config_hold_no_machine_paths() -> None:
    pipeline = parse_pipeline(dict(MINIMAL), Path("/somewhere"), "p.toml")
    assert pipeline.seed == 0 and pipeline.output.shard_size == 256 * 10**6
    assert pipeline.output.formats == ("bin", "wds") and pipeline.dedup.exact
    resolved = pipeline.resolved()
    assert "/somewhere" not in repr(resolved) and "t.json" not in repr(resolved)
    assert resolved["tokenizer"] == {"eos": "<|endoftext|>", "encode_special_tokens": True}
    assert resolved["input"]["max_document_bytes"] == 64 * 2**20, "it decides which records are read: an output setting"


@pytest.mark.parametrize(("change", "needle"), [
    ({"bogus": 1}, "bogus: unknown key"),
    ({"input": {"paths": ["a"], "fromat": "jsonl"}}, "input.fromat: unknown key"),
    ({"input": {"paths": ["a"], "format": "csv"}}, "input.format: must be one of"),
    ({"output": {"formats": ["bin", "TF record"]}}, "output.formats: unknown format 'TF record' (use bin, mds, wds)"),
    ({"output": {"formats": ["bin", "bin"]}}, "output.formats"),
    ({"tokenizer": {"path": "t.json", "encode_special_tokens": "yes"}}, "tokenizer.encode_special_tokens: expected bool"),
    ({"dataset": "has space"}, "dataset"),
    ({"dataset": "tiny\n"}, "p.toml: dataset: 'tiny\\n' is not a valid name"),  # `$` matched before a final newline
    ({"dataset": "x" * 201}, "at most 200"),
    ({"input": {"paths": []}}, "input.paths"),
    ({"seed": True}, "seed: expected int"),
    ({"seed": 2**70}, r"seed: must be an integer in [0, 2**64)"),
    ({"seed": 2**64}, r"seed: must be an integer in [0, 2**64)"),
    ({"seed": -1}, r"seed: must be an integer in [0, 2**64)"),
    ({"output": {"shard_size": "12XB"}}, "p.toml: output.shard_size: unknown size unit 'XB'"),
    ({"build": {"tokenizer_cache": "0"}}, "p.toml: build.tokenizer_cache: size must be positive"),
    ({"input": {"paths": ["a"], "max_document_bytes": "0B"}}, "p.toml: input.max_document_bytes: size must be positive"),
    ({"input": {"paths": ["a"], "max_document_bytes": "big"}}, "p.toml: input.max_document_bytes: expected a size"),
    ({"input": {"paths": ["a"], "max_document_bytes": True}}, "p.toml: input.max_document_bytes: expected str or int"),
    ({"build": {"tokenizer_cache": [1]}}, "p.toml: build.tokenizer_cache: expected str or int"),
    ({"build": {"merge_fan_in": 1}}, "p.toml: build.merge_fan_in: must be 2 to 512, got 1"),
    ({"build": {"merge_fan_in": 513}}, "p.toml: build.merge_fan_in: must be 2 to 512, got 513"),
    ({"build": {"merge_fan_in": "8"}}, "p.toml: build.merge_fan_in: expected int, got str"),
    ({"build": {"merge_fan_in": True}}, "p.toml: build.merge_fan_in: expected int, got bool"),
    ({"build": {"tokenizer_cahce": "1MB"}}, "p.toml: build.tokenizer_cahce: unknown key"),
])
def test_mistakes_name_the_key(change: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        parse_pipeline({**MINIMAL, **change}, Path("."), "p.toml")


def test_largest_seed_is_accepted() -> None:
    assert parse_pipeline({**MINIMAL, "seed": 2**64 - 1}, Path("."), "p.toml").seed == 2**64 - 1


def test_retention_table_is_parsed_and_stays_out_of_the_resolved_config() -> None:
    pipeline = parse_pipeline({**MINIMAL, "retention": {"keep_last": 3, "keep_within": "30d"}}, Path("."), "p.toml")
    assert (pipeline.retention.keep_last, pipeline.retention.keep_within) == (3, 30 * 86400)
    assert "retention" not in pipeline.resolved(), "retention changes no output byte, so no snapshot id"
    default = parse_pipeline(dict(MINIMAL), Path("."), "p.toml").retention
    assert (default.keep_last, default.keep_within) == (1, 0)


@pytest.mark.parametrize(("table", "needle"), [
    ({"keep_last": 0}, "p.toml: retention.keep_last: must be at least 1"),
    ({"keep_last": "3"}, "p.toml: retention.keep_last: expected int, got str"),
    ({"keep_last": True}, "p.toml: retention.keep_last: expected int, got bool"),
    ({"keep_within": "a month"}, "p.toml: retention.keep_within: expected a duration like"),
    ({"keep_within": 30}, "p.toml: retention.keep_within: expected str, got int"),
    ({"keep_forever": True}, "p.toml: retention.keep_forever: unknown key"),
])
def test_retention_mistakes_name_the_key(table: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        parse_pipeline({**MINIMAL, "retention": table}, Path("."), "p.toml")


def test_the_tokenizer_cache_bound_changes_no_output_setting() -> None:
    """[build] is how a build runs: two pipelines that differ only there resolve alike."""
    default = parse_pipeline(dict(MINIMAL), Path("."), "p.toml")
    tight = parse_pipeline({**MINIMAL, "build": {"tokenizer_cache": "32MiB"}}, Path("."), "p.toml")
    assert default.build.tokenizer_cache == 256 * 2**20 and tight.build.tokenizer_cache == 32 * 2**20
    assert tight.resolved() == default.resolved()
    merged = parse_pipeline({**MINIMAL, "build": {"merge_fan_in": 2}}, Path("."), "p.toml")
    assert (default.build.merge_fan_in, merged.build.merge_fan_in) == (128, 2)
    assert merged.resolved() == default.resolved()


@pytest.mark.parametrize(("text", "expected"), [
    ("1" + "0" * 400 + "TB", 10**412),  # float() of it overflowed: a traceback, not an error line
    ("9007199254740993B", 9007199254740993),  # beyond a float's integers: exact, not rounded
    ("99999999999999999999999TB", 99999999999999999999999 * 10**12),
    ("1.0000001KB", 1000), (2**70, 2**70),
], ids=["1e412", "2**53+1", "1e35", "fraction", "int"])
def test_sizes_are_exact_however_large(text: object, expected: int) -> None:
    assert parse_size(text, "output.shard_size") == expected


@pytest.mark.parametrize(("change", "needle"), [
    ({"input": {"paths": [""]}}, "p.toml: input.paths[0]: expected a non-empty str, got ''"),
    ({"input": {"paths": ["a.jsonl", "  "]}}, "p.toml: input.paths[1]: expected a non-empty str, got '  '"),
    ({"input": {"paths": ""}}, "p.toml: input.paths[0]: expected a non-empty str, got ''"),
    ({"store": ""}, "p.toml: store: must not be empty, got ''"),
    ({"tokenizer": {"path": " "}}, "p.toml: tokenizer.path: must not be empty, got ' '"),
])
def test_an_empty_path_is_an_error_not_the_pipeline_folder(change: dict[str, object], needle: str) -> None:
    """An empty input path walked the pipeline's folder (its store too); an empty store was ignored."""
    with pytest.raises(ConfigError, match=re.escape(needle)):
        parse_pipeline({**MINIMAL, **change}, Path("."), "p.toml")


@pytest.mark.parametrize("input_table", [
    {"paths": ["a"], "id_field": "text"},  # the default text_field
    {"paths": ["a"], "id_field": "body", "text_field": "body"},
])
def test_an_id_field_that_is_the_text_field_is_refused(input_table: dict[str, object]) -> None:
    """It made every tokenize task fail with an IndexError traceback (exit 1)."""
    with pytest.raises(ConfigError, match=r"^p\.toml: input\.id_field: must name another field than input\.text_field"):
        parse_pipeline({**MINIMAL, "input": input_table}, Path("."), "p.toml")


def test_an_empty_id_field_still_means_none() -> None:
    assert parse_pipeline({**MINIMAL, "input": {"paths": ["a"], "id_field": ""}}, Path("."), "p.toml").input.id_field is None


def test_metadata_fields_enter_the_resolved_config_only_when_given() -> None:
    plain = parse_pipeline(MINIMAL, Path("."), "p.toml")
    assert "metadata_fields" not in plain.resolved()["input"] and plain.metadata_keys() == ()
    given = parse_pipeline({**MINIMAL, "input": {"paths": ["a"], "id_field": "id",
                                                 "metadata_fields": ["url", "license", "source"]}}, Path("."), "p.toml")
    assert given.input.metadata_fields == given.metadata_keys() == ("url", "license", "source")
    assert given.resolved()["input"]["metadata_fields"] == ["url", "license", "source"]


@pytest.mark.parametrize(("fields", "needle"), [
    (["url", "url"], "'url' is listed 2 times"), (["text"], "'text' is input.text_field"),
    (["id"], "'id' is input.id_field"), ([""], "input.metadata_fields[0]: expected a non-empty str"),
    ([3], "input.metadata_fields[0]: expected str"), (7, "input.metadata_fields: expected list or str"),
])
def test_bad_metadata_fields_name_the_key(fields: object, needle: str) -> None:
    table = {"paths": ["a"], "id_field": "id", "metadata_fields": fields}
    with pytest.raises(ConfigError, match=re.escape(needle)) as caught:
        parse_pipeline({**MINIMAL, "input": table}, Path("."), "p.toml")
    assert "input.metadata_fields" in caught.value.message


def test_text_input_with_metadata_fields_is_a_config_error_of_one_line_exit_2(tmp_path: Path) -> None:
    from tests.helpers import prep_env, run_prep

    pipeline = tmp_path / "p.toml"
    pipeline.write_text('dataset = "d"\n[input]\npaths = ["a.txt"]\nformat = "text"\nmetadata_fields = ["url"]\n'
                        '[tokenizer]\npath = "t.json"\n')
    result = run_prep("build", pipeline, "--store", tmp_path / "store", env=prep_env(), check=False)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and result.stderr.startswith("prep: error: ")
    assert "input.metadata_fields" in result.stderr


def test_exclude_lists_are_paths_kept_out_of_the_resolved_config() -> None:
    """`[input] exclude` names files (read by the build, not here); the manifest records their
    hashes under `exclude`, so the resolved config is the one a pipeline without them has."""
    given = parse_pipeline({**MINIMAL, "input": {"paths": ["a"], "exclude": ["req/1.txt", "req/2.txt"]}},
                           Path("."), "p.toml")
    assert given.input.exclude == ("req/1.txt", "req/2.txt")
    assert given.resolved() == parse_pipeline(MINIMAL, Path("."), "p.toml").resolved()
    one = parse_pipeline({**MINIMAL, "input": {"paths": ["a"], "exclude": "req.txt"}}, Path("."), "p.toml")
    assert one.input.exclude == ("req.txt",)
    with pytest.raises(ConfigError, match=r"^p\.toml: input\.exclude\[0\]: expected str, got 3$"):
        parse_pipeline({**MINIMAL, "input": {"paths": ["a"], "exclude": [3]}}, Path("."), "p.toml")
