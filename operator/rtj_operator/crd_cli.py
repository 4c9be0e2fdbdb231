"""`rtj crd`: print the CustomResourceDefinition generated from rtj_operator.api, or write it to crds/.

`make crds` runs `rtj crd --write` from the repository root; a test keeps the file equal to what the
models generate (and the Helm chart's copy is synced from it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rtj_operator import api, constants

CRD_FILENAME = f"{constants.GROUP}_{constants.PLURAL}.yaml"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rtj crd", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--write",
        action="store_true",
        help=f"write crds/{CRD_FILENAME} under --root instead of printing the CRD",
    )
    parser.add_argument("--root", default=".", help="the repository root for --write (default: .)")
    args = parser.parse_args(argv)
    text = api.crd_yaml()
    if not args.write:
        sys.stdout.write(text)
        return 0
    target = Path(args.root) / "crds" / CRD_FILENAME
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() and target.read_text(encoding="utf-8") == text:
        print(f"{target}: up to date")
        return 0
    target.write_text(text, encoding="utf-8")
    print(f"{target}: written")
    return 0
