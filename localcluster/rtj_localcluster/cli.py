"""`rtj local ...`: run the embedded cluster as a background daemon and inject faults into it.

``up`` starts a daemon process (``python -m rtj_localcluster.cli _daemon``) that runs a
``LocalCluster`` and serves a control channel: a TCP port on 127.0.0.1 that takes one JSON request
per connection and needs the secret from ``<state>/daemon.json`` (written mode 0600, with the
daemon's pid and the kubeconfig path). ``node kill|partition|heal|delete|add`` and ``pod kill`` go
through that channel, because only the daemon holds the kubelets and their processes. ``status``
reads the API server like any client. ``down`` asks the daemon to stop (SIGTERM as a fallback).

State directory: ``--state-dir``, else ``$RTJ_LOCAL_DIR``, else ``~/.rtj/local``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .client import SyncKubeClient, path_for

DAEMON_FILE = "daemon.json"


def default_state_dir() -> Path:
    return Path(os.environ.get("RTJ_LOCAL_DIR") or Path.home() / ".rtj" / "local")


def _read_daemon(state_dir: Path) -> dict[str, Any] | None:
    try:
        info: dict[str, Any] = json.loads((state_dir / DAEMON_FILE).read_text())
    except (OSError, ValueError):
        return None
    return info if _alive(int(info.get("pid", 0))) else None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child (our own, not yet reaped) counts as gone.
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True


def _control(state_dir: Path, request: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    info = _read_daemon(state_dir)
    if info is None:
        raise SystemExit(f"rtj local: no cluster running in {state_dir} (start one with `rtj local up`)")
    with socket.create_connection(("127.0.0.1", int(info["port"])), timeout=timeout) as conn:
        conn.sendall(json.dumps({**request, "secret": info["secret"]}).encode() + b"\n")
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    reply: dict[str, Any] = json.loads(data or b"{}")
    return reply


# ---------------------------------------------------------------------------------------------
# The daemon
# ---------------------------------------------------------------------------------------------


class _ControlHandler(socketserver.StreamRequestHandler):
    server: _ControlServer

    def handle(self) -> None:
        try:
            request = json.loads(self.rfile.readline())
            if not secrets.compare_digest(str(request.get("secret", "")), self.server.secret):
                reply: dict[str, Any] = {"ok": False, "error": "bad secret"}
            else:
                reply = {"ok": True, "result": self.server.dispatch(request)}
        except Exception as error:
            reply = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        self.wfile.write(json.dumps(reply).encode() + b"\n")


class _ControlServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, cluster: Any) -> None:
        super().__init__(("127.0.0.1", 0), _ControlHandler)
        self.cluster = cluster
        self.secret = secrets.token_hex(16)

    def dispatch(self, request: dict[str, Any]) -> Any:
        op = request.get("op")
        cluster = self.cluster
        if op == "ping":
            return "pong"
        if op == "shutdown":
            threading.Thread(target=self.shutdown, daemon=True).start()
            return "stopping"
        if op == "node":
            action, name = request["action"], request.get("name")
            if action == "add":
                return cluster.add_node(name, profile=request.get("profile"))
            handlers = {
                "kill": cluster.kill_node,
                "partition": cluster.partition_node,
                "heal": cluster.heal_node,
                "notready": cluster.make_node_not_ready,
                "delete": cluster.delete_node,
            }
            handlers[action](name)
            return name
        if op == "kill-container":
            return cluster.kill_container(request["namespace"], request["pod"], request.get("container"))
        raise ValueError(f"unknown operation {op!r}")


def _daemon(args: argparse.Namespace) -> int:
    from .cluster import LocalCluster, LocalClusterSettings

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    state_dir = Path(args.state_dir)
    settings = LocalClusterSettings(
        state_dir=state_dir,
        nodes=args.nodes,
        profile=args.profile,
        node_monitor_grace_seconds=args.grace_seconds,
        heartbeat_interval_seconds=args.heartbeat_seconds,
        gpu_taint=args.gpu_taint,
        api_port=args.port,
    )
    cluster = LocalCluster(settings)
    cluster.start()
    server = _ControlServer(cluster)
    info = {
        "pid": os.getpid(),
        "port": server.server_address[1],
        "secret": server.secret,
        "kubeconfig": str(cluster.kubeconfig_path),
        "url": cluster.url,
        "startSeconds": cluster.start_seconds,
        "clusterId": cluster.cluster_id,
    }
    target = state_dir / DAEMON_FILE
    temporary = state_dir / f".{DAEMON_FILE}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(info, handle)
    os.replace(temporary, target)

    def terminate(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        cluster.stop()
        with contextlib.suppress(OSError):
            target.unlink()
    return 0


# ---------------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------------


def _up(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir)
    running = _read_daemon(state_dir)
    if running is not None:
        print(f"a local cluster is already running (pid {running['pid']})")
        _print_usage_hint(running["kubeconfig"])
        return 0
    state_dir.mkdir(parents=True, exist_ok=True)
    # Each `up` starts a fresh cluster unless --keep-state: then etcd's data, the credentials and
    # the volumes stay, and the kubelets start the pods bound to them again (like rebooted nodes).
    stale_paths = ["pods", "hosts", DAEMON_FILE]
    if not args.keep_state:
        stale_paths += ["control-plane", "volumes"]
    for stale in stale_paths:
        path = state_dir / stale
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()
    command = [
        sys.executable,
        "-m",
        "rtj_localcluster.cli",
        "_daemon",
        f"--state-dir={state_dir}",
        f"--nodes={args.nodes}",
        f"--profile={args.profile}",
        f"--grace-seconds={args.grace_seconds}",
        f"--heartbeat-seconds={args.heartbeat_seconds}",
        f"--port={args.port}",
    ]
    if args.gpu_taint:
        command.append("--gpu-taint")
    started = time.monotonic()
    with (state_dir / "daemon.log").open("ab") as log_file:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = started + args.timeout
    while time.monotonic() < deadline:
        info = _read_daemon(state_dir)
        if info is not None and int(info["pid"]) == process.pid:
            print(
                f"local cluster up in {time.monotonic() - started:.1f}s: {args.nodes} {args.profile} node(s)"
            )
            _print_usage_hint(info["kubeconfig"])
            return 0
        if process.poll() is not None:
            print(
                f"rtj local: the cluster daemon exited ({process.returncode}); "
                f"see {state_dir / 'daemon.log'}",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.2)
    process.terminate()
    print(
        f"rtj local: the cluster was not ready after {args.timeout:g}s; see {state_dir / 'daemon.log'}",
        file=sys.stderr,
    )
    return 1


def _print_usage_hint(kubeconfig: str) -> None:
    print(f"kubeconfig: {kubeconfig}")
    print(f"use it with:  export KUBECONFIG={kubeconfig}")
    print("then e.g.:    kubectl get nodes")


def _down(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir)
    info = _read_daemon(state_dir)
    if info is None:
        print("no local cluster is running")
        return 0
    pid = int(info["pid"])
    with contextlib.suppress(OSError, ValueError, SystemExit):
        _control(state_dir, {"op": "shutdown"}, timeout=10)
    deadline = time.monotonic() + args.timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)
        end = time.monotonic() + 15
        while _alive(pid) and time.monotonic() < end:
            time.sleep(0.2)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    # A daemon that did not stop cleanly leaves its pods' processes behind: they carry its mark.
    from .cluster import kill_cluster_processes

    kill_cluster_processes(str(info.get("clusterId", "")))
    with contextlib.suppress(OSError):
        (state_dir / DAEMON_FILE).unlink()
    print("local cluster stopped")
    return 0


def _ready(node: dict[str, Any]) -> str:
    for item in node.get("status", {}).get("conditions") or []:
        if item.get("type") == "Ready":
            return {"True": "Ready", "False": "NotReady", "Unknown": "Unknown"}.get(item.get("status"), "?")
    return "?"


def _status(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir)
    info = _read_daemon(state_dir)
    if info is None:
        print(f"no local cluster is running in {state_dir}")
        return 1
    print(f"local cluster (pid {info['pid']}) at {info['url']}")
    print(f"kubeconfig: {info['kubeconfig']}")
    with SyncKubeClient(info["kubeconfig"]) as client:
        nodes = client.get(path_for("nodes"))["items"]
        pods = client.get(path_for("pods"))["items"]
    print(f"\n{'NODE':<20} {'STATUS':<10} {'INSTANCE-TYPE':<16} TAINTS")
    for node in sorted(nodes, key=lambda n: n["metadata"]["name"]):
        taints = (
            ",".join(f"{t['key']}:{t['effect']}" for t in node.get("spec", {}).get("taints") or []) or "-"
        )
        instance = node["metadata"].get("labels", {}).get("node.kubernetes.io/instance-type", "")
        print(f"{node['metadata']['name']:<20} {_ready(node):<10} {instance:<16} {taints}")
    print(f"\n{'POD':<40} {'PHASE':<12} {'NODE':<20} IP")
    for pod in sorted(pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"])):
        phase = pod.get("status", {}).get("phase", "")
        if pod["metadata"].get("deletionTimestamp"):
            phase = "Terminating"
        name = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        node_name = pod.get("spec", {}).get("nodeName") or "-"
        print(f"{name:<40} {phase:<12} {node_name:<20} {pod.get('status', {}).get('podIP', '-')}")
    return 0


def _node(args: argparse.Namespace) -> int:
    request = {"op": "node", "action": args.action, "name": args.name, "profile": args.profile}
    reply = _control(Path(args.state_dir), request)
    if not reply.get("ok"):
        print(f"rtj local: {reply.get('error')}", file=sys.stderr)
        return 1
    print(f"node {reply['result']}: {args.action}")
    return 0


def _pod_kill(args: argparse.Namespace) -> int:
    namespace, _, name = args.pod.rpartition("/")
    request = {
        "op": "kill-container",
        "namespace": namespace or "default",
        "pod": name,
        "container": args.container,
    }
    reply = _control(Path(args.state_dir), request)
    if not reply.get("ok"):
        print(f"rtj local: {reply.get('error')}", file=sys.stderr)
        return 1
    print(f"killed {reply['result']} process(es) of {namespace or 'default'}/{name}")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rtj local", description="Run and control the embedded local cluster."
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state-dir", default=str(default_state_dir()), help="default: $RTJ_LOCAL_DIR or ~/.rtj/local"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="{up,down,status,node,pod}")

    def cluster_options(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--nodes", type=int, default=2, help="simulated nodes (default 2)")
        sub.add_argument("--profile", default="p5.48xlarge", choices=["p5.48xlarge", "cpu"])
        sub.add_argument(
            "--grace-seconds", type=float, default=40.0, help="node-monitor grace period (default 40)"
        )
        sub.add_argument(
            "--heartbeat-seconds", type=float, default=1.0, help="lease renewal interval (default 1)"
        )
        sub.add_argument(
            "--gpu-taint", action="store_true", help="taint nodes nvidia.com/gpu=present:NoSchedule"
        )
        sub.add_argument("--port", type=int, default=0, help="API server port (default: any free port)")

    up = commands.add_parser(
        "up", parents=[common], help="start the cluster in the background and print its kubeconfig"
    )
    cluster_options(up)
    up.add_argument(
        "--timeout", type=float, default=180.0, help="seconds to wait for the cluster to be ready"
    )
    up.add_argument(
        "--keep-state",
        action="store_true",
        help="keep the previous cluster's objects, credentials and volumes (default: start afresh)",
    )
    up.set_defaults(func=_up)
    down = commands.add_parser("down", parents=[common], help="stop the cluster and every process it started")
    down.add_argument("--timeout", type=float, default=60.0)
    down.set_defaults(func=_down)
    commands.add_parser("status", parents=[common], help="nodes and pods").set_defaults(func=_status)
    node = commands.add_parser(
        "node", parents=[common], help="node faults: kill, partition, notready, heal, delete, add"
    )
    node.add_argument("action", choices=["kill", "partition", "notready", "heal", "delete", "add"])
    node.add_argument("name", nargs="?", help="node name (optional for add)")
    node.add_argument("--profile", default=None, help="profile of an added node")
    node.set_defaults(func=_node)
    pod = commands.add_parser(
        "pod", parents=[common], help="pod faults: kill NAMESPACE/POD [--container NAME]"
    )
    pod.add_argument("action", choices=["kill"])
    pod.add_argument("pod", help="NAMESPACE/POD (namespace defaults to default)")
    pod.add_argument("--container", default=None)
    pod.set_defaults(func=_pod_kill)
    daemon = commands.add_parser("_daemon", parents=[common])
    cluster_options(daemon)
    daemon.set_defaults(func=_daemon)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "node" and args.action != "add" and not args.name:
        print("rtj local node: a node name is required", file=sys.stderr)
        return 2
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
