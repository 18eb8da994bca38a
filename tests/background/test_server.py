"""The background server: n bytes for /bytes/n over keep-alive, and a bounded life."""

import http.client
import socket
import subprocess
import sys
import time

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tailcut.background.server",
                             "--host", "127.0.0.1", "--port", str(port), "--duration-s", "20"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert b"serving" in proc.stdout.readline()
    yield port, proc
    proc.kill()
    proc.wait()


def test_a_request_for_n_bytes_gets_exactly_n_bytes_on_one_connection(server):
    port, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for size in (0, 1, 300_000, 1_000_000):
        conn.request("GET", f"/bytes/{size}")
        response = conn.getresponse()
        assert response.status == 200 and len(response.read()) == size
    conn.close()


def test_a_request_for_anything_else_is_refused_with_404(server):
    port, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/bytes/lots")
    assert conn.getresponse().status == 404


def test_the_server_stops_by_itself_after_its_duration():
    port = free_port()
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tailcut.background.server", "--host",
                           "127.0.0.1", "--port", str(port), "--duration-s", "0.5"],
                          capture_output=True, timeout=20)
    assert proc.returncode == 0
    assert time.monotonic() - start < 10


def test_sigterm_stops_the_server(server):
    _, proc = server
    proc.terminate()
    assert proc.wait(timeout=5) == 0
