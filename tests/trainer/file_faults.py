"""Faults of the files on a checkpoint volume, as the trainer tests make them."""

from __future__ import annotations

from pathlib import Path


def flip_a_bit(path: Path) -> None:
    """One bit in the middle of the file, as a failing disk or a bad copy does."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
