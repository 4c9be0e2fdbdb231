"""spec.rendezvous: where ft_launcher's rendezvous (or Supervisor's stores) lives, and how the hot
spares take part."""

from __future__ import annotations

import enum

from pydantic import Field

from rtj_operator.api.schema import ApiModel, Int32


class RendezvousHost(enum.StrEnum):
    # Worker0: worker 0's ft_launcher hosts the c10d store; losing worker 0's node restarts every pod.
    WORKER0 = "Worker0"
    # StorePod: a small store pod of the job's own hosts it; losing any worker's node is one replacement.
    STORE_POD = "StorePod"


class SpareMode(enum.StrEnum):
    # HoldNode: a hot spare holds a node outside the rendezvous; a lost worker's replacement takes it.
    HOLD_NODE = "HoldNode"
    # Standby: a hot spare's ft_launcher waits in the rendezvous as a standby node (NVRx 0.7 or later)
    # and takes a lost node's place in the next round; the lost worker's replacement stands by in turn.
    STANDBY = "Standby"


class RendezvousSpec(ApiModel):
    """Where ft_launcher's c10d rendezvous lives (FtLauncher), and the ports of the store pod."""

    port: Int32 = Field(
        default=29500,
        ge=1,
        le=65535,
        description="port is the rendezvous (c10d store) port, on worker 0 or on the store pod (see "
        "host) under faultTolerance.launcher FtLauncher; under Supervisor the store pod serves the "
        "world's store on it and the process groups' store on port + 1 (so at most 65534). Optional; "
        "default: 29500.",
    )
    host: RendezvousHost = Field(
        default=RendezvousHost.WORKER0,
        description="host is what hosts the rendezvous under faultTolerance.launcher FtLauncher. "
        "Worker0: worker 0's ft_launcher, so losing worker 0's node restarts every pod (a gang "
        "restart). StorePod: a store pod of the job's own (<name>-store: 100m CPU, 256Mi, on a node "
        "without the job's pods, such as a system node), so losing any worker's node, worker 0's "
        "included, is one pod replacement; losing the store pod restarts every pod. The store pod runs "
        "a plain c10d store on NVRx 0.4 and NVRx's nvrx-control from 0.7 (the barrier rendezvous needs a "
        "host that closes its rounds); a release with the barrier rendezvous but no nvrx-control cannot "
        "host it there. Supervisor always has a store pod. Optional; default: Worker0.",
    )
    spares: SpareMode = Field(
        default=SpareMode.HOLD_NODE,
        description="spares is how hotSpares take part under faultTolerance.launcher FtLauncher. "
        "HoldNode: each holds a node outside the rendezvous, and a lost worker's replacement pod is "
        "created on a spare's node (no scheduling, no image pull; the training restarts once it has "
        "started). Standby (NVRx 0.7 or later, with host StorePod): each spare's ft_launcher joins the "
        "rendezvous as a standby node (--nnodes=nodes:nodes+hotSpares) and takes a lost node's place in "
        "the next round, without waiting for a pod; the lost worker's replacement, created wherever it "
        "fits, stands by in turn. On an older NVRx a Standby job fails at its first start, naming this "
        "field. Supervisor's spares always run reserve ranks. Optional; default: HoldNode.",
    )
