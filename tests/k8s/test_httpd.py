"""The bounded HTTP server behind /metrics and /healthz: one thread for every client,
the oldest connection closed for a new one past the cap, each closed at its timeout."""

import socket
import time

from tailcut.k8s import httpd
from tests import waiting


def respond(path):
    if path == "/broken":
        raise RuntimeError("no figures")
    return (200, b"here\n", "text/plain") if path == "/here" else (404, b"no\n", "text/plain")


def ask(port, request=b"GET /here HTTP/1.1\r\nHost: x\r\n\r\n"):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    return answer


def test_answers_a_get_and_closes():
    server = httpd.Server("127.0.0.1", 0, respond)
    try:
        answer = ask(server.server_address[1])
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nhere\n")
        assert b"Connection: close" in answer
        assert ask(server.server_address[1], b"POST /here HTTP/1.1\r\n\r\n").startswith(
            b"HTTP/1.1 405")
        assert ask(server.server_address[1], b"GET /" + b"x" * 10000).startswith(
            b"HTTP/1.1 431")
        assert ask(server.server_address[1], b"GET /broken HTTP/1.1\r\n\r\n").endswith(
            b"RuntimeError: no figures\n")
        assert ask(server.server_address[1]).endswith(b"here\n"), "and it still serves"
    finally:
        server.shutdown()


def test_a_new_connection_past_the_cap_closes_the_oldest():
    server = httpd.Server("127.0.0.1", 0, respond, max_connections=4, timeout_s=30)
    idle = [socket.create_connection(server.server_address) for _ in range(10)]
    try:
        assert waiting.until(lambda: server.open_connections == 4)
        for sock in idle[:6]:   # the first six were closed for the last four
            sock.settimeout(5)
            assert sock.recv(1) == b""
        assert ask(server.server_address[1]).endswith(b"here\n")   # still answers
    finally:
        for sock in idle:
            sock.close()
        server.shutdown()


def test_an_idle_connection_is_closed_at_its_timeout():
    server = httpd.Server("127.0.0.1", 0, respond, timeout_s=0.5)
    try:
        with socket.create_connection(server.server_address) as sock:
            sock.sendall(b"GET /here HTTP/1.1\r\n")   # never finishes its headers
            sock.settimeout(5)
            started = time.monotonic()
            assert sock.recv(1) == b""
            assert 0.3 < time.monotonic() - started < 3
        assert waiting.until(lambda: server.open_connections == 0)
    finally:
        server.shutdown()
