"""The raw bpf(2) calls load what they are given and report the kernel's errno."""

import errno
import os
import resource
import struct

import pytest

from tailcut.datapath import bpfsys

pytestmark = pytest.mark.bpf

# r0 = TC_ACT_OK; exit (struct bpf_insn: u8 code, u8 regs, s16 off, s32 imm)
RETURN_OK = (struct.pack("<BBhi", 0xB7, 0, 0, bpfsys.TC_ACT_OK)
             + struct.pack("<BBhi", 0x95, 0, 0, 0))


def test_a_two_instruction_tc_program_loads_as_sched_cls() -> None:
    fd = bpfsys.load_return(bpfsys.BPF_PROG_TYPE_SCHED_CLS, bpfsys.TC_ACT_OK,
                            "tailcut_test")
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            info = dict(line.split(":\t", 1) for line in f.read().splitlines())
        assert int(info["prog_type"]) == bpfsys.BPF_PROG_TYPE_SCHED_CLS
    finally:
        os.close(fd)


def test_an_unknown_program_type_is_refused_with_einval() -> None:
    with pytest.raises(OSError) as caught:
        bpfsys.load_return(9999, 0, "tailcut_test")
    assert caught.value.errno == errno.EINVAL


def test_a_ring_buffer_of_one_page_is_created() -> None:
    os.close(bpfsys.create_ringbuf(resource.getpagesize()))


def test_a_ring_buffer_not_a_power_of_two_pages_is_refused() -> None:
    with pytest.raises(OSError) as caught:
        bpfsys.create_ringbuf(3 * resource.getpagesize())
    assert caught.value.errno == errno.EINVAL


def test_a_load_the_verifier_gave_up_on_for_a_pending_signal_is_tried_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """EAGAIN: a signal was pending while the verifier ran (met under a profiler, which
    stops the process to sample it); the program itself is fine."""
    real, calls = bpfsys._bpf, []

    def interrupted_twice(cmd: int, attr: object) -> int:
        calls.append(cmd)
        if cmd == bpfsys.BPF_PROG_LOAD and len(calls) <= 2:
            raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN))
        return real(cmd, attr)  # type: ignore[arg-type]
    monkeypatch.setattr(bpfsys, "_bpf", interrupted_twice)
    os.close(bpfsys.load_program(bpfsys.BPF_PROG_TYPE_SCHED_CLS, RETURN_OK, "tailcut_test"))
    assert calls == [bpfsys.BPF_PROG_LOAD] * 3


def test_a_load_refused_for_another_reason_is_not_tried_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real, calls = bpfsys._bpf, []

    def count(cmd: int, attr: object) -> int:
        calls.append(cmd)
        return real(cmd, attr)  # type: ignore[arg-type]
    monkeypatch.setattr(bpfsys, "_bpf", count)
    with pytest.raises(OSError):
        bpfsys.load_program(9999, RETURN_OK, "tailcut_test")
    assert len(calls) == 2   # once plain, once for the verifier's log
