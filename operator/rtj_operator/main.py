"""`rtj operator` / `rtj-operator`: run the operator (kopf) with the project's settings.

`main(argv)` parses the command line and runs the operator until interrupted. `EmbeddedOperator` runs
the same operator in a background thread with a stop flag, for the tests and the benchmark (and for
anyone embedding the operator in a larger program). The kopf wiring, the work queue and the passes
live in `rtj_operator.runtime`.

High availability: with `--leader-elect`, several replicas run and one Lease decides which of them
acts (`runtime.leader`): a standby serves its health endpoint and renews nothing, watches nothing
and handles no job until it acquires the Lease; then it starts kopf. A leader that cannot renew in
time stops and the process exits non-zero (the kubelet restarts it as a standby). Without the flag
the operator runs alone (kopf's peering stays off either way: it pauses, it does not elect).

Whatever the election, `runtime.api_liveness` serves `--liveness` (fails when the API server has not
answered for `--api-stale-seconds`) and exits the process on credentials the API server keeps
refusing (`--api-fatal-failures`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import threading
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf

from rtj_operator import metrics, nodehealth
from rtj_operator.fsx_policy import AllowListError, FsxAllowList
from rtj_operator.runtime import api_liveness, handlers, job_pass, kube, leader, quiet_logs
from rtj_operator.runtime.context import OperatorContext

logger = logging.getLogger(__name__)

Flag = asyncio.Event | threading.Event

# Where a pod finds its own namespace (the service account's mount).
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

# Exit codes of `rtj operator`.
EXIT_STOPPED = 0
EXIT_LOST = 1  # the Lease was lost, or the API server keeps refusing the credentials


@dataclass(frozen=True)
class RuntimeOptions:
    """How the operator guards itself against API faults and shares the work with standbys."""

    timeouts: kube.Timeouts = field(default_factory=kube.Timeouts)
    liveness_settings: api_liveness.LivenessSettings = field(default_factory=api_liveness.LivenessSettings)
    watch_inactivity_seconds: float = 15.0
    election: leader.LeaderElectionSettings | None = None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rtj operator", description="Run the ResilientTrainingJob operator."
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace", "-n", action="append", default=[], help="serve this namespace (repeatable)"
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="serve every namespace (default)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    parser.add_argument("--liveness", metavar="URL", help="health endpoint, e.g. http://0.0.0.0:8080/healthz")
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
    _add_api_fault_arguments(parser)
    _add_election_arguments(parser)
    return parser


def _add_api_fault_arguments(parser: argparse.ArgumentParser) -> None:
    faults = parser.add_argument_group("API faults")
    defaults, liveness_defaults = kube.Timeouts(), api_liveness.LivenessSettings()
    faults.add_argument(
        "--api-read-timeout-seconds",
        type=float,
        default=defaults.read_seconds,
        help=f"read timeout of the operator's own API calls (default {defaults.read_seconds:g})",
    )
    faults.add_argument(
        "--watch-inactivity-seconds",
        type=float,
        default=RuntimeOptions.watch_inactivity_seconds,
        help="a watch silent this long is re-made on a new connection (default %(default)g)",
    )
    faults.add_argument(
        "--api-stale-seconds",
        type=float,
        default=liveness_defaults.stale_after_seconds,
        help="liveness fails when the API server has not answered for this long (default %(default)g)",
    )
    faults.add_argument(
        "--api-fatal-failures",
        type=int,
        default=liveness_defaults.fatal_failures,
        help="exit after this many TLS-verification or 401 failures in a row (default %(default)d)",
    )


def _add_election_arguments(parser: argparse.ArgumentParser) -> None:
    election = parser.add_argument_group("leader election")
    election.add_argument(
        "--leader-elect",
        action="store_true",
        help="run as one of several replicas: only the Lease holder acts",
    )
    election.add_argument(
        "--leader-election-namespace",
        metavar="NS",
        help="namespace of the Lease (default: $POD_NAMESPACE, else the pod's own)",
    )
    election.add_argument(
        "--leader-election-lease",
        default=leader.DEFAULT_LEASE_NAME,
        help="name of the Lease (default %(default)s)",
    )
    election.add_argument(
        "--lease-duration-seconds",
        type=int,
        default=10,
        help="a standby takes over after this (default %(default)d)",
    )
    election.add_argument(
        "--renew-deadline-seconds",
        type=float,
        default=7.0,
        help="the leader stops acting when it could not renew for this long (default %(default)g)",
    )
    election.add_argument(
        "--retry-period-seconds",
        type=float,
        default=2.0,
        help="renew / acquire interval (default %(default)g)",
    )


def options_from(args: argparse.Namespace) -> RuntimeOptions:
    """The runtime options of parsed arguments; ValueError names a bad one."""
    election = None
    if args.leader_elect:
        namespace = args.leader_election_namespace or own_namespace()
        if not namespace:
            raise ValueError("--leader-elect needs --leader-election-namespace outside a pod")
        election = leader.LeaderElectionSettings(
            namespace=namespace,
            name=args.leader_election_lease,
            lease_duration_seconds=args.lease_duration_seconds,
            renew_deadline_seconds=args.renew_deadline_seconds,
            retry_period_seconds=args.retry_period_seconds,
        )
    return RuntimeOptions(
        timeouts=kube.Timeouts(read_seconds=args.api_read_timeout_seconds),
        liveness_settings=api_liveness.LivenessSettings(
            stale_after_seconds=args.api_stale_seconds, fatal_failures=args.api_fatal_failures
        ),
        watch_inactivity_seconds=args.watch_inactivity_seconds,
        election=election,
    )


def own_namespace() -> str | None:
    """$POD_NAMESPACE (the chart sets it), else the service account's namespace file of a pod."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    if IN_CLUSTER_NAMESPACE.exists():
        return IN_CLUSTER_NAMESPACE.read_text(encoding="utf-8").strip() or None
    return None


def _node_health(text: str) -> nodehealth.NodeHealth:
    try:
        return nodehealth.parse_node_health(text)
    except nodehealth.NodeHealthError as error:
        raise argparse.ArgumentTypeError(str(error)) from error


def make_registry() -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    return registry


def build_context(
    kubeconfig: str | None,
    options: RuntimeOptions,
    *,
    metrics_port: int | None = None,
    node_health: nodehealth.NodeHealth | None = None,
    fsx_allowed: FsxAllowList | None = None,
) -> OperatorContext:
    """The operator's state: its client reporting to its liveness record, and the elector when elected."""
    liveness_record = api_liveness.ApiLiveness(options.liveness_settings)
    client = kube.Kube.from_kubeconfig(kubeconfig, timeouts=options.timeouts, outcome=liveness_record)
    ctx = job_pass.new_context(
        client, metrics_port=metrics_port, node_health=node_health, fsx_allowed=fsx_allowed
    )
    ctx.api_liveness = liveness_record
    ctx.watch_inactivity_seconds = options.watch_inactivity_seconds
    if options.election is not None:
        # Its own connection pool: a frozen reconcile connection must not hold up a renewal.
        lease_timeouts = dataclasses.replace(
            options.timeouts,
            connect_seconds=min(options.timeouts.connect_seconds, options.election.call_seconds),
        )
        lease_client = kube.ApiTransport.from_configuration(
            client.configuration, timeouts=lease_timeouts, outcome=liveness_record
        )
        ctx.elector = leader.LeaderElector(lease_client, options.election)
    return ctx


def health_report(ctx: OperatorContext) -> tuple[bool, dict[str, Any]]:
    """The health endpoint's answer: healthy while the API server answers, leader or standby."""
    report = ctx.api_liveness.report()
    if ctx.elector is not None:
        report["leading"] = ctx.elector.holds()
        report["holder"] = ctx.elector.holder()
    return ctx.api_liveness.healthy(), report


def _serve_metrics(ctx: OperatorContext) -> None:
    """Metrics from the start, a standby's too: it is up, and `rtj_operator_leading` says it waits."""
    metrics.follow_leadership(ctx.acting)
    if ctx.metrics_port is not None and metrics.start_server(ctx.metrics_port):
        logger.info("metrics on :%d/metrics", ctx.metrics_port)


def _set(flag: Flag | None) -> None:
    if flag is not None:
        flag.set()


async def _follow(flag: Flag, stop: asyncio.Event) -> None:
    """Set `stop` once the caller's flag (possibly a threading.Event) is set."""
    if isinstance(flag, asyncio.Event):
        await flag.wait()
    while not flag.is_set() and not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.1)
    stop.set()


async def _stop_when_done(work: Awaitable[None], stop: asyncio.Event, failed: list[str], why: str) -> None:
    """Run `work`; if it ends while the operator is still running, record `why` and stop it."""
    await work
    if not stop.is_set():
        failed.append(why)
        stop.set()


async def run_operator(  # noqa: PLR0913 - keyword-only flags, each named by its caller
    ctx: OperatorContext,
    *,
    namespaces: Sequence[str] = (),
    liveness: str | None = None,
    stop_flag: Flag | None = None,
    ready_flag: Flag | None = None,
    leading_flag: Flag | None = None,
) -> int:
    """Run one operator with `ctx` (see `build_context`) until `stop_flag` is set (or forever).

    `ready_flag` is set once it serves (with an elector: once it stands by or leads), `leading_flag`
    once kopf serves the jobs. Returns `EXIT_STOPPED`, or `EXIT_LOST` when it stopped on its own (the
    Lease lost, credentials refused again and again).
    """
    stop = asyncio.Event()
    failed: list[str] = []
    _serve_metrics(ctx)
    health = await api_liveness.serve_health(liveness, lambda: health_report(ctx)) if liveness else None
    background = [
        asyncio.create_task(
            _stop_when_done(
                api_liveness.watch_api(
                    ctx.api_liveness,
                    ctx.kube.ping,
                    stop,
                    drop_connections=ctx.kube.drop_connections,
                    watch_silence_seconds=ctx.watch_inactivity_seconds,
                ),
                stop,
                failed,
                "credentials",
            )
        )
    ]
    if stop_flag is not None:
        background.append(asyncio.create_task(_follow(stop_flag, stop)))
    keeper: asyncio.Task[None] | None = None
    try:
        if ctx.elector is not None:
            _set(ready_flag)
            if not await ctx.elector.acquire(stop):
                return EXIT_LOST if failed else EXIT_STOPPED
            keeper = asyncio.create_task(_stop_when_done(ctx.elector.keep(stop), stop, failed, "lease lost"))
        kopf_ready = asyncio.Event()
        background.append(asyncio.create_task(_forward_ready(kopf_ready, ready_flag, leading_flag)))
        await kopf.operator(
            registry=make_registry(),
            standalone=True,
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            memo=ctx,
            stop_flag=stop,
            ready_flag=kopf_ready,
        )
    finally:
        stop.set()
        if keeper is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(keeper, timeout=5)  # releases the Lease
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        ctx.queue.stop()
        ctx.kube.close()
        if ctx.elector is not None:
            ctx.elector.kube.close()
        if health is not None:
            await health.cleanup()
        await asyncio.sleep(0.2)  # closing TLS connections finish their shutdown before the loop ends
    if failed:
        logger.error("the operator stopped: %s", ", ".join(failed))
        return EXIT_LOST
    return EXIT_STOPPED


async def _forward_ready(
    kopf_ready: asyncio.Event, ready_flag: Flag | None, leading_flag: Flag | None
) -> None:
    await kopf_ready.wait()
    _set(ready_flag)
    _set(leading_flag)


class EmbeddedOperator:
    """The operator in a background thread: `start()` waits until it serves, `stop()` until it ends.

    With `options.election`, `start()` returns once the replica stands by or leads; `leading` is set
    once it serves the jobs as the leader, and `exit_code` says how it ended.
    """

    def __init__(  # noqa: PLR0913 - keyword-only options, each named by its caller
        self,
        kubeconfig: str,
        *,
        namespaces: Sequence[str] = (),
        metrics_port: int | None = None,
        options: RuntimeOptions | None = None,
        liveness: str | None = None,
        node_health: nodehealth.NodeHealth | None = None,
        fsx_allowed: FsxAllowList | None = None,
    ):
        self.kubeconfig, self.namespaces, self.metrics_port = kubeconfig, tuple(namespaces), metrics_port
        self.options, self.liveness = options or RuntimeOptions(), liveness
        self.node_health = node_health or nodehealth.NodeHealth()
        self.fsx_allowed = fsx_allowed or FsxAllowList()
        self.context: OperatorContext | None = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self.leading = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.exit_code: int | None = None

    def start(self, timeout: float = 120.0) -> EmbeddedOperator:
        self._thread = threading.Thread(target=self._main, name="rtj-operator", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise RuntimeError(f"the operator did not become ready within {timeout}s: {self.error!r}")
        return self

    def _main(self) -> None:
        try:
            self.context = build_context(
                self.kubeconfig,
                self.options,
                metrics_port=self.metrics_port,
                node_health=self.node_health,
                fsx_allowed=self.fsx_allowed,
            )
            self.exit_code = asyncio.run(
                run_operator(
                    self.context,
                    namespaces=self.namespaces,
                    liveness=self.liveness,
                    stop_flag=self._stop,
                    ready_flag=self._ready,
                    leading_flag=self.leading,
                )
            )
        except BaseException as error:  # surfaced to the test through start()/stop()
            self.error = error
        finally:
            self._ready.set()  # start() returns once the operator serves or has ended

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

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
        # During an API outage each retry would log a line, some a traceback: one per failure class.
        quiet_logs.install()
        # kopf logs every handler run per object at INFO ("Timer ... succeeded"): one line per job per
        # timer tick. The operator's own decisions are Events; keep kopf's per-object warnings only.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    try:
        options = options_from(args)
    except ValueError as error:
        parser.error(str(error))
    try:
        ctx = build_context(
            args.kubeconfig,
            options,
            metrics_port=args.metrics_port,
            node_health=args.node_health,
            fsx_allowed=fsx_allowed,
        )
        return asyncio.run(run_operator(ctx, namespaces=args.namespace, liveness=args.liveness))
    except KeyboardInterrupt:
        return EXIT_STOPPED
