"""`tailcut calibrate JOB.yaml`: the link rates at which this host measures the network.

On a host of few cores a job at 1 Gbit/s is often bound by the CPU, and a comparison
of transports there measures their CPU cost, not the network. Calibrate probes the
job briefly at falling link rates (every access link and uplink set to the rate;
spec.training capped at a number of iterations, no target accuracy, so that a probe
trains for about PROBE_S), for each transport it names, and reports per probe the
fidelity verdict and the time per iteration, and between consecutive rates the
rate-response check: when every link's rate falls by a factor f, a network-bound
job's time per iteration grows by up to f (by f when transfers are all of it), a
host-bound one's hardly at all. Its answer, the highest rate at which each transport
(and every one of them) was network-bound, comes as a table and a YAML snippet to
paste into the spec; it never changes a spec file. calibrate.json holds it all.

Without --iterations the first probe of a transport trains FIRST_ITERATIONS
iterations, and each next one as many as its predecessor's time per iteration,
grown in proportion to the rate, fits in PROBE_S.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from tailcut.errors import RunError, SpecError, TailcutError
from tailcut.fidelity import verdict
from tailcut.runtime import compare

if TYPE_CHECKING:
    from tailcut.spec.model import TrainingJob

DEFAULT_RATES = "1Gbit,500Mbit,200Mbit,100Mbit,50Mbit"
PROBE_S = 15.0            # training time a probe aims at (the brief's 10-30 s)
FIRST_ITERATIONS = 200    # the first probe's, without --iterations
MIN_ITERATIONS, MAX_ITERATIONS = 20, 5000
# a probe's spec.training.timeoutS at most: the PS stops a probe that the estimate of
# its iterations got wrong there, as at its last iteration, and its time per
# iteration counts all the same
PROBE_TIMEOUT_S = 4 * PROBE_S
# elasticity of the time per iteration to 1/rate (log growth / log rate factor) from
# which it is called proportional, and below which flat
PROPORTIONAL, FLAT = 0.75, 0.25


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser(
        "calibrate", help="short probes of a job at falling link rates: the highest rate "
                          "at which this host is network-bound, per transport (needs root; "
                          "changes no file)")
    p.add_argument("job", help="TrainingJob YAML file (only read)")
    p.add_argument("--transports", metavar="T1[,T2,...]",
                   help="transports to probe, comma-separated (default: the job's own)")
    p.add_argument("--rates", default=DEFAULT_RATES, metavar="R1,R2,...",
                   help=f"link rates to probe, tc style, probed highest first (default "
                        f"{DEFAULT_RATES})")
    p.add_argument("--iterations", type=int,
                   help=f"iterations per probe (default: {FIRST_ITERATIONS} for a "
                        f"transport's first, then as many as fit in about {PROBE_S:g} s)")
    p.add_argument("--results-dir", type=Path,
                   help="where to write results (default: results/<job>-calibrate-<time>); "
                        "one probe per subdirectory")
    p.add_argument("--allow-busy", action="store_true",
                   help="probe even if other processes take more of the host's CPU than a "
                        "network-bound verdict allows")
    p.set_defaults(handler=_handle)


def parse_rates(text: str) -> list[int]:
    """The rates of --rates, highest first, each once."""
    rates = [compare.parse_rate(r.strip(), f"--rates {text!r}")
             for r in text.split(",") if r.strip()]
    if not rates:
        raise SpecError(f"--rates {text!r}: name at least one rate, e.g. 200Mbit")
    return sorted(set(rates), reverse=True)


def next_iterations(s_per_iteration: Optional[float], prev_rate: int, rate: int,
                    previous: int, target_s: float = PROBE_S) -> int:
    """Iterations for a probe at `rate` after one at `prev_rate` that took
    `s_per_iteration` (None: it failed, keep `previous`): as many as fit in `target_s`
    if the time per iteration grows in proportion to the rate's fall."""
    if not s_per_iteration:
        return previous
    predicted = s_per_iteration * prev_rate / rate
    return max(MIN_ITERATIONS, min(MAX_ITERATIONS, round(target_s / predicted)))


def probe_job(job: "TrainingJob", kind: str, rate: int, iterations: int,
              index: int) -> "TrainingJob":
    """The probe of `job` over `kind` at `rate`: `iterations` iterations, no target."""
    timeout = min(job.spec.training.timeout_s, PROBE_TIMEOUT_S)
    return compare.variant(job, kind, compare.run_name(job.name, kind, index, tag="cal"),
                           rate, training={"iterations": iterations, "targetAccuracy": None,
                                           "timeoutS": timeout})


@dataclass
class Probe:
    transport: str
    rate_bit: int
    rate: str
    job: str
    results_dir: str
    iterations: int          # asked for
    state: str = "failed"    # finished, failed
    jct_s: Optional[float] = None
    iterations_run: Optional[int] = None
    s_per_iteration: Optional[float] = None
    verdict: Optional[str] = None
    reasons: list[str] = field(default_factory=list)
    error: Optional[str] = None


def elasticity(hi_s: float, lo_s: float, hi_rate_bit: int, lo_rate_bit: int) -> dict[str, Any]:
    """The rate-response check between a time per iteration at a higher rate and one at
    a lower: how much the time grew (growth) against how much the rate fell (expected),
    and the elasticity log(growth) / log(expected): 1 when the time is in proportion to
    1/rate, 0 when the rate did not matter."""
    growth = lo_s / hi_s
    expected = hi_rate_bit / lo_rate_bit
    value = math.log(growth) / math.log(expected)
    kind = ("proportional" if value >= PROPORTIONAL else
            "flat" if value <= FLAT else "partial")
    return {"growth": round(growth, 3), "expected": round(expected, 3),
            "elasticity": round(value, 3), "response": kind}


def response(hi: Probe, lo: Probe) -> dict[str, Any]:
    """The rate-response check between two probes of a transport, and whether it agrees
    with the verdict at the higher rate."""
    assert hi.s_per_iteration and lo.s_per_iteration
    check = elasticity(hi.s_per_iteration, lo.s_per_iteration, hi.rate_bit, lo.rate_bit)
    return {"transport": hi.transport, "from": hi.rate, "to": lo.rate, **check,
            "verdicts": [hi.verdict, lo.verdict],
            "agrees": agrees(check["response"], hi.verdict)}


def agrees(kind: str, at_rate: Optional[str]) -> Optional[bool]:
    """Whether the response tells what the verdict at the higher rate claims: a
    network-bound run's time grows when the rate falls (not flat), a host-bound run's
    does not grow in proportion. None for a marginal or missing verdict, which claims
    neither. The verdict at the lower rate does not enter: a run network-bound at a
    rate stays so below it, and a host-bound one may become network-bound there (its
    time then grows in part)."""
    if at_rate == verdict.NETWORK_BOUND:
        return kind != "flat"
    if at_rate == verdict.HOST_BOUND:
        return kind != "proportional"
    return None


def disagreements(checks: Sequence[Mapping[str, Any]]) -> list[str]:
    """A line for each check whose response and verdict disagree."""
    return [f"{c['transport']} {c['from']} -> {c['to']}: time per iteration "
            f"x{c['growth']:.2f} of x{c['expected']:.2f} ({c['response']}), yet "
            f"{c['verdicts'][0]} at {c['from']}" for c in checks if c["agrees"] is False]


def responses(probes: Sequence[Probe]) -> list[dict[str, Any]]:
    """The check between consecutive finished probes of each transport (rates falling)."""
    out = []
    for t in dict.fromkeys(p.transport for p in probes):
        done = sorted((p for p in probes if p.transport == t and p.s_per_iteration),
                      key=lambda p: -p.rate_bit)
        out += [response(a, b) for a, b in zip(done, done[1:])]
    return out


def highest(probes: Sequence[Probe], transports: Sequence[str]) -> dict[str, Any]:
    """The highest rate at which each transport was network-bound (None: at none), and
    the highest at which every one of them was ("all")."""
    bound = {t: {p.rate_bit for p in probes if p.transport == t and p.state == "finished"
                 and p.verdict == verdict.NETWORK_BOUND} for t in transports}
    each = {t: max(rates) if rates else None for t, rates in bound.items()}
    common = set.intersection(*bound.values()) if bound else set()
    return {"each": each, "all": max(common) if common else None}


def snippet(job: "TrainingJob", rate_bit: int, transports: Sequence[str]) -> str:
    """The spec's links at `rate_bit`, their other fields as the job has them: YAML to
    paste over spec.network's accessLink and uplink."""
    import yaml
    from tailcut.spec import units
    net = job.spec.network
    links = {name: {**link.model_dump(by_alias=True, mode="json", exclude_defaults=True),
                    "bandwidth": units.format_bandwidth(rate_bit)}
             for name, link in (("accessLink", net.access_link), ("uplink", net.uplink))}
    body = yaml.safe_dump({"spec": {"network": links}}, sort_keys=False)
    return (f"# tailcut calibrate: the highest probed rate at which {' and '.join(transports)} "
            f"{'was' if len(transports) == 1 else 'were'} network-bound on this host\n" + body)


def table(probes: Sequence[Probe], checks: Sequence[Mapping[str, Any]]) -> str:
    """One line per probe: rate, iterations, JCT, time per iteration, the growth from
    the rate above (and the rate's factor), the verdict."""
    grown = {(c["transport"], c["to"]): c for c in checks}
    lines = [f"{'transport':<14}{'rate':>9}{'iters':>7}{'JCT s':>8}{'ms/iter':>9}"
             f"{'growth (response)':>30}  verdict"]
    for p in probes:
        if p.s_per_iteration is None or p.jct_s is None:
            lines.append(f"{p.transport:<14}{p.rate:>9}{p.iterations:>7}{'-':>8}{'-':>9}"
                         f"{'-':>30}  failed: {(p.error or '?').splitlines()[0][:60]}")
            continue
        c = grown.get((p.transport, p.rate))
        growth = (f"x{c['growth']:.2f} of x{c['expected']:.2f} {c['response']}" if c
                  else "-")
        lines.append(f"{p.transport:<14}{p.rate:>9}{p.iterations_run or 0:>7}"
                     f"{p.jct_s:>8.1f}{p.s_per_iteration * 1000:>9.1f}{growth:>30}  "
                     f"{p.verdict}")
    return "\n".join(lines)


def execute(probes_of: Callable[[str, int, int, int], "TrainingJob"],
            transports: Sequence[str], rates: Sequence[int], out: Path,
            progress: Callable[[str], None], runner: compare.Runner,
            iterations: Optional[int] = None,
            on_probe: Callable[[list[Probe]], None] = lambda probes: None) -> list[Probe]:
    """Probe every transport at every rate, rates falling, transports interleaved at
    each rate; each probe into out/<rate>-<transport>. `probes_of(transport, rate,
    iterations, index)` gives the probe's job."""
    from tailcut.spec import units
    probes: list[Probe] = []
    last: dict[str, Probe] = {}
    total = len(rates) * len(transports)
    for i, rate in enumerate(rates):
        for t in transports:
            before = last.get(t)
            n = (iterations if iterations is not None else FIRST_ITERATIONS if before is None
                 else next_iterations(before.s_per_iteration, before.rate_bit, rate,
                                      before.iterations))
            job = probes_of(t, rate, n, i + 1)
            where = out / f"{units.format_bandwidth(rate)}-{t}"
            p = Probe(transport=t, rate_bit=rate, rate=units.format_bandwidth(rate),
                      job=job.name, results_dir=str(where), iterations=n)
            k = len(probes) + 1
            progress(f"[{k}/{total}] {t} at {p.rate}: {n} iterations, job {job.name}")
            try:
                result = compare.run_logged(runner, job, where)
            except TailcutError as err:
                p.error = str(err)
                progress(f"[{k}/{total}] {t} at {p.rate}: FAILED: "
                         f"{str(err).splitlines()[0]} (logs in {where})")
            else:
                fid = result.fidelity or {}
                p.state, p.jct_s = "finished", result.jct_s
                p.iterations_run = result.iterations
                p.s_per_iteration = (result.jct_s / result.iterations
                                     if result.iterations else None)
                p.verdict, p.reasons = fid.get("verdict"), list(fid.get("reasons") or [])
                per = (f"{p.s_per_iteration * 1000:.1f} ms per iteration"
                       if p.s_per_iteration else "no iteration")
                progress(f"[{k}/{total}] {t} at {p.rate}: JCT {p.jct_s:.1f} s, {per}, "
                         f"{p.verdict}")
            probes.append(p)
            last[t] = p
            on_probe(probes)
    return probes


def _handle(args: argparse.Namespace) -> int:
    compare.prepare_runtime()
    from tailcut import spec
    from tailcut.runtime import record
    from tailcut.spec import units
    job = spec.load_file(args.job)
    transports = (compare.parse_transports(args.transports, least=1) if args.transports
                  else [job.spec.transport.type])
    rates = parse_rates(args.rates)
    if args.iterations is not None and args.iterations < 1:
        raise SpecError(f"--iterations {args.iterations}: must be at least 1")
    # every transport's probe checked before the first runs
    compare.refuse_unbuildable([probe_job(job, t, rates[0], args.iterations or 1, 1)
                                for t in transports], "--transports")
    if os.geteuid() != 0:
        raise RunError("calibrate runs the job through the local runtime, which needs "
                       "root (it creates network namespaces); run as root or through sudo")
    out = compare.results_dir(args.results_dir, job.name, "calibrate", "calibrate.json")

    def say(line: str) -> None:
        print(line, flush=True)
    before = compare.check_host(args.allow_busy, say)
    source = {"commit": record.commit()}   # tailcut's
    host = record.host()   # as the first run starts (its load1_before)
    out.mkdir(parents=True, exist_ok=True)
    say(f"calibrate {job.name}: {', '.join(transports)} at "
        f"{', '.join(units.format_bandwidth(r) for r in rates)}; results in {out}")

    def document(probes: list[Probe]) -> dict[str, Any]:
        checks = responses(probes)
        best = highest(probes, transports)
        return {"job": job.name, "spec": str(args.job), "transports": transports,
                "rates": [units.format_bandwidth(r) for r in rates],
                "iterations": args.iterations, "probe_s": PROBE_S,
                "tailcut": source, "host": host,
                "host_before": before, "probes": [asdict(p) for p in probes],
                "rate_response": checks,
                "highest_network_bound": {
                    "each": {t: None if r is None else units.format_bandwidth(r)
                             for t, r in best["each"].items()},
                    "all": None if best["all"] is None
                    else units.format_bandwidth(best["all"])},
                "snippet": None if best["all"] is None
                else snippet(job, best["all"], transports)}

    def write(probes: list[Probe]) -> None:
        (out / "calibrate.json").write_text(json.dumps(document(probes), indent=2) + "\n")
    probes = execute(lambda t, r, n, i: probe_job(job, t, r, n, i), transports, rates, out,
                     say, compare.local_runner(), args.iterations, on_probe=write)
    final = document(probes)
    print(f"\n{job.name} on this host: verdict and time per iteration per link rate")
    print(table(probes, final["rate_response"]))
    for line in disagreements(final["rate_response"]):
        print(f"rate response and verdict disagree: {line}")
    for t, r in final["highest_network_bound"]["each"].items():
        print(f"highest network-bound rate, {t}: {r or 'none of those probed'}")
    if final["snippet"]:
        print("\nspec snippet (paste over spec.network's links; calibrate changed no "
              "file):\n" + final["snippet"], end="")
    else:
        print("no probed rate was network-bound for every transport: probe lower "
              "--rates, or on a quieter host", file=sys.stderr)
    print(f"results: {out} (calibrate.json; one directory per probe)")
    return 0 if all(p.state == "finished" for p in probes) else 1
