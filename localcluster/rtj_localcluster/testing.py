"""pytest fixtures for tests that need a Kubernetes API: the embedded local cluster by default.

Registered for the whole suite by ``tests/conftest.py``. Fixtures:

- ``local_cluster``: a fresh ``LocalCluster`` per test (2 ``p5.48xlarge`` nodes, node-monitor grace
  4 s, heartbeat 0.5 s), for tests that inject faults. Change its settings with the marker
  ``@pytest.mark.local_cluster(nodes=3, profile="cpu", node_monitor_grace_seconds=3)`` (any field
  of ``LocalClusterSettings``). Skipped, with the reason, when ``RTJ_TEST_KUBECONFIG`` is set. The
  cluster is started while the test before it runs, and stopped while the test after it runs
  (``cluster_pool``); a cluster serves one test only.
- ``shared_local_cluster``: one ``LocalCluster`` for the session, for tests that only use the API
  and the kubelet and leave the nodes alone. The modules with a test on it run first, and it stops
  after the last of them (``shared_cluster_modules_first``).
- ``kubeconfig``: the path of a kubeconfig: ``RTJ_TEST_KUBECONFIG`` when set (a real cluster), else
  the shared local cluster's.
- ``api``: a ``SyncKubeClient`` (the admin's) on the shared local cluster; ``namespace``: a fresh
  namespace on it, named after the test module, deleted after the test. A module overrides either
  by defining its own.

Helpers: ``wait_for`` (poll until a condition holds, generous timeouts for loaded machines),
``kubectl`` (run the control plane's own kubectl against a kubeconfig) and ``create_namespace`` (a
fresh namespace, ready for pods once its ``default`` ServiceAccount exists).
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Set
from pathlib import Path
from typing import Any, TypeVar

import pytest

from . import podnet
from .binaries import program
from .client import SyncKubeClient, path_for
from .cluster import LocalCluster, LocalClusterSettings
from .cluster_pool import ClusterPool

T = TypeVar("T")

REAL_CLUSTER_ENV = "RTJ_TEST_KUBECONFIG"
DEFAULT_TEST_SETTINGS: dict[str, Any] = {
    "nodes": 2,
    "node_monitor_grace_seconds": 4.0,
    "heartbeat_interval_seconds": 0.5,
}


_POOL = pytest.StashKey[ClusterPool[LocalCluster]]()
WARM_CLUSTERS_ENV = "RTJ_TEST_WARM_CLUSTERS"
"""How many tests ahead of the running one the pool looks for fault tests whose cluster it starts
early (default 1; 0: none).
Each warm cluster idles at about 0.14 of a core (its control plane) until its test takes it, so more
than one ahead took longer on 2 cores than the starts it hid."""


def warm_clusters() -> int:
    return int(os.environ.get(WARM_CLUSTERS_ENV, "1"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "local_cluster(**settings): LocalClusterSettings fields for the local_cluster fixture",
    )


def wait_for(
    condition: Callable[[], T | None],
    *,
    timeout: float = 60.0,
    interval: float = 0.1,
    message: str = "condition",
) -> T:
    """Poll ``condition`` until it returns something truthy (returned), or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {message} (last value: {last!r})")


def process_ended(pid: int) -> bool:
    """Whether process `pid` has ended (gone, or a zombie its parent has not reaped yet): a check that
    a process ending between two questions to /proc cannot fail."""
    import psutil

    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def wait_phase(
    api: SyncKubeClient, namespace: str, name: str, *phases: str, timeout: float = 90
) -> dict[str, Any]:
    """The pod ``namespace/name`` once its phase is one of ``phases``."""

    def check() -> dict[str, Any] | None:
        pod: dict[str, Any] | None = api.get_or_none(path_for("pods", namespace, name))
        return pod if pod and pod.get("status", {}).get("phase") in phases else None

    return wait_for(check, timeout=timeout, message=f"pod {name} in {phases}")


def kubectl(kubeconfig: str | os.PathLike[str], *args: str, check: bool = True, timeout: float = 120) -> str:
    """Run kubectl with ``kubeconfig``; returns stdout (stderr is in the error when it fails).
    The kubectl is the control plane's own, so client and server are of one version."""
    result = subprocess.run(
        [str(program("kubectl")), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result.stdout


def create_namespace(
    kubeconfig: str | os.PathLike[str], prefix: str = "test", labels: dict[str, str] | None = None
) -> str:
    """Create a namespace with a unique name and wait until pods can be created in it (the
    ServiceAccount admission plugin refuses them until the controller manager made ``default``)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    label_args = [f"{key}={value}" for key, value in (labels or {}).items()]
    kubectl(kubeconfig, "create", "namespace", name)
    if label_args:
        kubectl(kubeconfig, "label", "namespace", name, *label_args)
    wait_for(
        lambda: kubectl(
            kubeconfig, "get", "serviceaccount", "default", "-n", name, "-o", "name", check=False
        ),
        timeout=60,
        message=f"the default ServiceAccount of namespace {name}",
    )
    return name


def local_cluster_settings(item: pytest.Item) -> dict[str, Any]:
    """The settings of `item`'s ``local_cluster``: the defaults and its marker's."""
    marker = item.get_closest_marker("local_cluster")
    return {**DEFAULT_TEST_SETTINGS, **(marker.kwargs if marker else {})}


@pytest.fixture(scope="session")
def local_cluster_pool(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[ClusterPool[LocalCluster]]:
    pool = ClusterPool(
        lambda settings: LocalCluster(
            LocalClusterSettings(state_dir=tmp_path_factory.mktemp("cluster"), **settings)
        )
    )
    pytestconfig.stash[_POOL] = pool
    try:
        yield pool
    finally:
        del pytestconfig.stash[_POOL]
        pool.close()


@pytest.fixture
def local_cluster(
    request: pytest.FixtureRequest, local_cluster_pool: ClusterPool[LocalCluster]
) -> Iterator[LocalCluster]:
    if os.environ.get(REAL_CLUSTER_ENV):
        pytest.skip(
            f"needs the embedded local cluster for fault injection ({REAL_CLUSTER_ENV} names a real cluster)"
        )
    cluster = local_cluster_pool.take(local_cluster_settings(request.node))
    try:
        yield cluster
    finally:
        local_cluster_pool.give_back(cluster)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before `item` is set up, have clusters warming for the tests about to take one: `item` and
    the next `warm_clusters()` tests (nothing while no fault test has made the pool yet)."""
    pool = item.config.stash.get(_POOL, None)
    if pool is None or os.environ.get(REAL_CLUSTER_ENV):
        return
    upcoming = [i for i in _upcoming(item) if "local_cluster" in getattr(i, "fixturenames", ())]
    pool.want([local_cluster_settings(i) for i in upcoming])


def _upcoming(item: pytest.Item) -> list[pytest.Item]:
    """`item` and the tests after it, as far as this process runs them in the session's order (a
    pytest-xdist worker gets its tests one batch at a time: only `item` itself is known there)."""
    if hasattr(item.config, "workerinput"):
        return [item]
    items = item.session.items
    try:
        index = items.index(item)
    except ValueError:  # not one of the session's collected items
        return [item]
    return items[index : index + warm_clusters() + 1]


SHARED_CLUSTER_FIXTURES = frozenset({"shared_local_cluster", "kubeconfig", "api", "namespace"})
"""The fixtures through which a test may reach the shared cluster (``kubeconfig`` asks for it while
it runs, so a test's static fixture closure does not name it)."""
_SHARED = pytest.StashKey[LocalCluster]()
_LAST_SHARED_MODULE = pytest.StashKey[str]()


def uses_shared_cluster(item: pytest.Item) -> bool:
    return bool(SHARED_CLUSTER_FIXTURES.intersection(getattr(item, "fixturenames", ())))


def _module_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def shared_cluster_modules_first(items: list[pytest.Item]) -> tuple[list[pytest.Item], str | None]:
    """`items` with the modules that have a test on the shared cluster first, each module whole and
    in its order, and the last of those modules (None: no test uses the cluster). An idle control
    plane takes 0.03 of a core, and a lane's shared cluster otherwise idled through every test after
    its first user (20 minutes of demo and trainer tests)."""
    users = {_module_of(item) for item in items if uses_shared_cluster(item)}
    ordered = sorted(items, key=lambda item: _module_of(item) not in users)  # sorted() is stable
    last = next((_module_of(item) for item in reversed(ordered) if _module_of(item) in users), None)
    return ordered, last


@pytest.hookimpl(trylast=True)  # after `-m` and `-k` deselected theirs
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:], last = shared_cluster_modules_first(items)
    if last is not None:
        config.stash[_LAST_SHARED_MODULE] = last


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Stop the shared cluster once the last module with a test on it has been torn down (its
    module-scoped fixtures included): no later test can reach it."""
    try:
        yield
    finally:
        leaving = nextitem is None or _module_of(nextitem) != _module_of(item)
        cluster = shared_cluster_started(item.config)
        if (
            cluster is not None
            and leaving
            and _module_of(item) == item.config.stash.get(_LAST_SHARED_MODULE, None)
        ):
            cluster.stop()


def shared_cluster_started(config: pytest.Config) -> LocalCluster | None:
    """The shared cluster if this session started it and has not stopped it yet."""
    cluster = config.stash.get(_SHARED, None)
    return cluster if cluster is not None and cluster.control_plane is not None else None


@pytest.fixture(scope="session")
def shared_local_cluster(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[LocalCluster]:
    if os.environ.get(REAL_CLUSTER_ENV):
        pytest.skip(f"needs the embedded local cluster ({REAL_CLUSTER_ENV} names a real cluster)")
    cluster = LocalCluster(
        LocalClusterSettings(state_dir=tmp_path_factory.mktemp("shared-cluster"), **DEFAULT_TEST_SETTINGS)
    )
    pytestconfig.stash[_SHARED] = cluster
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()  # again if the last module on it stopped it: stop() is idempotent


@pytest.fixture
def kubeconfig(request: pytest.FixtureRequest) -> Path:
    real = os.environ.get(REAL_CLUSTER_ENV)
    if real:
        return Path(real)
    cluster: LocalCluster = request.getfixturevalue("shared_local_cluster")
    return cluster.kubeconfig_path


def require_podnet() -> Path:
    """The pod network library's path; skips where there is no C compiler, fails where it should build."""
    net = podnet.library()
    if net.path is None and shutil.which(os.environ.get("CC") or "cc") is None:
        pytest.skip(f"no pod network library: {net.reason}")
    assert net.path is not None, net.reason
    return net.path


@pytest.fixture
def api(shared_local_cluster: LocalCluster) -> Iterator[SyncKubeClient]:
    with SyncKubeClient(shared_local_cluster.kubeconfig_path) as client:
        yield client


@pytest.fixture
def namespace(
    request: pytest.FixtureRequest, shared_local_cluster: LocalCluster, api: SyncKubeClient
) -> Iterator[str]:
    prefix = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")[:30]
    name = create_namespace(shared_local_cluster.kubeconfig_path, prefix)
    yield name
    api.delete(path_for("namespaces", name=name))


def stop_process(process: subprocess.Popen[Any], grace_seconds: float = 30) -> None:
    """SIGTERM `process` and wait for it; SIGKILL it after `grace_seconds` (nothing if it ended)."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def parse_module(path: Path) -> ast.Module:
    """`path`'s syntax tree, for the layout tests. CPython 3.11 can fail a parse with "AST constructor
    recursion depth mismatch" when another thread changes the recursion limit during it (measured
    once in a full run, on a file that parses every other time): such a parse is tried once more."""
    source = path.read_text(encoding="utf-8")
    try:
        return ast.parse(source, str(path))
    except SystemError:
        return ast.parse(source, str(path))


MAX_FUNCTION_LINES = 80
MAX_CLASS_LINES = 250


def oversized(module: ast.Module, *, exempt: Callable[[ast.ClassDef], bool] | None = None) -> dict[str, int]:
    """Each function of `module` over MAX_FUNCTION_LINES and each class over MAX_CLASS_LINES (but for
    those `exempt` says), as "function <name>" or "class <name>" -> its lines; the layout tests of
    every package share the rule."""
    found: dict[str, int] = {}
    for node in ast.walk(module):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        lines = (node.end_lineno or node.lineno) - node.lineno + 1
        if isinstance(node, ast.ClassDef):
            if lines > MAX_CLASS_LINES and not (exempt and exempt(node)):
                found[f"class {node.name}"] = lines
        elif lines > MAX_FUNCTION_LINES:
            found[f"function {node.name}"] = lines
    return found


def assert_no_import_cycles(graph: Mapping[str, Set[str]]) -> None:
    """Fail with the cycle's path when a module of `graph` (module -> the modules it imports) imports
    itself through others; the layout tests of the operator and the trainer share it."""
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, "import cycle: " + " -> ".join((*path[path.index(name) :], name))
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, (*path, name))
        done.add(name)

    for name in sorted(graph):
        visit(name, ())
