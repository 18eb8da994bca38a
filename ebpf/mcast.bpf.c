/* Multicast of the PS's parameters at a rack's ToR: a tc ingress program on the way
 * from the PS (its port, or the rack's uplink) that turns one PARAMS datagram sent to
 * the rack's multicast address into one copy per worker of the rack, each addressed
 * to its worker (MAC, IP, header's worker and rack) and sent out of that worker's port
 * (bpf_clone_redirect to its egress), so every copy passes the port's shaping, loss
 * and priority classes like any packet; the original ends here. The PS's link and the
 * rack's uplink carry one copy per rack instead of one per worker. A lost copy is the
 * worker's to repair (it asks the PS for the slot: tailcut/transports/mcast.py).
 * Every packet addressed to the multicast address gets one reason counted in
 * mcast_stats, every check comes before any copy, and the maps the program writes are
 * its counters only. Packets not addressed to it go on to the next filter
 * (TC_ACT_UNSPEC), so it shares a port with the rack's other ToR programs.
 * Loader: tailcut/datapath/mcast.py. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>
#include <uapi/linux/udp.h>
#include <uapi/linux/pkt_cls.h>

#include "mcast.h"
#include "rackport.h"

#define IP_OFF RACKPORT_IP_OFF
#define UDP_OFF RACKPORT_UDP_OFF
#define HDR_OFF RACKPORT_HDR_OFF

BPF_ARRAY(mcast_config, struct tailcut_mcast_config, 1);
BPF_ARRAY(mcast_ports, struct tailcut_mcast_port, TAILCUT_MCAST_PORTS);
BPF_PERCPU_ARRAY(mcast_copies, __u64, TAILCUT_MCAST_PORTS);   /* copies sent, by port */
BPF_PERCPU_ARRAY(mcast_stats, __u64, TAILCUT_MCAST_REASONS);

static __always_inline void count(__u32 reason)
{
	__u64 *n = mcast_stats.lookup(&reason);

	if (n)
		*n += 1;
}

static __always_inline int drop(__u32 reason)
{
	count(reason);
	return TC_ACT_SHOT;
}

/* Address the packet to one worker's port and send a copy out of it. `*dst` is the
 * IPv4 destination the packet has now (the checksum is updated from it). */
static __always_inline void copy_to(struct __sk_buff *skb, __u32 index,
				    struct tailcut_mcast_port *port, __u32 *dst, __u32 rack)
{
	unsigned char mac[ETH_ALEN];
	__u32 ip = port->ip, ifindex = port->ifindex;
	__u8 worker = port->worker;
	__be32 rack_be = bpf_htonl(rack);
	__u64 *copies;

	__builtin_memcpy(mac, port->mac, ETH_ALEN);
	if (bpf_skb_store_bytes(skb, 0, mac, ETH_ALEN, 0) < 0 ||
	    bpf_l3_csum_replace(skb, IP_OFF + offsetof(struct iphdr, check), *dst, ip,
				sizeof(__u32)) < 0 ||
	    bpf_skb_store_bytes(skb, IP_OFF + offsetof(struct iphdr, daddr), &ip,
				sizeof(ip), 0) < 0) {
		count(TAILCUT_MCAST_CLONE_FAILED);
		return;
	}
	*dst = ip;
	if (bpf_skb_store_bytes(skb, HDR_OFF + offsetof(struct tailcut_mcast_hdr, worker),
				&worker, 1, 0) < 0 ||
	    bpf_skb_store_bytes(skb, HDR_OFF + offsetof(struct tailcut_mcast_hdr, rack),
				&rack_be, sizeof(rack_be), 0) < 0 ||
	    bpf_clone_redirect(skb, ifindex, 0) < 0) {
		count(TAILCUT_MCAST_CLONE_FAILED);
		return;
	}
	copies = mcast_copies.lookup(&index);
	if (copies)
		*copies += 1;
}

int tailcut_mcast(struct __sk_buff *skb)
{
	__u32 zero = 0, key, slot, n, expected, dst, i;
	struct tailcut_mcast_config *cfg;
	struct tailcut_mcast_port *port;
	struct tailcut_mcast_hdr *h;
	struct iphdr *ip;
	struct udphdr *udp;
	void *data, *data_end;
	__u16 no_check = 0;

	cfg = mcast_config.lookup(&zero);
	if (!cfg || !cfg->address)
		return TC_ACT_UNSPEC;
	switch (rackport_classify(skb, cfg->address, TAILCUT_MCAST_PORT)) {
	case RACKPORT_NOT_MINE:
		return TC_ACT_UNSPEC;   /* the rack's other traffic: the next filter's, or on */
	case RACKPORT_BAD_IP:
		return drop(TAILCUT_MCAST_BAD_IP);
	default:
		break;
	}
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	ip = data + IP_OFF;
	udp = data + UDP_OFF;
	h = data + HDR_OFF;
	if ((void *)(h + 1) > data_end)
		return drop(TAILCUT_MCAST_SHORT);
	if (h->magic != bpf_htonl(TAILCUT_MCAST_MAGIC))
		return drop(TAILCUT_MCAST_BAD_MAGIC);
	if (h->version != TAILCUT_MCAST_VERSION)
		return drop(TAILCUT_MCAST_BAD_VERSION);
	if (h->op != TAILCUT_MCAST_OP_PARAMS || h->status || h->worker || h->rack ||
	    h->reserved)
		return drop(TAILCUT_MCAST_BAD_OP);
	if (bpf_ntohl(h->job) != cfg->job)
		return drop(TAILCUT_MCAST_UNKNOWN_JOB);
	key = skb->tc_classid;
	port = mcast_ports.lookup(&key);
	if (!port || !port->kind)
		return drop(TAILCUT_MCAST_NO_PORT);
	if (port->kind != TAILCUT_MCAST_PORT_PS)
		return drop(TAILCUT_MCAST_WRONG_PORT);
	slot = bpf_ntohl(h->slot);
	if (slot >= cfg->slots || slot >= TAILCUT_MCAST_SLOTS)
		return drop(TAILCUT_MCAST_BAD_SLOT);
	expected = cfg->elements - slot * TAILCUT_MCAST_STRIDE;
	if (expected > TAILCUT_MCAST_STRIDE)
		expected = TAILCUT_MCAST_STRIDE;
	n = bpf_ntohl(h->count);
	if (n != expected)
		return drop(TAILCUT_MCAST_BAD_COUNT);
	if (bpf_ntohs(udp->len) != 8 + TAILCUT_MCAST_HEADER + 4 * n ||
	    bpf_ntohs(ip->tot_len) != 20 + 8 + TAILCUT_MCAST_HEADER + 4 * n ||
	    (void *)(h + 1) + 4 * n > data_end)
		return drop(TAILCUT_MCAST_BAD_LENGTH);

	/* Copies carry no UDP checksum (the PS sends none; legal over IPv4): the
	 * destination changes per copy. */
	dst = ip->daddr;
	if (bpf_skb_store_bytes(skb, UDP_OFF + offsetof(struct udphdr, check), &no_check,
				sizeof(no_check), 0) < 0)
		return drop(TAILCUT_MCAST_CLONE_FAILED);
	for (i = 1; i < TAILCUT_MCAST_PORTS; i++) {
		key = i;
		port = mcast_ports.lookup(&key);
		if (port && port->kind == TAILCUT_MCAST_PORT_WORKER)
			copy_to(skb, i, port, &dst, cfg->rack);
	}
	return drop(TAILCUT_MCAST_REPLICATED);
}
