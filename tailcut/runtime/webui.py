"""The Locust web UI against a running testbed, to change background load by hand.

Starts Locust (not headless) in a background client pod of a running job, with the
job's flow sizes and per-user rate, and forwards 127.0.0.1:<port> on the host to the
web UI inside that pod's namespace (the pods have no route to the host). Each user
in the UI offers requests_per_s / users of the plan, so the plan's user count is the
spec's target and twice that count twice the target. Stops on Ctrl-C, after
--max-s, or when the job's namespaces go away.

    tailcut background-ui JOB.yaml [--port 8089] [--max-s 3600]
"""

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from tailcut.background import plan as bgplan
from tailcut.errors import RunError
from tailcut.net import netns, topology
from tailcut.runtime import background, procs
from tailcut.spec.model import TrainingJob

UI_PORT_IN_POD = 8089


def run(job: TrainingJob, port: int, max_s: float, workdir: Path,
        progress: Callable[[str], None] = print) -> None:
    topo = topology.plan(job)
    p = bgplan.plan(job, topo)
    if p is None:
        raise RunError(f"{job.name}: the job has no spec.backgroundLoad (its servers are "
                       "what the web UI loads)")
    client = p.clients[0]
    if not netns.exists(client.netns):
        raise RunError(f"{job.name} is not running: no namespace {client.netns}; start it "
                       "with `tailcut run` or `tailcut background` first")
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "locust-ui-config.json"
    config.write_text(json.dumps(p.locust_config(), indent=2) + "\n")
    env = {**os.environ, "TAILCUT_BACKGROUND": str(config), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "locust", "-f", str(background.LOCUSTFILE),
            "--web-host", "127.0.0.1", "--web-port", str(UI_PORT_IN_POD),
            "-u", str(p.users), "-r", str(p.users), "--csv", str(workdir / "locust-ui"),
            "--host", f"http://{p.servers[0].ip}:{bgplan.SERVER_PORT}"]
    listener = socket.create_server(("127.0.0.1", port))
    with open(workdir / "locust-ui.log", "wb") as log:
        locust = procs.spawn(client.netns, argv, stdout=log, stderr=log, env=env)
    threading.Thread(target=_accept, args=(listener, client.netns), daemon=True).start()
    progress(f"Locust web UI: http://127.0.0.1:{port}/ (Locust in {client.netns}); "
             f"{p.users} users = the spec's target ({p.requests_per_s:.1f} flows/s). "
             "Ctrl-C stops it.")
    deadline = time.monotonic() + max_s
    try:
        while (time.monotonic() < deadline and locust.poll() is None
               and netns.exists(client.netns)):
            time.sleep(0.5)
    finally:
        listener.close()
        procs.stop(locust, grace_s=5)
    progress(f"Locust stopped; its CSVs are in {workdir}")


def _accept(listener: socket.socket, namespace: str) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # closed: the UI is stopping
        threading.Thread(target=_relay_one, args=(conn, namespace), daemon=True).start()


def _relay_one(conn: socket.socket, namespace: str) -> None:
    """Connect to the UI inside `namespace` (a socket is bound to the namespace it was
    made in, so make it there) and copy bytes both ways until either side closes."""
    try:
        with netns.entered(namespace):
            inner = socket.socket()
        inner.connect(("127.0.0.1", UI_PORT_IN_POD))
    except OSError:
        conn.close()
        return

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    t = threading.Thread(target=pump, args=(inner, conn), daemon=True)
    t.start()
    pump(conn, inner)
    t.join(timeout=5)
    conn.close()
    inner.close()


__all__ = ["run"]
