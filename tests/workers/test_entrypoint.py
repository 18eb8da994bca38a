"""The worker image's entrypoint turns the mounted spec and a replica name into the
RoleConfig the role runs with."""

import importlib.util
import json
import re
from pathlib import Path

import pytest

from tailcut import spec
from tailcut.training import tcpstats

REPO = Path(__file__).resolve().parents[2]


def load_entrypoint():
    loaded = importlib.util.spec_from_file_location("entrypoint", REPO / "workers" / "entrypoint.py")
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


def test_roles_reach_and_bind_the_addresses_the_topology_plans_as_under_tailcut_run(tmp_path):
    from tailcut.net import topology

    entry = load_entrypoint()
    job = spec.load_file(REPO / "examples" / "quickstart.yaml")
    ps_ip = topology.plan(job).pod("ps-0").ip
    worker = entry.role_config(job, "worker-2", str(tmp_path))
    assert (worker.role, worker.index, worker.ps_host) == ("worker", 2, ps_ip)
    assert worker.target_accuracy == 0.93 and worker.num_workers == 4
    ps = entry.role_config(job, "ps-0", str(tmp_path))
    assert (ps.role, ps.ps_host) == ("ps", ps_ip)


def test_a_pod_whose_address_never_comes_fails_naming_it_and_the_agent(capsys, monkeypatch):
    from tailcut.net import topology

    entry = load_entrypoint()
    monkeypatch.setattr(entry, "ADDRESS_TIMEOUT_S", 0.3)
    example = REPO / "examples" / "quickstart.yaml"
    ip = topology.plan(spec.load_file(example)).pod("worker-1").ip
    assert entry.main(["--spec", str(example), "--replica", "worker-1"]) == 1
    err = capsys.readouterr().err
    assert f"pod worker-1: waited 0.3 s for {ip} (its address on the job's links)" in err
    assert "node agent adds it as tc0" in err


def test_a_pod_gets_the_transport_options_tailcut_run_gives_the_same_role(tmp_path):
    from tailcut import plan
    from tailcut.net import topology

    entry = load_entrypoint()
    job = spec.from_dict({"apiVersion": "tailcut.dev/v1alpha1", "kind": "TrainingJob",
                          "metadata": {"name": "wk-appdrop"},
                          "spec": {"transport": {"type": "app-drop", "p": 0.8}}})
    for replica in ("ps-0", "worker-1"):
        config = entry.role_config(job, replica, str(tmp_path))
        expected = plan.transport_options(job, topology.plan(job).pod(replica))
        assert config.transport == expected and config.transport["p"] == 0.8


def test_an_unknown_replica_is_refused_naming_the_jobs_pods(tmp_path, capsys):
    entry = load_entrypoint()
    code = entry.main(["--spec", str(REPO / "examples" / "quickstart.yaml"),
                       "--replica", "worker-9"])
    assert code == 2
    assert "worker-9" in capsys.readouterr().err


@pytest.mark.parametrize("dockerfile", ["operator/Dockerfile", "operator/agent.Dockerfile",
                                        "workers/Dockerfile", "workers/torch.Dockerfile"])
def test_every_dockerfile_copies_and_runs_files_that_exist(dockerfile):
    text = (REPO / dockerfile).read_text()
    for line in re.findall(r"^COPY\s+(.+)$", text, re.M):
        *sources, _ = line.split()
        if sources[0].startswith("--from="):
            continue  # from a build stage of the same file (workers/Dockerfile's rxfast)
        for src in sources:
            assert (REPO / src).exists(), f"{dockerfile}: COPY {src}: no such path"
    for module in re.findall(r'"-m", "([\w.]+)"', text):
        assert importlib.util.find_spec(module) is not None, f"{dockerfile}: -m {module}"
    for path in re.findall(r'"/app/([\w/.]+\.py)"', text):
        assert (REPO / path).exists(), f"{dockerfile}: /app/{path} is not in the repository"


def cadentflow_job():
    text = (REPO / "examples" / "cadentflow.yaml").read_text()
    return spec.load_text(text), text


def test_a_pod_takes_its_per_tensor_tags_from_the_config_maps_flows_json(tmp_path):
    import json

    from tailcut.k8s.manifests import policy
    from tailcut.scheduling import flowreport
    from tailcut.training import config

    entry = load_entrypoint()
    job, text = cadentflow_job()
    (tmp_path / "spec.yaml").write_text(text)
    assert entry.read_flows(tmp_path / "spec.yaml") is None   # then resolved from the spec
    assert entry.role_config(job, "ps-0", str(tmp_path)).flows == flowreport.role_flows(job)
    levels = {"policy": "cadentflow", "pull": {n: 3 for n in flowreport.layer_names(
        "deep-mlp", job.spec.training.seed)}}
    levels["push"] = dict(levels["pull"])
    (tmp_path / policy.FLOWS_KEY).write_text(json.dumps(levels))
    worker = entry.role_config(job, "worker-1", str(tmp_path),
                               entry.read_flows(tmp_path / "spec.yaml"))
    assert worker.flows == levels
    worker.to_json(tmp_path / "worker-1.json")   # what the role starts from: valid
    assert config.RoleConfig.from_json(tmp_path / "worker-1.json").flows == levels


DONE = {"event": "done", "role": "ps", "jct_s": 4.2, "epochs": 7, "iterations": 700,
        "final_accuracy": 0.931, "final_loss": 0.21, "converged": True, "per_epoch": [1] * 999,
        # the PS pod's TCP counters (role.py adds them), at their largest
        "tcp": {k: 2**63 - 1 for k in tcpstats.FIELDS}}


def test_the_ps_done_event_becomes_the_termination_message(tmp_path, monkeypatch, capsys):
    """The kubelet keeps at most 4096 bytes of it: the figures the operator puts in the
    status, not the whole event."""
    entry = load_entrypoint()
    message = tmp_path / "termination-log"
    message.write_text("")   # the kubelet's mount exists before the container starts
    monkeypatch.setenv("TAILCUT_TERMINATION_LOG", str(message))
    entry._emit_and_report({"event": "epoch", "epoch": 1})
    assert message.read_text() == ""
    entry._emit_and_report(DONE)
    written = json.loads(message.read_text())
    assert written == {k: v for k, v in DONE.items() if k not in ("event", "role", "per_epoch")}
    assert written["tcp"]["retrans_segs"] == 2**63 - 1
    assert len(message.read_bytes()) < 4096
    assert '"per_epoch"' in capsys.readouterr().out   # the log still has all of it


def test_a_roles_error_becomes_the_termination_message(tmp_path, monkeypatch):
    """Not the log's tail, which ends in the results block (base64): the job's status
    then said nothing of why a pod failed."""
    entry = load_entrypoint()
    message = tmp_path / "termination-log"
    message.write_text("")
    monkeypatch.setenv("TAILCUT_TERMINATION_LOG", str(message))
    entry._emit_and_report({"event": "error", "role": "worker", "index": 2,
                            "message": "no PARAMS from the PS within 30 s" + "é" * 9000})
    assert message.read_text().startswith("no PARAMS from the PS within 30 s")
    assert len(message.read_bytes()) < 4096


def test_outside_a_pod_no_termination_message_file_is_created(tmp_path, monkeypatch):
    """The directory exists (as /dev does for a test run as root), the file does not:
    the kubelet did not mount one, so none is made."""
    entry = load_entrypoint()
    absent = tmp_path / "termination-log"
    monkeypatch.setenv("TAILCUT_TERMINATION_LOG", str(absent))
    entry._emit_and_report(DONE)
    assert not absent.exists()


@pytest.mark.netns
def test_a_role_that_is_its_containers_pid_1_ends_at_once_on_sigterm(tmp_path):
    """As in a pod: the entrypoint is PID 1 of its own PID namespace, where a signal
    without a handler is ignored. Deleting the pod sends SIGTERM; the role must end
    then (a PS replica takes over only once its primary is gone), not at the kubelet's
    SIGKILL 30 s later. Here ps-0 waits for workers that never come."""
    import os
    import signal
    import subprocess
    import sys
    import time

    if os.geteuid() != 0:
        pytest.skip("needs root (a PID and a network namespace)")
    from tailcut.net import topology

    env = {**os.environ, "TAILCUT_RESULTS_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    example = REPO / "examples" / "quickstart.yaml"
    ip = topology.plan(spec.load_file(example)).pod("ps-0").ip
    # The address the agent would give the pod, then the entrypoint as PID 1 (exec).
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--net", "--kill-child", "sh", "-c",
         f"ip link add tc0 type veth peer name tc0-peer && ip addr add {ip}/24 dev tc0 && "
         f"ip link set tc0-peer up && ip link set tc0 up && exec {sys.executable} "
         f"{REPO / 'workers' / 'entrypoint.py'} --spec {example} --replica ps-0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        pid1 = None
        deadline = time.monotonic() + 60
        while pid1 is None and time.monotonic() < deadline:   # the PS is up and waiting
            for child in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
                if "ps-0" in Path(f"/proc/{child}/cmdline").read_text():
                    if (tmp_path / "ps-0.json").exists():
                        pid1 = int(child)
            time.sleep(0.1)
        assert pid1 is not None, "the role never started"
        time.sleep(2)   # past its imports, into the wait for workers
        os.kill(pid1, signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert "SIGTERM (the pod is being deleted or stopped): exiting" in out, out[-2000:]
