"""Unit behaviour of the trainer's pure parts: launcher argv, fault plans, checkpoint selection and
pruning, the progress JSON, and the environment contract as the operator renders it."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from rtj_contract import env as env_names
from rtj_operator import api, render
from rtj_trainer.library import checkpoint, env, progress
from rtj_trainer.rehearsal import fault_injection
from rtj_trainer.runtime import launch, rankshim

NVRX_0_4_1 = (0, 4, 1)
NVRX_0_7_0 = (0, 7, 0)
SHIM = rankshim.command(sys.executable)


def contract_env(**overrides: str) -> env.TrainerEnv:
    values = {
        "RTJ_JOB_UID": "uid-1",
        "RTJ_NODE_RANK": "0",
        "RTJ_NNODES": "2",
        "RTJ_NNODES_MAX": "2",
        "RTJ_NPROC_PER_NODE": "8",
        "RTJ_RDZV_HOST": "j-worker-0.j.ns.svc",
        "RTJ_RDZV_PORT": "29500",
        "RTJ_FT_HEARTBEAT_TIMEOUT_SECONDS": "300",
        "RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT_SECONDS": "600",
        "RTJ_FT_MONITOR_INTERVAL_SECONDS": "5",
        "RTJ_MAX_RESTARTS": "20",
    }
    values.update(overrides)
    return env.TrainerEnv.from_environ(values)


# --- launcher argv ------------------------------------------------------------------------------


def test_argv_for_the_store_host_node() -> None:
    argv = launch.ft_launcher_argv(
        contract_env(),
        rdzv_address="10.0.0.5",
        command=["rtj-train", "--steps", "10"],
        cpu=False,
        nvrx_version=NVRX_0_4_1,
        python="/venv/bin/python",
    )
    assert argv == [
        "ft_launcher",
        "--nnodes=2:2",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.5:29500",
        "--rdzv-id=uid-1",
        "--rdzv-conf=is_host=1",
        "--ft-initial-rank-heartbeat-timeout=600",
        "--ft-rank-heartbeat-timeout=300",
        "--monitor-interval=5",
        "--max-restarts=20",
        "--workers-stop-timeout=15",
        "--ft-enable-nic-monitor=true",
        "--no-python",
        # Each rank runs under the rank shim (rtj_trainer.runtime.rankshim), with rtj-launch's interpreter.
        "/venv/bin/python",
        "-m",
        "rtj_trainer.runtime.rankshim",
        "--",
        "rtj-train",
        "--steps",
        "10",
    ]


@pytest.mark.parametrize("node_rank", [1, 2, 7])
def test_argv_other_nodes_dial_the_host_and_do_not_host(node_rank: int) -> None:
    argv = launch.ft_launcher_argv(
        contract_env(
            RTJ_NODE_RANK=str(node_rank), RTJ_NNODES="8", RTJ_NNODES_MAX="10", RTJ_POD_IP="10.1.2.3"
        ),
        rdzv_address="10.0.0.5",
        command=["rtj-train"],
        cpu=True,
        nvrx_version=NVRX_0_4_1,
    )
    assert "--rdzv-conf=is_host=0" in argv
    assert "--nnodes=8:10" in argv
    assert "--local-addr=10.1.2.3" in argv
    assert "--ft-enable-nic-monitor=false" in argv
    # The training command comes last and whole, after --no-python and the rank shim.
    assert argv[-6:] == ["--no-python", *SHIM, "rtj-train"]


def test_argv_with_a_store_pod_no_node_hosts_the_rendezvous() -> None:
    # rendezvous.host StorePod: the store pod's address is set, and worker 0 is a client like the rest.
    for node_rank in ("0", "1"):
        argv = launch.ft_launcher_argv(
            contract_env(RTJ_NODE_RANK=node_rank, RTJ_STORE_HOST="j-store.j.ns.svc", RTJ_STORE_PORT="29500"),
            rdzv_address="10.0.0.9",
            command=["rtj-train"],
            cpu=True,
            nvrx_version=NVRX_0_4_1,
        )
        assert "--rdzv-conf=is_host=0" in argv and "--rdzv-endpoint=10.0.0.9:29500" in argv


def test_argv_keeps_user_arguments_verbatim() -> None:
    hostile = ["rtj-train", "--name", "x; rm -rf / $(id) `id`", "--steps=5"]
    argv = launch.ft_launcher_argv(
        contract_env(), rdzv_address="fd00::1", command=hostile, cpu=True, nvrx_version=NVRX_0_4_1
    )
    assert argv[-len(hostile) :] == hostile
    assert "--rdzv-endpoint=[fd00::1]:29500" in argv


def test_argv_needs_a_command() -> None:
    with pytest.raises(ValueError, match="no training command"):
        launch.ft_launcher_argv(
            contract_env(), rdzv_address="h", command=[], cpu=True, nvrx_version=NVRX_0_4_1
        )


@pytest.mark.parametrize("cpu", [True, False])
def test_argv_sets_the_defaults_nvrx_0_7_changed(cpu: bool) -> None:
    argv = launch.ft_launcher_argv(
        contract_env(), rdzv_address="10.0.0.5", command=["rtj-train"], cpu=cpu, nvrx_version=NVRX_0_7_0
    )
    assert "--workers-stop-timeout=15" in argv
    assert f"--ft-enable-nic-monitor={'false' if cpu else 'true'}" in argv
    # CPU: no NIC link-state check and no wait for GPU memory; GPU nodes keep 0.7.0's defaults.
    changed = [a for a in argv if a.startswith(("--ft-enable-nic-healthcheck", "--ft-gpu-memory"))]
    off_on_cpu = ["--ft-enable-nic-healthcheck=false", "--ft-gpu-memory-reclaim-timeout=0"]
    assert changed == (off_on_cpu if cpu else [])
    assert argv[-6:] == ["--no-python", *SHIM, "rtj-train"]


@pytest.mark.parametrize("cpu", [True, False])
def test_installed_launcher_accepts_the_flags(cpu: bool) -> None:
    """Every flag the builder emits parses with the installed ft_launcher's own parser.

    `make test` runs this once per supported NVRx release (0.4.1 and 0.7.0), each with its parser.
    """
    from nvidia_resiliency_ext.fault_tolerance.launcher import get_args_parser
    from rtj_trainer.library import nvrx_compat

    argv = launch.ft_launcher_argv(
        contract_env(RTJ_POD_IP="10.1.2.3"), rdzv_address="10.0.0.5", command=["rtj-train", "--x"], cpu=cpu
    )
    parsed = get_args_parser().parse_args(argv[1:])
    assert parsed.nnodes == "2:2"
    assert parsed.rdzv_endpoint == "10.0.0.5:29500"
    assert parsed.local_addr == "10.1.2.3"
    assert parsed.ft_enable_nic_monitor is (not cpu)
    # 0.4.1 parses the heartbeat timeouts as floats, 0.7.0 as strings converted later.
    assert float(parsed.ft_rank_heartbeat_timeout) == 300.0
    assert float(parsed.ft_initial_rank_heartbeat_timeout) == 600.0
    assert parsed.workers_stop_timeout == 15.0
    if nvrx_compat.nvrx_version() >= nvrx_compat.NVRX_0_7:
        assert parsed.ft_enable_nic_healthcheck is (False if cpu else None)
        assert parsed.ft_gpu_memory_reclaim_timeout == ("0" if cpu else None)
    # ft_launcher runs the rank shim, which runs the training command.
    assert [parsed.training_script, *parsed.training_script_args] == [*SHIM, "rtj-train", "--x"]


def test_writer_options_follow_the_installed_release() -> None:
    from nvidia_resiliency_ext.checkpointing.async_ckpt.core import PersistentAsyncCaller
    from rtj_trainer.library import nvrx_compat

    class Release041:
        def __init__(self) -> None: ...

    class Release070:
        def __init__(
            self, is_daemon: bool = True, cpu_priority: int = 10, cpu_shm_mode: bool = False
        ) -> None: ...

    assert nvrx_compat.writer_caller_kwargs(Release041) == {}
    assert nvrx_compat.writer_caller_kwargs(Release070) == {"cpu_shm_mode": True, "cpu_priority": 10}
    # And what the installed release gets: its writer must never need CUDA.
    installed = nvrx_compat.writer_caller_kwargs(PersistentAsyncCaller)
    assert installed.get("cpu_shm_mode", True) is True
    assert bool(installed) is (nvrx_compat.nvrx_version() >= nvrx_compat.NVRX_0_7)


def test_resolve_real_names() -> None:
    assert launch.resolve("127.0.0.1", 29500, timeout=5) == "127.0.0.1"
    assert launch.resolve("localhost", 29500, timeout=5) in ("127.0.0.1", "::1")


def test_resolve_retries_then_gives_up() -> None:
    attempts: list[str] = []

    def no_sleep(_: float) -> None:
        attempts.append("slept")

    with pytest.raises(RuntimeError, match="did not resolve"):
        launch.resolve("no-such-host.invalid", 29500, timeout=0.01, sleep=no_sleep)


def test_resolve_waits_for_the_name_to_appear() -> None:
    calls = {"n": 0}

    def appearing(host: str, port: int, **kwargs: object) -> list[tuple[object, ...]]:
        calls["n"] += 1
        if calls["n"] < 3:
            raise socket.gaierror(socket.EAI_NONAME, "not yet")
        return socket.getaddrinfo("127.0.0.1", port, type=socket.SOCK_STREAM)

    assert launch.resolve("later", 1, timeout=60, resolver=appearing, sleep=lambda _: None) == "127.0.0.1"
    assert calls["n"] == 3


# --- environment contract -----------------------------------------------------------------------


def test_env_parses_what_the_operator_renders() -> None:
    job = api.parse_job(
        {
            "apiVersion": "resilient.training/v1alpha1",
            "kind": "ResilientTrainingJob",
            "metadata": {"name": "llm", "namespace": "ml", "uid": "u-1"},
            "spec": {
                "image": "trainer:1",
                "nodes": 3,
                "checkpoint": {
                    "intervalSteps": 50,
                    "keep": 2,
                    "mode": "Sync",
                    "storage": {"dynamic": {"storageClassName": "x"}},
                },
            },
        }
    )
    pod = render.render_worker_pod(job, 2)
    values = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}
    parsed = env.TrainerEnv.from_environ(values)
    assert parsed.node_rank == 2
    assert parsed.nnodes == 3
    assert parsed.job_uid == "u-1"
    assert parsed.checkpoint_interval_steps == 50
    assert parsed.checkpoint_keep == 2
    assert parsed.checkpoint_mode == env_names.MODE_SYNC
    assert parsed.rdzv_host.startswith("llm-worker-0.llm.ml.svc")
    assert parsed.inprocess_soft_timeout_seconds < parsed.inprocess_hard_timeout_seconds


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RTJ_ROLE", "boss"),
        ("RTJ_CHECKPOINT_MODE", "Later"),
        ("RTJ_NNODES", "two"),
        ("RTJ_INPROCESS_ENABLED", "maybe"),
        ("RTJ_GROUPS_STORE_PORT", "65536"),
    ],
)
def test_env_rejects_malformed_values(name: str, value: str) -> None:
    with pytest.raises(env.EnvError, match=name):
        env.TrainerEnv.from_environ({name: value})


def test_rank_0_hosts_its_stores_after_master_port_unless_told_where() -> None:
    from rtj_trainer.reference.train import StorePorts

    assert StorePorts.of(40000, env.TrainerEnv.from_environ({})) == StorePorts(wrapper=40001, groups=40002)
    told = env.TrainerEnv.from_environ({"RTJ_WRAPPER_STORE_PORT": "21000", "RTJ_GROUPS_STORE_PORT": "21005"})
    assert StorePorts.of(40000, told) == StorePorts(wrapper=21000, groups=21005)


def test_a_single_rank_gets_a_master_port_with_its_two_store_ports_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rtj_trainer.reference import train

    for name in ("RANK", "MASTER_PORT", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        monkeypatch.setenv(name, "")  # restored (or removed) after the test, like the rest
        monkeypatch.delenv(name)
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    taken = held.getsockname()[1]
    # The first free port the kernel offers has its next port taken: it is passed over.
    offered = itertools.chain([taken - 1, taken - 1], itertools.repeat(0))
    real_free_port = train._free_port
    monkeypatch.setattr(train, "_free_port", lambda: next(offered) or real_free_port())
    try:
        train.ensure_rank_env()
    finally:
        held.close()
    master = int(os.environ["MASTER_PORT"])
    assert master != taken - 1 and os.environ["RANK"] == "0"


# --- fault plans --------------------------------------------------------------------------------


def test_fault_plan_parses_the_documented_example() -> None:
    plan = fault_injection.parse_faults(
        "exception@step=30,rank=1;sigkill@step=60,rank=2;hang@step=90,rank=3;exception@p=0.01,seed=7"
    )
    assert [(f.kind, f.step, f.ranks) for f in plan[:3]] == [
        ("exception", 30, (1,)),
        ("sigkill", 60, (2,)),
        ("hang", 90, (3,)),
    ]
    assert plan[3].probability == 0.01 and plan[3].seed == 7 and plan[3].ranks is None
    assert fault_injection.parse_faults("") == ()
    assert fault_injection.parse_faults("exception@step=1,rank=0+2")[0].ranks == (0, 2)


@pytest.mark.parametrize(
    "text",
    [
        "explode@step=1",
        "exception",
        "exception@step=1,p=0.5",
        "exception@rank=1",
        "exception@step=x",
        "exception@p=2",
        "exception@step=1,colour=red",
        "sigkill@step=-1",
    ],
)
def test_fault_plan_rejects_bad_input(text: str) -> None:
    with pytest.raises(fault_injection.FaultPlanError):
        fault_injection.parse_faults(text)


def test_step_fault_fires_once_across_restarts(tmp_path: Path) -> None:
    plan = fault_injection.parse_faults("exception@step=3,rank=1")
    first = fault_injection.FaultInjector(plan, tmp_path, rank=1)
    first.maybe_fire(2)
    with pytest.raises(fault_injection.InjectedFaultError):
        first.maybe_fire(3)
    # A restarted process (new injector, same checkpoint dir) passes step 3 again without firing.
    fault_injection.FaultInjector(plan, tmp_path, rank=1).maybe_fire(3)
    # Other ranks never fire it.
    fault_injection.FaultInjector(
        fault_injection.parse_faults("exception@step=4,rank=1"), tmp_path, rank=0
    ).maybe_fire(4)
    fired = first.fired_since(0)
    assert [(f.kind, f.step, f.rank) for f in fired] == [("exception", 3, 1)]


def test_probabilistic_faults_are_seeded_and_fire_near_their_rate(tmp_path: Path) -> None:
    (fault,) = fault_injection.parse_faults("exception@p=0.1,seed=7")
    due = [s for s in range(2000) if fault.due(s, rank=0)]
    assert due == [s for s in range(2000) if fault.due(s, rank=0)]
    assert 120 < len(due) < 280
    injector = fault_injection.FaultInjector((fault,), tmp_path, rank=0)
    with pytest.raises(fault_injection.InjectedFaultError):
        injector.maybe_fire(due[0])
    injector.maybe_fire(due[0])  # claimed: a resume at the same step does not fire again
    with pytest.raises(fault_injection.InjectedFaultError):
        injector.maybe_fire(due[1])


# --- checkpoint selection and pruning -----------------------------------------------------------


def _save_all(root: Path, step: int, world: int, *, ranks: range | None = None) -> None:
    managers = [
        checkpoint.CheckpointManager(root, rank=rank, world_size=world, asynchronous=False, keep=100)
        for rank in (ranks if ranks is not None else range(world))
    ]
    for manager in managers:
        manager.save(step, {"w": torch.full((4,), float(step * 10 + manager.rank))}, {"step": step})
    for manager in managers:
        manager.poll()  # the committer (rank 0) commits once every rank's shard is durable


def test_newest_complete_ignores_partial_and_torn_checkpoints(tmp_path: Path) -> None:
    _save_all(tmp_path, 10, 2)
    _save_all(tmp_path, 20, 2)
    _save_all(tmp_path, 30, 2, ranks=range(1))  # rank 1 never finished: no commit possible
    torn = checkpoint.step_dir(tmp_path, 40)
    torn.mkdir()
    (torn / "rank-00000.pt").write_bytes(b"\x80garbage")  # a shard cut short, no .done
    (torn / "rank-00001.pt").write_bytes(b"\x80garbage")
    assert checkpoint.try_commit(tmp_path, 30) is False
    assert checkpoint.try_commit(tmp_path, 40) is False
    newest = checkpoint.newest_complete(tmp_path, 2)
    assert newest is not None and newest.step == 20
    assert checkpoint.newest_complete(tmp_path, 4) is None  # another world size never matches
    manager = checkpoint.CheckpointManager(tmp_path, rank=1, world_size=2, asynchronous=False)
    info, payload = manager.load(20)
    assert info.step == 20 and torch.equal(payload["tensors"]["w"], torch.full((4,), 201.0))
    with pytest.raises(RuntimeError):
        manager.load(30)


def test_commit_needs_every_rank_and_marker_is_last(tmp_path: Path) -> None:
    _save_all(tmp_path, 5, 3, ranks=range(2))
    directory = checkpoint.step_dir(tmp_path, 5)
    assert not (directory / checkpoint.COMMIT_MARKER).exists()
    _save_all(tmp_path, 5, 3, ranks=range(2, 3))
    # Rank 2 is not the committer and rank 0 polled before rank 2 finished: a resume commits it.
    assert not (directory / checkpoint.COMMIT_MARKER).exists()
    assert checkpoint.commit_ready(tmp_path) == [5]
    marker = json.loads((directory / checkpoint.COMMIT_MARKER).read_text())
    assert marker["worldSize"] == 3 and marker["step"] == 5
    assert checkpoint.CheckpointManager(tmp_path, rank=0, world_size=3, asynchronous=False).newest_step() == 5


def test_keep_k_prunes_old_commits_and_stale_partials(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        _save_all(tmp_path, step, 1)
    stale = checkpoint.step_dir(tmp_path, 25)
    stale.mkdir()
    in_flight = checkpoint.step_dir(tmp_path, 50)
    in_flight.mkdir()
    removed = checkpoint.prune(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == ["step-000000010", "step-000000020", "step-000000025"]
    remaining = [(c.step, c.committed) for c in checkpoint.list_checkpoints(tmp_path)]
    assert remaining == [(30, True), (40, True), (50, False)]


def test_committer_prunes_as_it_commits(tmp_path: Path) -> None:
    manager = checkpoint.CheckpointManager(tmp_path, rank=0, world_size=1, asynchronous=False, keep=2)
    for step in range(1, 6):
        manager.save(step, {"w": torch.zeros(2)}, {})
        assert manager.poll() == [step]
    assert [c.step for c in checkpoint.list_checkpoints(tmp_path)] == [4, 5]
    assert manager.last_committed is not None and manager.last_committed.step == 5


# --- progress JSON ------------------------------------------------------------------------------


def test_progress_json_matches_the_contract() -> None:
    p = progress.Progress(node_rank=1, train_start_time=1_700_000_000.0)
    p.step = 123
    p.last_checkpoint_step, p.last_checkpoint_time = 100, 1_700_000_050.0
    p.restarts_in_process, p.restarts_in_job = 1, 2
    p.step_time_seconds, p.checkpoint_blocking_seconds, p.useful_step_seconds = 0.12, 0.01, 55.0
    for i in range(25):
        p.add_event(
            progress.RecoveryEvent("InProcessRestart", 40 + i, 1_700_000_060.0, 1_700_000_060.8, 0, "memory")
        )
    report = progress.progress_json(p, now=1_700_000_100.0)
    assert set(report) >= {
        "v",
        "time",
        "nodeRank",
        "step",
        "lastCheckpoint",
        "restarts",
        "stepTimeSeconds",
        "checkpointBlockingSeconds",
        "usefulStepSeconds",
        "trainStartTime",
        "finished",
        "events",
    }
    assert report["v"] == 1
    assert report["time"] == "2023-11-14T22:15:00.000000Z"
    assert report["nodeRank"] == 1 and report["step"] == 123
    assert report["lastCheckpoint"] == {"step": 100, "time": "2023-11-14T22:14:10.000000Z"}
    assert report["restarts"] == {"inProcess": 1, "inJob": 2}
    assert report["usefulStepSeconds"] == 55.0 and report["finished"] is False
    assert len(report["events"]) == progress.MAX_EVENTS
    assert report["events"][-1]["step"] == 64  # the newest 20 are kept
    event = report["events"][0]
    assert event["kind"] == "InProcessRestart" and event["recoverySeconds"] == pytest.approx(0.8)
    assert {"time", "kind", "step", "recoverySeconds"} <= set(event)
    json.dumps(report)  # serialisable as the annotation value


def test_samples_and_tokens_are_in_the_report_only_once_counted() -> None:
    p = progress.Progress(node_rank=0, train_start_time=1_700_000_000.0)
    p.count_work(0.0)
    assert (
        not {"samples", "tokens", "samplesPerSecond", "tokensPerSecond"}
        & progress.progress_json(p, 0.0).keys()
    )
    p.count_work(0.0, samples=0)
    counted = progress.progress_json(p, 0.0)
    assert counted["samples"] == 0 and "samplesPerSecond" not in counted  # no step time yet: no rate
    assert "tokens" not in counted
    p.count_work(2.0, samples=64, tokens=8192)
    report = progress.progress_json(p, 0.0)
    assert (report["samples"], report["tokens"]) == (64, 8192)
    assert (report["samplesPerSecond"], report["tokensPerSecond"]) == (32.0, 4096.0)
    restored = progress.Progress(node_rank=0, train_start_time=0.0)
    restored.resume_work(json.loads(json.dumps(report)))
    assert restored.work_json() == {"samples": 64, "tokens": 8192}
    restored.resume_work({"samples": -3, "tokens": "many"})  # a damaged node state: counts start over
    assert restored.work_json() == {}


def test_throughput_is_over_the_newest_window_of_step_time() -> None:
    rates = progress.Throughput(window_seconds=30.0, window_steps=1000)
    assert rates.samples_per_second() is None
    for _ in range(50):
        rates.add(1.0, 8, 1024)
    assert (rates.samples_per_second(), rates.tokens_per_second()) == (8.0, 1024.0)
    rates.add(10.0, 8, 1024)  # a slow step (a data loader's hiccup): the newest 30 s hold 21 steps
    assert rates.samples_per_second() == pytest.approx(21 * 8 / 30)
    few = progress.Throughput(window_seconds=30.0, window_steps=4)
    for samples in (100, 1, 1, 1, 1):
        few.add(0.5, samples, 0)
    assert few.samples_per_second() == 2.0  # only the newest 4 steps count
    assert few.tokens_per_second() == 0.0


def test_file_sink_and_reporter_throttle(tmp_path: Path) -> None:
    sink = progress.make_sink(f"file:{tmp_path / 'p.jsonl'}")
    reporter = progress.Reporter(sink, str(tmp_path / "ck"), interval_seconds=3600)
    p = progress.Progress(node_rank=0, train_start_time=0.0)
    assert reporter.report(p) is True
    assert reporter.report(p) is False  # throttled
    assert reporter.report(p, force=True) is True
    lines = (tmp_path / "p.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert progress.load_node_state(str(tmp_path / "ck"), 0) == json.loads(lines[-1])
    assert isinstance(progress.make_sink("none"), progress.NoSink)
    with pytest.raises(ValueError, match="RTJ_PROGRESS_SINK"):
        progress.make_sink("carrier-pigeon")


def test_several_sinks_each_throttled_on_its_own(tmp_path: Path) -> None:
    every, throttled = tmp_path / "every.jsonl", tmp_path / "throttled.jsonl"
    sink = progress.make_sink(f"file:{every}, file:{throttled}@3600")
    assert isinstance(sink, progress.MultiSink)
    reporter = progress.Reporter(sink, str(tmp_path / "ck"), interval_seconds=0)
    p = progress.Progress(node_rank=0, train_start_time=0.0)
    for step in range(1, 6):
        p.step = step
        assert reporter.report(p) is True
    # A restart is urgent: it reaches the throttled sink at once.
    p.restarts_in_job = 1
    reporter.report(p)
    every_lines = [json.loads(line) for line in every.read_text().splitlines()]
    throttled_lines = [json.loads(line) for line in throttled.read_text().splitlines()]
    assert [r["step"] for r in every_lines] == [1, 2, 3, 4, 5, 5]
    assert [(r["step"], r["restarts"]["inJob"]) for r in throttled_lines] == [(1, 0), (5, 1)]
    with pytest.raises(ValueError, match="RTJ_PROGRESS_SINK"):
        progress.make_sink(" , ")


def test_a_sink_with_its_own_cadence_is_not_held_to_the_interval(tmp_path: Path) -> None:
    """`file:x@0` (the demo's timeline) takes every step; the endpoint, the other sinks and the node
    state keep their cadence, so a step costs one line, not three file writes."""
    timeline, slow, live = tmp_path / "timeline.jsonl", tmp_path / "slow.jsonl", tmp_path / "progress.json"
    sink = progress.make_sink(
        f"endpoint,file:{timeline}@0,file:{slow}", {progress.PROGRESS_FILE_ENV: str(live)}
    )
    reporter = progress.Reporter(
        sink, str(tmp_path / "ck"), interval_seconds=3600, live_interval_seconds=3600
    )
    p = progress.Progress(node_rank=0, train_start_time=0.0)
    for step in range(1, 6):
        p.step = step
        reporter.report(p)
    assert [json.loads(line)["step"] for line in timeline.read_text().splitlines()] == [1, 2, 3, 4, 5]
    assert [json.loads(line)["step"] for line in slow.read_text().splitlines()] == [1]
    assert json.loads(live.read_text())["step"] == 1
    assert progress.load_node_state(str(tmp_path / "ck"), 0)["step"] == 1
    # A cadence of a few seconds holds that sink back, whatever the interval (0 here: every report).
    held = tmp_path / "held.jsonl"
    reporter = progress.Reporter(
        progress.make_sink(f"file:{held}@3600"), str(tmp_path / "ck"), interval_seconds=0
    )
    for step in range(6, 9):
        p.step = step
        reporter.report(p)
    assert [json.loads(line)["step"] for line in held.read_text().splitlines()] == [6]
    assert progress.load_node_state(str(tmp_path / "ck"), 0)["step"] == 8


@pytest.mark.slow
def test_spare_idles_until_sigterm(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    launcher = Path(sys.executable).parent / "rtj-launch"
    proc = subprocess.Popen(
        [str(launcher), "--", "rtj-train"],
        env={**os.environ, "RTJ_ROLE": "spare", "TMPDIR": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        for line in proc.stdout:
            if b"hot spare" in line:
                break
            assert time.monotonic() < deadline
        assert proc.poll() is None  # holding the node, not training, not exiting
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            import psutil

            p = psutil.Process(proc.pid)
            raise AssertionError((p.status(), p.threads(), proc.stdout.read1(100000))) from None
        assert rc == 0
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_rank_that_finished_ends_0_when_the_stores_host_left_before_the_last_barrier() -> None:
    """The error a store client meets once its host's process is gone (what NVRx's termination barrier
    met on rank 3 in make test run m12, after rank 0 had finished and exited) ends a rank that had
    finished as done, and any rank that had not as the fault it is."""
    from rtj_localcluster.ports import reserve_port
    from rtj_trainer.reference.train import finished_before_a_peer_left

    port = reserve_port()
    host = subprocess.Popen(
        [sys.executable, "-c", HOST_A_STORE, str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert host.stdout is not None and host.stdout.readline().strip() == "serving"
        client = torch.distributed.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
        client.set("arrived", "0,1,2")
        host.kill()
        host.wait()
        with pytest.raises(torch.distributed.DistError) as raised:
            client.get("arrived")
    finally:
        host.kill()
        host.wait()
        if host.stdout is not None:
            host.stdout.close()
    assert finished_before_a_peer_left(raised.value, finished=True)
    assert not finished_before_a_peer_left(raised.value, finished=False)
    assert not finished_before_a_peer_left(RuntimeError("step 12 raised"), finished=True)


def test_a_rank_ending_after_the_wrappers_error_exits_though_a_thread_it_left_runs() -> None:
    """NVRx's ProgressWatchdog is no daemon and outlives an error out of the in-process wrapper: the
    rank that finished ends 0 at once, with what it wrote flushed, instead of the interpreter waiting
    for the thread forever (and its node's ft_launcher with it)."""
    script = (
        "import threading, time\n"
        "from rtj_trainer.reference.train import exit_leaving_threads\n"
        "threading.Thread(target=time.sleep, args=(600,), daemon=False).start()\n"
        "print('finished', end='')\n"
        "exit_leaving_threads(0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout) == (0, "finished"), done.stderr


HOST_A_STORE = """
import sys, time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=True, wait_for_workers=False)
print("serving", flush=True)
time.sleep(600)
"""
