"""The trainer's faults blamed on its node: which errors blame the node, the GPU health check, the log
the node's ranks share, the progress field `nodeFaults` (and the operator parsing it), and a real
training run whose injected CUDA ECC error is counted and reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rtj_operator.progress import NodeFaultReport, parse_report
from rtj_trainer.library import node_faults, progress
from trainer_launch_support import store_ports


def _chained(outer: str, inner: str) -> BaseException:
    try:
        try:
            raise RuntimeError(inner)
        except RuntimeError as cause:
            raise ValueError(outer) from cause
    except ValueError as error:
        return error


@pytest.mark.parametrize(
    ("error", "blamed"),
    [
        (RuntimeError("CUDA error: uncorrectable ECC error encountered"), True),
        (RuntimeError("NCCL watchdog: Xid 79 reported on GPU 3"), True),
        (RuntimeError("CUDA error: unspecified launch failure"), True),
        (RuntimeError("pynvml.NVMLError_GpuIsLost: GPU is lost"), True),
        (_chained("step 12 failed", "CUDA error: uncorrectable ECC error encountered"), True),
        (RuntimeError("CUDA error: device-side assert triggered"), False),
        (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), False),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
        (None, False),
    ],
)
def test_only_errors_of_the_machine_blame_the_node(error: BaseException | None, blamed: bool) -> None:
    reason = node_faults.node_fault_reason(error)
    assert (reason is not None) is blamed
    if reason is not None:
        assert len(reason) <= node_faults.MAX_REASON_CHARS and "\n" not in reason


def _probe_fails(index: int) -> None:
    raise RuntimeError(f"CUDA error on device {index}")


@pytest.mark.parametrize(
    ("available", "count", "probe", "expected"),
    [
        (False, 0, None, None),  # a CPU run: nothing to check
        (True, 8, None, None),
        (True, 7, None, "7 of the 8 GPUs"),
        (True, 8, _probe_fails, "GPU 2 failed: RuntimeError: CUDA error on device 2"),
    ],
)
def test_gpu_health_check(available: bool, count: int, probe: object, expected: str | None) -> None:
    problem = node_faults.gpu_check_problem(
        8,
        2,
        available=lambda: available,
        device_count=lambda: count,
        probe=probe if callable(probe) else (lambda index: None),
    )
    assert (problem is None) is (expected is None)
    if expected is not None:
        assert problem is not None and expected in problem and problem.startswith("GPU health check")
        assert node_faults.node_fault_reason(RuntimeError(problem)) is not None


def test_the_ranks_of_a_node_share_one_count_other_nodes_lines_are_not_theirs(tmp_path: Path) -> None:
    rank0 = node_faults.NodeFaults(tmp_path, "ip-10-0-1-7.ec2.internal")
    rank1 = node_faults.NodeFaults(tmp_path, "ip-10-0-1-7.ec2.internal")
    assert rank0.summary() is None
    rank1.record("CUDA error: uncorrectable ECC error encountered", now=1_700_000_000.0)
    rank0.record("GPU health check: 7 of the 8 GPUs the node's ranks need are visible", now=1_700_000_060.0)
    with open(rank0.path, "a") as partial:
        partial.write('{"node": "ip-10-0-1-7.ec2.in')  # a line another rank is still writing
    assert rank0.summary() == {
        "node": "ip-10-0-1-7.ec2.internal",
        "count": 2,
        "lastReason": "GPU health check: 7 of the 8 GPUs the node's ranks need are visible",
        "lastTime": "2023-11-14T22:14:20Z",
    }
    # Another node keeps its own file and count.
    assert node_faults.NodeFaults(tmp_path, "ip-10-0-1-8.ec2.internal").summary() is None


def test_the_report_carries_the_node_faults_and_the_operator_parses_them() -> None:
    p = progress.Progress(node_rank=0, train_start_time=1_700_000_000.0)
    assert "nodeFaults" not in progress.progress_json(p, now=1_700_000_001.0)
    p.node_faults = {"node": "node-1", "count": 2, "lastReason": "CUDA error: ECC", "lastTime": "x"}
    report = progress.progress_json(p, now=1_700_000_001.0)
    parsed = parse_report(json.dumps(report))
    assert parsed is not None and parsed.node_faults == NodeFaultReport("node-1", 2, "CUDA error: ECC")


@pytest.mark.parametrize(
    "value",
    [
        None,
        "x",
        {"count": 2},
        {"node": "", "count": 2},
        {"node": "n", "count": -1},
        {"node": "n", "count": True},
    ],
)
def test_the_operator_ignores_a_malformed_node_faults_field(value: object) -> None:
    parsed = parse_report(json.dumps({"v": 1, "step": 3, "nodeFaults": value}))
    assert parsed is not None and parsed.step == 3 and parsed.node_faults is None


@pytest.mark.slow
def test_an_injected_cuda_ecc_error_is_counted_for_the_node_and_reported(tmp_path: Path) -> None:
    sink = tmp_path / "progress.jsonl"
    env = {
        **os.environ,
        "RTJ_CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
        "RTJ_CHECKPOINT_INTERVAL_STEPS": "4",
        "RTJ_PROGRESS_SINK": f"file:{sink}",
        "RTJ_PROGRESS_INTERVAL_SECONDS": "0",
        "RTJ_NODE_NAME": "node-7",
        "RTJ_FAULTS": "gpu-error@step=3",
        **store_ports(),
        "TMPDIR": str(tmp_path),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "rtj_trainer.reference.train", "--steps", "8"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reports = [json.loads(line) for line in sink.read_text().splitlines()]
    final = reports[-1]
    assert final["finished"] is True and final["restarts"]["inProcess"] == 1
    faults = final["nodeFaults"]
    assert (faults["node"], faults["count"]) == ("node-7", 1)
    assert "uncorrectable ECC error" in faults["lastReason"]
    assert "nodeFaults" not in reports[0]  # nothing blamed on the node before the fault
