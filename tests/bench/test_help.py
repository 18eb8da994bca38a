"""Every bench script still parses its options and offers --allow-busy
(bench/hostcheck.py): each is run as `python bench/x.py --help` would run it, in this
process (one interpreter's imports instead of thirty: fast on a busy 2-core host)."""

import os
import runpy
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
# modules the benches import or run in a pod, not benches
NOT_BENCHES = {"hostcheck.py", "bl_net.py", "bl_role.py", "bl_cost_role.py"}
BENCHES = sorted(p.name for p in BENCH.glob("*.py") if p.name not in NOT_BENCHES)


@pytest.fixture
def environ_kept():
    """Some benches set thread counts in os.environ as they load: not for later tests."""
    before = dict(os.environ)
    yield
    for name in set(os.environ) - set(before):
        del os.environ[name]
    os.environ.update(before)


def test_the_benches_are_found():
    assert len(BENCHES) >= 30 and "bl_conditions.py" in BENCHES


@pytest.mark.parametrize("name", BENCHES)
def test_a_bench_parses_help_and_offers_allow_busy(name, monkeypatch, capsys, environ_kept):
    monkeypatch.setattr(sys, "argv", [str(BENCH / name), "--help"])
    with pytest.raises(SystemExit) as ended:
        runpy.run_path(str(BENCH / name), run_name="__main__")
    assert ended.value.code in (0, None)
    out = capsys.readouterr().out
    assert "usage:" in out
    assert "--allow-busy" in out
