"""Read a wire header's layout and constants from the C header a BPF program compiles
with: now tailcut.ebpfheaders (pure, below the layers that read headers, so that a
planner can too); the names stay here for the modules that import them from here."""

from tailcut.ebpfheaders import defines as defines
from tailcut.ebpfheaders import enum_names as enum_names
from tailcut.ebpfheaders import packer as packer
from tailcut.ebpfheaders import struct_type as struct_type
