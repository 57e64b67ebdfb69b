"""The files of a user step's package a snapshot carries (prep.steps.stepsources): every module its
code identity covers and the package `__init__.py` files above them, named by paths inside the
package, nothing outside it; a file edited since the pipeline was read is refused; paths the
manifest schema accepts are the paths the rebuild writes."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prep.errors import ConfigError
from prep.steps import catalog
from prep.steps.function import FunctionStep
from prep.steps.length import LengthFilter
from prep.steps.stepsources import is_carried_path, relative_path, step_sources
from tests.helpers import user_package

SCHEMA = json.loads((Path(__file__).parents[2] / "manifests" / "snapshot-1.schema.json").read_text())
PATH_PATTERN = re.compile(SCHEMA["properties"]["step_sources"]["items"]["properties"]["path"]["pattern"])
RULES = "from .deep import words\n\n\ndef keep(document):\n    return words.count(document.text) > 1\n"
WORDS = "import json\n\n\ndef count(text):\n    return len(text.split())\n"


@pytest.fixture
def package(tmp_path: Path) -> Iterator[str]:
    """A package whose rules module imports a module of a subpackage; one module no one imports."""
    with user_package(tmp_path, "carried", {"rules.py": RULES, "unused.py": "x = 1\n"}) as name:
        (tmp_path / name / "deep").mkdir()
        (tmp_path / name / "deep" / "__init__.py").write_text("# the subpackage\n")
        (tmp_path / name / "deep" / "words.py").write_text(WORDS)
        yield name


def _step(name: str, base: Path) -> FunctionStep:
    step = catalog.parse_step({"use": f"{name}.rules:keep"}, base)
    assert isinstance(step, FunctionStep)
    return step


def test_the_closure_and_the_packages_above_it_by_path_inside_the_package(tmp_path: Path, package: str) -> None:
    sources = step_sources([LengthFilter(min_chars=1), _step(package, tmp_path)])
    assert [(s.module, s.path) for s in sources] == [
        (package, f"{package}/__init__.py"), (f"{package}.deep", f"{package}/deep/__init__.py"),
        (f"{package}.deep.words", f"{package}/deep/words.py"), (f"{package}.rules", f"{package}/rules.py")]
    assert all(s.data == (tmp_path / s.path).read_bytes() for s in sources)
    assert step_sources([LengthFilter(min_chars=1)]) == [], "built-in steps carry nothing"


def test_two_steps_of_one_package_carry_each_file_once(tmp_path: Path, package: str) -> None:
    step = _step(package, tmp_path)
    assert step_sources([step, step]) == step_sources([step])


def test_a_module_edited_since_the_pipeline_was_read_is_refused(tmp_path: Path, package: str) -> None:
    step = _step(package, tmp_path)
    (tmp_path / package / "deep" / "words.py").write_text(WORDS + "# edited\n")
    with pytest.raises(ConfigError, match=rf"step {package}\.rules:keep: its code changed during the build"):
        step_sources([step])


names = st.lists(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True), min_size=1, max_size=4)


@given(names, st.booleans())
def test_a_module_file_is_named_by_its_dotted_name(parts: list[str], is_package: bool) -> None:
    root = Path("/somewhere/on/this/machine")
    path = root.joinpath(*parts, "__init__.py") if is_package else root.joinpath(*parts[:-1], f"{parts[-1]}.py")
    expected = "/".join(parts) + ("/__init__.py" if is_package else ".py")
    assert relative_path(".".join(parts), path) == expected
    assert is_carried_path(expected) and PATH_PATTERN.search(expected)


def test_a_file_that_is_not_where_its_name_puts_it_is_refused() -> None:
    with pytest.raises(ConfigError, match="is not where its name puts it"):
        relative_path("pkg.rules", Path("/x/other/rules.py"))


@given(st.text(alphabet="ab./\\", max_size=12))
def test_the_schema_and_the_rebuild_accept_the_same_paths(path: str) -> None:
    assert is_carried_path(path) == bool(PATH_PATTERN.search(path))
