"""A small HTTP server for GET requests whose cost does not grow with its clients.

The node agent runs on the host network, so any pod can connect to its /metrics port:
http.server's ThreadingHTTPServer gave each connection a thread and waited for it
forever, and a few thousand idle connections from one pod had the agent OOM-killed.
This one serves every connection from one thread with a selector:

- at most `max_connections` open at once: a new one closes the oldest (an idle
  client loses its place; a probe or a scrape sends its request at once);
- each connection closed `timeout_s` after it was accepted, answered or not;
- a request line and headers of at most MAX_REQUEST_BYTES, else 431 and close;
- one request per connection (Connection: close), no body read.

So its memory is bounded by max_connections x (MAX_REQUEST_BYTES + one answer).
"""

import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

MAX_REQUEST_BYTES = 8192
MAX_CONNECTIONS = 64
TIMEOUT_S = 5.0
LISTEN_BACKLOG = 128
REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed",
           431: "Request Header Fields Too Large", 500: "Internal Server Error",
           503: "Service Unavailable"}

# path -> (status code, body, content type)
Respond = Callable[[str], tuple[int, bytes, str]]


@dataclass
class _Connection:
    sock: socket.socket
    deadline: float
    received: bytes = b""
    answer: bytes = field(default=b"", repr=False)


class Server:
    """Serves `respond` on (host, port) from a daemon thread; `shutdown` stops it."""

    def __init__(self, host: str, port: int, respond: Respond,
                 max_connections: int = MAX_CONNECTIONS, timeout_s: float = TIMEOUT_S,
                 name: str = "httpd") -> None:
        self.respond = respond
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        self._listener = socket.create_server((host, port), backlog=LISTEN_BACKLOG)
        self._listener.setblocking(False)
        self.server_address: tuple[str, int] = self._listener.getsockname()[:2]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._open: dict[socket.socket, _Connection] = {}   # oldest first
        self._stopping = False
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def shutdown(self) -> None:
        """Stop serving and close every connection (the listener too)."""
        self._stopping = True
        self._wake_w.send(b"x")
        self._thread.join(timeout=10)

    def server_close(self) -> None:
        """Nothing left to do after `shutdown` (http.server's name, kept for callers)."""

    def _run(self) -> None:
        try:
            while not self._stopping:
                wait = self._expire()
                for key, mask in self._selector.select(timeout=wait):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        continue
                    elif mask & selectors.EVENT_READ:
                        self._read(key.data)
                    else:
                        self._write(key.data)
        finally:
            for conn in list(self._open.values()):
                self._close(conn)
            self._selector.close()
            for sock in (self._listener, self._wake_r, self._wake_w):
                sock.close()

    def _expire(self) -> float:
        """Close what is past its deadline; how long until the next one is."""
        now = time.monotonic()
        for conn in [c for c in self._open.values() if c.deadline <= now]:
            self._close(conn)
        if not self._open:
            return 1.0
        return max(0.0, min(c.deadline for c in self._open.values()) - now)

    def _accept(self) -> None:
        # At most a table's worth per round, so reading the open ones is not starved.
        for _ in range(self.max_connections):
            try:
                sock, _addr = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:   # ECONNABORTED, or out of descriptors: try next round
                return
            if len(self._open) >= self.max_connections:
                self._close(next(iter(self._open.values())))
            sock.setblocking(False)
            conn = _Connection(sock, time.monotonic() + self.timeout_s)
            self._open[sock] = conn
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Connection) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not data:
            self._close(conn)
            return
        conn.received += data
        end = conn.received.find(b"\r\n\r\n")
        if end < 0 and len(conn.received) > MAX_REQUEST_BYTES:
            self._answer(conn, 431, b"request too large\n", "text/plain")
        elif end >= 0:
            method, _, rest = conn.received.partition(b" ")
            path = rest.split(b" ", 1)[0].decode("latin-1")
            if method != b"GET":
                self._answer(conn, 405, b"only GET\n", "text/plain")
                return
            try:
                answer = self.respond(path)
            except Exception as err:   # noqa: BLE001 - the server must outlive a bad answer
                answer = (500, f"{type(err).__name__}: {err}\n".encode(), "text/plain")
            self._answer(conn, *answer)

    def _answer(self, conn: _Connection, code: int, body: bytes, kind: str) -> None:
        head = (f"HTTP/1.1 {code} {REASONS.get(code, '')}\r\nContent-Type: {kind}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
        conn.answer = head.encode("latin-1") + body
        conn.received = b""
        self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _write(self, conn: _Connection) -> None:
        try:
            sent = conn.sock.send(conn.answer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        conn.answer = conn.answer[sent:]
        if not conn.answer:
            self._close(conn)

    def _close(self, conn: _Connection) -> None:
        if self._open.pop(conn.sock, None) is None:
            return
        self._selector.unregister(conn.sock)
        conn.sock.close()
