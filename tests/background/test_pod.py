"""The background pods' entrypoint: real servers and real Locust on loopback, set up
from a config like the one the operator puts in the background config map."""

import csv
import io
import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from tailcut.background import pod
from tailcut.spec import background as bgspec


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(tmp_path, port, run_time_s=3.0, clients=1, flow_bytes=20_000,
                 requests_per_s=20.0, server_extra_s=6.0):
    sizes = bgspec.FlowSizes(distribution="fixed", bytes=flow_bytes)
    config = {"servers": [f"http://127.0.0.1:{port}"], "requests_per_s": requests_per_s,
              "users": 4, "shape": {"type": "constant"}, "cdf": [list(p) for p in sizes.cdf()],
              "seed": 1, "run_time_s": run_time_s,
              "server_duration_s": run_time_s + server_extra_s,
              "clients": clients, "master_host": "127.0.0.1", "master_port": free_port()}
    path = tmp_path / "locust-config.json"
    path.write_text(json.dumps(config))
    return path


def entrypoint(*args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", "tailcut.background.pod", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            **kwargs)


def wait_listening(port, timeout_s=15.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


def aggregated(stats_csv_text):
    rows = list(csv.DictReader(io.StringIO(stats_csv_text)))
    return next(r for r in rows if r["Name"] == "Aggregated")


@pytest.fixture
def started():
    procs = []
    yield procs
    for p in procs:   # only what this test started, by its handle
        if p.poll() is None:
            p.kill()
        p.wait()


def test_server_and_standalone_locust_drive_flows_and_stop_by_themselves(tmp_path, started):
    port = free_port()
    # The server outlives Locust's start-up (a few s on a loaded host) and 3 s run.
    config = write_config(tmp_path, port, server_extra_s=12.0)
    server = entrypoint("server", "--config", config, "--port", port, "--ifname", "lo")
    started.append(server)
    wait_listening(port)
    locust = entrypoint("locust", "--config", config, "--mode", "standalone",
                        "--results", tmp_path / "results")
    started.append(locust)
    log, _ = locust.communicate(timeout=60)
    assert locust.returncode == 0, log
    # The CSVs are in the results directory and, the same, in the log.
    stats_file = (tmp_path / "results" / "locust_stats.csv").read_text()
    in_log = pod.csvs_from_log(log)
    assert in_log["locust_stats.csv"] == stats_file
    assert "locust_stats_history.csv" in in_log
    total = aggregated(stats_file)
    # 20 flows/s for 3 s: about 60 flows. Open loop: never far more; a loaded shared
    # host (Locust's users start late) can give far fewer, so the lower bound is loose.
    assert 10 <= int(total["Request Count"]) <= 110, total
    assert int(total["Failure Count"]) == 0
    assert json.loads((tmp_path / "results" / "locust-started.json").read_text())[
        "start_unix_s"] > 0
    # The server ends after its server_duration_s (3 + 12 s) without being told, and
    # reports what its interface sent: at least the flows' bytes (loopback also
    # carries the requests and anything else on this host).
    server_log, _ = server.communicate(timeout=30)
    assert server.returncode == 0
    sent = json.loads(server_log.strip().splitlines()[-1])["sent"]
    assert sent["interface"] == "lo" and 14 < sent["seconds"] < 30
    assert sent["tx_bytes"] >= int(total["Request Count"]) * 20_000


def test_a_master_and_a_worker_drive_the_flows_together(tmp_path, started):
    port = free_port()
    # The master waits for its worker (seconds on a busy host): servers outlive that.
    config = write_config(tmp_path, port, run_time_s=5.0, clients=1, requests_per_s=10.0,
                          server_extra_s=40)
    server = entrypoint("server", "--config", config, "--port", port)
    started.append(server)
    wait_listening(port)
    master = entrypoint("locust", "--config", config, "--mode", "master",
                        "--results", tmp_path / "results")
    started.append(master)
    worker = entrypoint("locust", "--config", config, "--mode", "worker",
                        "--results", tmp_path / "worker")
    started.append(worker)
    log, _ = master.communicate(timeout=90)
    assert master.returncode == 0, log
    total = aggregated(pod.csvs_from_log(log)["locust_stats.csv"])
    failures = pod.csvs_from_log(log).get("locust_failures.csv")
    # The wiring is under test, not the rate: a worker joining late on a busy host
    # leaves less of the 5 s run (the standalone test above checks the rate).
    assert int(total["Request Count"]) >= 1 and int(total["Failure Count"]) == 0, failures
    worker.communicate(timeout=60)
    assert not (tmp_path / "worker" / "locust_stats.csv").exists()   # the master counts


def test_a_sidecar_stays_after_its_run_until_sigterm(tmp_path, started):
    """A native sidecar that exits would be restarted by the kubelet: --stay waits."""
    port = free_port()
    config = write_config(tmp_path, port, run_time_s=0.5, server_extra_s=1.5)
    server = entrypoint("server", "--config", config, "--port", port, "--stay")
    started.append(server)
    wait_listening(port)
    with pytest.raises(subprocess.TimeoutExpired):
        server.wait(timeout=5)   # the server itself ended after 2 s
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=10) == 0


def test_sigterm_during_the_run_stops_locust_with_its_csvs_and_a_sidecar_exits(
        tmp_path, started):
    port = free_port()
    config = write_config(tmp_path, port, run_time_s=60)
    server = entrypoint("server", "--config", config, "--port", port)
    started.append(server)
    wait_listening(port)
    locust = entrypoint("locust", "--config", config, "--mode", "standalone", "--results",
                        tmp_path / "results", "--stay")
    started.append(locust)
    deadline = time.monotonic() + 30
    while not (tmp_path / "results" / "locust-started.json").exists():
        assert time.monotonic() < deadline, "Locust did not start"
        time.sleep(0.2)
    time.sleep(2)
    locust.send_signal(signal.SIGTERM)
    log, _ = locust.communicate(timeout=30)   # one SIGTERM ends even a --stay sidecar
    assert locust.returncode == 0
    assert int(aggregated(pod.csvs_from_log(log)["locust_stats.csv"])["Request Count"]) > 0
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=10) == 0


def test_a_config_without_its_run_time_is_refused_naming_the_key(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"servers": [], "requests_per_s": 1, "users": 1, "cdf": []}))
    with pytest.raises(SystemExit, match="run_time_s"):
        pod.load_config(path)


def test_csvs_are_found_again_in_a_log_with_other_lines():
    log = ("starting\n----- begin a.csv -----\nx,y\n1,2\n----- end a.csv -----\n"
           "noise\n----- begin b.csv -----\n----- end b.csv -----\n")
    assert pod.csvs_from_log(log) == {"a.csv": "x,y\n1,2\n", "b.csv": ""}
