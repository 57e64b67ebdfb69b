"""prep.store.layout is the one place that knows the store's key layout: its keys follow the
patterns of docs/store.md, and no other module of prep spells a key prefix."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from prep.errors import UsageError
from prep.store import layout

ROOT = Path(__file__).resolve().parents[2]
PREFIX = re.compile(r"(?<![\w.-])(objects|tasks|stages|snapshots|refs|history|logs|leases)/")
# Backends that still know part of the layout, each with the reason; nothing else may.
KNOWN_EXCEPTIONS = {
    # The S3 backend checks content keys' hashes and writes logs/ without a create-only condition;
    # it is owned by another change and keeps its own two constants until then.
    "prep/storage/s3/s3store.py": {"objects/sha256/", "logs/"},
}
HEX = "ab" + "0123456789abcdef" * 3 + "cdef0123456789"


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes in `tree` (documentation may name keys; code may not)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def prefix_literals(path: Path) -> set[str]:
    """Every string literal of a module, outside docstrings and comments, that spells a key prefix."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
            and PREFIX.search(node.value)}


def test_only_the_layout_module_spells_key_prefixes() -> None:
    found = {str(path.relative_to(ROOT)): literals for path in sorted((ROOT / "prep").rglob("*.py"))
             if (literals := prefix_literals(path))}
    assert found.pop("prep/store/layout.py") == {
        "objects/sha256/", "tasks/", "stages/", "snapshots/", "refs/", "history/", "logs/", "leases/"}
    assert found == KNOWN_EXCEPTIONS


def test_the_scan_sees_literals_in_code_and_f_strings_but_not_docstrings(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text('"""Keys under `refs/` are refs."""\n\n\ndef f(x: str) -> str:\n'
                      '    """Docs may say tasks/."""\n    return f"history/{x}" + "plain"  # and comments logs/\n')
    assert prefix_literals(module) == {"history/"}


@pytest.mark.parametrize(("key", "pattern"), [
    (layout.object_key(HEX), r"objects/sha256/([0-9a-f]{2})/\1[0-9a-f]{62}"),
    (layout.task_record_key("tokenize", HEX), r"tasks/tokenize/[0-9a-f]{64}\.json"),
    (layout.stage_record_key("shard", HEX), r"stages/shard/[0-9a-f]{64}\.json"),
    (layout.snapshot_marker_key(f"sha256:{HEX}"), r"snapshots/[0-9a-f]{64}"),
    (layout.ref_key("tiny", "v1.0"), r"refs/tiny/v1\.0\.json"),
    (layout.history_key("tiny", "latest", 7), r"history/tiny/latest/0000000000000007\.json"),
    (layout.log_key("tiny", "20250101T000000Z", "0123456789ab"), r"logs/tiny/20250101T000000Z-0123456789ab\.json"),
    (layout.lease_key("build", "run-1", 1_700_000_000), r"leases/build/run-1/001700000000\.json"),
])
def test_keys_follow_the_documented_layout(key: str, pattern: str) -> None:
    assert re.fullmatch(pattern, key), key


def test_keys_map_back_to_what_they_name() -> None:
    assert layout.object_sha(layout.object_key(HEX)) == HEX
    assert layout.marker_sha(layout.snapshot_marker_key(f"sha256:{HEX}")) == HEX
    assert layout.parse_lease_key(layout.lease_key("gc", "run-2", 42)) == ("gc", "run-2", 42)
    for not_a_lease in ("leases/gc/run/soon.json", "leases/gc/12.json", "refs/gc/run/12.json"):
        assert layout.parse_lease_key(not_a_lease) is None


@pytest.mark.parametrize("name", ["", "-x", ".hidden", "a/b", "a b", "ü", "v1\n", "v1\n\n", "x" * 201])
def test_names_outside_the_pattern_are_refused(name: str) -> None:
    """A final newline too (`$` matches before one), and names too long for a local store's files."""
    with pytest.raises(UsageError, match="invalid ref name"):
        layout.ref_key("tiny", name)
    with pytest.raises(UsageError, match="invalid dataset name"):
        layout.history_prefix(name)


def test_the_longest_name_fits_a_local_store(tmp_path: Path) -> None:
    name = "x" * layout.MAX_NAME_CHARS
    assert layout.valid_name(name) and layout.check_name("tag", name) == name
    for suffix in (".json", ".json.lock"):
        (tmp_path / f"{name}{suffix}").write_bytes(b"")  # within the 255-byte file name limit
