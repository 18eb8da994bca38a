"""Sync modes and aggregation side by side: JCT, epochs and PS push latency per setting.

Runs the MLP over loopback TCP (real processes, no namespaces, no root) with 2 PS
shards and 4 workers, in bsp, async, ssp (staleness 2) and bsp with an aggregator
for workers 2-3, `--repeats` times each in an interleaved order, and prints the
medians and each setting's JCT relative to bsp. Loopback has no shaped link, so
this measures the roles' own costs, not a network bottleneck.

    .venv/bin/python bench/sync_modes.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import hostcheck  # noqa: E402
from tailcut.training import rpc  # noqa: E402
from tests.training import loopback  # noqa: E402

SETTINGS = {
    "bsp": {"options": {"sync_mode": "bsp"}},
    "async": {"options": {"sync_mode": "async"}},
    "ssp(2)": {"options": {"sync_mode": "ssp", "staleness": 2}},
    "bsp+aggregator": {"options": {"sync_mode": "bsp"}, "groups": [[2, 3]]},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    watch = hostcheck.before(args)
    results: dict[str, list[tuple[float, int, float]]] = {name: [] for name in SETTINGS}
    for _ in range(args.repeats):
        for name, setting in SETTINGS.items():
            with tempfile.TemporaryDirectory(prefix="rl-bench-") as tmp:
                job = loopback.Job(
                    Path(tmp), num_workers=4, shards=2, groups=setting.get("groups", []),
                    options={"target_accuracy": 0.9, "max_epochs": 20, **setting["options"]})
                done = job.run()["ps-0"][-1]
                rows = rpc.dissect(job.results)
                push = statistics.median(r["total_us"] for r in rows if r["op"] == "push")
                results[name].append((done["jct_s"], done["epochs"], push))
    base = statistics.median(j for j, _, _ in results["bsp"])
    print(f"{'setting':<16}{'JCT s':>8}{'vs bsp':>8}{'epochs':>8}{'push p50 ms':>13}")
    for name, runs in results.items():
        jct = statistics.median(j for j, _, _ in runs)
        epochs = statistics.median(e for _, e, _ in runs)
        push = statistics.median(p for _, _, p in runs) / 1e3
        print(f"{name:<16}{jct:>8.2f}{jct / base:>8.2f}{epochs:>8.0f}{push:>13.2f}")
    print(f"medians of {args.repeats} runs each, interleaved; the machine is shared, so "
          "expect noise")
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
