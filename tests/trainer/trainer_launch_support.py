"""Run ``rtj-launch`` as two "nodes" on loopback (each its own TMPDIR), the way two worker pods would."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rtj_localcluster.ports import reserve_port, reserve_port_pair

BIN = Path(sys.executable).parent


def node_address(node_rank: int) -> str:
    """Each "node" its own loopback address, as each pod has its own IP (ft_launcher's --local-addr).

    NVRx 0.7.0's barrier rendezvous tells nodes apart by address: two launchers behind one address
    close the rendezvous for good. Linux routes all of 127.0.0.0/8 to the loopback interface.
    """
    return f"127.0.0.{node_rank + 1}"


@dataclasses.dataclass
class Run:
    returncodes: list[int]
    logs: list[str]
    progress: list[dict[str, Any]]

    def node(self, node_rank: int) -> list[dict[str, Any]]:
        return [r for r in self.progress if r["nodeRank"] == node_rank]

    def final(self, node_rank: int) -> dict[str, Any]:
        return self.node(node_rank)[-1]


def store_ports() -> dict[str, str]:
    """Where rank 0 of rtj-train hosts its two stores: ports no other test takes, where by default
    they follow ft_launcher's MASTER_PORT, an ephemeral port, whose neighbours the control planes'
    connections of the other test lane keep busy."""
    wrapper = reserve_port_pair()
    return {"RTJ_WRAPPER_STORE_PORT": str(wrapper), "RTJ_GROUPS_STORE_PORT": str(wrapper + 1)}


def launch_env(
    workdir: Path,
    *,
    faults: str = "",
    interval: int = 10,
    nproc: int = 2,
    heartbeat_timeout: float = 5,
    extra_env: dict[str, str] | None = None,
) -> dict[str, str]:
    """The environment two "nodes" share (each adds its rank, address and TMPDIR in start_node)."""
    port = reserve_port()
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "RTJ_RDZV_HOST": "127.0.0.1",
        "RTJ_RDZV_PORT": str(port),
        **store_ports(),
        "RTJ_NNODES": "2",
        "RTJ_NPROC_PER_NODE": str(nproc),
        "RTJ_JOB_UID": f"test-{port}",
        "RTJ_CHECKPOINT_DIR": str(workdir / "checkpoints"),
        "RTJ_CHECKPOINT_INTERVAL_STEPS": str(interval),
        # The endpoint too (each node serves it on a port of its own), so that training under both
        # NVRx releases writes it every step; nobody reads it here, so nothing lingers at the end.
        "RTJ_PROGRESS_SINK": f"endpoint,file:{workdir / 'progress.jsonl'}",
        "RTJ_PROGRESS_LINGER_SECONDS": "0",
        "RTJ_PROGRESS_INTERVAL_SECONDS": "0.5",
        "RTJ_FT_HEARTBEAT_TIMEOUT_SECONDS": str(heartbeat_timeout),
        "RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT_SECONDS": "120",
        "RTJ_FT_MONITOR_INTERVAL_SECONDS": "1",
        "RTJ_MAX_RESTARTS": "5",
        "RTJ_FAULTS": faults,
        "OMP_NUM_THREADS": "1",
        **(extra_env or {}),
    }


def start_node(
    workdir: Path,
    base: dict[str, str],
    node: int,
    *,
    steps: int,
    train_args: tuple[str, ...] = (),
    name: str = "",
    address: str = "",
) -> tuple[subprocess.Popen[bytes], Path]:
    """One "node": ``rtj-launch -- rtj-train`` in its own process group, its TMPDIR and log named
    ``name`` (default ``node<N>``, a replacement node takes another name), on its own loopback
    ``address`` (default: the node rank's)."""
    name = name or f"node{node}"
    tmp = workdir / f"tmp-{name}"
    tmp.mkdir(parents=True)
    log_path = workdir / f"{name}.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [str(BIN / "rtj-launch"), "--", "rtj-train", "--steps", str(steps), *train_args],
            env={
                **base,
                "TMPDIR": str(tmp),
                "RTJ_NODE_RANK": str(node),
                "RTJ_POD_IP": address or node_address(node),
                "RTJ_PROGRESS_PORT": str(reserve_port()),
            },
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # one process group per "node", killed as a whole
        )
    return proc, log_path


def read_progress(workdir: Path) -> list[dict[str, Any]]:
    progress_file = workdir / "progress.jsonl"
    if not progress_file.exists():
        return []
    return [json.loads(line) for line in progress_file.read_text().splitlines()]


def lose_node(proc: subprocess.Popen[bytes]) -> None:
    """A node's loss: SIGKILL to every process the "node" started, ft_launcher's workers too (they run
    in sessions of their own, out of reach of the node's process group)."""
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        tree = psutil.Process(proc.pid)
        for process in [tree, *tree.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
    proc.wait()


def kill_nodes(procs: list[subprocess.Popen[bytes]]) -> None:
    """End every "node" still running, as lose_node does: a test that stops early (a failure, a
    timeout) leaves no ranks behind to load the tests after it."""
    for proc in procs:
        if proc.poll() is None:
            lose_node(proc)
        proc.wait()


def run_two_nodes(
    workdir: Path,
    *,
    steps: int,
    faults: str = "",
    interval: int = 10,
    nproc: int = 2,
    heartbeat_timeout: float = 5,
    timeout: float = 420,
    extra_env: dict[str, str] | None = None,
    train_args: tuple[str, ...] = (),
) -> Run:
    base = launch_env(
        workdir,
        faults=faults,
        interval=interval,
        nproc=nproc,
        heartbeat_timeout=heartbeat_timeout,
        extra_env=extra_env,
    )
    procs: list[subprocess.Popen[bytes]] = []
    log_paths: list[Path] = []
    try:
        for node in (0, 1):
            proc, log_path = start_node(workdir, base, node, steps=steps, train_args=train_args)
            procs.append(proc)
            log_paths.append(log_path)
        deadline = time.monotonic() + timeout
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        kill_nodes(procs)
    return Run(
        [p.returncode for p in procs],
        [p.read_text(errors="replace") for p in log_paths],
        read_progress(workdir),
    )
