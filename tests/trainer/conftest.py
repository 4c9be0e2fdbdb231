"""The NVRx release the trainer tests run against.

`make test` runs tests/trainer twice: on the NVRx 0.4.1 installed in .venv, and on 0.7.0 (the
trainer image's) found first on PYTHONPATH (scripts/install-nvrx-0.7.0.sh), with
RTJ_TEST_NVRX_VERSION=0.7.0 naming the release that run expects. Every process the tests start
(ft_launcher, its workers, the checkpoint writers) inherits the path. Tests marked
`nvrx_independent` (torch and gloo only) run once, on 0.4.1: NVRx is barred from them. Tests marked
`image_nvrx_only` run once too, on 0.7.0 (the image's release): a test of the local cluster, whose
pods run .venv's 0.4.1, already runs the same path end to end on 0.4.1, or the path exists from 0.7
on (standby spares; 0.4.1's refusal has a test of its own).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

EXPECTED_NVRX_ENV = "RTJ_TEST_NVRX_VERSION"
# The trainer image's Dockerfile, whose NVRx release the `image_nvrx_only` tests run on alone.
IMAGE_DOCKERFILE = Path(__file__).resolve().parents[2] / "trainer_image" / "Dockerfile"


def _image_nvrx() -> str:
    found = re.search(r"^ARG NVRX_VERSION=(\S+)$", IMAGE_DOCKERFILE.read_text(), re.MULTILINE)
    assert found, f"{IMAGE_DOCKERFILE} names no NVRX_VERSION"
    return found.group(1)


def _installed() -> str:
    return metadata.version("nvidia-resiliency-ext")


def pytest_report_header() -> str:
    import nvidia_resiliency_ext

    # 0.4.1's top level is a namespace package (no __file__); both have a __path__.
    return f"nvidia-resiliency-ext: {_installed()} ({', '.join(nvidia_resiliency_ext.__path__)})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselects the `image_nvrx_only` tests unless the image's release is the one imported."""
    if _installed() == _image_nvrx():
        return
    deselected = [item for item in items if item.get_closest_marker("image_nvrx_only") is not None]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item.get_closest_marker("image_nvrx_only") is None]


@pytest.fixture(scope="session", autouse=True)
def expected_nvrx_release() -> str:
    """Fails every test when the release imported is not the one this run expects."""
    expected = os.environ.get(EXPECTED_NVRX_ENV)
    if expected and _installed() != expected:
        # A wrong path would silently test the other release twice.
        pytest.fail(
            f"{EXPECTED_NVRX_ENV}={expected}, but NVRx {_installed()} is imported:"
            " is its directory on PYTHONPATH?"
        )
    return _installed()


NVRX = "nvidia_resiliency_ext"


@pytest.fixture(autouse=True)
def nvrx_barred_where_independent(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """A test marked `nvrx_independent` runs once, not again on 0.7.0: it must load nothing of NVRx.
    The processes it starts find a stand-in first on their path whose import fails, and it fails
    itself when NVRx modules were loaded into this process while it ran."""
    if request.node.get_closest_marker("nvrx_independent") is None:
        yield
        return
    barrier = tmp_path_factory.mktemp("no-nvrx")
    (barrier / NVRX).mkdir()
    (barrier / NVRX / "__init__.py").write_text(
        f"raise ImportError('{request.node.nodeid} is marked nvrx_independent, yet it imports NVRx')\n"
    )
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(barrier), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.syspath_prepend(str(barrier))  # multiprocessing's spawned children take this path
    before = {name for name in sys.modules if name.startswith(NVRX)}
    yield
    loaded = sorted(name for name in sys.modules if name.startswith(NVRX) and name not in before)
    assert not loaded, f"marked nvrx_independent, yet it loaded {loaded}"
