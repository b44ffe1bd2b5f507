"""The package's layout: the library stands below the application, in floors, without cycles or import hooks.

Floors (a top-level entry imports only entries on lower floors):
utils (1) < layers, optim (2) < models (3) < analysis, export (4) < training, bench (5) < cli (6).
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "keras_attnconv"
FLOORS = {
    "version": 1,
    "utils": 1,
    "layers": 2,
    "optim": 2,
    "models": 3,
    "analysis": 4,
    "export": 4,
    "training": 5,
    "bench": 5,
    "cli": 6,
}
LIBRARY = {"version", "utils", "layers", "optim", "models", "analysis"}  # what a notebook imports
MODULES = sorted(path for path in PACKAGE.rglob("*.py"))


def _entry(path):
    """The top-level entry of the package that a file belongs to (``training`` for training/fit.py)."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return "__init__" if parts == ("__init__",) else parts[0]


def _imported_entries(path):
    """(line, entry) for each import of the package in `path`, those inside functions too."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "keras_attnconv":
            parts = node.module.split(".")
            for alias in node.names if len(parts) == 1 else [None]:
                yield node.lineno, parts[1] if len(parts) > 1 else alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "keras_attnconv":
                    yield node.lineno, (alias.name.split(".") + ["__init__"])[1]


def test_the_package_top_holds_at_most_eleven_entries_each_on_its_floor():
    entries = {
        path.stem if path.is_file() else path.name
        for path in PACKAGE.iterdir()
        if path.suffix == ".py" or (path.is_dir() and (path / "__init__.py").exists())
    }
    assert entries - {"__init__"} == set(FLOORS) and len(entries) <= 11


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_no_import_runs_upward_or_sideways(path):
    entry = _entry(path)
    if entry == "__init__":  # the package's face: the library's public names
        assert {imported for _, imported in _imported_entries(path)} <= LIBRARY
        return
    wrong = [
        f"line {line}: {entry} (floor {FLOORS[entry]}) imports {imported} (floor {FLOORS.get(imported)})"
        for line, imported in _imported_entries(path)
        if imported != entry and FLOORS.get(imported, 99) >= FLOORS[entry]
    ]
    assert not wrong, wrong


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_nothing_imports_the_package_root_or_imports_by_name_at_run_time(path):
    # No module reaches back into `keras_attnconv/__init__.py`, and no import is hidden from this check.
    assert all(imported != "__init__" for _, imported in _imported_entries(path))
    tree = ast.parse(path.read_text())
    assert "meta_path" not in ast.dump(tree)  # no import hook
    for node in ast.walk(tree):  # `__import__(module)` of a third-party runtime by its name is fine; ours is not
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in (
            "__import__",
            "import_module",
        ):
            argument = node.args[0]
            assert not isinstance(argument, ast.JoinedStr), f"line {node.lineno}: an import by a computed name"
            assert not (isinstance(argument, ast.Constant) and str(argument.value).startswith("keras_attnconv")), (
                f"line {node.lineno}: the package imported by name"
            )


def test_the_library_imports_no_application_module():
    offending = [
        f"{path.relative_to(PACKAGE)}:{line} imports {imported}"
        for path in MODULES
        if _entry(path) in LIBRARY
        for line, imported in _imported_entries(path)
        if imported not in LIBRARY
    ]
    assert not offending, offending


def test_no_module_claims_to_import_no_framework():
    # Importing any module runs the package root, which imports Keras to register the package's classes: a
    # docstring that says a module "imports no framework" promised what no import of it keeps.
    claims = [str(path.relative_to(PACKAGE)) for path in MODULES if "imports no framework" in path.read_text()]
    assert not claims
