"""The clsact qdisc the dropper and the classifier share is removed by whichever leaves last."""

import pytest

from tailcut.datapath import classifier, dropper
from tailcut.net import netns
from tests.datapath.udp_link import IFNAME, Link


def qdisc_kinds(ns: str) -> list[str]:
    with netns.ipr(ns) as ipr:
        index = ipr.link_lookup(ifname=IFNAME)[0]
        return sorted(str(q.get_attr("TCA_KIND")) for q in ipr.get_qdiscs(index))


@pytest.mark.netns
@pytest.mark.bpf
@pytest.mark.parametrize("first_out", ["dropper", "classifier"])
def test_the_clsact_the_dropper_added_goes_when_the_classifier_leaves_last(
        link: Link, first_out: str) -> None:
    attached = {"dropper": dropper.attach(link.sender, IFNAME, 0.1),
                "classifier": classifier.attach(link.sender, IFNAME)}
    attached.pop(first_out).detach()
    assert "clsact" in qdisc_kinds(link.sender)
    attached.popitem()[1].detach()
    assert "clsact" not in qdisc_kinds(link.sender)


@pytest.mark.netns
@pytest.mark.bpf
def test_a_clsact_someone_else_added_stays_after_both_leave(link: Link) -> None:
    with netns.ipr(link.sender) as ipr:
        ipr.tc("add", "clsact", ipr.link_lookup(ifname=IFNAME)[0])
    with dropper.attach(link.sender, IFNAME, 0.1), classifier.attach(link.sender, IFNAME):
        pass
    assert "clsact" in qdisc_kinds(link.sender)
