"""A bounded-loss job end to end inside Debian's user-mode Linux, run by
tests/uml/test_uml.py; never collected on the host (its name is not test_*.py), where
the delay it sets would be refused for want of netem.

The quickstart's shape, smaller (ps-0 and worker-0 in rack r0, worker-1 in r1; mlp; a
few iterations; 100 Mbit/s, since the UML has one CPU): access links delayed by netem,
uplinks losing by netem at both ends, so worker-1's messages and the PS's to it cross
two lossy ends and worker-0's none. Each receiving role attaches the XDP counter (BCC
compiled against Debian's 6.1 headers) in generic mode to its eth0; what the job
delivered is read back from its metrics.json and messages*.csv.
"""

import csv
import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.uml.inside.check_netem import BIN, job, record

pytestmark = [pytest.mark.netns, pytest.mark.bpf]
P = 0.9
LOSS = 0.05   # at each end of both uplinks, by netem


def test_a_bounded_loss_job_trains_over_delayed_lossy_links_and_delivers_p(
        tmp_path: Path) -> None:
    lossy = job("u-bl", {"accessLink": {"bandwidth": "100Mbit", "delayMs": 2},
                         "uplink": {"bandwidth": "100Mbit", "loss": LOSS}},
                training={"model": "mlp", "batchSize": 32, "epochs": 1, "iterations": 20},
                transport={"type": "bounded-loss", "p": P})
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(lossy.model_dump(by_alias=True, mode="json")))
    results = tmp_path / "results"
    started = time.monotonic()
    run = subprocess.run([str(BIN / "tailcut"), "run", str(path), "--results-dir",
                          str(results)], capture_output=True, text=True, timeout=150)
    wall = time.monotonic() - started
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    # the links as applied: netem's delay on the access links, netem's loss on the uplinks
    applied = json.loads((results / "network.json").read_text())["applied"]
    assert "netem delay 2 ms" in applied["tailcut-u-bl.worker-1/eth0"], applied
    assert "netem delay 0 ms jitter 0 ms loss 0.05" in applied["tailcut-u-bl.spine/r1"], applied
    # every receiving role counted its datagrams with the XDP counter, in generic mode
    for pod in ("ps-0", "worker-0", "worker-1"):
        log = (results / "logs" / f"{pod}.log").read_text()
        assert "XDP counter attached to eth0 in generic mode" in log, f"{pod}: {log[-2000:]}"
    delivery = json.loads((results / "metrics.json").read_text())["delivery"]
    # per message: what arrived of it, and the NACK rounds it took; by whether it
    # crossed the lossy uplinks (worker-1, index 1, is the one in rack r1; the PS is -1)
    shares: dict[str, list[float]] = {"r0": [], "r1": []}
    repairs = {"r0": 0, "r1": 0}
    for csv_path in sorted(results.glob("messages*.csv")):
        with open(csv_path, newline="") as f:
            for row in csv.DictReader(f):
                count = int(row["coordinates"] or 0)
                if count > 0:
                    rack = "r1" if "1" in (row["sender"], row["receiver"]) else "r0"
                    shares[rack].append(1 - int(row["missing"]) / count)
                    repairs[rack] += int(row["repairs"] or 0)
    record("bounded_loss_job", {"wall_s": round(wall, 1), "delivery": delivery,
                                "least_share": {r: round(min(s), 4) for r, s in shares.items()
                                                if s},
                                "repairs": repairs})
    assert shares["r0"] and shares["r1"], shares
    # p is a floor for every message: the counter fires at ceil(p * total) coordinates
    # (and the sender stops there, so a message on a clean path lacks some too)
    assert min(min(s) for s in shares.values()) >= P, shares
    assert delivery["delivered"] >= P, delivery
    # netem's loss reached the job: about 9.75% of a pass is lost across the two lossy
    # ends, so some of those messages fall short of p and are repaired by a NACK round
    assert repairs["r1"] > 0, repairs
