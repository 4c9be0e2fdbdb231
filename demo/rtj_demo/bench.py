"""`rtj bench goodput` and `rtj bench checkpoint`: the project's claims, measured side by side in one run.

`goodput` runs the same job with the same faults under each recovery mode, one after the other on
one local cluster (`rehearsal.Stack`), and compares seconds per fault, steps lost and goodput:

- `full`: every layer the project has, as the goodput targets assume: the `Supervisor` launcher (one
  fixed in-process world, two hot spare nodes whose ranks take over a lost rank, the world's stores
  in a store pod), in-process restart, a memory copy of the state every step, async checkpoints;
- `kubernetes-only`: no operator at all: the same training as a hand-rolled batch/v1 Indexed Job
  (`indexedjob`), every fault recovered by Kubernetes' Job controller, a lost node by the cloud node
  lifecycle controller and pod GC;
- `plain-restart`: in-process restart off, ft_launcher allowed no restarts, so any fault fails a pod
  and the operator restarts the whole job from the last checkpoint;
- `ft-launcher`: in-process off; ft_launcher restarts the workers of every pod (in-job restart);
- `in-process+ft`: in-process restart and ft_launcher (the defaults); with `Async` and with `Sync`
  checkpoints;
- `ft-launcher-standby`: NVRx's supported path, no in-process layer: ft_launcher with its rendezvous
  in a store pod and a hot spare standing by in it (`rendezvous.spares: Standby`), which takes a lost
  node's place in the next round. It needs NVRx 0.7 or later in the pods (run with
  `PYTHONPATH=.venv/nvrx-0.7.0`), so it is not among the default modes; its node loss takes the
  node of a pod that trains at the time (which pods train is the rendezvous' choice).

Every mode is a real run on the local cluster (pods as processes, the real control plane); nothing
is replayed or modelled. Goodput is reported from the first training step and from submission, with
the start-up apart (`report`). `checkpoint` is `ckptbench`. Results go to `bench/results/` as JSON,
with a plot.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rtj_demo import ckptbench, configurations, indexedjob, processes, scalebench, scalephases
from rtj_demo.plot import plot_runs
from rtj_demo.rehearsal import (
    REPO_ROOT,
    JobResult,
    JobSettings,
    MissingComponentError,
    PlannedFault,
    Stack,
    example_nodes,
    mid_interval,
    run_job,
)
from rtj_demo.report import LAYER_JOB_CONTROLLER, LOST_TIME_CAUSES, FaultReport, RunReport

# Who runs a mode's job: the operator (a ResilientTrainingJob) or Kubernetes alone (an Indexed Job).
RUNNER_OPERATOR = "operator"
RUNNER_INDEXED_JOB = "indexed-job"

# The `full` mode's spec is the recommended configuration (`configurations.RECOMMENDED`): an API
# server whose schema lacks one of its fields drops it (the run says which).
FULL_SPEC_PATCH = configurations.RECOMMENDED_SPEC_PATCH


@dataclass(frozen=True)
class Mode:
    name: str
    in_process: bool
    max_in_job_restarts: int
    checkpoint_mode: str = "Async"
    runner: str = RUNNER_OPERATOR
    spec_patch: Mapping[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.checkpoint_mode.lower()})"

    def pods(self, job_nodes: int) -> int:
        """How many pods the mode's job runs at once, each on a node of its own."""
        return configurations.pods(self.spec_patch, job_nodes)

    @property
    def intended(self) -> Mapping[str, str]:
        """The layer each fault class should be recovered by under the mode's launcher."""
        return configurations.of_patch(self.spec_patch).intended


MODES = {
    "full": Mode("full", in_process=True, max_in_job_restarts=20, spec_patch=FULL_SPEC_PATCH),
    "kubernetes-only": Mode(
        "kubernetes-only", in_process=False, max_in_job_restarts=0, runner=RUNNER_INDEXED_JOB
    ),
    "plain-restart": Mode("plain-restart", in_process=False, max_in_job_restarts=0),
    "ft-launcher": Mode("ft-launcher", in_process=False, max_in_job_restarts=20),
    "in-process+ft": Mode("in-process+ft", in_process=True, max_in_job_restarts=20),
    "in-process+ft-sync": Mode(
        "in-process+ft", in_process=True, max_in_job_restarts=20, checkpoint_mode="Sync"
    ),
    "ft-launcher-standby": Mode(
        "ft-launcher-standby",
        in_process=False,
        max_in_job_restarts=20,
        spec_patch=configurations.STANDBY_SPEC_PATCH,
    ),
}
DEFAULT_MODES = (
    "full",
    "kubernetes-only",
    "plain-restart",
    "ft-launcher",
    "in-process+ft",
    "in-process+ft-sync",
)


def checkpoint_interval(steps: int) -> int:
    return max(5, steps // 20)


def goodput_plan(steps: int) -> list[PlannedFault]:
    """Five faults at fixed steps, the same for every mode (AWS injected five into each run)."""
    interval = checkpoint_interval(steps)
    return [
        PlannedFault("exception", mid_interval(steps * 12 // 100, interval), rank=1),
        PlannedFault("sigkill", mid_interval(steps * 30 // 100, interval), rank=2),
        PlannedFault("hang", mid_interval(steps * 48 // 100, interval), rank=3),
        PlannedFault("exception", mid_interval(steps * 66 // 100, interval), rank=2),
        PlannedFault("node-loss", mid_interval(steps * 84 // 100, interval)),
    ]


def cluster_nodes(modes: Sequence[Mode], plan: Sequence[PlannedFault], job_nodes: int) -> int:
    """Nodes for running `modes` one after the other (`configurations.cluster_nodes`)."""
    losses = sum(1 for f in plan if f.kind == "node-loss")
    return configurations.cluster_nodes([m.spec_patch for m in modes], losses, job_nodes)


def run_timeout(mode: Mode, plan: Sequence[PlannedFault], job_nodes: int, base: float) -> float:
    """`base`, plus for Kubernetes alone the longest its back-off and pod GC may add."""
    if mode.runner != RUNNER_INDEXED_JOB:
        return base
    losses = sum(1 for f in plan if f.kind == "node-loss")
    return base + indexedjob.backoff_allowance_seconds(len(plan), job_nodes, losses)


def _results_dir() -> Path:
    return REPO_ROOT / "bench" / "results"


def _match_faults(plan: Sequence[PlannedFault], faults: Sequence[FaultReport]) -> list[FaultReport | None]:
    """The report's fault for each planned fault: the first not yet taken of the same kind, in time
    order (None: it did not fire, or the run ended first)."""
    free = sorted(faults, key=lambda f: f.time)
    matched: list[FaultReport | None] = []
    for planned in plan:
        found = next((f for f in free if f.kind == planned.kind), None)
        if found is not None:
            free.remove(found)
        matched.append(found)
    return matched


def summary_row(
    mode: Mode,
    result: JobResult,
    report: RunReport | None,
    plan: Sequence[PlannedFault],
    fault_free: RunReport | None = None,
) -> dict[str, Any]:
    """One mode's figures side by side: per planned fault the recovery seconds, the layer and the steps
    lost; then seconds per fault, steps lost, goodput from the first step and from submission, the
    start-up, the lost time by cause (`report.lost_time`), and, given the mode's run without faults,
    each goodput relative to that run's (pure: the table and the JSON results are made from it)."""
    row: dict[str, Any] = {"mode": mode.label, "state": result.state, "finished": result.finished}
    if report is None:
        return row | {"message": result.message, "faults": []}
    row["faults"] = [
        {
            "kind": planned.kind,
            "step": planned.step,
            "recovery_seconds": None if fault is None else fault.recovery_seconds,
            "recovered_by": None if fault is None else fault.recovered_by,
            "steps_lost": None if fault is None else fault.steps_lost,
        }
        for planned, fault in zip(plan, _match_faults(plan, report.faults), strict=True)
    ]
    return (
        row
        | {
            "seconds_per_fault": report.seconds_per_fault,
            "steps_lost": report.steps_lost,
            "goodput_from_first_step": report.goodput_from_first_step,
            "goodput_from_submission": report.goodput_from_submission,
            "startup_seconds": report.startup_seconds,
            "useful_seconds": report.useful_seconds,
            "wall_from_first_step_seconds": report.wall_from_first_step_seconds,
            "wall_from_submission_seconds": report.wall_seconds
            if report.startup_seconds is not None
            else None,
            "lost_time": report.lost_time(),
        }
        | _relative_to(report, fault_free)
    )


def _relative_to(report: RunReport, fault_free: RunReport | None) -> dict[str, float | None]:
    """The run's goodput as a share of the same mode's goodput without faults (None without it)."""

    def share(value: float | None, reference: float | None) -> float | None:
        return None if value is None or not reference else value / reference

    first = None if fault_free is None else fault_free.goodput_from_first_step
    submitted = None if fault_free is None else fault_free.goodput_from_submission
    return {
        "fault_free_goodput_from_first_step": first,
        "fault_free_goodput_from_submission": submitted,
        "relative_goodput_from_first_step": share(report.goodput_from_first_step, first),
        "relative_goodput_from_submission": share(report.goodput_from_submission, submitted),
    }


def _fault_cell(fault: Mapping[str, Any]) -> str:
    if fault["recovery_seconds"] is None:
        return "not recovered" if fault["recovered_by"] is None else f"- ({fault['recovered_by']})"
    lost = "?" if fault["steps_lost"] is None else str(fault["steps_lost"])
    return f"{fault['recovery_seconds']:.1f} ({fault['recovered_by'] or 'none'}) {lost} lost"


def _number(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _row_cells(row: Mapping[str, Any]) -> list[str] | None:
    """The cells after the mode's name, or None when the run recorded no step."""
    if "goodput_from_first_step" not in row:
        return None
    return [
        *(_fault_cell(f) for f in row["faults"]),
        _number(row["seconds_per_fault"], ".1f"),
        str(row["steps_lost"]),
        _number(row["goodput_from_first_step"], ".1%"),
        _number(row["goodput_from_submission"], ".1%"),
        _number(row["startup_seconds"], ".1f"),
        _number(row.get("relative_goodput_from_first_step"), ".1%"),
        _number(row.get("relative_goodput_from_submission"), ".1%"),
    ]


FIGURE_COLUMNS = (
    "s/fault",
    "steps lost",
    "goodput from 1st step",
    "goodput from submission",
    "start-up s",
    "vs fault-free from 1st step",
    "vs fault-free from submission",
)


def goodput_table(rows: Sequence[Mapping[str, Any]], plan: Sequence[PlannedFault]) -> str:
    """The summary rows as a plain-text table, one line per mode, for the terminal and the JSON."""
    headers = ["mode", *(f"{f.kind}@{f.step}" for f in plan), *FIGURE_COLUMNS]
    body: list[list[str]] = []
    notes: list[str] = []
    for row in rows:
        cells = _row_cells(row)
        if cells is None:
            notes.append(f"{row['mode']}: no steps recorded ({row['state']}: {row.get('message', '')})")
            continue
        body.append([row["mode"], *cells])
    lines = _aligned([headers, *body])
    lines.append(
        "per fault: seconds from the fault to the next step (the layer that recovered it), steps lost"
    )
    return "\n".join(lines + notes)


def _aligned(lines: Sequence[Sequence[str]]) -> list[str]:
    """Rows of cells as plain-text lines: the first column left-aligned, the others right-aligned,
    a rule under the header (the first row)."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    text = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    ]
    text.insert(1, "-" * len(text[0]))
    return text


def _markdown(headers: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    """A header and rows of cells as a Markdown table."""
    rows = ["| " + " | ".join(line) + " |" for line in [headers, *body]]
    return "\n".join([rows[0], "|" + "---|" * len(headers), *rows[1:]])


def lost_time_table(rows: Sequence[Mapping[str, Any]], *, markdown: bool = False) -> str:
    """Each mode's wall time that was not useful training, by cause, in seconds (the effective
    training time's complement: see `report.lost_time`), as plain text or Markdown."""
    headers = ["mode", *LOST_TIME_CAUSES, "total"]
    body = []
    for row in rows:
        lost = row.get("lost_time")
        if lost is None:
            continue
        total = sum(v for v in lost.values() if v is not None)
        body.append([row["mode"], *(_number(lost[c], ".1f") for c in LOST_TIME_CAUSES), f"{total:.1f}"])
    if markdown:
        return _markdown(headers, body)
    text = _aligned([headers, *body])
    return "\n".join([*text, "lost time by cause, seconds of the wall time from submission"])


def goodput_markdown(rows: Sequence[Mapping[str, Any]], plan: Sequence[PlannedFault]) -> str:
    """The same table in Markdown, for docs/benchmarks.md."""
    headers = ["mode", *(f"{f.kind} @{f.step}" for f in plan), *FIGURE_COLUMNS]
    blank = [""] * (len(headers) - 2)
    body = [
        [row["mode"], *(_row_cells(row) or [f"no steps recorded ({row['state']})", *blank])] for row in rows
    ]
    return _markdown(headers, body)


def _settings(mode: Mode, index: int, steps: int, step_sleep: float, plan: list[PlannedFault]) -> JobSettings:
    if configurations.stands_by(mode.spec_patch):
        # Which pods train is the rendezvous' choice: the node lost is one that trains.
        plan = [replace(f, worker=None) if f.kind == "node-loss" else f for f in plan]
    return JobSettings(
        name=f"bench-{index}",
        steps=steps,
        checkpoint_interval=checkpoint_interval(steps),
        checkpoint_mode=mode.checkpoint_mode,
        in_process=mode.in_process,
        max_in_job_restarts=mode.max_in_job_restarts,
        plan=plan,
        extra_args=["--step-sleep", str(step_sleep)],
        spec_patch=dict(mode.spec_patch),
    )


def _note(text: str) -> None:
    print("  " + text, flush=True)


def run_mode(
    stack: Stack, mode: Mode, settings: JobSettings, *, timeout: float
) -> tuple[JobResult, RunReport | None]:
    """One mode's run on the stack, its job deleted afterwards."""
    if mode.runner == RUNNER_INDEXED_JOB:
        driver = indexedjob.IndexedJob(stack, settings.name)
        result = run_job(stack, settings, timeout=timeout, on_note=_note, driver=driver)
        indexedjob.delete_indexed_job(stack, settings.name)
    else:
        result = run_job(stack, settings, timeout=timeout, on_note=_note)
        stack.delete_job(settings.name)
    report = result.timeline.report(mode.intended) if result.timeline.steps else None
    return result, report


def _run_json(
    mode: Mode,
    result: JobResult,
    report: RunReport | None,
    row: Mapping[str, Any],
    fault_free: tuple[JobResult, RunReport | None] | None = None,
) -> dict[str, Any]:
    recreated = sum(1 for r in result.timeline.recoveries if r.layer == LAYER_JOB_CONTROLLER)
    return {
        "mode": mode.name,
        "label": mode.label,
        "runner": mode.runner,
        "checkpoint_mode": mode.checkpoint_mode,
        "in_process": mode.in_process,
        "max_in_job_restarts": mode.max_in_job_restarts,
        "spec_patch": dict(mode.spec_patch),
        "manifests": result.manifests,
        "state": result.state,
        "message": result.message,
        "restarts": result.status.get("restarts"),
        "pods_recreated_by_job_controller": recreated if mode.runner == RUNNER_INDEXED_JOB else None,
        "status": result.status,
        "summary": dict(row),
        "report": report.to_json() if report else None,
        "timeline": result.timeline.to_json(),
        "fault_free": None if fault_free is None else _fault_free_json(*fault_free),
    }


def _fault_free_json(result: JobResult, report: RunReport | None) -> dict[str, Any]:
    return {
        "state": result.state,
        "message": result.message,
        "report": report.to_json() if report else None,
        "timeline": result.timeline.to_json(),
    }


def _goodput_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rtj bench goodput", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps per run (default 300)")
    parser.add_argument(
        "--step-sleep",
        type=float,
        default=0.15,
        help="seconds each step waits, like a step on an accelerator (default 0.15): runs last long "
        "enough for recoveries to be compared without keeping the CPUs busy",
    )
    parser.add_argument("--modes", nargs="+", choices=sorted(MODES), default=list(DEFAULT_MODES))
    parser.add_argument(
        "--fault-free",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run each mode without faults first, and report its goodput relative to that run "
        "(default on; --no-fault-free halves the time)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=900.0,
        help="seconds per run before giving up (kubernetes-only: plus the Job controller's back-off)",
    )
    parser.add_argument("--out", type=Path, default=None, help="results dir (default bench/results)")
    parser.add_argument("--plot", type=Path, default=None, help="also copy the plot here (e.g. docs/img/)")
    return parser


def goodput_main(argv: list[str]) -> int:
    parser = _goodput_parser()
    args = parser.parse_args(argv)
    out = args.out or _results_dir()
    plan = goodput_plan(args.steps)
    modes = [MODES[m] for m in args.modes]
    standby = any(configurations.stands_by(m.spec_patch) for m in modes)
    if standby and not configurations.standby_capable_nvrx():
        parser.error(
            "ft-launcher-standby needs NVRx 0.7 or later in the pods, which run this interpreter's: run "
            "with PYTHONPATH=.venv/nvrx-0.7.0 (make setup installs it there)"
        )
    job_nodes = example_nodes()
    nodes = cluster_nodes(modes, plan, job_nodes)
    run_id = processes.tag_environment()
    processes.clean_up_on_sigterm()
    stamp = time.strftime("%Y%m%dT%H%M%S")
    runs: list[tuple[Mode, JobResult, RunReport | None]] = []
    fault_free: dict[str, tuple[JobResult, RunReport | None]] = {}
    print(
        f"rtj bench goodput: {args.steps} steps per run; faults: "
        + ", ".join(f"{f.kind}@{f.step}" for f in plan)
        + f"; {nodes} nodes"
    )
    try:
        # The operator's log goes under out/ (ignored by git), the figures to `out`.
        logs = REPO_ROOT / "out" / "bench" / f"goodput-{stamp}"
        with_operator = any(m.runner == RUNNER_OPERATOR for m in modes)
        with Stack(nodes=nodes, out_dir=logs, operator=with_operator) as stack:
            for i, mode in enumerate(modes):
                timeout = run_timeout(mode, plan, job_nodes, args.timeout)
                if args.fault_free:
                    baseline = replace(
                        _settings(mode, i, args.steps, args.step_sleep, []), name=f"bench-{i}-ff"
                    )
                    print(f"- {mode.label}, no faults: running", flush=True)
                    fault_free[mode.label] = _run_and_say(stack, mode, baseline, timeout)
                settings = _settings(mode, i, args.steps, args.step_sleep, plan)
                print(f"- {mode.label}: running", flush=True)
                result, report = _run_and_say(stack, mode, settings, timeout)
                runs.append((mode, result, report))
    except MissingComponentError as err:
        print(f"rtj bench goodput: cannot run: {err}", file=sys.stderr)
        return 2
    finally:
        _reap_and_say(run_id)
    baselines = {label: report for label, (_, report) in fault_free.items()}
    rows = [
        summary_row(mode, result, report, plan, baselines.get(mode.label)) for mode, result, report in runs
    ]
    table, lost = goodput_table(rows, plan), lost_time_table(rows)
    print()
    print(table)
    print()
    print(lost)
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "benchmark": "goodput",
        "time": stamp,
        "steps": args.steps,
        "step_sleep": args.step_sleep,
        "cluster_nodes": nodes,
        **_goodput_results(plan, runs, rows, fault_free),
    }
    json_path = out / f"goodput-{stamp}.json"
    json_path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    plotted = [(m.label, r.timeline, rep) for m, r, rep in runs if r.timeline.steps]
    written = [json_path]
    if plotted:
        title = f"same job, same {len(plan)} faults, per recovery mode"
        png = plot_runs(plotted, out / f"goodput-{stamp}.png", title=title)
        written.append(png)
        if args.plot:
            # A smaller copy for the docs.
            written.append(plot_runs(plotted, args.plot, title=title, dpi=72))
    print("\nwritten: " + ", ".join(str(p) for p in written))
    return 0 if all(r.finished for _, r, _ in runs) else 1


def _goodput_results(
    plan: list[PlannedFault],
    runs: list[tuple[Mode, JobResult, RunReport | None]],
    rows: list[Any],
    fault_free: dict[str, tuple[JobResult, RunReport | None]],
) -> dict[str, Any]:
    """The results file's plan, runs and tables."""
    return {
        "plan": [{"kind": f.kind, "step": f.step, "rank": f.rank} for f in plan],
        "runs": [
            _run_json(m, r, rep, row, fault_free.get(m.label))
            for (m, r, rep), row in zip(runs, rows, strict=True)
        ],
        "table": goodput_table(rows, plan),
        "table_markdown": goodput_markdown(rows, plan),
        "lost_time_table": lost_time_table(rows),
        "lost_time_table_markdown": lost_time_table(rows, markdown=True),
    }


def _reap_and_say(run_id: str) -> None:
    """Kill what the runs left behind, and say so."""
    leftovers = processes.reap(run_id)
    if leftovers:
        print(
            f"killed {len(leftovers)} leftover process(es): {processes.describe(leftovers)}", file=sys.stderr
        )


def _run_and_say(
    stack: Stack, mode: Mode, settings: JobSettings, timeout: float
) -> tuple[JobResult, RunReport | None]:
    """One run of the mode, and a line saying how it went."""
    result, report = run_mode(stack, mode, settings, timeout=timeout)
    if report is not None:
        print(
            f"  {result.state}: goodput {report.goodput_from_first_step:.1%} from the first "
            f"step, {report.training_goodput:.1%} from submission; "
            f"wall {report.wall_seconds:.0f} s"
        )
    else:
        print(f"  {result.state}: {result.message}")
    return result, report


def checkpoint_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="rtj bench checkpoint", description=ckptbench.__doc__.splitlines()[0]
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256], help="state sizes, MiB")
    parser.add_argument("--intervals", type=int, nargs="+", default=[10, 50], help="steps between saves")
    parser.add_argument("--step-seconds", type=float, default=0.05, help="emulated step time (default 0.05)")
    parser.add_argument("--saves", type=int, default=4, help="saves per run (default 4)")
    parser.add_argument("--out", type=Path, default=None, help="results dir (default bench/results)")
    args = parser.parse_args(argv)
    out = args.out or _results_dir()
    settings = {
        "sizes_mb": args.sizes,
        "intervals": args.intervals,
        "step_seconds": args.step_seconds,
        "saves_per_run": args.saves,
    }
    print(f"rtj bench checkpoint: {settings}")
    results = ckptbench.run(
        args.sizes, args.intervals, step_seconds=args.step_seconds, saves_per_run=args.saves
    )
    table = ckptbench.format_table(results)
    print()
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    path = out / f"checkpoint-{stamp}.json"
    data = ckptbench.to_json(results, settings) | {"table": table}
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    print(f"\nwritten: {path}")
    return 0


def scale_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rtj bench scale", description=scalebench.__doc__.splitlines()[0])
    defaults = scalebench.ScaleSettings()
    parser.add_argument("--hollow-nodes", type=int, default=defaults.hollow_nodes, help="hollow nodes (1100)")
    parser.add_argument(
        "--sizes", type=int, nargs="*", default=list(defaults.sizes), help="job sizes, nodes (none: skip)"
    )
    parser.add_argument(
        "--concurrent-jobs", type=int, default=defaults.concurrent_jobs, help="small jobs at once"
    )
    parser.add_argument("--steady-seconds", type=float, default=defaults.steady_seconds)
    parser.add_argument("--idle-seconds", type=float, default=defaults.idle_seconds)
    parser.add_argument("--out", type=Path, default=None, help="results dir (default bench/results)")
    args = parser.parse_args(argv)
    settings = replace(
        defaults,
        hollow_nodes=args.hollow_nodes,
        sizes=tuple(args.sizes),
        concurrent_jobs=args.concurrent_jobs,
        steady_seconds=args.steady_seconds,
        idle_seconds=args.idle_seconds,
    )
    if max(settings.sizes, default=0) > settings.hollow_nodes:
        parser.error(f"--sizes: a job of {max(settings.sizes)} nodes needs as many hollow nodes")
    processes.clean_up_on_sigterm()
    out = args.out or _results_dir()
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    with tempfile.TemporaryDirectory(prefix="rtj-bench-scale-") as state:
        started = time.monotonic()
        try:
            results = scalephases.run_all(settings, Path(state), log=lambda line: print(line, flush=True))
        finally:
            operator_log = Path(state) / "operator.log"
            if operator_log.is_file():
                shutil.copyfile(operator_log, out / f"scale-{stamp}-operator.log")
        results["wall_seconds"] = round(time.monotonic() - started, 1)
    tables = "\n\n".join(
        t
        for t in (
            scalephases.growth_table(results),
            scalephases.loss_table(results),
            scalephases.concurrent_table(results),
        )
        if t
    )
    print(f"\n{tables}")
    path = out / f"scale-{stamp}.json"
    path.write_text(json.dumps(results | {"tables": tables}, indent=2) + "\n", encoding="utf-8")
    scalephases.plot_growth(results, out / f"scale-{stamp}.png")
    print(f"\nwritten: {path} and its plot")
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help"}:
        print("usage: rtj bench goodput|checkpoint|scale [options]   (--help after the name for options)")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "goodput":
        return goodput_main(rest)
    if name == "checkpoint":
        return checkpoint_main(rest)
    if name == "scale":
        return scale_main(rest)
    print(f"rtj bench: unknown benchmark {name!r} (goodput, checkpoint, scale)", file=sys.stderr)
    return 2
