"""Kinds that installed packages register under an entry point group (transports, ToR
kinds): read once, each checked, tailcut's own first (tailcut.spec.transport_kinds and
tor_kinds declare theirs)."""

import importlib.metadata
from collections.abc import Iterable
from typing import Protocol, TypeVar


class RegistrationError(ValueError):
    """An entry point that does not declare a kind of its group, or a part of a kind
    that is not what its declaration says."""


class _Named(Protocol):
    @property
    def name(self) -> str: ...


K = TypeVar("K", bound=_Named)


def load(group: str, builtin: Iterable[K], declared: type[K], noun: str,
         owner: str) -> dict[str, K]:
    """Every kind by name: `builtin`'s, then each entry point of `group`, which must load
    a `declared` (a `noun`) named as the entry point (`owner`'s name) and not as one of
    tailcut's own; RegistrationError naming the entry point otherwise."""
    kinds = {k.name: k for k in builtin}
    own = set(kinds)
    for entry in importlib.metadata.entry_points(group=group):
        where = f"entry point {entry.name!r} = {entry.value!r} of group {group}"
        try:
            kind = entry.load()
        except Exception as err:  # a broken plugin names itself, not a traceback
            raise RegistrationError(f"{where}: cannot load it: {err}") from err
        if not isinstance(kind, declared):
            raise RegistrationError(f"{where}: it is a {type(kind).__name__}, not a "
                                    f"{declared.__module__}.{declared.__qualname__}")
        if kind.name != entry.name:
            raise RegistrationError(f"{where}: it declares the {noun} {kind.name!r}; "
                                    f"the entry point's name must be the {owner}'s")
        if kind.name in own:
            raise RegistrationError(f"{where}: {kind.name!r} is one of tailcut's own "
                                    f"{noun}s; choose another name")
        kinds[kind.name] = kind
    return kinds
