"""`tailcut compare JOB.yaml --transports tcp,bounded-loss`: one job over several
transports, run the way a paper needs the comparison.

The same job and network, only spec.transport.type changed (the job's own transport
settings kept where they apply, p = DEFAULT_P for a lossy transport the job gives none),
run by run interleaved (tcp, bounded-loss, tcp, bounded-loss, ...) so that a host
whose load drifts drifts for both, each run in its own directory under its own job
name (the namespaces are named after the job). Per transport: the median JCT and
final accuracy with their spread, and every run's fidelity verdict; the ratio of
median JCTs (the first transport's over each other's) is called "met" only when
every run of both was network-bound, and otherwise carries the verdicts. One table
printed, compare.json, compare.csv (one row per run) and compare.png.

A comparison on a busy host measures the host, so it measures the host's CPU for
BUSY_SAMPLE_S first and refuses to start while other processes take more than the
verdict's others_cpu margin, unless --allow-busy; compare.json records that reading.

The pure parts (variants, spreads, the "met" rule, the refusal) are functions of their
inputs; `execute` takes the runner (local.run by default) as a parameter.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Protocol, Sequence

from tailcut.errors import RunError, SpecError, TailcutError
from tailcut.fidelity import hostcpu, processes, verdict
from tailcut.spec import transport_kinds

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tailcut.spec.model import TrainingJob

DEFAULT_P = 0.9   # bounded-loss/app-drop's p when the job gives none: the benches' value
MAX_JOB_NAME = 40   # spec.model.Metadata: a DNS label of at most 40 characters
BUSY_SAMPLE_S = 2.0
FILES = ("compare.json", "compare.csv", "compare.png")


class HostBusy(TailcutError):
    """Other processes took more of the host's CPU than a network-bound run allows."""


class Outcome(Protocol):
    """What a run returns (local.RunResult's fields that compare reads)."""

    @property
    def jct_s(self) -> float: ...

    @property
    def final_accuracy(self) -> float: ...

    @property
    def converged(self) -> bool: ...

    @property
    def iterations(self) -> int: ...

    @property
    def fidelity(self) -> Optional[dict[str, Any]]: ...


Runner = Callable[["TrainingJob", Path, Callable[[str], None]], Outcome]


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser(
        "compare", help="one job over several transports, runs interleaved: medians, "
                        "spread, each run's fidelity verdict, a table and a figure "
                        "(needs root)")
    p.add_argument("job", help="TrainingJob YAML file")
    p.add_argument("--transports", required=True, metavar="T1,T2[,...]",
                   help="transports to compare, comma-separated (e.g. tcp,bounded-loss); "
                        "ratios are the first one's JCT over each other's")
    p.add_argument("--runs", type=int, default=3, help="runs per transport (default 3)")
    p.add_argument("--bandwidth", metavar="RATE",
                   help="access link and uplink rate for every run, tc style (e.g. "
                        "200Mbit); default: the job's")
    p.add_argument("--results-dir", type=Path,
                   help="where to write results (default: results/<job>-compare-<time>); "
                        "one run per subdirectory")
    p.add_argument("--allow-busy", action="store_true",
                   help="run even if other processes take more of the host's CPU than a "
                        "network-bound verdict allows")
    p.set_defaults(handler=_handle)


# --- the job's variants ----------------------------------------------------------

def parse_transports(text: str, flag: str = "--transports", least: int = 2) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    for name in names:
        if name not in transport_kinds.names():
            raise SpecError(f"{flag} {text!r}: unknown transport {name!r}; known: "
                            f"{', '.join(transport_kinds.names())}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise SpecError(f"{flag} {text!r}: {', '.join(repeated)} named twice")
    if len(names) < least:
        raise SpecError(f"{flag} {text!r}: name at least {least} transports, "
                        "comma-separated, e.g. tcp,bounded-loss")
    return names


def parse_rate(text: str, flag: str) -> int:
    from tailcut.spec import units
    try:
        return units.parse_bandwidth(text)
    except ValueError as err:
        raise SpecError(f"{flag}: {err}") from err


def transport_fields(job: "TrainingJob", kind: str) -> dict[str, Any]:
    """spec.transport for `job` over `kind`: the job's own settings where they apply
    to `kind` (p, minP, rateMbit, xdpMode, tcpCongestionControl), p = DEFAULT_P for a
    lossy transport the job gives no p."""
    own = job.spec.transport
    traits = transport_kinds.get(kind)
    out: dict[str, Any] = {"type": kind}
    if traits.takes_p:
        out["p"] = own.p if own.p is not None else DEFAULT_P
    if traits.xdp_counter:
        out["xdpMode"] = own.xdp_mode
        if own.min_p is not None and own.min_p <= out["p"]:
            out["minP"] = own.min_p
    if traits.datagrams and own.rate_mbit is not None:
        out["rateMbit"] = own.rate_mbit
    if traits.kernel_tcp and own.tcp_congestion_control is not None:
        out["tcpCongestionControl"] = own.tcp_congestion_control
    return out


def variant(job: "TrainingJob", kind: str, name: str, bandwidth_bit: Optional[int] = None,
            training: Optional[Mapping[str, Any]] = None) -> "TrainingJob":
    """`job` named `name` over transport `kind`; with `bandwidth_bit`, every access
    link's and uplink's rate; `training`: spec.training fields to set (YAML names)."""
    from tailcut import spec
    from tailcut.spec import units
    raw = job.model_dump(by_alias=True, mode="json")
    raw["metadata"]["name"] = name
    raw["spec"]["transport"] = transport_fields(job, kind)
    if bandwidth_bit is not None:
        for link in ("accessLink", "uplink"):
            raw["spec"]["network"][link]["bandwidth"] = units.format_bandwidth(bandwidth_bit)
    raw["spec"]["training"].update(training or {})
    try:
        return spec.from_dict(raw, source=f"{job.name} over {kind}")
    except SpecError as err:
        raise SpecError(f"--transports {kind}: the job cannot run over it: {err}") from err


def run_name(base: str, kind: str, index: int, tag: str = "") -> str:
    """A job name unique to one run: <base>-<tag><transport><index>, base shortened to
    fit the 40 characters of a job name (e.g. quickstart-bg-bl2)."""
    suffix = f"-{tag}{transport_kinds.get(kind).label}{index}"
    return base[:MAX_JOB_NAME - len(suffix)].rstrip("-") + suffix


def condition(job: "TrainingJob") -> str:
    """The network a run had, in a few words, for titles: rates, loss, delay,
    buffers and background load."""
    from tailcut.spec import units
    net = job.spec.network
    a, u = net.access_link, net.uplink
    words = [f"access {units.format_bandwidth(a.bandwidth)}, uplink "
             f"{units.format_bandwidth(u.bandwidth)}"]
    for name, link in (("access", a), ("uplink", u)):
        if link.loss:
            words.append(f"{name} loss {link.loss:g}")
        if link.delay_ms:
            words.append(f"{name} delay {link.delay_ms:g} ms")
        if link.buffer_bytes is not None:
            words.append(f"{name} buffer {link.buffer_bytes / 1000:g} KB")
        if link.buffer_packets is not None:
            words.append(f"{name} buffer {link.buffer_packets} packets")
    bg = job.spec.background_load
    if bg is not None:
        target = bg.target
        load = (f"load {target.load_factor:g} on {target.link}" if target.load_factor
                is not None else f"{target.requests_per_s:g} flows/s")
        words.append(f"background {load}")
    return ", ".join(words)


# --- the runs and what they add up to ----------------------------------------------

@dataclass
class Run:
    """One run of the comparison, as compare.csv's row."""

    order: int           # 1, 2, ... in the order the runs were made
    run: int             # 1..runs, per transport
    transport: str
    job: str
    results_dir: str
    state: str = "failed"   # finished, target-not-reached, failed
    jct_s: Optional[float] = None
    final_accuracy: Optional[float] = None
    iterations: Optional[int] = None
    verdict: Optional[str] = None
    reasons: list[str] = field(default_factory=list)
    error: Optional[str] = None


CSV_FIELDS = ("order", "run", "transport", "job", "state", "jct_s", "final_accuracy",
              "iterations", "verdict", "reasons", "results_dir", "error")


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, min, max and the quartiles (inclusive method) of `values`."""
    if not values:
        return {"n": 0, "median": None, "min": None, "max": None, "q1": None, "q3": None}
    q1, _, q3 = (statistics.quantiles(values, n=4, method="inclusive")
                 if len(values) > 1 else (values[0],) * 3)
    return {"n": len(values), "median": statistics.median(values), "min": min(values),
            "max": max(values), "q1": q1, "q3": q3}


def verdicts(runs: Sequence[Run]) -> str:
    """'2 network-bound, 1 host-bound' (and failed runs, and runs without a verdict)."""
    count = {v: 0 for v in (*verdict.VERDICTS, "no verdict", "failed")}
    for r in runs:
        judged = r.verdict if r.verdict in verdict.VERDICTS else "no verdict"
        count["failed" if r.state == "failed" else judged] += 1
    return ", ".join(f"{n} {v}" for v, n in count.items() if n) or "no runs"


def met(a: Sequence[Run], b: Sequence[Run]) -> bool:
    """A ratio of two transports' JCTs is met only when every run of both finished and
    was network-bound."""
    return bool(a) and bool(b) and all(r.state != "failed" and r.verdict == verdict.NETWORK_BOUND
                                       for r in (*a, *b))


def summarize(runs: Sequence[Run], transports: Sequence[str]) -> dict[str, Any]:
    """Per transport: JCT and accuracy spreads over its finished runs, its verdicts;
    and the ratios of the first transport's median JCT over each other's."""
    of = {t: [r for r in runs if r.transport == t] for t in transports}
    per: dict[str, Any] = {}
    for t, mine in of.items():
        done = [r for r in mine if r.state != "failed"]
        per[t] = {"runs": len(mine), "failed": len(mine) - len(done),
                  "jct_s": spread([r.jct_s for r in done if r.jct_s is not None]),
                  "final_accuracy": spread([r.final_accuracy for r in done
                                            if r.final_accuracy is not None]),
                  "verdicts": verdicts(mine)}
    first = transports[0]
    ratios = []
    for t in transports[1:]:
        top, bottom = per[first]["jct_s"]["median"], per[t]["jct_s"]["median"]
        ratio = top / bottom if top is not None and bottom else None
        ok = met(of[first], of[t])
        ratios.append({"numerator": first, "denominator": t, "ratio": ratio, "met": ok,
                       "mark": "met" if ok else
                       f"not met: {first} {per[first]['verdicts']}; {t} {per[t]['verdicts']}"})
    return {"transports": per, "ratios": ratios}


def execute(variants: Mapping[str, Sequence["TrainingJob"]], out: Path,
            progress: Callable[[str], None], runner: Runner,
            on_run: Callable[[list[Run]], None] = lambda runs: None) -> list[Run]:
    """Run `variants` (transport -> its runs' jobs) interleaved: run 1 of every
    transport, then run 2, ...; each into out/run<i>-<transport>, its progress lines
    into progress.log there. A failed run is recorded and the others go on;
    `on_run` gets the runs so far after each."""
    transports = list(variants)
    count = max(len(v) for v in variants.values())
    total = sum(len(v) for v in variants.values())
    runs: list[Run] = []
    for i in range(count):
        for t in transports:
            if i >= len(variants[t]):
                continue
            job = variants[t][i]
            where = out / f"run{i + 1}-{t}"
            r = Run(order=len(runs) + 1, run=i + 1, transport=t, job=job.name,
                    results_dir=str(where))
            progress(f"[{r.order}/{total}] {t} run {i + 1}: job {job.name} in {where}")
            try:
                result = run_logged(runner, job, where)
            except TailcutError as err:   # the others still count; say which failed
                r.error = str(err)
                progress(f"[{r.order}/{total}] {t} run {i + 1}: FAILED, not counted: "
                         f"{str(err).splitlines()[0]} (logs in {where})")
            else:
                fid = result.fidelity or {}
                r.state = ("finished" if result.converged
                           or job.spec.training.target_accuracy is None
                           else "target-not-reached")
                r.jct_s, r.final_accuracy = result.jct_s, result.final_accuracy
                r.iterations = result.iterations
                r.verdict, r.reasons = fid.get("verdict"), list(fid.get("reasons") or [])
                target = "" if r.state != "target-not-reached" else " (target not reached)"
                progress(f"[{r.order}/{total}] {t} run {i + 1}: JCT {r.jct_s:.2f} s, "
                         f"accuracy {r.final_accuracy:.3f}{target}, {r.verdict}")
            runs.append(r)
            on_run(runs)
    return runs


# --- the host before ------------------------------------------------------------

def measure_host(seconds: float = BUSY_SAMPLE_S,
                 sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """The host's CPU over `seconds` and the share other processes took (this
    process's tree counts as the job's)."""
    tally = processes.Tally(roots={os.getpid()})
    before = hostcpu.read()
    tally.add(processes.read())
    sleep(seconds)
    tally.add(processes.read())
    host = hostcpu.window(before, hostcpu.read())
    return {"host": host, "processes": tally.summary(host["wall_s"], host["cores"])}


def busy_refusal(state: Mapping[str, Any]) -> Optional[str]:
    """What makes the host too busy to compare on (measure_host's reading), or None:
    other processes took more than the verdict's others_cpu margin."""
    limit = verdict.THRESHOLDS["others_cpu"][0]
    procs = state["processes"]
    share = float(procs["share"]["others"])
    if share <= limit:
        return None
    busiest = ", ".join(f"{name} {s:.1f} s" for name, s in
                        (procs.get("busiest_others") or {}).items()) or "none named"
    host = state["host"]
    return (f"the host is busy: other processes took {share:.0%} of its {host['cores']} "
            f"cores over {host['wall_s']:.1f} s (busiest: {busiest}; host {host['busy']:.0%} "
            f"busy, load {host['load1']}), more than the {limit:.0%} a network-bound run "
            "allows")


def check_host(allow_busy: bool, progress: Callable[[str], None],
               measure: Callable[[], dict[str, Any]] = measure_host) -> dict[str, Any]:
    """measure_host's reading, with "refusal" (or None) and "allowed_busy"; raise
    HostBusy if busy and not `allow_busy`."""
    state = measure()
    why = busy_refusal(state)
    if why and not allow_busy:
        raise HostBusy(f"{why}: the runs would measure the host, not the network. Wait "
                       "for them to finish, or pass --allow-busy to run anyway (each "
                       "run's verdict then says what it cost)")
    if why:
        progress(f"warning: {why}; --allow-busy: running anyway")
    else:
        others = state["processes"]["share"]["others"]
        progress(f"host before: {state['host']['busy']:.0%} of {state['host']['cores']} "
                 f"cores busy, other processes {others:.0%}, load {state['host']['load1']}")
    return {**state, "refusal": why, "allowed_busy": allow_busy}


def results_dir(given: Optional[Path], job: str, what: str, marker: str) -> Path:
    """--results-dir, or results/<job>-<what>-<time>; one holding `marker` is refused."""
    out = given or Path("results") / f"{job}-{what}-{time.strftime('%Y%m%d-%H%M%S')}"
    if (out / marker).exists():
        raise SpecError(f"--results-dir {out}: holds a {what} already ({marker}); choose "
                        "another directory or remove it")
    return out


def prepare_runtime() -> None:
    """What `tailcut run` does before numpy loads: one BLAS thread, and the roles
    forked from this process (tailcut.runtime.rolefork)."""
    blas_first = "numpy" not in sys.modules
    # before numpy loads (importing rolefork loads it): rolefork.BLAS_THREADS
    os.environ.update({v: "1" for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                        "MKL_NUM_THREADS")})
    from tailcut.runtime import rolefork
    rolefork.enable(numpy_loaded_after=blas_first)


def local_runner() -> Runner:
    from tailcut.runtime import local

    def run(job: "TrainingJob", out: Path, progress: Callable[[str], None]) -> Outcome:
        return local.run(job, out, progress)
    return run


def refuse_unbuildable(jobs: Sequence["TrainingJob"], flag: str) -> None:
    """Every variant checked before the first run: none refused halfway through."""
    from tailcut import features, plan
    for job in jobs:
        found = plan.refusals(job, "local", features.netem)
        if found:
            raise SpecError(f"{flag}: job {job.name}: {found[0].message}")


# --- output -------------------------------------------------------------------------

def table(summary: Mapping[str, Any]) -> str:
    """The printed table: per transport, JCT and accuracy (median, min-max), verdicts;
    then each ratio, met or marked."""
    head = (f"{'transport':<14}{'runs':>5}{'JCT median':>12}{'JCT min-max':>18}"
            f"{'acc median':>12}{'acc min-max':>15}  verdicts")
    lines = [head]
    for t, s in summary["transports"].items():
        j, a = s["jct_s"], s["final_accuracy"]
        jct = (f"{j['median']:>10.2f} s{j['min']:>9.2f}-{j['max']:.2f} s" if j["n"]
               else f"{'-':>12}{'-':>18}")
        acc = (f"{a['median']:>12.3f}{a['min']:>9.3f}-{a['max']:.3f}" if a["n"]
               else f"{'-':>12}{'-':>15}")
        runs = f"{j['n']}" + (f"+{s['failed']}F" if s["failed"] else "")
        lines.append(f"{t:<14}{runs:>5}{jct}{acc}  {s['verdicts']}")
    for r in summary["ratios"]:
        value = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(f"JCT({r['numerator']}) / JCT({r['denominator']}), medians: {value} "
                     f"({r['mark']})")
    return "\n".join(lines)


def run_table(runs: Sequence[Run], transports: Sequence[str]) -> str:
    """Every run's JCT and verdict: a row per run, a column per transport."""
    width = 30
    lines = ["run  " + "".join(f"{t:<{width}}" for t in transports).rstrip()]
    for i in sorted({r.run for r in runs}):
        cells = []
        for t in transports:
            r = next((r for r in runs if r.transport == t and r.run == i), None)
            cells.append("" if r is None else "FAILED" if r.jct_s is None
                         else f"{r.jct_s:.2f} s {r.verdict or 'no verdict'}")
        lines.append(f"{i:<5}" + "".join(f"{c:<{width}}" for c in cells).rstrip())
    return "\n".join(lines)


def write(out: Path, document: Mapping[str, Any], runs: Sequence[Run]) -> None:
    """compare.json and compare.csv (one row per run)."""
    (out / "compare.json").write_text(json.dumps(document, indent=2) + "\n")
    with open(out / "compare.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for r in runs:
            row = asdict(r)
            row["reasons"] = "; ".join(r.reasons)
            writer.writerow({k: row[k] for k in CSV_FIELDS})


MARKERS = {verdict.NETWORK_BOUND: ("o", "network-bound"),
           verdict.MARGINAL: ("s", "marginal"),
           verdict.HOST_BOUND: ("x", "host-bound")}


def run_logged(runner: Runner, job: "TrainingJob", where: Path) -> Outcome:
    """One run of `job` into its own directory `where`, its progress lines in
    progress.log there (compare's runs and calibrate's probes)."""
    where.mkdir(parents=True, exist_ok=True)
    with open(where / "progress.log", "w") as log:
        def say(line: str) -> None:
            log.write(line + "\n")
            log.flush()
        return runner(job, where, say)


def plot(runs: Sequence[Run], transports: Sequence[str], title: str, path: Path) -> Path:
    """compare.png: `draw`'s figure."""
    from tailcut.reports import style
    return style.save(draw(runs, transports, title), path)


def draw(runs: Sequence[Run], transports: Sequence[str], title: str) -> "Figure":
    """JCT of every run per transport (marker: its verdict), each transport's median
    a bar across its runs; the title wrapped to the figure, the legend where it covers
    no run (tailcut.reports.style)."""
    from matplotlib.lines import Line2D

    from tailcut.reports import style
    fig, ax = style.figure()
    try:
        used: set[str] = set()
        for x, t in enumerate(transports):
            mine = [(r.jct_s, r.verdict or "") for r in runs
                    if r.transport == t and r.jct_s is not None]
            n = max(len(mine), 1)
            for k, (jct, judged) in enumerate(mine):
                dx = (k - (n - 1) / 2) * min(0.08, 0.5 / n)
                marker, _ = MARKERS.get(judged, ("d", "no verdict"))
                used.add(judged)
                ax.plot(x + dx, jct, marker=marker, linestyle="none", markersize=8,
                        color=f"C{x}", markerfacecolor="none" if marker != "x" else None)
            if mine:
                median = statistics.median(jct for jct, _ in mine)
                ax.hlines(median, x - 0.3, x + 0.3, colors="black", linewidth=1.5)
        ax.set_xticks(range(len(transports)), list(transports))
        ax.set_xlim(-0.6, len(transports) - 0.4)
        ax.set_xlabel("transport")
        ax.set_ylabel("job completion time (s)")
        tallest = max((r.jct_s for r in runs if r.jct_s is not None), default=1.0)
        ax.set_ylim(0, tallest * 1.35)   # room above the runs for the legend
        ax.grid(axis="y", alpha=0.3)
        handles = [Line2D([], [], marker=m, linestyle="none", color="gray",
                          markerfacecolor="none" if m != "x" else None,
                          label=f"{label} run")
                   for v, (m, label) in MARKERS.items() if v in used]
        handles.append(Line2D([], [], color="black", linewidth=1.5, label="median JCT"))
        style.title(fig, title)
        style.legend(ax, handles, [str(h.get_label()) for h in handles], fontsize=9)
    except BaseException:
        import matplotlib.pyplot as plt
        plt.close(fig)
        raise
    return fig


# --- the command ----------------------------------------------------------------------

def _handle(args: argparse.Namespace) -> int:
    prepare_runtime()
    from tailcut import spec
    from tailcut.runtime import record
    job = spec.load_file(args.job)
    transports = parse_transports(args.transports)
    if args.runs < 1:
        raise SpecError(f"--runs {args.runs}: must be at least 1")
    rate = None if args.bandwidth is None else parse_rate(args.bandwidth, "--bandwidth")
    variants = {t: [variant(job, t, run_name(job.name, t, i + 1), rate)
                    for i in range(args.runs)] for t in transports}
    refuse_unbuildable([v[0] for v in variants.values()], "--transports")
    if os.geteuid() != 0:
        raise RunError("compare runs the job through the local runtime, which needs root "
                       "(it creates network namespaces); run as root or through sudo")
    out = results_dir(args.results_dir, job.name, "compare", "compare.json")

    def say(line: str) -> None:
        print(line, flush=True)
    shown = variants[transports[0]][0]
    title = (f"{job.name}: JCT per run, {condition(shown)}; {args.runs} interleaved "
             f"run(s) per transport")
    before = check_host(args.allow_busy, say)
    source = {"commit": record.commit()}   # tailcut's
    host = record.host()   # as the first run starts (its load1_before)
    out.mkdir(parents=True, exist_ok=True)
    settings = {t: transport_fields(job, t) for t in transports}
    say(f"compare {job.name}: {', '.join(transports)}, {args.runs} run(s) each, "
        f"{condition(shown)}; results in {out}")

    def document(runs: list[Run]) -> dict[str, Any]:
        return {"job": job.name, "spec": str(args.job), "transports": transports,
                "transport_settings": settings, "runs_per_transport": args.runs,
                "bandwidth": args.bandwidth, "condition": condition(shown),
                "tailcut": source, "host": host,
                "host_before": before, "summary": summarize(runs, transports),
                "runs": [asdict(r) for r in runs]}
    runs = execute(variants, out, say, local_runner(),
                   on_run=lambda so_far: write(out, document(so_far), so_far))
    summary = summarize(runs, transports)
    plot(runs, transports, title, out / "compare.png")
    print(f"\n{title}")
    print(table(summary))
    print("\n" + run_table(runs, transports))
    print(f"results: {out} ({', '.join(FILES)}; one directory per run)")
    failed = [f"{r.transport} run {r.run}" for r in runs if r.state == "failed"]
    if failed:
        print(f"tailcut compare: {len(failed)} run(s) failed, not counted: "
              f"{', '.join(failed)}", file=sys.stderr)
        return 1
    return 0
