"""Where the control plane's programs are: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kubectl of one Kubernetes version.

``scripts/build-control-plane.sh`` (run by ``make setup``) builds them from the Go modules pinned in
``localcluster/controlplane/`` into ``~/.cache/rtj/control-plane-<k8s>-etcd-<etcd>/bin``. Users who
have them already name their folder with ``RTJ_CONTROL_PLANE_BIN`` or ``KUBEBUILDER_ASSETS`` (the
variable envtest reads). A missing or broken program is a :class:`MissingBinaryError` that says what
to run.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path

PROGRAMS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
BIN_ENV = ("RTJ_CONTROL_PLANE_BIN", "KUBEBUILDER_ASSETS")
MODULES_DIR = Path(__file__).resolve().parents[1] / "controlplane"
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-control-plane.sh"
HOW_TO_BUILD = (
    "run `make setup` (it runs scripts/build-control-plane.sh), or set KUBEBUILDER_ASSETS to a folder "
    "holding " + ", ".join(PROGRAMS)
)


class MissingBinaryError(RuntimeError):
    """A control-plane program is missing or does not run."""


def _required_version(go_mod: Path, module: str) -> str:
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod.read_text(), re.MULTILINE)
    if match is None:
        raise MissingBinaryError(f"{go_mod} pins no version of {module}")
    return match.group(1)


def pinned_versions() -> tuple[str, str]:
    """(Kubernetes version, etcd version) that the wrapper modules pin."""
    return (
        _required_version(MODULES_DIR / "kubernetes" / "go.mod", "k8s.io/kubernetes"),
        _required_version(MODULES_DIR / "etcd" / "go.mod", "go.etcd.io/etcd/server/v3"),
    )


def cache_dir() -> Path:
    base = os.environ.get("RTJ_CACHE_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rtj"
    )
    return Path(base)


def bin_dir() -> Path:
    """The folder of the programs: a user's own (the variables in ``BIN_ENV``) or the build's."""
    for name in BIN_ENV:
        if os.environ.get(name):
            return Path(os.environ[name])
    kubernetes, etcd = pinned_versions()
    return cache_dir() / f"control-plane-{kubernetes}-etcd-{etcd}" / "bin"


@functools.cache
def _checked(path: Path) -> Path:
    if not path.is_file() or not os.access(path, os.X_OK):
        raise MissingBinaryError(f"{path} is missing: {HOW_TO_BUILD}")
    command = [str(path), "version", "--client"] if path.name == "kubectl" else [str(path), "--version"]
    try:
        subprocess.run(command, capture_output=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as error:
        raise MissingBinaryError(f"{path} does not run ({error}): {HOW_TO_BUILD}") from error
    return path


def program(name: str) -> Path:
    """The path of one of ``PROGRAMS``, checked to exist and run."""
    if name not in PROGRAMS:
        raise ValueError(f"unknown control-plane program {name!r}")
    return _checked(bin_dir() / name)
