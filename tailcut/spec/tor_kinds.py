"""What each kind of ToR program is (spec.network.inNetwork), as the spec knows it,
without importing it: its name and where its three parts live.

A ToR kind is one protocol in three parts, each imported only by the layer that needs
it (the operator plans without BCC, the roles run without the loaders):

- ``plan``: a ``tailcut.innetplan.KindPlan``: its section of the role configurations
  (addresses, racks; JSON) and what costs compute, resolved once by the planner;
- ``program``: a ``tailcut.innetwork.feature.Kind``: its programs at the racks' ToRs,
  created and served by either executor (``tailcut.innetwork``);
- ``roles``: a ``tailcut.training.torkinds.RoleKind``: its hooks in the parameter
  server and the workers (what they send, and to whom).

tailcut's three are declared in BUILTIN and a job asks for them by their own fields
(``hotParameters``, ``aggregate``, ``multicast``). A kind of your own, in a package of
its own, is declared the same way and registered under the entry point group
``tailcut.tor_kinds`` (docs/in-network.md, "Adding a ToR kind"); a job asks for it by
name, with its options, under ``inNetwork.kinds``.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any

from tailcut.spec import entrypoints

ENTRY_POINT_GROUP = "tailcut.tor_kinds"


@dataclass(frozen=True)
class TorKind:
    """One kind of ToR program: its name (its section's key in the plan, in the role
    configurations and in network.json) and its parts, each "package.module:object"."""

    name: str
    plan: str       # a tailcut.innetplan.KindPlan
    program: str    # a tailcut.innetwork.feature.Kind
    roles: str      # a tailcut.training.torkinds.RoleKind

    def __post_init__(self) -> None:
        for part in ("plan", "program", "roles"):
            ref = getattr(self, part)
            if ":" not in ref:
                raise ValueError(f"ToR kind {self.name!r}: {part} {ref!r} is not "
                                 "'package.module:object'")


BUILTIN: tuple[TorKind, ...] = (
    TorKind("hot_store", "tailcut.innetplan:HOT_STORE", "tailcut.innetwork.hotstore:KIND",
            "tailcut.training.hotset:ROLES"),
    TorKind("aggregation", "tailcut.innetplan:AGGREGATION",
            "tailcut.innetwork.aggregation:KIND", "tailcut.training.innetagg:ROLES"),
    TorKind("multicast", "tailcut.innetplan:MULTICAST", "tailcut.innetwork.multicast:KIND",
            "tailcut.training.innetmcast:ROLES"),
)
BUILTIN_NAMES: tuple[str, ...] = tuple(k.name for k in BUILTIN)


RegistrationError = entrypoints.RegistrationError


@functools.cache
def registered() -> dict[str, TorKind]:
    """Every ToR kind by name: tailcut's, then those installed packages register (read
    once per process; ``registered.cache_clear()`` reads them again)."""
    return entrypoints.load(ENTRY_POINT_GROUP, BUILTIN, TorKind, "ToR kind", "kind")


def names() -> list[str]:
    """Every ToR kind's name, tailcut's first."""
    return list(registered())


def plugin_names() -> list[str]:
    """The names of the ToR kinds installed packages register (not tailcut's)."""
    return [n for n in registered() if n not in BUILTIN_NAMES]


def part(kind: TorKind, which: str, expected: type) -> Any:
    """Import the part ``which`` ("plan", "program" or "roles") of ``kind``: an
    ``expected`` named as the kind; RegistrationError naming the kind otherwise."""
    ref: str = getattr(kind, which)
    module, _, attr = ref.partition(":")
    where = f"ToR kind {kind.name!r}: its {which} {ref!r}"
    try:
        obj = getattr(importlib.import_module(module), attr)
    except Exception as err:  # noqa: BLE001 -- named, not a traceback
        raise RegistrationError(f"{where} cannot be loaded: {err}") from err
    if not isinstance(obj, expected):
        raise RegistrationError(f"{where} is a {type(obj).__name__}, not a "
                                f"{expected.__module__}.{expected.__qualname__}")
    if getattr(obj, "name", None) != kind.name:
        raise RegistrationError(f"{where} is named {getattr(obj, 'name', None)!r}")
    return obj


def parts(which: str, expected: type) -> tuple[Any, ...]:
    """The part ``which`` of every registered kind, tailcut's first."""
    return tuple(part(k, which, expected) for k in registered().values())
