"""Every example is a valid job for the CRD and for parse_job, and renders objects Kubernetes 1.32 accepts."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
from crd_tools import EXAMPLES, crd_errors, load_example
from rtj_operator import api, render

UID = "0f9d5c38-6f4e-4a57-9d0e-0a3c7e1f2b11"


def test_there_are_the_three_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {"p5-2node.yaml", "p5-8node-spares.yaml", "local-cpu.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_passes_the_crd_schema_and_its_cel_rules(path: Path) -> None:
    assert crd_errors(load_example(path)) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_passes_parse_job(path: Path) -> None:
    job = api.parse_job(load_example(path))
    assert job.spec.nodes >= 1


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_rendered_manifest_is_valid_kubernetes_1_32(path: Path) -> None:
    job = api.parse_job(load_example(path))
    objects = render.render(job, uid=UID, excluded_nodes=["ip-10-0-0-1.ec2.internal"])
    assert len(objects) >= 3 + job.spec.nodes + job.spec.hot_spares - 1
    # What the operator creates after a fault: a replacement pinned to a spare's node.
    objects.append(render.render_worker_pod(job, 0, uid=UID, excluded_nodes=["n-1"], node_name="n-2"))
    for obj in objects:
        kubernetes_validate.validate(obj, "1.32", strict=True)


def test_the_local_example_fits_the_local_cluster() -> None:
    job = api.parse_job(load_example(Path(__file__).resolve().parents[2] / "examples" / "local-cpu.yaml"))
    spec = job.spec
    assert spec.instance_type == "cpu" and spec.nodes == 2 and spec.processes_per_node == 2
    assert spec.checkpoint.storage.dynamic is not None
    assert spec.checkpoint.storage.dynamic.storage_class_name == "local"
    assert spec.command == ["rtj-train"] and "--steps" in spec.args
    assert spec.fault_tolerance.heartbeat_timeout_seconds <= 15
