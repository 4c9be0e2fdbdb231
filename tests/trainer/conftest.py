"""The NVRx release the trainer tests run against.

`make test` runs tests/trainer twice: on the NVRx 0.4.1 installed in .venv, and on 0.7.0 (the
trainer image's) found first on PYTHONPATH (scripts/install-nvrx-0.7.0.sh), with
RTJ_TEST_NVRX_VERSION=0.7.0 naming the release that run expects. Every process the tests start
(ft_launcher, its workers, the checkpoint writers) inherits the path.
"""

from __future__ import annotations

import os
from importlib import metadata

import pytest

EXPECTED_NVRX_ENV = "RTJ_TEST_NVRX_VERSION"


def _installed() -> str:
    return metadata.version("nvidia-resiliency-ext")


def pytest_report_header() -> str:
    import nvidia_resiliency_ext

    # 0.4.1's top level is a namespace package (no __file__); both have a __path__.
    return f"nvidia-resiliency-ext: {_installed()} ({', '.join(nvidia_resiliency_ext.__path__)})"


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
