"""The operator's size rule (no function over 80 lines, no class over 250) for every other package,
read from the source with `ast` (tests/operator/test_operator_layout.py holds the operator to it).

Every class and function of these packages is within it: the classes that were over the limit when
the rule reached them (the trainer's CheckpointManager, Session and Trainer) have been cut into
units with one job each, and none may grow past it again."""

from __future__ import annotations

from pathlib import Path

import pytest
from rtj_localcluster.testing import oversized, parse_module

REPO = Path(__file__).resolve().parents[2]
PACKAGES = (
    REPO / "trainer_image" / "rtj_trainer",
    REPO / "localcluster" / "rtj_localcluster",
    REPO / "demo" / "rtj_demo",
    REPO / "contract" / "rtj_contract",
)


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            parts = path.relative_to(package.parent).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_function_over_80_lines_and_no_class_over_250(name: str) -> None:
    too_long = oversized(parse_module(MODULES[name]))
    assert not too_long, f"{name}: {too_long}"
