"""Build and teardown time of N-pod networks: tailcut against Mininet 2.3, in one run.

    .venv/bin/python bench/net_scale.py [--pods 64 256 1000] [--runs 3] [--mininet-up-to 256]

tailcut: the network `tailcut run` and `tailcut net up` build (tailcut.net.build): racks
of 32 pods (one bridge each, in its own namespace), a spine routing between them, HTB on
both ends of every access link (1 Gbit/s) and uplink (10 Gbit/s), permanent neighbour
entries; and the same with 1% loss on every access link (an eBPF dropper on both ends).
Teardown is Network.destroy: every namespace, link and program gone.

Mininet 2.3 (`apt-get install -y --no-install-recommends mininet bridge-utils`; Debian's
package, run by /usr/bin/python3; no Open vSwitch needed): the same shape as Mininet
builds it: N hosts, a Linux bridge per rack of 32 and one joining the racks (Mininet
has no routing switch), TCLink (HTB) at the same rates on every link, no controller;
start = Mininet(topo) + start(), stop = stop(). Mininet has no loss without netem (this
kernel lacks it), so only the lossless rows have a Mininet column. Mininet runs up to
--mininet-up-to pods (1,000 of its hosts take minutes).

Medians of --runs, interleaved; after each run, nothing of either may be left (checked;
the bench stops if something is). Never `mn -c`: it kills processes by name.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import hostcheck  # noqa: E402

RACK_PODS = 32
ACCESS, UPLINK = "1Gbit", "10Gbit"
ACCESS_MBIT, UPLINK_MBIT = 1000, 10_000
MININET_PYTHON = "/usr/bin/python3"


# ---- tailcut --------------------------------------------------------------------------

def tailcut_once(pods: int, loss: float) -> tuple[float, float]:
    from tailcut import features, spec
    from tailcut.datapath import dropper
    from tailcut.net import build, clean, naming, topology

    name = f"scale{pods}{'l' if loss else ''}"
    racks = -(-pods // RACK_PODS)
    job = spec.from_dict({
        "apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {"replicas": {"workers": pods - 1},
                 "network": {"racks": [{"name": f"rack-{r}"} for r in range(racks)],
                             "accessLink": {"bandwidth": ACCESS, "loss": loss},
                             "uplink": {"bandwidth": UPLINK}}}})
    topo = topology.plan(job)
    assert len(topo.pods) == pods
    has_netem = features.netem().available
    started = time.monotonic()
    network = build.build(topo, has_netem, droppers=dropper)
    built = time.monotonic()
    network.destroy()
    done = time.monotonic()
    left = clean.leftovers(name)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    if left or naming.alias(name) in links:
        raise SystemExit(f"tailcut left {len(left)} namespaces of {name} behind")
    return built - started, done - built


# ---- Mininet (this file, run by Debian's python3 with --mininet-child) ------------------

def mininet_child(pods: int) -> None:
    """Start and stop one Mininet network; print {"start_s", "stop_s", "left"}."""
    from mininet.link import TCLink
    from mininet.log import setLogLevel
    from mininet.net import Mininet
    from mininet.nodelib import LinuxBridge
    from mininet.topo import Topo

    setLogLevel("error")

    class Racks(Topo):
        def build(self) -> None:  # type: ignore[override]
            spine = self.addSwitch("s0")
            racks = -(-pods // RACK_PODS)
            tors = [self.addSwitch(f"s{r + 1}") for r in range(racks)]
            for tor in tors:
                self.addLink(tor, spine, bw=UPLINK_MBIT)
            for h in range(pods):
                host = self.addHost(f"h{h + 1}")
                self.addLink(host, tors[h // RACK_PODS], bw=ACCESS_MBIT)

    topo = Racks()
    started = time.monotonic()
    net = Mininet(topo=topo, switch=LinuxBridge, controller=None, link=TCLink,
                  autoSetMacs=True)
    net.start()
    up = time.monotonic()
    net.stop()
    down = time.monotonic()
    names = {n for n in topo.switches()} | {
        f"{a}-eth{i}" for a in topo.switches() for i in range(pods + 2)}
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    present = {line.split(": ")[1].split("@")[0] for line in links.splitlines()}
    print(json.dumps({"start_s": up - started, "stop_s": down - up,
                      "left": sorted(present & names)}))


def mininet_once(pods: int) -> tuple[float, float] | None:
    out = subprocess.run([MININET_PYTHON, __file__, "--mininet-child", str(pods)],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        print(f"  mininet {pods}: failed: {out.stderr.strip().splitlines()[-1:]}")
        return None
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["left"]:
        raise SystemExit(f"Mininet left {result['left'][:5]}... behind")
    return result["start_s"], result["stop_s"]


def mininet_available() -> bool:
    return subprocess.run([MININET_PYTHON, "-c", "import mininet.net"],
                          capture_output=True).returncode == 0


# ---- the table --------------------------------------------------------------------------

def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pods", type=int, nargs="+", default=[64, 256, 1000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--mininet-up-to", type=int, default=256,
                        help="largest network Mininet builds (default 256)")
    parser.add_argument("--mininet-child", type=int, help=argparse.SUPPRESS)
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    if args.mininet_child:
        mininet_child(args.mininet_child)
        return 0
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces)")
    watch = hostcheck.before(args)
    mininet = mininet_available()
    print(f"load average before: {os.getloadavg()}; Mininet: "
          f"{'2.3 (LinuxBridge, TCLink)' if mininet else 'not installed'}")
    rows: list[dict[str, Any]] = []
    for pods in args.pods:
        samples: dict[str, list[float]] = {k: [] for k in
                                           ("build", "down", "build_l", "down_l", "mn_up",
                                            "mn_down")}
        for _ in range(args.runs):   # interleaved, so drifting load hits all alike
            b, d = tailcut_once(pods, 0.0)
            samples["build"].append(b)
            samples["down"].append(d)
            b, d = tailcut_once(pods, 0.01)
            samples["build_l"].append(b)
            samples["down_l"].append(d)
            if mininet and pods <= args.mininet_up_to:
                got = mininet_once(pods)
                if got is not None:
                    samples["mn_up"].append(got[0])
                    samples["mn_down"].append(got[1])
        row = {"pods": pods, **{k: _median(v) for k, v in samples.items()},
               "load": os.getloadavg()[0]}
        rows.append(row)
        print(json.dumps(row))
    print(f"\nmedians of {args.runs}; racks of {RACK_PODS}; HTB on every link "
          f"(access {ACCESS}, uplink {UPLINK}); 'loss' = 1% eBPF dropper on every access "
          f"link end; ratio = Mininet / tailcut")
    print(f"{'pods':>5} {'build':>7} {'down':>7} {'pods/s':>7} | {'build':>7} {'down':>7}"
          f" (loss) | {'mn up':>7} {'mn down':>7} | {'up x':>6} {'down x':>6} | load1")
    for r in rows:
        up_x = r["mn_up"] / r["build"] if r["mn_up"] == r["mn_up"] else float("nan")
        down_x = r["mn_down"] / r["down"] if r["mn_down"] == r["mn_down"] else float("nan")
        print(f"{r['pods']:>5} {r['build']:>7.3f} {r['down']:>7.3f} "
              f"{r['pods'] / r['build']:>7.0f} | {r['build_l']:>7.3f} {r['down_l']:>7.3f}"
              f"        | {r['mn_up']:>7.3f} {r['mn_down']:>7.3f} | {up_x:>6.1f} {down_x:>6.1f}"
              f" | {r['load']:.2f}")
    print(f"load average after: {os.getloadavg()} (a shared machine: others' work "
          "counts in these times)")
    hostcheck.after(watch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
