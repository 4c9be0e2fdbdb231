"""``rtj-launch --prepare-checkpoint-dir``: the init container that gives the job its checkpoint directory.

A fresh FSx for Lustre file system's root belongs to root (mode 0755), and its CSI driver ignores the
pod's ``fsGroup`` for ReadWriteMany volumes, so the trainer (uid 10001) could not create
``<mountPath>/<job>``. The operator renders an init container that runs this as root with CAP_CHOWN
and CAP_FOWNER only: it creates the directory and gives it to ``RTJ_CHECKPOINT_DIR_OWNER``
(``uid:gid``), mode 2770 (the group inherited by what the job writes). Nothing above or below the
job's directory changes, and an existing directory with the right owner is left as it is.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from rtj_contract.env import CHECKPOINT_DIR, CHECKPOINT_DIR_OWNER

from rtj_trainer.library.env import EnvError

log = logging.getLogger("rtj_trainer.runtime.checkpoint_dir")

DIRECTORY_MODE = 0o2770


def parse_owner(raw: str) -> tuple[int, int]:
    """``"uid:gid"`` as two integers."""
    uid, sep, gid = raw.partition(":")
    if not sep or not uid.isdigit() or not gid.isdigit():
        raise EnvError(f"{CHECKPOINT_DIR_OWNER}={raw!r} must be <uid>:<gid>")
    return int(uid), int(gid)


def prepare(path: Path, uid: int, gid: int) -> bool:
    """Create ``path`` owned by ``uid:gid`` with mode 2770; False when it was already so."""
    path.mkdir(parents=True, exist_ok=True)
    info = path.stat()
    if (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (uid, gid, DIRECTORY_MODE):
        return False
    try:
        os.chown(path, uid, gid)
    except PermissionError:
        if os.geteuid() == 0:
            raise
        # Not root (a local cluster whose kubelet runs as an ordinary user, and so runs the trainer
        # as that user too): the directory stays this user's, which is the trainer's.
        log.warning("not root: %s stays owned by uid %d", path, os.geteuid())
        return True
    os.chmod(path, DIRECTORY_MODE)
    return True


def main(environ: Mapping[str, str]) -> int:
    raw_dir = environ.get(CHECKPOINT_DIR, "")
    if not raw_dir:
        raise EnvError(f"{CHECKPOINT_DIR} is required")
    uid, gid = parse_owner(environ.get(CHECKPOINT_DIR_OWNER, ""))
    changed = prepare(Path(raw_dir), uid, gid)
    log.info("%s %s for %d:%d", "prepared" if changed else "kept", raw_dir, uid, gid)
    return 0
