"""Compile a program under ebpf/ once per machine, and load it from then on in milliseconds.

BCC compiles C on every load: about half a second of CPU for the loss dropper and the
bounded-loss counter, paid by every run (the dropper) and every receiving role (the
counter). BCC cannot load a compiled object, but what it hands the kernel is simple:
each function's instructions, whose map references are `ld_imm64` instructions
carrying the fd of a map BCC created. So the first load compiles with BCC and writes
an image, as JSON under cache_dir(): the instructions, which instruction refers to
which map, each map's kernel attributes and BCC's description of its key, value and
ring buffer record types (so Python reads the maps as typed structs, as with BCC).
Every load, the first included, creates fresh maps from the image, writes their fds
into the instructions and loads them with bpf(2): no compiler, no BCC import.

An image is named by a hash of everything the compile depends on: the source, every
header under ebpf/, the cflags, BCC's version and the kernel release. A change to any
of them compiles anew. An unwritable cache directory only costs the compile.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tailcut.datapath import bcc, bpfsys, ringbuf
from tailcut.errors import DatapathError

FORMAT = 1  # of the image file; part of its name's hash
PROG_TYPES = {"sched_cls": bpfsys.BPF_PROG_TYPE_SCHED_CLS, "xdp": bpfsys.BPF_PROG_TYPE_XDP}
_LD_IMM64, _PSEUDO_MAP_FD = 0x18, 1


def cache_dir() -> Path:
    """$TAILCUT_BPF_CACHE, or ~/.cache/tailcut/bpf."""
    env = os.environ.get("TAILCUT_BPF_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tailcut" / "bpf"


@dataclass(frozen=True)
class MapSpec:
    name: str
    type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    key_desc: Any     # BCC's JSON description of the key type
    leaf_desc: Any    # ... and of the value type
    event_fields: list[str]  # a ring buffer's record, as BCC names it ("name#type")


@dataclass(frozen=True)
class Function:
    prog_type: int
    insns: str                      # hex
    relocs: list[tuple[int, int]]   # (instruction index, map index)


@dataclass(frozen=True)
class Image:
    maps: list[MapSpec]
    functions: dict[str, Function]
    license: str


def _bcc_version() -> str:
    """BCC's version file's text, read without importing BCC (a fifth of a second)."""
    spec = importlib.util.find_spec("bcc")
    if spec is None or spec.origin is None:
        return "no bcc"
    version = Path(spec.origin).parent / "version.py"
    return version.read_text() if version.is_file() else "unknown"


def image_name(stem: str, functions: Mapping[str, str], cflags: Sequence[str]) -> str:
    h = hashlib.sha256()
    parts = [str(FORMAT), stem, json.dumps(sorted(functions.items())),
             json.dumps(list(cflags)), bcc.source(stem).read_text(), _bcc_version(),
             os.uname().release]
    parts += [p.read_text() for p in sorted(bcc.EBPF_DIR.glob("*.h"))]
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return f"{stem}-{h.hexdigest()[:24]}.json"


def _compile(stem: str, functions: Mapping[str, bcc.ProgType],
             cflags: Sequence[str]) -> tuple[Image, float]:
    """Compile with BCC; the image of what it loaded, and the seconds it took."""
    program = bcc.load(stem, functions, cflags)
    try:
        from bcc import lib
        lib.bpf_num_tables.restype = ctypes.c_ulonglong
        lib.bpf_num_tables.argtypes = [ctypes.c_void_p]
        lib.bpf_table_name.restype = ctypes.c_char_p
        lib.bpf_table_name.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong]
        module = program.bpf.module
        maps: list[MapSpec] = []
        by_fd: dict[int, int] = {}
        for i in range(lib.bpf_num_tables(module)):
            name = lib.bpf_table_name(module, i)
            fd = lib.bpf_table_fd(module, name)
            info = bpfsys.map_info(fd)
            fields = [lib.bpf_perf_event_field(module, name, j).decode()
                      for j in range(lib.bpf_perf_event_fields(module, name))]
            by_fd[fd] = len(maps)
            maps.append(MapSpec(name.decode(), info.type, info.key_size, info.value_size,
                                info.max_entries, info.map_flags,
                                json.loads(lib.bpf_table_key_desc(module, name) or b"null"),
                                json.loads(lib.bpf_table_leaf_desc(module, name) or b"null"),
                                fields))
        out: dict[str, Function] = {}
        for function, kind in functions.items():
            insns = program.bpf.dump_func(function.encode())
            relocs = []
            for at in range(0, len(insns), 8):
                code, regs, _, imm = _insn(insns, at)
                if code == _LD_IMM64 and regs >> 4:
                    if regs >> 4 != _PSEUDO_MAP_FD or imm not in by_fd:
                        raise DatapathError(f"{stem}: instruction {at // 8} refers to "
                                            f"something other than a map (src {regs >> 4})")
                    relocs.append((at // 8, by_fd[imm]))
            out[function] = Function(PROG_TYPES[kind], insns.hex(), relocs)
        license = (lib.bpf_module_license(module) or b"GPL").decode()
        return Image(maps, out, license), program.compile_s
    finally:
        program.close()


def _insn(insns: bytes, at: int) -> tuple[int, int, int, int]:
    code, regs = insns[at], insns[at + 1]
    off = int.from_bytes(insns[at + 2:at + 4], "little", signed=True)
    imm = int.from_bytes(insns[at + 4:at + 8], "little", signed=True)
    return code, regs, off, imm


def _read(path: Path) -> Image | None:
    try:
        raw = json.loads(path.read_text())
        return Image([MapSpec(**m) for m in raw["maps"]],
                     {k: Function(f["prog_type"], f["insns"], [tuple(r) for r in f["relocs"]])
                      for k, f in raw["functions"].items()},
                     raw["license"])
    except (OSError, ValueError, KeyError, TypeError):
        return None   # absent or unreadable: compile again


def _write(path: Path, image: Image) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False,
                                         suffix=".tmp") as tmp:
            json.dump(asdict(image), tmp)
        os.replace(tmp.name, path)   # whole or absent, whoever else writes it too
    except OSError:
        pass   # an unwritable cache costs the next load a compile, nothing else


def load(stem: str, functions: Mapping[str, bcc.ProgType],
         cflags: Sequence[str] = ()) -> CachedProgram:
    """ebpf/<stem>.bpf.c's `functions`, loaded with fresh maps; compiled with BCC only if
    no image of this source, cflags, BCC and kernel is cached."""
    path = cache_dir() / image_name(stem, functions, cflags)
    image = _read(path)
    compile_s = 0.0
    if image is None:
        with _compiling(path):   # the roles of a first run wait for one compile
            image = _read(path)
            if image is None:
                image, compile_s = _compile(stem, functions, cflags)
                _write(path, image)
    return CachedProgram(stem, image, compile_s)


@contextlib.contextmanager
def _compiling(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path`'s lock file (none if it cannot be made)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class CachedProgram:
    """A program loaded from an image: the fds of its functions and maps. The surface
    its users need of bcc.Program: fds, prog_id(), table(), ring buffer polling."""

    def __init__(self, stem: str, image: Image, compile_s: float) -> None:
        self.stem = stem
        self.compile_s = compile_s
        self._specs = image.maps
        self._map_fds: list[int] = []
        self.fds: dict[str, int] = {}
        self._tables: dict[str, Table] = {}
        self._rings: list[ringbuf.RingBuffer] = []
        started = time.monotonic()
        try:
            for spec in image.maps:
                self._map_fds.append(bpfsys.create_map(spec.type, spec.key_size,
                                                       spec.value_size, spec.max_entries,
                                                       spec.flags, spec.name))
            for name, function in image.functions.items():
                insns = bytearray(bytes.fromhex(function.insns))
                for index, map_index in function.relocs:
                    insns[index * 8 + 4:index * 8 + 8] = \
                        self._map_fds[map_index].to_bytes(4, "little", signed=True)
                self.fds[name] = bpfsys.load_program(function.prog_type, bytes(insns), name,
                                                     image.license)
        except OSError as err:
            self.close()
            raise DatapathError(f"cannot load {stem}.bpf.c from its cached image: {err} "
                                f"(delete {cache_dir()} to compile it again)") from err
        bcc.add_load_seconds(time.monotonic() - started)

    @property
    def bpf(self) -> CachedProgram:
        """Itself: callers written for BCC poll ring buffers through `program.bpf`."""
        return self

    def prog_id(self, function: str) -> int:
        return bcc.fd_prog_id(self.fds[function], function)

    def table(self, name: str) -> Table:
        if name not in self._tables:
            index = next((i for i, m in enumerate(self._specs) if m.name == name), None)
            if index is None:
                raise KeyError(name)
            self._tables[name] = Table(self, self._map_fds[index], self._specs[index])
        return self._tables[name]

    def ring_buffer_poll(self, timeout_ms: int = -1) -> None:
        """Wait up to `timeout_ms` for a record on any opened ring buffer, and consume."""
        for ring in self._rings:
            ring.poll(timeout_ms)

    def ring_buffer_consume(self) -> None:
        for ring in self._rings:
            ring.consume()

    def close(self) -> None:
        """Close every fd. Programs still attached stay in the kernel."""
        for ring in self._rings:
            ring.close()
        self._rings = []
        for fd in [*self.fds.values(), *self._map_fds]:
            os.close(fd)
        self.fds, self._map_fds = {}, []


_SCALARS: dict[str, Any] = {
    "char": ctypes.c_char, "_Bool": ctypes.c_bool, "unsigned char": ctypes.c_ubyte,
    "short": ctypes.c_short, "unsigned short": ctypes.c_ushort, "int": ctypes.c_int,
    "unsigned int": ctypes.c_uint, "long": ctypes.c_long, "unsigned long": ctypes.c_ulong,
    "long long": ctypes.c_longlong, "unsigned long long": ctypes.c_ulonglong,
    "u8": ctypes.c_ubyte, "u16": ctypes.c_ushort, "u32": ctypes.c_uint,
    "u64": ctypes.c_ulonglong, "s8": ctypes.c_byte, "s16": ctypes.c_short,
    "s32": ctypes.c_int, "s64": ctypes.c_longlong,
}


def ctype(desc: Any) -> Any:
    """The ctypes type of BCC's JSON description of a C type: a scalar's name, or
    [name, [[field, type], [field, type, [n]] (an array), ...], "struct"|"union"]."""
    if isinstance(desc, str):
        return _SCALARS[desc]
    fields = []
    for f in desc[1]:
        if len(f) == 3 and isinstance(f[2], list):
            fields.append((f[0], ctype(f[1]) * f[2][0]))
        elif len(f) == 2:
            fields.append((f[0], ctype(f[1])))
        else:
            raise DatapathError(f"cannot read BCC's description of {desc[0]}: {f}")
    kind = desc[2] if len(desc) > 2 else "struct"
    base = ctypes.Union if kind == "union" else ctypes.Structure
    extra = {"_pack_": 1} if kind == "struct_packed" else {}
    return type(str(desc[0]) or "anon", (base,), {"_fields_": fields, **extra})


_ARRAY_FIELD = re.compile(r"(.+?) ?\[(\d+)\]$")


def event_type(fields: list[str]) -> Any:
    """A ring buffer record's ctypes type from BCC's "name#type" fields."""
    out = []
    for field in fields:
        name, _, kind = field.partition("#")
        m = _ARRAY_FIELD.match(kind)
        out.append((name, _SCALARS[m.group(1)] * int(m.group(2)) if m else _SCALARS[kind]))
    return type("event", (ctypes.Structure,), {"_fields_": out})


class Table:
    """One map, read and written as BCC's tables are: table[table.Key(...)], keys(),
    del; a per-CPU map's value is a list, one per CPU."""

    def __init__(self, program: CachedProgram, fd: int, spec: MapSpec) -> None:
        self._program = program
        self.map_fd = fd
        self.spec = spec
        self.Key: Any = ctype(spec.key_desc) if spec.key_desc is not None else None
        self.Leaf: Any = ctype(spec.leaf_desc) if spec.leaf_desc is not None else None
        self._percpu = spec.type in bpfsys.PERCPU_MAP_TYPES
        self._stride = (spec.value_size + 7) & ~7
        self._cpus = bpfsys.possible_cpus() if self._percpu else 1
        self._event: Any = None

    def __len__(self) -> int:
        return self.spec.max_entries

    def _value_bytes(self) -> int:
        return self._stride * self._cpus if self._percpu else self.spec.value_size

    def __getitem__(self, key: Any) -> Any:
        raw = bpfsys.map_lookup(self.map_fd, bytes(key), self._value_bytes())
        if raw is None:
            raise KeyError(key)
        if not self._percpu:
            return self.Leaf.from_buffer_copy(raw)
        values = [self.Leaf.from_buffer_copy(raw[i * self._stride:(i + 1) * self._stride])
                  for i in range(self._cpus)]
        # BCC hands a per-CPU map of scalars out as plain ints
        return [getattr(v, "value", v) for v in values]

    def __setitem__(self, key: Any, leaf: Any) -> None:
        value = bytes(leaf)
        if self._percpu:
            value = b"".join(value.ljust(self._stride, b"\0") for _ in range(self._cpus))
        bpfsys.map_update(self.map_fd, bytes(key), value)

    def __delitem__(self, key: Any) -> None:
        """Delete `key`; an array's entries cannot go, so they are zeroed (as BCC does)."""
        if self.spec.type in bpfsys.ARRAY_MAP_TYPES:
            bpfsys.map_update(self.map_fd, bytes(key), bytes(self._value_bytes()))
        elif not bpfsys.map_delete(self.map_fd, bytes(key)):
            raise KeyError(key)

    def keys(self) -> Iterator[Any]:
        key = None
        while True:
            key = bpfsys.map_next_key(self.map_fd, key, self.spec.key_size)
            if key is None:
                return
            yield self.Key.from_buffer_copy(key)

    def clear(self) -> None:
        """Delete every entry (zero every one, for an array)."""
        for key in list(self.keys()):
            try:
                del self[key]
            except KeyError:
                pass   # gone meanwhile

    def open_ring_buffer(self, callback: Callable[[Any, bytes, int], None]) -> None:
        """Call callback(None, record, size) for each record, as BCC's does (with the
        record as bytes, which event() reads)."""
        ring = ringbuf.RingBuffer(self.map_fd, lambda data: callback(None, data, len(data)))
        self._program._rings.append(ring)

    def event(self, data: bytes) -> Any:
        """A ring buffer record as the typed struct BCC would make of it."""
        if self._event is None:
            self._event = event_type(self.spec.event_fields)
        return self._event.from_buffer_copy(data[:ctypes.sizeof(self._event)])
