"""The official ``kubernetes`` Python client against the embedded API server: CRUD, lists with
selectors and pages, watch with resume and 410 Gone, dry runs, pod subresources and deletion."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from rtj_localcluster.apiserver import ApiServer
from rtj_localcluster.testing import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    # A short history window so that a test can push a resourceVersion out of it.
    server = ApiServer(tmp_path_factory.mktemp("api"), watch_history=200, bookmark_interval=0.5)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def core(api: ApiServer) -> Iterator[client.CoreV1Api]:
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(api.kubeconfig_path), client_configuration=configuration)
    with client.ApiClient(configuration) as api_client:
        yield client.CoreV1Api(api_client)


def _cm(name: str, labels: dict[str, str] | None = None, **data: str) -> client.V1ConfigMap:
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels=labels), data=data)


def _pod(name: str, node: str | None = None) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            node_name=node,
            containers=[client.V1Container(name="main", image="busybox:1")],
        ),
    )


def test_create_get_update_conflict_and_delete(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_config_map("default", _cm("crud", a="1"))
    meta = created.metadata
    assert meta.uid and meta.creation_timestamp and int(meta.resource_version) > 0
    with pytest.raises(ApiException) as exists:
        core.create_namespaced_config_map("default", _cm("crud"))
    assert exists.value.status == 409 and "AlreadyExists" in exists.value.body

    created.data = {"a": "2"}
    updated = core.replace_namespaced_config_map("crud", "default", created)
    assert int(updated.metadata.resource_version) > int(meta.resource_version)
    created.data = {"a": "3"}  # still carries the old resourceVersion
    with pytest.raises(ApiException) as stale:
        core.replace_namespaced_config_map("crud", "default", created)
    assert stale.value.status == 409 and '"reason":"Conflict"' in stale.value.body

    core.delete_namespaced_config_map("crud", "default")
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_config_map("crud", "default")
    assert gone.value.status == 404 and '"reason":"NotFound"' in gone.value.body


def test_generate_name_and_missing_namespace(core: client.CoreV1Api) -> None:
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(generate_name="gen-"))
    first = core.create_namespaced_config_map("default", body)
    second = core.create_namespaced_config_map("default", body)
    assert first.metadata.name.startswith("gen-") and len(first.metadata.name) == len("gen-") + 5
    assert first.metadata.name != second.metadata.name
    with pytest.raises(ApiException) as missing:
        core.create_namespaced_config_map("no-such-namespace", _cm("x"))
    assert missing.value.status == 404


def test_label_and_field_selectors_and_pages(core: client.CoreV1Api) -> None:
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="selectors")))
    for i, (tier, zone) in enumerate([("a", "x"), ("b", "x"), ("c", "y"), ("a", "y")]):
        labels = {"tier": tier, "zone": zone} if i != 3 else {"tier": tier}
        core.create_namespaced_config_map("selectors", _cm(f"cm{i}", labels))

    def names(**kwargs: Any) -> list[str]:
        return [i.metadata.name for i in core.list_namespaced_config_map("selectors", **kwargs).items]

    assert names(label_selector="tier=a") == ["cm0", "cm3"]
    assert names(label_selector="tier!=a") == ["cm1", "cm2"]
    assert names(label_selector="tier in (b,c)") == ["cm1", "cm2"]
    assert names(label_selector="tier notin (a),zone") == ["cm1", "cm2"]
    assert names(label_selector="!zone") == ["cm3"]
    assert names(label_selector="tier=a,zone=y") == []
    assert names(field_selector="metadata.name=cm2") == ["cm2"]
    assert names(field_selector="metadata.name!=cm2", label_selector="zone=x") == ["cm0", "cm1"]
    with pytest.raises(ApiException) as bad:
        names(field_selector="data.x=1")
    assert bad.value.status == 400

    first = core.list_namespaced_config_map("selectors", limit=3)
    assert len(first.items) == 3 and first.metadata._continue
    rest = core.list_namespaced_config_map("selectors", limit=3, _continue=first.metadata._continue)
    assert [i.metadata.name for i in first.items + rest.items] == ["cm0", "cm1", "cm2", "cm3"]
    assert not rest.metadata._continue
    listed = core.list_namespaced_config_map("selectors")
    assert int(listed.metadata.resource_version) >= max(
        int(i.metadata.resource_version) for i in listed.items
    )


def test_pod_field_selectors(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", _pod("on-node", node="node-a"))
    core.create_namespaced_pod("default", _pod("unscheduled"))
    on_node = core.list_namespaced_pod("default", field_selector="spec.nodeName=node-a")
    assert [p.metadata.name for p in on_node.items] == ["on-node"]
    pending = core.list_namespaced_pod("default", field_selector="status.phase=Pending,spec.nodeName=")
    assert "unscheduled" in [p.metadata.name for p in pending.items]
    assert "on-node" not in [p.metadata.name for p in pending.items]
    for name in ("on-node", "unscheduled"):
        core.delete_namespaced_pod(name, "default", grace_period_seconds=0)


def test_watch_resume_and_gone(api: ApiServer, core: client.CoreV1Api) -> None:
    start = core.list_namespaced_config_map("default").metadata.resource_version
    core.create_namespaced_config_map("default", _cm("w1", a="1"))
    core.patch_namespaced_config_map("w1", "default", {"data": {"a": "2"}})
    core.delete_namespaced_config_map("w1", "default")

    seen: list[tuple[str, str, str | None]] = []
    for event in watch.Watch().stream(
        core.list_namespaced_config_map, "default", resource_version=start, timeout_seconds=5
    ):
        obj = event["object"]
        seen.append((event["type"], obj.metadata.name, (obj.data or {}).get("a")))
        if event["type"] == "DELETED":
            break
    assert seen == [("ADDED", "w1", "1"), ("MODIFIED", "w1", "2"), ("DELETED", "w1", "2")]

    # A live watch sees events as they happen.
    received: list[str] = []
    ready = threading.Event()

    def follow() -> None:
        w = watch.Watch()
        rv = core.list_namespaced_config_map("default").metadata.resource_version
        ready.set()
        for event in w.stream(
            core.list_namespaced_config_map, "default", resource_version=rv, timeout_seconds=30
        ):
            received.append(f"{event['type']} {event['object'].metadata.name}")
            if event["object"].metadata.name == "live":
                w.stop()

    thread = threading.Thread(target=follow)
    thread.start()
    ready.wait(10)
    core.create_namespaced_config_map("default", _cm("live"))
    thread.join(60)
    assert received == ["ADDED live"]

    # Push `start` out of the history window: a resumed watch then gets 410 Gone.
    api.call(lambda cluster: cluster.store.compact())
    with pytest.raises(ApiException) as gone:
        for _ in watch.Watch().stream(
            core.list_namespaced_config_map, "default", resource_version=start, timeout_seconds=5
        ):
            pass
    assert gone.value.status == 410


def test_watch_bookmarks_and_timeout(core: client.CoreV1Api) -> None:
    rv = core.list_namespaced_config_map("default").metadata.resource_version
    began = time.monotonic()
    types = [
        event["type"]
        for event in watch.Watch().stream(
            core.list_namespaced_config_map,
            "default",
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=5,
        )
    ]
    # The server closed the stream by itself (timeoutSeconds), after sending bookmarks.
    assert time.monotonic() - began < 60
    assert "BOOKMARK" in types


def test_dry_run_does_not_store(core: client.CoreV1Api) -> None:
    result = core.create_namespaced_config_map("default", _cm("dry", a="1"), dry_run="All")
    assert result.metadata.name == "dry"
    with pytest.raises(ApiException):
        core.read_namespaced_config_map("dry", "default")


def test_finalizers_hold_deletion(core: client.CoreV1Api) -> None:
    body = _cm("held")
    body.metadata.finalizers = ["example.com/hold"]
    core.create_namespaced_config_map("default", body)
    core.delete_namespaced_config_map("held", "default")
    held = core.read_namespaced_config_map("held", "default")
    assert held.metadata.deletion_timestamp is not None
    with pytest.raises(ApiException) as forbidden:
        core.patch_namespaced_config_map(
            "held", "default", {"metadata": {"finalizers": ["example.com/hold", "new"]}}
        )
    assert forbidden.value.status == 422
    core.patch_namespaced_config_map("held", "default", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_config_map("held", "default")
    assert gone.value.status == 404


def test_pod_graceful_delete_binding_and_eviction(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", _pod("graceful"))
    core.create_namespaced_pod_binding(
        "graceful",
        "default",
        client.V1Binding(
            metadata=client.V1ObjectMeta(name="graceful"),
            target=client.V1ObjectReference(kind="Node", name="n1"),
        ),
        _preload_content=False,
    )
    bound = core.read_namespaced_pod("graceful", "default")
    assert bound.spec.node_name == "n1"
    assert any(c.type == "PodScheduled" and c.status == "True" for c in bound.status.conditions)

    # A scheduled pod is only marked; the kubelet finishes with gracePeriodSeconds=0.
    core.delete_namespaced_pod("graceful", "default")
    marked = core.read_namespaced_pod("graceful", "default")
    assert marked.metadata.deletion_timestamp is not None
    assert marked.metadata.deletion_grace_period_seconds == 30
    core.delete_namespaced_pod("graceful", "default", grace_period_seconds=0)
    with pytest.raises(ApiException):
        core.read_namespaced_pod("graceful", "default")

    # An unscheduled pod goes at once.
    core.create_namespaced_pod("default", _pod("pending"))
    core.delete_namespaced_pod("pending", "default")
    with pytest.raises(ApiException):
        core.read_namespaced_pod("pending", "default")

    core.create_namespaced_pod("default", _pod("evicted", node="n1"))
    core.create_namespaced_pod_eviction(
        "evicted",
        "default",
        client.V1Eviction(metadata=client.V1ObjectMeta(name="evicted", namespace="default")),
    )
    evicted = core.read_namespaced_pod("evicted", "default")
    assert evicted.metadata.deletion_timestamp is not None
    target = [c for c in evicted.status.conditions if c.type == "DisruptionTarget"]
    assert target and target[0].reason == "EvictionByEvictionAPI"
    core.delete_namespaced_pod("evicted", "default", grace_period_seconds=0)


def test_status_subresource_and_generation(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", _pod("gen"))
    pod = core.read_namespaced_pod("gen", "default")
    assert pod.status.phase == "Pending" and pod.metadata.generation == 1
    core.patch_namespaced_pod_status(
        "gen", "default", {"status": {"phase": "Running"}, "metadata": {"labels": {"x": "y"}}}
    )
    after = core.read_namespaced_pod("gen", "default")
    assert after.status.phase == "Running" and after.metadata.generation == 1 and not after.metadata.labels
    # The main resource ignores status; strategic merge patches merge containers by name.
    core.patch_namespaced_pod(
        "gen",
        "default",
        {"status": {"phase": "Failed"}, "spec": {"containers": [{"name": "main", "image": "busybox:2"}]}},
    )
    patched = core.read_namespaced_pod("gen", "default")
    assert patched.status.phase == "Running"
    assert [(c.name, c.image) for c in patched.spec.containers] == [("main", "busybox:2")]
    assert patched.metadata.generation == 2
    core.delete_namespaced_pod("gen", "default", grace_period_seconds=0)


def test_namespace_deletion_removes_content(core: client.CoreV1Api) -> None:
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="doomed")))
    wait_for(lambda: core.list_namespaced_service_account("doomed").items, message="default service account")
    core.create_namespaced_config_map("doomed", _cm("inside"))
    core.delete_namespace("doomed")

    def gone() -> bool:
        try:
            core.read_namespace("doomed")
        except ApiException as error:
            return error.status == 404
        return False

    wait_for(gone, message="namespace removal")
    assert core.list_namespaced_config_map("doomed").items == []


def test_pod_logs(api: ApiServer, core: client.CoreV1Api, tmp_path: Path) -> None:
    pod = core.create_namespaced_pod("default", _pod("logger", node="n1"))
    directory = api.log_root / "pods" / f"default_logger_{pod.metadata.uid}"
    directory.mkdir(parents=True)
    (directory / "main.log").write_text("one\ntwo\nthree\n")
    assert core.read_namespaced_pod_log("logger", "default") == "one\ntwo\nthree\n"
    assert core.read_namespaced_pod_log("logger", "default", tail_lines=1) == "three\n"
    core.delete_namespaced_pod("logger", "default", grace_period_seconds=0)


def test_deleting_a_crd_removes_its_objects_and_ends_watches(api: ApiServer, core: client.CoreV1Api) -> None:
    api_client = core.api_client
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "blips.client.example.com"},
        "spec": {
            "group": "client.example.com",
            "scope": "Namespaced",
            "names": {"plural": "blips", "kind": "Blip"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
            ],
        },
    }
    client.ApiextensionsV1Api(api_client).create_custom_resource_definition(crd)
    custom = client.CustomObjectsApi(api_client)
    body = {"apiVersion": "client.example.com/v1", "kind": "Blip", "metadata": {"name": "b"}, "data": 1}
    created = custom.create_namespaced_custom_object("client.example.com", "v1", "default", "blips", body)
    assert created["data"] == 1  # preserved unknown fields at the root
    types: list[str] = []

    def follow() -> None:
        for event in watch.Watch().stream(
            custom.list_namespaced_custom_object,
            "client.example.com",
            "v1",
            "default",
            "blips",
            resource_version=created["metadata"]["resourceVersion"],
            timeout_seconds=120,
        ):
            types.append(event["type"])

    watching = api.call(lambda cluster: cluster.store.watcher_count())
    thread = threading.Thread(target=follow)
    thread.start()
    wait_for(lambda: api.call(lambda cluster: cluster.store.watcher_count()) > watching, message="the watch")
    client.ApiextensionsV1Api(api_client).delete_custom_resource_definition("blips.client.example.com")
    thread.join(120)
    assert not thread.is_alive() and types == ["DELETED"]
    with pytest.raises(ApiException) as gone:
        custom.list_namespaced_custom_object("client.example.com", "v1", "default", "blips")
    assert gone.value.status == 404
