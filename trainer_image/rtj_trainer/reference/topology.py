"""Failure domains in the memory tier (``replica``): which node holds a node's replicas, and which hot
spare takes over a lost node, so that one domain's outage (a zone's) does not take a state and its
only copy together. Pure functions: every rank computes the same answer from the same table.

A node's domain is a string (its zone: ``topology.kubernetes.io/zone``), or ``""`` when unknown. Each
rank reads its own from ``RTJ_NODE_ZONE`` (``NODE_ZONE_ENV``) and the ranks exchange them
(``replica.world_domains``); with no domain known the pairing is the one ``replica.peer_offset``
gives, the next node in the ring.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Final

from rtj_contract import env as env_names

NODE_ZONE_ENV: Final = env_names.NODE_ZONE
"""The node's zone, which the operator renders into every trainer container (downward API:
``metadata.labels['topology.kubernetes.io/zone']``, a label the API server copies onto the pod from
its node at binding, Kubernetes 1.35 on; empty where it does not, and the pairing then stays the
next node's). Its presence makes every rank exchange domains: it is rendered for every pod of a job."""


def ring_order(domains: Sequence[str]) -> list[int]:
    """The nodes (indices into ``domains``) in ring order: each node's replicas go to the next one.

    The order of the nodes as they are (0, 1, ..., n-1) when it already puts neighbours in different
    domains, or when there is nothing to separate (one domain, or a node's domain unknown).
    Otherwise the nodes sorted by domain, largest domain first (ties by name, then node index), are
    dealt to the even places of the ring and then to the odd ones: when no domain holds more than
    half the nodes no two neighbours share one; when one does, its surplus nodes neighbour each other
    (no pairing can avoid that: a permutation gives each node one holder and holds one node)."""
    n = len(domains)
    if n <= 1 or "" in domains or len(set(domains)) == 1 or _alternates(domains, range(n)):
        return list(range(n))
    counts = Counter(domains)
    ranked = sorted(range(n), key=lambda i: (-counts[domains[i]], domains[i], i))
    places = [*range(0, n, 2), *range(1, n, 2)]
    order = [0] * n
    for place, node in zip(places, ranked, strict=True):
        order[place] = node
    return order


def _alternates(domains: Sequence[str], order: Sequence[int]) -> bool:
    n = len(order)
    return all(domains[order[i]] != domains[order[(i + 1) % n]] for i in range(n))


def replica_holders(domains: Sequence[str], ranks_per_node: int) -> list[int]:
    """``holders[r]``: the rank that holds rank ``r``'s replica, for a world of ``len(domains)`` nodes
    of ``ranks_per_node`` ranks (rank ``r`` on node ``r // ranks_per_node``). Local rank ``l`` of a
    node sends to local rank ``l`` of the next node in :func:`ring_order`; a single node sends to
    its next rank. A permutation with no fixed point (a world of one: ``[0]``)."""
    if ranks_per_node < 1:
        raise ValueError(f"ranks per node must be >= 1, got {ranks_per_node}")
    n, k = len(domains), ranks_per_node
    world = n * k
    if world <= 1:
        return [0] * world
    if n == 1:
        return [(r + 1) % world for r in range(world)]
    order = ring_order(domains)
    following = {order[i]: order[(i + 1) % n] for i in range(n)}
    return [following[r // k] * k + r % k for r in range(world)]


def node_domains(rank_domains: Sequence[str], ranks_per_node: int) -> list[str]:
    """Each node's domain from its ranks' (rank ``r`` on node ``r // ranks_per_node``); ``""`` for a
    node whose ranks disagree (its domain is not known)."""
    nodes = len(rank_domains) // ranks_per_node
    out = []
    for node in range(nodes):
        seen = set(rank_domains[node * ranks_per_node : (node + 1) * ranks_per_node])
        out.append(seen.pop() if len(seen) == 1 else "")
    return out


def assign_spares(
    lost: Sequence[int], spares: Sequence[int], domains: Mapping[int, str], active: Sequence[int]
) -> dict[int, int]:
    """Which spare node takes over each lost node: ``{lost node: spare node}``.

    Lost nodes in ascending order each take, among the spares left, one in the lost node's own
    domain (the world keeps its mix of domains, so :func:`ring_order` keeps every holder in another
    domain); else one in the domain with the fewest active nodes now (ties by domain name), so no
    domain grows towards more than half the world; the lowest-numbered such spare. A lost node left
    without a spare is not in the result (the world cannot go on: ``interrupt.reassign`` raises).
    ``active``: the nodes in the world before the loss, the lost ones included."""
    left = sorted(spares)
    population = Counter(domains.get(node, "") for node in active if node not in set(lost))
    out: dict[int, int] = {}
    for node in sorted(lost):
        if not left:
            break
        own = domains.get(node, "")
        same = [s for s in left if own and domains.get(s, "") == own]
        spare = (
            same[0]
            if same
            else min(left, key=lambda s: (population[domains.get(s, "")], domains.get(s, ""), s))
        )
        left.remove(spare)
        population[domains.get(spare, "")] += 1
        out[node] = spare
    return out
