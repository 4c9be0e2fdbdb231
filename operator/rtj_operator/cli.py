"""The `rtj` command: a thin dispatcher to the product's subcommands and to plugged-in ones.

The product's own subcommands (`render`, `crd`, `operator`, `status`) are modules of this package. Other
distributions, or other packages of this one (the local cluster, the demo and the benchmarks), add
subcommands through the entry-point group `rtj.commands` (pyproject.toml), each naming a module;
this package imports nothing of them until one is run. Every subcommand module exposes
``main(argv: list[str]) -> int`` and is imported lazily, so that `rtj render` does not pay for
importing kopf, torch or the local cluster.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from importlib.metadata import entry_points
from pathlib import Path

# The entry-point group through which other packages add `rtj <command>` (value: a module name).
ENTRY_POINT_GROUP = "rtj.commands"

# The product's subcommands: name -> (module, one-line help).
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "render": ("rtj_operator.render_cli", "print the manifests the operator would create for a job"),
    "crd": ("rtj_operator.crd_cli", "print or write the CustomResourceDefinition generated from the API"),
    "operator": ("rtj_operator.main", "run the operator"),
    "status": ("rtj_operator.status_cli", "print a job's status: state, step, conditions, checkpoint advice"),
}


def plugged_in() -> dict[str, str]:
    """Subcommands added through `ENTRY_POINT_GROUP`: name -> module (the product's names win)."""
    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    return {name: module for name, module in sorted(found.items()) if name not in SUBCOMMANDS}


def _help_of(module: str) -> str:
    """The first line of a module's docstring, read without importing the module."""
    try:
        spec = importlib.util.find_spec(module)
    except ImportError:
        spec = None
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return "(not installed)"
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))) or ""
    first = doc.splitlines()[0] if doc else ""
    return first.split("`: ", 1)[1].rstrip(".") if "`: " in first else first


def _usage() -> str:
    lines = ["usage: rtj <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {text}" for name, (_, text) in SUBCOMMANDS.items()]
    lines += [f"  {name:<10} {_help_of(module)}" for name, module in plugged_in().items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    name, rest = args[0], args[1:]
    modules = {name: module for name, (module, _) in SUBCOMMANDS.items()} | plugged_in()
    if name not in modules:
        print(f"rtj: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(modules[name])
    result: int = module.main(rest)
    return result


def operator_main() -> None:
    """Console script `rtj-operator`: the same as `rtj operator`."""
    sys.exit(main(["operator", *sys.argv[1:]]))


if __name__ == "__main__":
    sys.exit(main())
