"""Benchmark of the local cluster's API server (run by hand: `.venv/bin/python bench/apiserver_bench.py`).

Starts the API server in a child process (so that the client's work does not share its GIL), stores
1,000 ConfigMaps, then measures over HTTPS with a keep-alive aiohttp client:

- request latency p50/p99 of GET (one object), LIST (all 1,000), CREATE and PATCH (merge patch);
- watch fan-out: 50 concurrent watchers of one namespace while objects are created there; events
  delivered per second (all watchers together) and delivery latency (create sent -> event read).

The figures go to docs/localcluster.md. Numbers depend on the machine and its load: the script
prints the CPU count and load average next to them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp


def serve(state_dir: str) -> None:
    from rtj_localcluster.apiserver import ApiServer

    server = ApiServer(state_dir, watch_history=100_000)
    server.start()
    print(json.dumps({"url": server.url, "ca": str(server.ca_path)}), flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    server.stop()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def summary(name: str, samples: list[float]) -> dict[str, Any]:
    ms = [s * 1000 for s in samples]
    return {
        "op": name,
        "n": len(ms),
        "p50_ms": round(percentile(ms, 0.5), 2),
        "p99_ms": round(percentile(ms, 0.99), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
    }


def configmap(name: str, payload: str = "x" * 200, sent: float | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"bench": "yes"}}
    if sent is not None:
        meta["annotations"] = {"bench/sent": repr(sent)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"payload": payload}}


async def timed(session: aiohttp.ClientSession, method: str, url: str, **kwargs: Any) -> float:
    began = time.perf_counter()
    async with session.request(method, url, **kwargs) as response:
        await response.read()
        if response.status >= 300:
            raise RuntimeError(f"{method} {url}: {response.status}")
    return time.perf_counter() - began


async def latency(session: aiohttp.ClientSession, base: str, objects: int, reps: int) -> list[dict[str, Any]]:
    ns = f"{base}/api/v1/namespaces/default/configmaps"
    began = time.perf_counter()
    for i in range(objects):
        await timed(session, "POST", ns, json=configmap(f"obj-{i:05d}"))
    load_seconds = time.perf_counter() - began
    results = []
    results.append(
        summary("GET", [await timed(session, "GET", f"{ns}/obj-{i % objects:05d}") for i in range(reps)])
    )
    results.append(
        summary(
            f"LIST ({objects} objects)", [await timed(session, "GET", ns) for _ in range(max(reps // 10, 20))]
        )
    )
    results.append(
        summary(
            "LIST (label selector, 0 match)",
            [
                await timed(session, "GET", ns, params={"labelSelector": "bench=no"})
                for _ in range(max(reps // 10, 20))
            ],
        )
    )
    results.append(
        summary(
            "CREATE", [await timed(session, "POST", ns, json=configmap(f"new-{i:05d}")) for i in range(reps)]
        )
    )
    headers = {"Content-Type": "application/merge-patch+json"}
    results.append(
        summary(
            "PATCH (merge)",
            [
                await timed(
                    session,
                    "PATCH",
                    f"{ns}/obj-{i % objects:05d}",
                    data=json.dumps({"data": {"n": str(i)}}),
                    headers=headers,
                )
                for i in range(reps)
            ],
        )
    )
    results.append({"op": f"bulk load of {objects} objects", "seconds": round(load_seconds, 2)})
    return results


async def fanout(session_factory: Any, base: str, watchers: int, events: int) -> dict[str, Any]:
    url = f"{base}/api/v1/namespaces/fanout/configmaps"
    async with session_factory() as setup:
        await timed(setup, "POST", f"{base}/api/v1/namespaces", json={"metadata": {"name": "fanout"}})
        async with setup.get(url) as response:
            rv = (await response.json())["metadata"]["resourceVersion"]
    delays: list[float] = []
    received = 0
    last_receipt = 0.0
    ready = asyncio.Event()
    connected = 0

    async def watch() -> None:
        nonlocal received, last_receipt, connected
        async with (
            session_factory() as session,
            session.get(
                url, params={"watch": "1", "resourceVersion": rv, "timeoutSeconds": "600"}
            ) as response,
        ):
            connected += 1
            if connected == watchers:
                ready.set()
            seen = 0
            async for line in response.content:
                now = time.time()
                event = json.loads(line)
                sent = float(event["object"]["metadata"]["annotations"]["bench/sent"])
                delays.append(now - sent)
                received += 1
                last_receipt = time.perf_counter()
                seen += 1
                if seen == events:
                    return

    tasks = [asyncio.create_task(watch()) for _ in range(watchers)]
    await asyncio.wait_for(ready.wait(), 120)
    await asyncio.sleep(0.5)
    async with session_factory() as writer:
        began = time.perf_counter()
        for i in range(events):
            await timed(
                writer, "POST", url, json=configmap(f"f-{i:05d}", payload="y" * 100, sent=time.time())
            )
        write_seconds = time.perf_counter() - began
    await asyncio.wait_for(asyncio.gather(*tasks), 600)
    elapsed = last_receipt - began
    return {
        "watchers": watchers,
        "objects created": events,
        "events delivered": received,
        "create rate (objects/s)": round(events / write_seconds, 1),
        "delivered events/s (all watchers)": round(received / elapsed, 1),
        "delivery latency p50 ms": round(percentile(delays, 0.5) * 1000, 2),
        "delivery latency p99 ms": round(percentile(delays, 0.99) * 1000, 2),
    }


async def run(url: str, ca: str, args: argparse.Namespace) -> dict[str, Any]:
    context = ssl.create_default_context(cafile=ca)
    headers = {"Authorization": "Bearer bench"}

    def session_factory() -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context, limit=0),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=None),
        )

    async with session_factory() as session:
        requests = await latency(session, url, args.objects, args.reps)
    fan = await fanout(session_factory, url, args.watchers, args.events)
    return {"requests": requests, "watch_fanout": fan}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--objects", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=500)
    parser.add_argument("--watchers", type=int, default=50)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return 0
    with tempfile.TemporaryDirectory() as state:
        child = subprocess.Popen(
            [sys.executable, __file__, "--serve", state],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "localcluster")},
        )
        try:
            assert child.stdout is not None
            info = json.loads(child.stdout.readline())
            results = asyncio.run(run(info["url"], info["ca"], args))
        finally:
            if child.stdin is not None:
                child.stdin.close()
            child.wait(60)
    results["machine"] = {"cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2)}
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
