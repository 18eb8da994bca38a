"""A role config's ``flows`` section (tailcut.training.flows cuts, tags and paces the
messages by it), checked. Pure: the role config's check runs in the operator too,
which must not load the transports.
"""

from __future__ import annotations

from typing import Any

POLICIES = ("fair", "cadentflow", "coflow")


def check(raw: Any) -> None:
    """Validate a role config's ``flows`` section; ValueError names the bad key. (The
    roles check the tensor names against their model: ``levels_for``.)"""
    if not isinstance(raw, dict) or raw.get("policy") not in POLICIES:
        raise ValueError(f"flows={raw!r}: must be an object with policy one of "
                         f"{', '.join(POLICIES)}")
    if raw["policy"] == "fair":
        return
    if raw["policy"] == "coflow":
        if not isinstance(raw.get("pace"), dict):
            raise ValueError(f"flows.pace={raw.get('pace')!r}: must map each sender to "
                             "{receiver: bytes per second}")
        for sender, by_receiver in raw["pace"].items():
            if not isinstance(by_receiver, dict):
                raise ValueError(f"flows.pace.{sender}={by_receiver!r}: must map each "
                                 "receiver to bytes per second")
            for receiver, rate in by_receiver.items():
                if (not isinstance(rate, (int, float)) or isinstance(rate, bool)
                        or not rate > 0):
                    raise ValueError(f"flows.pace.{sender}.{receiver}={rate!r}: must be a "
                                     "rate > 0 in bytes per second")
        return
    for direction in ("pull", "push"):
        levels = raw.get(direction)
        if not isinstance(levels, dict):
            raise ValueError(f"flows.{direction}={levels!r}: must map each tensor to a level")
        for name, level in levels.items():
            if not isinstance(level, int) or isinstance(level, bool) or not 0 <= level < 8:
                raise ValueError(f"flows.{direction}.{name}={level!r}: must be a level 0..7")
