"""In-network aggregation's wire format, read from ebpf/agg.h (the header agg.bpf.c
compiles with): shared by the loader (tailcut.datapath.agg) and the senders and the
PS's collector (tailcut.transports.agg). Values are Q8.24, the hot-parameter store's
fixed point (tailcut.datapath.torformat), so the two share to_fixed/from_fixed."""

from __future__ import annotations

import struct
from functools import cache

from tailcut import ebpfheaders
from tailcut.datapath import torformat

HEADER_FILE = ebpfheaders.EBPF_DIR / "agg.h"
STRUCT = "tailcut_agg_hdr"


@cache
def const(name: str) -> int:
    """A TAILCUT_AGG_* constant of ebpf/agg.h, e.g. const("PORT")."""
    return ebpfheaders.defines(HEADER_FILE, "TAILCUT_AGG_")[f"TAILCUT_AGG_{name}"]


@cache
def header() -> struct.Struct:
    return ebpfheaders.packer(HEADER_FILE, STRUCT, const("HEADER"))


def reasons() -> list[str]:
    """agg_stats' counter names in index order ("added", "forwarded", ...)."""
    return ebpfheaders.enum_names(HEADER_FILE, "tailcut_agg_reason", "TAILCUT_AGG_")


if const("FRAC_BITS") != torformat.FRAC_BITS:
    raise RuntimeError(f"{HEADER_FILE}: FRAC_BITS differs from tor.h's; the fixed point "
                       f"is shared")
to_fixed, from_fixed, SCALE = torformat.to_fixed, torformat.from_fixed, torformat.SCALE
STRIDE = const("STRIDE")
MAX_ELEMENTS = ebpfheaders.max_elements("agg")   # STRIDE * SLOTS
MAX_WORKERS = const("MAX_WORKERS")
PORT = const("PORT")
PS_WORKER = const("PS_WORKER")
ADD, AGGREGATE, FLUSH = const("OP_ADD"), const("OP_AGGREGATE"), const("OP_FLUSH")
OK, NOT_READY, STALE = const("OK"), const("NOT_READY"), const("STALE")


def slots(elements: int) -> int:
    return -(-elements // STRIDE)


def slot_length(elements: int, slot: int) -> int:
    return min(STRIDE, elements - slot * STRIDE)
