"""The agent finds a pod's process from the container runtime's own record (containerd's
init.pid, CRI-O's pidfile) when the process's cgroup agrees that it is the pod's, and
otherwise by scanning /proc: first for the pod's UID with one of its container IDs,
then for the UID alone. Real processes in real cgroups named as the kubelet's cgroupfs
driver names them (pod<UID>/<container id>); runtime state dirs are made under
tmp_path."""

import os
import subprocess
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator, Optional

import pytest

from tailcut.k8s.agent import podns
from tests.k8s import fakepod

needs_cgroups = pytest.mark.skipif(
    os.geteuid() != 0 or not (fakepod.CGROUP / "cgroup.procs").exists(),
    reason="needs root and the cgroup v1 pids hierarchy, to put a process in a pod's "
           "cgroup")


def cid() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex   # 64 hex digits, as runtimes make them


@contextmanager
def process_in(cgroup: Optional[Path]) -> Iterator[int]:
    """A real process, in `cgroup` (made and removed here) or left where it is."""
    made: list[Path] = []
    proc = subprocess.Popen(["sleep", "300"])
    try:
        if cgroup is not None:
            for d in reversed([cgroup, *cgroup.parents]):
                if d.is_relative_to(fakepod.CGROUP) and not d.exists():
                    d.mkdir()
                    made.append(d)
            (cgroup / "cgroup.procs").write_text(str(proc.pid))
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()
        for d in reversed(made):   # children first
            d.rmdir()


def pod_cgroup(uid: str, container_id: Optional[str] = None) -> Path:
    group = fakepod.CGROUP / f"k8-test-pod{uid}"
    return group / container_id if container_id else group


def containerd_record(state: Path, container_id: str, content: str) -> Path:
    bundle = state / "io.containerd.runtime.v2.task" / "k8s.io" / container_id
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / "init.pid").write_text(content)
    return bundle / "init.pid"


@pytest.fixture
def pod():
    """A pod UID, one container ID, and a stack to start processes on."""
    with ExitStack() as stack:
        yield SimpleNamespace(uid=str(uuid.uuid4()), cid=cid(), start=lambda group:
                              stack.enter_context(process_in(group)))


@needs_cgroups
def test_the_containerd_record_is_taken_when_the_cgroup_agrees(pod, tmp_path):
    pid = pod.start(pod_cgroup(pod.uid, pod.cid))
    containerd_record(tmp_path, pod.cid, f"{pid}")   # runc writes no newline
    found = podns.find_pod_process(pod.uid, [f"containerd://{pod.cid}"], tmp_path)
    assert found == podns.Found(pid, "runtime", pod.cid)


@needs_cgroups
def test_the_state_dir_comes_from_the_environment(pod, tmp_path, monkeypatch):
    pid = pod.start(pod_cgroup(pod.uid, pod.cid))
    containerd_record(tmp_path, pod.cid, f"{pid}\n")
    monkeypatch.setenv(podns.RUNTIME_STATE_ENV, str(tmp_path))
    assert podns.pid_from_runtime(pod.uid, [f"containerd://{pod.cid}"]) == \
        podns.Found(pid, "runtime", pod.cid)


@needs_cgroups
def test_the_cri_o_record_is_taken_when_the_cgroup_agrees(pod, tmp_path):
    pid = pod.start(pod_cgroup(pod.uid, f"crio-{pod.cid}.scope"))
    userdata = tmp_path / "overlay-containers" / pod.cid / "userdata"
    userdata.mkdir(parents=True)
    (userdata / "pidfile").write_text(str(pid))
    assert podns.find_pod_process(pod.uid, [f"cri-o://{pod.cid}"], tmp_path) == \
        podns.Found(pid, "runtime", pod.cid)


@needs_cgroups
def test_a_record_whose_process_is_not_in_the_pods_cgroup_is_ignored(pod, tmp_path):
    """A stale init.pid: its pid now belongs to a process outside the pod."""
    stranger = pod.start(None)
    ours = pod.start(pod_cgroup(pod.uid, pod.cid))
    containerd_record(tmp_path, pod.cid, str(stranger))
    assert podns.pid_from_runtime(pod.uid, [f"containerd://{pod.cid}"], tmp_path) is None
    assert podns.find_pod_process(pod.uid, [f"containerd://{pod.cid}"], tmp_path) == \
        podns.Found(ours, "cgroup", pod.cid)


@needs_cgroups
@pytest.mark.parametrize("bad", ["../../elsewhere", "abc123", "0" * 63,
                                 "A" * 64, "0" * 64 + "/../x", "0" * 64 + "\n"])
def test_a_malformed_container_id_is_refused(pod, tmp_path, bad):
    """Never part of a path, nor a restriction of the scan: a record planted where the
    malformed id leads, holding the pod's own pid, is not read."""
    pid = pod.start(pod_cgroup(pod.uid))
    planted = tmp_path / "io.containerd.runtime.v2.task" / "k8s.io" / bad / "init.pid"
    planted.parent.mkdir(parents=True, exist_ok=True)
    planted.write_text(str(pid))
    assert planted.read_text() == str(pid)
    ids = [f"containerd://{bad}"]
    assert podns.pid_from_runtime(pod.uid, ids, tmp_path) is None
    assert podns.find_pod_process(pod.uid, ids, tmp_path) == podns.Found(pid, "cgroup", None)


def arabic_indic(pid: int) -> bytes:
    return "".join(chr(0x0660 + int(d)) for d in str(pid)).encode()   # int() reads these


@needs_cgroups
@pytest.mark.parametrize("garbage", [
    lambda pid: b"", lambda pid: b"   \n", lambda pid: b"0", lambda pid: b"-%d" % pid,
    lambda pid: b"+%d" % pid, lambda pid: b"%dabc" % pid, lambda pid: b"%d %d" % (pid, pid),
    lambda pid: b"0x%x" % pid, lambda pid: b"\xff%d" % pid, arabic_indic,
    lambda pid: b"%d" % pid + b" " * 100])
def test_an_init_pid_holding_garbage_is_ignored(pod, tmp_path, garbage):
    """None of these is a pid, though most name the pod's own to a lenient reader."""
    pid = pod.start(pod_cgroup(pod.uid, pod.cid))
    containerd_record(tmp_path, pod.cid, "").write_bytes(garbage(pid))
    ids = [f"containerd://{pod.cid}"]
    assert podns.pid_from_runtime(pod.uid, ids, tmp_path) is None
    assert podns.find_pod_process(pod.uid, ids, tmp_path) == podns.Found(pid, "cgroup", pod.cid)


@needs_cgroups
@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_an_init_pid_that_is_no_regular_file_is_not_read(pod, tmp_path, kind):
    """A symlink could lead anywhere on the node; a FIFO would hang the agent if
    nothing wrote to it. Both hold the pod's own pid here."""
    pid = pod.start(pod_cgroup(pod.uid, pod.cid))
    record = containerd_record(tmp_path, pod.cid, "")
    record.unlink()
    with ExitStack() as stack:
        if kind == "symlink":
            (tmp_path / "elsewhere").write_text(str(pid))
            record.symlink_to(tmp_path / "elsewhere")
        else:
            os.mkfifo(record)
            fd = os.open(record, os.O_RDWR | os.O_NONBLOCK)   # Linux: opens at once
            stack.callback(os.close, fd)
            os.write(fd, str(pid).encode())
        assert podns.pid_from_runtime(pod.uid, [f"containerd://{pod.cid}"],
                                      tmp_path) is None


@needs_cgroups
def test_without_a_record_the_scan_finds_the_process_with_a_container_id(pod, tmp_path):
    pid = pod.start(pod_cgroup(pod.uid, pod.cid))
    found = podns.find_pod_process(pod.uid, [f"containerd://{pod.cid}"], tmp_path)
    assert found == podns.Found(pid, "cgroup", pod.cid)


@needs_cgroups
def test_the_scan_skips_a_process_in_the_pods_cgroup_without_a_container_id(pod, tmp_path):
    """A host process a monitor put in the pod's cgroup comes first in /proc (lower
    pid), yet the pod's container process is chosen."""
    intruder = pod.start(pod_cgroup(pod.uid))
    ours = pod.start(pod_cgroup(pod.uid, pod.cid))
    assert intruder < ours, "pids wrapped around between the two starts; run again"
    assert podns.pid_of_pod(pod.uid) == intruder   # the UID alone would take it
    assert podns.find_pod_process(pod.uid, [f"containerd://{pod.cid}"], tmp_path) == \
        podns.Found(ours, "cgroup", pod.cid)
    # Without container IDs (none known yet), the UID alone is all there is.
    assert podns.find_pod_process(pod.uid, [], tmp_path) == \
        podns.Found(intruder, "cgroup", None)


@needs_cgroups
def test_when_no_process_names_a_container_the_uid_alone_finds_one(pod, tmp_path):
    pid = pod.start(pod_cgroup(pod.uid))
    assert podns.find_pod_process(pod.uid, [f"containerd://{pod.cid}"], tmp_path) == \
        podns.Found(pid, "cgroup", None)
    assert podns.find_pod_process(str(uuid.uuid4()), [f"containerd://{pod.cid}"],
                                  tmp_path) is None


def test_the_systemd_spelling_with_a_container_id_is_matched_in_a_fake_proc(tmp_path):
    """systemd's driver: the UID with underscores, the id in cri-containerd-<id>.scope."""
    uid, container = str(uuid.uuid4()), cid()
    slice_ = "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + \
        uid.replace("-", "_") + ".slice"
    for pid, line in ((21, slice_), (22, slice_ + f"/cri-containerd-{container}.scope")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(line + "\n")
    (tmp_path / "self").mkdir()
    assert podns.find_pod_process(uid, [f"containerd://{container}"], tmp_path / "none",
                                  proc=tmp_path) == podns.Found(22, "cgroup", container)


def test_running_container_ids_are_read_from_the_pods_status():
    def status(container_id, running):
        return SimpleNamespace(container_id=container_id, state=SimpleNamespace(
            running=SimpleNamespace() if running else None))
    pod = SimpleNamespace(status=SimpleNamespace(container_statuses=[
        status("containerd://" + "a" * 64, True), status("containerd://" + "b" * 64, False),
        status(None, False)]))
    assert podns.running_container_ids(pod) == ["containerd://" + "a" * 64]
    assert podns.running_container_ids(SimpleNamespace(status=None)) == []
    assert podns.running_container_ids(SimpleNamespace(status=SimpleNamespace())) == []
    assert podns.running_container_ids(
        SimpleNamespace(status=SimpleNamespace(container_statuses=None))) == []
