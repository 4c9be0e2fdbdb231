"""The shared contract (`contract/rtj_contract`): what it reads, and its two rules: the standard
library only, and nothing of the project's other packages (each image carries it on its own)."""

from __future__ import annotations

import ast
import sys
from datetime import UTC, datetime, timedelta, timezone
from fractions import Fraction
from pathlib import Path

import pytest
from rtj_contract import termination
from rtj_contract.quantity import parse_quantity
from rtj_contract.times import epoch_seconds, format_rfc3339, format_rfc3339_micro, parse_rfc3339
from rtj_localcluster.testing import parse_module

CONTRACT = Path(__file__).resolve().parents[2] / "contract" / "rtj_contract"


def _top_level_imports(module: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted(CONTRACT.glob("*.py")), ids=lambda p: p.name)
def test_the_contract_imports_the_standard_library_only(path: Path) -> None:
    imported = _top_level_imports(parse_module(path)) - {"__future__"}
    assert imported <= sys.stdlib_module_names, sorted(imported - sys.stdlib_module_names)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-12-05T02:00:00Z", datetime(2026, 12, 5, 2, tzinfo=UTC)),
        # Kubernetes' MicroTime, the trainer's reports (microseconds), a nanosecond fraction, an offset.
        ("2026-12-05T02:00:00.250000Z", datetime(2026, 12, 5, 2, 0, 0, 250000, tzinfo=UTC)),
        ("2026-12-05T02:00:00.123456789Z", datetime(2026, 12, 5, 2, 0, 0, 123456, tzinfo=UTC)),
        ("2026-12-05T03:00:00+01:00", datetime(2026, 12, 5, 2, tzinfo=UTC)),
        # No offset: UTC, whatever the machine's time zone.
        ("2026-12-05T02:00:00", datetime(2026, 12, 5, 2, tzinfo=UTC)),
    ],
)
def test_timestamps_are_read_as_aware_utc_times(text: str, expected: datetime) -> None:
    parsed = parse_rfc3339(text)
    assert parsed == expected and parsed is not None and parsed.tzinfo is not None
    assert epoch_seconds(text) == expected.timestamp()


def test_times_are_written_in_utc_as_kubernetes_writes_them_and_read_back() -> None:
    moment = datetime(2026, 12, 5, 3, 0, 7, 250000, tzinfo=timezone(timedelta(hours=1)))
    assert format_rfc3339(moment) == "2026-12-05T02:00:07Z"
    assert format_rfc3339_micro(moment) == "2026-12-05T02:00:07.250000Z"
    assert parse_rfc3339(format_rfc3339_micro(moment)) == moment
    assert parse_rfc3339(format_rfc3339(moment)) == moment.replace(microsecond=0)


@pytest.mark.parametrize("value", [None, "", "  ", "yesterday", "2026-13-01T00:00:00Z", 1796436000, b"2026"])
def test_what_is_not_a_timestamp_reads_as_none(value: object) -> None:
    assert parse_rfc3339(value) is None and epoch_seconds(value) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500m", Fraction(1, 2)),
        ("2Ti", Fraction(2 * 2**40)),
        ("1e3", Fraction(1000)),
        ("1.5Gi", Fraction(3 * 2**29)),
        (" 8 ", Fraction(8)),
        (32, Fraction(32)),
    ],
)
def test_quantities_are_exact(text: str | int, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["", "8 GPUs", "1e3Ki", "Gi", "1.2.3"])
def test_a_malformed_quantity_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(text)


def test_the_no_restart_status_is_nvrx_0_7s() -> None:
    # NVRx 0.7's launchers exit with it when NVRx decides the job must not restart; rtj-launch uses it
    # for its own verdict so that the operator reads both alike. Read from the 0.7.0 wheel's source
    # (make setup unpacks it into .venv/nvrx-0.7.0), without importing it over the installed 0.4.1.
    utils = Path(sys.prefix) / "nvrx-0.7.0" / "nvidia_resiliency_ext" / "fault_tolerance" / "utils.py"
    assignments = [
        node
        for node in ast.walk(parse_module(utils))
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "DEFAULT_NO_RESTART_EXIT_CODE" for t in node.targets)
    ]
    assert [ast.literal_eval(node.value) for node in assignments] == [termination.NO_RESTART_EXIT_CODE]


@pytest.mark.parametrize("reason", ["StartupFailed", "DataCorruption", "X" * 64])
def test_a_fault_message_names_its_reason_on_its_first_line(reason: str) -> None:
    message = termination.fault_message(reason, "what went wrong\nand more")
    assert message.splitlines()[0] == f"FaultReason: {reason}"
    assert termination.fault_reason(message) == reason
    assert termination.fault_reason("Traceback ...\nFaultReason: not one\n") is None
