"""The user a pod's container runs as on the process kubelet: ``runAsUser``, ``runAsGroup``,
``fsGroup`` and ``supplementalGroups``, as a real kubelet and container runtime apply them.

The process kubelet runs as root on this machine; a container whose securityContext (or its pod's)
names a ``runAsUser`` other than root is started through ``setpriv`` with that uid, its
``runAsGroup`` (0 when unset, as with an image without a group) and the supplementary groups
``[runAsGroup, fsGroup, *supplementalGroups]``. What it may write is then checked as that user, as
in a container: the pod's volumes, its TMPDIR and HOME (the container's own writable layer, given
to the user here), nothing else.

The host has no passwd entry for the pod's uid, which the container's image would have: ``USER``
(and ``LOGNAME``) name it, unless the container's env does, so ``getpass.getuser()`` works (kopf
asks it for its identity).

One liberty, and only for reading: the process keeps the CAP_DAC_READ_SEARCH capability (ambient),
because the host's Python, its packages and the project's sources live under directories private to
root (a container has them in its image). It may read and list any file; writes are never exempt.

``fsGroup`` applies to the volume types whose ownership a real kubelet manages: emptyDir (created
world-writable, 0777, as a real kubelet does) is given to the group, with the setgid bit on its
directories (``fsGroupChangePolicy: OnRootMismatch`` skips a volume whose root has the group
already). Persistent volumes here are host directories (hostPath PVs, and the directories CSI
volumes such as FSx for Lustre map to), and those keep their owner, as hostPath and FSx for Lustre
(ReadWriteMany) volumes do on EKS.

Without root (a kubelet run by an ordinary user) nothing changes: containers run as that user.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# CAP_DAC_READ_SEARCH only: reading the host's root-private Python and sources.
READ_CAPABILITY = "dac_read_search"


@dataclass(frozen=True)
class RunAs:
    """A container's identity."""

    uid: int
    gid: int
    groups: tuple[int, ...]


def honored() -> bool:
    """Whether this kubelet can switch users (it runs as root and has setpriv)."""
    return os.geteuid() == 0 and shutil.which("setpriv") is not None


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def fs_group(pod: Mapping[str, Any]) -> int | None:
    return _int_or_none(((pod.get("spec") or {}).get("securityContext") or {}).get("fsGroup"))


def run_as(pod: Mapping[str, Any], container: Mapping[str, Any]) -> RunAs | None:
    """The identity ``container`` of ``pod`` takes, or None to run as the kubelet does (no
    runAsUser, runAsUser equal to the kubelet's, or a kubelet that cannot switch)."""
    pod_context = (pod.get("spec") or {}).get("securityContext") or {}
    context = container.get("securityContext") or {}
    uid = _int_or_none(context.get("runAsUser", pod_context.get("runAsUser")))
    if uid is None or uid == os.geteuid() or not honored():
        return None
    gid = _int_or_none(context.get("runAsGroup", pod_context.get("runAsGroup"))) or 0
    groups = [gid]
    group = fs_group(pod)
    if group is not None:
        groups.append(group)
    groups += [g for g in (pod_context.get("supplementalGroups") or []) if _int_or_none(g) is not None]
    return RunAs(uid, gid, tuple(dict.fromkeys(groups)))


def command_prefix(identity: RunAs) -> list[str]:
    """``setpriv`` switching to ``identity`` before it execs the container's command (same pid)."""
    return [
        shutil.which("setpriv") or "setpriv",
        f"--reuid={identity.uid}",
        f"--regid={identity.gid}",
        f"--groups={','.join(str(g) for g in identity.groups)}",
        f"--inh-caps=+{READ_CAPABILITY}",
        f"--ambient-caps=+{READ_CAPABILITY}",
        "--",
    ]


def user_env(identity: RunAs, env: dict[str, str]) -> None:
    """``USER``/``LOGNAME`` for the uid (see above), in place, unless the container set them."""
    for name in ("USER", "LOGNAME"):
        if name not in env or env[name] == os.environ.get(name):
            env[name] = str(identity.uid)


def give_to(identity: RunAs, *paths: Path) -> None:
    """The container's own writable places (TMPDIR, HOME, the working directory it was given)."""
    for path in paths:
        if path.exists() and (path.stat().st_uid, path.stat().st_gid) != (identity.uid, identity.gid):
            os.chown(path, identity.uid, identity.gid)


def prepare_empty_dir(path: Path, pod: Mapping[str, Any]) -> None:
    """A fresh emptyDir: world-writable like a real kubelet's, then given to the pod's fsGroup."""
    if not honored():
        return
    os.chmod(path, 0o777)
    group = fs_group(pod)
    if group is not None:
        apply_fs_group(path, group, on_root_mismatch=_on_root_mismatch(pod))


def _on_root_mismatch(pod: Mapping[str, Any]) -> bool:
    context = (pod.get("spec") or {}).get("securityContext") or {}
    return context.get("fsGroupChangePolicy") == "OnRootMismatch"


def apply_fs_group(root: Path, group: int, *, on_root_mismatch: bool) -> bool:
    """Give ``root`` and what it holds to ``group``: group read/write (and search on directories,
    with setgid so new files inherit the group). False when skipped (OnRootMismatch, root already
    right)."""
    info = root.stat()
    wanted = stat.S_IRGRP | stat.S_IWGRP | stat.S_IXGRP | stat.S_ISGID
    if on_root_mismatch and info.st_gid == group and stat.S_IMODE(info.st_mode) & wanted == wanted:
        return False
    for directory, subdirs, files in os.walk(root):
        for name in [directory, *(os.path.join(directory, f) for f in files)]:
            path_info = os.lstat(name)
            if stat.S_ISLNK(path_info.st_mode):
                continue
            os.chown(name, -1, group)
            extra = stat.S_IRGRP | stat.S_IWGRP
            if stat.S_ISDIR(path_info.st_mode):
                extra |= stat.S_IXGRP | stat.S_ISGID
            os.chmod(name, stat.S_IMODE(path_info.st_mode) | extra)
        subdirs[:] = [d for d in subdirs if not os.path.islink(os.path.join(directory, d))]
    log.debug("fsGroup %d applied to %s", group, root)
    return True
