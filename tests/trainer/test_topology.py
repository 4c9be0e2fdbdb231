"""The memory tier across failure domains (rtj_trainer.reference.topology): every replica holder in
another zone where the topology allows it, the next node where it does not, a permutation every
rank computes alike; and the hot spare chosen for a lost node."""

from __future__ import annotations

import random

import pytest
from rtj_trainer.reference import replica, topology

pytestmark = pytest.mark.nvrx_independent

K = 8  # ranks per node


def zones(*counts: int) -> list[str]:
    """Nodes in zones a, b, c, ... of the given sizes, listed zone by zone (the worst order for a
    ring that ignores zones: most neighbours share one)."""
    return [f"zone-{chr(ord('a') + z)}" for z, count in enumerate(counts) for _ in range(count)]


def node_of(rank: int) -> int:
    return rank // K


def assert_a_derangement(holders: list[int]) -> None:
    assert sorted(holders) == list(range(len(holders)))
    assert all(h != r for r, h in enumerate(holders))


@pytest.mark.parametrize("counts", [(43, 43, 42), (60, 40, 28), (64, 64), (64, 32, 32), (3, 2, 2)])
def test_every_holder_is_in_another_zone(counts: tuple[int, ...]) -> None:
    domains = zones(*counts)
    rng = random.Random(sum(counts))
    for layout in (domains, rng.sample(domains, len(domains))):  # zone by zone, and shuffled
        holders = topology.replica_holders(layout, K)
        assert_a_derangement(holders)
        assert all(layout[node_of(h)] != layout[node_of(r)] for r, h in enumerate(holders))
        # Local rank l of a node sends to local rank l of its holder node.
        assert all(h % K == r % K for r, h in enumerate(holders))


def test_one_zone_keeps_the_next_node_as_the_stride_ring_does() -> None:
    holders = topology.replica_holders(zones(128), K)
    assert holders == [(r + K) % (128 * K) for r in range(128 * K)]
    unknown = topology.replica_holders([""] * 128, K)
    assert unknown == holders


def test_a_ring_that_already_alternates_is_kept() -> None:
    alternating = ["a", "b"] * 64
    assert topology.ring_order(alternating) == list(range(128))


def test_a_majority_zone_gets_as_many_holders_elsewhere_as_possible() -> None:
    domains = zones(100, 28)  # 100 nodes in one zone: at least 72 must hold for their own zone
    holders = topology.replica_holders(domains, K)
    assert_a_derangement(holders)
    crossing = sum(domains[node_of(h)] != domains[node_of(r)] for r, h in enumerate(holders)) // K
    assert crossing == 2 * 28  # each minority node sends across and is sent to from across


def test_random_topologies_give_derangements_across_zones_when_no_zone_is_a_majority() -> None:
    rng = random.Random(7)
    for _ in range(300):
        nodes = rng.randint(2, 160)
        per_node = rng.choice((1, 2, 8))
        domains = [rng.choice("abcde"[: rng.randint(1, 5)]) for _ in range(nodes)]
        holders = topology.replica_holders(domains, per_node)
        assert_a_derangement(holders)
        assert holders == topology.replica_holders(list(domains), per_node)  # deterministic
        if len(set(domains)) > 1 and max(domains.count(d) for d in set(domains)) <= nodes // 2:
            assert all(domains[h // per_node] != domains[r // per_node] for r, h in enumerate(holders))


def test_single_node_and_world_of_one() -> None:
    assert topology.replica_holders(["a"], 8) == [1, 2, 3, 4, 5, 6, 7, 0]
    assert topology.replica_holders(["a"], 1) == [0]


def test_node_domains_are_unknown_where_a_nodes_ranks_disagree() -> None:
    assert topology.node_domains(["a", "a", "b", "c"], 2) == ["a", ""]


def test_the_memory_tier_pairs_across_zones_once_it_knows_them() -> None:
    tier = replica.MemoryTier(stride=2)
    assert tier.peers(0, 8) == (2, 6)  # no domains: stride ahead and behind
    tier.domains = ("a", "a", "a", "a", "b", "b", "b", "b")  # nodes 0, 1 in a; 2, 3 in b
    holders = [tier.peers(r, 8) for r in range(8)]
    assert [h for h, _ in holders] == topology.replica_holders(["a", "a", "b", "b"], 2)
    assert all(tier.domains[h] != tier.domains[r] for r, (h, _) in enumerate(holders))
    assert all(holders[h][1] == r for r, (h, _) in enumerate(holders))  # source is the inverse
    tier.domains = ("a",) * 4  # a world of another size: the stride ring
    assert tier.peers(1, 8) == (3, 7)
    assert replica.MemoryTier(stride=4).peers(0, 1) is None


def test_a_spare_in_the_lost_nodes_zone_is_preferred() -> None:
    domains = {0: "a", 1: "b", 2: "c", 3: "a", 10: "c", 11: "a", 12: "b"}
    assert topology.assign_spares([0], [10, 11, 12], domains, active=[0, 1, 2, 3]) == {0: 11}
    assert topology.assign_spares([1, 2], [10, 11, 12], domains, active=[0, 1, 2, 3]) == {1: 12, 2: 10}


def test_without_a_spare_in_its_zone_the_least_populated_zone_gets_it() -> None:
    domains = {0: "a", 1: "a", 2: "b", 3: "c", 4: "c", 10: "b", 11: "c"}
    # Node 0 lost: zone a has no spare; b has 1 active node, c 2: the spare in b.
    assert topology.assign_spares([0], [11, 10], domains, active=[0, 1, 2, 3, 4]) == {0: 10}
    # More lost nodes than spares: the first lost ones get them, the rest none. With 3 and 4 lost
    # too, zone c has no active node left: node 0's spare is c's, and node 3 (in c) takes b's.
    assert topology.assign_spares([3, 0, 4], [10, 11], domains, active=[0, 1, 2, 3, 4]) == {0: 11, 3: 10}
