"""`rtj demo`: rehearse one fault of each class on the embedded local cluster and report what it cost.

It brings up the local cluster (cpu nodes: two for the job, spares for a replacement), applies the
CRD, starts the operator, and runs the example CPU job (real FSDP training on gloo under ft_launcher
and inprocess.Wrapper, async checkpoints on a volume) with four faults: a Python exception and a
hung rank (the in-process layer should recover both: the soft timeout interrupts the hung rank while
its process lives), a SIGKILLed rank (ft_launcher's in-job restart), and a lost node (the operator
replaces the worker). It shows live progress, then prints and saves the report (`report.json`,
`timeline.png`, `operator.log`, `pods/*.log` in `--out`), cleans up, and exits non-zero unless
every fault was recovered by its intended layer. See `rehearsal` for the machinery and `report`
for the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rtj_demo import processes
from rtj_demo.live import LiveLine, Snapshot
from rtj_demo.plot import plot_timeline
from rtj_demo.rehearsal import (
    JobResult,
    JobSettings,
    MissingComponentError,
    Observation,
    PlannedFault,
    Stack,
    mid_interval,
    run_job,
)
from rtj_demo.report import INTENDED_LAYER, RunReport, format_table

DEFAULT_STEPS = 300
QUICK_STEPS = 120


def checkpoint_interval(steps: int) -> int:
    return max(5, steps // 15)


def fault_plan(steps: int) -> list[PlannedFault]:
    """One fault of each class, spread over the run so each recovery ends before the next fault.

    Ranks 0-1 run on worker 0, ranks 2-3 on worker 1; the lost node is worker 1's (worker 0 hosts
    the rendezvous store: losing it is a gang restart, a different story).
    """
    interval = checkpoint_interval(steps)
    return [
        PlannedFault("exception", mid_interval(steps * 15 // 100, interval), rank=1),
        PlannedFault("sigkill", mid_interval(steps * 35 // 100, interval), rank=2),
        PlannedFault("hang", mid_interval(steps * 55 // 100, interval), rank=3),
        PlannedFault("node-loss", mid_interval(steps * 75 // 100, interval)),
    ]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="rtj demo",
        description="Rehearse faults on the embedded local cluster and report recovery time and goodput.",
    )
    parser.add_argument("--steps", type=int, default=None, help=f"training steps (default {DEFAULT_STEPS})")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a shortened run for CI: {QUICK_STEPS} steps, still all four fault classes",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="after the report, keep the cluster, operator and job up until Ctrl-C",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("out/demo"), help="report directory (default out/demo)"
    )
    parser.add_argument("--nodes", type=int, default=4, help="simulated nodes (default 4; the job uses 2)")
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds to wait for the job (default: 600, quick: 420)"
    )
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = QUICK_STEPS if args.quick else DEFAULT_STEPS
    if args.timeout is None:
        args.timeout = 420.0 if args.quick else 600.0
    if args.steps < 40:
        parser.error("--steps must be at least 40 (four faults need room between them)")
    if args.nodes < 3:
        parser.error("--nodes must be at least 3 (two for the job, one to replace a lost node)")
    return args


def summarize(result: JobResult, report: RunReport | None, plan: list[PlannedFault]) -> list[str]:
    """The reasons the rehearsal failed; empty when every fault was recovered by its intended layer."""
    problems: list[str] = []
    if not result.finished:
        problems.append(f"the job ended {result.state}: {result.message}".rstrip(": "))
    if report is None:
        problems.append("no training step was recorded")
        return problems
    fired = sorted(f.kind for f in report.faults)
    planned = sorted(f.kind for f in plan)
    if fired != planned:
        problems.append(f"faults planned {planned}, recorded {fired}")
    for fault in report.faults:
        if not fault.as_intended:
            problems.append(
                f"{fault.kind}: recovered by {fault.recovered_by or 'nothing'}, "
                f"intended {fault.intended_layer}"
            )
    return problems


def write_outputs(
    out: Path, result: JobResult, report: RunReport | None, plan: list[PlannedFault], problems: list[str]
) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"report": out / "report.json"}
    data: dict[str, Any] = {
        "job": result.name,
        "state": result.state,
        "ok": not problems,
        "problems": problems,
        "plan": [{"kind": f.kind, "step": f.step, "rank": f.rank} for f in plan],
        "intended_layers": INTENDED_LAYER,
        "report": report.to_json() if report else None,
        "restarts": result.status.get("restarts"),
        "status": result.status,
        "events": [
            {k: e.get(k) for k in ("reason", "type", "message", "eventTime", "lastTimestamp")}
            for e in result.events
        ],
        "timeline": result.timeline.to_json(),
    }
    paths["report"].write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    if report is not None:
        paths["plot"] = plot_timeline(
            result.timeline,
            report,
            out / "timeline.png",
            title=f"rtj demo: 2 nodes x 2 ranks, {report.final_step} steps, {len(plan)} faults",
        )
    return paths


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    plan = fault_plan(args.steps)
    settings = JobSettings(
        name="demo", steps=args.steps, checkpoint_interval=checkpoint_interval(args.steps), plan=plan
    )
    run_id = processes.tag_environment()
    live = LiveLine(interval=10.0)
    started = time.monotonic()
    print(
        f"rtj demo: {args.steps} steps, faults: "
        + ", ".join(f"{f.kind}@{f.step}" for f in plan)
        + f"; report in {args.out}/"
    )
    result: JobResult | None = None
    report: RunReport | None = None
    problems: list[str] = []
    try:
        with Stack(nodes=args.nodes, out_dir=args.out) as stack:
            live.note(f"local cluster up ({args.nodes} nodes), CRD applied, operator started")

            def update(obs: Observation) -> None:
                live.update(
                    Snapshot(obs.step, args.steps, obs.state, obs.restarts, obs.checkpoint_step, obs.elapsed)
                )

            try:
                result = run_job(stack, settings, timeout=args.timeout, on_update=update, on_note=live.note)
            finally:
                live.close()
            stack.save_pod_logs(settings.name, args.out / "pods")
            report = result.timeline.report() if result.timeline.steps else None
            problems = summarize(result, report, plan)
            paths = write_outputs(args.out, result, report, plan, problems)
            print()
            if report is not None:
                print(format_table(report))
            print("\nwritten: " + ", ".join(str(p) for p in paths.values()))
            if args.keep:
                wait_for_interrupt(stack)
            print("cleaning up: job, operator, cluster", flush=True)
            stack.delete_job(settings.name)
    except MissingComponentError as err:
        live.close()
        print(f"rtj demo: cannot run: {err}", file=sys.stderr)
        return 2
    except (RuntimeError, TimeoutError, OSError) as err:
        live.close()
        print(f"rtj demo: failed: {err}", file=sys.stderr)
        return 1
    finally:
        leftovers = processes.reap(run_id)
        if leftovers:
            problems.append(
                f"{len(leftovers)} process(es) outlived the cleanup and were killed: "
                + processes.describe(leftovers)
            )
    assert result is not None
    if leftovers:
        write_outputs(args.out, result, report, plan, problems)
    print(f"elapsed {time.monotonic() - started:.0f} s; no processes left behind" if not leftovers else "")
    if problems:
        print("rtj demo: FAILED: " + "; ".join(problems), file=sys.stderr)
        return 1
    print("every fault was recovered by its intended layer")
    return 0


def wait_for_interrupt(stack: Stack) -> None:
    """--keep: the cluster lives in this process, so it stays up while the demo waits."""
    print(
        f"\nthe cluster, the operator and the job are kept for inspection:\n"
        f"  export KUBECONFIG={stack.kubeconfig}\n  kubectl get rtj,pods,nodes\n"
        "press Ctrl-C to clean up and exit",
        flush=True,
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print()
