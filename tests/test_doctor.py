"""`tailcut doctor` prints a row per feature and exits 0 unless it could not probe."""

import os
import textwrap
from collections.abc import Iterator

import pytest

from tailcut import doctor, features


@pytest.fixture
def fresh() -> Iterator[None]:
    """Probe again rather than reuse results cached by an earlier test."""
    features.clear_cache()
    yield
    features.clear_cache()


def test_render_prints_one_row_per_feature_with_yes_or_no() -> None:
    table = doctor.render([features.Feature("htb", True, "added", "rates work"),
                           features.Feature("netem", False, "ENOENT", "dropper")])
    rows = table.splitlines()
    assert rows[0].split() == ["feature", "ok", "detail", "what", "it", "means", "for",
                               "a", "job"]
    assert rows[2].split() == ["htb", "yes", "added", "rates", "work"]
    assert rows[3].split() == ["netem", "NO", "ENOENT", "dropper"]


@pytest.mark.netns
@pytest.mark.bpf
def test_doctor_exits_zero_as_root_and_says_what_netem_means_here(
        fresh: None, capsys: pytest.CaptureFixture[str]) -> None:
    """With netem missing (the development VMs) or present (tests/uml runs it in
    Debian's user-mode Linux): an answer either way."""
    assert os.geteuid() == 0
    assert doctor.main() == 0
    netem = features.netem()
    row = next(line for line in capsys.readouterr().out.splitlines()
               if line.startswith("netem "))
    assert row.split()[:2] == ["netem", "yes" if netem.available else "NO"]
    assert row.endswith(textwrap.wrap(netem.meaning, 56)[0])


def test_doctor_reports_a_broken_probe_and_exits_non_zero(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> features.Feature:
        raise RuntimeError("boom")
    monkeypatch.setattr(features, "ALL", (broken,))
    assert doctor.main() == 1
    captured = capsys.readouterr()
    assert "probe failed: RuntimeError: boom" in captured.out
    assert "broken: RuntimeError: boom" in captured.err
