"""``rtj-store --port P [--rendezvous-id ID --nnodes N [--nnodes-max M]]``: the job's store pod, so
that no worker's node holds what the job's pods share.

In supervisor mode (``rtj_trainer.runtime.supervisor``) every rank of the job, the hot spares' reserve ranks
included, is a client of two TCPStore servers that this process hosts: port P for NVRx's in-process
wrapper (barriers, heartbeats, interruption and termination records) and P+1 for the process groups
of each in-process iteration. Losing a worker's node, worker 0's included, is then an ordinary node
loss: the stores survive it. The servers keep their keys in memory only; when this pod is lost the
operator restarts the whole job (a fresh world, from the newest checkpoint).

With ``--rendezvous-id`` (ft_launcher with rendezvous.host StorePod) it hosts ft_launcher's c10d
rendezvous on port P instead, which every node's ft_launcher joins as a client (``is_host=0``,
``rtj_trainer.runtime.launch``): on NVRx releases with NVRx's own control node (``nvrx-control``,
0.7 on), whose barrier rendezvous needs a host that closes its rounds, that process runs as this
one's child (``--nnodes-max``: the standby spares' nodes beyond the workers, rendezvous.spares
Standby); before the barrier rendezvous (0.4), a plain TCPStore is all its rendezvous needs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import logging
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any, Final

# The wrapper's store on the given port, the process groups' on the next one; the ranks find them
# and share keys there through rtj_trainer.library.world.
from rtj_contract.stores import PG_STORE_OFFSET, WRAPPER_STORE_OFFSET

from rtj_trainer.runtime import launcher_view

log = logging.getLogger("rtj_trainer.runtime.store")

# The stores served from --port: Supervisor's world needs both, ft_launcher's rendezvous one.
WORLD_STORES: Final = (WRAPPER_STORE_OFFSET, PG_STORE_OFFSET)
RENDEZVOUS_STORES: Final = (WRAPPER_STORE_OFFSET,)
# NVRx's control node, which hosts and closes the barrier rendezvous for launchers that are clients.
NVRX_CONTROL_MODULE: Final = "nvidia_resiliency_ext.fault_tolerance.control_plane"
# The first release whose ft_launcher has the barrier rendezvous (a plain store no longer suffices).
NVRX_BARRIER_RENDEZVOUS: Final = (0, 5, 0)


class RendezvousHostError(RuntimeError):
    """This NVRx release's rendezvous cannot be hosted outside the workers."""


def serve(port: int, *, host: str = "127.0.0.1", offsets: Sequence[int] = WORLD_STORES) -> list[Any]:
    """Start the servers, one per offset from `port` (they serve from their own threads), and return them.

    Each listens on every address of the pod; ``host`` is only where the server's own client
    connects: the loopback address, which reaches the pod's listeners on Kubernetes and on the local
    cluster alike (a client of 0.0.0.0 never connected there, and the store never came up)."""
    import torch.distributed as dist

    servers = []
    for offset in offsets:
        servers.append(
            dist.TCPStore(  # type: ignore[attr-defined]
                host_name=host,
                port=port + offset,
                is_master=True,
                wait_for_workers=False,
                multi_tenant=True,
                timeout=dt.timedelta(seconds=60),
            )
        )
        log.info("store serving on port %d", port + offset)
    return servers


def rendezvous_command(
    port: int,
    *,
    run_id: str,
    nnodes: int,
    version: tuple[int, ...],
    nnodes_max: int | None = None,
    python: str = sys.executable,
) -> list[str] | None:
    """The command of NVRx's control node for ft_launcher's rendezvous on `port` (pure), or None when
    the release's rendezvous needs only a TCPStore (before the barrier rendezvous).
    RendezvousHostError for a barrier release without the control node (0.5, 0.6)."""
    if version < NVRX_BARRIER_RENDEZVOUS:
        return None
    if importlib.util.find_spec(NVRX_CONTROL_MODULE) is None:
        raise RendezvousHostError(
            f"NVRx {'.'.join(map(str, version))} has a barrier rendezvous but no control node "
            f"({NVRX_CONTROL_MODULE}): rendezvous.host StorePod needs NVRx 0.7 or later (or 0.4); "
            "use rendezvous.host Worker0 with this image"
        )
    return [
        python,
        "-m",
        NVRX_CONTROL_MODULE,
        # The active nodes, and every node that may join: the workers, with standby spares beyond them.
        f"--nnodes={nnodes}:{max(nnodes_max or nnodes, nnodes)}",
        "--rdzv-backend=c10d",
        # The server listens on every address; this is where its own client connects.
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id={run_id}",
        "--ft-enable-log-server=false",
    ]


def run_control_node(command: Sequence[str], stop: threading.Event) -> int:
    """Run NVRx's control node as a child until `stop` is set; its exit status, if it fails, is this
    pod's (the operator restarts the job)."""
    log.info("rendezvous: NVRx's control node: %s", " ".join(command))
    child = subprocess.Popen(list(command))
    while not stop.wait(1.0):
        if child.poll() not in (None, 0):
            log.error("NVRx's control node exited with status %d", child.returncode)
            return child.returncode
    if child.poll() is None:
        child.terminate()
        child.wait()
    return 0


def _control_node_command(args: argparse.Namespace) -> list[str] | None:
    """NVRx's control node's command where it hosts the rendezvous; None where TCPStores are served."""
    if not args.rendezvous_id:
        return None
    from rtj_trainer.library import nvrx_compat

    version = nvrx_compat.nvrx_version()
    return rendezvous_command(
        args.port, run_id=args.rendezvous_id, nnodes=args.nnodes, nnodes_max=args.nnodes_max, version=version
    )


def _cannot_start(message: str) -> int:
    """The store pod cannot serve as configured: no restart would change that (the operator fails the
    job with StartupFailed and this message)."""
    print(message, file=sys.stderr)
    return launcher_view.cannot_start(message)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rtj-store", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--port", type=int, required=True, help="the wrapper's store; P+1: the process groups'"
    )
    parser.add_argument("--rendezvous-id", help="host ft_launcher's rendezvous of this id on --port instead")
    parser.add_argument(
        "--nnodes", type=int, default=1, help="the rendezvous' node count (with --rendezvous-id)"
    )
    parser.add_argument(
        "--nnodes-max",
        type=int,
        default=None,
        help="the most nodes in the rendezvous, standby spares included (default: --nnodes)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not 1 <= args.port <= 65534:
        return _cannot_start(f"rtj-store: --port {args.port} must leave room for port+1 (1-65534)")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        command = _control_node_command(args)
    except RendezvousHostError as err:
        return _cannot_start(f"rtj-store: {err}")
    if command is not None:
        return run_control_node(command, stop)
    servers = serve(args.port, offsets=RENDEZVOUS_STORES if args.rendezvous_id else WORLD_STORES)
    while not stop.wait(1.0):
        pass
    log.info("store stopping (%d servers)", len(servers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
