"""CPU time a role's threads used while it trained: where a run's CPU went, and whether
the machine's cores, not the network, bounded its JCT.

Every pod of a `tailcut run` job shares the host's cores (two on the machines this was
built on). A transport that costs more CPU per message then shows up as a longer JCT
even on an idle network, and a comparison of two transports measures their CPU cost as
much as their network behaviour. A researcher must be able to see that, so each role
records, from the moment it starts training (``mark``) to its closing event, the CPU
time (user and system) of each of its threads, grouped by what the thread does
(THREAD_KINDS), into ``cpu-<pod>.json``; ``summarize`` adds a job's files up for
metrics.json's "cpu" section and ``describe`` gives the run's output line, which says
when the roles kept the cores busy for most of the JCT.

Linux charges a thread the kernel work done in its own context: for a sender that is
most of the path of a datagram through the emulated links (the veths hand packets on
in the sending thread's softirq), so "system" time is the kernel's share of a message.
Work done in ksoftirqd is charged to no role and is not counted here.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Thread name prefix -> the kind reported (tailcut names its threads; see the transports
# and training/inbox.py). The first matching prefix wins; unnamed threads are "other".
THREAD_KINDS: tuple[tuple[str, str], ...] = (
    ("MainThread", "main (model, protocol)"),
    ("tcp-send-", "tcp send"),
    ("send-", "datagram send"),
    ("ctrl-", "datagram control"),
    ("udp-rx", "datagram receive"),
    ("inbox-", "receive (message readers)"),
)
# Which code a pod's datagram threads ran (transports.rxfast.status: "compiled", or
# "numpy (why)"), where they ran any.
DATAGRAM_PATHS = "datagram_paths"
OTHER = "other threads"
ENDED = "ended threads"  # CPU of threads gone before the role ended (process total - live)
BUSY_SHARE = 0.8  # roles' CPU at this share of (JCT x cores) or more: CPU-bound


def kind_of(thread_name: str) -> str:
    for prefix, kind in THREAD_KINDS:
        if thread_name.startswith(prefix):
            return kind
    return OTHER


def _thread_seconds(tid: int, tick: int) -> tuple[float, float] | None:
    """(user, system) seconds of thread ``tid`` of this process, None if it is gone."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[11]) / tick, int(fields[12]) / tick


def snapshot() -> dict[str, Any]:
    """This process's CPU now: its total and each live thread's, by thread name. Every
    task of the process counts; a thread Python did not start (a BLAS pool's) is
    "thread <tid>", and the initial one (tid = pid) is the main thread even in a role
    forked from the runner, whose threading module may still hold the runner's ids."""
    tick = os.sysconf("SC_CLK_TCK")
    times = os.times()
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    names[os.getpid()] = "MainThread"
    threads: dict[str, tuple[float, float]] = {}
    for entry in os.listdir("/proc/self/task"):
        tid = int(entry)
        got = _thread_seconds(tid, tick)
        if got is not None:
            threads[f"{names.get(tid, 'thread')} ({tid})"] = got
    return {"user_s": times.user, "system_s": times.system, "threads": threads}


_start: dict[str, Any] | None = None
_seen: dict[str, tuple[float, float]] = {}  # each thread's CPU at the last checkpoint


def mark() -> None:
    """Training starts now: later ``since_mark`` counts from here (the first call wins)."""
    global _start
    if _start is None:
        _start = snapshot()


def checkpoint() -> None:
    """Remember every live thread's CPU: call it before threads end (a transport's, when
    it closes), so that ``since_mark`` can still say what they did."""
    _seen.update(snapshot()["threads"])


def since_mark() -> dict[str, Any]:
    """CPU used since ``mark`` (since the process started if never marked), by kind:
    {"user_s", "system_s", "kinds": {kind: {"user_s", "system_s"}}, "from"}."""
    start = _start or {"user_s": 0.0, "system_s": 0.0, "threads": {}}
    now = snapshot()
    kinds: dict[str, dict[str, float]] = {}
    live_user = live_system = 0.0
    for name, (user, system) in {**_seen, **now["threads"]}.items():
        u0, s0 = start["threads"].get(name, (0.0, 0.0))
        entry = kinds.setdefault(kind_of(name), {"user_s": 0.0, "system_s": 0.0})
        entry["user_s"] += user - u0
        entry["system_s"] += system - s0
        live_user += user - u0
        live_system += system - s0
    user = now["user_s"] - start["user_s"]
    system = now["system_s"] - start["system_s"]
    ended = max(0.0, user - live_user) + max(0.0, system - live_system)
    if ended > 0.005:
        kinds[ENDED] = {"user_s": max(0.0, user - live_user),
                        "system_s": max(0.0, system - live_system)}
    return {"user_s": round(user, 3), "system_s": round(system, 3),
            "kinds": {k: {f: round(v, 3) for f, v in e.items()} for k, e in kinds.items()},
            "from": "training start" if _start is not None else "process start"}


def filename(pod: str) -> str:
    return f"cpu-{pod}.json"


def write(results_dir: str | Path, pod: str, usage: Mapping[str, Any]) -> Path:
    path = Path(results_dir) / filename(pod)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(usage) + "\n")
    return path


def summarize(results_dir: Path, pods: Sequence[str], jct_s: float,
              cores: int | None = None) -> dict[str, Any]:
    """metrics.json's "cpu" section from each pod's cpu-<pod>.json: the job's total,
    by thread kind and per pod, and ``busy``: the roles' CPU over (JCT x the cores they
    could use: this machine's unless given; 0 = unknown, e.g. pods on several nodes,
    and then no ``busy``). Pods whose file is missing or unreadable are listed, not counted."""
    cores = len(os.sched_getaffinity(0)) if cores is None else cores
    per_pod: dict[str, dict[str, Any]] = {}
    for pod in pods:
        try:  # a diagnostic: one bad file must not cost the run its results
            data = json.loads((results_dir / filename(pod)).read_text())
            per_pod[pod] = {"user_s": float(data["user_s"]),
                            "system_s": float(data["system_s"]),
                            "kinds": {str(k): {"user_s": float(v["user_s"]),
                                               "system_s": float(v["system_s"])}
                                      for k, v in data["kinds"].items()}}
            if DATAGRAM_PATHS in data:
                per_pod[pod][DATAGRAM_PATHS] = str(data[DATAGRAM_PATHS])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    kinds: dict[str, dict[str, float]] = {}
    for usage in per_pod.values():
        for kind, v in usage["kinds"].items():
            entry = kinds.setdefault(kind, {"user_s": 0.0, "system_s": 0.0})
            entry["user_s"] += v["user_s"]
            entry["system_s"] += v["system_s"]
    total = sum(u["user_s"] + u["system_s"] for u in per_pod.values())
    busy = total / (jct_s * cores) if jct_s > 0 and cores > 0 else None
    paths: dict[str, list[str]] = {}
    for pod, usage in per_pod.items():
        if DATAGRAM_PATHS in usage:
            paths.setdefault(usage[DATAGRAM_PATHS], []).append(pod)
    return {"total_s": round(total, 3), "cores": cores,
            "busy": None if busy is None else round(busy, 3),
            "kinds": {k: {f: round(v, 3) for f, v in e.items()}
                      for k, e in sorted(kinds.items(), key=lambda kv: -sum(kv[1].values()))},
            "pods": per_pod, "missing": [p for p in pods if p not in per_pod],
            DATAGRAM_PATHS: paths}


def describe(summary: Mapping[str, Any]) -> str:
    """One line for the run's output: the roles' CPU, where it went, and whether the
    cores bounded the JCT."""
    if not summary["pods"]:
        return "cpu: no role reported its CPU time"
    kinds = ", ".join(f"{kind} {v['user_s'] + v['system_s']:.1f} s"
                      for kind, v in summary["kinds"].items()
                      if v["user_s"] + v["system_s"] >= 0.05)
    line = (f"cpu: the roles used {summary['total_s']:.1f} s of CPU while training "
            f"({kinds}; per pod in {filename('<pod>')})")
    busy = summary["busy"]
    if busy is not None:
        line += f"; {100 * busy:.0f}% of {summary['cores']} cores over the JCT"
        if busy >= BUSY_SHARE:
            line += (" - the JCT is bounded by CPU, not by the network: transports are "
                     "compared here by their CPU cost too (docs/bounded-loss.md#cpu-time)")
    if summary["missing"]:
        line += f" (none from {', '.join(summary['missing'])})"
    paths = summary.get(DATAGRAM_PATHS) or {}
    if len(paths) == 1:
        line += f"; datagram paths: {next(iter(paths))}"
    elif paths:
        line += "; datagram paths: " + "; ".join(
            f"{path} in {', '.join(pods)}" for path, pods in sorted(paths.items()))
    return line
