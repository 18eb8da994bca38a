"""Transports that carry gradients and parameters between PS and workers, chosen by name.

A job's spec names its transport in one line (``transport: {type: tcp}``); the
roles call ``get(type, **other_options)`` and only use the ``base`` interface, so
adding a transport means adding a module and one line in ``_FACTORIES``.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from tailcut.transports import base

# name -> (module, class): a module is imported when its transport is first asked
# for, so a TCP job's processes never import the datagram transports (~0.05 s)
_FACTORIES: dict[str, tuple[str, str]] = {
    "tcp": ("tcp", "TcpTransport"),
    "udp": ("datagram", "UdpTransport"),
    "bounded-loss": ("datagram", "BoundedLossTransport"),
    "app-drop": ("app_drop", "AppDropTransport"),
}


def names() -> list[str]:
    """Names of the supported transports, sorted."""
    return sorted(_FACTORIES)


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
    try:
        module, cls = _FACTORIES[name]
    except KeyError:
        raise ValueError(
            f"transport {name!r} is unknown; supported: {', '.join(names())}"
        ) from None
    factory: type[base.Transport] = getattr(
        importlib.import_module(f"tailcut.transports.{module}"), cls)
    return factory
