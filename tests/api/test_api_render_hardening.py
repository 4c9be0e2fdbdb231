"""The trainer containers are locked down: non-root, no privilege escalation, RuntimeDefault seccomp,
a read-only root filesystem with writable volumes where the trainer writes, every capability dropped
but IPC_LOCK on EFA nodes. The real API server's verdict on these pods (Pod Security levels) is in
tests/localcluster/test_pod_security.py."""

from __future__ import annotations

from typing import Any

import pytest
from rtj_operator import api, render

UID = "0c6f1e0e-0000-4000-8000-000000000003"


def job(instance_type: str = "p5.48xlarge", **spec: Any) -> api.ResilientTrainingJob:
    body_spec: dict[str, Any] = {
        "image": "trainer:1",
        "nodes": 2,
        "instanceType": instance_type,
        "checkpoint": {"storage": {"existingClaim": {"claimName": "ckpt"}}},
        **spec,
    }
    return api.parse_job(
        {
            "apiVersion": "resilient.training/v1alpha1",
            "kind": "ResilientTrainingJob",
            "metadata": {"name": "hard", "namespace": "ml", "uid": UID},
            "spec": body_spec,
        }
    )


def containers(model: api.ResilientTrainingJob) -> list[dict[str, Any]]:
    pods = [render.render_worker_pod(model, 0), render.render_spare_pod(model, 0)]
    return [c for pod in pods for c in pod["spec"]["containers"]]


def spare_job(instance_type: str) -> api.ResilientTrainingJob:
    return job(instance_type, hotSpares=1)


@pytest.mark.parametrize(("instance_type", "added"), [("p5.48xlarge", ["IPC_LOCK"]), ("cpu", None)])
def test_every_capability_is_dropped_and_only_efa_nodes_add_ipc_lock(
    instance_type: str, added: list[str] | None
) -> None:
    for container in containers(spare_job(instance_type)):
        context = container["securityContext"]
        assert context["capabilities"].get("drop") == ["ALL"]
        assert context["capabilities"].get("add") == added
        assert context["runAsNonRoot"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["privileged"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}


def test_a_read_only_root_keeps_tmp_and_home_writable_on_one_size_limited_volume() -> None:
    pod = render.render_worker_pod(job("cpu"), 0)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[api.SCRATCH_VOLUME] == {"name": api.SCRATCH_VOLUME, "emptyDir": {"sizeLimit": "16Gi"}}
    (container,) = pod["spec"]["containers"]
    scratch = {
        m["mountPath"]: m["subPath"] for m in container["volumeMounts"] if m["name"] == api.SCRATCH_VOLUME
    }
    assert scratch == {"/tmp": "tmp", "/home/rtj": "home"}
    env = {e["name"]: e.get("value") for e in container["env"]}
    # HOME points at the writable volume: Triton's, CUDA's and pip's caches live under it.
    assert env["HOME"] == "/home/rtj"
    # /dev/shm stays a memory-backed emptyDir (NCCL, data loaders).
    assert volumes[api.SHM_VOLUME]["emptyDir"]["medium"] == "Memory"


def test_a_path_the_job_mounts_itself_is_not_mounted_twice() -> None:
    model = job(
        "cpu",
        volumes=[{"name": "cache", "emptyDir": {}}],
        volumeMounts=[{"name": "cache", "mountPath": "/tmp/"}],
        checkpoint={"mountPath": "/home/rtj", "storage": {"existingClaim": {"claimName": "ckpt"}}},
        env=[{"name": "HOME", "value": "/data/home"}],
    )
    (container,) = render.render_worker_pod(model, 0)["spec"]["containers"]
    paths = [m["mountPath"] for m in container["volumeMounts"]]
    assert len(paths) == len(set(p.rstrip("/") for p in paths)), paths
    assert not [m for m in container["volumeMounts"] if m["name"] == api.SCRATCH_VOLUME]
    # The job's own HOME wins over the renderer's.
    assert [e["value"] for e in container["env"] if e["name"] == "HOME"] == ["/data/home"]


def test_the_scratch_volume_name_is_reserved() -> None:
    with pytest.raises(ValueError, match="rtj-scratch"):
        job("cpu", volumes=[{"name": api.SCRATCH_VOLUME, "emptyDir": {}}])
