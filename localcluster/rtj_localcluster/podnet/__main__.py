"""``python -m rtj_localcluster.podnet``: build the pod network library (``make setup`` runs it).

Prints the library's path; without a C compiler it says so and exits 0, since local clusters run
without the library (pods then share the machine's ports; see docs/localcluster.md).
"""

from __future__ import annotations

import sys

from . import build


def main() -> int:
    try:
        print(build())
    except RuntimeError as error:
        print(f"pod network library not built: {error}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
