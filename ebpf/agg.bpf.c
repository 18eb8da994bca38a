/* In-network aggregation at a rack's ToR: a tc ingress program on the rack's ports
 * that adds its workers' gradient slots (fixed point, Q8.24, see agg.h) into a sum per
 * slot and iteration, and sends the sum on to the PS in the packet of the rack's last
 * member to add it; the other members' packets end here, so the PS's link carries one
 * gradient per rack instead of one per worker. A member's ADD that is lost leaves its
 * slot short: the PS asks for what is in (FLUSH) and averages over the members who
 * made it (the bounded-loss semantics, counted at both ends). Packets not addressed to
 * the rack's aggregation address pass untouched to the port's next filter
 * (TC_ACT_UNSPEC: TC_ACT_OK would end the port's filters there). Every packet addressed to it gets
 * one reason counted in agg_stats (a FLUSH whose answer cannot be built: a second,
 * send_failed), and every check comes before any write.
 * Loader: tailcut/datapath/agg.py. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>
#include <uapi/linux/udp.h>
#include <uapi/linux/pkt_cls.h>

#include "agg.h"
#include "rackport.h"

#define CLAIM_TRIES 8
#define CLOSED (1ULL << 32)
#define BITMAP 0xffffffffULL
#define IP_OFF RACKPORT_IP_OFF
#define UDP_OFF RACKPORT_UDP_OFF
#define HDR_OFF RACKPORT_HDR_OFF

BPF_ARRAY(agg_config, struct tailcut_agg_config, 1);
BPF_ARRAY(agg_ports, struct tailcut_agg_port, TAILCUT_AGG_PORTS);
/* Iteration i of slot s is at [s * RING + i % RING]. */
BPF_ARRAY(agg_entries, struct tailcut_agg_entry, TAILCUT_AGG_RING * TAILCUT_AGG_SLOTS);
BPF_ARRAY(agg_sums, struct tailcut_agg_sum, TAILCUT_AGG_RING * TAILCUT_AGG_SLOTS);
BPF_PERCPU_ARRAY(agg_stats, __u64, TAILCUT_AGG_REASONS);

static __always_inline void count(__u32 reason)
{
	__u64 *n = agg_stats.lookup(&reason);

	if (n)
		*n += 1;
}

static __always_inline int drop(__u32 reason)
{
	count(reason);
	return TC_ACT_SHOT;
}

static __always_inline __u32 popcount(__u32 x)
{
	x = x - ((x >> 1) & 0x55555555);
	x = (x & 0x33333333) + ((x >> 2) & 0x33333333);
	x = (x + (x >> 4)) & 0x0f0f0f0f;
	return (x * 0x01010101) >> 24;
}

static __always_inline __u32 ring_key(__u32 slot, __u32 iteration)
{
	return slot * TAILCUT_AGG_RING + iteration % TAILCUT_AGG_RING;
}

/* Make iteration `it` + 2's entry of the slot ready. It holds `it` - 1, which is over
 * under BSP (nobody adds to `it` before the PS has taken `it` - 1's sums: forwarded,
 * so every member is in, or flushed, so it is closed): only then is it cleared, so a
 * member sending ahead cannot clear an iteration still being summed. One caller wins
 * the claim word and clears; the entry stays closed while it does. */
static __always_inline void prepare(struct tailcut_agg_config *cfg, __u32 slot, __u32 it)
{
	__u32 key = ring_key(slot, it + 2);
	struct tailcut_agg_entry *ent = agg_entries.lookup(&key);
	struct tailcut_agg_sum *sum = agg_sums.lookup(&key);
	__u64 old, target = (__u64)(it + 2) << 33;
	volatile __s64 *v;   /* volatile: clang would make the loop a memset, which BPF lacks */
	__u32 i;

	if (!ent || !sum)
		return;
	old = ent->claim;
	if ((old >> 33) >= (__u64)it + 2)
		return;
	if (!(old & CLOSED) && (__u32)(old & BITMAP) != cfg->members)
		return;   /* still being summed */
	if (__sync_fetch_and_add(&ent->added, 0) != popcount((__u32)(old & BITMAP)))
		return;   /* an add still in flight */
	if (__sync_val_compare_and_swap(&ent->claim, old, target | CLOSED) != old)
		return;
	v = sum->v;
	for (i = 0; i < TAILCUT_AGG_STRIDE; i++)
		v[i] = 0;
	ent->added = 0;
	__sync_lock_test_and_set(&ent->claim, target);
}

/* Copy a sum into the payload, as many values as the header's count (checked against
 * the slot before). The count is read again here, not passed in: a value the caller's
 * loop compared at every element would reach here in hundreds of shapes, and the
 * verifier would walk this loop once for each. */
static __always_inline void fill(struct __sk_buff *skb, struct tailcut_agg_sum *sum)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct tailcut_agg_hdr *h = data + HDR_OFF;
	void *payload = (void *)(h + 1);
	__u32 i, n;

	if ((void *)(h + 1) > data_end)
		return;
	n = bpf_ntohl(h->count);

	for (i = 0; i < TAILCUT_AGG_STRIDE; i++) {
		__s32 *p = payload + 4 * i;

		if (i >= n || (void *)(p + 1) > data_end)
			break;
		*p = rackport_clamp32(sum->v[i]);
	}
}

/* Answer a FLUSH in place (rackport_turn_around): status, iteration (the one asked
 * about), members and rack set, sent back out of the port it came in on. `reason` is
 * counted first: the FLUSH did what it did even if the answer then cannot be built
 * (counted once more as send_failed). */
static __always_inline int answer(struct __sk_buff *skb, struct tailcut_agg_config *cfg,
				  __u8 status, __u32 iteration, __u32 members, __u32 reason)
{
	void *data, *data_end;
	struct tailcut_agg_hdr *h;

	count(reason);
	if (rackport_turn_around(skb, TAILCUT_AGG_HEADER) < 0)
		return drop(TAILCUT_AGG_SEND_FAILED);
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	h = data + HDR_OFF;
	if ((void *)(h + 1) > data_end)
		return drop(TAILCUT_AGG_SEND_FAILED);
	h->status = status;
	h->iteration = bpf_htonl(iteration);
	h->members = bpf_htonl(members);
	h->rack = bpf_htonl(cfg->rack);
	return bpf_redirect(skb->ifindex, 0);
}

/* The rack's sum is complete: turn this packet into the AGGREGATE for the PS and let
 * the rack's bridge take it on to the next hop toward the PS (the PS itself in this
 * rack, else the spine's port: cfg->next_hop), as it takes any frame. */
static __always_inline int forward(struct __sk_buff *skb, struct tailcut_agg_config *cfg,
				   struct tailcut_agg_sum *sum, __u32 members)
{
	void *data, *data_end;
	struct ethhdr *eth;
	struct iphdr *ip;
	struct udphdr *udp;
	struct tailcut_agg_hdr *h;
	__be32 old_src, old_dst;

	if (!(cfg->next_hop[0] | cfg->next_hop[1] | cfg->next_hop[2] | cfg->next_hop[3] |
	      cfg->next_hop[4] | cfg->next_hop[5]))
		return drop(TAILCUT_AGG_NO_ROUTE);
	fill(skb, sum);
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	ip = data + IP_OFF;
	udp = data + UDP_OFF;
	h = data + HDR_OFF;
	if ((void *)(h + 1) > data_end)
		return drop(TAILCUT_AGG_SEND_FAILED);
	__builtin_memcpy(eth->h_dest, cfg->next_hop, ETH_ALEN);
	h->op = TAILCUT_AGG_OP_AGGREGATE;
	h->status = TAILCUT_AGG_OK;
	h->members = bpf_htonl(members);
	h->rack = bpf_htonl(cfg->rack);
	udp->source = bpf_htons(TAILCUT_AGG_PORT);
	udp->check = 0;
	old_src = ip->saddr;
	old_dst = ip->daddr;
	ip->saddr = cfg->address;
	ip->daddr = cfg->ps_address;
	if (bpf_l3_csum_replace(skb, IP_OFF + offsetof(struct iphdr, check), old_src,
				cfg->address, sizeof(__u32)) < 0 ||
	    bpf_l3_csum_replace(skb, IP_OFF + offsetof(struct iphdr, check), old_dst,
				cfg->ps_address, sizeof(__u32)) < 0)
		return drop(TAILCUT_AGG_SEND_FAILED);
	count(TAILCUT_AGG_FORWARDED);
	return TC_ACT_OK;
}

int tailcut_agg(struct __sk_buff *skb)
{
	__u32 zero = 0, key, it, slot, n, expected, worker, i, bits;
	struct tailcut_agg_config *cfg;
	struct tailcut_agg_port *port;
	struct tailcut_agg_entry *ent;
	struct tailcut_agg_sum *sum;
	struct tailcut_agg_hdr *h;
	struct ethhdr *eth;
	struct iphdr *ip;
	struct udphdr *udp;
	void *data, *data_end, *payload;
	__u64 old, bit, added;
	int tries;

	cfg = agg_config.lookup(&zero);
	if (!cfg || !cfg->address)
		return TC_ACT_UNSPEC;
	switch (rackport_classify(skb, cfg->address, TAILCUT_AGG_PORT)) {
	case RACKPORT_NOT_MINE:
		return TC_ACT_UNSPEC;   /* the rack's other traffic: the next filter's, or on */
	case RACKPORT_BAD_IP:
		return drop(TAILCUT_AGG_BAD_IP);
	default:
		break;
	}
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;
	ip = (void *)(eth + 1);
	udp = (void *)(ip + 1);
	h = (void *)(udp + 1);
	if ((void *)(h + 1) > data_end)
		return drop(TAILCUT_AGG_SHORT);
	if (h->magic != bpf_htonl(TAILCUT_AGG_MAGIC))
		return drop(TAILCUT_AGG_BAD_MAGIC);
	if (h->version != TAILCUT_AGG_VERSION)
		return drop(TAILCUT_AGG_BAD_VERSION);
	if ((h->op != TAILCUT_AGG_OP_ADD && h->op != TAILCUT_AGG_OP_FLUSH) || h->status ||
	    h->members || h->rack)
		return drop(TAILCUT_AGG_BAD_OP);
	if (bpf_ntohl(h->job) != cfg->job)
		return drop(TAILCUT_AGG_UNKNOWN_JOB);

	key = skb->tc_classid;
	port = agg_ports.lookup(&key);
	if (!port || !port->kind)
		return drop(TAILCUT_AGG_NO_PORT);
	worker = h->worker;
	if (h->op == TAILCUT_AGG_OP_FLUSH) {
		if (port->kind != TAILCUT_AGG_PORT_PS || worker != TAILCUT_AGG_PS_WORKER)
			return drop(TAILCUT_AGG_WRONG_PORT);
	} else {
		if (worker >= TAILCUT_AGG_MAX_WORKERS || !((cfg->members >> worker) & 1))
			return drop(TAILCUT_AGG_BAD_WORKER);
		if (port->kind != TAILCUT_AGG_PORT_WORKER || !((port->workers >> worker) & 1))
			return drop(TAILCUT_AGG_WRONG_PORT);
	}

	slot = bpf_ntohl(h->slot);
	if (slot >= cfg->slots || slot >= TAILCUT_AGG_SLOTS)
		return drop(TAILCUT_AGG_BAD_SLOT);
	expected = cfg->elements - slot * TAILCUT_AGG_STRIDE;
	if (expected > TAILCUT_AGG_STRIDE)
		expected = TAILCUT_AGG_STRIDE;
	n = bpf_ntohl(h->count);
	if (n != expected)
		return drop(TAILCUT_AGG_BAD_COUNT);
	if (bpf_ntohs(udp->len) != 8 + TAILCUT_AGG_HEADER + 4 * n ||
	    bpf_ntohs(ip->tot_len) != 20 + 8 + TAILCUT_AGG_HEADER + 4 * n ||
	    (void *)(h + 1) + 4 * n > data_end)
		return drop(TAILCUT_AGG_BAD_LENGTH);

	it = bpf_ntohl(h->iteration);
	key = ring_key(slot, it);
	ent = agg_entries.lookup(&key);
	sum = agg_sums.lookup(&key);
	if (!ent || !sum)
		return drop(TAILCUT_AGG_BAD_SLOT);
	payload = (void *)(h + 1);

	if (h->op == TAILCUT_AGG_OP_FLUSH) {
		/* Close the iteration (no ADD of it is taken from now on), then answer with
		 * the sum once every ADD already taken is in it. An entry the ring never
		 * brought to this iteration (every ADD of it - 2 lost) answers empty. */
		for (tries = 0; tries < CLAIM_TRIES; tries++) {
			old = ent->claim;
			if ((__u64)it < (old >> 33))
				return answer(skb, cfg, TAILCUT_AGG_STALE, it, 0,
					      TAILCUT_AGG_R_STALE);
			if ((__u64)it > (old >> 33)) {
				prepare(cfg, slot, it);
				return answer(skb, cfg, TAILCUT_AGG_OK, it, 0, TAILCUT_AGG_FLUSHED);
			}
			if ((old & CLOSED) ||
			    __sync_val_compare_and_swap(&ent->claim, old, old | CLOSED) == old)
				break;
		}
		if (tries == CLAIM_TRIES)
			return drop(TAILCUT_AGG_CONTENDED);
		bits = (__u32)(old & BITMAP);
		if (__sync_fetch_and_add(&ent->added, 0) != popcount(bits))
			return answer(skb, cfg, TAILCUT_AGG_NOT_READY, it, 0, TAILCUT_AGG_R_NOT_READY);
		prepare(cfg, slot, it);
		if (bits)
			fill(skb, sum);
		return answer(skb, cfg, TAILCUT_AGG_OK, it, bits, TAILCUT_AGG_FLUSHED);
	}

	/* ADD: take the worker's claim on this iteration of the slot, exactly once. */
	bit = 1ULL << worker;
	for (tries = 0; tries < CLAIM_TRIES; tries++) {
		old = ent->claim;
		if ((__u64)it > (old >> 33))
			return drop(TAILCUT_AGG_EARLY);
		if ((__u64)it < (old >> 33) || (old & CLOSED))
			return drop(TAILCUT_AGG_LATE);
		if (old & bit)
			return drop(TAILCUT_AGG_DUPLICATE);
		if (__sync_val_compare_and_swap(&ent->claim, old, old | bit) == old)
			break;
	}
	if (tries == CLAIM_TRIES)
		return drop(TAILCUT_AGG_CONTENDED);
	for (i = 0; i < TAILCUT_AGG_STRIDE; i++) {
		__s32 *p = payload + 4 * i;
		__s64 v;

		if (i >= n || (void *)(p + 1) > data_end)
			break;
		v = *p;
		if (v)
			__sync_fetch_and_add(&sum->v[i], v);
	}
	added = __sync_fetch_and_add(&ent->added, 1) + 1;
	prepare(cfg, slot, it);
	if (added != cfg->expected)
		return drop(TAILCUT_AGG_ADDED);
	/* Every member has claimed and added (the last to finish adding need not be the
	 * last to claim): the bitmap as it is now, not as this ADD saw it. */
	return forward(skb, cfg, sum,
		       (__u32)(__sync_fetch_and_add(&ent->claim, 0) & BITMAP));
}
