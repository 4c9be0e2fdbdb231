"""The pod runtime from spec.runtimeImage (rtj_trainer.runtime.install): the init container that
copies it into a volume, and how a container then runs rtj-launch or rtj-store from there."""

from __future__ import annotations

import copy
from typing import Any

from rtj_operator import names
from rtj_operator.api import RUNTIME_MOUNT_PATH, RUNTIME_VOLUME, ResilientTrainingJob
from rtj_operator.render.security import restricted_security_context

LAUNCH_COMMAND = "rtj-launch"


# rtj-launch's other init-container mode (rtj_trainer.runtime.install): copy the runtime into a volume;
# the interpreter of the user's image that then runs it, and the volume's and the copy's sizes.
INSTALL_RUNTIME_ARG = "--install-runtime"


RUNTIME_PYTHON = "python3"


RUNTIME_SIZE_LIMIT = "256Mi"


RUNTIME_INIT_RESOURCES = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "128Mi"}}


def runtime_entry(job: ResilientTrainingJob, command: str) -> list[str]:
    """How a container runs the runtime's `command` (rtj-launch, rtj-store): from the image, or, with
    spec.runtimeImage, its entry script in the runtime volume under the image's own python3."""
    if job.spec.runtime_image is None:
        return [command]
    return [RUNTIME_PYTHON, f"{RUNTIME_MOUNT_PATH}/{command}.py"]


def runtime_init_container(job: ResilientTrainingJob) -> dict[str, Any] | None:
    """Copies the runtime from spec.runtimeImage into the runtime volume; None without one."""
    spec = job.spec
    if spec.runtime_image is None:
        return None
    return {
        "name": names.RUNTIME_INIT_CONTAINER_NAME,
        "image": spec.runtime_image,
        "imagePullPolicy": spec.image_pull_policy.value,
        "command": [LAUNCH_COMMAND, INSTALL_RUNTIME_ARG, RUNTIME_MOUNT_PATH],
        "resources": copy.deepcopy(RUNTIME_INIT_RESOURCES),
        "securityContext": restricted_security_context(),
        "volumeMounts": [{"name": RUNTIME_VOLUME, "mountPath": RUNTIME_MOUNT_PATH}],
    }


def runtime_volumes(job: ResilientTrainingJob) -> list[dict[str, Any]]:
    if job.spec.runtime_image is None:
        return []
    return [{"name": RUNTIME_VOLUME, "emptyDir": {"sizeLimit": RUNTIME_SIZE_LIMIT}}]


def runtime_mounts(job: ResilientTrainingJob) -> list[dict[str, Any]]:
    """Read-only in the containers that run it: only the init container writes the runtime."""
    if job.spec.runtime_image is None:
        return []
    return [{"name": RUNTIME_VOLUME, "mountPath": RUNTIME_MOUNT_PATH, "readOnly": True}]
