"""Racks of one job on two "nodes" (namespaces joined by a veth, as the nodes of a
cluster are joined by their LAN), each node with its own spine, the spines joined by
VXLAN (tailcut.net.overlay): pods reach each other across the nodes, encapsulated on
the nodes' link."""

import dataclasses
import subprocess

import pytest

from tailcut import spec
from tailcut.net import build, netns, overlay, topology
from tests import netutil

pytestmark = pytest.mark.netns

JOB = "ovl"


@pytest.fixture
def two_nodes():
    """Namespaces node-a 192.168.77.1 and node-b 192.168.77.2 joined by a veth."""
    with netutil.linked_namespaces(("tailcut-ovl.node-a", "tailcut-ovl.node-b"),
                                   ("192.168.77.1", "192.168.77.2")) as nodes:
        yield nodes
    build.teardown(JOB)


@pytest.mark.parametrize("mtu", [1500, 9000])
def test_pods_of_racks_on_two_nodes_reach_each_other_over_the_spines_vxlan(two_nodes, mtu):
    job = spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                          "metadata": {"name": JOB},
                          "spec": {"replicas": {"workers": 1},
                                   "network": {"racks": [{"name": "a"}, {"name": "b"}],
                                               "placement": {"ps-0": "a", "worker-0": "b"},
                                               "mtu": mtu}}})
    topo = topology.plan(job)
    spines = [overlay.Spine(0, "192.168.77.1", (topo.racks[0].subnet,)),
              overlay.Spine(1, "192.168.77.2", (topo.racks[1].subnet,))]
    networks = []
    for k, node in enumerate(two_nodes):
        here = dataclasses.replace(topo, spine_netns=f"tailcut-{JOB}.spine-{k}")
        networks.append(build.build_fabric(here, [here.racks[k]], has_netem=False))
        with netns.entered(node):   # the outer packets leave from the node
            applied = overlay.join(here.spine_netns, JOB, overlay.vni("lab/ovl"),
                                   spines[k], [spines[1 - k]], topo.mtu)
        assert applied.startswith("vxlan ")
        assert mtu_of(here.spine_netns, overlay.VXLAN_IF) == mtu
    ps, worker = topo.pod("ps-0"), topo.pod("worker-0")
    for pod, network in ((ps, networks[0]), (worker, networks[1])):
        netns.create(pod.netns)
        build.wire_pod(network, pod, pod.netns)
        # The node agent's wiring (tc0 beside the CNI's eth0) gets the job's MTU too.
        assert mtu_of(pod.netns, build.KUBERNETES.ifname) == mtu

    assert netutil.udp_delivered(worker.netns, ps.netns, ps.ip, 200) == 200
    assert netutil.udp_delivered(ps.netns, worker.netns, worker.ip, 200) == 200
    # It went through the underlay as VXLAN: the nodes' veth carried it.
    shown = subprocess.run(["ip", "-n", two_nodes[0], "-s", "-j", "link", "show", "lan0"],
                           capture_output=True, text=True).stdout
    assert '"packets":' in shown and int(shown.split('"packets":')[1].split(",")[0]) >= 200


def mtu_of(ns: str, ifname: str) -> int:
    with netns.ipr(ns) as ipr:
        return int(ipr.get_links(ipr.link_lookup(ifname=ifname)[0])[0].get_attr("IFLA_MTU"))


def test_a_jobs_vni_is_24_bits_and_differs_between_jobs():
    vnis = {overlay.vni(f"lab/job-{i}") for i in range(1000)}
    assert len(vnis) == 1000 and all(0 < v < 1 << 24 for v in vnis)
    assert overlay.vni("lab/a") == overlay.vni("lab/a")
