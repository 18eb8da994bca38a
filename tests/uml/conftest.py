"""One boot of Debian's user-mode Linux per session (tests/uml/machine.py), in which a
chosen part of the suite runs with pytest; test_uml.py reads its results."""

import json
import shlex
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.uml import machine

REPO = Path(__file__).resolve().parents[2]
# What runs inside: tests of the suite that must hold on a kernel with netem as well
# as on the host's, and the checks of the netem path that only a kernel with netem
# can run, BPF ones included (BCC compiles against Debian's 6.1 headers there).
# tests/net/test_build.py and test_shaping_buffers.py are left out too: their rate
# and burst tests need more than the UML's one CPU gives on a loaded host (100 Mbit/s
# links carried 67 and 38 Mbit/s at load 12; a Python burst of 1,300 datagrams was
# slow enough for a 10 Mbit/s link to drain all but 135 of them, not the 150 expected).
# The BPF programs run with their own tests: the bounded-loss XDP counter (with the
# transport's tests of it), CadentFlow's classifier, the ToR's store, the raw bpf(2)
# calls, BCC's errors. The loss dropper's own tests held there too (23 passed, 27 s)
# but are left out for time: check_netem.py builds and counts it already. The kernel
# receive ring does not load (check_xdp.py says where), so test_rxring.py is left out.
XDP_TESTS = "tests/transports/test_datagram.py::test_"
SUITE = ("tests/test_features.py", "tests/test_doctor.py",
         "tests/test_plan.py::test_validate_refuses_a_delay_exactly_where_this_kernel_lacks_netem",
         "tests/net/test_rtt.py",
         "tests/datapath/test_partial.py", "tests/datapath/test_classifier.py",
         "tests/datapath/test_tor.py", "tests/datapath/test_bpfsys.py",
         "tests/datapath/test_bcc.py",
         XDP_TESTS + "bounded_loss_over_a_lossy_veth_completes_on_the_xdp_event",
         XDP_TESTS + "xdp_entries_are_freed_while_messages_keep_coming_back_to_back")
# Tests of SUITE's files that do not hold there. test_bcc's: 6.1 refuses its unchecked
# 4-byte read at skb->data first for alignment ("misaligned packet access off
# 2+(0x0; 0x0)+0+0 size 4"), not with the "invalid access to packet" it matches.
DESELECTED = ("tests/datapath/test_bcc.py::test_a_verifier_rejection_carries_the_verifier_log",)
CHECKS = ("tests/uml/inside/check_netem.py", "tests/uml/inside/check_bounded_loss.py",
          "tests/uml/inside/check_xdp.py")
# Boot to halt took 70-120 s on the 2-core development VM (load 10-12), 165 s (load 9-15)
# with the bounded-loss job and the datapath tests; past this the UML is killed.
TIMEOUT_S = 420.0


@dataclass
class Case:
    """One test as the inside pytest reported it."""

    nodeid: str                  # file::name[param]
    outcome: str                 # passed, failed, error, skipped
    message: str = ""


@dataclass
class Inside:
    """What the boot left: its Boot record, the tests' outcomes, the figures."""

    boot: machine.Boot
    out: Path
    cases: list[Case] = field(default_factory=list)
    exit_code: Optional[int] = None        # the inside pytest's
    release: str = ""                      # uname -r inside
    figures: dict[str, Any] = field(default_factory=dict)

    def failure(self, what: str) -> str:
        return (f"{what} (boot to halt {self.boot.wall_s:.1f} s, timed out: "
                f"{self.boot.timed_out}, inside pytest exit {self.exit_code})\n"
                + self.boot.tail())


def _cases(junit: Path) -> list[Case]:
    cases = []
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        path = path.rsplit("/", 1)[0] if path.split("/")[-1][:1].isupper() else path
        nodeid = f"{path}.py::{case.get('name')}"
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
                message = ((found.get("message") or "") + "\n" + (found.text or "")).strip()
                break
        cases.append(Case(nodeid, outcome, message))
    return cases


@pytest.fixture(scope="session")
def uml(tmp_path_factory: pytest.TempPathFactory) -> Inside:
    """Boot once, run SUITE and CHECKS inside, collect the outcomes."""
    out = tmp_path_factory.mktemp("uml")
    python = machine.which_venv_python(REPO)
    selection = " ".join(shlex.quote(s) for s in SUITE + CHECKS)
    selection += "".join(f" --deselect {shlex.quote(nodeid)}" for nodeid in DESELECTED)
    body = (f"uname -r > {out}/uname\n"
            f"TAILCUT_UML_OUT={out} {python} -m pytest -p no:cacheprovider -q -rfEs --durations=8 "
            f"--basetemp=/run/tmp/pytest --junitxml={out}/junit.xml "
            f"{selection}\n"
            f"echo $? > {out}/pytest.rc\n")
    boot = machine.boot(body, out, TIMEOUT_S, cwd=REPO)
    inside = Inside(boot, out)
    if (out / "uname").exists():
        inside.release = (out / "uname").read_text().strip()
    if (out / "pytest.rc").exists():
        inside.exit_code = int((out / "pytest.rc").read_text())
    if (out / "junit.xml").exists():
        inside.cases = _cases(out / "junit.xml")
    if (out / "figures.json").exists():
        inside.figures = json.loads((out / "figures.json").read_text())
    return inside
