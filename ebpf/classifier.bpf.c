/* The CadentFlow tag classifier: a tc program (clsact egress, direct-action) that reads
 * a packet's DSCP and puts it into the HTB priority class of that tag by setting
 * skb->priority = major:minor, which HTB honours before its own filters.
 * Loader: tailcut/datapath/classifier.py. Shared constants and the map: classifier.h. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>

#include "classifier.h"

#ifndef TAILCUT_HTB_MAJOR
#error "compile with -DTAILCUT_HTB_MAJOR=<the root HTB qdisc's major, 1>, as tailcut/datapath/classifier.py does"
#endif

#define ETH_HLEN_ 14

BPF_PERCPU_ARRAY(class_counts, struct tailcut_class_counts,
		 TAILCUT_CLASS_SLOTS * (TAILCUT_PRIORITY_LEVELS + 1));

int tailcut_classify(struct __sk_buff *skb)
{
	__u8 ethertype[2];
	__u8 tos;
	__u32 level = TAILCUT_PRIORITY_LEVELS; /* untagged */
	/* The attachment's slot: cls_bpf set it from the filter's classid. */
	__u32 key;
	struct tailcut_class_counts *counts;

	/* Byte loads keep the check independent of the host's byte order. */
	if (bpf_skb_load_bytes(skb, 12, ethertype, 2) == 0 &&
	    ethertype[0] == 0x08 && ethertype[1] == 0x00 &&
	    bpf_skb_load_bytes(skb, ETH_HLEN_ + 1, &tos, 1) == 0) {
		__u32 dscp = tos >> 2;
		if (dscp >= TAILCUT_DSCP_BASE &&
		    dscp < TAILCUT_DSCP_BASE + TAILCUT_PRIORITY_LEVELS)
			level = dscp - TAILCUT_DSCP_BASE;
	}
	if (level < TAILCUT_PRIORITY_LEVELS)
		skb->priority = (TAILCUT_HTB_MAJOR << 16) | (TAILCUT_CLASS_BASE + level);

	key = skb->tc_classid * (TAILCUT_PRIORITY_LEVELS + 1) + level;
	counts = class_counts.lookup(&key);
	if (counts) {
		counts->packets++;
		counts->bytes += skb->len;
	}
	/* TC_ACT_UNSPEC: hand the packet on unchanged, so a classifier added later at a
	 * higher preference still sees it; HTB reads skb->priority afterwards. */
	return TC_ACT_UNSPEC;
}
