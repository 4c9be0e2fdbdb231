"""kubectl 1.32 end to end against the embedded API server: apply (with kubectl's default
validation) of a CRD and a custom resource, get with printer columns, get -w, describe with events,
patch (merge, json, strategic), label, wait for a condition, logs, delete."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from rtj_localcluster.apiserver import ApiServer
from rtj_localcluster.testing import wait_for

pytestmark = pytest.mark.slow

CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd], categories: [toys]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    - {name: Color, type: string, jsonPath: .spec.color}
    - {name: Ready, type: string, jsonPath: '.status.conditions[?(@.type=="Ready")].status'}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer, minimum: 1, maximum: 10}
              color: {type: string, enum: [red, blue], default: red}
          status:
            type: object
            properties:
              conditions:
                type: array
                items:
                  type: object
                  properties:
                    type: {type: string}
                    status: {type: string}
                    reason: {type: string}
"""

WIDGET = """
apiVersion: example.com/v1
kind: Widget
metadata:
  name: w1
spec:
  size: 3
"""


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    server = ApiServer(tmp_path_factory.mktemp("api"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def api_client(api: ApiServer) -> Iterator[client.ApiClient]:
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(api.kubeconfig_path), client_configuration=configuration)
    with client.ApiClient(configuration) as c:
        yield c


@pytest.fixture(scope="module")
def kubectl(api: ApiServer) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["kubectl", f"--kubeconfig={api.kubeconfig_path}", *args],
            input=stdin,
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    return run


def _table(output: str) -> list[list[str]]:
    return [line.split() for line in output.strip().splitlines()]


@pytest.fixture(scope="module")
def widget(kubectl: Callable[..., subprocess.CompletedProcess[str]]) -> str:
    assert "created" in kubectl("apply", "-f", "-", stdin=CRD).stdout
    kubectl("wait", "--for=condition=Established", "crd/widgets.example.com", "--timeout=60s")
    assert "widget.example.com/w1 created" in kubectl("apply", "-f", "-", stdin=WIDGET).stdout
    return "w1"


def test_apply_is_idempotent_and_validated(
    kubectl: Callable[..., subprocess.CompletedProcess[str]], widget: str
) -> None:
    assert "unchanged" in kubectl("apply", "-f", "-", stdin=WIDGET).stdout
    # kubectl's default validation (strict, done by the server) rejects unknown fields...
    unknown = kubectl("apply", "-f", "-", stdin=WIDGET.replace("size: 3", "size: 3\n  bogus: 1"), check=False)
    assert unknown.returncode != 0 and 'unknown field "spec.bogus"' in unknown.stderr
    # ...and the schema rejects out-of-range values, naming the field.
    invalid = kubectl("apply", "-f", "-", stdin=WIDGET.replace("size: 3", "size: 11"), check=False)
    assert (
        invalid.returncode != 0
        and "spec.size" in invalid.stderr
        and "less than or equal to 10" in invalid.stderr
    )
    # Validation can be turned off on the client: the unknown field is then pruned.
    kubectl("apply", "--validate=false", "-f", "-", stdin=WIDGET.replace("size: 3", "size: 3\n  bogus: 1"))
    assert json.loads(kubectl("get", "widget", "w1", "-o", "json").stdout)["spec"] == {
        "size": 3,
        "color": "red",
    }


def test_get_shows_printer_columns(
    kubectl: Callable[..., subprocess.CompletedProcess[str]], widget: str
) -> None:
    rows = _table(kubectl("get", "widgets").stdout)
    assert rows[0] == ["NAME", "SIZE", "COLOR", "READY", "AGE"]
    assert rows[1][:3] == ["w1", "3", "red"]
    # Short names and categories resolve through discovery.
    assert _table(kubectl("get", "wd").stdout)[1][0] == "w1"
    assert "widget.example.com/w1" in kubectl("get", "toys", "-o", "name").stdout
    assert "w1" in kubectl("get", "widgets", "-A").stdout


def test_patch_label_and_get_watch(
    kubectl: Callable[..., subprocess.CompletedProcess[str]], api: ApiServer, widget: str
) -> None:
    lines: queue.Queue[str] = queue.Queue()
    with subprocess.Popen(
        ["kubectl", f"--kubeconfig={api.kubeconfig_path}", "get", "widgets", "-w"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as watcher:
        try:
            assert watcher.stdout is not None
            stdout = watcher.stdout
            threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
            first = lines.get(timeout=60)
            assert first.split()[:2] == ["NAME", "SIZE"]
            assert lines.get(timeout=60).split()[:2] == ["w1", "3"]

            kubectl("patch", "widget", "w1", "--type", "merge", "-p", '{"spec":{"size":5}}')
            wait_for(
                lambda: any(line.split()[:2] == ["w1", "5"] for line in _drain(lines)),
                message="line for size 5",
            )
            kubectl(
                "patch",
                "widget",
                "w1",
                "--type",
                "json",
                "-p",
                '[{"op":"replace","path":"/spec/color","value":"blue"}]',
            )
            wait_for(
                lambda: any(line.split()[1:3] == ["5", "blue"] for line in _drain(lines)),
                message="line for blue",
            )
        finally:
            watcher.terminate()
    obj = json.loads(kubectl("get", "widget", "w1", "-o", "json").stdout)
    assert obj["spec"] == {"size": 5, "color": "blue"}
    assert obj["metadata"]["generation"] == 3

    kubectl("label", "widget", "w1", "tier=gold")
    assert _table(kubectl("get", "widgets", "-l", "tier=gold").stdout)[1][0] == "w1"
    assert "No resources found" in kubectl("get", "widgets", "-l", "tier=silver").stderr
    kubectl("label", "widget", "w1", "tier-")
    assert "No resources found" in kubectl("get", "widgets", "-l", "tier").stderr


_seen: list[str] = []


def _drain(lines: queue.Queue[str]) -> list[str]:
    while True:
        try:
            _seen.append(lines.get_nowait())
        except queue.Empty:
            return _seen


def test_describe_shows_events(
    kubectl: Callable[..., subprocess.CompletedProcess[str]], api_client: client.ApiClient, widget: str
) -> None:
    obj = json.loads(kubectl("get", "widget", "w1", "-o", "json").stdout)
    client.CoreV1Api(api_client).create_namespaced_event(
        "default",
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name="w1."),
            involved_object=client.V1ObjectReference(
                api_version="example.com/v1",
                kind="Widget",
                name="w1",
                namespace="default",
                uid=obj["metadata"]["uid"],
            ),
            reason="WidgetPolished",
            message="the widget shines",
            type="Normal",
            source=client.V1EventSource(component="test"),
            first_timestamp=obj["metadata"]["creationTimestamp"],
            last_timestamp=obj["metadata"]["creationTimestamp"],
            count=1,
        ),
    )
    described = kubectl("describe", "widget", "w1").stdout
    assert "Name:         w1" in described
    assert "WidgetPolished" in described and "the widget shines" in described
    assert "WidgetPolished" in kubectl("get", "events").stdout


def test_wait_for_condition_set_through_status(
    kubectl: Callable[..., subprocess.CompletedProcess[str]],
    api: ApiServer,
    api_client: client.ApiClient,
    widget: str,
) -> None:
    with subprocess.Popen(
        [
            "kubectl",
            f"--kubeconfig={api.kubeconfig_path}",
            "wait",
            "--for=condition=Ready",
            "widget/w1",
            "--timeout=90s",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as waiter:
        try:
            time.sleep(1)  # let kubectl start watching; the outcome does not depend on it
            custom = client.CustomObjectsApi(api_client)
            custom.patch_namespaced_custom_object_status(
                "example.com",
                "v1",
                "default",
                "widgets",
                "w1",
                {
                    "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Polished"}]},
                    "spec": {"size": 9},
                },
            )
            out, err = waiter.communicate(timeout=120)
        finally:
            if waiter.poll() is None:
                waiter.kill()
    assert waiter.returncode == 0, err
    assert "condition met" in out
    # The status write ignored the spec change; the Ready column shows the condition.
    row = _table(kubectl("get", "widget", "w1").stdout)[1]
    assert row[1] == "5" and row[3] == "True"


def test_builtin_apply_strategic_patch_and_logs(
    kubectl: Callable[..., subprocess.CompletedProcess[str]], api: ApiServer
) -> None:
    pod = """
apiVersion: v1
kind: Pod
metadata: {name: logger, labels: {app: logger}}
spec:
  nodeName: node-a
  containers:
  - {name: main, image: "busybox:1", env: [{name: A, value: "1"}]}
  - {name: side, image: "busybox:1"}
"""
    kubectl("apply", "-f", "-", stdin=pod)
    kubectl("apply", "-f", "-", stdin=pod.replace('value: "1"', 'value: "2"'))
    kubectl("patch", "pod", "logger", "-p", '{"spec":{"containers":[{"name":"side","image":"busybox:2"}]}}')
    obj = json.loads(kubectl("get", "pod", "logger", "-o", "json").stdout)
    containers = {c["name"]: c for c in obj["spec"]["containers"]}
    assert containers["main"]["env"] == [{"name": "A", "value": "2"}]
    assert containers["side"]["image"] == "busybox:2"
    assert _table(kubectl("get", "pods").stdout)[0] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert _table(kubectl("get", "pod", "logger").stdout)[1][:3] == ["logger", "0/2", "Pending"]

    directory = Path(api.log_root) / "pods" / f"default_logger_{obj['metadata']['uid']}"
    directory.mkdir(parents=True)
    (directory / "main.log").write_text("hello from main\n")
    (directory / "side.log").write_text("hello from side\n")
    assert kubectl("logs", "logger", "-c", "main").stdout == "hello from main\n"
    assert kubectl("logs", "pod/logger", "-c", "side").stdout == "hello from side\n"
    # Without -c kubectl defaults to the first container.
    assert kubectl("logs", "logger").stdout == "hello from main\n"
    wide = _table(kubectl("get", "pod", "logger", "-o", "wide").stdout)
    assert (
        wide[0][:7] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"] and wide[1][6] == "node-a"
    )

    # logs -f streams what the kubelet appends and ends when the container has terminated.
    lines: queue.Queue[str] = queue.Queue()
    with subprocess.Popen(
        ["kubectl", f"--kubeconfig={api.kubeconfig_path}", "logs", "-f", "logger", "-c", "side"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as follower:
        try:
            assert follower.stdout is not None
            stdout = follower.stdout
            threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()

            def next_line() -> str:
                try:
                    return lines.get(timeout=60)
                except queue.Empty:
                    follower.kill()
                    assert follower.stderr is not None
                    raise AssertionError(
                        f"no log line from kubectl logs -f: {follower.stderr.read()}"
                    ) from None

            assert next_line() == "hello from side\n"
            with (directory / "side.log").open("a") as log:
                log.write("appended later\n")
            assert next_line() == "appended later\n"
            terminated = {"terminated": {"exitCode": 0, "reason": "Completed"}}
            status = {
                "phase": "Succeeded",
                "containerStatuses": [
                    {
                        "name": n,
                        "ready": False,
                        "restartCount": 0,
                        "image": "busybox:1",
                        "imageID": "",
                        "state": terminated,
                    }
                    for n in ("main", "side")
                ],
            }
            kubectl(
                "patch",
                "pod",
                "logger",
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps({"status": status}),
            )
            assert follower.wait(60) == 0
        finally:
            if follower.poll() is None:
                follower.kill()
    assert _table(kubectl("get", "pod", "logger").stdout)[1][2] == "Completed"
    kubectl("delete", "pod", "logger", "--grace-period=0", "--force")


def test_kubectl_create_sends_protobuf(kubectl: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    # `kubectl create <kind>` uses typed clients that encode request bodies as protobuf.
    kubectl("create", "namespace", "made-by-create")
    kubectl("create", "serviceaccount", "bot", "-n", "made-by-create")
    kubectl("create", "configmap", "settings", "--from-literal=mode=fast", "-n", "made-by-create")
    kubectl("create", "secret", "generic", "token", "--from-literal=key=s3cr3t", "-n", "made-by-create")
    cm = json.loads(kubectl("get", "configmap", "settings", "-n", "made-by-create", "-o", "json").stdout)
    assert cm["data"] == {"mode": "fast"}
    secret = json.loads(kubectl("get", "secret", "token", "-n", "made-by-create", "-o", "json").stdout)
    assert secret["type"] == "Opaque" and secret["data"] == {"key": "czNjcjN0"}
    kubectl("get", "serviceaccount", "bot", "-n", "made-by-create")
    kubectl("delete", "namespace", "made-by-create")
    assert kubectl("get", "namespace", "made-by-create", check=False).returncode != 0


def test_server_side_apply(kubectl: Callable[..., subprocess.CompletedProcess[str]], widget: str) -> None:
    manifest = WIDGET.replace("name: w1", "name: w-ssa").replace("size: 3", "size: 2\n  color: blue")
    assert "serverside-applied" in kubectl("apply", "--server-side", "-f", "-", stdin=manifest).stdout
    # Dropping a field from the applied configuration removes it (the schema default comes back).
    kubectl("apply", "--server-side", "-f", "-", stdin=manifest.replace("\n  color: blue", ""))
    obj = json.loads(kubectl("get", "widget", "w-ssa", "-o", "json").stdout)
    assert obj["spec"] == {"size": 2, "color": "red"}
    kubectl("delete", "widget", "w-ssa")


def test_delete(kubectl: Callable[..., subprocess.CompletedProcess[str]], widget: str) -> None:
    assert 'widget.example.com "w1" deleted' in kubectl("delete", "widget", "w1").stdout
    missing = kubectl("get", "widget", "w1", check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr
    kubectl("delete", "crd", "widgets.example.com")
    gone = kubectl("get", "widgets", check=False)
    assert gone.returncode != 0
