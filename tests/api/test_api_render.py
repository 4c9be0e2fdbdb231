"""What the renderer produces for a job: the children, their wiring, the env contract, node placement."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from rtj_contract import env as env_names
from rtj_contract import progress as progress_contract
from rtj_operator import api, constants, names, profiles, render

UID = "7d0c1d3e-2b8f-4a47-9b59-0b6f1d0c2e5a"


def job(**spec: Any) -> api.ResilientTrainingJob:
    body_spec: dict[str, Any] = {
        "image": "trainer:1",
        "nodes": 3,
        "checkpoint": {
            "storage": {
                "fsxStatic": {"fileSystemId": "fs-0123456789abcdef0", "dnsName": "fs.x", "mountName": "mnt"}
            }
        },
    }
    body_spec.update(spec)
    return api.parse_job(
        {
            "apiVersion": "resilient.training/v1alpha1",
            "kind": "ResilientTrainingJob",
            "metadata": {"name": "llm", "namespace": "ml", "uid": UID},
            "spec": body_spec,
        }
    )


def by_kind_name(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def test_children_in_creation_order() -> None:
    objects = render.render(job(hotSpares=2))
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("ServiceAccount", "llm-trainer"),
        ("PersistentVolume", "llm-checkpoints-ml"),
        ("PersistentVolumeClaim", "llm-checkpoints"),
        ("Service", "llm"),
        ("Pod", "llm-worker-0"),
        ("Pod", "llm-worker-1"),
        ("Pod", "llm-worker-2"),
        ("Pod", "llm-spare-0"),
        ("Pod", "llm-spare-1"),
    ]


@pytest.mark.parametrize("retention", ["Retain", "Delete"])
def test_labels_and_owner_references(retention: str) -> None:
    spec_job = job(
        checkpoint={"retentionPolicy": retention, "storage": {"dynamic": {"storageClassName": "fsx"}}}
    )
    for obj in render.render(spec_job):
        meta = obj["metadata"]
        assert meta["labels"][constants.LABEL_JOB] == "llm"
        assert meta["labels"][constants.LABEL_MANAGED_BY] == constants.MANAGED_BY
        owned = obj["kind"] != "PersistentVolumeClaim" or retention == "Delete"
        if owned:
            assert meta["ownerReferences"] == [
                {
                    "apiVersion": "resilient.training/v1alpha1",
                    "kind": "ResilientTrainingJob",
                    "name": "llm",
                    "uid": UID,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
        else:
            assert "ownerReferences" not in meta


def test_static_fsx_volume_and_its_claim() -> None:
    fsx = {
        "fileSystemId": "fs-0123456789abcdef0",
        "dnsName": "fs.x",
        "mountName": "mnt",
        "capacity": "2400Gi",
    }
    the_job = job(checkpoint={"retentionPolicy": "Delete", "storage": {"fsxStatic": fsx}})
    objects = by_kind_name(render.render(the_job))
    pv = objects[("PersistentVolume", "llm-checkpoints-ml")]
    assert "ownerReferences" not in pv["metadata"] and "namespace" not in pv["metadata"]
    assert pv["spec"]["csi"] == {
        "driver": "fsx.csi.aws.com",
        "volumeHandle": "fs-0123456789abcdef0",
        "volumeAttributes": {"dnsname": "fs.x", "mountname": "mnt"},
    }
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert pv["spec"]["accessModes"] == ["ReadWriteMany"] and pv["spec"]["storageClassName"] == ""
    assert pv["spec"]["capacity"] == {"storage": "2400Gi"}
    pvc = objects[("PersistentVolumeClaim", "llm-checkpoints")]
    assert pvc["spec"]["volumeName"] == "llm-checkpoints-ml" and pvc["spec"]["storageClassName"] == ""
    assert pv["spec"]["claimRef"]["name"] == "llm-checkpoints" and pv["spec"]["claimRef"]["namespace"] == "ml"


def test_dynamic_and_existing_claims() -> None:
    dynamic = by_kind_name(
        render.render(job(checkpoint={"storage": {"dynamic": {"storageClassName": "fsx-sc"}}}))
    )
    pvc = dynamic[("PersistentVolumeClaim", "llm-checkpoints")]
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "storageClassName": "fsx-sc",
        "resources": {"requests": {"storage": "1200Gi"}},
    }
    assert not any(kind == "PersistentVolume" for kind, _ in dynamic)
    existing = render.render(job(checkpoint={"storage": {"existingClaim": {"claimName": "shared-ckpt"}}}))
    assert not any(o["kind"] in ("PersistentVolume", "PersistentVolumeClaim") for o in existing)
    pod = next(o for o in existing if o["kind"] == "Pod")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[api.CHECKPOINT_VOLUME]["persistentVolumeClaim"] == {"claimName": "shared-ckpt"}


def test_headless_service_publishes_not_ready_workers() -> None:
    service = by_kind_name(render.render(job(rendezvous={"port": 29600})))[("Service", "llm")]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"] == [
        {"name": "rendezvous", "port": 29600, "targetPort": 29600, "protocol": "TCP"}
    ]
    assert service["spec"]["selector"] == {constants.LABEL_JOB: "llm", constants.LABEL_ROLE: "worker"}


def test_trainer_account_has_no_role_and_no_token() -> None:
    objects = render.render(job(hotSpares=1))
    assert [o["kind"] for o in objects if "Role" in o["kind"]] == []
    account = by_kind_name(objects)[("ServiceAccount", "llm-trainer")]
    assert account["automountServiceAccountToken"] is False
    for pod in (o for o in objects if o["kind"] == "Pod"):
        assert pod["spec"]["serviceAccountName"] == "llm-trainer"
        assert pod["spec"]["automountServiceAccountToken"] is False


def test_workers_serve_progress_on_the_named_port() -> None:
    pod = render.render_worker_pod(job(), 0)
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[names.PROGRESS_PORT_NAME] == progress_contract.PORT
    assert env_of(pod)[env_names.PROGRESS_PORT] == str(progress_contract.PORT)
    assert env_of(pod)[env_names.PROGRESS_SINK] == "endpoint"


def test_worker_pod_on_p5() -> None:
    pod = render.render_worker_pod(job(args=["--steps", "10"]), 1)
    spec = pod["spec"]
    assert pod["metadata"]["labels"][constants.LABEL_ROLE] == "worker"
    assert pod["metadata"]["labels"][constants.LABEL_WORKER_INDEX] == "1"
    assert (spec["hostname"], spec["subdomain"], spec["restartPolicy"]) == ("llm-worker-1", "llm", "Never")
    assert spec["serviceAccountName"] == "llm-trainer"
    (container,) = spec["containers"]
    assert container["command"] == ["rtj-launch"]
    assert container["args"] == ["--", "rtj-train", "--steps", "10"]
    resources = container["resources"]
    assert resources["limits"] == {
        "memory": "1800Gi",
        "nvidia.com/gpu": "8",
        "vpc.amazonaws.com/efa": "32",
        "hugepages-2Mi": "5120Mi",
    }
    assert resources["requests"] == {"cpu": "180", **resources["limits"]}
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    shm = next(v for v in spec["volumes"] if v["name"] == api.SHM_VOLUME)
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "128Gi"}
    assert {"name": api.SHM_VOLUME, "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert {"name": api.CHECKPOINT_VOLUME, "mountPath": "/checkpoints"} in container["volumeMounts"]
    assert spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {
            "key": "node.kubernetes.io/not-ready",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 10,
        },
        {
            "key": "node.kubernetes.io/unreachable",
            "operator": "Exists",
            "effect": "NoExecute",
            "tolerationSeconds": 10,
        },
    ]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5.48xlarge"]}
            ]
        }
    ]


def test_env_contract_on_workers_and_spares() -> None:
    the_job = job(hotSpares=1, checkpoint={"mountPath": "/fsx", "storage": {"dynamic": {}}})
    worker = env_of(render.render_worker_pod(the_job, 2))
    spare = env_of(render.render_spare_pod(the_job, 0))
    # Every name the trainer reads is rendered (RTJ_FAULTS is the user's, through spec.env), but for
    # the Supervisor launcher's (test_api_render_supervisor) and those of optional fields left unset
    # (test_api_own_script).
    expected = (
        set(env_names.CONTRACT_NAMES)
        - {env_names.FAULTS}
        - set(constants.ENV_SUPERVISOR_ONLY)
        - set(constants.ENV_WHEN_SET)
    )
    assert expected <= set(worker)
    assert not set(constants.ENV_SUPERVISOR_ONLY) & (set(worker) | set(spare))
    assert expected - {env_names.NODE_RANK} <= set(spare) and env_names.NODE_RANK not in spare
    assert worker["RTJ_NODE_RANK"] == "2" and worker["RTJ_ROLE"] == "worker" and spare["RTJ_ROLE"] == "spare"
    assert worker["RTJ_RDZV_HOST"] == "llm-worker-0.llm.ml.svc" and worker["RTJ_RDZV_PORT"] == "29500"
    assert worker["RTJ_NNODES"] == worker["RTJ_NNODES_MAX"] == "3"
    assert worker["RTJ_NPROC_PER_NODE"] == "8"
    assert worker["RTJ_CHECKPOINT_DIR"] == "/fsx/llm"
    assert worker["RTJ_JOB_UID"] == UID
    assert worker["RTJ_INPROCESS_ENABLED"] == "true"
    assert worker["RTJ_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert worker["RTJ_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert worker["RTJ_POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    zone = {"fieldRef": {"fieldPath": "metadata.labels['topology.kubernetes.io/zone']"}}
    assert worker["RTJ_NODE_ZONE"] == spare["RTJ_NODE_ZONE"] == zone
    assert worker["FI_PROVIDER"] == "efa" and worker["NCCL_SOCKET_IFNAME"] == "^docker,lo,veth"


def test_cpu_profile_has_no_devices_and_no_efa_env() -> None:
    pod = render.render_worker_pod(job(instanceType="cpu"), 0)
    env = env_of(pod)
    assert env["RTJ_NPROC_PER_NODE"] == "1"
    assert not {"FI_PROVIDER", "NCCL_SOCKET_IFNAME", "RDMAV_FORK_SAFE"} & set(env)
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources == {"requests": {"cpu": "250m", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}
    assert all(t["key"] != "nvidia.com/gpu" for t in pod["spec"]["tolerations"])


def test_user_env_comes_last_and_wins() -> None:
    the_job = job(
        env=[{"name": "RTJ_PROGRESS_SINK", "value": "file:/tmp/p"}, {"name": "RTJ_FAULTS", "value": "x"}]
    )
    env = render.render_worker_pod(the_job, 0)["spec"]["containers"][0]["env"]
    names = [e["name"] for e in env]
    assert names.count("RTJ_PROGRESS_SINK") == 1
    assert env[-2:] == [
        {"name": "RTJ_PROGRESS_SINK", "value": "file:/tmp/p"},
        {"name": "RTJ_FAULTS", "value": "x"},
    ]


def test_excluded_nodes_and_user_terms_combine() -> None:
    the_job = job(
        scheduling={
            "requiredNodeAffinityTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
            ],
            "nodeSelector": {"pool": "train"},
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
        }
    )
    pod = render.render_worker_pod(the_job, 0, excluded_nodes=["n-b", "n-a", "n-b"])
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    ours = [
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5.48xlarge"]},
        {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n-a", "n-b"]},
    ]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}, *ours]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}, *ours]},
    ]
    assert pod["spec"]["nodeSelector"] == {"pool": "train"}
    assert pod["spec"]["tolerations"][-1] == {"key": "dedicated", "operator": "Exists"}


def test_a_replacement_is_pinned_to_the_spares_node() -> None:
    pod = render.render_worker_pod(job(), 1, excluded_nodes=["bad-node"], node_name="spare-node")
    expressions = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchExpressions"]
    assert {"key": "kubernetes.io/hostname", "operator": "In", "values": ["spare-node"]} in expressions
    assert {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["bad-node"]} in expressions
    assert "nodeName" not in pod["spec"]  # the scheduler waits for the spare's resources to free


def test_pods_are_spread_one_per_node() -> None:
    pod = render.render_spare_pod(job(hotSpares=1), 0)
    (term,) = pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {
        "labelSelector": {"matchLabels": {constants.LABEL_JOB: "llm"}},
        "topologyKey": "kubernetes.io/hostname",
    }


def test_indexes_out_of_range_and_missing_uid_are_errors() -> None:
    with pytest.raises(ValueError, match="worker index 3"):
        render.render_worker_pod(job(), 3)
    with pytest.raises(ValueError, match="spare index 0"):
        render.render_spare_pod(job(), 0)
    no_uid = api.parse_job(
        {**job().model_dump(by_alias=True, exclude_none=True, mode="json"), "metadata": {"name": "x"}}
    )
    with pytest.raises(ValueError, match="no uid"):
        render.render(no_uid)
    assert render.render(no_uid, uid="u")[0]["metadata"]["namespace"] == "default"


def test_profiles_and_overrides() -> None:
    assert profiles.resolve_sizing("p5en.48xlarge").efa_adapters == 16
    assert profiles.resolve_sizing("p4d.24xlarge").efa_adapters == 4
    sizing = profiles.resolve_sizing(
        "p5.48xlarge", api.ResourceOverrides(gpus=4, memory="900Gi", hugepages2_mi="0", shm_size="8Gi")
    )
    assert (sizing.gpus, sizing.efa_adapters, sizing.memory, sizing.hugepages_2mi, sizing.shm_size) == (
        4, 32, "900Gi", None, "8Gi",
    )  # fmt: skip
    for zero in ("0", "0Mi", "0.0Gi"):
        assert (
            profiles.resolve_sizing("p5.48xlarge", api.ResourceOverrides(hugepages2_mi=zero)).hugepages_2mi
            is None
        )
    custom = job(instanceType="m7i.48xlarge", resources={"cpu": "180", "memory": "700Gi"})
    assert profiles.processes_per_node(custom.spec) == 1
    pod = render.render_worker_pod(custom, 0)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"memory": "700Gi"}
    assert profiles.processes_per_node(job(processesPerNode=4).spec) == 4


def test_the_renderer_sets_every_name_of_the_contract() -> None:
    assert len(env_names.CONTRACT_NAMES) == len(set(env_names.CONTRACT_NAMES))
    # Everything but the user's fault plan is rendered on a worker (the Supervisor launcher's names
    # under that launcher only, those of optional fields where they are set).
    optional = set(constants.ENV_WHEN_SET)
    rendered = {e["name"] for e in render.render_worker_pod(job(), 0)["spec"]["containers"][0]["env"]}
    assert set(env_names.CONTRACT_NAMES) - rendered == {
        env_names.FAULTS,
        *constants.ENV_SUPERVISOR_ONLY,
        *optional,
    }
    supervisor = job(faultTolerance={"launcher": "Supervisor"})
    rendered = {e["name"] for e in render.render_worker_pod(supervisor, 0)["spec"]["containers"][0]["env"]}
    assert set(env_names.CONTRACT_NAMES) - rendered == {env_names.FAULTS, *optional}
    # Each optional one where its field is set: an inline ft_launcher config, or one from a ConfigMap.
    for ft_launcher in ({"config": {"safety_factor": 4}}, {"configMap": {"name": "ft"}}):
        with_all = job(progress={"stepLogPattern": r"step (\d+)"}, faultTolerance={"ftLauncher": ft_launcher})
        rendered = {e["name"] for e in render.render_worker_pod(with_all, 0)["spec"]["containers"][0]["env"]}
        unset = env_names.FT_CONFIG_FILE if "config" in ft_launcher else env_names.FT_CONFIG
        assert set(env_names.CONTRACT_NAMES) - rendered == {
            env_names.FAULTS,
            *constants.ENV_SUPERVISOR_ONLY,
            unset,
        }


# Every embedded Kubernetes type at once, each source and option that the API accepts.
EVERY_EMBEDDED_TYPE: dict[str, Any] = {
    "env": [
        {"name": "PLAIN", "value": "1"},
        {"name": "my.var-1",
         "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.labels['app']"}}},
        {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}}},
        {"name": "CM", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "lr", "optional": True}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
    ],
    "volumes": [
        {"name": "scratch", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
        {"name": "cm",
         "configMap": {"name": "settings", "items": [{"key": "a", "path": "conf/a", "mode": 0o600}]}},
        {"name": "secret", "secret": {"secretName": "hf", "defaultMode": 0o400}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}},
        {"name": "host", "hostPath": {"path": "/var/log/train", "type": "DirectoryOrCreate"}},
        {"name": "nfs", "nfs": {"server": "10.0.0.5", "path": "/exports/data"}},
        {"name": "csi", "csi": {"driver": "fsx.csi.aws.com", "volumeAttributes": {"a": "b"}}},
    ],
    "volumeMounts": [
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "cm", "mountPath": "/etc/train", "readOnly": True, "recursiveReadOnly": "IfPossible"},
        {"name": "data", "mountPath": "/data", "subPath": "imagenet", "mountPropagation": "HostToContainer"},
        {"name": "host", "mountPath": "/logs", "subPathExpr": "$(POD_NAME)"},
    ],
    "scheduling": {
        "nodeSelector": {"topology.kubernetes.io/zone": "us-east-1a"},
        "tolerations": [
            {"operator": "Exists"},
            {"key": "example.com/maintenance", "operator": "Equal", "value": "soon", "effect": "NoExecute",
             "tolerationSeconds": 60},
        ],
        "requiredNodeAffinityTerms": [
            {"matchExpressions": [
                {"key": "example.com/generation", "operator": "Gt", "values": ["4"]},
                {"key": "example.com/reserved", "operator": "DoesNotExist"},
            ]}
        ],
        "priorityClassName": "training-high",
    },
    "podLabels": {"example.com/team": "ml"},
    "podAnnotations": {"example.com/Note": "any text"},
}  # fmt: skip


def test_every_embedded_type_renders_children_valid_for_kubernetes() -> None:
    objects = render.render(job(**EVERY_EMBEDDED_TYPE), uid=UID)
    for obj in objects:
        kubernetes_validate.validate(obj, "1.32", strict=True)
    pod = by_kind_name(objects)[("Pod", "llm-worker-0")]
    container = pod["spec"]["containers"][0]
    # Each entry is copied as given, and nothing the user did not write is added.
    for entry in EVERY_EMBEDDED_TYPE["env"]:
        assert entry in container["env"]
    for volume in EVERY_EMBEDDED_TYPE["volumes"]:
        assert volume in pod["spec"]["volumes"]
    for mount in EVERY_EMBEDDED_TYPE["volumeMounts"]:
        assert mount in container["volumeMounts"]
    for toleration in EVERY_EMBEDDED_TYPE["scheduling"]["tolerations"]:
        assert toleration in pod["spec"]["tolerations"]
