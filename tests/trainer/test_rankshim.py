"""The rank shim (rtj_trainer.runtime.rankshim) around real processes: the container's log reads the same,
steps and loss are matched from output lines into the rank's record, exit statuses and signals pass
through, and the command dies with the shim. The commands are plain Python without torch."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rtj_trainer.runtime import rankshim

PATTERN = r"step (?P<step>\d+) loss (?P<loss>[0-9.e+-]+)"


def shim_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONUNBUFFERED", "TORCHELASTIC_RESTART_COUNT")}
    return {**env, rankshim.RANKS_DIR_ENV: str(tmp_path), "LOCAL_RANK": "3", **extra}


def shim(script: str) -> list[str]:
    return [*rankshim.command(sys.executable), sys.executable, "-c", textwrap.dedent(script)]


def record(tmp_path: Path, local_rank: int = 3) -> dict[str, Any]:
    (path,) = tmp_path.glob(f"{rankshim.RECORD_PREFIX}{local_rank}-*{rankshim.RECORD_SUFFIX}")
    loaded: dict[str, Any] = json.loads(path.read_text())
    assert path.name == rankshim.record_name(local_rank, loaded["pid"])
    return loaded


OUTPUT = r"""
import os, sys
sys.stdout.write("first line\n")
sys.stderr.write("a warning\n")
for step in range(1, 4):
    print(f"[rank0] step {step} loss {1.0 / step}")
print("progress 10%\rprogress 100%\r", end="")
print("buffered:", os.environ.get("PYTHONUNBUFFERED"))
for n in range(7):
    print(f"error {n} " + "x" * 400, file=sys.stderr)
print("")
sys.stdout.write("no newline at the end")
sys.exit(3)
"""


def test_output_passes_through_and_steps_are_recorded(tmp_path: Path) -> None:
    started = time.time()
    done = subprocess.run(
        shim(OUTPUT),
        env=shim_env(tmp_path, RTJ_STEP_LOG_PATTERN=PATTERN, TORCHELASTIC_RESTART_COUNT="2"),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3
    # Byte for byte what the command wrote, on the same stream; Python unbuffered (the user set nothing).
    lines = "".join(f"[rank0] step {s} loss {1.0 / s}\n" for s in (1, 2, 3))
    assert done.stdout.decode() == (
        f"first line\n{lines}progress 10%\rprogress 100%\rbuffered: 1\n\nno newline at the end"
    )
    assert done.stderr.decode().splitlines()[0] == "a warning"
    assert len(done.stderr.decode().splitlines()) == 8
    rec = record(tmp_path)
    assert rec["pid"] > 0 and rec["restartCount"] == 2
    assert (rec["step"], rec["loss"], rec["firstStep"]) == (3, pytest.approx(1 / 3), 1)
    assert started <= rec["startEpoch"] <= rec["firstStepEpoch"] <= rec["stepEpoch"] <= rec["endEpoch"]
    assert rec["exitCode"] == 3
    # The last five lines of stderr that are not blank, each clipped to 300 characters.
    assert rec["lastErrorLines"] == [f"error {n} " + "x" * 292 for n in range(2, 7)]


def test_a_first_group_is_the_step_and_a_set_pythonunbuffered_is_kept(tmp_path: Path) -> None:
    script = """
    import os
    print("it=41 ok", flush=True)
    print("it=42 ok", os.environ["PYTHONUNBUFFERED"], flush=True)
    """
    done = subprocess.run(
        shim(script),
        env=shim_env(tmp_path, RTJ_STEP_LOG_PATTERN=r"it=(\d+)", PYTHONUNBUFFERED="0"),
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.decode().splitlines()[-1] == "it=42 ok 0"
    rec = record(tmp_path)
    assert (rec["step"], rec["loss"], rec["firstStep"], rec["exitCode"]) == (42, None, 41, 0)
    assert rec["restartCount"] == 0  # no TORCHELASTIC_RESTART_COUNT


def test_a_step_record_is_written_while_the_rank_runs(tmp_path: Path) -> None:
    script = """
    import sys, time
    for step in range(1, 6):
        print(f"step {step} loss 0.5", flush=True)
    time.sleep(30)
    """
    proc = subprocess.Popen(shim(script), env=shim_env(tmp_path, RTJ_STEP_LOG_PATTERN=PATTERN))
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError, ValueError):
                rec = record(tmp_path)
                if rec["step"] == 5:
                    break
            assert time.monotonic() < deadline, "the throttled step never reached the record"
            time.sleep(0.1)
        assert rec["firstStep"] == 1 and rec["exitCode"] is None and rec["endEpoch"] is None
    finally:
        proc.kill()
        proc.wait()


def test_records_are_throttled_but_for_the_first_match_and_the_exit(tmp_path: Path) -> None:
    path = tmp_path / rankshim.record_name(0, 1)
    rec = rankshim.RankRecord(path, pid=1, start_epoch=100.0, restart_count=0)
    rec.started(100.0)
    rec.step_seen(1, None, 100.1)
    assert json.loads(path.read_text())["step"] == 1  # the first match at once
    rec.step_seen(2, None, 100.2)
    rec.flush(100.3)
    assert json.loads(path.read_text())["step"] == 1  # within the half second
    rec.flush(100.7)
    assert json.loads(path.read_text())["step"] == 2
    rec.step_seen(3, None, 100.8)
    rec.ended(0, 100.9)
    assert json.loads(path.read_text())[("step")] == 3 and json.loads(path.read_text())["exitCode"] == 0


@pytest.mark.parametrize(
    ("argv_tail", "status"),
    [
        (["-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], 128 + signal.SIGKILL),
        (["-c", "raise SystemExit(0)"], 0),
    ],
)
def test_exit_status_is_the_commands(tmp_path: Path, argv_tail: list[str], status: int) -> None:
    argv = [*rankshim.command(sys.executable), sys.executable, *argv_tail]
    assert subprocess.run(argv, env=shim_env(tmp_path), timeout=60, check=False).returncode == status
    assert record(tmp_path)["exitCode"] == status


def test_a_command_that_does_not_exist_fails_as_a_shell_says(tmp_path: Path) -> None:
    argv = [*rankshim.command(sys.executable), str(tmp_path / "missing.py")]
    done = subprocess.run(argv, env=shim_env(tmp_path), capture_output=True, timeout=60, check=False)
    assert done.returncode == 127 and b"missing.py" in done.stderr
    rec = record(tmp_path)
    assert rec["exitCode"] == 127 and "missing.py" in rec["lastErrorLines"][-1]


SIGNALS = """
import os, signal, sys, time
def report(signum, frame):
    print("got", signal.Signals(signum).name, flush=True)
for sig in (signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(sig, report)
print("pid", os.getpid(), "group", os.getpgid(0), flush=True)
while True:
    time.sleep(0.05)
"""


def read_until(proc: subprocess.Popen[bytes], prefix: str) -> str:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline().decode()
        assert line, f"the output ended before {prefix!r}"
        if line.startswith(prefix):
            return line.strip()


@contextlib.contextmanager
def running(argv: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE) as proc:
        try:
            yield proc
        finally:
            proc.kill()


def test_signals_are_forwarded_to_the_command(tmp_path: Path) -> None:
    with running(shim(SIGNALS), shim_env(tmp_path)) as proc:
        _, child, _, group = read_until(proc, "pid").split()
        # The command runs in a process group of its own: the forwarded signal is its only copy.
        assert int(group) == int(child) != os.getpgid(proc.pid)
        for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT):
            proc.send_signal(sig)
            assert read_until(proc, "got") == f"got {sig.name}"
        proc.send_signal(signal.SIGTERM)  # the command's default action: it dies, and so the shim
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert record(tmp_path)["exitCode"] == 128 + signal.SIGTERM


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")  # a zombie waits for a reaper, but runs no more


def test_the_command_dies_with_the_shim(tmp_path: Path) -> None:
    with running(shim(SIGNALS), shim_env(tmp_path)) as proc:
        child = int(read_until(proc, "pid").split()[1])
        proc.kill()  # SIGKILL: the shim cannot forward anything
        proc.wait()
        deadline = time.monotonic() + 10
        while not _gone(child):
            assert time.monotonic() < deadline, "the command outlived its shim"
            time.sleep(0.1)


def test_the_pattern_rules() -> None:
    compiled = rankshim.compile_step_pattern(PATTERN)
    assert rankshim.match_step(compiled, "12:00 step 7 loss 2.5e-1 lr 3") == (7, 0.25)
    assert rankshim.match_step(compiled, "step x loss 1") is None
    assert rankshim.match_step(rankshim.compile_step_pattern(r"s=(\d+)"), "s=3") == (3, None)
    nan = rankshim.compile_step_pattern(r"step (?P<step>\d+) loss (?P<loss>\w+)")
    assert rankshim.match_step(nan, "step 2 loss nan") == (2, None)
    with pytest.raises(ValueError, match="no group"):
        rankshim.compile_step_pattern(r"step \d+")
    with pytest.raises(ValueError, match="not a Python regular expression"):
        rankshim.compile_step_pattern(r"step (\d+")


def test_the_shim_imports_only_the_standard_library() -> None:
    code = (
        "import sys; before = set(sys.modules); import rtj_trainer.runtime.rankshim; "
        "print(sorted(m.split('.')[0] for m in set(sys.modules) - before))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=True)
    loaded = set(json.loads(done.stdout.decode().replace("'", '"')))
    assert loaded - {"rtj_trainer"} <= set(sys.stdlib_module_names)


def test_a_helper_holding_the_output_open_does_not_keep_the_rank_alive(tmp_path: Path) -> None:
    script = """
    import subprocess, sys
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print("helper", helper.pid, flush=True)
    print("the command is done", file=sys.stderr)
    """
    started = time.monotonic()
    done = subprocess.run(shim(script), env=shim_env(tmp_path), capture_output=True, timeout=60, check=False)
    helper = int(done.stdout.split()[1])
    try:
        # The exit is not held back for the helper's 60 s; the command's own output is all there.
        assert done.returncode == 0 and time.monotonic() - started < 10
        assert done.stderr == b"the command is done\n"
        assert record(tmp_path)["lastErrorLines"] == ["the command is done"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(helper, signal.SIGKILL)
