"""A non-finite loss is a fault, never trained on.

A loss of NaN or infinity means the step's gradients (and, once the optimizer stepped, the
parameters) are garbage: a silent data corruption on one GPU, a bad batch, an overflow. Training on
would carry it into every later step and the next checkpoint. :class:`rtj_trainer.Session` raises
:class:`NonFiniteLossError` from ``step()`` instead, before the step counts, so the block ends, the
launcher restarts the ranks and they resume from the last checkpoint, which the bad step never
reached. A loss that is non-finite again after the same step on the next try is a deterministic
failure (``rtj_trainer.library.failed_step``): ``rtj-launch`` stops the restarts.

Pure and standard library only.
"""

from __future__ import annotations

import math


class NonFiniteLossError(ArithmeticError):
    """The loss a step reported is NaN or infinite: the step is not counted, the block ends."""

    __module__ = "rtj_trainer"  # its public name, as tracebacks print it

    @classmethod
    def check(cls, step: int, loss: float) -> None:
        """Raise it when `loss` (of step `step`) is NaN or infinite."""
        if not math.isfinite(loss):
            raise cls(f"the loss of step {step} is {loss}: not training on it")
