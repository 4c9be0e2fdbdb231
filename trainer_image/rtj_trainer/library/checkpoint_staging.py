"""A save's copy of the state in host memory, before the writer process reads it.

The checkpoint manager (``rtj_trainer.library.checkpoint``) copies the state into a staging buffer of
preallocated shared-memory CPU tensors, so the writer process reads bytes equal to the state at the
save call while training goes on changing it. This module holds those buffers (two at most: one the
writer reads, one for the newest copy), the copy itself (inline, or on a background thread and for
CUDA state on a side stream), and the newest copy with whether it is still to be written.
``checkpoint_writes`` hands a staged copy to the writer; the manager decides when.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch


class StagingBuffer:
    """Preallocated shared-memory CPU tensors, one per state entry, reused by every save."""

    def __init__(self) -> None:
        self._tensors: dict[str, torch.Tensor] = {}
        self.bytes = 0

    def stage(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        staged: dict[str, torch.Tensor] = {}
        for name, tensor in state.items():
            src = tensor.detach()
            buf = self._tensors.get(name)
            if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
                buf = torch.empty(src.shape, dtype=src.dtype, device="cpu").share_memory_()  # type: ignore[no-untyped-call]
                self._tensors[name] = buf
            buf.copy_(src)
            staged[name] = buf
        self.bytes = sum(t.numel() * t.element_size() for t in staged.values())
        return staged


def _cuda_device(state: Mapping[str, torch.Tensor]) -> torch.device | None:
    return next((t.device for t in state.values() if t.is_cuda), None)


class Stager:
    """Copies the state into a staging buffer, inline or on a background thread.

    torch's copy releases the GIL, so a background copy overlaps the next step's compute. CUDA
    state is copied on a side stream that first waits for the work queued before the save (the
    step that produced the state), so the training stream goes on while the device-to-host copy
    runs.
    """

    def __init__(self, background: bool) -> None:
        self.background = background
        self._pool: ThreadPoolExecutor | None = None  # started by the first copy, again after close()
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def start(
        self, buffer: StagingBuffer, state: Mapping[str, torch.Tensor]
    ) -> Future[dict[str, torch.Tensor]]:
        if not self.background:
            done: Future[dict[str, torch.Tensor]] = Future()
            done.set_result(buffer.stage(state))
            return done
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rtj-ckpt-stage")
        state = dict(state)  # the caller may rebind its entries; the tensors themselves stay
        device = _cuda_device(state)
        if device is None:
            return self._pool.submit(buffer.stage, state)
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        produced = torch.cuda.current_stream(device).record_event()
        return self._pool.submit(self._stage_on_stream, buffer, state, stream, produced)

    @staticmethod
    def _stage_on_stream(
        buffer: StagingBuffer,
        state: Mapping[str, torch.Tensor],
        stream: torch.cuda.Stream,
        produced: torch.cuda.Event,
    ) -> dict[str, torch.Tensor]:
        with torch.cuda.stream(stream):
            stream.wait_event(produced)
            staged = buffer.stage(state)
        stream.synchronize()
        return staged

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


@dataclasses.dataclass
class StagedCopy:
    """The newest copy of the state in host memory, and whether it is to be written."""

    step: int
    buffer: StagingBuffer
    copy: Future[dict[str, torch.Tensor]]
    extra: dict[str, Any]
    write: bool  # a durable save of this step was asked for and is not yet with the writer


class StagingArea:
    """The staging buffers and the newest copy in them.

    Two buffers at most: one the writer reads, one for the newest copy. The second is allocated by
    the first save that finds the writer still busy.
    """

    def __init__(self, *, background: bool) -> None:
        self._stager = Stager(background)
        self._buffers: list[StagingBuffer] = [StagingBuffer()]
        self.staged: StagedCopy | None = None

    def write_queued(self) -> bool:
        """Whether the newest copy waits for the writer (a durable save not handed over yet)."""
        return self.staged is not None and self.staged.write

    def free_buffer(self, being_written: StagingBuffer | None) -> StagingBuffer | None:
        """A buffer neither the writer reads (``being_written``) nor a queued write holds; None when
        both are taken."""
        taken = {id(being_written)} if being_written is not None else set()
        if self.staged is not None and self.staged.write:
            taken.add(id(self.staged.buffer))
        for buffer in self._buffers:
            if id(buffer) not in taken:
                return buffer
        if len(self._buffers) < 2:
            self._buffers.append(StagingBuffer())
            return self._buffers[-1]
        return None

    def stage(
        self,
        step: int,
        buffer: StagingBuffer,
        tensors: Mapping[str, torch.Tensor],
        extra: Mapping[str, Any],
        *,
        write: bool,
    ) -> None:
        """Start copying ``tensors`` into ``buffer``: the newest copy from now on."""
        self.staged = StagedCopy(step, buffer, self._stager.start(buffer, tensors), dict(extra), write)

    def ready_to_write(self) -> StagedCopy | None:
        """The newest copy, once it is complete, if it is still to be written."""
        staged = self.staged
        if staged is None or not staged.write or not staged.copy.done():
            return None
        return staged

    def close(self) -> None:
        self._stager.close()
