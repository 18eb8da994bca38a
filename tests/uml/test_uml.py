"""Part of the suite, and the netem path end to end, run inside Debian's user-mode
Linux (`user-mode-linux`, kernel 6.1.x: the Debian 12 series, with netem), booted once
per session as an ordinary process (tests/uml/machine.py, conftest.py). Each test here
reports one file or check of what ran inside, so a failure there is a failure here,
with its message.

What it covers: netem's delay, jitter and loss and the layouts tailcut builds with
it (HTB with netem, switch buffers as netem's child, netem towards a pod next to the
eBPF dropper from it), read back through tc; TCP's RTT over delayed links; datagrams
lost by netem and by the dropper; a tcp job training there; feature detection,
`tailcut doctor` and `tailcut validate` on a kernel with netem. BCC compiles there
against Debian's 6.1 headers (linked by machine.py as scripts/setup.sh links them for
the host), so the feature tests marked `bpf` run too, with the tests of the XDP
counter, CadentFlow's classifier and the ToR's store, and a bounded-loss job trains
over netem's delay and loss with its XDP counter.

What it cannot: the UML has one CPU (no contention between pods' processes as on the
host, rates and bursts need that CPU, and timings are not the host's: so the rate and
burst tests of tests/net stay on the host), BPF runs in its interpreter (no JIT), and
it has no AF_XDP. 6.1's verifier refuses the kernel receive ring (inside/check_xdp.py
checks where and why).
"""

import ast
from pathlib import Path

import pytest

from tests.uml import conftest as harness
from tests.uml import machine

pytestmark = pytest.mark.netns


def _checks() -> list[str]:
    """Node ids of the checks' test functions (parametrized ones as the bare name)."""
    ids = []
    for path in harness.CHECKS:
        tree = ast.parse((harness.REPO / path).read_text())
        ids += [f"{path}::{node.name}" for node in tree.body
                if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]
    return ids


def _matching(inside: harness.Inside, selected: str) -> list[harness.Case]:
    """The cases inside that `selected` (a file, or file::test) stands for."""
    return [c for c in inside.cases
            if c.nodeid == selected or c.nodeid.startswith(selected + "[")
            or ("::" not in selected and c.nodeid.startswith(selected + "::"))]


def _report(inside: harness.Inside, selected: str, skips_allowed: bool) -> None:
    cases = _matching(inside, selected)
    if not cases:
        pytest.fail(inside.failure(f"{selected}: no result from inside the UML"))
    bad = [c for c in cases if c.outcome in ("failed", "error")
           or (c.outcome == "skipped" and not skips_allowed)]
    if bad:
        pytest.fail("\n\n".join(f"inside the UML ({inside.release}): {c.nodeid} "
                                f"{c.outcome}:\n{c.message}" for c in bad))


def test_the_uml_booted_a_kernel_with_netem_and_halted_in_time(uml: harness.Inside) -> None:
    print(f"\nUML {uml.release}: boot to halt {uml.boot.wall_s:.1f} s, "
          f"{len(uml.cases)} tests inside; figures: {uml.figures}")
    assert not uml.boot.timed_out, uml.failure(f"killed after {harness.TIMEOUT_S:.0f} s")
    assert uml.release.startswith("6.1."), uml.failure("no kernel release written")
    assert uml.exit_code in (0, 1), uml.failure("pytest inside could not run its tests")
    # tests/conftest.py's check of leftovers, inside: a namespace or BPF program a test
    # left in the UML is a bug there as it would be on the host
    assert "the tests left tailcut objects behind" not in uml.boot.log, uml.failure(
        "the tests inside left tailcut objects behind")


@pytest.mark.parametrize("selected", harness.SUITE, ids=lambda s: s.split("::")[-1])
def test_the_suites_tests_pass_inside_the_uml(uml: harness.Inside, selected: str) -> None:
    """Skips are the tests' own (e.g. one needing a tool absent there), not failures."""
    _report(uml, selected, skips_allowed=True)


@pytest.mark.parametrize("check", _checks(), ids=lambda check: check.split("::")[-1])
def test_the_netem_path_holds_inside_the_uml(uml: harness.Inside, check: str) -> None:
    _report(uml, check, skips_allowed=False)


def test_no_uml_process_is_left_after_a_timeout(tmp_path: Path) -> None:
    """The harness kills the UML (and all its helpers) at its timeout."""
    boot = machine.boot("sleep 600", tmp_path, timeout_s=10)
    assert boot.timed_out and boot.wall_s < 20
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit()
            and _cmdline(p).startswith(machine.LINUX) and str(tmp_path) in _cmdline(p)]
    assert left == []


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
