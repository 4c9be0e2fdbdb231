"""ft_launcher's configuration from the spec (RTJ_FT_CONFIG, RTJ_FT_CONFIG_FILE), the step pattern
(RTJ_STEP_LOG_PATTERN) and the node's rank order, checked against the installed NVRx release's own
parser and functions (`make test` runs this file once per supported release)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from rtj_contract import env as env_names
from rtj_trainer.library import env, nvrx_compat
from rtj_trainer.runtime import launch, rankshim

NVRX_0_4_1 = (0, 4, 1)
NVRX_0_7_0 = (0, 7, 0)
BASE = {
    "RTJ_JOB_UID": "uid-1",
    "RTJ_NNODES": "2",
    "RTJ_NPROC_PER_NODE": "2",
    "RTJ_FT_HEARTBEAT_TIMEOUT_SECONDS": "300",
    "RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT_SECONDS": "600",
}
SECTION_TIMEOUTS = {
    "rank_section_timeouts": {"setup": 600, "step": 30, "checkpointing": 200},
    "rank_out_of_section_timeout": 300,
}


def trainer_env(**overrides: str) -> env.TrainerEnv:
    return env.TrainerEnv.from_environ({**BASE, **overrides})


@pytest.mark.parametrize("version", [NVRX_0_4_1, NVRX_0_7_0])
def test_the_config_file_goes_to_ft_launchers_config_path_flag(version: tuple[int, ...]) -> None:
    argv = launch.ft_launcher_argv(
        trainer_env(), rdzv_address="10.0.0.5", command=["python", "/app/train.py"], cpu=True,
        nvrx_version=version, config_path="/etc/rtj/ft-launcher/config.yaml",
    )  # fmt: skip
    assert "--ft-cfg-path=/etc/rtj/ft-launcher/config.yaml" in argv
    assert argv.index("--ft-cfg-path=/etc/rtj/ft-launcher/config.yaml") < argv.index("--no-python")
    without = launch.ft_launcher_argv(
        trainer_env(), rdzv_address="h", command=["x"], cpu=True, nvrx_version=version
    )
    assert not [a for a in without if a.startswith("--ft-cfg-path")]


def _parsed(tmp_path: Path, trainer: env.TrainerEnv) -> tuple[list[str], Any]:
    """The argv rtj-launch builds for `trainer`'s config, and the installed NVRx's reading of it."""
    from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig
    from nvidia_resiliency_ext.fault_tolerance.launcher import get_args_parser

    config = launch.ft_config(trainer)
    path = None
    if config is not None:
        path = tmp_path / "ft.yaml"
        path.write_text(yaml.safe_dump(config))
    argv = launch.ft_launcher_argv(
        trainer, rdzv_address="10.0.0.5", command=["python", "/app/train.py"], cpu=True,
        config_path=str(path) if path else None, config_keys=launch.ft_section_keys(config),
    )  # fmt: skip
    return argv, FaultToleranceConfig.from_args(get_args_parser().parse_args(argv[1:]))


def test_installed_launcher_reads_the_file_and_the_spec_sets_the_heartbeats(tmp_path: Path) -> None:
    argv, ft = _parsed(tmp_path, trainer_env(RTJ_FT_CONFIG=yaml.safe_dump(SECTION_TIMEOUTS)))
    assert ft.rank_section_timeouts == SECTION_TIMEOUTS["rank_section_timeouts"]
    assert ft.rank_out_of_section_timeout == 300
    assert float(ft.rank_heartbeat_timeout) == 300.0  # the spec's flags
    assert float(ft.initial_rank_heartbeat_timeout) == 600.0
    # ft_launcher runs the shim, which runs the user's command.
    assert argv[-2:] == ["python", "/app/train.py"]


def test_heartbeat_timeouts_of_0_are_off_for_the_installed_launcher(tmp_path: Path) -> None:
    # A script that only times sections: the spec's 0 becomes null in the file, and no flag is passed
    # (leaving the flags out alone would give NVRx's own defaults).
    off = {"RTJ_FT_HEARTBEAT_TIMEOUT_SECONDS": "0", "RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT_SECONDS": "0"}
    argv, ft = _parsed(tmp_path, trainer_env(RTJ_FT_CONFIG=yaml.safe_dump(SECTION_TIMEOUTS), **off))
    assert not [a for a in argv if "heartbeat-timeout" in a]
    assert ft.rank_heartbeat_timeout is None and ft.initial_rank_heartbeat_timeout is None
    assert ft.rank_section_timeouts == SECTION_TIMEOUTS["rank_section_timeouts"]
    # Without any config of the user's, a file of rtj-launch's own says it.
    argv, ft = _parsed(tmp_path, trainer_env(**off))
    assert ft.rank_heartbeat_timeout is None and ft.initial_rank_heartbeat_timeout is None


def test_a_mounted_file_that_sets_the_heartbeats_keeps_them(tmp_path: Path) -> None:
    mounted = tmp_path / "mounted.yaml"
    section = {**SECTION_TIMEOUTS, "rank_heartbeat_timeout": 10}
    mounted.write_text(yaml.safe_dump({"fault_tolerance": section}))
    argv, ft = _parsed(tmp_path, trainer_env(RTJ_FT_CONFIG_FILE=str(mounted)))
    assert float(ft.rank_heartbeat_timeout) == 10.0  # the file's: rtj-launch passed no flag for it
    assert float(ft.initial_rank_heartbeat_timeout) == 600.0  # the spec's flag
    assert [a for a in argv if "heartbeat-timeout" in a] == ["--ft-initial-rank-heartbeat-timeout=600"]


def test_inline_config_is_put_under_the_fault_tolerance_section() -> None:
    bare = yaml.safe_dump({"rank_out_of_section_timeout": 300})
    assert launch.inline_ft_config(bare) == {"fault_tolerance": {"rank_out_of_section_timeout": 300}}
    # What the operator renders (a fault_tolerance section) is kept as it is.
    rendered = {"fault_tolerance": SECTION_TIMEOUTS}
    assert launch.inline_ft_config(yaml.safe_dump(rendered)) == rendered
    for bad in ("[1, 2]", "just text", "a: [", ""):
        with pytest.raises(env.EnvError, match="RTJ_FT_CONFIG"):
            launch.inline_ft_config(bad)


def test_a_mounted_config_file_must_exist_and_hold_the_section(tmp_path: Path) -> None:
    nested = tmp_path / "nested.yaml"
    nested.write_text(yaml.safe_dump({"training": {"fault_tolerance": {"rank_heartbeat_timeout": 5}}}))
    assert launch.ft_section_keys(launch.mounted_ft_config(str(nested))) == {"rank_heartbeat_timeout"}
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"rank_heartbeat_timeout": 5}))
    with pytest.raises(env.EnvError, match="no fault_tolerance section"):
        launch.mounted_ft_config(str(other))
    with pytest.raises(env.EnvError, match="RTJ_FT_CONFIG_FILE"):
        launch.mounted_ft_config(str(tmp_path / "missing.yaml"))


def test_worker_i_holds_group_rank_i_where_the_release_orders_by_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert nvrx_compat.ft_launcher_environment(3, NVRX_0_7_0) == {"GROUP_RANK": "3"}
    assert nvrx_compat.ft_launcher_environment(3, NVRX_0_4_1) == {}
    installed = nvrx_compat.ft_launcher_environment(5)
    if nvrx_compat.nvrx_version() < nvrx_compat.NVRX_0_7:
        assert installed == {}
        return
    # The variable is the one the installed rendezvous reads for the infrastructure rank.
    from nvidia_resiliency_ext.fault_tolerance.utils import get_infrastructure_rank

    for name in ("SLURM_PROCID", "CROSS_SLURM_PROCID", "SLURM_JOB_ID", "NVRX_INFRA_RANK_FROM_NODENAME"):
        monkeypatch.delenv(name, raising=False)
    for name, value in installed.items():
        monkeypatch.setenv(name, value)
    assert get_infrastructure_rank() == 5


def test_env_reads_and_checks_the_new_variables() -> None:
    parsed = trainer_env(RTJ_STEP_LOG_PATTERN=r"step (?P<step>\d+)", RTJ_FT_CONFIG="fault_tolerance: {a: 1}")
    assert parsed.step_log_pattern == r"step (?P<step>\d+)" and parsed.ft_config.startswith("fault")
    assert trainer_env(RTJ_FT_CONFIG_FILE="/etc/rtj/ft-launcher/config.yaml").ft_config_file
    assert {env_names.STEP_LOG_PATTERN, env_names.FT_CONFIG, env_names.FT_CONFIG_FILE} <= set(
        env_names.CONTRACT_NAMES
    )
    # The rank shim reads the pattern with its own copy of the name; rtj-launch checks it.
    assert env_names.STEP_LOG_PATTERN == rankshim.STEP_LOG_PATTERN_ENV
    launch.check_step_log_pattern(parsed.step_log_pattern)
    launch.check_step_log_pattern("")
    with pytest.raises(env.EnvError, match=r"RTJ_STEP_LOG_PATTERN.*not a Python regular expression"):
        launch.check_step_log_pattern(trainer_env(RTJ_STEP_LOG_PATTERN="step (").step_log_pattern)
    with pytest.raises(env.EnvError, match=r"RTJ_STEP_LOG_PATTERN.*no group"):
        launch.check_step_log_pattern(trainer_env(RTJ_STEP_LOG_PATTERN=r"step \d+").step_log_pattern)
    with pytest.raises(env.EnvError, match="exclusive"):
        trainer_env(RTJ_FT_CONFIG="a: 1", RTJ_FT_CONFIG_FILE="/x.yaml")


def test_a_bad_pattern_stops_rtj_launch_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    message = tmp_path / "termination-log"
    monkeypatch.setenv("RTJ_STEP_LOG_PATTERN", "step (")
    monkeypatch.setenv("RTJ_TERMINATION_MESSAGE_PATH", str(message))
    assert launch.main(["--", str(tmp_path / "never-run")]) == 78
    first, second = message.read_text().splitlines()
    assert first == "FaultReason: StartupFailed" and "RTJ_STEP_LOG_PATTERN" in second


def test_standby_spares_need_nvrx_0_7_and_a_worker_on_an_older_release_stops_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    standby = trainer_env(RTJ_NNODES="2", RTJ_NNODES_MAX="3", RTJ_NODE_RANK="2")
    assert standby.standby_spares and standby.slots == 3
    assert not trainer_env(RTJ_NNODES="2").standby_spares
    launch.check_standby_support(standby, (0, 7, 0))
    with pytest.raises(env.EnvError, match=r"rendezvous.spares Standby .* needs NVRx 0.7 or later"):
        launch.check_standby_support(standby, (0, 4, 1))
    if nvrx_compat.nvrx_version() >= nvrx_compat.NVRX_0_7:
        return  # the refusal below is for releases before 0.7 (.venv's 0.4.1)
    message = tmp_path / "termination-log"
    for name, value in {
        "RTJ_NNODES": "2",
        "RTJ_NNODES_MAX": "3",
        "RTJ_TERMINATION_MESSAGE_PATH": str(message),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert launch.main(["--", str(tmp_path / "never-run")]) == 78
    first, second = message.read_text().splitlines()
    assert first == "FaultReason: StartupFailed" and "rendezvous.spares HoldNode" in second
