"""The shared local cluster's modules run first and the cluster stops after the last of them, in a
real inner pytest session with a real control plane."""

from __future__ import annotations

import textwrap

import pytest
from rtj_localcluster.binaries import cache_dir

CACHE_DIR = cache_dir()  # read before pytester gives the inner session a HOME of its own
INNER_CONFTEST = 'pytest_plugins = ["rtj_localcluster.testing"]\n'

# What every inner module can ask: is the shared cluster's API server answering now?
INNER_HELPERS = """
import socket
from pathlib import Path
from urllib.parse import urlsplit

from rtj_localcluster.testing import shared_cluster_started

URL_FILE = Path(__file__).parent / "url.txt"


def api_answers() -> bool:
    url = urlsplit(URL_FILE.read_text())
    try:
        socket.create_connection((url.hostname, url.port), timeout=2).close()
    except OSError:
        return False
    return True
"""


def _user_module(first: bool) -> str:
    remember = "URL_FILE.write_text(shared_local_cluster.url)" if first else ""
    return textwrap.dedent(
        f"""
        from helpers import URL_FILE, api_answers, shared_cluster_started

        def test_on_the_shared_cluster(request, shared_local_cluster, kubeconfig):
            {remember}
            assert kubeconfig.exists() and api_answers()
            assert shared_cluster_started(request.config) is shared_local_cluster
        """
    )


PLAIN_MODULE = """
from helpers import api_answers, shared_cluster_started

def test_without_a_cluster(request):
    assert shared_cluster_started(request.config) is None
    assert not api_answers()
"""


@pytest.mark.slow
def test_modules_on_the_shared_cluster_run_first_and_it_stops_after_the_last(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RTJ_CACHE_DIR", str(CACHE_DIR))
    pytester.makeconftest(INNER_CONFTEST)
    pytester.makepyfile(helpers=INNER_HELPERS)
    pytester.makepyfile(
        test_a_plain=PLAIN_MODULE,
        test_b_user=_user_module(first=True),
        test_c_plain=PLAIN_MODULE,
        test_d_user=_user_module(first=False),
    )
    result = pytester.runpytest_subprocess("-v", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)
    ran = [line.split("::")[0] for line in result.outlines if "::test_" in line and "PASSED" in line]
    assert ran == ["test_b_user.py", "test_d_user.py", "test_a_plain.py", "test_c_plain.py"]
