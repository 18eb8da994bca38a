"""A transport from a package of its own (tests/plugins/toy_fp16.py, registered by the
entry point in toy_fp16-0.1.dist-info): the spec checks it by its traits, the roles
build it, `tailcut run` trains over it; a broken registration is named."""

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from tailcut import plan, spec, transports
from tailcut.errors import SpecError
from tailcut.net import topology
from tailcut.spec import transport_kinds
from tailcut.transports.base import Kind, Message
from tests import installed_plugins

PLUGINS = installed_plugins.PLUGINS
REPO = Path(__file__).resolve().parents[2]
JOB = """\
apiVersion: tailcut.dev/v1alpha1
kind: TrainingJob
metadata: {{name: {name}}}
spec:
  replicas: {{workers: 2}}
  transport: {transport}
  training: {{model: mlp, iterations: 40, epochs: 30, targetAccuracy: null}}
  network:
    racks: [{{name: a}}, {{name: b}}]
"""


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch):
    """The toy's distribution on sys.path, as `pip install` would put it."""
    with installed_plugins.installed(monkeypatch, transport_kinds.registered):
        yield


def _job(transport: str, name: str = "toy"):
    return spec.load_text(JOB.format(name=name, transport=transport))


def test_the_spec_knows_a_registered_transport_by_its_traits(registered) -> None:
    assert transports.names()[-1] == "toy-fp16"
    job = _job("{type: toy-fp16, tcpCongestionControl: reno}")
    pod = topology.plan(job).pod("worker-0")
    assert plan.transport_options(job, pod) == {"type": "toy-fp16",
                                                "congestion_control": "reno"}
    with pytest.raises(SpecError, match="p: only bounded-loss and app-drop take p; "
                                        "toy-fp16 delivers what it delivers"):
        _job("{type: toy-fp16, p: 0.9}")
    with pytest.raises(SpecError, match="rateMbit: toy-fp16 is paced by TCP"):
        _job("{type: toy-fp16, rateMbit: 100}")


def test_without_its_package_the_name_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(SpecError, match="unsupported transport 'toy-fp16'; supported: "
                                        "tcp, udp, bounded-loss, app-drop"):
        _job("{type: toy-fp16}")


def test_it_carries_a_vector_in_half_the_bytes_of_tcp(registered) -> None:
    values = np.random.default_rng(1).standard_normal(10_001).astype(np.float32)
    got = {}
    for name in ("tcp", "toy-fp16"):
        server, client = transports.get(name), transports.get(name)
        accepted: list = []
        port = _free_port()
        listener = threading.Thread(target=lambda: accepted.extend(
            server.listen("127.0.0.1", port, 1, 10.0)))
        listener.start()
        conn = client.connect("127.0.0.1", port, 10.0)
        listener.join()
        conn.send(Message(Kind.PUSH, 3, 1, values))
        got[name] = accepted[0].recv(10.0)
        for c in (conn, accepted[0]):
            c.close()
        server.close()
        client.close()
    half = got["toy-fp16"]
    assert half.iteration == 3 and half.values.dtype == np.float32
    np.testing.assert_allclose(half.values, values, rtol=1e-3, atol=1e-4)
    assert not np.array_equal(half.values, values)   # float16 really was on the wire
    assert half.wire_bytes < 0.51 * got["tcp"].wire_bytes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dist(root: Path, line: str) -> None:
    info = root / "broken-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[tailcut.transports]\n{line}\n")


@pytest.mark.parametrize("line, says", [
    ("odd = json:dumps", "it is a function, not a tailcut.spec.transport_kinds.TransportKind"),
    ("other = toy_fp16:KIND", "it declares the transport 'toy-fp16'; the entry point's "
                              "name must be the transport's"),
    ("gone = no_such_module:KIND", "cannot load it: No module named 'no_such_module'"),
])
def test_a_broken_registration_names_its_entry_point(tmp_path: Path, line: str, says: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _dist(tmp_path, line)
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.syspath_prepend(str(tmp_path))
    transport_kinds.registered.cache_clear()
    try:
        name = line.split(" = ")[0]
        with pytest.raises(transport_kinds.RegistrationError,
                           match=f"entry point '{name}' = .* of group tailcut.transports: "
                                 f"{says}"):
            transport_kinds.names()
    finally:
        monkeypatch.undo()
        transport_kinds.registered.cache_clear()


@pytest.mark.netns
@pytest.mark.e2e
def test_tailcut_run_trains_over_it_as_over_tcp_in_half_the_segments(tmp_path: Path) -> None:
    """The same short job over tcp and over the toy: the same accuracy (float16 keeps
    what 40 SGD steps need), about half the TCP segments sent."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGINS), str(REPO)])}
    metrics = {}
    for transport in ("tcp", "toy-fp16"):
        job_file = tmp_path / f"{transport}.yaml"
        job_file.write_text(JOB.format(name=f"plugin-{transport}",
                                       transport=f"{{type: {transport}}}"))
        out = tmp_path / transport
        run = subprocess.run([sys.executable, "-m", "tailcut.cli", "run", str(job_file),
                              "--results-dir", str(out)], env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        metrics[transport] = json.loads((out / "metrics.json").read_text())
    toy, tcp = metrics["toy-fp16"], metrics["tcp"]
    assert toy["transport"] == "toy-fp16" and toy["iterations"] == tcp["iterations"] == 40
    assert abs(toy["final_accuracy"] - tcp["final_accuracy"]) < 0.02
    segments = (toy["tcp_counters"]["total"]["out_segs"]
                / tcp["tcp_counters"]["total"]["out_segs"])
    assert 0.4 < segments < 0.6, segments
