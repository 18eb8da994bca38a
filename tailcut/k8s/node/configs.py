"""The configuration files of a node's daemons, as pure functions of its layout.

Each setting that is not the daemon's default is here for a measured reason on the
machines tailcut is developed on (../shared/PLATFORM.md), said next to it.
"""

import json
from pathlib import Path
from typing import Any

from tailcut.k8s.node.layout import CLUSTER_DOMAIN, POD_SUPERNET, Node

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


# A kind-like node's containerd runs in a mount namespace of its own (cluster.py): the
# pods' network namespaces, bind mounts, go under its state dir, not /var/run/netns,
# whose names would point at nothing outside it.
_KIND_LIKE_NETNS = "  netns_mounts_under_state_dir = true\n"


def containerd_toml(node: Node, root: Path) -> str:
    """`root`: containerd's images, content and snapshots, kept across clusters so a
    warm `up` imports nothing (tailcut.k8s.node.imagestore); its state (sockets,
    running tasks' mounts) stays under the node's directory and goes with it."""
    return f"""version = 2
root = "{root}"
state = "{node.dir / 'containerd' / 'state'}"
# Plugins that probe for storage this host lacks only fill the log with errors.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{node.containerd_socket}"

[plugins."io.containerd.grpc.v1.cri"]
  # Built here (no registry is reachable): tailcut/k8s/node/pause.c.
  sandbox_image = "{PAUSE_IMAGE}"
  # Root here lacks CAP_SYS_RESOURCE: the sandbox's oom_score_adj of -998 would be
  # refused ("can't get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true
{_KIND_LIKE_NETNS if node.kind_like else ""}  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{node.dir / 'cni' / 'net.d'}"
"""


def cni_conflist(node: Node) -> str:
    """A bridge (cni0) in the node's namespace, the gateway of the node's pods.
    host-local keeps its leases under the node's directory, not /var/lib/cni."""
    return json.dumps({
        "cniVersion": "1.0.0", "name": "tailcut",
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "hairpinMode": True,
             "ipam": {"type": "host-local", "dataDir": str(node.dir / "cni" / "ipam"),
                      "ranges": [[{"subnet": node.pod_cidr, "gateway": node.pod_gateway}]],
                      "routes": [{"dst": "0.0.0.0/0"}]}},
            {"type": "loopback"},
        ]}, indent=1)


def kubelet_config(node: Node, cluster_dns: str | None = None) -> dict[str, Any]:
    """`cluster_dns`: where CoreDNS answers (the first node's address), or this node's."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "containerRuntimeEndpoint": f"unix://{node.containerd_socket}",
        "cgroupDriver": "cgroupfs",          # no systemd on these machines
        "cgroupRoot": node.cgroup_root,      # one tree per node, so nodes can sit side by side
        "failSwapOn": False,
        "clusterDNS": [cluster_dns or node.ip], "clusterDomain": CLUSTER_DOMAIN,
        # No upstream DNS: pods resolve only the cluster's names.
        "resolvConf": str(node.dir / "resolv.conf"),
        # Not the shared /var/log/pods: a kubelet removes the log directories of pods it
        # does not know, so nodes on one host would delete each other's pods' logs.
        "podLogsDir": str(node.dir / "pod-logs"),
        # A development node: the API server reaches the kubelet across the node's own
        # veth only; logs and exec need no client certificates.
        "authentication": {"anonymous": {"enabled": True},
                           "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "address": node.ip, "healthzBindAddress": node.ip,
        # The shared machine's disk fills with other work's caches: evict only near full.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2%",
                         "imagefs.available": "2%"},
        "imageGCHighThresholdPercent": 99, "imageGCLowThresholdPercent": 98,
        "serializeImagePulls": False,
        "staticPodPath": "",
    }


def kube_proxy_config(node: Node, kubeconfig: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig},
        "hostnameOverride": node.name,
        # nftables, not iptables: with Debian's iptables-nft, iptables mode left chains
        # that `iptables -t nat -L` called incompatible (PLATFORM.md).
        "mode": "nftables",
        "clusterCIDR": POD_SUPERNET,
        # Pod -> Service -> pod on the same bridge: masquerading makes the reply come
        # back through the node, where the translation is undone.
        "nftables": {"masqueradeAll": True},
        "bindAddress": node.ip,
        "healthzBindAddress": f"{node.ip}:10256",
        "metricsBindAddress": f"{node.ip}:10249",
        # nf_conntrack_max is read-only outside the initial namespace: leave it.
        "conntrack": {"maxPerCore": 0, "min": 0,
                      "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def corefile(node: Node, kubeconfig: str) -> str:
    """CoreDNS as a process of the node answering on its address: the cluster's names
    (headless services give ps-0.<job>), and NXDOMAIN for everything else (there is no
    upstream to forward to)."""
    return f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 {{
    bind {node.ip}
    errors
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{
        kubeconfig {kubeconfig} tailcut-dev
        pods insecure
    }}
    cache 5
}}
.:53 {{
    bind {node.ip}
    health {node.ip}:8080
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""
