"""Which role a failed run names: the root cause, not the roles that only saw it go."""

from pathlib import Path

import pytest

from tailcut.runtime import local
from tailcut.training import exits


class Exited:
    """A role process as _diagnose sees it: its exit code, or None while running."""

    def __init__(self, code: int | None) -> None:
        self.code = code

    def poll(self) -> int | None:
        return self.code


def _logs(tmp_path: Path, **last_words: str) -> Path:
    (tmp_path / "logs").mkdir()
    for name, words in last_words.items():
        (tmp_path / "logs" / f"{name}.log").write_text(f"starting\n{words}\n")
    return tmp_path


def test_a_failure_is_named_before_the_roles_that_only_saw_it(tmp_path: Path) -> None:
    results = _logs(tmp_path, **{"ps-0": "worker-1 closed the connection",
                                 "worker-1": "internal error: boom"})
    roles = {"ps-0": Exited(exits.PEER_GONE), "worker-1": Exited(exits.FAILED)}
    said = local._diagnose(roles, results, None)   # type: ignore[arg-type]
    assert said.startswith("worker-1 exited with code 1")
    assert "internal error: boom" in said and "ps-0" not in said


def test_with_only_victims_each_ones_last_words_and_who_ended_are_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(local, "DIAGNOSE_WAIT_S", 0.2)
    results = _logs(tmp_path, **{"ps-0": "10.3.0.2:41300 closed the connection",
                                 "worker-4": "tailcut worker 4: PARAMS(7): timed out"})
    roles = {"ps-0": Exited(exits.PEER_GONE), "worker-4": Exited(exits.PEER_GONE),
             "worker-5": Exited(0), "worker-6": Exited(None)}
    said = local._diagnose(roles, results, None)   # type: ignore[arg-type]
    assert said.startswith("ps-0 exited with code 3")
    assert "worker-4 exited with code 3: tailcut worker 4: PARAMS(7): timed out" in said
    assert "worker-5 had already exited cleanly" in said
    assert "worker-6" not in said
