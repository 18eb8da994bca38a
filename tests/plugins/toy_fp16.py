"""A researcher's transport in a package of its own, registered with one entry point.

The idea tried: carry every vector as float16, half the bytes of float32 on the wire,
about three significant digits kept. It wraps tailcut's TCP transport, so it is TCP in
everything else (its connections, its congestion control). A job names it as
``transport: {type: toy-fp16}``; `tailcut run` finds it through the entry point in
toy_fp16-0.1.dist-info/entry_points.txt, which ``pip install`` of a package whose
pyproject.toml says

    [project.entry-points."tailcut.transports"]
    toy-fp16 = "toy_fp16:KIND"

would write. docs/transports.md walks through it.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from tailcut.spec.transport_kinds import TransportKind
from tailcut.transports import base, tcp

# What the spec, the planner and `tailcut compare` know of it: its vectors go over
# kernel TCP (so it takes tcpCongestionControl); it drops nothing (no p), tags nothing.
KIND = TransportKind("toy-fp16", "toy_fp16:Fp16Transport", short="f16", kernel_tcp=True)

_COUNT = np.dtype("<u4")   # the vector's length, ahead of its float16 pairs


def pack(values: np.ndarray) -> np.ndarray:
    """``values`` as float16, two to a float32 slot, behind a slot holding their count."""
    flat = np.asarray(values, np.float32).reshape(-1)
    if not flat.size:
        return flat
    half = flat.astype(np.float16)
    if half.size % 2:
        half = np.append(half, np.float16(0))
    count = np.array([flat.size], _COUNT).view(np.float32)
    return np.concatenate([count, half.view(np.float32)])


def unpack(packed: np.ndarray) -> np.ndarray:
    """What ``pack`` packed, as float32; a malformed vector raises ProtocolError."""
    if not packed.size:
        return packed
    count = int(packed[:1].view(_COUNT)[0])
    half = packed[1:].view(np.float16)
    if not (half.size - 1 <= count <= half.size):
        raise base.ProtocolError(f"toy-fp16: a vector of {half.size} halves claims "
                                 f"{count} values")
    return half[:count].astype(np.float32)


class Fp16Connection(base.Connection):
    """A TCP connection whose messages travel as float16."""

    def __init__(self, inner: base.Connection) -> None:
        self._inner = inner
        self.peer = inner.peer

    def send(self, msg: base.Message, timeout_s: float | None = None) -> None:
        self._inner.send(replace(msg, values=pack(msg.values)), timeout_s)

    def recv(self, timeout_s: float | None = None) -> base.Message:
        msg = self._inner.recv(timeout_s)
        return replace(msg, values=unpack(msg.values))

    def close(self) -> None:
        self._inner.close()


class Fp16Transport(base.Transport):
    """tailcut's TCP transport, every vector carried as float16."""

    name = "toy-fp16"

    def __init__(self, congestion_control: str | None = None) -> None:
        super().__init__()
        self._tcp = tcp.TcpTransport(congestion_control=congestion_control)

    def listen(self, host: str, port: int, count: int,
               timeout_s: float) -> list[base.Connection]:
        return [Fp16Connection(c) for c in self._tcp.listen(host, port, count, timeout_s)]

    def connect(self, host: str, port: int, timeout_s: float) -> base.Connection:
        return Fp16Connection(self._tcp.connect(host, port, timeout_s))

    def close(self) -> None:
        self._tcp.close()
        super().close()
