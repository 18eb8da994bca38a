"""Run a job's background load on this host: servers and Locust as processes in
their pod namespaces, the target link measured from its interface counters.

Every process is started by procs.spawn, so it dies with the runner even on
`kill -9`; each also stops by itself (servers after the run time, Locust by its
--run-time), and `stop()` ends them when the job ends or fails. Results go to
<results>/background/: locust_stats.csv, locust_stats_history.csv,
locust_failures.csv, link-load.csv and background.json.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, cast

from tailcut import features
from tailcut.background import launch, linkload
from tailcut.background import plan as bgplan
from tailcut.datapath import dropper
from tailcut.errors import RunError
from tailcut.net import build, netns, topology
from tailcut.runtime import procs
from tailcut.spec.model import TrainingJob

LOCUSTFILE = launch.LOCUSTFILE
READY_TIMEOUT_S = 20.0
LOCUST_STOP_GRACE_S = launch.LOCUST_STOP_GRACE_S


class Background:
    """The background load of one run: start, then stop (idempotent)."""

    def __init__(self, plan: bgplan.Plan, results_dir: Path) -> None:
        self.plan = plan
        self.dir = results_dir / "background"
        self.logs = results_dir / "logs"
        self.servers: list[subprocess.Popen[bytes]] = []
        self.locusts: list[subprocess.Popen[bytes]] = []   # master (or standalone) first
        self.link: Optional[linkload.LinkLoad] = None
        self.started_at = 0.0
        self.stopped_at: Optional[float] = None
        self.started_wall = 0.0
        self.started_file = self.dir / "locust-started.json"

    def pids(self) -> set[int]:
        """The background load's processes: its flow servers and Locust."""
        return {p.pid for p in self.servers + self.locusts}

    def start(self, progress: Callable[[str], None] = print) -> None:
        """Start servers, wait until they listen, then Locust and the link sampler.
        On failure, whatever was started is stopped before the error propagates."""
        p = self.plan
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        # The job and results dir in every background process's environment name it
        # as ours (e.g. to a test looking for leftovers).
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TAILCUT_JOB": p.job,
               "TAILCUT_RESULTS_DIR": str(self.dir.parent)}
        try:
            for s in p.servers:
                argv = launch.server_argv(sys.executable,
                                          launch.server_duration_s(p.run_time_s))
                self.servers.append(self._spawn(s.netns, argv, f"{s.pod}-bg-server", env))
            for s in p.servers:
                _wait_listening(s.netns, s.ip, bgplan.SERVER_PORT)
            config = self.dir / "locust-config.json"
            config.write_text(json.dumps(p.locust_config(), indent=2) + "\n")
            env["TAILCUT_BACKGROUND"] = str(config)
            # Locust writes shape time 0 here once its test starts (see locustfile)
            env["TAILCUT_BACKGROUND_STARTED"] = str(self.started_file)
            self.started_file.unlink(missing_ok=True)
            self.started_at = time.monotonic()
            self.started_wall = time.time()
            if p.link is not None:
                self.link = linkload.LinkLoad(p.link.netns, p.link.ifname,
                                              p.link.bandwidth_bit, self.dir / "link-load.csv")
                self.link.start()
            for ns, argv, name in locust_commands(p, self.dir / "locust"):
                self.locusts.append(self._spawn(ns, argv, name, env))
            what = (f"load factor {p.target_load_factor:g} on {p.link.name} ({p.link.direction})"
                    if p.link and p.target_load_factor else f"{p.requests_per_s:g} requests/s")
            progress(f"background load: {what}, {p.requests_per_s:.1f} flows/s of mean "
                     f"{p.mean_flow_bytes / 1e6:.3g} MB ({p.load.flow_sizes.distribution}), "
                     f"{p.users} Locust users, {len(p.servers)} server(s) -> "
                     f"{len(p.clients)} client(s), for at most {p.run_time_s:g} s")
        except BaseException:
            self.stop()
            raise

    def _spawn(self, ns: str, argv: list[str], name: str,
               env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.logs / f"{name}.log", "wb") as log:
            return procs.spawn(ns, argv, stdout=log, stderr=log, env=env)

    def failed(self) -> Optional[str]:
        """A message if a server or Locust exited with an error, else None."""
        for proc in self.servers + self.locusts:
            if proc.poll() not in (None, 0):
                return (f"background process {list(cast(list[str], proc.args))[2:4]} exited "
                        f"with {proc.returncode}")
        return None

    def finished(self) -> bool:
        """Whether Locust has stopped by itself (its --run-time is over)."""
        return bool(self.locusts) and all(p.poll() is not None for p in self.locusts)

    def stop(self) -> dict[str, Any]:
        """Stop Locust (master first, so it writes its CSVs), then the servers, then
        the sampler; write background.json. Safe to call twice."""
        if self.stopped_at is None:
            self.stopped_at = time.monotonic()
        for proc in self.locusts:
            procs.stop(proc, grace_s=LOCUST_STOP_GRACE_S)
        for proc in self.servers:
            procs.stop(proc)
        if self.link is not None:
            self.link.stop()
        summary = self.summary()
        if self.dir.exists():
            (self.dir / "background.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    def _shape_zero_s(self) -> Optional[float]:
        """Seconds from start() to shape time 0, or None if Locust never started."""
        try:
            wall = json.loads(self.started_file.read_text())["start_unix_s"]
        except (OSError, ValueError, KeyError):
            return None
        return float(wall) - self.started_wall

    def summary(self) -> dict[str, Any]:
        p = self.plan
        out: dict[str, Any] = {
            "target_link": p.link.name if p.link else None,
            "direction": p.link.direction if p.link else None,
            "measured_at": f"{p.link.netns}/{p.link.ifname}" if p.link else None,
            "link_bandwidth_bit": p.link.bandwidth_bit if p.link else None,
            "target_load_factor": p.target_load_factor,
            "requests_per_s": p.requests_per_s, "mean_flow_bytes": p.mean_flow_bytes,
            "distribution": p.load.flow_sizes.distribution, "users": p.users,
            "servers": [s.pod for s in p.servers], "clients": [c.pod for c in p.clients],
            "run_time_s": p.run_time_s, "ran_s": (self.stopped_at or time.monotonic())
            - self.started_at if self.started_at else 0.0,
        }
        if self.link is not None:
            # From shape time 0 to the end of the run or the stop, whichever was first.
            # From shape time 0 (as Locust wrote it) to the end of the run or the stop,
            # in seconds since start(); the sampler's clock began a moment later.
            begin = self._shape_zero_s()
            if begin is not None:
                end = begin + min(p.run_time_s, out["ran_s"] - begin)
                out["measured_window_s"] = [round(begin, 3), round(end, 3)]
                shift = self.link.t0 - self.started_at
                out["measured_load_factor"] = self.link.load_factor(begin - shift,
                                                                    end - shift)
                out["measured_load_factor_htb"] = self.link.load_factor(
                    begin - shift, end - shift, htb=True)
            else:
                out["measured_load_factor"] = out["measured_load_factor_htb"] = None
        stats = self.dir / "locust_stats.csv"
        if stats.exists():
            out["locust_total"] = _locust_total(stats)
        return out


def describe(summary: dict[str, Any]) -> str:
    """One line on what the background did, for the run's progress output."""
    total = summary.get("locust_total") or {}
    line = (f"background load: {total.get('Request Count', '?')} flows "
            f"({total.get('Failure Count', '?')} failed) in {summary['ran_s']:.1f} s")
    if summary.get("measured_load_factor") is not None:
        line += (f"; measured load factor {summary['measured_load_factor']:.3f} on "
                 f"{summary['target_link']} (target {summary['target_load_factor']:g}, "
                 "training traffic included)")
    return line


def locust_commands(p: bgplan.Plan, csv_prefix: Path) -> list[tuple[str, list[str], str]]:
    """(namespace, argv, log name) of each Locust process: one standalone process for
    one client pod; otherwise a master in the first client pod (it does no load: on
    2 cores it only aggregates) and one worker in each client pod."""
    host = f"http://{p.servers[0].ip}:{bgplan.SERVER_PORT}"
    first = p.clients[0]

    def argv(mode: str) -> list[str]:
        return launch.locust_argv(
            sys.executable, mode, users=p.users, run_time_s=p.run_time_s,
            csv_prefix=csv_prefix, host=host, master_host=first.ip,
            expect_workers=len(p.clients), master_bind_host=first.ip)
    if len(p.clients) == 1:
        return [(first.netns, argv("standalone"), f"{first.pod}-locust")]
    cmds = [(first.netns, argv("master"), f"{first.pod}-locust-master")]
    for c in p.clients:
        cmds.append((c.netns, argv("worker"), f"{c.pod}-locust-worker"))
    return cmds


def _wait_listening(ns: str, ip: str, port: int) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        with netns.entered(ns):
            sock = socket.socket()
        try:
            sock.settimeout(1.0)
            sock.connect((ip, port))
            return
        except OSError as err:
            if time.monotonic() > deadline:
                raise RunError(f"background server {ip}:{port} not listening after "
                               f"{READY_TIMEOUT_S:g} s: {err}") from err
            time.sleep(0.1)
        finally:
            sock.close()


def _locust_total(stats_csv: Path) -> dict[str, Any]:
    import csv
    with open(stats_csv) as f:
        for row in csv.DictReader(f):
            if row.get("Name") == "Aggregated":
                return {k: row[k] for k in ("Request Count", "Failure Count",
                                            "Median Response Time", "Average Response Time",
                                            "Requests/s", "95%", "99%") if k in row}
    return {}


def start(job: TrainingJob, topo: topology.Topology, results_dir: Path,
          progress: Callable[[str], None] = print) -> Optional[Background]:
    """Start the background load of `job` (None if it has none) and let it run
    warmupS seconds, so training meets a loaded network."""
    p = bgplan.plan(job, topo)
    if p is None:
        return None
    bg = Background(p, results_dir)
    bg.start(progress)
    time.sleep(p.warmup_s)
    return bg


def run_alone(job: TrainingJob, results_dir: Path,
              progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Build the job's network and run only its background load (no training) for
    its durationS; tear everything down after. For benchmarks and for the web UI."""
    if job.spec.background_load is None:
        raise RunError(f"{job.name}: the job has no spec.backgroundLoad")
    topo = topology.plan(job)
    p = bgplan.plan(job, topo)
    assert p is not None
    results_dir.mkdir(parents=True, exist_ok=True)
    with procs.terminate_as_exit():
        network = build.build(topo, features.netem().available, droppers=dropper)
        try:
            bg = Background(p, results_dir)
            bg.start(progress)
            deadline = time.monotonic() + p.run_time_s + LOCUST_STOP_GRACE_S
            while not bg.finished() and time.monotonic() < deadline:
                if bg.failed():
                    raise RunError(bg.failed() or "")
                time.sleep(0.2)
            return bg.stop()
        finally:
            if "bg" in locals():
                bg.stop()
            network.destroy()

