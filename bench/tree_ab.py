"""One job, this tree against another checkout: JCT and the roles' CPU, interleaved.

    .venv/bin/python bench/tree_ab.py --baseline DIR [--job JOB] [--runs 3]

Runs `tailcut run JOB` (a new process each time, as a user would: run_overhead.once)
of this tree and of the checkout DIR (e.g. `git archive REV | tar -x -C DIR`) in turn,
--runs times each, and prints per run and as medians: the JCT (and per iteration: a
run that needs one more epoch to reach the target is longer by an epoch whatever the
transport did), the CPU the roles used while training
(metrics.json's cpu, docs/bounded-loss.md#cpu-time) and its split by thread kind,
the final accuracy, and the ratios this tree / baseline. The default job is the
bounded-loss quickstart on a clean network (examples/bounded-loss.yaml without its
1% loss): where the transport's CPU per message is the JCT on two cores. Each run
prints its fidelity verdict and the ratios are marked with both trees' (bench/README.md;
a tree older than the verdict has none: "unmeasured"). Root."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import hostcheck, run_overhead  # noqa: E402

ROOT = run_overhead.ROOT


def clean_bounded_loss(path: Path) -> None:
    raw = yaml.safe_load((ROOT / "examples" / "bounded-loss.yaml").read_text())
    raw["spec"]["network"]["accessLink"].pop("loss", None)
    path.write_text(yaml.safe_dump(raw))


def once(tree: Path, job: Path) -> dict[str, Any]:
    metrics = run_overhead.once(tree, str(job))["metrics"]
    cpu = metrics.get("cpu", {})
    kinds = {kind: v["user_s"] + v["system_s"] for kind, v in cpu.get("kinds", {}).items()}
    # Bounded loss changes the training trajectory: a run may need one more epoch to
    # reach the target, which lengthens its JCT by an epoch whatever the transport did.
    # The JCT per iteration is the transport's figure without that.
    iterations = max(1, int(metrics.get("iterations") or 1))
    return {"jct_s": metrics["jct_s"], "cpu_s": cpu.get("total_s", 0.0), "kinds": kinds,
            "accuracy": metrics["final_accuracy"], "iterations": iterations,
            "ms_per_iteration": 1e3 * metrics["jct_s"] / iterations,
            "verdict": hostcheck.verdict_of(metrics.get("fidelity")),
            "during": hostcheck.during(metrics.get("fidelity"))}


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    kinds = sorted({k for r in runs for k in r["kinds"]})
    return {"jct_s": statistics.median(r["jct_s"] for r in runs),
            "cpu_s": statistics.median(r["cpu_s"] for r in runs),
            "accuracy": statistics.median(r["accuracy"] for r in runs),
            "ms_per_iteration": statistics.median(r["ms_per_iteration"] for r in runs),
            "kinds": {k: statistics.median(r["kinds"].get(k, 0.0) for r in runs)
                      for k in kinds}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, required=True,
                        help="another checkout of tailcut (its tree's root)")
    parser.add_argument("--job", type=Path, help="a TrainingJob YAML (default: the "
                        "clean bounded-loss quickstart)")
    parser.add_argument("--runs", type=int, default=3)
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    watch = hostcheck.before(args)
    with tempfile.TemporaryDirectory() as tmp:
        job = args.job
        if job is None:
            job = Path(tmp) / "bl-clean.yaml"
            clean_bounded_loss(job)
        trees = {"this tree": ROOT, "baseline": args.baseline.resolve()}
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for i in range(args.runs):
            for name, tree in trees.items():
                before = load()
                r = once(tree, job.resolve())
                results[name].append(r)
                print(f"run {i + 1}/{args.runs} {name:9}: JCT {r['jct_s']:6.2f} s "
                      f"({r['iterations']} iterations), roles' "
                      f"CPU {r['cpu_s']:5.1f} s, accuracy {r['accuracy']:.4f} "
                      f"(load {before}); {r['during']}", flush=True)
    print(f"\n{job.name if args.job else 'clean bounded-loss quickstart'}: medians of "
          f"{args.runs} interleaved runs")
    this, base = summary(results["this tree"]), summary(results["baseline"])
    for name, s in (("this tree", this), ("baseline", base)):
        kinds = ", ".join(f"{k} {v:.1f}" for k, v in s["kinds"].items())
        print(f"  {name:9}: JCT {s['jct_s']:.2f} s ({s['ms_per_iteration']:.1f} ms per "
              f"iteration), roles' CPU {s['cpu_s']:.1f} s "
              f"({kinds}), accuracy {s['accuracy']:.4f}")
    print(f"  this tree / baseline: JCT {this['jct_s'] / base['jct_s']:.2f}, JCT per "
          f"iteration {this['ms_per_iteration'] / base['ms_per_iteration']:.2f}, "
          f"roles' CPU {this['cpu_s'] / base['cpu_s']:.2f} "
          + hostcheck.mark({name: [r["verdict"] for r in rs] for name, rs in results.items()}))
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
