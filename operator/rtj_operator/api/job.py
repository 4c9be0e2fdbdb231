"""The ResilientTrainingJob object: parsing bodies with the CRD's rules, and the CRD itself.

:func:`parse_job` validates a body (as the API server stores it) in Python, for objects that never passed
an API server's validation; :func:`check_update` applies the transition rules; :func:`crd` builds the
CustomResourceDefinition from the models (``rtj crd`` prints it, ``make crds`` writes crds/).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from rtj_operator import constants
from rtj_operator.api.schema import immutable_paths, model_schema
from rtj_operator.api.spec import JOB_NAME_PATTERN, MAX_JOB_NAME_LENGTH, ResilientTrainingJobSpec
from rtj_operator.api.status import ResilientTrainingJobStatus
from rtj_operator.validation import JobValidationError, format_validation_error


class ObjectMeta(BaseModel):
    """The parts of Kubernetes object metadata the operator reads; the rest is ignored."""

    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True, extra="ignore", frozen=True)
    # A CRD may restrict only metadata.name and metadata.generateName.
    crd_schema_override: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": MAX_JOB_NAME_LENGTH, "pattern": JOB_NAME_PATTERN}
        },
    }

    name: str = Field(min_length=1, max_length=MAX_JOB_NAME_LENGTH, pattern=JOB_NAME_PATTERN)
    namespace: str | None = None
    uid: str | None = None
    generation: int | None = None
    resource_version: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class ResilientTrainingJob(BaseModel):
    """A ResilientTrainingJob: one FSDP training job kept making progress through faults."""

    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True, extra="forbid", frozen=True)

    api_version: Literal["resilient.training/v1alpha1"] = Field(
        description="apiVersion is resilient.training/v1alpha1."
    )
    kind: Literal["ResilientTrainingJob"] = Field(description="kind is ResilientTrainingJob.")
    metadata: ObjectMeta = Field(description="metadata is the standard object metadata.")
    spec: ResilientTrainingJobSpec = Field(description="spec is the desired state of the job.")
    status: ResilientTrainingJobStatus | None = Field(
        default=None, description="status is the observed state."
    )

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace or "default"


def parse_job(body: Mapping[str, Any]) -> ResilientTrainingJob:
    """Validate a ResilientTrainingJob body (as the API server stores it) with the CRD's rules.

    Raises :class:`JobValidationError` whose message names each offending field by its JSON path, e.g.
    ``spec.checkpoint.storage: exactly one of fsxStatic, dynamic, existingClaim must be set``.
    """
    if not isinstance(body, Mapping):
        raise JobValidationError([("", f"a job must be a mapping, not {type(body).__name__}")])
    try:
        return ResilientTrainingJob.model_validate(dict(body), by_alias=True, by_name=False)
    except ValidationError as error:
        raise JobValidationError(format_validation_error(error)) from None


def check_update(old: ResilientTrainingJob, new: ResilientTrainingJob) -> None:
    """Enforce the CRD's transition rules (immutable fields) in Python; raise JobValidationError."""
    problems: list[tuple[str, str]] = []
    for path, attrs in immutable_paths(ResilientTrainingJobSpec, "spec."):
        before: Any = old.spec
        after: Any = new.spec
        for attr in attrs:
            before, after = getattr(before, attr), getattr(after, attr)
        if before != after:
            problems.append((path, f"{path.rsplit('.', 1)[-1]} is immutable"))
    if problems:
        raise JobValidationError(problems)


def _printer_columns() -> list[dict[str, Any]]:
    return [
        {"name": "State", "type": "string", "jsonPath": ".status.state", "description": "The job's state."},
        {"name": "Nodes", "type": "string", "jsonPath": ".status.workers.readyText",
         "description": "Ready worker pods / desired."},
        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts.total",
         "description": "Restarts of every layer."},
        {"name": "Step", "type": "integer", "jsonPath": ".status.progress.step",
         "description": "The newest training step."},
        {"name": "Checkpoint", "type": "integer", "jsonPath": ".status.lastCheckpoint.step",
         "description": "The step of the newest complete checkpoint."},
        {"name": "Checkpointed", "type": "date", "jsonPath": ".status.lastCheckpoint.time",
         "description": "When the newest checkpoint was committed."},
        {"name": "Goodput", "type": "number", "jsonPath": ".status.progress.goodputPercent",
         "description": "Useful step time over wall time, in percent."},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        # -o wide: the checkpoint interval beside the one the measured costs advise.
        {"name": "Interval", "type": "integer", "jsonPath": ".spec.checkpoint.intervalSteps", "priority": 1,
         "description": "The configured checkpoint interval, in steps."},
        {"name": "Advised", "type": "integer", "priority": 1,
         "jsonPath": ".status.checkpointAdvice.recommendedIntervalSteps",
         "description": "The checkpoint interval the save cost and fault rate advise, in steps."},
        # -o wide: where the step comes from (Library, LogPattern or NotReported).
        {"name": "Steps-From", "type": "string", "jsonPath": ".status.progress.sources.step", "priority": 1,
         "description": "Where the step comes from: the rtj library, a log-line pattern, or nowhere."},
    ]  # fmt: skip


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition of ResilientTrainingJob, generated from the models."""
    root = model_schema(ResilientTrainingJob)
    root["description"] = (
        "ResilientTrainingJob runs a distributed PyTorch FSDP training job on one pod per node and keeps it "
        "making progress through faults: in-process restarts, in-job restarts, pod replacement and node "
        "exclusion."
    )
    root["properties"]["apiVersion"] = {
        "type": "string",
        "description": root["properties"]["apiVersion"]["description"],
    }
    root["properties"]["kind"] = {"type": "string", "description": root["properties"]["kind"]["description"]}
    root["required"] = ["spec"]
    # The API server forbids anything but name/generateName restrictions under metadata (even a
    # description): the root's metadata schema must be exactly {type: object[, properties.name]}.
    root["properties"]["metadata"].pop("description")
    schema = {"description": root.pop("description"), **root}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{constants.PLURAL}.{constants.GROUP}",
            "labels": {constants.LABEL_APP_NAME: "resilient-training-operator"},
        },
        "spec": {
            "group": constants.GROUP,
            "names": {
                "kind": constants.KIND,
                "listKind": f"{constants.KIND}List",
                "plural": constants.PLURAL,
                "singular": constants.SINGULAR,
                "shortNames": list(constants.SHORT_NAMES),
                "categories": list(constants.CATEGORIES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": constants.VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": _printer_columns(),
                }
            ],
        },
    }


def crd_yaml() -> str:
    """The CRD as the YAML document kept in crds/ (stable bytes: the key order is the models')."""
    header = "# Generated from rtj_operator.api by `rtj crd --write`; do not edit.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=120, allow_unicode=True)
