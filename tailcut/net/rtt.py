"""Round-trip times on a built network: what its links add up to, and what TCP measured.

A link's delay (`delayMs`) is netem's, on the egress of each end of the link
(tailcut.net.shaping), so a packet from pod a to pod b is held once at a's end of its
access link and once at the rack port towards b; between racks also once at each end
of the uplinks it crosses (the rack's `up` and the spine's `r<rack>`):

    RTT(a, b) = 2 * (2 * accessLink.delayMs + (2 * uplink.delayMs if a and b are in
                                                different racks else 0))

With `delayMs: 5` on the access links, two pods are 20 ms apart, in one rack or two.
Jitter varies each packet's delay around that mean; serialisation and queueing add to
it (at 100 Mbit/s a full frame takes 0.12 ms per shaped hop).

`measure` reads what the kernel's TCP measured on a pod's established connections,
as `ss -tin` prints it: the smoothed RTT (`rtt:`) and the least seen (`minrtt:`), the
figure to set beside the configured one for each run that sets a delay (`compare`;
`sample` does both for every pod of a built job, `report` makes it JSON, `describe` a
line for a run's progress). Take it while
the roles are connected (during training: their connections close at the end).
"""

import re
import statistics
import subprocess
from dataclasses import asdict, dataclass
from typing import Optional

from tailcut.net.topology import Topology

SS_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Sample:
    """One TCP connection of a pod, as its kernel saw it."""

    local: str                   # address:port
    peer: str                    # address:port
    rtt_ms: float                # smoothed RTT (srtt)
    rttvar_ms: float
    min_rtt_ms: Optional[float]  # the least RTT seen (kernels since 4.10 give it)

    @property
    def peer_ip(self) -> str:
        return self.peer.rsplit(":", 1)[0]


def configured_ms(topo: Topology, a: str, b: str) -> float:
    """The RTT between pods `a` and `b` that the links' delays add up to (see above)."""
    pa, pb = topo.pod(a), topo.pod(b)
    one_way = 2 * topo.access_link.delay_ms
    if pa.rack != pb.rack:
        one_way += 2 * topo.uplink.delay_ms
    return 2 * one_way


_RTT = re.compile(r"\brtt:([\d.]+)/([\d.]+)")
_MIN_RTT = re.compile(r"\bminrtt:([\d.]+)")


def parse_ss(text: str) -> list[Sample]:
    """The connections in the output of `ss -tinH` (no header): per connection a line
    `[State] Recv-Q Send-Q Local:Port Peer:Port` (no state column when a state filter
    is given), then an indented line of TCP's figures."""
    samples: list[Sample] = []
    address: Optional[tuple[str, str]] = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            words = line.split()
            if words and not words[0].isdigit():
                words = words[1:]   # the state
            address = (words[2], words[3]) if len(words) >= 4 else None
            continue
        rtt = _RTT.search(line)
        if address is None or rtt is None:
            continue
        least = _MIN_RTT.search(line)
        samples.append(Sample(address[0], address[1], float(rtt.group(1)),
                              float(rtt.group(2)),
                              float(least.group(1)) if least else None))
        address = None
    return samples


def measure(netns_name: str, port: Optional[int] = None) -> list[Sample]:
    """The established TCP connections in namespace `netns_name` (those with `port` at
    either end, if given), with the RTT the kernel measured on each."""
    command = ["ip", "netns", "exec", netns_name, "ss", "-tinH", "state", "established"]
    if port is not None:
        command += [f"( sport = :{port} or dport = :{port} )"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=SS_TIMEOUT_S,
                          check=True)
    return parse_ss(done.stdout)


@dataclass(frozen=True)
class Comparison:
    """One connection's measured RTT beside what its links add up to."""

    pod: str
    peer: str                      # the pod at the other end
    configured_ms: float
    rtt_ms: float                  # srtt
    min_rtt_ms: Optional[float]

    def off_by(self) -> Optional[float]:
        """(min RTT - configured) / configured; None without a delay or a min RTT."""
        if not self.configured_ms or self.min_rtt_ms is None:
            return None
        return (self.min_rtt_ms - self.configured_ms) / self.configured_ms


def compare(topo: Topology, pod: str, samples: list[Sample]) -> list[Comparison]:
    """`pod`'s connections to other pods of `topo`, each beside its configured RTT
    (connections to anything else, e.g. a Kubernetes pod's API server, are left out)."""
    by_ip = {p.ip: p.name for p in topo.pods}
    return [Comparison(pod, by_ip[s.peer_ip], configured_ms(topo, pod, by_ip[s.peer_ip]),
                       s.rtt_ms, s.min_rtt_ms)
            for s in samples if s.peer_ip in by_ip]


def sample(topo: Topology, port: Optional[int] = None) -> list[Comparison]:
    """Every pod's connections (to or from `port`, if given) beside their configured
    RTT; a pod whose namespace is gone (or not there yet) has none."""
    rows: list[Comparison] = []
    for pod in topo.pods:
        try:
            found = measure(pod.netns, port)
        except subprocess.CalledProcessError:
            continue
        rows += compare(topo, pod.name, found)
    return rows


def report(rows: list[Comparison]) -> dict[str, object]:
    """The RTT part of a run's results, per pair of pods (rows taken at several times
    and on several connections of a pair are one entry: the least RTT seen between the
    two, the smoothed RTTs' median), and the largest relative gap between a pair's
    least RTT and its configured RTT. (A connection's `minrtt` is its least so far: one
    read early, while its first messages queued, can be far above the pair's.)"""
    pairs: dict[tuple[str, str], list[Comparison]] = {}
    for row in rows:
        pairs.setdefault((row.pod, row.peer), []).append(row)
    entries = []
    gaps = []
    for (pod, peer), same in sorted(pairs.items()):
        least = [r.min_rtt_ms for r in same if r.min_rtt_ms is not None]
        pair = Comparison(pod, peer, same[0].configured_ms,
                          statistics.median(r.rtt_ms for r in same),
                          min(least) if least else None)
        entries.append({**asdict(pair), "samples": len(same)})
        gap = pair.off_by()
        if gap is not None:
            gaps.append(gap)
    return {"pairs": entries, "max_off_by": max(gaps, key=abs) if gaps else None}


def describe(rows: list[Comparison]) -> str:
    """One line per configured RTT: the least RTT measured and the smoothed RTTs'
    median, e.g. 'rtt: configured 20 ms: least 20.2 ms, smoothed median 41.0 ms (6
    connections)'."""
    if not rows:
        return "rtt: no connection between the job's pods was seen"
    parts = []
    for configured in sorted({r.configured_ms for r in rows}):
        same = [r for r in rows if r.configured_ms == configured]
        least = [r.min_rtt_ms for r in same if r.min_rtt_ms is not None]
        parts.append(f"configured {configured:g} ms: "
                     + (f"least {min(least):.1f} ms, " if least else "")
                     + f"smoothed median {statistics.median(r.rtt_ms for r in same):.1f} ms "
                     f"({len(same)} connection{'s' if len(same) != 1 else ''})")
    return "rtt: " + "; ".join(parts)
