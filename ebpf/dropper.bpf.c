/* The loss dropper: a tc program (clsact hook, direct-action) that drops each packet
 * with probability `loss`. tailcut uses it for a link's loss on kernels without netem.
 * Loader: tailcut/datapath/dropper.py. Shared types and the map: dropper.h. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>

#include "dropper.h"

BPF_PERCPU_ARRAY(drop_counts, struct tailcut_drop_counts, TAILCUT_DROP_SLOTS);
BPF_ARRAY(drop_thresholds, __u32, TAILCUT_DROP_SLOTS);

int tailcut_drop(struct __sk_buff *skb)
{
	/* The attachment's slot: cls_bpf set it from the filter's classid. */
	__u32 slot = skb->tc_classid;
	struct tailcut_drop_counts *counts = drop_counts.lookup(&slot);
	__u32 *set = drop_thresholds.lookup(&slot);
	/* A packet is dropped when a uniform u32 is below the slot's threshold,
	 * round(loss * 2^32). loss = 1 would need 2^32, which a u32 cannot hold, so
	 * 0xffffffff means "drop everything" (it only differs from "< 0xffffffff" with
	 * probability 2^-32). No entry (a slot out of range): keep the packet. */
	__u32 threshold = set ? *set : 0;
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
