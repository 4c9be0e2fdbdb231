"""The CRD on a cluster (the embedded local one, or RTJ_TEST_KUBECONFIG's), through the real kubectl.

The cluster stores a job with exactly the defaults the schema declares (what parse_job fills in), prints
the promised columns, answers to the short name and the category, and rejects an invalid job with a
message naming the field: every case of the invalid-spec table that the CRD refuses is refused at apply,
naming the same field as parse_job.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from crd_tools import CRD_FILE, REPO, load_example, openapi_schema
from rtj_localcluster.binaries import program
from rtj_localcluster.testing import kubectl, wait_for
from rtj_operator import api
from rtj_operator.validation import apply_defaults
from test_api_invalid_specs import CASES, _job_with

pytestmark = pytest.mark.slow


def _write(tmp_path: Path, name: str, obj: dict) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(obj), encoding="utf-8")
    return str(path)


@pytest.fixture
def namespace(kubeconfig: Path, tmp_path: Path):
    kubectl(kubeconfig, "apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    # Polled: `kubectl wait` fails at once while a new CRD has no conditions yet.
    established = '{.status.conditions[?(@.type=="Established")].status}'
    wait_for(
        lambda: kubectl(kubeconfig, "get", "crd/resilienttrainingjobs.resilient.training", "-o",
                        f"jsonpath={established}", check=False) == "True",
        timeout=120, message="the CRD to be established",
    )  # fmt: skip
    name = f"rtj-api-{uuid.uuid4().hex[:8]}"
    # `apply` of a manifest rather than `kubectl create namespace` (which sends protobuf).
    ns_manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    kubectl(kubeconfig, "apply", "-f", _write(tmp_path, "namespace.yaml", ns_manifest))
    try:
        yield name
    finally:
        kubectl(kubeconfig, "delete", "namespace", name, "--wait=false", check=False)


def test_a_job_is_stored_with_the_schemas_defaults(kubeconfig: Path, tmp_path: Path, namespace: str) -> None:
    job = load_example(REPO / "examples" / "local-cpu.yaml")
    job["metadata"] = {"name": "defaults", "namespace": namespace}
    job["spec"]["suspend"] = True  # an operator watching this cluster must not start training
    kubectl(kubeconfig, "apply", "-f", _write(tmp_path, "job.yaml", job))
    stored = json.loads(kubectl(kubeconfig, "get", "rtj", "defaults", "-n", namespace, "-o", "json"))
    assert stored["spec"] == apply_defaults(openapi_schema(), job)["spec"]
    assert api.parse_job(stored).spec == api.parse_job(job).spec
    table = kubectl(kubeconfig, "get", "resilient-training", "-n", namespace)
    header = table.splitlines()[0].split()
    assert header == [
        "NAME",
        "STATE",
        "NODES",
        "RESTARTS",
        "STEP",
        "CHECKPOINT",
        "CHECKPOINTED",
        "GOODPUT",
        "AGE",
    ]
    assert table.splitlines()[1].startswith("defaults ")


def test_ft_launchers_own_settings_are_stored_as_written(
    kubeconfig: Path, tmp_path: Path, namespace: str
) -> None:
    # The one map the API server keeps without a schema (x-kubernetes-preserve-unknown-fields): nothing
    # of it is pruned, and the rules around it compile on a real API server.
    job = load_example(REPO / "examples" / "byo-nvrx.yaml")
    job["metadata"] = {"name": "byo", "namespace": namespace}
    job["spec"]["suspend"] = True
    kubectl(kubeconfig, "apply", "-f", _write(tmp_path, "job.yaml", job))
    stored = json.loads(kubectl(kubeconfig, "get", "rtj", "byo", "-n", namespace, "-o", "json"))
    assert stored["spec"] == apply_defaults(openapi_schema(), job)["spec"]
    assert stored["spec"]["faultTolerance"]["ftLauncher"]["config"]["rank_section_timeouts"]["step"] == 120
    assert api.parse_job(stored).spec == api.parse_job(job).spec


def test_an_invalid_job_is_rejected_naming_the_field(
    kubeconfig: Path, tmp_path: Path, namespace: str
) -> None:
    job = load_example(REPO / "examples" / "local-cpu.yaml")
    job["metadata"] = {"name": "invalid", "namespace": namespace}
    job["spec"]["nodes"] = 0
    job["spec"]["checkpoint"]["mode"] = "Lazy"
    result = subprocess.run(
        [
            str(program("kubectl")),
            f"--kubeconfig={kubeconfig}",
            "apply",
            "-f",
            _write(tmp_path, "bad.yaml", job),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0, result.stdout
    assert "spec.nodes" in result.stderr and "spec.checkpoint.mode" in result.stderr, result.stderr
    missing = kubectl(kubeconfig, "get", "rtj", "invalid", "-n", namespace, "--ignore-not-found")
    assert missing == ""


def test_every_invalid_spec_of_the_table_is_refused_at_apply_naming_the_field(
    kubeconfig: Path, tmp_path: Path, namespace: str
) -> None:
    cases = [case for case in CASES if case[3] and not any(p.startswith("metadata.") for p in case[1])]
    jobs = []
    for index, (_, changes, _, _) in enumerate(cases):
        job = _job_with(changes)
        job["metadata"] = {"name": f"bad-{index}", "namespace": namespace}
        if "spec.suspend" not in changes:
            job["spec"]["suspend"] = True  # should one be accepted, an operator must not start it
        jobs.append(job)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump_all(jobs), encoding="utf-8")
    # One apply of every case: kubectl goes on after a refusal and reports each object's own errors.
    result = subprocess.run(
        [str(program("kubectl")), f"--kubeconfig={kubeconfig}", "apply", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode != 0
    refusals: dict[str, str] = {}
    for match in re.finditer(
        r'"(bad-\d+)" is invalid: (.*?)(?=\n\S.*"bad-\d+" is invalid:|\Z)', result.stderr, re.S
    ):
        refusals[match.group(1)] = match.group(2)
    missed = []
    for index, (case_id, _, field, _) in enumerate(cases):
        with pytest.raises(api.JobValidationError) as raised:
            api.parse_job(jobs[index])
        assert field in raised.value.paths, (case_id, raised.value.problems)
        refusal = refusals.get(f"bad-{index}", "")
        if f"{field}:" not in refusal:
            missed.append(f"{case_id}: wanted {field}, got {refusal or 'accepted'!r}")
    assert not missed, "\n".join(missed)
    stored = kubectl(kubeconfig, "get", "rtj", "-n", namespace, "-o", "name")
    assert stored.split() == [], stored
