"""The command lines of background processes (server, Locust standalone/master/worker),
shared by the local runtime and the Kubernetes pods so both run the same thing."""

from pathlib import Path
from typing import Optional

from tailcut.background import plan as bgplan

LOCUSTFILE = Path(bgplan.__file__).with_name("locustfile.py")
LOCUST_SPAWN_S = 1.0         # Locust's --run-time also covers spawning the users
LOCUST_STOP_GRACE_S = 10.0   # Locust writes its CSVs on SIGTERM; give it time to
MODES = ("standalone", "master", "worker")


def server_argv(python: str, duration_s: float, port: int = bgplan.SERVER_PORT) -> list[str]:
    """A background server answering GET /bytes/<n> for `duration_s` seconds."""
    return [python, "-m", "tailcut.background.server", "--port", str(port),
            "--duration-s", f"{duration_s:g}"]


def server_duration_s(run_time_s: float) -> float:
    """Servers outlive Locust's run and its stop grace, so no flow ends half-served."""
    return run_time_s + 2 * LOCUST_STOP_GRACE_S


def locust_argv(python: str, mode: str, *, users: int, run_time_s: float,
                csv_prefix: Path, host: str, master_host: Optional[str] = None,
                master_port: int = bgplan.LOCUST_MASTER_PORT, expect_workers: int = 0,
                master_bind_host: Optional[str] = None) -> list[str]:
    """Locust, headless: `standalone` drives the load itself; a `master` (it does no
    load: on 2 cores it only aggregates and writes the CSVs) waits for
    `expect_workers` workers; a `worker` connects to `master_host`."""
    if mode not in MODES:
        raise ValueError(f"mode: {mode!r} is not one of {', '.join(MODES)}")
    common = [python, "-m", "locust", "-f", str(LOCUSTFILE), "--loglevel", "WARNING",
              "--stop-timeout", "5"]
    if mode == "worker":
        if not master_host:
            raise ValueError("master_host: a Locust worker needs its master's address")
        return common + ["--worker", "--master-host", master_host,
                         "--master-port", str(master_port)]
    run = ["--headless", "-u", str(users), "-r", str(users),
           "-t", f"{run_time_s + LOCUST_SPAWN_S:g}s",
           "--csv", str(csv_prefix), "--csv-full-history", "--only-summary",
           "--exit-code-on-error", "0", "--host", host]
    if mode == "standalone":
        return common + run
    master = ["--master", "--master-bind-port", str(master_port),
              "--expect-workers", str(expect_workers), "--expect-workers-max-wait", "30"]
    if master_bind_host:
        master[1:1] = ["--master-bind-host", master_bind_host]
    return common + run + master
