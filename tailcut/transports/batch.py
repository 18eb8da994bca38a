"""Send and receive many UDP datagrams per system call (sendmmsg/recvmmsg), which Python
does not wrap.

The bounded-loss sender's per-packet Python overhead (~4-10 us a sendto) caps one
sender below a 1 Gbit/s link of 1500-byte packets; one sendmmsg per burst of packets
removes it. Each datagram is gathered from several pieces (the header row and the
values it carries, straight from the vector), so the sender never copies a vector into
packets.

With ``gso_size`` (UDP GSO, Linux's UDP_SEGMENT), consecutive datagrams of that size
go to the kernel as one message of up to 32 KiB (what tailcut's links take whole:
MAX_GSO_PAYLOAD) that it cuts into those datagrams as late as the path lets it: what a
TCP sender's GSO skbs get. On the emulated path
every hop's per-packet work is CPU, ~13 us a datagram, so this is what lets one sender
reach line rate. It is only for paths where nothing before the cut acts per packet:
a random-loss dropper would drop a whole super-packet (a path that drops has its pods
cut them at their own interface, tailcut.net.build). The XDP counter walks a whole
one datagram by datagram (ebpf/partial.bpf.c).

On the receiving side one recvmmsg fills a preallocated 2-D buffer, one row per
datagram, with each datagram's true length (MSG_TRUNC), source address and kernel
arrival time (SO_TIMESTAMPNS); the receiver then checks the whole batch with numpy.
GroInbox does the same for a socket with UDP_GRO on, which takes a UDP GSO message
that reaches it whole as one read: its datagrams land in consecutive rows (they are
cut at the row size), so a 32 KiB message costs the path and the socket one packet,
as a TCP segment train does.
The libc structs are ctypes Structures: ctypes lays them out, nothing here counts bytes.
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import functools
import os
import socket
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from tailcut.transports import rxfast

_libc = ctypes.CDLL(None, use_errno=True)

MSG_TRUNC = 0x20  # <bits/socket.h>: return a datagram's real length, even if cut
MSG_DONTWAIT = 0x40
SO_TIMESTAMPNS = 35  # <asm-generic/socket.h>; also the SCM type of the timestamp
SOL_UDP = 17
UDP_SEGMENT = 103  # <linux/udp.h>: a u16 cmsg, the size to cut a GSO message into
UDP_GRO = 104  # <linux/udp.h>: take UDP GSO messages whole; an int cmsg, their cut size
UDP_MAX_SEGMENTS = 64  # the kernel's limit (128 on newer ones; 64 fits both)
MAX_UDP_PAYLOAD = 65_507  # 64 KiB less the IP and UDP headers
# The links tailcut builds take GSO packets under 32 KiB (tailcut.net.shaping.GSO_BYTES,
# their gso_max_size); the kernel cuts a larger one into single datagrams at the pod's
# interface, measuring it with its Ethernet, IP and UDP headers.
MAX_GSO_PAYLOAD = 32_768 - 14 - 20 - 8 - 1
# What a kernel or device without UDP GSO refuses a first GSO message with (EIO: no
# checksum offload; EINVAL, ENOPROTOOPT: no UDP_SEGMENT).
GSO_REFUSED = frozenset({errno.EIO, errno.EINVAL, errno.ENOPROTOOPT})


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


class _CmsgTimespec(ctypes.Structure):
    """One control message holding a struct timespec (SCM_TIMESTAMPNS)."""

    _fields_ = [("cmsg_len", ctypes.c_size_t), ("cmsg_level", ctypes.c_int),
                ("cmsg_type", ctypes.c_int), ("tv_sec", ctypes.c_int64),
                ("tv_nsec", ctypes.c_int64)]


class _CmsgInt(ctypes.Structure):
    """One control message holding an int (IP_TOS on send: this datagram's TOS)."""

    _fields_ = [("cmsg_len", ctypes.c_size_t), ("cmsg_level", ctypes.c_int),
                ("cmsg_type", ctypes.c_int), ("value", ctypes.c_int), ("_pad", ctypes.c_int)]


class _CmsgGso(ctypes.Structure):
    """UDP_SEGMENT's control message (a u16), then room for an IP_TOS one."""

    _fields_ = [("cmsg_len", ctypes.c_size_t), ("cmsg_level", ctypes.c_int),
                ("cmsg_type", ctypes.c_int), ("value", ctypes.c_uint16),
                ("_pad", ctypes.c_uint16 * 3), ("tos", _CmsgInt)]


# The kernel puts the data of a control message at CMSG_DATA, which ctypes must agree with.
assert _CmsgTimespec.tv_sec.offset == socket.CMSG_LEN(0)
assert ctypes.sizeof(_CmsgTimespec) == socket.CMSG_SPACE(16)
assert _CmsgInt.value.offset == socket.CMSG_LEN(0)
assert ctypes.sizeof(_CmsgInt) == socket.CMSG_SPACE(4)
assert _CmsgGso.tos.offset == socket.CMSG_SPACE(2)

# numpy's views of the structs, made once (from ctypes each time, they cost more than
# the rest of a batch's setup).
_IOV = np.dtype(_IoVec)
_MMSG = np.dtype(_MMsgHdr)
_NAME = np.dtype(_SockAddrIn)
_CMSG_TS = np.dtype(_CmsgTimespec)
_CMSG_INT = np.dtype(_CmsgInt)
_CMSG_GSO = np.dtype(_CmsgGso)

_sendmmsg = getattr(_libc, "sendmmsg", None)
if _sendmmsg is not None:
    _sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
    _sendmmsg.restype = ctypes.c_int
_recvmmsg = getattr(_libc, "recvmmsg", None)
if _recvmmsg is not None:
    _recvmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int,
                          ctypes.c_void_p]
    _recvmmsg.restype = ctypes.c_int


def max_segments(gso_size: int) -> int:
    """Datagrams of ``gso_size`` bytes in one GSO message, at most."""
    return max(1, min(UDP_MAX_SEGMENTS, MAX_GSO_PAYLOAD // gso_size))


def _sockaddr(addr: tuple[str, int]) -> _SockAddrIn:
    return _SockAddrIn(socket.AF_INET, socket.htons(addr[1]),
                       (ctypes.c_uint8 * 4)(*socket.inet_aton(addr[0])))


@functools.lru_cache(maxsize=256)
def _sockaddr_of(addr: tuple[str, int]) -> _SockAddrIn:
    """_sockaddr, made once per peer (CompiledBatch only reads it)."""
    return _sockaddr(addr)


def _owned(a: np.ndarray) -> np.ndarray:
    """``a`` as int64, C-contiguous and unchanging while the kernel reads it: itself if
    it already is (read-only, as sender's slot ranges), else a copy."""
    if a.dtype == np.int64 and a.flags.c_contiguous and not a.flags.writeable \
            and a.base is None:
        return a
    return np.array(a, np.int64, order="C")


def available() -> bool:
    return _sendmmsg is not None and _recvmmsg is not None


def _required(function: Optional[Any], name: str) -> Any:
    """The libc function, or OSError(ENOSYS) naming it on a libc without it."""
    if function is None:
        raise OSError(errno.ENOSYS, f"this C library has no {name}()")
    return function


class Piece:
    """One piece of every datagram of a batch: bytes ``[offsets[i], offsets[i] +
    lengths[i])`` of ``array`` for datagram ``i``."""

    def __init__(self, array: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> None:
        if not array.flags.c_contiguous:
            raise ValueError("a piece's array must be C-contiguous")
        offsets = np.asarray(offsets, np.int64)
        lengths = np.asarray(lengths, np.int64)
        if len(offsets) and (offsets.min() < 0 or (offsets + lengths).max() > array.nbytes):
            raise ValueError("a piece reaches outside its array")
        self.array = array
        self.offsets = offsets
        self.lengths = lengths


class Batch:
    """Datagrams to ``addr``; datagram ``i`` is the concatenation of every piece's
    ``i``-th range, in the order given. With ``tos``, datagram ``i`` carries IP_TOS
    ``tos[i]`` as ancillary data: the kernel stamps it on that datagram alone, whatever
    the socket's own IP_TOS and whoever else sends on the socket meanwhile. With
    ``gso_size``, runs of datagrams of exactly that size (and one shorter one to end a
    run), with the same TOS, go out as one UDP GSO message each."""

    def __init__(self, sock: socket.socket, pieces: Sequence[Piece],
                 addr: tuple[str, int], tos: np.ndarray | None = None,
                 gso_size: int | None = None) -> None:
        n = len(pieces[0].offsets)
        k = len(pieces)
        self._sock = sock
        self._pieces = pieces  # keeps the buffers alive while the kernel reads from them
        self._name = _sockaddr(addr)
        iov_dtype = _IOV
        self._iov = np.zeros((n, k), iov_dtype)
        for j, piece in enumerate(pieces):
            self._iov["iov_base"][:, j] = piece.array.ctypes.data + piece.offsets
            self._iov["iov_len"][:, j] = piece.lengths
        # Datagram i's pieces are row i of _iov; a GSO message of datagrams i..j is the
        # rows i..j, one run of (j - i + 1) * k iovecs.
        self._iov_rows = self._iov.ctypes.data + np.arange(n, dtype=np.int64) * k * iov_dtype.itemsize
        self._k = k
        self._tos = tos
        self._msgs: np.ndarray | None = None  # one mmsghdr per datagram, made if needed
        self._gso: _Gso | None = None
        if gso_size is not None and n:
            lengths = pieces[0].lengths
            for piece in pieces[1:]:
                lengths = lengths + piece.lengths
            self._gso = _Gso(self._iov_rows, k, lengths, tos, gso_size, self._name)

    def _datagram_msgs(self) -> np.ndarray:
        """The mmsghdrs of sending one datagram each (without GSO, or once refused)."""
        if self._msgs is not None:
            return self._msgs
        n, tos = len(self._iov_rows), self._tos
        self._msgs = np.zeros(n, _MMSG)
        hdr = self._msgs["msg_hdr"]
        hdr["msg_name"] = ctypes.addressof(self._name)
        hdr["msg_namelen"] = ctypes.sizeof(self._name)
        hdr["msg_iov"] = self._iov_rows
        hdr["msg_iovlen"] = self._k
        if tos is not None:
            self._ctrl = np.zeros(n, _CMSG_INT)
            self._ctrl["cmsg_len"] = socket.CMSG_LEN(4)
            self._ctrl["cmsg_level"] = socket.IPPROTO_IP
            self._ctrl["cmsg_type"] = socket.IP_TOS
            self._ctrl["value"] = tos
            hdr["msg_control"] = (self._ctrl.ctypes.data
                                  + np.arange(n, dtype=np.int64) * self._ctrl.itemsize)
            hdr["msg_controllen"] = self._ctrl.itemsize
        return self._msgs

    def send(self, first: int, count: int) -> None:
        """Send datagrams ``first .. first + count - 1``; all of them."""
        if self._gso is not None:
            try:
                self._gso.send(self._sock.fileno(), first, count)
                return
            except OSError as refused:
                # A kernel or device without UDP GSO refuses the first message whole.
                if refused.errno not in GSO_REFUSED \
                        or self._gso.sent_any:
                    raise
                self._gso = None
        fd = self._sock.fileno()
        base = self._datagram_msgs().ctypes.data
        while count > 0:
            sent = _required(_sendmmsg, "sendmmsg")(fd, base + first * _MMSG.itemsize, count, 0)
            if sent < 0:
                err = ctypes.get_errno()
                if err in (errno.EINTR, errno.EAGAIN, errno.ENOBUFS):
                    continue
                raise OSError(err, os.strerror(err))
            first += sent
            count -= sent

    @property
    def gso(self) -> bool:
        """Whether sends still go out as GSO messages (False after a refusal)."""
        return self._gso is not None


class CompiledBatch:
    """Batch's datagrams for a message's packets (sender.Packets), each burst built and
    sent by one call of txfast.c: datagram ``i`` is slot ``order[i]``'s header row,
    then its values in place. Nothing is built ahead of a burst; with ``gso_size`` the
    messages are _Gso's, and a kernel that refuses GSO before anything went out gets
    one datagram a message from then on, as Batch does."""

    def __init__(self, lib: ctypes.CDLL, sock: socket.socket, headers: np.ndarray,
                 values: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                 order: np.ndarray, addr: tuple[str, int], tos: np.ndarray | None = None,
                 gso_size: int | None = None) -> None:
        self._lib = lib
        self._sock = sock  # its fd is looked up again at every send, as Batch does
        # Our own copies, of the C types, kept alive while the kernel reads from them:
        # txfast.c checks the indices and then uses them, so nobody else may change
        # them meanwhile (and Batch, too, sends the order it was given, not a later one).
        self._starts, self._ends, self._order = (
            _owned(a) for a in (starts, ends, order))
        self._tos = None if tos is None else np.array(tos, np.int32, order="C")
        self._headers, self._values = headers, values
        if not (headers.flags.c_contiguous and values.flags.c_contiguous):
            raise ValueError("a batch's headers and values must be C-contiguous")
        slots = len(self._starts)
        # (txfast.c reads headers[slot], ends[slot] and tos[slot] for any slot < slots)
        if headers.ndim != 1 or len(headers) < slots or len(self._ends) != slots \
                or self._order.ndim != 1 \
                or (self._tos is not None and (self._tos.ndim != 1 or len(self._tos) < slots)):
            raise ValueError("a batch's headers, ends and tos need a row per slot")
        if gso_size is not None and not 0 < gso_size <= 0xFFFF:
            raise ValueError(f"a GSO size of {gso_size} bytes does not fit UDP_SEGMENT")
        self._name = _sockaddr_of(addr)
        gso = gso_size if gso_size is not None and len(self._order) else 0
        self._pass = rxfast.TxPass(
            fd=sock.fileno(), to=ctypes.addressof(self._name), headers=headers.ctypes.data,
            header_bytes=headers.itemsize, values=values.ctypes.data,
            value_bytes=values.itemsize, values_count=values.size,
            starts=self._starts.ctypes.data, ends=self._ends.ctypes.data, slots=slots,
            order=self._order.ctypes.data, datagrams=len(self._order),
            tos=None if self._tos is None else self._tos.ctypes.data, gso_size=gso,
            max_segments=max_segments(gso) if gso else 1, sent_any=0)
        self._pointer = ctypes.byref(self._pass)
        # pace()'s failed burst: its first datagram, one past it, and due before it
        self.failed = (0, 0, 0.0)

    def _gso_refused(self, err: int) -> bool:
        """Whether ``err`` is this kernel refusing UDP GSO before anything of the pass
        went out; then GSO is off for the rest of it and the caller sends again."""
        if -err in GSO_REFUSED and self._pass.gso_size and not self._pass.sent_any:
            self._pass.gso_size, self._pass.max_segments = 0, 1
            return True
        return False

    def send(self, first: int, count: int) -> None:
        """Send datagrams ``first .. first + count - 1``; all of them."""
        self._pass.fd = self._sock.fileno()   # -1 once closed: EBADF, not another socket
        err = self._lib.txfast_send(self._pointer, first, count)
        if err == -errno.ERANGE:
            raise ValueError(f"datagrams {first}..{first + count - 1}: a slot or range "
                             "outside the batch")
        if self._gso_refused(err):
            err = self._lib.txfast_send(self._pointer, first, count)
        if err:
            raise OSError(-err, os.strerror(-err))

    def pace(self, first: int, first_burst: int, burst: int, rate_bit: float | None,
             due: float, bursts: int, until: float | None, wire: np.ndarray,
             catch_up_s: float) -> tuple[int, int, float]:
        """Send bursts from datagram ``first`` on, the first of ``first_burst``
        datagrams, then of ``burst``, at most ``bursts`` of them, paced at ``rate_bit``
        (None: not paced) between two, in txfast.c with the GIL released: ``due``
        (time.monotonic) is when the link has carried what went before, ``wire[i]`` the
        wire bytes before datagram i; a late wake-up is made up by later bursts, at most
        ``catch_up_s`` of link time of it. Stops after a burst once the pass is sent, at
        interrupt() or past ``until``. Returns the last burst's first datagram, one past
        it, and ``due`` before it; the caller paces that burst. Raises OSError of a
        failed burst (``failed`` then says which, and ``due`` before it; what went
        before it was sent)."""
        if len(wire) != len(self._order) + 1 or wire.dtype != np.int64:
            raise ValueError("wire needs an int64 per datagram, and one more")
        p = self._pass
        p.fd = self._sock.fileno()
        p.next, p.last, p.due_ns = first, first, int(due * 1e9)
        args = (self._pointer, wire.ctypes.data, first_burst, burst, rate_bit or 0.0, bursts,
                int(until * 1e9) if until is not None else 0, int(catch_up_s * 1e9))
        err = self._lib.txfast_pace(*args)
        if self._gso_refused(err):   # the same burst again
            p.next = p.last
            err = self._lib.txfast_pace(*args)
        if err == -errno.ERANGE:
            raise ValueError(f"pacing from datagram {first}: a slot, range or count outside "
                             "the batch")
        if err:
            self.failed = (p.last, p.next, p.due_ns / 1e9)
            raise OSError(-err, os.strerror(-err))
        return p.last, p.next, p.due_ns / 1e9

    def interrupt(self) -> None:
        """End a pace() under way after its current burst (any thread)."""
        self._pass.interrupt = 1

    def clear(self) -> None:
        """Forget an interrupt: called before the rate a pace() is given is read."""
        self._pass.interrupt = 0

    @property
    def gso(self) -> bool:
        """Whether sends still go out as GSO messages (False after a refusal)."""
        return bool(self._pass.gso_size > 0)


class _Gso:
    """A Batch's datagrams as UDP GSO messages: which datagrams may share one, and
    the mmsghdrs of a send, rebuilt per send (a burst is a few messages)."""

    def __init__(self, iov_rows: np.ndarray, k: int, lengths: np.ndarray,
                 tos: np.ndarray | None, gso_size: int, name: _SockAddrIn) -> None:
        n = len(lengths)
        self._iov_rows = iov_rows
        self._k = k
        self.max_segments = max_segments(gso_size)
        # Datagram i may be followed by i + 1 in one message: the kernel cuts a message
        # into gso_size pieces, so all but its last datagram must be exactly that long.
        joins = lengths[:-1] == gso_size
        if tos is not None:
            joins &= tos[:-1] == tos[1:]
        # Where runs end: one past each datagram that may not be followed (a short one,
        # or the last before a new TOS), and n. A sorted list: a send bisects it.
        self._run_stops = (np.flatnonzero(~joins) + 1).tolist() + [n]
        # The control messages: the cut size, and each datagram's TOS if it has one
        # (one per datagram, found by a message's first); without TOS every message
        # carries the same one, so there is one, pointed at once.
        self._ctrl = np.zeros(n if tos is not None else 1, _CMSG_GSO)
        self._ctrl["cmsg_len"] = socket.CMSG_LEN(2)
        self._ctrl["cmsg_level"] = SOL_UDP
        self._ctrl["cmsg_type"] = UDP_SEGMENT
        self._ctrl["value"] = gso_size
        ctrl_bytes = socket.CMSG_SPACE(2)
        ctrl_at = self._ctrl.ctypes.data
        self._ctrl_at: np.ndarray | None = None
        if tos is not None:
            self._ctrl["tos"]["cmsg_len"] = socket.CMSG_LEN(4)
            self._ctrl["tos"]["cmsg_level"] = socket.IPPROTO_IP
            self._ctrl["tos"]["cmsg_type"] = socket.IP_TOS
            self._ctrl["tos"]["value"] = tos
            ctrl_bytes += socket.CMSG_SPACE(4)
            self._ctrl_at = ctrl_at + np.arange(n, dtype=np.int64) * self._ctrl.itemsize
        self._msgs = np.zeros(n, _MMSG)
        hdr = self._msgs["msg_hdr"]
        hdr["msg_name"] = ctypes.addressof(name)
        hdr["msg_namelen"] = ctypes.sizeof(name)
        hdr["msg_controllen"] = ctrl_bytes
        if self._ctrl_at is None:
            hdr["msg_control"] = ctrl_at
        # The fields a send rewrites, as views made once.
        self._msg_iov, self._msg_iovlen = hdr["msg_iov"], hdr["msg_iovlen"]
        self._msg_control = hdr["msg_control"]
        self._address = self._msgs.ctypes.data
        self.sent_any = False

    def messages(self, first: int, count: int) -> tuple[list[int], list[int]]:
        """The messages datagrams first .. first + count - 1 go out in: each one's first
        datagram and its number of datagrams."""
        stop = first + count
        starts, sizes = [], []
        while first < stop:
            run_stop = self._run_stops[bisect.bisect_right(self._run_stops, first)]
            end = min(stop, first + self.max_segments, run_stop)
            starts.append(first)
            sizes.append(end - first)
            first = end
        return starts, sizes

    def send(self, fd: int, first: int, count: int) -> None:
        starts, sizes = self.messages(first, count)
        m = len(starts)
        self._msg_iov[:m] = self._iov_rows[starts]
        self._msg_iovlen[:m] = sizes
        self._msg_iovlen[:m] *= self._k
        if self._ctrl_at is not None:
            self._msg_control[:m] = self._ctrl_at[starts]
        done = 0
        while done < m:
            sent = _required(_sendmmsg, "sendmmsg")(
                fd, self._address + done * _MMSG.itemsize, m - done, 0)
            if sent < 0:
                err = ctypes.get_errno()
                if err in (errno.EINTR, errno.EAGAIN, errno.ENOBUFS):
                    continue
                raise OSError(err, os.strerror(err))
            self.sent_any = True
            done += sent


class _Reads:
    """recvmmsg into preallocated mmsghdrs: message ``i`` lands in ``block_bytes`` of
    ``data`` from byte ``i * block_bytes``, with its source address and its control
    messages (a ``ctrl_dtype``). What Inbox and GroInbox share."""

    # Where rows(n), lengths(n) and sources(n) always start, if they always start at
    # the same place (receiver.Receiver.accept's ``addresses``); None: they do not.
    addresses: tuple[int, int, int] | None = None

    def __init__(self, sock: socket.socket, count: int, data: np.ndarray, block_bytes: int,
                 ctrl_dtype: np.dtype) -> None:
        self._sock = sock
        self.data = data
        self._names = np.zeros(count, _NAME)
        self._ctrl = np.zeros(count, ctrl_dtype)
        self._iov = np.zeros(count, _IOV)
        self._iov["iov_base"] = data.ctypes.data + np.arange(count) * block_bytes
        self._iov["iov_len"] = block_bytes
        self._msgs = np.zeros(count, _MMSG)
        hdr = self._msgs["msg_hdr"]
        hdr["msg_name"] = self._names.ctypes.data + np.arange(count) * self._names.itemsize
        hdr["msg_iov"] = self._iov.ctypes.data + np.arange(count) * self._iov.itemsize
        hdr["msg_iovlen"] = 1
        hdr["msg_control"] = self._ctrl.ctypes.data + np.arange(count) * self._ctrl.itemsize
        self._namelen = hdr["msg_namelen"]  # views, reset before every call
        self._controllen = hdr["msg_controllen"]
        self._count = count
        self._address = self._msgs.ctypes.data
        self.filled = False  # the last read took as many as it could hold
        # Packets the last read delivered as the interface counted them (a UDP GSO
        # message read whole is one; GroInbox leaves out the misfits it drops).
        self.packets = 0

    def _read(self) -> int:
        """Read the messages waiting in the socket, up to ``count``, without blocking;
        0 if there are none. Raises OSError when the socket is closed."""
        self._namelen[:] = self._names.itemsize  # the kernel overwrites both
        self._controllen[:] = self._ctrl.itemsize
        while True:
            got = _required(_recvmmsg, "recvmmsg")(self._sock.fileno(), self._address,
                                                   self._count, MSG_DONTWAIT | MSG_TRUNC, None)
            if got >= 0:
                self.filled = got == self._count  # more may be waiting
                self.packets = int(got)
                return int(got)
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.filled = False
                self.packets = 0
                return 0
            if err != errno.EINTR:
                raise OSError(err, os.strerror(err))


class Inbox(_Reads):
    """Up to ``count`` datagrams per recvmmsg call into ``data[i, :row_bytes]``; longer
    datagrams are cut there, and ``lengths`` still says their real length."""

    def __init__(self, sock: socket.socket, count: int, row_bytes: int) -> None:
        super().__init__(sock, count, np.zeros((count, row_bytes), np.uint8), row_bytes,
                         _CMSG_TS)

    def recv(self) -> int:
        """Read the datagrams waiting in the socket, up to ``count``, without blocking;
        0 if there are none. Raises OSError when the socket is closed."""
        return self._read()

    def rows(self, n: int) -> np.ndarray:
        """The first ``n`` datagrams of the last recv, one row each."""
        return self.data[:n]

    def lengths(self, n: int) -> np.ndarray:
        """Real lengths of the first ``n`` datagrams of the last recv (may exceed a row)."""
        return self._msgs["msg_len"][:n].astype(np.int64)

    def sources(self, n: int) -> np.ndarray:
        """IPv4 source addresses of the first ``n`` datagrams, as big-endian u32 ints."""
        return self._names["sin_addr"][:n].copy().view(">u4").reshape(n).astype(np.int64)

    def arrivals(self, n: int) -> np.ndarray:
        """Kernel arrival times (CLOCK_REALTIME ns) of the first ``n`` datagrams, 0
        where the socket gave none (SO_TIMESTAMPNS off)."""
        c = self._ctrl[:n]
        ok = (self._controllen[:n] >= self._ctrl.itemsize) \
            & (c["cmsg_level"] == socket.SOL_SOCKET) & (c["cmsg_type"] == SO_TIMESTAMPNS)
        return np.where(ok, c["tv_sec"] * 1_000_000_000 + c["tv_nsec"], 0).astype(np.int64)

    def arrival_ns(self, i: int) -> int | None:
        """Kernel arrival time (CLOCK_REALTIME) of datagram ``i``, if the socket has
        SO_TIMESTAMPNS on."""
        if self._controllen[i] < self._ctrl.itemsize:
            return None
        c = self._ctrl[i]
        if c["cmsg_level"] != socket.SOL_SOCKET or c["cmsg_type"] != SO_TIMESTAMPNS:
            return None
        return int(c["tv_sec"]) * 1_000_000_000 + int(c["tv_nsec"])


class GroInbox(_Reads):
    """Inbox's interface for a socket with UDP_GRO on (turned on here, with
    SO_TIMESTAMPNS; OSError where the kernel has no UDP_GRO). Each read message has a
    block of rows, as many as a 64 KiB message has datagrams: a UDP GSO message cut at
    the row size fills its block's rows one datagram each, a single datagram fills the
    first. A GSO message cut at any other size is not ours (our senders cut at the full
    datagram, which is the row): it is dropped and counted in ``misfits``. ``recv``
    returns datagrams, and every accessor is per datagram."""

    def __init__(self, sock: socket.socket, count: int, row_bytes: int) -> None:
        sock.setsockopt(SOL_UDP, UDP_GRO, 1)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self._row_bytes = row_bytes
        self._block = -(-MAX_UDP_PAYLOAD // row_bytes)  # rows: no message is ever cut
        super().__init__(sock, count, np.zeros((count * self._block, row_bytes), np.uint8),
                         self._block * row_bytes, _CMSG_TS_GRO)
        self._msg_len = self._msgs["msg_len"]
        self._addresses: np.ndarray = self._names["sin_addr"].view(">u4").reshape(count)
        self.misfits = 0
        self.gso_messages = 0  # UDP GSO messages read whole (more than one datagram)
        self._rows = self.data[:0]
        self._lengths = self._sources = self._arrivals = np.zeros(0, np.int64)
        self._message: np.ndarray | None = self._lengths  # per row, its message (numpy's split)
        # rxfast.c's split (None: numpy's): it moves the datagrams into the first rows
        # and writes their lengths, sources and arrival times here.
        self._native = rxfast.library()
        self._out = np.zeros((3, count * self._block), np.int64)
        self._counts = np.zeros(3, np.int64)
        self._native_args = (self._msgs.ctypes.data, self._ctrl.ctypes.data,
                             self._names.ctypes.data, self.data.ctypes.data, self._block,
                             row_bytes, *(row.ctypes.data for row in self._out),
                             self._counts.ctypes.data)
        # After that split rows(n), lengths(n) and sources(n) start at the same place
        # whatever n: the receiver hands them to C as they are (taking an address from
        # an array costs more than C's work on a batch).
        self.addresses = None if self._native is None else \
            (self.data.ctypes.data, self._out[0].ctypes.data, self._out[1].ctypes.data)

    def recv(self) -> int:
        """Read what is waiting, up to ``count`` messages, without blocking; the number
        of datagrams they held (0: none). OSError when the socket is closed."""
        got = self._read()
        if not got:
            return 0
        return self._split(got) if self._native is None else self._split_native(got)

    def _split_native(self, got: int) -> int:
        """``_split`` in one call of rxfast.c; the rows then need no index."""
        assert self._native is not None
        msgs, ctrl, names, data, block, row_bytes, lengths, sources, arrivals, counts = \
            self._native_args
        self._counts[:] = 0
        n = self._native.rxfast_gro_split(msgs, got, ctrl, names, data, block, row_bytes,
                                          lengths, sources, arrivals, counts)
        misfits, gso_messages, packets = self._counts.tolist()
        self.misfits += misfits
        self.gso_messages += gso_messages
        self.packets = packets
        self._rows = self.data[:n]
        self._lengths, self._sources, self._arrivals = \
            self._out[0, :n], self._out[1, :n], self._out[2, :n]
        self._message = None
        return int(n)

    def _split(self, got: int) -> int:
        """Datagram rows of the ``got`` messages just read."""
        length = self._msg_len[:got].astype(np.int64)
        ctrl = self._ctrl[:got]
        gro = ((self._controllen[:got] >= self._ctrl.itemsize)
               & (ctrl["gro_type"] == UDP_GRO) & (ctrl["gro_level"] == SOL_UDP))
        gso = np.where(gro, ctrl["gso"], 0).astype(np.int64)
        fits = (gso == 0) | (gso == self._row_bytes)
        if not fits.all():
            self.misfits += int(got - np.count_nonzero(fits))
            self.packets = int(np.count_nonzero(fits))
        # Datagrams per message: a GSO message's length over its cut size, rounded up.
        count = np.where(gso > 0, -(-length // self._row_bytes), 1) * fits
        self.gso_messages += int(np.count_nonzero(count > 1))
        message = np.repeat(np.arange(got), count)
        index = np.arange(len(message)) - np.repeat(np.cumsum(count) - count, count)
        left = length[message] - index * self._row_bytes
        self._lengths = np.where(gso[message] > 0, np.minimum(left, self._row_bytes), left)
        # One message's rows are in place; several leave gaps between their blocks.
        self._rows = self.data[:len(message)] if got == 1 else \
            self.data[message * self._block + index]
        self._message = message
        return len(message)

    def rows(self, n: int) -> np.ndarray:
        return self._rows[:n]

    def lengths(self, n: int) -> np.ndarray:
        return self._lengths[:n]

    def sources(self, n: int) -> np.ndarray:
        if self._message is None:
            return self._sources[:n]
        return np.asarray(self._addresses[self._message[:n]], np.int64)

    def arrivals(self, n: int) -> np.ndarray:
        if self._message is None:
            return self._arrivals[:n]
        ctrl = self._ctrl[self._message[:n]]
        ok = (ctrl["ts_type"] == SO_TIMESTAMPNS) & (ctrl["ts_level"] == socket.SOL_SOCKET)
        return np.where(ok, ctrl["tv_sec"] * 1_000_000_000 + ctrl["tv_nsec"], 0)

    def arrival_ns(self, i: int) -> int | None:
        if self._message is None:
            return int(self._arrivals[i]) or None
        c = self._ctrl[self._message[i]]
        if c["ts_type"] != SO_TIMESTAMPNS or c["ts_level"] != socket.SOL_SOCKET:
            return None
        return int(c["tv_sec"]) * 1_000_000_000 + int(c["tv_nsec"])


class _CmsgTsGro(ctypes.Structure):
    """A read's control messages under UDP_GRO, in the kernel's order: the arrival
    time (SO_TIMESTAMPNS), then, for a GSO message, its cut size (UDP_GRO, an int)."""

    _fields_ = [("ts_len", ctypes.c_size_t), ("ts_level", ctypes.c_int),
                ("ts_type", ctypes.c_int), ("tv_sec", ctypes.c_int64),
                ("tv_nsec", ctypes.c_int64), ("gro_len", ctypes.c_size_t),
                ("gro_level", ctypes.c_int), ("gro_type", ctypes.c_int),
                ("gso", ctypes.c_int), ("_pad", ctypes.c_int)]


assert _CmsgTsGro.gro_len.offset == socket.CMSG_SPACE(16)
assert ctypes.sizeof(_CmsgTsGro) == socket.CMSG_SPACE(16) + socket.CMSG_SPACE(4)
_CMSG_TS_GRO = np.dtype(_CmsgTsGro)


def ipv4(address: str) -> int:
    """``address`` as the integer ``Inbox.sources`` reports for it."""
    return int.from_bytes(socket.inet_aton(address), "big")
