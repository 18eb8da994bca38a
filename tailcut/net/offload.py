"""Where UDP GSO messages are cut into datagrams.

A bounded-loss sender hands the kernel up to 64 KiB of datagrams at once (UDP GSO,
tailcut.transports.batch), as a TCP sender does with its segments; on veths and bridges
such a message travels whole until an interface that cannot carry it cuts it. The XDP
counter in generic mode, which is the default, would see a whole message as one
packet, so every switch port facing a pod cuts UDP GSO messages there, on its way out:
the pod then receives one datagram per wire packet, and the fabric before it carries
64 KiB at a time. TCP's segmentation offload is untouched (a separate feature)."""

from pyroute2.ethtool import Ethtool

from tailcut.net import netns

UDP_SEGMENTATION = "tx-udp-segmentation"


def cut_udp_gso_at(ns: str, ifnames: list[str]) -> None:
    """Make interfaces `ifnames` of namespace `ns` cut UDP GSO messages into datagrams."""
    with netns.entered(ns):
        ethtool = Ethtool()  # its ioctl socket belongs to the namespace it is made in
        try:
            for ifname in ifnames:
                features = ethtool.get_features(ifname)
                features.features[UDP_SEGMENTATION].enable = False
                ethtool.set_features(ifname, features)
        finally:
            ethtool.close()


def cuts_udp_gso(ns: str, ifname: str) -> bool:
    """Whether `ifname` in `ns` cuts UDP GSO messages (for tests and `tailcut doctor`)."""
    with netns.entered(ns):
        ethtool = Ethtool()
        try:
            return not ethtool.get_features(ifname).features[UDP_SEGMENTATION].enable
        finally:
            ethtool.close()
