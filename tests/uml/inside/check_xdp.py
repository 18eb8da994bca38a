"""What of the bounded-loss datapath Debian's 6.1 kernel refuses, run inside the
user-mode Linux by tests/uml/test_uml.py; never collected on the host (its name is
not test_*.py), whose kernel (6.18) loads both programs.

Both XDP programs of the bounded-loss receive path fail 6.1's verifier where it knows
less of a value's range than 6.18's: the counter (ebpf/partial.bpf.c, which every
bounded-loss receiver attaches, so no bounded-loss job runs there) at the UDP length,
byte-swapped (`be16`) into a scalar bounded below only, which it adds to a packet
pointer; the receive ring (ebpf/rxring.bpf.c, no transport uses it yet) at its range
index, checked against TAILCUT_RX_RANGES but read back from the stack unbounded, with
which it indexes its bitmap.
These checks fail once the programs load there: then the bounded-loss job and
tests/datapath/test_partial.py belong in the selection (tests/uml/conftest.py).
"""

import pytest

from tailcut.datapath import partial, rxring
from tailcut.errors import DatapathError

pytestmark = pytest.mark.bpf


def test_the_xdp_counter_is_refused_where_it_adds_the_udp_length_to_a_packet_pointer() -> None:
    # the stride of a 1500-byte MTU, as a bounded-loss receiver loads it
    with pytest.raises(DatapathError) as refused:
        partial.compile_program(360)
    log = str(refused.value)
    assert "Invalid argument" in log, log
    # the swapped length is an unknown scalar, bounded below only by the check for 40
    # bytes; the verifier refuses to add it to the pointer
    assert "= be16 r2" in log and "R2_w=scalar()" in log, log
    assert "math between pkt pointer and register with unbounded min value is not " \
           "allowed" in log, log


def test_the_receive_ring_is_refused_where_it_indexes_a_bitmap_word() -> None:
    with pytest.raises(DatapathError) as refused:
        rxring.compile_program(360)
    log = str(refused.value)
    assert "word = range / 64;" in log, log
    assert "R2 unbounded memory access, make sure to bounds check any such access" in log, log
