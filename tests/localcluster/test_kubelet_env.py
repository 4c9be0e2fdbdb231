"""The process kubelet's pure rules: mount-path rewriting, env resolution, argv, pod phase."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from rtj_localcluster.kubelet import host_file_of_the_image, host_python_path
from rtj_localcluster.podenv import (
    container_argv,
    expand_references,
    merge_conditions,
    normalise_mounts,
    pod_phase,
    resolve_env,
    rewrite_path,
)

MOUNTS = normalise_mounts({"/ckpt": "/real/ckpt", "/ckpt/inner": "/real/inner", "/data/": "/real/data"})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/ckpt", "/real/ckpt"),
        ("/ckpt/", "/real/ckpt/"),
        ("/ckpt/job/step-1", "/real/ckpt/job/step-1"),
        ("/ckpt/inner/x", "/real/inner/x"),  # the longer (nested) mount wins
        ("/ckpt2/x", "/ckpt2/x"),  # path boundary: not under /ckpt
        ("/data", "/real/data"),
        ("relative/ckpt", "relative/ckpt"),
        ("--dir=/ckpt", "--dir=/ckpt"),  # only values that start with a mount path
    ],
)
def test_rewrite_path(value: str, expected: str) -> None:
    assert rewrite_path(value, MOUNTS) == expected


def test_a_host_file_of_the_image_under_a_mount_is_not_rewritten(tmp_path: Path) -> None:
    """The local cluster's image is the host's files: a checkout or virtual environment under /tmp,
    where the pod's scratch volume is mounted, stays where it is; the pod's own paths move."""
    checkout = tmp_path / "checkout"
    (checkout / ".venv" / "bin").mkdir(parents=True)
    (checkout / ".venv" / "bin" / "python").touch()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    mounts = normalise_mounts({str(tmp_path): str(scratch)})
    python, output = str(checkout / ".venv" / "bin" / "python"), str(tmp_path / "out")
    container = {"command": [python, "--output", output]}
    assert container_argv(container, {}, mounts, host_file_of_the_image) == [
        python,  # exists on the host, not in the volume: the image's
        "--output",
        str(scratch / "out"),  # the pod's
    ]
    (scratch / "checkout" / ".venv" / "bin").mkdir(parents=True)
    (scratch / "checkout" / ".venv" / "bin" / "python").touch()  # now the volume has it too
    assert rewrite_path(python, mounts, host_file_of_the_image) == str(
        scratch / "checkout" / ".venv" / "bin" / "python"
    )


def test_a_relative_host_python_path_names_the_same_directories_from_a_containers_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert host_python_path(".venv/nvrx-0.7.0::/abs/site") == [
        str(tmp_path / ".venv/nvrx-0.7.0"),
        "/abs/site",
    ]
    assert host_python_path("") == []


def test_expand_references() -> None:
    env = {"A": "1", "B": "two"}
    assert expand_references("$(A)-$(B)-$(C)-$$(A)", env) == "1-two-$(C)-$(A)"


def make_pod() -> dict[str, Any]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u-1",
            "labels": {"app": "x"},
            "annotations": {"note": "hello"},
        },
        "spec": {"nodeName": "node-3", "serviceAccountName": "trainer"},
    }


def test_resolve_env_sources_order_and_rewriting() -> None:
    container = {
        "name": "main",
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}, {"secretRef": {"name": "sec"}}],
        "env": [
            {"name": "PLAIN", "value": "v"},
            {"name": "EXPANDED", "value": "$(PLAIN)/$(CM_k)"},
            {"name": "DIR", "value": "/ckpt/job"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "NOTE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['note']"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "GPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.nvidia.com/gpu"}}},
            {"name": "KEY", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
            {"name": "PASS", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "password"}}},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "missing", "key": "x", "optional": True}}},
        ],
    }
    env = resolve_env(
        container,
        make_pod(),
        base={"PATH": "/bin", "PLAIN": "overridden"},
        pod_ip="127.0.1.7",
        host_ip="127.0.0.1",
        configmaps={"cm": {"data": {"k": "cmvalue"}}},
        secrets={"sec": {"data": {"password": base64.b64encode(b"s3cret").decode()}}},
        node_allocatable={"nvidia.com/gpu": "8"},
        mounts=MOUNTS,
    )
    assert env["PATH"] == "/bin"
    assert env["CM_k"] == "cmvalue"
    assert env["password"] == "s3cret"
    assert env["PLAIN"] == "v"
    assert env["EXPANDED"] == "v/cmvalue"
    assert env["DIR"] == "/real/ckpt/job"
    assert (env["POD"], env["NS"], env["UID"]) == ("p", "ns", "u-1")
    assert (env["LABEL"], env["NOTE"]) == ("x", "hello")
    assert (env["NODE"], env["SA"], env["IP"], env["HOST"]) == ("node-3", "trainer", "127.0.1.7", "127.0.0.1")
    assert env["GPUS"] == "8"
    assert (env["KEY"], env["PASS"]) == ("cmvalue", "s3cret")
    assert "OPT" not in env


def test_missing_required_configmap_is_an_error() -> None:
    container = {
        "name": "c",
        "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k"}}}],
    }
    with pytest.raises(KeyError):
        resolve_env(
            container,
            make_pod(),
            base={},
            pod_ip="",
            host_ip="",
            configmaps={},
            secrets={},
            node_allocatable={},
            mounts=[],
        )


def test_argv_expands_and_rewrites() -> None:
    container = {"command": ["python", "/ckpt/run.py"], "args": ["--out", "/ckpt/$(JOB)", "$(JOB)"]}
    assert container_argv(container, {"JOB": "j"}, MOUNTS) == [
        "python",
        "/real/ckpt/run.py",
        "--out",
        "/real/ckpt/j",
        "j",
    ]
    with pytest.raises(ValueError, match="no command"):
        container_argv({"name": "x"}, {}, MOUNTS)


def test_a_variable_holding_a_rewritten_path_is_not_rewritten_again() -> None:
    # The environment holds real directories already; one under a mount path stays as it is.
    env = {"CKPT": "/data/state/ckpt/j", "JOB": "j"}
    container = {"command": ["python"], "args": ["--dir", "$(CKPT)", "/ckpt/$(JOB)"]}
    assert container_argv(container, env, MOUNTS) == ["python", "--dir", "/data/state/ckpt/j", "/real/ckpt/j"]


@pytest.mark.parametrize(
    ("containers", "phase"),
    [
        ([], "Pending"),
        ([(False, None, False)], "Pending"),
        ([(True, None, False)], "Running"),
        ([(True, 0, False)], "Succeeded"),
        ([(True, 1, False)], "Failed"),
        ([(True, 1, True)], "Running"),  # will be restarted (OnFailure/Always)
        ([(True, 0, False), (True, None, False)], "Running"),
        ([(True, 0, False), (True, 2, False)], "Failed"),
        ([(True, 0, False), (False, None, False)], "Pending"),
    ],
)
def test_pod_phase(containers: list[tuple[bool, int | None, bool]], phase: str) -> None:
    assert pod_phase(containers) == phase


def test_merge_conditions_keeps_transition_times_and_foreign_conditions() -> None:
    previous = [
        {"type": "Ready", "status": "True", "lastTransitionTime": "t0"},
        {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"},
    ]
    merged = merge_conditions(
        previous,
        [
            {"type": "Ready", "status": "True", "lastTransitionTime": "t1"},
            {"type": "Initialized", "status": "True", "lastTransitionTime": "t1"},
        ],
    )
    assert merged[0]["lastTransitionTime"] == "t0"
    assert merged[1]["lastTransitionTime"] == "t1"
    assert merged[2]["type"] == "DisruptionTarget"
