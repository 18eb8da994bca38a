"""The hot-parameter store's wire format and fixed point, read from ebpf/tor.h (the
header tor.bpf.c compiles with): shared by the loader (tailcut.datapath.tor) and the
clients (tailcut.transports.hot).

Values are Q8.24: an s32 v stands for v / 2^24 (a step of 6.0e-8, a range of +-128).
"""

from __future__ import annotations

import struct
from functools import cache

import numpy as np

from tailcut import ebpfheaders

HEADER_FILE = ebpfheaders.EBPF_DIR / "tor.h"
STRUCT = "tailcut_tor_hdr"


@cache
def const(name: str) -> int:
    """A TAILCUT_TOR_* constant of ebpf/tor.h, e.g. const("PORT")."""
    return ebpfheaders.defines(HEADER_FILE, "TAILCUT_TOR_")[f"TAILCUT_TOR_{name}"]


@cache
def header() -> struct.Struct:
    return ebpfheaders.packer(HEADER_FILE, STRUCT, const("HEADER"))


FRAC_BITS = const("FRAC_BITS")
SCALE = float(1 << FRAC_BITS)
STRIDE = const("STRIDE")
MAX_ELEMENTS = ebpfheaders.max_elements("tor")   # STRIDE * SLOTS
PORT = const("PORT")
PS_WORKER = const("PS_WORKER")
PULL, PUSH, COUNTS = const("OP_PULL"), const("OP_PUSH"), const("OP_COUNTS")
OK, NOT_READY, STALE, DUPLICATE = (const("OK"), const("NOT_READY"), const("STALE"),
                                   const("DUPLICATE"))
S32 = np.iinfo(np.int32)


def reasons() -> list[str]:
    """tor_stats' counter names in index order ("pulled", "pushed", ...)."""
    return ebpfheaders.enum_names(HEADER_FILE, "tailcut_tor_reason", "TAILCUT_TOR_")


def to_fixed(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Q8.24 s32 of float values, rounded to nearest; and how many saturated."""
    scaled = np.rint(np.asarray(values, dtype=np.float64) * SCALE)
    saturated = int(np.count_nonzero((scaled > S32.max) | (scaled < S32.min)))
    return np.clip(scaled, S32.min, S32.max).astype("<i4"), saturated


def from_fixed(values: np.ndarray) -> np.ndarray:
    return (np.asarray(values, dtype=np.float64) / SCALE).astype(np.float32)


def slots(elements: int) -> int:
    return -(-elements // STRIDE)


def slot_length(elements: int, slot: int) -> int:
    return min(STRIDE, elements - slot * STRIDE)
