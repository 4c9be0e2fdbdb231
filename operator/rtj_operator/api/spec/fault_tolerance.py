"""spec.faultTolerance: the launcher, NVRx's heartbeat timeouts, in-process restart and
ft_launcher's own configuration."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, Field
from rtj_contract import env as env_names

from rtj_operator.api.corev1 import ConfigKey, Name
from rtj_operator.api.schema import ApiModel, CelRule, Flag, Immutable, Int32, SchemaExtra
from rtj_operator.api.spec.common import FT_LAUNCHER_CONFIG_MOUNT_PATH, LIBRARY_ONLY_NOTE


class Launcher(enum.StrEnum):
    # FtLauncher: NVRx's ft_launcher runs each pod's ranks; a torchelastic rendezvous hosted by worker 0.
    FT_LAUNCHER = "FtLauncher"
    # Supervisor: rtj-launch runs each pod's ranks in one fixed NVRx in-process world, spares included;
    # the world's stores live in a store pod of their own.
    SUPERVISOR = "Supervisor"


class InProcessRestart(ApiModel):
    """NVRx in-process restart: recovery inside the running interpreter."""

    cel_rules = (
        CelRule(
            rule="self.hardTimeoutSeconds > self.softTimeoutSeconds",
            message="hardTimeoutSeconds must be greater than softTimeoutSeconds",
            check=lambda s: s.hard_timeout_seconds > s.soft_timeout_seconds,
            field_path=".hardTimeoutSeconds",
        ),
    )

    enabled: Flag = Field(
        default=True,
        description="enabled turns in-process restarts on; a script of your own sets false (only the rtj "
        "library restarts in-process). Optional; default: true.",
    )
    max_iterations: Int32 = Field(
        default=10,
        ge=1,
        le=1000,
        description="maxIterations is the number of in-process restarts before giving up to the launcher. "
        f"Optional; default: 10. {LIBRARY_ONLY_NOTE}",
    )
    soft_timeout_seconds: Int32 = Field(
        default=60,
        ge=1,
        le=86400,
        description="softTimeoutSeconds is how long a rank may make no progress before it is interrupted. "
        f"Optional; default: 60. {LIBRARY_ONLY_NOTE}",
    )
    hard_timeout_seconds: Int32 = Field(
        default=90,
        ge=1,
        le=86400,
        description="hardTimeoutSeconds is how long a rank may make no progress before it is terminated; "
        f"greater than softTimeoutSeconds. Optional; default: 90. {LIBRARY_ONLY_NOTE}",
    )
    barrier_timeout_seconds: Int32 = Field(
        default=120,
        ge=1,
        le=86400,
        description="barrierTimeoutSeconds bounds the restart barrier among ranks. Optional; default: 120. "
        f"{LIBRARY_ONLY_NOTE}",
    )


# Keys of ft_launcher's fault_tolerance section that ftLauncher.config may not set, and why: rtj-launch
# passes the first two as ft_launcher flags from spec fields (a flag wins over the file); the next two are
# torchelastic flags, not settings of the section (which would ignore them); rtj-launch sets the NIC
# monitor itself (rtj_trainer.library.nvrx_compat.ft_launcher_tuning); and the map is the section itself.
FT_CONFIG_KEYS_SET_ELSEWHERE: Mapping[str, str] = {
    "initial_rank_heartbeat_timeout": (
        "set spec.faultTolerance.initialHeartbeatTimeoutSeconds instead (0: off)"
    ),
    "rank_heartbeat_timeout": "set spec.faultTolerance.heartbeatTimeoutSeconds instead (0: off)",
    "monitor_interval": "set spec.faultTolerance.monitorIntervalSeconds instead",
    "max_restarts": "set spec.faultTolerance.maxInJobRestarts instead",
    "enable_nic_monitor": "rtj-launch sets it (on for nodes with GPUs, off for CPU nodes)",
    "fault_tolerance": "config is the fault_tolerance section itself: write its keys directly",
}


FT_CONFIG_MAX_KEYS: int = 64


def _check_ft_config_keys(config: dict[str, Any]) -> dict[str, Any]:
    """Refuse the keys of FT_CONFIG_KEYS_SET_ELSEWHERE (CEL cannot see into a map of unknown fields)."""
    refused = [f"{key}: {why}" for key, why in FT_CONFIG_KEYS_SET_ELSEWHERE.items() if key in config]
    if refused:
        raise ValueError(f"config may not set {'; '.join(refused)}")
    return config


# A map of unknown fields: the API server keeps it as written, the operator checks its keys.
FtLauncherConfig = Annotated[
    dict[str, Any],
    Field(max_length=FT_CONFIG_MAX_KEYS),
    SchemaExtra({"x-kubernetes-preserve-unknown-fields": True}),
    AfterValidator(_check_ft_config_keys),
]


class FtLauncherConfigMap(ApiModel):
    """A key of a ConfigMap that holds ft_launcher's config file, mounted read-only into the pods."""

    name: Name = Field(
        description="name is the ConfigMap's name, in the job's namespace; a pod waits in ContainerCreating "
        "until the ConfigMap and its key exist. Required."
    )
    key: ConfigKey = Field(
        default="config.yaml",
        description=(
            "key is the ConfigMap's key whose value is the file: YAML with a fault_tolerance section "
            "(at the top level or nested), as ft_launcher's --ft-cfg-path reads it. It is mounted at "
            f"{FT_LAUNCHER_CONFIG_MOUNT_PATH}/<key> ({env_names.FT_CONFIG_FILE}). "
            "Optional; default: config.yaml."
        ),
    )


class FtLauncherSpec(ApiModel):
    """ft_launcher's settings beyond the spec's own: NVRx's FaultToleranceConfig, inline or in a ConfigMap."""

    cel_rules = (
        CelRule(
            rule="has(self.config) != has(self.configMap)",
            message="exactly one of config, configMap must be set",
            check=lambda s: (s.config is None) != (s.config_map is None),
        ),
    )

    config: FtLauncherConfig | None = Field(
        default=None,
        description=(
            "config is the fault_tolerance section of ft_launcher's config file, as a map of NVRx's "
            "FaultToleranceConfig settings: for example rank_section_timeouts (a map of section name to "
            "seconds) and rank_out_of_section_timeout for a script that uses NVRx's sections API, "
            "workload_check_interval, safety_factor, rank_termination_signal, log_level (a script that "
            "only times sections also sets heartbeatTimeoutSeconds and initialHeartbeatTimeoutSeconds to "
            "0). "
            "rtj-launch writes it to a file as `fault_tolerance: <config>` "
            f"({env_names.FT_CONFIG}) and passes it to ft_launcher; settings the image's NVRx "
            "release does not know are ignored. The API server keeps "
            "the map as written; the operator refuses a job (Ready=False, reason InvalidSpec) whose map "
            f"sets one of {', '.join(FT_CONFIG_KEYS_SET_ELSEWHERE)}, saying what sets it instead (the "
            "spec's fields or rtj-launch; ft_launcher's flags win over its file), and so does `rtj render`. "
            f"Optional; one of config, configMap; at most {FT_CONFIG_MAX_KEYS} entries."
        ),
    )
    config_map: FtLauncherConfigMap | None = Field(
        default=None,
        description=(
            "configMap names a ConfigMap key holding the whole config file, mounted read-only at "
            f"{FT_LAUNCHER_CONFIG_MOUNT_PATH}/ in the worker and spare containers "
            f"({env_names.FT_CONFIG_FILE}); the operator does not read it. A file that sets "
            "initial_rank_heartbeat_timeout or rank_heartbeat_timeout keeps its values (rtj-launch then "
            "passes no heartbeat flag). Optional; one of config, configMap."
        ),
    )


class FaultTolerance(ApiModel):
    """Who runs the ranks (the launcher), ft_launcher heartbeats and restarts, and in-process restarts."""

    cel_rules = (
        CelRule(
            rule=(
                f"self.launcher != '{Launcher.SUPERVISOR.value}' || "
                "!has(self.inProcess) || self.inProcess.enabled"
            ),
            message=(
                "launcher Supervisor requires inProcess.enabled: true (reserve ranks take over lost ranks "
                "through in-process restarts)"
            ),
            check=lambda s: s.launcher is not Launcher.SUPERVISOR or s.in_process.enabled,
            field_path=".launcher",
        ),
        CelRule(
            rule="(self.heartbeatTimeoutSeconds == 0) == (self.initialHeartbeatTimeoutSeconds == 0)",
            message=(
                "heartbeatTimeoutSeconds and initialHeartbeatTimeoutSeconds are 0 together (heartbeat "
                "timeouts off) or neither"
            ),
            check=lambda s: (s.heartbeat_timeout_seconds == 0) == (s.initial_heartbeat_timeout_seconds == 0),
            field_path=".heartbeatTimeoutSeconds",
        ),
        CelRule(
            rule="self.initialHeartbeatTimeoutSeconds >= self.heartbeatTimeoutSeconds",
            message="initialHeartbeatTimeoutSeconds must be at least heartbeatTimeoutSeconds",
            check=lambda s: s.initial_heartbeat_timeout_seconds >= s.heartbeat_timeout_seconds,
            field_path=".initialHeartbeatTimeoutSeconds",
        ),
        CelRule(
            rule=(
                "self.heartbeatTimeoutSeconds == 0 || "
                "self.monitorIntervalSeconds < self.heartbeatTimeoutSeconds"
            ),
            message="monitorIntervalSeconds must be less than heartbeatTimeoutSeconds",
            check=lambda s: (
                s.heartbeat_timeout_seconds == 0 or s.monitor_interval_seconds < s.heartbeat_timeout_seconds
            ),
            field_path=".monitorIntervalSeconds",
        ),
        CelRule(
            rule=(
                "!has(self.inProcess) || !self.inProcess.enabled || "
                "self.heartbeatTimeoutSeconds > self.inProcess.hardTimeoutSeconds"
            ),
            message=(
                "heartbeatTimeoutSeconds must be greater than inProcess.hardTimeoutSeconds while in-process "
                "restarts are enabled (an in-process restart must finish before the launcher declares a "
                "hang; a script of your own, which does not restart in-process, sets "
                "inProcess.enabled: false)"
            ),
            check=lambda s: (
                (not s.in_process.enabled) or s.heartbeat_timeout_seconds > s.in_process.hard_timeout_seconds
            ),
            field_path=".heartbeatTimeoutSeconds",
        ),
        CelRule(
            rule=f"self.launcher != '{Launcher.SUPERVISOR.value}' || !has(self.ftLauncher)",
            message="ftLauncher applies to launcher FtLauncher only",
            check=lambda s: s.launcher is not Launcher.SUPERVISOR or s.ft_launcher is None,
            field_path=".ftLauncher",
        ),
    )

    launcher: Annotated[Launcher, Immutable()] = Field(
        default=Launcher.FT_LAUNCHER,
        description=(
            "launcher is what runs each pod's training processes. FtLauncher: NVRx's ft_launcher in every "
            "worker pod, with a rendezvous hosted by worker 0 or by a store pod (rendezvous.host); a rank "
            "that dies or hangs restarts the processes of every pod (an in-job restart, ~10 s plus the "
            "reload of the last checkpoint), and the loss of worker 0's node restarts every pod unless the "
            "store pod hosts the rendezvous. Supervisor: rtj-launch starts the ranks "
            "itself in one fixed NVRx in-process world (no ft_launcher, no rendezvous) that the hot "
            "spares' pods join as reserve ranks; a rank that dies or hangs, or a node that is lost (worker "
            "0's included), is replaced in-process by a reserve rank that takes over its index and its "
            "state from the memory tier (checkpoint.memoryIntervalSteps), in seconds and without a pod "
            "restart; the world's stores live in a small store pod of their own (<name>-store: 100m CPU, "
            "256Mi, on a node without the job's pods), whose loss restarts every pod. Supervisor needs "
            "inProcess.enabled and spends each spare's GPUs on idle reserve ranks, and a job recovers "
            "in-process from as many rank or node losses as there are spares' ranks; the "
            "heartbeat and in-job restart fields apply to FtLauncher only. Optional; default: FtLauncher. "
            "Immutable."
        ),
    )
    heartbeat_timeout_seconds: Int32 = Field(
        default=300,
        ge=0,
        le=86400,
        description="heartbeatTimeoutSeconds is how long a rank may miss heartbeats before ft_launcher "
        "restarts the workers; 0 (with initialHeartbeatTimeoutSeconds 0) turns heartbeat timeouts off, as "
        "a script that times NVRx sections and sends no heartbeats needs (its section timeouts go in "
        "ftLauncher.config). Optional; default: 300.",
    )
    initial_heartbeat_timeout_seconds: Int32 = Field(
        default=600,
        ge=0,
        le=86400,
        description="initialHeartbeatTimeoutSeconds is the heartbeat timeout before a rank's first "
        "heartbeat; at least heartbeatTimeoutSeconds; 0 only with heartbeatTimeoutSeconds 0 (off). "
        "Optional; default: 600.",
    )
    monitor_interval_seconds: Int32 = Field(
        default=5,
        ge=1,
        le=86400,
        description="monitorIntervalSeconds is how often ft_launcher checks its workers; less than "
        "heartbeatTimeoutSeconds. Optional; default: 5.",
    )
    max_in_job_restarts: Int32 = Field(
        default=20,
        ge=0,
        le=10000,
        description="maxInJobRestarts is the number of worker-process restarts ft_launcher makes before the "
        "pod fails. Optional; default: 20.",
    )
    in_process: InProcessRestart = Field(
        default_factory=InProcessRestart,
        description=(
            "inProcess configures NVRx in-process restarts. A script of your own sets enabled: false (it "
            "restarts through ft_launcher only, and heartbeatTimeoutSeconds need then not exceed "
            "inProcess.hardTimeoutSeconds); rtj-train, the default command, restarts in-process. "
            f"Optional; default: enabled. {LIBRARY_ONLY_NOTE}"
        ),
    )
    ft_launcher: FtLauncherSpec | None = Field(
        default=None,
        description=(
            "ftLauncher configures ft_launcher beyond the fields above, with NVRx's own settings: inline "
            "(config) or from a ConfigMap (configMap). The fields above still apply: rtj-launch passes "
            "them to ft_launcher as flags, which win over the file. Applies to launcher FtLauncher only. "
            "Optional; default: none (ft_launcher's defaults)."
        ),
    )
