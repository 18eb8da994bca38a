"""What `tailcut cluster up` costs, warm (the nodes' image stores hold the images) and
cold (the stores purged first, as on a fresh machine), side by side in one run.

    .venv/bin/python bench/cluster_up.py                  # 1 and 2 nodes, 3 rounds
    .venv/bin/python bench/cluster_up.py --nodes 2 --rounds 5 --warm-only

Each round runs the CLI as a user would (`tailcut cluster up --workdir W --nodes N`,
with the images built before the first round), times it from the command to its exit,
and takes the cluster down. The cold rounds purge the stores of the bench's own node
numbers only. Prints medians, the cold/warm ratio, the load average at each round and,
for the last warm round, the steps `up` printed with their seconds. Needs root and
scripts/setup.sh --cluster; nodes numbered from 10 so no other cluster is touched.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import hostcheck  # noqa: E402
from tailcut.k8s.node import images, imagestore  # noqa: E402
from tailcut.k8s.node.cluster import Cluster  # noqa: E402
from tailcut.k8s.node.layout import Node  # noqa: E402

FIRST_NODE = 10


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tailcut.cli", *args]


def one_up(workdir: Path, nodes: int) -> tuple[float, str]:
    started = time.monotonic()
    out = subprocess.run(cli("cluster", "up", "--workdir", str(workdir), "--nodes",
                             str(nodes), "--first-node", str(FIRST_NODE)),
                         capture_output=True, text=True)
    took = time.monotonic() - started
    Cluster.down(workdir, progress=lambda line: None)
    if out.returncode != 0:
        sys.exit(f"cluster up failed:\n{out.stdout}\n{out.stderr}")
    return took, out.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="*", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm-only", action="store_true")
    hostcheck.add_arguments(ap)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root")
    watch = hostcheck.before(args)
    images.build_all(progress=lambda line: None)
    workdir = Path(tempfile.mkdtemp(prefix="tc-up-", dir="/tmp")) / "c"
    print(f"{'nodes':>5} {'mode':>5} {'median s':>9}  rounds (load average)")
    for nodes in args.nodes:
        medians = {}
        last = ""
        for mode in ("cold", "warm") if not args.warm_only else ("warm",):
            if mode == "warm":
                one_up(workdir, nodes)   # fills the stores if the cold rounds did not
            times = []
            for _ in range(args.rounds):
                if mode == "cold":
                    for k in range(nodes):
                        imagestore.purge(Node(FIRST_NODE + k, workdir))
                load = os.getloadavg()[0]
                took, last = one_up(workdir, nodes)
                times.append(f"{took:.1f} ({load:.1f})")
                medians.setdefault(mode, []).append(took)
            print(f"{nodes:>5} {mode:>5} {statistics.median(medians[mode]):>9.1f}  "
                  + ", ".join(times))
        if "cold" in medians:
            print(f"{nodes:>5} cold/warm {statistics.median(medians['cold']) / statistics.median(medians['warm']):.1f}x")
        print("the last warm round's steps:\n" + "\n".join(
            "    " + line for line in last.splitlines() if " s  " in line))
    for k in range(max(args.nodes)):
        imagestore.purge(Node(FIRST_NODE + k, workdir))
    hostcheck.after(watch)


if __name__ == "__main__":
    main()
