"""What a node is on the host: its network namespace and veth, its cgroups, and the
removal of all of it, including what the container runtime left after a crash.

Ownership: the node's namespace, veth and cgroups carry its name (tcnode-<i>); the
runtime's leftovers are found through the node's own paths (mounts under its
directory, shims started with its containerd socket, processes in its cgroups, pod
namespaces whose address is in its pod range). Nothing else is touched.
"""

import ctypes
import errno
import ipaddress
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from tailcut.k8s.node.layout import LAN_BRIDGE, LAN_IF, Node, lan_netns
from tailcut.k8s.node.procs import cmdline, pids_in_cgroup, stop
from tailcut.net import netns

CGROUP_ROOT = Path("/sys/fs/cgroup")
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def create_node_network(node: Node) -> None:
    """The node's namespace, and a veth pair whose node end is eth0 there."""
    netns.create(node.name)
    with IPRoute() as ipr:
        ipr.link("add", ifname=node.host_veth, kind="veth", peer={"ifname": "tmp-" + node.name})
        host_index = ipr.link_lookup(ifname=node.host_veth)[0]
        peer_index = ipr.link_lookup(ifname="tmp-" + node.name)[0]
        ipr.addr("add", index=host_index, address=node.host_ip, prefixlen=24)
        ipr.link("set", index=peer_index, net_ns_fd=str(netns.path(node.name)))
        ipr.link("set", index=host_index, state="up")
    with netns.ipr(node.name) as ipr:
        index = ipr.link_lookup(ifname="tmp-" + node.name)[0]
        ipr.link("set", index=index, ifname="eth0")
        ipr.addr("add", index=index, address=node.ip, prefixlen=24)
        ipr.link("set", index=index, state="up")
        ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
        # Components that look for a default route to pick their address find one; the
        # host does not forward (ip_forward 0 on these machines), so nothing leaves.
        ipr.route("add", dst="0.0.0.0/0", gateway=node.host_ip)


def create_lan(nodes: list[Node]) -> str:
    """Join `nodes` by a bridge in a namespace of their own (the LAN), each by a veth
    (lan0 in the node), with routes in every node to the others' addresses and pod
    ranges through it. Each node's link has its MTU (Node.lan_mtu), at both ends.
    Returns the LAN namespace's name."""
    lan = lan_netns(nodes[0].index)
    netns.create(lan)
    with netns.ipr(lan) as ipr:
        ipr.link("add", ifname=LAN_BRIDGE, kind="bridge")
        bridge = ipr.link_lookup(ifname=LAN_BRIDGE)[0]
        ipr.link("set", index=bridge, state="up")
        for node in nodes:
            ipr.link("add", ifname=node.lan_port, kind="veth",
                     peer={"ifname": LAN_IF, "net_ns_fd": netns.path(node.name)})
            ipr.link("set", index=ipr.link_lookup(ifname=node.lan_port)[0], master=bridge,
                     mtu=node.lan_mtu, state="up")
    for node in nodes:
        with netns.ipr(node.name) as ipr:
            index = ipr.link_lookup(ifname=LAN_IF)[0]
            ipr.addr("add", index=index, address=node.lan_ip, prefixlen=24)
            ipr.link("set", index=index, mtu=node.lan_mtu, state="up")
            for other in nodes:
                if other != node:
                    ipr.route("add", dst=f"{other.ip}/32", gateway=other.lan_ip)
                    ipr.route("add", dst=other.pod_cidr, gateway=other.lan_ip)
    return lan


def remove_lan(first_index: int) -> None:
    """Remove the LAN namespace (its bridge and veths go with it). Gone is fine."""
    netns.remove(lan_netns(first_index))


def _controllers() -> list[Path]:
    """The cgroup hierarchies to make the node's root in: each v1 controller, or the
    unified hierarchy."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return [CGROUP_ROOT]
    return [p for p in sorted(CGROUP_ROOT.iterdir()) if p.is_dir() and not p.is_symlink()
            and (p / "cgroup.procs").exists()]


def create_cgroups(node: Node) -> None:
    """The kubelet's cgroupRoot must exist; cpuset children need cpus and mems set."""
    for hierarchy in _controllers():
        path = hierarchy / node.name
        path.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (path / knob).exists():
                (path / knob).write_text((hierarchy / knob).read_text())


def remove_node(node: Node, progress: Callable[[str], None]) -> None:
    _stop_shims(node, progress)
    for pid in pids_in_cgroup(node.cgroup_root + "/"):
        progress(f"stopping container process {pid}")
        stop(pid, timeout_s=2)
    _unmount_under(node.dir)
    for name in _pod_namespaces(node):
        progress(f"removing pod network namespace {name}")
        netns.remove(name)
    if netns.exists(node.name):
        progress(f"removing network namespace {node.name}")
        netns.remove(node.name)
    with IPRoute() as ipr:
        for index in ipr.link_lookup(ifname=node.host_veth):
            try:
                ipr.link("del", index=index)
            except NetlinkError as err:
                if err.code != errno.ENODEV:   # gone with the namespace's end of it
                    raise
    _remove_cgroups(node)
    shutil.rmtree(node.run_dir, ignore_errors=True)
    try:
        node.run_dir.parent.rmdir()   # /run/tailcut, once no node is left
    except OSError:
        pass


def _stop_shims(node: Node, progress: Callable[[str], None]) -> None:
    """containerd's shims outlive it; ours were started with our socket's address."""
    socket = str(node.containerd_socket)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            argv = cmdline(int(entry.name))
            if argv and "containerd-shim" in argv[0] and socket in argv:
                progress(f"stopping containerd shim {entry.name}")
                stop(int(entry.name), timeout_s=2)


def _unmount_under(directory: Path) -> None:
    prefix = str(directory.resolve()) + "/"
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix):
            mounts.append(point)
    for point in sorted(mounts, key=len, reverse=True):   # the deepest first
        _libc.umount2(point.encode(), MNT_DETACH)


def _pod_namespaces(node: Node) -> list[str]:
    """containerd's pod namespaces (cni-*) holding an address of this node's pods."""
    pods = ipaddress.ip_network(node.pod_cidr)
    found = []
    for name in netns.list_names("cni-"):
        out = subprocess.run(["ip", "-n", name, "-j", "addr"], capture_output=True,
                             text=True)
        try:
            links = json.loads(out.stdout or "[]")
        except ValueError:
            continue
        addresses = [a["local"] for link in links for a in link.get("addr_info", [])
                     if a.get("family") == "inet"]
        if not addresses or any(ipaddress.ip_address(a) in pods for a in addresses):
            found.append(name)   # an empty one is a sandbox whose CNI setup never ran
    return found


def _remove_cgroups(node: Node) -> None:
    for hierarchy in _controllers():
        root = hierarchy / node.name
        if not root.exists():
            continue
        for dirpath, _dirs, _files in sorted(os.walk(root), key=lambda w: -len(w[0])):
            try:
                os.rmdir(dirpath)
            except OSError:
                pass   # a process still inside: reported by the caller's checks
