"""`rtj bench goodput` and `rtj bench checkpoint`: the project's claims, measured side by side in one run.

`goodput` runs the same job with the same faults under each recovery mode, one after the other on
one local cluster with one operator (`rehearsal.Stack`), and compares seconds per fault and goodput:

- `plain-restart`: what Kubernetes alone gives: in-process restart off, ft_launcher allowed no
  restarts, so any fault fails a pod and the operator restarts the whole job from the last checkpoint;
- `ft-launcher`: in-process off; ft_launcher restarts the workers of every pod (in-job restart);
- `in-process+ft`: every layer on (the default); with `Async` and with `Sync` checkpoints.

Every mode is a real run on the local cluster (pods as processes, the operator replacing lost
nodes); nothing is replayed or modelled. `checkpoint` is `ckptbench`. Results go to
`bench/results/` as JSON, with a plot.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rtj_demo import ckptbench, processes
from rtj_demo.plot import plot_runs
from rtj_demo.rehearsal import (
    REPO_ROOT,
    JobResult,
    JobSettings,
    MissingComponentError,
    PlannedFault,
    Stack,
    mid_interval,
    run_job,
)
from rtj_demo.report import RunReport


@dataclass(frozen=True)
class Mode:
    name: str
    in_process: bool
    max_in_job_restarts: int
    checkpoint_mode: str = "Async"

    @property
    def label(self) -> str:
        return f"{self.name} ({self.checkpoint_mode.lower()})"


MODES = {
    "plain-restart": Mode("plain-restart", in_process=False, max_in_job_restarts=0),
    "ft-launcher": Mode("ft-launcher", in_process=False, max_in_job_restarts=20),
    "in-process+ft": Mode("in-process+ft", in_process=True, max_in_job_restarts=20),
    "in-process+ft-sync": Mode(
        "in-process+ft", in_process=True, max_in_job_restarts=20, checkpoint_mode="Sync"
    ),
}
DEFAULT_MODES = ("plain-restart", "ft-launcher", "in-process+ft", "in-process+ft-sync")


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


def _results_dir() -> Path:
    return REPO_ROOT / "bench" / "results"


def goodput_table(rows: list[tuple[Mode, JobResult, RunReport | None]]) -> str:
    kinds = [f.kind for f in rows[0][2].faults] if rows and rows[0][2] else []
    header = (
        f"{'mode':<28}" + "".join(f"{k:>11}" for k in kinds) + f"{'s/fault':>9}{'goodput':>9}{'wall s':>8}"
    )
    lines = [header, "-" * len(header)]
    for mode, result, report in rows:
        if report is None:
            lines.append(f"{mode.label:<28} no steps recorded ({result.state}: {result.message})")
            continue
        cells = []
        for fault in report.faults:
            cells.append("-" if fault.recovery_seconds is None else f"{fault.recovery_seconds:.1f}")
        recovered = [f.recovery_seconds for f in report.faults if f.recovery_seconds is not None]
        mean = sum(recovered) / len(recovered) if recovered else float("nan")
        lines.append(
            f"{mode.label:<28}"
            + "".join(f"{c:>11}" for c in cells)
            + f"{mean:>9.1f}{report.training_goodput:>9.1%}{report.wall_seconds:>8.0f}"
        )
        layers = ", ".join(f"{f.kind}: {f.recovered_by or 'none'}" for f in report.faults)
        lines.append(f"{'':<28}  recovered by: {layers}")
    return "\n".join(lines)


def goodput_main(argv: list[str]) -> int:
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
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run before giving up")
    parser.add_argument("--out", type=Path, default=None, help="results dir (default bench/results)")
    parser.add_argument("--plot", type=Path, default=None, help="also copy the plot here (e.g. docs/img/)")
    args = parser.parse_args(argv)
    out = args.out or _results_dir()
    plan = goodput_plan(args.steps)
    modes = [MODES[m] for m in args.modes]
    run_id = processes.tag_environment()
    stamp = time.strftime("%Y%m%dT%H%M%S")
    rows: list[tuple[Mode, JobResult, RunReport | None]] = []
    print(
        f"rtj bench goodput: {args.steps} steps per run; faults: "
        + ", ".join(f"{f.kind}@{f.step}" for f in plan)
    )
    try:
        # Every node loss kills a node for good: give each run its own replacement node.
        # The operator's log goes under out/ (ignored by git), the figures to `out`.
        logs = REPO_ROOT / "out" / "bench" / f"goodput-{stamp}"
        with Stack(nodes=2 + len(modes) + 1, out_dir=logs) as stack:
            for i, mode in enumerate(modes):
                settings = JobSettings(
                    name=f"bench-{i}",
                    steps=args.steps,
                    checkpoint_interval=checkpoint_interval(args.steps),
                    checkpoint_mode=mode.checkpoint_mode,
                    in_process=mode.in_process,
                    max_in_job_restarts=mode.max_in_job_restarts,
                    plan=plan,
                    extra_args=["--step-sleep", str(args.step_sleep)],
                )
                print(f"- {mode.label}: running", flush=True)
                result = run_job(stack, settings, timeout=args.timeout, on_note=lambda t: print("  " + t))
                stack.delete_job(settings.name)
                report = result.timeline.report() if result.timeline.steps else None
                rows.append((mode, result, report))
                if report is not None:
                    print(
                        f"  {result.state}: goodput {report.training_goodput:.1%}, "
                        f"wall {report.wall_seconds:.0f} s"
                    )
                else:
                    print(f"  {result.state}: {result.message}")
    except MissingComponentError as err:
        print(f"rtj bench goodput: cannot run: {err}", file=sys.stderr)
        return 2
    finally:
        leftovers = processes.reap(run_id)
        if leftovers:
            print(
                f"killed {len(leftovers)} leftover process(es): {processes.describe(leftovers)}",
                file=sys.stderr,
            )
    table = goodput_table(rows)
    print()
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "benchmark": "goodput",
        "time": stamp,
        "steps": args.steps,
        "step_sleep": args.step_sleep,
        "plan": [{"kind": f.kind, "step": f.step, "rank": f.rank} for f in plan],
        "runs": [
            {
                "mode": mode.name,
                "checkpoint_mode": mode.checkpoint_mode,
                "in_process": mode.in_process,
                "max_in_job_restarts": mode.max_in_job_restarts,
                "state": result.state,
                "message": result.message,
                "restarts": result.status.get("restarts"),
                "report": report.to_json() if report else None,
                "timeline": result.timeline.to_json(),
            }
            for mode, result, report in rows
        ],
        "table": table,
    }
    json_path = out / f"goodput-{stamp}.json"
    json_path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    plotted = [(m.label, r.timeline, rep) for m, r, rep in rows if r.timeline.steps]
    written = [json_path]
    if plotted:
        title = f"same job, same {len(plan)} faults, per recovery mode"
        png = plot_runs(plotted, out / f"goodput-{stamp}.png", title=title)
        written.append(png)
        if args.plot:
            # A smaller copy for the docs.
            written.append(plot_runs(plotted, args.plot, title=title, dpi=72))
    print("\nwritten: " + ", ".join(str(p) for p in written))
    return 0 if all(r.finished for _, r, _ in rows) else 1


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


def main(argv: list[str]) -> int:
    if not argv or argv[0] in {"-h", "--help"}:
        print("usage: rtj bench goodput|checkpoint [options]   (--help after the name for options)")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "goodput":
        return goodput_main(rest)
    if name == "checkpoint":
        return checkpoint_main(rest)
    print(f"rtj bench: unknown benchmark {name!r} (goodput, checkpoint)", file=sys.stderr)
    return 2
