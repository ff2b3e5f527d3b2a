"""The layout's rules, read from the source: no import cycles, the Dagster layer on top, the station apart."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "dgx_assets"
MAX_MODULE_LINES = 420


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_names(tree: ast.AST):
    """Every import, at module level or inside a function, except those under `if TYPE_CHECKING:`."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from (name for child in node.orelse for name in _imported_names(ast.Module(body=[child])))
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)
        yield from _imported_names(node)


@cache
def imports_of(module: str) -> frozenset[str]:
    """The product modules `module` imports (a package's `__init__` counts only when imported by name)."""
    tree = ast.parse(modules()[module].read_text())
    known = modules()
    return frozenset(name for name in _imported_names(tree) if name in known and name != module)


def _cycle_from(start: str) -> list[str] | None:
    path, on_path, done = [start], {start}, set()

    def visit(module: str) -> list[str] | None:
        for target in sorted(imports_of(module)):
            if target in on_path:
                return path[path.index(target) :] + [target]
            if target in done:
                continue
            path.append(target)
            on_path.add(target)
            if found := visit(target):
                return found
            on_path.discard(path.pop())
            done.add(target)
        return None

    return visit(start)


def test_no_product_module_imports_another_in_a_cycle():
    cycles = {tuple(cycle) for module in modules() if (cycle := _cycle_from(module))}
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in sorted(cycles))


def test_the_domain_cores_import_nothing_of_the_dagster_layer():
    entry_points = ("dgx_assets.definitions", "dgx_assets.cli", "dgx_assets.demo")  # `make demo`'s modules too
    offenders = {
        module: sorted(name for name in imports_of(module) if name.startswith("dgx_assets.defs"))
        for module in modules()
        if not module.startswith(("dgx_assets.defs", *entry_points))
    }
    assert {module: names for module, names in offenders.items() if names} == {}


@pytest.mark.parametrize("package", ["dgx_assets.station", "dgx_assets.serving"])
def test_the_apart_installed_packages_import_only_themselves_and_the_http_limits(package):
    allowed = (package, "dgx_assets.http_limits", "dgx_assets.flags")
    offenders = {
        module: sorted(name for name in imports_of(module) if name != "dgx_assets" and not name.startswith(allowed))
        for module in modules()
        if module == package or module.startswith(package + ".")
    }
    assert {module: names for module, names in offenders.items() if names} == {}


def test_no_product_module_is_over_the_line_budget():
    long = {module: n for module, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def _base_names(node: ast.ClassDef) -> set[str]:
    return {base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "") for base in node.bases}


def test_settings_classes_carry_their_bounds_as_pydantic_constraints_not_check_methods():
    classes = [
        node for path in modules().values() for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
    ]
    settings = {"BaseModel", "BaseSettings", "Config", "ConfigurableResource", "PermissiveConfig"}
    while grown := {node.name for node in classes if _base_names(node) & settings} - settings:
        settings |= grown  # a subclass of a settings class is one too (TrainConfig of ModelConfig)
    hand_written = {
        (node.name, item.name)
        for node in classes
        if node.name in settings
        for item in node.body
        if isinstance(item, ast.FunctionDef) and item.name in ("check", "model_post_init")
    }
    assert len(settings) > 20 and hand_written == set()
