"""A training script of one's own: torch DDP with NVRx fault-tolerance heartbeats, and nothing of
this project. It is what docs/byo.md starts from, and what the tests run under the operator.

Each rank trains a small model on synthetic data; global rank 0 prints one line per step
(``step <n> loss <x>``) and saves a checkpoint every ``--ckpt-every`` steps into ``--ckpt-dir``
(written to a temporary name, then renamed); every rank resumes from the newest one after a restart.
With ``--sections`` the script times its phases with NVRx's sections API (``init``, ``step``,
``checkpointing``) instead of plain heartbeats, which needs a ft_launcher config that names those
sections (``rank_section_timeouts``).

Run it with ft_launcher (or under the operator with ``command: [python, /app/train.py]``):
``ft_launcher --nproc-per-node=2 --no-python python train.py --steps 100 --ckpt-dir /tmp/ckpt``.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

import torch
import torch.distributed as dist
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
from torch.nn.parallel import DistributedDataParallel

CHECKPOINT = re.compile(r"^ckpt-(\d+)\.pt$")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-sleep", type=float, default=0.1, help="seconds per step on top of compute")
    parser.add_argument("--ckpt-dir", type=Path, required=True)
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--sections", action="store_true", help="use NVRx's sections API")
    return parser.parse_args()


def newest_checkpoint(directory: Path) -> tuple[int, Path] | None:
    found = [(int(m.group(1)), p) for p in directory.glob("ckpt-*.pt") if (m := CHECKPOINT.match(p.name))]
    return max(found) if found else None


def save(directory: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".ckpt-{step}.pt.tmp"
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp)
    os.replace(tmp, directory / f"ckpt-{step}.pt")


def main() -> int:
    args = parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
    ft = RankMonitorClient()
    ft.init_workload_monitoring()
    if args.sections:
        ft.start_section("init")

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    newest = newest_checkpoint(args.ckpt_dir)
    if newest is not None:
        state = torch.load(newest[1], map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state["step"])
        if rank == 0:
            print(f"resumed from step {start}", flush=True)
    ddp = DistributedDataParallel(model)
    if args.sections:
        ft.end_section("init")

    for step in range(start + 1, args.steps + 1):
        if args.sections:
            ft.start_section("step")
        generator = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(64, 32, generator=generator).to(device)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if args.sections:
            ft.end_section("step")
        else:
            ft.send_heartbeat()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if step % args.ckpt_every == 0 and rank == 0:
            if args.sections:
                ft.start_section("checkpointing")
            save(args.ckpt_dir, step, model, optimizer)
            if args.sections:
                ft.end_section("checkpointing")
        time.sleep(args.step_sleep)

    ft.shutdown_workload_monitoring()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
