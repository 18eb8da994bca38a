"""The Locust user of a background load: open-loop flows of drawn sizes.

Locust runs this file in its own process (gevent patches the standard library, so it
is never imported by tailcut itself). The run's settings come from the JSON file named
by $TAILCUT_BACKGROUND (written by tailcut.background.plan):

    servers        ["http://10.1.0.4:8080", ...]   a flow asks a random one
    requests_per_s total rate at scale 1, over all users
    users          how many users share that rate
    shape          the spec's backgroundLoad.shape
    cdf            flow-size CDF points [[bytes, probability], ...]
    seed

Flows arrive as a Poisson process per user whose rate follows the shape (thinning
against the peak rate); arrival times are kept on an absolute schedule, so a user
held up by a long flow catches up instead of lowering the offered load. The web UI's
user count scales the rate: every user carries requests_per_s / users.
"""

import json
import os
import random
import time
from typing import Any

import gevent
from locust import FastHttpUser, constant, events, task
from locust.runners import WorkerRunner

from tailcut.spec import flowsizes
from tailcut.spec.background import Shape

MAX_LAG_S = 2.0   # a user further behind than this drops its backlog instead of bursting
SPAWN_S = 1.0     # shape time 0 comes this long after the test starts: users are up

_started_at: float = 0.0

_config: dict[str, Any] = {}
if os.environ.get("TAILCUT_BACKGROUND"):
    with open(os.environ["TAILCUT_BACKGROUND"]) as f:
        _config = json.load(f)


def _bucket(size: int) -> str:
    """The name a flow is counted under in Locust's stats: its size class."""
    for limit, label in ((10_000, "<10KB"), (100_000, "10KB-100KB"),
                         (1_000_000, "100KB-1MB"), (10_000_000, "1MB-10MB")):
        if size < limit:
            return f"flow {label}"
    return "flow >=10MB"


@events.test_start.add_listener
def _on_test_start(environment: Any, **_kwargs: Any) -> None:
    """Fix shape time 0 on every node (master and workers start within milliseconds)
    and tell tailcut when it is, in $TAILCUT_BACKGROUND_STARTED: the load is measured
    from then on, however long Locust took to start (workers connecting to a master
    can take seconds on a busy host)."""
    global _started_at
    _started_at = time.time() + SPAWN_S
    marker = os.environ.get("TAILCUT_BACKGROUND_STARTED")
    if marker and not isinstance(environment.runner, WorkerRunner):
        with open(marker, "w") as out:
            json.dump({"start_unix_s": _started_at}, out)


class BackgroundFlow(FastHttpUser):
    """One background client: fetches flows of drawn sizes from the servers."""

    wait_time = constant(0)      # pacing is the task's own schedule
    network_timeout = 120.0
    connection_timeout = 10.0
    host = (_config.get("servers") or ["http://127.0.0.1:8080"])[0]
    _count = 0

    def on_start(self) -> None:
        BackgroundFlow._count += 1
        cfg = _config
        self.servers: list[str] = cfg["servers"]
        self.shape = Shape.model_validate(cfg.get("shape") or {})
        self.cdf = tuple((int(x), float(p)) for x, p in cfg["cdf"])
        # Reproducible per (seed, worker, user); workers of one master differ by index.
        worker = getattr(self.environment.runner, "worker_index", 0)
        self.rng = random.Random(f"{cfg.get('seed', 0)}-{worker}-{BackgroundFlow._count}")
        self.peak = self.shape.peak_scale()
        # The rate per user is the plan's: more users in the web UI offer more load.
        self.rate = cfg["requests_per_s"] * self.peak / max(1, cfg["users"])
        self.start = _started_at or time.time()
        self.next_at = max(time.time(), self.start)

    def _next_arrival(self) -> tuple[float, bool]:
        """The next arrival time, and whether a flow starts then: candidates come at
        the peak rate and are kept with probability scale/peak (thinning). After 1000
        rejected candidates (a long pause in the shape) the user sleeps until the last
        one without a flow, and thins on from there."""
        if self.rate <= 0:  # a shape that never offers load (all steps at scale 0)
            self.next_at += 60.0
            return self.next_at, False
        for _ in range(1000):
            self.next_at += self.rng.expovariate(self.rate)
            scale = self.shape.scale_at(self.next_at - self.start)
            if self.rng.random() * self.peak < scale:
                return self.next_at, True
        return self.next_at, False

    @task
    def flow(self) -> None:
        at, starts = self._next_arrival()
        now = time.time()
        if at < now - MAX_LAG_S:
            self.next_at = at = now
        if at > now:
            gevent.sleep(at - now)
        if not starts:
            return
        size = flowsizes.sample(self.cdf, self.rng)
        server = self.servers[self.rng.randrange(len(self.servers))]
        self.client.get(f"{server}/bytes/{size}", name=_bucket(size))
