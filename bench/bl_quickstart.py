"""The quickstart under 1% loss: bounded-loss p=0.9 against tcp, same accuracy target.

    .venv/bin/python bench/bl_quickstart.py [--runs 2]

Runs examples/quickstart.yaml (1 PS, 4 workers, 2 racks, 1 Gbit/s, target 93% test
accuracy) with accessLink.loss 0.01, once per transport per run, interleaved, through
the local runtime; prints each JCT, whether the target was reached, and the median
JCT ratio tcp / bounded-loss, marked with both transports' verdicts (bench/README.md).
Root."""

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import hostcheck  # noqa: E402
from tailcut import spec  # noqa: E402
from tailcut.runtime import local  # noqa: E402

TRANSPORTS = {"tcp": {"type": "tcp"}, "bounded-loss": {"type": "bounded-loss", "p": 0.9}}


def job(transport: str) -> spec.model.TrainingJob:
    raw = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    raw["metadata"]["name"] = f"bl-bench-qs-{'tcp' if transport == 'tcp' else 'bl'}"
    raw["spec"]["network"]["accessLink"]["loss"] = 0.01
    raw["spec"]["transport"] = TRANSPORTS[transport]
    return spec.from_dict(raw)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    hostcheck.add_arguments(ap)
    args = ap.parse_args()
    watch = hostcheck.before(args)
    jct: dict[str, list[float]] = {t: [] for t in TRANSPORTS}
    verdicts: dict[str, list[str]] = {t: [] for t in TRANSPORTS}
    for run in range(args.runs):
        for t in TRANSPORTS:
            with tempfile.TemporaryDirectory(prefix="bl-bench-qs-") as out:
                r = local.run(job(t), Path(out), progress=lambda line: None)
            jct[t].append(r.jct_s)
            verdicts[t].append(hostcheck.verdict_of(r.fidelity))
            print(f"run {run + 1}/{args.runs} {t:>12}: JCT {r.jct_s:6.1f} s, {r.epochs} epochs, "
                  f"accuracy {r.final_accuracy:.3f}, target reached: {r.converged}, "
                  f"{hostcheck.during(r.fidelity)}", flush=True)
            if not r.converged:
                print(f"  {t} did NOT reach the target", flush=True)
    med = {t: statistics.median(v) for t, v in jct.items()}
    print(f"\nquickstart, 1% loss on every access link, median JCT of {args.runs} runs: "
          + ", ".join(f"{t} {v:.1f} s" for t, v in med.items()))
    print(f"JCT(tcp) / JCT(bounded-loss p=0.9) = {med['tcp'] / med['bounded-loss']:.2f} "
          f"{hostcheck.mark(verdicts)}")
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
