"""World formation and a lost node's reassignment round through the real store pod process, with
stand-in ranks (bench/store_scale.py: NVRx's store calls as the in-process wrapper makes them, the
project's StoreClient and ``reassign``): 64 active ranks and one spare node's 8 reserve ranks in two
worker processes. Behaviour only: the figures are the bench's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "store_scale.py"
ACTIVE, RESERVE = 64, 8

pytestmark = pytest.mark.nvrx_independent


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("store-scale")
    records = out / "records.json"
    subprocess.run(
        [sys.executable, str(SCRIPT), "--ranks", str(ACTIVE), "--workers", "2",
         "--heartbeat-seconds", "0", "--out", str(out), "--records", str(records)],
        check=True, timeout=300,
    )  # fmt: skip
    (only,) = json.loads(records.read_text())["runs"]
    result: dict[str, Any] = only
    return result


def test_every_rank_joins_one_world_and_the_active_ranks_one_group(run: dict[str, Any]) -> None:
    formed = run["formed"]
    assert sorted(r["initial"] for r in formed) == list(range(ACTIVE + RESERVE))
    assert all((r["iteration"], r["world"], r["rank"]) == (0, ACTIVE + RESERVE, r["initial"]) for r in formed)
    active = [r for r in formed if r["rank"] < ACTIVE]
    assert {r["group_id"] for r in active} == {f"iteration=0 ranks={ACTIVE} by=0"}
    assert all(r["group_id"] is None for r in formed if r["rank"] >= ACTIVE)  # reserve ranks wait
    # Two clients per rank (the wrapper's store and the process groups'), each served by the pod.
    assert run["formation"]["connections"] >= 2 * (ACTIVE + RESERVE)


def test_a_lost_node_is_replaced_by_the_spare_and_the_next_world_forms(run: dict[str, Any]) -> None:
    lost = set(run["lost_ranks"])
    assert len(lost) == 8 and max(lost) < ACTIVE
    assert run["after_loss"]["connections"] == run["formation"]["connections"] - 2 * len(lost)
    reformed = run["reformed"]
    assert {r["initial"] for r in reformed} == set(range(ACTIVE + RESERVE)) - lost
    assert all((r["iteration"], r["world"]) == (1, ACTIVE + RESERVE - len(lost)) for r in reformed)
    # The next world's active ranks are a permutation of its indices: survivors keep theirs, the
    # spare's ranks take the lost ones in order, and every one of them joined the same new group.
    assert sorted(r["rank"] for r in reformed) == list(range(ACTIVE))
    assert all(r["rank"] == r["initial"] for r in reformed if r["initial"] < ACTIVE)
    spare = sorted((r["initial"], r["rank"]) for r in reformed if r["initial"] >= ACTIVE)
    assert [rank for _, rank in spare] == sorted(lost)
    assert {r["group_id"] for r in reformed} == {f"iteration=1 ranks={ACTIVE} by=0"}
