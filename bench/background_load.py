"""Measured against target load factor of Locust background load on a 1 Gbit/s uplink.

For each target load factor, runs only the background load (no training) of a
2-rack job several times and prints the median load factor measured from the uplink
veth's interface counters (and, for comparison, its HTB byte counter) over the
constant-load window, and the ratio measured/target.

    .venv/bin/python bench/background_load.py [--runs 3] [--duration-s 20]
        [--distribution fixed|web-search|data-mining] [--bytes 1000000]
"""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import hostcheck  # noqa: E402
from tailcut import spec  # noqa: E402
from tailcut.runtime import background  # noqa: E402

JOB = """\
apiVersion: tailcut.dev/v1alpha1
kind: TrainingJob
metadata: {{name: bg-bench}}
spec:
  replicas: {{workers: 1}}
  network:
    racks: [{{name: rack-0}}, {{name: rack-1}}]
    uplink: {{bandwidth: 1Gbit}}
  backgroundLoad:
    senders: [rack-0]
    receivers: [rack-1]
    target: {{link: uplink/rack-0, loadFactor: {lf}}}
    flowSizes: {sizes}
    durationS: {duration}
    locust: {{seed: {seed}}}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--distribution", default="fixed")
    parser.add_argument("--bytes", type=int, default=1_000_000)
    parser.add_argument("--targets", default="0.2,0.5,0.8")
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    watch = hostcheck.before(args)
    sizes = ("{distribution: fixed, bytes: %d}" % args.bytes if args.distribution == "fixed"
             else "{distribution: %s}" % args.distribution)
    print(f"background load on a 1 Gbit/s uplink, {args.distribution} flows, "
          f"{args.duration_s:g} s per run, median of {args.runs} runs")
    print(f"{'target':>7} {'measured':>9} {'measured/target':>16} {'htb view':>9} "
          f"{'runs (interface counters)':>30}")
    ok = True
    for lf in [float(x) for x in args.targets.split(",")]:
        measured, htb = [], []
        for run in range(args.runs):
            job = spec.load_text(JOB.format(lf=lf, sizes=sizes, duration=args.duration_s,
                                            seed=run))
            with tempfile.TemporaryDirectory(prefix="bg-bench-") as tmp:
                summary = background.run_alone(job, Path(tmp), progress=lambda _: None)
            measured.append(summary["measured_load_factor"])
            htb.append(summary["measured_load_factor_htb"])
        m = statistics.median(measured)
        ratio = m / lf
        ok &= abs(ratio - 1) <= 0.10
        print(f"{lf:>7.2f} {m:>9.3f} {ratio:>16.3f} {statistics.median(htb):>9.3f} "
              f"{' '.join(f'{x:.3f}' for x in measured):>30}", flush=True)
    print("all within 10% of target" if ok else "NOT all within 10% of target")
    hostcheck.after(watch)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
