"""Layer contracts for the packages outside the operator (tests/operator/test_operator_layout.py holds
the operator's, tests/trainer/test_trainer_layout.py the trainer's), read from the source with `ast`.

Each package declares its layers, lowest first: a module imports only modules of its own layer or
below, every module is in exactly one layer (a new module must be placed), and no import cycle runs
through the package. A module of a package is its top-level name (a subpackage counts as one)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from rtj_localcluster.testing import assert_no_import_cycles, parse_module

REPO = Path(__file__).resolve().parents[2]

LAYERS: dict[str, tuple[frozenset[str], ...]] = {
    "rtj_localcluster": (
        # Parts with no other part below them: the API client, programs, certificates, ports, the
        # pod's environment and identity, the log server, the SPDY framing, the resource figures,
        # the event loop's thread.
        frozenset(
            {
                "binaries", "certs", "client", "cluster_pool", "identity", "logserver", "loop_thread",
                "marks", "podenv", "podnet", "podsite", "ports", "probes", "resource_metrics", "spdy",
            }
        ),
        # What a cluster is made of: the control plane's processes, node objects and their leases,
        # DNS, volumes (the provisioner's and a pod's), exec/attach/port-forward streams, the
        # metrics API.
        frozenset({"controlplane", "dns", "metrics_api", "nodes", "pod_volumes", "streaming", "volumes"}),
        # A node's agents: the process kubelet of one node, and the one agent of every hollow node.
        frozenset({"hollow", "kubelet"}),
        frozenset({"fleet"}),
        frozenset({"cluster"}),
        # The entry points: `rtj-local` and the pytest fixtures.
        frozenset({"cli", "testing"}),
    ),
    "rtj_demo": (
        # The report's vocabulary, the terminal view, the processes a run leaves, the checkpoint bench,
        # the projection to large jobs, the scale bench's watches and probes.
        frozenset({"ckptbench", "live", "processes", "projection", "report", "scalewatch"}),
        # The timeline of a run; the scale bench's cluster and operator.
        frozenset({"scalebench", "timeline"}),
        # The scale bench's scenarios and tables.
        frozenset({"scalephases"}),
        frozenset({"plot", "rehearsal"}),
        # The configurations the demo rehearses, and the Kubernetes-only run beside them.
        frozenset({"configurations", "indexedjob"}),
        # The entry points: `rtj demo` and `rtj bench`.
        frozenset({"bench", "demo"}),
    ),
}  # fmt: skip

PACKAGE_DIRS = {"rtj_localcluster": REPO / "localcluster", "rtj_demo": REPO / "demo"}


def package_modules(package: str) -> dict[str, list[Path]]:
    """The package's modules (top-level names) and their source files."""
    root = PACKAGE_DIRS[package] / package
    modules: dict[str, list[Path]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts == ("__init__",):
            continue
        modules.setdefault(parts[0], []).append(path)
    return modules


def imported_modules(package: str, module: str, path: Path) -> set[str]:
    """The package's modules that `path` (part of `module`) imports, relative imports resolved."""
    found: set[str] = set()
    depth = len(path.relative_to(PACKAGE_DIRS[package] / package).parts) - 1  # 0: a top-level module
    for node in ast.walk(parse_module(path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = [package, *([module] if depth else [])][: max(1 + depth - (node.level - 1), 1)]
                prefix = ".".join([*base, *([node.module] if node.module else [])])
            else:
                prefix = node.module or ""
            names = [prefix, *(f"{prefix}.{alias.name}" for alias in node.names)]
        else:
            continue
        found |= {name.split(".")[1] for name in names if name.startswith(f"{package}.")}
    return found & set(package_modules(package)) - {module}


def import_graph(package: str) -> dict[str, set[str]]:
    return {
        module: set().union(*(imported_modules(package, module, path) for path in paths))
        for module, paths in package_modules(package).items()
    }


def layer_of(package: str, module: str) -> int:
    return next(index for index, layer in enumerate(LAYERS[package]) if module in layer)


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_every_module_is_in_exactly_one_layer(package: str) -> None:
    declared = [module for layer in LAYERS[package] for module in layer]
    assert len(declared) == len(set(declared)), f"{package}: a module is in two layers"
    assert sorted(declared) == sorted(package_modules(package)), (
        f"{package}: place each module in a layer, and name no module that is gone"
    )


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_no_module_imports_one_of_a_higher_layer(package: str) -> None:
    upward = {
        f"{module} -> {imported}"
        for module, imports in import_graph(package).items()
        for imported in imports
        if layer_of(package, imported) > layer_of(package, module)
    }
    assert not upward, f"{package}: {sorted(upward)}"


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_no_import_cycles(package: str) -> None:
    assert_no_import_cycles(import_graph(package))


def test_the_import_graph_sees_relative_and_absolute_imports() -> None:
    graph = import_graph("rtj_localcluster")
    assert "identity" in graph["kubelet"]  # `from . import identity`
    assert "client" in graph["dns"]  # `from .client import ...`
    assert {"cluster", "cluster_pool", "podnet"} <= graph["testing"]
    assert {"rehearsal", "report", "timeline"} <= import_graph("rtj_demo")["indexedjob"]  # absolute
