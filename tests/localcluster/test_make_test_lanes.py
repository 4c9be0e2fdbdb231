"""`make test` runs pytest in two lanes side by side (the Makefile's TEST_LANE_*): every test folder
is in exactly one lane, so a new folder cannot drop out of the suite, and the trainer's tests run a
second time on NVRx 0.7.0."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def lane_runs() -> list[list[str]]:
    """The argv of each pytest run of the two lanes, as make would run them (a dry run)."""
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", "test-lane-operator", "test-lane-rest", "PYTEST_ARGS="],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.replace("\\\n", " ")
    return [shlex.split(line) for line in out.splitlines() if "bin/pytest" in line]


def test_every_test_folder_is_in_exactly_one_lane_and_the_trainer_tests_run_again_on_nvrx_0_7() -> None:
    runs = lane_runs()
    assert len(runs) == 3, runs
    folders = [arg for run in runs[:2] for arg in run if arg.startswith("tests/")]
    on_disk = sorted({f"tests/{path.parent.name}" for path in (REPO / "tests").glob("*/test_*.py")})
    assert sorted(folders) == on_disk, (folders, on_disk)
    assert len(folders) == len(set(folders)), folders
    assert not list((REPO / "tests").glob("test_*.py")), "a test file at the top of tests/ is in no lane"
    second = runs[2]
    assert "RTJ_TEST_NVRX_VERSION=0.7.0" in second and second[-1] == "tests/trainer", second
