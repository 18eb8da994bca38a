"""Transports that carry gradients and parameters between PS and workers, chosen by name.

A job's spec names its transport in one line (``transport: {type: tcp}``); the
roles call ``get(type, **options)`` and only use the ``base`` interface. What each
transport is (its traits, where its class lives) is declared in
``tailcut.spec.transport_kinds``, so adding one means a module with a
``base.Transport`` subclass and one declaration there, or, for a transport in a
package of its own, one entry point (docs/transports.md).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from tailcut.spec import transport_kinds
from tailcut.transports import base


def names() -> list[str]:
    """Names of the supported transports, tailcut's first, then registered ones."""
    return transport_kinds.names()


def get(name: str, **options: Any) -> base.Transport:
    """A new transport ``name`` built with ``options`` (the spec's other transport keys)."""
    factory = load(name)
    accepted = inspect.signature(factory).parameters
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"transport {name!r} has no option {', '.join(unknown)}; "
            f"its options are: {', '.join(accepted) or '(none)'}"
        )
    return factory(**options)


def load(name: str) -> type[base.Transport]:
    """The class of transport ``name``, its module imported (the local runtime does so
    before it forks the roles, which then have it)."""
    kind = transport_kinds.get(name)
    module, _, cls = kind.factory.partition(":")
    factory = getattr(importlib.import_module(module), cls, None)
    if not (isinstance(factory, type) and issubclass(factory, base.Transport)):
        raise ValueError(f"transport {name!r}: {kind.factory} is not a "
                         "tailcut.transports.base.Transport subclass")
    return factory
