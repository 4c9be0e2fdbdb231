"""bench/gpu_check.py's parts that need no GPU: its fault plan and environment follow the trainer's
contract, its verdict reads progress records right, and without CUDA it stops at once, saying why."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from rtj_trainer.library import env
from rtj_trainer.rehearsal import fault_injection

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"


def load_gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


gpu_check = load_gpu_check()


@pytest.mark.parametrize("nproc", [1, 2, 8])
def test_the_plan_is_one_fault_per_layer_in_the_trainers_syntax(nproc: int) -> None:
    plan = gpu_check.fault_plan(nproc)
    parsed = fault_injection.parse_faults(gpu_check.faults_spec(plan))
    assert [(f.kind, f.step, f.ranks) for f in parsed] == [(f.kind, f.step, (f.rank,)) for f in plan]
    assert {f.kind for f in plan} == {"exception", "sigkill", "hang"}
    assert all(0 <= f.rank < nproc for f in plan)
    # Every fault after the first checkpoint, so the in-job restarts resume from one.
    assert min(f.step for f in plan) > gpu_check.CHECKPOINT_INTERVAL


def test_the_environment_is_a_valid_single_node_contract(tmp_path: Path) -> None:
    values = gpu_check.trainer_env({"PATH": "/usr/bin"}, tmp_path, nproc=4, port=29400)
    parsed = env.TrainerEnv.from_environ(values)
    assert (parsed.nnodes, parsed.nproc_per_node, parsed.node_rank) == (1, 4, 0)
    assert parsed.rdzv_port == 29400
    assert parsed.checkpoint_interval_steps == gpu_check.CHECKPOINT_INTERVAL
    # A hang must reach ft_launcher's heartbeat timeout before the wrapper's soft timeout.
    assert parsed.ft_heartbeat_timeout_seconds < parsed.inprocess_soft_timeout_seconds


def _event(kind: str, step: int, lost: int, source: str) -> dict[str, Any]:
    return {"kind": kind, "step": step, "stepsLost": lost, "resumedFrom": source, "recoverySeconds": 1.5}


def _good_run(steps: int) -> list[dict[str, Any]]:
    events = [
        _event("InProcessRestart", 12, 0, "memory"),
        _event("InJobRestart", 20, 2, "checkpoint"),
        _event("InJobRestart", 30, 2, "checkpoint"),
    ]
    return [
        {"nodeRank": 0, "step": 5, "finished": False, "events": []},
        {"nodeRank": 0, "step": steps, "finished": True, "lastCheckpoint": {"step": steps}, "events": events},
    ]


def test_verdict_passes_a_run_where_every_layer_recovered() -> None:
    plan = gpu_check.fault_plan(2)
    records = _good_run(40)
    assert gpu_check.judge(records, plan, steps=40) == []
    lines = gpu_check.recovery_lines(records, plan)
    assert len(lines) == 3 and "InProcessRestart: 1.50 s" in lines[0]


def test_verdict_names_what_went_wrong() -> None:
    plan = gpu_check.fault_plan(2)
    assert gpu_check.judge([], plan, steps=40) == ["no progress records: the trainer never reported"]
    records = _good_run(40)
    records[-1]["events"][0]["resumedFrom"] = "checkpoint"
    records[-1]["events"].pop()
    records[-1]["lastCheckpoint"] = {"step": 35}
    problems = gpu_check.judge(records, plan, steps=40)
    assert any("final checkpoint at step 35" in p for p in problems)
    assert any(p.startswith("recoveries") for p in problems)
    assert any("in-process restart resumed from checkpoint" in p for p in problems)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_cuda_it_stops_at_once_and_says_why() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == gpu_check.EXIT_NO_CUDA
    assert "CUDA is not available" in result.stderr and "needs an NVIDIA GPU" in result.stderr
