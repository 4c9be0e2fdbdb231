"""The trainer package's layers, held by a test: four parts and who may import whom (docs/trainer.md).

Read from the source with `ast`, without importing anything, as tests/operator/test_operator_layout.py
does for the operator. rtj_trainer is the public facade (`__init__.py`) and four subpackages:

* library: the facade's implementation and what the other parts share; imports none of them;
* runtime: the pod runtime (rtj-launch, the rank shim, the endpoint, rtj-store); the library only;
* rehearsal: fault injection and the checkpoint drill; the library only;
* reference: the reference trainer (rtj-train); the facade and rehearsal: its resilience goes through
  the library's public API (the facade's `__all__`), as a user's script's does, never through a
  module of the library or the runtime (docs/trainer.md, "Modules").

Nothing imports the reference trainer, not even the other packages of the project; the facade
loads its names from the library only; the subpackages' `__init__` files import nothing; the rank
shim imports only the standard library; and no import cycle runs between the modules.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
from rtj_localcluster.testing import assert_no_import_cycles, parse_module

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "trainer_image" / "rtj_trainer"
FACADE = "rtj_trainer"
PARTS = ("library", "runtime", "rehearsal", "reference")
# The parts each part may import, itself included. The facade is the library's public face:
# the other parts may import it as any script does; the library may not (the facade imports it).
MAY_IMPORT: dict[str, frozenset[str]] = {
    FACADE: frozenset({"library"}),
    "library": frozenset({"library"}),
    "runtime": frozenset({FACADE, "library", "runtime"}),
    "rehearsal": frozenset({FACADE, "library", "rehearsal"}),
    "reference": frozenset({FACADE, "rehearsal", "reference"}),
}
RANK_SHIM = "rtj_trainer.runtime.rankshim"
# The project's other packages: none of them may import the reference trainer either.
OTHER_PACKAGES = (
    REPO / "operator" / "rtj_operator",
    REPO / "localcluster" / "rtj_localcluster",
    REPO / "demo" / "rtj_demo",
)


def _parse(root: Path) -> dict[str, ast.Module]:
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = parse_module(path)
    return found


MODULES = _parse(PACKAGE)


def _imports(module: ast.Module) -> set[str]:
    """Every module name an absolute import statement names (`from a import b` names a.b and a),
    wherever the statement is: a function's lazy import counts as much as one at the top. A relative
    import stays inside its own package (rtj_trainer has none: a test below holds it)."""
    names: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _imported_modules(module: ast.Module) -> set[str]:
    """The modules an absolute import statement takes something from: `from a.b import c` takes from
    a.b, or from a.b.c where that is a module; `import a.b` from a.b."""
    names: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            names |= {_module_of(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {_module_of(f"{node.module}.{alias.name}") for alias in node.names}
    return names


def _module_of(name: str) -> str:
    """The module of rtj_trainer that a dotted name is in (itself outside rtj_trainer)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in MODULES:
            return ".".join(parts[:end])
    return name


def _part(name: str) -> str | None:
    """The part a module name belongs to: the facade, a subpackage, or None outside rtj_trainer.
    A name under rtj_trainer in no part (an old path such as rtj_trainer.launch) is its own name,
    which no part may import."""
    if name == FACADE:
        return FACADE
    if not name.startswith(FACADE + "."):
        return None
    first = name.split(".")[1]
    return first if first in PARTS else name


def _own_imports(name: str) -> set[str]:
    return {i for i in _imports(MODULES[name]) if i.startswith(FACADE)}


def test_every_module_is_in_one_of_the_four_parts() -> None:
    stray = [name for name in MODULES if name != FACADE and _part(name) not in PARTS]
    assert not stray, f"modules outside library/runtime/rehearsal/reference: {stray}"
    assert {f"{FACADE}.{part}" for part in PARTS} <= set(MODULES), (
        "each part is a package with an __init__.py"
    )


def test_imports_are_absolute() -> None:
    relative = [
        name
        for name, module in MODULES.items()
        if any(isinstance(node, ast.ImportFrom) and node.level for node in ast.walk(module))
    ]
    assert not relative, f"relative imports, which this test would not see: {relative}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_each_part_imports_only_what_its_layer_allows(name: str) -> None:
    part = _part(name)
    assert part is not None
    allowed = MAY_IMPORT[part]
    wrong = sorted(
        m for m in _imported_modules(MODULES[name]) if _part(m) is not None and _part(m) not in allowed
    )
    assert not wrong, f"{name} ({part}) may import {sorted(allowed)} only, not {wrong}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if _part(n) == "reference"))
def test_the_reference_trainer_takes_only_public_names_from_the_facade(name: str) -> None:
    """`from rtj_trainer import X` names X in the facade's `__all__`; no attribute path reaches past
    the facade (`rtj_trainer.library...`)."""
    public = _facade_all()
    module = MODULES[name]
    taken = {
        alias.name
        for node in ast.walk(module)
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == FACADE
        for alias in node.names
    }
    assert taken <= public, f"{name} takes {sorted(taken - public)} from rtj_trainer, not in its __all__"
    reached = {
        node.attr
        for node in ast.walk(module)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == FACADE
    }
    assert reached <= public, f"{name} reaches rtj_trainer.{sorted(reached - public)}"


def _facade_all() -> set[str]:
    (names,) = [
        node.value
        for node in MODULES[FACADE].body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
    ]
    assert isinstance(names, ast.List)
    return {e.value for e in names.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}


def test_nothing_imports_the_reference_trainer() -> None:
    importers = {name: MODULES[name] for name in MODULES if _part(name) != "reference"}
    for root in OTHER_PACKAGES:
        importers |= _parse(root)
    for name, module in importers.items():
        assert not {i for i in _imports(module) if _part(i) == "reference"}, name


def test_the_facade_loads_its_names_from_the_library_only() -> None:
    """Its exports are imported by name on first use (importlib), which the import statements do not
    show: the `_EXPORTS` table must name library modules."""
    (table,) = [
        node.value
        for node in ast.walk(MODULES[FACADE])
        if isinstance(node, ast.AnnAssign | ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in _targets(node))
    ]
    assert isinstance(table, ast.Dict) and table.values
    for value in table.values:
        assert isinstance(value, ast.Constant) and isinstance(value.value, str)
        assert _part(value.value) == "library", value.value
        assert value.value in MODULES, value.value


def _targets(node: ast.AnnAssign | ast.Assign) -> list[ast.expr]:
    return [node.target] if isinstance(node, ast.AnnAssign) else list(node.targets)


@pytest.mark.parametrize("part", PARTS)
def test_a_part_s_init_imports_nothing(part: str) -> None:
    """Importing one module of a part loads no other (the rank shim starts with the standard library
    alone); the package docstring says what the part is for and what it may import."""
    module = MODULES[f"{FACADE}.{part}"]
    assert not _imports(module)
    doc = ast.get_docstring(module)
    assert doc and "May import" in doc


def test_the_rank_shim_imports_only_the_standard_library() -> None:
    outside = {i.partition(".")[0] for i in _imports(MODULES[RANK_SHIM])} - set(sys.stdlib_module_names)
    assert not outside, f"{RANK_SHIM} imports {sorted(outside)}"


def test_no_import_cycles() -> None:
    # `from rtj_trainer.library import drain` names the package too: its __init__ imports nothing, so
    # that edge ends there and closes no cycle.
    graph = {name: {i for i in _own_imports(name) if i in MODULES and i != name} for name in MODULES}
    assert_no_import_cycles(graph)


# The trainer tests that NVRx's release cannot change (marked `nvrx_independent`: `make test` runs
# them on .venv's NVRx only, not again on 0.7.0) import nothing of NVRx and name none of the programs
# that run it; tests/trainer/conftest.py bars NVRx from them and from the processes they start.
NVRX = "nvidia_resiliency_ext"
NVRX_PROGRAMS = ("rtj-launch", "rtj-train", "ft_launcher", "torchrun", "rtj_trainer.runtime", NVRX)
TESTS = Path(__file__).resolve().parent


def _is_marked_nvrx_independent(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.Attribute) and node.attr == "nvrx_independent" for node in ast.walk(tree))


def _nvrx_independent_test_modules() -> list[Path]:
    marked = [p for p in sorted(TESTS.glob("test_*.py")) if _is_marked_nvrx_independent(parse_module(p))]
    assert marked, "no trainer test is marked nvrx_independent: the 0.7.0 run repeats every one"
    return marked


@pytest.mark.parametrize("path", _nvrx_independent_test_modules(), ids=lambda p: p.name)
def test_a_test_marked_nvrx_independent_imports_and_starts_no_nvrx(path: Path) -> None:
    tree = parse_module(path)
    assert not [n for n in _imports(tree) if n.startswith(NVRX)], f"{path.name} imports NVRx"
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    named = sorted({p for p in NVRX_PROGRAMS for s in strings if p in s})
    assert not named, f"{path.name} names {named}, which run NVRx"
