"""`rtj status`: print what a ResilientTrainingJob's status says, in words.

`rtj status NAME [-n NAMESPACE] [--kubeconfig PATH]` reads the job through the Kubernetes API (the
operator's own client, `runtime.kube`) and prints its state, workers, training step (and whether it
advances), the samples and tokens trained on (when the script reports them), last checkpoint,
restarts, the last recovery, the checkpoint interval the measured save cost and fault rate advise
(`decide.checkpoint_advice`) beside the configured one, and every condition. `format_status` is the
pure part: a job body in, the text out.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from rtj_operator import constants


def _dict(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _step_line(progress: Mapping[str, Any]) -> str:
    source = _dict(progress.get("sources")).get("step")
    if progress.get("step") is None:
        if source == "NotReported":
            return "not reported (use the rtj library, or set spec.progress.stepLogPattern)"
        return "no step reported yet"
    parts = [str(progress["step"]) + (" (from the log pattern)" if source == "LogPattern" else "")]
    current = progress.get("currentStep")
    if current is not None and current != progress["step"]:
        parts[0] += f" (now at {current}: redoing the steps since the checkpoint it resumed from)"
    if progress.get("stepTimeSeconds") is not None:
        parts.append(f"{progress['stepTimeSeconds']} s/step")
    if progress.get("goodputPercent") is not None:
        parts.append(f"goodput {progress['goodputPercent']}%")
    if progress.get("lastAdvanceTime"):
        parts.append(f"last advanced {progress['lastAdvanceTime']}")
    return ", ".join(parts)


def _checkpoint_line(checkpoint: Mapping[str, Any], configured: object) -> str:
    newest = f"step {checkpoint['step']} at {checkpoint.get('time', '?')}" if checkpoint else "none yet"
    return f"{newest}; configured every {configured} steps"


def _advice_line(advice: Mapping[str, Any]) -> str:
    if not advice:
        return "none yet (no progress reported)"
    measured = []
    if advice.get("saveCostSeconds") is not None:
        measured.append(f"save blocks {advice['saveCostSeconds']} s")
    if advice.get("meanTimeBetweenFaultsSeconds") is not None:
        measured.append(
            f"mean time between faults {advice['meanTimeBetweenFaultsSeconds']} s "
            f"({advice.get('faults') or 0} faults)"
        )
    basis = f" [{'; '.join(measured)}]" if measured else ""
    if advice.get("recommendedIntervalSeconds") is None:
        return f"{advice.get('message') or 'none'}{basis}"
    steps = advice.get("recommendedIntervalSteps")
    every = (
        f"every {steps} steps ({advice['recommendedIntervalSeconds']} s)"
        if steps
        else (f"every {advice['recommendedIntervalSeconds']} s")
    )
    return f"{every} by Young/Daly, configured {advice.get('configuredIntervalSteps')}{basis}"


def _recovery_line(recovery: Mapping[str, Any]) -> str:
    if not recovery:
        return "none"
    text = f"{recovery.get('reason') or 'fault'} at {recovery.get('faultTime') or '?'}"
    text += f", training resumed at {recovery.get('resumeTime') or '?'}"
    if recovery.get("durationSeconds") is not None:
        text += f" after {recovery['durationSeconds']} s"
    if recovery.get("step") is not None:
        text += f" (step {recovery['step']})"
    return text


def _conditions_table(conditions: list[Mapping[str, Any]]) -> list[str]:
    rows = [("TYPE", "STATUS", "REASON", "SINCE", "MESSAGE")]
    rows += [
        (
            str(c.get("type", "")),
            str(c.get("status", "")),
            str(c.get("reason", "")),
            str(c.get("lastTransitionTime", "")),
            str(c.get("message", "")),
        )
        for c in conditions
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return ["  " + "  ".join([*(row[i].ljust(widths[i]) for i in range(4)), row[4]]) for row in rows]


def _work_lines(progress: Mapping[str, Any]) -> list[str]:
    """`Trained on:` with the samples and tokens (and their rates) the script reports; none without."""
    parts = [
        f"{progress[total]} {total}" + (f" ({progress[rate]}/s)" if progress.get(rate) is not None else "")
        for total, rate in (("samples", "samplesPerSecond"), ("tokens", "tokensPerSecond"))
        if progress.get(total) is not None
    ]
    return [f"Trained on:     {', '.join(parts)}"] if parts else []


def format_status(job: Mapping[str, Any]) -> str:
    """The job's status as `rtj status` prints it."""
    metadata, spec, status = (_dict(job.get(k)) for k in ("metadata", "spec", "status"))
    workers, restarts = _dict(status.get("workers")), _dict(status.get("restarts"))
    configured = _dict(spec.get("checkpoint")).get("intervalSteps", 100)
    lines = [
        f"Name:           {metadata.get('namespace', '')}/{metadata.get('name', '')}",
        f"State:          {status.get('state', 'Pending')}",
        f"Workers:        {workers.get('readyText', '0/?')} ready, "
        f"{workers.get('readySpares', 0)} spares ready",
        f"Step:           {_step_line(_dict(status.get('progress')))}",
        *_work_lines(_dict(status.get("progress"))),
        f"Checkpoint:     {_checkpoint_line(_dict(status.get('lastCheckpoint')), configured)}",
        f"Advised:        {_advice_line(_dict(status.get('checkpointAdvice')))}",
        f"Restarts:       in-process {restarts.get('inProcess', 0)}, in-job {restarts.get('inJob', 0)}, "
        f"pod replacements {restarts.get('podReplacement', 0)}",
        f"Last recovery:  {_recovery_line(_dict(status.get('lastRecovery')))}",
        "Conditions:",
        *_conditions_table([_dict(c) for c in status.get("conditions") or []]),
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rtj status", description="Print a ResilientTrainingJob's status.")
    parser.add_argument("name", help="the job's name")
    parser.add_argument("-n", "--namespace", help="the job's namespace (default: the kubeconfig context's)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    return parser


def _context_namespace(kubeconfig: str | None) -> str:
    """The namespace of the kubeconfig's current context, else `default`."""
    import kubernetes

    config: Any = kubernetes.config  # the loaders are untyped
    try:
        _, active = config.list_kube_config_contexts(config_file=kubeconfig)
    except (config.ConfigException, OSError):
        return "default"
    return str(_dict(_dict(active).get("context")).get("namespace") or "default")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    from rtj_operator.runtime import kube

    namespace = args.namespace or _context_namespace(args.kubeconfig)
    job = kube.Kube.from_kubeconfig(args.kubeconfig).get_job(namespace, args.name)
    if job is None:
        print(f"rtj status: {constants.KIND} {namespace}/{args.name} not found", file=sys.stderr)
        return 1
    print(format_status(job))
    return 0
