/* What the ToR's programs (tor.bpf.c, agg.bpf.c) share: finding the UDP packets
 * addressed to them on a rack's ports without touching any other packet, and turning
 * a request into its answer in place. Include after the uapi headers. */
#ifndef TAILCUT_RACKPORT_H
#define TAILCUT_RACKPORT_H

/* Offsets with a 20-byte IPv4 header (options are refused). */
#define RACKPORT_IP_OFF ETH_HLEN
#define RACKPORT_UDP_OFF (RACKPORT_IP_OFF + 20)
#define RACKPORT_HDR_OFF (RACKPORT_UDP_OFF + 8)

enum rackport_verdict { RACKPORT_MINE, RACKPORT_NOT_MINE, RACKPORT_BAD_IP };

/* Is it a UDP datagram to address:port (address in network order)? The headers are
 * read with bpf_skb_load_bytes, so the rest of the rack's traffic crossing the port
 * passes as it came; a datagram for us (at most one MTU) is then made readable and
 * writable whole. A fragment or IPv4 options (our senders use neither): BAD_IP. */
static __always_inline enum rackport_verdict rackport_classify(struct __sk_buff *skb,
							       __u32 address, __u16 port)
{
	struct {
		struct ethhdr eth;
		struct iphdr ip;
		struct udphdr udp;
	} __attribute__((packed)) peek;

	if (bpf_skb_load_bytes(skb, 0, &peek, sizeof(peek)) < 0 ||
	    peek.eth.h_proto != bpf_htons(ETH_P_IP) || peek.ip.protocol != IPPROTO_UDP ||
	    peek.ip.daddr != address)
		return RACKPORT_NOT_MINE;
	if (peek.ip.ihl != 5 || (peek.ip.frag_off & bpf_htons(0x3fff)))
		return RACKPORT_BAD_IP;
	if (peek.udp.dest != bpf_htons(port))
		return RACKPORT_NOT_MINE;
	bpf_skb_pull_data(skb, skb->len < 1514 ? skb->len : 1514);
	return RACKPORT_MINE;
}

/* Swap the MACs, the IPv4 addresses (which leaves the IP checksum as it was) and the
 * UDP ports, and set no UDP checksum (legal over IPv4: clients send none either, so no
 * later hop, a VXLAN tunnel, completes a half-done one). -1 if the packet is shorter
 * than its headers and `header` bytes of ours. */
static __always_inline int rackport_turn_around(struct __sk_buff *skb, __u32 header)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + RACKPORT_IP_OFF;
	struct udphdr *udp = data + RACKPORT_UDP_OFF;
	unsigned char mac[ETH_ALEN];
	__be32 addr;
	__be16 port;

	if (data + RACKPORT_HDR_OFF + header > data_end)
		return -1;
	__builtin_memcpy(mac, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, mac, ETH_ALEN);
	addr = ip->daddr;
	ip->daddr = ip->saddr;
	ip->saddr = addr;
	port = udp->dest;
	udp->dest = udp->source;
	udp->source = port;
	udp->check = 0;
	return 0;
}

/* A 64-bit sum as the s32 a packet carries, saturating. */
static __always_inline __s32 rackport_clamp32(__s64 v)
{
	return v > 2147483647LL ? (__s32)2147483647 :
	       v < -2147483648LL ? (__s32)(-2147483647 - 1) : (__s32)v;
}

#endif
