"""The memory tier: each rank's training state copied to a peer rank on another node.

Every few steps each rank flattens its local state (``rtj_trainer.reference.model.local_state``: its shards
of the parameters and optimizer state) into one byte buffer and sends it to its *holder*, the rank
``stride`` places ahead in the ring (``stride`` = ranks per node, so the holder is on the next node),
while it receives, and keeps in host memory, the state of the rank ``stride`` places behind. When
ranks are lost, a rank that takes over a lost index gets that index's state back from the holder
instead of from a checkpoint, provided every other index can resume at the same step.

Three layers, I/O at the edges:

* :func:`flatten` / :func:`unflatten` and :class:`Layout`: a ``dict[str, Tensor]`` of any dtypes
  and shapes as one contiguous ``uint8`` buffer and back. The layout orders tensors by name, so it
  is the same for the same model, rank and world size on any process.
* :class:`MemoryTier`: the replica a rank holds. :meth:`MemoryTier.replicate` is a collective of
  the group; the held replica changes in one assignment, only once a new one arrived completely,
  with the CRC-32 of its bytes as they arrived: a replica whose bytes changed while it was held (a
  bit flipped in host memory, a buffer reused too early) is never reported for a resume
  (:func:`gather_reports` checks it), so a resume falls back to the checkpoint instead. The tier
  keeps two generations, of the replica and of the rank's own snapshot: the newest and the one
  before it, whose buffers the next exchange reuses. A node lost in the middle of an exchange
  leaves some pairs one step ahead of the others; the generation before is what they share.
* :func:`plan_resume` (pure) decides from every rank's :class:`RankReport` (gathered by
  :func:`gather_reports`) whether the world resumes from memory, and which holder sends which
  replica to which rank; :func:`execute_transfers` moves them.

The wire device follows the group's backend: NCCL groups send from and receive into buffers on the
current CUDA device; every other backend (gloo) sends host memory directly. The held replica is
always in host memory (pinned when CUDA is available), so it costs no GPU memory between steps.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import time
import zlib
from collections.abc import Mapping, Sequence
from typing import Literal

import torch
import torch.distributed as dist

from rtj_trainer.reference import topology

log = logging.getLogger(__name__)

ALIGNMENT = 64
"""Bytes every tensor's offset in a flat buffer is a multiple of (any dtype can be viewed there)."""

REPORT_FIELDS = 8
HEADER_FIELDS = 4


# -- flat buffers ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Entry:
    """Where one tensor lives in a flat buffer."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclasses.dataclass(frozen=True)
class Layout:
    """Names, dtypes, shapes and byte offsets of the tensors of a flat buffer of ``nbytes``."""

    entries: tuple[Entry, ...]
    nbytes: int

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor]) -> Layout:
        """The layout of ``tensors``: ordered by name, each offset aligned to :data:`ALIGNMENT`."""
        entries: list[Entry] = []
        offset = 0
        for name in sorted(tensors):
            t = tensors[name]
            nbytes = t.numel() * t.element_size()
            entries.append(Entry(name, t.dtype, tuple(t.shape), offset, nbytes))
            offset = _aligned(offset + nbytes)
        return cls(tuple(entries), offset)

    def encode(self) -> torch.Tensor:
        """The layout as a ``uint8`` tensor (JSON), to travel next to the buffer it describes."""
        rows = [
            [e.name, str(e.dtype).removeprefix("torch."), list(e.shape), e.offset, e.nbytes]
            for e in self.entries
        ]
        data = json.dumps({"nbytes": self.nbytes, "entries": rows}, separators=(",", ":")).encode()
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    @classmethod
    def decode(cls, encoded: torch.Tensor) -> Layout:
        raw = json.loads(bytes(encoded.cpu().numpy().tobytes()).decode())
        entries = tuple(
            Entry(str(name), _dtype(str(dtype)), tuple(int(d) for d in shape), int(offset), int(nbytes))
            for name, dtype, shape, offset, nbytes in raw["entries"]
        )
        return cls(entries, int(raw["nbytes"]))


def _aligned(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"layout names an unknown dtype {name!r}")
    return dtype


def _slot(flat: torch.Tensor, entry: Entry) -> torch.Tensor:
    return flat[entry.offset : entry.offset + entry.nbytes].view(entry.dtype).view(entry.shape)


def crc32(flat: torch.Tensor) -> int:
    """The CRC-32 of a host ``uint8`` buffer's bytes (zlib's, over a view: no copy)."""
    return zlib.crc32(flat.numpy().data)


def _host_bytes(nbytes: int) -> torch.Tensor:
    """A zeroed host buffer (alignment padding included: equal states give equal bytes); pinned
    where CUDA is available, so copies from and to the GPU are fast."""
    return torch.zeros(nbytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())


def flatten_into(tensors: Mapping[str, torch.Tensor], layout: Layout, out: torch.Tensor) -> None:
    """Copy ``tensors`` (on any device) into the flat ``uint8`` buffer ``out`` laid out by ``layout``."""
    if out.dtype != torch.uint8 or out.numel() != layout.nbytes:
        raise ValueError(
            f"flat buffer has {out.numel()} {out.dtype} elements, layout needs {layout.nbytes} bytes"
        )
    if set(tensors) != {e.name for e in layout.entries}:
        raise ValueError("tensors do not match the layout: " + _name_difference(tensors, layout))
    asynchronous = out.is_pinned()
    for entry in layout.entries:
        t = tensors[entry.name]
        if t.dtype != entry.dtype or tuple(t.shape) != entry.shape:
            raise ValueError(
                f"tensor {entry.name} is {t.dtype} {tuple(t.shape)}, layout says {entry.dtype} {entry.shape}"
            )
        _slot(out, entry).copy_(t, non_blocking=asynchronous and t.is_cuda)
    if asynchronous and any(t.is_cuda for t in tensors.values()):
        torch.cuda.synchronize()


def _name_difference(tensors: Mapping[str, torch.Tensor], layout: Layout) -> str:
    expected = {e.name for e in layout.entries}
    missing, extra = sorted(expected - set(tensors)), sorted(set(tensors) - expected)
    return f"missing {missing}, unexpected {extra}"


def flatten(tensors: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, Layout]:
    """``tensors`` copied into one new contiguous host ``uint8`` buffer, and its layout."""
    layout = Layout.of(tensors)
    flat = _host_bytes(layout.nbytes)
    flatten_into(tensors, layout, flat)
    return flat, layout


def unflatten(flat: torch.Tensor, layout: Layout) -> dict[str, torch.Tensor]:
    """The tensors of ``flat`` by name: views into it, not copies."""
    if flat.dtype != torch.uint8 or flat.dim() != 1 or flat.numel() != layout.nbytes:
        raise ValueError(
            f"flat buffer has shape {tuple(flat.shape)} of {flat.dtype}, layout needs {layout.nbytes} bytes"
        )
    return {entry.name: _slot(flat, entry) for entry in layout.entries}


# -- point to point -------------------------------------------------------------------------------


def peer_offset(stride: int, world_size: int) -> int:
    """How far ahead in the ring a rank's holder is: ``stride`` (ranks per node) when that lands on
    another rank, else the next rank (a single node); 0 for a world of one."""
    if world_size <= 1:
        return 0
    offset = stride % world_size
    return offset if offset != 0 else 1


def world_domains(group: dist.ProcessGroup | None = None) -> tuple[str, ...] | None:
    """Collective of ``group`` where the job renders ``RTJ_NODE_ZONE`` (every rank or none): each
    rank's zone, in rank order; None (no collective) where it does not."""
    if topology.NODE_ZONE_ENV not in os.environ:
        return None
    gathered: list[object] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, os.environ[topology.NODE_ZONE_ENV].strip(), group=group)
    return tuple(str(zone) for zone in gathered)


def wire_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where tensors sent over ``group`` must live: the current CUDA device for NCCL, else the host."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _exchange(
    sends: Sequence[tuple[torch.Tensor, int]],
    recvs: Sequence[tuple[torch.Tensor, int]],
    group: dist.ProcessGroup | None,
    timeout: dt.timedelta | None,
) -> None:
    """Post every send and receive (group ranks) at once, then wait for all: no ordering deadlocks,
    and NCCL gets them as one group."""
    ops = [dist.P2POp(dist.isend, t, _global(peer, group), group) for t, peer in sends]
    ops += [dist.P2POp(dist.irecv, t, _global(peer, group), group) for t, peer in recvs]
    if not ops:
        return
    for work in dist.batch_isend_irecv(ops):
        if timeout is None:
            work.wait()
        else:
            work.wait(timeout)


def _global(group_rank: int, group: dist.ProcessGroup | None) -> int:
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def _swap_headers(
    step: int,
    ranks: tuple[int, int, int],
    sizes: Sequence[int],
    device: torch.device,
    *,
    group: dist.ProcessGroup | None,
    timeout: dt.timedelta | None,
) -> tuple[int, int]:
    """Send ``[step, rank, *sizes]`` to the holder, receive the source's: its payload and layout
    sizes. Both sides must be replicating the same step."""
    rank, holder, source = ranks
    header = torch.tensor([step, rank, *sizes], dtype=torch.long, device=device)
    peer_header = torch.empty(HEADER_FIELDS, dtype=torch.long, device=device)
    _exchange([(header, holder)], [(peer_header, source)], group, timeout)
    peer_step, peer_rank, nbytes, layout_len = (int(v) for v in peer_header.tolist())
    if (peer_step, peer_rank) != (step, source):
        raise RuntimeError(
            f"replicate of step {step}: rank {source} sent step {peer_step} as rank {peer_rank}"
        )
    return nbytes, layout_len


# -- the replica a rank holds ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Replica:
    """Another rank's state at a step, in host memory. Its buffer is not written while it is the
    held replica; once replaced, the next :meth:`MemoryTier.replicate` reuses it (copy what you keep)."""

    step: int
    of_index: int
    world_size: int
    payload: torch.Tensor
    encoded_layout: torch.Tensor
    crc32: int  # of ``payload`` as it arrived

    @property
    def layout(self) -> Layout:
        return Layout.decode(self.encoded_layout)

    def intact(self) -> bool:
        """Whether its bytes are still those that arrived (one pass of CRC-32 over them)."""
        return crc32(self.payload) == self.crc32


class MemoryTier:
    """This rank's side of the memory tier: the replica it holds for a peer, and the buffers it
    reuses from one :meth:`replicate` to the next (a send buffer on the wire device, a spare host
    buffer the next replica arrives in, and on NCCL a receive buffer on the GPU)."""

    def __init__(self, stride: int) -> None:
        if stride < 1:
            raise ValueError(f"stride (ranks per node) must be >= 1, got {stride}")
        self.stride = stride
        self.replica: Replica | None = None
        self.previous: Replica | None = None
        """The replica before :attr:`replica`, until the next :meth:`replicate` receives into its
        buffer."""
        self.last_seconds = 0.0
        """Wall time of the latest successful :meth:`replicate`, flatten included."""
        self.own: OwnSnapshot | None = None
        """This rank's own state as it sent it in the latest successful :meth:`replicate`: a
        survivor whose live state went one step past the replicas (a peer lost in the middle of an
        exchange) rolls back to it."""
        self.previous_own: OwnSnapshot | None = None
        """The own snapshot before :attr:`own`, until the next :meth:`replicate` flattens into its
        buffer."""
        self._layout: Layout | None = None
        self._encoded_layout = torch.empty(0, dtype=torch.uint8)
        self._sends: list[torch.Tensor | None] = [None, None]
        self._wire_in: torch.Tensor | None = None
        self._spare: torch.Tensor | None = None
        self.domains: tuple[str, ...] | None = None
        """Each rank's failure domain in the current world (:func:`world_domains`), or None: the
        holders are then ``stride`` ranks ahead (:func:`peer_offset`)."""
        self._pairing: tuple[tuple[tuple[str, ...], int], list[int], list[int]] | None = None

    def peers(self, rank: int, world: int) -> tuple[int, int] | None:
        """(holder, source) of ``rank`` in a world of ``world``: the rank its state goes to and the
        rank whose state it holds; None in a world of one. Across failure domains
        (``topology.replica_holders``) when :attr:`domains` describes this world of whole nodes,
        else ``stride`` ranks ahead and behind. Every rank computes the same permutation."""
        domains = self.domains
        if domains is None or len(domains) != world or world % self.stride != 0:
            offset = peer_offset(self.stride, world)
            return None if offset == 0 else ((rank + offset) % world, (rank - offset) % world)
        if world <= 1:
            return None
        key = (domains, self.stride)
        if self._pairing is None or self._pairing[0] != key:
            holders = topology.replica_holders(topology.node_domains(domains, self.stride), self.stride)
            sources = [0] * world
            for giver, holder in enumerate(holders):
                sources[holder] = giver
            self._pairing = (key, holders, sources)
        _, holders, sources = self._pairing
        return holders[rank], sources[rank]

    def replica_at(self, of_index: int, step: int) -> Replica | None:
        """The held replica of ``of_index`` at ``step``, of either generation, or None."""
        held = (r for r in (self.replica, self.previous) if r is not None)
        return next((r for r in held if (r.of_index, r.step) == (of_index, step)), None)

    def own_at(self, step: int) -> OwnSnapshot | None:
        """This rank's own snapshot of ``step``, of either generation, or None."""
        return next((o for o in (self.own, self.previous_own) if o is not None and o.step == step), None)

    @property
    def replica_step(self) -> int:
        return self.replica.step if self.replica is not None else -1

    @property
    def replica_of(self) -> int:
        return self.replica.of_index if self.replica is not None else -1

    def replicate(
        self,
        step: int,
        tensors: Mapping[str, torch.Tensor],
        group: dist.ProcessGroup | None = None,
        timeout: dt.timedelta | None = None,
    ) -> None:
        """Collective of ``group``: send ``tensors`` (this rank's state after ``step`` steps) to the
        holder, receive the state of the rank this one holds for. The held replica is replaced only
        when the new one arrived whole; on any error (a peer lost, ``timeout``) it stays as it was
        and the error propagates. A no-op in a world of one."""
        world = dist.get_world_size(group)
        rank = dist.get_rank(group)
        peers = self.peers(rank, world)
        if peers is None:
            return
        started = time.perf_counter()
        holder, source = peers
        device = wire_device(group)
        send, encoded = self._prepare_send(tensors, device)
        sizes = [send.numel(), encoded.numel()]
        nbytes, layout_len = _swap_headers(
            step, (rank, holder, source), sizes, device, group=group, timeout=timeout
        )
        # The previous replica's buffer is the spare this exchange receives into.
        spare, self._spare, self.previous = self._spare_of(nbytes), None, None
        incoming = spare if device.type == "cpu" else self._wire_buffer(nbytes, device)
        incoming_layout = torch.empty(layout_len, dtype=torch.uint8, device=device)
        _exchange(
            [(send, holder), (encoded, holder)],
            [(incoming, source), (incoming_layout, source)],
            group,
            timeout,
        )
        if incoming is not spare:
            spare.copy_(incoming)
        previous, previous_own = self.replica, self.own
        self.replica = Replica(step, source, world, spare, incoming_layout.cpu(), crc32(spare))
        assert self._layout is not None
        self.own = OwnSnapshot(step, rank, world, send, self._layout)
        self.previous, self.previous_own = previous, previous_own
        self._spare = previous.payload if previous is not None else None
        self.last_seconds = time.perf_counter() - started

    def _prepare_send(
        self, tensors: Mapping[str, torch.Tensor], device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        layout = Layout.of(tensors)
        if layout != self._layout:
            self._layout, self._sends, self.own = layout, [None, None], None
            self._encoded_layout = layout.encode()
        self.previous_own = None  # its buffer is the one this send is flattened into
        # Two send buffers take turns: the one holding the own snapshot stays as it is until the
        # next exchange completes.
        turn = 1 if self.own is not None and self.own.payload is self._sends[0] else 0
        send = self._sends[turn]
        if send is None or send.device != device:
            on_host = device.type == "cpu"
            send = (
                _host_bytes(layout.nbytes)
                if on_host
                else torch.zeros(layout.nbytes, dtype=torch.uint8, device=device)
            )
            self._sends[turn] = send
        flatten_into(tensors, layout, send)
        return send, self._encoded_layout.to(device)

    def _spare_of(self, nbytes: int) -> torch.Tensor:
        if self._spare is not None and self._spare.numel() == nbytes:
            return self._spare
        return _host_bytes(nbytes)

    def _wire_buffer(self, nbytes: int, device: torch.device) -> torch.Tensor:
        if self._wire_in is None or self._wire_in.numel() != nbytes or self._wire_in.device != device:
            self._wire_in = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return self._wire_in


# -- resuming from memory -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OwnSnapshot:
    """A rank's own state (index ``index`` of a world of ``world_size``) after ``step`` steps, as
    sent to its holder: the send buffer of the latest successful exchange."""

    step: int
    index: int
    world_size: int
    payload: torch.Tensor
    layout: Layout


@dataclasses.dataclass(frozen=True)
class RankReport:
    """What one rank can contribute to a resume. ``index``: the rank index it now holds;
    ``live_step``: the step of the consistent state of that index it holds itself, or -1;
    ``replica_of`` / ``replica_step``: the index and step of the replica it holds, or -1;
    ``own_step``: the step of its own snapshot of that index (``MemoryTier.own``), or -1; the
    ``previous_*`` fields: the same of the generation before (``MemoryTier.previous``,
    ``MemoryTier.previous_own``)."""

    index: int
    live_step: int
    replica_of: int
    replica_step: int
    own_step: int = -1
    previous_of: int = -1
    previous_step: int = -1
    previous_own_step: int = -1

    def replicas(self) -> tuple[tuple[int, int], ...]:
        """(index, step) of each replica it holds, newest first."""
        held = ((self.replica_of, self.replica_step), (self.previous_of, self.previous_step))
        return tuple((of, step) for of, step in held if of >= 0 and step >= 0)

    def own_steps(self) -> tuple[int, ...]:
        return tuple(step for step in (self.own_step, self.previous_own_step) if step >= 0)


@dataclasses.dataclass(frozen=True)
class Transfer:
    """The holder (a rank) sends its replica of ``receiver``'s index to ``receiver``."""

    holder: int
    receiver: int


@dataclasses.dataclass(frozen=True)
class ResumePlan:
    """``memory``: every index resumes at ``step``, the ones without live state by ``transfers``;
    ``checkpoint``: from the checkpoint, ``reason`` says why not from memory."""

    source: Literal["memory", "checkpoint"]
    step: int = -1
    transfers: tuple[Transfer, ...] = ()
    reason: str = ""
    snapshots: tuple[int, ...] = ()
    """Ranks that resume from their own snapshot (``MemoryTier.own``) rather than their live state."""


def _checkpoint(reason: str) -> ResumePlan:
    return ResumePlan("checkpoint", reason=reason)


def plan_resume(reports: Sequence[RankReport]) -> ResumePlan:
    """From memory when every index has a source at one step ``S``: its own live state (the
    survivors, who must all be at ``S``) or a replica of ``S`` held by some rank; else from the
    checkpoint. ``reports[i]`` is rank ``i``'s."""
    world = len(reports)
    if [r.index for r in reports] != list(range(world)):
        raise ValueError(
            f"reports must be of indices 0..{world - 1} in order, got {[r.index for r in reports]}"
        )
    if not any(r.live_step >= 0 for r in reports):
        return _checkpoint("no rank holds a live state")
    candidates = {r.live_step for r in reports if r.live_step >= 0}
    candidates |= {step for r in reports for step in r.own_steps()}
    reasons = []
    for step in sorted(candidates, reverse=True):
        plan = _plan_at(reports, step)
        if plan.source == "memory":
            return plan
        reasons.append(plan.reason)
    return _checkpoint("; ".join(reasons))


def _plan_at(reports: Sequence[RankReport], step: int) -> ResumePlan:
    """Every index at ``step``: live state, else own snapshot, else a replica held by a rank."""
    holders: dict[int, int] = {}
    for r in reports:
        for of, held_step in r.replicas():
            if held_step == step:
                holders.setdefault(of, r.index)
    transfers: list[Transfer] = []
    snapshots: list[int] = []
    for report in reports:
        if report.live_step == step:
            continue
        if step in report.own_steps():
            snapshots.append(report.index)
            continue
        holder = holders.get(report.index)
        if holder is None:
            return _checkpoint(f"no live state or replica of step {step} for index {report.index}")
        transfers.append(Transfer(holder, report.index))
    return ResumePlan("memory", step, tuple(transfers), snapshots=tuple(snapshots))


def gather_reports(
    tier: MemoryTier,
    live_step: int,
    rank: int,
    world: int,
    device: torch.device,
    *,
    group: dist.ProcessGroup | None = None,
) -> list[RankReport]:
    """Collective of ``group`` (one ``all_gather``): every rank's :class:`RankReport`. ``live_step``:
    the step of this rank's consistent state of index ``rank`` in this world, or -1. A replica taken
    in a world of another size is not reported (its indices meant other ranks), nor one whose bytes
    changed since they arrived (:meth:`Replica.intact`). Both generations are reported."""
    of_index, replica_step = _offered(tier.replica, world)
    previous_of, previous_step = _offered(tier.previous, world)
    own_step, previous_own_step = _own_step(tier.own, rank, world), _own_step(tier.previous_own, rank, world)
    fields = [rank, live_step, of_index, replica_step, own_step, previous_of, previous_step]
    mine = torch.tensor([*fields, previous_own_step], dtype=torch.long, device=device)
    gathered = [torch.empty(REPORT_FIELDS, dtype=torch.long, device=device) for _ in range(world)]
    dist.all_gather(gathered, mine, group=group)
    return [RankReport(*(int(v) for v in t.tolist())) for t in gathered]


def _offered(replica: Replica | None, world: int) -> tuple[int, int]:
    """(index, step) of a replica that can serve a resume in a world of ``world``, else (-1, -1)."""
    if replica is None or replica.world_size != world or not _intact(replica):
        return -1, -1
    return replica.of_index, replica.step


def _own_step(own: OwnSnapshot | None, rank: int, world: int) -> int:
    return own.step if own is not None and (own.index, own.world_size) == (rank, world) else -1


def _intact(replica: Replica) -> bool:
    if replica.intact():
        return True
    log.error(
        "the replica of index %d at step %d is corrupt (its CRC-32 changed since it arrived): "
        "not offered for a resume",
        replica.of_index,
        replica.step,
    )
    return False


def execute_transfers(
    plan: ResumePlan,
    tier: MemoryTier,
    own_rank: int,
    expected_layout: Layout | None = None,
    *,
    group: dist.ProcessGroup | None = None,
    timeout: dt.timedelta | None = None,
) -> dict[str, torch.Tensor] | None:
    """Collective of the ranks named in ``plan.transfers``: a holder sends its replica, a receiver
    gets its state back (host tensors by name, as :func:`unflatten` of a fresh buffer); every other
    rank returns None at once. ``expected_layout``, when given, must match what arrives (else
    ValueError, after the transfer completed, so the holder never hangs)."""
    if plan.source != "memory":
        return None
    sends = [t for t in plan.transfers if t.holder == own_rank]
    receives = [t for t in plan.transfers if t.receiver == own_rank]
    if len(receives) > 1:
        raise ValueError(f"plan has {len(receives)} transfers to rank {own_rank}")
    device = wire_device(group)
    replica = _replica_to_send(tier, plan.step, sends)
    out_headers, out_payloads = _outgoing(replica, sends, device)
    in_headers = [(torch.empty(HEADER_FIELDS, dtype=torch.long, device=device), t.holder) for t in receives]
    _exchange(out_headers, in_headers, group, timeout)
    in_payloads = [
        (torch.empty(int(header[field]), dtype=torch.uint8, device=device), holder)
        for header, holder in in_headers
        for field in (2, 3)
    ]
    _exchange(out_payloads, in_payloads, group, timeout)
    if not receives:
        return None
    (header, holder), ((payload, _), (encoded, _)) = in_headers[0], in_payloads
    step, index = int(header[0]), int(header[1])
    if (step, index) != (plan.step, own_rank):
        raise RuntimeError(
            f"rank {holder} sent the state of index {index} at step {step},"
            f" expected index {own_rank} at step {plan.step}"
        )
    layout = Layout.decode(encoded)
    if expected_layout is not None and layout != expected_layout:
        difference = _layout_difference(layout, expected_layout)
        raise ValueError(
            f"state of index {own_rank} from rank {holder} is not the expected layout: {difference}"
        )
    host = payload if payload.device.type == "cpu" else payload.to("cpu")
    return unflatten(host, layout)


def _replica_to_send(tier: MemoryTier, step: int, sends: Sequence[Transfer]) -> Replica | None:
    if not sends:
        return None
    replica = tier.replica_at(sends[0].receiver, step)
    if len(sends) > 1 or replica is None:
        held = f"index {tier.replica_of} at step {tier.replica_step}"
        raise RuntimeError(
            f"plan asks for {[t.receiver for t in sends]} at step {step}; this rank holds {held}"
        )
    return replica


def _outgoing(
    replica: Replica | None, sends: Sequence[Transfer], device: torch.device
) -> tuple[list[tuple[torch.Tensor, int]], list[tuple[torch.Tensor, int]]]:
    if replica is None:
        return [], []
    receiver = sends[0].receiver
    sizes = [replica.step, replica.of_index, replica.payload.numel(), replica.encoded_layout.numel()]
    header = torch.tensor(sizes, dtype=torch.long, device=device)
    payloads = [(replica.payload.to(device), receiver), (replica.encoded_layout.to(device), receiver)]
    return [(header, receiver)], payloads


def _layout_difference(got: Layout, expected: Layout) -> str:
    got_entries, expected_entries = set(got.entries), set(expected.entries)
    return (
        f"{len(got_entries - expected_entries)} entries not expected"
        f" (first: {min(got_entries - expected_entries, key=lambda e: e.name, default=None)}),"
        f" {len(expected_entries - got_entries)} missing"
        f" (first: {min(expected_entries - got_entries, key=lambda e: e.name, default=None)})"
    )


def own_state(tier: MemoryTier, step: int) -> dict[str, torch.Tensor]:
    """This rank's own snapshot of ``step`` as tensors by name (host views into its buffer)."""
    own = tier.own_at(step)
    if own is None:
        raise RuntimeError(f"this rank holds no snapshot of its own state at step {step}")
    host = own.payload if own.payload.device.type == "cpu" else own.payload.to("cpu")
    return unflatten(host, own.layout)
