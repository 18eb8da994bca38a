"""A ToR protocol's wire format as its C header defines it: one reader for the three
(ebpf/tor.h, agg.h and mcast.h), so that the constants, the header's layout and the
counters' names are read one way.

    fmt = WireFormat("agg")          # ebpf/agg.h: TAILCUT_AGG_*, struct tailcut_agg_hdr
    fmt.const("PORT"), fmt.header(), fmt.reasons(), fmt.slots(10_000)
"""

from __future__ import annotations

import struct

from tailcut import ebpfheaders


class WireFormat:
    """The format of ToR program ebpf/<stem>.h: its ``TAILCUT_<STEM>_*`` defines, its
    ``struct tailcut_<stem>_hdr`` and its ``enum tailcut_<stem>_reason``."""

    def __init__(self, stem: str) -> None:
        self.stem = stem
        self.header_file = ebpfheaders.EBPF_DIR / f"{stem}.h"
        self._prefix = f"TAILCUT_{stem.upper()}_"
        self._defines = ebpfheaders.defines(self.header_file, self._prefix)
        self._header = ebpfheaders.packer(self.header_file, f"tailcut_{stem}_hdr",
                                          self.const("HEADER"))
        self.stride = self.const("STRIDE")
        self.max_elements = ebpfheaders.max_elements(stem)   # STRIDE * SLOTS

    def const(self, name: str) -> int:
        """A TAILCUT_<STEM>_<name> define, e.g. const("PORT")."""
        return self._defines[self._prefix + name]

    def header(self) -> struct.Struct:
        """The header's packer (big-endian, checked against the define HEADER)."""
        return self._header

    def reasons(self) -> list[str]:
        """The program's counter names in index order ("added", "forwarded", ...)."""
        return ebpfheaders.enum_names(self.header_file, f"tailcut_{self.stem}_reason",
                                      self._prefix)

    def slots(self, elements: int) -> int:
        """Slots of ``stride`` values a vector of ``elements`` takes."""
        return -(-elements // self.stride)

    def slot_length(self, elements: int, slot: int) -> int:
        """Values in slot ``slot`` of a vector of ``elements``."""
        return min(self.stride, elements - slot * self.stride)
