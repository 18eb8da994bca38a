"""The datagram receiver's state: check batches of packets, fill each message's vector
and mask, and decide when a message is complete or needs a NACK.

No I/O here: the transport (datagram.py) reads the socket and the XDP events, calls
``accept``/``fired``/``sweep`` and does what the returned ``Done`` items say (deliver,
DONE, NACK). Every packet of a batch is checked with numpy (wire.check_batch, then
job, message, source, total, kind and the slot's exact range) before a value is
written, and values are written only as whole slots of the message's vector, so no
packet writes outside it; a slot is counted once however often it arrives.
"""

from __future__ import annotations

import collections
import ctypes
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from tailcut.spec import fraction
from tailcut.transports import cutlayout, rxfast, wire

# Packets kept for messages whose BEGIN has not been read yet (the control channel can
# lag the data); beyond this they are dropped and recovered as losses.
STASH_PACKETS = 16384
FINISHED_REMEMBERED = 4096
RETIRED_CHECKED = 64   # finished messages whose late packets rxfast.c checks
KERNEL_LINGER_S = 0.02  # a handed-over message's region stays bound this long
AHEAD_LAPSE_S = 10.0    # a region bound ahead for a message that does not come
MAX_ENDS = 256  # END frames a pass may announce (one per TOS it used)
# Early close (min_p < p): once a pass's LAST packet is read, a message below p is
# handed over with what arrived (if at least min_p) after QUIET_GAPS of its recent
# inter-packet gaps pass with nothing more from it, that quiet time kept within
# [QUIET_MIN_NS, QUIET_MAX_NS]: what a reordered packet of the pass would still take.
QUIET_GAPS = 16
QUIET_MIN_NS = 200_000
QUIET_MAX_NS = 2_000_000
GAP_WEIGHT = 0.25  # of each batch's mean gap in the moving average
_MESSAGE_AT: int = wire.header_type().message.offset
_MESSAGE_BYTES = slice(_MESSAGE_AT, _MESSAGE_AT + 4)  # a row's message id (big-endian)


class Peer(Protocol):
    """What the receiver needs of a connection: its id and its data source address."""

    peer_id: int
    udp_addr: tuple[str, int]


@dataclass
class Rx:
    """One message being received."""

    conn: Any  # the Peer it comes from (a DatagramConnection)
    source: int  # the peer's IPv4 address, as batch.Inbox.sources reports it
    message: int
    kind: int
    iteration: int
    sender: int
    total: int
    sent_at_ns: int
    threshold: int
    values: np.ndarray
    mask: np.ndarray
    seen: np.ndarray  # per slot: counted already
    template: np.ndarray  # its packets' header words under wire.shared_bits
    count: int = 0
    wire_bytes: int = 0
    fired: bool = False
    event_ns: int = 0
    end_at: float | None = None  # monotonic time the last END was read (None: no pass)
    end_ns: int = 0  # the same moment, CLOCK_REALTIME, to compare with packet timestamps
    ends: int = 0  # END frames of the current pass read so far (a tagged pass sends several)
    # the rate its sender runs at as far as grants go (congestion.py): the last GRANT
    # sent, or the rate its BEGIN said it starts at; 0: neither
    granted_kbit: int = 0
    repairs: int = 0  # NACKs sent for it: each asks for one pass of retransmissions
    # Early close: the threshold below p it may be handed over at, the kernel arrival
    # time (CLOCK_REALTIME) of its newest packet, the moving average of the gaps
    # between its packets, and whether the current pass's LAST packet was read.
    min_threshold: int = 0
    last_arrival_ns: int = 0
    gap_ns: float | None = None
    pass_over: bool = False
    begun_ns: int = field(default_factory=time.monotonic_ns)
    # A CadentFlow-tagged message: its cuts' wire layout (``total`` is then the wire
    # length, padding included, and ``elements`` the message's), the slots each cut
    # still lacks, and when its last one arrived (time.time_ns(), 0: not yet).
    layout: cutlayout.Layout | None = None
    elements: int = 0
    cut_missing: np.ndarray | None = None
    cut_done_ns: np.ndarray | None = None
    # rxfast.c's view of it (an untagged message, with the library loaded)
    native: rxfast.Message | None = None
    # Its region of the kernel receive path (tailcut.datapath.rxring.Message), which
    # places the datagrams that arrive once it is bound; those before (stashed, or
    # read by the socket) are in values/mask/seen/count above. Merged at retire.
    kernel: Any = None
    bound_ahead: bool = False   # its region was bound before its BEGIN (from the last)

    def __post_init__(self) -> None:
        self.elements = self.total if self.layout is None else self.layout.elements
        if self.layout is not None:
            self.cut_missing = self.layout.slots_per_cut.copy()
            self.cut_done_ns = np.zeros(len(self.layout.cuts), np.int64)

    def make_native(self, stride: int) -> None:
        """rxfast.c's view of this message: its checks and its arrays (kept alive by
        this Rx)."""
        m = self.native = rxfast.Message()
        m.template_words[:] = self.template.tolist()
        m.shared_bits[:] = wire.shared_bits().tolist()
        m.source, m.total, m.stride = self.source, self.total, stride
        m.values, m.mask = self.values.ctypes.data, self.mask.ctypes.data
        m.seen = self.seen.ctypes.data


@dataclass(frozen=True)
class Done:
    """What to do for a message once the lock is released: deliver it, or NACK."""

    rx: Rx
    reason: str  # full | xdp | p | end | early | nack
    missing: bytes = b""  # NACK: the missing slots as big-endian u32s


threshold_elements = fraction.threshold_elements  # as the XDP program computes it


class Receiver:
    """Messages being received from any peer; the caller holds one lock around every call."""

    def __init__(self, job_id: int, stride: int, p: float, bounded: bool, xdp: bool,
                 max_elements: int, stats: collections.Counter[str],
                 min_p: float | None = None) -> None:
        self.job_id = job_id
        self.stride = stride
        self.p = p
        # The floor below p a message may close early at (None: p, no early close).
        self.min_p = min_p
        self.bounded = bounded
        self.xdp = xdp  # completions at p wait for the XDP counter's event
        self.max_elements = max_elements
        self.stats = stats
        # Rows must hold the largest acceptable datagram; a longer one is cut, but its
        # real length still fails the checks.
        self.row_bytes = wire.HEADER_BYTES + 4 * stride
        self.rx: dict[int, Rx] = {}
        self.peers: dict[int, tuple[Peer, int]] = {}  # peer id -> (peer, source address)
        self._stash: dict[int, list[tuple[np.ndarray, int]]] = {}
        self._stashed = 0
        self._early_fired: dict[int, int] = {}
        self.finished: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.native = rxfast.library()  # None: numpy does every step
        self._native_out = np.zeros(4, np.int64)
        self._native_out_at = self._native_out.ctypes.data
        # The last RETIRED_CHECKED finished messages as rxfast.c sees them, every slot
        # marked seen and no array to write to: the packets still in flight after DONE
        # (the tail beyond p) are checked and counted late by one call, not by numpy.
        self._retired: collections.OrderedDict[int, rxfast.Message] = \
            collections.OrderedDict()
        self._all_seen = np.ones(wire.slots(max_elements, stride), bool)
        # The kernel receive path (tailcut.datapath.rxring.Ring), or None: the socket's.
        self.ring: Any = None
        # Regions of messages handed over, kept bound until a moment on (monotonic) so
        # that their late datagrams end in the kernel, not in the socket (and a wake-up).
        self._releasing: collections.deque[tuple[float, int]] = collections.deque()
        # Regions bound ahead of a BEGIN, to the message each peer sends next (its id
        # + 1, the size and kind of its last): a BEGIN is read by a thread that may
        # wake after the message's first datagrams, which would then go to the socket.
        # By message: (kind, total, source, when it lapses, monotonic).
        self._ahead: dict[int, tuple[int, int, int, float]] = {}

    @property
    def early_close(self) -> bool:
        """Whether a message may be handed over below p (bounded, min_p < p)."""
        return self.bounded and self.min_p is not None and self.min_p < self.p

    def begin(self, conn: Peer, source: int, message: int, kind: int, iteration: int,
              sender: int, total: int, sent_at_ns: int,
              layout: cutlayout.Layout | None = None, start_kbit: int = 0) -> list[Done]:
        """A BEGIN (checked by the caller, ``layout`` decoded from its cut table):
        allocate the message, replay its stash. p applies to the message's elements,
        not to the padding of a layout. ``start_kbit``: the rate the sender starts at,
        which counts as granted (a share within congestion.REGRANT_RATIO of it is not
        sent: one frame and a wake-up of the sender a message fewer)."""
        n_slots = wire.slots(total, self.stride)
        elements = total if layout is None else layout.elements
        rx = Rx(conn, source, message, kind, iteration, sender, total, sent_at_ns,
                threshold_elements(self.p, elements), np.zeros(total, wire.VALUE_DTYPE),
                np.zeros(total, bool), np.zeros(n_slots, bool),
                wire.template(self.job_id, message, kind, total), layout=layout,
                granted_kbit=start_kbit)
        rx.min_threshold = rx.threshold if not self.early_close else \
            threshold_elements(self.min_p or self.p, elements)
        # (A kind or a total check_batch refuses keeps its packets on that path.)
        if self.native is not None and layout is None and kind in wire.DATA_KINDS \
                and total <= self.max_elements:
            rx.make_native(self.stride)
        done: list[Done] = []
        self.finished.pop(message, None)
        self._retired.pop(message, None)
        self.rx[message] = rx
        self._bind(rx)
        ktime = self._early_fired.pop(message, None)
        if ktime is not None:
            rx.fired, rx.event_ns = True, ktime
        stashed = self._stash.pop(message, [])
        if stashed:
            self._stashed -= len(stashed)
            data = np.zeros((len(stashed), self.row_bytes), np.uint8)
            lengths = np.zeros(len(stashed), np.int64)
            sources = np.zeros(len(stashed), np.int64)
            for i, (row, src) in enumerate(stashed):
                data[i, :row.size] = row
                lengths[i], sources[i] = row.size, src
            self.accept(data, lengths, sources, done)
        self.check(rx, done)
        return done

    def end(self, conn: Peer, message: int, of: int = 1) -> None:
        """One of the ``of`` END frames of a pass over ``message`` (one per priority
        class the pass used, each behind its class's packets): the pass is over once
        all are in."""
        rx = self.rx.get(message)
        if rx is not None and rx.conn is conn:
            rx.ends += 1
            if rx.ends < min(max(of, 1), MAX_ENDS):
                return
            rx.ends = 0
            rx.end_at = time.monotonic()
            rx.end_ns = time.time_ns()

    def accept(self, data: np.ndarray, lengths: np.ndarray, sources: np.ndarray,
               done: list[Done], arrivals: np.ndarray | None = None,
               addresses: tuple[int, int, int] | None = None) -> None:
        """Datagrams ``data[i, :lengths[i]]`` from ``sources[i]``, which reached the
        host at ``arrivals[i]`` (kernel CLOCK_REALTIME ns, 0 or None: unknown): check
        them all, put the values of the new slots in place, count every reason a
        packet is refused. ``addresses``: where ``data``, ``lengths`` (int64) and
        ``sources`` (int64) start in memory, if the caller knows (batch.GroInbox)."""
        # Every message's completion is judged once the whole batch is in, whichever
        # path took its packets (so the paths agree to the packet: test_rxfast.py).
        touched: list[Rx] = []
        if self.native is not None and not self.early_close:
            self._accept_native(data, lengths, sources, addresses, touched)
        elif not self._accept_run(data, lengths, sources, done, arrivals):
            self._accept_checked(data, lengths, sources, arrivals, touched)
        for rx in touched:
            self.check(rx, done)

    def _accept_checked(self, data: np.ndarray, lengths: np.ndarray, sources: np.ndarray,
                        arrivals: np.ndarray | None, touched: list[Rx]) -> None:
        """``accept``'s general path: every check on every datagram, with its reason."""
        hdr = wire.headers(data)
        codes = wire.check_batch(hdr, lengths, self.max_elements)
        bad = codes != 0
        if bad.any():
            found, counts = np.unique(codes[bad], return_counts=True)
            for code, count in zip(found.tolist(), counts.tolist()):
                self.stats["bad_packet"] += count
                self.stats[f"bad_packet: {wire.REASONS[code]}"] += count
        good = np.flatnonzero(~bad)
        ours = hdr["job"][good] == self.job_id
        if not ours.all():
            self.stats["unknown_job"] += int(good.size - np.count_nonzero(ours))
            good = good[ours]
        if not good.size:  # nothing well-formed of this job in the batch
            return
        messages = hdr["message"][good].astype(np.int64)
        # Usually one message: a batch holds a run of one sender's packets.
        one = messages.min() == messages.max()
        for message in [int(messages[0])] if one else np.unique(messages).tolist():
            idx = good if one else good[messages == message]
            rx = self.rx.get(message)
            if rx is None:
                self._unbegun(message, idx, data, lengths, sources)
            else:
                self._fill(rx, idx, hdr, data, lengths, sources, arrivals)
                touched.append(rx)

    def _accept_run(self, data: np.ndarray, lengths: np.ndarray, sources: np.ndarray,
                    done: list[Done], arrivals: np.ndarray | None) -> bool:
        """The common case in a few numpy calls: every datagram is a well-formed packet
        of one live message from its peer. False (nothing done) if any is not; then
        ``accept`` checks each one and names what is wrong. Passing here implies
        passing every check there (the template fixes magic, version, kind, reserved,
        unknown flags, job, message and total; the range and length are checked below)."""
        hdr = wire.headers(data)
        rx = self.rx.get(int(hdr["message"][0]))
        if rx is None or not (sources == rx.source).all() \
                or not ((wire.words(data) & wire.shared_bits()) == rx.template).all():
            return False
        stride = self.stride
        start = hdr["start"].astype(np.int64)
        end = hdr["end"].astype(np.int64)
        slots = start // stride
        if not ((slots * stride == start) & (start < rx.total)
                & (end == np.minimum(start + stride, rx.total))
                & (lengths == wire.HEADER_BYTES + 4 * (end - start))).all():
            return False
        idx = np.arange(len(slots))
        self._add(rx, idx, slots, start, end, data, lengths)
        self._arrived(rx, idx, hdr, arrivals)
        self.check(rx, done)
        return True

    def _accept_native(self, data: np.ndarray, lengths: np.ndarray, sources: np.ndarray,
                       addresses: tuple[int, int, int] | None, touched: list[Rx]) -> None:
        """``accept`` run by run (a run: consecutive rows of one message from one
        source, what one GSO message brings). A run of well-formed packets of a live
        untagged message is taken by one call of rxfast.c; any other (a message not
        begun or finished, a tagged one, a bad datagram and the rest of its run) by
        ``_accept_checked``. Not with early close: its gap estimate follows what each
        batch brings per message, which runs would split."""
        assert self.native is not None
        n = len(data)
        if data.ndim != 2 or data.dtype != np.uint8 or data.strides[1] != 1 \
                or data.shape[1] < self.row_bytes or data.strides[0] < data.shape[1] \
                or len(lengths) < n or len(sources) < n:
            self._accept_checked(data, lengths, sources, None, touched)
            return  # rows C cannot walk, or too few lengths: numpy takes (or refuses) them
        row_bytes = data.strides[0]
        if addresses is None:
            lengths = np.ascontiguousarray(lengths, np.int64)
            sources = np.ascontiguousarray(sources, np.int64)
            addresses = data.ctypes.data, lengths.ctypes.data, sources.ctypes.data
        at, lengths_at, sources_at = addresses
        out, out_at = self._native_out, self._native_out_at
        taken = 0
        while taken < n:
            message = int.from_bytes(data[taken, _MESSAGE_BYTES].tobytes(), "big")
            rx = self.rx.get(message)
            # a live message's view, or a finished one's (its late packets)
            view = rx.native if rx is not None else self._retired.get(message)
            run = 0
            if view is not None:
                run = self.native.rxfast_accept_run(
                    at + taken * row_bytes, n - taken, row_bytes, lengths_at + 8 * taken,
                    sources_at + 8 * taken, ctypes.addressof(view), out_at)
            if run and rx is None:
                # well-formed packets of a finished message: late, as _unbegun counts them
                self.stats["late"] += run
            elif run and rx is not None:
                added, duplicates, elements, wire_bytes = out.tolist()
                rx.count += elements
                rx.wire_bytes += wire_bytes
                if duplicates:
                    self.stats["duplicate"] += duplicates
                if added:
                    self.stats["accepted"] += added
                touched.append(rx)
            else:
                run = self.native.rxfast_same_message(
                    at + taken * row_bytes, n - taken, row_bytes, sources_at + 8 * taken)
                end = taken + run
                self._accept_checked(data[taken:end], lengths[taken:end], sources[taken:end],
                                     None, touched)
            taken += run

    def _unbegun(self, message: int, idx: np.ndarray, data: np.ndarray, lengths: np.ndarray,
                 sources: np.ndarray) -> None:
        """Packets of a message that is finished (late) or not begun yet (stash them if
        they come from the peer the id names)."""
        if message in self.finished:
            self.stats["late"] += idx.size
            return
        peer = self.peers.get(message >> 16)
        if peer is None:
            self.stats["unknown_message"] += idx.size
            return
        from_peer = idx[sources[idx] == peer[1]]
        if from_peer.size < idx.size:
            self.stats["unknown_message"] += idx.size - from_peer.size
        room = max(0, STASH_PACKETS - self._stashed)
        if from_peer.size > room:
            self.stats["stash_full"] += from_peer.size - room
        kept = self._stash.setdefault(message, [])
        for i in from_peer[:room].tolist():
            n = int(min(lengths[i], data.shape[1]))  # a cut datagram stays cut (refused)
            kept.append((data[i, :n].copy(), int(sources[i])))
        self._stashed += min(room, from_peer.size)

    def _fill(self, rx: Rx, idx: np.ndarray, hdr: np.ndarray, data: np.ndarray,
              lengths: np.ndarray, sources: np.ndarray,
              arrivals: np.ndarray | None = None) -> None:
        """Write the new slots among packets ``idx`` of message ``rx``."""
        stride = self.stride
        same = sources[idx] == rx.source
        if not same.all():
            self.stats["foreign_source"] += int(idx.size - np.count_nonzero(same))
            idx = idx[same]
        fits = (hdr["total"][idx] == rx.total) & (hdr["kind"][idx] == rx.kind)
        if not fits.all():
            self.stats["mismatch"] += int(idx.size - np.count_nonzero(fits))
            idx = idx[fits]
        start = hdr["start"][idx].astype(np.int64)
        end = hdr["end"][idx].astype(np.int64)
        # A slot is one fixed range; the whole datagram is in its row (checked lengths).
        aligned = (start % stride == 0) & (end == np.minimum(start + stride, rx.total)) \
            & (lengths[idx] <= data.shape[1])
        if not aligned.all():
            self.stats["misaligned"] += int(idx.size - np.count_nonzero(aligned))
            idx, start, end = idx[aligned], start[aligned], end[aligned]
        self._add(rx, idx, start // stride, start, end, data, lengths)
        self._arrived(rx, idx, hdr, arrivals)

    def _arrived(self, rx: Rx, idx: np.ndarray, hdr: np.ndarray,
                 arrivals: np.ndarray | None) -> None:
        """Packets ``idx`` of ``rx`` passed every check: when they arrived, how far
        apart, and whether one ended the pass (early close's inputs)."""
        if not self.early_close or not idx.size:
            return
        if (hdr["flags"][idx] & wire.F_LAST).any():
            rx.pass_over = True
        if arrivals is None:
            return
        t = arrivals[idx]
        t = t[t > 0]
        if not t.size:
            return
        first, last = int(t.min()), int(t.max())
        rx.last_arrival_ns = max(rx.last_arrival_ns, last)
        if t.size > 1:
            gap = (last - first) / (t.size - 1)
            rx.gap_ns = gap if rx.gap_ns is None else rx.gap_ns + GAP_WEIGHT * (gap - rx.gap_ns)

    def _add(self, rx: Rx, idx: np.ndarray, slots: np.ndarray, start: np.ndarray,
             end: np.ndarray, data: np.ndarray, lengths: np.ndarray) -> None:
        """Put checked packets ``idx`` (slots ``slots``, ranges [start, end)) in place."""
        stride = self.stride
        # Count each slot once: only if never seen, and of its copies in this batch the
        # first (as rxfast.c does).
        new = np.flatnonzero(~rx.seen[slots])
        if new.size > 1:
            new = new[np.sort(np.unique(slots[new], return_index=True)[1])]
        if new.size < idx.size:
            self.stats["duplicate"] += int(idx.size - new.size)
        if not new.size:
            return
        slots, rows = slots[new], idx[new]
        rx.seen[slots] = True
        elements = end[new] - start[new]
        floats = data.view(wire.VALUE_DTYPE)  # rows of floats; the header is 8 of them
        h0 = wire.HEADER_BYTES // wire.VALUE_DTYPE.itemsize
        whole = rx.total // stride
        full = slots < whole
        if full.any():
            values = rx.values[:whole * stride].reshape(whole, stride)
            mask = rx.mask[:whole * stride].reshape(whole, stride)
            values[slots[full]] = floats[rows[full], h0:h0 + stride]
            mask[slots[full]] = True
        if not full.all():  # the short last slot, at most once per message
            s = whole * stride
            n = rx.total - s
            rx.values[s:] = floats[rows[~full][0], h0:h0 + n]
            rx.mask[s:] = True
        if rx.layout is None:
            rx.count += int(elements.sum())
        else:
            # Padding is not the message's: count each slot's real elements, and stamp
            # the cuts whose last slot this batch brought.
            assert rx.cut_missing is not None and rx.cut_done_ns is not None
            rx.count += int(rx.layout.slot_elements[slots].sum())
            rx.cut_missing -= np.bincount(rx.layout.slot_cut[slots],
                                          minlength=rx.cut_missing.size)
            complete = (rx.cut_missing == 0) & (rx.cut_done_ns == 0)
            if complete.any():
                rx.cut_done_ns[complete] = time.time_ns()
        rx.wire_bytes += int(lengths[rows].sum())
        self.stats["accepted"] += int(slots.size)

    def fired(self, message: int, ktime_ns: int, done: list[Done]) -> None:
        """The XDP counter saw ``message`` cross p at ``ktime_ns``."""
        rx = self.rx.get(message)
        if rx is None:
            if message not in self.finished:
                self._early_fired[message] = ktime_ns
                while len(self._early_fired) > FINISHED_REMEMBERED:
                    self._early_fired.pop(next(iter(self._early_fired)))
            return
        rx.fired = True
        rx.event_ns = ktime_ns
        self.check(rx, done)

    def _bind(self, rx: Rx) -> None:
        """Give ``rx`` a region of the kernel receive path, where it can take it: an
        untagged data message that fits one, without early close (which needs each
        packet's arrival time); otherwise, or with every region bound, its datagrams
        come through the socket as before."""
        ahead = self._ahead.pop(rx.message, None) if self.ring is not None else None
        if ahead is not None and self._placeable(rx) and ahead[:3] == (
                rx.kind, rx.total, rx.source):
            rx.kernel = self.ring.message(rx.message)   # with what it placed so far
            rx.bound_ahead = True
            self.stats["kernel_bound_ahead"] += 1
            return
        if ahead is not None:
            self.ring.release(rx.message)   # guessed wrong: its datagrams went on
        if not self._placeable(rx):
            return
        rx.kernel = self._region(rx.message, rx.kind, rx.total, rx.source)
        if rx.kernel is None:
            self.stats["kernel_regions_full"] += 1

    def _placeable(self, rx: Rx) -> bool:
        return self.ring is not None and rx.layout is None and not self.early_close \
            and rx.kind in wire.DATA_KINDS and rx.total <= self.ring.capacity

    def _region(self, message: int, kind: int, total: int, source: int) -> Any:
        """A region bound to ``message`` from ``source`` (an rxring.Message), or None:
        none free. With every region bound, the oldest lingering one goes early, else
        the oldest bound ahead into which nothing has come yet."""
        from tailcut.errors import DatapathError
        if len(self.ring.bound()) >= self.ring.regions:
            if self._releasing:
                self.ring.release(self._releasing.popleft()[1])
            else:
                empty = [m for m in self._ahead if not self.ring.message(m).packets]
                if empty:
                    oldest = min(empty, key=lambda m: self._ahead[m][3])
                    del self._ahead[oldest]
                    self.ring.release(oldest)
        try:
            # (not zeroed: _take_region copies only the ranges that arrived)
            return self.ring.bind(message, total, self.p, kind, zeroed=False,
                                  source=source)
        except DatapathError:
            return None   # none free, or none out of its quarantine yet

    def _bind_ahead(self, rx: Rx) -> None:
        """Bind the message ``rx``'s peer sends next, as ``rx`` was, before its BEGIN."""
        following = (rx.message & ~0xFFFF) | ((rx.message + 1) & 0xFFFF)
        if following in self.rx or following in self._ahead or \
                following in self.finished or len(self.ring.bound()) >= self.ring.regions:
            return
        if self._region(following, rx.kind, rx.total, rx.source) is not None:
            self._ahead[following] = (rx.kind, rx.total, rx.source,
                                      time.monotonic() + AHEAD_LAPSE_S)

    def release_regions(self, now: float) -> None:
        """Release the regions whose messages were handed over KERNEL_LINGER_S ago,
        and those bound ahead for a message that did not come in AHEAD_LAPSE_S and
        into which nothing came either (what did is the message's: its BEGIN adopts
        it, or its peer's going releases it, forget_peer)."""
        if self.ring is None:
            return
        while self._releasing and self._releasing[0][0] <= now:
            self.ring.release(self._releasing.popleft()[1])
        for message in [m for m, ahead in self._ahead.items()
                        if ahead[3] <= now and not self.ring.message(m).packets]:
            del self._ahead[message]
            self.ring.release(message)

    def next_release(self) -> float | None:
        """When release_regions next has a lingering region to release (monotonic), if
        regions run short (more than half bound): otherwise the receive thread releases
        them when it wakes anyway, not waking for them (a wake-up a message)."""
        if not self._releasing or 2 * len(self.ring.bound()) <= self.ring.regions:
            return None
        return self._releasing[0][0]

    def forget_peer(self, peer_id: int) -> None:
        """The peer is gone: its messages' regions, and the one bound ahead for it, go."""
        if self.ring is None:
            return
        for rx in self.rx.values():
            if rx.message >> 16 == peer_id and rx.kernel is not None:
                rx.kernel = None
                self.ring.release(rx.message)
        for message in [m for m in self._ahead if m >> 16 == peer_id]:
            del self._ahead[message]
            self.ring.release(message)

    def kernel_event(self, message: int, ktime_ns: int, at_p: bool,
                     done: list[Done]) -> None:
        """The kernel receive path placed ``message``'s datagram that crossed its
        threshold (``at_p``) or completed it, at ``ktime_ns``."""
        rx = self.rx.get(message)
        if rx is None:
            return
        if at_p and not rx.event_ns:
            rx.event_ns = ktime_ns
        self.check(rx, done)

    def counted(self, rx: Rx) -> int:
        """The message's elements in so far, by either path: the socket's (before the
        region was bound) and the region's, a range that came both ways once."""
        if rx.kernel is None:
            return rx.count
        return self._socket_share(rx) + int(rx.kernel.counted)

    def _socket_share(self, rx: Rx) -> int:
        """The elements the socket brought that the region does not hold too."""
        if not rx.count:
            return 0
        both = rx.seen & rx.kernel.arrived
        if not both.any():
            return rx.count
        elements = int(np.count_nonzero(both)) * self.stride
        if both[-1] and rx.total % self.stride:   # the short last range
            elements -= self.stride - rx.total % self.stride
        return rx.count - elements

    def check(self, rx: Rx, done: list[Done]) -> None:
        """Complete ``rx`` if it may be."""
        if rx.message not in self.rx:
            return
        if rx.kernel is not None and rx.count:
            # Part came through the socket (before the region was bound): the region's
            # event is due when it holds the rest of p.
            rx.kernel.lower_threshold(rx.threshold - self._socket_share(rx))
        count = self.counted(rx)
        if count >= rx.elements:
            reason = "full"
        elif self.bounded and count >= rx.threshold and (rx.fired or not self.xdp):
            reason = "xdp" if rx.fired else "p"
        else:
            return
        self._retire(rx)
        done.append(Done(rx, reason))

    def _take_region(self, rx: Rx) -> None:
        """What the kernel placed for ``rx``, into its arrays. Its region stays bound
        KERNEL_LINGER_S more (release_regions), silent: its late datagrams are taken
        and dropped there."""
        region, rx.kernel = rx.kernel, None
        region.silence()
        new = region.element_mask()
        packets = region.packets
        if rx.count:   # (a range came one way only: these are disjoint)
            new &= ~rx.mask
        np.copyto(rx.values, region.values, where=new)
        rx.mask |= new
        rx.seen |= region.arrived
        counted = int(np.count_nonzero(new))
        rx.count += counted
        rx.wire_bytes += 4 * counted + wire.HEADER_BYTES * packets
        self.stats["kernel_placed"] += packets
        self._releasing.append((time.monotonic() + KERNEL_LINGER_S, rx.message))

    def _retire(self, rx: Rx) -> None:
        if rx.kernel is not None:
            self._take_region(rx)
        if self._placeable(rx):
            self._bind_ahead(rx)
        del self.rx[rx.message]
        self.finished[rx.message] = None
        while len(self.finished) > FINISHED_REMEMBERED:
            self.finished.popitem(last=False)
        if rx.native is not None:
            late = rxfast.Message.from_buffer_copy(rx.native)
            late.values = late.mask = None   # never written: every slot is seen
            late.seen = self._all_seen.ctypes.data
            self._retired[rx.message] = late
            while len(self._retired) > RETIRED_CHECKED:
                self._retired.popitem(last=False)

    def next_sweep(self, grace_s: float) -> float | None:
        """When ``sweep`` next has a pass to judge (monotonic), or None: no END is in."""
        ends = [rx.end_at for rx in self.rx.values() if rx.end_at is not None]
        return min(ends) + grace_s if ends else None

    def fired_short(self) -> bool:
        """Whether a message's XDP event is in but not yet its crossing packet (the
        event is in the ring before the packet is in the socket): read on at once."""
        return any(rx.fired and rx.count < rx.threshold for rx in self.rx.values())

    def quiet_ns(self, rx: Rx) -> int:
        """How long nothing more may arrive from ``rx``'s pass before it closes early:
        QUIET_GAPS of its recent gaps, within [QUIET_MIN_NS, QUIET_MAX_NS]."""
        if rx.gap_ns is None:
            return QUIET_MAX_NS
        return int(min(QUIET_MAX_NS, max(QUIET_MIN_NS, QUIET_GAPS * rx.gap_ns)))

    def sweep(self, now: float, read_up_to_ns: int, grace_s: float, done: list[Done]) -> None:
        """Passes that ended: complete (udp, p without an XDP event, or early close at
        min_p) or NACK. ``read_up_to_ns``: everything that reached the host before it
        (CLOCK_REALTIME) has been read."""
        for rx in list(self.rx.values()):
            # Early close: the pass's LAST packet is in, and nothing more came for a
            # few of its gaps since its newest packet: whatever is missing is lost.
            if self.early_close and rx.pass_over and rx.count >= rx.min_threshold \
                    and rx.last_arrival_ns and \
                    read_up_to_ns - rx.last_arrival_ns >= self.quiet_ns(rx):
                self.stats["early_close"] += 1
                self._retire(rx)
                done.append(Done(rx, "early"))
                continue
            # A pass is drained once the socket has been read up to END's arrival: the
            # sender sent END after the pass's last packet, over the same FIFO path, so
            # a datagram that reached the kernel after END was read means every packet
            # of the pass that survived has been read too. The grace covers reordering
            # between CPUs.
            if rx.end_at is None or read_up_to_ns < rx.end_ns or now - rx.end_at < grace_s:
                continue
            rx.end_at = None
            count = self.counted(rx)
            if not self.bounded or count >= rx.min_threshold:
                if self.bounded and count < rx.threshold:
                    self.stats["early_close"] += 1
                self._retire(rx)
                done.append(Done(rx, "end"))
            else:
                seen = rx.seen if rx.kernel is None else rx.seen | rx.kernel.arrived
                missing = np.flatnonzero(~seen).astype(">u4")
                self.stats["nacks"] += 1
                rx.repairs += 1
                rx.pass_over = False  # the next pass (retransmissions) ends anew
                done.append(Done(rx, "nack", missing.tobytes()))
