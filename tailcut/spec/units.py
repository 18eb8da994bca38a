"""Parse and format link bandwidths the way tc writes them ("100mbit", "1Gbit")."""

import re

_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_QUANTITY = re.compile(r"^\s*([+-]?\d+(?:\.\d+)?)\s*([a-zA-Z/]*)\s*$")
_HINT = "write a number and a unit in bits per second, e.g. 100Mbit, 1Gbit, 10Gbit"

MIN_RATE_BIT = 8_000          # below 1 kB/s HTB's token bucket no longer shapes usefully
MAX_RATE_BIT = 400 * 10**9    # far above what a veth carries; catches typos like 1Tbit


def parse_bandwidth(text: object) -> int:
    """Return bits per second for strings like '1Gbit', or raise ValueError saying why."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise ValueError(f"{text!r} is not a bandwidth; {_HINT}")
    match = _QUANTITY.match(str(text))
    if not match:
        raise ValueError(f"{text!r} cannot be parsed; {_HINT}")
    number, unit = float(match.group(1)), match.group(2).lower()
    if number <= 0:
        raise ValueError(f"{text!r} must be positive; {_HINT}")
    if unit.endswith("bps") or unit.endswith("b/s") or unit in ("b", "kb", "mb", "gb", "tb"):
        raise ValueError(f"{text!r} is ambiguous (tc reads 'bps' as bytes per second); "
                         f"{_HINT}")
    if unit == "":
        raise ValueError(f"{text!r} has no unit; {_HINT}")
    if unit not in _UNITS:
        raise ValueError(f"{text!r} has an unknown unit {match.group(2)!r}; {_HINT}")
    rate = int(number * _UNITS[unit])
    if not MIN_RATE_BIT <= rate <= MAX_RATE_BIT:
        raise ValueError(f"{text!r} is outside {format_bandwidth(MIN_RATE_BIT)}.."
                         f"{format_bandwidth(MAX_RATE_BIT)}")
    return rate


def format_bandwidth(rate_bit: int) -> str:
    """The shortest exact spelling: 1000000000 -> '1Gbit', 1500000 -> '1500kbit'."""
    for unit, scale in (("Tbit", 10**12), ("Gbit", 10**9), ("Mbit", 10**6), ("kbit", 10**3)):
        if rate_bit % scale == 0:
            return f"{rate_bit // scale}{unit}"
    return f"{rate_bit}bit"
