"""kopf, unmodified, runs an operator against the embedded API server: create/update/delete handlers
of a custom resource with kopf's finalizer, its status and event posting, and resourceVersion
conflicts (a stale patch gets 409)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from rtj_localcluster.apiserver import ApiServer
from rtj_localcluster.testing import wait_for

pytestmark = pytest.mark.slow

GROUP, VERSION, PLURAL = "kopf.example.com", "v1", "gadgets"
FINALIZER = "kopf.example.com/finalizer"


CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "gadget", "kind": "Gadget"},
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    server = ApiServer(tmp_path_factory.mktemp("api"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def custom(api: ApiServer) -> Iterator[client.CustomObjectsApi]:
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(api.kubeconfig_path), client_configuration=configuration)
    with client.ApiClient(configuration) as api_client:
        client.ApiextensionsV1Api(api_client).create_custom_resource_definition(CRD)
        yield client.CustomObjectsApi(api_client)


class Operator:
    """A tiny kopf operator, run by ``kopf.operator`` on its own loop in a thread."""

    def __init__(self, api: ApiServer) -> None:
        self.api = api
        self.calls: list[tuple[str, str, Any]] = []
        self.registry = kopf.OperatorRegistry()
        self.loop = asyncio.new_event_loop()
        self.stop_flag: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self._register()

    def _register(self) -> None:
        registry = self.registry
        calls = self.calls
        api = self.api

        @kopf.on.login(registry=registry)
        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(
                server=api.url, ca_path=str(api.ca_path), token="any", default_namespace="default"
            )

        @kopf.on.startup(registry=registry)
        def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
            settings.persistence.finalizer = FINALIZER
            # Short server-side watch timeouts exercise watch restarts with resourceVersion.
            settings.watching.server_timeout = 5
            settings.watching.client_timeout = 30
            settings.posting.level = 20

        @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry, id="created")
        def created(name: str, spec: Any, body: Any, **_: Any) -> dict[str, Any]:
            calls.append(("create", name, spec.get("size")))
            kopf.info(body, reason="GadgetSeen", message="gadget created")
            return {"seenSize": spec.get("size")}

        @kopf.on.update(GROUP, VERSION, PLURAL, registry=registry, id="updated")
        def updated(name: str, old: Any, new: Any, **_: Any) -> None:
            calls.append(("update", name, (old["spec"].get("size"), new["spec"].get("size"))))

        @kopf.on.delete(GROUP, VERSION, PLURAL, registry=registry, id="deleted")
        def deleted(name: str, **_: Any) -> None:
            calls.append(("delete", name, None))

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.stop_flag = asyncio.Event()
        self.loop.run_until_complete(
            kopf.operator(
                registry=self.registry, standalone=True, namespaces=["default"], stop_flag=self.stop_flag
            )
        )
        # Closed TLS connections finish their shutdown on the loop's next iterations.
        self.loop.run_until_complete(asyncio.sleep(1))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        wait_for(lambda: self.stop_flag is not None, timeout=90.0, message="operator start")
        assert self.stop_flag is not None
        self.loop.call_soon_threadsafe(self.stop_flag.set)
        self.thread.join(60)
        assert not self.thread.is_alive()


def test_kopf_operator_handles_create_update_delete(api: ApiServer, custom: client.CustomObjectsApi) -> None:
    operator = Operator(api)
    operator.start()
    try:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Gadget",
            "metadata": {"name": "g1"},
            "spec": {"size": 1},
        }
        custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)

        def handled() -> dict[str, Any] | None:
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "g1")
            return obj if (obj.get("status") or {}).get("created") else None

        obj = wait_for(handled, timeout=90.0, message="the create handler's result in status")
        assert obj["status"]["created"] == {"seenSize": 1}
        assert FINALIZER in obj["metadata"]["finalizers"]
        assert ("create", "g1", 1) in operator.calls

        custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "g1", {"spec": {"size": 2}})
        wait_for(
            lambda: ("update", "g1", (1, 2)) in operator.calls, timeout=90.0, message="the update handler"
        )

        custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "g1")

        def gone() -> bool:
            try:
                custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "g1")
            except ApiException as error:
                return error.status == 404
            return False

        wait_for(gone, timeout=90.0, message="deletion after kopf removed its finalizer")
        assert ("delete", "g1", None) in operator.calls
        # kopf posted its events (core/v1) about the object.
        events = client.CoreV1Api(custom.api_client).list_namespaced_event("default").items
        assert any(e.involved_object.name == "g1" and e.reason == "GadgetSeen" for e in events)
    finally:
        operator.stop()


def test_stale_resource_version_patch_conflicts(custom: client.CustomObjectsApi) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Gadget",
        "metadata": {"name": "g2"},
        "spec": {"size": 1},
    }
    created = custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    stale = created["metadata"]["resourceVersion"]
    custom.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "g2", {"spec": {"size": 2}})
    with pytest.raises(ApiException) as conflict:
        custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            "default",
            PLURAL,
            "g2",
            {"metadata": {"resourceVersion": stale}, "spec": {"size": 3}},
        )
    assert conflict.value.status == 409 and '"reason":"Conflict"' in conflict.value.body
    current = custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "g2")
    assert current["spec"]["size"] == 2
