"""A complete Kubernetes cluster on this host, from real components, of one node or more.

    cluster = Cluster.up()                 # or: tailcut cluster up [--nodes 2]
    cluster.kubectl("get", "nodes")
    cluster.load_image(Path("worker.oci.tar"))
    Cluster.down()                          # or: tailcut cluster down

etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd + runc, the
kubelet, kube-proxy and CoreDNS run as processes on the host inside the first node's
network namespace (tailcut.k8s.node.layout); every further node runs its own
containerd, kubelet and kube-proxy in its own namespace, as kind's worker node
containers do, and the nodes reach each other over a LAN of their own (host.create_lan).
Pods get a CNI bridge address of their node's range. Every binary comes
from Debian's packages, PyPI (etcd) or is built by scripts/k8s-tools.sh (the first
`up` builds what is missing). The state file
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
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import yaml

from tailcut.k8s.node import configs, devcluster, host, imagestore, ociimage, tools
from tailcut.k8s.node.layout import API_PORT, SERVICE_CIDR, Node
from tailcut.k8s.node.procs import ClusterError, alive, spawn, stop, tail
from tailcut.net import netns

DEFAULT_WORKDIR = Path("/var/lib/tailcut/cluster")
READY_TIMEOUT_S = 120.0
POLL_S = 0.2   # how often a start-up wait asks: most answers are a local HTTP request
ADMIN_USER = devcluster.ADMIN_USER
Progress = Callable[[str], None]


def k8s_binary(name: str, progress: Progress = print) -> Path:
    """A Kubernetes binary, built with the others the first time (tailcut.k8s.node.tools)."""
    return tools.binary(name, progress)


def system_binary(name: str, package: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise ClusterError(f"{name} is missing: apt-get install {package} "
                           "(scripts/setup.sh --cluster installs it)")
    return found


@dataclass
class Cluster:
    workdir: Path
    node: Node          # the first node: the control plane, CoreDNS and a kubelet
    token: str
    pids: dict[str, int]   # "<daemon>" on the first node, "<daemon>@<index>" on others
    workers: list[Node] = field(default_factory=list)   # the further nodes
    # where the steps of `up` and `down` are told, with the seconds since the start
    say: Progress = field(default=print, repr=False, compare=False)

    @property
    def nodes(self) -> list[Node]:
        return [self.node, *self.workers]

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

    def ctr(self, *args: str, node: Optional[Node] = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ctr", "--address", str((node or self.node).containerd_socket),
                               "--namespace", "k8s.io", *args],
                              capture_output=True, text=True, timeout=600)

    def load_image(self, archive: Path, nodes: Optional[list[Node]] = None) -> None:
        """Import an OCI or docker image archive into every node's containerd, as
        `kind load docker-image` does for a kind cluster."""
        self.load_images([archive], nodes)

    def load_images(self, archives: list[Path], nodes: Optional[list[Node]] = None) -> None:
        """Import the archives into each node's containerd, the nodes at once: their
        containerds are independent, and an import mostly waits on the disk. An
        archive a node already holds (its image store outlives clusters) is skipped."""
        targets = nodes or self.nodes
        with ThreadPoolExecutor(max_workers=len(targets)) as pool:
            for _ in pool.map(lambda node: imagestore.load(node, archives, self.say),
                              targets):
                pass

    # --- bring-up -------------------------------------------------------------------

    @classmethod
    def up(cls, workdir: Path = DEFAULT_WORKDIR, progress: Progress = print,
           index: int = 0, nodes: int = 1, images: Sequence[Path] = (),
           kind_like: int = 0) -> "Cluster":
        """Start a cluster of `nodes` nodes numbered from `index` (their names and
        addresses, tailcut.k8s.node.layout): clusters whose node numbers differ can
        run side by side. The last `kind_like` of them look like kind's nodes as its
        defaults make them (Node.kind_like: LAN MTU 1500, no kernel headers).
        `images` (archives) are imported into each node as soon as its containerd
        runs, while the rest of the cluster comes up. Every step is told to
        `progress` with the seconds since the start, and each wait with how long it
        took."""
        if nodes < 1:
            raise ClusterError(f"nodes={nodes}: a cluster has at least one node")
        if not 0 <= kind_like < nodes:
            raise ClusterError(f"kind_like={kind_like}: from 0 to nodes - 1 ({nodes - 1}); "
                               "the first node, the control plane's, is never kind-like")
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
        started = time.monotonic()
        cluster = cls(workdir=workdir, node=node, token=secrets.token_hex(16), pids={},
                      workers=[Node(index + k, workdir, kind_like=k >= nodes - kind_like)
                               for k in range(1, nodes)],
                      say=_timed(progress, started))
        taken = [n.name for n in cluster.nodes if netns.exists(n.name)]
        if taken:   # another cluster's (its work dir elsewhere): never touch it
            raise ClusterError(
                f"node name {', '.join(taken)} is taken: another cluster on this host "
                f"uses node numbers {index}..{index + nodes - 1}; take it down, or choose "
                "other numbers (Cluster.up(index=...))")
        loader = ThreadPoolExecutor(max_workers=nodes)
        try:
            cluster._start(list(images), loader)
        except BaseException:
            loader.shutdown(wait=True, cancel_futures=True)   # no import outlives its node
            progress("bring-up failed: removing what was started")
            cluster._remove(lambda line: None)
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        finally:
            loader.shutdown(wait=True)
        cluster.say("cluster up")
        progress(f"cluster up in {time.monotonic() - started:.1f} s")
        return cluster

    @classmethod
    def load(cls, workdir: Path = DEFAULT_WORKDIR) -> Optional["Cluster"]:
        try:
            state = json.loads((workdir / "state.json").read_text())
        except (OSError, ValueError):
            return None
        first, count = int(state["node"]), int(state.get("nodes", 1))
        kind_like = int(state.get("kindLike", 0))
        return cls(workdir=workdir, node=Node(first, workdir), token=state["token"],
                   pids={k: int(v) for k, v in state["pids"].items()},
                   workers=[Node(first + k, workdir, kind_like=k >= count - kind_like)
                            for k in range(1, count)])

    def _save(self) -> None:
        (self.workdir / "state.json").write_text(json.dumps(
            {"node": self.node.index, "nodes": len(self.nodes), "token": self.token,
             "kindLike": sum(n.kind_like for n in self.nodes), "pids": self.pids},
            indent=1))

    def _start(self, images: list[Path], loader: ThreadPoolExecutor) -> None:
        """The order follows what waits on what: etcd, the API server and every node's
        containerd start at once; the image imports need only containerd, so they run
        while the API server warms up (3-8 s); the kubelets, kube-proxy and CoreDNS
        need the API server."""
        node, say = self.node, self.say
        # Debian's packages first: a missing one is a quick fix, unlike the Go build.
        for name, package in (("containerd", "containerd"), ("runc", "runc"),
                              ("nsenter", "util-linux"), ("ctr", "containerd"),
                              ("nft", "nftables"), ("iptables", "iptables"), ("gcc", "gcc")):
            system_binary(name, package)
        if not Path("/usr/lib/cni/bridge").exists():
            raise ClusterError("CNI plugins are missing: apt-get install "
                               "containernetworking-plugins (scripts/setup.sh --cluster "
                               "installs them)")
        binaries = {
            "etcd": str(devcluster.etcd_binary()),
            **{name: str(k8s_binary(name, say)) for name in (
                "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet",
                "kube-proxy", "coredns")},
            "containerd": system_binary("containerd", "containerd"),
        }
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._save()
        for each in self.nodes:
            each.dir.mkdir(parents=True, exist_ok=True)
            each.run_dir.mkdir(parents=True, exist_ok=True)
            imagestore.root(each).mkdir(parents=True, exist_ok=True)
            say(f"node {each.name}: network namespace, {each.host_veth} "
                f"{each.host_ip} <-> {each.ip}, cgroups {each.cgroup_root}")
            host.create_node_network(each)
            host.create_cgroups(each)
            self._write_files(each)
        if self.workers:
            say(f"LAN {', '.join(f'{n.name} {n.lan_ip}' for n in self.nodes)}")
            host.create_lan(self.nodes)

        def start(name: str, argv: list[str], on: Node = node,
                  mount_ns: Optional[Path] = None) -> None:
            key = name if on == node else f"{name}@{on.index}"
            say(f"starting {name}" + ("" if on == node else f" on {on.name}"))
            self.pids[key] = spawn(on.netns_path, argv, on.dir / "logs" / f"{name}.log",
                                   mount_ns)
            self._save()

        def start_containerd(on: Node) -> None:
            argv = [binaries["containerd"], "--config", str(on.dir / "containerd.toml")]
            start("containerd", _kind_like_mounts(argv) if on.kind_like else argv, on)

        start("etcd", [
            binaries["etcd"], "--data-dir", str(node.dir / "etcd"),
            "--listen-client-urls", f"http://{node.ip}:2379",
            "--advertise-client-urls", f"http://{node.ip}:2379",
            "--listen-peer-urls", "http://127.0.0.1:2380",
            "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
            "--initial-cluster", "default=http://127.0.0.1:2380",
            "--unsafe-no-fsync"])   # a throw-away store: durability buys nothing
        for each in self.nodes:
            start_containerd(each)
        # Not waiting for etcd: the API server spends its first second or more on its
        # own set-up and retries etcd until it answers.
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
        self._wait("etcd", lambda: _http_ok(f"http://{node.ip}:2379/health"))
        loading: list[Future[None]] = []
        pause = self._pause_image()
        for each in self.nodes:
            self._wait("containerd", lambda: self.ctr("version", node=each).returncode == 0,
                       node=each)
            stale = imagestore.clear_containers(each)
            if stale:   # its CRI plugin read them at start: start it afresh
                say(f"{each.name}: removed {stale} containers an earlier cluster left in "
                    "the image store; restarting containerd")
                stop(self.pids[_key("containerd", each, node)])
                start_containerd(each)
                self._wait("containerd",
                           lambda: self.ctr("version", node=each).returncode == 0, node=each)
            say(f"{each.name}: loading the pause image {configs.PAUSE_IMAGE}"
                + (f" and {len(images)} images, meanwhile" if images else ""))
            loading.append(loader.submit(imagestore.load, each, [pause, *images], say))
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
        for each in self.nodes:
            # A kind-like node's kubelet sees the files its containerd sees (hostPath
            # volumes, the volumes it mounts for runc to bind), as in a kind node.
            containerd_mounts = (Path(f"/proc/{self.pids[_key('containerd', each, node)]}"
                                      "/ns/mnt") if each.kind_like else None)
            start("kubelet", [
                binaries["kubelet"], "--config", str(each.dir / "kubelet.yaml"),
                "--kubeconfig", str(self.kubeconfig), "--node-ip", each.ip,
                "--hostname-override", each.name, "--root-dir", str(each.kubelet_dir),
                "--cert-dir", str(each.kubelet_dir / "pki"), "--v", "1"], each,
                containerd_mounts)
            start("kube-proxy", [binaries["kube-proxy"], "--config",
                                 str(each.dir / "kube-proxy.yaml")], each)
        start("coredns", [binaries["coredns"], "-conf", str(node.dir / "Corefile")])
        self._wait("coredns", lambda: _http_ok(f"http://{node.ip}:8080/health"))
        self._wait("kube-proxy", lambda: _http_ok(f"http://{node.ip}:10256/healthz"))
        self._wait("kube-controller-manager",
                   lambda: _http_ok(f"https://{node.ip}:10257/healthz"))
        self._wait("kube-scheduler", lambda: _http_ok(f"https://{node.ip}:10259/healthz"))
        for each in self.nodes:
            self._wait("kubelet", lambda: self._node_ready(each), node=each,
                       detail=f"node {each.name} never became Ready", step="node Ready")
        self._wait("kube-controller-manager", self._default_service_account,
                   detail="no `default` service account in namespace default",
                   step="service account default")
        for each_load in loading:
            each_load.result()
        if loading:
            say("images loaded")

    def _write_files(self, node: Node) -> None:
        """`node`'s configuration files; the control plane's too on the first node."""
        (node.dir / "containerd.toml").write_text(
            configs.containerd_toml(node, imagestore.root(node)))
        (node.dir / "cni" / "net.d").mkdir(parents=True, exist_ok=True)
        (node.dir / "cni" / "net.d" / "10-tailcut.conflist").write_text(
            configs.cni_conflist(node))
        (node.dir / "resolv.conf").write_text("# tailcut node: no upstream DNS\n")
        (node.dir / "kubelet.yaml").write_text(yaml.safe_dump(
            configs.kubelet_config(node, cluster_dns=self.node.ip)))
        (node.dir / "kube-proxy.yaml").write_text(yaml.safe_dump(
            configs.kube_proxy_config(node, str(self.kubeconfig))))
        if node != self.node:
            return
        subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt",
                        "rsa_keygen_bits:2048", "-out", str(node.dir / "sa.key")],
                       check=True, capture_output=True)
        (node.dir / "tokens.csv").write_text(f'{self.token},{ADMIN_USER},1,"system:masters"\n')
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

    def _node_ready(self, node: Node) -> bool:
        out = self.kubectl("get", "node", node.name, "-o", "json", check=False)
        if out.returncode != 0:
            return False
        conditions = json.loads(out.stdout)["status"].get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _default_service_account(self) -> bool:
        return self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0

    def _wait(self, name: str, ready: Callable[[], bool], detail: str = "",
              node: Optional[Node] = None, step: str = "ready") -> None:
        node = node or self.node
        began = time.monotonic()
        deadline = began + READY_TIMEOUT_S
        log = node.dir / "logs" / f"{name}.log"
        key = _key(name, node, self.node)
        while time.monotonic() < deadline:
            pid = self.pids.get(key)
            if pid is not None and not alive(pid):
                raise ClusterError(f"{key} exited during start-up; the end of {log}:\n"
                                   + tail(log))
            try:
                if ready():
                    self.say(f"{key}: {step} (waited {time.monotonic() - began:.1f} s)")
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            time.sleep(POLL_S)
        raise ClusterError(f"{name} not ready after {READY_TIMEOUT_S:.0f} s"
                           f"{': ' + detail if detail else ''}; the end of {log}:\n"
                           + tail(log))

    # --- take-down ------------------------------------------------------------------

    @classmethod
    def down(cls, workdir: Path = DEFAULT_WORKDIR, progress: Progress = print,
             purge_images: bool = False) -> None:
        """Remove the cluster in `workdir`: pods, daemons, shims, mounts, namespaces,
        links, cgroups and files. Safe to run twice and after a crash. Without a state
        file nothing of a cluster was made there (it is written first), and the
        nodes' names (tcnode-<i>) may belong to another cluster: only files go. The
        nodes' image stores stay for the next cluster (tailcut.k8s.node.imagestore)
        unless `purge_images`."""
        say = _timed(progress, time.monotonic())
        cluster = cls.load(workdir)
        if cluster is not None:
            cluster._remove(say)
            if purge_images:
                for node in cluster.nodes:
                    say(f"removing the image store {imagestore.root(node)}")
                    imagestore.purge(node)
        if workdir.exists():
            shutil.rmtree(workdir, ignore_errors=True)
        say("cluster down")

    def _remove(self, progress: Progress) -> None:
        nodes = self.nodes
        if alive(self.pids.get("kube-apiserver", -1)) and alive(self.pids.get("kubelet", -1)):
            self._drain(progress)
        for name in ("kube-controller-manager", "kube-scheduler", "coredns",
                     "kube-proxy", "kubelet", "containerd", "kube-apiserver", "etcd"):
            for each in nodes:
                key = _key(name, each, self.node)
                pid = self.pids.get(key)
                if pid is None or not alive(pid):
                    continue
                if name == "containerd":   # its image store outlives it; its pods not
                    try:
                        imagestore.clear_containers(each)
                    except (ClusterError, subprocess.SubprocessError) as err:
                        progress(f"{each.name}: {err} (the next `up` removes them)")
                progress(f"stopping {key} (pid {pid})")
                stop(pid)
        for node in nodes:
            host.remove_node(node, progress)
        host.remove_lan(nodes[0].index)

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
            outs = [self.ctr("tasks", "list", "--quiet", node=n) for n in self.nodes]
            if all(out.returncode != 0 or not out.stdout.strip() for out in outs):
                return   # no container runs; the sandboxes' leftovers go with the node
            time.sleep(1)
        progress("some containers outlived the pods' deletion; they are stopped by force")


def _kind_like_mounts(argv: list[str]) -> list[str]:
    """`argv` in a mount namespace of its own whose /usr/src is empty, as in a kind
    node that does not mount the host's: /lib/modules/<release>/build (the host's,
    which kind mounts) then points nowhere, and BCC finds no kernel headers. The
    mounts of the node's pods stay in it and go with it."""
    return ["unshare", "--mount", "--propagation", "slave", "--", "sh", "-c",
            'mount -t tmpfs -o ro,mode=0755 tailcut-kind-like /usr/src && exec "$@"',
            "sh", *argv]


def _key(name: str, node: Node, first: Node) -> str:
    """A daemon's key in the state file: "<daemon>" on the first node, else "<daemon>@<i>"."""
    return name if node == first else f"{name}@{node.index}"


def _timed(progress: Progress, started: float) -> Progress:
    """`progress` with each line prefixed by the seconds since `started`."""
    return lambda line: progress(f"{time.monotonic() - started:6.1f} s  {line}")


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
