"""Per-tensor flows of a role's messages: how CadentFlow cuts them, and their FCT rows.

A role config's ``flows`` section (written by the runtime from ``spec.scheduling``)::

    {"policy": "cadentflow", "pull": {"fc1.weight": 0, ...}, "push": {"fc1.weight": 0, ...}}

With policy ``cadentflow`` a PS sends each PARAMS and a worker each PUSH as one frame
per tensor (``tailcut.transports.tcp``), in tag order (level, then forward order), each
with IP_TOS ``classifier.tos_of(level)``; control messages (HELLO, PULL, ACK, STOP) go
at level 0, so they never wait behind bulk data in the default class. With ``fair``
messages go whole and untagged, as always. Either way the receiver writes one row per
tensor per message to ``flows-<role>.csv``: under ``fair`` a tensor is usable when its
whole message is, so its completion time is the message's.

With policy ``coflow`` (Varys' MADD, tailcut.scheduling.madd) the section also says
each flow's rate, in payload bytes/s, by sender and receiver::

    {"policy": "coflow", "pace": {"ps-0": {"worker-0": 2.9e6, ...}, "worker-0": {...}}}

and ``pace`` sends PARAMS/PUSH as untagged per-tensor parts in forward order on a
connection capped at that rate (SO_MAX_PACING_RATE), so all flows of a coflow end
together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tailcut.ml.models import Layer
from tailcut.transports import base
from tailcut.transports.base import Kind, Message

FIELDS = ("kind", "iteration", "sender", "receiver", "layer", "level", "bytes",
          "sent_at_ns", "received_at_ns", "completion_s")


def filename(role_name: str) -> str:
    """``flows-<role>.csv``, e.g. flows-worker-0.csv, flows-ps-0.csv."""
    return f"flows-{role_name}.csv"


def pieces(layers: Sequence[Layer], lo: int, hi: int) -> list[tuple[str, int, int]]:
    """(tensor, offset in the message, size) of every tensor overlapping [lo, hi), in
    forward order: a shard's message holds these pieces back to back."""
    out = []
    for layer in layers:
        a, b = max(lo, layer.offset), min(hi, layer.offset + layer.size)
        if a < b:
            out.append((layer.name, a - lo, b - a))
    return out


def cuts(layers: Sequence[Layer], lo: int, hi: int,
         levels: Mapping[str, int]) -> tuple[base.Cut, ...]:
    """The cuts of a message holding [lo, hi), in send order: most urgent level first,
    then forward order (earlier layers first, as the next forward pass needs them)."""
    found = [base.Cut(offset, size, int(levels[name]))
             for name, offset, size in pieces(layers, lo, hi)]
    return tuple(sorted(found, key=lambda c: (c.level, c.offset)))


def tag(conn: base.Connection, kind: Kind, message_cuts: tuple[base.Cut, ...]) -> None:
    """Make ``conn`` send ``kind`` messages in ``message_cuts`` and tag its control
    messages at level 0. The tcp, udp and bounded-loss connections can (the runtime
    refuses the others)."""
    from tailcut.datapath import classifier  # the DSCP mapping lives with the classifier

    if not hasattr(conn, "cuts"):
        raise base.TransportError(f"the connection to {conn.peer} cannot send tagged "
                                  "per-tensor messages; cadentflow needs transport tcp, "
                                  "udp or bounded-loss")
    conn.cuts[kind] = message_cuts
    conn.tos_of = classifier.tos_of  # type: ignore[attr-defined]
    conn.control_tos = classifier.tos_of(0)  # type: ignore[attr-defined]


def pace(conn: base.Connection, raw: Mapping[str, Any] | None, sender: str, receiver: str,
         kind: Kind, layers: Sequence[Layer], lo: int, hi: int) -> None:
    """Under coflow: send ``kind`` messages on ``conn`` as untagged per-tensor parts, at
    the (sender, receiver) flow's MADD rate. Nothing under other policies, or for a
    pair the section has no rate for."""
    if raw is None or raw["policy"] != "coflow":
        return
    rate = raw["pace"].get(sender, {}).get(receiver)
    if rate is None:
        return
    if not hasattr(conn, "set_pacing_rate"):
        raise base.TransportError(f"the connection to {conn.peer} cannot be paced; "
                                  "coflow needs transport tcp")
    conn.cuts[kind] = tuple(base.Cut(offset, size, None)  # type: ignore[attr-defined]
                            for _, offset, size in pieces(layers, lo, hi))
    conn.set_pacing_rate(rate)


def rows(msg: Message, receiver: str, layers: Sequence[Layer], lo: int, hi: int,
         levels: Mapping[str, int] | None) -> list[dict[str, Any]]:
    """One flows-*.csv row per tensor of a received PARAMS or PUSH message."""
    parts = {p.offset: p for p in msg.parts or []}
    out = []
    for name, offset, size in pieces(layers, lo, hi):
        part = parts.get(offset)
        sent = part.sent_at_ns if part else msg.sent_at_ns
        done = part.received_at_ns if part else msg.received_at_ns
        level = part.level if part else (levels or {}).get(name)
        out.append({"kind": msg.kind.name, "iteration": msg.iteration, "sender": msg.sender,
                    "receiver": receiver, "layer": name,
                    "level": "" if level is None else level, "bytes": 4 * size,
                    "sent_at_ns": sent, "received_at_ns": done,
                    "completion_s": f"{(done - sent) / 1e9:.9f}"})
    return out


def levels_for(raw: Mapping[str, Any] | None, direction: str,
               layers: Sequence[Layer]) -> dict[str, int] | None:
    """The ``direction`` levels of a cadentflow config, checked against the model's
    tensors; None under fair (or no config)."""
    if raw is None or raw["policy"] != "cadentflow":
        return None
    levels = dict(raw[direction])
    names = [layer.name for layer in layers]
    if set(levels) != set(names):
        raise ValueError(f"flows.{direction} names {', '.join(sorted(levels))}; the model's "
                         f"tensors are {', '.join(names)}")
    return levels
