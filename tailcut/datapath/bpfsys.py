"""The few bpf(2) calls that need no compiler: load a two-instruction program, create a map.

The kernel feature probes use these so that `tailcut doctor` tells what the kernel can
do even where BCC or its headers are missing, and in milliseconds rather than the
quarter second a BCC compile takes. Python 3.11 has no binding for bpf(2), hence ctypes.
"""

import ctypes
import errno
import os
import platform

# __NR_bpf differs per architecture; these are the two the project runs on.
_NR_BPF = {"x86_64": 321, "aarch64": 280}

BPF_MAP_CREATE = 0
BPF_PROG_LOAD = 5
BPF_PROG_TEST_RUN = 10
LOAD_ATTEMPTS = 5   # of BPF_PROG_LOAD while it fails with EAGAIN (as libbpf)

BPF_PROG_TYPE_SCHED_CLS = 3
BPF_PROG_TYPE_XDP = 6
BPF_MAP_TYPE_RINGBUF = 27

TC_ACT_OK = 0
XDP_PASS = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class _MapCreateAttr(ctypes.Structure):
    # union bpf_attr, BPF_MAP_CREATE member (include/uapi/linux/bpf.h); fields the
    # kernel knows beyond these are read as zero.
    _fields_ = [("map_type", ctypes.c_uint32), ("key_size", ctypes.c_uint32),
                ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32),
                ("map_flags", ctypes.c_uint32)]


class _ProgLoadAttr(ctypes.Structure):
    # union bpf_attr, BPF_PROG_LOAD member, up to prog_name.
    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32),
                ("insns", ctypes.c_uint64), ("license", ctypes.c_uint64),
                ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
                ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32),
                ("prog_flags", ctypes.c_uint32), ("prog_name", ctypes.c_char * 16)]


def _bpf(cmd: int, attr: ctypes.Structure) -> int:
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise OSError(0, f"bpf(2) syscall number unknown for {platform.machine()}")
    fd = _libc.syscall(nr, cmd, ctypes.byref(attr), ctypes.sizeof(attr))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(fd)


def load_return(prog_type: int, value: int, name: str) -> int:
    """Load a program that only returns `value` (r0 = value; exit). Returns its fd;
    raises OSError with the kernel's errno."""
    # struct bpf_insn is {u8 code; u8 dst:4, src:4; s16 off; s32 imm}.
    # 0xb7 = BPF_ALU64 | BPF_MOV | BPF_K (r0 = imm), 0x95 = BPF_JMP | BPF_EXIT.
    insns = (ctypes.c_uint64 * 2)(0xB7 | (value & 0xFFFFFFFF) << 32, 0x95)
    license = ctypes.c_char_p(b"GPL")
    attr = _ProgLoadAttr(prog_type=prog_type, insn_cnt=2,
                         insns=ctypes.addressof(insns),
                         license=ctypes.cast(license, ctypes.c_void_p).value or 0,
                         prog_name=name.encode()[:15])
    return _bpf(BPF_PROG_LOAD, attr)


def create_ringbuf(size_bytes: int) -> int:
    """Create a BPF ring buffer map (size: a power-of-2 multiple of the page size)."""
    return _bpf(BPF_MAP_CREATE, _MapCreateAttr(map_type=BPF_MAP_TYPE_RINGBUF,
                                                max_entries=size_bytes))


class _TestRunAttr(ctypes.Structure):
    # union bpf_attr, BPF_PROG_TEST_RUN member ("test"), up to batch_size.
    _fields_ = [("prog_fd", ctypes.c_uint32), ("retval", ctypes.c_uint32),
                ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32),
                ("data_in", ctypes.c_uint64), ("data_out", ctypes.c_uint64),
                ("repeat", ctypes.c_uint32), ("duration", ctypes.c_uint32),
                ("ctx_size_in", ctypes.c_uint32), ("ctx_size_out", ctypes.c_uint32),
                ("ctx_in", ctypes.c_uint64), ("ctx_out", ctypes.c_uint64),
                ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32),
                ("batch_size", ctypes.c_uint32)]


def test_run(prog_fd: int, packet: bytes, repeat: int = 1) -> tuple[int, int]:
    """Run a loaded program on `packet` `repeat` times in the kernel (BPF_PROG_TEST_RUN).
    Returns (the program's return value, mean nanoseconds per run)."""
    buf = ctypes.create_string_buffer(packet, len(packet))
    attr = _TestRunAttr(prog_fd=prog_fd, data_size_in=len(packet),
                        data_in=ctypes.addressof(buf), repeat=repeat)
    _bpf(BPF_PROG_TEST_RUN, attr)
    return int(attr.retval), int(attr.duration)


def test_run_output(prog_fd: int, packet: bytes, room: int = 4096) -> tuple[int, bytes]:
    """Run a loaded program once on `packet`; return its return value and the packet as
    the program left it (a reply written in place, a cut tail)."""
    buf = ctypes.create_string_buffer(packet, len(packet))
    out = ctypes.create_string_buffer(room)
    attr = _TestRunAttr(prog_fd=prog_fd, data_size_in=len(packet),
                        data_in=ctypes.addressof(buf), data_size_out=room,
                        data_out=ctypes.addressof(out), repeat=1)
    _bpf(BPF_PROG_TEST_RUN, attr)
    return int(attr.retval), out.raw[:attr.data_size_out]


# ---- maps and programs by fd, for programs loaded from a cached image (bpfcache.py) ----

BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_MAP_TYPE_HASH = 1
BPF_MAP_TYPE_ARRAY = 2
BPF_MAP_TYPE_PERCPU_HASH = 5
BPF_MAP_TYPE_PERCPU_ARRAY = 6
PERCPU_MAP_TYPES = (BPF_MAP_TYPE_PERCPU_HASH, BPF_MAP_TYPE_PERCPU_ARRAY)
ARRAY_MAP_TYPES = (BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_PERCPU_ARRAY)


class _MapCreateNamedAttr(ctypes.Structure):
    # union bpf_attr, BPF_MAP_CREATE member, up to map_name.
    _fields_ = [("map_type", ctypes.c_uint32), ("key_size", ctypes.c_uint32),
                ("value_size", ctypes.c_uint32), ("max_entries", ctypes.c_uint32),
                ("map_flags", ctypes.c_uint32), ("inner_map_fd", ctypes.c_uint32),
                ("numa_node", ctypes.c_uint32), ("map_name", ctypes.c_char * 16)]


class _MapElemAttr(ctypes.Structure):
    # union bpf_attr, BPF_MAP_*_ELEM member: map_fd, key, value (or next_key), flags.
    _fields_ = [("map_fd", ctypes.c_uint32), ("pad", ctypes.c_uint32),
                ("key", ctypes.c_uint64), ("value", ctypes.c_uint64),
                ("flags", ctypes.c_uint64)]


class _InfoAttr(ctypes.Structure):
    # union bpf_attr, BPF_OBJ_GET_INFO_BY_FD member ("info").
    _fields_ = [("bpf_fd", ctypes.c_uint32), ("info_len", ctypes.c_uint32),
                ("info", ctypes.c_uint64)]


class MapInfo(ctypes.Structure):
    """struct bpf_map_info, up to its name (what the kernel says a map is)."""

    _fields_ = [("type", ctypes.c_uint32), ("id", ctypes.c_uint32),
                ("key_size", ctypes.c_uint32), ("value_size", ctypes.c_uint32),
                ("max_entries", ctypes.c_uint32), ("map_flags", ctypes.c_uint32),
                ("name", ctypes.c_char * 16)]


def create_map(map_type: int, key_size: int, value_size: int, max_entries: int,
               flags: int = 0, name: str = "") -> int:
    """Create a map; returns its fd (OSError with the kernel's errno)."""
    return _bpf(BPF_MAP_CREATE, _MapCreateNamedAttr(
        map_type=map_type, key_size=key_size, value_size=value_size,
        max_entries=max_entries, map_flags=flags, map_name=name.encode()[:15]))


def map_info(fd: int) -> MapInfo:
    info = MapInfo()
    _bpf(BPF_OBJ_GET_INFO_BY_FD, _InfoAttr(bpf_fd=fd, info_len=ctypes.sizeof(info),
                                            info=ctypes.addressof(info)))
    return info


def load_program(prog_type: int, insns: bytes, name: str, license: str = "GPL") -> int:
    """Load a program's instructions (map references already fds); returns its fd.
    A refusal raises OSError whose text is the verifier's log."""
    code = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(license.encode())
    log = ctypes.create_string_buffer(1 << 20)
    attr = _ProgLoadAttr(prog_type=prog_type, insn_cnt=len(insns) // 8,
                         insns=ctypes.addressof(code), license=ctypes.addressof(lic),
                         prog_name=name.encode()[:15])
    try:
        return _load_retrying(attr)
    except OSError:
        # Again with the verifier's log, which only a failure needs (it costs time).
        attr.log_level, attr.log_size, attr.log_buf = 1, len(log), ctypes.addressof(log)
        try:
            return _load_retrying(attr)
        except OSError as err:
            said = log.value.decode(errors="replace").strip()
            raise OSError(err.errno, f"{err.strerror}: {said[-2000:]}") from None


def _load_retrying(attr: ctypes.Structure) -> int:
    """BPF_PROG_LOAD, again on EAGAIN: the verifier gives up when a signal is pending
    for the loading thread (a child's exit, a debugger's stop), which says nothing of
    the program. libbpf retries the same way. (A sampling profiler that stops the
    process, py-spy without --nonblocking, beats any number of attempts.)"""
    for _ in range(LOAD_ATTEMPTS - 1):
        try:
            return _bpf(BPF_PROG_LOAD, attr)
        except OSError as err:
            if err.errno != errno.EAGAIN:
                raise
    return _bpf(BPF_PROG_LOAD, attr)


def _elem(cmd: int, fd: int, key: ctypes.Array[ctypes.c_char] | None,
          value: ctypes.Array[ctypes.c_char] | None, flags: int = 0) -> None:
    _bpf(cmd, _MapElemAttr(map_fd=fd, key=ctypes.addressof(key) if key is not None else 0,
                           value=ctypes.addressof(value) if value is not None else 0,
                           flags=flags))


def map_lookup(fd: int, key: bytes, value_size: int) -> bytes | None:
    """The value at `key` (`value_size` bytes: all CPUs' for a per-CPU map), or None."""
    k, v = ctypes.create_string_buffer(key, len(key)), ctypes.create_string_buffer(value_size)
    try:
        _elem(BPF_MAP_LOOKUP_ELEM, fd, k, v)
    except OSError as err:
        if err.errno == 2:   # ENOENT
            return None
        raise
    return v.raw


def map_update(fd: int, key: bytes, value: bytes) -> None:
    _elem(BPF_MAP_UPDATE_ELEM, fd, ctypes.create_string_buffer(key, len(key)),
          ctypes.create_string_buffer(value, len(value)))


def map_delete(fd: int, key: bytes) -> bool:
    """Delete `key`; False if it was not there."""
    try:
        _elem(BPF_MAP_DELETE_ELEM, fd, ctypes.create_string_buffer(key, len(key)), None)
    except OSError as err:
        if err.errno == 2:
            return False
        raise
    return True


def map_next_key(fd: int, key: bytes | None, key_size: int) -> bytes | None:
    """The key after `key` (the first with None), or None at the end."""
    k = None if key is None else ctypes.create_string_buffer(key, len(key))
    out = ctypes.create_string_buffer(key_size)
    try:
        _elem(BPF_MAP_GET_NEXT_KEY, fd, k, out)
    except OSError as err:
        if err.errno == 2:
            return None
        raise
    return out.raw


def possible_cpus() -> int:
    """How many values a per-CPU map holds per key (/sys/devices/system/cpu/possible)."""
    with open("/sys/devices/system/cpu/possible") as f:
        text = f.read().strip()
    count = 0
    for part in text.split(","):
        first, _, last = part.partition("-")
        count += int(last or first) - int(first) + 1
    return count
