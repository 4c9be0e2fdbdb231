"""Kubernetes resource quantities ("500m", "2Ti", "1e3") as exact fractions.

Read by the operator's capacity check (a worker's requests against the nodes' allocatable) and by
the local cluster's pods (``resourceFieldRef``). Exact fractions keep "1500m" + "500m" == "2" true
without float rounding.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_PATTERN = re.compile(r"^([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")


def parse_quantity(value: str | int | float) -> Fraction:
    """The exact value of a quantity; raises ValueError for a malformed one."""
    if isinstance(value, int | float):
        return Fraction(value)
    match = _PATTERN.match(value.strip())
    if not match:
        raise ValueError(f"invalid quantity {value!r}")
    number, exponent, suffix = match.groups()
    try:
        base = Fraction(number)
    except ValueError:
        raise ValueError(f"invalid quantity {value!r}") from None
    if exponent:
        return base * Fraction(10) ** int(exponent[1:])
    suffix = suffix or ""
    if suffix in _BINARY:
        return base * _BINARY[suffix]
    return base * _DECIMAL[suffix]
