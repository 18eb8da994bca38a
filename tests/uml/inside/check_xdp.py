"""What of the bounded-loss datapath Debian's 6.1 kernel refuses, run inside the
user-mode Linux by tests/uml/test_uml.py; never collected on the host (its name is
not test_*.py), whose kernel (6.18) loads it.

The kernel receive ring (ebpf/rxring.bpf.c; no transport uses it yet) fails 6.1's
verifier, which knows less of a value's range than 6.18's: its range index, checked
against TAILCUT_RX_RANGES, is read back from the stack unbounded, and indexes the
bitmap with it. This check fails once the program loads there: then
tests/datapath/test_rxring.py belongs in the selection (tests/uml/conftest.py).
"""

import pytest

from tailcut.datapath import rxring
from tailcut.errors import DatapathError

pytestmark = pytest.mark.bpf


def test_the_receive_ring_is_refused_where_it_indexes_a_bitmap_word() -> None:
    with pytest.raises(DatapathError) as refused:
        rxring.compile_program(360)
    log = str(refused.value)
    assert "word = range / 64;" in log, log
    assert "R2 unbounded memory access, make sure to bounds check any such access" in log, log
