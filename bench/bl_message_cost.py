"""What a small message costs: tcp against bounded-loss, ping-pong on a clean 1 Gbit/s link.

    .venv/bin/python bench/bl_message_cost.py [--runs 3] [--rounds 200] [--p 0.9]
        [--elements 64714] [--receive-paths socket,kernel] [--baseline DIR] [--trace]

Two pods (ps-0, worker-0) on one rack, loss-free 1 Gbit/s access links. The worker
sends a PUSH of ``elements`` float32s (the quickstart's MLP: 64 714, 259 KB), the PS
answers with a PARAMS of the same size, and so on ``rounds`` times: the quickstart's
PUSH then PULL reply, back to back, one message in flight at a time. Per message:
time from ``send`` being called to ``recv`` returning on the other side (one host
clock); p50 / p99 per transport (the first 10 rounds warm up) and the ratio
bounded-loss / tcp, medians over runs, every transport measured in every run. Also
per round, the CPU time both pods used and their context switches: on a loaded
machine each wake-up of a thread waits for a core, so these say what a message
costs where the times cannot, and the CPU per round of each bounded-loss receive
path over tcp's, per run (``--receive-paths``: the receiver's socket, the kernel's tc
program, or both side by side; "bounded-loss/kernel" in the output).

With ``--trace`` (this tree only; one more run per run), each bounded-loss message is cut into
phases from stamps both sides take (bench/bl_cost_role.py): where the fixed cost
of a message goes. ``--baseline DIR`` runs the same with the tailcut of another
checkout (``git archive REV | tar -x -C DIR``), interleaved run by run. Each run's
verdict is judged from the host's CPU over it (bench/hostcheck.py: its links are not
sampled); the ratio bounded-loss / tcp is marked with both transports' verdicts. Root."""

import argparse
import bisect
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import bl_net, hostcheck  # noqa: E402

ROLE = Path(__file__).with_name("bl_cost_role.py")
WARMUP = 10
# (label, from stamp, to stamp): the phases of one bounded-loss message.
PHASES = (
    ("send() writes BEGIN", "send_called", "begin_sent"),
    ("send() called -> sender thread starts", "send_called", "tx_started"),
    ("BEGIN written -> read by the receiver", "begin_sent", "begin_read"),
    ("sender thread starts -> first packet taken", "tx_started", "first_packet"),
    ("BEGIN read -> first datagrams read", "begin_read", "first_read"),
    ("first packet taken -> XDP event (p crossed)", "first_packet", "xdp_event"),
    ("XDP event -> queued for the app (DONE sent)", "xdp_event", "queued"),
    ("queued -> recv() returns", "queued", "recv_returned"),
    ("queued -> DONE read by the sender", "queued", "done_read"),
    ("sender thread starts -> its pass is sent", "tx_started", "pass_sent"),
    ("send() called -> recv() returns", "send_called", "recv_returned"),
)


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def one(transport: str, p: float, args: argparse.Namespace, port: int,
        tree: Path | None, traced: bool = False) -> dict[str, Any]:
    transport, _, receive_path = transport.partition("/")
    # UDP GSO, as tailcut.plan.transport_options sets it on every path; with no
    # switch_buffer_bytes a burst is a whole GSO message (22 datagrams; 44 on Nov 27
    # and 16 before, so this bench's figures from before then are not comparable).
    options: dict[str, Any] = {} if transport == "tcp" else {"job": "bl-bench-cost",
                                                            "gso": True}
    if transport == "bounded-loss":
        options["p"] = p
        if receive_path:
            options["receive_path"] = receive_path
    with bl_net.network("bl-bench-cost", 1, 0.0) as topo:
        ps = topo.pod("ps-0")
        base = {"transport": transport, "options": options, "host": ps.ip, "port": port,
                "elements": args.elements, "trace": traced}
        pong = bl_net.start(ps, {**base, "role": "pong"}, tree, ROLE)
        ping = bl_net.start(topo.pod("worker-0"), {**base, "role": "ping",
                                                    "rounds": args.rounds}, tree, ROLE)
        a, b = bl_net.finish(pong), bl_net.finish(ping)
    msgs = [m for m in a["messages"][WARMUP:] + b["messages"][WARMUP:]]
    stamps: dict[tuple[int, int], dict[str, int]] = {}
    for side in (a, b):
        for kind, mid, s in side["stamps"]:
            stamps.setdefault((kind, mid), {}).update(s)
    # The receiving side's socket reads while each message was coming in (one message
    # in flight at a time): how many, and when the first found datagrams.
    for side, kind in ((a, 2), (b, 3)):
        times = [t for t, _ in side.get("reads", [])]
        for (k, _), s in stamps.items():
            if k != kind or "begin_read" not in s or "queued" not in s:
                continue
            lo, hi = bisect.bisect_left(times, s["begin_read"]), bisect.bisect_right(
                times, s["queued"])
            got = [(t, n) for t, n in side["reads"][lo:hi] if n]
            s["reads"], s["batches"] = hi - lo, len(got)
            if got:
                s["first_read"] = got[0][0]
    return {"ms": [(m["returned_ns"] - m["sent_ns"]) / 1e6 for m in msgs],
            "missing": [m["missing"] for m in msgs],
            "stamps": [s for (_, mid), s in stamps.items() if mid & 0xFFFF > WARMUP],
            "stats": {**a["stats"], **{f"ping {k}": v for k, v in b["stats"].items()}},
            "cost": {k: a["cost"][k] + b["cost"][k] for k in a["cost"]}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--p", type=float, default=0.9)
    ap.add_argument("--elements", type=int, default=64714)
    ap.add_argument("--receive-paths", default="socket",
                    help="the bounded-loss receive paths to run, comma-separated: socket, "
                         "kernel")
    ap.add_argument("--baseline", type=Path, help="another checkout to compare with")
    ap.add_argument("--trace", action="store_true",
                    help="one more bounded-loss run of this tree per run, its phases stamped")
    hostcheck.add_arguments(ap)
    args = ap.parse_args()
    watch = hostcheck.before(args)
    trees: dict[str, Path | None] = {"this tree": None}
    if args.baseline:
        trees = {"baseline": args.baseline.resolve(), "this tree": None}
    paths = args.receive_paths.split(",")
    if not paths or set(paths) - {"socket", "kernel"}:
        ap.error(f"--receive-paths {args.receive_paths}: socket, kernel or both")
    transports = ("tcp", *("bounded-loss" if path == "socket" else "bounded-loss/kernel"
                           for path in paths))
    p50: dict[tuple[str, str], list[float]] = {(l, t): [] for l in trees for t in transports}
    p99: dict[tuple[str, str], list[float]] = {k: [] for k in p50}
    ratio50: dict[str, list[float]] = {l: [] for l in trees}
    phases: dict[str, list[float]] = {label: [] for label, _, _ in PHASES}
    cpu: dict[tuple[str, str], list[float]] = {k: [] for k in p50}
    reads: list[int] = []  # socket reads while a message came in (traced)
    batches: list[int] = []  # of which found datagrams
    switches: dict[tuple[str, str], list[float]] = {k: [] for k in p50}
    loads = []
    verdicts: dict[tuple[str, str], list[str]] = {k: [] for k in p50}
    for run in range(args.runs):
        for label, tree in trees.items():
            for t in transports:
                run_watch = hostcheck.Watch()
                res = one(t, args.p, args, 7400 + run, tree)
                fidelity = hostcheck.judged(run_watch.stop())
                verdicts[label, t].append(hostcheck.verdict_of(fidelity))
                ms = res["ms"]
                p50[label, t].append(bl_net.pct(ms, 50))
                p99[label, t].append(bl_net.pct(ms, 99))
                loads.append(float(load()))
                cpu[label, t].append(res["cost"]["cpu_us"])
                switches[label, t].append(res["cost"]["switches"] + res["cost"]["involuntary"])
                print(f"run {run + 1}/{args.runs} {label} {t}: per message p50 "
                      f"{p50[label, t][-1]:.2f} ms, p99 {p99[label, t][-1]:.2f} ms, missing "
                      f"mean {statistics.mean(res['missing']):.0f} of {args.elements}; per "
                      f"round (2 messages) {cpu[label, t][-1]:.0f} us of CPU, "
                      f"{switches[label, t][-1]:.0f} context switches (load {load()}); "
                      f"{hostcheck.during(fidelity)}", flush=True)
                if t != "tcp":
                    interesting = {k: v for k, v in res["stats"].items()
                                   if k in ("nacks", "retransmitted", "late", "duplicate",
                                            "ping nacks", "ping retransmitted",
                                            "packets_sent", "ping packets_sent")}
                    print(f"  stats: {interesting}", flush=True)
            ratio50[label].append(p50[label, transports[1]][-1] / p50[label, "tcp"][-1])
            if args.trace and tree is None:
                res = one("bounded-loss", args.p, args, 7450 + run, tree, traced=True)
                for s in res["stamps"]:
                    for name, a, b in PHASES:
                        if a in s and b in s:
                            phases[name].append((s[b] - s[a]) / 1e3)
                    if "reads" in s:
                        reads.append(s["reads"])
                        batches.append(s["batches"])
                print(f"run {run + 1}/{args.runs} {label} bounded-loss traced: per message p50 "
                      f"{bl_net.pct(res['ms'], 50):.2f} ms (load {load()})", flush=True)
    print(f"\nping-pong of {args.elements} float32s ({args.elements * 4 / 1e3:.0f} KB) over a "
          f"clean 1 Gbit/s link, {args.rounds} rounds x {args.runs} runs, load "
          f"{min(loads):.1f}-{max(loads):.1f}:")
    for label in trees:
        for t in transports:
            print(f"  {label} {t:>12}: per message p50 {statistics.median(p50[label, t]):.2f} ms, "
                  f"p99 {statistics.median(p99[label, t]):.2f} ms; per round "
                  f"{statistics.median(cpu[label, t]):.0f} us of CPU (both pods), "
                  f"{statistics.median(switches[label, t]):.0f} context switches "
                  f"(medians of runs)")
        print(f"  {label}: p50 {transports[1]} p={args.p} / tcp = "
              f"{statistics.median(ratio50[label]):.2f} (per run: "
              f"{' '.join(f'{r:.2f}' for r in ratio50[label])}) "
              + hostcheck.mark({t: verdicts[label, t] for t in transports}))
        for t in transports[1:]:
            per_run = [b / a for a, b in zip(cpu[label, "tcp"], cpu[label, t])]
            print(f"  {label}: CPU per round {t} / tcp = {statistics.median(per_run):.2f} "
                  f"(per run: {' '.join(f'{r:.2f}' for r in per_run)}); context switches "
                  f"{statistics.median(switches[label, t]) / statistics.median(switches[label, 'tcp']):.2f}x")
    if any(phases.values()):
        print("\nthis tree, bounded-loss: phases of a message (us, over every message)")
        for name, v in phases.items():
            if v:
                print(f"  {name:<48} p50 {bl_net.pct(v, 50):8.0f}  p90 {bl_net.pct(v, 90):8.0f}"
                      f"  ({len(v)})")
        if reads:
            print(f"  socket reads from BEGIN to queued: median {statistics.median(reads)}, "
                  f"of which found datagrams {statistics.median(batches)}")
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
