"""Supervisor mode's pure parts: rank reassignment, the pods' ranks, their exit status, the contract,
the store pod's servers and NVRx's use of the reassignment."""

from __future__ import annotations

import datetime as dt
import os

import pytest
import torch.distributed as dist
from nvidia_resiliency_ext import inprocess
from nvidia_resiliency_ext.inprocess.state import Mode
from rtj_contract import stores
from rtj_localcluster.ports import reserve_port_pair
from rtj_trainer.library import world
from rtj_trainer.library.env import ACTIVE_WORLD_SIZE, EnvError, TrainerEnv
from rtj_trainer.reference.interrupt import WorldBrokenError, reassign
from rtj_trainer.reference.restart import ReplaceFromReserve, StoreClient
from rtj_trainer.runtime import store, supervisor


def test_active_ranks_keep_their_index_and_reserves_close_up() -> None:
    # 4 active, 4 reserve; nothing lost: everyone stays.
    assert [reassign(r, 8, set(), 4) for r in range(8)] == [(r, 8) for r in range(8)]


def test_a_lost_active_rank_is_replaced_by_the_lowest_reserve_rank() -> None:
    terminated = {2}
    got = {r: reassign(r, 8, terminated, 4) for r in range(8) if r not in terminated}
    assert got == {0: (0, 7), 1: (1, 7), 3: (3, 7), 4: (2, 7), 5: (4, 7), 6: (5, 7), 7: (6, 7)}


def test_a_lost_node_takes_two_reserve_ranks_in_order() -> None:
    terminated = {2, 3}
    got = {r: reassign(r, 8, terminated, 4)[0] for r in range(8) if r not in terminated}
    assert got == {0: 0, 1: 1, 4: 2, 5: 3, 6: 4, 7: 5}


def test_a_lost_reserve_rank_only_shrinks_the_reserve() -> None:
    terminated = {5}
    got = {r: reassign(r, 8, terminated, 4)[0] for r in range(8) if r not in terminated}
    assert got == {0: 0, 1: 1, 2: 2, 3: 3, 4: 4, 6: 5, 7: 6}


def test_active_and_reserve_lost_together() -> None:
    # FillGaps would move rank 7 onto the lost rank 6; here the lost active index 3 gets rank 4.
    terminated = {3, 6}
    got = {r: reassign(r, 8, terminated, 4)[0] for r in range(8) if r not in terminated}
    assert got == {0: 0, 1: 1, 2: 2, 4: 3, 5: 4, 7: 5}
    assert sorted(got.values()) == list(range(6))


def test_no_reserve_left_breaks_the_world() -> None:
    with pytest.raises(WorldBrokenError, match=r"2 active rank\(s\) \[2, 3\] lost and 1 reserve"):
        reassign(0, 5, {2, 3}, 4)


def test_a_terminated_rank_is_not_reassigned() -> None:
    with pytest.raises(ValueError, match="terminated"):
        reassign(2, 8, {2}, 4)


def _state(rank: int, world: int) -> inprocess.state.State:
    return inprocess.state.State(rank=rank, world_size=world, initial_rank=rank, initial_world_size=world)


def _assign(rank: int, world: int, terminated: set[int], active: int) -> inprocess.state.State:
    ctx = inprocess.rank_assignment.RankAssignmentCtx(_state(rank, world), None, terminated)
    result = ReplaceFromReserve(active)(ctx)
    assert result.terminated_ranks == set()
    return result.state  # type: ignore[no-any-return]


def test_nvrx_state_after_the_reassignment() -> None:
    reserve = _assign(5, 6, set(), 4)
    assert (reserve.mode, reserve.active_rank, reserve.active_world_size) == (Mode.INACTIVE, None, 4)
    taken = _assign(4, 6, {1}, 4)
    assert (taken.rank, taken.world_size, taken.mode, taken.active_rank, taken.active_world_size) == (
        1,
        5,
        Mode.ACTIVE,
        1,
        4,
    )
    with pytest.raises(inprocess.rank_assignment.RankDiscarded):
        _assign(1, 6, {1}, 4)
    with pytest.raises(WorldBrokenError):
        _assign(0, 5, {1, 2}, 4)


def test_nvrx_sets_the_training_world_from_the_reassignment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "4")
    monkeypatch.setenv("WORLD_SIZE", "6")
    _assign(4, 6, {1}, 4).set_distributed_vars()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"]) == ("1", "4")


def _env(**overrides: str) -> TrainerEnv:
    base = {
        "RTJ_LAUNCH_MODE": "supervisor",
        "RTJ_SLOT": "3",
        "RTJ_SLOTS": "4",
        "RTJ_NNODES": "2",
        "RTJ_NPROC_PER_NODE": "2",
        "RTJ_STORE_HOST": "job-store.job.ns.svc",
        "RTJ_STORE_PORT": "29500",
    }
    return TrainerEnv.from_environ(base | overrides)


def test_each_local_rank_gets_its_slot_global_rank_and_the_store() -> None:
    envs = supervisor.rank_environments(_env(), {"KEEP": "1"}, "10.0.0.9")
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e[ACTIVE_WORLD_SIZE]) for e in envs] == [
        ("6", "0", "8", "4"),
        ("7", "1", "8", "4"),
    ]
    assert {(e["MASTER_ADDR"], e["MASTER_PORT"], e["KEEP"], e["LOCAL_WORLD_SIZE"]) for e in envs} == {
        ("10.0.0.9", "29500", "1", "2")
    }
    # Each rank finds the store pod's two stores where rtj-store serves them.
    from rtj_trainer.reference.train import StorePorts

    served = {29500 + offset for offset in store.WORLD_STORES}
    for rank_env in envs:
        ports = StorePorts.of(int(rank_env["MASTER_PORT"]), TrainerEnv.from_environ(rank_env))
        assert {
            ports.wrapper,
            ports.groups,
        } == served and ports.wrapper == 29500 + stores.WRAPPER_STORE_OFFSET


def test_the_contract_names_what_is_wrong() -> None:
    with pytest.raises(EnvError, match="RTJ_STORE_HOST"):
        _env(RTJ_STORE_HOST="")
    with pytest.raises(EnvError, match="RTJ_SLOT=4 must be below RTJ_SLOTS=4"):
        _env(RTJ_SLOT="4")
    with pytest.raises(EnvError, match="RTJ_MEMORY_INTERVAL_STEPS=-1"):
        _env(RTJ_MEMORY_INTERVAL_STEPS="-1")
    assert _env().supervisor_mode and not TrainerEnv.from_environ({}).supervisor_mode


@pytest.mark.parametrize(
    ("codes", "status"),
    [
        ([0, 0], 0),
        ([137, 0], 0),  # one rank was killed and replaced; its sibling finished the training
        ([137, 137], 137),
        ([0, world.WORLD_BROKEN_EXIT_CODE], world.WORLD_BROKEN_EXIT_CODE),
        ([1, 2], 1),
    ],
)
def test_the_pods_status_from_its_ranks(codes: list[int], status: int) -> None:
    assert supervisor.pod_status(codes) == status


def test_the_store_pod_serves_both_stores_and_tells_a_late_pod_the_world_formed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANK", "0")  # the would-be host rank: it must not host
    port = reserve_port_pair()
    servers = store.serve(port, host="127.0.0.1")
    try:
        assert not supervisor.world_formed("127.0.0.1", port, timeout=10)
        pg = dist.TCPStore(  # type: ignore[attr-defined]
            "127.0.0.1", port + stores.PG_STORE_OFFSET, is_master=False, wait_for_workers=False
        )
        pg.set(world.WORLD_FORMED_KEY, "1")
        assert supervisor.world_formed("127.0.0.1", port, timeout=10)
        wrapper_store = StoreClient(host_name="127.0.0.1", port=port, world_size=8, wait_for_workers=False)
        wrapper_store.set("k", "v")
        assert wrapper_store.get("k") == b"v"
        assert wrapper_store.critical_ranks == ()
        assert not wrapper_store.check([world.WORLD_FORMED_KEY])  # the two stores are apart
    finally:
        del servers


def test_the_wrapper_store_never_hosts_even_on_rank_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    port = reserve_port_pair()
    with pytest.raises(Exception, match=r"(?i)timed out|connect|refused"):
        StoreClient(
            host_name="127.0.0.1",
            port=port,
            world_size=2,
            wait_for_workers=False,
            timeout=dt.timedelta(seconds=1),
        )


def test_the_termination_barrier_takes_ranks_as_the_store_returns_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RANK", "2")
    port = reserve_port_pair()
    servers = store.serve(port, host="127.0.0.1")
    try:
        client = StoreClient(host_name="127.0.0.1", port=port, world_size=4, wait_for_workers=False)
        client.set_initial_rank(0, 0)
        lost = client.get_initial_ranks([0])  # bytes, as the sibling monitor gets them
        client.termination_barrier(ranks=lost, rendezvous_count=4, timeout=dt.timedelta(0))
        # A surviving rank's own barrier at its shutdown reads what the monitor wrote.
        client.termination_barrier(ranks=[2], rendezvous_count=4, timeout=dt.timedelta(0))
        assert sorted(
            client.get_packed(f"{client.BARRIER_PREFIX}:reentrant_barrier:termination_barrier:arrived", ",")[
                :2
            ]
        ) == ["0", "2"]
    finally:
        del servers
