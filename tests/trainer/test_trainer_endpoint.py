"""The pod's progress endpoint, without a cluster: the endpoint sink gets every step's report while
the other sinks stay throttled; rtj-launch serves the report and the trainer's Prometheus metrics
(parsed with prometheus_client's own parser), stays up for the final report to be read, forwards
SIGTERM and exits with its child's status."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rtj_localcluster.ports import reserve_port
from rtj_trainer.library import progress
from rtj_trainer.runtime import endpoint, metrics

BIN = Path(sys.executable).parent


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def parse_metrics(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name -> labels -> value; the parser raises on anything malformed."""
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    families = list(text_string_to_metric_families(text))
    assert {f.name for f in families} == {n.removesuffix("_total") for n, _, _ in metrics.SERIES}
    for family in families:
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def a_report(**changes: Any) -> dict[str, Any]:
    p = progress.Progress(node_rank=0, train_start_time=1_700_000_000.0)
    p.step, p.loss, p.step_time_seconds = 42, 1.25, 0.5
    p.last_checkpoint_step, p.last_checkpoint_time = 40, 1_700_000_090.0
    p.restarts_in_process, p.restarts_in_job = 1, 2
    p.useful_step_seconds, p.checkpoint_blocking_seconds = 50.0, 0.125
    for key, value in changes.items():
        setattr(p, key, value)
    return progress.progress_json(p, now=1_700_000_100.0)


def test_endpoint_sink_is_fresher_than_the_throttled_file_sink(tmp_path: Path) -> None:
    live, lines = tmp_path / "progress.json", tmp_path / "p.jsonl"
    sink = progress.make_sink(f"endpoint,file:{lines}", {progress.PROGRESS_FILE_ENV: str(live)})
    reporter = progress.Reporter(sink, str(tmp_path / "ck"), interval_seconds=3600, live_interval_seconds=0)
    p = progress.Progress(node_rank=0, train_start_time=0.0)
    for step in range(1, 4):
        p.step = step
        reporter.report(p)
        assert json.loads(live.read_text())["step"] == step
    assert [json.loads(line)["step"] for line in lines.read_text().splitlines()] == [1]
    # At most one live report a second, but a commit, a recovery or the end goes at once.
    reporter = progress.Reporter(sink, str(tmp_path / "ck"), interval_seconds=3600)
    assert reporter.live_interval == progress.LIVE_INTERVAL_SECONDS
    p.step = 10
    reporter.report(p)
    p.step = 11
    reporter.report(p)
    assert json.loads(live.read_text())["step"] == 10
    p.step, p.finished = 12, True
    reporter.report(p, force=True)
    assert json.loads(live.read_text())["step"] == 12
    with pytest.raises(RuntimeError, match=progress.PROGRESS_FILE_ENV):
        progress.make_sink("endpoint", {})
    with pytest.raises(ValueError, match="endpoint, file:<path> or none"):
        progress.make_sink("pod-annotation", {})


def test_metrics_follow_prometheus_conventions_and_the_report() -> None:
    samples = parse_metrics(metrics.exposition(a_report(), now=1_700_000_110.0))
    value = {name: next(iter(by_labels.values())) for name, by_labels in samples.items()}
    assert value["rtj_trainer_step"] == 42 and value["rtj_trainer_loss"] == 1.25
    assert value["rtj_trainer_step_duration_seconds"] == 0.5
    assert value["rtj_trainer_useful_step_seconds_total"] == 50.0
    assert value["rtj_trainer_goodput_ratio"] == 0.5  # 50 s useful of 100 s since the start
    assert value["rtj_trainer_checkpoint_last_step"] == 40
    assert value["rtj_trainer_checkpoint_age_seconds"] == 20.0
    assert value["rtj_trainer_checkpoint_save_blocking_seconds"] == 0.125
    assert value["rtj_trainer_report_age_seconds"] == 10.0 and value["rtj_trainer_finished"] == 0
    assert samples["rtj_trainer_restarts_total"] == {
        (("layer", "in_process"),): 1.0,
        (("layer", "in_job"),): 2.0,
    }
    assert not {"rtj_trainer_samples_total", "rtj_trainer_tokens_per_second"} & samples.keys()
    rates = progress.Throughput()
    rates.add(2.0, 128, 16384)
    counted = parse_metrics(
        metrics.exposition(a_report(samples=640, tokens=81920, throughput=rates), now=0.0)
    )
    assert (counted["rtj_trainer_samples_total"], counted["rtj_trainer_tokens_total"]) == (
        {(): 640},
        {(): 81920},
    )
    assert counted["rtj_trainer_samples_per_second"] == {(): 64.0}
    assert counted["rtj_trainer_tokens_per_second"] == {(): 8192.0}
    # Before the first report: the descriptions only, still a valid exposition.
    assert parse_metrics(metrics.exposition(None, now=0.0)) == {}


def test_endpoint_serves_the_report_and_knows_when_it_was_read(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    server = endpoint.ProgressEndpoint(path, reserve_port())
    assert server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert get(base + "/progress")[0] == 404
        assert server.wait_delivered(0)  # nothing to deliver yet
        progress.EndpointSink(str(path)).send(a_report())
        assert not server.wait_delivered(0.2)
        status, body = get(base + "/progress")
        assert status == 200 and json.loads(body)["step"] == 42
        assert server.wait_delivered(10)  # recorded once the answer is written
        status, text = get(base + "/metrics")
        assert status == 200 and parse_metrics(text.decode())["rtj_trainer_step"] == {(): 42.0}
        assert get(base + "/elsewhere")[0] == 404
        # A second endpoint on the same port cannot bind: a warning, not a crash.
        assert not endpoint.ProgressEndpoint(path, server.port).start()
    finally:
        server.close()


REPORT_THEN_EXIT = """
import json, os
from rtj_trainer.library import progress
p = progress.Progress(node_rank=0, train_start_time=1700000000.0)
p.step, p.finished = 7, True
progress.make_sink("endpoint").send(progress.progress_json(p, now=1700000007.0))
"""


def launch(tmp_path: Path, script: str, port: int, **env: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(BIN / "rtj-launch"), "--", "python", "-c", script],
        env={
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "TMPDIR": str(tmp_path),
            "RTJ_LAUNCH_MODE": "direct",
            "RTJ_PROGRESS_PORT": str(port),
            **env,
        },
    )


def test_launcher_keeps_a_finished_pod_up_until_its_final_report_is_read(tmp_path: Path) -> None:
    port = reserve_port()
    proc = launch(tmp_path, REPORT_THEN_EXIT, port, RTJ_PROGRESS_LINGER_SECONDS="120")
    try:
        deadline = time.monotonic() + 60
        while (answer := _try_get(f"http://127.0.0.1:{port}/progress")) is None or answer[0] != 200:
            assert proc.poll() is None, "the launcher exited before its final report was read"
            assert time.monotonic() < deadline, answer
            time.sleep(0.2)
        assert json.loads(answer[1])["finished"] is True
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def _try_get(url: str) -> tuple[int, bytes] | None:
    try:
        return get(url)
    except OSError:
        return None


def test_without_a_port_the_sink_still_has_its_file_and_nothing_lingers(tmp_path: Path) -> None:
    proc = launch(tmp_path, REPORT_THEN_EXIT, 0, RTJ_PROGRESS_LINGER_SECONDS="120")
    assert proc.wait(timeout=60) == 0  # the report was written, and nobody waits for a reader


def test_launcher_forwards_sigterm_and_exits_with_the_childs_status(tmp_path: Path) -> None:
    port = reserve_port()
    proc = launch(tmp_path, "import time; time.sleep(600)", port)
    try:
        deadline = time.monotonic() + 60
        while _try_get(f"http://127.0.0.1:{port}/healthz") is None:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        proc.kill()
