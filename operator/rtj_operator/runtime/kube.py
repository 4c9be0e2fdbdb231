"""Every Kubernetes API call the operator's own code makes, and the permissions they need.

`runtime.job_pass` calls this module to read a job and its pods fresh, to write status and to apply
the decisions' actions (`rtj_operator.decide`); kopf makes the watch calls (and its finalizer and
annotation patches) itself. The Helm chart's ClusterRole must grant exactly `REQUIRED_PERMISSIONS`
(a chart test compares them, and another runs the operator under them with the API server's audit
log on: every rule must be used), so any new call added here must add its
(group, resource, verb) there.

Synchronous on purpose: the official client is synchronous; `runtime` runs these calls in worker
threads. Creates treat 409 AlreadyExists as success and deletes treat 404 NotFound as success, which
makes every action safe to repeat. A create refused for good (400, 403, 404, 422) raises `RefusedError`
with the API server's message (`decide.admission` turns it into a condition); 429 and 5xx stay
transient errors that the work queue retries.

Every call is bounded (`Timeouts`: connect and read timeouts, TCP keepalive on every socket), and a
call that times out or loses its connection drops the whole connection pool and is tried once more
on a fresh connection: a pooled keep-alive connection that a network fault froze silently would
otherwise be picked again and again. Each outcome is reported to `api_liveness.ApiLiveness` (liveness, and
the exit on persistent TLS or authentication failures).
"""

from __future__ import annotations

import copy
import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, Self

import kubernetes
import urllib3
from kubernetes.utils.keepalive import tcp_keepalive_socket_options

from rtj_operator import constants
from rtj_operator.decide import (
    PERMANENT_CODES,
    Action,
    CreateObject,
    DeleteJob,
    DeleteObject,
    DeletePod,
    Refusal,
    TaintNode,
)

logger = logging.getLogger(__name__)

COORDINATION_GROUP: Final = "coordination.k8s.io"
POLICY_GROUP: Final = "policy"
COSCHEDULING_GROUP, COSCHEDULING_VERSION = constants.COSCHEDULING_API_VERSION.split("/")

# (group, resource, verb) for everything the operator does, its own calls and kopf's.
REQUIRED_PERMISSIONS: Final[frozenset[tuple[str, str, str]]] = frozenset(
    {
        # Jobs: kopf watches them (list, watch), adds/removes its finalizer and annotations (patch);
        # the operator reads one fresh before acting (get), deletes it after its TTL (delete).
        (constants.GROUP, constants.PLURAL, "get"),
        (constants.GROUP, constants.PLURAL, "list"),
        (constants.GROUP, constants.PLURAL, "watch"),
        (constants.GROUP, constants.PLURAL, "patch"),
        (constants.GROUP, constants.PLURAL, "delete"),
        (constants.GROUP, f"{constants.PLURAL}/status", "patch"),
        # Pods: indexed and watched by kopf, listed fresh, created and deleted.
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods", "create"),
        ("", "pods", "delete"),
        # Nodes: indexed and watched; read when a pod names a node the index does not know yet, and
        # tainted (opt-in taintExcludedNodes) with a read-modify-write.
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
        # The job's other children. PersistentVolumes only for allowed FSx file systems (opt-in).
        ("", "services", "create"),
        ("", "serviceaccounts", "create"),
        ("", "persistentvolumeclaims", "create"),
        ("", "persistentvolumeclaims", "delete"),
        ("", "persistentvolumes", "create"),
        ("", "persistentvolumes", "delete"),
        # Opt-in children: the workers' PodDisruptionBudget, the coscheduling PodGroup.
        (POLICY_GROUP, "poddisruptionbudgets", "create"),
        (COSCHEDULING_GROUP, "podgroups", "create"),
        # Events, posted by kopf's event poster for the operator, and the milestone Events the
        # operator posts itself under names of their own.
        ("", "events", "create"),
    }
)

# (group, resource, verb) for leader election, granted only in the operator's own namespace (a Role
# of the chart): the replicas read, create and renew one Lease there (`runtime.leader`).
LEADER_ELECTION_PERMISSIONS: Final[frozenset[tuple[str, str, str]]] = frozenset(
    {
        (COORDINATION_GROUP, "leases", "get"),
        (COORDINATION_GROUP, "leases", "create"),
        (COORDINATION_GROUP, "leases", "update"),
    }
)


@dataclass(frozen=True)
class Timeouts:
    """Bounds on every API call of the operator's own client (seconds).

    A read timeout bounds how long a request may wait for the first byte of the answer (and between
    bytes); with TCP keepalive, a connection whose peer vanished is found dead by the kernel too.
    """

    connect_seconds: float = 5.0
    read_seconds: float = 10.0
    # TCP keepalive: first probe after this much idle time, then every interval, dead after count.
    keepalive_idle_seconds: int = 10
    keepalive_interval_seconds: int = 5
    keepalive_count: int = 3


class CallOutcome(Protocol):
    """Where `Kube` reports each call's outcome (`api_liveness.ApiLiveness` is one)."""

    def succeeded(self) -> None:
        """An API call was answered (any HTTP status but 401)."""

    def failed(self, error: BaseException) -> None:
        """An API call failed without an answer, or with 401."""


class _Unreported:
    def succeeded(self) -> None:
        pass

    def failed(self, error: BaseException) -> None:
        pass


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced:
            if not namespace:
                raise ValueError(f"{self.plural} are namespaced: a namespace is needed")
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if subresource:
            base += f"/{subresource}"
        return base


RESOURCES: Final[dict[str, Resource]] = {
    "Pod": Resource("", "v1", "pods", True),
    "Service": Resource("", "v1", "services", True),
    "ServiceAccount": Resource("", "v1", "serviceaccounts", True),
    "PersistentVolumeClaim": Resource("", "v1", "persistentvolumeclaims", True),
    "PersistentVolume": Resource("", "v1", "persistentvolumes", False),
    "Node": Resource("", "v1", "nodes", False),
    "PodDisruptionBudget": Resource(POLICY_GROUP, "v1", "poddisruptionbudgets", True),
    "PodGroup": Resource(COSCHEDULING_GROUP, COSCHEDULING_VERSION, "podgroups", True),
    "Lease": Resource(COORDINATION_GROUP, "v1", "leases", True),
    "Event": Resource("", "v1", "events", True),
    constants.KIND: Resource(constants.GROUP, constants.VERSION, constants.PLURAL, True),
}


def merged(target: object, patch: object) -> Any:
    """What a JSON merge patch (RFC 7386) makes of `target`: objects merge key by key, a null removes
    the key, anything else (a list included) replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merged(result.get(key), value)
    return result


class ConflictError(Exception):
    """The object changed since it was read (HTTP 409 on an update with a resourceVersion)."""


class RefusedError(Exception):
    """The API server refused a create for good (400, 403, 404, 422): retrying the same request is useless."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.describe())
        self.refusal = refusal


def refusal_from(manifest: Mapping[str, Any], error: kubernetes.client.ApiException) -> Refusal:
    """The API server's own account of a refused create: its Status's reason, message and causes."""
    try:
        status = json.loads(error.body or "{}")
    except ValueError:
        status = {}
    if not isinstance(status, dict):
        status = {}
    message = str(status.get("message") or error.reason or "")
    causes = (status.get("details") or {}).get("causes") or []
    extra = [
        f"{c.get('field')}: {c.get('message')}" if c.get("field") else str(c.get("message"))
        for c in causes
        if isinstance(c, dict) and c.get("message") and str(c.get("message")) not in message
    ]
    if extra:
        message = "; ".join([message, *extra])
    return Refusal(
        kind=str(manifest.get("kind", "")),
        name=str(manifest.get("metadata", {}).get("name", "")),
        code=int(error.status or 0),
        reason=str(status.get("reason") or error.reason or ""),
        message=message,
    )


class ApiTransport:
    """The official client's REST call with the operator's bounds: plain dicts in and out."""

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        *,
        timeouts: Timeouts | None = None,
        outcome: CallOutcome | None = None,
    ) -> None:
        self.api_client = api_client
        self.timeouts = timeouts or Timeouts()
        self.outcome: CallOutcome = outcome or _Unreported()
        # API writes made, by verb: the benchmark reads them (writes per job, writes while idle).
        self.writes: dict[str, int] = {}
        # Creates sent, by kind, never reset: the tests count them (no create of a known child).
        self.creates: dict[str, int] = {}
        # Requests go from several threads at once (a pass's pod creates side by side).
        self._counting = threading.Lock()

    def _count(self, table: dict[str, int], key: str) -> None:
        with self._counting:
            table[key] = table.get(key, 0) + 1

    def take_writes(self) -> dict[str, int]:
        """The writes counted since the last call, by verb."""
        with self._counting:
            taken = dict(self.writes)
            self.writes.clear()
        return taken

    @classmethod
    def from_kubeconfig(
        cls, path: str | None = None, *, timeouts: Timeouts | None = None, outcome: CallOutcome | None = None
    ) -> Self:
        """From a kubeconfig file, else the in-cluster service account, else the default kubeconfig."""
        configuration = kubernetes.client.Configuration()
        config: Any = kubernetes.config  # the loaders are untyped
        if path:
            config.load_kube_config(config_file=path, client_configuration=configuration)
        else:
            try:
                config.load_incluster_config(client_configuration=configuration)
            except config.ConfigException:
                config.load_kube_config(client_configuration=configuration)
        return cls.from_configuration(configuration, timeouts=timeouts, outcome=outcome)

    @classmethod
    def from_configuration(
        cls,
        configuration: kubernetes.client.Configuration,
        *,
        timeouts: Timeouts | None = None,
        outcome: CallOutcome | None = None,
    ) -> Self:
        """A client with its own connection pool (keepalive on, urllib3's own retries off: `request`
        retries itself, on a fresh pool)."""
        timeouts = timeouts or Timeouts()
        own = copy.copy(configuration)
        own.socket_options = tcp_keepalive_socket_options(
            idle=timeouts.keepalive_idle_seconds,
            interval=timeouts.keepalive_interval_seconds,
            count=timeouts.keepalive_count,
        )
        own.retries = False
        return cls(kubernetes.client.ApiClient(own), timeouts=timeouts, outcome=outcome)

    @property
    def configuration(self) -> kubernetes.client.Configuration:
        configuration: kubernetes.client.Configuration = self.api_client.configuration
        return configuration

    def close(self) -> None:
        client: Any = self.api_client
        client.close()

    def drop_connections(self) -> None:
        """Close every pooled connection: the next call dials afresh."""
        rest: Any = self.api_client.rest_client
        rest.pool_manager.clear()

    def request(  # noqa: PLR0913 - keyword-only request options
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: list[tuple[str, Any]] | None = None,
        content_type: str = "application/json",
        read_seconds: float | None = None,
        attempts: int = 2,
    ) -> dict[str, Any]:
        """One request; on a timeout or a lost connection, the pool is dropped and the request sent
        again, up to `attempts` times (every request the operator makes is safe to repeat)."""
        if method != "GET":
            self._count(self.writes, method)
        for attempt in range(1, attempts + 1):
            try:
                return self._send(
                    method, path, body=body, query=query, content_type=content_type, read_seconds=read_seconds
                )
            except kubernetes.client.ApiException as error:
                if error.status != 0:  # an answer of the API server (401 is reported in _send)
                    raise
                # No answer: the client's own wrapping of a TLS failure (status 0).
                self.outcome.failed(error)
                self.drop_connections()
                if attempt == attempts:
                    raise
            except (urllib3.exceptions.HTTPError, OSError) as error:
                self.outcome.failed(error)
                self.drop_connections()
                if attempt == attempts:
                    raise
                logger.warning("%s %s: %r; retrying on a new connection", method, path, error)
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(  # noqa: PLR0913 - keyword-only request options, as request's
        self,
        method: str,
        path: str,
        *,
        body: Any,
        query: list[tuple[str, Any]] | None,
        content_type: str,
        read_seconds: float | None,
    ) -> dict[str, Any]:
        method, url, headers, serialized, _ = self.api_client.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
        )
        timeout = (self.timeouts.connect_seconds, read_seconds or self.timeouts.read_seconds)
        response = self.api_client.call_api(
            method, url, header_params=headers, body=serialized, _request_timeout=timeout
        )
        data: bytes = response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status < 300:
            error = kubernetes.client.ApiException(
                http_resp=response, body=data.decode(errors="replace"), data=None
            )
            if response.status == 401:
                self.outcome.failed(error)
            else:
                self.outcome.succeeded()
            raise error
        self.outcome.succeeded()
        result: dict[str, Any] = json.loads(data) if data else {}
        return result

    def ping(self, read_seconds: float | None = None) -> dict[str, Any]:
        """The API server's version: the cheapest authenticated call (a health check)."""
        return self.request("GET", "/version", read_seconds=read_seconds, attempts=1)


class Kube(ApiTransport):
    """Every call of the operator's passes: typed reads and idempotent writes."""

    # -- reads --

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", RESOURCES[constants.KIND].path(namespace, name))
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return None
            raise

    def get_node(self, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", RESOURCES["Node"].path(None, name))
        except kubernetes.client.ApiException as error:
            if error.status == 404:
                return None
            raise

    def list_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        path = RESOURCES["Pod"].path(namespace)
        result = self.request("GET", path, query=[("labelSelector", f"{constants.LABEL_JOB}={job}")])
        items: list[dict[str, Any]] = result.get("items") or []
        return items

    # -- writes --

    def patch_status(
        self, namespace: str, name: str, status: Mapping[str, Any], resource_version: str | None
    ) -> dict[str, Any]:
        """Replace status through the status subresource; ConflictError if the job changed since read.

        A merge patch whose metadata carries the resourceVersion is an optimistic update: two passes
        working from the same read cannot both count the same fault.
        """
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            return self.request(
                "PATCH",
                RESOURCES[constants.KIND].path(namespace, name, "status"),
                body=body,
                content_type="application/merge-patch+json",
            )
        except kubernetes.client.ApiException as error:
            if error.status == 409:
                raise ConflictError(f"{namespace}/{name} changed while being reconciled") from error
            raise

    def create(self, manifest: Mapping[str, Any]) -> bool:
        """Create an object; False when it already existed (which is success).

        RefusedError when the API server refuses it for good (invalid, forbidden by a quota or an
        admission policy); other errors (429, 5xx, connection) are raised as they are, to be retried.
        """
        kind = str(manifest["kind"])
        resource = RESOURCES[kind]
        namespace = manifest.get("metadata", {}).get("namespace")
        self._count(self.creates, kind)
        try:
            self.request("POST", resource.path(namespace), body=dict(manifest))
        except kubernetes.client.ApiException as error:
            if error.status == 409:
                return False
            if error.status in PERMANENT_CODES:
                raise RefusedError(refusal_from(manifest, error)) from error
            raise
        return True

    def delete(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        *,
        uid: str | None = None,
        grace_seconds: int | None = None,
    ) -> bool:
        """Delete an object (only if it still has `uid`, when given); False when it was already gone."""
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Background",
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        try:
            self.request("DELETE", RESOURCES[kind].path(namespace, name), body=body)
        except kubernetes.client.ApiException as error:
            # 409 on a uid precondition: a newer object of that name exists, which is not ours to delete.
            if error.status in (404, 409):
                return False
            raise
        return True

    def taint_node(self, node: str, key: str, value: str, effect: str, *, remove: bool = False) -> None:
        """Add or remove one taint, keeping the others (read-modify-write guarded by resourceVersion)."""
        path = RESOURCES["Node"].path(None, node)
        for _ in range(5):
            try:
                body = self.request("GET", path)
            except kubernetes.client.ApiException as error:
                if error.status == 404:
                    return
                raise
            taints: list[dict[str, Any]] = list(body.get("spec", {}).get("taints") or [])
            mine = [
                t
                for t in taints
                if t.get("key") == key and t.get("value") == value and t.get("effect") == effect
            ]
            if remove:
                if not mine:
                    return
                taints = [t for t in taints if t not in mine]
            else:
                if mine:
                    return
                taints.append({"key": key, "value": value, "effect": effect})
            patch = {
                "metadata": {"resourceVersion": body["metadata"]["resourceVersion"]},
                "spec": {"taints": taints},
            }
            try:
                self.request("PATCH", path, body=patch, content_type="application/merge-patch+json")
                return
            except kubernetes.client.ApiException as error:
                if error.status != 409:
                    raise
        raise ConflictError(f"node {node} kept changing while being tainted")

    def apply(self, action: Action, namespace: str) -> None:
        """Apply one of reconcile's actions idempotently."""
        if isinstance(action, CreateObject):
            self.create(action.manifest)
        elif isinstance(action, DeletePod):
            self.delete("Pod", namespace, action.name, uid=action.uid, grace_seconds=action.grace_seconds)
        elif isinstance(action, DeleteObject):
            self.delete(action.kind, action.namespace, action.name)
        elif isinstance(action, TaintNode):
            self.taint_node(action.node, action.key, action.value, action.effect, remove=action.remove)
        elif isinstance(action, DeleteJob):
            self.delete(constants.KIND, action.namespace, action.name, uid=action.uid)
        else:  # pragma: no cover - the Action union is closed
            raise TypeError(f"unknown action {action!r}")
