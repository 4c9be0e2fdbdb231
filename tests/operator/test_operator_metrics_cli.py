"""The operator's command line and its metrics' bookkeeping (bounded per-job series)."""

from __future__ import annotations

from typing import Any

import kubernetes
import prometheus_client
import pytest
import urllib3
from rtj_operator import metrics
from rtj_operator.main import build_parser
from rtj_operator.runtime import api_liveness


def sample(name: str, labels: dict[str, str] | None = None) -> float | None:
    return prometheus_client.REGISTRY.get_sample_value(name, labels or {})


def test_command_line_scopes_and_options() -> None:
    args = build_parser().parse_args(
        ["-n", "a", "--namespace", "b", "--metrics-port", "9090", "--log-format", "json"]
    )
    assert args.namespace == ["a", "b"] and args.metrics_port == 9090 and args.log_format == "json"
    assert build_parser().parse_args([]).namespace == []  # all namespaces by default
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--namespace", "a", "--all-namespaces"])


def test_goodput_series_is_removed_with_its_job_and_states_are_counted() -> None:
    metrics.observe_pass(
        "ns",
        "metrics-job",
        state="Recovering",
        counters={"node_losses": 1, "pod_replacements": 1, "gang_restarts": 0},
        old_restarts={"inProcess": 1, "inJob": 0, "podReplacement": 0},
        new_restarts={"inProcess": 3, "inJob": 0, "podReplacement": 1},
        goodput_percent=87.5,
    )
    assert sample("rtj_job_goodput_ratio", {"namespace": "ns", "rtj_job": "metrics-job"}) == 0.875
    assert (sample("rtj_jobs", {"state": "Recovering"}) or 0) >= 1
    before = sample("rtj_restarts_total", {"layer": "in_process"}) or 0
    metrics.observe_pass(
        "ns",
        "metrics-job",
        state="Running",
        counters={},
        old_restarts={"inProcess": 3},
        new_restarts={"inProcess": 4},
        goodput_percent=None,
    )
    assert sample("rtj_restarts_total", {"layer": "in_process"}) == before + 1
    metrics.forget_job("ns", "metrics-job")
    assert sample("rtj_job_goodput_ratio", {"namespace": "ns", "rtj_job": "metrics-job"}) is None
    metrics.forget_job("ns", "metrics-job")  # forgetting twice is harmless


def _observe_running(status: dict[str, Any], failures_allowed: int | None = None) -> None:
    """One pass of the running job `series-job` in `ns` whose status is `status`."""
    metrics.observe_pass(
        "ns",
        "series-job",
        state="Running",
        counters={},
        old_restarts={},
        new_restarts={},
        goodput_percent=50.0,
        status=status,
        failures_allowed=failures_allowed,
    )


def test_per_job_series_follow_status_and_go_with_the_job() -> None:
    status = {
        "progress": {
            "step": 120,
            "stepTimeSeconds": 0.25,
            "updateTime": "2026-01-01T12:01:40Z",
            "samples": 7680,
            "tokens": 983040,
            "samplesPerSecond": 256.0,
            "tokensPerSecond": 32768.5,
        },
        "lastCheckpoint": {"step": 100, "time": "2026-01-01T12:01:00Z"},
        "workers": {"desired": 2, "ready": 1},
        "restarts": {"inProcess": 2, "inJob": 1, "podReplacement": 3, "total": 6},
        "conditions": [{"type": "Stalled", "status": "True", "reason": "NoProgress"}],
        "lastRecovery": {"reason": "NodeLost", "durationSeconds": 35.5},
        "checkpointAdvice": {"configuredIntervalSteps": 100, "recommendedIntervalSteps": 523},
        "state": "Stalled",
        "budget": {"failuresUsed": 4},
        "excludedNodes": [{"nodeName": "node-3"}],
    }
    _observe_running(status, failures_allowed=5)
    labels = {"namespace": "ns", "rtj_job": "series-job"}
    assert sample("rtj_job_step", labels) == 120
    assert sample("rtj_job_step_duration_seconds", labels) == 0.25
    assert sample("rtj_job_goodput_ratio", labels) == 0.5
    assert sample("rtj_job_checkpoint_last_step", labels) == 100
    assert sample("rtj_job_checkpoint_last_timestamp_seconds", labels) == 1767268860.0
    assert sample("rtj_job_progress_timestamp_seconds", labels) == 1767268900.0
    assert (sample("rtj_job_workers_ready", labels), sample("rtj_job_workers_desired", labels)) == (1, 2)
    assert sample("rtj_job_stalled", labels) == 1
    assert sample("rtj_job_last_recovery_seconds", labels) == 35.5
    assert sample("rtj_job_checkpoint_advised_interval_steps", labels) == 523
    assert sample("rtj_job_checkpoint_interval_steps", labels) == 100
    for layer, count in (("in_process", 2), ("in_job", 1), ("pod_replacement", 3)):
        assert sample("rtj_job_restarts_total", {**labels, "layer": layer}) == count
    assert (sample("rtj_job_samples_total", labels), sample("rtj_job_tokens_total", labels)) == (7680, 983040)
    assert sample("rtj_job_samples_per_second", labels) == 256.0
    assert sample("rtj_job_tokens_per_second", labels) == 32768.5
    assert (sample("rtj_job_failures_used", labels), sample("rtj_job_failures_allowed", labels)) == (4, 5)
    assert sample("rtj_job_excluded_nodes", labels) == 1
    # One series per state, 1 for the status's: what alerts on a state held too long select.
    states = {s: sample("rtj_job_state", {**labels, "state": s}) for s in ("Stalled", "Running", "Failed")}
    assert states == {"Stalled": 1, "Running": 0, "Failed": 0}
    # A job whose script reports no samples or tokens has no such series.
    _observe_running({"progress": {"step": 121}})
    for name in ("rtj_job_samples_total", "rtj_job_tokens_total", "rtj_job_samples_per_second"):
        assert sample(name, labels) is None, name
    assert sample("rtj_job_step", labels) == 121
    assert sample("rtj_job_failures_used", labels) == 0 and sample("rtj_job_excluded_nodes", labels) == 0
    assert sample("rtj_job_failures_allowed", labels) is None  # not passed: no sample
    metrics.forget_job("ns", "series-job")
    exposition = prometheus_client.generate_latest().decode()
    assert 'rtj_job="series-job"' not in exposition


@pytest.mark.parametrize(
    ("error", "failure_class"),
    [
        (kubernetes.client.ApiException(status=429, reason="Too Many Requests"), "throttled"),
        (kubernetes.client.ApiException(status=503, reason="Service Unavailable"), "server"),
        (kubernetes.client.ApiException(status=409, reason="Conflict"), "refused"),
        (kubernetes.client.ApiException(status=401, reason="Unauthorized"), "credentials"),
        (urllib3.exceptions.ReadTimeoutError(None, "/api", "read timed out"), "timeout"),
        (TimeoutError("connect"), "timeout"),
        (
            urllib3.exceptions.MaxRetryError(None, "/api", ConnectionRefusedError(111, "refused")),
            "connection",
        ),
    ],
)
def test_failed_api_calls_are_counted_by_class(error: BaseException, failure_class: str) -> None:
    before = sample("rtj_api_errors_total", {"class": failure_class}) or 0
    api_liveness.ApiLiveness().failed(error)
    assert sample("rtj_api_errors_total", {"class": failure_class}) == before + 1


def test_leading_follows_the_operator_that_serves_last() -> None:
    acting = [True]
    metrics.follow_leadership(lambda: acting[0])
    assert sample("rtj_operator_leading") == 1
    acting[0] = False
    assert sample("rtj_operator_leading") == 0
