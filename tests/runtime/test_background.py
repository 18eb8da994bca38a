"""Background load on real namespaces: Locust drives traffic across the uplink, the
link's counters see it, and it stops when the job ends, fails or is killed."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tailcut import spec
from tailcut.errors import RunError
from tailcut.net import clean, naming, netns
from tailcut.runtime import background, local

pytestmark = [pytest.mark.netns, pytest.mark.e2e]

JOB = """\
apiVersion: tailcut.dev/v1alpha1
kind: TrainingJob
metadata: {{name: {name}}}
spec:
  replicas: {{workers: 2}}
  training: {{{training}}}
  network:
    racks: [{{name: rack-0}}, {{name: rack-1}}]
    placement: {{ps-0: rack-0, worker-0: rack-1, worker-1: rack-1}}
  backgroundLoad:
    senders: [rack-1]
    receivers: [ps-0]
    target: {{link: uplink/rack-1, loadFactor: 0.3}}
    flowSizes: {{distribution: fixed, bytes: 500000}}
    warmupS: 1
{extra}"""


def job_text(name: str, training: str = "epochs: 1000, timeoutS: 120", extra: str = "") -> str:
    return JOB.format(name=name, training=training, extra=extra)


def processes_mentioning(text: str) -> list[int]:
    """Pids whose command line holds `text` (our results dir: unique to the test)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if text.encode() in cmdline or text.encode() in environ:
            found.append(int(entry))
    return found


def locust_requests(results: Path) -> int:
    with open(results / "background" / "locust_stats.csv") as f:
        row = next(r for r in csv.DictReader(f) if r["Name"] == "Aggregated")
    assert row["Failure Count"] == "0"
    return int(row["Request Count"])


def nothing_left(job: str, results: Path) -> None:
    assert clean.leftovers(job) == []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert naming.alias(job) not in links
    assert processes_mentioning(str(results)) == []


def test_background_alone_loads_its_link_and_writes_locust_and_link_csvs(tmp_path):
    job = spec.load_text(job_text("bg-alone", extra="    durationS: 6\n"))
    summary = background.run_alone(job, tmp_path, progress=lambda _: None)
    # A functional check that the flows crossed the measured link; the accuracy of
    # the load factor is bench/background_load.py's to show.
    assert 0.15 < summary["measured_load_factor"] < 0.45, summary
    assert summary["measured_at"] == "tailcut-bg-alone.rack-1/up"
    assert locust_requests(tmp_path) > 50
    rows = list(csv.DictReader(open(tmp_path / "background" / "link-load.csv")))
    assert len(rows) > 10 and max(float(r["load_factor"]) for r in rows) > 0.1
    assert json.loads((tmp_path / "background" / "background.json").read_text())[
        "target_load_factor"] == 0.3
    nothing_left("bg-alone", tmp_path)


def test_the_background_stops_when_the_job_ends(tmp_path):
    job = spec.load_text(job_text("bg-ends", training="epochs: 2, timeoutS: 120"))
    lines: list[str] = []
    local.run(job, tmp_path, progress=lines.append)
    assert any(line.startswith("background load: load factor 0.3") for line in lines)
    summary = json.loads((tmp_path / "background" / "background.json").read_text())
    assert summary["ran_s"] < summary["run_time_s"]  # stopped by the job, not its timer
    assert locust_requests(tmp_path) > 0  # Locust wrote its CSVs on the way out
    nothing_left("bg-ends", tmp_path)


def test_the_background_stops_when_the_job_fails(tmp_path):
    job = spec.load_text(job_text("bg-fails"))

    def kill_worker_once_loaded(line: str) -> None:
        if line.startswith("background load:"):
            return
        pids = netns.pids_inside(naming.pod_netns("bg-fails", "worker-1"))
        for pid in pids:
            if pid != os.getpid():
                os.kill(pid, signal.SIGKILL)

    with pytest.raises(RunError, match="worker-1 exited with code -9"):
        local.run(job, tmp_path, progress=kill_worker_once_loaded)
    assert (tmp_path / "background" / "background.json").exists()
    nothing_left("bg-fails", tmp_path)


def test_a_killed_runner_takes_its_background_with_it(tmp_path):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(job_text("bg-killed"))
    results = tmp_path / "results"
    run = subprocess.Popen([sys.executable, "-m", "tailcut.cli", "run", str(job_file),
                            "--results-dir", str(results)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    client_ns = naming.pod_netns("bg-killed", "ps-0")
    deadline = time.monotonic() + 40

    def locust_running() -> bool:
        """Locust of this run, on ps-0 (the runner and the roles it forks ahead mention
        the results dir from the start: counting processes no longer tells)."""
        for pid in processes_mentioning(str(results)):
            try:
                if b"locust" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return True
            except OSError:
                continue   # ended meanwhile
        return False
    while not locust_running():
        assert run.poll() is None, run.communicate()
        assert time.monotonic() < deadline, "the background never started"
        time.sleep(0.2)
    assert netns.pids_inside(client_ns)
    run.send_signal(signal.SIGKILL)
    run.communicate(timeout=10)
    deadline = time.monotonic() + 5  # PR_SET_PDEATHSIG ends them with the runner
    while processes_mentioning(str(results)):
        assert time.monotonic() < deadline, "background processes outlived the runner"
        time.sleep(0.1)
    cleaned = subprocess.run([sys.executable, "-m", "tailcut.cli", "clean", "bg-killed"],
                             capture_output=True, text=True)
    assert "removed tailcut-bg-killed.bg-server-0" in cleaned.stdout
    nothing_left("bg-killed", results)


def test_on_off_bursts_load_the_link_only_while_on(tmp_path):
    job = spec.load_text(job_text("bg-onoff", extra="    durationS: 8\n"
                                  "    shape: {type: onOff, onS: 2, offS: 2}\n"))
    summary = background.run_alone(job, tmp_path, progress=lambda _: None)
    rows = list(csv.DictReader(open(tmp_path / "background" / "link-load.csv")))
    t0 = summary["measured_window_s"][0]  # shape time 0 (the sampler's clock, about)

    def mean_load(windows: list[tuple[float, float]]) -> float:
        picked = [float(r["load_factor"]) for r in rows
                  if any(a <= float(r["t_s"]) - t0 <= b for a, b in windows)]
        assert picked
        return sum(picked) / len(picked)

    on = mean_load([(0.6, 1.6), (4.6, 5.6)])
    off = mean_load([(2.6, 3.6), (6.6, 7.6)])
    assert on > 0.15 and off < 0.03, (on, off)  # target 0.3 while on
    nothing_left("bg-onoff", tmp_path)
