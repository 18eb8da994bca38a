"""What of the bounded-loss datapath Debian's 6.1 kernel refuses, run inside the
user-mode Linux by tests/uml/test_uml.py; never collected on the host (its name is
not test_*.py), whose kernel (6.18) loads it.

The kernel receive ring (ebpf/rxring.bpf.c, bounded-loss's receivePath: kernel) fails
6.1's verifier, which knows less of a value's range than 6.18's: the length of a
datagram's payload copy, checked against the range's size, is read back from the stack
with a negative lower bound, and bpf_skb_load_bytes refuses it. (Before 8 Dec 2026 it
failed earlier, at the bitmap word its range index selects.) This check fails once the
program loads there: then tests/datapath/test_rxring.py belongs in the selection
(tests/uml/conftest.py).
"""

import pytest

from tailcut.datapath import rxring
from tailcut.errors import DatapathError

pytestmark = pytest.mark.bpf


def test_the_receive_ring_is_refused_where_it_copies_a_payload() -> None:
    with pytest.raises(DatapathError) as refused:
        rxring.compile_program(360)
    log = str(refused.value)
    assert "bpf_skb_load_bytes(skb, at + sizeof(h), buf->v, bytes)" in log, log
    assert log.rstrip().splitlines()[-2].strip().endswith(
        "R4 min value is negative, either use unsigned or 'var &= const'"), log[-2000:]
