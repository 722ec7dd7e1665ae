"""Byte sizes as people write them: ``64424509440``, ``60GiB``, ``1.5 TB``, ``80G``."""

from __future__ import annotations

import math
import re

from kvpools_core.errors import ConfigError, short_repr

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    # single letters follow the binary convention of memory flags (docker -m 1g, ulimit)
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_PATTERN = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


MAX_BYTES = 1 << 60
"""1 EiB: far above any device or node, low enough that a mistyped exponent is caught, not planned."""
_MAX_DIGITS = len(str(MAX_BYTES))
"""A byte count written with more digits (leading zeros aside) is above :data:`MAX_BYTES` whatever its unit."""


def parse_bytes(value: int | float | str, flag: str = "size") -> int:
    """Parse a byte count (an int, a float such as ``1.5e9``, or a string with a unit).

    Errors name the option, the value and the accepted forms; a fractional
    byte count is rounded down.
    """
    number: float
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(
            f"{flag} must be a byte count (an int, a float, or a string such as '60GiB'), "
            f"got {type(value).__name__} {short_repr(value)}."
        )
    if isinstance(value, (int, float)):
        number, unit = value, ""
    else:
        match = _PATTERN.match(value)
        if not match or match.group(2).lower() not in _UNITS:
            raise ConfigError(
                f"{flag} {short_repr(value)} is not a size. Write bytes (64424509440) or a number with a unit: "
                f"B, KB, MB, GB, TB (powers of 1000), KiB, MiB, GiB, TiB or K, M, G, T (powers of 1024)."
            )
        text = match.group(1)
        sign = "-" if text.startswith("-") else ""
        digits = text.lstrip("-").split(".")[0].lstrip("0")
        if len(digits) > _MAX_DIGITS:  # beyond 1 EiB in any unit; int() of 4,300+ digits would raise
            problem = "must not be negative" if sign else "is beyond any device (at most 1 EiB)"
            raise ConfigError(
                f"{flag} {short_repr(value)} {problem}: a {len(digits):,}-digit number. "
                f"Write the size with a unit, e.g. 60GiB."
            )
        number = float(text) if "." in text else int(sign + (digits or "0"))
        unit = match.group(2).lower()
    if isinstance(number, float) and not math.isfinite(number):
        raise ConfigError(f"{flag} must be a finite byte count, got {short_repr(value)}.")
    if number < 0:
        raise ConfigError(f"{flag} must not be negative, got {short_repr(value)}.")
    size = int(number * _UNITS[unit])
    if size > MAX_BYTES:
        amount = f"{size:.3g} bytes" if size < 1e300 else "a number of bytes"  # no float holds a larger int
        raise ConfigError(
            f"{flag} {short_repr(value)} is {amount}, beyond any device (at most 1 EiB). Check the value."
        )
    return size


def format_bytes(num_bytes: float) -> str:
    """Binary units with two decimals, e.g. ``60.00 GiB``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{int(num_bytes)} B"
