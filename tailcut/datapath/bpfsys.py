"""The few bpf(2) calls that need no compiler: load a two-instruction program, create a map.

The kernel feature probes use these so that `tailcut doctor` tells what the kernel can
do even where BCC or its headers are missing, and in milliseconds rather than the
quarter second a BCC compile takes. Python 3.11 has no binding for bpf(2), hence ctypes.
"""

import ctypes
import os
import platform

# __NR_bpf differs per architecture; these are the two the project runs on.
_NR_BPF = {"x86_64": 321, "aarch64": 280}

BPF_MAP_CREATE = 0
BPF_PROG_LOAD = 5
BPF_PROG_TEST_RUN = 10

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
