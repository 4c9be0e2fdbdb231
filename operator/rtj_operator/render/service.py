"""The job's headless Service: DNS names for the workers (and the store pod) before they are ready."""

from __future__ import annotations

from typing import Any

from rtj_operator import constants, names
from rtj_operator.api import ResilientTrainingJob
from rtj_operator.render.meta import has_store_pod, job_uid, object_metadata
from rtj_operator.render.store_pod import store_ports


def render_service(job: ResilientTrainingJob, *, uid: str | None = None) -> dict[str, Any]:
    """The headless Service: DNS records for workers before they are ready (rendezvous needs them).

    With a store pod it selects every pod of the job, so that the store pod has its DNS name too (a
    pod's hostname record needs the Service to select it), and names the store's ports.
    """
    port = job.spec.rendezvous.port
    selector = {**names.selector_labels(job.name), constants.LABEL_ROLE: constants.ROLE_WORKER}
    ports = [{"name": names.RENDEZVOUS_PORT_NAME, "port": port, "targetPort": port, "protocol": "TCP"}]
    if has_store_pod(job):
        selector = names.selector_labels(job.name)
        ports = [
            {"name": name, "port": number, "targetPort": number, "protocol": "TCP"}
            for name, number in store_ports(job)
        ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_metadata(job, names.service_name(job.name), job_uid(job, uid)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": ports,
        },
    }
