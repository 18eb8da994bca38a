"""In-network aggregation's wire format, read from ebpf/agg.h (the header agg.bpf.c
compiles with): shared by the loader (tailcut.datapath.agg) and the senders and the
PS's collector (tailcut.transports.agg). Values are Q8.24, the hot-parameter store's
fixed point (tailcut.datapath.torformat), so the two share to_fixed/from_fixed."""

from __future__ import annotations

from tailcut.datapath import torformat
from tailcut.datapath.torwire import WireFormat

FORMAT = WireFormat("agg")
HEADER_FILE = FORMAT.header_file
const, header, reasons = FORMAT.const, FORMAT.header, FORMAT.reasons
slots, slot_length = FORMAT.slots, FORMAT.slot_length

if const("FRAC_BITS") != torformat.FRAC_BITS:
    raise RuntimeError(f"{HEADER_FILE}: FRAC_BITS differs from tor.h's; the fixed point "
                       f"is shared")
to_fixed, from_fixed, SCALE = torformat.to_fixed, torformat.from_fixed, torformat.SCALE
STRIDE = const("STRIDE")
MAX_ELEMENTS = FORMAT.max_elements   # STRIDE * SLOTS
MAX_WORKERS = const("MAX_WORKERS")
PORT = const("PORT")
PS_WORKER = const("PS_WORKER")
ADD, AGGREGATE, FLUSH = const("OP_ADD"), const("OP_AGGREGATE"), const("OP_FLUSH")
OK, NOT_READY, STALE = const("OK"), const("NOT_READY"), const("STALE")

