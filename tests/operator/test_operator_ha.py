"""The operator stays available and sighted: a standby takes over from a killed leader during a
node loss, a silently frozen API connection does not blind it, its liveness follows the API
server, credentials the server keeps refusing end the process, and spec changes re-create nothing.

The hand-over and recovery times are printed (run with -s to see them); the only bounds on them
are the generous `wait_for` timeouts (performance belongs in bench/).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from api_proxy import ApiProxy, kubeconfig_via
from operator_cluster import (
    apply,
    event_reasons,
    get,
    install_crd,
    job_manifest,
    job_status,
    new_namespace,
    pods,
    running_pods_on,
    wait_state,
)
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.ports import reserve_port
from rtj_localcluster.testing import kubectl, stop_process, wait_for
from rtj_operator import constants, events
from rtj_operator.main import EXIT_LOST, EmbeddedOperator, RuntimeOptions
from rtj_operator.runtime.api_liveness import LivenessSettings
from rtj_operator.runtime.leader import LeaderElectionSettings
from test_operator_command import fetch

pytestmark = pytest.mark.slow
CPU_CLUSTER = pytest.mark.local_cluster(nodes=3, profile="cpu", node_monitor_grace_seconds=3.0)
LEASE = "rtj-operator-leader"
# The children of a job with dynamic storage other than its pods.
BASE_KINDS = {"Service", "ServiceAccount", "PersistentVolumeClaim"}


@pytest.fixture
def cluster(local_cluster: LocalCluster) -> LocalCluster:
    install_crd(local_cluster.kubeconfig_path)
    return local_cluster


def lease_holder(kubeconfig: Path) -> str:
    lease = get(kubeconfig, "-n", "default", "lease", LEASE)
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def health(port: int) -> int | None:
    """The HTTP status of the operator's health endpoint, None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return None


class Replica:
    """`rtj operator --leader-elect` as a separate process named `name` (its identity's prefix),
    serving `namespace` and electing through a Lease there."""

    def __init__(
        self,
        kubeconfig: Path,
        name: str,
        log: Path,
        *,
        namespace: str = "default",
        extra: tuple[str, ...] = (),
    ) -> None:
        self.name, self.health_port, self.metrics_port = name, reserve_port(), reserve_port()
        self._log = log.open("w")
        self.process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "rtj"),
                "operator",
                "--kubeconfig",
                str(kubeconfig),
                "--namespace",
                namespace,
                "--leader-elect",
                "--leader-election-namespace",
                namespace,
                "--liveness",
                f"http://127.0.0.1:{self.health_port}/healthz",
                "--metrics-port",
                str(self.metrics_port),
                *extra,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "POD_NAME": name},
        )

    def leading(self) -> bool | None:
        """Whether the replica says it leads (its health report), None when it does not answer."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.health_port}/healthz", timeout=5
            ) as response:
                report = json.loads(response.read())
        except urllib.error.HTTPError as error:
            report = json.loads(error.read())
        except OSError:
            return None
        return bool(report.get("leading"))

    def _metric(self, prefix: str) -> float:
        """The sum of this replica's samples whose line starts with `prefix` (0 when none)."""
        text = fetch(f"http://127.0.0.1:{self.metrics_port}/metrics") or ""
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))

    def passes(self) -> float:
        """Reconcile passes this replica ran (0 for a standby: it handles no job)."""
        return self._metric("rtj_reconcile_total{")

    def leading_metric(self) -> float:
        """`rtj_operator_leading` as this replica serves it (a standby serves metrics too)."""
        return self._metric("rtj_operator_leading ")

    def stop(self) -> None:
        stop_process(self.process)
        self._log.close()


@pytest.fixture
def replicas(cluster: LocalCluster, tmp_path: Path) -> Iterator[list[Replica]]:
    started: list[Replica] = []
    yield started
    for replica in started:
        replica.stop()


@CPU_CLUSTER
def test_killed_leader_hands_over_to_the_standby_which_replaces_the_lost_worker(
    cluster: LocalCluster, replicas: list[Replica], tmp_path: Path
) -> None:
    kc = cluster.kubeconfig_path
    replicas.append(Replica(kc, "op-a", tmp_path / "op-a.log"))
    wait_for(lambda: lease_holder(kc).startswith("op-a-"), timeout=120, message="op-a to lead")
    replicas.append(Replica(kc, "op-b", tmp_path / "op-b.log"))
    leader, standby = replicas
    wait_for(lambda: health(standby.health_port) == 200, timeout=120, message="the standby to serve /healthz")
    apply(kc, job_manifest("ha", "default", nodes=2), tmp_path)
    wait_state(kc, "default", "ha", "Running")
    placed = wait_for(lambda: p if len(p := running_pods_on(kc, "default", "ha")) == 2 else None)
    assert leader.passes() > 0
    assert standby.passes() == 0  # the standby watches nothing and handles no job
    assert (leader.leading_metric(), standby.leading_metric()) == (1, 0)
    victim = placed["ha-worker-1"]

    started = time.monotonic()
    cluster.kill_node(victim)
    leader.process.send_signal(signal.SIGKILL)
    wait_for(lambda: lease_holder(kc).startswith("op-b-"), timeout=90, interval=0.2, message="op-b to lead")
    hand_over = time.monotonic() - started
    wait_for(
        lambda: running_pods_on(kc, "default", "ha").get("ha-worker-1") not in (None, victim),
        timeout=120,
        interval=0.3,
        message="worker 1 to run on another node",
    )
    recovered = time.monotonic() - started
    print(f"\nhand-over {hand_over:.1f} s, worker replaced and running {recovered:.1f} s after the kill")

    status = wait_state(kc, "default", "ha", "Running", timeout=90)
    assert status["restarts"]["podReplacement"] == 1  # the loss was handled once
    assert sorted(pods(kc, "default", "ha")) == ["ha-worker-0", "ha-worker-1"]
    assert event_reasons(kc, "default", "ha").count(events.NODE_LOST) == 1
    assert standby.passes() > 0
    assert standby.leading_metric() == 1


@CPU_CLUSTER
def test_silent_stall_and_outage_neither_blind_the_operator_nor_fool_its_liveness(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Every open API connection freezes (new ones pass); a node is lost during that stall and the
    stall is not lifted before the operator has replaced the worker. Then a full outage: liveness
    fails during it and passes again after it."""
    kc = cluster.kubeconfig_path
    port = reserve_port()
    options = RuntimeOptions(
        liveness_settings=LivenessSettings(stale_after_seconds=10.0, ping_interval_seconds=2.0)
    )
    with ApiProxy(cluster.url) as proxy:
        via = kubeconfig_via(kc, proxy, tmp_path / "via-proxy.kubeconfig")
        operator = EmbeddedOperator(
            str(via), namespaces=["default"], options=options, liveness=f"http://127.0.0.1:{port}/healthz"
        )
        with operator:
            apply(kc, job_manifest("stall", "default", nodes=2), tmp_path)
            wait_state(kc, "default", "stall", "Running")
            placed = wait_for(lambda: p if len(p := running_pods_on(kc, "default", "stall")) == 2 else None)
            victim = placed["stall-worker-1"]

            proxy.stall()
            time.sleep(5)  # the watches and pooled connections are frozen by now
            lost = time.monotonic()
            cluster.kill_node(victim)
            wait_for(
                lambda: running_pods_on(kc, "default", "stall").get("stall-worker-1") not in (None, victim),
                # The aim is 30 s; without bounded watches and reads it took about 130 s.
                timeout=75,
                interval=0.3,
                message="worker 1 replaced during the stall",
            )
            recovered = time.monotonic() - lost
            assert job_status(kc, "default", "stall")["restarts"]["podReplacement"] == 1
            proxy.heal()

            proxy.outage()
            outage = time.monotonic()
            wait_for(lambda: health(port) == 503, timeout=90, interval=0.5, message="liveness to fail")
            failed_after = time.monotonic() - outage
            time.sleep(5)
            proxy.heal()
            healed = time.monotonic()
            wait_for(lambda: health(port) == 200, timeout=90, interval=0.5, message="liveness to pass again")
            passed_after = time.monotonic() - healed
            # Still serving: a deleted worker is noticed and re-created through the healed network.
            kubectl(kc, "-n", "default", "delete", "pod", "stall-worker-0", "--wait=false")
            wait_for(
                lambda: job_status(kc, "default", "stall").get("restarts", {}).get("total", 0) >= 2,
                timeout=90,
                message="the deleted worker to be handled after the outage",
            )
    print(
        f"\nnode lost during a stall: worker running again {recovered:.1f} s after the loss; "
        f"liveness failed {failed_after:.1f} s into the outage, passed {passed_after:.1f} s after it"
    )


def test_credentials_the_server_keeps_refusing_end_the_operator(kubeconfig: Path, tmp_path: Path) -> None:
    """A CA that did not sign the API server's certificate (a rotated CA): after the configured
    number of failed verifications in a row, the operator stops with EXIT_LOST."""
    config = yaml.safe_load(kubeconfig.read_text())
    wrong_ca = config["users"][0]["user"]["client-certificate-data"]  # a certificate, not the server's CA
    for cluster in config["clusters"]:
        cluster["cluster"]["certificate-authority-data"] = wrong_ca
    broken = tmp_path / "wrong-ca.kubeconfig"
    broken.write_text(yaml.safe_dump(config))
    assert base64.b64decode(wrong_ca).startswith(b"-----BEGIN CERTIFICATE-----")
    options = RuntimeOptions(liveness_settings=LivenessSettings(ping_interval_seconds=1.0, fatal_failures=3))
    operator = EmbeddedOperator(str(broken), namespaces=["default"], options=options).start()
    wait_for(lambda: not operator.running, timeout=120, message="the operator to exit")
    operator.stop()
    assert operator.exit_code == EXIT_LOST
    assert operator.context is not None and operator.context.api_liveness.credential_failures >= 3
    assert "CERTIFICATE_VERIFY_FAILED" in operator.context.api_liveness.last_failure


def test_spec_patches_create_no_base_child_after_the_first(kubeconfig: Path, tmp_path: Path) -> None:
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)
    patches = 20
    try:
        with EmbeddedOperator(str(kubeconfig), namespaces=[namespace]) as operator:
            assert operator.context is not None
            creates = operator.context.kube.creates
            nodes = get(kubeconfig, "nodes")["items"]
            instance_type = nodes[0]["metadata"]["labels"][constants.LABEL_INSTANCE_TYPE]
            apply(kubeconfig, job_manifest("posts", namespace, nodes=1, instanceType=instance_type), tmp_path)
            wait_state(kubeconfig, namespace, "posts", "Running")
            first = {kind: count for kind, count in creates.items() if kind in BASE_KINDS}
            assert set(first) == BASE_KINDS and set(first.values()) == {1}
            for i in range(patches):
                patch = {"spec": {"failurePolicy": {"backoffSeconds": 1 + (i + 1) % 2}}}
                kubectl(
                    kubeconfig,
                    "-n",
                    namespace,
                    "patch",
                    "rtj",
                    "posts",
                    "--type=merge",
                    "-p",
                    json.dumps(patch),
                )
            generation = get(kubeconfig, "-n", namespace, "rtj", "posts")["metadata"]["generation"]
            wait_for(
                lambda: job_status(kubeconfig, namespace, "posts").get("observedGeneration") == generation,
                timeout=90,
                message="the last spec change to be observed",
            )
            passes = operator.context.queue.passes
            after = {kind: count for kind, count in creates.items() if kind in BASE_KINDS}
            print(f"\n{patches} spec patches: {passes} passes, base-child creates {first} -> {after}")
            assert after == first
            assert creates.get("Pod") == 1
    finally:
        kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)


def test_a_milestone_event_lost_in_a_crash_is_posted_again_once(kubeconfig: Path, tmp_path: Path) -> None:
    """ChildrenCreated is posted after the status write that records the start: an operator killed in
    between loses it. The next operator posts it again, and the one after that does not double it."""
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)

    def children_created() -> int:
        return event_reasons(kubeconfig, namespace, "milestone").count(events.CHILDREN_CREATED)

    try:
        with EmbeddedOperator(str(kubeconfig), namespaces=[namespace]):
            nodes = get(kubeconfig, "nodes")["items"]
            instance_type = nodes[0]["metadata"]["labels"][constants.LABEL_INSTANCE_TYPE]
            apply(
                kubeconfig,
                job_manifest("milestone", namespace, nodes=1, instanceType=instance_type),
                tmp_path,
            )
            wait_state(kubeconfig, namespace, "milestone", "Running")
            wait_for(lambda: children_created() == 1, timeout=60, message="ChildrenCreated")
        # What a crash right after the status write leaves behind: the start recorded, no Event.
        selector = f"reason={events.CHILDREN_CREATED}"
        kubectl(kubeconfig, "-n", namespace, "delete", "events", f"--field-selector={selector}")
        assert children_created() == 0
        with EmbeddedOperator(str(kubeconfig), namespaces=[namespace]):
            wait_for(lambda: children_created() == 1, timeout=60, message="ChildrenCreated posted again")
        with EmbeddedOperator(str(kubeconfig), namespaces=[namespace]) as operator:
            assert operator.context is not None
            posted = operator.context.kube.creates
            wait_for(lambda: posted.get("Event", 0) >= 1, timeout=60, message="the milestone to be re-posted")
        assert children_created() == 1  # answered AlreadyExists: still one
    finally:
        kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)


def test_a_leader_cut_off_from_the_api_stops_acting_before_the_standby_takes_over(
    kubeconfig: Path, tmp_path: Path
) -> None:
    """Fencing: the leader's open connections freeze and new ones are refused; it stops acting once it
    could not renew for the renew deadline, which is before the Lease runs out and the standby
    acquires it. The old leader then exits 1 (to restart as a standby); the new one serves, and
    releases the Lease when stopped."""
    install_crd(kubeconfig)
    namespace = new_namespace(kubeconfig)
    flags = ("--lease-duration-seconds=6", "--renew-deadline-seconds=4", "--retry-period-seconds=1")
    try:
        with ApiProxy(f"https://127.0.0.1:{_port_of(kubeconfig)}") as proxy:
            via = kubeconfig_via(kubeconfig, proxy, tmp_path / "via-proxy.kubeconfig")
            first = Replica(via, "first", tmp_path / "first.log", namespace=namespace, extra=flags)
            try:
                wait_for(first.leading, timeout=120, message="the first replica to lead")
                election = LeaderElectionSettings(
                    namespace=namespace,
                    identity="second",
                    lease_duration_seconds=6,
                    renew_deadline_seconds=4.0,
                    retry_period_seconds=1.0,
                )
                options = RuntimeOptions(election=election)
                with EmbeddedOperator(str(kubeconfig), namespaces=[namespace], options=options) as second:
                    assert second.context is not None
                    assert not second.leading.wait(3) and not second.context.acting()

                    proxy.partition()
                    cut = time.monotonic()
                    fenced = took_over = None
                    while took_over is None and time.monotonic() - cut < 60:
                        now = time.monotonic() - cut
                        if fenced is None and first.leading() is False:
                            fenced = now
                        if second.leading.is_set():
                            took_over = now
                        time.sleep(0.05)
                    print(
                        f"\nleader cut off: fenced after {fenced:.1f} s, standby led after {took_over:.1f} s"
                    )
                    assert fenced is not None and took_over is not None and fenced < took_over
                    assert first.process.wait(60) == EXIT_LOST

                    nodes = get(kubeconfig, "nodes")["items"]
                    instance_type = nodes[0]["metadata"]["labels"][constants.LABEL_INSTANCE_TYPE]
                    job = job_manifest("fenced", namespace, nodes=1, instanceType=instance_type)
                    apply(kubeconfig, job, tmp_path)
                    wait_state(kubeconfig, namespace, "fenced", "Running")
            finally:
                first.stop()
            lease = get(kubeconfig, "-n", namespace, "lease", LEASE)
            assert not lease["spec"].get("holderIdentity")  # released on a clean stop
    finally:
        kubectl(kubeconfig, "delete", "namespace", namespace, "--wait=false", check=False)


def _port_of(kubeconfig: Path) -> int:
    server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    return int(server.rsplit(":", 1)[1])
