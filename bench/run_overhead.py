"""tailcut's own time around a run: the quickstart's wall time minus its JCT.

    .venv/bin/python bench/run_overhead.py [--runs 5] [--job examples/quickstart.yaml]
                                           [--baseline DIR]

Runs `tailcut run JOB` --runs times as a user would (a new process each time) and
prints, per run and as medians, the wall time from the command's start to its exit,
the JCT the PS measured, their difference (tailcut's overhead: interpreter start,
network build, role start, teardown, report) and the run's own breakdown by phase
(metrics.json's overhead_s). With --baseline (a checkout of another revision, e.g.
`git worktree add /tmp/base <rev>`), runs of that tree alternate with this one's, and
the ratio of the medians is printed. CPU is the CPU time of the run's whole process
tree: on a busy shared machine, where wall times follow others' load, the cost that
moves least (run under `nice -n -20` to see the wall times of a quiet machine). `unaccounted` is wall - JCT minus the phases'
sum: time outside every phase, chiefly the interpreter's exit after the report. One untimed run of each tree comes first
(--warmup): what a user's second run finds (bytecode compiled, the generated dataset
cached, files in the page cache). Each run prints its fidelity verdict and the ratio is
marked with both trees' (bench/README.md; a tree older than the verdict has none:
"unmeasured").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import hostcheck  # noqa: E402

PHASES = ("startup", "network_build", "datapath", "role_start", "role_exit", "teardown",
          "report", "unaccounted")


def once(tree: Path, job: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tailcut-overhead-") as out:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        cpu_before = _children_cpu_s()
        started = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "tailcut.cli", "run", job,
                              "--results-dir", out], capture_output=True, text=True,
                             env=env, cwd=tree, timeout=600)
        wall = time.monotonic() - started
        cpu = _children_cpu_s() - cpu_before
        if run.returncode != 0:
            raise SystemExit(f"tailcut run failed ({tree}):\n{run.stderr[-2000:]}")
        metrics = json.loads((Path(out) / "metrics.json").read_text())
    phases = metrics.get("overhead_s", {})
    if "overhead" in phases:   # what no phase holds: the process's exit, mostly
        phases["unaccounted"] = wall - metrics["jct_s"] - phases["overhead"]
    return {"wall_s": wall, "jct_s": metrics["jct_s"], "overhead_s": wall - metrics["jct_s"],
            "cpu_s": cpu, "phases": phases, "metrics": metrics}


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of the waited-for children so far: a run's whole
    process tree (its roles are the runner's children), what others' load on a shared
    machine changes least."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def _describe(label: str, rows: list[dict[str, Any]]) -> None:
    print(f"{label}: wall {_median(rows, 'wall_s'):.2f} s, JCT {_median(rows, 'jct_s'):.2f} s, "
          f"wall - JCT {_median(rows, 'overhead_s'):.2f} s, CPU {_median(rows, 'cpu_s'):.2f} s "
          f"(medians of {len(rows)})")
    phased = [r["phases"] for r in rows if r["phases"]]
    if phased:
        parts = [f"{p.replace('_', ' ')} {statistics.median(x.get(p, 0.0) for x in phased):.2f}"
                 for p in PHASES]
        print("  by phase (s, medians): " + ", ".join(parts))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--job", default="examples/quickstart.yaml")
    parser.add_argument("--baseline", type=Path, help="another checkout to compare with")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed runs of each tree first (bytecode, page cache, the "
                             "dataset cache; default 1)")
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (tailcut run builds network namespaces)")
    watch = hostcheck.before(args)
    job = str((ROOT / args.job).resolve())
    trees = {"this tree": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline
                                   else {})
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in trees}
    for _ in range(args.warmup):
        for tree in trees.values():
            once(tree, job)
    print(f"load average before: {os.getloadavg()}")
    for i in range(args.runs):
        for label, tree in trees.items():   # alternating, so drifting load hits both
            r = once(tree, job)
            results[label].append(r)
            print(f"  {label} run {i + 1}: wall {r['wall_s']:.2f} s, JCT {r['jct_s']:.2f} s, "
                  f"wall - JCT {r['overhead_s']:.2f} s, CPU {r['cpu_s']:.2f} s, "
                  f"load1 {os.getloadavg()[0]:.2f}; "
                  f"{hostcheck.during(r['metrics'].get('fidelity'))}", flush=True)
    print()
    for label, rows in results.items():
        _describe(label, rows)
    if args.baseline:
        ratio = _median(results["baseline"], "overhead_s") / _median(results["this tree"],
                                                                      "overhead_s")
        marked = hostcheck.mark({label: [hostcheck.verdict_of(r["metrics"].get("fidelity"))
                                         for r in rows] for label, rows in results.items()})
        print(f"overhead baseline / this tree: {ratio:.2f}x {marked}")
    print(f"load average after: {os.getloadavg()} (a shared machine: others' work counts "
          "in these times; goal: wall - JCT <= 1.5 s on a quiet machine)")
    hostcheck.after(watch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
