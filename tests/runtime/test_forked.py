"""A call run in a forked child: its value, its failure, and in-process when threads run."""

import json
import os
import subprocess
import sys
import textwrap
import threading

from tailcut.runtime import forked, rolefork

# A fresh interpreter with one BLAS thread: pytest's process may have a BLAS pool.
SCRIPT = textwrap.dedent("""
    import json, os
    from tailcut.errors import RunError
    from tailcut.runtime import forked

    def pid_and(value):
        return os.getpid(), value

    def fail():
        raise ValueError("no figures today")

    pid, value = forked.call(pid_and, {"lines": ["a", "b"]}).result()
    try:
        forked.call(fail).result()
        error = None
    except RunError as err:
        error = str(err)
    print(json.dumps({"here": os.getpid(), "child": pid, "value": value, "error": error}))
""")


def _pid_and(value):
    return os.getpid(), value


def test_a_forked_call_returns_the_childs_value_or_its_failure_as_a_run_error():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         env={**os.environ, **rolefork.BLAS_THREADS}, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["child"] != seen["here"] and seen["value"] == {"lines": ["a", "b"]}
    assert "fail failed" in seen["error"] and "ValueError: no figures today" in seen["error"]


def test_with_other_threads_running_the_call_is_made_here_when_its_result_is_asked():
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        call = forked.call(_pid_and, 1)
        pid, _ = call.result()
    finally:
        stop.set()
        thread.join()
    assert pid == os.getpid()
