"""The node agent builds a job's racks and spine on its node and wires each pod into
its rack through tc0, with the address and shaping `tailcut run` gives the same pod:
real namespaces, veths, HTB and BPF here, and pods faked as a process in its own
network namespace, in a cgroup named after a pod UID (as the kubelet puts it). It
lets go when the pod goes and leaves the pod itself running."""

import json
import re
import socket
import struct
import subprocess
import time
import uuid
from types import SimpleNamespace

import pytest
from pyroute2 import IPRoute

from tailcut import spec
from tailcut.k8s import metrics
from tailcut.k8s.agent import admission, daemon, errors, podns, wiring
from tailcut.k8s.manifests import placement, resources
from tailcut.net import netns, overlay, topology
from tests import netutil, waiting
from tests.k8s import fakepod

K8S_NS = "k8-lab"


def test_pid_of_pod_matches_cgroupfs_and_systemd_spellings_of_the_uid(tmp_path):
    uid = "0d1c2b3a-1111-2222-3333-444455556666"
    for pid, line in ((11, "8:pids:/kubepods/burstable/pod" + uid + "/abc"),
                      (12, "0::/kubepods.slice/kubepods-pod" + uid.replace("-", "_") + ".slice")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(line + "\n")
    (tmp_path / "self").mkdir()
    assert podns.pid_of_pod(uid, tmp_path) in (11, 12)
    assert podns.pid_of_pod("ffffffff-0000-0000-0000-000000000000", tmp_path) is None


def test_netns_names_fit_and_stay_out_of_tailcut_clean():
    name = podns.netns_name(str(uuid.uuid4()))
    assert name.startswith("tck8s-") and not name.startswith("tailcut-")
    rack = wiring.node_topology(job("k8-names"), K8S_NS, "k8-node").racks[0].netns
    assert rack == "tck8s-k8-lab.k8-names@k8-node.rack-0"


def job(name, **job_spec):
    return spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                           "metadata": {"name": name}, "spec": job_spec})


JOB_UID = "7e57a9e1-0000-4000-8000-00000000j0b5"
OVERLAY_ID = 4242   # the VXLAN id the operator allocated (status.overlayId)


class NotFound(Exception):
    status = 404


def training_job(j, where=None):
    """The TrainingJob as the API server returns it once the operator has recorded the
    spec's generation and the racks' placement in its status."""
    return {"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": j.name, "namespace": K8S_NS, "uid": JOB_UID,
                         "generation": 1},
            "spec": j.model_dump(by_alias=True, mode="json")["spec"],
            "status": {"specGeneration": 1, "placement": placement.to_status(where or {}),
                       "overlayId": OVERLAY_ID}}


class FakeApi:
    """The API calls the agent makes: the TrainingJob that controls a pod, and the
    status patches that record a pod's links and its queue drops (kept here, merged
    as the API server merges annotations)."""

    def __init__(self, j=None, where=None):
        self.training_job = None if j is None else training_job(j, where)
        self.annotations = {}

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        if self.training_job is None or self.training_job["metadata"]["name"] != name:
            raise NotFound(name)
        return self.training_job

    def patch_namespaced_pod_status(self, name, namespace, body):
        self.annotations.setdefault(name, {}).update(body["metadata"]["annotations"])


def make_agent(j=None, node="k8-node", where=None):
    api = FakeApi(j, where)
    return daemon.Agent(api, api, node=node)


@pytest.fixture
def pods():
    """Make fake pods (tests/k8s/fakepod.py); each is ended at the end."""
    with fakepod.Maker() as make:
        yield make


@pytest.fixture
def agents():
    """Agents made by a test release everything at the end, even after a failure."""
    made = []
    yield lambda j: made.append(make_agent(j)) or made[-1]
    for a in made:
        a.release_all()


def pod_event(pod, phase, job_name="k8-demo", uid=JOB_UID):
    """The pod as the agent's watch yields it: controlled by TrainingJob `job_name`."""
    owner = SimpleNamespace(api_version="tailcut.dev/v1alpha1", kind="TrainingJob",
                            name=job_name, uid=uid, controller=True)
    return SimpleNamespace(
        metadata=SimpleNamespace(uid=pod.uid, namespace=K8S_NS,
                                 name=f"{job_name}-{pod.replica}",
                                 labels={resources.LABEL_JOB: job_name,
                                         resources.LABEL_REPLICA: pod.replica},
                                 annotations={}, owner_references=[owner]),
        spec=SimpleNamespace(host_network=False), status=SimpleNamespace(phase=phase))


def in_pod(pod, *argv):
    return subprocess.run(["nsenter", f"--net=/proc/{pod.pid}/ns/net", *argv],
                          capture_output=True, text=True).stdout


def htb_rates(ns, ifname):
    with netns.ipr(ns) as ipr:
        index = ipr.link_lookup(ifname=ifname)[0]
        return sorted(c.get_attr("TCA_OPTIONS").get_attr("TCA_HTB_PARMS")["rate"]
                      for c in ipr.get_classes(index=index))


def fabric_namespaces(job_name, node="k8-node"):
    return netns.list_names(wiring.fabric_name(K8S_NS, job_name, node) + ".")


@pytest.mark.netns
def test_agent_wires_pods_into_their_racks_with_the_planned_addresses_and_both_ways_shaped(
        pods, agents):
    two_racks = job("k8-demo", replicas={"workers": 1},
                    network={"racks": [{"name": "a"}, {"name": "b"}],
                             "placement": {"ps-0": "a", "worker-0": "b"},
                             "accessLink": {"bandwidth": "100Mbit"},
                             "uplink": {"bandwidth": "200Mbit"}})
    topo = topology.plan(two_racks)
    node_agent = agents(two_racks)
    ps, worker = pods("ps-0"), pods("worker-0")
    node_agent.handle("MODIFIED", pod_event(ps, "Pending"))
    assert not node_agent.wired and not fabric_namespaces("k8-demo"), \
        "a pod that is not running yet has no process to enter"
    for pod in (ps, worker):
        node_agent.handle("MODIFIED", pod_event(pod, "Running"))
    node_agent.handle("MODIFIED", pod_event(ps, "Running"))   # no second time
    assert fabric_namespaces("k8-demo") == [
        "tck8s-k8-lab.k8-demo@k8-node.rack-0", "tck8s-k8-lab.k8-demo@k8-node.rack-1",
        "tck8s-k8-lab.k8-demo@k8-node.spine"]

    # Each pod has its planned address on tc0; its eth0 (the CNI's) is left alone.
    for pod in (ps, worker):
        assert f"inet {topo.pod(pod.replica).ip}/24" in in_pod(pod, "ip", "-4", "addr",
                                                                "show", "dev", "tc0")
        assert "htb" not in in_pod(pod, "tc", "qdisc", "show", "dev", "eth0")
        assert htb_rates(pod.name, "tc0") == [100 * 10**6 // 8] * 2   # bytes/s
    rack1 = "tck8s-k8-lab.k8-demo@k8-node.rack-1"
    assert htb_rates(rack1, "p0") == [100 * 10**6 // 8] * 2        # rack -> pod
    assert htb_rates(rack1, "up") == [200 * 10**6 // 8] * 2        # rack -> spine
    assert htb_rates("tck8s-k8-lab.k8-demo@k8-node.spine", "r1") == [200 * 10**6 // 8] * 2

    # Across racks, through the spine, both ways.
    ps_ip, worker_ip = topo.pod("ps-0").ip, topo.pod("worker-0").ip
    assert netutil.udp_delivered(worker.name, ps.name, ps_ip, 100) == 100
    assert netutil.udp_delivered(ps.name, worker.name, worker_ip, 100) == 100

    links = json.loads(node_agent.core.annotations["k8-demo-worker-0"][
        resources.ANNOTATION_NETWORK])
    gso = ", gso_max_size 32768"
    assert links == {"worker-0/tc0": "htb 100 Mbit/s" + gso, "rack-1/p0": "htb 100 Mbit/s" + gso,
                     "rack-1/up": "htb 200 Mbit/s", "spine/r1": "htb 200 Mbit/s"}

    node_agent.handle("DELETED", pod_event(ps, "Running"))
    assert "tc0" not in in_pod(ps, "ip", "link") and not netns.exists(ps.name)
    assert len(fabric_namespaces("k8-demo")) == 3, "worker-0 still uses the fabric"
    node_agent.handle("MODIFIED", pod_event(worker, "Succeeded"))
    assert not node_agent.wired and not node_agent.fabrics
    assert fabric_namespaces("k8-demo") == [] and "tc0" not in in_pod(worker, "ip", "link")
    assert ps.proc.poll() is None and worker.proc.poll() is None, \
        "releasing must not end the pods"


@pytest.mark.netns
def test_a_pod_that_ends_leaves_its_links_queue_drops_for_the_jobs_status(pods, agents):
    shallow = job("k8-buf", replicas={"workers": 1},
                  network={"accessLink": {"bandwidth": "10Mbit", "bufferPackets": 8}})
    topo = topology.plan(shallow)
    node_agent = agents(shallow)
    ps, worker = pods("ps-0"), pods("worker-0")
    for pod in (ps, worker):
        node_agent.handle("MODIFIED", pod_event(pod, "Running", "k8-buf"))
    wired = node_agent.wired[worker.uid]
    assert "pfifo buffer 8 packets per class" in wired.description
    before = metrics.agent_registry.get_sample_value("tailcut_agent_queue_drops_total")
    # spine -> worker-0: at 1 Gbit/s over the uplink, then piles up at the rack's port
    # to the worker (10 Mbit/s, 8 packets; the worker's own end has no switch buffer).
    spine = wired.fabric.network.topology.spine_netns
    lost = 300 - netutil.udp_burst_received(spine, worker.name, topo.pod("worker-0").ip, 300)
    node_agent.handle("MODIFIED", pod_event(worker, "Succeeded", "k8-buf"))
    drops = json.loads(node_agent.core.annotations["k8-buf-worker-0"][
        resources.ANNOTATION_QUEUE_DROPS])
    assert set(drops) == {"worker-0/tc0", "rack-0/p1", "rack-0/up", "spine/r0"}
    # (an IPv6 router solicitation may be in the queue's count too)
    assert lost >= 150 and lost <= drops["rack-0/p1"] <= lost + 5
    assert metrics.agent_registry.get_sample_value(
        "tailcut_agent_queue_drops_total") - before == sum(drops.values())
    node_agent.handle("DELETED", pod_event(ps, "Running", "k8-buf"))
    assert resources.ANNOTATION_QUEUE_DROPS not in node_agent.core.annotations[
        "k8-buf-ps-0"], "a deleted pod is not patched"


@pytest.fixture
def two_nodes():
    """The network namespaces of two nodes and their LAN."""
    with netutil.linked_namespaces(("tck8s-test.node-a", "tck8s-test.node-b"),
                                   ("192.168.78.1", "192.168.78.2")) as nodes:
        yield nodes


@pytest.mark.netns
def test_racks_placed_on_two_nodes_are_joined_by_vxlan_between_their_spines(
        pods, two_nodes):
    two_racks = job("k8-two", replicas={"workers": 1},
                    network={"racks": [{"name": "a"}, {"name": "b"}],
                             "placement": {"ps-0": "a", "worker-0": "b"}})
    where = {"a": placement.NodeAddress("node-a", "node-a", "192.168.78.1"),
             "b": placement.NodeAddress("node-b", "node-b", "192.168.78.2")}
    node_agents = [make_agent(two_racks, n, where) for n in ("node-a", "node-b")]
    ps, worker = pods("ps-0"), pods("worker-0")
    try:
        for node_ns, node_agent, pod in zip(two_nodes, node_agents, (ps, worker)):
            with netns.entered(node_ns):   # an agent runs in its node's namespace
                node_agent.handle("ADDED", pod_event(pod, "Running", "k8-two"))
        # Each node holds its own rack and a spine; the pods meet over the VXLAN.
        assert [len(fabric_namespaces("k8-two", n)) for n in ("node-a", "node-b")] == [2, 2]
        topo = topology.plan(two_racks)
        assert netutil.udp_delivered(worker.name, ps.name, topo.pod("ps-0").ip, 200) == 200
        assert netutil.udp_delivered(ps.name, worker.name, topo.pod("worker-0").ip, 200) == 200
        spine_a = node_agents[0].fabrics[(K8S_NS, "k8-two")].network
        vxlan = spine_a.applied["tck8s-k8-lab.k8-two@node-a.spine/vx0"]
        assert vxlan.startswith("vxlan ") and "192.168.78.2 (10.2.0.0/24)" in vxlan
        assert vxlan.endswith("; accepted only from 192.168.78.2")

        # The VXLAN is accepted from the job's other node only: the same encapsulated
        # datagram for ps-0 arrives from node-b's address, not from another on its LAN.
        assert "vxlan 4242 " in vxlan, "the id the operator allocated, not a hash"
        vni = OVERLAY_ID
        frame = vxlan_frame(vni, topo.pod("worker-0").ip, topo.pod("ps-0").ip)
        with netns.ipr(two_nodes[1]) as ipr:
            ipr.addr("add", index=ipr.link_lookup(ifname="lan0")[0],
                     address="192.168.78.3", prefixlen=24)
        assert inject(two_nodes[1], "192.168.78.3", "192.168.78.1", frame, ps.name) == 0
        with netns.entered(two_nodes[0]):
            assert overlay.refused(vni) == 20, "the guard dropped them"
        assert inject(two_nodes[1], "192.168.78.2", "192.168.78.1", frame, ps.name) == 20
        # A pod of rack b is not node-a's to wire.
        stray = pods("worker-0")
        with pytest.raises(errors.AgentError, match=r"worker-0 belongs to rack b, which is "
                                                   r"placed on another node"):
            with netns.entered(two_nodes[0]):
                node_agents[0].handle("ADDED", pod_event(stray, "Running", "k8-two"))
    finally:
        for node_ns, node_agent in zip(two_nodes, node_agents):
            with netns.entered(node_ns):
                node_agent.release_all()
    for node_ns in two_nodes:
        listed = subprocess.run(["ip", "netns", "exec", node_ns, "nft", "list", "ruleset"],
                                capture_output=True, text=True, check=True).stdout
        assert overlay.TABLE not in listed, "the guard went with the job"


@pytest.mark.netns
def test_a_node_whose_link_is_short_of_the_jobs_mtu_plus_vxlan_refuses_before_building(
        pods):
    """A kind node's 1500 carries no 1500-byte job in VXLAN (1550): the agent refuses
    at once, naming spec.network.mtu, the link and the fix, builds nothing, and marks
    the pod for the operator to fail the job (no retry mends it)."""
    with netutil.linked_namespaces(("tck8s-test.node-a", "tck8s-test.node-b"),
                                   ("192.168.78.1", "192.168.78.2"), mtu=1500) as nodes:
        two_racks = job("k8-mtu", replicas={"workers": 1},
                        network={"racks": [{"name": "a"}, {"name": "b"}],
                                 "placement": {"ps-0": "a", "worker-0": "b"}})
        where = {"a": placement.NodeAddress("node-a", "node-a", "192.168.78.1"),
                 "b": placement.NodeAddress("node-b", "node-b", "192.168.78.2")}
        with netns.entered(nodes[0]):
            with pytest.raises(errors.NodeUnfit) as err:
                wiring.build_fabric(K8S_NS, two_racks, False, "node-a", where, OVERLAY_ID)
            assert fabric_namespaces("k8-mtu", "node-a") == []
            assert str(err.value).endswith(
                "spec.network.mtu is 1500 and its racks on other nodes are joined by VXLAN, "
                "50 bytes more per packet, but node node-a reaches 192.168.78.2 through lan0 "
                "of MTU 1500, short of the 1550 needed: set spec.network.mtu to 1450 or less, "
                "or give the nodes' network an MTU of 1550 (kind: its Docker network, as "
                "scripts/kind-up.sh makes it)")
            # At 1450 the same link carries it.
            at_1450 = job("k8-mtu", replicas={"workers": 1},
                          network={"racks": [{"name": "a"}, {"name": "b"}],
                                   "placement": {"ps-0": "a", "worker-0": "b"}, "mtu": 1450})
            fabric = wiring.build_fabric(K8S_NS, at_1450, False, "node-a", where, OVERLAY_ID)
            wiring.remove_fabric(fabric)
        # Through the agent: the pod carries the refusal for the operator.
        node_agent = make_agent(two_racks, "node-a", where)
        ps = pods("ps-0")
        with netns.entered(nodes[0]):
            with pytest.raises(errors.NodeUnfit):
                node_agent.handle("ADDED", pod_event(ps, "Running", "k8-mtu"))
            node_agent.release_all()
        recorded = node_agent.core.annotations["k8-mtu-ps-0"]
        assert recorded[resources.ANNOTATION_NODE_UNFIT] == recorded[
            resources.ANNOTATION_WIRING_ERROR]
        assert "set spec.network.mtu to 1450" in recorded[resources.ANNOTATION_NODE_UNFIT]


@pytest.mark.netns
def test_a_rack_with_no_pod_is_built_on_no_node():
    """Rack c holds no pod: with a placement it has no node, without one (every rack on
    every node) it is left out all the same; its uplink's queues would hold kernel
    memory for nothing."""
    sparse = job("k8-sparse", replicas={"workers": 1},
                 network={"racks": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
                          "placement": {"ps-0": "a", "worker-0": "b"}})
    node_a = placement.NodeAddress("k8-node", "k8-node", "192.168.78.1")
    for where in ({}, {"a": node_a, "b": node_a}):
        fabric = wiring.build_fabric(K8S_NS, sparse, False, "k8-node", where)
        try:
            built = fabric_namespaces("k8-sparse")
            assert sorted(n.rsplit(".", 1)[1] for n in built) == ["rack-0", "rack-1", "spine"]
        finally:
            wiring.remove_fabric(fabric)
        assert fabric_namespaces("k8-sparse") == []


def test_two_jobs_whose_vnis_collide_do_not_share_a_node():
    """The second would replace the first's guard; refused before anything is built."""
    two_racks = job("k8-vni", network={"racks": [{"name": "a"}, {"name": "b"}]})
    where = {"a": placement.NodeAddress("node-a", "node-a", "192.168.78.1"),
             "b": placement.NodeAddress("node-b", "node-b", "192.168.78.2")}
    with pytest.raises(errors.AgentError, match=rf"VXLAN id {OVERLAY_ID} \(status.overlayId\) "
                                               "is also lab/other's on this node"):
        wiring.build_fabric(K8S_NS, two_racks, False, "node-a", where, OVERLAY_ID,
                            {OVERLAY_ID: "lab/other"})
    assert fabric_namespaces("k8-vni", "node-a") == []


def test_a_job_on_several_nodes_is_wired_only_with_the_overlay_id_the_operator_recorded():
    two_racks = job("k8-vni", replicas={"workers": 1},
                    network={"racks": [{"name": "a"}, {"name": "b"}],
                             "placement": {"ps-0": "a", "worker-0": "b"}})
    where = {"a": placement.NodeAddress("node-a", "node-a", "192.168.78.1"),
             "b": placement.NodeAddress("node-b", "node-b", "192.168.78.2")}
    pod = pod_event(SimpleNamespace(uid="u-1", replica="ps-0"), "Running", "k8-vni")
    recorded = training_job(two_racks, where)
    recorded["metadata"]["name"] = "k8-vni"
    assert admission.admit(pod, recorded).overlay_id == OVERLAY_ID
    del recorded["status"]["overlayId"]
    with pytest.raises(admission.Refused, match=r"not wired yet: .* \(status.overlayId\)"):
        admission.admit(pod, recorded)
    for wrong in (0, 2 ** 24, "7", True):
        recorded["status"]["overlayId"] = wrong
        with pytest.raises(admission.Refused, match=rf"status.overlayId={wrong!r}: not a "
                                                    r"VXLAN id \(1 to 16777215\)"):
            admission.admit(pod, recorded)
    with pytest.raises(errors.AgentError, match=r"recorded no VXLAN id"):
        wiring.build_fabric(K8S_NS, two_racks, False, "node-a", where, None)
    assert fabric_namespaces("k8-vni", "node-a") == []


@pytest.mark.netns
def test_a_pod_whose_process_is_in_the_nodes_network_namespace_is_refused_for_good(pods):
    """Wiring it would put tc0 and its shaping on the node itself: refused before
    anything is named or built, and recorded on the pod, so the operator fails the job
    at once with an event (not after the pod's 120 s)."""
    single = job("k8-hostns", replicas={"workers": 1})
    node_agent = make_agent(single)
    ps = pods("ps-0", own_netns=False)
    links_before = netns_links()
    with pytest.raises(admission.Denied, match=rf"k8-lab/k8-hostns-ps-0: not wired: its "
                                               rf"process {ps.pid} is in the node's network "
                                               "namespace"):
        node_agent.handle("ADDED", pod_event(ps, "Running", "k8-hostns"))
    recorded = node_agent.core.annotations["k8-hostns-ps-0"]
    assert recorded[resources.ANNOTATION_REFUSED] == recorded[resources.ANNOTATION_WIRING_ERROR]
    assert "in the node's network namespace" in recorded[resources.ANNOTATION_REFUSED]
    assert not netns.exists(ps.name) and not node_agent.fabrics and not node_agent.wired
    assert netns_links() == links_before
    # Its next event (the annotation's own) records nothing new.
    node_agent.core.annotations.clear()
    with pytest.raises(admission.Denied):
        node_agent.handle("MODIFIED", pod_event(ps, "Running", "k8-hostns"))
    assert node_agent.core.annotations == {}


def netns_links():
    with IPRoute() as ipr:
        return sorted(link.get_attr("IFLA_IFNAME") for link in ipr.get_links())


def test_a_refusal_for_good_is_recorded_on_the_pod_and_one_that_may_pass_is_not():
    single = job("k8-changed", replicas={"workers": 1})
    node_agent = make_agent(single)
    pod = pod_event(SimpleNamespace(uid="u-changed", replica="ps-0"), "Running", "k8-changed")
    node_agent.core.training_job["metadata"]["name"] = "k8-changed"
    del node_agent.core.training_job["status"]["specGeneration"]   # not recorded yet
    with pytest.raises(admission.NotYet):
        node_agent.handle("ADDED", pod)
    assert node_agent.core.annotations == {}
    node_agent.core.training_job["status"]["specGeneration"] = 1
    node_agent.core.training_job["metadata"]["generation"] = 2      # the spec changed
    with pytest.raises(admission.Denied, match=r"spec changed \(generation 2\)"):
        node_agent.handle("MODIFIED", pod)
    recorded = node_agent.core.annotations["k8-changed-ps-0"]
    assert recorded[resources.ANNOTATION_REFUSED].startswith(
        "node k8-node: k8-lab/k8-changed-ps-0: not wired: TrainingJob k8-lab/k8-changed's "
        "spec changed")


def test_a_placement_ip_that_is_no_address_is_refused_before_it_reaches_nftables():
    two_racks = job("k8-ip", replicas={"workers": 1},
                    network={"racks": [{"name": "a"}, {"name": "b"}],
                             "placement": {"ps-0": "a", "worker-0": "b"}})
    pod = pod_event(SimpleNamespace(uid="u-ip", replica="ps-0"), "Running", "k8-ip")
    recorded = training_job(two_racks, {
        "a": placement.NodeAddress("node-a", "node-a", "192.168.78.1"),
        "b": placement.NodeAddress("node-b", "node-b", "192.168.78.2")})
    recorded["metadata"]["name"] = "k8-ip"
    recorded["status"]["placement"]["b"]["ip"] = "1.2.3.4 } accept; add rule ip x y {"
    with pytest.raises(admission.Denied, match=r"status.placement.b.ip='1.2.3.4 } accept.*': "
                                               "not an IPv4 address"):
        admission.admit(pod, recorded)


INJECT_PORT = 5299


def vxlan_frame(vni, src_ip, dst_ip, payload=b"inject"):
    """A VXLAN packet's UDP payload: the VXLAN header of `vni` and an Ethernet frame
    from spine 1 to spine 0 (node-b's and node-a's vx0) carrying a UDP datagram from
    `src_ip` to `dst_ip`:INJECT_PORT."""
    udp = struct.pack("!HHHH", 40000, INJECT_PORT, 8 + len(payload), 0) + payload
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0,
                         socket.inet_aton(src_ip), socket.inet_aton(dst_ip))
    words = sum(struct.unpack("!10H", header))
    while words >> 16:
        words = (words & 0xFFFF) + (words >> 16)
    header = header[:10] + struct.pack("!H", ~words & 0xFFFF) + header[12:]
    spine_a, spine_b = (bytes.fromhex(overlay.Spine(i, "", ()).mac.replace(":", ""))
                        for i in (0, 1))
    ethernet = spine_a + spine_b + b"\x08\x00"
    return struct.pack("!II", 0x08000000, vni << 8) + ethernet + header + udp


def inject(from_ns, src_ip, node_ip, frame, pod_ns, count=20):
    """How many of `count` copies of `frame`, sent from `src_ip` in `from_ns` to the
    VXLAN port of `node_ip`, reach a receiver in `pod_ns`."""
    rx = netutil.start(pod_ns, netutil.UDP_RECEIVER.format(port=INJECT_PORT))
    netutil._wait_ready(rx)
    with netns.entered(from_ns):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        tx.bind((src_ip, 0))
        for _ in range(count):
            tx.sendto(frame, (node_ip, overlay.VXLAN_PORT))
    finally:
        tx.close()
    return int(netutil._finish(rx, 30))


@pytest.mark.netns
def test_a_lossy_link_drops_both_ways_and_pins_the_neighbours(pods, agents):
    lossy = job("k8-loss", replicas={"workers": 1},
                network={"accessLink": {"bandwidth": "1Gbit", "loss": 0.2}})
    topo = topology.plan(lossy)
    node_agent = agents(lossy)
    ps, worker = pods("ps-0"), pods("worker-0")
    for pod in (ps, worker):
        node_agent.handle("ADDED", pod_event(pod, "Running", "k8-loss"))
    # Two lossy hops (worker -> rack, rack -> ps): about 64% arrive, never all.
    got = netutil.udp_delivered(worker.name, ps.name, topo.pod("ps-0").ip, 2000)
    assert 0.5 * 2000 < got < 0.8 * 2000, got
    neighbours = in_pod(worker, "ip", "neigh", "show", "dev", "tc0")
    assert f"{topo.pod('ps-0').ip} " in neighbours and "PERMANENT" in neighbours
    assert "gso_max_segs 1" in node_agent.wired[worker.uid].description


@pytest.mark.netns
def test_a_pod_with_other_links_down_is_wired_without_waiting_for_them(pods, agents):
    """A CNI may leave tunnel devices down in every pod's namespace: not ours."""
    node_agent = agents(job("k8-extra"))
    ps = pods("ps-0")
    with IPRoute(netns=f"/proc/{ps.pid}/ns/net") as ipr:
        ipr.link("add", ifname="extra0", kind="veth", peer="extra1")   # left down
    started = time.monotonic()
    node_agent.handle("ADDED", pod_event(ps, "Running", "k8-extra"))
    assert ps.uid in node_agent.wired and time.monotonic() - started < 4


@pytest.mark.netns
def test_agent_refuses_host_network_pods_unless_told_otherwise(pods, agents):
    node_agent = agents(None)
    event = pod_event(pods("ps-0"), "Running")
    event.spec.host_network = True
    node_agent.handle("ADDED", event)
    assert not node_agent.wired


def test_a_pod_whose_replica_label_names_no_pod_of_the_job_is_refused():
    node_agent = make_agent(job("k8-label"))
    pod = SimpleNamespace(uid=str(uuid.uuid4()), replica="worker-7")
    with pytest.raises(admission.Refused, match=r"label tailcut.dev/replica='worker-7' "
                                               r"names no pod of job k8-label"):
        node_agent.handle("ADDED", pod_event(pod, "Running", "k8-label"))


# --- spec.scheduling: cadentflow priority classes and classifier on both ends ---

def cadentflow_job(name, scheduling, **extra):
    return job(name, network={"accessLink": {"bandwidth": "100Mbit"}},
               training={"model": "deep-mlp"}, scheduling=scheduling, **extra)


def tc_state(ns, ifname):
    """An egress as tc sees it: qdisc kinds, HTB class ids (1:xx) with their bytes
    sent, and the BPF filters' (name, program id)."""
    with netns.ipr(ns) as ipr:
        index = ipr.link_lookup(ifname=ifname)[0]
        kinds = sorted(q.get_attr("TCA_KIND") for q in ipr.get_qdiscs(index))
        classes = {f"1:{c['handle'] & 0xFFFF:x}":
                   c.get_attr("TCA_STATS2").get_attr("TCA_STATS_BASIC")["bytes"]
                   for c in ipr.get_classes(index=index)}
    shown = subprocess.run(["ip", "netns", "exec", ns, "tc", "-j", "filter", "show", "dev",
                            ifname, "egress"], capture_output=True, text=True).stdout
    filters = [(f["options"]["bpf_name"], f["options"]["prog"]["id"])
               for f in json.loads(shown or "[]") if "options" in f]
    return kinds, classes, filters


def prog_loaded(prog_id):
    return subprocess.run(["bpftool", "prog", "show", "id", str(prog_id)],
                          capture_output=True).returncode == 0


def prog_unloaded(prog_id):
    """True once program `prog_id` is gone. Deleting the last tc filter that holds a
    program frees it after an RCU grace period, so its id can outlive the delete."""
    return waiting.until(lambda: not prog_loaded(prog_id))


def send_tagged_udp(from_ns, to_ip, level, count):
    """`count` datagrams from namespace `from_ns` to `to_ip` with the DSCP of `level`."""
    import socket

    from tailcut.datapath import classifier

    with netns.entered(from_ns):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, classifier.tos_of(level))
        for _ in range(count):
            s.sendto(b"x" * 200, (to_ip, 9))
    finally:
        s.close()


@pytest.mark.netns
@pytest.mark.bpf
def test_agent_puts_cadentflow_classes_and_classifiers_on_both_ends_and_removes_them(
        pods, agents):
    cf = cadentflow_job("k8-cf", {"policy": "cadentflow", "priorityLevels": 3},
                        replicas={"workers": 1})
    topo = topology.plan(cf)
    node_agent = agents(cf)
    ps, worker = pods("ps-0"), pods("worker-0")
    for pod in (ps, worker):
        node_agent.handle("MODIFIED", pod_event(pod, "Running", "k8-cf"))
    rack = "tck8s-k8-lab.k8-cf@k8-node.rack-0"
    ends = [(worker.name, "tc0"), (rack, "p0"), (rack, "up"),
            ("tck8s-k8-lab.k8-cf@k8-node.spine", "r0")]
    programs = []
    for ns, ifname in ends:
        kinds, classes, filters = tc_state(ns, ifname)
        assert sorted(classes) == ["1:1", "1:10", "1:20", "1:21", "1:22"], (ns, ifname)
        assert "clsact" in kinds and "htb" in kinds
        programs += [prog_id for name, prog_id in filters if name.startswith("tailcut_classify")]
    assert len(programs) == 4 and all(prog_loaded(p) for p in programs)
    wired = node_agent.wired[worker.uid]
    assert "cadentflow" in wired.description and "1:22 prio 2" in wired.description

    # The rack's port towards ps-0 (slot 0) classifies what the worker sends it.
    ps_port_before = tc_state(rack, "p0")[1]
    send_tagged_udp(worker.name, topo.pod("ps-0").ip, level=1, count=200)
    assert waiting.until(lambda: tc_state(rack, "p0")[1]["1:21"] - ps_port_before["1:21"]
                         >= 200 * 200), "tagged packets went to 1:21 on the way in"
    assert re.search(r"level 1 2\d\d\b", wiring.classified(wired)), wiring.classified(wired)

    node_agent.handle("MODIFIED", pod_event(worker, "Succeeded", "k8-cf"))
    node_agent.handle("DELETED", pod_event(ps, "Running", "k8-cf"))
    assert not node_agent.wired and not fabric_namespaces("k8-cf")
    assert all(prog_unloaded(p) for p in programs), "every classifier program is unloaded"
    assert worker.proc.poll() is None, "releasing must not end the pod"


@pytest.mark.netns
def test_agent_adds_no_classes_for_fair(pods, agents):
    node_agent = agents(cadentflow_job("k8-fair", {"policy": "fair"}))
    ps = pods("ps-0")
    node_agent.handle("ADDED", pod_event(ps, "Running", "k8-fair"))
    kinds, classes, filters = tc_state(ps.name, "tc0")
    assert sorted(classes) == ["1:1", "1:10"] and filters == [] and kinds == ["htb"]
    assert node_agent.wired[ps.uid].description == (
        "ps-0/tc0: htb 100 Mbit/s, gso_max_size 32768; "
        "rack-0/p0: htb 100 Mbit/s, gso_max_size 32768")


@pytest.mark.netns
@pytest.mark.bpf
def test_agent_stopping_releases_every_pod_and_fabric(pods, agents):
    node_agent = agents(cadentflow_job("k8-stop", {"policy": "cadentflow"}))
    ps = pods("ps-0")
    node_agent.handle("ADDED", pod_event(ps, "Running", "k8-stop"))
    [(_, prog_id)] = tc_state(ps.name, "tc0")[2]
    node_agent.release_all()
    assert not node_agent.wired and not node_agent.fabrics
    assert fabric_namespaces("k8-stop") == [] and "tc0" not in in_pod(ps, "ip", "link")
    assert prog_unloaded(prog_id)


def test_agent_refuses_a_policy_it_cannot_enforce_naming_the_field():
    node_agent = make_agent(cadentflow_job(
        "ks-appdrop", {"policy": "cadentflow"}, transport={"type": "app-drop", "p": 0.9}),
        node="ks-node")
    pod = SimpleNamespace(uid=str(uuid.uuid4()), replica="ps-0")
    with pytest.raises(admission.Refused, match=r"spec.scheduling.policy='cadentflow' with "
                                               r"spec.transport.type='app-drop'"):
        node_agent.handle("ADDED", pod_event(pod, "Running", "ks-appdrop"))
    assert not node_agent.wired


@pytest.mark.netns
def test_a_failure_to_wire_is_recorded_on_the_pod_once_and_cleared_when_wiring_passes(
        pods, agents, monkeypatch):
    """For the operator to put in the job's status and an Event (the agent's log is not
    where a job's owner looks)."""
    j = job("k8-fails", replicas={"workers": 1})
    node_agent = agents(j)
    ps = pods("ps-0")
    patches = []
    record = node_agent.core.patch_namespaced_pod_status
    monkeypatch.setattr(node_agent.core, "patch_namespaced_pod_status",
                        lambda *a: patches.append(a) or record(*a))
    built = wiring.build_fabric

    def broken(*args, **kwargs):
        raise errors.AgentError("the spine's bridge could not be made")
    monkeypatch.setattr(wiring, "build_fabric", broken)
    for _ in range(2):   # the second attempt fails alike: recorded once
        with pytest.raises(errors.AgentError):
            node_agent.handle("MODIFIED", pod_event(ps, "Running", "k8-fails"))
    said = node_agent.core.annotations["k8-fails-ps-0"][resources.ANNOTATION_WIRING_ERROR]
    assert said == ("node k8-node: AgentError: the spine's bridge could not be made")
    assert len(patches) == 1
    assert resources.wiring_errors_from_pods([{
        "metadata": {"labels": {resources.LABEL_REPLICA: "ps-0"},
                     "annotations": node_agent.core.annotations["k8-fails-ps-0"]}}]) == {
        "ps-0": said}
    monkeypatch.setattr(wiring, "build_fabric", built)
    node_agent.handle("MODIFIED", pod_event(ps, "Running", "k8-fails"))
    recorded = node_agent.core.annotations["k8-fails-ps-0"]
    assert recorded[resources.ANNOTATION_WIRING_ERROR] is None   # removed (merge patch)
    assert resources.ANNOTATION_NETWORK in recorded


@pytest.mark.bpf
def test_agent_loads_the_in_network_programs_the_operator_resolved_and_serves_each_pod(
        pods, agents):
    """The same contract as `tailcut run`: the programs of the job's status.inNetwork
    on the racks of this node, each pod's port served as it is wired, released as it
    goes; a PARAMS from the PS reaches both workers of the other rack."""
    from tailcut.k8s.manifests import policy
    from tailcut.transports import mcast as wire_mcast
    from tailcut.transports import wire
    from tailcut.transports.hot import SO_NO_CHECK

    copied = job("k8-mc", replicas={"workers": 2},
                 network={"racks": [{"name": "a"}, {"name": "b"}],
                          "placement": {"ps-0": "a", "worker-0": "b", "worker-1": "b"},
                          "inNetwork": {"multicast": True}})
    node_agent = agents(copied)
    node_agent.jobs.training_job["status"]["inNetwork"] = policy.in_network_data(copied)
    ps, w0, w1 = pods("ps-0"), pods("worker-0"), pods("worker-1")
    for pod in (ps, w0, w1):
        node_agent.handle("MODIFIED", pod_event(pod, "Running", "k8-mc"))
    fabric = node_agent.fabrics[(K8S_NS, "k8-mc")]
    [feature] = fabric.tor
    assert feature.name == "multicast"
    links = json.loads(node_agent.core.annotations["k8-mc-worker-0"][
        resources.ANNOTATION_NETWORK])
    assert "multicast (to workers of rack 1 at 10.2.0.252)" in links["rack-1/up"]

    elements = json.loads(policy.in_network_data(copied))["multicast"]["elements"]
    with netns.entered(ps.name):
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        tx.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
        tx.sendto(wire_mcast.packet(1, job=wire.job_id("k8-mc"), iteration=0, slot=0,
                                    payload=bytes(4 * 360), count=360), ("10.2.0.252", 7102))
    finally:
        tx.close()
    assert elements > 360
    assert waiting.until(
        lambda: feature.summary()["rack-1"]["copies"] == {"p0": 1, "p1": 1}), \
        feature.summary()   # one copy out of each worker's port
    node_agent.handle("DELETED", pod_event(w1, "Running", "k8-mc"))   # released, counted
    assert feature.summary()["rack-1"]["copies"] == {"p0": 1, "p1": 1}
    node_agent.release_all()
    assert not node_agent.fabrics and fabric_namespaces("k8-mc") == []
