"""A node's image store, kept across clusters, and image loading that skips what it holds.

containerd's root (its content store, unpacked snapshots and image records) lives at
~/.cache/tailcut/k8s-tools/containerd/tcnode-<i>, not under the cluster's work dir:
importing tailcut's three images into an empty containerd took 48 s of a 64 s `tailcut
cluster up` (worker 18 s, operator 14 s, agent 16 s, 1 node, load 5), while the
cluster itself was Ready in 13 s. Each imported image is labelled with the identity
of the archive it came from (its file name, which carries its build inputs' hash, its
size and its mtime), so loading the same archive again is one `ctr images ls`.

What a cluster leaves in the store besides images (the containers and sandboxes of
its pods, known only to containerd's database) is removed when the next cluster's
containerd starts, before its kubelet can see them (`clear_containers`), and when the
cluster goes down while containerd still runs. `tailcut cluster down --purge-images`
removes the store.
"""

import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

from tailcut.k8s import tools
from tailcut.k8s.node.layout import Node
from tailcut.k8s.node.procs import ClusterError

LABEL = "tailcut.dev/archive"
NAMESPACE = "k8s.io"   # the CRI plugin's containerd namespace
Progress = Callable[[str], None]


def root(node: Node) -> Path:
    """containerd's root for `node`: one per node name, as two nodes (or clusters) must
    not share a containerd database."""
    return tools.tools_dir().parent / "containerd" / node.name


def archive_id(archive: Path) -> str:
    stat = archive.stat()
    return f"{archive.name}:{stat.st_size}:{stat.st_mtime_ns}"


def ctr(node: Node, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ctr", "--address", str(node.containerd_socket),
                           "--namespace", NAMESPACE, *args],
                          capture_output=True, text=True, timeout=timeout_s)


def loaded_archives(node: Node) -> set[str]:
    """The archive identities the node's images carry (`ctr images ls`: the labels are
    the last column, `k=v,k=v`)."""
    out = ctr(node, "images", "ls")
    if out.returncode != 0:
        raise ClusterError(f"containerd of {node.name}: listing images: {out.stderr.strip()}")
    found = set()
    for line in out.stdout.splitlines()[1:]:
        for label in line.split()[-1].split(","):
            key, _, value = label.partition("=")
            if key == LABEL:
                found.add(value)
    return found


def load(node: Node, archives: list[Path], progress: Progress) -> None:
    """Import each archive the node does not already hold, then label its image."""
    have = loaded_archives(node)
    for archive in archives:
        ident = archive_id(archive)
        if ident in have:
            progress(f"{node.name}: {archive.name} already loaded (same archive)")
            continue
        started = time.monotonic()
        out = ctr(node, "images", "import", "--no-unpack=false", str(archive))
        if out.returncode != 0:
            raise ClusterError(f"containerd of {node.name}: importing {archive}: "
                               f"{out.stderr.strip()}")
        # "unpacking <ref> (sha256:...)...done", one line per image in the archive
        refs = [line.split()[1] for line in out.stdout.splitlines()
                if line.startswith("unpacking ")]
        for ref in refs:
            ctr(node, "images", "label", ref, f"{LABEL}={ident}")
        progress(f"{node.name}: imported {archive.name} in "
                 f"{time.monotonic() - started:.1f} s")


def clear_containers(node: Node) -> int:
    """Remove every container (and with it its sandbox record and snapshot) from the
    node's containerd: a store kept from an earlier cluster holds its pods'. Their
    tasks are gone with the earlier containerd's state; a live one is killed first.
    Returns how many there were."""
    out = ctr(node, "containers", "ls", "--quiet")
    ids = out.stdout.split() if out.returncode == 0 else []
    for ident in ids:
        ctr(node, "tasks", "rm", "--force", ident)
    if ids:
        done = ctr(node, "containers", "rm", *ids)
        if done.returncode != 0:
            raise ClusterError(f"containerd of {node.name}: removing an earlier cluster's "
                               f"containers: {done.stderr.strip()}")
    return len(ids)


def purge(node: Node) -> None:
    """Remove the node's store (its containerd must not run)."""
    shutil.rmtree(root(node), ignore_errors=True)
