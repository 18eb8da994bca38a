"""`tailcut net up / show / down`: a job's network without its training."""

import socket
import subprocess
import sys

import pytest

from tailcut.net import clean, naming, netns
from tests.runtime.runs import nothing_of

JOB = """\
apiVersion: tailcut.dev/v1alpha1
kind: TrainingJob
metadata: {name: netonly}
spec:
  replicas: {workers: 3}
  network:
    racks: [{name: a}, {name: b}]
    accessLink: {bandwidth: 100Mbit, loss: 0.01}
"""


def tailcut(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tailcut.cli", *args], capture_output=True,
                          text=True, timeout=120)


def reachable(src_ns: str, dst_ns: str, dst_ip: str) -> bool:
    with netns.entered(dst_ns):
        server = socket.create_server((dst_ip, 7100))
    with server, netns.entered(src_ns):
        client = socket.create_connection((dst_ip, 7100), timeout=5)
        with client:
            accepted, _ = server.accept()
            accepted.close()
    return True


@pytest.mark.netns
@pytest.mark.bpf
def test_net_up_leaves_the_runs_network_up_and_net_down_removes_all_of_it(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    try:
        built = tailcut("net", "up", str(job))
        assert built.returncode == 0, built.stderr
        assert "netonly: 4 pods in 2 rack(s) up in" in built.stdout
        assert "ebpf dropper loss 0.01" in built.stdout
        assert "tailcut-netonly.worker-2" in built.stdout
        # Up after the command ended: across racks, through the spine.
        assert len(clean.leftovers("netonly")) == 7
        assert reachable(naming.pod_netns("netonly", "worker-2"),
                         naming.pod_netns("netonly", "ps-0"), "10.1.0.2")
        again = tailcut("net", "up", str(job))
        assert again.returncode == 1 and "already has namespaces" in again.stderr
        shown = tailcut("net", "show", str(job))
        assert "7 of 7 namespaces up" in shown.stdout
        assert "worker-2  b        10.2.0.3     tailcut-netonly.worker-2  up" in shown.stdout
    finally:
        down = tailcut("net", "down", "netonly")
    assert down.returncode == 0 and "netonly: 7 namespace(s) removed" in down.stdout
    nothing_of("netonly")
    shown = tailcut("net", "show", str(job))
    assert "0 of 7 namespaces up" in shown.stdout and "absent" in shown.stdout


def test_net_down_refuses_what_is_neither_a_file_nor_a_job_name():
    out = tailcut("net", "down", "Not_A_Job")
    assert out.returncode == 2 and "neither a TrainingJob file nor a job name" in out.stderr
