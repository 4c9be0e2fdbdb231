"""``train.py`` with the rtj library (docs/library.md): the same torch DDP script with NVRx heartbeats,
whose steps, loss, samples and tokens, checkpoints and drains the operator sees through
``rtj_trainer.Session``.

Against ``train.py``: no ``--ckpt-dir`` (checkpoints go to the job's checkpoint volume every
``spec.checkpoint.intervalSteps`` steps, sharded per rank, written asynchronously and committed
atomically), no step log line to match (the session reports), and a drain (the pod's SIGTERM)
commits a step (the one after the SIGTERM's) before the processes exit. Run it under the operator with
``command: [python, /app/train_with_library.py]``.
"""

from __future__ import annotations

import argparse
import os
import time

import rtj_trainer
import torch
import torch.distributed as dist
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
from torch.nn.parallel import DistributedDataParallel


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-sleep", type=float, default=0.1, help="seconds per step on top of compute")
    args = parser.parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
    ft = RankMonitorClient()
    ft.init_workload_monitoring()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ddp = DistributedDataParallel(model)

    def snapshot() -> dict[str, object]:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    with rtj_trainer.Session(keepalive=ft.send_heartbeat) as session:
        start, state = session.load(like=snapshot())
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        for step in range(start + 1, args.steps + 1):
            generator = torch.Generator().manual_seed(step * 1000 + rank)
            x = torch.randn(64, 32, generator=generator).to(device)
            loss = torch.nn.functional.mse_loss(ddp(x), x.sum(dim=1, keepdim=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            ft.send_heartbeat()
            # The whole job's step: every rank trains on 64 samples of its own, 32 values ("tokens") each.
            session.step(
                step, loss=loss.item(), samples=x.shape[0] * world_size, tokens=x.numel() * world_size
            )
            if session.draining:
                session.drain(step, snapshot())
            if step % session.checkpoint_interval_steps == 0 or step == args.steps:
                session.save(step, snapshot())
            time.sleep(args.step_sleep)

    ft.shutdown_workload_monitoring()
    dist.destroy_process_group()
    return 0


# Required: the async checkpoint writer is a spawned process, which imports this file.
if __name__ == "__main__":
    raise SystemExit(main())
