"""The netem path end to end, run inside Debian's user-mode Linux (kernel 6.1, which
has netem) by tests/uml/test_uml.py; never collected on the host (its name is not
test_*.py), where it would fail for want of netem.

- feature detection and `tailcut doctor` choose netem, and validate accepts a delay;
- every link layout that uses netem (delay, jitter, loss by netem, HTB with netem,
  switch buffers with netem), built by tailcut.net.build and read back through tc's
  own view (`tc -j qdisc show`, `tc class show`) in the namespaces;
- packets really take the delay (TCP's RTT) and the loss (UDP datagrams counted, by
  netem and by the eBPF dropper, which BCC compiles there against Debian's 6.1
  headers);
- a tcp job trains over access links of delayMs 5, and the RTT measured in its pods
  (`ss -ti`) is within 10% of the 20 ms its links add up to.

Figures go to $TAILCUT_UML_OUT/figures.json for the host to show.
"""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tailcut import features, plan, spec
from tailcut.datapath import dropper
from tailcut.net import build, clean, rtt, topology

pytestmark = pytest.mark.netns
OUT = Path(os.environ.get("TAILCUT_UML_OUT", "/run/tmp"))
BIN = Path(sys.executable).parent
SO_RCVBUFFORCE = 33   # <asm-generic/socket.h>; Python's socket module lacks it


def record(name: str, value: Any) -> None:
    """Add one figure to figures.json (read by the host's test)."""
    path = OUT / "figures.json"
    figures = json.loads(path.read_text()) if path.exists() else {}
    figures[name] = value
    path.write_text(json.dumps(figures, indent=1, sort_keys=True))


def job(name: str, network: dict[str, Any], **job_spec: Any) -> spec.TrainingJob:
    """ps-0 and worker-0 in rack r0, worker-1 in r1 (so uplinks are crossed)."""
    racks = {"racks": [{"name": "r0"}, {"name": "r1"}],
             "placement": {"ps-0": "r0", "worker-0": "r0", "worker-1": "r1"}}
    return spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                           "metadata": {"name": name},
                           "spec": {"replicas": {"workers": 2},
                                    "network": {**racks, **network}, **job_spec}})


def tc_qdiscs(ns: str, dev: str) -> list[dict[str, Any]]:
    """tc's own view of `dev`'s qdiscs: kind, handle, parent and the options that
    tailcut sets."""
    out = subprocess.run(["ip", "netns", "exec", ns, "tc", "-j", "qdisc", "show", "dev",
                          dev], capture_output=True, text=True, check=True).stdout
    found = []
    for q in json.loads(out):
        o = q.get("options", {})
        item = {"kind": q["kind"], "handle": q["handle"], "parent": q.get("parent", "root")}
        if q["kind"] == "netem":
            item.update(limit=o["limit"], delay_s=o.get("delay", {}).get("delay", 0.0),
                        jitter_s=o.get("delay", {}).get("jitter", 0.0),
                        loss=o.get("loss-random", {}).get("loss", 0.0))
        elif q["kind"] in ("pfifo", "bfifo"):
            item.update(limit=o["limit"])
        found.append(item)
    return found


def tc_rates(ns: str, dev: str) -> dict[str, str]:
    """HTB class -> its rate, as `tc class show` prints them (its -j prints text for
    HTB classes in iproute2 6.1)."""
    out = subprocess.run(["ip", "netns", "exec", ns, "tc", "class", "show", "dev", dev],
                         capture_output=True, text=True, check=True).stdout
    return dict(re.findall(r"class htb (\S+) .*?rate (\S+)", out))


def tc_ingress_filters(ns: str, dev: str) -> list[str]:
    """Kinds of the filters on `dev`'s clsact ingress, as tc shows them."""
    out = subprocess.run(["ip", "netns", "exec", ns, "tc", "-j", "filter", "show", "dev",
                          dev, "ingress"], capture_output=True, text=True, check=True).stdout
    return [f["kind"] for f in json.loads(out or "[]") if "options" in f]


def htb() -> list[dict[str, Any]]:
    return [{"kind": "htb", "handle": "1:", "parent": "root"}]


CLSACT = {"kind": "clsact", "handle": "ffff:", "parent": "ffff:fff1"}   # the dropper's hook


def netem(delay_s: float, limit: int = 1000, jitter_s: float = 0.0,
          loss: float = 0.0) -> dict[str, Any]:
    return {"kind": "netem", "handle": "10:", "parent": "1:10", "limit": limit,
            "delay_s": delay_s, "jitter_s": jitter_s, "loss": loss}


def close(found: list[dict[str, Any]], expected: list[dict[str, Any]]) -> bool:
    """Equal, times within 1 us: netem keeps its times in the kernel's ticks, and 50 us
    reads back as 49 us."""
    if len(found) != len(expected):
        return False
    for f, e in zip(found, expected):
        if f.keys() != e.keys():
            return False
        for key, value in e.items():
            if key.endswith("_s"):
                if abs(f[key] - value) > 1.01e-6:
                    return False
            elif f[key] != value:
                return False
    return True


# (the job's links, what tc shows on: a pod's end eth0, its rack port p0, the rack's
# uplink end `up`, the spine's end r0)
LAYOUTS = {
    "delay": ({"accessLink": {"delayMs": 2}},
              {"eth0": htb() + [netem(0.002)], "p0": htb() + [netem(0.002)],
               "up": htb(), "r0": htb()}),
    "jitter": ({"accessLink": {"delayMs": 2, "jitterMs": 0.5}},
               {"eth0": htb() + [netem(0.002, jitter_s=0.0005)],
                "p0": htb() + [netem(0.002, jitter_s=0.0005)], "up": htb(), "r0": htb()}),
    "loss-by-netem": ({"uplink": {"loss": 0.02}},
                      {"eth0": htb(), "p0": htb(), "up": htb() + [netem(0.0, loss=0.02)],
                       "r0": htb() + [netem(0.0, loss=0.02)]}),
    # towards a pod netem loses, from a pod the eBPF dropper at the rack port's ingress
    # (checked below); the pod's own end loses nothing
    "access-loss": ({"accessLink": {"loss": 0.05}},
                    {"eth0": htb(), "p0": htb() + [netem(0.0, loss=0.05), CLSACT],
                     "up": htb(), "r0": htb()}),
    "htb-with-netem": ({"accessLink": {"bandwidth": "100Mbit", "delayMs": 1},
                        "uplink": {"bandwidth": "200Mbit", "delayMs": 0.05}},
                       {"eth0": htb() + [netem(0.001)], "p0": htb() + [netem(0.001)],
                        "up": htb() + [netem(0.00005)], "r0": htb() + [netem(0.00005)]}),
    "buffers-with-netem": (
        {"accessLink": {"delayMs": 1, "bufferPackets": 16},
         "uplink": {"delayMs": 0.05, "bufferBytes": 30000}},
        # a switch port's buffer is netem's child, netem's own limit out of the way;
        # the pod's own end (its host's NIC) keeps netem's default queue
        {"eth0": htb() + [netem(0.001)],
         "p0": htb() + [netem(0.001, limit=1_000_000),
                        {"kind": "pfifo", "handle": "11:", "parent": "10:1", "limit": 16}],
         "up": htb() + [netem(0.00005, limit=1_000_000),
                        {"kind": "bfifo", "handle": "11:", "parent": "10:1", "limit": 30000}],
         "r0": htb() + [netem(0.00005, limit=1_000_000),
                        {"kind": "bfifo", "handle": "11:", "parent": "10:1",
                         "limit": 30000}]}),
}


def test_feature_detection_and_doctor_choose_netem_here() -> None:
    features.clear_cache()
    assert features.netem().available and features.htb().available
    delayed = job("u-feat", {"accessLink": {"delayMs": 5}})
    assert plan.refusals(delayed, "local", features.netem) == []
    doctor = subprocess.run([str(BIN / "tailcut"), "doctor"], capture_output=True, text=True,
                            timeout=120)
    rows = {line.split()[0]: line.split()[1] for line in doctor.stdout.splitlines()[2:]
            if len(line.split()) > 1 and line.split()[1] in ("yes", "NO")}
    record("doctor", rows)
    assert rows["netem"] == "yes" and rows["htb"] == "yes", doctor.stdout
    # BCC compiles against Debian's 6.1 headers, linked by tests/uml/machine.py
    assert rows["bcc"] == "yes" and rows["clsact_bpf"] == "yes", doctor.stdout


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_netem_layout_is_what_tc_shows_in_the_namespaces(layout: str) -> None:
    network, expected = LAYOUTS[layout]
    topo = topology.plan(job(f"u-{layout[:12]}", network))
    built = build.build(topo, has_netem=True, droppers=dropper)
    try:
        ends = {"eth0": topo.pod("worker-0").netns, "p0": topo.racks[0].netns,
                "up": topo.racks[0].netns, "r0": topo.spine_netns}
        for dev, ns in ends.items():
            found = tc_qdiscs(ns, dev)
            assert close(found, expected[dev]), f"{layout}: {ns}/{dev}: tc shows {found}"
        if layout == "access-loss":
            assert tc_ingress_filters(ends["p0"], "p0") == ["bpf"]
            assert tc_ingress_filters(ends["eth0"], "eth0") == []
        if layout == "htb-with-netem":
            assert tc_rates(ends["eth0"], "eth0") == {"1:1": "100Mbit", "1:10": "100Mbit"}
            assert tc_rates(ends["r0"], "r0") == {"1:1": "200Mbit", "1:10": "200Mbit"}
    finally:
        built.destroy()
    assert clean.leftovers(topo.job) == []


def tcp_round_trips(client_ns: str, server_ns: str, server_ip: str,
                    rounds: int = 20) -> list[rtt.Sample]:
    """`rounds` request/answer exchanges of 1 KB over one TCP connection between two
    pods, then the client's connection as `ss -ti` shows it."""
    port = 7100
    from tailcut.net import netns
    with netns.entered(server_ns):
        server = socket.create_server(("0.0.0.0", port))
    with netns.entered(client_ns):
        client = socket.create_connection((server_ip, port), timeout=10)
    peer, _ = server.accept()

    def echo() -> None:
        while data := peer.recv(4096):
            peer.sendall(data)
    answering = threading.Thread(target=echo, daemon=True)
    answering.start()
    try:
        for _ in range(rounds):
            client.sendall(b"x" * 1000)
            got = 0
            while got < 1000:
                got += len(client.recv(4096))
        return rtt.measure(client_ns, port)
    finally:
        client.close()
        answering.join(timeout=5)
        peer.close()
        server.close()


def test_a_delay_is_what_tcp_measures_across_one_rack_and_two() -> None:
    topo = topology.plan(job("u-rtt", {"accessLink": {"delayMs": 5},
                                        "uplink": {"delayMs": 0.5}}))
    built = build.build(topo, has_netem=True, droppers=dropper)
    try:
        ps = topo.pod("ps-0")
        figures = {}
        for worker in ("worker-0", "worker-1"):
            (sample,) = tcp_round_trips(topo.pod(worker).netns, ps.netns, ps.ip)
            (row,) = rtt.compare(topo, worker, [sample])
            figures[worker] = {"configured_ms": row.configured_ms, "rtt_ms": row.rtt_ms,
                               "min_rtt_ms": row.min_rtt_ms}
            assert row.configured_ms == {"worker-0": 20, "worker-1": 22}[worker]
        record("echo_rtt", figures)
        for worker in figures:
            off = rtt.Comparison(worker, "ps-0", **figures[worker]).off_by()
            assert off is not None and 0 <= off < 0.1, figures
    finally:
        built.destroy()


@pytest.mark.parametrize("network, sender, delivered", [
    # 10% at each end of both uplinks: rack r1 to r0 crosses two lossy ends
    ({"uplink": {"loss": 0.1}}, "worker-1", 0.9 ** 2),
    # 5% at the sender's wire end (the eBPF dropper) and 5% by netem towards the PS
    ({"accessLink": {"loss": 0.05}}, "worker-0", 0.95 ** 2)], ids=["uplink", "access"])
def test_random_loss_drops_datagrams_at_each_lossy_end(network: dict[str, Any], sender: str,
                                                       delivered: float) -> None:
    """2000 datagrams to ps-0; what arrives is within 4 standard deviations."""
    topo = topology.plan(job("u-loss", network))
    built = build.build(topo, has_netem=True, droppers=dropper)
    try:
        ps, worker = topo.pod("ps-0"), topo.pod(sender)
        from tailcut.net import netns
        with netns.entered(ps.netns):
            receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            # room for every datagram: the test reads them only after sending
            receiver.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
            receiver.bind((ps.ip, 7200))
            receiver.settimeout(1.0)
        with netns.entered(worker.netns):
            sender_socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sent, got = 2000, 0
        try:
            for i in range(sent):
                sender_socket.sendto(b"d" * 100, (ps.ip, 7200))
                if i % 50 == 49:
                    time.sleep(0.002)   # stay under every queue's limit
            while True:
                try:
                    receiver.recv(2048)
                    got += 1
                except socket.timeout:
                    break
        finally:
            sender_socket.close()
            receiver.close()
        record(f"loss_{sender}", {"sent": sent, "received": got,
                                  "expected_fraction": round(delivered, 4)})
        spread = 4 * (delivered * (1 - delivered) / sent) ** 0.5
        assert abs(got / sent - delivered) <= spread, f"{got} of {sent} arrived"
    finally:
        built.destroy()


def test_a_tcp_job_trains_over_delayed_links_and_its_pods_measure_their_sum(
        tmp_path: Path) -> None:
    """delayMs 5 on the access links: every worker is 20 ms from the PS, in its own
    rack or the other (the uplinks add nothing)."""
    delayed = job("u-train", {"accessLink": {"bandwidth": "100Mbit", "delayMs": 5}},
                  training={"model": "mlp", "batchSize": 32, "epochs": 1,
                            "iterations": 30},
                  transport={"type": "tcp"})
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(delayed.model_dump(by_alias=True, mode="json")))
    topo = topology.plan(delayed)
    started = time.monotonic()
    run = subprocess.Popen([str(BIN / "tailcut"), "run", str(path), "--results-dir",
                            str(tmp_path / "results")], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    rows: list[rtt.Comparison] = []
    try:
        while run.poll() is None and time.monotonic() - started < 150:
            rows += rtt.sample(topo, plan.PS_PORT)   # tailcut.net.rtt, as a run would
            time.sleep(0.5)
    finally:
        if run.poll() is None:
            run.kill()
        output = run.communicate()[0]
    wall = time.monotonic() - started
    assert run.returncode == 0, output[-3000:]
    assert "(netem)" in output, output[-3000:]
    figures: dict[str, Any] = {"wall_s": round(wall, 1), "configured_ms": 20.0}
    for pod in ("worker-0", "worker-1", "ps-0"):
        mine = [r for r in rows if r.pod == pod]
        assert mine, f"{pod}: no connection of the job seen by ss during the run"
        assert {r.configured_ms for r in mine} == {20.0}
        least = min(r.min_rtt_ms for r in mine if r.min_rtt_ms is not None)
        srtts = sorted(r.rtt_ms for r in mine)
        figures[pod] = {"min_rtt_ms": least, "srtt_median_ms": srtts[len(srtts) // 2],
                        "srtt_max_ms": srtts[-1], "samples": len(mine)}
    figures["max_off_by"] = rtt.report(rows)["max_off_by"]
    figures["line"] = rtt.describe(rows)
    assert figures["line"].startswith("rtt: configured 20 ms: least 20."), figures
    record("tcp_job", figures)
    # The least RTT is what the links add; the smoothed one adds the queueing behind
    # the job's own messages (a 259 KB gradient takes 21 ms at 100 Mbit/s), recorded.
    for pod in ("worker-0", "worker-1", "ps-0"):
        assert 20.0 <= figures[pod]["min_rtt_ms"] <= 22.0, figures
    assert 0 <= figures["max_off_by"] < 0.1, figures   # every pair of pods, as reported
    # tailcut run's own reading (one, a second into training): there, and configured
    # right; its least RTT may still hold the first messages' queueing, so recorded only
    reported = json.loads((tmp_path / "results" / "metrics.json").read_text())["rtt"]
    assert reported["pairs"] and {p["configured_ms"] for p in reported["pairs"]} == {20.0}
    assert "rtt: configured 20 ms: least " in output, output[-3000:]
    record("tcp_job_run_reported", {"max_off_by": reported["max_off_by"],
                                    "pairs": len(reported["pairs"])})
