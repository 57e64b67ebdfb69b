"""The architecture of docs/architecture.md, checked: import contracts hold, the build driver
stays light, each module says what it holds and has a name no other module has, and no function
grows past the size a reader can hold."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("numpy", "pyarrow", "tokenizers", "jsonschema", "boto3", "ray", "torch", "datasets")
DRIVER_MODULES = ("prep.cli.main", "prep.cli.build", "prep.runner.build", "prep.runner.tasks", "prep.config",
                  "prep.store.snapshots", "prep.store.refs")
MODULES = sorted((ROOT / "prep").rglob("*.py"))
MAX_FUNCTION_LINES = 60  # "no function over about 50" (docs/architecture.md, rule 8)
# A command's module, prep/cli/<command>.py, may share its name with the module doing its work
# (issue 40 renamed every other repeated name: storage/backend.py, storage/s3/s3store.py,
# history/selectors.py, runner/executors/pool.py).
SHARED_NAMES = {
    "build.py": {"prep/cli/build.py", "prep/runner/build.py"},
    "status.py": {"prep/cli/status.py", "prep/runner/status.py"},
    "sample.py": {"prep/cli/sample.py", "prep/sample.py"},
}


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


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_every_module_says_what_it_holds() -> None:
    """A module holds one concept, and its docstring's first line names it: where a piece of code
    goes is decided by what it is, not by how long the file it would join has grown."""
    unsaid = []
    for path in MODULES:
        body = ast.parse(path.read_text()).body
        first = body[0] if body else None
        doc = first.value.value if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) else None
        if not isinstance(doc, str) or not doc.split("\n", 1)[0].strip():
            unsaid.append(_relative(path))
    assert unsaid == [], "modules without a docstring whose first line says what they hold"


def test_no_two_modules_share_a_name() -> None:
    """One name per concept: two `cache.py` modules make a reader (and a traceback) ambiguous."""
    by_name: dict[str, set[str]] = defaultdict(set)
    for path in MODULES:
        if path.name != "__init__.py":
            by_name[path.name].add(_relative(path))
    shared = {name: paths for name, paths in by_name.items()
              if len(paths) > 1 and not paths <= SHARED_NAMES.get(name, set())}
    assert shared == {}


def test_no_function_is_longer_than_a_reader_can_hold() -> None:
    long = {f"{_relative(path)}:{node.lineno} {node.name}": lines for path in MODULES
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (lines := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_FUNCTION_LINES}
    assert long == {}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, package: str, known: set[str]) -> set[str]:
    """Every prep module `path` imports anywhere: at the top, in functions, under TYPE_CHECKING."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def _import_graph() -> dict[str, set[str]]:
    """Module -> the prep modules it imports (its own packages' __init__ left out)."""
    modules = {_module_name(path): path for path in MODULES}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = {target for target in _imported(path, package, set(modules))
                       if target != name and not name.startswith(target + ".")}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = stack[stack.index(node):]
                del stack[stack.index(node):]
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_no_import_cycle_hides_behind_a_guard_or_a_function() -> None:
    """lint-imports leaves out imports under TYPE_CHECKING; this walks every import statement,
    guarded, lazy or not, and finds no two modules that reach each other."""
    assert _cycles(_import_graph()) == []


def test_the_cycle_finder_sees_a_type_only_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


STAGE_NAMES = ("tokenize", "merge", "order", "shard", "Tokeniz", "Merg", "Order", "Shard")


def test_the_runner_knows_no_stage_by_name() -> None:
    """prep/runner/driver.py drives any list of stages: it names none, and imports none."""
    driver = ROOT / "prep" / "runner" / "driver.py"
    code = "\n".join(line for line in driver.read_text().splitlines() if not line.lstrip().startswith("#"))
    tree = ast.parse(code)
    body = [node for node in tree.body if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
    source = "\n".join(ast.unparse(node) for node in body)
    source = "\n".join(line for line in source.splitlines() if '"""' not in line)
    named = [name for name in STAGE_NAMES if name in source.replace("BatchResult", "")]
    assert named == [], f"the runner names stages: {named}"
    imported = _imported(driver, "prep.runner", {_module_name(path) for path in MODULES})
    assert not imported & {"prep.runner.tokenizing", "prep.runner.merging", "prep.runner.ordering",
                            "prep.runner.sharding", "prep.stages"}
