"""The process kubelet's user switch, piece by piece: which identity a container takes (its own
securityContext over its pod's), the setpriv command, and fsGroup on an emptyDir's tree."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rtj_localcluster import identity


def pod(context: dict[str, object]) -> dict[str, object]:
    return {"spec": {"securityContext": context}}


def test_container_context_wins_and_groups_collect_fs_group_and_supplemental_ones() -> None:
    assert identity.honored() == (os.geteuid() == 0)  # these machines run the kubelet as root
    spec = pod({"runAsUser": 10001, "runAsGroup": 10002, "fsGroup": 10003, "supplementalGroups": [7, 10002]})
    assert identity.run_as(spec, {}) == identity.RunAs(10001, 10002, (10002, 10003, 7))
    own = {"securityContext": {"runAsUser": 20000, "runAsGroup": 20001}}
    assert identity.run_as(spec, own) == identity.RunAs(20000, 20001, (20001, 10003, 7, 10002))
    # No runAsUser, or the kubelet's own uid (an init container as root): no switch.
    assert identity.run_as(pod({"fsGroup": 5}), {}) is None
    assert identity.run_as(spec, {"securityContext": {"runAsUser": os.geteuid()}}) is None
    # runAsUser without runAsGroup: group 0, as an image without a group gives.
    assert identity.run_as(pod({"runAsUser": 10001}), {}) == identity.RunAs(10001, 0, (0,))


def test_setpriv_switches_and_keeps_only_the_read_capability() -> None:
    prefix = identity.command_prefix(identity.RunAs(10001, 10002, (10002, 10003)))
    assert prefix[0].endswith("setpriv") and prefix[-1] == "--"
    assert prefix[1:-1] == [
        "--reuid=10001",
        "--regid=10002",
        "--groups=10002,10003",
        "--inh-caps=+dac_read_search",
        "--ambient-caps=+dac_read_search",
    ]
    # The host has no passwd entry for the uid: USER names it, unless the container set its own.
    env = {"LOGNAME": "set-by-the-container"}
    identity.user_env(identity.RunAs(10001, 0, (0,)), env)
    assert env == {"USER": "10001", "LOGNAME": "set-by-the-container"}


def test_fs_group_gives_the_tree_to_the_group_and_on_root_mismatch_skips_a_right_root(tmp_path: Path) -> None:
    gid = os.getgid() if os.geteuid() != 0 else 10003
    root = tmp_path / "scratch"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f").write_text("x")
    os.chmod(root / "sub" / "f", 0o600)
    assert identity.apply_fs_group(root, gid, on_root_mismatch=True) is True
    for path in (root, root / "sub"):
        info = path.stat()
        assert (
            info.st_gid == gid and info.st_mode & (stat.S_ISGID | stat.S_IRWXG) == stat.S_ISGID | stat.S_IRWXG
        )
    f = (root / "sub" / "f").stat()
    assert f.st_gid == gid and stat.S_IMODE(f.st_mode) == 0o660
    (root / "new").write_text("y")
    assert identity.apply_fs_group(root, gid, on_root_mismatch=True) is False  # the root was right
    assert identity.apply_fs_group(root, gid, on_root_mismatch=False) is True  # Always: every time
