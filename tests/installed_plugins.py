"""The toy plugins' distributions (tests/plugins) on sys.path, as `pip install` would
put them, with a registry's cache read again before and after."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

PLUGINS = Path(__file__).resolve().parent / "plugins"


@contextmanager
def installed(monkeypatch: pytest.MonkeyPatch, registered: Callable[[], Any]) -> Iterator[None]:
    """Within: the plugins installed; `registered` (a functools.cache'd registry) sees
    them, and forgets them after."""
    monkeypatch.syspath_prepend(str(PLUGINS))
    registered.cache_clear()  # type: ignore[attr-defined]
    yield
    registered.cache_clear()  # type: ignore[attr-defined]
