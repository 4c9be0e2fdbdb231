"""The engine behind `rtj demo` and `rtj bench goodput`: run a real job through faults on the local cluster.

`Stack` brings up what a user would have: the embedded local cluster (simulated cpu nodes whose
kubelet runs pods as local processes), the CRD applied with kubectl, and the operator started as
the `rtj operator` subprocess pointed at the cluster's kubeconfig. `run_job` submits one
ResilientTrainingJob built from examples/local-cpu.yaml with a fault plan, injects the faults the
trainer cannot inject itself (a lost node), follows the job until it finishes, and gathers the
timeline (`timeline.Timeline`) from the trainer's records, the operator's Events and its own record
of what it injected. Nothing is simulated beyond the cluster itself: the training is real FSDP on
gloo under real ft_launcher and inprocess.Wrapper, with real async checkpoints on a volume.
A `JobDriver` says what kind of job runs the training: `OperatorJob` (the ResilientTrainingJob, the
default) or `rtj_demo.indexedjob.IndexedJob` (the same training as a plain Kubernetes Job, with a
stack started without the operator where no run needs it).

The operator runs as a subprocess rather than in-process: that is how users run it, it keeps
kopf's event loop and signal handling out of the demo's process, and a crash of either side is
visible as such.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml
from rtj_localcluster.ports import reserve_port
from rtj_operator import api
from rtj_operator.constants import GROUP, LABEL_JOB, PLURAL, VERSION

from rtj_demo.report import LAYER_POD_REPLACEMENT, FaultRecord, RecoveryRecord
from rtj_demo.timeline import (
    Timeline,
    align_fault_times,
    faults_from_markers,
    from_progress_records,
    read_json_lines,
    recoveries_from_events,
)

NAMESPACE = "default"
# The trainer's progress file, in the job's checkpoint directory.
PROGRESS_FILE = "progress.jsonl"

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_JOB = REPO_ROOT / "examples" / "local-cpu.yaml"


class MissingComponentError(RuntimeError):
    """A component the rehearsal needs is not installed or not working; the message says which."""


@dataclass(frozen=True)
class PlannedFault:
    """A fault of the rehearsal: trainer faults go into RTJ_FAULTS, `node-loss` is injected here."""

    kind: str  # exception | sigkill | hang | node-loss
    step: int
    rank: int | None = None  # the global rank (trainer faults)
    # node-loss: the index of the worker whose node is lost; None: the node of a pod that trains at
    # the time (the one whose ranks wrote the newest step record), where which pods train is the
    # rendezvous' choice (standby spares).
    worker: int | None = 1

    def rtj_faults_entry(self) -> str:
        rank = "" if self.rank is None else f",rank={self.rank}"
        return f"{self.kind}@step={self.step}{rank}"


def mid_interval(step: int, interval: int) -> int:
    """`step` moved to the middle of its checkpoint interval. A fault just after a save would meet that
    save committed (sync) or still being written (async: resume from the one before), which would
    make the comparison of checkpoint modes depend on where the plan happened to fall."""
    return (step // interval) * interval + interval // 2


def rtj_faults(plan: Sequence[PlannedFault]) -> str:
    """The RTJ_FAULTS value for the trainer's share of the plan (format:
    rtj_trainer.rehearsal.fault_injection)."""
    return ";".join(f.rtj_faults_entry() for f in plan if f.kind != "node-loss")


@dataclass
class JobSettings:
    """What one rehearsal run changes in the example job."""

    name: str = "rehearsal"
    steps: int = 300
    checkpoint_interval: int = 20
    checkpoint_mode: str = "Async"
    in_process: bool = True
    max_in_job_restarts: int = 20
    max_node_replacements: int = 20  # every gang restart of a plain-restart run spends from it
    plan: list[PlannedFault] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    # Merged into the job's spec last (JSON merge patch: nested mappings merge, None removes a key),
    # for settings the fields above do not name.
    spec_patch: dict[str, Any] = field(default_factory=dict)


@dataclass
class JobResult:
    """What a run produced: the timeline, the job's final status, and why it ended."""

    name: str
    state: str
    timeline: Timeline
    status: dict[str, Any]
    events: list[dict[str, Any]]
    finished: bool
    message: str = ""
    manifests: list[dict[str, Any]] = field(default_factory=list)  # what was submitted


def example_nodes() -> int:
    """How many worker nodes the example job runs on (its `spec.nodes`)."""
    return int(load_example()["spec"]["nodes"])


def load_example() -> dict[str, Any]:
    if not EXAMPLE_JOB.is_file():
        raise MissingComponentError(
            f"the example job {EXAMPLE_JOB} is missing (it comes with the API/renderer)"
        )
    with EXAMPLE_JOB.open(encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    jobs = [d for d in docs if d.get("kind") == "ResilientTrainingJob"]
    if not jobs:
        raise MissingComponentError(f"{EXAMPLE_JOB} holds no ResilientTrainingJob")
    job: dict[str, Any] = jobs[0]
    return job


def _set_arg(args: list[str], name: str, value: str) -> list[str]:
    """Replace `name VALUE` / `name=VALUE` in an argv list, or append it."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == name and i + 1 < len(args):
            skip = True
            continue
        if arg.startswith(name + "="):
            continue
        out.append(arg)
    return [*out, name, value]


_OWN_ENV = {"RTJ_FAULTS", "RTJ_PROGRESS_SINK", "RTJ_PROGRESS_INTERVAL_SECONDS"}


def merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`target` with `patch` applied as a JSON merge patch (RFC 7386): mappings merge key by key, a
    None value removes the key, anything else replaces. Neither argument is changed."""
    merged = copy.deepcopy(dict(target))
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_patch(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def build_job(example: Mapping[str, Any], settings: JobSettings, *, rendezvous_port: int) -> dict[str, Any]:
    """The example job with the rehearsal's name, steps, checkpoint mode, recovery layers and faults."""
    job = copy.deepcopy(dict(example))
    job["metadata"] = {"name": settings.name, "namespace": NAMESPACE}
    spec = job.setdefault("spec", {})
    args = list(spec.get("args") or [])
    args = _set_arg(args, "--steps", str(settings.steps))
    for i in range(0, len(settings.extra_args) - 1, 2):
        args = _set_arg(args, settings.extra_args[i], settings.extra_args[i + 1])
    spec["args"] = args
    spec["rendezvous"] = {"port": rendezvous_port}
    ckpt = spec.setdefault("checkpoint", {})
    ckpt["intervalSteps"] = settings.checkpoint_interval
    ckpt["mode"] = settings.checkpoint_mode
    ft = spec.setdefault("faultTolerance", {})
    ft["maxInJobRestarts"] = settings.max_in_job_restarts
    ft.setdefault("inProcess", {})["enabled"] = settings.in_process
    spec.setdefault("failurePolicy", {})["maxNodeReplacements"] = settings.max_node_replacements
    mount = ckpt.get("mountPath", "/checkpoints")
    # The trainer's file sink writes one JSON line per report; at its own cadence of 0 that is one per
    # step, which the timeline needs. Its path is relative to the working directory, set to the
    # checkpoint mount: the kubelet rewrites a workingDir under a mount path to the volume's real
    # directory, but not a `file:` value, so this is how the file lands where the demo can read it.
    # The progress endpoint, which the operator reads into the job's status, and the node state get
    # one a second (and at once on a commit, a recovery or the end), not three file writes a step.
    spec["workingDir"] = mount
    env = [e for e in spec.get("env") or [] if e.get("name") not in _OWN_ENV]
    env += [
        {"name": "RTJ_FAULTS", "value": rtj_faults(settings.plan)},
        {"name": "RTJ_PROGRESS_SINK", "value": f"endpoint,file:{settings.name}/{PROGRESS_FILE}@0"},
        {"name": "RTJ_PROGRESS_INTERVAL_SECONDS", "value": "1"},
    ]
    env += [{"name": k, "value": v} for k, v in settings.extra_env.items()]
    spec["env"] = env
    job["spec"] = merge_patch(spec, settings.spec_patch)
    return job


def dropped_fields(sent: Any, stored: Any, path: str = "") -> list[str]:
    """The paths of mapping keys in `sent` that `stored` lacks: what the API server pruned (fields the
    CRD's schema does not know)."""
    if not isinstance(sent, Mapping) or not isinstance(stored, Mapping):
        return []
    missing: list[str] = []
    for key, value in sent.items():
        where = f"{path}.{key}" if path else str(key)
        if key not in stored:
            missing.append(where)
        else:
            missing += dropped_fields(value, stored[key], where)
    return missing


def _wait(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def install_crd(kubectl: Callable[..., str], custom: Any) -> None:
    """Apply the CRD and wait until the API server serves its objects (`custom`: a CustomObjectsApi)."""
    try:
        from rtj_operator.api import crd_yaml
    except ImportError as err:
        raise MissingComponentError(f"the API models (rtj_operator.api) are missing: {err}") from err
    kubectl("apply", "-f", "-", input_text=crd_yaml())
    # Polled rather than `kubectl wait`, which fails at once while a new CRD has no conditions yet
    # (and so does this jsonpath filter: an error is "not yet").
    established = '{.status.conditions[?(@.type=="Established")].status}'

    def is_established() -> bool:
        try:
            return kubectl("get", f"crd/{PLURAL}.{GROUP}", "-o", f"jsonpath={established}") == "True"
        except RuntimeError:
            return False

    _wait(is_established, 60, "the CRD to be established")
    # Established is not yet served: until the API server's cache of the new resource is filled,
    # a list is refused (429 "storage is (re)initializing"), and the operator's first watch would
    # back off for seconds while the first job waits.
    _wait(lambda: _jobs_listed(custom), 60, "the API server to serve the CRD's objects")


def _jobs_listed(custom: Any) -> bool:
    from kubernetes.client.exceptions import ApiException

    try:
        custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)
    except ApiException:
        return False
    return True


def _answers_ok(url: str) -> bool:
    """Whether a health endpoint answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


class Stack:
    """The local cluster, the CRD and the operator subprocess, for one or more job runs."""

    def __init__(
        self,
        *,
        nodes: int = 4,
        grace_seconds: float = 3.0,
        out_dir: Path,
        operator: bool = True,
    ) -> None:
        self.nodes = nodes
        self.grace_seconds = grace_seconds
        self.with_operator = operator
        self.out_dir = out_dir
        self.state_dir = Path(tempfile.mkdtemp(prefix="rtj-demo-"))
        self.cluster: Any = None
        self.kubeconfig: Path | None = None
        self.operator: subprocess.Popen[bytes] | None = None
        self._operator_log: Any = None
        self._operator_health = ""
        self.api: Any = None

    # -- bring-up ---------------------------------------------------------------------------------

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._start_cluster()
        install_crd(self.kubectl, self.custom)
        if self.with_operator:
            self._start_operator()
            # A job is submitted to an operator that runs, as a user's is: the figures from submission
            # count the job's start-up, not the operator's own (1.5-2.5 s on two loaded cores).
            _wait(self._operator_healthy, 120, "the operator's health endpoint")

    def _start_cluster(self) -> None:
        try:
            from rtj_localcluster.cluster import LocalCluster, LocalClusterSettings
        except ImportError as err:
            raise MissingComponentError(
                f"the embedded local cluster (rtj_localcluster.cluster) is missing: {err}"
            ) from err
        settings = LocalClusterSettings(
            nodes=self.nodes,
            profile="cpu",
            node_monitor_grace_seconds=self.grace_seconds,
            state_dir=self.state_dir / "cluster",
        )
        self.cluster = LocalCluster(settings)
        self.cluster.start()
        self.kubeconfig = Path(self.cluster.kubeconfig_path)
        from kubernetes import client, config

        self.api = config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        _wait(
            lambda: sum(_node_ready(n) for n in self.core.list_node().items) >= self.nodes,
            120,
            f"{self.nodes} Ready nodes",
        )

    def kubectl(self, *args: str, input_text: str | None = None, timeout: float = 120) -> str:
        from rtj_localcluster.binaries import MissingBinaryError, program

        try:
            kubectl = program("kubectl")
        except MissingBinaryError as error:
            raise MissingComponentError(str(error)) from error
        done = subprocess.run(
            [str(kubectl), "--kubeconfig", str(self.kubeconfig), *args],
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    def _start_operator(self) -> None:
        if importlib.util.find_spec("rtj_operator.main") is None:
            raise MissingComponentError("the operator (rtj_operator.main, `rtj operator`) is not installed")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._operator_log = (self.out_dir / "operator.log").open("wb")
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1"}
        self._operator_health = f"http://127.0.0.1:{reserve_port()}/healthz"
        self.operator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rtj_operator.cli",
                "operator",
                "--namespace",
                NAMESPACE,
                "--kubeconfig",
                str(self.kubeconfig),
                "--liveness",
                self._operator_health,
            ],
            env=env,
            stdout=self._operator_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _operator_healthy(self) -> bool:
        """Whether the operator answers its health endpoint (it has heard from the API server)."""
        self.check_operator()
        return _answers_ok(self._operator_health)

    def check_operator(self) -> None:
        if self.operator is not None and self.operator.poll() is not None:
            raise RuntimeError(
                f"the operator exited with code {self.operator.returncode}; "
                f"see {self.out_dir / 'operator.log'}"
            )

    # -- teardown ---------------------------------------------------------------------------------

    def stop(self) -> None:
        if self.operator is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.operator.pid, signal.SIGTERM)
            try:
                self.operator.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.operator.pid, signal.SIGKILL)
                self.operator.wait(timeout=10)
            self.operator = None
        if self._operator_log is not None:
            self._operator_log.close()
            self._operator_log = None
        if self.api is not None:
            self.api.close()
            self.api = None
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        shutil.rmtree(self.state_dir, ignore_errors=True)

    # -- jobs -------------------------------------------------------------------------------------

    def volume_dir(self, job_name: str) -> Path | None:
        """The real directory behind the job's checkpoint volume (None until the claim is bound)."""
        from rtj_localcluster.pod_volumes import volume_directory

        pvc = self.core.read_namespaced_persistent_volume_claim(f"{job_name}-checkpoints", NAMESPACE)
        if not pvc.spec or not pvc.spec.volume_name or not pvc.status or pvc.status.phase != "Bound":
            return None
        pv = self.api.sanitize_for_serialization(self.core.read_persistent_volume(pvc.spec.volume_name))
        return Path(volume_directory(pv, self.cluster.state_dir))

    def get_job(self, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            job = self.custom.get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return job if isinstance(job, dict) else None

    def job_events(self, name: str) -> list[dict[str, Any]]:
        items = self.core.list_namespaced_event(NAMESPACE, field_selector=f"involvedObject.name={name}").items
        return [self.api.sanitize_for_serialization(e) for e in items]

    def pod_summary(self, job_name: str, label_selector: str | None = None) -> str:
        """One line on the job's pods, for a rehearsal that stopped making progress."""
        selector = label_selector or f"{LABEL_JOB}={job_name}"
        pods = self.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
        parts = []
        for pod in pods:
            phase = pod.status.phase if pod.status else "?"
            node = pod.spec.node_name if pod.spec else "?"
            parts.append(f"{pod.metadata.name if pod.metadata else '?'} {phase} on {node}")
        return ", ".join(parts) or "none"

    def save_pod_logs(self, job_name: str, directory: Path, label_selector: str | None = None) -> list[Path]:
        """Copy the logs of the job's current pods (ft_launcher and the ranks) next to the report."""
        directory.mkdir(parents=True, exist_ok=True)
        saved = []
        selector = label_selector or f"{LABEL_JOB}={job_name}"
        pods = self.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
        for pod in pods:
            name = pod.metadata.name if pod.metadata else None
            if not name:
                continue
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                path = directory / f"{name}.log"
                path.write_text(self.kubectl("logs", name, timeout=60), encoding="utf-8")
                saved.append(path)
        return saved

    def worker_node(self, job_name: str, index: int) -> str | None:
        return self.pod_node(f"{job_name}-worker-{index}")

    def pod_node(self, pod_name: str) -> str | None:
        """The node pod `pod_name` runs on (None: no such pod now, or not placed)."""
        from kubernetes.client.exceptions import ApiException

        try:
            pod = self.core.read_namespaced_pod(pod_name, NAMESPACE)
        except ApiException:
            return None
        return pod.spec.node_name if pod.spec is not None else None

    def delete_job(self, name: str, timeout: float = 120) -> None:
        from kubernetes.client.exceptions import ApiException

        with contextlib.suppress(ApiException):
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)

        def gone() -> bool:
            pods = self.core.list_namespaced_pod(NAMESPACE, label_selector=f"{LABEL_JOB}={name}").items
            return self.get_job(name) is None and not pods

        _wait(gone, timeout, f"job {name} and its pods to be deleted")
        # The checkpoint claim is retained by design (retentionPolicy Retain); a rerun starts afresh.
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_persistent_volume_claim(f"{name}-checkpoints", NAMESPACE)


def _node_ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or []))


@dataclass
class Observation:
    """What the follower saw at one poll, for the live line."""

    step: int
    state: str
    restarts: dict[str, int]
    checkpoint_step: int | None
    elapsed: float


class JobDriver(Protocol):
    """How `run_job` submits one kind of job and follows it: a ResilientTrainingJob the operator runs
    (`OperatorJob`), or the same training as a plain Kubernetes Job (`rtj_demo.indexedjob`)."""

    name: str
    label_selector: str  # selects the job's pods
    objects: list[dict[str, Any]]  # what `submit` created

    def submit(self, manifest: Mapping[str, Any]) -> list[str]:
        """Create the job from the ResilientTrainingJob manifest `build_job` made; returns notes for
        the user (what the API server changed)."""

    def poll(self) -> tuple[str, dict[str, Any]]:
        """(state, status): state is Pending, Running, ..., Succeeded or Failed; status as the API says."""

    def worker_node(self, index: int) -> str | None:
        """The node the current pod of worker `index` runs on (None: no such pod now)."""

    def slot_node(self, slot: int) -> str | None:
        """The node of the pod in `slot` (the node rank a pod reports: worker i is slot i, spare k
        is slot nodes + k; None: no such pod now)."""

    def lose_node(self, node: str, on_note: Callable[[str], None]) -> None:
        """The node is lost (its machine dies)."""

    def tick(self, on_note: Callable[[str], None]) -> None:
        """Called once per poll: for what follows a loss later (a Node object deleted)."""

    def events(self) -> list[dict[str, Any]]:
        """The Events on the job, as the API returns them."""

    def recoveries(self, events: Sequence[Mapping[str, Any]]) -> list[RecoveryRecord]:
        """What Kubernetes or the operator did to recover, with its time."""

    def end_message(self, state: str, status: Mapping[str, Any]) -> str:
        """Why the job ended, from its status."""


class OperatorJob:
    """A ResilientTrainingJob: the operator creates the pods and recovers them, reporting by Events."""

    def __init__(self, stack: Stack, name: str) -> None:
        self.stack = stack
        self.name = name
        self.label_selector = f"{LABEL_JOB}={name}"
        self.objects: list[dict[str, Any]] = []

    def submit(self, manifest: Mapping[str, Any]) -> list[str]:
        self.objects = [dict(manifest)]
        stored = self.stack.custom.create_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, dict(manifest)
        )
        stored_spec = stored.get("spec") if isinstance(stored, dict) else None
        dropped = dropped_fields(manifest.get("spec"), stored_spec, "spec")
        if not dropped:
            return []
        return ["the API server dropped fields its schema does not know: " + ", ".join(dropped)]

    def poll(self) -> tuple[str, dict[str, Any]]:
        self.stack.check_operator()
        job = self.stack.get_job(self.name) or {}
        status = job.get("status") or {}
        return str(status.get("state") or "Pending"), status

    def worker_node(self, index: int) -> str | None:
        return self.stack.worker_node(self.name, index)

    def slot_node(self, slot: int) -> str | None:
        nodes = example_nodes()
        role, index = ("worker", slot) if slot < nodes else ("spare", slot - nodes)
        return self.stack.pod_node(f"{self.name}-{role}-{index}")

    def lose_node(self, node: str, on_note: Callable[[str], None]) -> None:
        # The machine dies and stays dead: the node lifecycle controller marks it NotReady after the
        # cluster's grace period, the operator replaces the pod (its Node object stays).
        self.stack.cluster.kill_node(node)

    def tick(self, on_note: Callable[[str], None]) -> None:
        return None

    def events(self) -> list[dict[str, Any]]:
        return self.stack.job_events(self.name)

    def recoveries(self, events: Sequence[Mapping[str, Any]]) -> list[RecoveryRecord]:
        found = recoveries_from_events(events)
        if self.objects and api.spares_in_training(api.parse_job(self.objects[0]).spec):
            # The spares took over the lost pod's ranks; its replacement stands by: a refill of the
            # spares, which recovers nothing.
            found = [r for r in found if r.layer != LAYER_POD_REPLACEMENT]
        return found

    def end_message(self, state: str, status: Mapping[str, Any]) -> str:
        return _condition_message(status, state)


def run_job(
    stack: Stack,
    settings: JobSettings,
    *,
    timeout: float,
    on_update: Callable[[Observation], None] = lambda _: None,
    on_note: Callable[[str], None] = print,
    stall_note_seconds: float = 90.0,
    driver: JobDriver | None = None,
) -> JobResult:
    """Submit the job, inject the plan's node losses, follow it to the end and gather its timeline.
    `driver` says what kind of job runs the training (default: a ResilientTrainingJob)."""
    job = driver if driver is not None else OperatorJob(stack, settings.name)
    example = load_example()
    manifest = build_job(example, settings, rendezvous_port=reserve_port())
    submitted = time.time()
    for note in job.submit(manifest):
        on_note(note)
    node_losses = sorted((f for f in settings.plan if f.kind == "node-loss"), key=lambda f: f.step)
    injected: list[FaultRecord] = []
    volume: Path | None = None
    state, finished, message = "Pending", False, ""
    status: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    last_step, last_change = -1, time.monotonic()
    newest_ckpt: int | None = None
    while True:
        state, status = job.poll()
        if volume is None:
            with contextlib.suppress(Exception):
                volume = stack.volume_dir(settings.name)
        record = _newest_record(volume, settings.name)
        obs = observe({**status, "state": state}, record, time.time() - submitted)
        # The newest line may be a node that learns of commits later than rank 0: never go back.
        if obs.checkpoint_step is not None or newest_ckpt is not None:
            obs.checkpoint_step = max(obs.checkpoint_step or 0, newest_ckpt or 0)
            newest_ckpt = obs.checkpoint_step
        step = obs.step
        on_update(obs)
        if step != last_step:
            last_step, last_change = step, time.monotonic()
        elif time.monotonic() - last_change > stall_note_seconds:
            summary = stack.pod_summary(settings.name, job.label_selector)
            on_note(f"no new step for {stall_note_seconds:.0f} s; pods: {summary}")
            last_change = time.monotonic()
        if node_losses and step >= node_losses[0].step:
            node, whose = _loss_target(job, node_losses[0], record)
            if node:
                # The fault's time is when the kill begins: killing a node's processes takes a while,
                # and a recovery in-process can be over before the call returns.
                struck = time.time()
                job.lose_node(node, on_note)
                injected.append(FaultRecord(time=struck, kind="node-loss", killed_by=time.time()))
                on_note(f"fault: node {node} ({whose}) killed at step {step}")
                node_losses.pop(0)
        job.tick(on_note)
        if state in ("Succeeded", "Failed"):
            finished = state == "Succeeded"
            message = job.end_message(state, status)
            break
        if time.monotonic() > deadline:
            message = f"the job did not finish within {timeout:.0f} s (state {state}, step {step})"
            break
        time.sleep(1.0)
    timeline = Timeline(start_time=submitted)
    if volume is not None:
        job_dir = volume / settings.name
        timeline.extend(from_progress_records(read_json_lines(job_dir / PROGRESS_FILE)))
        timeline.faults += faults_from_markers(job_dir / "faults-fired")
    events = job.events()
    timeline.recoveries += job.recoveries(events)
    timeline.faults = align_fault_times(timeline.steps, timeline.faults + injected)
    timeline.faults.sort(key=lambda f: f.time)
    timeline.recoveries.sort(key=lambda r: r.time)
    return JobResult(settings.name, state, timeline, status, events, finished, message, job.objects)


def _loss_target(job: JobDriver, fault: PlannedFault, record: Mapping[str, Any]) -> tuple[str | None, str]:
    """The node a node-loss fault takes, and whose pod it holds: the planned worker's, or (worker None)
    that of the pod whose ranks wrote the newest step record."""
    if fault.worker is not None:
        return job.worker_node(fault.worker), f"worker {fault.worker}"
    slot = record.get("nodeRank")
    if not isinstance(slot, int) or isinstance(slot, bool):
        return None, ""
    return job.slot_node(slot), f"the pod in slot {slot}, training"


def _newest_record(volume: Path | None, name: str) -> dict[str, Any]:
    """The newest record in the trainer's progress file (the file's last complete line)."""
    if volume is None:
        return {}
    path = volume / name / PROGRESS_FILE
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            tail = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return {}
    for line in reversed(tail):
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                return record
    return {}


def observe(status: Mapping[str, Any], record: Mapping[str, Any], elapsed: float) -> Observation:
    """The live view: the job's status (state, pod replacements) and the trainer's newest record
    (step, restarts per layer, checkpoint), whichever is further along."""
    restarts = status.get("restarts") or {}
    trainer_restarts = record.get("restarts") or {}
    ckpt_steps = [
        s
        for s in (
            (status.get("lastCheckpoint") or {}).get("step"),
            (record.get("lastCheckpoint") or {}).get("step"),
        )
        if isinstance(s, int)
    ]
    return Observation(
        step=max(int((status.get("progress") or {}).get("step") or 0), int(record.get("step") or 0)),
        state=str(status.get("state") or "Pending"),
        restarts={
            "in-process": max(int(restarts.get("inProcess", 0)), int(trainer_restarts.get("inProcess", 0))),
            "in-job": max(int(restarts.get("inJob", 0)), int(trainer_restarts.get("inJob", 0))),
            "pod": int(restarts.get("podReplacement", 0)),
        },
        checkpoint_step=max(ckpt_steps) if ckpt_steps else None,
        elapsed=elapsed,
    )


def _condition_message(status: Mapping[str, Any], cond_type: str) -> str:
    for cond in status.get("conditions") or []:
        if cond.get("type") == cond_type:
            return f"{cond.get('reason', '')}: {cond.get('message', '')}"
    return ""
