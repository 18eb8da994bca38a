"""What loading tailcut's images costs a node of `tailcut cluster up`: `ctr images import`
of the three archives into a fresh containerd, as Cluster.load_image does for every node,
without starting a cluster (a containerd of its own, in a temporary directory).

    .venv/bin/python bench/k8s_image_load.py                    # the archives built now
    .venv/bin/python bench/k8s_image_load.py --before OLD_DIR   # side by side with others
    .venv/bin/python bench/k8s_image_load.py --before OLD_DIR --now NEW_DIR

Each round starts a containerd on an empty root and imports the archives in turn;
medians of --rounds. Needs root, containerd and ctr (scripts/setup.sh --cluster).
"""

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import hostcheck  # noqa: E402
from tailcut.k8s.node import images  # noqa: E402

NAMES = ("worker", "operator", "agent")


def archives_in(directory: Path) -> dict[str, Path]:
    found = {}
    for name in NAMES:
        matches = sorted(directory.glob(f"{name}-*.tar"), key=lambda p: p.stat().st_mtime)
        if not matches:
            sys.exit(f"{directory}: no {name}-*.tar (tailcut images build)")
        found[name] = matches[-1]
    return found


def one_round(archives: dict[str, Path]) -> dict[str, float]:
    """Seconds per import into one fresh containerd, in the order a node loads them."""
    with tempfile.TemporaryDirectory(prefix="tc-ctrd-") as tmp:
        root = Path(tmp)
        socket = root / "containerd.sock"
        (root / "config.toml").write_text(
            f'version = 2\nroot = "{root / "root"}"\nstate = "{root / "state"}"\n'
            f'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{socket}"\n')
        daemon = subprocess.Popen(["containerd", "--config", str(root / "config.toml")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            ctr = ["ctr", "--address", str(socket), "--namespace", "k8s.io"]
            deadline = time.monotonic() + 30
            while subprocess.run([*ctr, "version"], capture_output=True).returncode != 0:
                if time.monotonic() > deadline:
                    sys.exit("containerd did not start")
                time.sleep(0.1)
            took = {}
            for name, archive in archives.items():
                started = time.monotonic()
                subprocess.run([*ctr, "images", "import", "--no-unpack=false", str(archive)],
                               check=True, capture_output=True)
                took[name] = time.monotonic() - started
            return took
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
            subprocess.run(["umount", "-R", str(root / "state")], capture_output=True)
            shutil.rmtree(root, ignore_errors=True)


def medians(archives: dict[str, Path], rounds: int) -> dict[str, float]:
    runs = [one_round(archives) for _ in range(rounds)]
    out = {name: statistics.median(r[name] for r in runs) for name in archives}
    out["total"] = statistics.median(sum(r.values()) for r in runs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="a directory of other archives")
    parser.add_argument("--now", type=Path, help="the archives compared (default: those "
                        "`tailcut images build` keeps)")
    parser.add_argument("--rounds", type=int, default=3)
    hostcheck.add_arguments(parser)
    args = parser.parse_args()
    watch = hostcheck.before(args)
    sets = {"now": archives_in(args.now or images.cache_dir())}
    if args.before:
        sets = {"before": archives_in(args.before), **sets}
    results = {label: medians(a, args.rounds) for label, a in sets.items()}
    print(f"{'image':<10}" + "".join(f"{label + ' MB':>11}{label + ' s':>10}" for label in sets)
          + ("   now/before" if args.before else ""))
    for name in (*NAMES, "total"):
        row = f"{name:<10}"
        for label, found in sets.items():
            size = (sum(p.stat().st_size for p in found.values()) if name == "total"
                    else found[name].stat().st_size)
            row += f"{size / 1e6:>11.0f}{results[label][name]:>10.2f}"
        if args.before:
            row += f"{results['now'][name] / results['before'][name]:>13.2f}"
        print(row)
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
