"""A training script of one's own: its step log pattern, ft_launcher's own settings (inline or from a
ConfigMap) and how they are rendered, the fields only the rtj library honours, and examples/byo-nvrx.yaml."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import kubernetes_validate
import pytest
import yaml
from crd_tools import REPO, crd_errors, load_example, openapi_schema
from rtj_contract import env as env_names
from rtj_operator import api, constants, names, render
from rtj_operator.api.spec import LIBRARY_ONLY_NOTE

UID = "3b1f7c2e-9a4d-4f0b-8c6e-2d5a7b9e1f03"


def body(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resilient.training/v1alpha1",
        "kind": "ResilientTrainingJob",
        "metadata": {"name": "own", "namespace": "ml", "uid": UID},
        "spec": {
            "image": "trainer:1",
            "nodes": 2,
            "hotSpares": 1,
            "instanceType": "cpu",
            "command": ["python", "/app/train.py"],
            "checkpoint": {"storage": {"dynamic": {}}},
            **spec,
        },
    }


def job(**spec: Any) -> api.ResilientTrainingJob:
    return api.parse_job(body(**spec))


def container(pod: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = pod["spec"]["containers"][0]
    return result


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(pod)["env"]}


def pods(the_job: api.ResilientTrainingJob) -> list[dict[str, Any]]:
    return [render.render_worker_pod(the_job, 0), render.render_spare_pod(the_job, 0)]


SECTIONS = {
    "rank_section_timeouts": {"init": 600, "step": 60.5, "idle": None},
    "rank_out_of_section_timeout": 60,
}


# --- rendering ---------------------------------------------------------------------------------------------


def test_nothing_is_rendered_for_the_optional_fields_left_unset() -> None:
    for pod in pods(job()):
        assert not set(constants.ENV_WHEN_SET) & set(env_of(pod))
        assert api.FT_LAUNCHER_CONFIG_VOLUME not in {v["name"] for v in pod["spec"]["volumes"]}
        assert api.FT_LAUNCHER_CONFIG_MOUNT_PATH not in {
            m["mountPath"] for m in container(pod)["volumeMounts"]
        }


def test_the_step_log_pattern_is_rendered_as_written() -> None:
    pattern = r"^step (?P<step>\d+) loss (?P<loss>\S+)"
    for pod in pods(job(progress={"stepLogPattern": pattern})):
        assert env_of(pod)[env_names.STEP_LOG_PATTERN] == pattern


def test_an_inline_config_is_rendered_as_the_fault_tolerance_section_of_a_config_file() -> None:
    the_job = job(faultTolerance={"ftLauncher": {"config": SECTIONS}})
    for pod in pods(the_job):
        text = env_of(pod)[env_names.FT_CONFIG]
        assert yaml.safe_load(text) == {"fault_tolerance": SECTIONS}
        assert env_names.FT_CONFIG_FILE not in env_of(pod)
        assert api.FT_LAUNCHER_CONFIG_VOLUME not in {v["name"] for v in pod["spec"]["volumes"]}
    # Stable bytes whatever the order of the keys as written (the operator compares renders).
    reordered = job(faultTolerance={"ftLauncher": {"config": dict(reversed(SECTIONS.items()))}})
    assert render.render(reordered) == render.render(the_job)


def test_ft_launchers_own_loader_reads_the_rendered_config(tmp_path) -> None:
    # NVRx's FaultToleranceConfig.from_yaml_file is what ft_launcher's --ft-cfg-path reads the file with.
    config_module = pytest.importorskip("nvidia_resiliency_ext.fault_tolerance.config")
    path = tmp_path / "ft.yaml"
    path.write_text(render.ft_launcher_config_yaml({**SECTIONS, "safety_factor": 3.0}), encoding="utf-8")
    loaded = config_module.FaultToleranceConfig.from_yaml_file(str(path))
    assert loaded.rank_section_timeouts == SECTIONS["rank_section_timeouts"]
    assert loaded.rank_out_of_section_timeout == 60
    assert loaded.safety_factor == 3.0


@pytest.mark.parametrize(
    ("config_map", "file"), [({"name": "ft"}, "config.yaml"), ({"name": "ft", "key": "ft.yml"}, "ft.yml")]
)
def test_a_config_map_is_mounted_read_only_and_its_file_named(config_map: dict[str, str], file: str) -> None:
    the_job = job(faultTolerance={"ftLauncher": {"configMap": config_map}})
    for pod in pods(the_job):
        assert env_of(pod)[env_names.FT_CONFIG_FILE] == f"/etc/rtj/ft-launcher/{file}"
        assert env_names.FT_CONFIG not in env_of(pod)
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["rtj-ft-launcher"] == {
            "name": "rtj-ft-launcher",
            "configMap": {"name": "ft", "items": [{"key": file, "path": file}]},
        }
        mounts = [m for m in container(pod)["volumeMounts"] if m["name"] == "rtj-ft-launcher"]
        assert mounts == [{"name": "rtj-ft-launcher", "mountPath": "/etc/rtj/ft-launcher", "readOnly": True}]
        kubernetes_validate.validate(pod, "1.32", strict=True)


def test_the_users_env_still_wins() -> None:
    the_job = job(
        progress={"stepLogPattern": r"step (\d+)"},
        env=[{"name": env_names.STEP_LOG_PATTERN, "value": r"it (\d+)"}],
    )
    env = container(render.render_worker_pod(the_job, 0))["env"]
    assert [e["value"] for e in env if e["name"] == env_names.STEP_LOG_PATTERN] == [r"it (\d+)"]


RUNTIME_IMAGE = "registry.example/rtj-runtime:0.1.0"


def test_a_runtime_image_is_copied_into_every_pod_and_run_with_the_images_python() -> None:
    the_job = job(runtimeImage=RUNTIME_IMAGE, faultTolerance={"launcher": "Supervisor"}, hotSpares=0)
    store = render.render_store_pod(the_job)
    for pod, command in [
        *((p, "rtj-launch") for p in pods(job(runtimeImage=RUNTIME_IMAGE))),
        (render.render_worker_pod(the_job, 0), "rtj-launch"),
        (store, "rtj-store"),
    ]:
        installer = pod["spec"]["initContainers"][0]
        assert installer["name"] == names.RUNTIME_INIT_CONTAINER_NAME
        assert installer["image"] == RUNTIME_IMAGE
        assert installer["command"] == ["rtj-launch", "--install-runtime", api.RUNTIME_MOUNT_PATH]
        assert installer["volumeMounts"] == [
            {"name": api.RUNTIME_VOLUME, "mountPath": api.RUNTIME_MOUNT_PATH}
        ]
        assert installer["securityContext"]["readOnlyRootFilesystem"] is True
        main = container(pod)
        assert main["image"] == "trainer:1"
        assert main["command"][:2] == ["python3", f"{api.RUNTIME_MOUNT_PATH}/{command}.py"]
        assert {"name": api.RUNTIME_VOLUME, "mountPath": api.RUNTIME_MOUNT_PATH, "readOnly": True} in main[
            "volumeMounts"
        ]
        assert {"name": api.RUNTIME_VOLUME, "emptyDir": {"sizeLimit": "256Mi"}} in pod["spec"]["volumes"]
        kubernetes_validate.validate(pod, "1.32", strict=True)
    assert container(store)["command"][2:] == ["--port", str(the_job.spec.rendezvous.port)]


def test_the_checkpoint_directory_is_prepared_by_the_runtime_image() -> None:
    the_job = job(
        runtimeImage=RUNTIME_IMAGE, checkpoint={"storage": {"dynamic": {}}, "prepareDirectory": True}
    )
    init = {c["name"]: c for c in render.render_worker_pod(the_job, 0)["spec"]["initContainers"]}
    assert list(init) == [names.RUNTIME_INIT_CONTAINER_NAME, names.CHECKPOINT_INIT_CONTAINER_NAME]
    assert init[names.CHECKPOINT_INIT_CONTAINER_NAME]["image"] == RUNTIME_IMAGE


def test_without_a_runtime_image_the_image_runs_its_own_runtime() -> None:
    for pod in pods(job()):
        assert container(pod)["command"] == ["rtj-launch"]
        assert names.RUNTIME_INIT_CONTAINER_NAME not in {
            c["name"] for c in pod["spec"].get("initContainers", [])
        }
        assert api.RUNTIME_VOLUME not in {v["name"] for v in pod["spec"]["volumes"]}


def test_the_operators_runtime_commands_are_the_ones_the_runtime_installs() -> None:
    """The operator renders what rtj_trainer.runtime.install writes, and each entry script runs the
    module that the package's console script of the same name runs."""
    from rtj_trainer.runtime import install

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert render.INSTALL_RUNTIME_ARG == install.INSTALL_RUNTIME
    for command in (render.LAUNCH_COMMAND, render.STORE_COMMAND):
        assert install.ENTRY_SCRIPTS[f"{command}.py"] == scripts[command].partition(":")[0]
        assert scripts[command].endswith(":main")


@pytest.mark.parametrize(
    "spec",
    [
        {"volumes": [{"name": "rtj-runtime", "emptyDir": {}}]},
        {
            "volumes": [{"name": "v", "emptyDir": {}}],
            "volumeMounts": [{"name": "v", "mountPath": "/opt/rtj/runtime"}],
        },
        {"runtimeImage": "has space"},
    ],
)
def test_the_runtimes_volume_and_path_are_reserved_and_its_image_checked(spec: dict[str, Any]) -> None:
    errors = crd_errors(body(**spec))
    assert errors, spec
    with pytest.raises(api.JobValidationError):
        job(**spec)


# --- validation --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "line", "step"),
    [
        (r"^step (?P<step>\d+) loss (?P<loss>\S+)", "step 12 loss 0.5", "12"),
        (r"iteration (\d+)/\d+", "iteration 7/100", "7"),
        (r"loss (?P<loss>\S+) step (?P<step>\d+)", "loss 0.5 step 3", "3"),
        (r"\[(\d+)\] loss=(?P<loss>[\d.]+)", "[9] loss=1.25", "9"),
    ],
)
def test_a_pattern_with_a_group_for_the_step_is_valid_for_both(pattern: str, line: str, step: str) -> None:
    the_body = body(progress={"stepLogPattern": pattern})
    compiled = re.compile(api.parse_job(the_body).spec.progress.step_log_pattern or "")
    match = compiled.search(line)
    assert match is not None
    assert (match.group("step") if "step" in compiled.groupindex else match.group(1)) == step
    assert crd_errors(the_body) == []


@pytest.mark.parametrize(
    ("spec", "field", "says"),
    [
        (
            {"progress": {"stepLogPattern": "step (\\d+"}},
            "spec.progress.stepLogPattern",
            "not a Python regular",
        ),
        ({"progress": {"stepLogPattern": "step \\d+"}}, "spec.progress.stepLogPattern", "(?P<step>...)"),
        (
            {"faultTolerance": {"ftLauncher": {"config": {"rank_heartbeat_timeout": 30}}}},
            "spec.faultTolerance.ftLauncher.config",
            "rank_heartbeat_timeout: set spec.faultTolerance.heartbeatTimeoutSeconds instead (0: off)",
        ),
        (
            {"faultTolerance": {"ftLauncher": {"config": {"initial_rank_heartbeat_timeout": 30}}}},
            "spec.faultTolerance.ftLauncher.config",
            "set spec.faultTolerance.initialHeartbeatTimeoutSeconds instead",
        ),
        (
            {"faultTolerance": {"ftLauncher": {"config": {"monitor_interval": 1, "max_restarts": 2}}}},
            "spec.faultTolerance.ftLauncher.config",
            "monitorIntervalSeconds instead; max_restarts: set spec.faultTolerance.maxInJobRestarts",
        ),
        (
            {"faultTolerance": {"ftLauncher": {"config": {"enable_nic_monitor": False}}}},
            "spec.faultTolerance.ftLauncher.config",
            "rtj-launch sets it",
        ),
    ],
)
def test_what_only_the_operator_can_check_is_refused_naming_the_field(
    spec: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(api.JobValidationError) as raised:
        job(**spec)
    assert raised.value.paths == [field]
    assert says in str(raised.value)
    # The API server accepts these: CEL cannot compile a Python regex or see into a map of unknown fields.
    assert crd_errors(body(**spec)) == []


def test_the_api_server_keeps_the_config_as_written() -> None:
    schema = openapi_schema()["properties"]["spec"]["properties"]["faultTolerance"]["properties"][
        "ftLauncher"
    ]
    assert schema["properties"]["config"]["x-kubernetes-preserve-unknown-fields"] is True
    nested = {**SECTIONS, "attribution_endpoint": "http://a:8000", "segment": 4}
    the_body = body(faultTolerance={"ftLauncher": {"config": nested}})
    assert crd_errors(the_body) == []
    ft_launcher = api.parse_job(the_body).spec.fault_tolerance.ft_launcher
    assert ft_launcher is not None and ft_launcher.config == nested


def test_ft_launcher_is_refused_under_supervisor_with_a_message_that_says_why() -> None:
    spec = {"faultTolerance": {"launcher": "Supervisor", "ftLauncher": {"config": SECTIONS}}}
    with pytest.raises(api.JobValidationError, match=r"spec\.faultTolerance\.ftLauncher: .*FtLauncher only"):
        job(**spec)
    assert crd_errors(body(**spec)) == [
        ("spec.faultTolerance.ftLauncher", "ftLauncher applies to launcher FtLauncher only")
    ]


# --- fields only the rtj library honours -------------------------------------------------------------------


def _schema_at(path: str) -> dict[str, Any]:
    node: dict[str, Any] = openapi_schema()["properties"]["spec"]
    for key in path.split("."):
        node = node["properties"][key]
    return node


def test_every_library_only_field_exists_and_says_so() -> None:
    assert api.LIBRARY_ONLY_FIELDS
    for path in api.LIBRARY_ONLY_FIELDS:
        assert _schema_at(path)["description"].endswith(LIBRARY_ONLY_NOTE), path
    assert _schema_at("faultTolerance.inProcess")["description"].endswith(LIBRARY_ONLY_NOTE)
    reference = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    assert reference.count(LIBRARY_ONLY_NOTE) == len(api.LIBRARY_ONLY_FIELDS) + 1


def test_library_only_fields_set_lists_those_set_to_other_than_their_default() -> None:
    assert api.library_only_fields_set(job().spec) == ()
    # Defaults written out are not settings; disabling in-process restarts is what a script of one's own
    # is told to do.
    defaults = job(
        checkpoint={"intervalSteps": 100, "storage": {"dynamic": {}}},
        faultTolerance={"inProcess": {"enabled": False}},
    )
    assert api.library_only_fields_set(defaults.spec) == ()
    tuned = job(
        checkpoint={"intervalSteps": 50, "mode": "Sync", "storage": {"dynamic": {}}},
        faultTolerance={
            "heartbeatTimeoutSeconds": 300,
            "inProcess": {"softTimeoutSeconds": 30, "hardTimeoutSeconds": 45},
        },
    )
    assert api.library_only_fields_set(tuned.spec) == (
        "checkpoint.intervalSteps",
        "checkpoint.mode",
        "faultTolerance.inProcess.softTimeoutSeconds",
        "faultTolerance.inProcess.hardTimeoutSeconds",
    )


# --- the example -------------------------------------------------------------------------------------------


def test_the_byo_nvrx_example_runs_a_script_of_ones_own() -> None:
    the_job = api.parse_job(load_example(REPO / "examples" / "byo-nvrx.yaml"))
    spec = the_job.spec
    assert spec.command == ["python", "/app/train.py"]
    assert spec.fault_tolerance.launcher is api.Launcher.FT_LAUNCHER
    assert spec.fault_tolerance.in_process.enabled is False
    assert api.library_only_fields_set(spec) == ()
    # The pattern reads the lines examples/byo/train.py prints.
    script = (REPO / "examples" / "byo" / "train.py").read_text(encoding="utf-8")
    assert 'print(f"step {step} loss {loss.item():.4f}"' in script
    match = re.search(spec.progress.step_log_pattern or "", "step 1200 loss 0.0412")
    assert match is not None and match.group("step", "loss") == ("1200", "0.0412")
    # Its config names the sections the script opens with --sections.
    ft_launcher = spec.fault_tolerance.ft_launcher
    assert ft_launcher is not None and ft_launcher.config is not None
    assert "--sections" in spec.args
    assert set(ft_launcher.config["rank_section_timeouts"]) == set(
        re.findall(r'start_section\("(\w+)"\)', script)
    )
    worker = render.render_worker_pod(the_job, 0, uid=UID)
    rendered = yaml.safe_load(env_of(worker)[env_names.FT_CONFIG])
    assert rendered == {"fault_tolerance": ft_launcher.config}
    # The kubelet expands $(RTJ_CHECKPOINT_DIR) in the args from the container's env.
    assert "$(RTJ_CHECKPOINT_DIR)" in container(worker)["args"]
    assert env_of(worker)[env_names.CHECKPOINT_DIR] == "/checkpoints/byo-nvrx"
