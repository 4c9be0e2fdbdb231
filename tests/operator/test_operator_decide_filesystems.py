"""FSx allow-list (fsx_policy, decide.filesystems): a static FSx volume only where the administrator
allowed that file system for the job's namespace; anything else creates nothing and says why."""

from __future__ import annotations

from typing import Any

import pytest
from operator_world import T0, job_body, node_body
from rtj_operator import decide, events, observe
from rtj_operator.decide import CreateObject
from rtj_operator.decide import conditions as cond
from rtj_operator.fsx_policy import AllowListError, FsxAllowList

FS_A = "fs-0123456789abcdef0"
FS_B = "fs-0fedcba9876543210"


def dns(fs: str) -> str:
    return f"{fs}.fsx.us-east-1.amazonaws.com"


def fsx_job(fs: str = FS_A, dns_name: str | None = None, **spec: Any) -> dict[str, Any]:
    storage = {"fsxStatic": {"fileSystemId": fs, "dnsName": dns_name or dns(fs), "mountName": "abcdefgh"}}
    return job_body(checkpoint={"storage": storage}, **spec)


def plan(job: dict[str, Any], allowed: list[str]) -> decide.Plan:
    observed = observe.observe(
        [],
        [node_body(f"node-{i}") for i in range(3)],
        ensure_base=True,
        fsx_allowed=FsxAllowList.parse(allowed),
    )
    return decide.reconcile(observe.observe_job(job), observed, T0)


def created_kinds(result: decide.Plan) -> list[str]:
    return [a.kind for a in result.actions if isinstance(a, CreateObject)]


def blocked(result: decide.Plan) -> dict[str, Any] | None:
    conditions = result.status.to_status()["conditions"]
    return next((c for c in conditions if c["type"] == cond.COND_BLOCKED), None)


@pytest.mark.parametrize(
    "allowed",
    [
        [f"ml={FS_A}"],
        [f"ml={FS_B},{FS_A}"],
        [f"ml={dns(FS_A)}"],
        [f"*={FS_A}"],
        ["ml=*"],
        [f"other={FS_B}", f"ml={FS_A.upper()}"],
    ],
)
def test_an_allowed_file_system_gets_its_volume(allowed: list[str]) -> None:
    result = plan(fsx_job(), allowed)
    assert "PersistentVolume" in created_kinds(result)
    assert "Pod" in created_kinds(result)
    assert blocked(result) is None


@pytest.mark.parametrize(
    "allowed",
    [
        [],
        [f"ml={FS_B}"],
        [f"other={FS_A}"],
        [f"ml={dns(FS_B)}"],
        ["other=*"],
    ],
)
def test_a_file_system_not_allowed_for_the_namespace_creates_nothing_and_says_why(
    allowed: list[str],
) -> None:
    result = plan(fsx_job(), allowed)
    assert created_kinds(result) == []
    condition = blocked(result)
    assert condition is not None and condition["status"] == "True"
    assert condition["reason"] == events.FILE_SYSTEM_NOT_ALLOWED
    assert "spec.checkpoint.storage.fsxStatic.fileSystemId" in condition["message"]
    assert "namespace 'ml'" in condition["message"] and FS_A in condition["message"]
    assert [(e.type, e.reason) for e in result.events] == [(events.WARNING, events.FILE_SYSTEM_NOT_ALLOWED)]


def test_an_allowed_id_with_another_file_systems_dns_name_is_refused() -> None:
    # The CSI driver mounts by DNS name: an allowed id must not smuggle in another file system.
    result = plan(fsx_job(FS_A, dns_name=dns(FS_B)), [f"ml={FS_A}"])
    assert created_kinds(result) == []
    condition = blocked(result)
    assert condition is not None and condition["reason"] == events.FILE_SYSTEM_NOT_ALLOWED
    assert "spec.checkpoint.storage.fsxStatic.dnsName" in condition["message"]


def test_a_suspended_job_creates_no_volume_either() -> None:
    result = plan(fsx_job(suspend=True), [])
    assert created_kinds(result) == []
    assert (blocked(result) or {}).get("reason") == events.FILE_SYSTEM_NOT_ALLOWED


def test_the_condition_is_said_once_and_cleared_when_the_spec_names_an_allowed_file_system() -> None:
    job = fsx_job(FS_B)
    first = plan(job, [f"ml={FS_A}"])
    job["status"] = first.status.to_status()
    again = plan(job, [f"ml={FS_A}"])
    assert not again.events and not again.status_changed
    fixed = fsx_job(FS_A)
    fixed["metadata"]["generation"] = 2
    fixed["status"] = first.status.to_status()
    result = plan(fixed, [f"ml={FS_A}"])
    condition = blocked(result)
    assert condition is not None and condition["status"] == "False"
    assert "PersistentVolume" in created_kinds(result)


def test_jobs_without_fsx_are_not_concerned() -> None:
    result = plan(job_body(), [])
    assert "Pod" in created_kinds(result) and blocked(result) is None


@pytest.mark.parametrize("item", ["ml", "=fs-0123456789abcdef0", "ml=", "ml=efs-123", "ml=fs-xyz"])
def test_a_malformed_allow_list_entry_names_itself(item: str) -> None:
    with pytest.raises(AllowListError, match="--allow-fsx"):
        FsxAllowList.parse([item])
