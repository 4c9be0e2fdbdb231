"""Loopback ports claimed until their holder binds them: never handed out twice, whether the two
claimants are in one process or in two (as two pytest workers' clusters are), never in the range
the kernel gives outgoing connections, never one something already listens on."""

from __future__ import annotations

import fcntl
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from rtj_localcluster.ports import FIRST_PORT, PortClaim, ephemeral_low, reserve_port, reserve_port_pair


def test_two_claims_in_one_process_never_share_a_port(tmp_path: Path) -> None:
    first, second = PortClaim(lock_dir=tmp_path), PortClaim(lock_dir=tmp_path)
    ports = [claim.take() for claim in (first, second) for _ in range(20)]
    assert len(set(ports)) == 40
    assert all(FIRST_PORT <= port < ephemeral_low() for port in ports)


def test_a_port_another_process_claimed_is_skipped_until_it_exits(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys
                from pathlib import Path
                from rtj_localcluster.ports import PortClaim
                claim = PortClaim(lock_dir=Path({str(tmp_path)!r}))
                print(claim.take(), flush=True)
                sys.stdin.read()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdin is not None
    held = int(holder.stdout.readline())
    claim = PortClaim(lock_dir=tmp_path)
    assert claim.take(preferred=held) != held
    holder.communicate(timeout=30)  # closes its stdin: it exits
    # Its claim went with it: the port's lock is free again (whether the port is, another test
    # worker's cluster decides).
    with (tmp_path / f"{held}.lock").open() as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_port_something_listens_on_is_never_handed_out(tmp_path: Path) -> None:
    probe = PortClaim(lock_dir=tmp_path / "probe")
    port = probe.take()
    probe.release()
    with socket.create_server(("127.0.0.1", port)):
        claim = PortClaim(lock_dir=tmp_path)
        assert claim.take(preferred=port) != port


def test_a_preferred_port_is_kept_and_released_ports_come_back(tmp_path: Path) -> None:
    claim = PortClaim(lock_dir=tmp_path)
    port = claim.take()
    claim.release()
    assert claim.ports == []
    assert claim.take(preferred=port) == port
    assert claim.ports == [port]


def test_a_pair_is_two_neighbouring_ports(tmp_path: Path) -> None:
    claim = PortClaim(lock_dir=tmp_path)
    port = claim.take_pair()
    assert claim.ports == [port, port + 1]
    assert port + 1 < ephemeral_low()
    other = PortClaim(lock_dir=tmp_path)
    assert other.take(preferred=port + 1) != port + 1


def test_the_process_reservations_differ() -> None:
    ports = [reserve_port() for _ in range(3)]
    pair = reserve_port_pair()
    assert len({*ports, pair, pair + 1}) == 5


def test_the_ephemeral_range_is_read_from_the_kernel_or_defaults(tmp_path: Path) -> None:
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("40000\t60999\n")
    assert ephemeral_low(range_file) == 40000
    assert ephemeral_low(tmp_path / "missing") == 32768
