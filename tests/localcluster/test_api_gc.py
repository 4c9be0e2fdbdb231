"""ownerReference garbage collection on the embedded API server: background, foreground (with
blockOwnerDeletion) and orphan propagation, and pods whose graceful deletion holds a foreground
owner until the kubelet's final delete."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from rtj_localcluster.apiserver import ApiServer
from rtj_localcluster.testing import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[client.CoreV1Api]:
    server = ApiServer(tmp_path_factory.mktemp("api"))
    server.start()
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(server.kubeconfig_path), client_configuration=configuration)
    with client.ApiClient(configuration) as api_client:
        yield client.CoreV1Api(api_client)
    server.stop()


def _owner(core: client.CoreV1Api, name: str) -> client.V1OwnerReference:
    owner = core.create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name))
    )
    return client.V1OwnerReference(
        api_version="v1", kind="ConfigMap", name=name, uid=owner.metadata.uid, block_owner_deletion=True
    )


def _dependent(core: client.CoreV1Api, name: str, *owners: client.V1OwnerReference) -> None:
    core.create_namespaced_secret(
        "default", client.V1Secret(metadata=client.V1ObjectMeta(name=name, owner_references=list(owners)))
    )


def _exists(read: Callable[[str, str], Any], name: str) -> bool:
    try:
        read(name, "default")
    except ApiException as error:
        assert error.status == 404
        return False
    return True


def test_background_deletion_removes_dependents(core: client.CoreV1Api) -> None:
    ref = _owner(core, "bg-owner")
    _dependent(core, "bg-dep-1", ref)
    _dependent(core, "bg-dep-2", ref)
    other = _owner(core, "bg-other")
    _dependent(core, "bg-shared", ref, other)  # still has a live owner: kept

    core.delete_namespaced_config_map("bg-owner", "default")
    assert not _exists(core.read_namespaced_config_map, "bg-owner")  # the owner goes first
    wait_for(lambda: not _exists(core.read_namespaced_secret, "bg-dep-1"), message="bg-dep-1 collected")
    wait_for(lambda: not _exists(core.read_namespaced_secret, "bg-dep-2"), message="bg-dep-2 collected")
    assert _exists(core.read_namespaced_secret, "bg-shared")
    core.delete_namespaced_config_map("bg-other", "default")
    wait_for(lambda: not _exists(core.read_namespaced_secret, "bg-shared"), message="bg-shared collected")


def test_foreground_deletion_waits_for_dependents(core: client.CoreV1Api) -> None:
    ref = _owner(core, "fg-owner")
    _dependent(core, "fg-dep", ref)
    # A scheduled pod is deleted gracefully: it holds the owner until its final delete.
    core.create_namespaced_pod(
        "default",
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="fg-pod", owner_references=[ref]),
            spec=client.V1PodSpec(node_name="n1", containers=[client.V1Container(name="c", image="i:1")]),
        ),
    )
    core.delete_namespaced_config_map("fg-owner", "default", propagation_policy="Foreground")
    owner = core.read_namespaced_config_map("fg-owner", "default")
    assert owner.metadata.deletion_timestamp is not None
    assert "foregroundDeletion" in owner.metadata.finalizers
    wait_for(lambda: not _exists(core.read_namespaced_secret, "fg-dep"), message="fg-dep collected")
    pod = wait_for(
        lambda: core.read_namespaced_pod("fg-pod", "default").metadata.deletion_timestamp and True,
        message="pod marked",
    )
    assert pod
    assert _exists(core.read_namespaced_config_map, "fg-owner")  # held by the terminating pod

    core.delete_namespaced_pod("fg-pod", "default", grace_period_seconds=0)  # as the kubelet does
    wait_for(lambda: not _exists(core.read_namespaced_config_map, "fg-owner"), message="owner removed")


def test_orphan_deletion_keeps_dependents(core: client.CoreV1Api) -> None:
    ref = _owner(core, "or-owner")
    _dependent(core, "or-dep", ref)
    core.delete_namespaced_config_map("or-owner", "default", propagation_policy="Orphan")
    assert not _exists(core.read_namespaced_config_map, "or-owner")
    # The references to the owner are gone in the same request, so nothing can collect it later.
    dep = core.read_namespaced_secret("or-dep", "default")
    assert not dep.metadata.owner_references


def test_dependent_of_a_missing_owner_is_collected(core: client.CoreV1Api) -> None:
    ghost = client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="ghost", uid="no-such-uid")
    _dependent(core, "orphaned-at-birth", ghost)
    wait_for(lambda: not _exists(core.read_namespaced_secret, "orphaned-at-birth"), message="collection")
