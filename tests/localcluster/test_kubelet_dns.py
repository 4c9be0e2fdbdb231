"""Cluster DNS for pods: the hosts records (pure) and the sitecustomize hook in a real interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from rtj_localcluster.dns import hosts_records, render_hosts
from rtj_localcluster.kubelet import SITE_DIR


def make_pod(name: str, ip: str, *, ready: bool, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "labels": labels},
        "spec": spec,
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def service(name: str, *, headless: bool, publish_not_ready: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": {"job": "j"}, "publishNotReadyAddresses": publish_not_ready}
    if headless:
        spec["clusterIP"] = "None"
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": spec}


def test_records_for_headless_service_and_pod_hostnames() -> None:
    pods = [
        make_pod(
            "j-worker-0", "127.0.1.1", ready=False, labels={"job": "j"}, hostname="j-worker-0", subdomain="j"
        ),
        make_pod(
            "j-worker-1", "127.0.1.2", ready=True, labels={"job": "j"}, hostname="j-worker-1", subdomain="j"
        ),
        make_pod("other", "127.0.1.3", ready=True, labels={"job": "k"}),
    ]
    records = hosts_records(pods, [service("j", headless=True, publish_not_ready=True)])
    assert records["j-worker-0.j.ns.svc"] == ["127.0.1.1"]
    assert records["j-worker-0.j.ns.svc.cluster.local"] == ["127.0.1.1"]
    assert records["j.ns.svc"] == ["127.0.1.1", "127.0.1.2"]
    # Without publishNotReadyAddresses only Ready pods get records.
    strict = hosts_records(pods, [service("j", headless=True, publish_not_ready=False)])
    assert "j-worker-0.j.ns.svc" not in strict
    assert strict["j.ns.svc"] == ["127.0.1.2"]
    # A subdomain without a matching headless Service gives no pod record.
    assert "j-worker-1.j.ns.svc" not in hosts_records(
        pods, [service("j", headless=False, publish_not_ready=True)]
    )
    finished = make_pod("done", "127.0.1.9", ready=True, labels={"job": "j"})
    finished["status"]["phase"] = "Succeeded"
    assert "127.0.1.9" not in hosts_records(
        [finished], [service("j", headless=True, publish_not_ready=True)]
    ).get("j.ns.svc", [])


PROBE = """
import json, socket
out = {
    "full": socket.gethostbyname("j-worker-0.j.ns.svc"),
    "short": socket.gethostbyname("j-worker-0.j"),
    "ex": socket.gethostbyname_ex("j.ns.svc.cluster.local")[2],
    "gai": sorted({a[4][0] for a in socket.getaddrinfo("j.ns.svc", 29500, type=socket.SOCK_STREAM)}),
    "gai_port": socket.getaddrinfo("j.ns.svc", "29500", socket.AF_INET, socket.SOCK_STREAM)[0][4][1],
    "localhost": socket.gethostbyname("localhost"),
}
try:
    socket.gethostbyname("missing.ns.svc")
    out["missing"] = "resolved"
except OSError:
    out["missing"] = "error"
# The cluster rewrites the file as pods come and go: a later lookup sees the new address.
import os, time
time.sleep(0.05)
with open(os.environ["RTJ_LOCAL_HOSTS_FILE"], "w") as handle:
    handle.write("127.0.3.3 j-worker-0.j.ns.svc\\n")
out["updated"] = socket.gethostbyname("j-worker-0.j.ns.svc")
print(json.dumps(out))
"""


def test_sitecustomize_answers_from_the_hosts_file_and_follows_updates(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(
        render_hosts(
            {
                "j-worker-0.j.ns.svc.cluster.local": ["127.0.1.1"],
                "j-worker-0.j.ns.svc": ["127.0.1.1"],
                "j.ns.svc": ["127.0.1.1", "127.0.1.2"],
                "j.ns.svc.cluster.local": ["127.0.1.1", "127.0.1.2"],
            }
        )
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SITE_DIR), os.environ.get("PYTHONPATH")])),
        "RTJ_LOCAL_HOSTS_FILE": str(hosts),
        "RTJ_LOCAL_POD_NAMESPACE": "ns",
    }
    result = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out == {
        "full": "127.0.1.1",
        "short": "127.0.1.1",
        "ex": ["127.0.1.1", "127.0.1.2"],
        "gai": ["127.0.1.1", "127.0.1.2"],
        "gai_port": 29500,
        "localhost": "127.0.0.1",
        "missing": "error",
        "updated": "127.0.3.3",
    }
