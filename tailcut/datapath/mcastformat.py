"""The parameters' multicast wire format, read from ebpf/mcast.h (the header
mcast.bpf.c compiles with): shared by the loader (tailcut.datapath.mcast) and the PS's
publisher and the workers' receivers (tailcut.transports.mcast)."""

from __future__ import annotations

from tailcut.datapath.torwire import WireFormat

FORMAT = WireFormat("mcast")
HEADER_FILE = FORMAT.header_file
const, header, reasons = FORMAT.const, FORMAT.header, FORMAT.reasons
slots, slot_length = FORMAT.slots, FORMAT.slot_length

STRIDE = const("STRIDE")
MAX_ELEMENTS = FORMAT.max_elements   # STRIDE * SLOTS
PORT = const("PORT")
PARAMS, REPAIR = const("OP_PARAMS"), const("OP_REPAIR")

