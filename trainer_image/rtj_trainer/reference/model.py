"""The workload: a small language model over a seeded synthetic token stream, sharded with FSDP2.

The stream is a first-order Markov chain: the next token is ``perm[token]`` with probability
``1 - noise``, otherwise uniform. A model that learns ``perm`` drops the loss from ``ln(vocab)``
towards the chain's entropy, so convergence is visible in a few dozen steps. The batch of step ``k``
on rank ``r`` depends only on ``(seed, k, r)``: a run resumed at step ``k`` sees exactly the data an
uninterrupted run would.

Sharding is FSDP2 (``fully_shard``): it trains on gloo and NCCL alike, and each parameter's local
shard is a plain tensor (``to_local()``), which is what a per-rank checkpoint stores.
``rtj_trainer.reference.train`` builds the model inside every in-process restart iteration (the device mesh
belongs to that iteration's process group) and moves state in and out with :func:`local_state` and
:func:`restore_local_state`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
from torch import nn
from torch.distributed.tensor import DTensor

MODEL_PREFIX = "model/"
OPTIM_SHARDED_PREFIX = "optim-sharded/"
OPTIM_PLAIN_PREFIX = "optim-plain/"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab: int = 64
    hidden: int = 64
    layers: int = 2
    seq_len: int = 32
    batch: int = 8
    seed: int = 1234
    noise: float = 0.1


class Block(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.up = nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return out


class TinyLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.blocks = nn.ModuleList([Block(cfg.hidden) for _ in range(cfg.layers)])
        self.norm = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of shape (batch * seq_len, vocab)."""
        h = self.embed(tokens)
        for block in self.blocks:
            h = block(h)
        # Flattened before the head: FSDP2 warns about (and mishandles in-place ops on) a root output
        # that is a view, which a 3-D Linear output is.
        logits: torch.Tensor = self.head(self.norm(h).reshape(-1, h.shape[-1]))
        return logits


def build_model(cfg: ModelConfig, device: torch.device) -> TinyLM:
    # Same seed on every rank: the unsharded initial weights agree before fully_shard splits them.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = TinyLM(cfg)
    return model.to(device)


def shard_model(model: TinyLM, device_type: str) -> TinyLM:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device_type, (torch.distributed.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def transition_table(cfg: ModelConfig) -> torch.Tensor:
    g = torch.Generator().manual_seed(cfg.seed)
    return torch.randperm(cfg.vocab, generator=g)


def batch_for_step(
    cfg: ModelConfig, step: int, rank: int, perm: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets of ``step`` on ``rank``; a pure function of its arguments."""
    g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step * 1_009 + rank)
    tokens = torch.empty(cfg.batch, cfg.seq_len + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(cfg.vocab, (cfg.batch,), generator=g)
    for i in range(1, cfg.seq_len + 1):
        follow = perm[tokens[:, i - 1]]
        random_tokens = torch.randint(cfg.vocab, (cfg.batch,), generator=g)
        keep = torch.rand(cfg.batch, generator=g) >= cfg.noise
        tokens[:, i] = torch.where(keep, follow, random_tokens)
    return tokens[:, :-1], tokens[:, 1:]


def _local(t: torch.Tensor) -> torch.Tensor:
    if isinstance(t, DTensor):
        return t.to_local()
    return t


def local_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """This rank's shards of the parameters and optimizer state, by name (references, no copies)."""
    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        out[MODEL_PREFIX + name] = _local(p.data)
        for key, value in opt.state.get(p, {}).items():
            if isinstance(value, DTensor):
                out[f"{OPTIM_SHARDED_PREFIX}{name}/{key}"] = value.to_local()
            elif isinstance(value, torch.Tensor):
                out[f"{OPTIM_PLAIN_PREFIX}{name}/{key}"] = value
    return out


def restore_local_state(
    model: nn.Module, opt: torch.optim.Optimizer, state: Mapping[str, torch.Tensor]
) -> None:
    """Copy shards saved by :func:`local_state` (same world size) into a freshly sharded model."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            local = _local(p.data)
            saved = state[MODEL_PREFIX + name]
            if saved.shape != local.shape:
                raise ValueError(
                    f"shard of {name} has shape {tuple(saved.shape)}, expected {tuple(local.shape)}"
                )
            local.copy_(saved)
            param_state: dict[str, torch.Tensor] = {}
            for key_name, value in state.items():
                if key_name.startswith(f"{OPTIM_SHARDED_PREFIX}{name}/"):
                    key = key_name.rsplit("/", 1)[1]
                    if isinstance(p, DTensor):
                        param_state[key] = DTensor.from_local(
                            value.to(local.device).clone(),
                            p.device_mesh,
                            p.placements,
                            shape=p.shape,
                            stride=p.stride(),
                            run_check=False,
                        )
                    else:
                        param_state[key] = value.to(local.device).clone()
                elif key_name.startswith(f"{OPTIM_PLAIN_PREFIX}{name}/"):
                    param_state[key_name.rsplit("/", 1)[1]] = value.clone()
            if param_state:
                opt.state[p] = param_state
