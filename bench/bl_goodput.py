"""Bounded-loss goodput on a loss-free 1 Gbit/s link: one sender alone takes the link,
four senders into one receiver share it; and the time from the packet that crosses p
to the application seeing the message.

    .venv/bin/python bench/bl_goodput.py [--runs 3] [--rounds 15] [--baseline DIR]

Alone: one worker sends 4 MiB vectors to the PS; no rate is configured, so the
sender paces at its link's rate (the HTB class of its interface) and at most at the
receiver's grant (tailcut.transports.congestion). Goodput = elements delivered x 4
bytes x 8 / completion time, over the link rate. Latency = time.monotonic_ns() when
recv() returned - bpf_ktime_get_ns() of the XDP event (the crossing packet).

Fan-in: four workers push 4 MiB each into the PS at once, every round. Per sender:
its delivered bits / its message's completion time; fairness is Jain's index of the
four ((sum x)^2 / (n sum x^2), 1 = equal shares); total goodput = all delivered bits
/ (last arrival - first send) of the round, over the link rate. Medians over rounds
(the first warms up) and runs. Root.

--baseline DIR runs the same measurement with the tailcut of another checkout (e.g.
``git archive 5019711 | tar -x -C /tmp/base``) interleaved with this one, run by run,
and prints both side by side. Each run's verdict is judged from the host's CPU over it
(bench/hostcheck.py: its links are not sampled); the ratios of two trees are marked
with both trees' verdicts."""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import bl_net, hostcheck  # noqa: E402

ELEMENTS = 1 << 20
LINK_BIT = 1e9
PS = (0.9, 1.0)
FAN_IN = 4


def one(p: float, rounds: int, port: int, tree: Path | None, senders: int = 1,
        gso: bool = True, whole_bursts: bool = True) -> dict:
    """The transport's options are those `tailcut run` plans for this loss-free network
    (bl_net.planned_options): UDP GSO, and bursts of a whole GSO message; ``gso`` and
    ``whole_bursts`` False turn those off."""
    name = "bl-bench-gp" if senders == 1 else "bl-bench-fan"
    options = bl_net.planned_options(name, senders, 0.0, {"type": "bounded-loss", "p": p})
    options["gso"] = options["gso"] and gso
    if not whole_bursts:  # as behind a finite switch buffer, one too big to bound the credit
        options["switch_buffer_bytes"] = 1 << 30
    with bl_net.network(name, senders, 0.0) as topo:
        ps = topo.pod("ps-0")
        base = {"transport": "bounded-loss", "options": options,
                "host": ps.ip, "port": port}
        server = bl_net.start(ps, {**base, "role": "ps", "workers": senders, "rounds": rounds},
                              tree)
        clients = [bl_net.start(topo.pod(f"worker-{i}"),
                                {**base, "role": "worker", "index": i, "elements": ELEMENTS},
                                tree) for i in range(senders)]
        result = bl_net.finish(server)
        result["sender_cpu_s"] = sum(bl_net.finish(c).get("cpu_s", 0.0) for c in clients)
    return result


def jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def fan_in(res: dict) -> tuple[float, float, list[float]]:
    """(median fairness, median total goodput / link, median per-sender share) over
    the rounds after the first."""
    rounds: dict[int, list[dict]] = {}
    for m in res["messages"]:
        rounds.setdefault(m["round"], []).append(m)
    fair, total, shares = [], [], []
    for r, msgs in sorted(rounds.items())[1:]:
        rates = [m["elements"] * 32 / m["completion_s"] for m in msgs]
        span_s = (max(m["received_ns"] for m in msgs) - min(m["sent_ns"] for m in msgs)) / 1e9
        fair.append(jain(rates))
        total.append(sum(m["elements"] * 32 for m in msgs) / span_s / LINK_BIT)
        shares += [x / LINK_BIT for x in rates]
    return statistics.median(fair), statistics.median(total), shares


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--baseline", type=Path, help="another checkout to compare with")
    ap.add_argument("--no-gso-too", action="store_true",
                    help="also this tree without UDP GSO (one datagram per sendmmsg entry)")
    ap.add_argument("--short-bursts-too", action="store_true",
                    help="also this tree with GSO but bursts of BURST_S, as behind a "
                         "finite switch buffer")
    hostcheck.add_arguments(ap)
    args = ap.parse_args()
    watch = hostcheck.before(args)
    # label -> (tree, UDP GSO, whole-GSO bursts): on a path without a finite switch
    # buffer tailcut run turns on both.
    variants: dict[str, tuple[Path | None, bool, bool]] = {"this tree": (None, True, True)}
    if args.baseline:
        variants = {"baseline": (args.baseline.resolve(), False, False), **variants}
    if args.no_gso_too:
        variants["no gso"] = (None, False, False)
    if args.short_bursts_too:
        variants["short bursts"] = (None, True, False)
    trees = variants
    goodput = {t: {p: [] for p in PS} for t in trees}
    fairness = {t: [] for t in trees}
    fan_total = {t: [] for t in trees}
    latency_us: dict[str, list[float]] = {t: [] for t in trees}
    queued_us: dict[str, list[float]] = {t: [] for t in trees}
    sending_ms: dict[str, list[float]] = {t: [] for t in trees}
    verdicts: dict[str, list[str]] = {t: [] for t in trees}
    for run in range(args.runs):
        for label, (tree, gso, whole_bursts) in variants.items():
            for p in PS:
                run_watch = hostcheck.Watch()
                res = one(p, args.rounds, 7200 + run, tree, gso=gso, whole_bursts=whole_bursts)
                fidelity = hostcheck.judged(run_watch.stop())
                verdicts[label].append(hostcheck.verdict_of(fidelity))
                msgs = res["messages"][1:]  # round 0 warms up
                gp = [m["delivered"] * ELEMENTS * 32 / m["completion_s"] / LINK_BIT
                      for m in msgs]
                goodput[label][p].append(statistics.median(gp))
                recs = [r for r in res["records"][1:] if r["event_ns"]]
                if p == 0.9:
                    latency_us[label] += [(r["app_ns"] - r["event_ns"]) / 1e3 for r in recs]
                    queued_us[label] += [(r["done_ns"] - r["event_ns"]) / 1e3 for r in recs]
                    sending_ms[label] += [(r["event_ns"] - r["begun_ns"]) / 1e6 for r in recs]
                print(f"run {run + 1}/{args.runs} {label} p={p}: goodput "
                      f"{goodput[label][p][-1]:.3f} of the link, delivered "
                      f"{statistics.mean(m['delivered'] for m in msgs):.4f}, completions by "
                      f"{sorted({r['reason'] for r in res['records']})} (load {load()}); "
                      f"{hostcheck.during(fidelity)}", flush=True)
            run_watch = hostcheck.Watch()
            res = one(0.9, args.rounds, 7300 + run, tree, FAN_IN, gso, whole_bursts)
            fidelity = hostcheck.judged(run_watch.stop())
            verdicts[label].append(hostcheck.verdict_of(fidelity))
            fair, total, shares = fan_in(res)
            fairness[label].append(fair)
            fan_total[label].append(total)
            print(f"run {run + 1}/{args.runs} {label} fan-in {FAN_IN}x p=0.9: Jain {fair:.3f}, "
                  f"total goodput {total:.3f} of the link, per sender "
                  f"{min(shares):.3f}..{max(shares):.3f} (load {load()}); "
                  f"{hostcheck.during(fidelity)}", flush=True)
    print("\nloss-free 1 Gbit/s links, 4 MiB messages, no rate configured:")
    for label in trees:
        for p, v in goodput[label].items():
            print(f"  {label}: one sender alone, bounded-loss p={p}: goodput / link rate = "
                  f"{statistics.median(v):.3f} (median of {len(v)} runs; goal >= 0.9; the "
                  f"header overhead caps it at {1440 / 1514:.3f})")
        print(f"  {label}: {FAN_IN} senders into one receiver, p=0.9: Jain's index "
              f"{statistics.median(fairness[label]):.3f} (goal >= 0.95), total goodput / link "
              f"{statistics.median(fan_total[label]):.3f} (goal >= 0.9)")
        if latency_us[label]:
            print(f"  {label}: XDP event (p-crossing packet) -> recv() returns: p50 "
                  f"{bl_net.pct(latency_us[label], 50):.0f} us, p99 "
                  f"{bl_net.pct(latency_us[label], 99):.0f} us ({len(latency_us[label])} "
                  f"messages); -> message queued for the app: p50 "
                  f"{bl_net.pct(queued_us[label], 50):.0f} us")
            # At line rate p = 0.9 of 2913 packets of 1514 bytes takes 31.7 ms: a
            # longer time here is the sender (or the link) being slow, not the receiver.
            print(f"  {label}: BEGIN read -> XDP event (sending up to p): p50 "
                  f"{bl_net.pct(sending_ms[label], 50):.1f} ms (line rate: 31.7 ms)")
    for other in [v for v in variants if v != "this tree"]:
        marked = hostcheck.mark({t: verdicts[t] for t in ("this tree", other)})
        for p in PS:
            new, old = (statistics.median(goodput[t][p]) for t in ("this tree", other))
            print(f"goodput alone (this tree) / ({other}), p={p}: {new / old:.2f} {marked}")
        new, old = (statistics.median(fan_total[t]) for t in ("this tree", other))
        print(f"fan-in total goodput (this tree) / ({other}): {new / old:.2f} {marked}")
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
