"""`make test` runs pytest in three lanes side by side (the Makefile's TEST_LANE_* and test-lane-*):
every test file is in exactly one lane, so a new file or folder cannot drop out of the suite (a lane
may take a folder, a folder less some files, or single files), and the trainer's tests run a second
time on NVRx 0.7.0."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def lane_targets() -> list[str]:
    """The lanes `make test` runs side by side: the targets of its last recipe line."""
    recipe = (REPO / "Makefile").read_text().split("\ntest:\n", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"\btest-lane-[\w.-]+", recipe.splitlines()[-1])


def lane_runs(targets: list[str]) -> list[list[str]]:
    """The argv of each pytest run of the lanes, as make would run them (a dry run)."""
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", *targets, "PYTEST_ARGS="],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.replace("\\\n", " ")
    return [shlex.split(line) for line in out.splitlines() if "bin/pytest" in line]


def lane_files(run: list[str]) -> list[str]:
    """The test files one pytest run takes: its folders' less those it ignores, and its files."""
    ignored = {arg.removeprefix("--ignore=") for arg in run if arg.startswith("--ignore=")}
    files: list[str] = []
    for arg in (arg for arg in run if arg.startswith("tests/")):
        path = REPO / arg
        found = sorted(path.glob("test_*.py")) if path.is_dir() else [path]
        files += [str(f.relative_to(REPO)) for f in found if str(f.relative_to(REPO)) not in ignored]
    return files


def test_every_test_file_is_in_exactly_one_lane_and_the_trainer_tests_run_again_on_nvrx_0_7() -> None:
    targets = lane_targets()
    assert len(targets) == 3, targets
    runs = lane_runs(targets)
    assert len(runs) == 4, runs
    again = [run for run in runs if "RTJ_TEST_NVRX_VERSION=0.7.0" in run]
    assert len(again) == 1 and again[0][-1] == "tests/trainer", again
    files = [f for run in runs if run not in again for f in lane_files(run)]
    on_disk = sorted(str(path.relative_to(REPO)) for path in (REPO / "tests").glob("*/test_*.py"))
    assert sorted(files) == on_disk, sorted(set(on_disk) ^ set(files))
    assert len(files) == len(set(files)), [f for f in set(files) if files.count(f) > 1]
    assert not list((REPO / "tests").glob("test_*.py")), "a test file at the top of tests/ is in no lane"
