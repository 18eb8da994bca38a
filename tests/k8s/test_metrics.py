"""The operator's and the agent's /metrics and /healthz (the chart's probes and
Services point at them): each component serves its own series only."""

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from tailcut.k8s import httpd, metrics


def get(server, path):
    host, port = "127.0.0.1", server.server_address[1]
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture
def servers():
    healthy = {"agent": True}
    started = {"operator": metrics.serve(metrics.operator_registry, port=0),
               "agent": metrics.serve(metrics.agent_registry, port=0,
                                      healthy=lambda: healthy["agent"])}
    yield started, healthy
    for server in started.values():
        server.shutdown()
        server.server_close()


def test_each_component_serves_its_own_series_only(servers):
    started, _ = servers
    metrics.job_phases.set("ns", "m-job", "Running")
    metrics.pods_shaped_total.inc()
    try:
        _, operator_text = get(started["operator"], "/metrics")
        _, agent_text = get(started["agent"], "/metrics")
    finally:
        metrics.job_phases.forget("ns", "m-job")
    assert 'tailcut_operator_jobs{phase="Running"} 1.0' in operator_text
    assert "tailcut_operator_reconcile_seconds_count" in operator_text
    assert "tailcut_agent_" not in operator_text
    assert "tailcut_agent_pods_shaped_total" in agent_text
    assert "tailcut_operator_" not in agent_text


def test_healthz_follows_the_components_health(servers):
    started, healthy = servers
    assert get(started["agent"], "/healthz") == (200, "ok\n")
    healthy["agent"] = False
    assert get(started["agent"], "/healthz") == (503, "unhealthy\n")
    assert get(started["agent"], "/nothing")[0] == 404


# The agent's endpoint in a process of its own, so its memory and descriptors are its.
SERVE = """
import sys, time
from tailcut.k8s import metrics
server = metrics.serve(metrics.agent_registry, port=0, host="127.0.0.1")
print(server.server_address[1], flush=True)
time.sleep(float(sys.argv[1]))
"""
IDLE_CONNECTIONS = 3000


def status_of(pid, field):
    """A figure of /proc/<pid>/status, e.g. VmRSS in KiB or Threads."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def open_idle(port, count, within_s):
    """`count` connections to loopback `port` that send nothing; opened within
    `within_s` or as many as were by then."""
    socks = []
    deadline = time.monotonic() + within_s
    for _ in range(count):
        if time.monotonic() > deadline:
            break
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        socks.append(sock)
    return socks


def test_thousands_of_idle_connections_neither_grow_the_agent_nor_stop_its_health_check():
    proc = subprocess.Popen([sys.executable, "-c", SERVE, "120"], stdout=subprocess.PIPE,
                            text=True)
    idle = []
    try:
        port = int(proc.stdout.readline())
        server = SimpleNamespace(server_address=("127.0.0.1", port))
        assert get(server, "/healthz") == (200, "ok\n")
        before_kib = status_of(proc.pid, "VmRSS")
        idle = open_idle(port, IDLE_CONNECTIONS, within_s=30)
        time.sleep(3)   # the server has taken them in (or not) by now
        assert get(server, "/healthz") == (200, "ok\n")
        grown_kib = status_of(proc.pid, "VmRSS") - before_kib
        descriptors = len(list(Path(f"/proc/{proc.pid}/fd").iterdir()))
        print(f"{len(idle)} idle connections: RSS +{grown_kib} KiB, {descriptors} "
              f"descriptors, {status_of(proc.pid, 'Threads')} threads")
        assert len(idle) == IDLE_CONNECTIONS
        assert grown_kib < 8 * 1024
        assert descriptors < httpd.MAX_CONNECTIONS + 16
        assert status_of(proc.pid, "Threads") <= 3
    finally:
        for sock in idle:
            sock.close()
        proc.kill()
        proc.wait()
