"""`rtj operator` / `rtj-operator`: run the operator (kopf) with the project's settings.

`main(argv)` parses the command line and runs kopf until interrupted. `EmbeddedOperator` runs the same
operator in a background thread with a stop flag, for the tests and the benchmark (and for anyone
embedding the operator in a larger program). The kopf wiring, the work queue and the passes live in
`rtj_operator.runtime`.

One replica: peering is off (standalone). Two operators serving the same jobs would not corrupt
them (status writes are optimistic and creates idempotent) but would double the API traffic.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any

import kopf

from rtj_operator import nodehealth
from rtj_operator.fsx_policy import AllowListError, FsxAllowList
from rtj_operator.runtime import handlers, kube, passes
from rtj_operator.runtime.context import OperatorContext

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rtj operator", description="Run the ResilientTrainingJob operator (one replica)."
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace", "-n", action="append", default=[], help="serve this namespace (repeatable)"
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="serve every namespace (default)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    parser.add_argument(
        "--liveness", metavar="URL", help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    parser.add_argument("--metrics-port", type=int, metavar="N", help="serve Prometheus metrics on this port")
    parser.add_argument(
        "--allow-fsx",
        action="append",
        default=[],
        metavar="NAMESPACE=FILESYSTEM",
        help="let jobs in NAMESPACE (* for all) mount these FSx file systems (ids, DNS names or *, "
        "comma-separated; repeatable). Default: none, so fsxStatic jobs are Blocked",
    )
    parser.add_argument(
        "--log-format", choices=["text", "json"], default="text", help="log format (default text)"
    )
    parser.add_argument(
        "--node-health",
        metavar="JSON",
        type=_node_health,
        default=nodehealth.NodeHealth(),
        help="node health signals beyond Ready, a JSON object (the chart's nodeHealth values; "
        "omitted keys keep their defaults; docs/operations.md, 'Node health signals')",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    return parser


def _node_health(text: str) -> nodehealth.NodeHealth:
    try:
        return nodehealth.parse_node_health(text)
    except nodehealth.NodeHealthError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def make_registry() -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    return registry


async def run_operator(
    ctx: OperatorContext,
    *,
    namespaces: Sequence[str] = (),
    liveness: str | None = None,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """Run one operator with `ctx` (see `passes.new_context`) until `stop_flag` is set (or forever)."""
    try:
        await kopf.operator(
            registry=make_registry(),
            standalone=True,
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            liveness_endpoint=liveness,
            memo=ctx,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        ctx.queue.stop()
        ctx.kube.close()


class EmbeddedOperator:
    """The operator in a background thread: `start()` waits until it serves, `stop()` until it ends."""

    def __init__(
        self,
        kubeconfig: str,
        *,
        namespaces: Sequence[str] = (),
        metrics_port: int | None = None,
        node_health: nodehealth.NodeHealth | None = None,
        fsx_allowed: FsxAllowList | None = None,
    ):
        self.kubeconfig, self.namespaces, self.metrics_port = kubeconfig, tuple(namespaces), metrics_port
        self.node_health = node_health or nodehealth.NodeHealth()
        self.fsx_allowed = fsx_allowed or FsxAllowList()
        self.context: OperatorContext | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self, timeout: float = 120.0) -> EmbeddedOperator:
        self._thread = threading.Thread(target=self._main, name="rtj-operator", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise RuntimeError(f"the operator did not become ready within {timeout}s: {self.error!r}")
        return self

    def _main(self) -> None:
        try:
            client = kube.Kube.from_kubeconfig(self.kubeconfig)
            self.context = passes.new_context(
                client,
                metrics_port=self.metrics_port,
                node_health=self.node_health,
                fsx_allowed=self.fsx_allowed,
            )
            asyncio.run(
                run_operator(
                    self.context, namespaces=self.namespaces, stop_flag=self._stop, ready_flag=self._ready
                )
            )
        except BaseException as error:  # surfaced to the test through start()/stop()
            self.error = error
            self._ready.set()

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError(f"the operator did not stop within {timeout}s")
        if self.error is not None:
            raise RuntimeError(f"the operator failed: {self.error!r}") from self.error

    def __enter__(self) -> EmbeddedOperator:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        fsx_allowed = FsxAllowList.parse(args.allow_fsx)
    except AllowListError as error:
        parser.error(str(error))
    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.FULL,
    )
    if not args.verbose:
        # kopf logs every handler run per object at INFO ("Timer ... succeeded"): one line per job per
        # timer tick. The operator's own decisions are Events; keep kopf's per-object warnings only.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    try:
        ctx = passes.new_context(
            kube.Kube.from_kubeconfig(args.kubeconfig),
            metrics_port=args.metrics_port,
            node_health=args.node_health,
            fsx_allowed=fsx_allowed,
        )
        asyncio.run(run_operator(ctx, namespaces=args.namespace, liveness=args.liveness))
    except KeyboardInterrupt:
        return 0
    return 0
