/* classifier.h: what the CadentFlow tag classifier (classifier.bpf.c) shares with its
 * loader, tailcut/datapath/classifier.py. BCC builds the Python view of the map from
 * these C types, so no byte offsets are written by hand anywhere.
 *
 * The tag is the IPv4 DSCP the sender sets with IP_TOS. Priority level p (0 = most
 * urgent) travels as DSCP TAILCUT_DSCP_BASE + p and goes to HTB class
 * <TAILCUT_HTB_MAJOR>:<TAILCUT_CLASS_BASE + p> (1:20 .. 1:27, hex minors, as
 * tailcut/net/shaping.py builds them). Any other DSCP, and non-IPv4 packets, keep
 * skb->priority as it is, so HTB sends them to its default class 1:10. */
#ifndef TAILCUT_CLASSIFIER_H
#define TAILCUT_CLASSIFIER_H

#define TAILCUT_PRIORITY_LEVELS 8
#define TAILCUT_DSCP_BASE 8        /* CS1; levels use DSCP 8..15 */
#define TAILCUT_CLASS_BASE 0x20    /* HTB minors 0x20..0x27 */
#define TAILCUT_CLASS_SLOTS 256    /* attachments sharing the program */

struct tailcut_class_counts {
	__u64 packets;
	__u64 bytes;
};

/* Map class_counts
 *   type         BPF_MAP_TYPE_PERCPU_ARRAY (per CPU: counting needs no atomics)
 *   key          __u32, slot * (TAILCUT_PRIORITY_LEVELS + 1) + level, where slot is
 *                the attachment's tc filter classid (1..SLOTS-1) and level
 *                TAILCUT_PRIORITY_LEVELS counts untagged packets (default class)
 *   value        struct tailcut_class_counts, one per CPU
 *   max_entries  TAILCUT_CLASS_SLOTS * (TAILCUT_PRIORITY_LEVELS + 1)
 *   written by   tailcut_classify (classifier.bpf.c): one increment per packet
 *   read by      AttachedClassifier.counts() (tailcut/datapath/classifier.py), summed
 *                over CPUs; attach() zeroes a slot's entries before handing it out
 */

#endif /* TAILCUT_CLASSIFIER_H */
