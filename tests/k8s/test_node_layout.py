"""The local cluster's node layout and daemon configs (pure; no root): nodes side by
side never share a name, address, cgroup or socket, and sockets fit the kernel's limit."""

import tomllib
from pathlib import Path

from tailcut.k8s.node import configs
from tailcut.k8s.node.layout import Node


def test_two_nodes_share_no_name_address_cgroup_or_socket(tmp_path):
    a, b = Node(0, tmp_path / "a"), Node(1, tmp_path / "b")
    for attribute in ("name", "host_veth", "host_ip", "ip", "pod_cidr", "cgroup_root",
                      "containerd_socket", "dir"):
        assert getattr(a, attribute) != getattr(b, attribute), attribute
    assert len(a.host_veth) <= 15   # IFNAMSIZ


def test_sockets_stay_short_whatever_the_work_dir():
    deep = Node(3, Path("/tmp") / ("x" * 200))
    assert len(str(deep.containerd_socket) + ".ttrpc") < 108


def test_a_work_dir_too_long_for_the_kubelets_sockets_is_refused_before_anything_starts():
    """The kubelet's own sockets sit under its root dir, which is in the work dir: a
    work dir that would push one past the kernel's limit is named, with the excess."""
    assert Node(0, Path("/var/lib/tailcut/cluster")).path_problem() is None
    fits = Node(0, Path("/" + "x" * (107 - len("/node-0/kubelet/pod-resources/4294967295") - 1)))
    assert fits.path_problem() is None
    too_long = Node(0, Path(str(fits.workdir) + "y"))
    assert "too long by 1 bytes" in too_long.path_problem()
    assert str(too_long.workdir) in too_long.path_problem()


def test_containerd_restricts_oom_score_adj_keeps_images_in_the_store_and_state_in_the_node(tmp_path):
    node = Node(0, tmp_path)
    config = tomllib.loads(configs.containerd_toml(node, tmp_path / "store" / node.name))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["cni"]["bin_dir"] == "/usr/lib/cni"
    assert config["grpc"]["address"] == str(node.containerd_socket)
    # images outlive the cluster; what running containers mount goes with the node
    assert config["root"] == str(tmp_path / "store" / node.name)
    assert config["state"].startswith(str(node.dir))


def test_the_kubelet_runs_its_pods_under_the_nodes_own_cgroup(tmp_path):
    config = configs.kubelet_config(Node(2, tmp_path))
    assert config["cgroupRoot"] == "/tcnode-2"
    assert config["clusterDNS"] == ["10.240.2.2"]
    assert config["failSwapOn"] is False and config["cgroupDriver"] == "cgroupfs"


def test_a_kind_like_node_has_kinds_mtu_and_keeps_its_pods_namespaces_to_itself(tmp_path):
    """Its containerd runs in a mount namespace of its own (an empty /usr/src), so the
    pods' network namespaces are mounted under its state, not /var/run/netns."""
    plain, kind = Node(1, tmp_path), Node(2, tmp_path, kind_like=True)
    assert (plain.lan_mtu, kind.lan_mtu) == (1550, 1500)
    cri = [tomllib.loads(configs.containerd_toml(n, tmp_path / "store"))["plugins"][
        "io.containerd.grpc.v1.cri"] for n in (plain, kind)]
    assert "netns_mounts_under_state_dir" not in cri[0]
    assert cri[1]["netns_mounts_under_state_dir"] is True


def test_a_cluster_read_back_from_its_state_knows_its_kind_like_nodes(tmp_path):
    """`tailcut cluster down` (another process) builds the nodes from state.json."""
    from tailcut.k8s.node.cluster import Cluster
    up = Cluster(workdir=tmp_path, node=Node(0, tmp_path), token="t", pids={},
                 workers=[Node(1, tmp_path), Node(2, tmp_path, kind_like=True)])
    up._save()
    again = Cluster.load(tmp_path)
    assert again is not None and again.nodes == up.nodes
    assert [n.kind_like for n in again.nodes] == [False, False, True]
