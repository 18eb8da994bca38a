/* The bounded-loss receiver counter: an XDP program that counts, per message, the
 * float32 elements that arrived in range-indexed UDP packets (each packet slot once,
 * however often it arrives) and emits a ring-buffer event when the count crosses
 * p * total: the "partial delivery" signal. Every packet is passed on (XDP_PASS):
 * the receiving socket still gets the data. A UDP GSO message arriving whole is walked
 * datagram by datagram. Loader: tailcut/datapath/partial.py.
 * Wire header, maps and counters: partial.h. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/in.h>
#include <uapi/linux/udp.h>

#include "partial.h"

/* The loader compiles the program once per stride (-DTAILCUT_BL_STRIDE=<elements per
 * full packet>, e.g. 360); which ports it serves, for which job and at which p are
 * entries of bl_receivers, written at run time. */
#ifndef TAILCUT_BL_STRIDE
#error "compile with -DTAILCUT_BL_STRIDE, as tailcut/datapath/partial.py does"
#endif
/* A full datagram's UDP payload, and the most of them any sender may put in one UDP GSO
 * message (at most 65507 bytes of payload, at most 64 segments; tailcut's own senders
 * stay under 32 KiB: batch.py's max_segments). The verifier needs both as constants, and every offset it
 * checks below 64 KiB: the last datagram walked starts at most 65507 - DATAGRAM in. */
#define TAILCUT_BL_DATAGRAM (TAILCUT_BL_HDR_BYTES + 4 * TAILCUT_BL_STRIDE)
#define TAILCUT_BL_GSO_DATAGRAMS \
	(65507 / TAILCUT_BL_DATAGRAM < 64 ? 65507 / TAILCUT_BL_DATAGRAM : 64)

/* Indexed by port: an array lookup the verifier inlines, a few ns a packet where a
 * hash of the port cost ~25 ns (bench/bl_xdp_cost.py). */
BPF_ARRAY(bl_receivers, struct tailcut_bl_receiver, TAILCUT_BL_RECEIVERS);
BPF_HASH(bl_messages, struct tailcut_bl_key, struct tailcut_bl_state, TAILCUT_BL_MESSAGES);
BPF_RINGBUF_OUTPUT(bl_events, TAILCUT_BL_EVENTS_PAGES);
BPF_PERCPU_ARRAY(bl_stats, __u64, TAILCUT_BL_REASONS);
/* One zeroed state, never written: the template for a new bl_messages entry. */
BPF_ARRAY(bl_zero, struct tailcut_bl_state, 1);

static __always_inline int verdict(__u32 reason)
{
	__u64 *n = bl_stats.lookup(&reason);

	if (n)
		*n += 1;
	return XDP_PASS;
}

/* Count one datagram of the message: header h (its 32 bytes readable), payload bytes
 * of values after it. Returns its verdict's reason. */
static __always_inline __u32 count_datagram(struct tailcut_bl_hdr *h, __u32 payload,
					    struct tailcut_bl_receiver *rcv, __u32 port)
{
	struct tailcut_bl_key key = {};
	struct tailcut_bl_state *st;
	__u32 start, end, total, slot, n, word, p_ppm;
	__u64 bit, old, before, thr, old_total;

	if (h->magic != bpf_htonl(TAILCUT_BL_MAGIC))
		return TAILCUT_BL_BAD_MAGIC;
	if (h->version != TAILCUT_BL_VERSION)
		return TAILCUT_BL_BAD_VERSION;
	if ((h->flags & ~TAILCUT_BL_FLAGS) || h->reserved)
		return TAILCUT_BL_BAD_FLAGS;
	start = bpf_ntohl(h->start);
	end = bpf_ntohl(h->end);
	total = bpf_ntohl(h->total);
	if (end <= start || end > total ||
	    total > (__u32)TAILCUT_BL_MAX_SLOTS * TAILCUT_BL_STRIDE)
		return TAILCUT_BL_BAD_RANGE;
	n = end - start;
	/* n <= total <= 2^13 * STRIDE, so 4 * n cannot overflow a u32 for sane strides. */
	if (payload != 4 * n)
		return TAILCUT_BL_BAD_LENGTH;
	slot = start / TAILCUT_BL_STRIDE;
	if (start % TAILCUT_BL_STRIDE ||
	    end != (total - start < TAILCUT_BL_STRIDE ? total : start + TAILCUT_BL_STRIDE))
		return TAILCUT_BL_MISALIGNED;
	if (h->job != bpf_htonl(rcv->job))
		return TAILCUT_BL_UNKNOWN_JOB;
	/* ceil(p * total), at least 1; total < 2^32 and p_ppm <= 1e6 fit a u64. The
	 * loader writes p_ppm in 1..1e6; clamp anyway, the map is writable. */
	p_ppm = rcv->p_ppm;
	if (p_ppm > TAILCUT_BL_PPM)
		p_ppm = TAILCUT_BL_PPM;
	thr = ((__u64)total * p_ppm + TAILCUT_BL_PPM - 1) / TAILCUT_BL_PPM;
	if (!thr)
		thr = 1;

	key.job = rcv->job;
	key.message = bpf_ntohl(h->message);
	key.port = port;
	st = bl_messages.lookup(&key);
	if (!st) {
		/* A state is 1 KiB, more than the 512-byte BPF stack: insert a copy of the
		 * never-written entry of bl_zero. insert() is BPF_NOEXIST: a racer may win. */
		__u32 zero_key = 0;
		struct tailcut_bl_state *zero = bl_zero.lookup(&zero_key);

		if (!zero)
			return TAILCUT_BL_TABLE_FULL;
		bl_messages.insert(&key, zero);
		st = bl_messages.lookup(&key);
		if (!st)
			return TAILCUT_BL_TABLE_FULL;
	}
	/* The first packet fixes the message's total; every CPU may race for it. */
	old_total = __sync_val_compare_and_swap(&st->total, 0, total);
	if (old_total == 0) {
		st->threshold = thr;
		st->first_ns = bpf_ktime_get_ns();
	} else if (old_total != total) {
		return TAILCUT_BL_TOTAL_MISMATCH;
	}
	/* slot < MAX_SLOTS follows from the range check, so clang drops a plain bounds
	 * test; the empty asm hides what it knows and the mask keeps the verifier sure. */
	word = slot / 64;
	asm volatile("" : "+r"(word));
	word &= TAILCUT_BL_SLOT_WORDS - 1;
	bit = 1ULL << (slot & 63);
	old = __sync_fetch_and_or(&st->slots[word], bit);
	if (old & bit) {
		__sync_fetch_and_add(&st->duplicates, 1);
		return TAILCUT_BL_DUPLICATE;
	}
	__sync_fetch_and_add(&st->packets, 1);
	before = __sync_fetch_and_add(&st->counted, n);
	/* thr is computed from this packet's total, which equals the message's: no CPU
	 * depends on another having written st->threshold yet. */
	if (before < thr && before + n >= thr &&
	    __sync_val_compare_and_swap(&st->fired, 0, 1) == 0) {
		struct tailcut_bl_event ev = {
			.job = key.job, .message = key.message, .counted = before + n,
			.total = total, .seq = bpf_ntohl(h->seq), .slot = slot,
			.ktime_ns = bpf_ktime_get_ns(), .port = port,
		};

		bl_events.ringbuf_output(&ev, sizeof(ev), 0);
	}
	return TAILCUT_BL_COUNTED;
}

int tailcut_partial(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct udphdr *udp;
	struct tailcut_bl_hdr *h;
	struct tailcut_bl_receiver *rcv;
	__u32 ihl, udp_len, payload, off, seg, i, reason;
	__u32 port;

	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end || ip->protocol != IPPROTO_UDP)
		return XDP_PASS;
	/* Fragments carry no UDP header of their own (and the sender never fragments). */
	if (ip->frag_off & bpf_htons(0x3fff))
		return XDP_PASS;
	ihl = ip->ihl * 4;
	if (ihl < sizeof(*ip))
		return XDP_PASS;
	udp = (void *)ip + ihl;
	if ((void *)(udp + 1) > data_end)
		return XDP_PASS;
	port = bpf_ntohs(udp->dest);
	rcv = bl_receivers.lookup(&port);
	if (!rcv || !rcv->p_ppm)   /* p_ppm 0: a port not served */
		return XDP_PASS;

	/* From here on the packet is addressed to us: each datagram in it gets exactly one
	 * verdict, up to the first one that is not counted. It holds one datagram, or a UDP GSO message of several (the sender's
	 * batch.py; generic XDP sees it whole, before the socket cuts it or takes it whole
	 * with UDP_GRO): back to back, every one but the last exactly TAILCUT_BL_DATAGRAM
	 * bytes, the full datagram of this stride. A single datagram longer than that
	 * cannot come unfragmented through links of the job's MTU, which the stride is
	 * made from, so a longer payload is always such a message. */
	udp_len = bpf_ntohs(udp->len);
	/* A bound clang cannot fold away: 6.1's verifier knows nothing of a be16 result. */
	asm volatile("" : "+r"(udp_len));
	if (udp_len > 0xffff)
		return verdict(TAILCUT_BL_SHORT);
	if (udp_len < sizeof(*udp) + sizeof(*h) || (void *)udp + udp_len > data_end)
		return verdict(TAILCUT_BL_SHORT);
	payload = udp_len - sizeof(*udp);
	/* A GSO message's last datagram holds a header and a float at least; a datagram a
	 * few bytes longer than a full one (an MTU not a multiple of 4 lets one through
	 * whole) is not a GSO message: one verdict, as the socket refuses it too. */
	if (payload > TAILCUT_BL_DATAGRAM &&
	    payload % TAILCUT_BL_DATAGRAM != 0 &&
	    payload % TAILCUT_BL_DATAGRAM < sizeof(*h) + 4)
		return verdict(TAILCUT_BL_SHORT);
	for (i = 0; i < TAILCUT_BL_GSO_DATAGRAMS; i++) {
		off = i * TAILCUT_BL_DATAGRAM;
		if (off >= payload)
			break;
		seg = payload - off;
		if (seg > TAILCUT_BL_DATAGRAM)
			seg = TAILCUT_BL_DATAGRAM;
		h = (void *)(udp + 1) + off;
		if ((void *)(h + 1) > data_end || seg < sizeof(*h)) {
			verdict(TAILCUT_BL_SHORT);
			break;
		}
		reason = count_datagram(h, seg - sizeof(*h), rcv, port);
		verdict(reason);
		/* The sender cuts a message into whole datagrams of one message: after one
		 * that is not, the rest is not looked at (a hostile packet gets one verdict). */
		if (reason != TAILCUT_BL_COUNTED && reason != TAILCUT_BL_DUPLICATE)
			break;
	}
	return XDP_PASS;
}
