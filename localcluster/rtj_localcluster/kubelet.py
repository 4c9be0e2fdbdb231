"""The process kubelet of one simulated node: registers the Node, renews its heartbeat Lease, and
runs each container of the pods bound to it as a local process group.

Per pod (``PodWorker``, which runs the pod's containers through their restart policy and terminates
them): a directory ``<state>/pods/<ns>_<pod>_<uid>/`` holding ``<container>.log`` (read by the API
server's ``pods/log``), volumes (``pod_volumes``: PVC -> the bound PV's directory, emptyDir,
hostPath, configMap/secret files, projected tokens), the service-account files and a working
directory; a short per-pod ``TMPDIR`` (IPC socket paths must stay under 108 bytes); a loopback pod
IP. ``ContainerLauncher`` starts each container: mount paths in env values, command/args and
workingDir are rewritten to the real directories (``podenv``); an exec readiness probe runs beside
it (``probes``). ``PodStatusWriter`` sends the status (phase, conditions, containerStatuses) to
``pods/status``; deletion sends SIGTERM, then SIGKILL after the grace period, then finishes the
delete with gracePeriodSeconds=0.

Containers run as their securityContext's runAsUser/runAsGroup/fsGroup when the kubelet runs as root
(``identity``: a real kubelet's user switch and emptyDir ownership).

Every process of a container carries ``RTJ_LOCAL_POD_UID``/``RTJ_LOCAL_CONTAINER`` in its
environment: launchers such as torch elastic start workers in new sessions, so the kubelet finds a
container's processes by that mark (like a cgroup) rather than by process group alone.

The node's HTTPS server (``logserver``) serves ``kubectl logs``, and ``exec``, ``attach`` and
``port-forward`` (``streaming``: a command runs as one of the container's processes; a container
with ``stdin: true`` gets a stdin pipe for attach); ``ContainerAccess`` finds the container each
request names. ``NodeReporter`` registers the Node and its Lease and keeps both current.

Faults (``kill``, ``partition``, ``heal``, ``kill_container``) are driven by ``LocalCluster``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rtj_contract.times import parse_rfc3339

from . import identity
from .certs import CertPair
from .client import ApiError, Informer, KubeClient, now_micro, now_rfc3339, path_for
from .logserver import LogServer
from .marks import signal_matching
from .nodes import NODE_LEASE_NAMESPACE, Degradation, NodeProfile, lease_object, node_status, ready_condition
from .pod_volumes import PodVolumes, get_optional
from .podenv import (
    SERVICE_ACCOUNT_DIR,
    condition,
    container_argv,
    merge_conditions,
    normalise_mounts,
    pod_phase,
    resolve_env,
    rewrite_path,
)
from .podnet import OWNER_ENV, IpAllocator, container_env, library, taken_ports
from .probes import probe_readiness
from .resource_metrics import MachineScan, ResourceEndpoint, RunningContainer
from .streaming import AttachTarget, ExecTarget, StreamingEndpoints, StreamingError

log = logging.getLogger(__name__)


def _epoch(rfc3339: str | None) -> float:
    parsed = parse_rfc3339(rfc3339)
    return parsed.timestamp() if parsed is not None else 0.0


def host_file_of_the_image(path: str, rewritten: str) -> bool:
    """Whether a command's path below a mount (the pod's /tmp) names one of the host's files, which
    stand in for the image's, rather than a file of the pod's volume: it exists on the host and not
    in the volume (a checkout or virtual environment under /tmp)."""
    return os.path.exists(path) and not os.path.exists(rewritten)


MARK_POD = "RTJ_LOCAL_POD_UID"
MARK_CONTAINER = "RTJ_LOCAL_CONTAINER"
MARK_NODE = "RTJ_LOCAL_NODE"
HOSTS_FILE_ENV = "RTJ_LOCAL_HOSTS_FILE"
SITE_DIR = Path(__file__).parent / "podsite"
# The machine's marked processes, scanned once for all the process's kubelets' resource endpoints.
MARKED_PROCESSES = MachineScan((MARK_NODE, MARK_POD, MARK_CONTAINER))
# Host variables a pod must not inherit: they would point it at the host's cluster or test run.
_HOST_ENV_DROPPED = ("KUBECONFIG", "PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER", "RTJ_TEST_KUBECONFIG")


def host_python_path(value: str) -> list[str]:
    """The host's PYTHONPATH entries, each made absolute: a container runs in its own working
    directory, where a relative entry (``PYTHONPATH=.venv/nvrx-0.7.0 rtj bench ...``) would name
    nothing."""
    return [os.path.abspath(entry) for entry in value.split(os.pathsep) if entry]


@dataclass
class KubeletConfig:
    """What every kubelet of a cluster shares."""

    state_dir: Path
    api_host: str
    api_port: int
    hosts_file: Path
    bin_dir: Path
    heartbeat_interval_seconds: float
    node_status_interval_seconds: float
    restart_backoff_seconds: float
    max_restart_backoff_seconds: float
    image_entrypoints: Mapping[str, list[str]] = field(default_factory=dict)
    """Image name (the last path element, without tag or digest) -> the command that stands for its
    entrypoint, for containers that give no ``command``: the project's own images run as local
    programs (``rtj-operator``, ``rtj-launch``)."""
    extra_env: Mapping[str, str] = field(default_factory=dict)
    """Added to every container's environment (the cluster's own mark)."""


def signal_marked(uid: str, container: str | None, sig: int) -> int:
    """Send ``sig`` to every process carrying the pod's (and container's) mark; returns how many."""
    return signal_matching(
        sig,
        lambda env: env.get(MARK_POD) == uid and (container is None or env.get(MARK_CONTAINER) == container),
    )


# A kubelet's defaults and limits for a container's termination message.
DEFAULT_TERMINATION_MESSAGE_PATH = "/dev/termination-log"
TERMINATION_MESSAGE_LIMIT = 4096
TERMINATION_LOG_LINES = 80


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class ContainerRuntime:
    spec: dict[str, Any]
    init: bool = False
    restart_count: int = 0
    process: asyncio.subprocess.Process | None = None
    started_at: str | None = None
    started_once: bool = False
    will_restart: bool = False
    waiting: tuple[str, str] = ("ContainerCreating", "")
    terminated: dict[str, Any] | None = None
    last_terminated: dict[str, Any] | None = None
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    probe_ready: bool = True
    """The readiness probe's verdict (True without a probe)."""
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    mounts: list[tuple[str, str]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    @property
    def ready(self) -> bool:
        return self.running and not self.init and self.probe_ready

    def status(self) -> dict[str, Any]:
        state: dict[str, Any]
        if self.running:
            state = {"running": {"startedAt": self.started_at}}
        elif self.terminated is not None and not self.will_restart:
            state = {"terminated": self.terminated}
        else:
            reason, message = self.waiting
            state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        result: dict[str, Any] = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": "",
            "ready": self.ready,
            "started": self.running,
            "restartCount": self.restart_count,
            "state": state,
            "lastState": {"terminated": self.last_terminated} if self.last_terminated else {},
        }
        if self.process is not None:
            result["containerID"] = f"process://{self.process.pid}"
        return result


class ContainerLauncher:
    """Starts a pod's containers as local process groups: each one's mounts, environment (its
    ConfigMaps' and Secrets' values, the node's and the pod's own), argv, user and log file, and reads
    its termination message when it exits."""

    def __init__(self, worker: PodWorker) -> None:
        self.worker = worker

    async def wait_for_free_ports(self, c: ContainerRuntime) -> bool:
        """Without the pod network library a pod binds the machine's own ports: while a declared
        containerPort is taken, the container waits (reason PortInUse) instead of crash-looping.
        False when the pod terminates meanwhile."""
        if library().path is not None:
            return True
        while taken := await asyncio.to_thread(taken_ports, c.spec, self.worker.owner_uid):
            message = (
                f"containerPort {', '.join(map(str, taken))} is in use on this machine; pods share its "
                f"ports because the pod network library is missing ({library().reason})"
            )
            if c.waiting != ("PortInUse", message):
                c.waiting = ("PortInUse", message)
                self.worker.event("Warning", "PortInUse", message)
                self.worker.changed.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.worker.terminating.wait(), timeout=2)
            if self.worker.terminating.is_set():
                return False
        return True

    def service_account_dir(self) -> str | None:
        """The real directory of the volume mounted at the service-account path, if any."""
        for container in self.worker.pod.get("spec", {}).get("containers") or []:
            for mount in container.get("volumeMounts") or []:
                if mount.get("mountPath", "").rstrip("/") == SERVICE_ACCOUNT_DIR:
                    return self.worker.volumes.get(mount["name"])
        return None

    def mounts_for(self, container: Mapping[str, Any]) -> list[tuple[str, str]]:
        mounts: dict[str, str] = {}
        for mount in container.get("volumeMounts") or []:
            real = self.worker.volumes.get(mount["name"])
            if real is None:
                raise RuntimeError(f"volumeMount {mount['name']!r} names no volume of the pod")
            if mount.get("subPath"):
                real = str(Path(real) / mount["subPath"])
                Path(real).mkdir(parents=True, exist_ok=True)
            mounts[mount["mountPath"]] = real
        # The container's terminationMessagePath is a file of the pod's directory, read at exit.
        message_path = container.get("terminationMessagePath") or DEFAULT_TERMINATION_MESSAGE_PATH
        mounts.setdefault(message_path, str(self.termination_message_file(container["name"])))
        return normalise_mounts(mounts)

    def termination_message_file(self, container: str) -> Path:
        return self.worker.dir / f"{container}.termination-log"

    def reset_termination_message(self, container: str) -> None:
        """An empty message file that the container's user (runAsUser) may write."""
        path = self.termination_message_file(container)
        path.write_bytes(b"")
        path.chmod(0o666)

    def termination_message(self, c: ContainerRuntime, code: int) -> str:
        """What the container wrote to its terminationMessagePath (at most 4096 bytes), or with
        FallbackToLogsOnError and a failure, the tail of its log, as a kubelet reports it."""
        with contextlib.suppress(OSError):
            with self.termination_message_file(c.name).open("rb") as written:
                message = written.read(TERMINATION_MESSAGE_LIMIT).decode(errors="replace").strip()
            if message:
                return message
        if code != 0 and c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            with contextlib.suppress(OSError):
                lines = self.worker.log_path(c.name).read_bytes().decode(errors="replace").splitlines()
                return "\n".join(lines[-TERMINATION_LOG_LINES:])[-TERMINATION_MESSAGE_LIMIT:]
        return ""

    async def _sources(self, container: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        configmaps: dict[str, Any] = {}
        secrets: dict[str, Any] = {}
        refs: list[tuple[str, str]] = []
        for source in container.get("envFrom") or []:
            for kind in ("configMap", "secret"):
                if source.get(f"{kind}Ref"):
                    refs.append((kind, source[f"{kind}Ref"].get("name", "")))
        for item in container.get("env") or []:
            for kind in ("configMap", "secret"):
                ref = (item.get("valueFrom") or {}).get(f"{kind}KeyRef")
                if ref:
                    refs.append((kind, ref.get("name", "")))
        for kind, name in refs:
            store, resource = (configmaps, "configmaps") if kind == "configMap" else (secrets, "secrets")
            obj = await get_optional(self.worker.kubelet.client, resource, self.worker.namespace, name)
            if obj is not None:
                store[name] = obj
        return configmaps, secrets

    def _base_env(self, container_name: str) -> dict[str, str]:
        config = self.worker.kubelet.config
        env = {k: v for k, v in os.environ.items() if k not in _HOST_ENV_DROPPED}
        env["PATH"] = f"{config.bin_dir}{os.pathsep}{env.get('PATH', os.defpath)}"
        env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), *host_python_path(env.get("PYTHONPATH", ""))])
        env["TMPDIR"] = str(self.worker.tmp_dir)
        env["HOME"] = str(self.worker.dir / "work")
        env["HOSTNAME"] = self.worker.pod.get("spec", {}).get("hostname") or self.worker.name
        env["KUBERNETES_SERVICE_HOST"] = config.api_host
        env["KUBERNETES_SERVICE_PORT"] = str(config.api_port)
        env["KUBERNETES_SERVICE_PORT_HTTPS"] = str(config.api_port)
        env[HOSTS_FILE_ENV] = str(config.hosts_file)
        # Programs that cannot see the mount-path rewriting (a constant in code, not an env value)
        # find the service-account files through this (rtj_trainer.library.progress and podsite read it).
        account_dir = self.service_account_dir()
        if account_dir:
            env["RTJ_SERVICE_ACCOUNT_DIR"] = account_dir
        env["RTJ_LOCAL_POD_NAMESPACE"] = self.worker.namespace
        env.update(config.extra_env)
        env[MARK_POD] = self.worker.uid
        env[MARK_CONTAINER] = container_name
        env[MARK_NODE] = self.worker.kubelet.name
        env[OWNER_ENV] = self.worker.owner_uid
        return env

    async def spawn(self, c: ContainerRuntime) -> asyncio.subprocess.Process:
        mounts = self.mounts_for(c.spec)
        self.reset_termination_message(c.name)
        configmaps, secrets = await self._sources(c.spec)
        env = resolve_env(
            c.spec,
            self.worker.pod,
            base=self._base_env(c.name),
            pod_ip=self.worker.pod_ip,
            host_ip=self.worker.kubelet.host_ip,
            configmaps=configmaps,
            secrets=secrets,
            node_allocatable=self.worker.kubelet.profile.resources,
            mounts=mounts,
        )
        # The identity marks must survive a user env that happens to reuse the names.
        env.update(self.worker.kubelet.config.extra_env)
        env.update({MARK_POD: self.worker.uid, MARK_CONTAINER: c.name, MARK_NODE: self.worker.kubelet.name})
        env[OWNER_ENV] = self.worker.owner_uid
        container_env(env, self.worker.pod_ip)  # the pod's own wildcard address (rtj_localcluster.podnet)
        argv = container_argv(
            self.worker.kubelet.with_entrypoint(c.spec), env, mounts, host_file_of_the_image
        )
        working_dir = c.spec.get("workingDir")
        cwd = Path(rewrite_path(working_dir, mounts)) if working_dir else self.worker.dir / "work"
        cwd.mkdir(parents=True, exist_ok=True)
        run_as = identity.run_as(self.worker.pod, c.spec)
        if run_as is not None:
            # The container's writable layer: its TMPDIR and HOME (the default working directory).
            identity.give_to(
                run_as, *(p for p in (self.worker.tmp_dir, self.worker.dir / "work") if p is not None)
            )
            identity.user_env(run_as, env)
            argv = [*identity.command_prefix(run_as), *argv]
        c.env, c.cwd, c.mounts = env, str(cwd), mounts
        with self.worker.log_path(c.name).open("ab") as log_file:
            return await asyncio.create_subprocess_exec(
                *argv,
                cwd=str(cwd),
                env=env,
                # `stdin: true` keeps a pipe open for `kubectl attach -i` (and `kubectl run -i`).
                stdin=asyncio.subprocess.PIPE if c.spec.get("stdin") else asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )

    def readiness_probe(self, c: ContainerRuntime, probe: Mapping[str, Any]) -> Coroutine[Any, Any, None]:
        """The exec readinessProbe of `c`, with the container's env, mounts and working directory."""
        argv = container_argv(
            {"command": probe["exec"].get("command") or []}, c.env, c.mounts, host_file_of_the_image
        )

        def report(ready: bool) -> None:
            c.probe_ready = ready
            self.worker.changed.set()

        return probe_readiness(argv, env=c.env, cwd=c.cwd, probe=probe, report=report)


class PodStatusWriter:
    """A pod's status as its kubelet reports it: phase, conditions, container statuses and IPs, built
    from the worker's state and patched to ``pods/status`` whenever the worker marks a change."""

    def __init__(self, worker: PodWorker) -> None:
        self.worker = worker

    def build(self) -> dict[str, Any]:
        w, now = self.worker, now_rfc3339()
        if w.failed_message is not None:
            phase = "Failed"
        else:
            phase = pod_phase(
                [
                    (
                        c.started_once,
                        None if c.running else (c.terminated or {}).get("exitCode"),
                        c.will_restart,
                    )
                    for c in w.containers
                ]
            )
        terminal = phase in ("Succeeded", "Failed")
        all_ready = bool(w.containers) and all(c.ready for c in w.containers)
        ready = all_ready and not w.terminating.is_set()
        not_ready_reason = "PodCompleted" if terminal else "ContainersNotReady"
        wanted = [
            condition("PodReadyToStartContainers", bool(w.pod_ip), now),
            condition(
                "Initialized", w.initialized, now, None if w.initialized else "ContainersNotInitialized"
            ),
            condition("Ready", ready, now, None if ready else not_ready_reason),
            condition("ContainersReady", ready, now, None if ready else not_ready_reason),
            condition("PodScheduled", True, now),
        ]
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": merge_conditions(w.pod.get("status", {}).get("conditions") or [], wanted),
            "hostIP": w.kubelet.host_ip,
            "hostIPs": [{"ip": w.kubelet.host_ip}],
            "startTime": w.start_time,
            "containerStatuses": [c.status() for c in w.containers],
        }
        if w.init_containers:
            status["initContainerStatuses"] = [c.status() for c in w.init_containers]
        if w.pod_ip:
            status["podIP"] = w.pod_ip
            status["podIPs"] = [{"ip": w.pod_ip}]
        if w.failed_message:
            status["message"] = w.failed_message
        return status

    async def run(self) -> None:
        while True:
            await self.worker.changed.wait()
            await self.worker.kubelet.connected.wait()
            self.worker.changed.clear()
            await self.write()
            # Coalesce bursts of changes (several containers starting at once) into one patch.
            await asyncio.sleep(0.05)

    async def write(self) -> None:
        status = self.build()
        try:
            updated = await self.worker.kubelet.client.patch(
                path_for("pods", self.worker.namespace, self.worker.name, "status"),
                # The uid makes the patch conditional: a new pod of the same name (a resumed job's
                # worker) must never receive this one's status.
                {"metadata": {"uid": self.worker.uid}, "status": status},
            )
            if isinstance(updated, dict):
                self.worker.pod = updated
        except ApiError as error:
            # 404: deleted; 409: the uid precondition failed (the name now belongs to a new pod).
            if error.status not in (404, 409):
                self._failed(error)
        except Exception as error:
            self._failed(error)

    def _failed(self, error: Exception) -> None:
        log.warning("pod %s/%s status update failed: %s", self.worker.namespace, self.worker.name, error)
        self.worker.changed.set()  # try again


class PodWorker:
    """Runs one pod: prepare volumes, run init containers then containers, report, terminate."""

    def __init__(self, kubelet: Kubelet, pod: dict[str, Any]) -> None:
        self.kubelet = kubelet
        self.pod = pod
        meta = pod["metadata"]
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.dir = kubelet.config.state_dir / "pods" / f"{self.namespace}_{self.name}_{self.uid}"
        self.tmp_dir: Path | None = None
        self.pod_ip = ""
        self.start_time = now_rfc3339()
        spec = pod.get("spec", {})
        self.restart_policy: str = spec.get("restartPolicy") or "Always"
        self.init_containers = [
            ContainerRuntime(dict(c), init=True) for c in spec.get("initContainers") or []
        ]
        self.containers = [ContainerRuntime(dict(c)) for c in spec.get("containers") or []]
        self.initialized = not self.init_containers
        self.failed_message: str | None = None
        self.volumes: dict[str, str] = {}
        self.terminating = asyncio.Event()
        self.finished = False
        self.changed = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._terminate_task: asyncio.Task[None] | None = None
        self.launcher = ContainerLauncher(self)
        self.status = PodStatusWriter(self)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._run(), name=f"pod {self.name}"))
        self._tasks.append(asyncio.create_task(self.status.run(), name=f"status {self.name}"))
        self.changed.set()

    def event(self, event_type: str, reason: str, message: str) -> None:
        """Record an Event about the pod in the background (kubectl describe shows them)."""
        if not self.kubelet.connected.is_set():
            return
        coroutine = self.kubelet.client.post_event(
            self.pod, event_type, reason, message, component=f"kubelet/{self.kubelet.name}"
        )
        task = asyncio.create_task(coroutine)
        self.kubelet._background.add(task)
        task.add_done_callback(self.kubelet._background.discard)

    @property
    def owner_uid(self) -> str:
        """The uid of the pod's controller (the pod's own without one): pods of one workload share it."""
        owners = self.pod.get("metadata", {}).get("ownerReferences") or []
        controller = next((o for o in owners if o.get("controller")), owners[0] if owners else {})
        return str(controller.get("uid") or self.uid)

    def log_path(self, container: str) -> Path:
        return self.dir / f"{container}.log"

    async def _run(self) -> None:
        try:
            await self._prepare()
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.warning("pod %s/%s cannot start: %s", self.namespace, self.name, error)
            for c in self.containers:
                c.waiting = ("CreateContainerConfigError", str(error))
            self.changed.set()
            return
        for init in self.init_containers:
            if not await self._run_container(init):
                self.failed_message = f"init container {init.name} failed"
                self.changed.set()
                return
        self.initialized = True
        self.changed.set()
        await asyncio.gather(*(self._run_container(c) for c in self.containers))

    async def _run_container(self, c: ContainerRuntime) -> bool:
        """Run ``c`` until the restart policy stops it; True when its last run exited 0."""
        backoff = self.kubelet.config.restart_backoff_seconds
        while True:
            if self.terminating.is_set() or not await self.launcher.wait_for_free_ports(c):
                return False
            code = await self._run_once(c)
            if self.terminating.is_set():
                return code == 0
            again = self.restart_policy == "Always" and not c.init
            again = again or (self.restart_policy in ("Always", "OnFailure") and code != 0)
            if not again:
                return code == 0
            c.will_restart = True
            c.waiting = ("CrashLoopBackOff", f"back-off {backoff:g}s restarting failed container {c.name}")
            self.event("Warning", "BackOff", f"Back-off {backoff:g}s restarting container {c.name}")
            self.changed.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.terminating.wait(), timeout=backoff)
            if self.terminating.is_set():
                c.will_restart = False
                self.changed.set()
                return code == 0
            backoff = min(backoff * 2, self.kubelet.config.max_restart_backoff_seconds)
            c.restart_count += 1
            c.last_terminated = c.terminated
            # `kubectl logs --previous` reads the last instance's output from here.
            with contextlib.suppress(OSError):
                os.replace(self.log_path(c.name), self.dir / f"{c.name}.previous.log")

    async def _run_once(self, c: ContainerRuntime) -> int:
        try:
            process = await self.launcher.spawn(c)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            stamp = now_rfc3339()
            c.started_once = True
            c.terminated = {
                "exitCode": 128,
                "reason": "ContainerCannotRun",
                "message": str(error),
                "startedAt": stamp,
                "finishedAt": stamp,
            }
            self.changed.set()
            return 128
        c.exited.clear()
        c.process = process
        c.started_at = now_rfc3339()
        c.started_once = True
        c.will_restart = False
        c.terminated = None
        self.event("Normal", "Started", f"Started container {c.name} (pid {process.pid})")
        probe = (c.spec.get("readinessProbe") or {}) if not c.init else {}
        prober: asyncio.Task[None] | None = None
        if probe.get("exec"):
            c.probe_ready = False
            prober = asyncio.create_task(self.launcher.readiness_probe(c, probe), name=f"probe {self.name}")
        self.changed.set()
        try:
            returncode = await process.wait()
        finally:
            if prober is not None:
                prober.cancel()
        # The container's main process is gone: like a runtime tearing down the container's
        # cgroup, every other process of that container goes too.
        await asyncio.to_thread(signal_marked, self.uid, c.name, signal.SIGKILL)
        code = _exit_code(returncode)
        c.terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": c.started_at,
            "finishedAt": now_rfc3339(),
            "containerID": f"process://{process.pid}",
        }
        if returncode < 0:
            c.terminated["signal"] = -returncode
        if message := self.launcher.termination_message(c, code):
            c.terminated["message"] = message
        c.exited.set()
        self.changed.set()
        return code

    # -- preparation ---------------------------------------------------------------------------

    async def _prepare(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "work").mkdir(exist_ok=True)
        self.tmp_dir = _short_temp_dir(f"rtj-{self.uid[:8]}-")
        self.pod_ip = self.kubelet.ips.allocate()
        self.changed.set()
        volumes = PodVolumes(
            self.pod,
            client=self.kubelet.client,
            state_dir=self.kubelet.config.state_dir,
            pod_dir=self.dir,
            tmp_dir=self.tmp_dir,
            pod_ip=self.pod_ip,
            host_ip=self.kubelet.host_ip,
            waiting=self._waiting_for_volume,
        )
        await volumes.mount_all(self.volumes)

    def _waiting_for_volume(self, message: str, event_reason: str | None) -> None:
        for c in self.containers:
            c.waiting = ("ContainerCreating", message)
        if event_reason is not None:
            self.event("Warning", event_reason, message)
        self.changed.set()

    # -- termination ---------------------------------------------------------------------------

    def request_termination(self, grace_seconds: float) -> None:
        if self._terminate_task is None:
            self._terminate_task = asyncio.create_task(self._terminate(grace_seconds))

    async def _terminate(self, grace_seconds: float) -> None:
        self.terminating.set()
        self.changed.set()
        if any(c.running for c in [*self.init_containers, *self.containers]):
            self.event(
                "Normal", "Killing", f"Stopping the pod's containers (grace period {grace_seconds:g}s)"
            )
        for c in [*self.init_containers, *self.containers]:
            if c.running and c.process is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(c.process.pid, signal.SIGTERM)
        running = [c.exited.wait() for c in [*self.init_containers, *self.containers] if c.running]
        if running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*running), timeout=max(grace_seconds, 0.0))
        await asyncio.to_thread(signal_marked, self.uid, None, signal.SIGKILL)
        runs = [t for t in self._tasks if t.get_name().startswith("pod ")]
        # With every process dead the run task ends by itself; one still preparing (waiting for a
        # volume) is cancelled.
        _, pending = await asyncio.wait(runs, timeout=5)
        for task in pending:
            task.cancel()
        await self.kubelet.connected.wait()
        await self.status.write()
        try:
            await self.kubelet.client.delete(
                path_for("pods", self.namespace, self.name), grace_period_seconds=0, uid=self.uid
            )
        except ApiError as error:
            if error.status != 404:
                log.warning("pod %s/%s final delete failed: %s", self.namespace, self.name, error)
        self.stop()

    def kill_now(self) -> None:
        """SIGKILL everything of this pod at once (node death, or the pod was force-deleted): its
        containers' process groups here, the processes that left them in a sweep off the loop."""
        for c in [*self.init_containers, *self.containers]:
            if c.process is not None and c.process.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(c.process.pid, signal.SIGKILL)
        self.kubelet.sweep_marked(self.uid)

    def stop(self) -> None:
        """Forget the pod: cancel its tasks and remove its temporary directory (logs stay)."""
        self.finished = True
        for task in self._tasks:
            task.cancel()
        if self.tmp_dir is not None:
            shutil.rmtree(self.tmp_dir, ignore_errors=True)


def image_name(image: str) -> str:
    """``registry/path/name:tag@digest`` -> ``name``."""
    without_digest = image.split("@", 1)[0]
    last = without_digest.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def _short_temp_dir(prefix: str) -> Path:
    # /tmp rather than the host's TMPDIR, which may be long: the pod's IPC socket paths grow from here.
    root = "/tmp" if os.path.isdir("/tmp") else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=root))


class ContainerAccess:
    """The node's running containers as its HTTPS endpoints reach them: a container's log file for
    ``kubectl logs``, its environment for ``exec``, its output and stdin for ``attach``, the pod's address
    for ``port-forward``, and the running containers for the resource metrics."""

    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet

    def locate_log(
        self, namespace: str, name: str, container: str, previous: bool
    ) -> tuple[Path, Callable[[], bool]] | None:
        """The log file of a container of a pod this node runs (for the log endpoint)."""
        for worker in self.kubelet.workers.values():
            if worker.namespace != namespace or worker.name != name:
                continue
            runtimes = [c for c in [*worker.init_containers, *worker.containers] if c.name == container]
            if not runtimes:
                return None
            runtime = runtimes[0]
            if previous:
                return worker.dir / f"{container}.previous.log", lambda: False
            return worker.log_path(container), functools.partial(self._still_writing, runtime)
        return None

    def _running_container(
        self, namespace: str, name: str, container: str
    ) -> tuple[PodWorker, ContainerRuntime]:
        worker = self.kubelet.find_worker(namespace, name)
        if worker is None:
            raise StreamingError(f"pod {namespace}/{name} not found on node {self.kubelet.name}")
        runtime = next(
            (c for c in [*worker.init_containers, *worker.containers] if c.name == container), None
        )
        if runtime is None:
            raise StreamingError(f"container {container!r} not found in pod {namespace}/{name}")
        if not runtime.running or self.kubelet.dead:
            raise StreamingError(f"container {container!r} of pod {namespace}/{name} is not running", 400)
        return worker, runtime

    def exec_target(self, namespace: str, name: str, container: str) -> ExecTarget:
        """How ``kubectl exec`` runs a command in a running container: with the container's
        environment (the pod network library and the marks included), working directory, mount
        paths and user, as the container's own processes run. Unlike the container's command, an
        exec command's ``$(VAR)`` references are not expanded (nor are they by a real kubelet)."""
        worker, runtime = self._running_container(namespace, name, container)
        run_as = identity.run_as(worker.pod, runtime.spec)
        mounts = list(runtime.mounts)

        def command(argv: Sequence[str]) -> list[str]:
            return [rewrite_path(str(arg), mounts, host_file_of_the_image) for arg in argv]

        user = identity.command_prefix(run_as) if run_as is not None else []
        return ExecTarget(command, dict(runtime.env), runtime.cwd, user)

    def attach_target(self, namespace: str, name: str, container: str) -> AttachTarget:
        """A running container's output from now on (its log file is its stdout and stderr) and,
        with ``stdin: true``, its stdin (closed after the first attach with ``stdinOnce``)."""
        worker, runtime = self._running_container(namespace, name, container)
        path = worker.log_path(container)
        size = 0
        with contextlib.suppress(OSError):
            size = path.stat().st_size
        process = runtime.process
        stdin = process.stdin if process is not None else None
        once = bool(runtime.spec.get("stdinOnce"))
        return AttachTarget(path, size, functools.partial(self._still_writing, runtime), stdin, once)

    def pod_ip_of(self, namespace: str, name: str) -> str:
        """The IP ``kubectl port-forward`` connects to: the pod's own loopback address."""
        worker = self.kubelet.find_worker(namespace, name)
        if worker is None or not worker.pod_ip or self.kubelet.dead:
            raise StreamingError(f"pod {namespace}/{name} not found on node {self.kubelet.name}")
        return worker.pod_ip

    def _still_writing(self, runtime: ContainerRuntime) -> bool:
        return runtime.running and not self.kubelet.dead

    def running_containers(self) -> list[RunningContainer]:
        """The containers running now, for the resource metrics endpoint."""
        return [
            RunningContainer(w.namespace, w.name, w.uid, c.name, _epoch(c.started_at))
            for w in self.kubelet.workers.values()
            if not w.finished and not self.kubelet.dead
            for c in w.containers
            if c.running
        ]


class NodeReporter:
    """The node as the API server sees it: the Node registered with its Lease, the Lease renewed every
    heartbeat, and the Node's status posted when it is stale or its Ready condition is not what the
    kubelet reports (NotReady, a degradation)."""

    def __init__(self, kubelet: Kubelet) -> None:
        self.kubelet = kubelet

    async def register(self) -> None:
        if not self.kubelet.log_server.port:
            await self.kubelet.log_server.start()
        try:
            created = await self.kubelet.client.create(path_for("nodes"), self.kubelet.node)
        except ApiError as error:
            if error.status != 409:
                raise
            # Registered before (a restarted cluster): NodeRestriction lets a node keep its taints
            # only as they are, so just the labels are brought up to date.
            created = await self.kubelet.client.patch(
                path_for("nodes", name=self.kubelet.name),
                {"metadata": {"labels": self.kubelet.node["metadata"]["labels"]}},
            )
        await self.post_status()
        lease = lease_object(self.kubelet.name, created["metadata"]["uid"])
        try:
            await self.kubelet.client.create(path_for("leases", NODE_LEASE_NAMESPACE), lease)
        except ApiError as error:
            if error.status != 409:
                raise
            await self._renew_lease()

    async def post_status(self) -> None:
        status = node_status(
            self.kubelet.profile,
            host_ip=self.kubelet.host_ip,
            kubelet_port=self.kubelet.log_server.port,
            not_ready_message=self.kubelet.not_ready_message,
            degradation=self.kubelet.degradation,
        )
        current = self.kubelet.nodes.get(self.kubelet.name)
        if current is not None:
            status["conditions"] = [
                c
                for c in merge_conditions(
                    (current.get("status") or {}).get("conditions") or [], status["conditions"]
                )
                if c.get("type") not in self.kubelet.cleared_conditions
            ]
            for item in status["conditions"]:
                item["lastHeartbeatTime"] = now_rfc3339()
        cleared = set(self.kubelet.cleared_conditions)
        await self.kubelet.client.patch(
            path_for("nodes", name=self.kubelet.name, subresource="status"), {"status": status}
        )
        self.kubelet.cleared_conditions -= cleared

    async def _renew_lease(self) -> None:
        await self.kubelet.client.patch(
            path_for("leases", NODE_LEASE_NAMESPACE, self.kubelet.name), {"spec": {"renewTime": now_micro()}}
        )

    async def heartbeat(self) -> None:
        loop = asyncio.get_running_loop()
        last_status = loop.time()
        while True:
            await asyncio.sleep(self.kubelet.config.heartbeat_interval_seconds)
            await self.kubelet.connected.wait()
            try:
                await self._renew_lease()
                node = self.kubelet.nodes.get(self.kubelet.name)
                ready = ready_condition(node) if node else None
                stale = loop.time() - last_status >= self.kubelet.config.node_status_interval_seconds
                wanted = "True" if self.kubelet.not_ready_message is None else "False"
                if node is not None and (stale or ready is None or ready.get("status") != wanted):
                    await self.post_status()
                    last_status = loop.time()
            except asyncio.CancelledError:
                raise
            except ApiError as error:
                # 404: the Node (and with it the Lease, its dependent) was deleted by someone; like
                # a real kubelet this one does not re-register, and pod GC removes its pods.
                level = logging.DEBUG if error.status == 404 else logging.WARNING
                log.log(level, "node %s heartbeat failed: %s", self.kubelet.name, error)
            except Exception as error:
                log.warning("node %s heartbeat failed: %s", self.kubelet.name, error)


class Kubelet:
    """One node: registration, heartbeats, and the pods bound to it."""

    def __init__(
        self,
        name: str,
        profile: NodeProfile,
        node: dict[str, Any],
        *,
        client: KubeClient,
        pods: Informer,
        nodes: Informer,
        config: KubeletConfig,
        ips: IpAllocator,
        serving: CertPair,
        host_ip: str = "127.0.0.1",
    ) -> None:
        self.name = name
        self.profile = profile
        self.node = node
        self.client = client
        self.pods = pods
        self.nodes = nodes
        self.config = config
        self.ips = ips
        self.host_ip = host_ip
        self.connected = asyncio.Event()
        self.connected.set()
        self.dead = False
        self.not_ready_message: str | None = None
        self.degradation: Degradation | None = None
        # Condition types a healed degradation had added: dropped from the next status posted.
        self.cleared_conditions: set[str] = set()
        self.workers: dict[str, PodWorker] = {}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._sweeps: set[asyncio.Task[int]] = set()
        self.access = ContainerAccess(self)
        self.reporter = NodeReporter(self)
        self.streaming = StreamingEndpoints(
            self.access.exec_target, self.access.attach_target, self.access.pod_ip_of
        )
        resources = ResourceEndpoint(name, self.access.running_containers, MARKED_PROCESSES)
        routes = [*self.streaming.routes(), resources.route()]
        self.log_server = LogServer(self.access.locate_log, serving.cert, serving.key, routes)
        pods.subscribe(self._wake.set)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self.reporter.heartbeat(), name=f"heartbeat {self.name}"),
            asyncio.create_task(self._sync_loop(), name=f"kubelet {self.name}"),
        ]

    async def _sync_loop(self) -> None:
        await self.pods.synced()
        while True:
            await self.connected.wait()
            self._wake.clear()
            try:
                self.sync()
            except Exception:
                log.exception("kubelet %s sync failed", self.name)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=2)

    def sync(self) -> None:
        mine = {
            p["metadata"]["uid"]: p
            for p in self.pods.items()
            if p.get("spec", {}).get("nodeName") == self.name
        }
        for uid, pod in mine.items():
            worker = self.workers.get(uid)
            deleting = pod["metadata"].get("deletionTimestamp")
            if worker is None:
                if deleting:
                    # Never started here (or started by an earlier kubelet): nothing to stop.
                    task = asyncio.create_task(self._finish_delete(pod))
                    self._background.add(task)
                    task.add_done_callback(self._background.discard)
                    continue
                if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                worker = PodWorker(self, pod)
                self.workers[uid] = worker
                worker.start()
                continue
            worker.pod = pod
            if deleting:
                grace = pod["metadata"].get("deletionGracePeriodSeconds")
                if grace is None:
                    grace = pod.get("spec", {}).get("terminationGracePeriodSeconds", 30)
                worker.request_termination(float(grace))
        for uid in list(self.workers):
            if uid not in mine:
                # Force-deleted (or deleted by pod GC): the processes must not outlive the pod.
                worker = self.workers.pop(uid)
                if not worker.finished:
                    worker.kill_now()
                    worker.stop()

    async def _finish_delete(self, pod: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(ApiError):
            await self.client.delete(
                path_for("pods", meta["namespace"], meta["name"]), grace_period_seconds=0, uid=meta["uid"]
            )

    def with_entrypoint(self, container: Mapping[str, Any]) -> Mapping[str, Any]:
        """``container`` with the command its image stands for, when it names none itself."""
        if container.get("command"):
            return container
        entrypoint = self.config.image_entrypoints.get(image_name(str(container.get("image", ""))))
        return {**container, "command": list(entrypoint)} if entrypoint else container

    def find_worker(self, namespace: str, name: str) -> PodWorker | None:
        for worker in self.workers.values():
            if worker.namespace == namespace and worker.name == name and not worker.finished:
                return worker
        return None

    def sweep_marked(self, uid: str) -> None:
        """SIGKILL the pod's processes that left its process groups (launchers start new sessions),
        found by their mark in a thread: the scan reads every process's environment (0.3-0.6 s on
        a loaded machine), and every node's heartbeats share this loop: a few such scans in a row
        once read as a lost node."""
        task = asyncio.create_task(asyncio.to_thread(signal_marked, uid, None, signal.SIGKILL))
        self._sweeps.add(task)
        task.add_done_callback(self._sweeps.discard)

    async def swept(self) -> None:
        """Until every sweep started so far has signalled its processes."""
        await asyncio.gather(*self._sweeps, return_exceptions=True)

    # -- faults --------------------------------------------------------------------------------

    def kill(self) -> None:
        """The machine dies: every process SIGKILLed, no more heartbeats, status or deletes."""
        self.dead = True
        self.connected.clear()
        for task in self._tasks:
            task.cancel()
        for worker in self.workers.values():
            worker.kill_now()
            worker.stop()
            if worker._terminate_task is not None:
                worker._terminate_task.cancel()
        task = asyncio.create_task(self.reap())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        """Stop serving logs and streams and close the node's API connection (after ``kill``)."""
        await self.streaming.close()
        await self.log_server.stop()
        await self.client.close()

    async def reap(self) -> None:
        """Collect the exit of every process this kubelet started (after a kill nobody else waits)."""
        for worker in self.workers.values():
            for c in [*worker.init_containers, *worker.containers]:
                if c.process is not None:
                    with contextlib.suppress(TimeoutError, ProcessLookupError):
                        await asyncio.wait_for(c.process.wait(), timeout=10)

    def partition(self) -> None:
        """Cut the node off the API server: processes keep running, nothing is reported."""
        self.connected.clear()

    def heal(self) -> None:
        """End a partition, a NotReady spell or a degradation."""
        if not self.dead:
            self.not_ready_message = None
            degraded, self.degradation = self.degradation, None
            if degraded is not None:
                self.cleared_conditions |= {str(c.get("type")) for c in degraded.conditions}
            self.connected.set()
            self._wake.set()
            if degraded is not None:
                self._post_status_soon()

    def degrade(self, degradation: Degradation) -> None:
        """The node stays Ready but reports ``degradation`` (and keeps reporting it) until healed."""
        self.degradation = degradation
        self._post_status_soon()

    def _post_status_soon(self) -> None:
        task = asyncio.create_task(self.reporter.post_status())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def set_not_ready(self, message: str) -> None:
        """The kubelet stays in touch but reports Ready=False (a runtime or device failure)."""
        self.not_ready_message = message
