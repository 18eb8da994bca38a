"""`tailcut collect` builds the results `tailcut run` leaves from what the pods' logs carry."""

import json

from tailcut import spec
from tailcut.k8s import collect, podresults
from tailcut.training import tcpstats

DONE = {"event": "done", "converged": False, "jct_s": 1.5, "epochs": 0, "iterations": 5,
        "final_accuracy": 0.5, "final_loss": 1.2}


def test_the_pods_tcp_counters_travel_in_their_logs_and_are_summed_as_under_tailcut_run(
        tmp_path):
    job = spec.load_text("kind: TrainingJob\nmetadata: {name: collected}\n"
                         "spec: {replicas: {workers: 2}}\n")
    results = tmp_path / "results"
    for pod, retrans in (("ps-0", 3), ("worker-0", 4)):   # worker-1 left no block
        own = tmp_path / pod
        counts = {**{k: 1 for k in tcpstats.FIELDS}, "out_segs": 100, "retrans_segs": retrans}
        tcpstats.write(own, pod, counts)
        block, _ = podresults.pack(pod, own)
        podresults.unpack(pod, block.splitlines(), results)
    lines: list[str] = []
    collect.write_report(job, DONE, results, lines.append)
    metrics = json.loads((results / "metrics.json").read_text())
    assert metrics["tcp_retrans_segs"] == 7 and metrics["tcp_rto_timeouts"] == 2
    assert sorted(metrics["tcp_counters"]["pods"]) == ["ps-0", "worker-0"]
    assert metrics["tcp_counters"]["missing"] == ["worker-1"]
    assert (results / "tcp_counters.csv").read_text().count("\n") == 3
    assert any(line.startswith("tcp (2 pods' namespaces): 7 of 200 segments "
                                  "retransmitted (3.50%), 2 RTO timeouts") for line in lines)
