"""The kernel feature probes and `tailcut doctor` tell this machine's truth and clean up."""

import gzip
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailcut import doctor, features
from tailcut.errors import KernelFeatureMissing
from tailcut.net import netns

CONFIG = Path("/proc/config.gz")


def kernel_config(option: str) -> str | None:
    """The value of `option` in /proc/config.gz: "y", "m", ..., or None if not set."""
    if not CONFIG.exists():
        pytest.skip("the kernel exposes no /proc/config.gz")
    with gzip.open(CONFIG, "rt") as f:
        for line in f:
            if line.startswith(f"{option}="):
                return line.strip().split("=", 1)[1]
    return None


@pytest.fixture
def fresh() -> Iterator[None]:
    """Probe again rather than reuse results cached by an earlier test."""
    features.clear_cache()
    yield
    features.clear_cache()


@pytest.mark.netns
def test_netem_is_detected_as_the_kernel_config_says(fresh: None) -> None:
    # The development VMs' kernel is built without netem (PLATFORM.md); Debian's, and
    # its user-mode Linux (tests/uml runs this test there), has it as a module. The
    # probe must find that out by trying, and agree with the build configuration.
    built = kernel_config("CONFIG_NET_SCH_NETEM") in ("y", "m")
    netem = features.netem()
    assert (netem.available, netem.probed) == (built, True)
    if built:
        assert netem.detail == "added a netem qdisc to a veth"
        assert netem.meaning.startswith("delay, jitter and the loss towards a pod")
    else:
        assert "ENOENT" in netem.detail
        assert netem.meaning == ("loss falls back to the eBPF dropper; delay and jitter "
                                 "are refused")


@pytest.mark.netns
def test_vxlan_is_detected_as_the_kernel_config_says(fresh: None) -> None:
    assert features.vxlan().available == (kernel_config("CONFIG_VXLAN") in ("y", "m"))
    assert netns.list_names(features.SCRATCH_PREFIX) == [], "the probe cleans up"


@pytest.mark.netns
def test_htb_is_detected_as_present(fresh: None) -> None:
    assert kernel_config("CONFIG_NET_SCH_HTB") in ("y", "m")
    assert features.htb().available


@pytest.mark.netns
@pytest.mark.bpf
def test_the_bpf_features_this_platform_has_are_found(fresh: None) -> None:
    found = {f.name: f for f in (features.clsact_bpf(), features.xdp_native(),
                                 features.xdp_generic(), features.ringbuf(), features.bcc())}
    assert {n: f.available for n, f in found.items()} == dict.fromkeys(found, True)


def probe_programs() -> set[int]:
    """Ids of the loaded probe programs (the dropper's are checked in tests/datapath)."""
    out = subprocess.run(["bpftool", "-j", "prog", "show"], check=True,
                         capture_output=True, text=True).stdout
    return {p["id"] for p in json.loads(out)
            if p.get("name") == "tailcut_probe"}


@pytest.mark.netns
@pytest.mark.bpf
def test_the_probes_leave_no_namespace_and_no_program_behind(fresh: None) -> None:
    assert netns.list_names(features.SCRATCH_PREFIX) == []
    before = probe_programs()  # other people's runs on this host may hold some
    doctor.run()
    assert netns.list_names(features.SCRATCH_PREFIX) == []
    # The scratch namespace's filter holds a probe program until the kernel has torn
    # the namespace down, which it does asynchronously.
    deadline = time.monotonic() + 5
    while probe_programs() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert probe_programs() - before == set()


@pytest.mark.netns
def test_each_probe_runs_once_per_process(fresh: None) -> None:
    first = features.netem()
    assert features.netem() is first


def test_a_missing_feature_can_be_required_with_a_clear_error() -> None:
    missing = features.Feature("netem", False, "adding a netem qdisc failed with ENOENT",
                               "loss falls back to the eBPF dropper")
    with pytest.raises(KernelFeatureMissing, match="netem is missing .*ENOENT.*dropper"):
        missing.require()
    features.Feature("htb", True, "ok", "rates work").require()


def test_without_root_nothing_is_probed_and_doctor_exits_non_zero(
        fresh: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    found = {f.name: f for f in doctor.run()}
    assert not found["root"].available
    assert found["netem"].detail == "not probed: needs root"
    assert not found["netem"].probed and found["htb"].probed is False
    assert netns.list_names(features.SCRATCH_PREFIX) == []
    assert doctor.main() == 1
    assert "run as root" in capsys.readouterr().err
