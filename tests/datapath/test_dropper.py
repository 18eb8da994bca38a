"""The eBPF loss dropper drops what it is asked to, counts it, and leaves nothing behind."""

import json
import math
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tailcut.datapath import dropper
from tailcut.errors import DatapathError
from tailcut.net import netns
from tests.datapath.udp_link import (
    IFNAME,
    Link,
    Traffic,
    build_link,
    link_drops,
    remove_link,
    send_udp,
    udp_errors,
)

LOSS = 0.05
PACKETS = 20_000


def bpf_objects(prog_id: int) -> list[tuple[str, int]]:
    """("prog", id) and ("map", id) for program `prog_id` and its maps; [] if it is gone.
    Asked by id, not by name: other people's runs on this host load tailcut_drop too."""
    shown = subprocess.run(["bpftool", "-j", "prog", "show", "id", str(prog_id)],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        return []
    prog = json.loads(shown.stdout)
    return [("prog", prog_id)] + [("map", m) for m in prog.get("map_ids", [])]


def still_loaded(objects: list[tuple[str, int]]) -> list[tuple[str, int]]:
    return [(kind, n) for kind, n in objects
            if subprocess.run(["bpftool", kind, "show", "id", str(n)],
                              capture_output=True).returncode == 0]


def qdisc_kinds(ns: str) -> list[str]:
    with netns.ipr(ns) as ipr:
        index = ipr.link_lookup(ifname=IFNAME)[0]
        return sorted(str(q.get_attr("TCA_KIND")) for q in ipr.get_qdiscs(index))


@dataclass(frozen=True)
class Run:
    traffic: Traffic
    counts: tuple[int, int]
    udp_errors: dict[str, int]
    link_drops: int


@pytest.fixture(scope="module")
def five_percent() -> Iterator[Run]:
    """One run of PACKETS datagrams through a 5% dropper, shared by the tests below."""
    link = build_link("m")
    try:
        with dropper.attach(link.sender, IFNAME, LOSS) as d:
            traffic = send_udp(link, PACKETS)
            counts = d.counts()
        yield Run(traffic, counts, udp_errors(link.receiver),
                  link_drops(link.sender) + link_drops(link.receiver))
    finally:
        remove_link(link)


@pytest.mark.parametrize("loss", [-0.01, 1.5, float("nan"), True, "0.05"])
def test_a_loss_outside_zero_to_one_is_refused_with_the_range(loss: object) -> None:
    with pytest.raises(ValueError, match=r"must be a fraction in \[0, 1\]"):
        dropper.attach("tailcut-nowhere.x", IFNAME, loss)  # type: ignore[arg-type]


def test_an_unknown_direction_is_refused() -> None:
    with pytest.raises(ValueError, match="direction='sideways'"):
        dropper.attach("tailcut-nowhere.x", IFNAME, 0.1, "sideways")  # type: ignore[arg-type]


def test_the_threshold_is_loss_times_two_to_the_32_and_saturates_at_loss_one() -> None:
    assert dropper.threshold(0) == 0
    assert dropper.threshold(0.05) == 214748365
    assert dropper.threshold(0.5) == 2**31
    assert dropper.threshold(1) == 0xFFFFFFFF


@pytest.mark.netns
@pytest.mark.bpf
def test_five_percent_loss_drops_within_four_standard_deviations_of_five_percent(
        five_percent: Run) -> None:
    fraction = five_percent.traffic.lost / PACKETS
    sigma = math.sqrt(LOSS * (1 - LOSS) / PACKETS)
    print(f"dropped {five_percent.traffic.lost}/{PACKETS} = {fraction:.4f} "
          f"(5% +- 4 sigma = [{LOSS - 4 * sigma:.4f}, {LOSS + 4 * sigma:.4f}])")
    assert abs(fraction - LOSS) <= 4 * sigma


@pytest.mark.netns
@pytest.mark.bpf
def test_the_bpf_counters_agree_with_the_receiver(five_percent: Run) -> None:
    passed, dropped = five_percent.counts
    assert passed == five_percent.traffic.received
    assert dropped == five_percent.traffic.lost
    assert passed + dropped == PACKETS  # the link carried nothing else


@pytest.mark.netns
@pytest.mark.bpf
def test_nothing_but_the_dropper_lost_packets(five_percent: Run) -> None:
    assert five_percent.udp_errors == {"InErrors": 0, "RcvbufErrors": 0, "NoPorts": 0}
    assert five_percent.link_drops == 0


@pytest.mark.netns
@pytest.mark.bpf
def test_loss_zero_drops_nothing(link: Link) -> None:
    with dropper.attach(link.sender, IFNAME, 0.0) as d:
        traffic = send_udp(link, 5000)
        assert d.counts() == (5000, 0)
    assert traffic.received == 5000


@pytest.mark.netns
@pytest.mark.bpf
def test_loss_one_drops_everything(link: Link) -> None:
    with dropper.attach(link.sender, IFNAME, 1.0) as d:
        traffic = send_udp(link, 5000)
        assert d.counts() == (0, 5000)
    assert traffic.received == 0


@pytest.mark.netns
@pytest.mark.bpf
def test_ingress_dropper_drops_what_arrives(link: Link) -> None:
    with dropper.attach(link.receiver, IFNAME, 1.0, direction="ingress") as d:
        traffic = send_udp(link, 1000)
        assert d.counts() == (0, 1000)
    assert traffic.received == 0


@pytest.mark.netns
@pytest.mark.bpf
def test_dropper_coexists_with_an_htb_root_qdisc(link: Link) -> None:
    with netns.ipr(link.sender) as ipr:
        index = ipr.link_lookup(ifname=IFNAME)[0]
        ipr.tc("replace", "htb", index, handle="1:", default=0x10)
        ipr.tc("add-class", "htb", index, handle="1:10", parent="1:",
               rate="1000mbit", ceil="1000mbit")
    with dropper.attach(link.sender, IFNAME, 0.5) as d:
        assert qdisc_kinds(link.sender) == ["clsact", "htb"]
        traffic = send_udp(link, 2000)
        passed, dropped = d.counts()
    assert passed == traffic.received and dropped == traffic.lost and dropped > 0
    with netns.ipr(link.sender) as ipr:
        htb = [q for q in ipr.get_qdiscs(index) if q.get_attr("TCA_KIND") == "htb"]
        classes = [c["handle"] for c in ipr.get_classes(index)]
    assert qdisc_kinds(link.sender) == ["htb"]  # clsact gone, HTB untouched
    assert htb[0]["handle"] == 0x10000 and 0x10010 in classes
    assert htb[0].get_nested("TCA_STATS2", "TCA_STATS_BASIC")["packets"] == passed


@pytest.mark.netns
@pytest.mark.bpf
def test_detach_leaves_a_clsact_it_did_not_add(link: Link) -> None:
    with netns.ipr(link.sender) as ipr:
        ipr.tc("add", "clsact", ipr.link_lookup(ifname=IFNAME)[0])
    dropper.attach(link.sender, IFNAME, 0.1).detach()
    assert qdisc_kinds(link.sender) == ["clsact", "noqueue"]


@pytest.mark.netns
@pytest.mark.bpf
def test_clsact_stays_until_the_last_of_our_droppers_on_it_detaches(link: Link) -> None:
    out = dropper.attach(link.sender, IFNAME, 0.1)
    into = dropper.attach(link.sender, IFNAME, 0.1, direction="ingress")
    out.detach()
    assert "clsact" in qdisc_kinds(link.sender)
    into.detach()
    assert "clsact" not in qdisc_kinds(link.sender)


@pytest.mark.netns
@pytest.mark.bpf
def test_a_second_dropper_on_the_same_hook_is_refused(link: Link) -> None:
    with dropper.attach(link.sender, IFNAME, 0.1):
        with pytest.raises(DatapathError, match="already has a filter at egress"):
            dropper.attach(link.sender, IFNAME, 0.2)
    assert "clsact" not in qdisc_kinds(link.sender)


@pytest.mark.netns
@pytest.mark.bpf
def test_a_missing_interface_is_named_in_the_error(link: Link) -> None:
    with pytest.raises(DatapathError,
                       match=f"no interface eth9 in network namespace {link.sender}"):
        dropper.attach(link.sender, "eth9", 0.1)


@pytest.mark.netns
@pytest.mark.bpf
def test_one_program_serves_every_interface_with_the_same_loss(link: Link) -> None:
    with dropper.attach(link.sender, IFNAME, 1.0) as out, \
            dropper.attach(link.receiver, IFNAME, 1.0) as back:
        assert out.prog_id == back.prog_id
        assert out.slot != back.slot
        send_udp(link, 300)
        # Counted per attachment although the program is shared.
        assert out.counts() == (0, 300) and back.counts() == (0, 0)


@pytest.mark.netns
@pytest.mark.bpf
def test_one_program_drops_each_interface_at_its_own_loss_and_counts_each_apart(
        link: Link) -> None:
    sent = 10_000
    with dropper.attach(link.sender, IFNAME, 0.2) as out, \
            dropper.attach(link.receiver, IFNAME, 0.5, direction="ingress") as back:
        assert out.prog_id == back.prog_id and out.slot != back.slot
        send_udp(link, sent)
        (out_passed, out_dropped), (back_passed, back_dropped) = out.counts(), back.counts()
    assert out_passed + out_dropped == sent
    assert back_passed + back_dropped == out_passed   # what the sender's dropper kept
    for dropped, seen, loss in [(out_dropped, sent, 0.2), (back_dropped, out_passed, 0.5)]:
        sigma = math.sqrt(loss * (1 - loss) / seen)
        assert abs(dropped / seen - loss) < 4 * sigma, (dropped, seen, loss)


@pytest.mark.netns
@pytest.mark.bpf
def test_no_program_of_ours_is_left_after_detach_and_namespace_removal() -> None:
    link = build_link("g")
    try:
        kept = dropper.attach(link.sender, IFNAME, 0.3)
        abandoned = dropper.attach(link.receiver, IFNAME, 0.7, direction="ingress")
        assert kept.prog_id == abandoned.prog_id   # one program, whatever the loss
        ours = bpf_objects(kept.prog_id)
        assert sorted(kind for kind, _ in ours) == ["map", "map", "prog"]
        send_udp(link, 200)
        kept.detach()
    finally:
        remove_link(link)
    abandoned.detach()  # after its namespace is gone: nothing to remove, no error
    assert sum(abandoned.counts()) > 0  # the final numbers survive detach
    deadline = time.monotonic() + 5  # netns teardown, and with it the filter, is async
    while still_loaded(ours) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert still_loaded(ours) == []
    assert not netns.exists(link.sender) and not netns.exists(link.receiver)


@pytest.mark.netns
@pytest.mark.bpf
def test_release_keeps_the_counts_and_the_program_goes_with_the_link() -> None:
    link = build_link("r")
    try:
        d = dropper.attach(link.sender, IFNAME, 1.0)
        ours = bpf_objects(d.prog_id)
        send_udp(link, 100)
        d.release()   # the filter stays until the link goes
        assert d.counts() == (0, 100)
        assert "clsact" in qdisc_kinds(link.sender)
    finally:
        remove_link(link)
    deadline = time.monotonic() + 5
    while still_loaded(ours) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert still_loaded(ours) == []
    d.detach()   # after release and removal: nothing left to do, no error


def test_there_are_slots_for_a_dropper_on_both_ends_of_every_link_of_the_largest_job():
    import re

    from tailcut.datapath import bcc
    from tailcut.spec.model import Replicas

    def most(field: str) -> int:
        return next(m.le for m in Replicas.model_fields[field].metadata if hasattr(m, "le"))

    header = (bcc.EBPF_DIR / "dropper.h").read_text()
    slots = int(re.search(r"#define TAILCUT_DROP_SLOTS (\d+)", header).group(1))
    pods = most("workers") + most("parameter_servers")
    racks = 250   # rack r is 10.<r+1>.0.0/24 (tailcut/net/naming.py)
    assert slots - 1 >= 2 * pods + 2 * racks   # both ends of every link; slot 0 unused
