"""Store pod benchmark: world formation and a lost node's reassignment round at 128 to 1,024 ranks.

Run by hand (about two minutes on 2 cores; the figures go to docs/benchmarks.md)::

    .venv/bin/python bench/store_scale.py                    # 128, 256 and 1,024 active ranks
    .venv/bin/python bench/store_scale.py --ranks 1024 --workers 8

The store is the project's: ``python -m rtj_trainer.runtime.store --port P`` (what the ``rtj-store``
entry point runs), a process of its own serving the wrapper's store on P and the process groups' on
P+1. Stand-in ranks, one thread each, live in a few worker processes (``--worker``: a blocking
TCPStore call releases the GIL, so a thread per rank blocks as a process would); each rank has the
two clients a supervisor-mode rank has, NVRx's in-process store client as the project subclasses it
(``rtj_trainer.reference.restart.StoreClient``) on P and a ``torch.distributed.TCPStore`` on P+1. The
world is ``--ranks`` active ranks (8 per node) and one hot spare's node of 8 reserve ranks.

Mirrored, call for call through NVRx's own store methods:

* formation (iteration 0): connect both clients, NVRx's ``initial_barrier`` (``add`` + ``append``;
  the last arrival sets a key every rank ``wait``s on) over the whole world, ``set_initial_rank`` on
  the base store and in the iteration's ``PrefixStore``, one heartbeat; then each active rank joins
  the process group of ``rtj-pg-0`` as NCCL's eager init does it over the store: rank 0 ``set``s the
  group's unique id, every other rank ``get``s it (and rank 0 sets ``WORLD_FORMED_KEY``).
* a lost node: its 8 ranks close their clients. The survivor whose sibling (NVRx's sibling monitor:
  rank + 1) was on that node does what the monitor does: reads every heartbeat (``multi_get``),
  records the interruption and the terminated ranks, enters the iteration barrier on their behalf
  and the termination barrier of their initial ranks. Every survivor waits for the interruption,
  enters the reentrant ``iteration_barrier`` (``append`` + ``get`` of the arrivals), reads the
  terminated ranks, takes its next rank from the project's ``reassign`` (the spare's ranks take the
  lost indices), and forms iteration 1 as above (``rtj-pg-1``).

Not mirrored: the time until the loss is noticed (the heartbeat timeout, a setting, not store load);
the periodic heartbeats during training (a separate phase, ``--heartbeat-seconds``, measures the
store's CPU under them: a set per rank and a sibling's get per 0.5 s); gloo's full-mesh address
exchange (each rank ``get``s every other rank's key: O(N^2), CPU-only runs); the wrapper's monitor
process (its own client per rank: a real rank holds three connections, a stand-in two); torch's
optional store barrier in ``init_process_group`` (``TORCH_DIST_INIT_BARRIER``, off by default).

Reverse lookups: torch's store server resolves the address of every connection it accepts, on its
one event-loop thread, and its clients resolve theirs (both only for log lines). In a cluster the
cluster DNS answers those at once; on a machine whose resolver does not answer (a sandbox) each
lookup waits for the resolver's timeout (5 s by default) and formation takes minutes. By default the
bench therefore runs itself in a user and mount namespace (``unshare -rm``) whose /etc/resolv.conf
names 127.0.0.1, where nothing listens: every lookup fails at once and the store is measured, not the
resolver. ``--resolver system`` measures with the machine's resolver as it is.

Prints a table and writes JSON to bench/results/store-scale-<time>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
NPROC = 8
TIMEOUT = dt.timedelta(seconds=120)
GROUP_ID_KEY = "default_pg/nccl_unique_id"
HEARTBEAT_INTERVAL = 0.5


# -- worker side: stand-in ranks ------------------------------------------------------------------


def layer_module(name: str) -> Any:
    """A module of NVRx's in-process layer, through the one module of the project that imports it."""
    from rtj_trainer.library.nvrx_inprocess import layer_module as of_the_layer

    return of_the_layer(name)


class StandInRank:
    """One rank's store traffic: its two clients and NVRx's calls of formation and reassignment."""

    def __init__(self, initial: int, port: int, world: int, active: int) -> None:
        self.initial = self.rank = initial
        self.port = port
        self.initial_world = self.world = world
        self.active = active
        self.iteration = 0
        self.base: Any = None
        self.groups: Any = None

    def connect(self) -> None:
        import torch.distributed as dist
        from rtj_trainer.reference.restart import StoreClient

        self.base = StoreClient(
            host_name="127.0.0.1", port=self.port, timeout=TIMEOUT, wait_for_workers=False
        )
        self.groups = dist.TCPStore(  # type: ignore[attr-defined]
            host_name="127.0.0.1",
            port=self.port + 1,
            is_master=False,
            wait_for_workers=False,
            timeout=TIMEOUT,
        )

    def close(self) -> None:
        self.base = self.groups = None  # the clients' sockets close with them

    def form(self) -> dict[str, Any]:
        """Iteration 0: connect, the initial barrier, the first iteration."""
        self.connect()
        self.base.initial_barrier(ranks=[self.rank], rendezvous_count=self.world, timeout=TIMEOUT)
        self.base.set_initial_rank(self.rank, self.initial)
        return self.start_iteration()

    def start_iteration(self) -> dict[str, Any]:
        store = layer_module("store").PrefixStore(self.iteration, self.base)
        store.set_initial_rank(self.rank, self.initial)
        store.send_heartbeat(self.rank)
        group_id = self.join_group() if self.rank < self.active else None
        return {
            "initial": self.initial,
            "rank": self.rank,
            "world": self.world,
            "iteration": self.iteration,
            "group_id": group_id,
            "done": time.time(),
        }

    def join_group(self) -> str:
        """The store's part of an eager NCCL ``init_process_group``: rank 0 publishes the unique id."""
        import torch.distributed as dist
        from rtj_trainer import WORLD_FORMED_KEY

        groups = dist.PrefixStore(f"rtj-pg-{self.iteration}", self.groups)  # type: ignore[attr-defined]
        if self.rank == 0:
            groups.set(GROUP_ID_KEY, f"iteration={self.iteration} ranks={self.active} by={self.initial}")
            if self.iteration == 0:
                self.groups.set(WORLD_FORMED_KEY, str(time.time()))
        return bytes(groups.get(GROUP_ID_KEY)).decode()

    def detect(self, lost: Sequence[int]) -> None:
        """NVRx's sibling monitor on finding its sibling silent: what it writes for the lost ranks."""
        attribution = layer_module("attribution")
        Interruption, InterruptionRecord = attribution.Interruption, attribution.InterruptionRecord  # noqa: N806
        store = layer_module("store").PrefixStore(self.iteration, self.base)
        store.get_all_heartbeats(self.world)
        store.record_interrupted([InterruptionRecord(r, Interruption.UNRESPONSIVE) for r in lost])
        store.record_terminated_ranks(lost)
        store.iteration_barrier(ranks=lost, rendezvous_count=self.world, timeout=dt.timedelta(0))
        initial = store.get_initial_ranks(lost)
        self.base.termination_barrier(
            ranks=initial, rendezvous_count=self.initial_world, timeout=dt.timedelta(0)
        )

    def reform(self, lost: Sequence[int]) -> dict[str, Any]:
        """After an interruption: the iteration barrier, the reassignment, the next iteration."""
        from rtj_trainer.reference.interrupt import reassign

        if self.rank == (lost[0] - 1) % self.world:
            self.detect(lost)
        store = layer_module("store").PrefixStore(self.iteration, self.base)
        store.wait_for_interrupted(TIMEOUT)
        store.iteration_barrier(ranks=[self.rank], rendezvous_count=self.world, timeout=TIMEOUT)
        terminated = store.get_terminated_ranks()
        self.rank, self.world = reassign(self.rank, self.world, terminated, self.active)
        self.iteration += 1
        return self.start_iteration()

    def heartbeats(self, until: float) -> int:
        """Training's steady traffic: a heartbeat and a look at the sibling's every interval."""
        store = layer_module("store").PrefixStore(self.iteration, self.base)
        sibling = (self.rank + 1) % self.world
        beats = 0
        while time.time() < until:
            store.send_heartbeat(self.rank)
            store.get_heartbeat(sibling)
            beats += 1
            time.sleep(HEARTBEAT_INTERVAL)
        return beats


class Worker:
    """A worker process's ranks and the commands the driver sends it (one JSON line each)."""

    def __init__(self) -> None:
        self.ranks: dict[int, StandInRank] = {}

    def run_all(self, ranks: Sequence[StandInRank], call: str, *args: Any) -> list[Any]:
        if not ranks:
            return []
        with ThreadPoolExecutor(max_workers=len(ranks)) as pool:
            return list(pool.map(lambda r: getattr(r, call)(*args), ranks))

    def handle(self, cmd: dict[str, Any]) -> Any:
        op = cmd["op"]
        if op == "setup":
            self.ranks = {r: StandInRank(r, cmd["port"], cmd["world"], cmd["active"]) for r in cmd["ranks"]}
            return len(self.ranks)
        if op == "form":
            return self.run_all(list(self.ranks.values()), "form")
        if op == "lose":
            for r in cmd["ranks"]:
                if r in self.ranks:
                    self.ranks.pop(r).close()
            return len(self.ranks)
        if op == "reform":
            return self.run_all(list(self.ranks.values()), "reform", cmd["lost"])
        if op == "heartbeats":
            return sum(self.run_all(list(self.ranks.values()), "heartbeats", cmd["until"]))
        if op == "close":
            for rank in self.ranks.values():
                rank.close()
            self.ranks = {}
            return 0
        raise ValueError(f"unknown command {op!r}")


def worker_main() -> int:
    # NVRx's store reads RANK (its host rank hosts the store: the project's client never does).
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    import rtj_trainer  # noqa: F401 - its warning filters precede torch's import
    from rtj_trainer.reference import restart  # noqa: F401 - NVRx and torch imported before timing

    worker = Worker()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "exit":
            break
        print(json.dumps({"reply": worker.handle(cmd)}), flush=True)
    return 0


# -- driver side ----------------------------------------------------------------------------------


class Workers:
    """The worker processes, started once (each imports torch and NVRx) and reused for every size."""

    def __init__(self, count: int) -> None:
        self.procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=_child_env(),
            )
            for _ in range(count)
        ]
        for proc in self.procs:
            _read(proc.stdout)

    def send(self, cmds: Sequence[dict[str, Any]]) -> list[Any]:
        """One command to each worker at once; their replies, in order."""
        for proc, cmd in zip(self.procs, cmds, strict=True):
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(cmd) + "\n")
            proc.stdin.flush()
        return [_read(proc.stdout)["reply"] for proc in self.procs]

    def broadcast(self, cmd: dict[str, Any]) -> list[Any]:
        return self.send([cmd] * len(self.procs))

    def close(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(BrokenPipeError, OSError):
                assert proc.stdin is not None
                proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
                proc.stdin.close()
        for proc in self.procs:
            proc.wait(timeout=30)


def _read(stream: IO[str] | None) -> dict[str, Any]:
    assert stream is not None
    line = stream.readline()
    if not line:
        raise RuntimeError("a worker process ended early (see its stderr)")
    reply: dict[str, Any] = json.loads(line)
    return reply


def _child_env() -> dict[str, str]:
    paths = [str(REPO / d) for d in ("trainer_image", "contract")]
    existing = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([*paths, *([existing] if existing else [])]),
        "PYTHONWARNINGS": "ignore::FutureWarning",
    }


def _free_port_pair() -> int:
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        if port < 65534:
            return port
    raise RuntimeError("no free pair of ports")


def start_store(port: int) -> subprocess.Popen[bytes]:
    """The project's store pod process (``rtj-store --port P``), once both ports accept."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rtj_trainer.runtime.store", "--port", str(port)],
        env=_child_env(),
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    for p in (port, port + 1):
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", p)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"rtj-store did not serve on {p}")
            time.sleep(0.1)
    return proc


def stop_store(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class StoreProbe:
    """The store process's CPU seconds, resident memory and established connections."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.proc = psutil.Process(pid)

    def cpu(self) -> float:
        times = self.proc.cpu_times()
        return float(times.user + times.system)

    def sample(self) -> dict[str, Any]:
        import psutil

        conns = self.proc.net_connections(kind="tcp")
        established = sum(1 for c in conns if c.status == psutil.CONN_ESTABLISHED)
        return {"rss_mib": round(self.proc.memory_info().rss / 2**20, 1), "connections": established}


def split_nodes(nodes: int, workers: int) -> list[list[int]]:
    """Nodes (whole: a pod's ranks stay together) spread over the workers in contiguous blocks."""
    per, extra = divmod(nodes, workers)
    out, start = [], 0
    for w in range(workers):
        count = per + (1 if w < extra else 0)
        out.append(list(range(start, start + count)))
        start += count
    return out


def _ranks_of(nodes: Sequence[int]) -> list[int]:
    return [n * NPROC + local for n in nodes for local in range(NPROC)]


def _latencies(results: Sequence[dict[str, Any]], started: float) -> dict[str, float]:
    seconds = sorted(r["done"] - started for r in results)
    quantiles = statistics.quantiles(seconds, n=100, method="inclusive")
    return {
        "total_s": round(seconds[-1], 3),
        "p50_s": round(statistics.median(seconds), 3),
        "p99_s": round(quantiles[98], 3),
    }


def _phase(
    workers: Workers, probe: StoreProbe, cmds: Sequence[dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run one command on every worker at once: every rank's result and the phase's figures."""
    cpu, started = probe.cpu(), time.time()
    results = [r for reply in workers.send(cmds) for r in reply]
    figures = {**_latencies(results, started), "store_cpu_s": round(probe.cpu() - cpu, 3), **probe.sample()}
    return results, figures


def run_scale(
    workers: Workers, active_ranks: int, *, spare_nodes: int = 1, heartbeat_seconds: float = 0.0
) -> dict[str, Any]:
    """Form a world of ``active_ranks`` (+ the spares' reserve ranks) through a fresh store, lose a
    node, re-form; every rank's observations and the figures."""
    if active_ranks % NPROC:
        raise ValueError(f"active ranks must be a multiple of {NPROC}")
    nodes = active_ranks // NPROC + spare_nodes
    blocks = split_nodes(nodes, len(workers.procs))
    port = _free_port_pair()
    store = start_store(port)
    try:
        probe = StoreProbe(store.pid)
        idle = probe.sample()
        world = nodes * NPROC
        setup = {"op": "setup", "port": port, "world": world, "active": active_ranks}
        workers.send([{**setup, "ranks": _ranks_of(block)} for block in blocks])
        formed, formation = _phase(workers, probe, [{"op": "form"}] * len(blocks))
        lost = _ranks_of([active_ranks // NPROC // 2])  # a node in the middle
        workers.broadcast({"op": "lose", "ranks": lost})
        after_loss = probe.sample()
        reformed, reassignment = _phase(workers, probe, [{"op": "reform", "lost": lost}] * len(blocks))
        heartbeat = _heartbeats(workers, probe, heartbeat_seconds)
        workers.broadcast({"op": "close"})
    finally:
        stop_store(store)
    return {
        "active_ranks": active_ranks,
        "reserve_ranks": spare_nodes * NPROC,
        "clients_per_store": world,
        "worker_processes": len(blocks),
        "store_idle": idle,
        "formation": formation,
        "after_loss": after_loss,
        "reassignment": reassignment,
        "heartbeats": heartbeat,
        "lost_ranks": lost,
        "formed": formed,
        "reformed": reformed,
    }


def _heartbeats(workers: Workers, probe: StoreProbe, seconds: float) -> dict[str, Any]:
    if seconds <= 0:
        return {}
    cpu = probe.cpu()
    beats = sum(workers.broadcast({"op": "heartbeats", "until": time.time() + seconds}))
    used = probe.cpu() - cpu
    return {
        "seconds": seconds,
        "ops_per_s": round(2 * beats / seconds),
        "store_cpu_s": round(used, 3),
        "store_cpu_fraction": round(used / seconds, 3),
    }


def summary(run: dict[str, Any]) -> dict[str, Any]:
    """A run without the per-rank records."""
    return {k: v for k, v in run.items() if k not in ("formed", "reformed")}


def _table(runs: Sequence[dict[str, Any]]) -> str:
    head = f"{'ranks':>6} {'form p50':>9} {'p99':>7} {'total':>7} {'cpu s':>6} {'reform':>7} {'cpu s':>6}"
    head += f" {'RSS MiB':>8} {'conns':>6} {'hb cpu':>7}"
    rows = [head]
    for r in runs:
        f, g, beats = r["formation"], r["reassignment"], r["heartbeats"].get("store_cpu_fraction", 0)
        rows.append(
            f"{r['active_ranks']:>6} {f['p50_s']:>9.3f} {f['p99_s']:>7.3f} {f['total_s']:>7.3f}"
            f" {f['store_cpu_s']:>6.2f} {g['total_s']:>7.3f} {g['store_cpu_s']:>6.2f}"
            f" {g['rss_mib']:>8.1f} {f['connections']:>6} {beats:>7.3f}"
        )
    return "\n".join(rows)


def pairing_figures(nodes: int = 128, repeats: int = 20) -> dict[str, Any]:
    """Seconds to compute the memory tier's pairing across zones (``topology.replica_holders``, what
    every rank computes once per world) for ``nodes`` x 8 ranks in three uneven zones (60/40/28 of
    128), shuffled; median of ``repeats``."""
    import random

    from rtj_trainer.reference import topology

    sizes = [nodes * 60 // 128, nodes * 40 // 128]
    domains = ["a"] * sizes[0] + ["b"] * sizes[1] + ["c"] * (nodes - sum(sizes))
    random.Random(0).shuffle(domains)
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        topology.replica_holders(domains, NPROC)
        seconds.append(time.perf_counter() - started)
    return {
        "ranks": nodes * NPROC,
        "zones": [domains.count(z) for z in "abc"],
        "median_s": statistics.median(seconds),
    }


IN_NAMESPACE = "RTJ_BENCH_NO_RESOLVER"


def _namespaces_work() -> bool:
    """Whether this machine lets an unprivileged user make a user and mount namespace."""
    try:
        probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def _in_namespace_without_resolver(argv: Sequence[str]) -> int:
    """This bench again, in a user and mount namespace whose resolver fails every lookup at once."""
    fd, name = tempfile.mkstemp(prefix="rtj-resolv-", suffix=".conf")
    conf = Path(name)
    with os.fdopen(fd, "w") as f:
        f.write("nameserver 127.0.0.1\n")
    script = 'mount --bind "$0" /etc/resolv.conf && shift && exec "$@"'
    command = ["unshare", "-rm", "sh", "-c", script, str(conf), "-", sys.executable, __file__, *argv]
    try:
        return subprocess.run(command, env={**os.environ, IN_NAMESPACE: "1"}, check=False).returncode
    finally:
        conf.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ranks", default="128,256,1024", help="active rank counts, comma-separated")
    parser.add_argument("--workers", type=int, default=8, help="worker processes")
    parser.add_argument("--heartbeat-seconds", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    parser.add_argument("--records", type=Path, help="also write every rank's records here (JSON)")
    parser.add_argument(
        "--resolver", choices=("none", "system"), default="none", help="see the module's docstring"
    )
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main()
    if args.resolver == "none" and not os.environ.get(IN_NAMESPACE) and _namespaces_work():
        return _in_namespace_without_resolver(sys.argv[1:] if argv is None else list(argv))
    started = time.time()
    workers = Workers(args.workers)
    try:
        runs = [
            run_scale(workers, int(n), heartbeat_seconds=args.heartbeat_seconds)
            for n in args.ranks.split(",")
        ]
    finally:
        workers.close()
    result = {
        "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "resolver": args.resolver,
        "wall_s": round(time.time() - started, 1),
        "runs": [summary(r) for r in runs],
        "pairing": pairing_figures(),
    }
    print(_table(runs))
    pairing = result["pairing"]
    print(
        f"pairing across zones {pairing['zones']}, {pairing['ranks']} ranks:"
        f" {pairing['median_s'] * 1e3:.2f} ms"
    )
    if args.records is not None:
        args.records.write_text(json.dumps({**result, "runs": runs}) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"store-scale-{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out} ({result['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
