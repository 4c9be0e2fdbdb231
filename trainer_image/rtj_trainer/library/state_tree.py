"""A state dict as a checkpoint holds it: its tensors apart, and a skeleton of everything else.

``Session.save`` (``rtj_trainer.library.session``) splits the script's state into the tensors that
the checkpoint manager writes as this rank's shard (a ``DTensor`` as its local shard) and a skeleton
of its structure and plain values, which goes into the shard's ``extra``; ``Session.load`` joins them
back, each tensor placed like its counterpart in the freshly built model's state (its device, its
mesh and placements). Pure functions; torch is imported when a state is split or joined.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import torch

# The key that marks a tensor leaf in the saved state's skeleton (the non-tensor part of a state dict).
TENSOR_KEY: Final = "__rtj_tensor__"
# What a state dict may hold besides tensors, dicts, lists and tuples: what torch.load(weights_only) reads.
PLAIN_LEAVES: Final = (bool, int, float, str, type(None))


def split_state(state: object, path: tuple[str, ...], tensors: dict[str, torch.Tensor]) -> object:
    """The state's skeleton (its structure and plain values, each tensor replaced by a reference),
    collecting the tensors into ``tensors``: a ``DTensor`` as its local shard."""
    import torch

    where = "/".join(path) or "the state"
    if isinstance(state, torch.Tensor):
        from torch.distributed.tensor import DTensor

        key = where
        while key in tensors:
            key += "'"
        tensors[key] = state.to_local() if isinstance(state, DTensor) else state
        return {TENSOR_KEY: key}
    if isinstance(state, Mapping):
        out: dict[object, object] = {}
        for name, value in state.items():
            if not isinstance(name, str | int):
                raise TypeError(f"{where}: key {name!r} is a {type(name).__name__}; only str and int keys")
            out[name] = split_state(value, (*path, str(name)), tensors)
        return out
    if isinstance(state, list | tuple):
        items = [split_state(value, (*path, str(i)), tensors) for i, value in enumerate(state)]
        return items if isinstance(state, list) else tuple(items)
    if isinstance(state, PLAIN_LEAVES):
        return state
    raise TypeError(
        f"{where} is a {type(state).__name__}: a checkpointed state holds tensors, numbers, strings, "
        "None, and dicts, lists and tuples of them"
    )


def join_state(
    skeleton: object, tensors: Mapping[str, torch.Tensor], like: object, path: tuple[str, ...]
) -> Any:
    """The saved state back from its skeleton; each tensor placed like its counterpart in ``like``."""
    if isinstance(skeleton, dict):
        if set(skeleton) == {TENSOR_KEY}:
            return _placed(tensors[skeleton[TENSOR_KEY]], like, path)
        peers = like if isinstance(like, Mapping) else {}
        return {k: join_state(v, tensors, peers.get(k), (*path, str(k))) for k, v in skeleton.items()}
    if isinstance(skeleton, list | tuple):
        peers_seq = like if isinstance(like, list | tuple) and len(like) == len(skeleton) else None
        items = [
            join_state(v, tensors, None if peers_seq is None else peers_seq[i], (*path, str(i)))
            for i, v in enumerate(skeleton)
        ]
        return items if isinstance(skeleton, list) else tuple(items)
    return skeleton


def _placed(saved: torch.Tensor, like: object, path: tuple[str, ...]) -> torch.Tensor:
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(like, DTensor):
        local = like.to_local()
        if local.shape != saved.shape:
            raise ValueError(
                f"{'/'.join(path)}: the saved shard has shape {tuple(saved.shape)}, the model's "
                f"{tuple(local.shape)} (a different sharding?)"
            )
        return DTensor.from_local(
            saved.to(local.device),
            like.device_mesh,
            like.placements,
            shape=like.shape,
            stride=like.stride(),
            run_check=False,
        )
    if isinstance(like, torch.Tensor):
        return saved.to(like.device)
    return saved
