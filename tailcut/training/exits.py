"""Exit statuses of a role process, shared by the roles and the runtime that reads them,
and how a role says why it failed."""

from __future__ import annotations

import sys
from typing import Any, Callable

OK = 0
FAILED = 1          # the run failed here (an error event says why)
USAGE = 2           # the command line or the role config is wrong
PEER_GONE = 3       # failed only because another role went away first


def say_failed(emit: Callable[[dict[str, Any]], None], role: str, index: int,
               message: str) -> None:
    """Say why the role failed: on stderr, and as an "error" event through the
    caller's `emit` (in a pod, the entrypoint's: it becomes the termination message)."""
    print(f"tailcut {role} {index}: {message}", file=sys.stderr, flush=True)
    emit({"event": "error", "role": role, "index": index, "message": message})
