"""The timeline plot of a fault rehearsal: training steps against wall-clock time, with faults,
checkpoint commits and recoveries marked.

Drawn from the same records `report.build_report` reads (see `timeline.Timeline`), with matplotlib's
Agg backend so it works without a display (CI, ssh). `rtj demo` draws one run; `rtj bench goodput`
draws several runs on one figure to compare recovery modes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from rtj_demo.report import RunReport
from rtj_demo.timeline import Timeline

# One colour per fault class, reused across runs so figures can be compared side by side.
FAULT_COLOURS = {
    "exception": "tab:orange",
    "sigkill": "tab:red",
    "hang": "tab:purple",
    "node-loss": "tab:brown",
}


def _draw_run(ax: Any, timeline: Timeline, report: RunReport | None, origin: float, label: str) -> None:
    steps = sorted(timeline.steps, key=lambda s: s.time)
    ax.plot(
        [s.time - origin for s in steps],
        [s.step for s in steps],
        ".",
        markersize=2.5,
        label=label,
    )
    for ckpt in timeline.checkpoints:
        ax.plot(ckpt.time - origin, ckpt.step, marker="^", color="tab:green", markersize=5, linestyle="none")
    faults = sorted(timeline.faults, key=lambda f: f.time)
    reports = report.faults if report is not None else []
    top = max((s.step for s in steps), default=1)
    for i, fault in enumerate(faults):
        colour = FAULT_COLOURS.get(fault.kind, "tab:gray")
        ax.axvline(fault.time - origin, color=colour, linestyle="--", linewidth=1)
        text = fault.kind
        if i < len(reports) and reports[i].recovery_seconds is not None:
            rep = reports[i]
            layer = rep.recovered_by or "none"
            text += f"\n{layer}: {rep.recovery_seconds:.1f} s\n{rep.steps_lost or 0} steps lost"
        elif i < len(reports):
            text += "\nnot recovered"
        ax.annotate(
            text,
            xy=(fault.time - origin, top * (0.97 - 0.3 * (i % 3))),
            xytext=(4, 0),
            textcoords="offset points",
            fontsize=7,
            color=colour,
            va="top",
        )


def plot_timeline(
    timeline: Timeline, report: RunReport | None, path: Path, *, title: str = "", dpi: int = 110
) -> Path:
    """Write one run's timeline as a PNG at `path` and return the path."""
    return plot_runs([(title or "training", timeline, report)], path, dpi=dpi)


def plot_runs(
    runs: Sequence[tuple[str, Timeline, RunReport | None]], path: Path, *, title: str = "", dpi: int = 110
) -> Path:
    """Write one panel per run (label, timeline, report), sharing the time axis, as a PNG."""
    if not runs:
        raise ValueError("nothing to plot")
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 2.6 * len(runs) + 0.6), sharex=True, squeeze=False)
    try:
        for ax, (label, timeline, report) in zip(axes[:, 0], runs, strict=True):
            origin = timeline.start_time if timeline.start_time is not None else _first_time(timeline)
            _draw_run(ax, timeline, report, origin, label)
            heading = label
            if report is not None:
                heading += f"  (goodput {report.goodput_from_first_step:.0%} from the first step"
                if report.goodput_from_submission is not None:
                    heading += f", {report.goodput_from_submission:.0%} from submission"
                heading += ")"
            ax.set_title(heading, fontsize=9, loc="left")
            ax.set_ylabel("step")
            ax.grid(True, alpha=0.3)
        axes[-1, 0].set_xlabel("wall clock since submission (s)   ^ checkpoint committed   -- fault")
        if title:
            fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
    return path


def _first_time(timeline: Timeline) -> float:
    times = [s.time for s in timeline.steps] + [f.time for f in timeline.faults]
    return min(times) if times else 0.0
