/* The kernel receive path of bounded loss: a tc program on the receiving pod's clsact
 * ingress hook that takes the transport's data datagrams off the stack before the
 * socket. For each datagram of a bound message it checks every header field and
 * bound, copies the payload into the message's region of a memory-mapped array
 * (rx_data), counts each range once (as partial.bpf.c does) and emits a ring-buffer
 * event when the count reaches the message's threshold and when the message is
 * complete; the skb is then dropped (TC_ACT_SHOT). A malformed datagram to the port
 * is counted under its reason and dropped without a write; anything else (other
 * ports, protocols, jobs, messages bound to no region) passes untouched.
 *
 * It runs after every shaping hop (tc ingress of the pod's own interface) and sees a
 * UDP GSO skb whole: its datagrams are walked gso_size bytes apart. Payloads are read
 * with bpf_skb_load_bytes, so a non-linear skb needs no linearising (generic XDP's
 * cost). Loader: tailcut/datapath/rxring.py. Maps and reasons: rxring.h. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/udp.h>

#ifndef TAILCUT_RX_STRIDE
#error "compile with -DTAILCUT_RX_STRIDE, -DTAILCUT_RX_RANGES and -DTAILCUT_RX_REGIONS, as tailcut/datapath/rxring.py does"
#endif

#include "rxring.h"

#define RX_DATAGRAM   (TAILCUT_BL_HDR_BYTES + 4 * TAILCUT_RX_STRIDE)  /* a full datagram */
#define RX_RANGE_BYTES (4 * TAILCUT_RX_STRIDE)
#define RX_CAPACITY   ((__u64)TAILCUT_RX_RANGES * TAILCUT_RX_STRIDE)  /* floats a region holds */
#define KIND_PUSH     2   /* tailcut.transports.base.Kind */
#define KIND_PARAMS   3

_Static_assert(TAILCUT_RX_RANGES % 64 == 0 && TAILCUT_RX_RANGES <= TAILCUT_RX_MAX_RANGES,
	       "TAILCUT_RX_RANGES: a multiple of 64, at most TAILCUT_RX_MAX_RANGES");
_Static_assert(TAILCUT_RX_REGIONS >= 1 && TAILCUT_RX_REGIONS <= TAILCUT_RX_MAX_REGIONS,
	       "TAILCUT_RX_REGIONS: 1..TAILCUT_RX_MAX_REGIONS");

BPF_ARRAY(rx_receivers, struct tailcut_rx_receiver, TAILCUT_RX_RECEIVERS);
BPF_HASH(rx_bind, struct tailcut_rx_key, __u32, TAILCUT_RX_REGIONS);
BPF_F_TABLE("array", __u32, struct tailcut_rx_region, rx_regions, TAILCUT_RX_REGIONS,
	    BPF_F_MMAPABLE);
BPF_F_TABLE("array", __u32, struct tailcut_rx_range, rx_data,
	    TAILCUT_RX_REGIONS * TAILCUT_RX_RANGES, BPF_F_MMAPABLE);
BPF_RINGBUF_OUTPUT(rx_events, TAILCUT_RX_EVENTS_PAGES);
BPF_PERCPU_ARRAY(rx_stats, __u64, TAILCUT_RX_REASONS);

static __always_inline void count(__u32 reason)
{
	__u64 *n = rx_stats.lookup(&reason);

	if (n)
		*n += 1;
}

/* One datagram: its header at `at` in the skb, `len` bytes in all (header included).
 * Returns its reason; only PLACED writes, and only inside the bound region. */
static __always_inline __u32 place(struct __sk_buff *skb, __u32 at, __u32 len,
				   __u32 job, __u32 port, __u32 saddr)
{
	struct tailcut_bl_hdr h;
	struct tailcut_rx_key key = {};
	struct tailcut_rx_region *st;
	struct tailcut_rx_range *buf;
	__u32 *region, index;
	__u32 start, end, total, n, thr, what;
	__u64 range, word, bit, old, before, bytes, at_region;

	if (len < sizeof(h) + 4 || bpf_skb_load_bytes(skb, at, &h, sizeof(h)))
		return TAILCUT_RX_SHORT;
	if (h.magic != bpf_htonl(TAILCUT_BL_MAGIC))
		return TAILCUT_RX_BAD_MAGIC;
	if (h.version != TAILCUT_BL_VERSION)
		return TAILCUT_RX_BAD_VERSION;
	if ((h.flags & ~TAILCUT_BL_FLAGS) || h.reserved)
		return TAILCUT_RX_BAD_FLAGS;
	if (h.kind != KIND_PUSH && h.kind != KIND_PARAMS)
		return TAILCUT_RX_BAD_KIND;
	start = bpf_ntohl(h.start);
	end = bpf_ntohl(h.end);
	total = bpf_ntohl(h.total);
	if (end <= start || end > total)
		return TAILCUT_RX_BAD_RANGE;
	n = end - start;
	/* n < 2^32 / 4 before the product is trusted: a huge range is a bad length anyway */
	if (n > TAILCUT_RX_STRIDE || len - sizeof(h) != 4 * n)
		return TAILCUT_RX_BAD_LENGTH;
	if (start % TAILCUT_RX_STRIDE ||
	    end != (total - start < TAILCUT_RX_STRIDE ? total : start + TAILCUT_RX_STRIDE))
		return TAILCUT_RX_MISALIGNED;
	if (h.job != bpf_htonl(job))
		return TAILCUT_RX_UNKNOWN_JOB;

	key.job = job;
	key.message = bpf_ntohl(h.message);
	key.port = port;
	region = rx_bind.lookup(&key);
	if (!region)
		return TAILCUT_RX_UNBOUND;
	st = rx_regions.lookup(region);
	/* The loader arms a region before binding it and unbinds it before reuse; a
	 * binding whose region says otherwise (a race with release) is not ours. */
	if (!st || !st->armed || st->job != key.job || st->message != key.message ||
	    st->port != port)
		return TAILCUT_RX_UNBOUND;
	if (st->source && st->source != saddr)
		return TAILCUT_RX_FOREIGN_SOURCE;
	if (st->kind != h.kind)
		return TAILCUT_RX_KIND_MISMATCH;
	if (st->total != total)
		return TAILCUT_RX_TOTAL_MISMATCH;
	if (total > RX_CAPACITY)   /* the map is writable: never trust the bound total */
		return TAILCUT_RX_OUT_OF_RANGE;

	/* The checks above make range < RANGES, region < REGIONS and bytes <= RANGE_BYTES;
	 * all three are checked again here, explicitly (the bound total and the binding
	 * come from maps user space writes), and the empty asm keeps clang from folding
	 * the checks away. The copy below writes bytes <= RANGE_BYTES at offset 0 of
	 * element region * RANGES + range of rx_data, this region's range: the verifier
	 * holds the length to the element's size, the lookup the index to the map. */
	range = start / TAILCUT_RX_STRIDE;
	bytes = 4 * n;
	at_region = *region;
	asm volatile("" : "+r"(range), "+r"(bytes), "+r"(at_region));
	if (range >= TAILCUT_RX_RANGES || at_region >= TAILCUT_RX_REGIONS)
		return TAILCUT_RX_OUT_OF_RANGE;
	if (bytes < 4 || bytes > RX_RANGE_BYTES)
		return TAILCUT_RX_BAD_LENGTH;
	index = at_region * TAILCUT_RX_RANGES + range;
	buf = rx_data.lookup(&index);
	if (!buf)
		return TAILCUT_RX_OUT_OF_RANGE;
	word = range / 64;
	bit = 1ULL << (range & 63);
	/* Already placed: consumed without a copy (a racing copy of the same range is
	 * caught by the fetch_or below and writes the same datagram's bytes). */
	if (*(volatile __u64 *)&st->bits[word] & bit) {
		__sync_fetch_and_add(&st->duplicates, 1);
		return TAILCUT_RX_DUPLICATE;
	}
	if (bpf_skb_load_bytes(skb, at + sizeof(h), buf->v, bytes))
		return TAILCUT_RX_SHORT;
	/* Bits, then the byte mask, then the count: a reader that sees any of them (or the
	 * event) sees the copy. Fetch atomics are fully ordered. */
	old = __sync_fetch_and_or(&st->bits[word], bit);
	if (old & bit) {
		__sync_fetch_and_add(&st->duplicates, 1);
		return TAILCUT_RX_DUPLICATE;
	}
	st->arrived[range] = 1;
	st->last_ns = bpf_ktime_get_ns();
	__sync_fetch_and_add(&st->packets, 1);
	before = __sync_fetch_and_add(&st->counted, n);
	thr = st->threshold;
	if (thr < 1)
		thr = 1;
	if (thr > total)
		thr = total;
	what = 0;
	if (before < thr && before + n >= thr)
		what |= TAILCUT_RX_EV_P;
	if (before + n == total)
		what |= TAILCUT_RX_EV_COMPLETE;
	/* Not again what was emitted, nor what the loader marked as not wanted (a message
	 * already handed over, whose region stays bound a little for its late packets). */
	what &= ~(__u32)st->fired;
	if (what) {
		struct tailcut_rx_event ev = {
			.job = job, .message = key.message, .port = port, .region = *region,
			.counted = before + n, .total = total, .what = what,
			.seq = bpf_ntohl(h.seq), .ktime_ns = bpf_ktime_get_ns(),
		};

		__sync_fetch_and_or(&st->fired, what);
		rx_events.ringbuf_output(&ev, sizeof(ev), 0);
	}
	return TAILCUT_RX_PLACED;
}

int tailcut_rxring(struct __sk_buff *skb)
{
	struct iphdr ip;
	struct udphdr udp;
	struct tailcut_rx_receiver *rcv;
	__u32 l4, udp_len, payload, step, off, seg, i, reason, port, job;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return TC_ACT_UNSPEC;
	/* At clsact ingress skb->data is the Ethernet header (cls_bpf pushes it back). */
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) || ip.protocol != IPPROTO_UDP)
		return TC_ACT_UNSPEC;
	/* Fragments carry no UDP header of their own (and the sender never fragments). */
	if (ip.frag_off & bpf_htons(0x3fff) || ip.ihl < 5)
		return TC_ACT_UNSPEC;
	l4 = ETH_HLEN + ip.ihl * 4;
	if (bpf_skb_load_bytes(skb, l4, &udp, sizeof(udp)))
		return TC_ACT_UNSPEC;
	port = bpf_ntohs(udp.dest);
	rcv = rx_receivers.lookup(&port);
	if (!rcv || !rcv->served)
		return TC_ACT_UNSPEC;
	job = rcv->job;

	/* Addressed to us from here on. A GSO skb's UDP length is the whole payload's;
	 * its datagrams sit gso_size bytes apart, every one but the last that long. */
	udp_len = bpf_ntohs(udp.len);
	if (udp_len < sizeof(udp) + TAILCUT_BL_HDR_BYTES + 4 || l4 + udp_len > skb->len) {
		count(TAILCUT_RX_SHORT);
		return TC_ACT_SHOT;
	}
	payload = udp_len - sizeof(udp);
	step = payload;
	if (skb->gso_size && payload > skb->gso_size)
		step = skb->gso_size;
	if (step > RX_DATAGRAM) {   /* a datagram longer than any this stride makes */
		count(TAILCUT_RX_BAD_LENGTH);
		return TC_ACT_SHOT;
	}
	for (i = 0; i < TAILCUT_RX_DATAGRAMS; i++) {
		off = i * step;
		if (off >= payload)
			return TC_ACT_SHOT;   /* every datagram consumed */
		seg = payload - off;
		if (seg > step)
			seg = step;
		reason = place(skb, l4 + sizeof(udp) + off, seg, job, port, ip.saddr);
		if (reason == TAILCUT_RX_PLACED || reason == TAILCUT_RX_DUPLICATE) {
			count(reason);
			continue;
		}
		/* Not ours to take: the whole skb goes on, if nothing of it was taken;
		 * after placed datagrams it is dropped instead (the socket would count
		 * those again). */
		if (reason == TAILCUT_RX_UNKNOWN_JOB || reason == TAILCUT_RX_UNBOUND ||
		    reason == TAILCUT_RX_KIND_MISMATCH || reason == TAILCUT_RX_TOTAL_MISMATCH ||
		    reason == TAILCUT_RX_FOREIGN_SOURCE) {
			count(i == 0 ? reason : TAILCUT_RX_PASS_SPLIT);
			return i == 0 ? TC_ACT_UNSPEC : TC_ACT_SHOT;
		}
		count(reason);
		/* Malformed: nothing of it was written; the rest of the skb is not looked
		 * at (a hostile skb gets one verdict) and it is dropped. */
		return TC_ACT_SHOT;
	}
	/* More datagrams than any GSO skb holds: what is left was not looked at. */
	count(TAILCUT_RX_SHORT);
	return TC_ACT_SHOT;
}
