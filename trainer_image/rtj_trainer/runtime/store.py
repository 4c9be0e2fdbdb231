"""``rtj-store --port P``: the job's store pod, so that no worker's node holds the world's stores.

In supervisor mode (``rtj_trainer.runtime.supervisor``) every rank of the job, the hot spares' reserve ranks
included, is a client of two TCPStore servers that this process hosts: port P for NVRx's in-process
wrapper (barriers, heartbeats, interruption and termination records) and P+1 for the process groups
of each in-process iteration. Losing a worker's node, worker 0's included, is then an ordinary node
loss: the stores survive it. The servers keep their keys in memory only; when this pod is lost the
operator restarts the whole job (a fresh world, from the newest checkpoint).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any, Final

log = logging.getLogger("rtj_trainer.runtime.store")

# The wrapper's store on the given port, the process groups' on the next one (rtj_trainer.reference.train).
# The keys the ranks and the supervisor share in the process groups' store are in rtj_trainer.library.world.
WRAPPER_STORE_OFFSET: Final = 0
PG_STORE_OFFSET: Final = 1


def serve(port: int, *, host: str = "127.0.0.1") -> list[Any]:
    """Start the two servers (they serve from their own threads) and return them.

    Each listens on every address of the pod; ``host`` is only where the server's own client
    connects: the loopback address, which reaches the pod's listeners on Kubernetes and on the local
    cluster alike (a client of 0.0.0.0 never connected there, and the store never came up)."""
    import torch.distributed as dist

    servers = []
    for offset in (WRAPPER_STORE_OFFSET, PG_STORE_OFFSET):
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rtj-store", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--port", type=int, required=True, help="the wrapper's store; P+1: the process groups'"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not 1 <= args.port <= 65534:
        print(f"rtj-store: --port {args.port} must leave room for port+1 (1-65534)", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    servers = serve(args.port)
    while not stop.wait(1.0):
        pass
    log.info("store stopping (%d servers)", len(servers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
