"""The operator's shape, held by a test: sizes, layers and no import cycles (docs/architecture.md).

Read from the source with `ast`, without importing anything: no function over 80 lines and no class
over 250 in rtj_operator (the pydantic models of rtj_operator.api are field declarations and exempt);
the pure layers (decide, render, observe, names) import neither kopf, the API client nor the runtime;
the product imports nothing of the development tools; and no import cycle between its modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from rtj_localcluster.testing import assert_no_import_cycles, oversized, parse_module

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "rtj_operator"
PURE = ("rtj_operator.decide", "rtj_operator.render", "rtj_operator.observe", "rtj_operator.names")
NOT_IN_PURE = ("kopf", "kubernetes", "rtj_operator.runtime", "rtj_operator.main")
DEVELOPMENT_TOOLS = ("rtj_localcluster", "rtj_demo", "rtj_trainer")


def _modules() -> dict[str, ast.Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = parse_module(path)
    return found


MODULES = _modules()


def _imports(module: ast.Module) -> set[str]:
    """Every module name an import statement names (`from a import b` names a.b and a)."""
    names: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _is_pydantic_model(node: ast.ClassDef, name: str) -> bool:
    return name.startswith("rtj_operator.api.") and bool(node.bases)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_function_over_80_lines_and_no_class_over_250(name: str) -> None:
    too_long = oversized(MODULES[name], exempt=lambda node: _is_pydantic_model(node, name))
    assert not too_long, f"{name}: {too_long}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith(PURE)))
def test_pure_layers_import_no_io(name: str) -> None:
    imported = _imports(MODULES[name])
    assert not {i for i in imported if i.startswith(NOT_IN_PURE)}


def test_the_product_imports_none_of_the_development_tools() -> None:
    for name, module in MODULES.items():
        assert not {i for i in _imports(module) if i.startswith(DEVELOPMENT_TOOLS)}, name


def test_no_import_cycles() -> None:
    graph = {
        name: {i for i in _imports(module) if i in MODULES and i != name} for name, module in MODULES.items()
    }
    # A package's own modules import it for their siblings (`from rtj_operator.decide import x`):
    # that names the sibling, not the package's __init__.
    for name, module in MODULES.items():
        for node in ast.walk(module):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module in MODULES
                and all(f"{node.module}.{alias.name}" in MODULES for alias in node.names)
            ):
                graph[name].discard(node.module)
    assert_no_import_cycles(graph)
