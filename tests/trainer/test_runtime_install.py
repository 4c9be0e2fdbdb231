"""``rtj-launch --install-runtime``: the pod runtime copied into a volume runs from there, with an
interpreter that has no site-packages at all (a user's image without this project's package), and the
processes it starts find the package too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from rtj_contract.termination import STARTUP_FAILED, STARTUP_FAILURE_EXIT_CODE
from rtj_trainer.runtime import install

# A module placed in the copied lib: it starts a child interpreter and prints where that child found
# the package, as the rank shim and a user's script importing the library would.
CHILD_PROBE = """
import subprocess, sys

def main():
    where = subprocess.run(
        [sys.executable, "-S", "-c", "import rtj_trainer; print(rtj_trainer.__file__)"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    print("child found", where)
    return 0
"""


def run_bare(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """This interpreter without site-packages (-S) nor PYTHONPATH and the like (-E)."""
    return subprocess.run(
        [sys.executable, "-S", "-E", *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_copy_holds_the_package_and_one_entry_script_per_command(tmp_path: Path) -> None:
    install.install(tmp_path)
    package = tmp_path / install.LIB_DIR / "rtj_trainer"
    assert (package / "runtime" / "launch.py").is_file() and (package / "library" / "session.py").is_file()
    assert not list(package.rglob("__pycache__")) and not list(package.rglob("*.pyc"))
    assert (tmp_path / install.LIB_DIR / "prometheus_client" / "exposition.py").is_file()
    assert sorted(p.name for p in tmp_path.glob("*.py")) == sorted(install.ENTRY_SCRIPTS)


def test_the_copy_runs_without_site_packages_and_installs_itself_again(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    install.install(first)
    assert run_bare("-c", "import rtj_trainer", cwd=tmp_path).returncode != 0  # nothing else to import
    result = run_bare(str(first / "rtj-launch.py"), install.INSTALL_RUNTIME, str(second), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"from {first / install.LIB_DIR / 'rtj_trainer'}" in result.stderr
    assert (second / install.LIB_DIR / "rtj_trainer" / "runtime" / "install.py").is_file()
    # The trainer's metrics, written by prometheus-client, work from the copy alone.
    metrics = "from rtj_trainer.runtime import metrics; print(metrics.exposition({'step': 3}, 0.0))"
    shown = run_bare(
        "-c", f"import sys; sys.path.insert(0, {str(second / install.LIB_DIR)!r}); {metrics}", cwd=tmp_path
    )
    assert shown.returncode == 0, shown.stderr
    assert "rtj_trainer_step 3.0" in shown.stdout


def test_processes_started_from_the_copy_find_the_package(tmp_path: Path) -> None:
    install.install(tmp_path)
    (tmp_path / install.LIB_DIR / "rtj_probe_child.py").write_text(CHILD_PROBE)
    (tmp_path / "probe.py").write_text(install.entry_script("probe.py", "rtj_probe_child"))
    result = run_bare(str(tmp_path / "probe.py"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    found = result.stdout.strip().removeprefix("child found ")
    assert Path(found) == tmp_path / install.LIB_DIR / "rtj_trainer" / "__init__.py"


def test_an_interpreter_older_than_the_runtime_needs_is_a_startup_failure(tmp_path: Path) -> None:
    install.install(tmp_path)
    script = tmp_path / "rtj-launch.py"
    older = f"import sys; sys.version_info = (3, {install.MIN_PYTHON[1] - 1}, 0)"
    code = f"compile(open({str(script)!r}).read(), {str(script)!r}, 'exec')"
    run = f"{older}; exec({code}, {{'__file__': {str(script)!r}}})"
    result = run_bare("-c", run, cwd=tmp_path)
    assert result.returncode == STARTUP_FAILURE_EXIT_CODE
    assert result.stderr.startswith(f"FaultReason: {STARTUP_FAILED}\n")
    assert f"python3 is 3.{install.MIN_PYTHON[1] - 1}" in result.stderr


def test_wrong_arguments_get_the_usage_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert install.main([install.INSTALL_RUNTIME]) == 2
    assert "usage: rtj-launch --install-runtime <directory>" in capsys.readouterr().err
