"""CadentFlow in real `tailcut run` jobs: the same job with policy fair and cadentflow,
side by side, medians of several rounds.

    sudo .venv/bin/python bench/cadentflow_run.py [--rounds 3] [--iterations 70] \
        [--job examples/cadentflow.yaml] [--workers 4] [--bandwidth 200Mbit]

Each round runs the job (capped at --iterations, no accuracy target) once with
`scheduling.policy: fair` (each PARAMS/PUSH one whole untagged message, TCP fair share)
and once with `cadentflow` (one message per tensor, in tag order, DSCP-tagged, priority
classes on every pod), alternating which goes first. Prints per round and as medians:
the iteration time (median per run, from flows.json) and the median completion time of
each tensor's pull and push; then the ratios cadentflow / fair.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml  # noqa: E402

from tailcut import spec  # noqa: E402
from tailcut.runtime import local  # noqa: E402

POLICIES = ("fair", "cadentflow")


def job_for(base: dict[str, Any], policy: str, args: argparse.Namespace) -> spec.TrainingJob:
    raw = {**base, "metadata": {"name": f"cf2-bench-{policy[:4]}"}}
    s = dict(raw["spec"])
    s["training"] = {**s["training"], "iterations": args.iterations, "targetAccuracy": None,
                     "epochs": 1000}
    s["replicas"] = {**s["replicas"], "workers": args.workers}
    s["network"] = {**s["network"], "accessLink": {**s["network"]["accessLink"],
                                                    "bandwidth": args.bandwidth}}
    s["scheduling"] = {**s.get("scheduling", {}), "policy": policy}
    raw["spec"] = s
    return spec.from_dict(raw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default="examples/cadentflow.yaml")
    parser.add_argument("--rounds", type=int, default=3)
    # At least one epoch (63 iterations with 4 workers): a run without one has no loss
    # plot, which tailcut run treats as an error.
    parser.add_argument("--iterations", type=int, default=70)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--bandwidth", default="200Mbit")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: each round builds namespaces")
    base = yaml.safe_load(Path(args.job).read_text())
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in POLICIES}
    with tempfile.TemporaryDirectory(prefix="cf2-bench-") as tmp:
        for r in range(args.rounds):
            order = POLICIES if r % 2 == 0 else POLICIES[::-1]
            for policy in order:
                job = job_for(base, policy, args)
                local.run(job, Path(tmp) / f"{policy}-{r}", progress=lambda _: None)
                summary = json.loads((Path(tmp) / f"{policy}-{r}" / "flows.json").read_text())
                runs[policy].append(summary)
                print(f"round {r} {policy:>10}: iteration {summary['iteration_s'] * 1e3:7.1f} ms"
                      f" ({summary['iterations_measured']} gaps)", flush=True)
    layers = list(runs["fair"][0]["fct_s"]["pull"])
    med = {p: statistics.median(s["iteration_s"] for s in runs[p]) for p in POLICIES}
    print(f"\n{args.rounds} rounds x {args.iterations} iterations, {args.workers} workers, "
          f"access links {args.bandwidth}, model {base['spec']['training']['model']}")
    print(f"iteration ms: fair {med['fair'] * 1e3:.1f}  cadentflow "
          f"{med['cadentflow'] * 1e3:.1f}  ratio cadentflow/fair "
          f"{med['cadentflow'] / med['fair']:.3f}")
    print("\nmedian ms from an iteration's first pull to:")
    for policy in POLICIES:
        phases = {k: statistics.median(s["phases_s"][k] for s in runs[policy])
                  for k in runs[policy][0]["phases_s"]}
        print(f"{policy:>10}: " + "  ".join(f"{k} {v * 1e3:.1f}" for k, v in phases.items())
              + f"  next pull {med[policy] * 1e3:.1f}")
    for direction in ("pull", "push"):
        print(f"\n{direction} FCT, median of the runs' medians (ms):")
        print(f"{'tensor':>12} {'level':>5} {'fair':>8} {'cadentflow':>10} {'ratio':>6}")
        for name in layers:
            f = statistics.median(s["fct_s"][direction][name]["median"] for s in runs["fair"])
            c = statistics.median(s["fct_s"][direction][name]["median"]
                                  for s in runs["cadentflow"])
            level = runs["cadentflow"][0]["fct_s"][direction][name]["level"]
            print(f"{name:>12} {level:>5} {f * 1e3:8.1f} {c * 1e3:10.1f} {c / f:6.3f}")


if __name__ == "__main__":
    main()
