"""The real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager and
kube-scheduler, each a child process of ``ControlPlane``.

What runs is Kubernetes' own code (built by ``scripts/build-control-plane.sh``, found by
``binaries``): authentication by client certificates of one generated CA (``certs``), ``Node,RBAC``
authorization, the API server's default admission plugins plus NodeRestriction (Pod Security,
ServiceAccount, DefaultTolerationSeconds, TaintNodesByCondition, ResourceQuota, validating admission
policies...), and the controller manager's default controllers (garbage collector, node lifecycle
and taint eviction, pod GC, Deployments and ReplicaSets, the PV binder, service accounts and their
root CA). The simulated part of the local cluster (nodes, their kubelets, a volume provisioner, DNS)
lives in ``cluster`` and talks to this API server like any client.

State (etcd's data, the PKI, kubeconfigs, the chosen ports, the components' logs) lives under
``<state_dir>/control-plane``; a second start on the same state (``--keep-state``) reuses all of it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from .binaries import program
from .certs import CertPair, Pki, ensure_pki
from .marks import signal_matching
from .ports import PortClaim

log = logging.getLogger(__name__)

SERVICE_CIDR = "10.0.0.0/24"
"""Service ClusterIPs come from here. Nothing routes them on this machine: pods reach Services
through the DNS shim, which answers with the pods' loopback addresses."""
SERVICE_IP = "10.0.0.1"
ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMIN_USER = "rtj-local-admin"
COMPONENT_PORTS = ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler")
MARK_CONTROL_PLANE = "RTJ_LOCAL_CONTROL_PLANE"
"""Every control-plane process carries the cluster's id in its environment, so a sweep finds them."""


@dataclass
class ControlPlaneSettings:
    """How the control plane is run. Times in seconds."""

    state_dir: Path
    node_monitor_grace_seconds: float = 40.0
    node_monitor_period_seconds: float = 1.0
    default_toleration_seconds: int = 300
    api_port: int = 0
    """0: a free port (kept in the state directory for later starts)."""
    start_timeout_seconds: float = 120.0
    cluster_id: str = ""
    audit_log: bool = False
    """Write the API server's audit log (every request's user, verb, resource and response code, at
    the Metadata level) to ``audit_log_path``: how a test sees exactly which permissions a client used."""


def _ports(path: Path, api_port: int, claim: PortClaim) -> dict[str, int]:
    """The components' ports, each claimed until the control plane stops: those a previous start
    chose where they are still free, else new ones (API: ``api_port`` as given)."""
    known: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError):
        known = {k: int(v) for k, v in json.loads(path.read_text()).items()}
    ports = {name: claim.take(known.get(name, 0)) for name in COMPONENT_PORTS if name != "apiserver"}
    ports["apiserver"] = api_port or claim.take(known.get("apiserver", 0))
    path.write_text(json.dumps(ports))
    return ports


def write_kubeconfig(path: Path, server: str, ca: Path, client: CertPair, user: str) -> Path:
    """A kubeconfig with the CA and a client certificate, embedded so the file stands alone."""
    import base64

    def data(file: Path) -> str:
        return base64.b64encode(file.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "rtj-local", "cluster": {"server": server, "certificate-authority-data": data(ca)}}
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": data(client.cert), "client-key-data": data(client.key)},
            }
        ],
        "contexts": [{"name": "rtj-local", "context": {"cluster": "rtj-local", "user": user}}],
        "current-context": "rtj-local",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


class ControlPlane:
    """Start, wait for, and stop the four components."""

    def __init__(self, settings: ControlPlaneSettings) -> None:
        self.settings = settings
        self.dir = Path(settings.state_dir).resolve() / "control-plane"
        self.logs = self.dir / "logs"
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self._port_claim = PortClaim()
        self.pki: Pki | None = None
        self.start_seconds: float | None = None

    # -- what clients need ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def ca_path(self) -> Path:
        assert self.pki is not None
        return self.pki.ca.cert

    @property
    def kubeconfig_path(self) -> Path:
        """The admin's kubeconfig (group system:masters): kubectl, Helm and the tests use it."""
        return self.dir / "admin.kubeconfig"

    def kubeconfig_for(self, name: str, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig for the identity ``user`` in ``groups`` (issued once, then reused)."""
        assert self.pki is not None
        client = self.pki.client(name, user, groups)
        return write_kubeconfig(self.dir / f"{name}.kubeconfig", self.url, self.pki.ca.cert, client, user)

    @property
    def audit_log_path(self) -> Path:
        """The API server's audit log, one JSON event per line (only with ``audit_log``)."""
        return self.logs / "audit.log"

    def pki_serving(self, name: str, dns_names: tuple[str, ...] = ()) -> CertPair:
        """A serving certificate for loopback (and ``dns_names``) from the cluster's CA (the
        kubelets' endpoints, the Metrics API)."""
        assert self.pki is not None
        return self.pki.serving(name, dns_names=dns_names)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        started = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        self.ports = _ports(self.dir / "ports.json", self.settings.api_port, self._port_claim)
        self.pki = ensure_pki(self.dir / "pki", SERVICE_IP)
        self.kubeconfig_for("admin", ADMIN_USER, ("system:masters",))
        deadline = started + self.settings.start_timeout_seconds
        try:
            self._start_etcd(deadline)
            self._start_apiserver(deadline)
            self._start_controllers(deadline)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        log.info("control plane up in %.1fs at %s", self.start_seconds, self.url)

    def stop(self) -> None:
        """Stop the API server's clients and the API server together, then etcd (last, and given time
        to close its database cleanly, so that ``--keep-state`` finds it whole). The cluster is
        disposable: a component that has not exited within a few seconds is killed."""
        clients = [name for name in self._processes if name != "etcd"]
        self._terminate(clients, grace_seconds=5)
        self._terminate([name for name in self._processes if name == "etcd"], grace_seconds=15)
        self._port_claim.release()

    def _terminate(self, names: list[str], grace_seconds: float) -> None:
        for name in names:
            if self._processes[name].poll() is None:
                self._processes[name].terminate()
        deadline = time.monotonic() + grace_seconds
        for name in names:
            process = self._processes.pop(name)
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)

    def alive(self) -> dict[str, bool]:
        return {name: process.poll() is None for name, process in self._processes.items()}

    # -- components ----------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG",)}
        env[MARK_CONTROL_PLANE] = self.settings.cluster_id
        with (self.logs / f"{name}.log").open("ab") as output:
            self._processes[name] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.dir,
                start_new_session=True,  # a terminal's Ctrl-C reaches the parent, which stops them in order
            )

    def _wait_healthy(self, name: str, url: str, deadline: float, context: ssl.SSLContext | None) -> None:
        last = "no answer"
        while time.monotonic() < deadline:
            process = self._processes[name]
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}: {self._log_tail(name)}")
            try:
                with urllib.request.urlopen(url, timeout=5, context=context) as response:
                    body = response.read().decode(errors="replace")
                    if response.status == 200:
                        return
                    last = body
            except (urllib.error.URLError, OSError, ValueError) as error:
                last = str(error)
            time.sleep(0.2)
        raise TimeoutError(f"{name} not healthy at {url}: {last}; {self._log_tail(name)}")

    def _log_tail(self, name: str, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            text = (self.logs / f"{name}.log").read_text(errors="replace").splitlines()
            return "log tail:\n" + "\n".join(text[-lines:])
        return "no log"

    def _start_etcd(self, deadline: float) -> None:
        client = f"http://127.0.0.1:{self.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.ports['etcd-peer']}"
        self._spawn(
            "etcd",
            [
                str(program("etcd")),
                "--name=rtj-local",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=rtj-local={peer}",
                # The local cluster is disposable: no fsync (as envtest runs it), small log.
                "--unsafe-no-fsync",
                "--log-level=warn",
                "--quota-backend-bytes=2147483648",
            ],
        )
        self._wait_healthy("etcd", f"{client}/health", deadline, None)

    def _start_apiserver(self, deadline: float) -> None:
        pki = self.pki
        assert pki is not None
        kubelet_client = pki.client("apiserver-kubelet-client", "kube-apiserver-kubelet-client")
        grace = str(self.settings.default_toleration_seconds)
        self._spawn(
            "kube-apiserver",
            [
                str(program("kube-apiserver")),
                f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.ports['apiserver']}",
                f"--tls-cert-file={pki.apiserver.cert}",
                f"--tls-private-key-file={pki.apiserver.key}",
                f"--client-ca-file={pki.ca.cert}",
                f"--service-account-issuer={ISSUER}",
                f"--service-account-key-file={pki.service_account_public}",
                f"--service-account-signing-key-file={pki.service_account_key}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                # The defaults (NamespaceLifecycle, LimitRanger, ServiceAccount, TaintNodesByCondition,
                # PodSecurity, Priority, DefaultTolerationSeconds, DefaultStorageClass,
                # StorageObjectInUseProtection, ..., ValidatingAdmissionPolicy, ResourceQuota) plus:
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                f"--default-not-ready-toleration-seconds={grace}",
                f"--default-unreachable-toleration-seconds={grace}",
                f"--kubelet-client-certificate={kubelet_client.cert}",
                f"--kubelet-client-key={kubelet_client.key}",
                f"--kubelet-certificate-authority={pki.ca.cert}",
                "--kubelet-preferred-address-types=InternalIP",
                "--profiling=false",
                "--v=1",
                *(audit_flags(self.dir, self.audit_log_path) if self.settings.audit_log else []),
            ],
        )
        context = ssl.create_default_context(cafile=str(pki.ca.cert))
        admin = pki.client("admin", ADMIN_USER, ("system:masters",))
        context.load_cert_chain(str(admin.cert), str(admin.key))
        self._wait_healthy("kube-apiserver", f"{self.url}/readyz", deadline, context)

    def _start_controllers(self, deadline: float) -> None:
        pki = self.pki
        assert pki is not None
        manager = self.kubeconfig_for("controller-manager", "system:kube-controller-manager")
        scheduler = self.kubeconfig_for("scheduler", "system:kube-scheduler")
        self._spawn(
            "kube-controller-manager",
            [
                str(program("kube-controller-manager")),
                f"--kubeconfig={manager}",
                f"--authentication-kubeconfig={manager}",
                f"--authorization-kubeconfig={manager}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['controller-manager']}",
                f"--cert-dir={self.dir / 'controller-manager'}",
                f"--root-ca-file={pki.ca.cert}",
                f"--service-account-private-key-file={pki.service_account_key}",
                "--use-service-account-credentials=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--node-monitor-grace-period={self.settings.node_monitor_grace_seconds:g}s",
                f"--node-monitor-period={self.settings.node_monitor_period_seconds:g}s",
                # Its clients' own rate limit (20/s, bursts of 30) paced its start: each controller
                # is built with requests of its own, so the node lifecycle controller, which lifts the
                # nodes' not-ready taint, came about 4 s after the rest (a cluster's start: 9.5-12 s
                # before, 4.6-8.7 s with these, side by side on a loaded 2-core machine).
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                str(program("kube-scheduler")),
                f"--kubeconfig={scheduler}",
                f"--authentication-kubeconfig={scheduler}",
                f"--authorization-kubeconfig={scheduler}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['scheduler']}",
                f"--cert-dir={self.dir / 'scheduler'}",
                "--profiling=false",
                "--v=1",
            ],
        )
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # their serving certificates are self-signed
        for name, port in (
            ("kube-controller-manager", self.ports["controller-manager"]),
            ("kube-scheduler", self.ports["scheduler"]),
        ):
            self._wait_healthy(name, f"https://127.0.0.1:{port}/healthz", deadline, insecure)


def audit_flags(directory: Path, log_path: Path) -> list[str]:
    """kube-apiserver's flags for an audit log at `log_path`, its policy written into `directory`.
    Metadata: who, which verb on which resource, and the response code; never bodies. A request is
    logged when its response starts (a watch's, which may never complete within a test) and when it
    completes; readers group the events by auditID."""
    policy = directory / "audit-policy.yaml"
    document = {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata"}],
    }
    policy.write_text(yaml.safe_dump(document))
    return [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={log_path}",
        "--audit-log-format=json",
        "--audit-log-mode=blocking",
    ]


def stop_marked_processes(cluster_id: str) -> int:
    """SIGKILL control-plane processes a crashed run left (found by their mark); returns how many."""
    if not cluster_id:
        return 0
    return signal_matching(signal.SIGKILL, lambda env: env.get(MARK_CONTROL_PLANE) == cluster_id)
