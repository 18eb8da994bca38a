"""Send many UDP datagrams per system call with sendmmsg(2), which Python does not wrap.

The bounded-loss sender's per-packet Python overhead (~4-10 us a sendto) caps one
sender below a 1 Gbit/s link of 1500-byte packets; one sendmmsg per burst of packets
removes it, while the kernel still sends, shapes and drops each datagram on its own
(unlike UDP GSO, whose super-packet a tc-egress dropper would drop as a whole).
The libc structs are ctypes Structures: ctypes lays them out, nothing here counts bytes.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket

import numpy as np

_libc = ctypes.CDLL(None, use_errno=True)


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [("msg_name", ctypes.c_void_p), ("msg_namelen", ctypes.c_uint32),
                ("msg_iov", ctypes.c_void_p), ("msg_iovlen", ctypes.c_size_t),
                ("msg_control", ctypes.c_void_p), ("msg_controllen", ctypes.c_size_t),
                ("msg_flags", ctypes.c_int)]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _MsgHdr), ("msg_len", ctypes.c_uint)]


class _SockAddrIn(ctypes.Structure):
    _fields_ = [("sin_family", ctypes.c_ushort), ("sin_port", ctypes.c_uint16),
                ("sin_addr", ctypes.c_uint8 * 4), ("sin_zero", ctypes.c_uint8 * 8)]


_sendmmsg = getattr(_libc, "sendmmsg", None)
if _sendmmsg is not None:
    _sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
    _sendmmsg.restype = ctypes.c_int


def available() -> bool:
    return _sendmmsg is not None


class Batch:
    """Datagrams ``raw[row, :lengths[row]]`` for ``rows`` in send order, to ``addr``."""

    def __init__(self, sock: socket.socket, raw: np.ndarray, lengths: np.ndarray,
                 rows: np.ndarray, addr: tuple[str, int]) -> None:
        n = len(rows)
        self._sock = sock
        self._raw = raw  # keeps the buffer alive while the kernel reads from it
        self._name = _SockAddrIn(socket.AF_INET, socket.htons(addr[1]),
                                 (ctypes.c_uint8 * 4)(*socket.inet_aton(addr[0])))
        iov_dtype = np.dtype(_IoVec)
        msg_dtype = np.dtype(_MMsgHdr)
        self._iov = np.zeros(n, iov_dtype)
        self._iov["iov_base"] = raw.ctypes.data + rows.astype(np.int64) * raw.strides[0]
        self._iov["iov_len"] = lengths[rows]
        self._msgs = np.zeros(n, msg_dtype)
        hdr = self._msgs["msg_hdr"]
        hdr["msg_name"] = ctypes.addressof(self._name)
        hdr["msg_namelen"] = ctypes.sizeof(self._name)
        hdr["msg_iov"] = self._iov.ctypes.data + np.arange(n, dtype=np.int64) * iov_dtype.itemsize
        hdr["msg_iovlen"] = 1
        self._base = self._msgs.ctypes.data
        self._size = msg_dtype.itemsize

    def send(self, first: int, count: int) -> None:
        """Send datagrams ``first .. first + count - 1`` (in send order); all of them."""
        fd = self._sock.fileno()
        while count > 0:
            sent = _sendmmsg(fd, self._base + first * self._size, count, 0)
            if sent < 0:
                err = ctypes.get_errno()
                if err in (errno.EINTR, errno.EAGAIN, errno.ENOBUFS):
                    continue
                raise OSError(err, os.strerror(err))
            first += sent
            count -= sent
