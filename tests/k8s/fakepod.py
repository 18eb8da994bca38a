"""A pod as the node agent finds one, without a kubelet: a process in its own network
namespace with an eth0 (as a CNI leaves it), in a cgroup named after a pod UID (as the
kubelet puts it)."""

import os
import subprocess
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

from pyroute2 import IPRoute

from tailcut.k8s.agent import podns

CGROUP = Path("/sys/fs/cgroup/pids")


class Maker:
    """`with Maker() as make: pod = make("ps-0")`; every pod is ended on exit."""

    def __init__(self) -> None:
        self.made: list[tuple[str, subprocess.Popen, Path]] = []

    def __enter__(self) -> "Maker":
        return self

    def __call__(self, replica: str, uid: Optional[str] = None,
                 own_netns: bool = True) -> SimpleNamespace:
        """`own_netns` False: the process stays in this (the node's) network
        namespace, as a host-network process a runtime put in the pod's cgroup."""
        uid = uid or str(uuid.uuid4())
        proc = subprocess.Popen(["unshare", "--net", "sleep", "300"] if own_netns
                                else ["sleep", "300"])
        group = CGROUP / f"k8-test-pod{uid}"
        self.made.append((uid, proc, group))
        for _ in range(100):   # wait until unshare has exec'd sleep in the new netns
            if not own_netns or \
                    os.readlink(f"/proc/{proc.pid}/ns/net") != os.readlink("/proc/self/ns/net"):
                break
            time.sleep(0.02)
        group.mkdir()
        (group / "cgroup.procs").write_text(str(proc.pid))
        if not own_netns:
            return SimpleNamespace(uid=uid, pid=proc.pid, proc=proc, replica=replica,
                                   name=podns.netns_name(uid))
        with IPRoute(netns=f"/proc/{proc.pid}/ns/net") as ipr:
            ipr.link("add", ifname="eth0", kind="veth", peer="cni-peer")
            for ifname in ("eth0", "cni-peer"):
                ipr.link("set", index=ipr.link_lookup(ifname=ifname)[0], state="up")
        return SimpleNamespace(uid=uid, pid=proc.pid, proc=proc, replica=replica,
                               name=podns.netns_name(uid))

    def __exit__(self, *exc: object) -> None:
        for uid, proc, group in self.made:
            podns.detach(podns.netns_name(uid))   # in case a test failed half-way
            proc.kill()
            proc.wait()
            if group.exists():
                group.rmdir()
