"""Bounded loss against TCP where the papers say it matters: one table, five conditions.

    .venv/bin/python bench/bl_conditions.py [--runs 3] [--conditions clean incast ...]
        [--executor kubernetes --kubeconfig KUBECONFIG]

Each condition is the quickstart model (mlp to 93% test accuracy) over tcp and over
bounded-loss p=0.9, run by run interleaved (tcp, bounded-loss, tcp, ...), through
`tailcut run`'s local runtime:

  clean                examples/quickstart.yaml: default (deep) queues
  clean-shallow        the same, every switch port's buffer 85 KB
  loss-1%              1% random loss on every access link (the coin flip)
  background-shallow   examples/quickstart-background.yaml (Locust at load 0.5 on
                       rack-1's uplink, flows ending in the PS's pod), 85 KB buffers
  incast-shallow       examples/incast.yaml: 8 workers and the PS in one rack, 85 KB

85 KB is a 1 Gbit/s port's share of a shallow shared-buffer switch (DCTCP, SIGCOMM'10:
4 MB for 48 ports); docs/network.md. Per condition it prints the median JCT of each
transport and their ratio tcp / bounded-loss (> 1: bounded loss is faster), the
median accuracy, the drops by cause (full switch queues, the random-loss dropper) and
TCP's retransmitted segments and retransmission timeouts (the pods' kernel counters,
summed over the job; bounded-loss's count its TCP control channel), and the CPU the
roles used while training (metrics.json's cpu: the pods share the host's cores, so
a transport's CPU per message is part of its JCT; docs/bounded-loss.md#cpu-time), and
what each job left the background load where there is one: Locust's completed flows
per second and their median completion time (a transport that wins by running over
the other traffic shows there). Root.

--executor kubernetes applies the same jobs to the cluster the kubeconfig names (the
operator and agent of the chart, docs/kubernetes.md; bench/k8s_quickstart.py's way)
and reads the JCT, accuracy and queue drops from the job's status; random drops, TCP
counters, CPU and Locust's figures are not in the status, so those columns read nan
(not measured) there, and so do the verdicts (unmeasured: no ratio is "met").
Every run prints its fidelity verdict, and each tcp / bl is marked with both
transports' verdicts ("met" only when all were network-bound; bench/README.md).
--rate-response then runs every cell once more, each transport, with every link at
half the rate, and checks each verdict against how the time per iteration grew
(tailcut calibrate's check, docs/compare.md): a network-bound run's grows about in
proportion, a host-bound run's does not; a line names every cell where the two
disagree.
Goals (issue 20): clean >= 0.95, loss-1% >= 4, background-shallow >= 1.5,
incast-shallow >= 2, accuracy within 0.5% of tcp's in every row."""

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import hostcheck  # noqa: E402
from tailcut import errors, spec  # noqa: E402
from tailcut.runtime import calibrate, local  # noqa: E402
from tailcut.spec import units  # noqa: E402

SHALLOW = {"bufferBytes": 85_000}
TRANSPORTS = {"tcp": {"type": "tcp"}, "bounded-loss": {"type": "bounded-loss", "p": 0.9}}


def _quickstart(example: str = "quickstart.yaml") -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / example).read_text())


def _shallow(raw: dict[str, Any]) -> dict[str, Any]:
    for link in ("accessLink", "uplink"):
        raw["spec"]["network"][link].update(SHALLOW)
    return raw


def _lossy(raw: dict[str, Any]) -> dict[str, Any]:
    raw["spec"]["network"]["accessLink"]["loss"] = 0.01
    return raw


CONDITIONS = {
    "clean": lambda: _quickstart(),
    "clean-shallow": lambda: _shallow(_quickstart()),
    "loss-1%": lambda: _lossy(_quickstart()),
    "background-shallow": lambda: _shallow(_quickstart("quickstart-background.yaml")),
    "incast-shallow": lambda: _quickstart("incast.yaml"),
}


TCP_CONGESTION_CONTROL: str | None = None  # --tcp-congestion-control; None: the kernel's
BANDWIDTH: str | None = None  # --bandwidth: every link's rate; None: the examples' 1Gbit


def job(condition: str, transport: str, bandwidth: str | None = None
        ) -> spec.model.TrainingJob:
    raw = CONDITIONS[condition]()
    raw["metadata"]["name"] = f"blc-{'tcp' if transport == 'tcp' else 'bl'}"
    raw["spec"]["transport"] = dict(TRANSPORTS[transport])
    rate = bandwidth or BANDWIDTH
    if rate:
        for link in ("accessLink", "uplink"):
            raw["spec"]["network"][link]["bandwidth"] = rate
    if transport == "tcp" and TCP_CONGESTION_CONTROL:
        raw["spec"]["transport"]["tcpCongestionControl"] = TCP_CONGESTION_CONTROL
    return spec.from_dict(raw)


def on_cluster(condition: str, transport: str, kubeconfig: str, run: int) -> dict[str, Any]:
    from bench import k8s_quickstart
    raw = job(condition, transport).model_dump(by_alias=True, mode="json")
    raw["metadata"] = {"name": f"{raw['metadata']['name']}-{run}"}
    jct, _, status = k8s_quickstart.run_job(kubeconfig, "tailcut-bench", raw)
    # The job's status carries no random drops, TCP counters, CPU or Locust figures:
    # NaN (not measured), not 0 (measured none).
    unknown = float("nan")
    return {"jct_s": jct, "accuracy": float(status.get("accuracy", 0.0)), "converged": True,
            "queue_drops": int(status.get("queueDrops", {}).get("total", 0)),
            "random_drops": unknown, "retrans": unknown, "rtos": unknown, "cpu_s": unknown,
            "bg_flows_per_s": unknown, "bg_fct_ms": unknown, **hostcheck.columns(None),
            "during": hostcheck.during(None)}


def background(out: Path) -> dict[str, float]:
    """What the job left the competing traffic: Locust's completed flows per second
    and their median completion time (NaN without background load)."""
    path = out / "background" / "background.json"
    if not path.exists():
        return {"bg_flows_per_s": float("nan"), "bg_fct_ms": float("nan")}
    total = json.loads(path.read_text()).get("locust_total", {})
    return {"bg_flows_per_s": float(total.get("Requests/s", "nan")),
            "bg_fct_ms": float(total.get("Median Response Time", "nan"))}


class RunFailed(Exception):
    """One run of the bench failed; its results directory is kept for a look."""


def one(condition: str, transport: str, bandwidth: str | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="blc-") as out:
        try:
            r = local.run(job(condition, transport, bandwidth), Path(out),
                          progress=lambda line: None)
        except errors.RunError as err:
            kept = Path(tempfile.mkdtemp(prefix=f"blc-failed-{transport}-"))
            shutil.copytree(out, kept, dirs_exist_ok=True)
            raise RunFailed(f"{err} (its results and logs: {kept})") from err
        network = json.loads((Path(out) / "network.json").read_text())
        cpu = json.loads((Path(out) / "metrics.json").read_text()).get("cpu", {})
        competing = background(Path(out))
    return {"jct_s": r.jct_s, "accuracy": r.final_accuracy, "converged": r.converged,
            "s_per_iteration": r.jct_s / max(r.iterations, 1),
            "queue_drops": network.get("queue_drops", {}).get("total", 0),
            "random_drops": network.get("ebpf_dropper", {}).get("dropped", 0),
            "retrans": r.tcp_retrans_segs or 0, "rtos": r.tcp_rto_timeouts or 0,
            # the roles' CPU while training (tailcut.training.cpustats): on a shared
            # host a transport's CPU per message is part of its JCT
            "cpu_s": float(cpu.get("total_s", float("nan"))), **competing,
            **hostcheck.columns(r.fidelity), "during": hostcheck.during(r.fidelity),
            # the whole verdict with its evidence, so that --json keeps what a later
            # rule would need to judge the run again (verdict.judge(**evidence))
            "fidelity": r.fidelity}


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def described(r: dict[str, Any], started: float) -> str:
    """One run's figures, for its progress line."""
    return (f"JCT {r['jct_s']:6.2f} s, accuracy {r['accuracy']:.4f}"
            f"{'' if r['converged'] else ' (NOT reached)'}, queue drops {r['queue_drops']}, "
            f"random drops {r['random_drops']}, tcp retrans {r['retrans']} / RTOs {r['rtos']}, "
            f"roles' CPU {r['cpu_s']:.1f} s, background {r['bg_flows_per_s']:.1f} flows/s of "
            f"median FCT {r['bg_fct_ms']:.0f} ms (wall {time.monotonic() - started:.0f} s, "
            f"load {load()}); {r['during']}")


def judged(kind: str, verdicts: list[str]) -> bool | None:
    """Whether a response agrees with the verdicts of a cell's runs at the higher rate:
    False if it disagrees with any of them, True if it agrees with one, None when every
    one is marginal or unmeasured (they claim neither)."""
    seen = {calibrate.agrees(kind, v) for v in verdicts}
    return False if False in seen else True if True in seen else None


def rate_response(conditions: list[str], runs: dict[str, dict[str, list[dict[str, Any]]]],
                  bandwidth: str, failed: list[str]) -> list[dict[str, Any]]:
    """Every cell once more at half `bandwidth`, each transport: the rate-response check
    of the median time per iteration of its runs against this one's."""
    upper = units.parse_bandwidth(bandwidth)
    lower = units.format_bandwidth(upper // 2)
    checks = []
    for c in conditions:
        for t in TRANSPORTS:
            if not runs[c][t]:
                continue
            started = time.monotonic()
            try:
                r = one(c, t, lower)
            except RunFailed as err:
                print(f"at {lower} {c:>18} {t:>12}: FAILED, not counted: {err}", flush=True)
                failed.append(f"{c} {t} at {lower}")
                continue
            print(f"at {lower} {c:>18} {t:>12}: {described(r, started)}", flush=True)
            verdicts = [x["verdict"] for x in runs[c][t]]
            above = statistics.median(x["s_per_iteration"] for x in runs[c][t])
            check = calibrate.elasticity(above, r["s_per_iteration"], upper, upper // 2)
            checks.append({"condition": c, "transport": t, "from": bandwidth, "to": lower,
                           **check, "verdicts": verdicts, "verdict_lower": r["verdict"],
                           "agrees": judged(check["response"], verdicts),
                           "ms_per_iteration": [1e3 * above, 1e3 * r["s_per_iteration"]]})
    return checks


def response_table(checks: list[dict[str, Any]]) -> str:
    """The rate-response table, and a line for every cell where it disagrees."""
    first = checks[0]
    lines = [f"\nRate response: every link from {first['from']} to {first['to']}, one run "
             "each (time per iteration against the median of the runs above):\n",
             f"| condition | transport | ms/iter at {first['from']} | ms/iter at {first['to']} "
             "| growth (response) | verdicts above | verdict below | agrees |",
             "|---|---|---:|---:|---|---|---|---|"]
    for k in checks:
        hi, lo = k["ms_per_iteration"]
        agree = {True: "yes", False: "**NO**", None: "n/a (marginal)"}[k["agrees"]]
        lines.append(f"| {k['condition']} | {k['transport']} | {hi:.1f} | {lo:.1f} "
                     f"| x{k['growth']:.2f} of x{k['expected']:.2f} {k['response']} "
                     f"| {hostcheck.counted(k['verdicts'])} "
                     f"| {k['verdict_lower']} | {agree} |")
    wrong = [k for k in checks if k["agrees"] is False]
    lines.append(f"\n{len(wrong)} of {len(checks)} cells disagree with the rate response"
                 + "".join(f"\n  {k['condition']} {k['transport']}: x{k['growth']:.2f} of "
                           f"x{k['expected']:.2f} ({k['response']}) against "
                           f"{', '.join(k['verdicts'])}" for k in wrong))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--conditions", nargs="+", choices=list(CONDITIONS),
                    default=list(CONDITIONS))
    ap.add_argument("--json", type=Path, help="also write every run's figures here")
    ap.add_argument("--executor", choices=["local", "kubernetes"], default="local")
    ap.add_argument("--kubeconfig", help="with --executor kubernetes")
    ap.add_argument("--tcp-congestion-control", metavar="NAME",
                    help="the tcp jobs' spec.transport.tcpCongestionControl (e.g. cubic, "
                         "as most Linux hosts default to); unset: this kernel's default")
    ap.add_argument("--bandwidth", metavar="RATE",
                    help="every link's bandwidth (e.g. 200Mbit: where the network, not "
                         "the CPU of 2 cores, bounds the JCT); unset: the examples' 1Gbit")
    ap.add_argument("--rate-response", action="store_true",
                    help="then run every cell once more at half the links' rate and check "
                         "each verdict against how the time per iteration grew (local only)")
    hostcheck.add_arguments(ap)
    args = ap.parse_args()
    if args.rate_response and args.executor != "local":
        ap.error("--rate-response needs the local executor (it reads each run's iterations)")
    watch = hostcheck.before(args)
    global TCP_CONGESTION_CONTROL, BANDWIDTH
    TCP_CONGESTION_CONTROL = args.tcp_congestion_control
    BANDWIDTH = args.bandwidth
    if args.executor == "kubernetes":
        if not args.kubeconfig:
            ap.error("--executor kubernetes needs --kubeconfig")
        import subprocess
        subprocess.run(["kubectl", "--kubeconfig", args.kubeconfig, "create", "namespace",
                        "tailcut-bench"], capture_output=True)
        # bounded-loss pods get BPF and NET_ADMIN only where a namespace opted in
        # (docs/kubernetes.md, Pod Security).
        subprocess.run(["kubectl", "--kubeconfig", args.kubeconfig, "label", "--overwrite",
                        "namespace", "tailcut-bench", "tailcut.dev/bounded-loss=allowed"],
                       capture_output=True)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        c: {t: [] for t in TRANSPORTS} for c in args.conditions}
    failed: list[str] = []
    for run in range(args.runs):
        for c in args.conditions:
            for t in TRANSPORTS:
                started = time.monotonic()
                try:
                    r = (one(c, t) if args.executor == "local"
                         else on_cluster(c, t, args.kubeconfig, run))
                except RunFailed as err:   # the other runs still count; say which failed
                    print(f"run {run + 1}/{args.runs} {c:>18} {t:>12}: FAILED, not counted: "
                          f"{err}", flush=True)
                    failed.append(f"{c} {t} run {run + 1}")
                    continue
                runs[c][t].append(r)
                print(f"run {run + 1}/{args.runs} {c:>18} {t:>12}: {described(r, started)}",
                      flush=True)
    checks = (rate_response(args.conditions, runs, BANDWIDTH or "1Gbit", failed)
              if args.rate_response else [])
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "rate_response": checks}, indent=1))

    def med(c: str, t: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[c][t])

    print(f"\n{args.executor}, links at {BANDWIDTH or '1Gbit'}: medians of "
          f"{args.runs} interleaved runs "
          f"(tcp with {TCP_CONGESTION_CONTROL or 'the kernel default congestion control'} "
          "| bounded-loss p=0.9):\n")
    print("| condition | JCT tcp (s) | JCT bl (s) | tcp / bl | accuracy tcp | accuracy bl "
          "| queue drops tcp / bl | random drops tcp / bl | tcp retrans / RTOs (tcp job) "
          "| retrans / RTOs (bl job) | roles' CPU tcp / bl (s) "
          "| background flows/s tcp / bl | background median FCT tcp / bl (ms) "
          "| verdicts |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for c in args.conditions:
        if not all(runs[c][t] for t in TRANSPORTS):
            print(f"| {c} | every run of a transport failed |")
            continue
        tcp, bl = (med(c, t, "jct_s") for t in TRANSPORTS)
        print(f"| {c} | {tcp:.2f} | {bl:.2f} | **{tcp / bl:.2f}** "
              f"| {med(c, 'tcp', 'accuracy'):.4f} | {med(c, 'bounded-loss', 'accuracy'):.4f} "
              f"| {med(c, 'tcp', 'queue_drops'):.0f} / {med(c, 'bounded-loss', 'queue_drops'):.0f} "
              f"| {med(c, 'tcp', 'random_drops'):.0f} / "
              f"{med(c, 'bounded-loss', 'random_drops'):.0f} "
              f"| {med(c, 'tcp', 'retrans'):.0f} / {med(c, 'tcp', 'rtos'):.0f} "
              f"| {med(c, 'bounded-loss', 'retrans'):.0f} / {med(c, 'bounded-loss', 'rtos'):.0f} "
              f"| {med(c, 'tcp', 'cpu_s'):.1f} / {med(c, 'bounded-loss', 'cpu_s'):.1f} "
              f"| {med(c, 'tcp', 'bg_flows_per_s'):.1f} / "
              f"{med(c, 'bounded-loss', 'bg_flows_per_s'):.1f} "
              f"| {med(c, 'tcp', 'bg_fct_ms'):.0f} / {med(c, 'bounded-loss', 'bg_fct_ms'):.0f} "
              f"| {hostcheck.mark({t: [r['verdict'] for r in runs[c][t]] for t in TRANSPORTS})} "
              "|")
    if checks:
        print(response_table(checks))
    if failed:
        print(f"\nfailed, not in the medians: {', '.join(failed)}")
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
