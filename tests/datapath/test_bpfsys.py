"""The raw bpf(2) calls load what they are given and report the kernel's errno."""

import errno
import os
import resource

import pytest

from tailcut.datapath import bpfsys

pytestmark = pytest.mark.bpf


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
