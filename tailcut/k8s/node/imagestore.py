"""A node's image store, kept across clusters, and image loading that skips what it holds.

containerd's root (its content store, unpacked snapshots and image records) lives at
~/.cache/tailcut/k8s-tools/containerd/tcnode-<i>, not under the cluster's work dir:
importing tailcut's three images into an empty containerd took 48 s of a 64 s `tailcut
cluster up` (worker 18 s, operator 14 s, agent 16 s, 1 node, load 5), while the
cluster itself was Ready in 13 s. Each imported image is labelled with the identity
of the archive it came from (its file name, which carries its build inputs' hash, its
size and its mtime), so loading the same archive again is one `ctr images ls`; a new
archive sends containerd only the layers it lacks (ociimage.stream_without), so a
change to tailcut's code imports the code's few MiB, not the image.

What a cluster leaves in the store besides images (the containers and sandboxes of
its pods, known only to containerd's database) is removed when the next cluster's
containerd starts, before its kubelet can see them (`clear_containers`), and when the
cluster goes down while containerd still runs. `tailcut cluster down --purge-images`
removes the store.
"""

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from tailcut.k8s.node import ociimage, tools
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
        image = ociimage.read_docker_archive(archive)
        if image is None:
            out = ctr(node, "images", "import", str(archive))
            sent = "whole"
        else:
            have = content(node)
            out = _import_without(node, archive, image, have)
            missing = [size for _, digest, size in image.layers if digest not in have]
            sent = (f"{len(missing)} of {len(image.layers)} layers, "
                    f"{sum(missing) / 2**20:.0f} MiB")
            if out.returncode != 0:
                # A layer's blob can outlive its unpacked snapshot (an earlier build,
                # pruned, whose snapshots the collector took first): "parent snapshot
                # ... does not exist". The whole archive unpacks every layer again.
                progress(f"{node.name}: importing {archive.name} without the layers it "
                         f"holds failed ({out.stderr.strip()[-200:]}); importing it whole")
                out = ctr(node, "images", "import", str(archive))
                sent = "whole, after a partial import failed"
        if out.returncode != 0:
            raise ClusterError(f"containerd of {node.name}: importing {archive}: "
                               f"{out.stderr.strip()}")
        # "unpacking <ref> (sha256:...)...done", one line per image in the archive
        refs = [line.split()[1] for line in out.stdout.splitlines()
                if line.startswith("unpacking ")]
        for ref in refs:
            ctr(node, "images", "label", ref, f"{LABEL}={ident}")
        progress(f"{node.name}: imported {archive.name} ({sent}) in "
                 f"{time.monotonic() - started:.1f} s")
        prune(node)


def prune(node: Node) -> None:
    """Remove the records of images no name points to any more: the CRI plugin names
    each image also by its config's digest (sha256:...), and keeps that name when a
    new build takes the image's name, so without this a store kept across clusters
    would keep every earlier build's layers."""
    out = ctr(node, "images", "ls")
    rows = [line.split() for line in out.stdout.splitlines()[1:] if line.strip()]
    named = {row[2] for row in rows if not row[0].startswith("sha256:")}
    stale = [row[0] for row in rows if row[0].startswith("sha256:") and row[2] not in named]
    if stale:
        ctr(node, "images", "rm", *stale)


def content(node: Node) -> set[str]:
    """The digests of the blobs the node's containerd holds."""
    out = ctr(node, "content", "ls", "--quiet")
    return set(out.stdout.split()) if out.returncode == 0 else set()


def _import_without(node: Node, archive: Path, image: ociimage.DockerImage,
                    have: set[str]) -> subprocess.CompletedProcess[str]:
    """Import `image` sending only the layers the node lacks (ociimage.stream_without)."""
    # ctr's output to files: it may write while the archive is still being sent
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(["ctr", "--address", str(node.containerd_socket),
                                 "--namespace", NAMESPACE, "images", "import", "-"],
                                stdin=subprocess.PIPE, stdout=out, stderr=err)
        assert proc.stdin is not None
        try:
            ociimage.stream_without(archive, image, have, proc.stdin)
        except BrokenPipeError:
            pass   # ctr gave up: its exit status and stderr say why
        finally:
            proc.stdin.close()
        code = proc.wait(timeout=600)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(proc.args, code, out.read().decode(errors="replace"),
                                           err.read().decode(errors="replace"))


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
