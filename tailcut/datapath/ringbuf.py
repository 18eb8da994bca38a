"""Read a BPF ring buffer map by its fd, as libbpf does, without BCC.

The kernel maps a ring buffer to user space as a consumer page (ours to write), then a
producer page and the data area, the data area mapped twice in a row so that a record
that wraps past its end reads as one piece. Each record starts with an 8-byte header:
its length, with bit 31 set while the producer is still writing it and bit 30 if it was
discarded, and then the record itself, padded to 8 bytes. (include/uapi/linux/bpf.h,
kernel/bpf/ringbuf.c.)
"""

from __future__ import annotations

import mmap
import select
import struct
from collections.abc import Callable

from tailcut.datapath import bpfsys

_BUSY, _DISCARD = 1 << 31, 1 << 30
_HEADER = 8


class RingBuffer:
    """One ring buffer map; consume() hands each new record to `callback`."""

    def __init__(self, fd: int, callback: Callable[[bytes], None]) -> None:
        self.fd = fd
        self._callback = callback
        size = bpfsys.map_info(fd).max_entries   # bytes of data, a power of two
        page = mmap.PAGESIZE
        self._mask = size - 1
        self._consumer = mmap.mmap(fd, page, mmap.MAP_SHARED,
                                   mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._producer = mmap.mmap(fd, page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ,
                                   offset=page)
        self._data_at = page
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def consume(self) -> int:
        """Hand every committed record to the callback, without waiting; how many."""
        consumer, = struct.unpack_from("=Q", self._consumer, 0)
        handed = 0
        while True:
            producer, = struct.unpack_from("=Q", self._producer, 0)
            if consumer >= producer:
                break
            at = self._data_at + (consumer & self._mask)
            length, = struct.unpack_from("=I", self._producer, at)
            if length & _BUSY:
                break   # being written: the rest waits for the next call
            size = length & ~(_BUSY | _DISCARD)
            if not length & _DISCARD:
                self._callback(bytes(self._producer[at + _HEADER:at + _HEADER + size]))
                handed += 1
            consumer += (size + _HEADER + 7) & ~7
            # Published after each record, as libbpf does: the producer only wakes a
            # poller when it finds the consumer caught up.
            struct.pack_into("=Q", self._consumer, 0, consumer)
        return handed

    def poll(self, timeout_ms: int) -> int:
        """Wait up to `timeout_ms` for a record (none waiting), then consume."""
        handed = self.consume()
        if handed:
            return handed
        self._poll.poll(timeout_ms)
        return self.consume()

    def close(self) -> None:
        self._consumer.close()
        self._producer.close()
