"""``rtj-launch -- <training command...>``: the worker container's entry point and main process.

It turns the environment contract (``rtj_trainer.env``) into an ``ft_launcher`` command line and runs
it as its child, so ft_launcher (NVRx's torchrun) restarts the workers of this node on a crash or a
missed heartbeat (in-job restart), while ``rtj-launch`` stays for the pod's whole life: it serves
the pod's progress endpoint (``rtj_trainer.endpoint``: the progress report for the operator, the
trainer's Prometheus metrics) through every restart, marks a drain before it forwards SIGTERM
(:func:`supervise`, ``rtj_trainer.drain``), writes the termination message and exits with
ft_launcher's status. The argv is built by the pure :func:`ft_launcher_argv` and passed as a list:
nothing the user wrote reaches a shell.

Rendezvous: worker 0 hosts the c10d store (``is_host=1``), every node dials ``RTJ_RDZV_HOST``
(``J-worker-0.J.NS.svc``). The name exists only once the headless service publishes worker 0, and a
local cluster resolves it only in Python, so it is resolved here, with retries, and ft_launcher gets
an address. With ``RTJ_ROLE=spare`` nothing is launched: the pod holds its node until it is deleted.
``rtj-launch --prepare-checkpoint-dir`` is the checkpoint-directory init container
(``rtj_trainer.checkpoint_dir``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rtj_trainer.endpoint import ProgressEndpoint
from rtj_trainer.env import LAUNCH_MODE, LAUNCH_MODE_DIRECT, ROLE_SPARE, TrainerEnv
from rtj_trainer.progress import PROGRESS_FILE_ENV

log = logging.getLogger("rtj_trainer.launch")

# The init container's argument (rtj_trainer.checkpoint_dir): no launcher, only the directory.
PREPARE_CHECKPOINT_DIR = "--prepare-checkpoint-dir"


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
) -> list[str]:
    """The ft_launcher command for this node (pure when ``nvrx_version`` is given)."""
    if not command:
        raise ValueError("no training command given after --")
    # Imported here: it imports torch, which a spare never needs (nor the threads it starts).
    from rtj_trainer import nvrx_compat

    version = nvrx_version if nvrx_version is not None else nvrx_compat.nvrx_version()
    names = dict(nvrx_compat.ft_launcher_flags(version))
    argv = [
        launcher,
        f"--nnodes={env.nnodes}:{max(env.nnodes_max, env.nnodes)}",
        f"--nproc-per-node={env.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={_host_port(rdzv_address, env.rdzv_port)}",
        f"--rdzv-id={env.job_uid}",
        f"--rdzv-conf=is_host={1 if env.node_rank == 0 else 0}",
        f"{names['initial_heartbeat_timeout']}={_fmt_seconds(env.ft_initial_heartbeat_timeout_seconds)}",
        f"{names['heartbeat_timeout']}={_fmt_seconds(env.ft_heartbeat_timeout_seconds)}",
        f"--monitor-interval={_fmt_seconds(env.ft_monitor_interval_seconds)}",
        f"--max-restarts={env.max_restarts}",
    ]
    if env.pod_ip:
        # Rank 0's agent publishes this as MASTER_ADDR: the pod IP is reachable from every node,
        # a pod's own hostname may not resolve elsewhere.
        argv.append(f"--local-addr={env.pod_ip}")
    # Options whose defaults differ between NVRx releases, each chosen in nvrx_compat.
    argv += nvrx_compat.ft_launcher_tuning(cpu=cpu, version=version)
    argv += ["--no-python", *command]
    return argv


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


def idle_as_spare() -> int:
    """Hold the node until the operator deletes the pod (SIGTERM)."""
    from rtj_trainer.supervisor import record_release_signals

    released = record_release_signals()
    log.info("hot spare: holding the node until SIGTERM")
    while not released:
        time.sleep(0.5)
    log.info("hot spare: %s received, releasing the node", signal.Signals(released[0]).name)
    return 0


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when rtj-launch dies (it runs in its own session, so a
    process-group kill of the container would otherwise leave it running)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def supervise(argv: Sequence[str], env: dict[str, str], marker: Path) -> int:
    """Run ``argv`` (ft_launcher) as a child; on SIGTERM mark the drain first, then forward it.

    The child gets its own session: on a local cluster the kubelet signals the container's whole
    process group, and ft_launcher must hear of the SIGTERM only after the drain file exists (its
    workers read it). Returns the exit status for the container. The same supervision as the
    supervisor mode's ranks, with one child.
    """
    from rtj_trainer.supervisor import supervise_ranks

    return supervise_ranks(argv, [env], marker, preexec=_die_with_parent)


def _cpu_only() -> bool:
    try:
        import torch

        return not torch.cuda.is_available()
    except ImportError:
        return True


@contextmanager
def progress_endpoint(env: TrainerEnv, child_env: dict[str, str]) -> Iterator[ProgressEndpoint | None]:
    """Serve the pod's progress endpoint while the block runs; the children learn the report file
    from ``RTJ_PROGRESS_FILE`` in `child_env`. With ``RTJ_PROGRESS_PORT`` 0 the file is still
    there for the endpoint sink to write, but nothing serves it (None)."""
    directory = Path(tempfile.mkdtemp(prefix="rtj-progress-"))
    path = directory / "progress.json"
    child_env[PROGRESS_FILE_ENV] = str(path)
    endpoint = None
    if env.progress_port != 0:
        endpoint = ProgressEndpoint(path, env.progress_port, ipv6=":" in env.pod_ip)
        endpoint.start()
    try:
        yield endpoint
    finally:
        if endpoint is not None:
            endpoint.close()
        shutil.rmtree(directory, ignore_errors=True)


def launch_supervised(env: TrainerEnv, command: list[str], child_env: dict[str, str]) -> int:
    """Supervisor mode (``rtj_trainer.supervisor``): the ranks as children, or a standby when the
    world formed without this pod."""
    from rtj_trainer import supervisor

    address = resolve(env.store_host, env.store_port)
    if supervisor.world_formed(address, env.store_port):
        log.info("the world formed before this pod started: standing by")
        return supervisor.stand_by(address, env.store_port)
    child_env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    child_env.setdefault("TMPDIR", tempfile.gettempdir())
    marker = Path(child_env["TMPDIR"]) / f"rtj-drain-{os.getpid()}"
    with progress_endpoint(env, child_env) as endpoint:
        envs = supervisor.rank_environments(env, child_env, address)
        log.info("run %d ranks of %s (slot %d)", len(envs), " ".join(command), env.slot)
        sys.stdout.flush()
        sys.stderr.flush()
        code = supervisor.supervise_ranks(command, envs, marker, preexec=_die_with_parent)
        if code == 0 and endpoint is not None and not endpoint.wait_delivered(env.progress_linger_seconds):
            log.warning("final progress report not read within %.0f s", env.progress_linger_seconds)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """The container's entry point; returns its exit status."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = list(sys.argv[1:] if argv is None else argv)
    if args == [PREPARE_CHECKPOINT_DIR]:
        from rtj_trainer import checkpoint_dir

        return checkpoint_dir.main(os.environ)
    if args and args[0] == "--":
        args = args[1:]
    env = TrainerEnv.from_environ(os.environ)
    if env.role == ROLE_SPARE and not env.supervised:
        return idle_as_spare()
    if not args:
        print("usage: rtj-launch -- <training command...>", file=sys.stderr)
        return 2
    command = [_find_executable(args[0]), *args[1:]]
    child_env = dict(os.environ)
    if env.supervised:
        return launch_supervised(env, command, child_env)
    if os.environ.get(LAUNCH_MODE) == LAUNCH_MODE_DIRECT:
        # No ft_launcher, no rendezvous: the command is the launcher's child (operator tests use
        # trivial commands to exercise pod lifecycles without spending CPU on torch).
        full = command
    else:
        address = resolve(env.rdzv_host, env.rdzv_port)
        launcher = _find_executable("ft_launcher")
        full = ft_launcher_argv(
            env, rdzv_address=address, command=command, cpu=_cpu_only(), launcher=launcher
        )
        child_env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    # ft_launcher's IPC sockets and the drain marker live in TMPDIR; a read-only root filesystem
    # needs it on a volume.
    child_env.setdefault("TMPDIR", tempfile.gettempdir())
    marker = Path(child_env["TMPDIR"]) / f"rtj-drain-{os.getpid()}"
    with progress_endpoint(env, child_env) as endpoint:
        log.info("run %s", " ".join(full))
        sys.stdout.flush()
        sys.stderr.flush()
        code = supervise(full, child_env, marker)
        if code == 0 and endpoint is not None and not endpoint.wait_delivered(env.progress_linger_seconds):
            # The operator reads the final report from the endpoint: a finished pod waits for that
            # read (a failed one does not: its replacement matters more than its last report).
            log.warning("final progress report not read within %.0f s", env.progress_linger_seconds)
    return code
