"""How a parameter server shard applies a push and when it may answer a pull: one class
per ``sync_mode`` (tailcut.training.ps keeps what every mode shares: connections,
logs, epochs, the replica and the ToR features).

- ``Barrier`` (bsp): one push of iteration k from each source (a worker, or an
  aggregator standing for its group), summed in a fixed order when the last arrives
  and combined by the aggregation rule (tailcut.training.aggregation) into one step;
  a pull for step k waits for iteration k-1's barrier.
- ``Stale`` (async, and ssp with ``staleness``): each push applied at once with
  ``learning_rate / num_workers``, so a round of N pushes moves as far as one bsp step;
  a pull waits while its worker is more than ``staleness`` steps ahead of the slowest
  (async: never).

Both count the model's version (updates applied) and iteration (bsp: barriers passed;
otherwise versions / workers) the same way for the epochs and the logs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from tailcut import errors
from tailcut.training import aggregation
from tailcut.training.config import RoleConfig
from tailcut.transports.base import Message


class SyncMode(Protocol):
    def allowed(self, who: str, step: int, iteration: int) -> bool:
        """May ``who``'s pull for ``step`` be answered at ``iteration``?"""

    def ahead(self, msg: Message, iteration: int) -> bool:
        """A push for an iteration this shard has not reached (the replica keeps it)."""

    def apply(self, who: str, msg: Message, params: np.ndarray, iteration: int,
              version: int) -> tuple[int, int]:
        """Take ``who``'s push into ``params``; return (iteration, version) after it."""


def create(cfg: RoleConfig, size: int, weight: dict[str, int]) -> SyncMode:
    """The mode of ``cfg.sync_mode`` for a shard of ``size`` parameters whose push
    sources are ``weight`` (source -> how many workers its push sums)."""
    if cfg.sync_mode == "bsp":
        return Barrier(cfg, size, weight)
    staleness = cfg.staleness if cfg.sync_mode == "ssp" else math.inf
    return Stale(cfg, staleness)


def average(pushes: Sequence[Message], num_params: int,
            rule: str = "mean") -> tuple[np.ndarray, np.ndarray]:
    """One worker's push each, combined by the aggregation rule (``aggregation.combine``;
    ``mean``: per coordinate over the workers that delivered it).

    Returns (step, delivered): a coordinate no worker delivered has step 0 and
    ``delivered`` False, so an SGD step leaves that parameter as it was.
    """
    total = np.zeros(num_params, dtype=np.float32)
    counts = np.zeros(num_params, dtype=np.float32)
    for msg in pushes:
        accumulate(total, counts, msg, num_params, weight=1)
    return aggregation.combine(total, counts, rule)


def accumulate(
    total: np.ndarray, counts: np.ndarray, msg: Message, num_params: int, weight: int
) -> None:
    """Add one push into a running sum; ``weight`` is how many workers it sums."""
    if msg.values.shape != (num_params,):
        raise errors.RunError(
            f"worker {msg.sender} pushed {msg.values.size} values; the model has {num_params}"
        )
    if msg.mask is None:
        total += msg.values
        counts += weight
    else:
        # Missing values may hold anything (even NaN): never add them.
        total[msg.mask] += msg.values[msg.mask]
        counts += weight * msg.mask


class Barrier:
    def __init__(self, cfg: RoleConfig, size: int, weight: dict[str, int]) -> None:
        self.cfg = cfg
        self.size = size
        self.weight = weight
        self.total = np.zeros(size, dtype=np.float32)
        self.counts = np.zeros(size, dtype=np.float32)
        self.pushed: dict[str, Message] = {}   # this iteration's pushes, by source

    def allowed(self, who: str, step: int, iteration: int) -> bool:
        return step <= iteration

    def ahead(self, msg: Message, iteration: int) -> bool:
        return msg.iteration > iteration

    def apply(self, who: str, msg: Message, params: np.ndarray, iteration: int,
              version: int) -> tuple[int, int]:
        if msg.iteration != iteration or who in self.pushed:
            raise errors.RunError(
                f"expected PUSH for iteration {iteration} from {who.replace('-', ' ')}, "
                f"got PUSH for iteration {msg.iteration}"
            )
        self.pushed[who] = msg
        if len(self.pushed) < len(self.weight):
            return iteration, version
        # Sum in a fixed order, not arrival order: float32 addition is not
        # associative, and a run must give the same numbers every time.
        for source in self.weight:
            accumulate(self.total, self.counts, self.pushed[source], self.size,
                       self.weight[source])
        direction, _ = aggregation.combine(self.total, self.counts, self.cfg.aggregation)
        params -= np.float32(self.cfg.learning_rate) * direction
        self.total[:] = 0
        self.counts[:] = 0
        self.pushed.clear()
        return iteration + 1, iteration + 1


class Stale:
    def __init__(self, cfg: RoleConfig, staleness: float) -> None:
        self.workers = cfg.num_workers
        self.staleness = staleness
        self.step = np.float32(cfg.learning_rate / cfg.num_workers)
        self.clock = {f"worker-{w}": 0 for w in range(cfg.num_workers)}   # pushes made

    def allowed(self, who: str, step: int, iteration: int) -> bool:
        return step - min(self.clock.values()) <= self.staleness

    def ahead(self, msg: Message, iteration: int) -> bool:
        return False   # applied in arrival order, whatever its iteration

    def apply(self, who: str, msg: Message, params: np.ndarray, iteration: int,
              version: int) -> tuple[int, int]:
        if msg.mask is None:
            params -= self.step * msg.values
        else:
            params[msg.mask] -= self.step * msg.values[msg.mask]
        self.clock[who] = msg.iteration + 1
        version += 1
        return (version // self.workers if version % self.workers == 0 else iteration), version
