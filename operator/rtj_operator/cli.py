"""The `rtj` command: a thin dispatcher to the subcommand modules.

Each subcommand lives in its own module and exposes ``main(argv: list[str]) -> int``; the modules are
imported lazily so that `rtj render` does not pay for importing kopf, torch or the local cluster.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "render": ("rtj_operator.render_cli", "print the manifests the operator would create for a job"),
    "crd": ("rtj_operator.crd_cli", "print or write the CustomResourceDefinition generated from the API"),
    "operator": ("rtj_operator.main", "run the operator"),
    "local": ("rtj_localcluster.cli", "run and control the embedded local cluster"),
    "demo": ("rtj_demo.demo", "rehearse faults on the local cluster and report goodput"),
    "bench": ("rtj_demo.bench", "run the goodput and checkpoint benchmarks"),
}


def _usage() -> str:
    lines = ["usage: rtj <command> [options]", "", "commands:"]
    lines += [f"  {name:<10} {text}" for name, (_, text) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in {"-h", "--help", "help"}:
        print(_usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"rtj: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    result: int = module.main(rest)
    return result


def operator_main() -> None:
    """Console script `rtj-operator`: the same as `rtj operator`."""
    sys.exit(main(["operator", *sys.argv[1:]]))


if __name__ == "__main__":
    sys.exit(main())
