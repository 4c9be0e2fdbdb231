"""Property tests over generated valid jobs: rendering is deterministic and idempotent, and the CRD agrees."""

from __future__ import annotations

import random
from typing import Any

import yaml
from crd_tools import crd_errors, openapi_schema
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rtj_operator import api, render
from rtj_operator.validation import apply_defaults

NAME = st.from_regex(r"[a-z][a-z0-9-]{0,20}[a-z0-9]", fullmatch=True)
WORD = st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True)
VALUE = st.text(alphabet="abcXYZ019 -_./:=", max_size=12)


@st.composite
def fault_tolerance(draw: st.DrawFn) -> dict[str, Any]:
    heartbeat = draw(st.integers(3, 900))
    soft = draw(st.integers(1, heartbeat - 2))
    hard = draw(st.integers(soft + 1, heartbeat - 1))
    return {
        "heartbeatTimeoutSeconds": heartbeat,
        "initialHeartbeatTimeoutSeconds": heartbeat + draw(st.integers(0, 900)),
        "monitorIntervalSeconds": draw(st.integers(1, heartbeat - 1)),
        "maxInJobRestarts": draw(st.integers(0, 50)),
        "inProcess": {
            "enabled": draw(st.booleans()),
            "softTimeoutSeconds": soft,
            "hardTimeoutSeconds": hard,
            "maxIterations": draw(st.integers(1, 20)),
        },
    }


STORAGE = st.one_of(
    st.builds(lambda c: {"dynamic": {"storageClassName": c, "capacity": "100Gi"}}, WORD),
    st.builds(lambda c: {"existingClaim": {"claimName": c}}, NAME),
    st.builds(
        lambda fs, m: {"fsxStatic": {"fileSystemId": fs, "dnsName": f"{fs}.fsx.aws", "mountName": m}},
        st.from_regex(r"fs-[0-9a-f]{17}", fullmatch=True),
        WORD,
    ),
)


@st.composite
def jobs(draw: st.DrawFn) -> dict[str, Any]:
    instance_type = draw(st.sampled_from([*api.KNOWN_INSTANCE_TYPES, "m7i.48xlarge"]))
    spec: dict[str, Any] = {
        "image": draw(st.sampled_from(["trainer:1", "registry.example/t@sha256:" + "a" * 64])),
        "nodes": draw(st.integers(1, 6)),
        "hotSpares": draw(st.integers(0, 3)),
        "instanceType": instance_type,
        "args": draw(st.lists(VALUE, max_size=4)),
        "checkpoint": {
            "storage": draw(STORAGE),
            "retentionPolicy": draw(st.sampled_from(["Retain", "Delete"])),
            "mode": draw(st.sampled_from(["Async", "Sync"])),
            "intervalSteps": draw(st.integers(1, 1000)),
        },
        "faultTolerance": draw(fault_tolerance()),
        "failurePolicy": {"nodeLossGraceSeconds": draw(st.integers(0, 120))},
        "rendezvous": {"port": draw(st.integers(1024, 65535))},
        "env": [
            {"name": n, "value": v}
            for n, v in draw(st.dictionaries(WORD.map(str.upper), VALUE, max_size=3)).items()
        ],
        "podLabels": draw(st.dictionaries(WORD, WORD, max_size=2)),
        "scheduling": {
            "nodeSelector": draw(st.dictionaries(WORD, WORD, max_size=2)),
            "tolerations": draw(
                st.lists(st.builds(lambda k: {"key": k, "operator": "Exists"}, WORD), max_size=2)
            ),
        },
    }
    if instance_type not in api.KNOWN_INSTANCE_TYPES:
        spec["resources"] = {"cpu": "90", "memory": "700Gi"}
    if draw(st.booleans()):
        spec["processesPerNode"] = draw(st.integers(1, 8))
    return {
        "apiVersion": "resilient.training/v1alpha1",
        "kind": "ResilientTrainingJob",
        "metadata": {"name": draw(NAME), "namespace": draw(WORD), "uid": "uid-1"},
        "spec": spec,
    }


def as_yaml(objects: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=jobs(), excluded=st.lists(WORD, max_size=4))
def test_rendering_is_deterministic_and_idempotent(body: dict[str, Any], excluded: list[str]) -> None:
    job = api.parse_job(body)
    first = as_yaml(render.render(job, excluded_nodes=excluded))
    # Same input, same bytes; order and repetition of excluded nodes do not matter.
    shuffled = [*excluded, *excluded]
    random.Random(0).shuffle(shuffled)
    assert as_yaml(render.render(api.parse_job(body), excluded_nodes=shuffled)) == first
    # Parsing what the model dumps gives the same job (defaults filled in are stable).
    dumped = job.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert api.parse_job(dumped) == job
    assert as_yaml(render.render(api.parse_job(dumped), excluded_nodes=excluded)) == first
    # Rendering did not mutate the job.
    assert job.model_dump(by_alias=True, exclude_none=True, mode="json") == dumped
    pods = [o for o in yaml.safe_load_all(first) if o["kind"] == "Pod"]
    assert len(pods) == job.spec.nodes + job.spec.hot_spares
    assert len({p["metadata"]["name"] for p in pods}) == len(pods)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=jobs())
def test_the_crd_accepts_every_job_parse_job_accepts(body: dict[str, Any]) -> None:
    api.parse_job(body)
    assert crd_errors(body) == []
    # And the API server's defaulting and pydantic's defaults agree.

    defaulted = apply_defaults(openapi_schema(), body)
    assert api.parse_job(defaulted) == api.parse_job(body)


# Hypothesis favours the first entries: the cross-field timeouts come first, the name last.
LEAVES = [
    "spec.faultTolerance.heartbeatTimeoutSeconds",
    "spec.faultTolerance.inProcess.hardTimeoutSeconds",
    "spec.image",
    "spec.imagePullPolicy",
    "spec.nodes",
    "spec.hotSpares",
    "spec.processesPerNode",
    "spec.instanceType",
    "spec.suspend",
    "spec.resources.cpu",
    "spec.resources.gpus",
    "spec.rendezvous.port",
    "spec.checkpoint.intervalSteps",
    "spec.checkpoint.keep",
    "spec.checkpoint.mode",
    "spec.checkpoint.mountPath",
    "spec.checkpoint.retentionPolicy",
    "spec.checkpoint.storage.dynamic.capacity",
    "spec.faultTolerance.initialHeartbeatTimeoutSeconds",
    "spec.faultTolerance.monitorIntervalSeconds",
    "spec.faultTolerance.inProcess.enabled",
    "spec.faultTolerance.inProcess.softTimeoutSeconds",
    "spec.failurePolicy.nodeLossGraceSeconds",
    "spec.failurePolicy.repeatOffenderThreshold",
    "metadata.name",
]
SAMPLE_STRINGS = ("", "a", "Async", "Sync", "Delete", "IfNotPresent", "cpu", "p5.48xlarge", "m7i.large")
SAMPLE_STRINGS += ("/ckpt", "ckpt", "1Gi", "500m", "lots", "x" * 60, "job-1", "Job_1", "0")
# Mostly plausible values, so that both outcomes are common.
ANY_VALUE = st.one_of(
    st.integers(1, 600),
    st.integers(1, 600),
    st.integers(-10, 70000),
    st.booleans(),
    st.sampled_from(SAMPLE_STRINGS),
)


def _get(obj: dict[str, Any], path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj


def _put(obj: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        obj = obj.setdefault(part, {})
    if value is _MISSING:
        obj.pop(last, None)
    else:
        obj[last] = value


_MISSING = object()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=jobs(),
    donor=jobs(),
    leaves=st.lists(st.sampled_from(LEAVES), min_size=1, max_size=4, unique=True),
    garbage=st.one_of(st.none(), st.tuples(st.sampled_from(LEAVES), ANY_VALUE)),
)
def test_parse_job_and_the_crd_agree_on_what_is_valid(
    body: dict[str, Any], donor: dict[str, Any], leaves: list[str], garbage: tuple[str, Any] | None
) -> None:
    # Values from another valid job are plausible one by one and break cross-field rules now and then;
    # an occasional arbitrary value breaks types and bounds.
    for path in leaves:
        _put(body, path, _get(donor, path))
    if garbage is not None:
        _put(body, *garbage)
    crd = crd_errors(body)
    event("rejected" if crd else "accepted")
    try:
        api.parse_job(body)
    except api.JobValidationError as error:
        assert crd, f"only parse_job rejects: {error}"
        # Both name at least one common field.
        assert set(error.paths) & {path for path, _ in crd}, (error.problems, crd)
    else:
        assert not crd, f"only the CRD rejects: {crd}"
