"""Whole runs judged by their fidelity verdict: a job the links bound is called
network-bound, the same job beside CPU hogs host-bound, each with its evidence."""

import json
import subprocess
import sys

import pytest

from tailcut import spec
from tailcut.fidelity import verdict
from tailcut.runtime import local
from tests.runtime.runs import nothing_of

pytestmark = [pytest.mark.netns, pytest.mark.e2e]

# The quickstart's PS pushes ~1 MB a iteration to its workers; at 100 Mbit/s that
# takes ~80 ms against a few ms of compute: the links bind, two cores idle along.
JOB = """\
apiVersion: tailcut.dev/v1alpha1
kind: TrainingJob
metadata: {{name: {name}}}
spec:
  replicas: {{workers: 4}}
  training: {{model: mlp, iterations: 60, epochs: 30, targetAccuracy: null}}
  network:
    racks: [{{name: a}}, {{name: b}}]
    accessLink: {{bandwidth: 100Mbit}}
    uplink: {{bandwidth: 100Mbit}}
"""
HOG = "while True: pass\n"


def run(tmp_path, name):
    lines: list[str] = []
    result = local.run(spec.load_text(JOB.format(name=name)), tmp_path, progress=lines.append)
    nothing_of(name)
    return result, lines, json.loads((tmp_path / "metrics.json").read_text())


def test_a_job_the_links_bound_is_network_bound(tmp_path):
    result, lines, metrics = run(tmp_path, "fid-net")
    fidelity = metrics["fidelity"]
    if fidelity["verdict"] != "network-bound":
        # A CI host's own daemons may take a few % of its cores: the verdict then names
        # them, and nothing else; judged again without them, the job is network-bound.
        assert fidelity["verdict"] == "marginal", fidelity["reasons"]
        assert all(reason.startswith("other processes took")
                   for reason in fidelity["reasons"]), fidelity["reasons"]
        evidence = fidelity["evidence"]
        processes = evidence["processes"]
        quiet = {**processes, "share": {**processes["share"], "others": 0.0}}
        again = verdict.judge(host=evidence["host"], processes=quiet,
                              links=evidence["links"])
        assert again["verdict"] == "network-bound", again["reasons"]
    assert result.fidelity == fidelity
    links = fidelity["evidence"]["links"]["ends"]
    assert len(links) == 2 * 5 + 2 * 2   # both ends of 5 access links and 2 uplinks
    assert max(end["backlogged_share"] for end in links.values()) > 0.3
    assert any(line.startswith(f"fidelity: {fidelity['verdict']}") for line in lines)
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["state"] == "finished" and record["fidelity"] == fidelity["verdict"]
    assert record["host"]["kernel"] and record["host"]["cores"] >= 1


def test_the_same_job_beside_cpu_hogs_is_host_bound_naming_them(tmp_path):
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(3)]
    try:
        _, lines, metrics = run(tmp_path, "fid-hog")
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    fidelity = metrics["fidelity"]
    assert fidelity["verdict"] == "host-bound"
    assert any(reason.startswith("the host's") and "busy" in reason
               for reason in fidelity["reasons"]), fidelity["reasons"]
    assert any(reason.startswith("other processes took") and "python" in reason
               for reason in fidelity["reasons"]), fidelity["reasons"]
    assert any(line.startswith("fidelity: host-bound") for line in lines)


def test_a_directory_holding_a_run_is_refused_before_anything_is_built(tmp_path):
    (tmp_path / "metrics.json").write_text("{}")
    with pytest.raises(local.RunError, match="already holds a run's results"):
        local.run(spec.load_text(JOB.format(name="fid-twice")), tmp_path,
                  progress=lambda _: None)
    nothing_of("fid-twice")
