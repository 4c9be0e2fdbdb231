"""The scenarios of `rtj bench scale` (see ``scalebench``): one job of each size through its node
losses, then many small jobs at once; and the tables of what they measured."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rtj_demo.scalebench import NAMESPACE, ZONES, ScaleRun, ScaleSettings, job_manifest, summary, wait_until
from rtj_demo.scalewatch import PodSeen

Log = Callable[[str], None]
IDLE = 1e9  # a stand-in step's seconds for a job whose step never moves


def brief(values: Mapping[str, Any], *keys: str) -> str:
    return ", ".join(f"{key} {values.get(key)}" for key in keys)


def losses_for(nodes: int) -> list[tuple[str, int | None]]:
    """The losses one size goes through: 1% of its nodes, and at 1,000 nodes 5% and a whole zone
    (None: every node of the first zone)."""
    found: list[tuple[str, int | None]] = [("1%", max(1, nodes // 100))]
    if nodes >= 1000:
        found += [("5%", nodes // 20), ("zone", None)]
    return found


def one_size(run: ScaleRun, nodes: int, log: Log) -> dict[str, Any]:
    assert run.kube is not None
    name = f"size-{nodes}"
    started = time.time()
    run.kube.create(job_manifest(name, nodes, run.settings, spread=True, step_seconds=1.0))
    wait_until(lambda: len(run.workers(name)) == nodes, timeout=600)
    created = max((p.created for p in run.workers(name).values()), default=time.time())
    wait_until(lambda: run.all_running(name, nodes), timeout=900)
    running = max((p.running or time.time() for p in run.workers(name).values()), default=time.time())
    result: dict[str, Any] = {
        "nodes": nodes,
        "apply_to_workers_created_seconds": round(created - started, 2),
        "apply_to_all_running_seconds": round(running - started, 2),
    }
    log(
        f"{nodes} nodes: " + brief(result, "apply_to_workers_created_seconds", "apply_to_all_running_seconds")
    )
    time.sleep(10)  # the first reports reach the status
    window = run.window()
    time.sleep(run.settings.steady_seconds)
    result["steady"] = window.close() | {"status_kib": run.status_kib(name)}
    log(f"  steady: {brief(result['steady'], 'operator_cpu_cores', 'operator_writes_per_minute')}")
    result["losses"] = [lose(run, name, label, count, log) for label, count in losses_for(nodes)]
    result["status_kib_after_losses"] = run.status_kib(name)
    delete_job(run, name)
    return result


def _victims(run: ScaleRun, name: str, count: int | None) -> list[str]:
    """The nodes to lose: `count` nodes of the job's workers other than worker 0's (whose loss the
    default launcher answers with a gang restart: the zone's loss shows that), or every live hollow
    node of the first zone."""
    if count is None:
        return [
            n
            for n in run.cluster.hollow.names
            if run.cluster.hollow.zone_of(n) == ZONES[0] and n not in run.lost
        ]
    workers = run.workers(name)
    spared = {workers["0"].node} if "0" in workers else set()
    running = {p.node for p in workers.values() if p.running is not None}
    return sorted(running - spared - run.lost)[:count]


def lose(run: ScaleRun, name: str, label: str, count: int | None, log: Log) -> dict[str, Any]:
    assert run.recorder is not None
    victims = _victims(run, name, count)
    affected = {index: pod for index, pod in run.workers(name).items() if pod.node in set(victims)}
    window = run.window()
    fault = time.time()
    run.cluster.hollow.lose(victims)
    run.lost |= set(victims)

    def replaced() -> dict[str, PodSeen]:
        now = run.workers(name)
        return {
            i: now[i] for i in affected if i in now and now[i].created > fault and now[i].running is not None
        }

    timeout = (
        run.settings.loss_timeout_seconds if count is not None else run.settings.loss_timeout_seconds / 2
    )
    wait_until(lambda: len(replaced()) == len(affected), timeout=timeout, interval=0.5)
    time.sleep(3)
    result = {"loss": label, "nodes_lost": len(victims), "workers_lost": len(affected)} | loss_timings(
        run, name, affected, fault
    )
    result["window"] = window.close() | {"status_kib": run.status_kib(name)}
    result["job"] = job_conditions(run, name)
    log(f"  lost {label}: {brief(result, 'nodes_lost', 'workers_lost', 'replacements_running')}")
    log(f"    {brief(result, 'fault_to_node_lost', 'node_lost_to_created', 'created_to_running')}")
    return result


def job_conditions(run: ScaleRun, name: str) -> dict[str, Any]:
    """The job's state and its True conditions' reasons, as the operator left them."""
    assert run.kube is not None
    status = (run.kube.get_job(NAMESPACE, name) or {}).get("status") or {}
    true = [
        f"{c.get('type')}: {c.get('reason')}"
        for c in status.get("conditions") or []
        if c.get("status") == "True"
    ]
    return {"state": status.get("state"), "conditions": true, "restarts": status.get("restarts")}


def loss_timings(run: ScaleRun, name: str, affected: dict[str, PodSeen], fault: float) -> dict[str, Any]:
    assert run.recorder is not None
    grace = run.settings.node_loss_grace_seconds
    now = run.workers(name)
    not_ready, node_lost, created, started, reaction = [], [], [], [], []
    for index, old in affected.items():
        unready = run.recorder.not_ready.get(old.node)
        event = run.recorder.node_lost_after(old.node, fault)
        if unready is not None:
            not_ready.append(unready - fault)
        if event is not None:
            node_lost.append(event - fault)
            if unready is not None:
                reaction.append(event - unready - grace)
        new = now.get(index)
        if new is not None and new.created > fault:
            if event is not None:
                created.append(new.created - event)
            if new.running is not None:
                started.append(new.running - new.created)
    return {
        "fault_to_node_not_ready": summary(not_ready),
        "fault_to_node_lost": summary(node_lost),
        "operator_after_grace": summary(reaction),
        "node_lost_to_created": summary(created),
        "created_to_running": summary(started),
        "replacements_created": sum(1 for i in affected if i in now and now[i].created > fault),
        "replacements_running": len(started),
    }


def delete_job(run: ScaleRun, name: str) -> None:
    """The lost nodes come back first (a dead machine's pods stay Terminating until its kubelet or
    someone else ends them), then the job goes with its pods."""
    assert run.kube is not None
    run.cluster.hollow.recover(sorted(run.lost))
    run.lost.clear()
    run.kube.delete("ResilientTrainingJob", NAMESPACE, name)
    wait_until(lambda: not run.workers(name), timeout=600, interval=1.0)
    time.sleep(run.settings.lease_interval_seconds + 5)  # the recovered nodes are Ready again


def concurrent(run: ScaleRun, log: Log) -> dict[str, Any]:
    """Many small jobs applied at once, then left idle: their worlds formed, their step never moves
    (the operator's writes per job and minute then should be none)."""
    assert run.kube is not None
    kube, settings = run.kube, run.settings
    names = [f"burst-{i}" for i in range(settings.concurrent_jobs)]
    applied: dict[str, float] = {}

    def create(name: str) -> None:
        applied[name] = time.time()
        manifest = job_manifest(name, settings.concurrent_nodes, settings, spread=False, step_seconds=IDLE)
        kube.create(manifest)

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(create, names))
    n = settings.concurrent_nodes
    wait_until(lambda: all(len(run.workers(name)) == n for name in names), timeout=900, interval=0.5)
    wait_until(lambda: all(run.all_running(name, n) for name in names), timeout=900, interval=0.5)
    to_created = [
        max(p.created for p in run.workers(name).values()) - applied[name]
        for name in names
        if run.workers(name)
    ]
    to_running = [
        max(p.running or 0.0 for p in run.workers(name).values()) - applied[name]
        for name in names
        if run.all_running(name, n)
    ]
    result: dict[str, Any] = {
        "jobs": len(names),
        "nodes_each": n,
        "apply_to_workers_created": summary(to_created),
        "apply_to_all_running": summary(to_running),
    }
    log(f"{len(names)} x {n}-node jobs: {brief(result, 'apply_to_workers_created', 'apply_to_all_running')}")
    time.sleep(10)
    window = run.window()
    time.sleep(settings.idle_seconds)
    idle = window.close()
    result["idle"] = idle | {
        "operator_writes_per_job_minute": round(idle["operator_writes_per_minute"] / len(names), 2)
    }
    log(f"  idle: {brief(result['idle'], 'operator_writes_per_minute', 'operator_cpu_cores')}")
    return result


def warm_up(run: ScaleRun) -> None:
    """One 1-node job through to Running and deleted: the operator's watches are up before anything
    is timed (a job applied while they start waits for them)."""
    assert run.kube is not None
    run.kube.create(job_manifest("warm-up", 1, run.settings, spread=True, step_seconds=1.0))
    wait_until(lambda: run.all_running("warm-up", 1), timeout=300)
    run.kube.delete("ResilientTrainingJob", NAMESPACE, "warm-up")
    wait_until(lambda: not run.workers("warm-up"), timeout=300)


def run_all(settings: ScaleSettings, state_dir: Path, log: Log = print) -> dict[str, Any]:
    results: dict[str, Any] = {"settings": {**settings.__dict__, "sizes": list(settings.sizes)}}
    with ScaleRun(settings, state_dir) as run:
        results["setup"] = run.set_up(log)
        warm_up(run)
        results["sizes"] = [one_size(run, nodes, log) for nodes in settings.sizes]
        results["concurrent"] = concurrent(run, log)
    return results


def _p(value: Any, key: str = "p50") -> str:
    """One figure of a summary (or a plain number) for a table cell; "-" when not measured."""
    if isinstance(value, dict):
        value = value.get(key)
    return "-" if value is None else f"{value:g}"


def growth_table(results: Mapping[str, Any]) -> str:
    """How each cost grows from the smallest job to the largest, with 1% of its nodes lost."""
    rows = [
        "| nodes | apply to all Running (s) | status (KiB) | operator CPU (cores) | writes/min "
        "| scrape round (s) | API requests/s | fault to NodeLost p50 (s) "
        "| NodeLost to created p50 / max (s) | created to Running p50 (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size in results.get("sizes") or []:
        steady, first = size["steady"], size["losses"][0]
        rows.append(
            f"| {size['nodes']} | {_p(size['apply_to_all_running_seconds'])} | {_p(steady['status_kib'])} "
            f"| {_p(steady['operator_cpu_cores'])} | {_p(steady['operator_writes_per_minute'])} "
            f"| {_p(steady['scrape_round_mean_seconds'])} | {_p(steady['api_requests_per_second'])} "
            f"| {_p(first['fault_to_node_lost'])} | {_p(first['node_lost_to_created'])} / "
            f"{_p(first['node_lost_to_created'], 'max')} | {_p(first['created_to_running'])} |"
        )
    return "\n".join(rows)


def loss_table(results: Mapping[str, Any]) -> str:
    """Every loss of every size: what was lost, how fast it was judged and replaced, what it cost."""
    rows = [
        "| nodes | loss | nodes lost | workers lost | running again | NotReady p50 (s) "
        "| NodeLost p50 / max (s) "
        "| operator after grace p50 (s) | created after NodeLost p50 / max (s) | Events | operator writes "
        "| operator CPU (s) | status (KiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size in results.get("sizes") or []:
        for loss in size["losses"]:
            window = loss["window"]
            rows.append(
                f"| {size['nodes']} | {loss['loss']} | {loss['nodes_lost']} | {loss['workers_lost']} "
                f"| {loss['replacements_running']} | {_p(loss['fault_to_node_not_ready'])} "
                f"| {_p(loss['fault_to_node_lost'])} / {_p(loss['fault_to_node_lost'], 'max')} "
                f"| {_p(loss['operator_after_grace'])} | {_p(loss['node_lost_to_created'])} / "
                f"{_p(loss['node_lost_to_created'], 'max')} | {_p(window['events_written'])} "
                f"| {_p(window['operator_writes'])} | {_p(window['operator_cpu_seconds'])} "
                f"| {_p(window['status_kib'])} |"
            )
    return "\n".join(rows)


def concurrent_table(results: Mapping[str, Any]) -> str:
    found = results.get("concurrent")
    if not found:
        return ""
    idle = found["idle"]
    return "\n".join(
        [
            "| jobs x nodes | apply to workers created p50 / p99 (s) | apply to all Running p50 / p99 (s) "
            "| writes per job per minute, idle | operator CPU (cores), idle | operator RSS (MiB) |",
            "|---|---|---|---|---|---|",
            f"| {found['jobs']} x {found['nodes_each']} | {_p(found['apply_to_workers_created'])} / "
            f"{_p(found['apply_to_workers_created'], 'p99')} | {_p(found['apply_to_all_running'])} / "
            f"{_p(found['apply_to_all_running'], 'p99')} | {_p(idle['operator_writes_per_job_minute'])} "
            f"| {_p(idle['operator_cpu_cores'])} | {_p(idle['operator_rss_mib'])} |",
        ]
    )


def plot_growth(results: Mapping[str, Any], path: Path) -> None:
    """Apply-to-Running, operator CPU and status size against the job's nodes, on log axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = results.get("sizes") or []
    nodes = [s["nodes"] for s in sizes]
    series = {
        "apply to all Running (s)": [s["apply_to_all_running_seconds"] for s in sizes],
        "operator CPU, steady (cores x 100)": [100 * s["steady"]["operator_cpu_cores"] for s in sizes],
        "status (KiB)": [s["steady"]["status_kib"] for s in sizes],
        "NodeLost to replacement created, max (s x 100)": [
            100 * ((s["losses"][0]["node_lost_to_created"] or {}).get("max") or math.nan) for s in sizes
        ],
    }
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for label, values in series.items():
        axes.plot(nodes, values, marker="o", label=label)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("nodes of the job")
    axes.set_title("rtj bench scale: cost against job size (hollow nodes)")
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
