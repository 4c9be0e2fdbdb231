"""``rtj-launch -- <training command...>``: the worker container's entry point and main process.

It turns the environment contract (``rtj_trainer.library.env``) into an ``ft_launcher`` command line and runs
it as its child, so ft_launcher (NVRx's torchrun) restarts the workers of this node on a crash or a
missed heartbeat (in-job restart), while ``rtj-launch`` stays for the pod's whole life: it serves
the pod's progress endpoint (``rtj_trainer.runtime.endpoint``: the progress report for the operator, the
trainer's Prometheus metrics) through every restart, marks a drain before it forwards SIGTERM
(``rtj_trainer.runtime.supervisor.run_forwarding_drain``, ``rtj_trainer.library.drain``), writes
the termination message and exits with ft_launcher's status. The argv is built by the pure
:func:`ft_launcher_argv` and passed as a list: nothing the user wrote reaches a shell.

Each rank runs under the rank shim (``rtj_trainer.runtime.rankshim``), which keeps a record of it in a
pod-local directory; :class:`RankHistory` keeps every record across ft_launcher's restarts, and the
endpoint serves the library's report merged with the launcher view derived from them
(``rtj_trainer.runtime.launcher_view``): restarts, recoveries, and the step when the job declares a log-line
pattern (``RTJ_STEP_LOG_PATTERN``), for a script that does not use the library too. When two
generations of ranks in a row fail the same way before their first step (a wrong script path),
``rtj-launch`` stops ft_launcher and exits with ``rtj_contract.termination.STARTUP_FAILURE_EXIT_CODE`` and a
``FaultReason: StartupFailed`` termination message, instead of restarting it until the budget is
spent; when two generations in a row fail the same way after the same step (the library's note on
the exception says which, ``rtj_trainer.library.failed_step``, else the step pattern), it does the
same with ``NO_RESTART_EXIT_CODE`` and ``FaultReason: DeterministicFailure``.
ft_launcher's own settings come from ``RTJ_FT_CONFIG`` (YAML text, written to a file) or
``RTJ_FT_CONFIG_FILE`` (a mounted file), passed with its config-path flag; the flags built here
override the file's values.

Rendezvous: worker 0 hosts the c10d store (``is_host=1``), every node dials ``RTJ_RDZV_HOST``
(``J-worker-0.J.NS.svc``); with a store pod (``RTJ_STORE_HOST`` set: rendezvous.host StorePod) the
store pod hosts it (``rtj_trainer.runtime.store``), ``RTJ_RDZV_HOST`` is its name and every node is a
client. The name exists only once the headless service publishes the pod, and a local cluster
resolves it only in Python, so it is resolved here, with retries, and ft_launcher gets an address.
With ``RTJ_ROLE=spare`` nothing is launched: the pod holds its node until it is deleted; but where
the spares stand by in the rendezvous (``RTJ_NNODES_MAX`` above ``RTJ_NNODES``: rendezvous.spares
Standby, NVRx 0.7 on) a spare runs ft_launcher as a worker does, its infrastructure rank after the
workers', and NVRx's barrier rendezvous keeps it out of the training until a round needs it.
``RTJ_LAUNCH_MODE=direct`` runs the command as the only child (no ft_launcher, no shim), and the
supervisor mode runs the ranks itself (``rtj_trainer.runtime.supervisor``).
``rtj-launch --prepare-checkpoint-dir`` is the checkpoint-directory init container
(``rtj_trainer.runtime.checkpoint_dir``); ``rtj-launch --install-runtime <dir>`` copies the runtime
into a volume for an image without it (``rtj_trainer.runtime.install``).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from rtj_contract.env import (
    FT_CONFIG,
    FT_CONFIG_FILE,
    LAUNCH_MODE,
    LAUNCH_MODE_DIRECT,
    NNODES,
    NNODES_MAX,
    ROLE_SPARE,
    STEP_LOG_PATTERN,
)

from rtj_trainer.library import drain
from rtj_trainer.library.env import EnvError, TrainerEnv
from rtj_trainer.library.progress import LIBRARY_VERSION, PROGRESS_FILE_ENV
from rtj_trainer.runtime import install, launcher_view, rankshim
from rtj_trainer.runtime.endpoint import ProgressEndpoint
from rtj_trainer.runtime.launcher_view import LauncherView, RankRecord, RepeatedFailure, StartupFailure

if TYPE_CHECKING:
    from rtj_trainer.runtime.supervisor import Child

# What stops ft_launcher for good: a command that cannot start, or one that fails at the same step.
LaunchFailure = StartupFailure | RepeatedFailure

log = logging.getLogger("rtj_trainer.runtime.launch")

# The init container's argument (rtj_trainer.runtime.checkpoint_dir): no launcher, only the directory.
PREPARE_CHECKPOINT_DIR = "--prepare-checkpoint-dir"
# How often the rank records are read: recoveries are timed from the records' own epochs, so this
# only bounds how late the view and a start-up failure's verdict are.
RANKS_POLL_SECONDS: Final = 0.5
# After a start-up failure, how long ft_launcher gets to stop its workers before SIGKILL.
STOP_GRACE_SECONDS: Final = 10.0
# ft_launcher's config file (from RTJ_FT_CONFIG), in rtj-launch's own directory under TMPDIR.
FT_CONFIG_FILE_NAME: Final = "ft-launcher.yaml"
FT_CONFIG_SECTION: Final = "fault_tolerance"


def _fmt_seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def ft_launcher_argv(
    env: TrainerEnv,
    *,
    rdzv_address: str,
    command: Sequence[str],
    cpu: bool,
    launcher: str = "ft_launcher",
    nvrx_version: tuple[int, ...] | None = None,
    config_path: str | None = None,
    config_keys: Collection[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """The ft_launcher command for this node (pure when ``nvrx_version`` is given): each rank runs
    `command` under the rank shim (with the interpreter `python`); `config_path` is ft_launcher's
    config file, whose values the flags here override, but for the heartbeat timeouts that the file
    sets itself (`config_keys`, the keys of its fault_tolerance section): those stay the file's (null
    there turns a timeout off, as a script that only times sections needs)."""
    if not command:
        raise ValueError("no training command given after --")
    # Imported here: it imports torch, which a spare never needs (nor the threads it starts).
    from rtj_trainer.library import nvrx_compat

    version = nvrx_version if nvrx_version is not None else nvrx_compat.nvrx_version()
    names = dict(nvrx_compat.ft_launcher_flags(version))
    argv = [
        launcher,
        f"--nnodes={env.nnodes}:{env.nnodes_max}",
        f"--nproc-per-node={env.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={_host_port(rdzv_address, env.rdzv_port)}",
        f"--rdzv-id={env.job_uid}",
        f"--rdzv-conf=is_host={1 if hosts_rendezvous(env) else 0}",
        *_heartbeat_flags(env, names, config_keys),
        f"--monitor-interval={_fmt_seconds(env.ft_monitor_interval_seconds)}",
        f"--max-restarts={env.max_restarts}",
    ]
    if env.pod_ip:
        # Rank 0's agent publishes this as MASTER_ADDR: the pod IP is reachable from every node,
        # a pod's own hostname may not resolve elsewhere.
        argv.append(f"--local-addr={env.pod_ip}")
    if config_path:
        argv.append(f"{names['config_path']}={config_path}")
    # Options whose defaults differ between NVRx releases, each chosen in nvrx_compat.
    argv += nvrx_compat.ft_launcher_tuning(cpu=cpu, version=version)
    argv += ["--no-python", *rankshim.command(python), *command]
    return argv


# ft_launcher's config keys for the heartbeat timeouts -> the flags that would override them.
HEARTBEAT_CONFIG_KEYS: Final = {
    "initial_rank_heartbeat_timeout": "initial_heartbeat_timeout",
    "rank_heartbeat_timeout": "heartbeat_timeout",
}


def hosts_rendezvous(env: TrainerEnv) -> bool:
    """Whether this node's ft_launcher hosts the rendezvous store: worker 0's, unless the store pod
    does (its address is set)."""
    return env.node_rank == 0 and not env.store_host


def _heartbeat_flags(env: TrainerEnv, names: Mapping[str, str], config_keys: Collection[str]) -> list[str]:
    """The spec's heartbeat timeouts as flags, but for those the config file sets."""
    seconds = {
        "initial_heartbeat_timeout": env.ft_initial_heartbeat_timeout_seconds,
        "heartbeat_timeout": env.ft_heartbeat_timeout_seconds,
    }
    file_sets = {HEARTBEAT_CONFIG_KEYS[key] for key in config_keys if key in HEARTBEAT_CONFIG_KEYS}
    return [
        f"{names[flag]}={_fmt_seconds(value)}" for flag, value in seconds.items() if flag not in file_sets
    ]


def find_ft_section(data: object) -> dict[str, Any] | None:
    """The first non-empty ``fault_tolerance`` mapping NVRx would find in `data`, at the top or
    nested (as FaultToleranceConfig.from_yaml_file searches); None when there is none."""
    if isinstance(data, dict):
        section = data.get(FT_CONFIG_SECTION)
        if isinstance(section, dict) and section:
            return section
        values: list[object] = list(data.values())
    elif isinstance(data, list):
        values = list(data)
    else:
        return None
    return next((found for value in values if (found := find_ft_section(value)) is not None), None)


def ft_section_keys(data: object) -> frozenset[str]:
    """The keys of the ``fault_tolerance`` section NVRx would find in `data` (none: empty)."""
    section = find_ft_section(data)
    return frozenset(str(key) for key in section) if section is not None else frozenset()


def _load_yaml(text: str, what: str) -> object:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise EnvError(f"{what} is not YAML: {err}") from err


def inline_ft_config(raw: str) -> dict[str, Any]:
    """``RTJ_FT_CONFIG`` as ft_launcher's config: the mapping as given when it holds a
    ``fault_tolerance`` section, else put under one (NVRx ignores a file without it). EnvError when
    it is not a YAML mapping."""
    data = _load_yaml(raw, FT_CONFIG)
    if not isinstance(data, dict) or not data:
        raise EnvError(f"{FT_CONFIG} must be a YAML mapping (ft_launcher's {FT_CONFIG_SECTION} settings)")
    return data if find_ft_section(data) is not None else {FT_CONFIG_SECTION: data}


def mounted_ft_config(path: str) -> dict[str, Any]:
    """``RTJ_FT_CONFIG_FILE``'s content; EnvError unless it is a readable YAML mapping with a
    ``fault_tolerance`` section (ft_launcher would fail on a missing file and silently ignore one
    without the section)."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise EnvError(f"{FT_CONFIG_FILE}={path}: {err}") from err
    data = _load_yaml(text, f"{FT_CONFIG_FILE}={path}")
    if not isinstance(data, dict) or find_ft_section(data) is None:
        raise EnvError(
            f"{FT_CONFIG_FILE}={path} has no {FT_CONFIG_SECTION} section: ft_launcher would ignore it"
        )
    return data


def heartbeat_timeouts_off(data: dict[str, Any] | None) -> dict[str, Any]:
    """`data` (a copy) with both heartbeat timeouts null in its ``fault_tolerance`` section (made when
    missing): what the spec's 0 means. Only the file can say it: the flags take numbers, and leaving
    them out gives NVRx's own defaults."""
    import copy

    config = copy.deepcopy(data) if data is not None else {}
    section = find_ft_section(config)
    if section is None:
        section = config.setdefault(FT_CONFIG_SECTION, {})
    for key in HEARTBEAT_CONFIG_KEYS:
        section[key] = None
    return config


def ft_config(env: TrainerEnv) -> dict[str, Any] | None:
    """The config file ft_launcher gets, None for none: the spec's inline config or the mounted
    file, with the heartbeat timeouts off when the spec sets them to 0. EnvError for a bad one."""
    data = None
    if env.ft_config:
        data = inline_ft_config(env.ft_config)
    elif env.ft_config_file:
        data = mounted_ft_config(env.ft_config_file)
    if env.ft_heartbeat_timeout_seconds == 0:
        data = heartbeat_timeouts_off(data)
    return data


def check_step_log_pattern(pattern: str) -> None:
    """EnvError unless ``RTJ_STEP_LOG_PATTERN`` (when set) is a pattern the rank shim can use. Only the
    shim reads it, and it ignores one it cannot use: rtj-launch rejects it before any rank starts, so a
    wrong spec ends the pod with StartupFailed instead of a job that never reports a step."""
    if not pattern:
        return
    try:
        rankshim.compile_step_pattern(pattern)
    except ValueError as err:
        raise EnvError(f"{STEP_LOG_PATTERN}: {err}") from err


def resolve(
    host: str,
    port: int,
    *,
    timeout: float = 600.0,
    resolver: Callable[..., Sequence[tuple[Any, ...]]] = socket.getaddrinfo,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """The address of ``host``, retried until the name exists (a headless record appears late)."""
    deadline = time.monotonic() + timeout
    delay = 0.5
    while True:
        try:
            infos = resolver(host, port, type=socket.SOCK_STREAM)
        except OSError as err:
            if time.monotonic() + delay > deadline:
                raise RuntimeError(
                    f"rendezvous host {host!r} did not resolve within {timeout:.0f} s"
                ) from err
            log.info("waiting for %s to resolve (%s)", host, err)
            sleep(delay)
            delay = min(delay * 2, 5.0)
            continue
        # Prefer IPv4: the c10d store and gloo bind IPv4 wildcards on these machines.
        infos = sorted(infos, key=lambda info: 0 if info[0] == socket.AF_INET else 1)
        sockaddr = infos[0][4]
        assert isinstance(sockaddr, tuple)
        return str(sockaddr[0])


def _find_executable(name: str) -> str:
    """``name`` on PATH, else next to this interpreter (a virtual environment not on PATH)."""
    if os.sep in name:
        return name
    found = shutil.which(name)
    if found:
        return found
    sibling = Path(sys.executable).parent / name
    return str(sibling) if sibling.exists() else name


def check_standby_support(env: TrainerEnv, version: tuple[int, ...]) -> None:
    """EnvError where the spares are to stand by in the rendezvous but the release cannot keep them
    out of the training: before 0.7's barrier rendezvous, ft_launcher's --nnodes=N:M (torchrun's
    elastic range) grows the world with every node that joins."""
    from rtj_trainer.library import nvrx_compat

    if env.standby_spares and version < nvrx_compat.NVRX_0_7:
        raise EnvError(
            f"rendezvous.spares Standby ({NNODES_MAX}={env.nnodes_max} > {NNODES}={env.nnodes}) needs NVRx "
            f"0.7 or later, whose rendezvous keeps standby nodes out of the training; this image has "
            f"{'.'.join(map(str, version))}: use rendezvous.spares HoldNode"
        )


# How often an idle spare looks for its SIGTERM (a sleep resumes after the handler ran): a surge pod
# or a given-up spare leaves its node for the replacement within this.
SPARE_POLL_SECONDS: Final = 0.05


def idle_as_spare() -> int:
    """Hold the node until the operator deletes the pod (SIGTERM)."""
    from rtj_trainer.runtime.supervisor import record_release_signals

    released = record_release_signals()
    log.info("hot spare: holding the node until SIGTERM")
    while not released:
        time.sleep(SPARE_POLL_SECONDS)
    log.info("hot spare: %s received, releasing the node", signal.Signals(released[0]).name)
    return 0


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when rtj-launch dies (it runs in its own session, so a
    process-group kill of the container would otherwise leave it running)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RankHistory:
    """Every rank record (``rtj_trainer.runtime.rankshim``) seen in `directory`, by (local rank, pid),
    across ft_launcher's restarts (one file per process). A thread reads the directory every
    :data:`RANKS_POLL_SECONDS`; a record whose shim is gone without its exit record (killed) is
    closed when that is noticed. `on_failure` is called once, from that thread, when the records
    show a start-up failure or a repeated failure at one step (`launcher_view.repeated_failure`);
    the time of the library's newest report (the file `library_report`, given to :meth:`start`)
    tells a script that reports through the library, not a log line, from one that never started."""

    def __init__(
        self,
        directory: Path,
        *,
        step_pattern_set: bool,
        on_failure: Callable[[LaunchFailure], None] | None = None,
        alive: Callable[[int], bool] = _pid_alive,
    ) -> None:
        self.directory = directory
        self.step_pattern_set = step_pattern_set
        self.on_failure = on_failure
        self.failure: LaunchFailure | None = None
        self.library_report: Path | None = None
        self._library_report_epoch: float | None = None
        self._alive = alive
        self._records: dict[tuple[int, int], RankRecord] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def records(self) -> list[RankRecord]:
        with self._lock:
            return list(self._records.values())

    def view(self) -> LauncherView:
        return launcher_view.launcher_view(self.records(), step_pattern_set=self.step_pattern_set)

    def _read(self) -> list[RankRecord]:
        found = []
        for path in self.directory.glob(f"{rankshim.RECORD_PREFIX}*{rankshim.RECORD_SUFFIX}"):
            local_rank = rankshim.record_local_rank(path.name)
            if local_rank is None:
                continue
            try:
                record = launcher_view.parse_record(local_rank, json.loads(path.read_text()))
            except (OSError, ValueError):
                continue  # replaced between the listing and the read, or not a record
            if record is not None:
                found.append(record)
        return found

    def scan(self, now: float | None = None, *, ended: bool = False) -> None:
        """Read the records; `ended` (ft_launcher has exited): every record still running is closed."""
        at = time.time() if now is None else now
        read = self._read()
        with self._lock:
            for record in read:
                known = self._records.get(record.key)
                if known is None or not (record.running and not known.running):
                    self._records[record.key] = record
            for key, record in list(self._records.items()):
                if record.running and (ended or not self._alive(record.pid)):
                    self._records[key] = dataclasses.replace(record, end_epoch=at)
        if self.library_report is not None:
            with contextlib.suppress(OSError):
                self._library_report_epoch = self.library_report.stat().st_mtime
        self._judge()

    def _judge(self) -> None:
        if self.failure is not None:
            return
        records = self.records()
        failure: LaunchFailure | None = launcher_view.startup_failure(
            records, step_pattern_set=self.step_pattern_set, library_report_epoch=self._library_report_epoch
        ) or launcher_view.repeated_failure(records, step_pattern_set=self.step_pattern_set)
        if failure is None:
            return
        self.failure = failure
        if self.on_failure is not None:
            self.on_failure(failure)

    def _run(self) -> None:
        while not self._stop.wait(RANKS_POLL_SECONDS):
            try:
                self.scan()
            except Exception:  # the view is advisory: a bug here must not end the pod
                log.exception("reading the rank records failed")

    def start(self, library_report: Path | None = None) -> None:
        self.library_report = library_report
        self._thread = threading.Thread(target=self._run, name="rtj-rank-history", daemon=True)
        self._thread.start()

    def finish(self) -> None:
        """Stop the thread and take the last records (ft_launcher has exited)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.scan(ended=True)


class LauncherStopper:
    """Stops ft_launcher after a start-up or repeated failure: SIGTERM (it stops its workers), SIGKILL
    after :data:`STOP_GRACE_SECONDS`."""

    def __init__(self) -> None:
        self._launcher: Child | None = None
        self._pending: LaunchFailure | None = None
        self._lock = threading.Lock()

    def adopt(self, children: Sequence[Child]) -> None:
        with self._lock:
            self._launcher = children[0]
            pending = self._pending
        if pending is not None:
            self.stop(pending)

    def stop(self, failure: LaunchFailure) -> None:
        with self._lock:
            launcher = self._launcher
            if launcher is None:
                self._pending = failure
                return
        log.error("%s; stopping ft_launcher", failure.message.replace("\n", ": ", 1))
        with contextlib.suppress(ProcessLookupError):
            launcher.send_signal(signal.SIGTERM)
        killer = threading.Timer(STOP_GRACE_SECONDS, self._kill, args=(launcher,))
        killer.daemon = True
        killer.start()

    @staticmethod
    def _kill(launcher: Child) -> None:
        if launcher.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                launcher.kill()


def _cpu_only() -> bool:
    try:
        import torch

        return not torch.cuda.is_available()
    except ImportError:
        return True


@contextmanager
def progress_endpoint(
    env: TrainerEnv, child_env: dict[str, str], view: RankHistory | None = None, *, serve: bool = True
) -> Iterator[ProgressEndpoint | None]:
    """Serve the pod's progress endpoint while the block runs; the children learn the report file
    from ``RTJ_PROGRESS_FILE`` in `child_env`; `view`'s launcher view is merged in. With
    ``RTJ_PROGRESS_PORT`` 0 the file is still there for the endpoint sink to write, but nothing
    serves it (None). With `serve` False the block starts it (``start()``): after forking ranks,
    which must inherit neither its thread nor its socket."""
    launch_start = time.time()
    directory = Path(tempfile.mkdtemp(prefix="rtj-progress-"))
    path = directory / "progress.json"
    child_env[PROGRESS_FILE_ENV] = str(path)
    endpoint = None
    if env.progress_port != 0:
        endpoint = ProgressEndpoint(
            path,
            env.progress_port,
            ipv6=":" in env.pod_ip,
            view=view.view if view is not None else lambda: None,
            node_rank=env.node_rank,
            launch_start=launch_start,
        )
        if serve:
            endpoint.start()
    try:
        yield endpoint
    finally:
        if endpoint is not None:
            endpoint.close()
        shutil.rmtree(directory, ignore_errors=True)


def launch_supervised(env: TrainerEnv, command: list[str], child_env: dict[str, str]) -> int:
    """Supervisor mode (``rtj_trainer.runtime.supervisor``): the ranks as children, or a standby when the
    world formed without this pod. A Python program's ranks are forked after its imports
    (``rtj_trainer.runtime.forked``)."""
    from rtj_trainer.runtime import forked, supervisor

    address = resolve(env.store_host, env.store_port)
    child_env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    child_env.setdefault("TMPDIR", tempfile.gettempdir())
    program = forked.program_of(command) if forked.fork_enabled(child_env) else None
    if program is not None:
        os.environ["TORCH_CPP_LOG_LEVEL"] = child_env["TORCH_CPP_LOG_LEVEL"]  # read as torch loads
        log.info("preloaded %s: the ranks fork from here", ", ".join(forked.preload(program, child_env)))
    if supervisor.world_formed(address, env.store_port):
        log.info("the world formed before this pod started: standing by")
        return supervisor.stand_by(address, env.store_port)
    marker = Path(child_env["TMPDIR"]) / f"rtj-drain-{os.getpid()}"
    received = supervisor.record_signals()
    with progress_endpoint(env, child_env, serve=program is None) as endpoint:
        envs = supervisor.rank_environments(env, child_env, address)
        log.info("run %d ranks of %s (slot %d)", len(envs), " ".join(command), env.slot)
        sys.stdout.flush()
        sys.stderr.flush()
        code = supervisor.run_forwarding_drain(
            command,
            envs,
            marker,
            preexec=_die_with_parent,
            received=received,
            spawn=forked.spawner(program, _die_with_parent) if program is not None else None,
            started=_serve_once_forked(endpoint) if program is not None else None,
        )
        if code == 0 and endpoint is not None and not endpoint.wait_delivered(env.progress_linger_seconds):
            log.warning("final progress report not read within %.0f s", env.progress_linger_seconds)
    return code


def _serve_once_forked(endpoint: ProgressEndpoint | None) -> Callable[[Sequence[Child]], None]:
    """Start serving the endpoint once every rank is forked."""

    def serve(_ranks: Sequence[Child]) -> None:
        if endpoint is not None:
            endpoint.start()

    return serve


def configuration_error(err: EnvError) -> int:
    """A contract variable rtj-launch cannot use: nothing starts, and the operator learns why from
    the termination message (the same reason as a command that cannot start)."""
    log.error("%s", err)
    return launcher_view.cannot_start(f"rtj-launch: {err}")


def run_launcher(
    env: TrainerEnv,
    argv: list[str],
    child_env: dict[str, str],
    *,
    history: RankHistory | None = None,
    started: Callable[[Sequence[Child]], None] | None = None,
) -> int:
    """Run `argv` (ft_launcher, or the command in direct mode) as a child that hears of a SIGTERM
    after the drain is marked, while the endpoint serves the report (with `history`'s launcher
    view); returns its exit status."""
    marker = Path(child_env["TMPDIR"]) / f"rtj-drain-{os.getpid()}"
    from rtj_trainer.runtime.supervisor import record_signals, run_forwarding_drain

    received = record_signals()  # before the endpoint: the pod may be deleted already
    with progress_endpoint(env, child_env, history) as endpoint:
        log.info("run %s", " ".join(argv))
        sys.stdout.flush()
        sys.stderr.flush()
        if history is not None:
            history.start(library_report=Path(child_env[PROGRESS_FILE_ENV]))
        try:
            code = run_forwarding_drain(
                argv, [child_env], marker, preexec=_die_with_parent, started=started, received=received
            )
        finally:
            if history is not None:
                history.finish()
        if code == 0 and endpoint is not None and not endpoint.wait_delivered(env.progress_linger_seconds):
            # The operator reads the final report from the endpoint: a finished pod waits for that
            # read (a failed one does not: its replacement matters more than its last report).
            log.warning("final progress report not read within %.0f s", env.progress_linger_seconds)
    return code


def launch_ft(env: TrainerEnv, command: list[str], child_env: dict[str, str]) -> int:
    """ft_launcher mode: the ranks under the rank shim, their records in a fresh directory, and a
    start-up failure stopped at the second try."""
    import yaml

    from rtj_trainer.library import nvrx_compat

    try:
        config = ft_config(env)
        check_standby_support(env, nvrx_compat.nvrx_version())
    except EnvError as err:
        return configuration_error(err)
    address = resolve(env.rdzv_host, env.rdzv_port)
    state = Path(tempfile.mkdtemp(prefix="rtj-launch-", dir=child_env["TMPDIR"]))
    try:
        ranks = state / "ranks"
        ranks.mkdir()
        config_path = None
        if config is not None:
            config_path = str(state / FT_CONFIG_FILE_NAME)
            Path(config_path).write_text(yaml.safe_dump(config, sort_keys=True, default_flow_style=False))
        full = ft_launcher_argv(
            env,
            rdzv_address=address,
            command=command,
            cpu=_cpu_only(),
            launcher=_find_executable("ft_launcher"),
            config_path=config_path,
            config_keys=ft_section_keys(config),
        )
        child_env.update(nvrx_compat.ft_launcher_environment(env.node_rank))
        child_env[rankshim.RANKS_DIR_ENV] = str(ranks)
        child_env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        stopper = LauncherStopper()
        history = RankHistory(ranks, step_pattern_set=bool(env.step_log_pattern), on_failure=stopper.stop)
        code = run_launcher(env, full, child_env, history=history, started=stopper.adopt)
        if history.failure is not None and code != 0:
            log.error("%s", history.failure.message.replace("\n", ": ", 1))
            drain.write_termination_message(history.failure.message)
            return history.failure.pod_exit_code
        return code
    finally:
        shutil.rmtree(state, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """The container's entry point; returns its exit status."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = list(sys.argv[1:] if argv is None else argv)
    if args == [PREPARE_CHECKPOINT_DIR]:
        from rtj_trainer.runtime import checkpoint_dir

        return checkpoint_dir.main(os.environ)
    if args and args[0] == install.INSTALL_RUNTIME:
        return install.main(args)
    log.info("rtj-launch %s from %s, Python %s", LIBRARY_VERSION, install.package_dir(), sys.executable)
    if args and args[0] == "--":
        args = args[1:]
    try:
        env = TrainerEnv.from_environ(os.environ)
        check_step_log_pattern(env.step_log_pattern)
    except EnvError as err:
        return configuration_error(err)
    if env.role == ROLE_SPARE and not env.supervisor_mode and not env.standby_spares:
        return idle_as_spare()
    if not args:
        print("usage: rtj-launch -- <training command...>", file=sys.stderr)
        return 2
    command = [_find_executable(args[0]), *args[1:]]
    child_env = dict(os.environ)
    if env.supervisor_mode:
        return launch_supervised(env, command, child_env)
    # ft_launcher's IPC sockets, the rank records and the drain marker live in TMPDIR; a read-only
    # root filesystem needs it on a volume.
    child_env.setdefault("TMPDIR", tempfile.gettempdir())
    if os.environ.get(LAUNCH_MODE) == LAUNCH_MODE_DIRECT:
        # No ft_launcher, no rendezvous, no shim: the command is the launcher's child (operator
        # tests use trivial commands to exercise pod lifecycles without spending CPU on torch).
        return run_launcher(env, command, child_env)
    return launch_ft(env, command, child_env)
