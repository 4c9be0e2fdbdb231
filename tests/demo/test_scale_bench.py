"""The pure parts of `rtj bench scale`: the API server's counters by verb and resource, the rates and
summaries the tables show, the losses a job size goes through, and the tables from a result."""

from __future__ import annotations

import pytest
from rtj_demo.scalebench import mean_between, summary
from rtj_demo.scalephases import concurrent_table, growth_table, loss_table, losses_for
from rtj_demo.scalewatch import Recorder, api_request_counts, rates


def request_line(code: str, resource: str, subresource: str, verb: str, value: str) -> str:
    labels = (
        f'code="{code}",component="apiserver",resource="{resource}",subresource="{subresource}",verb="{verb}"'
    )
    return f"apiserver_request_total{{{labels}}} {value}"


METRICS = "\n".join(
    [
        "# HELP apiserver_request_total Counter of apiserver requests",
        request_line("200", "leases", "", "PATCH", "1100"),
        request_line("409", "leases", "", "PATCH", "10"),
        request_line("200", "pods", "status", "PATCH", "5"),
        request_line("201", "pods", "", "POST", "2e+03"),
        'apiserver_request_duration_seconds_count{verb="GET"} 7',
    ]
)


def test_the_api_servers_requests_are_summed_by_verb_and_resource_across_codes() -> None:
    assert api_request_counts(lambda: METRICS) == {
        "PATCH leases": 1110.0,
        "PATCH pods/status": 5.0,
        "POST pods": 2000.0,
    }


def test_rates_are_per_second_growth_highest_first_and_leave_out_what_did_not_grow() -> None:
    before = {"PATCH leases": 100.0, "POST pods": 10.0, "GET nodes": 5.0}
    after = {"PATCH leases": 1200.0, "POST pods": 30.0, "GET nodes": 5.0, "POST events": 4.0}
    assert rates(before, after, 10.0) == {"PATCH leases": 110.0, "POST pods": 2.0, "POST events": 0.4}
    assert list(rates(before, after, 10.0, top=1)) == ["PATCH leases"]


def test_summaries_and_histogram_means() -> None:
    assert summary([]) is None
    assert summary([3.0, 1.0, 2.0]) == {"p50": 2.0, "p99": 3.0, "max": 3.0}
    assert mean_between((1.0, 2.0), (4.0, 5.0)) == 1.0
    assert mean_between((1.0, 2.0), (1.0, 2.0)) is None


def test_a_job_loses_one_percent_of_its_nodes_and_at_1000_also_five_percent_and_a_zone() -> None:
    assert losses_for(10) == [("1%", 1)]
    assert losses_for(100) == [("1%", 1)]
    assert losses_for(1000) == [("1%", 10), ("5%", 50), ("zone", None)]


def test_the_recorder_keeps_the_newest_live_worker_per_index_and_each_node_lost_event(
    tmp_path: object,
) -> None:
    recorder = Recorder.__new__(Recorder)  # no watches: fed by hand
    recorder.pods, recorder.not_ready, recorder.node_lost, recorder.events_seen = {}, {}, {}, 0
    labels = {"resilient.training/job-name": "j", "resilient.training/role": "worker"}

    def pod(uid: str, index: str, phase: str) -> dict[str, object]:
        meta = {
            "uid": uid,
            "name": f"j-worker-{index}",
            "labels": {**labels, "resilient.training/worker-index": index},
        }
        return {"metadata": meta, "spec": {"nodeName": f"n-{uid}"}, "status": {"phase": phase}}

    recorder._pod("ADDED", pod("a", "0", "Running"), 10.0)
    recorder._pod("ADDED", pod("b", "1", "Pending"), 11.0)
    recorder._pod("DELETED", pod("a", "0", "Running"), 20.0)
    recorder._pod("ADDED", pod("c", "0", "Pending"), 21.0)
    recorder._pod("MODIFIED", pod("c", "0", "Running"), 22.5)
    live = recorder.live_workers("j")
    assert {i: (p.name, p.node, p.created, p.running) for i, p in live.items()} == {
        "0": ("j-worker-0", "n-c", 21.0, 22.5),
        "1": ("j-worker-1", "n-b", 11.0, None),
    }
    message = "node hollow-7 has been Ready=Unknown since 2026-12-05T14:41:01+00:00"
    recorder._event("ADDED", {"reason": "NodeLost", "message": message}, 30.0)
    recorder._event("ADDED", {"reason": "NodeLost", "message": message}, 90.0)
    recorder._event("ADDED", {"reason": "WorkerReplaced", "message": "node hollow-8"}, 31.0)
    assert recorder.node_lost_after("hollow-7", 0.0) == 30.0
    assert recorder.node_lost_after("hollow-7", 50.0) == 90.0
    assert recorder.node_lost_after("hollow-8", 0.0) is None
    assert recorder.events_seen == 3


@pytest.fixture
def result() -> dict[str, object]:
    timing = {"p50": 1.5, "p99": 2.0, "max": 2.0}
    window = {
        "events_written": 12.0,
        "operator_writes": 7.0,
        "operator_cpu_seconds": 3.5,
        "status_kib": 180.2,
    }
    loss = {
        "loss": "1%", "nodes_lost": 10, "workers_lost": 10, "replacements_running": 10,
        "fault_to_node_not_ready": timing, "fault_to_node_lost": timing, "operator_after_grace": timing,
        "node_lost_to_created": timing, "created_to_running": timing, "window": window,
    }  # fmt: skip
    steady = {
        "status_kib": 170.0, "operator_cpu_cores": 0.25, "operator_writes_per_minute": 10.0,
        "scrape_round_mean_seconds": 0.9, "api_requests_per_second": 150.0,
    }  # fmt: skip
    idle = {"operator_writes_per_job_minute": 0.0, "operator_cpu_cores": 0.1, "operator_rss_mib": 200.0}
    return {
        "sizes": [{"nodes": 1000, "apply_to_all_running_seconds": 42.1, "steady": steady, "losses": [loss]}],
        "concurrent": {
            "jobs": 100, "nodes_each": 8, "apply_to_workers_created": timing, "apply_to_all_running": timing,
            "idle": idle,
        },
    }  # fmt: skip


def test_the_tables_show_each_figure_of_a_result(result: dict[str, object]) -> None:
    growth = growth_table(result).splitlines()
    assert growth[2] == "| 1000 | 42.1 | 170 | 0.25 | 10 | 0.9 | 150 | 1.5 | 1.5 / 2 | 1.5 |"
    assert loss_table(result).splitlines()[2] == (
        "| 1000 | 1% | 10 | 10 | 10 | 1.5 | 1.5 / 2 | 1.5 | 1.5 / 2 | 12 | 7 | 3.5 | 180.2 |"
    )
    assert concurrent_table(result).splitlines()[2] == "| 100 x 8 | 1.5 / 2 | 1.5 / 2 | 0 | 0.1 | 200 |"
    assert concurrent_table({}) == ""
