"""``rtj-launch --install-runtime <dir>``: copy the pod runtime into a volume, for an image without it.

A job whose ``spec.runtimeImage`` is set runs a user's own image that holds Python, torch and NVRx but
not this package. The operator renders an init container from the runtime image that runs this: it
copies the ``rtj_trainer`` package (pure Python: the runtime, the library, the rest) and the packages
the runtime needs beyond the standard library, ``rtj_contract`` (what the operator and the trainer read
alike) and ``prometheus_client`` (pure Python, the trainer's metrics), to ``<dir>/lib``, and writes one
entry script per command to ``<dir>`` (``rtj-launch.py``, ``rtj-store.py``). The worker then runs
``python3 <dir>/rtj-launch.py -- <command...>`` with the image's own interpreter: the script puts
``<dir>/lib`` first on ``sys.path`` and on ``PYTHONPATH`` (so the rank shim and a script that imports
the library find it too) and calls the command's ``main``. Nothing is compiled or installed into the
image; the volume is the pod's own.
"""

from __future__ import annotations

import importlib
import logging
import shutil
import sys
from pathlib import Path
from typing import Final

from rtj_contract.termination import STARTUP_FAILED, STARTUP_FAILURE_EXIT_CODE

log = logging.getLogger("rtj_trainer.runtime.install")

# The init container's argument: `rtj-launch --install-runtime <dir>`.
INSTALL_RUNTIME: Final = "--install-runtime"
LIB_DIR: Final = "lib"
# What is copied: this package, and the packages the runtime imports beyond the standard library.
DEPENDENCIES: Final = ("rtj_contract", "prometheus_client")
# Each command's entry script in the runtime directory -> the module whose main() it runs.
ENTRY_SCRIPTS: Final = {
    "rtj-launch.py": "rtj_trainer.runtime.launch",
    "rtj-store.py": "rtj_trainer.runtime.store",
}
# The package's own floor (pyproject.toml requires-python): an older interpreter in the user's image
# gets a start-up failure that says so (the operator fails the job at once with the message), not a
# SyntaxError from deep inside the runtime.
MIN_PYTHON: Final = (3, 11)

_ENTRY_TEMPLATE: Final = """\
# {name}: installed by `rtj-launch --install-runtime`; runs {module} from ./{lib}.
import os
import sys

if sys.version_info < {min_python!r}:
    sys.stderr.write(
        "FaultReason: {reason}\\n"
        "the image's python3 is %d.%d; the pod runtime (spec.runtimeImage) needs Python {min_text} "
        "or newer\\n" % sys.version_info[:2]
    )
    sys.exit({exit_code})
LIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "{lib}")
sys.path.insert(0, LIB)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (LIB, os.environ.get("PYTHONPATH")) if p)
from {module} import main  # noqa: E402

sys.exit(main())
"""


def package_dir() -> Path:
    """The ``rtj_trainer`` package this process runs from."""
    import rtj_trainer

    return Path(rtj_trainer.__file__).resolve().parent


def entry_script(name: str, module: str) -> str:
    """The text of the entry script `name` that runs `module`'s ``main()``."""
    return _ENTRY_TEMPLATE.format(
        name=name,
        module=module,
        lib=LIB_DIR,
        min_python=MIN_PYTHON,
        min_text=".".join(map(str, MIN_PYTHON)),
        exit_code=STARTUP_FAILURE_EXIT_CODE,
        reason=STARTUP_FAILED,
    )


def dependency_dir(name: str) -> Path:
    """The directory of the installed package `name` this process would import."""
    module = importlib.import_module(name)
    assert module.__file__ is not None, name
    return Path(module.__file__).resolve().parent


def install(target: Path) -> None:
    """Copy this package and its DEPENDENCIES to ``target/lib`` and write the entry scripts; what an
    earlier run left there is replaced."""
    for package in (package_dir(), *(dependency_dir(name) for name in DEPENDENCIES)):
        lib = target / LIB_DIR / package.name
        if lib.exists():
            shutil.rmtree(lib)
        shutil.copytree(package, lib, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name, module in ENTRY_SCRIPTS.items():
        (target / name).write_text(entry_script(name, module))
    log.info("pod runtime installed in %s (from %s)", target, package_dir())


def main(args: list[str]) -> int:
    """``--install-runtime <dir>``: install into `dir`; 2 with a usage line on other arguments."""
    if len(args) != 2 or args[0] != INSTALL_RUNTIME:
        print(f"usage: rtj-launch {INSTALL_RUNTIME} <directory>", file=sys.stderr)
        return 2
    install(Path(args[1]))
    return 0
