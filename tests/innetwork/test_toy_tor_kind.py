"""A ToR kind from a package of its own (tests/plugins/toy_count.py, registered by the
entry point in toy_count-0.1.dist-info): the spec takes it by name, the planner gives
the roles its section, and `tailcut run` runs the quickstart with it: its switch side
counts the rack ports' bytes, its roles' side every push and pull."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tailcut import innetplan, innetwork, plan, spec
from tailcut.errors import SpecError
from tailcut.ml import models
from tailcut.net import topology
from tailcut.spec import tor_kinds
from tailcut.training import torkinds
from tests import installed_plugins

PLUGINS = installed_plugins.PLUGINS
REPO = Path(__file__).resolve().parents[2]
ITERATIONS = 30
# The quickstart (examples/quickstart.yaml) with the toy kind, a fixed number of
# iterations and a name of its own.
JOB = """\
apiVersion: tailcut.dev/v1alpha1
kind: TrainingJob
metadata: {{name: toykind}}
spec:
  replicas: {{parameterServers: 1, workers: 4}}
  training: {{model: mlp, batchSize: 32, learningRate: 0.1, epochs: 30,
              targetAccuracy: null, iterations: {iterations}}}
  network:
    racks: [{{name: rack-0}}, {{name: rack-1}}]
    placement: {{ps-0: rack-0, worker-0: rack-0, worker-1: rack-0, worker-2: rack-1,
                 worker-3: rack-1}}
    accessLink: {{bandwidth: 1Gbit}}
    uplink: {{bandwidth: 1Gbit}}
    inNetwork: {in_network}
  transport: {{type: tcp}}
"""


def _job(in_network: str = "{kinds: {toy-count: {label: hello}}}"):
    return spec.load_text(JOB.format(iterations=ITERATIONS, in_network=in_network))


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch):
    """The toy's distribution on sys.path, as `pip install` would put it."""
    with installed_plugins.installed(monkeypatch, tor_kinds.registered):
        yield


def test_every_layer_finds_tailcuts_kinds_then_the_registered_one(registered) -> None:
    assert tor_kinds.names() == ["hot_store", "aggregation", "multicast", "toy-count"]
    for kinds in (innetplan.kinds(), innetwork.kinds(), torkinds.kinds()):
        assert [k.name for k in kinds] == tor_kinds.names()


def test_the_roles_get_its_section_and_tailcuts_kinds_stay_off(registered) -> None:
    job = _job()
    topo = topology.plan(job)
    config = plan.role_config(job, "worker-2", "/r", plan.hosts(topo))
    assert config.hot is None and config.aggregate is None and config.multicast is None
    assert list(config.tor) == ["toy-count"]
    mine = config.tor["toy-count"]
    assert mine["label"] == "hello"
    assert [r["workers"] for r in mine["racks"]] == [[0, 1], [2, 3]]


def test_a_job_naming_a_kind_nobody_registered_is_refused() -> None:
    with pytest.raises(SpecError, match="kinds: unknown ToR kind 'toy-count'; "
                                        "registered: none"):
        _job()
    with pytest.raises(SpecError, match="'multicast' is one of tailcut's own ToR kinds"):
        _job("{kinds: {multicast: {}}}")


def test_a_broken_registration_names_its_entry_point(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "broken-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[tailcut.tor_kinds]\nodd = json:dumps\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    tor_kinds.registered.cache_clear()
    try:
        with pytest.raises(tor_kinds.RegistrationError,
                           match="entry point 'odd' = 'json:dumps' of group "
                                 "tailcut.tor_kinds: it is a function, not a "
                                 "tailcut.spec.tor_kinds.TorKind"):
            tor_kinds.names()
    finally:
        monkeypatch.undo()
        tor_kinds.registered.cache_clear()


def test_a_part_that_is_not_what_it_says_is_named() -> None:
    wrong = tor_kinds.TorKind("wrong", plan="tailcut.innetplan:MULTICAST",
                              program="x:y", roles="x:y")
    with pytest.raises(tor_kinds.RegistrationError,
                       match="ToR kind 'wrong': its plan 'tailcut.innetplan:MULTICAST' is "
                             "named 'multicast'"):
        tor_kinds.part(wrong, "plan", innetplan.KindPlan)


@pytest.mark.netns
@pytest.mark.e2e
def test_tailcut_run_runs_the_quickstart_with_it(tmp_path: Path) -> None:
    job_file = tmp_path / "toykind.yaml"
    job_file.write_text(JOB.format(iterations=ITERATIONS,
                                   in_network="{kinds: {toy-count: {label: hello}}}"))
    out = tmp_path / "results"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGINS), str(REPO)])}
    run = subprocess.run([sys.executable, "-m", "tailcut.cli", "run", str(job_file),
                          "--results-dir", str(out)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "ToR toy-count (hello): counting 5 ports" in run.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["iterations"] == ITERATIONS
    # the switch side: every pod's port, in its rack's namespace, carried its traffic
    counted = json.loads((out / "network.json").read_text())["toy-count"]
    assert counted["label"] == "hello"
    ports = counted["ports"]
    assert sorted(ports) == ["ps-0", "worker-0", "worker-1", "worker-2", "worker-3"]
    model_bytes = 4 * models.create("mlp", models.dataset("mlp", 0)).num_params
    for w in range(4):   # each worker's port: its pulls one way, its pushes the other
        seen = ports[f"worker-{w}"]
        assert seen["from_pod"] > ITERATIONS * model_bytes < seen["to_pod"], (w, seen)
    assert ports["ps-0"]["to_pod"] > 4 * ITERATIONS * model_bytes   # every push
    # the roles' side: each worker counted each push (with its rack), the PS each pull
    for w in range(4):
        with open(out / f"toy-count-worker-{w}.csv") as f:
            rows = list(csv.DictReader(f))
        assert [int(r["iteration"]) for r in rows] == list(range(ITERATIONS))
        assert {r["rack"] for r in rows} == {"0" if w < 2 else "1"}
        assert all(int(r["nonzero"]) > 0 and float(r["norm"]) > 0 for r in rows)
    pulls = json.loads((out / "toy-count-ps-0.json").read_text())
    assert pulls["label"] == "hello"
    assert sorted(pulls["pulls"]) == [f"worker-{w}" for w in range(4)]
    assert all(n >= ITERATIONS for n in pulls["pulls"].values())


def test_kubernetes_refuses_a_kind_of_ones_own_naming_the_field(registered) -> None:
    """The CRD has no inNetwork.kinds (the API server would drop it): refused before a
    cluster is asked, naming the field; under `tailcut run` it runs."""
    job = _job()
    refused = plan.refusals(job, "kubernetes")
    assert [r.field for r in refused] == ["spec.network.inNetwork.kinds"]
    assert "toy-count" in refused[0].message and "tailcut run" in refused[0].message
    assert plan.refusals(job, "local") == []
