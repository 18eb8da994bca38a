/* The ToR's hot-parameter store: a tc ingress program on the ports of the PS's rack
 * that keeps the job's hot parameters in maps, answers workers' pulls of them and
 * applies their pushes, in fixed point (Q8.24, see tor.h). Replies are written into
 * the request and sent back out of the port it came in on (bpf_redirect to the port's
 * egress), so they pass the port's shaping, loss and classes like any other packet.
 * Packets not addressed to the store pass untouched to the port's next filter
 * (TC_ACT_UNSPEC: TC_ACT_OK would end the port's filters there). Every packet addressed to it gets
 * exactly one reason counted in tor_stats, and every check comes before any write.
 * Loader: tailcut/datapath/tor.py. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>
#include <uapi/linux/udp.h>
#include <uapi/linux/pkt_cls.h>

#include "rackport.h"
#include "tor.h"

#define CLAIM_TRIES 8
#define IP_OFF RACKPORT_IP_OFF
#define HDR_OFF RACKPORT_HDR_OFF
#define PAYLOAD_OFF (HDR_OFF + TAILCUT_TOR_HEADER)

BPF_ARRAY(tor_config, struct tailcut_tor_config, 1);
BPF_ARRAY(tor_ports, struct tailcut_tor_port, TAILCUT_TOR_PORTS);
BPF_ARRAY(tor_slots, struct tailcut_tor_slot, TAILCUT_TOR_SLOTS);
/* Two values per slot: iteration i's are at [(i & 1) * SLOTS + slot]. */
BPF_ARRAY(tor_vals, struct tailcut_tor_values, 2 * TAILCUT_TOR_SLOTS);
BPF_ARRAY(tor_acc, struct tailcut_tor_values, TAILCUT_TOR_SLOTS);
BPF_ARRAY(tor_counts, struct tailcut_tor_counts, TAILCUT_TOR_SLOTS);
BPF_PERCPU_ARRAY(tor_stats, __u64, TAILCUT_TOR_REASONS);

static __always_inline void count(__u32 reason)
{
	__u64 *n = tor_stats.lookup(&reason);

	if (n)
		*n += 1;
}

static __always_inline int drop(__u32 reason)
{
	count(reason);
	return TC_ACT_SHOT;
}

/* Turn the request into its reply in place (rackport_turn_around), set the status and
 * the iteration, and send it back out of the port it arrived on. With header_only,
 * the payload is cut off first (an ACK, NOT_READY, STALE). `reason` is counted first:
 * what happened to the store happened even if the reply then fails (counted once more
 * as reply_failed). */
static __always_inline int reply(struct __sk_buff *skb, __u8 status, __u32 iteration,
				 int header_only, __u32 reason)
{
	void *data, *data_end;
	struct iphdr *ip;
	struct udphdr *udp;
	struct tailcut_tor_hdr *h;
	__be16 old_len, new_len;

	count(reason);
	if (rackport_turn_around(skb, TAILCUT_TOR_HEADER) < 0)
		return drop(TAILCUT_TOR_REPLY_FAILED);
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	ip = data + IP_OFF;
	udp = data + RACKPORT_UDP_OFF;
	h = data + HDR_OFF;
	if ((void *)(h + 1) > data_end)
		return drop(TAILCUT_TOR_REPLY_FAILED);
	h->status = status;
	h->iteration = bpf_htonl(iteration);
	if (header_only) {
		h->count = 0;
		old_len = ip->tot_len;
		new_len = bpf_htons(20 + 8 + TAILCUT_TOR_HEADER);
		udp->len = bpf_htons(8 + TAILCUT_TOR_HEADER);
		ip->tot_len = new_len;
		if (bpf_l3_csum_replace(skb, IP_OFF + offsetof(struct iphdr, check),
					old_len, new_len, sizeof(__u16)) < 0)
			return drop(TAILCUT_TOR_REPLY_FAILED);
		if (bpf_skb_change_tail(skb, PAYLOAD_OFF, 0) < 0)
			return drop(TAILCUT_TOR_REPLY_FAILED);
	}
	return bpf_redirect(skb->ifindex, 0);
}

int tailcut_tor(struct __sk_buff *skb)
{
	__u32 zero = 0, key, it, slot, n, expected, worker, i;
	struct tailcut_tor_config *cfg;
	struct tailcut_tor_port *port;
	struct tailcut_tor_slot *st;
	struct tailcut_tor_values *vals, *next, *acc;
	struct tailcut_tor_counts *cnt;
	struct tailcut_tor_hdr *h;
	struct ethhdr *eth;
	struct iphdr *ip;
	struct udphdr *udp;
	void *data, *data_end, *payload;
	__u64 cur, old, bit, added;
	int tries;

	cfg = tor_config.lookup(&zero);
	if (!cfg || !cfg->address)
		return TC_ACT_UNSPEC;
	switch (rackport_classify(skb, cfg->address, TAILCUT_TOR_PORT)) {
	case RACKPORT_NOT_MINE:
		return TC_ACT_UNSPEC;   /* the PS's own traffic, or the next filter's */
	case RACKPORT_BAD_IP:
		return drop(TAILCUT_TOR_BAD_IP);
	default:
		break;
	}
	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	eth = data;   /* the headers classified above, now in place */
	ip = (void *)(eth + 1);
	udp = (void *)(ip + 1);
	h = (void *)(udp + 1);
	if ((void *)(h + 1) > data_end)
		return drop(TAILCUT_TOR_SHORT);
	if (h->magic != bpf_htonl(TAILCUT_TOR_MAGIC))
		return drop(TAILCUT_TOR_BAD_MAGIC);
	if (h->version != TAILCUT_TOR_VERSION)
		return drop(TAILCUT_TOR_BAD_VERSION);
	if (h->op < TAILCUT_TOR_OP_PULL || h->op > TAILCUT_TOR_OP_COUNTS || h->status ||
	    h->reserved0 || h->reserved1)
		return drop(TAILCUT_TOR_BAD_OP);
	if (bpf_ntohl(h->job) != cfg->job)
		return drop(TAILCUT_TOR_UNKNOWN_JOB);

	key = skb->tc_classid;
	port = tor_ports.lookup(&key);
	if (!port || !port->kind)
		return drop(TAILCUT_TOR_NO_PORT);
	worker = h->worker;
	if (worker == TAILCUT_TOR_PS_WORKER) {
		if (port->kind != TAILCUT_TOR_PORT_PS || h->op == TAILCUT_TOR_OP_PUSH)
			return drop(TAILCUT_TOR_WRONG_PORT);
	} else {
		if (worker >= cfg->workers || worker >= TAILCUT_TOR_MAX_WORKERS)
			return drop(TAILCUT_TOR_BAD_WORKER);
		if (h->op == TAILCUT_TOR_OP_COUNTS || port->kind == TAILCUT_TOR_PORT_PS ||
		    !((port->workers >> worker) & 1))
			return drop(TAILCUT_TOR_WRONG_PORT);
	}

	slot = bpf_ntohl(h->slot);
	if (slot >= cfg->slots || slot >= TAILCUT_TOR_SLOTS)
		return drop(TAILCUT_TOR_BAD_SLOT);
	expected = cfg->elements - slot * TAILCUT_TOR_STRIDE;
	if (expected > TAILCUT_TOR_STRIDE)
		expected = TAILCUT_TOR_STRIDE;
	n = bpf_ntohl(h->count);
	if (n != expected)
		return drop(TAILCUT_TOR_BAD_COUNT);
	if (bpf_ntohs(udp->len) != 8 + TAILCUT_TOR_HEADER + 4 * n ||
	    bpf_ntohs(ip->tot_len) != 20 + 8 + TAILCUT_TOR_HEADER + 4 * n ||
	    (void *)(h + 1) + 4 * n > data_end)
		return drop(TAILCUT_TOR_BAD_LENGTH);

	st = tor_slots.lookup(&slot);
	acc = tor_acc.lookup(&slot);
	cnt = tor_counts.lookup(&slot);
	if (!st || !acc || !cnt)
		return drop(TAILCUT_TOR_BAD_SLOT);
	it = bpf_ntohl(h->iteration);
	payload = (void *)(h + 1);

	if (h->op == TAILCUT_TOR_OP_COUNTS) {
		for (i = 0; i < TAILCUT_TOR_STRIDE; i++) {
			__u32 *p = payload + 4 * i;

			if (i >= n || (void *)(p + 1) > data_end)
				break;
			*p = (__u32)cnt->c[i];
		}
		return reply(skb, TAILCUT_TOR_OK, (__u32)st->iteration, 0, TAILCUT_TOR_COUNTED);
	}

	if (h->op == TAILCUT_TOR_OP_PULL) {
		/* Only the current iteration: its buffer is the one the next fold does not
		 * write. (Under BSP nobody needs an older one: the PS reads the values at an
		 * epoch end before it lets any worker pull the next iteration.) */
		cur = __sync_fetch_and_add(&st->iteration, 0);
		if ((__u64)it > cur)
			return reply(skb, TAILCUT_TOR_NOT_READY, (__u32)cur, 1,
				     TAILCUT_TOR_R_NOT_READY);
		if ((__u64)it < cur)
			return reply(skb, TAILCUT_TOR_STALE, (__u32)cur, 1, TAILCUT_TOR_R_STALE);
		key = (it & 1) * TAILCUT_TOR_SLOTS + slot;
		vals = tor_vals.lookup(&key);
		if (!vals)
			return drop(TAILCUT_TOR_BAD_SLOT);
		for (i = 0; i < TAILCUT_TOR_STRIDE; i++) {
			__s32 *p = payload + 4 * i;

			if (i >= n || (void *)(p + 1) > data_end)
				break;
			*p = rackport_clamp32(vals->v[i]);
		}
		return reply(skb, TAILCUT_TOR_OK, it, 0, TAILCUT_TOR_PULLED);
	}

	/* PUSH: take the worker's claim on this iteration of the slot, exactly once. */
	bit = 1ULL << worker;
	for (tries = 0; tries < CLAIM_TRIES; tries++) {
		old = st->claim;
		if ((__u64)it < (old >> 32))
			return reply(skb, TAILCUT_TOR_STALE, (__u32)(old >> 32), 1,
				     TAILCUT_TOR_R_STALE);
		if ((__u64)it > (old >> 32))
			return drop(TAILCUT_TOR_FUTURE);
		if (old & bit)
			return reply(skb, TAILCUT_TOR_DUPLICATE, it, 1, TAILCUT_TOR_R_DUPLICATE);
		if (__sync_val_compare_and_swap(&st->claim, old, old | bit) == old)
			break;
	}
	if (tries == CLAIM_TRIES)
		return drop(TAILCUT_TOR_CONTENDED);
	for (i = 0; i < TAILCUT_TOR_STRIDE; i++) {
		__s32 *p = payload + 4 * i;
		__s64 v;

		if (i >= n || (void *)(p + 1) > data_end)
			break;
		v = *p;
		if (v) {
			__sync_fetch_and_add(&acc->v[i], v);
			__sync_fetch_and_add(&cnt->c[i], 1);
		}
	}
	added = __sync_fetch_and_add(&st->added, 1) + 1;
	if (added == cfg->workers) {
		/* The iteration's last push: no other push of it can come, and no push of the
		 * next before a pull of it, which waits for st->iteration. Fold into the
		 * other buffer (no pull reads it), then publish: claim first (a resent push
		 * of this iteration is then STALE), the iteration last, atomically. */
		key = (it & 1) * TAILCUT_TOR_SLOTS + slot;
		vals = tor_vals.lookup(&key);
		key = ((it + 1) & 1) * TAILCUT_TOR_SLOTS + slot;
		next = tor_vals.lookup(&key);
		if (vals && next) {
			for (i = 0; i < TAILCUT_TOR_STRIDE; i++) {
				next->v[i] = vals->v[i] + acc->v[i];
				acc->v[i] = 0;
			}
		}
		st->added = 0;
		st->folds += 1;
		__sync_lock_test_and_set(&st->claim, ((__u64)it + 1) << 32);
		__sync_fetch_and_add(&st->iteration, 1);
	}
	return reply(skb, TAILCUT_TOR_OK, it, 1, TAILCUT_TOR_PUSHED);
}
