"""The fidelity verdict: network-bound, marginal or host-bound, with its evidence.

Pure: it takes what hostcpu, processes and links measured over a run's training
window (any of them may be missing: a pod on Kubernetes sees its node's CPU but not
the other processes) and returns a dict for metrics.json's "fidelity":

    {"verdict": "host-bound",
     "reasons": ["the host's cores were 96% busy (threshold 90%)", ...],
     "notes": ["no delay was emulated ..."],
     "evidence": {"host": {...}, "processes": {...}, "links": {...}},
     "thresholds": THRESHOLDS}

A run is host-bound when any measure crosses its bound, marginal when any crosses
only its margin, and network-bound otherwise: the host had cores to spare, nothing
else took them, and every link that had packets to send sent them at its rate.
A run whose links hardly ever queued is marginal: neither the network nor a full host
bounded it (compute and round trips did), so a comparison of transports there says
little about the network.

The thresholds are calibrated on a 2-core host (docs/fidelity.md has the runs).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

NETWORK_BOUND, MARGINAL, HOST_BOUND = "network-bound", "marginal", "host-bound"
VERDICTS = (NETWORK_BOUND, MARGINAL, HOST_BOUND)

# (margin, bound) per measure; "higher is worse" except for drain
THRESHOLDS: dict[str, tuple[float, float]] = {
    # share of all cores' time not idle, softirq and steal included
    "host_busy": (0.75, 0.90),
    # share of wall time at least one runnable task waited for a core (PSI "some")
    "cpu_pressure": (0.40, 0.70),
    # share of all cores' time taken by processes not the job's (nor the kernel's)
    "others_cpu": (0.05, 0.15),
    # what a link drained at its rate of what it held (fidelity.links; lower is worse).
    # Its busy_rate is evidence only: it reads low where a bursty queue emptied between
    # two samples (a PS's port at 100 Mbit/s read 63% on a quiet host)
    "drain": (0.95, 0.85),
    # the busiest link end's share of the window: the larger of the time it spent with
    # packets waiting and of what it sent as a share of its rate (a sender paced at the
    # link's rate keeps it busy with no queue); below this the network did not bound
    # the run (lower is worse; margin only)
    "link_busy": (0.10, 0.0),
}
# A link end with fewer backlogged intervals than this says nothing of its rate.
MIN_BACKLOGGED_INTERVALS = 10


def judge(host: Optional[Mapping[str, Any]] = None,
          processes: Optional[Mapping[str, Any]] = None,
          links: Optional[Mapping[str, Any]] = None,
          delay: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    bound: list[str] = []
    margin: list[str] = []
    notes: list[str] = []

    def check(name: str, value: Optional[float], say: str, higher_is_worse: bool = True
              ) -> None:
        if value is None:
            return
        low, high = THRESHOLDS[name]
        if higher_is_worse:
            if value >= high:
                bound.append(f"{say} (host-bound from {high:.0%})")
            elif value >= low:
                margin.append(f"{say} (marginal from {low:.0%})")
        elif value < high:
            bound.append(f"{say} (host-bound below {high:.0%})")
        elif value < low:
            margin.append(f"{say} (marginal below {low:.0%})")

    if host:
        check("host_busy", host.get("busy"),
              f"the host's {host.get('cores')} cores were {host['busy']:.0%} busy "
              f"(softirq {host.get('softirq', 0):.0%}, steal {host.get('steal', 0):.0%})")
        psi = host.get("psi_some")
        check("cpu_pressure", psi,
              f"tasks waited for a core {psi or 0:.0%} of the time (CPU pressure)")
    else:
        notes.append("the host's CPU was not measured")
    if processes:
        share = processes["share"]["others"]
        busiest = ", ".join(processes.get("busiest_others") or {}) or "none named"
        check("others_cpu", share,
              f"other processes took {share:.0%} of the cores ({busiest})")
    stalled = _worst_end(links, "drain", "backlogged")
    if stalled is not None:
        end, summary = stalled
        check("drain", summary["drain"],
              f"link end {end} drained {summary['drain']:.0%} of what it held at its "
              f"rate", higher_is_worse=False)
    if links and links.get("ends"):
        end, share = max(((e, max(s["backlogged_share"], s.get("utilization") or 0.0))
                          for e, s in links["ends"].items()), key=lambda item: item[1])
        low, _ = THRESHOLDS["link_busy"]
        if share < low:
            margin.append(f"no link was busy for long (at most {share:.0%} of the window, "
                          f"at {end}): the network did not bound the run, compute and "
                          "round trips did")
    elif links is not None:
        notes.append("no link end was sampled" + (f": {links['errors'][0]}"
                                                  if links.get("errors") else ""))
    else:
        notes.append("the links' rates were not sampled")
    notes += delay_notes(delay)
    verdict = HOST_BOUND if bound else MARGINAL if margin else NETWORK_BOUND
    return {"verdict": verdict, "reasons": bound + margin, "notes": notes,
            "evidence": {"host": dict(host) if host else None,
                         "processes": dict(processes) if processes else None,
                         "links": _links_evidence(links)},
            "thresholds": {k: list(v) for k, v in THRESHOLDS.items()}}


def _worst_end(links: Optional[Mapping[str, Any]], measure: str, intervals: str
               ) -> Optional[tuple[str, dict[str, Any]]]:
    """The link end lowest in `measure`, among those with enough `intervals` to tell."""
    if not links:
        return None
    judged = [(end, s) for end, s in links.get("ends", {}).items()
              if s.get(measure) is not None
              and s.get(intervals, 0) >= MIN_BACKLOGGED_INTERVALS]
    return min(judged, key=lambda item: item[1][measure]) if judged else None


def _links_evidence(links: Optional[Mapping[str, Any]]) -> Optional[dict[str, Any]]:
    """The sampler's summary, its ends ordered busiest first."""
    if links is None:
        return None
    ends = sorted(links.get("ends", {}).items(),
                  key=lambda item: -item[1]["backlogged_share"])
    return {**links, "ends": dict(ends)}


def delay_notes(delay: Optional[Mapping[str, Any]]) -> list[str]:
    """What the emulated delay (or its absence) means for the comparison."""
    if delay is None:
        return []
    if not delay.get("netem"):
        return ["no delay was emulated (this kernel has no netem): a same-host path's "
                "round trip is tens of microseconds, not a datacenter's, so TCP's "
                "minimum retransmission timeout (200 ms) is thousands of round trips and "
                "a timeout costs far more, relative to a transfer, than in a fabric"]
    if not delay.get("round_trip_ms"):
        return ["no delay was set on the links (netem is there: set delayMs for a "
                "datacenter's round trip)"]
    return [f"links add {delay['round_trip_ms']:g} ms to a round trip across the spine "
            "(netem)"]


def describe(fidelity: Mapping[str, Any]) -> list[str]:
    """The run's closing lines: the verdict with its reasons, then the notes."""
    reasons = fidelity.get("reasons") or []
    if fidelity["verdict"] == NETWORK_BOUND:
        sampled = (fidelity.get("evidence") or {}).get("links") is not None
        why = ("the host had cores to spare and every backlogged link sent at its rate"
               if sampled else "the host had cores to spare (links not sampled)")
    else:
        why = "; ".join(reasons)
    lines = [f"fidelity: {fidelity['verdict']} - {why}"]
    lines += [f"  note: {note}" for note in fidelity.get("notes") or []]
    return lines
