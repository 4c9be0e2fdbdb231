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
    """The bytes ``rtj render`` would print (libyaml's emitter: the pure-Python one took most of
    this module's time)."""
    return yaml.dump_all(objects, Dumper=yaml.CSafeDumper, sort_keys=False)


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
    pods = [o for o in yaml.load_all(first, Loader=yaml.CSafeLoader) if o["kind"] == "Pod"]
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


# Fragments of the embedded Kubernetes types, drawn from values on both sides of each rule: names and
# keys that are, or just are not, what Kubernetes accepts; quantities with signs and zeros; integers as
# floats and out of range; paths with backsteps; tolerations, requirements, env sources and volumes whose
# fields contradict each other now and then. (No unknown fields: the API server prunes those.)
LONG_PREFIX_KEY = "a" * 254 + "/k"
ENV_NAMES = ["A", "MY_VAR", "my.var-1", ".a", "1A", "A=B", "A\nB", "A\n", "..A", ".", "", "A B"]
LABEL_KEYS = [
    "k",
    "team",
    "example.com/k",
    "a/b",
    "A.com/k",
    "a" * 63,
    "a" * 64,
    LONG_PREFIX_KEY,
    "bad key",
    "-k",
]
LABEL_VALUES = ["", "v", "a.b", "a b", "a" * 63, "a" * 64, "-v", "10", "v\n"]
QUANTITIES = [
    "1",
    "0",
    "-1",
    "+1",
    "1.5",
    ".5",
    "0.0",
    "1Gi",
    "0Gi",
    "-1Gi",
    "1e3",
    "1E",
    "500m",
    "lots",
    "1 Gi",
]
INTS = [0, 1, 5, -1, 1.0, 2.5, 10**12, 2**31, True, "1"]
PATHS = ["/d", "/data/x", "d", "a/b", "/a/../b", "a/..", "..a", "../a", "", "/", "/d\n"]
NAMES = ["data", "cm", "My_Name", "a.b", "", "-a", "a" * 64]


def _maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(_MISSING), value)


def _fields(**strategies: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects whose fields are each present or missing."""
    keys = list(strategies)
    return st.tuples(*(_maybe(strategies[k]) for k in keys)).map(
        lambda values: {k: v for k, v in zip(keys, values, strict=True) if v is not _MISSING}
    )


TOLERATIONS = _fields(
    key=st.sampled_from(["", "k", "example.com/k", "bad key", LONG_PREFIX_KEY]),
    operator=st.sampled_from(["Exists", "Equal", "Gt"]),
    value=st.sampled_from(LABEL_VALUES),
    effect=st.sampled_from(["NoSchedule", "NoExecute", "Never"]),
    tolerationSeconds=st.sampled_from(INTS),
)
REQUIREMENTS = _fields(
    key=st.sampled_from(LABEL_KEYS),
    operator=st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Near"]),
    values=st.lists(st.sampled_from([*LABEL_VALUES, "12"]), max_size=2),
)
VALUE_SOURCES = st.one_of(
    _fields(
        fieldRef=_fields(
            apiVersion=st.sampled_from(["v1", "v2"]),
            fieldPath=st.sampled_from(
                [
                    "metadata.name",
                    "status.podIP",
                    "spec.hostname",
                    "metadata.labels['app']",
                    "metadata.labels['a b']",
                ]
            ),
        )
    ),
    _fields(
        resourceFieldRef=_fields(
            resource=st.sampled_from(["limits.cpu", "requests.memory", "limits.hugepages-2Mi", "limits.gpu"]),
            divisor=st.sampled_from(["1", "1m", "1Mi", "-1", "2"]),
            containerName=st.sampled_from(["trainer", "Trainer"]),
        )
    ),
    _fields(
        configMapKeyRef=_fields(name=st.sampled_from(NAMES), key=st.sampled_from(["k", "a/b", "..k", ".k"]))
    ),
    _fields(
        secretKeyRef=_fields(
            name=st.sampled_from(NAMES),
            key=st.sampled_from(["k", "a/b"]),
            optional=st.sampled_from([True, "yes"]),
        )
    ),
)
ENV = _fields(name=st.sampled_from(ENV_NAMES), value=st.sampled_from(["1", ""]), valueFrom=VALUE_SOURCES)
ITEMS = st.lists(
    _fields(
        key=st.sampled_from(["k", "a/b"]),
        path=st.sampled_from(PATHS),
        mode=st.sampled_from([0o644, 0o1000, -1, 1.0]),
    ),
    max_size=2,
)
VOLUME_SOURCES = _fields(
    emptyDir=_fields(
        medium=st.sampled_from(["Memory", "Tape", "HugePages-2Mi"]), sizeLimit=st.sampled_from(QUANTITIES)
    ),
    configMap=_fields(name=st.sampled_from(NAMES), items=ITEMS, defaultMode=st.sampled_from(INTS)),
    secret=_fields(secretName=st.sampled_from(NAMES), items=ITEMS),
    persistentVolumeClaim=_fields(claimName=st.sampled_from(NAMES), readOnly=st.booleans()),
    hostPath=_fields(path=st.sampled_from(PATHS), type=st.sampled_from(["Directory", "Dir"])),
    nfs=_fields(server=st.sampled_from(["nfs.example", "10.0.0.1", "a b"]), path=st.sampled_from(PATHS)),
    csi=_fields(
        driver=st.sampled_from(["fsx.csi.aws.com", "my_driver"]),
        volumeAttributes=st.dictionaries(
            st.sampled_from(["a", "b"]), st.sampled_from(["1", "x"]), max_size=2
        ),
    ),
)
VOLUMES = st.lists(
    st.builds(
        lambda name, source: {"name": name, **source},
        st.sampled_from(["data", "logs", "Data"]),
        VOLUME_SOURCES,
    ),
    max_size=2,
)
MOUNTS = st.lists(
    st.builds(
        lambda name, rest: {"name": name, **rest},
        st.sampled_from(["data", "logs"]),
        _fields(
            mountPath=st.sampled_from(PATHS),
            readOnly=st.sampled_from([True, False, 1]),
            subPath=st.sampled_from(PATHS),
            subPathExpr=st.sampled_from(["$(POD_NAME)", "../x"]),
            mountPropagation=st.sampled_from(["None", "HostToContainer", "Bidirectional"]),
            recursiveReadOnly=st.sampled_from(["Disabled", "IfPossible", "Enabled"]),
        ),
    ),
    max_size=2,
)
LABELS = st.dictionaries(st.sampled_from(LABEL_KEYS), st.sampled_from(LABEL_VALUES), max_size=2)
EMBEDDED: dict[str, st.SearchStrategy[Any]] = {
    "spec.image": st.sampled_from(["trainer:1", " ", "trainer :1", "trainer:1\n", "", "ré:1"]),
    "spec.nodes": st.sampled_from([*INTS, 2.0, 1024, 1025]),
    "spec.checkpoint.intervalSteps": st.sampled_from(INTS),
    "spec.ttlSecondsAfterFinished": st.sampled_from(INTS),
    "spec.resources.cpu": st.sampled_from(QUANTITIES),
    "spec.resources.memory": st.sampled_from(QUANTITIES),
    "spec.resources.hugepages2Mi": st.sampled_from([*QUANTITIES, "2Mi", "3Mi", "5120Mi", "1Gi", "1.5Gi"]),
    "spec.checkpoint.storage": st.one_of(
        _fields(
            dynamic=_fields(
                storageClassName=st.sampled_from(["", "fsx-sc", "Fast_SSD", "a.b"]),
                capacity=st.sampled_from(QUANTITIES),
            )
        ),
        _fields(existingClaim=_fields(claimName=st.sampled_from(NAMES))),
    ),
    "spec.scheduling.priorityClassName": st.sampled_from(["", "high", "High Priority", "a.b"]),
    "spec.scheduling.nodeSelector": LABELS,
    "spec.scheduling.tolerations": st.lists(TOLERATIONS, max_size=2),
    "spec.scheduling.requiredNodeAffinityTerms": st.lists(
        st.builds(lambda exprs: {"matchExpressions": exprs}, st.lists(REQUIREMENTS, max_size=2)), max_size=2
    ),
    "spec.env": st.lists(ENV, max_size=2),
    "spec.volumes": VOLUMES,
    "spec.volumeMounts": MOUNTS,
    "spec.podLabels": LABELS,
    "spec.podAnnotations": st.dictionaries(
        st.sampled_from(LABEL_KEYS), st.sampled_from(["x", ""]), max_size=2
    ),
}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=jobs(),
    donor=jobs(),
    leaves=st.lists(st.sampled_from(LEAVES), min_size=1, max_size=4, unique=True),
    garbage=st.one_of(st.none(), st.tuples(st.sampled_from(LEAVES), ANY_VALUE)),
    embedded=st.lists(
        st.sampled_from(sorted(EMBEDDED)).flatmap(lambda path: st.tuples(st.just(path), EMBEDDED[path])),
        max_size=3,
    ),
)
def test_parse_job_and_the_crd_agree_on_what_is_valid(
    body: dict[str, Any],
    donor: dict[str, Any],
    leaves: list[str],
    garbage: tuple[str, Any] | None,
    embedded: list[tuple[str, Any]],
) -> None:
    """parse_job (`rtj render`, the operator) accepts exactly the specs the API server's schema and CEL do."""
    # Values from another valid job are plausible one by one and break cross-field rules now and then;
    # an occasional arbitrary value breaks types and bounds; the embedded Kubernetes types get values from
    # both sides of each of their rules.
    for path in leaves:
        _put(body, path, _get(donor, path))
    if garbage is not None:
        _put(body, *garbage)
    for path, value in embedded:
        _put(body, path, value)
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
