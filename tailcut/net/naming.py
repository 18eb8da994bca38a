"""The naming scheme of everything the local runtime creates.

Every kernel object a run creates carries the job's name, so `tailcut clean` can find
leftovers of a crashed run and remove only what is tailcut's:

    network namespaces   tailcut-<job>.<pod>      one per pod, e.g. tailcut-quick.worker-0
                         tailcut-<job>.rack-<r>   one per rack, holds the ToR bridge
                         tailcut-<job>.spine      the spine router joining the racks
                         (job names are DNS labels and never hold a dot, so the dot
                         keeps job "a" from owning job "a-b"'s namespaces)
    interfaces           live only inside those namespaces, so names can be short and
                         fixed (Linux allows 15 characters):
                           pod:   eth0             its access link, peer in the rack ns
                                  (tc0 in a Kubernetes pod, whose eth0 is the CNI's)
                           rack:  tor              the rack's bridge
                                  p<i>             rack end of pod i's access link
                                  up               rack end of the uplink
                           spine: r<r>             spine end of rack r's uplink
                         each also carries the ifalias "tailcut:<job>" and interface
                         group GROUP, so a namespace's links go in one request
                         (`ip link delete group 29795`); a pod's end and the spine's end
                         have the MAC of their address (mac_of: 02:74:<the IPv4 bytes>),
                         so neighbour entries need no lookup.
    qdiscs (HTB)         root 1:, class 1:1 = link rate, leaf 1:10 = default traffic,
                         1:20.. = CadentFlow priority levels; the leaf qdisc of class
                         1:m is m: (netem under 1:10 is 10:, a buffer's pfifo/bfifo
                         20: under 1:20), and a buffer under netem is 11:.
    addresses            rack r is 10.<r+1>.0.0/24 (r < 250); the spine is .1 of every
                         rack subnet and routes between them; pod i of a rack is .<i+2>.
"""

import re

PREFIX = "tailcut-"
ALIAS_PREFIX = "tailcut:"
MAX_IFNAME = 15

_JOB_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")


def valid_job_name(name: str) -> bool:
    """Job names are DNS labels of at most 40 characters (they prefix netns names)."""
    return bool(_JOB_NAME.match(name))


def pod_netns(job: str, pod: str) -> str:
    return f"{PREFIX}{job}.{pod}"


def rack_netns(job: str, rack_index: int) -> str:
    return f"{PREFIX}{job}.rack-{rack_index}"


def spine_netns(job: str) -> str:
    return f"{PREFIX}{job}.spine"


def job_prefix(job: str) -> str:
    """Every namespace of `job` starts with this, and no other job's does."""
    return f"{PREFIX}{job}."


def alias(job: str) -> str:
    return f"{ALIAS_PREFIX}{job}"


GROUP = 0x7463   # interface group of every link tailcut creates ("tc")


def mac_of(ip: str) -> str:
    """The MAC of the interface holding IPv4 `ip` (a pod's, or the spine's gateway):
    locally administered, unique within a job, as its addresses are."""
    return "02:74:" + ":".join(f"{int(b):02x}" for b in ip.split("."))


POD_IF = "eth0"
DATA_IF = "tc0"   # a Kubernetes pod's access link, next to the CNI's eth0
TOR_BRIDGE = "tor"
RACK_UPLINK_IF = "up"


def rack_port(pod_slot: int) -> str:
    return f"p{pod_slot}"


def spine_port(rack_index: int) -> str:
    return f"r{rack_index}"


def rack_subnet(rack_index: int) -> str:
    return f"10.{rack_index + 1}.0.0/24"


def gateway_ip(rack_index: int) -> str:
    return f"10.{rack_index + 1}.0.1"


def pod_ip(rack_index: int, pod_slot: int) -> str:
    return f"10.{rack_index + 1}.0.{pod_slot + 2}"


# The ToR's hot-parameter store answers at this address of its rack's subnet (past
# every pod's: at most 250 pods a rack, .2 to .251), through a fixed MAC that every pod
# of the rack and the spine know as a permanent neighbour: no host owns the address,
# the rack's ports' ingress program takes its packets.
def hot_store_ip(rack_index: int) -> str:
    return f"10.{rack_index + 1}.0.254"


HOT_STORE_MAC = "02:74:63:68:6f:74"   # locally administered; "tchot"


# The ToR's in-network aggregation takes its workers' gradients at this address, the
# same way (its ingress program, a fixed MAC as a permanent neighbour).
def aggregation_ip(rack_index: int) -> str:
    return f"10.{rack_index + 1}.0.253"


AGGREGATION_MAC = "02:74:63:61:67:67"   # locally administered; "tcagg"


# The ToR's multicast of the PS's parameters takes them at this address of each
# workers' rack, the same way (its ingress program on the way from the PS, a fixed MAC
# as a permanent neighbour in ps-0 and the spine).
def multicast_ip(rack_index: int) -> str:
    return f"10.{rack_index + 1}.0.252"


MULTICAST_MAC = "02:74:63:6d:63:73"   # locally administered; "tcmcs"
