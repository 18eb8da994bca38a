"""CPU time of a role's threads while it trains: a busy thread is charged to its kind,
threads that end are still counted, and a job's files add up into one line that says
when the cores bounded the JCT."""

import json
import threading
import time
from pathlib import Path

import pytest

from tailcut.training import cpustats


@pytest.fixture(autouse=True)
def fresh_marks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpustats, "_start", None)
    monkeypatch.setattr(cpustats, "_seen", {})


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_thread_names_map_to_the_kinds_the_transports_use() -> None:
    assert cpustats.kind_of("MainThread") == "main (model, protocol)"
    assert cpustats.kind_of("send-3") == "datagram send"
    assert cpustats.kind_of("tcp-send-ps-0") == "tcp send"
    assert cpustats.kind_of("udp-rx") == "datagram receive"
    assert cpustats.kind_of("ctrl-1") == "datagram control"
    assert cpustats.kind_of("inbox-0") == "receive (message readers)"
    assert cpustats.kind_of("Thread-7") == cpustats.OTHER


def test_a_busy_thread_is_charged_to_its_kind_and_cpu_before_the_mark_is_not() -> None:
    _spin(0.15)  # before the mark: not training
    cpustats.mark()
    worker = threading.Thread(target=_spin, args=(0.3,), name="send-1")
    worker.start()
    worker.join(timeout=10)
    usage = cpustats.since_mark()
    # The thread ended without a checkpoint: its time is still in the process total.
    assert usage["from"] == "training start"
    total = usage["user_s"] + usage["system_s"]
    assert 0.25 <= total < 0.6, usage
    # (Threads left by other tests may be listed, idle.)
    assert sum(usage["kinds"].get("datagram send", {}).values()) < 0.05
    assert sum(usage["kinds"][cpustats.ENDED].values()) >= 0.2


def test_a_checkpoint_keeps_what_a_thread_did_before_it_ended() -> None:
    cpustats.mark()
    go = threading.Event()
    worker = threading.Thread(target=lambda: (_spin(0.3), go.wait(10)), name="udp-rx")
    worker.start()
    time.sleep(0.05)
    while worker.is_alive() and not go.is_set():
        cpustats.checkpoint()  # as a role does before closing its transport
        if sum(cpustats._seen.get(f"udp-rx ({worker.native_id})", (0, 0))) >= 0.25:
            break
        time.sleep(0.05)
    go.set()
    worker.join(timeout=10)
    kinds = cpustats.since_mark()["kinds"]
    assert sum(kinds["datagram receive"].values()) >= 0.25, kinds


def test_a_jobs_files_add_up_and_a_busy_machine_is_called_cpu_bound(tmp_path: Path) -> None:
    for pod, (app, send) in {"ps-0": (1.0, 3.0), "worker-0": (2.0, 2.0)}.items():
        cpustats.write(tmp_path, pod, {
            "user_s": app + send, "system_s": 0.0, "from": "training start",
            "kinds": {"main (model, protocol)": {"user_s": app, "system_s": 0.0},
                      "datagram send": {"user_s": send - 1, "system_s": 1.0}}})
    (tmp_path / "cpu-worker-2.json").write_text("{not json")
    summary = cpustats.summarize(tmp_path, ["ps-0", "worker-0", "worker-1", "worker-2"],
                                 jct_s=4.0, cores=2)
    assert summary["total_s"] == 8.0
    assert summary["busy"] == 1.0
    assert list(summary["kinds"]) == ["datagram send", "main (model, protocol)"]
    assert summary["kinds"]["datagram send"] == {"user_s": 3.0, "system_s": 2.0}
    assert summary["missing"] == ["worker-1", "worker-2"]
    line = cpustats.describe(summary)
    assert "8.0 s of CPU" in line and "datagram send 5.0 s" in line
    assert "bounded by CPU" in line and "none from worker-1, worker-2" in line
    idle = cpustats.summarize(tmp_path, ["ps-0", "worker-0"], jct_s=40.0, cores=2)
    assert idle["busy"] == 0.1 and "bounded by CPU" not in cpustats.describe(idle)
    assert json.loads((tmp_path / "cpu-ps-0.json").read_text())["user_s"] == 4.0


def test_which_datagram_code_each_pod_ran_is_kept_and_said(tmp_path: Path) -> None:
    usage = {"user_s": 1.0, "system_s": 0.0, "kinds": {}}
    cpustats.write(tmp_path, "ps-0", {**usage, cpustats.DATAGRAM_PATHS: "compiled"})
    cpustats.write(tmp_path, "worker-0", {**usage, cpustats.DATAGRAM_PATHS: "compiled"})
    cpustats.write(tmp_path, "worker-1", usage)   # a role that sent no datagram
    summary = cpustats.summarize(tmp_path, ["ps-0", "worker-0", "worker-1"], 1.0, cores=2)
    assert summary[cpustats.DATAGRAM_PATHS] == {"compiled": ["ps-0", "worker-0"]}
    assert cpustats.describe(summary).endswith("; datagram paths: compiled")
    cpustats.write(tmp_path, "worker-1", {**usage, cpustats.DATAGRAM_PATHS: "numpy (off)"})
    mixed = cpustats.describe(cpustats.summarize(tmp_path, ["ps-0", "worker-0", "worker-1"],
                                                 1.0, cores=2))
    assert mixed.endswith("; datagram paths: compiled in ps-0, worker-0; numpy (off) in "
                          "worker-1")


def test_no_files_say_so() -> None:
    summary = cpustats.summarize(Path("/nonexistent"), ["ps-0"], jct_s=1.0, cores=2)
    assert cpustats.describe(summary) == "cpu: no role reported its CPU time"


def test_unknown_cores_give_no_verdict(tmp_path: Path) -> None:
    cpustats.write(tmp_path, "ps-0", {"user_s": 9.0, "system_s": 0.0, "kinds": {}})
    summary = cpustats.summarize(tmp_path, ["ps-0"], jct_s=1.0, cores=0)
    assert summary["busy"] is None and "cores" not in cpustats.describe(summary)


def test_a_forked_childs_main_thread_is_its_main_thread() -> None:
    """Roles may be forked from the runner (tailcut.runtime.rolefork): the child's
    initial thread is its main one whatever ids threading kept from the parent."""
    import os
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: spin, then report what it saw
        try:
            cpustats.mark()
            _spin(0.2)
            kinds = cpustats.since_mark()["kinds"]
            os.write(write, json.dumps(kinds).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        kinds = json.loads(f.read())
    os.waitpid(pid, 0)
    assert sum(kinds["main (model, protocol)"].values()) >= 0.15, kinds
