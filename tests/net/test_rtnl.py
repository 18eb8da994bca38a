"""Batched rtnetlink: the messages are what the kernel expects, failures are named."""

import errno
import os
import socket
import struct
import subprocess

import pytest

from tailcut.errors import NetError
from tailcut.net import naming, netns, rtnl


def _messages(batch: rtnl.Batch) -> list[tuple[int, int, bytes]]:
    """(type, flags, body) of each message, as send() would frame them."""
    return [(struct.unpack_from("=HH", body)[0], struct.unpack_from("=HH", body)[1], body[4:])
            for body, _ in batch._messages]


def test_a_neighbour_entry_is_a_permanent_ipv4_entry_with_address_and_mac():
    batch = rtnl.Batch()
    batch.neigh_replace(7, "10.1.0.3", "02:74:0a:01:00:03")
    [(kind, flags, body)] = _messages(batch)
    assert kind == rtnl.RTM_NEWNEIGH
    assert flags & rtnl.NLM_F_REPLACE and flags & rtnl.NLM_F_CREATE
    assert not flags & rtnl.NLM_F_ACK   # only failures are answered
    family, ifindex, state = struct.unpack_from("=BxxxiH", body)
    assert (family, ifindex, state) == (socket.AF_INET, 7, rtnl.NUD_PERMANENT)
    assert socket.inet_aton("10.1.0.3") in body and bytes.fromhex("02740a010003") in body


def test_a_pods_mac_is_its_address_locally_administered():
    assert naming.mac_of("10.2.0.7") == "02:74:0a:02:00:07"
    assert int(naming.mac_of("10.1.0.2").split(":")[0], 16) & 0b11 == 0b10  # local, unicast


@pytest.fixture
def scratch():
    name = f"tailcut-rtnltest-{os.getpid()}.a"
    netns.create(name)
    try:
        yield name
    finally:
        netns.remove(name)


def _links(ns: str) -> list[str]:
    with rtnl.socket_in(ns) as sock:
        return [name for name, _, _ in rtnl.link_states(sock)]


@pytest.mark.netns
def test_a_failed_request_raises_naming_it_and_its_errno_unless_tolerated(scratch):
    batch = rtnl.Batch()
    batch.delete_link(4242)
    with pytest.raises(NetError, match=r"delete ifindex 4242: No such device \(ENODEV\)"):
        rtnl.send_in(scratch, batch)
    batch.delete_link(4242)
    rtnl.send_in(scratch, batch, tolerate=[errno.ENODEV])


@pytest.mark.netns
def test_one_request_deletes_every_link_of_the_group_and_leaves_the_others(scratch):
    ip = ["ip", "-n", scratch, "link"]
    for name, kind, group in (("d1", ["veth", "peer", "d1p"], naming.GROUP),
                              ("d2", ["bridge"], naming.GROUP),
                              ("k1", ["veth", "peer", "k1p"], 0)):
        subprocess.run(ip + ["add", name, "type", *kind], check=True)
        subprocess.run(ip + ["set", name, "group", str(group)], check=True)
    batch = rtnl.Batch()
    batch.delete_group(naming.GROUP)
    rtnl.send_in(scratch, batch)
    assert sorted(_links(scratch)) == ["k1", "k1p", "lo"]   # d1's peer went with it


@pytest.mark.netns
def test_a_veth_batch_builds_what_ip_shows(scratch):
    peer_ns = scratch[:-1] + "b"
    netns.create(peer_ns)
    try:
        with rtnl.socket_in(scratch) as sock:
            batch = rtnl.Batch()
            batch.raw(rtnl.RTM_NEWLINK, rtnl.NLM_F_CREATE | rtnl.NLM_F_EXCL,
                      struct.pack("=BxHiII", 0, 0, 0, 0, 0)
                      + rtnl._attr(rtnl.IFLA_IFNAME, b"br\0")
                      + rtnl._attr(rtnl.IFLA_LINKINFO, rtnl._attr(1, b"bridge\0")), "bridge")
            batch.send(sock)
            bridge = rtnl.ifindex(sock, "br")
            fd = netns.enter_fd(peer_ns)
            try:
                batch.veth_add("p0", "eth0", fd, mtu=1400, group=naming.GROUP, master=bridge,
                               peer_mac="02:74:0a:01:00:02")
                batch.send(sock)
            finally:
                os.close(fd)
            port = rtnl.ifindex(sock, "p0")
            batch.set_link(port, alias="tailcut:x", up=True)
            batch.send(sock)
        with rtnl.socket_in(peer_ns) as sock:
            eth0 = rtnl.ifindex(sock, "eth0")
            batch.addr_add(eth0, "10.1.0.2", 24)
            batch.set_link(eth0, up=True, gso_max_segs=1)
            batch.route_add("0.0.0.0/0", "10.1.0.1")
            batch.route_add("10.9.0.0/24", "10.1.0.1")
            batch.send(sock)
        port_shown = subprocess.run(["ip", "-d", "-n", scratch, "link", "show", "p0"],
                                    capture_output=True, text=True, check=True).stdout
        assert "master br" in port_shown and "group 29795" in port_shown
        assert "mtu 1400" in port_shown and "alias tailcut:x" in port_shown
        peer = subprocess.run(["ip", "-d", "-n", peer_ns, "link", "show", "eth0"],
                              capture_output=True, text=True, check=True).stdout
        assert "02:74:0a:01:00:02" in peer and "gso_max_segs 1 " in peer
        addrs = subprocess.run(["ip", "-n", peer_ns, "addr", "show", "eth0"],
                               capture_output=True, text=True, check=True).stdout
        assert "inet 10.1.0.2/24 brd 10.1.0.255" in addrs
        routes = subprocess.run(["ip", "-n", peer_ns, "route"], capture_output=True,
                                text=True, check=True).stdout
        assert "default via 10.1.0.1 dev eth0" in routes
        assert "10.9.0.0/24 via 10.1.0.1 dev eth0" in routes
        with rtnl.socket_in(scratch) as sock:
            states = {name: (oper, port) for name, oper, port in rtnl.link_states(sock)}
        assert states["p0"][1] is not None   # a bridge port reports its state
    finally:
        netns.remove(peer_ns)
