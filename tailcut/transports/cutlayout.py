"""Where each cut (tensor) of a CadentFlow-tagged message sits on the datagram wire.

A tagged message (``DatagramConnection.cuts``) goes out cut by cut, most urgent
first, each cut's packets with that cut's IP_TOS. For the per-tensor counts to be
exact a packet must carry one tensor only, while the XDP counter (ebpf/partial.h)
insists that every packet be exactly one fixed slot ``[s * stride, min((s + 1) *
stride, total))`` of the message. So the sender lays the cuts out back to back *in
send order*, each starting on a slot boundary, and pads the last slot of every cut
but the last with zeros::

    message  [ fc1.weight | fc1.bias | fc2.weight ... ]       (model order)
    wire     [ cut 0 ......|pad| cut 1 |pad......| cut 2 ... ]  (send order)
             slot boundaries every ``stride`` elements

The packets' ``total`` is the wire length; the BEGIN frame carries the cut table
(``encode``: offset, size, level per cut, in send order) so that the receiver can
rebuild the same layout (``decode``) and map what arrived back (``from_wire``). A cut
adds at most ``stride - 1`` padding elements (one packet).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tailcut.transports import base

ENTRY = struct.Struct("!IIB")  # offset, size, level (UNTAGGED: none)
UNTAGGED = 255
# A BEGIN frame's extra holds the table: 4096 * 9 bytes stays under control.MAX_EXTRA.
MAX_CUTS = 4096


@dataclass(frozen=True)
class Layout:
    """The wire layout of one tagged message (see the module docstring)."""

    cuts: tuple[base.Cut, ...]  # in send order
    stride: int
    elements: int  # the message's real elements (sum of the cuts' sizes)
    total: int  # elements on the wire, padding included
    wire_starts: np.ndarray  # per cut: its first wire element (a slot boundary)
    first_slot: np.ndarray  # per cut, plus one: cut i holds slots [first_slot[i], first_slot[i+1])
    slot_cut: np.ndarray  # per wire slot: the index of its cut
    slot_elements: np.ndarray  # per wire slot: the real (not padding) elements it carries

    @property
    def slots_per_cut(self) -> np.ndarray:
        return np.diff(self.first_slot)

    def encode(self) -> bytes:
        """The cut table for the BEGIN frame."""
        return b"".join(ENTRY.pack(c.offset, c.size, UNTAGGED if c.level is None else c.level)
                        for c in self.cuts)

    def to_wire(self, values: np.ndarray) -> np.ndarray:
        """The padded wire vector of message ``values``."""
        wire = np.zeros(self.total, values.dtype)
        for cut, at in zip(self.cuts, self.wire_starts.tolist()):
            wire[at:at + cut.size] = values[cut.offset:cut.offset + cut.size]
        return wire

    def from_wire(self, wire: np.ndarray, wire_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The message's values and mask from the received wire vector and mask."""
        values = np.empty(self.elements, wire.dtype)
        mask = np.empty(self.elements, bool)
        for cut, at in zip(self.cuts, self.wire_starts.tolist()):
            values[cut.offset:cut.offset + cut.size] = wire[at:at + cut.size]
            mask[cut.offset:cut.offset + cut.size] = wire_mask[at:at + cut.size]
        return values, mask


def plan(cuts: Sequence[base.Cut], elements: int, stride: int,
         max_total: int | None = None) -> Layout:
    """The layout of a message of ``elements`` values sent as ``cuts`` (send order).
    ValueError, naming the cut, unless the cuts tile [0, elements) exactly, or if the
    wire would hold more than ``max_total`` elements (checked before allocating)."""
    if not 1 <= len(cuts) <= MAX_CUTS:
        raise ValueError(f"{len(cuts)} cuts: a tagged message has 1..{MAX_CUTS}")
    if stride < 1:
        raise ValueError(f"stride={stride}: must be >= 1")
    for i, c in enumerate(cuts):
        if c.offset < 0 or c.size < 1:
            raise ValueError(f"cut {i}: offset {c.offset}, size {c.size}: need offset >= 0, "
                             "size >= 1")
        if c.level is not None and not 0 <= c.level < UNTAGGED:
            raise ValueError(f"cut {i}: level {c.level} is not in 0..{UNTAGGED - 1}")
    covered = 0
    for c in sorted(cuts, key=lambda c: c.offset):
        if c.offset != covered:
            raise ValueError(f"cut at offset {c.offset} (size {c.size}): the cuts must tile "
                             f"[0, {elements}) without gap or overlap; the previous ended at "
                             f"{covered}")
        covered += c.size
    if covered != elements:
        raise ValueError(f"the cuts cover {covered} elements; the message has {elements}")
    sizes = np.array([c.size for c in cuts], np.int64)
    slots = -(-sizes // stride)
    first_slot = np.concatenate([[0], np.cumsum(slots)])
    wire_starts = first_slot[:-1] * stride
    total = int(wire_starts[-1] + sizes[-1])
    if max_total is not None and total > max_total:
        raise ValueError(f"the cuts lay out {total} wire elements; at most {max_total}")
    slot_cut = np.repeat(np.arange(len(cuts)), slots)
    # Real elements of each slot: a full stride, except the last slot of each cut.
    slot_elements = np.full(int(first_slot[-1]), stride, np.int64)
    slot_elements[first_slot[1:] - 1] = sizes - (slots - 1) * stride
    return Layout(tuple(cuts), stride, elements, total, wire_starts, first_slot, slot_cut,
                  slot_elements)


def decode(table: bytes, total: int, stride: int) -> Layout:
    """The layout a BEGIN frame's cut ``table`` describes for a ``total``-element wire
    message; ValueError says what does not fit (the caller names the peer)."""
    if len(table) % ENTRY.size:
        raise ValueError(f"cut table of {len(table)} bytes is not whole {ENTRY.size}-byte "
                         "entries")
    cuts = [base.Cut(offset, size, None if level == UNTAGGED else level)
            for offset, size, level in ENTRY.iter_unpack(table)]
    layout = plan(cuts, sum(c.size for c in cuts), stride, max_total=total)
    if layout.total != total:
        raise ValueError(f"cut table lays out {layout.total} wire elements; BEGIN says {total}")
    return layout
