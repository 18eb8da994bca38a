"""The hot-parameter store's wire format and fixed point, read from ebpf/tor.h (the
header tor.bpf.c compiles with): shared by the loader (tailcut.datapath.tor) and the
clients (tailcut.transports.hot).

Values are Q8.24: an s32 v stands for v / 2^24 (a step of 6.0e-8, a range of +-128).
"""

from __future__ import annotations

import numpy as np

from tailcut.datapath.torwire import WireFormat

FORMAT = WireFormat("tor")
HEADER_FILE = FORMAT.header_file
const, header, reasons = FORMAT.const, FORMAT.header, FORMAT.reasons
slots, slot_length = FORMAT.slots, FORMAT.slot_length

FRAC_BITS = const("FRAC_BITS")
SCALE = float(1 << FRAC_BITS)
STRIDE = const("STRIDE")
MAX_ELEMENTS = FORMAT.max_elements   # STRIDE * SLOTS
PORT = const("PORT")
PS_WORKER = const("PS_WORKER")
PULL, PUSH, COUNTS = const("OP_PULL"), const("OP_PUSH"), const("OP_COUNTS")
OK, NOT_READY, STALE, DUPLICATE = (const("OK"), const("NOT_READY"), const("STALE"),
                                   const("DUPLICATE"))
S32 = np.iinfo(np.int32)


def to_fixed(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Q8.24 s32 of float values, rounded to nearest; and how many saturated."""
    scaled = np.rint(np.asarray(values, dtype=np.float64) * SCALE)
    saturated = int(np.count_nonzero((scaled > S32.max) | (scaled < S32.min)))
    return np.clip(scaled, S32.min, S32.max).astype("<i4"), saturated


def from_fixed(values: np.ndarray) -> np.ndarray:
    return (np.asarray(values, dtype=np.float64) / SCALE).astype(np.float32)

