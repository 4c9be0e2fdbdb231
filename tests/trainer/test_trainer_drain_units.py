"""The pieces of a drain and of the checkpoint directory's preparation, each on its own: which SIGTERM
drains (only one with the drain file), the termination message, and the init container's chown."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from rtj_trainer.library import drain
from rtj_trainer.library.env import EnvError
from rtj_trainer.runtime import checkpoint_dir

HANDLER_PROGRAM = """
import os, signal, sys, time
from pathlib import Path
from rtj_trainer.library import drain
request = drain.install_drain_handler(Path(sys.argv[1]))
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.2)
print("requested" if request.requested else "alive")
"""


def _run_handler(marker: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", HANDLER_PROGRAM, str(marker)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )


def test_sigterm_with_the_drain_file_only_requests_a_drain(tmp_path: Path) -> None:
    marker = tmp_path / "drain"
    marker.touch()
    result = _run_handler(marker)
    assert (result.returncode, result.stdout.strip()) == (0, "requested"), result.stderr


def test_sigterm_without_the_drain_file_kills_at_once_as_before(tmp_path: Path) -> None:
    # ft_launcher stopping its workers for an in-job restart: no drain, no delay.
    result = _run_handler(tmp_path / "absent")
    assert result.returncode == -signal.SIGTERM and result.stdout == "", result.stderr


def test_termination_message_names_the_committed_step(tmp_path: Path) -> None:
    marker = tmp_path / "drain"
    assert drain.termination_message(marker).startswith("Drained: SIGTERM received; no drain checkpoint")
    request = drain.DrainRequest(marker)
    request.record_committed_step(40)  # not requested: a peer's drain writes nothing
    assert not drain.step_file(marker).exists()
    request.requested = True
    request.record_committed_step(40)
    assert drain.termination_message(marker) == (
        "Drained: SIGTERM received; checkpoint of step 40 committed before the exit"
    )
    target = tmp_path / "termination-log"
    assert drain.write_termination_message("Drained: x", {drain.TERMINATION_MESSAGE_PATH_ENV: str(target)})
    assert target.read_text() == "Drained: x"
    assert not drain.write_termination_message("Drained: x", {})
    assert not drain.write_termination_message(
        "x", {drain.TERMINATION_MESSAGE_PATH_ENV: str(tmp_path / "no/x")}
    )
    assert (request.exit_code, drain.DrainRequest(None).exit_code) == (
        drain.DRAINED_EXIT_CODE,
        drain.PEER_DRAINED_EXIT_CODE,
    )


def test_prepare_gives_a_root_owned_volumes_job_directory_to_the_trainer_user(tmp_path: Path) -> None:
    # As the init container does, when the test runs as root; otherwise to the test's own user.
    uid, gid = (10001, 10001) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    root = tmp_path / "fsx"
    root.mkdir(mode=0o755)
    before = root.stat()
    job_dir = root / "llm"
    env = {"RTJ_CHECKPOINT_DIR": str(job_dir), "RTJ_CHECKPOINT_DIR_OWNER": f"{uid}:{gid}"}
    assert checkpoint_dir.main(env) == 0
    info = job_dir.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (uid, gid, 0o2770)
    # The volume's root is left as it was; a second run changes nothing.
    after = root.stat()
    assert (after.st_uid, after.st_gid, stat.S_IMODE(after.st_mode)) == (before.st_uid, before.st_gid, 0o755)
    assert checkpoint_dir.prepare(job_dir, uid, gid) is False


@pytest.mark.parametrize("owner", ["", "10001", "a:b", "10001:", ":1", "-1:2"])
def test_prepare_refuses_a_malformed_owner(owner: str) -> None:
    with pytest.raises(EnvError, match="RTJ_CHECKPOINT_DIR_OWNER"):
        checkpoint_dir.parse_owner(owner)
