"""The launcher view of a pod's ranks (rtj_trainer.runtime.launcher_view) and the report the endpoint serves
from it: generations of rank processes, in-job restarts and their recovery events, the start-up
failure rule, the merge with the library's report, and rtj-launch's record history."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from rtj_contract import termination
from rtj_localcluster.ports import reserve_port
from rtj_trainer.library import failed_step, progress
from rtj_trainer.runtime import endpoint, launch, launcher_view, rankshim
from rtj_trainer.runtime.launcher_view import LauncherView, RankRecord, StartupFailure

T0 = 1_700_000_000.0


def rank(local_rank: int, pid: int, start: float, **fields: Any) -> RankRecord:
    return RankRecord(local_rank=local_rank, pid=pid, start_epoch=T0 + start, **fields)


def ended(record: RankRecord, at: float, code: int, *lines: str) -> RankRecord:
    return RankRecord(
        **{**record.__dict__, "end_epoch": T0 + at, "exit_code": code, "last_error_lines": tuple(lines)}
    )


def stepped(record: RankRecord, first: tuple[int, float], last: tuple[int, float], loss: float) -> RankRecord:
    return RankRecord(
        **{
            **record.__dict__,
            "first_step": first[0],
            "first_step_epoch": T0 + first[1],
            "step": last[0],
            "step_epoch": T0 + last[1],
            "loss": loss,
        }
    )


# One crash: local rank 1 fails at t=30; ft_launcher restarts both ranks (restart count 1) at t=34,
# and the new generation's first step is at t=40.
GEN0 = [
    ended(stepped(rank(0, 10, 0.0), (1, 5.0), (20, 29.0), 0.5), 31.0, 143),
    ended(rank(1, 11, 0.1), 30.0, 1, "Traceback (most recent call last):", "RuntimeError: boom"),
]
GEN1 = [
    stepped(rank(0, 20, 34.0, restart_count=1), (1, 40.0), (7, 46.0), 0.9),
    rank(1, 21, 34.1, restart_count=1),
]


def test_a_restart_is_a_new_generation_with_a_recovery_event() -> None:
    gens = launcher_view.generations(GEN1 + GEN0)
    assert [[r.pid for r in g] for g in gens] == [[10, 11], [20, 21]]
    view = launcher_view.launcher_view(GEN0 + GEN1, step_pattern_set=True)
    assert view.in_job_restarts == 1
    assert view.ranks_json() == {
        "running": 2,
        "startTime": progress.rfc3339(T0 + 34.0),
        "restartCount": 1,
    }
    assert (view.step, view.loss) == (7, 0.9)  # local rank 0's newest line
    [event] = view.events
    # The fault: the first failure's end (rank 1 at 30, not rank 0's SIGTERM at 31); the recovery:
    # the new generation's first step.
    assert event == {
        "time": progress.rfc3339(T0 + 40.0),
        "kind": "InJobRestart",
        "step": 1,
        "recoverySeconds": 10.0,
        "faultTime": progress.rfc3339(T0 + 30.0),
        "faultEpoch": T0 + 30.0,
        "recoveredEpoch": T0 + 40.0,
        "stepsLost": None,
        "resumedFrom": "unknown",
        "source": "Launcher",
    }
    # The same keys as the library's events, plus where it comes from.
    library_event = progress.RecoveryEvent("InJobRestart", 1, T0, T0 + 1, 0, "checkpoint").to_json()
    assert set(event) == set(library_event) | {"source"}


def test_without_a_step_pattern_a_recovery_ends_when_the_ranks_started() -> None:
    plain = [rank(0, 10, 0.0), rank(1, 11, 0.0)]
    first = [ended(plain[0], 30.0, 0), ended(plain[1], 29.5, 0)]  # no failure: the earliest end
    again = [rank(0, 20, 33.0, restart_count=1), rank(1, 21, 33.2, restart_count=1)]
    view = launcher_view.launcher_view(first + again, step_pattern_set=False)
    [event] = view.events
    assert (event["faultEpoch"], event["recoveredEpoch"], event["step"]) == (T0 + 29.5, T0 + 33.0, None)
    assert event["recoverySeconds"] == 3.5 and view.step is None


def test_with_a_step_pattern_a_recovery_without_a_step_yet_is_counted_but_not_timed() -> None:
    waiting = [rank(0, 20, 34.0, restart_count=1), rank(1, 21, 34.0, restart_count=1)]
    view = launcher_view.launcher_view(GEN0 + waiting, step_pattern_set=True)
    assert view.in_job_restarts == 1 and view.events == ()
    # The step stays the newest one seen (the old generation's) until the new one prints.
    assert view.step == 20


def test_generations_without_the_restart_count_and_after_a_membership_change() -> None:
    # The count stays 0 (no TORCHELASTIC_RESTART_COUNT, or a restart for a node joining): a local
    # rank seen again starts the next generation.
    records = [
        ended(rank(0, 1, 0.0), 10.0, 1),
        ended(rank(1, 2, 0.0), 10.5, 143),
        ended(rank(0, 3, 12.0), 20.0, 1),
        rank(1, 4, 12.1),
        rank(0, 5, 22.0),
    ]
    gens = launcher_view.generations(records)
    assert [[r.pid for r in g] for g in gens] == [[1, 2], [3, 4], [5]]
    # Rank 1's pid 4 has no exit record and no successor: running (rtj-launch closes it when its
    # shim is gone), as is rank 0's pid 5.
    assert launcher_view.launcher_view(records, step_pattern_set=False).running == 2


def test_a_process_replaced_before_its_exit_record_was_read_counts_as_ended() -> None:
    records = [rank(0, 1, 0.0), rank(0, 2, 5.0, restart_count=1)]
    settled = launcher_view.settled(records)
    assert settled[0].end_epoch == T0 + 5.0 and settled[1].running
    view = launcher_view.launcher_view(records, step_pattern_set=False)
    assert view.running == 1 and view.in_job_restarts == 1


def test_a_replacement_node_starts_at_a_higher_count_without_a_restart() -> None:
    late = [rank(0, 1, 0.0, restart_count=3), rank(1, 2, 0.0, restart_count=3)]
    view = launcher_view.launcher_view(late, step_pattern_set=False)
    assert view.in_job_restarts == 0 and view.ranks_json()["restartCount"] == 3


def test_events_keep_the_newest_max_events() -> None:
    records = []
    for generation in range(progress.MAX_EVENTS + 5):
        start = generation * 10.0
        records.append(ended(rank(0, 100 + generation, start, restart_count=generation), start + 5, 1))
    view = launcher_view.launcher_view(records, step_pattern_set=False)
    assert view.in_job_restarts == progress.MAX_EVENTS + 4
    assert len(view.events) == progress.MAX_EVENTS
    assert view.events[-1]["recoveredEpoch"] == T0 + (progress.MAX_EVENTS + 4) * 10.0


def test_step_and_loss_come_from_local_rank_0_else_any_rank() -> None:
    other = [stepped(rank(1, 2, 0.0), (3, 1.0), (9, 5.0), 0.25), rank(0, 1, 0.0)]
    view = launcher_view.launcher_view(other, step_pattern_set=True)
    assert (view.step, view.loss) == (9, 0.25)
    both = [*other[:1], stepped(rank(0, 1, 0.0), (2, 1.0), (8, 4.0), 0.5)]
    assert launcher_view.launcher_view(both, step_pattern_set=True).step == 8


# --- start-up failure -----------------------------------------------------------------------------


def failing_generation(
    count: int, start: float, code: int = 2, line: str = "no such file"
) -> list[RankRecord]:
    return [
        ended(rank(0, 100 + count * 2, start, restart_count=count), start + 1.0, code, "x", line),
        ended(rank(1, 101 + count * 2, start, restart_count=count), start + 1.5, 143),
    ]


def test_two_generations_failing_alike_before_a_step_are_a_startup_failure() -> None:
    records = failing_generation(0, 0.0) + failing_generation(1, 10.0)
    failure = launcher_view.startup_failure(records, step_pattern_set=False)
    assert failure == StartupFailure(2, "no such file")
    assert failure.message == (
        "FaultReason: StartupFailed\n"
        "the training command failed the same way on 2 tries before its first step: exit 2: no such file"
    )
    # One try is not enough.
    assert launcher_view.startup_failure(failing_generation(0, 0.0), step_pattern_set=False) is None


@pytest.mark.parametrize(
    ("second", "pattern"),
    [
        (failing_generation(1, 10.0, code=1), False),  # another exit code
        (failing_generation(1, 10.0, line="other"), False),  # another last error line
        # Without a pattern, a failure 150 s after its generation started is not one of starting.
        ([ended(rank(0, 102, 10.0, restart_count=1), 160.0, 2, "no such file")], False),
        ([stepped(failing_generation(1, 10.0)[0], (1, 10.5), (1, 10.5), 1.0)], True),  # it stepped
    ],
)
def test_no_startup_failure_when_the_tries_differ_or_training_began(
    second: list[RankRecord], pattern: bool
) -> None:
    records = failing_generation(0, 0.0) + second
    assert launcher_view.startup_failure(records, step_pattern_set=pattern) is None


def test_a_script_reporting_through_the_library_has_started() -> None:
    # rtj-train prints no step line: two restarts in a row killed alike (a hang, then an injected
    # SIGKILL, each ending on the same warning line) are no start-up failure when the library
    # reported in between.
    records = failing_generation(0, 0.0, code=137) + failing_generation(1, 10.0, code=137)
    killed_alike = StartupFailure(137, "no such file")
    assert launcher_view.startup_failure(records, step_pattern_set=False) == killed_alike
    for reported in (5.0, 12.0):  # during the first try, or during the second
        assert launcher_view.startup_failure(
            records, step_pattern_set=False, library_report_epoch=T0 + reported
        ) is None  # fmt: skip
    # A report from before these two tries says nothing about them.
    earlier = launcher_view.startup_failure(records, step_pattern_set=False, library_report_epoch=T0 - 1)
    assert earlier == killed_alike


def test_ranks_stopped_by_ft_launcher_did_not_fail_to_start() -> None:
    # Two restarts in a row that another node caused (or a node joining): this node's ranks were
    # stopped with SIGTERM before their first step, and that is all.
    stopped = [
        ended(rank(local, 100 + 2 * count + local, 10.0 * count, restart_count=count), 10.0 * count + 2, 143)
        for count in range(2)
        for local in range(2)
    ]
    assert launcher_view.startup_failure(stopped, step_pattern_set=False) is None
    assert launcher_view.launcher_view(stopped, step_pattern_set=False).in_job_restarts == 1


def test_only_the_newest_tries_are_judged() -> None:
    running = [rank(0, 200, 20.0, restart_count=2), rank(1, 201, 20.0, restart_count=2)]
    records = failing_generation(0, 0.0) + failing_generation(1, 10.0) + running
    assert launcher_view.startup_failure(records, step_pattern_set=False) is None


def test_with_a_step_pattern_a_late_failure_before_the_first_step_still_counts() -> None:
    late = [ended(rank(0, 102, 10.0, restart_count=1), 400.0, 2, "no such file")]
    records = failing_generation(0, 0.0) + late
    assert launcher_view.startup_failure(records, step_pattern_set=True) == StartupFailure(2, "no such file")
    assert launcher_view.startup_failure(records, step_pattern_set=False) is None


# --- the repeated failure rule -----------------------------------------------------------------------


def failing_after(
    count: int, start: float, step: int | None, code: int = 1, line: str = "ValueError: bad batch 0x7f3a"
) -> list[RankRecord]:
    """A generation whose local rank 1 raised after `step` steps (the library's note; None: no note),
    then ft_launcher stopped local rank 0."""
    note = () if step is None else (failed_step.note(step),)
    failing = stepped(
        rank(1, 101 + count * 2, start, restart_count=count), (1, start + 1), (9, start + 2), 1.0
    )
    return [
        ended(rank(0, 100 + count * 2, start, restart_count=count), start + 3.5, 143),
        ended(failing, start + 3.0, code, "Traceback (most recent call last):", line, *note),
    ]


def test_two_generations_failing_alike_after_the_same_step_are_a_repeated_failure() -> None:
    records = failing_after(0, 0.0, 57) + failing_after(1, 10.0, 57, line="ValueError: bad batch 0x7f9c")
    failure = launcher_view.repeated_failure(records, step_pattern_set=False)
    assert failure is not None and (failure.exit_code, failure.step) == (1, 57)
    assert failure.error_line == "ValueError: bad batch 0x7f9c"  # the newest try's, numbers aside
    assert failure.pod_exit_code == termination.NO_RESTART_EXIT_CODE == 93
    assert failure.message == (
        "FaultReason: DeterministicFailure\n"
        "the training failed the same way after step 57 on 2 tries in a row: "
        "exit 1: ValueError: bad batch 0x7f9c"
    )
    # One try is not enough; a third try that ft_launcher started before rtj-launch looked changes
    # nothing (the two before it decided), and neither does a later failure of another kind.
    assert launcher_view.repeated_failure(failing_after(0, 0.0, 57), step_pattern_set=False) is None
    running = [rank(0, 200, 20.0, restart_count=2), rank(1, 201, 20.0, restart_count=2)]
    assert launcher_view.repeated_failure(records + running, step_pattern_set=False) == failure
    other = failing_after(2, 20.0, 12, line="KeyError: 'labels'")
    assert launcher_view.repeated_failure(records + other, step_pattern_set=False) == failure
    # Alike but not consecutive: another failure in between.
    apart = failing_after(0, 0.0, 57) + failing_after(1, 10.0, 12) + failing_after(2, 20.0, 57)
    assert launcher_view.repeated_failure(apart, step_pattern_set=False) is None


@pytest.mark.parametrize(
    "second",
    [
        failing_after(1, 10.0, 58),  # another step
        failing_after(1, 10.0, 57, code=2),  # another exit code
        failing_after(1, 10.0, 57, line="KeyError: 'labels'"),  # another error
        failing_after(1, 10.0, None),  # no note and no pattern: the step is unknown
        failing_after(1, 10.0, 57, code=137),  # killed by a signal (the note is a stale line)
        failing_after(1, 10.0, 57, code=75),  # left for a peer's drain
    ],
)
def test_no_repeated_failure_when_the_tries_differ_or_say_no_step(second: list[RankRecord]) -> None:
    records = failing_after(0, 0.0, 57) + second
    assert launcher_view.repeated_failure(records, step_pattern_set=False) is None


def test_with_a_step_pattern_the_last_printed_step_stands_in_for_the_note() -> None:
    records = failing_after(0, 0.0, None) + failing_after(1, 10.0, None)
    failure = launcher_view.repeated_failure(records, step_pattern_set=True)
    assert failure is not None and failure.step == 9
    assert launcher_view.repeated_failure(records, step_pattern_set=False) is None


def test_a_generation_whose_first_failure_is_a_signal_is_not_judged_by_what_followed() -> None:
    # Local rank 0 SIGKILLed first; local rank 1's exception (with its note) only followed from it.
    def killed_first(count: int, start: float) -> list[RankRecord]:
        killed = ended(rank(0, 100 + count * 2, start, restart_count=count), start + 2.0, 137)
        return [killed, *failing_after(count, start, 57)[1:]]

    records = killed_first(0, 0.0) + killed_first(1, 10.0)
    assert launcher_view.repeated_failure(records, step_pattern_set=False) is None


def test_the_note_is_found_among_the_last_lines_and_only_as_a_whole_line() -> None:
    assert failed_step.step_in(["x", failed_step.note(3), "  " + failed_step.note(12) + "  "]) == 12
    assert failed_step.step_in(["print: rtj_trainer: failed after step 3"]) is None
    assert failed_step.step_in([]) is None


# --- the served report ----------------------------------------------------------------------------


def test_merge_without_a_library_report_is_the_launcher_view() -> None:
    view = launcher_view.launcher_view(GEN0 + GEN1, step_pattern_set=True)
    report = launcher_view.merge(None, view, now=T0 + 50, node_rank=3, launch_start=T0 - 5)
    assert report == {
        "v": 1,
        "time": progress.rfc3339(T0 + 50),
        "nodeRank": 3,
        "step": 7,
        "loss": 0.9,
        "restarts": {"inProcess": 0, "inJob": 1},
        "events": list(view.events),
        "finished": False,
        "trainStartTime": progress.rfc3339(T0 - 5),
        "ranks": view.ranks_json(),
        "sources": {"step": "LogPattern", "restarts": "Launcher"},
    }
    # No step matched (or no pattern): the step is not reported at all.
    quiet = launcher_view.merge(None, LauncherView(running=2), now=T0, node_rank=0, launch_start=T0)
    assert quiet is not None and "step" not in quiet and "loss" not in quiet
    assert quiet["sources"] == {"step": "NotReported", "restarts": "Launcher"}
    assert launcher_view.merge(None, None, now=T0, node_rank=0, launch_start=T0) is None


def test_merge_keeps_every_field_of_the_library_report() -> None:
    p = progress.Progress(node_rank=1, train_start_time=T0)
    p.step, p.loss, p.restarts_in_job = 42, 1.5, 4
    library = progress.progress_json(p, now=T0 + 10)
    assert library["library"] == progress.LIBRARY_VERSION
    view = launcher_view.launcher_view(GEN0 + GEN1, step_pattern_set=True)
    report = launcher_view.merge(library, view, now=T0 + 99, node_rank=1, launch_start=T0)
    assert report == {
        **library,
        "ranks": view.ranks_json(),
        "sources": {"step": "Library", "restarts": "Library"},
    }
    # The direct and supervisor modes keep no rank records: no ranks, the library's figures.
    alone = launcher_view.merge(library, None, now=T0, node_rank=1, launch_start=T0)
    assert alone is not None and "ranks" not in alone
    assert alone["sources"] == {"step": "Library", "restarts": "Library"}


def test_parse_record_reads_the_shims_json_and_rejects_what_is_not_one() -> None:
    record = rankshim.RankRecord(None, pid=7, start_epoch=T0, restart_count=2)
    record.step_seen(5, 0.5, T0 + 1)
    record.error_line("boom")
    record.ended(1, T0 + 2)
    parsed = launcher_view.parse_record(3, record.snapshot())
    assert parsed == RankRecord(
        local_rank=3,
        pid=7,
        start_epoch=T0,
        restart_count=2,
        step=5,
        loss=0.5,
        step_epoch=T0 + 1,
        first_step=5,
        first_step_epoch=T0 + 1,
        exit_code=1,
        end_epoch=T0 + 2,
        last_error_lines=("boom",),
    )
    assert launcher_view.parse_record(0, {"pid": "7", "startEpoch": T0}) is None
    assert launcher_view.parse_record(0, [1, 2]) is None
    odd = launcher_view.parse_record(0, {"pid": 7, "startEpoch": T0, "step": "x", "exitCode": True})
    assert odd is not None and odd.step is None and odd.exit_code is None and odd.running


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_endpoint_serves_the_launcher_view_before_any_library_report(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    current: dict[str, LauncherView | None] = {"view": None}
    server = endpoint.ProgressEndpoint(
        path, reserve_port(), view=lambda: current["view"], node_rank=2, launch_start=T0
    )
    assert server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert get(base + "/progress")[0] == 404  # neither a report nor a view
        current["view"] = LauncherView(running=2, start_epoch=T0, step=12, loss=0.75, in_job_restarts=1)
        status, body = get(base + "/progress")
        report = json.loads(body)
        assert status == 200 and report["step"] == 12 and report["nodeRank"] == 2
        assert report["sources"] == {"step": "LogPattern", "restarts": "Launcher"}
        assert report["ranks"]["running"] == 2 and report["restarts"] == {"inProcess": 0, "inJob": 1}
        text = get(base + "/metrics")[1].decode()
        assert "rtj_trainer_step 12" in text and 'rtj_trainer_restarts_total{layer="in_job"} 1' in text
        # Read: delivered, whatever the time says; a changed view needs another read. The handler
        # marks a report served after writing its body, which the client may see first: wait for it.
        assert server.wait_delivered(5)
        current["view"] = LauncherView(running=0, start_epoch=T0, step=13)
        assert not server.wait_delivered(0.2)
        get(base + "/progress")
        assert server.wait_delivered(5)
        # The library's report wins once it exists.
        p = progress.Progress(node_rank=2, train_start_time=T0)
        p.step = 99
        progress.EndpointSink(str(path)).send(progress.progress_json(p, now=T0 + 1))
        report = json.loads(get(base + "/progress")[1])
        assert report["step"] == 99 and report["sources"]["step"] == "Library"
        assert report["ranks"]["running"] == 0
    finally:
        server.close()


# --- rtj-launch's record history --------------------------------------------------------------------


def write_record(directory: Path, local_rank: int, **fields: Any) -> None:
    record = {
        "pid": 1,
        "startEpoch": T0,
        "restartCount": 0,
        "step": None,
        "loss": None,
        "stepEpoch": None,
        "firstStep": None,
        "firstStepEpoch": None,
        "exitCode": None,
        "endEpoch": None,
        "lastErrorLines": [],
        **fields,
    }
    (directory / rankshim.record_name(local_rank, record["pid"])).write_text(json.dumps(record))


def test_history_reads_every_generations_end_however_late_it_looks(tmp_path: Path) -> None:
    # Two generations of local rank 0 failed the same way after step 3 before rtj-launch's first read
    # (a loaded machine): each process has its own record, so both failures count.
    failures: list[object] = []
    history = launch.RankHistory(
        tmp_path, step_pattern_set=True, on_failure=failures.append, alive=lambda pid: False
    )
    for pid, start in ((101, T0), (201, T0 + 10)):
        write_record(
            tmp_path,
            0,
            pid=pid,
            startEpoch=start,
            restartCount=pid // 100 - 1,
            step=3,
            stepEpoch=start + 2,
            firstStep=1,
            firstStepEpoch=start + 1,
            exitCode=1,
            endEpoch=start + 3,
            lastErrorLines=["ValueError: bad batch"],
        )
    history.scan(now=T0 + 20)
    assert sorted(r.pid for r in history.records()) == [101, 201]
    assert [type(f).__name__ for f in failures] == ["RepeatedFailure"]


def test_history_keeps_replaced_records_and_closes_those_of_dead_shims(tmp_path: Path) -> None:
    alive = {101, 102, 201}
    failures: list[StartupFailure] = []
    history = launch.RankHistory(
        tmp_path, step_pattern_set=False, on_failure=failures.append, alive=lambda pid: pid in alive
    )
    write_record(tmp_path, 0, pid=101)
    write_record(tmp_path, 1, pid=102)
    (tmp_path / "rank-x.json").write_text("{}")  # not a rank: ignored
    history.scan(now=T0 + 1)
    assert history.view().running == 2
    # Rank 1's shim is killed: its file still says running.
    alive.discard(102)
    history.scan(now=T0 + 5)
    records = {r.pid: r for r in history.records()}
    assert records[102].end_epoch == T0 + 5 and records[101].running
    # ft_launcher restarts the group: each file now holds a new process; the old ones are kept.
    write_record(tmp_path, 0, pid=201, startEpoch=T0 + 8, restartCount=1)
    write_record(tmp_path, 1, pid=202, startEpoch=T0 + 8, restartCount=1, exitCode=2, endEpoch=T0 + 9)
    history.scan(now=T0 + 10)
    assert {r.pid for r in history.records()} == {101, 102, 201, 202}
    view = history.view()
    assert view.in_job_restarts == 1 and view.running == 1
    assert not failures
    history.scan(now=T0 + 11, ended=True)  # ft_launcher exited: nothing runs any more
    assert history.view().running == 0


def test_history_reports_a_startup_failure_once(tmp_path: Path) -> None:
    failures: list[StartupFailure] = []
    history = launch.RankHistory(
        tmp_path, step_pattern_set=False, on_failure=failures.append, alive=lambda pid: False
    )
    lines = ["python: can't open file '/app/train.py': [Errno 2] No such file or directory"]
    for count in range(3):
        write_record(
            tmp_path, 0, pid=10 + count, startEpoch=T0 + 10 * count, restartCount=count,
            exitCode=2, endEpoch=T0 + 10 * count + 1, lastErrorLines=lines,
        )  # fmt: skip
        history.scan(now=T0 + 10 * count + 2)
    assert failures == [StartupFailure(2, lines[0])]
    assert history.failure == failures[0]


def test_history_takes_a_library_report_for_a_start(tmp_path: Path) -> None:
    failures: list[StartupFailure] = []
    history = launch.RankHistory(
        tmp_path, step_pattern_set=False, on_failure=failures.append, alive=lambda pid: False
    )
    history.library_report = tmp_path / "progress.json"
    for count in range(2):
        write_record(
            tmp_path, 0, pid=10 + count, startEpoch=T0 + 10 * count, restartCount=count,
            exitCode=137, endEpoch=T0 + 10 * count + 5, lastErrorLines=["killed"],
        )  # fmt: skip
        # The library reported while this try ran (the file's time says when).
        history.library_report.write_text("{}")
        os.utime(history.library_report, (T0 + 10 * count + 1, T0 + 10 * count + 1))
        history.scan(now=T0 + 10 * count + 6)
    assert failures == [] and history.failure is None
