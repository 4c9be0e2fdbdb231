"""Helpers for the chart tests: render the Helm chart offline and locate the scanning tools.

The chart is rendered with the Helm 4 SDK (helm-python-sdk binds Helm's Go library, so no helm
binary is needed); the rendered objects feed the lint, schema, RBAC, kubernetes-validate and
checkov tests next to this module.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "resilient-training-operator"
CHART_CRDS = CHART / "crds"
REPO_CRDS = REPO / "crds"
EXAMPLE_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
RELEASE = "rtj"
NAMESPACE = "rtj-system"
KUBE_VERSION = "1.32.0"

# Tools installed by `make setup`: checkov lives in its own virtual environment because its pins
# (packaging<24, networkx<3, python-dateutil<3) conflict with the project's.
CHECKOV = Path(sys.prefix) / "tools-checkov" / "bin" / "checkov"
HADOLINT = Path(sys.prefix) / "bin" / "hadolint"


@functools.cache
def _chart() -> helm.Chart:
    return helm.Chart.load(CHART)


def small_job(nodes: int) -> Any:
    """A parsed cpu job of `nodes` workers in team-a, as the operator would render its children."""
    from rtj_operator import api

    return api.ResilientTrainingJob.model_validate(
        {
            "apiVersion": "resilient.training/v1alpha1",
            "kind": "ResilientTrainingJob",
            "metadata": {"name": "demo", "namespace": "team-a", "uid": "0000-1111"},
            "spec": {
                "image": "trainer:1",
                "nodes": nodes,
                "instanceType": "cpu",
                "checkpoint": {"storage": {"existingClaim": {"claimName": "ckpt"}}},
            },
        }
    )


def load_values(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text())
    assert isinstance(loaded, dict)
    return loaded


def render_templates(
    values: dict[str, Any] | None = None, namespace: str = NAMESPACE, release: str = RELEASE
) -> dict[str, str]:
    """Template path -> rendered text, as `helm template` would produce it."""
    return _chart().render(values, name=release, namespace=namespace, is_install=True)


@functools.cache
def _render_cached(values_json: str, namespace: str, release: str) -> tuple[str, ...]:
    values = json.loads(values_json) if values_json else None
    texts = render_templates(values, namespace, release)
    return tuple(texts[name] for name in sorted(texts) if name.endswith((".yaml", ".yml")))


def render(
    values: dict[str, Any] | None = None, namespace: str = NAMESPACE, release: str = RELEASE
) -> list[dict[str, Any]]:
    """The Kubernetes objects the chart's templates produce (CRDs excluded: see crd_objects)."""
    texts = _render_cached(json.dumps(values, sort_keys=True) if values else "", namespace, release)
    return [doc for text in texts for doc in yaml.safe_load_all(text) if doc]


def crd_objects() -> list[dict[str, Any]]:
    """The CRDs shipped in the chart's crds/ folder."""
    return [
        doc
        for path in sorted(CHART_CRDS.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def objects_of(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = objects_of(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def value_sets() -> dict[str, dict[str, Any] | None]:
    """Every values set the tests exercise: the defaults and each example file under ci/."""
    sets: dict[str, dict[str, Any] | None] = {"default": None}
    sets.update({path.stem: load_values(path) for path in EXAMPLE_VALUES})
    return sets
