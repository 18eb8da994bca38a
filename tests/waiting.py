"""Polling for state that other processes or the kernel change a moment later."""

import time
from collections.abc import Callable


def until(condition: Callable[[], bool], within_s: float = 5.0, every_s: float = 0.05) -> bool:
    """Whether `condition()` holds within `within_s`, asked every `every_s`."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every_s)
    return True
