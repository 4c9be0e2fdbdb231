"""A worker pod's identity on the process kubelet, with the rendered pieces that depend on it: the
trainer runs as uid 10001 (the pod's runAsUser/runAsGroup/fsGroup), cannot write to a checkpoint
volume whose root belongs to root, and writes the job's directory that the rendered init container
(root, ``rtj-launch --prepare-checkpoint-dir``) created for it; its emptyDir carries the fsGroup.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from rtj_localcluster import identity
from rtj_localcluster.client import SyncKubeClient, path_for
from rtj_localcluster.cluster import LocalCluster
from rtj_localcluster.testing import kubectl, wait_phase
from rtj_operator import api as rtj_api
from rtj_operator import render

pytestmark = pytest.mark.slow

PROBE = """
import json, os, sys
job_dir, root, scratch = sys.argv[1:4]
result = {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups())}
open(os.path.join(job_dir, "shard-0"), "w").write("ok")
open(os.path.join(os.environ["TMPDIR"], "ipc"), "w").write("ok")
open(os.path.join(os.environ["HOME"], "cache"), "w").write("ok")
open(os.path.join(scratch, "x"), "w").write("ok")
result["scratch_gid"] = os.stat(scratch).st_gid
try:
    open(os.path.join(root, "outside-the-job"), "w").write("no")
    result["root_writable"] = True
except PermissionError:
    result["root_writable"] = False
print(json.dumps(result))
"""


def rendered_job() -> rtj_api.ResilientTrainingJob:
    return rtj_api.parse_job(
        {
            "apiVersion": "resilient.training/v1alpha1",
            "kind": "ResilientTrainingJob",
            "metadata": {"name": "owned", "namespace": "x", "uid": "u"},
            "spec": {
                "image": "trainer:1",
                "nodes": 1,
                "instanceType": "cpu",
                "checkpoint": {"storage": {"existingClaim": {"claimName": "fsx"}}},
            },
        }
    )


def test_trainer_runs_as_its_user_and_writes_the_directory_the_init_container_prepared(
    shared_local_cluster: LocalCluster, api: SyncKubeClient, namespace: str
) -> None:
    assert identity.honored(), "the local cluster's kubelet runs as root with setpriv here"
    api.create(
        path_for("persistentvolumeclaims", namespace),
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "fsx"},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    # The renderer's pieces, as the operator sends them: the pod's securityContext and init container.
    worker = render.render_worker_pod(rendered_job(), 0)
    init = worker["spec"]["initContainers"][0]
    container: dict[str, Any] = {
        "name": "trainer",
        "image": "x",
        "command": ["python", "-c", PROBE, "/checkpoints/owned", "/checkpoints", "/scratch"],
        "volumeMounts": [
            {"name": rtj_api.CHECKPOINT_VOLUME, "mountPath": "/checkpoints"},
            {"name": "scratch", "mountPath": "/scratch"},
        ],
    }
    api.create(
        path_for("pods", namespace),
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "owned"},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": worker["spec"]["securityContext"],
                "initContainers": [init],
                "containers": [container],
                "volumes": [
                    {"name": rtj_api.CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": "fsx"}},
                    {"name": "scratch", "emptyDir": {}},
                ],
            },
        },
    )
    pod = wait_phase(api, namespace, "owned", "Succeeded", "Failed", timeout=120)
    logs = kubectl(shared_local_cluster.kubeconfig_path, "logs", "-n", namespace, "owned")
    assert pod["status"]["phase"] == "Succeeded", logs
    result = json.loads(logs.strip().splitlines()[-1])
    assert (result["uid"], result["gid"]) == (10001, 10001)
    assert result["groups"] == [10001]  # runAsGroup and fsGroup, the same group here
    assert result["root_writable"] is False  # the volume's root stays root's, as on FSx
    assert result["scratch_gid"] == 10001
    pvc = api.get(path_for("persistentvolumeclaims", namespace, "fsx"))
    pv = api.get(path_for("persistentvolumes", name=pvc["spec"]["volumeName"]))
    volume_root = Path(pv["spec"]["hostPath"]["path"])
    assert (volume_root.stat().st_uid, stat.S_IMODE(volume_root.stat().st_mode)) == (0, 0o755)
    job_dir = volume_root / "owned"
    info = job_dir.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (10001, 10001, 0o2770)
    shard = (job_dir / "shard-0").stat()
    assert (shard.st_uid, shard.st_gid) == (10001, 10001)
    assert os.getuid() == 0  # the test's own user, that of the kubelet: it switched for the trainer only
