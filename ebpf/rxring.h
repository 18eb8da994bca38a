/* rxring.h: what the kernel receive path (rxring.bpf.c, a tc clsact ingress program)
 * shares with its loader (tailcut/datapath/rxring.py). The wire header is partial.h's
 * (struct tailcut_bl_hdr); BCC builds the Python view of every map from the structs
 * here, and the loader reads the two memory-mapped ones as numpy through those views:
 * no byte offset is written by hand anywhere else.
 *
 * Words: a *region* is one message's buffer (a message is bound to a region by the
 * receiving role before its packets come, as BEGIN allows); a *range* is one packet's
 * share of it, elements [i * STRIDE, min((i + 1) * STRIDE, total)), what partial.h
 * calls a slot.
 */
#ifndef TAILCUT_RXRING_H
#define TAILCUT_RXRING_H

#include "partial.h"

/* Compile-time constants, all -D cflags from the loader (rxring.compile_program):
 *   TAILCUT_RX_STRIDE   elements per full packet (the transport's packet_elements)
 *   TAILCUT_RX_RANGES   ranges per region, a multiple of 64 and at most MAX_RANGES:
 *                       the largest message a region holds is RANGES * STRIDE floats
 *   TAILCUT_RX_REGIONS  regions, messages bound at once
 * Only the port, the job and each message's binding are set at run time. */
#define TAILCUT_RX_MAX_RANGES   8192   /* partial.h's TAILCUT_BL_MAX_SLOTS */
#define TAILCUT_RX_MAX_REGIONS  1024
#define TAILCUT_RX_DATAGRAMS    64     /* datagrams walked in one GSO skb at most */
#define TAILCUT_RX_EVENTS_PAGES 16     /* ring buffer size in pages */
#define TAILCUT_RX_RECEIVERS    65536  /* rx_receivers: one entry per UDP port */

/* What an event says crossed (rx_regions' fired holds the same bits). */
#define TAILCUT_RX_EV_P        0x1   /* counted reached the region's threshold */
#define TAILCUT_RX_EV_COMPLETE 0x2   /* every range of the message arrived */

/* One receiver (a UDP port) served by the program. */
struct tailcut_rx_receiver {
	__u32 job;     /* the job whose packets are taken; others pass untouched */
	__u32 served;  /* 0: packets to this port are not looked at */
};

/* The binding of a message to a region. */
struct tailcut_rx_key {
	__u32 job;
	__u32 message;
	__u32 port;
};

/* One region's state, memory-mapped: the loader writes the binding fields (armed
 * last, before inserting the rx_bind entry), the program writes the rest. Fields
 * updated with atomics are 64 bits wide (BCC's clang emits only 64-bit fetch
 * atomics). Its size is a multiple of 8 (RANGES is a multiple of 64), so the regions
 * are back to back in the mapping and read as one numpy array of records. */
struct tailcut_rx_region {
	__u64 armed;        /* generation, nonzero while bound; written by the loader */
	__u32 job;          /* the bound message's key, as in rx_bind */
	__u32 message;
	__u32 port;
	__u32 kind;         /* the message's kind (BEGIN's): packets of another are refused */
	__u32 total;        /* elements in the message (BEGIN's); <= RANGES * STRIDE */
	__u32 threshold;    /* ceil(p * total), in 1..total: the P event fires at it */
	__u32 source;       /* the peer's IPv4 address as it lies in the IP header (0:
	                     * any): another source's datagrams are passed on */
	__u32 spare;
	__u64 counted;      /* distinct elements placed */
	__u64 packets;      /* distinct ranges placed */
	__u64 duplicates;   /* datagrams of a range already placed (consumed, not copied) */
	__u64 fired;        /* TAILCUT_RX_EV_* bits already emitted */
	__u64 last_ns;      /* bpf_ktime_get_ns() of the last range placed */
	__u64 bits[TAILCUT_RX_RANGES / 64];  /* bit i: range i placed (set after the copy) */
	__u8 arrived[TAILCUT_RX_RANGES];     /* 1: range i placed (set after the bit): the
	                                      * mask numpy reads without unpacking bits */
};

/* One range of a region's values: element e of the message at v[e % STRIDE] of range
 * e / STRIDE, a little-endian float32's bits as on the wire (declared __u32: the
 * program only copies them, and the loader's reader of BCC's type descriptions knows
 * no float). Padded to 8 bytes, as the kernel lays array elements out: with an even
 * stride (360 for a 1500-byte MTU) a region's ranges are one flat float32 vector.
 * One map element per range, not per region: BCC generates code per array element
 * of a map's value type, and a region-sized value made its compile take 10 s at 256
 * ranges, 38 s at 512 and 67 s at 1024. */
struct tailcut_rx_range {
	__u32 v[TAILCUT_RX_STRIDE + (TAILCUT_RX_STRIDE & 1)];
};

/* u32/u64 (not __u32/__u64): BCC builds the Python view of a ring buffer record only
 * from its own type names. */
struct tailcut_rx_event {
	u32 job;
	u32 message;
	u32 port;
	u32 region;
	u32 counted;   /* elements placed, including the crossing datagram's */
	u32 total;
	u32 what;      /* TAILCUT_RX_EV_* that this datagram crossed (both at p = 1) */
	u32 seq;       /* seq of the crossing datagram */
	u64 ktime_ns;  /* bpf_ktime_get_ns() (CLOCK_MONOTONIC) at the crossing datagram */
};

/* Per-CPU verdict counters, indexed by reason: every datagram to a served port lands
 * in exactly one, up to the first one in an skb that is not consumed. The first two
 * are consumed (the skb is dropped, TC_ACT_SHOT, once all of it is); UNKNOWN_JOB,
 * UNBOUND, the two MISMATCHes and FOREIGN_SOURCE pass the skb on untouched
 * (TC_ACT_UNSPEC) if they are its first datagram; later in a GSO skb whose first
 * datagrams were placed, the rest is dropped (PASS_SPLIT: passing it whole would hand
 * the socket those placed ones again); every other reason is a malformed datagram:
 * nothing is written, and the skb is dropped. */
enum tailcut_rx_reason {
	TAILCUT_RX_PLACED = 0,      /* a new range: its payload was copied and counted */
	TAILCUT_RX_DUPLICATE,       /* range already placed: consumed, nothing written */
	TAILCUT_RX_UNKNOWN_JOB,     /* another job's datagram: passed on */
	TAILCUT_RX_UNBOUND,         /* a message bound to no region (yet): passed on */
	TAILCUT_RX_KIND_MISMATCH,   /* not the bound message's kind: passed on (a binding
	                             * made ahead of BEGIN guessed wrong; the socket checks) */
	TAILCUT_RX_TOTAL_MISMATCH,  /* not the bound message's total: passed on, the same */
	TAILCUT_RX_FOREIGN_SOURCE,  /* not from the bound message's peer: passed on (the
	                             * socket's receiver refuses it) */
	TAILCUT_RX_SHORT,           /* truncated: no room for the header or the payload */
	TAILCUT_RX_BAD_MAGIC,
	TAILCUT_RX_BAD_VERSION,
	TAILCUT_RX_BAD_FLAGS,       /* unknown flag bits or reserved != 0 */
	TAILCUT_RX_BAD_KIND,        /* not PUSH or PARAMS */
	TAILCUT_RX_BAD_RANGE,       /* end <= start or end > total */
	TAILCUT_RX_BAD_LENGTH,      /* payload bytes != 4 * (end - start) */
	TAILCUT_RX_MISALIGNED,      /* range is not exactly one range's */
	TAILCUT_RX_OUT_OF_RANGE,    /* the range lies outside the region's buffer */
	TAILCUT_RX_PASS_SPLIT,      /* a datagram to pass on after placed ones in its skb:
	                             * dropped (a loss the sender repairs) */
	TAILCUT_RX_REASONS
};

/* Map rx_receivers
 *   type         BPF_MAP_TYPE_ARRAY (512 KiB)
 *   key          __u32, the receiver's UDP port (host byte order)
 *   value        struct tailcut_rx_receiver
 *   max_entries  TAILCUT_RX_RECEIVERS
 *   written by   tailcut/datapath/rxring.py (serve / stop_serving)
 *
 * Map rx_bind
 *   type         BPF_MAP_TYPE_HASH
 *   key          struct tailcut_rx_key (job, message, port)
 *   value        __u32, the region the message is bound to
 *   max_entries  TAILCUT_RX_REGIONS
 *   written by   rxring.py: Ring.bind() inserts after writing the region, release()
 *                deletes before the region is reused
 *
 * Map rx_regions
 *   type         BPF_MAP_TYPE_ARRAY, BPF_F_MMAPABLE
 *   key          __u32, region
 *   value        struct tailcut_rx_region
 *   max_entries  TAILCUT_RX_REGIONS
 *   written by   rxring.py through the mapping (binding fields), tailcut_rxring (the rest)
 *   read by      rxring.py through the mapping, as numpy (no syscall)
 *
 * Map rx_data
 *   type         BPF_MAP_TYPE_ARRAY, BPF_F_MMAPABLE
 *   key          __u32, region * TAILCUT_RX_RANGES + range
 *   value        struct tailcut_rx_range
 *   max_entries  TAILCUT_RX_REGIONS * TAILCUT_RX_RANGES
 *   written by   tailcut_rxring only: bpf_skb_load_bytes() of each new range's payload
 *   read by      rxring.py through the mapping: Message.values is a float32 view
 *
 * Map rx_events
 *   type         BPF_MAP_TYPE_RINGBUF, TAILCUT_RX_EVENTS_PAGES pages
 *   record       struct tailcut_rx_event: one when a message's count reaches its
 *                threshold, one when it is complete (one with both bits at p = 1)
 *
 * Map rx_stats
 *   type         BPF_MAP_TYPE_PERCPU_ARRAY
 *   key          __u32, enum tailcut_rx_reason
 *   value        __u64 datagrams, per CPU
 *   max_entries  TAILCUT_RX_REASONS
 */

#endif /* TAILCUT_RXRING_H */
