"""A run's condition in a line, for its figures' titles: what a reader must know to set
one figure beside another (model, workers, transport, the links' rate, loss, delay and
buffers, scheduling, in-network programs, background load), read from the spec.yaml a
run leaves in its results directory.

    mlp, 4 workers, bounded-loss p=0.9; links 1 Gbit/s, 1% loss; background 0.5 on uplink/rack-1
"""

from __future__ import annotations

from pathlib import Path

from tailcut import errors
from tailcut.spec import load
from tailcut.spec.model import JobSpec, Link, TrainingJob


def of_results(results_dir: Path) -> str:
    """The condition of the run whose results are in `results_dir`; "" where it left
    no spec.yaml (or one this version cannot read): a figure is drawn all the same."""
    try:
        return describe(load.load_file(results_dir / "spec.yaml"))
    except errors.SpecError:
        return ""


def describe(job: TrainingJob) -> str:
    s = job.spec
    parts = [_job(s), _links(s.network.access_link, s.network.uplink)]
    if s.scheduling.policy != "fair":   # the default: every flow its fair share
        parts.append(f"scheduling {s.scheduling.policy}")
    innet = s.network.in_network
    if innet is not None:
        done = [what for what, on in (("hot parameters", innet.hot_parameters is not None),
                                      ("aggregation", innet.aggregate),
                                      ("multicast", innet.multicast)) if on]
        if done:
            parts.append("in-network " + ", ".join(done))
    bg = s.background_load
    if bg is not None:
        target = bg.target
        amount = (f"{target.load_factor:g}" if target.load_factor is not None
                  else f"{target.requests_per_s:g} flows/s")
        parts.append(f"background {amount}" + (f" on {target.link}" if target.link else ""))
    return "; ".join(parts)


def _job(s: JobSpec) -> str:
    transport = s.transport.type + (f" p={s.transport.p:g}" if s.transport.p else "")
    sync = "" if s.training.sync_mode == "bsp" else f", {s.training.sync_mode}"
    return f"{s.training.model}, {s.replicas.workers} workers{sync}, {transport}"


def _links(access: Link, uplink: Link) -> str:
    if access == uplink:
        return "links " + _link(access)
    return f"access links {_link(access)}, uplinks {_link(uplink)}"


def _link(link: Link) -> str:
    words = [_rate(link.bandwidth)]
    if link.loss:
        words.append(f"{100 * link.loss:g}% loss")
    if link.delay_ms:
        words.append(f"{link.delay_ms:g} ms delay")
    if link.buffer_bytes:
        words.append(f"{link.buffer_bytes / 1000:g} KB buffers")
    elif link.buffer_packets:
        words.append(f"{link.buffer_packets}-packet buffers")
    return ", ".join(words)


def _rate(rate_bit: int) -> str:
    """1000000000 -> "1 Gbit/s", 200000000 -> "200 Mbit/s"."""
    for unit, scale in (("Gbit/s", 10**9), ("Mbit/s", 10**6), ("kbit/s", 10**3)):
        if rate_bit >= scale:
            return f"{rate_bit / scale:g} {unit}"
    return f"{rate_bit} bit/s"
