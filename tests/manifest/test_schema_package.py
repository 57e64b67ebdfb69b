"""The schemas travel in the wheel: manifests/ (their one home) is packaged as prep/_schemas/, and
an installed prep loads every schema from there, not from a checkout that may not exist."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from prep.manifest import schema

REPO = Path(__file__).resolve().parents[2]
SCHEMA_FILES = sorted(path.name for path in (REPO / "manifests").glob("*.schema.json"))


def _schema_id(name: str) -> str:
    schema_id: str = json.loads((REPO / "manifests" / name).read_text(encoding="utf-8"))["$id"]
    return schema_id


def test_every_schema_id_names_its_file() -> None:
    assert len(SCHEMA_FILES) >= 9
    for name in SCHEMA_FILES:
        found = schema.schema_path(_schema_id(name))
        assert found.name == name
        assert found.read_bytes() == (REPO / "manifests" / name).read_bytes()


def test_pyproject_lists_every_package_and_maps_the_schemas() -> None:
    """The package list is written out (a found list cannot hold prep._schemas): it must not miss one."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    on_disk = {".".join(init.parent.relative_to(REPO).parts) for init in (REPO / "prep").rglob("__init__.py")}
    assert set(setuptools["packages"]) == on_disk | {"prep._schemas"}
    assert setuptools["package-dir"] == {"prep._schemas": "manifests"}
    assert "*.schema.json" in setuptools["package-data"]["prep._schemas"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip wheel` of a copy of the project's sources (the checkout gets no build/ folder), offline:
    with the setuptools installed here, which builds wheels itself from 70.1 on."""
    pytest.importorskip("setuptools", minversion="70.1")
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for folder in ("prep", "manifests"):
        shutil.copytree(REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation",
                             "--no-index", "-q", "-w", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (built,) = out.glob("prep-*.whl")
    return built


def test_wheel_holds_every_schema_and_module(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for name in SCHEMA_FILES:
            assert archive.read(f"prep/_schemas/{name}") == (REPO / "manifests" / name).read_bytes()
    modules = {path.relative_to(REPO).as_posix() for path in (REPO / "prep").rglob("*.py")}
    assert modules <= names
    assert "prep/py.typed" in names
    assert not any(name.startswith("manifests/") for name in names)  # nothing at site-packages' top level


def test_installed_wheel_loads_every_schema_from_the_package(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    check = """if True:
        import json, sys
        from pathlib import Path
        import prep
        from prep.errors import IntegrityError
        from prep.manifest import schema
        site = Path(sys.argv[1]).resolve()
        assert Path(prep.__file__).resolve().is_relative_to(site), prep.__file__
        for schema_id in sys.argv[2:]:
            try:
                schema.validate(None, schema_id)  # loads the schema; no schema allows null
            except IntegrityError:
                pass
            found = schema.schema_path(schema_id)
            assert Path(str(found)).resolve().parent == site / "prep" / "_schemas", found
            assert json.loads(found.read_text(encoding="utf-8"))["$id"] == schema_id
    """
    run = tmp_path / "elsewhere"
    run.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
    env.update(PYTHONPATH=str(site), PYTHONSAFEPATH="1")
    result = subprocess.run([sys.executable, "-c", check, str(site), *map(_schema_id, SCHEMA_FILES)], cwd=run, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
