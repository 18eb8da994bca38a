/* dropper.h: what the tc loss dropper (dropper.bpf.c) shares with its loader,
 * tailcut/datapath/dropper.py. BCC builds the Python view of the map from these
 * C types, so no byte offsets are written by hand anywhere. */
#ifndef TAILCUT_DROPPER_H
#define TAILCUT_DROPPER_H

/* Attachment slots of the program. One program serves every interface a process drops
 * on, whatever its loss; each attachment gets its own slot,
 * which the loader passes as the tc filter's classid. cls_bpf copies that classid's
 * minor into skb->tc_classid before running the program, so the shared program knows
 * which attachment a packet went through. Slot 0 is never handed out. */
/* 4096: a 1,000-pod job with loss on every access link attaches 2,000 (both ends). */
#define TAILCUT_DROP_SLOTS 4096

struct tailcut_drop_counts {
	__u64 passed;   /* packets handed on (TC_ACT_UNSPEC) */
	__u64 dropped;  /* packets dropped (TC_ACT_SHOT) */
};

/* Map drop_counts
 *   type         BPF_MAP_TYPE_PERCPU_ARRAY (per CPU: counting needs no atomics)
 *   key          __u32, an attachment's slot (its tc filter classid, 1..SLOTS-1)
 *   value        struct tailcut_drop_counts, one per CPU
 *   max_entries  TAILCUT_DROP_SLOTS
 *   written by   tailcut_drop (dropper.bpf.c): one increment per packet
 *   read by      AttachedDropper.counts() (tailcut/datapath/dropper.py), summed over
 *                CPUs; attach() zeroes a slot before handing it out again
 *
 * Map drop_thresholds
 *   type         BPF_MAP_TYPE_ARRAY
 *   key          __u32, an attachment's slot
 *   value        __u32, round(loss * 2^32), saturated to 0xffffffff ("drop all")
 *   max_entries  TAILCUT_DROP_SLOTS
 *   written by   tailcut/datapath/dropper.py when it hands the slot out
 *   read by      tailcut_drop, once per packet
 */

#endif /* TAILCUT_DROPPER_H */
