"""What every area of the spec shares: the volume names and mount paths the renderer reserves,
the job name's rules, the fields only the rtj library honours, and the small string grammars."""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import Field, Strict

from rtj_operator import constants
from rtj_operator.api.corev1 import LABEL_VALUE_PATTERN

# Volume names the renderer uses itself; user volumes may not take them.
CHECKPOINT_VOLUME: str = "rtj-checkpoints"


SHM_VOLUME: str = "rtj-shm"


SCRATCH_VOLUME: str = "rtj-scratch"


FT_LAUNCHER_CONFIG_VOLUME: str = "rtj-ft-launcher"


# The pod runtime copied from spec.runtimeImage (rtj_trainer.runtime.install), an emptyDir.
RUNTIME_VOLUME: str = "rtj-runtime"


RESERVED_VOLUMES: tuple[str, ...] = (
    CHECKPOINT_VOLUME,
    SHM_VOLUME,
    SCRATCH_VOLUME,
    FT_LAUNCHER_CONFIG_VOLUME,
    RUNTIME_VOLUME,
)


SHM_MOUNT_PATH: str = "/dev/shm"


# Where the ConfigMap of faultTolerance.ftLauncher.configMap is mounted, read-only (RTJ_FT_CONFIG_FILE is
# this directory and the ConfigMap's key); reserved whether or not a job uses it.
FT_LAUNCHER_CONFIG_MOUNT_PATH: str = "/etc/rtj/ft-launcher"


# Where the runtime of spec.runtimeImage lies, read-only in the worker; reserved whether or not a job uses it.
RUNTIME_MOUNT_PATH: str = "/opt/rtj/runtime"


RESERVED_MOUNT_PATHS: tuple[str, ...] = (SHM_MOUNT_PATH, FT_LAUNCHER_CONFIG_MOUNT_PATH, RUNTIME_MOUNT_PATH)


# The fields that only the project's training library (rtj_trainer, which rtj-train uses) honours, as
# JSON paths under spec: a training script of one's own ignores them. Each one's description ends with
# LIBRARY_ONLY_NOTE; the operator reports those a job sets to other than their default while its workers
# report no library (library_only_fields_set). inProcess.enabled is library-only too, but not listed: a
# script of one's own is told to set it false, which must not read as a setting it ignores.
LIBRARY_ONLY_FIELDS: tuple[str, ...] = (
    "checkpoint.intervalSteps",
    "checkpoint.keep",
    "checkpoint.mode",
    "checkpoint.memoryIntervalSteps",
    "faultTolerance.inProcess.maxIterations",
    "faultTolerance.inProcess.softTimeoutSeconds",
    "faultTolerance.inProcess.hardTimeoutSeconds",
    "faultTolerance.inProcess.barrierTimeoutSeconds",
)


LIBRARY_ONLY_NOTE: str = (
    "Applies to training scripts that use the rtj library (rtj-train does); a script of your own ignores it."
)


# A job's name becomes its Service name (a DNS-1035 label) and the prefix of its pods' hostnames
# `<name>-worker-<i>` (DNS labels, at most 63 characters, with i < 1024): hence 50 characters.
MAX_JOB_NAME_LENGTH: int = 50


JOB_NAME_PATTERN: str = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


AnnotationValue = Annotated[str, Strict(), Field(max_length=4096)]


Arg = Annotated[str, Strict(), Field(max_length=4096)]


# An AWS availability zone name (us-east-1a, us-gov-west-1b, use1-az1 is a zone id, not a name).
AvailabilityZone = Annotated[str, Strict(), Field(min_length=1, max_length=63, pattern=LABEL_VALUE_PATTERN)]


ZONE_LABEL: str = constants.LABEL_ZONE


# Time for a drain: finish the step, write this node's shards to the volume, wait for the commit.
DEFAULT_TERMINATION_GRACE_SECONDS: int = 180


MAX_PORT: int = 65535


class ImagePullPolicy(enum.StrEnum):
    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"
