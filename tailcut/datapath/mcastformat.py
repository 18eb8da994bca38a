"""The parameters' multicast wire format, read from ebpf/mcast.h (the header
mcast.bpf.c compiles with): shared by the loader (tailcut.datapath.mcast) and the PS's
publisher and the workers' receivers (tailcut.transports.mcast)."""

from __future__ import annotations

import struct
from functools import cache

from tailcut import ebpfheaders

HEADER_FILE = ebpfheaders.EBPF_DIR / "mcast.h"
STRUCT = "tailcut_mcast_hdr"


@cache
def const(name: str) -> int:
    """A TAILCUT_MCAST_* constant of ebpf/mcast.h, e.g. const("PORT")."""
    return ebpfheaders.defines(HEADER_FILE, "TAILCUT_MCAST_")[f"TAILCUT_MCAST_{name}"]


@cache
def header() -> struct.Struct:
    return ebpfheaders.packer(HEADER_FILE, STRUCT, const("HEADER"))


def reasons() -> list[str]:
    """mcast_stats' counter names in index order ("replicated", "short", ...)."""
    return ebpfheaders.enum_names(HEADER_FILE, "tailcut_mcast_reason", "TAILCUT_MCAST_")


STRIDE = const("STRIDE")
MAX_ELEMENTS = ebpfheaders.max_elements("mcast")   # STRIDE * SLOTS
PORT = const("PORT")
PARAMS, REPAIR = const("OP_PARAMS"), const("OP_REPAIR")


def slots(elements: int) -> int:
    return -(-elements // STRIDE)


def slot_length(elements: int, slot: int) -> int:
    return min(STRIDE, elements - slot * STRIDE)
