"""Everything the project ships to a cluster passes kubernetes-validate (strict, 1.32) and checkov.

Scanned: the chart rendered with every values set, the CRD in the chart's crds/, and the objects
the operator renders for each example job (`rtj render -f examples/<job>.yaml`). A failed checkov
check is accepted only if docs/security.md justifies it for that kind, and every justification
there must still be needed (so the document cannot go stale).
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from chart_support import CHECKOV, KUBE_VERSION, REPO, crd_objects, render, value_sets

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
SECURITY_DOC = REPO / "docs" / "security.md"
# Kinds whose schema is a third-party CRD, not part of Kubernetes: checked structurally elsewhere
# (the PrometheusRule's groups by promtool, test_chart_monitoring.py).
THIRD_PARTY_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}


def chart_objects() -> dict[str, list[dict[str, Any]]]:
    return {f"chart-{name}": render(values) for name, values in value_sets().items()}


@functools.cache
def job_objects() -> dict[str, list[dict[str, Any]]]:
    """What the operator creates for each example job, as `rtj render` prints it."""
    rendered = {}
    for example in EXAMPLES:
        result = subprocess.run(
            [sys.executable, "-m", "rtj_operator.cli", "render", "-f", str(example)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        rendered[f"job-{example.stem}"] = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    return rendered


def validate_strict(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("values_name", list(value_sets()))
def test_chart_objects_pass_strict_kubernetes_validation(values_name: str) -> None:
    for obj in render(value_sets()[values_name]):
        if obj["kind"] not in THIRD_PARTY_KINDS:
            validate_strict(obj)


def test_strict_validation_rejects_an_unknown_field() -> None:
    deployment = next(obj for obj in render() if obj["kind"] == "Deployment")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_strict(broken)


def test_crd_passes_strict_kubernetes_validation() -> None:
    crds = crd_objects()
    assert [crd["metadata"]["name"] for crd in crds] == ["resilienttrainingjobs.resilient.training"]
    for crd in crds:
        validate_strict(crd)


def test_rendered_job_objects_pass_strict_kubernetes_validation() -> None:
    assert EXAMPLES, "examples/ holds no job manifests"
    for name, objects in job_objects().items():
        assert objects, f"{name}: nothing rendered"
        for obj in objects:
            validate_strict(obj)


def justified_findings() -> set[tuple[str, str]]:
    """(check id, kind) pairs from the table rows of docs/security.md's checkov section."""
    text = SECURITY_DOC.read_text()
    section = text.split("## Checkov findings", 1)[1].split("\n## ", 1)[0]
    pairs = set()
    for row in section.splitlines():
        cells = [cell.strip(" `") for cell in row.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"CKV2?_K8S_\d+", cells[0]):
            pairs.update((cells[0], kind.strip(" `")) for kind in cells[1].split(","))
    return pairs


def run_checkov(directory: Path) -> list[dict[str, Any]]:
    result = subprocess.run(
        [str(CHECKOV), "-d", str(directory), "--framework", "kubernetes", "--skip-download", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode in (0, 1), result.stderr[-2000:]
    report = json.loads(result.stdout)
    reports = report if isinstance(report, list) else [report]
    assert sum(r["summary"]["resource_count"] for r in reports) > 0, "checkov scanned nothing"
    assert all(r["summary"]["parsing_errors"] == 0 for r in reports)
    failed: list[dict[str, Any]] = [check for r in reports for check in r["results"]["failed_checks"]]
    return failed


@pytest.mark.slow
def test_checkov_finds_nothing_unjustified(tmp_path: Path) -> None:
    scanned = {**chart_objects(), **job_objects(), "crd": crd_objects()}
    for name, objects in scanned.items():
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump_all(objects, sort_keys=False))
    failed = run_checkov(tmp_path)
    found = {(check["check_id"], check["resource"].split(".", 1)[0]) for check in failed}
    justified = justified_findings()
    unjustified = sorted(found - justified)
    examples = {}
    for check in failed:
        key = (check["check_id"], check["resource"].split(".", 1)[0])
        examples.setdefault(key, f"{key[0]} on {key[1]} ({check['check_name']}; e.g. {check['resource']})")
    assert not unjustified, "fix these or justify them in docs/security.md:\n" + "\n".join(
        examples[key] for key in unjustified
    )
    stale = sorted(justified - found)
    assert not stale, f"docs/security.md justifies findings that no longer occur: {stale}"


@pytest.mark.slow
def test_checkov_is_really_scanning(tmp_path: Path) -> None:
    """The same invocation flags a privileged root pod, so a clean result means something."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bad", "namespace": "x"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": True}}]},
    }
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(pod))
    ids = {check["check_id"] for check in run_checkov(tmp_path)}
    assert {"CKV_K8S_16", "CKV_K8S_22", "CKV_K8S_23"} <= ids
