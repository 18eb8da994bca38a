/* partial.h: the bounded-loss wire header and what the XDP counter (partial.bpf.c)
 * shares with its loader (tailcut/datapath/partial.py) and with the transport
 * (tailcut/transports/wire.py). Python builds its view of every struct here from this
 * file (the wire header through ctypes, the maps through BCC): no byte offset is
 * written by hand anywhere else. Documented for people in docs/bounded-loss.md.
 *
 * Only fixed-width types appear in tailcut_bl_hdr, one field per line, because
 * tailcut/transports/wire.py reads that struct's declaration to build its ctypes view.
 */
#ifndef TAILCUT_PARTIAL_H
#define TAILCUT_PARTIAL_H

/* ---- The wire format: one UDP datagram = this header + (end - start) float32s ----
 *
 * Every field is big-endian (network order), so a hex dump reads naturally. The
 * payload is (end - start) little-endian IEEE-754 float32 values, elements
 * [start, end) of the message's vector; no float is ever split across packets.
 * With a 1500-byte MTU a datagram holds 1500 - 20 (IP) - 8 (UDP) - 32 (this header)
 * = 1440 payload bytes = 360 floats.
 */
#define TAILCUT_BL_MAGIC   0x54434c42  /* "TCLB" */
#define TAILCUT_BL_VERSION 1

/* flags: every other bit must be 0 */
#define TAILCUT_BL_F_RETX 0x01  /* a retransmission of a range sent before */
#define TAILCUT_BL_F_LAST 0x02  /* the last packet of a pass over the message */
#define TAILCUT_BL_FLAGS  0x03  /* every known flag: RETX | LAST */

struct tailcut_bl_hdr {
	__be32 magic;     /* TAILCUT_BL_MAGIC */
	__u8 version;     /* TAILCUT_BL_VERSION */
	__u8 flags;       /* TAILCUT_BL_F_* */
	__u8 kind;        /* tailcut.transports.base.Kind: 2 PUSH, 3 PARAMS */
	__u8 reserved;    /* 0 */
	__be32 job;       /* job id: the first 4 bytes of sha256(job name) */
	__be32 message;   /* message id: (peer id << 16) | per-peer counter */
	__be32 seq;       /* transmission number in the message, 0, 1, ...; retransmits get new ones */
	__be32 start;     /* first element index of the payload */
	__be32 end;       /* one past the last element; start < end <= total */
	__be32 total;     /* elements in the whole message */
} __attribute__((packed));

#define TAILCUT_BL_HDR_BYTES 32
_Static_assert(sizeof(struct tailcut_bl_hdr) == TAILCUT_BL_HDR_BYTES,
	       "the wire header is 32 bytes");

/* ---- The XDP counter ----
 *
 * A packet's slot is start / STRIDE, where STRIDE (elements per full packet) is the
 * one compile-time constant the sender and the counter agree on (the transport option
 * packet_elements). A packet is counted only if its range is exactly that slot's:
 * start % STRIDE == 0 and end == min(start + STRIDE, total). So each slot covers one
 * fixed range and is counted once, however often it arrives and whatever its seq. */
#define TAILCUT_BL_MAX_SLOTS   8192   /* packets per message: 8192 * 360 floats = 11.8 MB */
#define TAILCUT_BL_SLOT_WORDS  (TAILCUT_BL_MAX_SLOTS / 64)
#define TAILCUT_BL_MESSAGES    256    /* messages tracked at once per program */
#define TAILCUT_BL_EVENTS_PAGES 16    /* ring buffer size in pages */
#define TAILCUT_BL_RECEIVERS   65536  /* bl_receivers: one entry per UDP port */
#define TAILCUT_BL_PPM         1000000

/* What one receiver asks of the counter, set at run time by the loader, so that one
 * compiled program serves every receiver (port) on a host or node. */
struct tailcut_bl_receiver {
	__u32 job;     /* packets of other jobs to this port: TAILCUT_BL_UNKNOWN_JOB */
	__u32 p_ppm;   /* p * 1e6, in 1..TAILCUT_BL_PPM: fire at ceil(p * total); 0: the
	                * port is not served */
};

struct tailcut_bl_key {
	__u32 job;
	__u32 message;
	__u32 port;    /* the receiver's: two receivers' messages never share an entry */
};

/* Fields updated with atomics are 64 bits wide: BCC's clang only emits 64-bit
 * atomic fetch operations. */
struct tailcut_bl_state {
	__u64 slots[TAILCUT_BL_SLOT_WORDS];  /* bit s set: slot s arrived */
	__u64 first_ns;    /* bpf_ktime_get_ns() of the message's first packet */
	__u64 total;       /* from the first packet; later ones must agree */
	__u64 threshold;   /* ceil(p * total) elements, at least 1 */
	__u64 counted;     /* distinct elements arrived */
	__u64 packets;     /* packets counted (distinct slots) */
	__u64 duplicates;  /* packets whose slot was already set */
	__u64 fired;       /* 1 once the event was emitted */
};

/* u32/u64 (not __u32/__u64): BCC builds the Python view of a ring buffer record only
 * from its own type names. */
struct tailcut_bl_event {
	u32 job;
	u32 message;
	u32 counted;   /* elements counted, including the crossing packet */
	u32 total;
	u32 seq;       /* seq of the packet that crossed p * total */
	u32 slot;
	u64 ktime_ns;  /* bpf_ktime_get_ns() (CLOCK_MONOTONIC) at the crossing packet */
	u32 port;      /* the receiver's UDP port */
	u32 reserved;  /* 0 */
};

/* Per-CPU verdict counters, indexed by reason. Every packet to the port lands in
 * exactly one of them. */
enum tailcut_bl_reason {
	TAILCUT_BL_COUNTED = 0,     /* a new slot: its elements were counted */
	TAILCUT_BL_DUPLICATE,       /* slot already counted (retransmit or duplicate) */
	TAILCUT_BL_SHORT,           /* truncated: no room for the header or the payload */
	TAILCUT_BL_BAD_MAGIC,
	TAILCUT_BL_BAD_VERSION,
	TAILCUT_BL_BAD_FLAGS,       /* unknown flag bits or reserved != 0 */
	TAILCUT_BL_BAD_RANGE,       /* end <= start, end > total, or total too big */
	TAILCUT_BL_BAD_LENGTH,      /* payload bytes != 4 * (end - start) */
	TAILCUT_BL_MISALIGNED,      /* range is not exactly one slot's */
	TAILCUT_BL_UNKNOWN_JOB,
	TAILCUT_BL_TOTAL_MISMATCH,  /* total differs from the message's first packet */
	TAILCUT_BL_TABLE_FULL,      /* no room for a new message in bl_messages */
	TAILCUT_BL_REASONS
};

/* Map bl_receivers
 *   type         BPF_MAP_TYPE_ARRAY (512 KiB)
 *   key          __u32, the receiver's UDP port (host byte order)
 *   value        struct tailcut_bl_receiver
 *   max_entries  TAILCUT_BL_RECEIVERS
 *   written by   tailcut/datapath/partial.py (serve / stop_serving); packets to a port
 *                whose entry has p_ppm 0 are not looked at
 *
 * Map bl_messages
 *   type         BPF_MAP_TYPE_HASH
 *   key          struct tailcut_bl_key (job, message, port)
 *   value        struct tailcut_bl_state
 *   max_entries  TAILCUT_BL_MESSAGES
 *   written by   tailcut_partial (partial.bpf.c): creates an entry on a message's first
 *                well-formed packet, sets slot bits and counts with atomics
 *   read by      tailcut/datapath/partial.py, which deletes an entry once the
 *                transport is done with the message
 *
 * Map bl_events
 *   type         BPF_MAP_TYPE_RINGBUF, TAILCUT_BL_EVENTS_PAGES pages
 *   record       struct tailcut_bl_event, one per message, when counted >= threshold
 *   written by   tailcut_partial; read by Counter.poll() in partial.py
 *
 * Map bl_zero
 *   type         BPF_MAP_TYPE_ARRAY, one struct tailcut_bl_state, all zero, never written:
 *                the template tailcut_partial copies into bl_messages for a new message
 *
 * Map bl_stats
 *   type         BPF_MAP_TYPE_PERCPU_ARRAY
 *   key          __u32, enum tailcut_bl_reason
 *   value        __u64 packets, per CPU
 *   max_entries  TAILCUT_BL_REASONS
 *   written by   tailcut_partial; read (summed over CPUs) by Counter.stats()
 */

#endif /* TAILCUT_PARTIAL_H */
