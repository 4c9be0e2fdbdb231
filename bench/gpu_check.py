"""GPU check: NCCL, NVRx in-process restart and async saves on real GPUs, in one command.

The test suite runs on CPU (gloo); this is what it cannot show. Run it on any machine with one or
more NVIDIA GPUs and the project installed (``make setup``, or the trainer image)::

    .venv/bin/python bench/gpu_check.py                 # every visible GPU, about 2-3 minutes
    .venv/bin/python bench/gpu_check.py --nproc 1 --workdir /tmp/gpu-check --keep

Stages, each printed with its verdict; the exit code is 0 only when all pass:

  environment  the GPUs, the CUDA and NCCL versions torch was built with, the NVRx release; exits
               with code 2 at once when CUDA is not available.
  nccl         one process per GPU: an all-reduce whose result every rank checks, and the time of a
               64 MiB all-reduce.
  train        ``rtj-launch -- rtj-train`` as one node with one rank per GPU: FSDP2 over NCCL, async
               saves every 5 steps (GPU -> shared-memory staging -> NVRx writer with cpu_shm_mode),
               and three injected faults: an exception (in-process restart: NCCL abort, NVRx's NVML
               restart health checks, resume from memory), a SIGKILL and a hang (ft_launcher restarts
               the workers; resume from the newest checkpoint). The verdict reads the trainer's
               progress records and prints each recovery time.

The plan, the environment and the verdict are pure functions (tests/trainer/test_gpu_check.py runs
them on CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
EXIT_NO_CUDA = 2
STEPS = 40
CHECKPOINT_INTERVAL = 5
HEARTBEAT_TIMEOUT_SECONDS = 10


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    rank: int
    layer: str  # the recovery event the trainer must report for it


def fault_plan(nproc: int) -> list[Fault]:
    """One fault per recovery layer, each on a different rank when there are several."""
    last = nproc - 1
    return [
        Fault("exception", 12, last, "InProcessRestart"),
        Fault("sigkill", 22, 0, "InJobRestart"),
        Fault("hang", 32, min(1, last), "InJobRestart"),
    ]


def faults_spec(plan: Sequence[Fault]) -> str:
    return ";".join(f"{f.kind}@step={f.step},rank={f.rank}" for f in plan)


def trainer_env(base: Mapping[str, str], workdir: Path, *, nproc: int, port: int) -> dict[str, str]:
    """The environment contract for one node with ``nproc`` ranks on this machine."""
    return {
        **base,
        "PATH": f"{BIN}{os.pathsep}{base.get('PATH', '')}",
        "TMPDIR": str(workdir / "tmp"),
        "RTJ_JOB_UID": f"gpu-check-{port}",
        "RTJ_NODE_RANK": "0",
        "RTJ_NNODES": "1",
        "RTJ_NPROC_PER_NODE": str(nproc),
        "RTJ_RDZV_HOST": "127.0.0.1",
        "RTJ_RDZV_PORT": str(port),
        "RTJ_POD_IP": "127.0.0.1",
        "RTJ_CHECKPOINT_DIR": str(workdir / "checkpoints"),
        "RTJ_CHECKPOINT_INTERVAL_STEPS": str(CHECKPOINT_INTERVAL),
        "RTJ_CHECKPOINT_KEEP": "100",
        "RTJ_PROGRESS_SINK": f"file:{workdir / 'progress.jsonl'}",
        "RTJ_PROGRESS_INTERVAL_SECONDS": "1",
        "RTJ_FT_HEARTBEAT_TIMEOUT_SECONDS": str(HEARTBEAT_TIMEOUT_SECONDS),
        "RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT_SECONDS": "300",
        "RTJ_FT_MONITOR_INTERVAL_SECONDS": "1",
        "RTJ_MAX_RESTARTS": "5",
        "RTJ_FAULTS": faults_spec(fault_plan(nproc)),
        "OMP_NUM_THREADS": base.get("OMP_NUM_THREADS", "4"),
    }


def judge(records: Sequence[Mapping[str, Any]], plan: Sequence[Fault], *, steps: int) -> list[str]:
    """What is wrong with a finished run, from its progress records (empty: it passed)."""
    if not records:
        return ["no progress records: the trainer never reported"]
    final = records[-1]
    problems = []
    if not final.get("finished") or final.get("step") != steps:
        problems.append(f"did not finish: last report at step {final.get('step')}")
    last_checkpoint = (final.get("lastCheckpoint") or {}).get("step")
    if last_checkpoint != steps:
        problems.append(f"final checkpoint at step {last_checkpoint}, not {steps}")
    events = list(final.get("events", []))
    got = [(e.get("kind"), e.get("step", 0) + e.get("stepsLost", 0)) for e in events]
    want = [(f.layer, f.step) for f in plan]
    if got != want:
        problems.append(f"recoveries {got}, expected {want}")
    for fault, event in zip(plan, events, strict=False):
        if fault.layer == "InProcessRestart" and event.get("resumedFrom") != "memory":
            problems.append(f"the in-process restart resumed from {event.get('resumedFrom')}, not memory")
        if fault.layer == "InJobRestart" and event.get("resumedFrom") != "checkpoint":
            problems.append(f"the {fault.kind} resumed from {event.get('resumedFrom')}, not a checkpoint")
    return problems


def recovery_lines(records: Sequence[Mapping[str, Any]], plan: Sequence[Fault]) -> list[str]:
    events = list(records[-1].get("events", [])) if records else []
    return [
        f"  {fault.kind:<9} -> {event.get('kind')}: {event.get('recoverySeconds', float('nan')):.2f} s,"
        f" resumed at step {event.get('step')} from {event.get('resumedFrom')}"
        for fault, event in zip(plan, events, strict=False)
    ]


# --- stages that need the GPU ----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_environment() -> int:
    import torch

    if not torch.cuda.is_available():
        print(
            f"gpu_check: CUDA is not available (torch {torch.__version__}, built for CUDA"
            f" {torch.version.cuda or 'none'}): this check needs an NVIDIA GPU and its driver",
            file=sys.stderr,
        )
        return 0
    from importlib import metadata

    count = torch.cuda.device_count()
    names = sorted({torch.cuda.get_device_name(i) for i in range(count)})
    nccl = ".".join(str(v) for v in torch.cuda.nccl.version())  # type: ignore[no-untyped-call]
    nvrx = metadata.version("nvidia-resiliency-ext")
    print(f"environment: {count} x {', '.join(names)}; torch {torch.__version__}, CUDA {torch.version.cuda},")
    print(f"             NCCL {nccl}, nvidia-resiliency-ext {nvrx}")
    return count


def _nccl_worker(rank: int, world: int, port: int, results: Any) -> None:
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=dt.timedelta(seconds=120),
        device_id=torch.device("cuda", rank),
    )
    try:
        value = torch.full((1024,), float(rank + 1), device="cuda")
        dist.all_reduce(value)
        expected = world * (world + 1) / 2
        correct = bool(torch.all(value == expected).item())
        big = torch.ones(16 * 1024 * 1024, device="cuda")  # 64 MiB of float32
        dist.all_reduce(big)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(5):
            dist.all_reduce(big)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / 5
        results.put((rank, correct, seconds))
    finally:
        dist.destroy_process_group()


def check_nccl(nproc: int) -> bool:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_nccl_worker, args=(r, nproc, port, results)) for r in range(nproc)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=180)
    outcomes = [results.get(timeout=5) for _ in procs if not results.empty()]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    ok = len(outcomes) == nproc and all(correct for _, correct, _ in outcomes)
    slowest = max((s for _, _, s in outcomes), default=float("nan"))
    print(
        f"nccl:        all-reduce over {nproc} GPU(s) {'correct' if ok else 'FAILED'};"
        f" 64 MiB all-reduce {slowest * 1000:.2f} ms"
    )
    return ok


def run_training(workdir: Path, nproc: int, timeout: float) -> list[dict[str, Any]]:
    port = _free_port()
    env = trainer_env(os.environ, workdir, nproc=nproc, port=port)
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    log_path = workdir / "node0.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(BIN / "rtj-launch"), "--", "rtj-train", "--steps", str(STEPS), "--hidden", "256"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    progress = workdir / "progress.jsonl"
    if proc.returncode != 0:
        print(f"train:       rtj-launch exited with {proc.returncode}; the log is {log_path}")
    if not progress.exists():
        return []
    return [json.loads(line) for line in progress.read_text().splitlines()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=0, help="ranks (GPUs) to use; 0: every visible GPU")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a new temporary directory")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, checkpoints)")
    parser.add_argument("--timeout", type=float, default=420, help="seconds the training stage may take")
    args = parser.parse_args(argv)

    gpus = check_environment()
    if gpus == 0:
        return EXIT_NO_CUDA
    nproc = min(args.nproc or gpus, gpus)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rtj-gpu-check-"))
    workdir.mkdir(parents=True, exist_ok=True)
    passed = False
    try:
        nccl_ok = check_nccl(nproc)
        plan = fault_plan(nproc)
        started = time.monotonic()
        records = [r for r in run_training(workdir, nproc, args.timeout) if r.get("nodeRank") == 0]
        problems = judge(records, plan, steps=STEPS)
        verdict = "passed" if not problems else "FAILED"
        elapsed = time.monotonic() - started
        print(f"train:       {nproc} rank(s), {STEPS} steps, 3 faults: {verdict} in {elapsed:.0f} s")
        for line in recovery_lines(records, plan):
            print(line)
        for problem in problems:
            print(f"  problem: {problem}")
        passed = nccl_ok and not problems
        if not passed:
            print(f"  logs and checkpoints kept in {workdir}")
        return 0 if passed else 1
    finally:
        if passed and not args.keep and args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
