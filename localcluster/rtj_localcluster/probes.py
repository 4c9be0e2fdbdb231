"""A container's exec readinessProbe, run as a kubelet's prober does: the command runs with the
container's environment and working directory, and exit 0 counts as success."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import Any


async def probe_readiness(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str,
    probe: Mapping[str, Any],
    report: Callable[[bool], None],
) -> None:
    """Run the probe's `argv` every period until cancelled; `report` gets each change of the verdict,
    which starts not ready. Kubernetes' defaults: period 10 s, timeout 1 s, thresholds 1/3."""
    period = float(probe.get("periodSeconds") or 10)
    timeout = float(probe.get("timeoutSeconds") or 1)
    success_needed = int(probe.get("successThreshold") or 1)
    failure_needed = int(probe.get("failureThreshold") or 3)
    await asyncio.sleep(float(probe.get("initialDelaySeconds") or 0))
    ready = False
    successes = failures = 0
    while True:
        ok = await _probe_once(argv, env, cwd, timeout)
        successes, failures = (successes + 1, 0) if ok else (0, failures + 1)
        verdict = ready
        if successes >= success_needed:
            verdict = True
        elif failures >= failure_needed:
            verdict = False
        if verdict != ready:
            ready = verdict
            report(ready)
        await asyncio.sleep(period)


async def _probe_once(argv: Sequence[str], env: Mapping[str, str], cwd: str, limit_seconds: float) -> bool:
    try:
        checker = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        return False
    try:
        return await asyncio.wait_for(checker.wait(), limit_seconds) == 0
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(checker.pid, signal.SIGKILL)
        await checker.wait()
        return False
