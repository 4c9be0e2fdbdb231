"""Reading the trainers' progress endpoints (`runtime.scrape`), against real HTTP servers on loopback:
which pods are read, change detection, what a failed, oversized, malformed or slow endpoint does (the
previous report stays; the read is bounded by its timeout), and the reports handed to a pass."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from rtj_contract import env as env_names
from rtj_operator import constants, names
from rtj_operator.runtime.scrape import ProgressScraper, ScrapeSettings, targets

KEY = ("ns", "job")


class Endpoint:
    """A progress endpoint whose answer the test sets: (status, body, delay seconds)."""

    def __init__(self) -> None:
        self.answer: tuple[int, bytes, float] = (404, b"", 0.0)
        self.requests = 0
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                endpoint.requests += 1
                status, body, delay = endpoint.answer
                time.sleep(delay)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the reader gave up (the slow answer)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def report(self, step: int) -> None:
        self.answer = (200, json.dumps({"v": 1, "step": step}).encode(), 0.0)


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    served = Endpoint()
    yield served
    served.server.shutdown()
    served.server.server_close()


def pod(
    uid: str, port: int, *, role: str = "worker", phase: str = "Running", ip: str = "127.0.0.1"
) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "labels": {constants.LABEL_ROLE: role}},
        "spec": {"containers": [{"ports": [{"name": names.PROGRESS_PORT_NAME, "containerPort": port}]}]},
        "status": {"phase": phase, "podIP": ip},
    }


def test_only_running_reporting_pods_with_an_ip_are_read() -> None:
    reserve = pod("reserve", 9410, role="spare")  # Supervisor: a trainer pod with reserve ranks
    reserve["spec"]["containers"][0]["env"] = [
        {"name": env_names.LAUNCH_MODE, "value": env_names.LAUNCH_MODE_SUPERVISOR}
    ]
    standby = pod("standby", 9410, role="spare")  # rendezvous.spares Standby: in the rendezvous
    standby["spec"]["containers"][0]["env"] = [
        {"name": env_names.NNODES, "value": "2"},
        {"name": env_names.NNODES_MAX, "value": "3"},
    ]
    holding = pod("idle-spare", 9410, role="spare")  # ft_launcher's spares that only hold a node
    holding["spec"]["containers"][0]["env"] = [
        {"name": env_names.NNODES, "value": "2"},
        {"name": env_names.NNODES_MAX, "value": "2"},
    ]
    found = targets(
        [
            pod("a", 9410),
            holding,
            reserve,
            standby,
            pod("store", 9410, role="store"),
            pod("pending", 9410, phase="Pending"),
            pod("no-ip", 9410, ip=""),
            pod("v6", 9411, ip="fd00::1"),
        ]
    )
    assert [(t.uid, t.url) for t in found] == [
        ("a", "http://127.0.0.1:9410/progress"),
        ("reserve", "http://127.0.0.1:9410/progress"),
        ("standby", "http://127.0.0.1:9410/progress"),
        ("v6", "http://[fd00::1]:9411/progress"),
    ]


def test_changes_are_noticed_and_failures_keep_the_previous_report(endpoint: Endpoint) -> None:
    scraper = ProgressScraper(ScrapeSettings(timeout_seconds=0.5, max_bytes=1024))
    pods = [pod("a", endpoint.port)]

    def scrape() -> bool:
        return asyncio.run(scraper.scrape_job(KEY, pods))

    assert scrape() is False and scraper.reports(KEY) == {}  # 404: no report yet
    endpoint.report(7)
    assert scrape() is True and scraper.reports(KEY)["a"].step == 7
    assert scrape() is False  # the same report: no pass needed
    for answer in [
        (500, b"oops", 0.0),
        (200, b"not json", 0.0),
        (200, b"x" * 2048, 0.0),  # over max_bytes
        (200, json.dumps({"v": 1, "step": 9}).encode(), 2.0),  # slower than the timeout
    ]:
        endpoint.answer = answer
        started = time.monotonic()
        assert scrape() is False and scraper.reports(KEY)["a"].step == 7
        assert time.monotonic() - started < 1.9  # bounded by the timeout, not the slow pod
    endpoint.report(8)
    assert scrape() is True and scraper.reports(KEY)["a"].step == 8
    # A pod that is gone takes its report with it.
    assert asyncio.run(scraper.scrape_job(KEY, [])) is False and scraper.reports(KEY) == {}


def test_unreachable_pods_cost_one_bounded_round(endpoint: Endpoint) -> None:
    endpoint.report(1)
    # 40 pods that refuse connections and one that answers, 8 reads at a time.
    pods = [pod(f"gone-{i}", 1, ip="127.0.0.1") for i in range(40)] + [pod("a", endpoint.port)]
    scraper = ProgressScraper(ScrapeSettings(max_concurrent=8, connect_timeout_seconds=0.5))
    started = time.monotonic()
    assert asyncio.run(scraper.scrape_job(KEY, pods)) is True
    assert time.monotonic() - started < 10 and list(scraper.reports(KEY)) == ["a"]
