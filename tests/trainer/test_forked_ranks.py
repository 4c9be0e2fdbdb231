"""Supervisor's ranks forked after the imports (`rtj_trainer.runtime.forked`): which commands are
forked, and that a forked rank is the program as a new interpreter would run it."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from rtj_trainer.runtime import forked, supervisor

PROGRAM = r"""
import atexit, json, logging, os, signal, sys, threading
out = os.environ["OUT"]
def done():
    with open(out, "a") as f:
        f.write(json.dumps({"atexit": True}) + "\n")
atexit.register(done)
late = threading.Thread(target=lambda: __import__("time").sleep(0.3))
late.start()
with open(out, "w") as f:
    f.write(json.dumps({
        "name": __name__,
        "argv": sys.argv,
        "rank": os.environ.get("RANK"),
        "parent_only": os.environ.get("PARENT_ONLY"),
        "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
        "sigint_python": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
        "own_session": os.getsid(0) == os.getpid(),
        "log_handlers": len(logging.getLogger().handlers),
        "torch_loaded": "torch" in sys.modules,
    }) + "\n")
sys.exit(int(sys.argv[1]))
"""


def _script(tmp_path: Path, shebang: str | None) -> Path:
    path = tmp_path / "train_script"
    path.write_text((f"#!{shebang}\n" if shebang else "") + PROGRAM)
    path.chmod(0o755)
    return path


def test_commands_of_this_interpreter_are_forked_and_others_started_afresh(tmp_path: Path) -> None:
    script = _script(tmp_path, sys.executable)
    assert forked.program_of([str(script), "7"]) == forked.Program(str(script), (str(script), "7"))
    by_path = forked.Program(str(script), (str(script), "a"))
    assert forked.program_of([sys.executable, str(script), "a"]) == by_path
    assert forked.program_of([sys.executable, "-m", "pkg.mod", "x"]) == forked.Program(
        "pkg.mod", ("pkg.mod", "x"), module=True
    )
    assert forked.program_of([sys.executable, "-u", str(script)]) is None  # interpreter options
    assert forked.program_of([sys.executable, "-c", "pass"]) is None
    assert forked.program_of([str(_script(tmp_path / "..", "/bin/sh"))]) is None  # another interpreter
    assert forked.program_of(["/bin/true"]) is None  # a binary
    assert forked.program_of([str(tmp_path / "missing")]) is None
    assert forked.entry_module(forked.Program("/venv/bin/rtj-train", ("rtj-train",))) == (
        "rtj_trainer.reference.train"
    )
    # A -m module's or a script's top-level code is the program: never imported in rtj-launch.
    assert forked.entry_module(forked.Program("pkg.mod", ("pkg.mod",), module=True)) is None
    assert forked.entry_module(forked.Program(str(script), (str(script),))) is None
    assert not forked.fork_enabled({forked.FORK_RANKS_ENV: "0"}) and forked.fork_enabled({})


def test_a_module_that_exits_on_import_does_not_end_rtj_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(2)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    program = forked.Program(str(tmp_path / "x"), ("x",))
    loaded = forked.preload(program, {forked.PRELOAD_MODULES_ENV: "exits_on_import"})
    assert "exits_on_import" not in loaded and "torch" in loaded


def test_a_forked_rank_runs_the_program_as_a_new_interpreter_would(tmp_path: Path) -> None:
    script = _script(tmp_path, sys.executable)
    program = forked.program_of([str(script), "7"])
    assert program is not None
    assert "torch" in forked.preload(program, {forked.PRELOAD_MODULES_ENV: "json, no_such_module_here"})
    out = tmp_path / "out.jsonl"
    os.environ["PARENT_ONLY"] = "1"
    try:
        rank = forked.spawn(program, {"OUT": str(out), "RANK": "3", "PATH": os.environ["PATH"]})
        assert rank.wait() == 7 and rank.poll() == 7
    finally:
        del os.environ["PARENT_ONLY"]
    seen, ended = (json.loads(line) for line in out.read_text().splitlines())
    assert seen == {
        "name": "__main__",
        "argv": [str(script), "7"],
        "rank": "3",
        "parent_only": None,
        "sigterm_default": True,
        "sigint_python": True,
        "own_session": True,
        "log_handlers": 0,
        "torch_loaded": True,
    }
    assert ended == {"atexit": True}  # its own exit functions ran, after its thread


ENDINGS = [
    ("raise RuntimeError('x')", 1),
    ("import sys; sys.exit('bye')", 1),
    ("pass", 0),
    ("import sys; sys.exit(None)", 0),
]


@pytest.mark.parametrize(("body", "status"), ENDINGS)
def test_a_forked_rank_ends_with_the_status_the_interpreter_would_give(
    tmp_path: Path, body: str, status: int
) -> None:
    script = tmp_path / "s.py"
    script.write_text(body + "\n")
    program = forked.program_of([sys.executable, str(script)])
    assert program is not None
    assert forked.spawn(program, {}).wait() == status


def test_the_supervisor_forwards_sigterm_to_forked_ranks_and_reads_their_statuses(tmp_path: Path) -> None:
    script = tmp_path / "wait.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "drained = lambda *_: sys.exit(0 if os.path.exists(os.environ['RTJ_DRAIN_FILE']) else 9)\n"
        "signal.signal(signal.SIGTERM, drained)\n"
        "open(os.environ['READY'], 'w').close()\n"
        "time.sleep(60)\n"
        "sys.exit(5)\n"
    )
    program = forked.program_of([sys.executable, str(script)])
    assert program is not None
    ready = [tmp_path / f"ready-{i}" for i in range(2)]
    received = supervisor.record_signals()

    def term_when_ready(_children: object) -> None:
        deadline = time.monotonic() + 30
        while not all(path.exists() for path in ready) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    try:
        code = supervisor.run_forwarding_drain(
            [sys.executable, str(script)],
            [{"READY": str(path)} for path in ready],
            tmp_path / "drain",
            received=received,
            spawn=forked.spawner(program, None),
            started=term_when_ready,
        )
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    assert code == 0  # both ranks saw the drain marked before SIGTERM reached them
