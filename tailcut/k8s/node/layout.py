"""Names, addresses and paths of one node of the local cluster, in one place.

A node is a network namespace joined to the host by a veth pair, as kind's node
containers are: the control plane and every node daemon run on the host with only
their network namespace switched, so every packet-filter rule and bridge the kubelet,
kube-proxy and the CNI add lives in that namespace and goes with it. For node i:

    netns       tcnode-i                (also the Kubernetes node name; not tailcut-*,
                                         which `tailcut clean` removes as a job's)
    host veth   tcnode-i-h 10.240.i.1/24 (the host's end; kubectl reaches the API here)
    node veth   eth0      10.240.i.2/24 (the node's InternalIP; API server :6443, DNS :53)
    pods        cni0      10.244.i.1/24 (the CNI bridge; pods get 10.244.i.2-254)
    services    10.96.0.0/16            (10.96.0.1 is the `kubernetes` Service)
    LAN         lan0      10.241.0.(i+2)/24 (a cluster of several nodes: each node's
                                         second veth, into the bridge of the cluster's
                                         own namespace tcnode-lan-<first node>; routes
                                         through it reach the other nodes' addresses
                                         and pod ranges, as a real LAN would)
                                        MTU 1550: room for VXLAN around 1500 bytes
    cgroups     /sys/fs/cgroup/<controller>/tcnode-i  (the kubelet's cgroupRoot)
    files       <workdir>/node-i/       (containerd's root and state, kubelet, CNI, logs)
    sockets     /run/tailcut/tcnode-i/  (containerd's)

A node may look like one of kind's as its defaults make it (`kind_like`): a LAN MTU
of 1500 (kind's Docker network) and an empty /usr/src (kind's node image, without
the host's mounted: /lib/modules/<release>/build then points nowhere). What tailcut
does there is docs/kubernetes.md's "Installing on kind" and tests/cluster/test_kind_node.py.
"""

from dataclasses import dataclass
from pathlib import Path

SERVICE_CIDR = "10.96.0.0/16"
API_SERVICE_IP = "10.96.0.1"
POD_SUPERNET = "10.244.0.0/16"
API_PORT = 6443
CLUSTER_DOMAIN = "cluster.local"
UNIX_PATH_MAX = 107                                  # bytes, without the final NUL
KUBELET_LONGEST_SOCKET = "/pod-resources/4294967295"  # under the kubelet's root dir


LAN_IF = "lan0"
LAN_BRIDGE = "lan"
# Room for a VXLAN header (50 bytes) around a 1500-byte packet: a job's spines on
# different nodes talk VXLAN over this LAN without fragmenting (tailcut.net.overlay).
LAN_MTU = 1550
KIND_LAN_MTU = 1500   # kind's Docker network, unless made otherwise


def lan_netns(first_index: int) -> str:
    """The namespace holding the LAN bridge of the cluster whose first node is this."""
    return f"tcnode-lan-{first_index}"


@dataclass(frozen=True)
class Node:
    index: int
    workdir: Path   # the cluster's work dir; this node's files are in workdir/node-<i>
    kind_like: bool = False   # LAN MTU 1500 and an empty /usr/src, as kind's defaults

    @property
    def lan_mtu(self) -> int:
        return KIND_LAN_MTU if self.kind_like else LAN_MTU

    @property
    def name(self) -> str:
        return f"tcnode-{self.index}"

    @property
    def host_veth(self) -> str:
        return f"tcnode-{self.index}-h"

    @property
    def host_ip(self) -> str:
        return f"10.240.{self.index}.1"

    @property
    def ip(self) -> str:
        return f"10.240.{self.index}.2"

    @property
    def lan_ip(self) -> str:
        return f"10.241.0.{self.index + 2}"

    @property
    def lan_port(self) -> str:
        """The LAN namespace's end of this node's LAN veth."""
        return f"n{self.index}"

    @property
    def pod_cidr(self) -> str:
        return f"10.244.{self.index}.0/24"

    @property
    def pod_gateway(self) -> str:
        return f"10.244.{self.index}.1"

    @property
    def dir(self) -> Path:
        return self.workdir / f"node-{self.index}"

    @property
    def run_dir(self) -> Path:
        """Sockets: a unix socket path must stay under 108 bytes, work dirs need not."""
        return Path("/run/tailcut") / self.name

    @property
    def kubelet_dir(self) -> Path:
        return self.dir / "kubelet"

    def path_problem(self) -> str | None:
        """Why this node's files cannot live under its work dir, if they cannot: the
        kubelet makes unix sockets under its root dir (pod-resources/<10 digits>), and
        a socket path longer than 107 bytes is refused with a bare EINVAL."""
        longest = len(str(self.kubelet_dir)) + len(KUBELET_LONGEST_SOCKET)
        if longest > UNIX_PATH_MAX:
            return (f"work dir {self.workdir} is too long by {longest - UNIX_PATH_MAX} "
                    f"bytes: the kubelet's sockets under {self.kubelet_dir} must stay "
                    f"within {UNIX_PATH_MAX} bytes; choose a shorter work dir")
        return None

    @property
    def containerd_socket(self) -> Path:
        return self.run_dir / "containerd.sock"

    @property
    def cgroup_root(self) -> str:
        return f"/{self.name}"

    @property
    def netns_path(self) -> Path:
        return Path("/var/run/netns") / self.name

    @property
    def api_server(self) -> str:
        return f"https://{self.ip}:{API_PORT}"
