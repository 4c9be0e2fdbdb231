"""`rtj demo`: rehearse one fault of each class on the embedded local cluster and report what it cost.

It brings up the local cluster (cpu nodes: the job's pods, and one more for each node it loses),
applies the CRD, starts the operator, and runs the example CPU job (real FSDP training on gloo, async
checkpoints on a volume) in the configuration the README recommends (`configurations.RECOMMENDED`:
the Supervisor launcher, two hot spares, a memory copy of the state every step) with five faults: a
Python exception, a SIGKILLed rank, a hung rank, and the loss of worker 1's node and then of worker
0's. Every one should be recovered in-process by the processes that survive it, no step lost.
`--launcher FtLauncher` rehearses the default launcher instead (`configurations.DEFAULT`) with four
faults: in-process restart for the exception and the hang, ft_launcher's in-job restart for the
SIGKILL, the operator's pod replacement for worker 1's node; with `--rendezvous-host StorePod` a
store pod hosts ft_launcher's rendezvous and the node lost is worker 0's.

It shows live progress, then prints and saves the report (`report.json`, `timeline.png`,
`operator.log`, `pods/*.log` in `--out`), cleans up, and exits non-zero unless every fault was
recovered by its intended layer. See `rehearsal` for the machinery and `report` for the figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rtj_demo import configurations, processes
from rtj_demo.live import LiveLine, Snapshot
from rtj_demo.plot import plot_timeline
from rtj_demo.rehearsal import (
    JobResult,
    JobSettings,
    MissingComponentError,
    Observation,
    PlannedFault,
    Stack,
    example_nodes,
    mid_interval,
    run_job,
)
from rtj_demo.report import RunReport, format_table

DEFAULT_STEPS = 300
QUICK_STEPS = 120
# Seconds each step waits, like a step on an accelerator: the planned faults stay apart, and a node
# loss injected when the demo sees its step finds the run far from its end.
DEFAULT_STEP_SLEEP = 0.1


def checkpoint_interval(steps: int) -> int:
    return max(5, steps // 15)


def fault_plan(
    steps: int,
    launcher: str = configurations.SUPERVISOR,
    rendezvous_host: str = configurations.WORKER0,
    spares: str = configurations.HOLD_NODE,
) -> list[PlannedFault]:
    """One fault of each class, spread over the run so each recovery ends before the next fault.

    Ranks 0-1 run on worker 0, ranks 2-3 on worker 1. Under the Supervisor launcher worker 1's node
    is lost, then worker 0's: the world's stores live in a pod of their own, so each is one more
    in-process recovery, the second from the spare that took over the first. Under the default
    launcher worker 0's launcher hosts the rendezvous: losing it is a gang restart, a different
    story, so only worker 1's node is lost, unless a store pod hosts the rendezvous: then it is worker
    0's; with standby spares, which pods train is the rendezvous' choice, so it is the node of a pod
    that trains at the time.
    """
    interval = checkpoint_interval(steps)
    if launcher == configurations.SUPERVISOR:
        return [
            PlannedFault("exception", mid_interval(steps * 12 // 100, interval), rank=1),
            PlannedFault("sigkill", mid_interval(steps * 30 // 100, interval), rank=2),
            PlannedFault("hang", mid_interval(steps * 48 // 100, interval), rank=3),
            PlannedFault("node-loss", mid_interval(steps * 64 // 100, interval), worker=1),
            PlannedFault("node-loss", mid_interval(steps * 80 // 100, interval), worker=0),
        ]
    return [
        PlannedFault("exception", mid_interval(steps * 15 // 100, interval), rank=1),
        PlannedFault("sigkill", mid_interval(steps * 35 // 100, interval), rank=2),
        PlannedFault("hang", mid_interval(steps * 55 // 100, interval), rank=3),
        PlannedFault(
            "node-loss",
            mid_interval(steps * 75 // 100, interval),
            worker=_lost_worker(rendezvous_host, spares),
        ),
    ]


def _lost_worker(rendezvous_host: str, spares: str) -> int | None:
    """The default launcher's lost worker (`PlannedFault.worker`): 1 where worker 0 hosts the
    rendezvous, 0 where a store pod does, and where the spares stand by, whichever pod trains."""
    if rendezvous_host != configurations.STORE_POD:
        return 1
    return None if spares == configurations.STANDBY else 0


def needed_nodes(configuration: configurations.Configuration, plan: list[PlannedFault]) -> int:
    """The nodes the demo's one job needs (`configurations.cluster_nodes`)."""
    losses = sum(1 for f in plan if f.kind == "node-loss")
    return configurations.cluster_nodes([configuration.spec_patch], losses, example_nodes())


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rtj demo",
        description="Rehearse faults on the embedded local cluster and report recovery time and goodput.",
    )
    parser.add_argument("--steps", type=int, default=None, help=f"training steps (default {DEFAULT_STEPS})")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a shortened run for CI: {QUICK_STEPS} steps, still every fault",
    )
    parser.add_argument(
        "--launcher",
        choices=sorted(configurations.BY_LAUNCHER),
        default=configurations.SUPERVISOR,
        help="the job's launcher: Supervisor with two hot spares (default, the recommended "
        "configuration) or FtLauncher (the operator's default launcher)",
    )
    parser.add_argument(
        "--rendezvous-host",
        choices=(configurations.WORKER0, configurations.STORE_POD),
        default=configurations.WORKER0,
        help="FtLauncher: what hosts ft_launcher's rendezvous (spec.rendezvous.host); with StorePod the "
        "node lost is worker 0's (default Worker0)",
    )
    parser.add_argument(
        "--spares",
        choices=(configurations.HOLD_NODE, configurations.STANDBY),
        default=configurations.HOLD_NODE,
        help="FtLauncher with --rendezvous-host StorePod: how its hot spare takes part "
        "(spec.rendezvous.spares); Standby (one spare waiting in the rendezvous) needs NVRx 0.7 or later "
        "in the pods: run with PYTHONPATH=.venv/nvrx-0.7.0 (make setup installs it) (default HoldNode)",
    )
    parser.add_argument(
        "--step-sleep",
        type=float,
        default=DEFAULT_STEP_SLEEP,
        help=f"seconds each step waits, like a step on an accelerator (default {DEFAULT_STEP_SLEEP})",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="after the report, keep the cluster, operator and job up until Ctrl-C",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("out/demo"), help="report directory (default out/demo)"
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="simulated nodes (default: the job's pods, one per node it loses, and one more)",
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="seconds to wait for the job (default: 600, quick: 420)"
    )
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = QUICK_STEPS if args.quick else DEFAULT_STEPS
    if args.timeout is None:
        args.timeout = 420.0 if args.quick else 600.0
    _check_args(parser, args)
    return args


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Stop with a usage error for a combination the demo cannot run; fill in the default node count."""
    if args.steps < 40:
        parser.error("--steps must be at least 40 (the faults need room between them)")
    if args.step_sleep < 0:
        parser.error("--step-sleep must not be negative")
    if args.rendezvous_host != configurations.WORKER0 and args.launcher != configurations.FT_LAUNCHER:
        parser.error("--rendezvous-host applies to --launcher FtLauncher (Supervisor always has a store pod)")
    if args.spares != configurations.HOLD_NODE and args.rendezvous_host != configurations.STORE_POD:
        parser.error("--spares Standby needs --launcher FtLauncher --rendezvous-host StorePod")
    if args.spares == configurations.STANDBY and not configurations.standby_capable_nvrx():
        parser.error(
            "--spares Standby needs NVRx 0.7 or later in the pods, which run this interpreter's: run with "
            "PYTHONPATH=.venv/nvrx-0.7.0 (make setup installs it there)"
        )
    configuration = configurations.chosen(args.launcher, args.rendezvous_host, args.spares)
    needed = needed_nodes(
        configuration, fault_plan(args.steps, args.launcher, args.rendezvous_host, args.spares)
    )
    if args.nodes is None:
        args.nodes = needed
    if args.nodes < needed:
        parser.error(
            f"--nodes must be at least {needed} for the {args.launcher} job "
            "(its pods, one node per node it loses, one spare)"
        )


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
    out: Path,
    result: JobResult,
    report: RunReport | None,
    plan: list[PlannedFault],
    problems: list[str],
    *,
    configuration: configurations.Configuration,
) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"report": out / "report.json"}
    data: dict[str, Any] = {
        "job": result.name,
        "state": result.state,
        "ok": not problems,
        "problems": problems,
        "launcher": configuration.launcher,
        "plan": [_planned_json(f) for f in plan],
        "intended_layers": dict(configuration.intended),
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
            title=f"rtj demo ({configuration.launcher}): {example_nodes()} nodes x 2 ranks, "
            f"{report.final_step} steps, {len(plan)} faults",
        )
    return paths


def _planned_json(fault: PlannedFault) -> dict[str, Any]:
    if fault.kind == "node-loss":
        return {"kind": fault.kind, "step": fault.step, "worker": fault.worker}
    return {"kind": fault.kind, "step": fault.step, "rank": fault.rank}


def job_settings(args: argparse.Namespace, plan: list[PlannedFault]) -> JobSettings:
    """The example job as the demo runs it: the launcher's configuration, the steps and the faults."""
    configuration = configurations.chosen(args.launcher, args.rendezvous_host, args.spares)
    return JobSettings(
        name="demo",
        steps=args.steps,
        checkpoint_interval=checkpoint_interval(args.steps),
        plan=plan,
        extra_args=["--step-sleep", str(args.step_sleep)],
        spec_patch=dict(configuration.spec_patch),
    )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    configuration = configurations.chosen(args.launcher, args.rendezvous_host, args.spares)
    plan = fault_plan(args.steps, args.launcher, args.rendezvous_host, args.spares)
    settings = job_settings(args, plan)
    run_id = processes.tag_environment()
    processes.clean_up_on_sigterm()
    live = LiveLine(interval=10.0)
    started = time.monotonic()
    print(
        f"rtj demo: {args.launcher} launcher, {args.steps} steps, faults: "
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
            report = result.timeline.report(configuration.intended) if result.timeline.steps else None
            problems = summarize(result, report, plan)
            paths = write_outputs(args.out, result, report, plan, problems, configuration=configuration)
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
        write_outputs(args.out, result, report, plan, problems, configuration=configuration)
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
