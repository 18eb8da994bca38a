"""A call run in a forked child: its value, its failure, and inline when threads run."""

import os
import threading

import pytest

from tailcut.errors import RunError
from tailcut.runtime import forked


def _pid_and(value):
    return os.getpid(), value


def _fail():
    raise ValueError("no figures today")


def test_a_forked_call_returns_the_childs_value():
    pid, value = forked.call(_pid_and, {"lines": ["a", "b"]}).result()
    assert pid != os.getpid() and value == {"lines": ["a", "b"]}


def test_what_the_child_raised_is_a_run_error_with_its_traceback():
    with pytest.raises(RunError, match="(?s)_fail failed.*ValueError: no figures today"):
        forked.call(_fail).result()


def test_with_other_threads_running_the_call_runs_inline():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        pid, _ = forked.call(_pid_and, 1).result()
    finally:
        stop.set()
        thread.join()
    assert pid == os.getpid()
