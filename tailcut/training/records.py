"""CSV files a role leaves in the results directory: epochs, messages and RPC stamps.

One row per epoch (written by PS shard 0, or the replica after a take-over) and
one row per data message received (PS shard 0 writes messages.csv for HELLO and
PUSH, shard s messages-ps-s.csv, the replica messages-replica-0.csv; worker N
writes messages-worker-N.csv for PARAMS and STOP; an aggregated PUSH's ``sender``
is the aggregator's index). ``completion_s`` is receive-complete time minus the
sender's ``sent_at_ns``: both read the one host clock all pods share. The
rpc-*.csv stamps below feed tailcut.training.rpc's dissection.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tailcut.transports.base import Message

EPOCH_FIELDS = ("epoch", "iteration", "train_loss", "test_loss", "test_accuracy", "elapsed_s")
MESSAGE_FIELDS = (
    "kind",
    "iteration",
    "sender",
    "receiver",
    "bytes",
    "coordinates",  # coordinates the message carries
    "missing",  # coordinates the transport did not deliver (0 over TCP)
    "sent_at_ns",
    "received_at_ns",
    "completion_s",
    "repairs",  # bounded loss: NACK rounds (passes of retransmissions) before delivery; else 0
)


def messages_filename(role: str, index: int) -> str:
    """``messages.csv`` for PS shard 0, ``messages-<role>-<index>.csv`` for the others."""
    return "messages.csv" if (role, index) == ("ps", 0) else f"messages-{role}-{index}.csv"


def message_row(msg: Message, receiver: int) -> dict[str, Any]:
    """The messages.csv row for a received message."""
    return {
        "kind": msg.kind.name,
        "iteration": msg.iteration,
        "sender": msg.sender,
        "receiver": receiver,
        "bytes": msg.wire_bytes,
        "coordinates": int(msg.values.size),
        "missing": msg.missing,
        "sent_at_ns": msg.sent_at_ns,
        "received_at_ns": msg.received_at_ns,
        "completion_s": f"{msg.completion_s:.9f}",
        "repairs": msg.repairs,
    }


class CsvLog:
    """A CSV file written row by row, header first; flush() makes rows durable."""

    def __init__(self, path: str | Path, fields: Sequence[str], append: bool = False) -> None:
        """``append``: add rows to an existing file (a PS replica continues epochs.csv)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(path)
        header = not (append and self.path.exists() and self.path.stat().st_size > 0)
        mode = "a" if append else "w"
        self._file = open(self.path, mode, newline="")  # noqa: SIM115 - closed in close()
        self._writer = csv.DictWriter(self._file, fieldnames=list(fields))
        if header:
            self._writer.writeheader()

    def write(self, row: Mapping[str, Any]) -> None:
        self._writer.writerow(row)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> CsvLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# Per-RPC stamps (IMC'20 dissection). Every role that answers a request writes one
# SERVER row per request it answered (rpc-server-<name>.csv); every role that sends
# one writes one CLIENT row per answer it took from its queue (rpc-client-<name>.csv).
# All stamps are time.time_ns() of the one host clock the pods share, so
# tailcut.training.rpc joins the two sides afterwards instead of piggybacking the
# server's numbers on the reply.
SERVER_RPC_FIELDS = (
    "op",  # push or pull
    "client",  # worker-3, aggregator-0
    "server",  # ps-0, replica-0, aggregator-0
    "step",  # the client's step the request belongs to
    "version",  # model version (updates applied, per iteration in bsp) when answered
    "arrived_ns",  # request complete in the server's receiving queue
    "dequeued_ns",  # the server took it out of the queue
    "ready_ns",  # the sync mode let it proceed (bsp barrier, ssp bound); = dequeued if no wait
    "replied_ns",  # processing done, reply starts going out
    "request_bytes",
    "reply_bytes",
    "nonzero",  # push: coordinates the update changed
)
CLIENT_RPC_FIELDS = (
    "op",
    "client",
    "server",
    "step",
    "sent_ns",  # t0: the request was handed to the network stack
    "request_bytes",
    "reply_arrived_ns",  # t1: the reply was complete in the client's receiving queue
    "dequeued_ns",  # the client took the reply out of its queue
    "done_ns",  # the client finished processing the reply
    "reply_bytes",
)


def rpc_filename(side: str, name: str) -> str:
    """``rpc-server-ps-0.csv``, ``rpc-client-worker-3.csv``."""
    return f"rpc-{side}-{name}.csv"
