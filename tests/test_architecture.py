"""The architecture of docs/architecture.md, checked: import contracts hold, the build driver
stays light, and no module grows past the size a reader can hold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("numpy", "pyarrow", "tokenizers", "jsonschema", "boto3", "ray", "torch", "datasets")
DRIVER_MODULES = ("prep.cli.main", "prep.cli.build", "prep.runner.build", "prep.runner.tasks", "prep.config",
                  "prep.store.snapshots", "prep.store.refs")
MAX_MODULE_LINES = 420


def test_import_contracts_hold() -> None:
    """Layers, no circles, executors that import only their base, stages that never touch a store."""
    lint = Path(sys.executable).with_name("lint-imports")
    if not lint.exists():
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("module", DRIVER_MODULES)
def test_the_driver_imports_no_heavy_library(module: str) -> None:
    """The build driver and the CLI start in tenths of a second: numpy, Arrow and the tokenizer
    libraries load in workers only, when a task needs them."""
    probe = (f"import sys, json; import {module}; "
             f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == [], f"importing {module} loads {result.stdout.strip()}"


def test_no_module_is_longer_than_a_reader_can_hold() -> None:
    long = {str(path.relative_to(ROOT)): count for path in sorted((ROOT / "prep").rglob("*.py"))
            if (count := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}
