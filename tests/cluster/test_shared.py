"""tailcut on a shared cluster, as a platform engineer would install it: Pod Security
levels enforced per namespace, a quota on requests, bounded-loss pods only where a
namespace opted in, a chart upgrade that leaves running agents alone, the service
accounts' privileges as docs/kubernetes.md tables them, and nothing built or changed
for what an ordinary user makes with tailcut's labels and names."""

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tailcut.k8s.manifests import resources
from tailcut.k8s.node import images
from tailcut.net import netns, overlay
from tests.cluster import chart
from tests.cluster.conftest import CHART
from tests.conftest import tailcut_objects
from tests.k8s import test_privileges as privileges
from tests.waiting import until

pytestmark = [pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]


def quickstart(name: str, **spec_changes) -> str:
    raw = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())
    raw["metadata"]["name"] = name
    raw["spec"].update(spec_changes)
    return yaml.safe_dump(raw)


def test_a_tcp_job_succeeds_in_a_restricted_namespace_whose_quota_demands_requests(
        cluster, release, namespace):
    """Pod Security's restricted level enforced, and a ResourceQuota on CPU and memory
    requests (which refuses any pod that states none): the quickstart's pods are
    admitted, wired and the job succeeds."""
    cluster.kubectl("label", "namespace", namespace,
                    "pod-security.kubernetes.io/enforce=restricted")
    cluster.kubectl("-n", namespace, "create", "quota", "requests",
                    "--hard=requests.cpu=4,requests.memory=8Gi")
    # The quota is enforced once the controller-manager has filled in its status: a
    # restricted-level pod that states no requests is then refused.
    no_requests = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
                   "spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                                "seccompProfile": {"type": "RuntimeDefault"}},
                            "containers": [{"name": "c", "image": "x", "securityContext": {
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}}}]}}
    def refused() -> str:
        out = cluster.kubectl("-n", namespace, "create", "--dry-run=server", "-f", "-",
                              input=json.dumps(no_requests), check=False)
        return out.stderr if out.returncode else ""
    assert until(lambda: "must specify requests" in refused(), within_s=60, every_s=1), \
        refused()
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=quickstart("rs"))
    status = chart.wait_phase(cluster, namespace, "rs", "Succeeded")
    assert status["replicaStatuses"]["Worker"]["succeeded"] == 4
    assert status["network"]["ps-0/tc0"].startswith("htb 1000 Mbit/s"), status["network"]


def test_a_bounded_loss_job_where_the_namespace_has_not_opted_in_fails_at_once(
        cluster, release, namespace):
    cluster.kubectl("-n", namespace, "apply", "-f", "-",
                    input=quickstart("bl", transport={"type": "bounded-loss", "p": 0.9}))
    status = chart.wait_phase(cluster, namespace, "bl", "Failed", within_s=30)
    failed = {c["type"]: c for c in status["conditions"]}["Failed"]
    assert failed["reason"] == "BoundedLossNotAllowed"
    assert "tailcut.dev/bounded-loss=allowed" in failed["message"], failed["message"]
    assert not chart.owned_objects(cluster, namespace, "bl")


def component_pods(cluster) -> dict[str, str]:
    """name -> uid of the chart's operator and agent pods."""
    pods = chart.get(cluster, chart.RELEASE_NS, "pods", "-l",
                     "app.kubernetes.io/name=tailcut")["items"]
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods
            if p["metadata"]["labels"].get("app.kubernetes.io/component") != "test"}


def test_helm_upgrade_to_a_new_chart_version_restarts_no_agent(cluster, release, tmp_path):
    """A chart version bump that changes nothing the pods run: the DaemonSet's and the
    Deployment's pod templates are unchanged (their generation stays), and every agent
    and operator pod is the one that ran before."""
    def generations():
        return {kind: chart.get(cluster, chart.RELEASE_NS, kind, name)["metadata"]["generation"]
                for kind, name in (("daemonset", "tailcut-agent"),
                                   ("deployment", "tailcut-operator"))}
    before, generations_before = component_pods(cluster), generations()
    bumped = tmp_path / "tailcut"
    shutil.copytree(CHART, bumped)
    meta = yaml.safe_load((bumped / "Chart.yaml").read_text())
    meta["version"] = meta["version"] + "-upgrade.1"
    meta["appVersion"] = str(meta["appVersion"]) + "-upgrade.1"
    (bumped / "Chart.yaml").write_text(yaml.safe_dump(meta))
    try:
        chart.helm(cluster, "upgrade", chart.RELEASE, str(bumped), "--namespace",
                   chart.RELEASE_NS, "--wait", "--timeout", "2m")
        listed = json.loads(chart.helm(cluster, "list", "-n", chart.RELEASE_NS, "-o",
                                       "json").stdout)
        assert listed[0]["chart"] == f"tailcut-{meta['version']}", listed
        assert generations() == generations_before
        assert component_pods(cluster) == before
        ds = chart.get(cluster, chart.RELEASE_NS, "daemonset", "tailcut-agent")
        assert ds["metadata"]["labels"]["helm.sh/chart"] == f"tailcut-{meta['version']}"
    finally:   # the session's other tests expect the chart as it is
        chart.helm(cluster, "upgrade", chart.RELEASE, str(CHART), "--namespace",
                   chart.RELEASE_NS, "--wait", "--timeout", "2m")
    assert component_pods(cluster) == before


def test_an_agent_that_cannot_wire_a_pod_says_so_in_the_jobs_status_and_an_event(
        cluster, release, namespace, tmp_path):
    """What a kind node without the host's /usr/src meets: the agent's mount of it is
    empty, BCC finds no kernel headers for a lossy link's dropper, and the job's owner
    reads why in status.wiringErrors and a WiringFailed event, not in the agent's log."""
    empty = tmp_path / "no-headers"
    empty.mkdir()
    chart.helm(cluster, "upgrade", chart.RELEASE, str(CHART), "--namespace",
               chart.RELEASE_NS, "--reuse-values", "--set",
               f"agent.hostPaths.headers={empty}", "--wait", "--timeout", "3m")
    try:
        lossy = yaml.safe_load(quickstart("nohdr"))
        lossy["spec"]["network"].setdefault("accessLink", {})["loss"] = 0.01
        cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(lossy))

        def wiring_errors():
            body = chart.get(cluster, namespace, "trainingjob", "nohdr") or {}
            return (body.get("status") or {}).get("wiringErrors")
        assert until(wiring_errors, within_s=180, every_s=1), chart.get(
            cluster, namespace, "trainingjob", "nohdr")
        errors = wiring_errors()
        assert all(said.startswith("node tcnode-") for said in errors.values()), errors
        def warned():
            return [e for e in chart.get(cluster, namespace, "events")["items"]
                    if e["reason"] == "WiringFailed" and e["type"] == "Warning"
                    and e["involvedObject"]["name"] == "nohdr"]
        assert until(warned, within_s=30, every_s=1), chart.get(cluster, namespace, "events")
        cluster.kubectl("-n", namespace, "delete", "trainingjob", "nohdr", "--wait=false")
    finally:
        chart.helm(cluster, "upgrade", chart.RELEASE, str(CHART), "--namespace",
                   chart.RELEASE_NS, "--reset-values", *chart.runtime_state_values(cluster),
                   "--wait", "--timeout", "3m")


# A tenant's pod holding up to 3,000 idle connections to its node's agent (its
# /metrics port, on the node's address) for 30 s, opening new ones as the agent closes
# old ones; what it opened is in its log.
IDLER = """
import os, resource, socket, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
target = (os.environ["NODE_IP"], {port})
want = min({count}, hard - 64)
socks, opened = [], 0
end = time.monotonic() + {hold_s}
while time.monotonic() < end:
    alive = []
    for s in socks:
        try:
            if s.recv(1) == b"":   # the agent closed it
                s.close()
                continue
        except BlockingIOError:    # open and idle
            pass
        except OSError:
            s.close()
            continue
        alive.append(s)
    socks = alive
    while len(socks) < want:
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(target)
        socks.append(s)
        opened += 1
    time.sleep(1)
print(f"opened {{opened}} connections, up to {{want}} at once", flush=True)
"""


def process_figures(pid: int) -> tuple[int, int]:
    """(threads, open descriptors) of a process on this host."""
    threads = next(int(line.split()[1]) for line in
                   Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("Threads:"))
    return threads, len(list(Path(f"/proc/{pid}/fd").iterdir()))


def agent_health(pid: int, port: int = 9109) -> str:
    """/healthz as the kubelet asks it: on the node's loopback (the agent's network)."""
    probe = (f"import urllib.request; print(urllib.request.urlopen("
             f"'http://127.0.0.1:{port}/healthz', timeout=5).read().decode().strip())")
    done = subprocess.run(["nsenter", "-t", str(pid), "-n", "python3", "-c", probe],
                          capture_output=True, text=True, timeout=30)
    return done.stdout.strip() or done.stderr.strip()[-300:]


AGENT_THREADS, AGENT_DESCRIPTORS = 8, 32   # a steady agent's, at most (4 and 12 seen)


def test_thousands_of_idle_connections_from_a_pod_neither_stop_the_agent_nor_fail_a_job(
        cluster, release, namespace):
    """What issue 44 showed: 2,813 idle connections from a pod had the agent
    OOM-killed. Now, while a quickstart trains across both nodes, a pod holds 3,000 to
    its node's agent: every agent stays up (same pods, no restart, /healthz answers on
    the node's loopback), keeps its threads and at most its cap of connections, and the
    job succeeds."""
    def agent_pods():
        return {p["metadata"]["name"]: (p["metadata"]["uid"],
                                        sum(c["restartCount"] for c in
                                            p["status"]["containerStatuses"]),
                                        bool(p["metadata"].get("deletionTimestamp")))
                for p in chart.get(cluster, chart.RELEASE_NS, "pods", "-l",
                                   "app.kubernetes.io/component=agent")["items"]
                if p["status"].get("containerStatuses")}

    # One steady agent a node: an agent pod an earlier test deleted may still be
    # terminating beside its replacement (the DaemonSet's), and would leave the list.
    assert until(lambda: len(pods := agent_pods()) == len(cluster.nodes)
                 and not any(terminating for *_, terminating in pods.values()),
                 within_s=120, every_s=1)
    before = agent_pods()
    pids = agent_pids()
    figures_before = {pid: process_figures(pid) for pid in pids}
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=quickstart("qs-idle"))
    idler = user_pod("idler", {}, IDLER.format(port=9108, count=3000, hold_s=30))
    idler["spec"]["containers"][0]["env"] = [
        {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}]
    cluster.kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump(idler))
    chart.wait_pod_running(cluster, namespace, "idler")
    time.sleep(15)   # the connections are open by now
    during = {pid: process_figures(pid) for pid in pids}
    health = {pid: agent_health(pid) for pid in pids}
    assert until(lambda: (chart.get(cluster, namespace, "pod", "idler") or {}).get(
        "status", {}).get("phase") in ("Succeeded", "Failed"), within_s=90, every_s=1)
    said = cluster.kubectl("-n", namespace, "logs", "idler").stdout
    print(f"{said.strip()}; agents (threads, descriptors) before {figures_before}, "
          f"during {during}")
    assert int(said.split()[1]) >= 3000, said
    assert all(v == "ok" for v in health.values()), health
    for pid in pids:
        # A thread (and descriptor) per connection would show thousands. An agent that
        # has just (re)started may not have all its own threads yet when `before` is
        # read (1 thread then 4 was seen), so the bound counts a steady agent's few.
        threads, fds = during[pid]
        base_threads, base_fds = (max(figures_before[pid][0], AGENT_THREADS),
                                  max(figures_before[pid][1], AGENT_DESCRIPTORS))
        assert threads <= base_threads + 2, (pid, figures_before[pid], during[pid])
        assert fds <= base_fds + 64 + 16, (pid, figures_before[pid], during[pid])
    chart.wait_phase(cluster, namespace, "qs-idle", "Succeeded")
    assert agent_pods() == before, "an agent restarted"


# --- what an ordinary user of the cluster can make with tailcut's labels ---

USER = "researcher"


def as_user(cluster, namespace: str, *args: str, **kw):
    """kubectl as a service account bound to Kubernetes' `edit` role in `namespace`:
    pods and config maps, not TrainingJobs' status nor anything cluster-wide."""
    return cluster.kubectl("--as", f"system:serviceaccount:{namespace}:{USER}",
                           "-n", namespace, *args, **kw)


def make_user(cluster, namespace: str) -> None:
    cluster.kubectl("-n", namespace, "create", "serviceaccount", USER)
    cluster.kubectl("-n", namespace, "create", "rolebinding", USER, "--clusterrole=edit",
                    f"--serviceaccount={namespace}:{USER}")
    assert as_user(cluster, namespace, "auth", "can-i", "create", "pods").stdout.strip() \
        == "yes"


def user_pod(name: str, labels: dict, script: str, **meta) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels, **meta},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "c", "image": images.ref("worker"), "imagePullPolicy": "Never",
                "command": ["python", "-c", script]}]}}


def agent_pids() -> list[int]:
    """The node agents' processes on this host (every node's agent runs here)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and b"tailcut.k8s.agent" in args:
            pids.append(int(entry.name))
    return pids


def as_agents_see(*argv: str) -> dict[int, str]:
    """`argv`'s output inside each agent's mount namespace, where it names the
    namespaces it builds (tailcut.k8s.agent): the host's /run/netns does not show them."""
    return {pid: subprocess.run(["nsenter", "-t", str(pid), "-m", *argv],
                                capture_output=True, text=True).stdout
            for pid in agent_pids()}


def agents_namespaces() -> set[str]:
    return {f"{pid}:{name}" for pid, out in as_agents_see("ls", "/run/netns").items()
            for name in out.split()}


def vxlan_ids() -> set[int]:
    """The VNIs of every VXLAN device in every namespace the agents or the host named
    (nodes, spines, racks, pods) and in the host's own."""
    found: set[int] = set()
    listing = ["ip", "-d", "-j", "link", "show", "type", "vxlan"]
    outputs = [subprocess.run(listing, capture_output=True, text=True).stdout]
    outputs += [subprocess.run(["ip", "-n", name, *listing[1:]], capture_output=True,
                               text=True).stdout for name in netns.list_names()]
    for pid, name in (each.split(":", 1) for each in agents_namespaces()):
        outputs.append(subprocess.run(["nsenter", "-t", pid, "-m", "ip", "-n", name,
                                       *listing[1:]], capture_output=True, text=True).stdout)
    for out in outputs:
        for link in json.loads(out or "[]"):
            found.add(int(link.get("linkinfo", {}).get("info_data", {}).get("id", -1)))
    return found


def test_a_pod_and_config_map_an_ordinary_user_makes_with_a_jobs_labels_get_nothing_built(
        cluster, release, namespace):
    """What issue 21 found: a ConfigMap holding a quickstart spec and a sleeping pod
    with the job label and the annotation the agent once read the spec from, in a
    namespace with no TrainingJob, got a spine, racks and a wired tc0 within 20 s.
    Now the agent of the pod's node refuses it (its log names the pod and why), and
    no node has a namespace, a BPF program or a VXLAN more than before. The spec's
    access links are lossy, so a fabric built from it would load the eBPF dropper."""
    make_user(cluster, namespace)
    assert len(agent_pids()) == len(cluster.nodes), agent_pids()
    assert shutil.which("bpftool"), "the BPF programs are listed with bpftool"
    before_netns = agents_namespaces()
    before_bpf = tailcut_bpf_programs()
    lossy = yaml.safe_load(quickstart("forged"))
    lossy["spec"]["network"].setdefault("accessLink", {})["loss"] = 0.01
    spec_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "forged-spec"},
                "data": {resources.SPEC_KEY: yaml.safe_dump(lossy),
                         "placement.json": json.dumps({"rack-0": {"ip": "203.0.113.9"}})}}
    labels = {resources.LABEL_JOB: "forged", resources.LABEL_REPLICA: "ps-0",
              resources.LABEL_ROLE: "ps", resources.LABEL_RACK: "rack-0"}
    pod = user_pod("forged-ps-0", labels, "import time; time.sleep(300)",
                   annotations={"tailcut.dev/spec-configmap": "forged-spec"})
    as_user(cluster, namespace, "apply", "-f", "-", input=yaml.safe_dump_all([spec_map, pod]))
    node = chart.wait_pod_running(cluster, namespace, "forged-ps-0")["spec"]["nodeName"]
    refusal = f"{namespace}/forged-ps-0: "
    assert until(lambda: refusal in chart.agent_log(cluster, node), within_s=30, every_s=1), \
        chart.agent_log(cluster, node)[-3000:]
    said = next(line for line in chart.agent_log(cluster, node).splitlines() if refusal in line)
    assert "no controller" in said, said
    time.sleep(5)   # what the agent built in 20 s then, it would have built by now
    assert agents_namespaces() - before_netns == set()
    assert tailcut_bpf_programs() - before_bpf == set()
    assert overlay.vni(f"{namespace}/forged") not in vxlan_ids()
    annotations = chart.get(cluster, namespace, "pod", "forged-ps-0")["metadata"].get(
        "annotations") or {}
    agents = {k for k in annotations if k.startswith("tailcut.dev/")}
    assert agents == {"tailcut.dev/spec-configmap"}, "the agent wrote nothing on the pod"


def tailcut_bpf_programs() -> set[str]:
    return {o for o in tailcut_objects() if o.startswith("bpf prog ")}


def test_what_an_ordinary_user_makes_neither_changes_a_jobs_status_nor_is_adopted(
        cluster, release, namespace):
    """Job "real" runs while the user's pods with its labels end: one labelled ps-0
    fails, one claiming the job through an ownerReference reports a PS's "done" figures.
    The job succeeds with its own figures, naming neither. A `squat-spec` ConfigMap
    the user made before job "squat" existed is refused, not adopted: the job fails
    naming it, the ConfigMap is left as it was and no pod is made."""
    make_user(cluster, namespace)
    squatted = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "squat-spec"},
                "data": {resources.SPEC_KEY: "the user's own"}}
    as_user(cluster, namespace, "apply", "-f", "-", input=yaml.safe_dump(squatted))
    cluster.kubectl("-n", namespace, "apply", "-f", "-",
                    input=quickstart("real") + "---\n" + quickstart("squat"))
    tj = chart.get(cluster, namespace, "trainingjob", "real")
    labels = {resources.LABEL_JOB: "real", resources.LABEL_REPLICA: "ps-0",
              resources.LABEL_ROLE: "ps", resources.LABEL_RACK: "rack-0"}
    done = json.dumps({"event": "done", "jct_s": 0.5, "final_accuracy": 0.5,
                       "final_loss": 9.0, "converged": True, "epochs": 1})
    claim = {"apiVersion": tj["apiVersion"], "kind": tj["kind"], "name": "real",
             "uid": tj["metadata"]["uid"], "controller": True}
    ending = "import sys, time; time.sleep(2); open('/dev/termination-log', 'w').write({!r}); " \
             "sys.exit({})"
    as_user(cluster, namespace, "apply", "-f", "-", input=yaml.safe_dump_all([
        user_pod("real-evil", labels, ending.format("fail the job", 1)),
        user_pod("real-forged", labels, ending.format(done, 0), ownerReferences=[claim])]))

    status = chart.wait_phase(cluster, namespace, "real", "Succeeded")
    fakes = {n: chart.get(cluster, namespace, "pod", n)["status"]
             for n in ("real-evil", "real-forged")}
    assert [s["phase"] for s in fakes.values()] == ["Failed", "Succeeded"], fakes
    ended = max(s["containerStatuses"][0]["state"]["terminated"]["finishedAt"]
                for s in fakes.values())
    assert ended <= status["completionTime"], "the user's pods ended while the job ran"
    assert status["accuracy"] >= 0.93 and status["jctSeconds"] != 0.5, status
    assert status["replicaStatuses"]["PS"]["failed"] == 0, status["replicaStatuses"]
    assert "evil" not in status["message"] and "forged" not in status["message"]

    squat = chart.wait_phase(cluster, namespace, "squat", "Failed", within_s=60)
    failed = {c["type"]: c for c in squat["conditions"]}["Failed"]
    assert failed["reason"] == "ObjectNotOwned", failed
    assert f"ConfigMap {namespace}/squat-spec already exists" in failed["message"], failed
    cm = chart.get(cluster, namespace, "configmap", "squat-spec")
    assert cm["data"] == squatted["data"] and "ownerReferences" not in cm["metadata"]
    assert not chart.get(cluster, namespace, "pods", "-l",
                         f"{resources.LABEL_JOB}=squat")["items"]


def test_each_service_account_may_do_on_the_cluster_exactly_what_the_docs_table_says(
        cluster, release):
    """The chart as helm installed it on the cluster, asked with `kubectl auth can-i`
    (tests/k8s/test_privileges.py asks the same of a bare API server, and checks the
    table against what the ClusterRoles grant)."""
    rows = privileges.table()
    wrong = privileges.check_rows(cluster, release, rows,
                                  {"all": [None], "release": [release]})
    assert len(rows) > 10 and not wrong, "\n".join(wrong)
