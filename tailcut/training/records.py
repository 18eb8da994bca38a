"""CSV files a role leaves in the results directory: epochs.csv and messages*.csv.

One row per epoch (written by the PS) and one row per message received (the PS
writes messages.csv for HELLO and PUSH; worker N writes messages-worker-N.csv for
PARAMS and STOP). ``completion_s`` is receive-complete time minus the sender's
``sent_at_ns``: both read the one host clock all pods share.
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
    "missing",  # coordinates the transport did not deliver (0 over TCP)
    "sent_at_ns",
    "received_at_ns",
    "completion_s",
)


def messages_filename(role: str, index: int) -> str:
    """``messages.csv`` for the PS, ``messages-worker-<index>.csv`` for a worker."""
    return "messages.csv" if role == "ps" else f"messages-worker-{index}.csv"


def message_row(msg: Message, receiver: int) -> dict[str, Any]:
    """The messages.csv row for a received message."""
    return {
        "kind": msg.kind.name,
        "iteration": msg.iteration,
        "sender": msg.sender,
        "receiver": receiver,
        "bytes": msg.wire_bytes,
        "missing": msg.missing,
        "sent_at_ns": msg.sent_at_ns,
        "received_at_ns": msg.received_at_ns,
        "completion_s": f"{msg.completion_s:.9f}",
    }


class CsvLog:
    """A CSV file written row by row, header first; flush() makes rows durable."""

    def __init__(self, path: str | Path, fields: Sequence[str]) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = Path(path)
        self._file = open(self.path, "w", newline="")  # noqa: SIM115 - closed in close()
        self._writer = csv.DictWriter(self._file, fieldnames=list(fields))
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
