"""The roles' side of a ToR kind (spec.network.inNetwork; tailcut.spec.tor_kinds): the
hooks through which a kind changes what the parameter server and the workers send. The
PS (tailcut.training.ps) and the workers (tailcut.training.worker) loop over the job's
kinds through them and name none.

A kind's ``RoleKind`` makes its side in each role from the role's configuration and
what the role knows (``PSContext``, ``WorkerContext``), or None when the job does not
ask for it there. Every hook has a default that changes nothing, so a side overrides
only what its kind changes. Sides are called in the registry's order (tailcut's three
first: the hot store, aggregation, multicast).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from tailcut.ml import data, models
from tailcut.spec import tor_kinds
from tailcut.training.config import RoleConfig
from tailcut.transports.base import Message


@dataclass(frozen=True)
class PSContext:
    """What the PS knows when it makes its sides."""

    cfg: RoleConfig
    model: models.Model
    dataset: data.Dataset
    size: int           # the PS's range of the parameters (the whole model: one PS)
    active: bool        # it answers the workers (not a passive replica)
    evaluates: bool     # it evaluates the whole model (shard 0, active)


@dataclass(frozen=True)
class WorkerContext:
    """What a worker knows when it makes its side."""

    cfg: RoleConfig
    model: models.Model
    dataset: data.Dataset


class PSSide:
    """A kind's side in the parameter server. ``key`` names its summary in the PS's
    "done" event."""

    key = ""
    # True if the ToR holds parameters the PS must read to evaluate the whole model
    # (``fill_model``).
    holds_parameters = False

    def fill_model(self, full: np.ndarray, iteration: int) -> None:
        """Write the values the ToR holds into the whole model ``full`` (to evaluate)."""

    def reply(self, iteration: int, params: np.ndarray) -> Optional[np.ndarray]:
        """The values of the PARAMS answering a pull of ``iteration`` (the PS's
        ``params`` otherwise): None leaves the reply as it is."""
        return None

    def pulled(self, who: str, iteration: int, current: int) -> bool:
        """A worker asked for ``iteration`` (the PS is at ``current``); True when the
        PS should step now on this side's ``sums`` (no worker pushes to it)."""
        return False

    def sums(self, iteration: int, timeout_s: float) -> tuple[np.ndarray, np.ndarray]:
        """The iteration's summed gradient and how many contributed to each element."""
        raise NotImplementedError(f"{type(self).__name__} steps on no sums")

    def finish(self, results: Path) -> Optional[dict[str, Any]]:
        """At the end of a job: write its files into ``results``; its summary."""
        return None

    def close(self) -> None:
        """After a failed job (``finish`` not called): free what it holds."""


class WorkerSide:
    """A kind's side in a worker. ``key`` names its summary in the worker's."""

    key = ""

    def pulled(self, params: np.ndarray, step: int) -> None:
        """The model of ``step`` is in from every shard: add what the ToR holds."""

    def take_params(self, step: int, params: np.ndarray, msg: Message,
                    timeout_s: float) -> bool:
        """A PARAMS(step) for the range ``params`` came: True if this side took it
        into ``params`` itself (the worker applies it otherwise)."""
        return False

    def push(self, grad: np.ndarray, step: int) -> bool:
        """The gradient of ``step`` is computed (it may change it): True if this side
        sent it on, so that the worker pushes it to no PS."""
        return False

    def finish(self, results: Path, name: str) -> Optional[dict[str, Any]]:
        """At the end of a job: write its files (``name``: the worker's) into
        ``results``; its summary."""
        return None


@dataclass(frozen=True)
class RoleKind:
    """How the roles reach one ToR kind (named as in tailcut.spec.tor_kinds)."""

    name: str
    ps: Callable[[PSContext], Optional[PSSide]] = lambda ctx: None
    worker: Callable[[WorkerContext], Optional[WorkerSide]] = lambda ctx: None


def section(cfg: RoleConfig, name: str) -> Optional[dict[str, Any]]:
    """The section of the kind ``name`` (None: the job does not ask for it)."""
    return cfg.tor.get(name)


def kinds(cfg: Optional[RoleConfig] = None) -> tuple[RoleKind, ...]:
    """The role side of every registered ToR kind, tailcut's first; with ``cfg``, only
    of the kinds the job asks for (a role imports no other kind)."""
    return tuple(tor_kinds.part(kind, "roles", RoleKind)
                 for kind in tor_kinds.registered().values()
                 if cfg is None or kind.name in cfg.tor)


def ps_sides(ctx: PSContext) -> list[PSSide]:
    """The PS's sides of the kinds the job asks for, in the registry's order."""
    made = [kind.ps(ctx) for kind in kinds(ctx.cfg)]
    return [side for side in made if side is not None]


def worker_sides(ctx: WorkerContext) -> list[WorkerSide]:
    """A worker's sides of the kinds the job asks for, in the registry's order."""
    made = [kind.worker(ctx) for kind in kinds(ctx.cfg)]
    return [side for side in made if side is not None]
