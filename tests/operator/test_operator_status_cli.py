"""`rtj status` (rtj_operator.status_cli): a job's status in words, the advice beside the configured
interval. The command against a real API server is exercised in test_operator_stall_cluster."""

from __future__ import annotations

import pytest
from rtj_operator import cli, status_cli

JOB = {
    "metadata": {"name": "train", "namespace": "ml"},
    "spec": {"checkpoint": {"intervalSteps": 50}},
    "status": {
        "state": "Recovering",
        "workers": {"readyText": "2/2", "readySpares": 1},
        "progress": {"step": 120, "currentStep": 101, "stepTimeSeconds": 0.5, "goodputPercent": 91.2},
        "lastCheckpoint": {"step": 100, "time": "2026-01-01T11:59:00Z"},
        "restarts": {"inProcess": 1, "inJob": 0, "podReplacement": 1, "total": 2},
        "checkpointAdvice": {
            "configuredIntervalSteps": 50,
            "faults": 2,
            "saveCostSeconds": 10.0,
            "meanTimeBetweenFaultsSeconds": 3600.0,
            "recommendedIntervalSeconds": 261.7,
            "recommendedIntervalSteps": 523,
        },
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "AllWorkersReady", "message": "2/2 workers ready"},
            {"type": "Recovering", "status": "True", "reason": "NodeLost", "message": "waiting"},
        ],
    },
}


def test_status_says_where_training_is_and_what_interval_is_advised() -> None:
    text = status_cli.format_status(JOB)
    assert "State:          Recovering" in text
    assert "120 (now at 101: redoing the steps since the checkpoint it resumed from)" in text
    assert "every 523 steps (261.7 s) by Young/Daly, configured 50" in text
    assert "save blocks 10.0 s; mean time between faults 3600.0 s (2 faults)" in text
    assert "  Recovering  True    NodeLost" in text


def test_status_without_a_fault_says_why_no_interval_is_advised() -> None:
    job = {**JOB, "status": {"checkpointAdvice": {"faults": 0, "message": "no fault counted yet"}}}
    text = status_cli.format_status(job)
    assert "Advised:        no fault counted yet" in text and "Step:           no step reported yet" in text


def test_status_says_where_the_step_comes_from() -> None:
    own = {**JOB, "status": {"progress": {"sources": {"step": "NotReported", "restarts": "Launcher"}}}}
    assert "Step:           not reported (use the rtj library, or set spec.progress.stepLogPattern)" in (
        status_cli.format_status(own)
    )
    matched = {**JOB, "status": {"progress": {"step": 7, "sources": {"step": "LogPattern"}}}}
    assert "Step:           7 (from the log pattern)" in status_cli.format_status(matched)


def test_status_is_an_rtj_subcommand_that_needs_a_name() -> None:
    assert cli.SUBCOMMANDS["status"][0] == "rtj_operator.status_cli"
    with pytest.raises(SystemExit):
        status_cli.build_parser().parse_args([])
    args = status_cli.build_parser().parse_args(["train", "-n", "ml"])
    assert (args.name, args.namespace) == ("train", "ml")


def test_status_says_what_was_trained_on_only_when_the_script_reports_it() -> None:
    progress = {"step": 120, "samples": 7680, "tokens": 983040, "samplesPerSecond": 256.0}
    text = status_cli.format_status({**JOB, "status": {"progress": progress}})
    assert "Trained on:     7680 samples (256.0/s), 983040 tokens\n" in text
    assert "Trained on:" not in status_cli.format_status(JOB)
