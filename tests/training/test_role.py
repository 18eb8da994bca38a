"""A role's process: what it says when it cannot run."""

from pathlib import Path
from typing import Any

from tailcut.training import exits, role


def test_a_role_that_cannot_start_says_why_through_the_callers_emit(tmp_path: Path) -> None:
    """Through the `emit` it was given, not only the module's print: in a pod that
    is the entrypoint's, which makes the error the container's termination message."""
    seen: list[dict[str, Any]] = []
    missing = tmp_path / "missing.json"
    assert role.main([str(missing)], emit=seen.append) == exits.USAGE
    assert [e["event"] for e in seen] == ["error"]
    assert str(missing) in seen[0]["message"]
