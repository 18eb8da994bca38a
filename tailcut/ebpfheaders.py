"""The C headers under ebpf/ that the BPF programs compile with, read from Python: a
wire header's layout and constants, so that Python and the program cannot drift apart
(tor.h, partial.h), and the capacity of a ToR program's maps. Pure (it only reads
files), so that a planner knows a program's limits without loading anything."""

from __future__ import annotations

import ctypes
import re
import struct
from pathlib import Path


def _ebpf_dir() -> Path:
    """Where the programs are, found from this file, not the cwd. Installed from a wheel
    (an image), they are package data inside the package: tailcut/ebpf/. Run from a
    checkout (an editable install, or PYTHONPATH), tailcut is the checkout's and they
    are its top-level ebpf/ (pyproject.toml maps tailcut.ebpf there). Not found by
    importing tailcut.ebpf: setuptools' editable finder does not import a namespace
    subpackage mapped elsewhere (pypa/setuptools#4943), and under PYTHONPATH another
    checkout's editable install would answer."""
    package = Path(__file__).resolve().parent
    installed, checkout = package / "ebpf", package.parent / "ebpf"
    if not installed.is_dir() and (package.parent / "pyproject.toml").is_file():
        return checkout
    return installed


EBPF_DIR = _ebpf_dir()

# C fixed-width types a header struct may use, as ctypes types (big-endian in the struct).
_CTYPES = {"__u8": ctypes.c_uint8, "__be16": ctypes.c_uint16, "__be32": ctypes.c_uint32,
           "__be64": ctypes.c_uint64}
_FIELD = re.compile(r"^\s*(\w+)\s+(\w+)\s*;")


def defines(path: Path, prefix: str) -> dict[str, int]:
    """Every ``#define <prefix>NAME <number>`` of the file, by full name."""
    pattern = r"^#define\s+(" + prefix + r"\w+)\s+(0x[0-9a-fA-F]+|\d+)\b"
    return {name: int(value, 0)
            for name, value in re.findall(pattern, path.read_text(), flags=re.M)}


def struct_type(path: Path, name: str) -> type[ctypes.BigEndianStructure]:
    """The packed big-endian ctypes view of ``struct <name>``: one field per line."""
    body = re.search(r"struct\s+" + name + r"\s*\{(.*?)\}", path.read_text(), flags=re.S)
    if body is None:
        raise RuntimeError(f"{path} declares no struct {name}")
    fields = []
    for line in body.group(1).splitlines():
        line = line.split("/*")[0]
        if not line.strip():
            continue
        m = _FIELD.match(line)
        if m is None or m.group(1) not in _CTYPES:
            raise RuntimeError(f"{path}: struct {name}: cannot read {line.strip()!r}; "
                               f"only {', '.join(_CTYPES)} fields, one per line")
        fields.append((m.group(2), _CTYPES[m.group(1)]))
    return type("Header", (ctypes.BigEndianStructure,), {"_pack_": 1, "_fields_": fields})


def packer(path: Path, name: str, size: int) -> struct.Struct:
    """A struct.Struct (big-endian, packed) for ``struct <name>``, checked against the
    header's own size define ``size``."""
    view = struct_type(path, name)
    codes = {1: "B", 2: "H", 4: "I", 8: "Q"}
    packed = struct.Struct(">" + "".join(codes[ctypes.sizeof(f[1])] for f in view._fields_))
    if packed.size != ctypes.sizeof(view) or packed.size != size:
        raise RuntimeError(f"{path}: struct {name} is {ctypes.sizeof(view)} bytes, "
                           f"its size define says {size}")
    return packed


def enum_names(path: Path, enum: str, prefix: str) -> list[str]:
    """The members of ``enum <enum>`` in order, lower case, without ``prefix`` (nor an
    ``R_`` after it) and without the closing ``<prefix>REASONS``-style count."""
    body = re.search(r"enum\s+" + enum + r"\s*\{(.*?)\}", path.read_text(), flags=re.S)
    if body is None:
        raise RuntimeError(f"{path} declares no enum {enum}")
    names = re.findall(r"^\s*" + prefix + r"(?:R_)?(\w+)", body.group(1), flags=re.M)
    return [n.lower() for n in names[:-1]]


def max_elements(stem: str) -> int:
    """The most values the maps of ToR program ebpf/<stem>.h hold: TAILCUT_<STEM>_SLOTS
    slots of TAILCUT_<STEM>_STRIDE values."""
    prefix = f"TAILCUT_{stem.upper()}_"
    found = defines(EBPF_DIR / f"{stem}.h", prefix)
    return found[f"{prefix}STRIDE"] * found[f"{prefix}SLOTS"]
