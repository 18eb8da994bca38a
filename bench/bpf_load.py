"""What loading the loss dropper and the XDP counter costs a new process.

    .venv/bin/python bench/bpf_load.py [--runs 5] [--baseline DIR]

Each sample is a new Python process (as a run's builder, or a receiving role, is) that
loads one program, its imports done first and not timed: the dropper as the network
builder does (its first link end), or the bounded-loss counter as a receiving role
does (stride 360), and reports the load's wall time and CPU time (user + system). With --baseline (a checkout of another
revision, e.g. /work/main), the same loads of that tree alternate with this tree's,
and the ratios of the medians are printed. One unmeasured load per tree and program
comes first: what a user's second run finds (for this tree, the compiled image in
~/.cache/tailcut/bpf).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import hostcheck  # noqa: E402

# The child: load one program, print {"wall_s", "cpu_s"}. dropper._acquire is what the
# builder's first attach does (the load and a slot), in this tree and older ones alike.
# Imports are not timed (the same in both trees, and a role pays them anyway).
CHILD = {
    "dropper": ("from tailcut.datapath import dropper as d",
                "d._acquire(d.threshold(0.01))"),
    "counter": ("from tailcut.datapath import partial", "partial.compile_program(360)"),
}
WRAP = """
import json, resource, time
{imports}
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
{body}
r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
print(json.dumps({{"wall_s": t1 - t0,
                  "cpu_s": r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime}}))
"""


def once(tree: Path, program: str) -> dict[str, float]:
    imports, body = CHILD[program]
    out = subprocess.run([sys.executable, "-c", WRAP.format(imports=imports, body=body)],
                         env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree,
                         capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", type=Path, help="another checkout to compare with")
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    watch = hostcheck.before(args)
    trees = {"this tree": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline
                                   else {})
    print(f"load average before: {os.getloadavg()}")
    for program in CHILD:
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for tree in trees.values():
            once(tree, program)   # warm-up: the image cached, files in the page cache
        for _ in range(args.runs):   # interleaved, so drifting load hits both alike
            for name, tree in trees.items():
                samples[name].append(once(tree, program))
        medians = {name: {k: statistics.median(s[k] for s in runs)
                          for k in ("wall_s", "cpu_s")}
                   for name, runs in samples.items()}
        for name, m in medians.items():
            print(f"{program:8s} {name:10s} load wall {m['wall_s'] * 1000:8.1f} ms   "
                  f"cpu {m['cpu_s'] * 1000:8.1f} ms   (median of {args.runs})")
        if args.baseline:
            base, this = medians["baseline"], medians["this tree"]
            print(f"{program:8s} baseline / this tree: wall "
                  f"{base['wall_s'] / this['wall_s']:.0f}x, cpu "
                  f"{base['cpu_s'] / max(this['cpu_s'], 1e-4):.0f}x")
    print(f"load average after: {os.getloadavg()}")
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
