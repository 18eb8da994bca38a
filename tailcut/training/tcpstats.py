"""The kernel's TCP counters of a pod's network namespace over a role's run: do its
flows retransmit, and do they wait out retransmission timeouts (200 ms at least on
Linux, the incast stall of shallow switch buffers)?

/proc/net/snmp ("Tcp:") and /proc/net/netstat ("TcpExt:") count per network
namespace, and a role always runs in its pod's namespace: under `tailcut run` one
namespace per pod, on Kubernetes the pod sandbox's. So the role reads them as it
starts and once it is done (tailcut.training.role), identically on both executors,
and writes the difference to ``tcp-<pod>.json`` in its results directory (on
Kubernetes that file travels in the pod's log with the role's other files).
``summarize`` adds a job's files up for tcp_counters.csv and metrics.json.

Both /proc files hold pairs of lines per table, names then values::

    Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens ... OutSegs RetransSegs ...
    Tcp: 1 200 120000 -1 32 ... 8171 0 ...
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tailcut.errors import TailcutError

PROC_NET = Path("/proc/net")
# Our name -> (file under /proc/net, table, the kernel's name). Counts, not rates.
COUNTERS: dict[str, tuple[str, str, str]] = {
    # segments sent; Linux counts the retransmitted ones in too
    "out_segs": ("snmp", "Tcp", "OutSegs"),
    # segments sent again, for whatever reason
    "retrans_segs": ("snmp", "Tcp", "RetransSegs"),
    # retransmission timer expiries (RTOs; SYN and SYN-ACK timeouts included)
    "rto_timeouts": ("netstat", "TcpExt", "TCPTimeouts"),
    # resent on duplicate ACKs / SACK, without waiting for the timer
    "fast_retrans": ("netstat", "TcpExt", "TCPFastRetrans"),
    # resent in slow start after an RTO
    "slow_start_retrans": ("netstat", "TcpExt", "TCPSlowStartRetrans"),
    # tail loss probes (sent after ~2 RTTs of silence, before the RTO would fire)
    "loss_probes": ("netstat", "TcpExt", "TCPLossProbes"),
    # RTOs that F-RTO found needless (the ACKs were late, not lost)
    "spurious_rtos": ("netstat", "TcpExt", "TCPSpuriousRTOs"),
    # SYNs resent: a connection's set-up waited for its 1 s initial timeout
    "syn_retrans": ("netstat", "TcpExt", "TCPSynRetrans"),
}
FIELDS = tuple(COUNTERS)
CSV_NAME = "tcp_counters.csv"

Counts = dict[str, int]


class CountersError(TailcutError):
    """The kernel's TCP counters could not be read; the message names the file."""


def parse(text: str, source: str = "/proc/net/snmp") -> dict[str, dict[str, int]]:
    """Every table of a /proc/net/snmp or /proc/net/netstat text: table -> name -> value."""
    tables: dict[str, dict[str, int]] = {}
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) % 2:
        raise CountersError(f"{source}: {len(lines)} lines; expected pairs of "
                            "names and values")
    for n in range(0, len(lines), 2):
        names, values = lines[n].split(), lines[n + 1].split()
        table = names[0].rstrip(":")
        if values[0] != names[0] or len(values) != len(names):
            raise CountersError(f"{source} line {n + 2}: {values[0]} with {len(values)} "
                                f"fields does not pair with {names[0]} with {len(names)}")
        try:   # MaxConn is -1 (no limit): int() takes the sign
            tables[table] = {k: int(v) for k, v in zip(names[1:], values[1:])}
        except ValueError as err:
            raise CountersError(f"{source} line {n + 2}: {err}") from err
    return tables


def pick(tables: Mapping[str, Mapping[str, Mapping[str, int]]]) -> Counts:
    """Our COUNTERS out of the parsed files (file -> table -> name -> value)."""
    counts: Counts = {}
    for ours, (file, table, name) in COUNTERS.items():
        try:
            counts[ours] = tables[file][table][name]
        except KeyError:
            raise CountersError(f"/proc/net/{file}: no {table} {name} (for {ours}); "
                                "this kernel does not count it") from None
    return counts


def read(proc_net: Path = PROC_NET) -> Counts:
    """The counters of the network namespace of whoever opens `proc_net` (/proc/net:
    this process's; /proc/<pid>/net: that process's)."""
    tables: dict[str, dict[str, dict[str, int]]] = {}
    for file in ("snmp", "netstat"):
        path = proc_net / file
        try:
            tables[file] = parse(path.read_text(), str(path))
        except OSError as err:
            raise CountersError(f"{path}: {err.strerror or err}") from err
    return pick(tables)


def delta(before: Mapping[str, int], after: Mapping[str, int]) -> Counts:
    """What the counters counted between two readings."""
    return {k: after[k] - before[k] for k in FIELDS}


def filename(pod: str) -> str:
    return f"tcp-{pod}.json"


def default_congestion_control() -> str:
    """The TCP congestion control new sockets of this network namespace get ("" if
    unreadable): part of what the counters mean (BBR and cubic react to a full
    switch queue differently)."""
    try:
        return Path("/proc/sys/net/ipv4/tcp_congestion_control").read_text().strip()
    except OSError:
        return ""


def write(results_dir: str | Path, pod: str, counts: Mapping[str, int],
          congestion_control: str = "") -> Path:
    """``congestion_control``: what the role's TCP connections used."""
    path = Path(results_dir) / filename(pod)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**counts, "congestion_control": congestion_control}) + "\n")
    return path


def summarize(results_dir: Path, pods: Sequence[str]) -> dict[str, Any]:
    """The "tcp_counters" section of metrics.json from each pod's tcp-<pod>.json, and
    tcp_counters.csv (one row per pod that reported). ``missing``: pods of the job
    whose role wrote none (it failed, was killed, or its counters were unreadable)
    or one this version cannot read; the total is over the others."""
    per_pod: dict[str, Counts] = {}
    algorithms: set[str] = set()
    for pod in pods:
        try:   # a diagnostic: one bad file must not cost the run its results
            data = json.loads((results_dir / filename(pod)).read_text())
            per_pod[pod] = {k: int(data[k]) for k in FIELDS}
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(data.get("congestion_control"), str) and data["congestion_control"]:
            algorithms.add(data["congestion_control"])
    total = {k: sum(c[k] for c in per_pod.values()) for k in FIELDS}
    with open(results_dir / CSV_NAME, "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=["pod", *FIELDS])
        out.writeheader()
        for pod, counts in per_pod.items():
            out.writerow({"pod": pod, **counts})
    return {"total": total, "pods": per_pod, "congestion_control": sorted(algorithms),
            "missing": [p for p in pods if p not in per_pod]}


def describe(summary: Mapping[str, Any]) -> str:
    """One line for the run's output: the job's retransmissions and timeouts."""
    t, pods = summary["total"], summary["pods"]
    if not pods:
        return "tcp: no pod reported its TCP counters"
    share = f" ({100 * t['retrans_segs'] / t['out_segs']:.2f}%)" if t["out_segs"] else ""
    line = (f"tcp ({len(pods)} pods' namespaces): {t['retrans_segs']} of {t['out_segs']} "
            f"segments retransmitted{share}, {t['rto_timeouts']} RTO timeouts, "
            f"{t['syn_retrans']} SYN retransmits; per pod in {CSV_NAME}")
    if summary["missing"]:
        line += f" (none from {', '.join(summary['missing'])})"
    if summary.get("congestion_control"):
        line += f"; congestion control {'/'.join(summary['congestion_control'])}"
    return line
