"""Entrypoint of a background container on Kubernetes: a flow server or Locust, set up
from the job's background config map (tailcut.k8s.manifests.background writes it).

    python -m tailcut.background.pod server --config /etc/tailcut-background/locust-config.json
    python -m tailcut.background.pod locust --config ... --mode standalone --results /results

Runs the same server module and Locust command line as the local runtime
(tailcut.background.launch). Both stop by themselves after the config's run time.
Locust's CSVs go to --results; when Locust ends, the entrypoint also prints them to
its log between marker lines (`kubectl logs` has them after the container ended, as
long as the pod object exists) and puts the aggregated row in the container's
termination message.
With --stay (a sidecar in a training pod, which the kubelet would restart if it
exited) it then waits for SIGTERM instead of exiting.
"""

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

from tailcut.background import launch
from tailcut.background import plan as bgplan
from tailcut.errors import NetError
from tailcut.net import address

CSV_BEGIN = "----- begin {name} -----"
CSV_END = "----- end {name} -----"
CSV_SUFFIXES = ("stats", "stats_history", "failures", "exceptions")
TERMINATION_LOG = Path("/dev/termination-log")
MAX_TERMINATION_BYTES = 4096   # the kubelet keeps at most this much of the message


def load_config(path: Path) -> dict[str, Any]:
    """The config map's JSON; names the key that is missing if it is incomplete."""
    config: dict[str, Any] = json.loads(path.read_text())
    for key in ("servers", "requests_per_s", "users", "cdf", "run_time_s"):
        if key not in config:
            raise SystemExit(f"background pod: {path}: no {key!r}; the config map is "
                             "written by the tailcut operator")
    return config


_stopping = threading.Event()   # SIGTERM/SIGINT arrived: the pod is ending


def run_child(argv: list[str], env: dict[str, str], timeout_s: float) -> int:
    """Run `argv`, passing SIGTERM/SIGINT on (Locust writes its CSVs on SIGTERM); end
    it if it outlives `timeout_s` (its own run time ends it long before)."""
    child = subprocess.Popen(argv, env=env, preexec_fn=_die_with_parent)

    def forward(signum: int, _frame: Any) -> None:
        _stopping.set()
        if child.poll() is None:
            child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            return child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            child.terminate()
            try:
                return child.wait(timeout=launch.LOCUST_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                child.kill()
                return child.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def tx_bytes(ifname: str) -> Optional[int]:
    """The interface's transmitted bytes as the kernel counts them (None if absent)."""
    try:
        return int(Path(f"/sys/class/net/{ifname}/statistics/tx_bytes").read_text())
    except (OSError, ValueError):
        return None


def sent_report(ifname: str, before: int, after: int, seconds: float,
                bandwidth_bit: Optional[int]) -> dict[str, Any]:
    """What the pod's interface sent during the run: bytes, rate, and that rate as a
    share of the target link's bandwidth (the server's part of the load factor; the
    training traffic of a shared pod is included, as on the local runtime's links)."""
    report: dict[str, Any] = {"interface": ifname, "tx_bytes": after - before,
                              "seconds": round(seconds, 3),
                              "mbit_per_s": round((after - before) * 8 / seconds / 1e6, 3)
                              if seconds > 0 else None}
    if bandwidth_bit and seconds > 0:
        report["load_factor_of_target_link"] = round(
            (after - before) * 8 / seconds / bandwidth_bit, 4)
    return report


def _die_with_parent() -> None:
    """In the child: SIGTERM it if the entrypoint dies, even by SIGKILL (outside a
    container nothing else would end it)."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG


def run_server(config: dict[str, Any], port: int, ifname: str = "eth0") -> int:
    """tailcut.background.server for the config's server duration; then one line of
    JSON (log and termination message) with what the pod's interface sent meanwhile."""
    duration = config.get("server_duration_s") or launch.server_duration_s(
        config["run_time_s"])
    argv = launch.server_argv(sys.executable, duration, port)
    before, start = tx_bytes(ifname), time.monotonic()
    code = run_child(argv, {**os.environ, "PYTHONUNBUFFERED": "1"},
                     duration + launch.LOCUST_STOP_GRACE_S)
    after = tx_bytes(ifname)
    if before is not None and after is not None:
        report = sent_report(ifname, before, after, time.monotonic() - start,
                             (config.get("target") or {}).get("linkBandwidthBit"))
        line = json.dumps({"sent": report})
        print(line, flush=True)
        write_termination_message(line)
    return code


def run_locust(config_path: Path, config: dict[str, Any], mode: str, results: Path) -> int:
    """Locust (standalone, master or worker) with the config's users and run time."""
    results.mkdir(parents=True, exist_ok=True)
    prefix = results / "locust"
    argv = launch.locust_argv(
        sys.executable, mode, users=int(config["users"]), run_time_s=config["run_time_s"],
        csv_prefix=prefix, host=config["servers"][0],
        master_host=config.get("master_host"), expect_workers=int(config.get("clients", 1)),
        master_port=int(config.get("master_port", bgplan.LOCUST_MASTER_PORT)))
    env = {**os.environ, "TAILCUT_BACKGROUND": str(config_path),
           "TAILCUT_BACKGROUND_STARTED": str(results / "locust-started.json"),
           "PYTHONUNBUFFERED": "1"}
    # Locust's own --run-time ends it; the timeout is a guard against a hang (a
    # worker may also wait up to a minute for its master).
    timeout = (config["run_time_s"] + launch.LOCUST_SPAWN_S + 3 * launch.LOCUST_STOP_GRACE_S
               + (60 if mode == "worker" else 0))
    code = run_child(argv, env, timeout)
    if mode != "worker":
        print_csvs(prefix)
        write_termination_message(summary_line(prefix))
    return code


def print_csvs(prefix: Path) -> None:
    """Locust's CSVs to stdout between marker lines: `kubectl logs` keeps them."""
    for suffix in CSV_SUFFIXES:
        path = prefix.with_name(f"{prefix.name}_{suffix}.csv")
        if path.exists():
            print(CSV_BEGIN.format(name=path.name), flush=True)
            sys.stdout.write(path.read_text())
            print(CSV_END.format(name=path.name), flush=True)


def csvs_from_log(log: str) -> dict[str, str]:
    """The CSV files print_csvs wrote into a log, by file name."""
    out: dict[str, str] = {}
    lines = log.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("----- begin ") and line.endswith(" -----"):
            name = line[len("----- begin "):-len(" -----")]
            end = CSV_END.format(name=name)
            j = i + 1
            while j < len(lines) and lines[j].strip() != end:
                j += 1
            out[name] = "".join(lines[i + 1:j])
            i = j
        i += 1
    return out


def summary_line(prefix: Path) -> str:
    """The aggregated row of Locust's stats, as one line of JSON ('' if none)."""
    stats = prefix.with_name(f"{prefix.name}_stats.csv")
    if not stats.exists():
        return ""
    with open(stats) as f:
        for row in csv.DictReader(f):
            if row.get("Name") == "Aggregated":
                keep = ("Request Count", "Failure Count", "Requests/s",
                        "Median Response Time", "99%")
                return json.dumps({k: row[k] for k in keep if k in row})
    return ""


def write_termination_message(text: str, path: Path = TERMINATION_LOG) -> None:
    """Into the file the kubelet mounts (never create it: outside a pod, /dev is not
    ours), so `kubectl get pod` shows the totals."""
    if text and path.exists():
        try:
            path.write_text(text[:MAX_TERMINATION_BYTES])
        except OSError:
            pass   # not in a container: the log has it


def wait_for_stop() -> None:
    """Block until SIGTERM or SIGINT (a sidecar that ended its run stays up, quiet)."""
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: _stopping.set())
    if not _stopping.is_set():
        print("background run over; waiting for the pod to end", flush=True)
    while not _stopping.wait(3600):
        pass


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("server", "locust"))
    parser.add_argument("--config", required=True, type=Path,
                        help="locust-config.json from the job's background config map")
    parser.add_argument("--mode", choices=launch.MODES, default="standalone",
                        help="locust: standalone, master or worker")
    parser.add_argument("--results", type=Path, default=Path("/results/background"),
                        help="locust: where the CSVs go")
    parser.add_argument("--port", type=int, default=bgplan.SERVER_PORT, help="server port")
    parser.add_argument("--ifname", default="eth0",
                        help="the pod's interface on the job's links: waited for; the "
                             "server reports the bytes it sent")
    parser.add_argument("--wait-s", type=float, default=120.0,
                        help="how long to wait for an address on --ifname")
    parser.add_argument("--stay", action="store_true",
                        help="after the run, wait for SIGTERM (sidecar in a training pod)")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    try:   # the node agent wires the pod into its rack once the pod runs
        address.wait_for(args.wait_s, f"background {args.what}", ifname=args.ifname)
    except NetError as err:
        print(f"background pod: {err}", file=sys.stderr, flush=True)
        return 1
    if args.what == "server":
        code = run_server(config, args.port, args.ifname)
    else:
        code = run_locust(args.config, config, args.mode, args.results)
    if args.stay:
        wait_for_stop()
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
