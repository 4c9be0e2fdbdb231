"""Every name the operator derives from a job's name: its children, its pods' DNS names, its paths.

The renderer names the objects it produces with these, the decisions (`rtj_operator.decide`) find a
job's pods by them, and docs/architecture.md ("What the renderer produces") lists them. Each takes
plain strings (the job's name, namespace, an index), so that code holding only a name, not a parsed
job, derives the same names. Labels, annotations and environment names are in `constants`.
"""

from __future__ import annotations

from typing import Final

from rtj_contract import progress as progress_contract

from rtj_operator import constants

# The worker and spare pods' container.
CONTAINER_NAME: Final = "trainer"
# The init container that gives the job its checkpoint directory (render, rtj_trainer.runtime.checkpoint_dir).
CHECKPOINT_INIT_CONTAINER_NAME: Final = "prepare-checkpoints"
# The init container that copies the pod runtime from spec.runtimeImage (render, rtj_trainer.runtime.install).
RUNTIME_INIT_CONTAINER_NAME: Final = "install-runtime"
# The rendezvous port's name, on the container and on the Service.
RENDEZVOUS_PORT_NAME: Final = "rendezvous"
# The store pod's container and its two ports (faultTolerance.launcher Supervisor): the world's wrapper
# store on rendezvous.port, the process groups' store on the port after it.
STORE_CONTAINER_NAME: Final = "store"
STORE_PORT_NAME: Final = "store"
STORE_GROUPS_PORT_NAME: Final = "store-groups"
# The progress endpoint's port name on the container (the operator and a PodMonitor find it by it).
PROGRESS_PORT_NAME: Final = progress_contract.PORT_NAME


def service_name(job: str) -> str:
    """The headless Service `J` that gives workers their DNS names."""
    return job


def worker_pod_name(job: str, index: int) -> str:
    """`J-worker-<i>`: also the pod's hostname, so replacements keep their DNS name."""
    return f"{job}-worker-{index}"


def spare_pod_name(job: str, index: int) -> str:
    """`J-spare-<k>`."""
    return f"{job}-spare-{index}"


def surge_pod_name(job: str, index: int) -> str:
    """`J-surge-<i>`: the surge pod for worker i's replacement (rtj_operator.decide.surges). Not the
    worker's name: that one is fixed per index (the pod's DNS name, worker 0's the rendezvous host)
    and stays with the old pod until its kubelet has ended it."""
    return f"{job}-surge-{index}"


def store_pod_name(job: str) -> str:
    """`J-store`: the store pod of a Supervisor job; also its hostname, so its DNS name is stable."""
    return f"{job}-store"


def pod_name(job: str, role: str, index: int) -> str:
    """The pod of `role` (constants.ROLE_WORKER, ROLE_SPARE, ROLE_SURGE or ROLE_STORE, whose index is 0)
    and `index`."""
    if role == constants.ROLE_STORE:
        return store_pod_name(job)
    if role == constants.ROLE_SURGE:
        return surge_pod_name(job, index)
    return worker_pod_name(job, index) if role == constants.ROLE_WORKER else spare_pod_name(job, index)


def pvc_name(job: str) -> str:
    """`J-checkpoints`: the claim the job renders (unless it names an existing claim)."""
    return f"{job}-checkpoints"


def pv_name(job: str, namespace: str) -> str:
    """`J-checkpoints-<ns>`: the static PersistentVolume (cluster-scoped, hence the namespace)."""
    return f"{job}-checkpoints-{namespace}"


def trainer_name(job: str) -> str:
    """`J-trainer`: the ServiceAccount of the job's pods (bound to no Role)."""
    return f"{job}-trainer"


def disruption_budget_name(job: str) -> str:
    """`J-workers`: the PodDisruptionBudget over the job's workers (opt-in)."""
    return f"{job}-workers"


def pod_group_name(job: str) -> str:
    """`J`: the job's Kueue pod group and coscheduling PodGroup (opt-in)."""
    return job


def rendezvous_host(job: str, namespace: str) -> str:
    """Worker 0's stable DNS name, where the c10d store listens."""
    return f"{worker_pod_name(job, 0)}.{service_name(job)}.{namespace}.svc"


def store_host(job: str, namespace: str) -> str:
    """The store pod's stable DNS name (Supervisor): `J-store.<service>.<ns>.svc`."""
    return f"{store_pod_name(job)}.{service_name(job)}.{namespace}.svc"


def checkpoint_dir(job: str, mount_path: str) -> str:
    """`<mountPath>/J`: jobs sharing a volume keep apart."""
    return f"{mount_path.rstrip('/')}/{job}"


def selector_labels(job: str) -> dict[str, str]:
    """The labels that select every child of the job."""
    return {constants.LABEL_JOB: job}
