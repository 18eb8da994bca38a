/* The loss dropper: a tc program (clsact hook, direct-action) that drops each packet
 * with probability `loss`. tailcut uses it for a link's loss on kernels without netem.
 * Loader: tailcut/datapath/dropper.py. Shared types and the map: dropper.h. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>

#include "dropper.h"

/* The loader compiles one program per loss with
 *   -DTAILCUT_DROP_THRESHOLD=<round(loss * 2^32), saturated to 0xffffffff>U
 * e.g. loss 0.05 -> 214748365U. A packet is dropped when a uniform u32 is below the
 * threshold. loss = 1 would need 2^32, which a u32 cannot hold, so 0xffffffff means
 * "drop everything" (it only differs from "< 0xffffffff" with probability 2^-32). */
#ifndef TAILCUT_DROP_THRESHOLD
#error "compile with -DTAILCUT_DROP_THRESHOLD=<round(loss * 2^32)>U, as tailcut/datapath/dropper.py does"
#endif

BPF_PERCPU_ARRAY(drop_counts, struct tailcut_drop_counts, TAILCUT_DROP_SLOTS);

int tailcut_drop(struct __sk_buff *skb)
{
	const __u32 threshold = TAILCUT_DROP_THRESHOLD;
	/* The attachment's slot: cls_bpf set it from the filter's classid. */
	__u32 slot = skb->tc_classid;
	struct tailcut_drop_counts *counts = drop_counts.lookup(&slot);
	int drop = threshold == 0xffffffff || bpf_get_prandom_u32() < threshold;

	if (counts) {
		if (drop)
			counts->dropped++;
		else
			counts->passed++;
	}
	/* Kept packets return TC_ACT_UNSPEC, not TC_ACT_OK: in direct-action mode OK
	 * would end the filter chain, and a CadentFlow classifier on the same hook
	 * (which sets skb->priority) must still see every packet we keep. */
	/* A dropped packet is STOLEN, not SHOT: at a sender's egress SHOT tells its socket
	 * (NET_XMIT_DROP), and TCP then sends the segment again as if nothing were lost,
	 * never counting a retransmission or waiting out a timeout. A loss on the wire is
	 * silent, and so is STOLEN (the kernel reports NET_XMIT_SUCCESS). */
	return drop ? TC_ACT_STOLEN : TC_ACT_UNSPEC;
}
