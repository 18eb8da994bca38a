"""What a kind user meets who skips the two steps scripts/kind-up.sh takes (a Docker
network of MTU 1550, the host's /usr/src mounted into every node): tcnode-2 of the
session's cluster looks like a kind node as kind's defaults make it (LAN MTU 1500, an
empty /usr/src; tailcut.k8s.node.layout). It is cordoned for the other tests; each
test here makes the nodes it names, and only those, schedulable while its jobs are
placed (the operator places racks on schedulable nodes: tailcut.k8s.manifests.placement)."""

import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tests.cluster import chart
from tests.cluster.conftest import KIND_NODE
from tests.waiting import until

pytestmark = [pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]
PODS_WAIT_FOR_TC0_S = 120   # workers/entrypoint.py: what a job would take to fail without


@contextmanager
def schedulable_only(cluster, names: set[str]):
    for node in cluster.nodes:
        cluster.kubectl("uncordon" if node.name in names else "cordon", node.name)
    try:
        yield
    finally:
        for node in cluster.nodes:
            cluster.kubectl("cordon" if node.kind_like else "uncordon", node.name)


def job(example: str, name: str, **network) -> str:
    raw = yaml.safe_load((REPO / "examples" / example).read_text())
    raw["metadata"]["name"] = name
    raw["spec"]["network"].update(network)
    return yaml.safe_dump(raw)


def failed_condition(status: dict) -> dict:
    return {c["type"]: c for c in status["conditions"]}["Failed"]


def events(cluster, namespace: str, name: str) -> dict[str, str]:
    """reason -> message of the Warning events on TrainingJob `name`."""
    found = chart.get(cluster, namespace, "events", "--field-selector",
                      f"involvedObject.name={name},type=Warning") or {"items": []}
    return {e["reason"]: e["message"] for e in found["items"]}


def test_a_job_across_a_kind_node_of_mtu_1500_fails_at_once_naming_the_mtu_and_runs_at_1450(
        cluster, release, namespace):
    """The quickstart's racks on tcnode-0 and the kind-like node: its spines would
    talk VXLAN, 1550-byte packets, over a link of 1500. The agent there refuses before
    building anything, naming spec.network.mtu, the link and the fix, and the job
    fails at once (not when its pods give up waiting for tc0). At spec.network.mtu
    1450, as the message says, the same job succeeds across the same nodes."""
    with schedulable_only(cluster, {"tcnode-0", KIND_NODE}):
        started = time.monotonic()
        cluster.kubectl("-n", namespace, "apply", "-f", "-",
                        input=job("quickstart.yaml", "mtu"))
        status = chart.wait_phase(cluster, namespace, "mtu", "Failed", within_s=90)
        took_s = time.monotonic() - started
        failed = failed_condition(status)
        assert failed["reason"] == "NodeUnfit", failed
        message = failed["message"]
        for said in ("spec.network.mtu is 1500", f"node {KIND_NODE} reaches",
                     "lan0 of MTU 1500", "short of the 1550 needed",
                     "set spec.network.mtu to 1450 or less", "scripts/kind-up.sh"):
            assert said in message, message
        assert took_s < PODS_WAIT_FOR_TC0_S / 2, took_s
        # (the Warning event is posted just after the status: wait for it)
        assert until(lambda: "NodeUnfit" in events(cluster, namespace, "mtu"), within_s=15,
                     every_s=0.5), events(cluster, namespace, "mtu")
        # Its pods, wired on tcnode-0 or never on the kind-like node, end now too (the
        # operator lowers their deadline), not when they give up waiting for their peers
        # or their tc0. Within seconds, measured; the bound leaves room for one pod
        # stopped in its interpreter's first instants, before its SIGTERM handler, whom
        # the kubelet kills after its 30 s of grace.
        def pods():
            return chart.get(cluster, namespace, "pods", "-l", "tailcut.dev/job=mtu")["items"]
        assert until(lambda: all(p["status"].get("phase") in ("Succeeded", "Failed")
                                 for p in pods()), within_s=45, every_s=1), [
            (p["metadata"]["name"], p["spec"].get("nodeName"), p["status"].get("phase"),
             p["spec"].get("activeDeadlineSeconds")) for p in pods()]
        cluster.kubectl("-n", namespace, "apply", "-f", "-",
                        input=job("quickstart.yaml", "mtu-1450", mtu=1450))
        status = chart.wait_phase(cluster, namespace, "mtu-1450", "Succeeded")
    network = status["network"]
    assert {"spine@tcnode-0/vx0", f"spine@{KIND_NODE}/vx0"} <= set(network), network
    nodes = {p["spec"]["nodeName"] for p in chart.get(
        cluster, namespace, "pods", "-l", "tailcut.dev/job=mtu-1450")["items"]}
    assert nodes == {"tcnode-0", KIND_NODE}, nodes
    assert status["accuracy"] >= 0.93


def test_a_bounded_loss_job_on_a_kind_node_without_kernel_headers_fails_at_once_naming_usr_src(
        cluster, release, namespace):
    """Both racks on the kind-like node, whose /usr/src is empty: BCC would find no
    headers. examples/bounded-loss.yaml's lossy access links need the agent's eBPF
    dropper: the agent refuses the pods and the job fails at once (NodeUnfit). Without
    the loss, the agent wires the pods and each receiver's own XDP counter cannot be
    compiled: the pods fail, and the job with them (PodFailed). Both messages name
    the missing headers and the kind config's mount of /usr/src."""
    cluster.kubectl("label", "namespace", namespace, "tailcut.dev/bounded-loss=allowed")
    with schedulable_only(cluster, {KIND_NODE}):
        cluster.kubectl("-n", namespace, "apply", "-f", "-",
                        input=job("bounded-loss.yaml", "bl-lossy"))
        lossy = failed_condition(chart.wait_phase(cluster, namespace, "bl-lossy", "Failed",
                                                  within_s=90))
        lossless = yaml.safe_load(job("bounded-loss.yaml", "bl"))
        del lossless["spec"]["network"]["accessLink"]["loss"]
        cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(lossless))
        own = failed_condition(chart.wait_phase(cluster, namespace, "bl", "Failed",
                                                within_s=90))
    assert lossy["reason"] == "NodeUnfit", lossy
    assert "dropper" in lossy["message"], lossy["message"]
    assert own["reason"] == "PodFailed", own
    assert "partial" in own["message"] or "xdp" in own["message"].lower(), own["message"]
    for failed in (lossy, own):
        for said in ("headers of the running kernel", "/usr/src", "extraMounts",
                     "scripts/kind-up.sh"):
            assert said in failed["message"], failed["message"]
