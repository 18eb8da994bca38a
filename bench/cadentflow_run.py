"""CadentFlow in real `tailcut run` jobs: the same job under fair share, under cadentflow,
and per-tensor without priorities, side by side, medians of several rounds.

    sudo .venv/bin/python bench/cadentflow_run.py [--rounds 3] [--iterations 70] \
        [--job examples/cadentflow.yaml] [--workers 4] [--bandwidth 200Mbit] \
        [--model deep-mlp] [--batch-size 32] [--ps 1] [--variants fair,cadentflow,one-class]

Each round runs the job (capped at --iterations, no accuracy target) once per variant,
rotating which goes first:

- ``fair``: `scheduling.policy: fair`, each PARAMS/PUSH one whole untagged message, TCP
  fair share; the worker computes when its whole model is in (the paper's baseline);
- ``cadentflow``: one message part per tensor in tag order, DSCP-tagged, priority
  classes on every pod (the job's priorityLevels); the worker computes layer by layer
  as the parts arrive and pushes each gradient as soon as it has it
  (tailcut.ml.layerwise);
- ``one-class``: the same per-tensor parts and layer-wise worker, but priorityLevels 1:
  every tensor in one class, so nothing is prioritised. cadentflow against one-class
  is the priorities' own share; one-class against fair is pipelining's;
- ``pull-prio`` (only if asked for in --variants): cadentflow with every push at level
  0 while pulls keep their layer-order levels (the paper's pushes share one deadline).

Prints per round and as medians: the iteration time (median per run, from flows.json),
phases of an iteration, and the median completion time of each tensor's pull and push;
then the ratios to fair, each marked with both variants' fidelity verdicts
(bench/README.md).
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

from bench import hostcheck  # noqa: E402
from tailcut import spec  # noqa: E402
from tailcut.runtime import local  # noqa: E402

VARIANTS = ("fair", "cadentflow", "one-class", "pull-prio")
SHORT = {"fair": "fair", "cadentflow": "cf", "one-class": "one", "pull-prio": "pull"}


def job_for(base: dict[str, Any], variant: str, args: argparse.Namespace) -> spec.TrainingJob:
    raw = {**base, "metadata": {"name": f"cfrun-{SHORT[variant]}"}}
    s = dict(raw["spec"])
    s["training"] = {**s["training"], "iterations": args.iterations, "targetAccuracy": None,
                     "epochs": 1000}
    if args.batch_size is not None:
        s["training"]["batchSize"] = args.batch_size
    if args.model is not None:
        s["training"]["model"] = args.model
    s["replicas"] = {**s["replicas"], "workers": args.workers, "parameterServers": args.ps}
    s["network"] = {**s["network"], "accessLink": {**s["network"]["accessLink"],
                                                    "bandwidth": args.bandwidth}}
    scheduling = {**s.get("scheduling", {})}
    scheduling["policy"] = "fair" if variant == "fair" else "cadentflow"
    if variant == "one-class":
        scheduling["priorityLevels"] = 1
    if variant == "pull-prio":  # the paper's pushes share one deadline: one class here
        scheduling["flows"] = [*scheduling.get("flows", []),
                               {"layer": "*", "direction": "push", "priority": 0}]
    s["scheduling"] = scheduling
    raw["spec"] = s
    return spec.from_dict(raw)


def _median(values: list[float]) -> float:
    return statistics.median(values)


def worker_compute_ms(results: Path) -> float:
    """Median over workers of each one's median time in the model per iteration (waits
    for parameters and pushes excluded), from its worker_done event: shows when a
    variant was slower only because the shared CPU was busier."""
    medians = []
    for log in sorted((results / "logs").glob("worker-*.log")):
        for line in log.read_text().splitlines():
            if line.startswith("{") and '"worker_done"' in line:
                medians.append(json.loads(line).get("compute_ms_median", float("nan")))
    return statistics.median(medians) if medians else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", default="examples/cadentflow.yaml")
    parser.add_argument("--rounds", type=int, default=3)
    # At least one epoch (63 iterations with 4 workers at batch 32): a run without one
    # has no loss plot.
    parser.add_argument("--iterations", type=int, default=70)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--ps", type=int, default=1)
    parser.add_argument("--bandwidth", default="200Mbit")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="per worker; default: the job's")
    parser.add_argument("--model", default=None, help="default: the job's")
    parser.add_argument("--variants", default=",".join(VARIANTS[:3]))
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    variants = args.variants.split(",")
    if "fair" not in variants or not set(variants) <= set(VARIANTS):
        sys.exit(f"--variants: a comma list of {', '.join(VARIANTS)} including fair")
    if os.geteuid() != 0:
        sys.exit("run as root: each round builds namespaces")
    base = yaml.safe_load(Path(args.job).read_text())
    for variant in variants:
        job_for(base, variant, args)  # a bad option fails here, before any run
    watch = hostcheck.before(args)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    with tempfile.TemporaryDirectory(prefix="cfrun-bench-") as tmp:
        for r in range(args.rounds):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for variant in order:
                job = job_for(base, variant, args)
                out = Path(tmp) / f"{variant}-{r}"
                result = local.run(job, out, progress=lambda _: None)
                summary = json.loads((out / "flows.json").read_text())
                summary["compute_ms"] = worker_compute_ms(out)
                summary["verdict"] = hostcheck.verdict_of(result.fidelity)
                runs[variant].append(summary)
                print(f"round {r} {variant:>10}: iteration {summary['iteration_s'] * 1e3:7.1f} ms"
                      f" ({summary['iterations_measured']} gaps), worker compute "
                      f"{summary['compute_ms']:.1f} ms; {hostcheck.during(result.fidelity)}",
                      flush=True)
    layers = list(runs["fair"][0]["fct_s"]["pull"])
    med = {v: _median([s["iteration_s"] for s in runs[v]]) for v in variants}
    batch = args.batch_size or base["spec"]["training"]["batchSize"]
    print(f"\n{args.rounds} rounds x {args.iterations} iterations, {args.workers} workers, "
          f"{args.ps} PS, access links {args.bandwidth}, model "
          f"{args.model or base['spec']['training']['model']}, batch {batch}")
    print("iteration ms (median of rounds; per round in brackets):")
    def marked(a: str, b: str) -> str:
        return hostcheck.mark({u: [s["verdict"] for s in runs[u]] for u in (a, b)})

    for v in variants:
        rounds = ", ".join(f"{s['iteration_s'] * 1e3:.1f}" for s in runs[v])
        print(f"{v:>10}: {med[v] * 1e3:7.1f}  ratio to fair {med[v] / med['fair']:.3f}"
              f"  [{rounds}] {marked(v, 'fair')}")
    if "cadentflow" in med and "one-class" in med:
        print(f"cadentflow / one-class (the priorities' own share): "
              f"{med['cadentflow'] / med['one-class']:.3f} {marked('cadentflow', 'one-class')}")
    print("worker compute ms per iteration (median of rounds; the CPU is shared):  " + "  ".join(
        f"{v} {_median([s['compute_ms'] for s in runs[v]]):.1f}" for v in variants))
    print("\nmedian ms from an iteration's first pull to:")
    for v in variants:
        phases = {k: _median([s["phases_s"][k] for s in runs[v]])
                  for k in runs[v][0]["phases_s"]}
        print(f"{v:>10}: " + "  ".join(f"{k} {t * 1e3:.1f}" for k, t in phases.items())
              + f"  next pull {med[v] * 1e3:.1f}")
    for direction in ("pull", "push"):
        print(f"\n{direction} FCT, median of the runs' medians (ms), level under cadentflow:")
        print(f"{'tensor':>12} {'level':>5} " + " ".join(f"{v:>10}" for v in variants))
        for name in layers:
            fct = [_median([s["fct_s"][direction][name]["median"] for s in runs[v]])
                   for v in variants]
            level = (runs["cadentflow"][0]["fct_s"][direction][name]["level"]
                     if "cadentflow" in runs else "")
            print(f"{name:>12} {level!s:>5} " + " ".join(f"{t * 1e3:10.1f}" for t in fct))
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
