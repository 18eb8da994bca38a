"""A background server: answers `GET /bytes/<n>` with n bytes, over HTTP/1.1 keep-alive.

Runs in a background server pod (or a training pod it shares) and stops by itself
after --duration-s, or on SIGTERM/SIGINT. One thread per connection; the body is
written from one preallocated buffer, so the kernel, not Python, does the copying.

    python -m tailcut.background.server --port 8080 --duration-s 60
"""

import argparse
import http.server
import re
import signal
import sys
import threading
from typing import Any, Optional

CHUNK_BYTES = 256 * 1024
MAX_BYTES = 10**10
_ZEROS = memoryview(bytes(CHUNK_BYTES))
_PATH = re.compile(r"^/bytes/(\d+)$")


class FlowHandler(http.server.BaseHTTPRequestHandler):
    """One HTTP connection: each GET /bytes/<n> gets n zero bytes back."""

    protocol_version = "HTTP/1.1"  # keep-alive: a Locust user reuses its connection

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        match = _PATH.match(self.path)
        size = int(match.group(1)) if match else -1
        if not 0 <= size <= MAX_BYTES:
            self.send_error(404, f"ask for /bytes/<n> with 0 <= n <= {MAX_BYTES}")
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        left = size
        while left > 0:
            n = min(left, CHUNK_BYTES)
            self.wfile.write(_ZEROS[:n])
            left -= n

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # one line per flow would be thousands of lines; Locust keeps the stats


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--duration-s", type=float, required=True,
                        help="stop after this many seconds")
    args = parser.parse_args(argv)
    server = Server((args.host, args.port), FlowHandler)
    stopper = threading.Timer(args.duration_s, server.shutdown)
    stopper.daemon = True
    stopper.start()

    def on_signal(signum: int, _frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"serving /bytes/<n> on {args.host}:{args.port} for {args.duration_s:g} s",
          flush=True)
    server.serve_forever(poll_interval=0.2)
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
