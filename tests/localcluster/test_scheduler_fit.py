"""The scheduler's fit rules, one table row per rule (pure: no cluster)."""

from __future__ import annotations

from typing import Any

import pytest
from rtj_localcluster.nodes import PROFILES, node_object, node_status
from rtj_localcluster.scheduler import (
    choose_node,
    default_tolerations,
    inter_pod_affinity_failures,
    node_fit_failures,
    pod_requests,
    toleration_matches,
)


def make_node(
    name: str = "node-0",
    *,
    ready: bool = True,
    taints: list[dict[str, Any]] | None = None,
    unschedulable: bool = False,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    node = node_object(name, PROFILES["p5.48xlarge"], labels=labels, taints=taints or [])
    node["status"] = node_status(PROFILES["p5.48xlarge"], host_ip="127.0.0.1")
    if not ready:
        for condition in node["status"]["conditions"]:
            if condition["type"] == "Ready":
                condition["status"] = "False"
    if unschedulable:
        node["spec"]["unschedulable"] = True
    return node


def make_pod(uid: str = "p", requests: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "x", "command": ["true"]}
    if requests:
        container["resources"] = {"requests": requests}
    return {
        "metadata": {"name": uid, "namespace": "default", "uid": uid},
        "spec": {"containers": [container], **spec},
    }


def affinity(*expressions: dict[str, Any], fields: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    term: dict[str, Any] = {}
    if expressions:
        term["matchExpressions"] = list(expressions)
    if fields:
        term["matchFields"] = fields
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

CASES: list[tuple[str, dict[str, Any], dict[str, Any], str | None]] = [
    # (case, pod spec, node kwargs, expected failure substring or None for a fit)
    ("plain pod fits a ready node", {}, {}, None),
    ("not ready node", {}, {"ready": False}, "not ready"),
    ("unschedulable node", {}, {"unschedulable": True}, "unschedulable"),
    (
        "unschedulable node tolerated",
        {"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]},
        {"unschedulable": True},
        None,
    ),
    ("NoSchedule taint untolerated", {}, {"taints": [GPU_TAINT]}, "untolerated taint"),
    (
        "NoSchedule taint tolerated by Exists",
        {"tolerations": [GPU_TOLERATION]},
        {"taints": [GPU_TAINT]},
        None,
    ),
    (
        "NoSchedule taint tolerated by Equal",
        {"tolerations": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        {"taints": [GPU_TAINT]},
        None,
    ),
    (
        "Equal toleration with another value",
        {"tolerations": [{"key": "nvidia.com/gpu", "value": "absent", "effect": "NoSchedule"}]},
        {"taints": [GPU_TAINT]},
        "untolerated taint",
    ),
    (
        "NoExecute taint untolerated",
        {},
        {"taints": [{"key": "dedicated", "value": "x", "effect": "NoExecute"}]},
        "untolerated taint",
    ),
    (
        "PreferNoSchedule taint is only a preference",
        {},
        {"taints": [{"key": "a", "effect": "PreferNoSchedule"}]},
        None,
    ),
    ("wildcard toleration", {"tolerations": [{"operator": "Exists"}]}, {"taints": [GPU_TAINT]}, None),
    ("nodeSelector matches", {"nodeSelector": {"node.kubernetes.io/instance-type": "p5.48xlarge"}}, {}, None),
    (
        "nodeSelector differs",
        {"nodeSelector": {"node.kubernetes.io/instance-type": "p4d.24xlarge"}},
        {},
        "affinity",
    ),
    ("nodeSelector label missing", {"nodeSelector": {"pool": "a"}}, {}, "affinity"),
    (
        "affinity In",
        {
            "affinity": affinity(
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5.48xlarge"]}
            )
        },
        {},
        None,
    ),
    (
        "affinity In without the value",
        {
            "affinity": affinity(
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["x"]}
            )
        },
        {},
        "affinity",
    ),
    (
        "affinity NotIn excludes",
        {"affinity": affinity({"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-0"]})},
        {},
        "affinity",
    ),
    (
        "affinity NotIn other",
        {"affinity": affinity({"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-9"]})},
        {},
        None,
    ),
    ("affinity Exists", {"affinity": affinity({"key": "kubernetes.io/os", "operator": "Exists"})}, {}, None),
    (
        "affinity Exists missing",
        {"affinity": affinity({"key": "pool", "operator": "Exists"})},
        {},
        "affinity",
    ),
    ("affinity DoesNotExist", {"affinity": affinity({"key": "pool", "operator": "DoesNotExist"})}, {}, None),
    (
        "affinity DoesNotExist present",
        {"affinity": affinity({"key": "kubernetes.io/os", "operator": "DoesNotExist"})},
        {},
        "affinity",
    ),
    (
        "affinity Gt",
        {"affinity": affinity({"key": "rank", "operator": "Gt", "values": ["3"]})},
        {"labels": {"rank": "5"}},
        None,
    ),
    (
        "affinity Gt not greater",
        {"affinity": affinity({"key": "rank", "operator": "Gt", "values": ["5"]})},
        {"labels": {"rank": "5"}},
        "affinity",
    ),
    (
        "affinity Lt",
        {"affinity": affinity({"key": "rank", "operator": "Lt", "values": ["9"]})},
        {"labels": {"rank": "5"}},
        None,
    ),
    (
        "affinity Lt non-integer label",
        {"affinity": affinity({"key": "rank", "operator": "Lt", "values": ["9"]})},
        {"labels": {"rank": "five"}},
        "affinity",
    ),
    (
        "matchFields metadata.name",
        {"affinity": affinity(fields=[{"key": "metadata.name", "operator": "In", "values": ["node-0"]}])},
        {},
        None,
    ),
    (
        "matchFields other name",
        {"affinity": affinity(fields=[{"key": "metadata.name", "operator": "In", "values": ["node-1"]}])},
        {},
        "affinity",
    ),
    (
        "requests fit",
        {"_requests": {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32", "cpu": "180"}},
        {},
        None,
    ),
    ("too many GPUs", {"_requests": {"nvidia.com/gpu": "9"}}, {}, "Insufficient nvidia.com/gpu"),
    (
        "too many EFA",
        {"_requests": {"vpc.amazonaws.com/efa": "33"}},
        {},
        "Insufficient vpc.amazonaws.com/efa",
    ),
    ("too much cpu", {"_requests": {"cpu": "192500m"}}, {}, "Insufficient cpu"),
    ("too much memory", {"_requests": {"memory": "3Ti"}}, {}, "Insufficient memory"),
    ("too many hugepages", {"_requests": {"hugepages-2Mi": "11Gi"}}, {}, "Insufficient hugepages-2Mi"),
    (
        "unknown extended resource",
        {"_requests": {"example.com/fpga": "1"}},
        {},
        "Insufficient example.com/fpga",
    ),
]


@pytest.mark.parametrize(("case", "spec", "node_kwargs", "expected"), CASES, ids=[c[0] for c in CASES])
def test_fit_rule(case: str, spec: dict[str, Any], node_kwargs: dict[str, Any], expected: str | None) -> None:
    spec = dict(spec)
    pod = make_pod(requests=spec.pop("_requests", None), **spec)
    failures = node_fit_failures(pod, make_node(**node_kwargs), [])
    if expected is None:
        assert failures == []
    else:
        assert any(expected in failure for failure in failures), failures


def test_requests_of_pods_already_on_the_node_count_unless_terminated() -> None:
    node = make_node()
    running = make_pod("a", {"nvidia.com/gpu": "6"})
    running["status"] = {"phase": "Running"}
    finished = make_pod("b", {"nvidia.com/gpu": "8"})
    finished["status"] = {"phase": "Succeeded"}
    pod = make_pod("c", {"nvidia.com/gpu": "2"})
    assert node_fit_failures(pod, node, [running, finished]) == []
    bigger = make_pod("d", {"nvidia.com/gpu": "3"})
    assert node_fit_failures(bigger, node, [running, finished]) == ["Insufficient nvidia.com/gpu"]


def test_effective_requests_take_limits_and_init_containers() -> None:
    pod = make_pod()
    pod["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "8"},
        "requests": {"cpu": "500m"},
    }
    pod["spec"]["containers"].append({"name": "b", "resources": {"requests": {"cpu": "1500m"}}})
    pod["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "4", "memory": "1Gi"}}}]
    requests = pod_requests(pod)
    assert requests["nvidia.com/gpu"] == 8
    assert requests["cpu"] == 4  # the init container's 4 > 0.5 + 1.5
    assert requests["memory"] == 2**30


def test_choose_node_spreads_and_explains_failures() -> None:
    nodes = [make_node("node-0"), make_node("node-1")]
    busy = make_pod("x")
    busy["spec"]["nodeName"] = "node-0"
    assert choose_node(make_pod("y"), nodes, {"node-0": [busy]}) == ("node-1", "")
    name, message = choose_node(make_pod("z", {"nvidia.com/gpu": "16"}), nodes, {})
    assert name is None
    assert message == "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."


def test_default_tolerations_added_once() -> None:
    pod = make_pod()
    tolerations = default_tolerations(pod)
    assert tolerations is not None
    assert {(t["key"], t["tolerationSeconds"]) for t in tolerations} == {
        ("node.kubernetes.io/not-ready", 300),
        ("node.kubernetes.io/unreachable", 300),
    }
    pod["spec"]["tolerations"] = tolerations
    assert default_tolerations(pod) is None
    own = make_pod(
        tolerations=[{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}]
    )
    added = default_tolerations(own, seconds=30)
    assert added is not None
    assert [t["key"] for t in added] == ["node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"]


def test_toleration_effect_must_match_when_given() -> None:
    taint = {"key": "k", "value": "v", "effect": "NoExecute"}
    assert not toleration_matches({"key": "k", "operator": "Exists", "effect": "NoSchedule"}, taint)
    assert toleration_matches({"key": "k", "operator": "Exists"}, taint)


def placed(
    uid: str, node: str, labels: dict[str, str], namespace: str = "default", **spec: Any
) -> dict[str, Any]:
    pod = make_pod(uid, **spec)
    pod["metadata"]["labels"] = labels
    pod["metadata"]["namespace"] = namespace
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    return pod


def anti(selector: dict[str, Any], key: str = "kubernetes.io/hostname", **extra: Any) -> dict[str, Any]:
    term = {"labelSelector": selector, "topologyKey": key, **extra}
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


def together(selector: dict[str, Any], key: str = "kubernetes.io/hostname") -> dict[str, Any]:
    term = {"labelSelector": selector, "topologyKey": key}
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}


JOB = {"matchLabels": {"job": "j"}}
ZONE = "topology.kubernetes.io/zone"

INTER_POD_CASES: list[tuple[str, dict[str, Any], list[dict[str, Any]], str | None]] = [
    # (case, incoming pod's affinity, pods placed on node-0 (the candidate) or node-1, expected)
    ("anti-affinity: no peer anywhere", anti(JOB), [], None),
    ("anti-affinity: peer on the node", anti(JOB), [placed("a", "node-0", {"job": "j"})], "anti-affinity"),
    ("anti-affinity: peer on another node", anti(JOB), [placed("a", "node-1", {"job": "j"})], None),
    (
        "anti-affinity by zone: peer on another node of the zone",
        anti(JOB, ZONE),
        [placed("a", "node-1", {"job": "j"})],
        "anti-affinity",
    ),
    ("anti-affinity: other labels", anti(JOB), [placed("a", "node-0", {"job": "k"})], None),
    ("anti-affinity: other namespace", anti(JOB), [placed("a", "node-0", {"job": "j"}, namespace="x")], None),
    (
        "anti-affinity: listed namespace",
        anti(JOB, namespaces=["x"]),
        [placed("a", "node-0", {"job": "j"}, namespace="x")],
        "anti-affinity",
    ),
    (
        "anti-affinity with matchExpressions",
        anti({"matchExpressions": [{"key": "job", "operator": "In", "values": ["j", "k"]}]}),
        [placed("a", "node-0", {"job": "k"})],
        "anti-affinity",
    ),
    (
        "existing pod's anti-affinity repels the incoming pod",
        {},
        [placed("a", "node-0", {"x": "y"}, affinity=anti({"matchLabels": {"job": "j"}}))],
        "existing pods anti-affinity",
    ),
    ("affinity: peer on the node", together(JOB), [placed("a", "node-0", {"job": "j"})], None),
    ("affinity: peer elsewhere only", together(JOB), [placed("a", "node-1", {"job": "j"})], "pod affinity"),
    ("affinity: first of a self-selecting group", together({"matchLabels": {"job": "j"}}), [], None),
    (
        "affinity: nothing matches and not self-selecting",
        together({"matchLabels": {"app": "db"}}),
        [],
        "pod affinity",
    ),
]


@pytest.mark.parametrize(
    ("case", "pod_affinity", "pods", "expected"), INTER_POD_CASES, ids=[c[0] for c in INTER_POD_CASES]
)
def test_inter_pod_affinity_rule(
    case: str, pod_affinity: dict[str, Any], pods: list[dict[str, Any]], expected: str | None
) -> None:
    nodes = {"node-0": make_node("node-0"), "node-1": make_node("node-1")}  # same zone: local-1a
    pod = make_pod("incoming", affinity=pod_affinity) if pod_affinity else make_pod("incoming")
    pod["metadata"]["labels"] = {"job": "j"}
    failures = inter_pod_affinity_failures(pod, nodes["node-0"], nodes, pods)
    if expected is None:
        assert failures == []
    else:
        assert any(expected in failure for failure in failures), failures


def test_choose_node_spreads_workers_of_a_job_by_anti_affinity() -> None:
    nodes = [make_node("node-0"), make_node("node-1")]
    first = placed("w0", "node-1", {"job": "j"}, affinity=anti(JOB))
    incoming = make_pod("w1", affinity=anti(JOB))
    incoming["metadata"]["labels"] = {"job": "j"}
    assert choose_node(incoming, nodes, {"node-1": [first]}) == ("node-0", "")
    third = placed("w2", "node-0", {"job": "j"}, affinity=anti(JOB))
    name, message = choose_node(incoming, nodes, {"node-1": [first], "node-0": [third]})
    assert name is None
    assert "anti-affinity" in message
