"""Transports that carry gradients and parameters between PS and workers, chosen by name.

A job's spec names its transport in one line (``transport: {type: tcp}``); the
roles call ``get(type, **other_options)`` and only use the ``base`` interface, so
adding a transport means adding a module and one line in ``_FACTORIES``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from tailcut.transports import app_drop, base, datagram, tcp

_FACTORIES: dict[str, Callable[..., base.Transport]] = {
    "tcp": tcp.TcpTransport,
    "udp": datagram.UdpTransport,
    "bounded-loss": datagram.BoundedLossTransport,
    "app-drop": app_drop.AppDropTransport,
}


def names() -> list[str]:
    """Names of the supported transports, sorted."""
    return sorted(_FACTORIES)


def get(name: str, **options: Any) -> base.Transport:
    """A new transport ``name`` built with ``options`` (the spec's other transport keys)."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ValueError(
            f"transport {name!r} is unknown; supported: {', '.join(names())}"
        ) from None
    accepted = inspect.signature(factory).parameters
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"transport {name!r} has no option {', '.join(unknown)}; "
            f"its options are: {', '.join(accepted) or '(none)'}"
        )
    return factory(**options)
