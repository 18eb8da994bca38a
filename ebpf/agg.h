/* In-network aggregation at a rack's ToR: wire header, maps and counters shared by
 * agg.bpf.c and its loader (tailcut/datapath/agg.py; tailcut/transports/agg.py packs
 * and parses this struct and these defines, so the two sides cannot drift apart).
 *
 * One UDP datagram is a 32-byte header and `count` little-endian s32 values: slot
 * `slot` of the gradient, elements [slot * STRIDE, slot * STRIDE + count), in Q8.24
 * (v / 2^24, as the hot-parameter store's; see tor.h).
 *
 *   ADD       (worker -> its rack's aggregation address, port TAILCUT_AGG_PORT): the
 *             worker's gradient for the slot at `iteration`. The ToR adds it into the
 *             slot's sum. The rack's last member to add forwards the sum in its own
 *             packet to the PS (op AGGREGATE, to ps_address:TAILCUT_AGG_PORT);
 *             the others' packets end at the ToR. No answer: a lost ADD is what
 *             FLUSH is for.
 *   AGGREGATE (ToR -> PS): the sum of `members` (a bitmap of worker indices) for the
 *             slot at `iteration`, from rack `rack`.
 *   FLUSH     (PS -> ToR): a payload of `count` zeros, the room for the answer. The
 *             ToR closes the slot's iteration (later ADDs of it are late) and answers
 *             in place with the sum of whoever is in (status OK, `members` saying who;
 *             NOT_READY while an ADD already taken is still being added: ask again;
 *             STALE once the iteration is gone; an answer echoes the iteration
 *             asked about). An iteration the ring never reached at that slot
 *             (every ADD two iterations before was lost) is answered OK, empty.
 *
 * A slot keeps three iterations in a ring (it % 3): the ADDs of iteration i clear
 * the entry of i - 1 for i + 2, once i - 1 is finished (complete or flushed).
 */
#ifndef TAILCUT_AGG_H
#define TAILCUT_AGG_H

#define TAILCUT_AGG_MAGIC 0x54434147   /* "TCAG" */
#define TAILCUT_AGG_VERSION 1
#define TAILCUT_AGG_PORT 7101
#define TAILCUT_AGG_HEADER 32

#define TAILCUT_AGG_OP_ADD 1
#define TAILCUT_AGG_OP_AGGREGATE 2
#define TAILCUT_AGG_OP_FLUSH 3

/* A FLUSH answer's status. */
#define TAILCUT_AGG_OK 1
#define TAILCUT_AGG_NOT_READY 2
#define TAILCUT_AGG_STALE 3

#define TAILCUT_AGG_FRAC_BITS 24     /* Q8.24 */
#define TAILCUT_AGG_MAX_WORKERS 32   /* one bit each in an entry's claim word */
#define TAILCUT_AGG_PS_WORKER 255    /* the header's worker field for the PS */

/* Elements per slot: (MTU 1500 - IPv4 20 - UDP 8 - header 32) / 4. */
#define TAILCUT_AGG_STRIDE 360
/* At most 368,640 elements (1024 slots of 360). */
#define TAILCUT_AGG_SLOTS 1024
#define TAILCUT_AGG_RING 3

/* Where a packet arrived (tailcut_agg_port.kind), found by the filter's classid. */
#define TAILCUT_AGG_PORT_WORKER 1    /* a member's own port: only that worker may add */
#define TAILCUT_AGG_PORT_PS 2        /* toward the PS (its port, or the uplink): flushes */
#define TAILCUT_AGG_PORTS 64

/* Why a packet got the verdict it got: per-CPU counters in agg_stats, one per packet
 * addressed to the aggregation address (others are not counted and pass untouched). */
enum tailcut_agg_reason {
	TAILCUT_AGG_ADDED,  /* added; the packet ends here */
	TAILCUT_AGG_FORWARDED,  /* added, the last member: forwarded the sum to the PS */
	TAILCUT_AGG_FLUSHED,  /* answered a FLUSH with the sum so far */
	TAILCUT_AGG_R_NOT_READY,  /* a FLUSH while an add was in flight: answered NOT_READY */
	TAILCUT_AGG_R_STALE,  /* a FLUSH of an iteration gone: answered STALE */
	TAILCUT_AGG_LATE,  /* an ADD of an iteration flushed or gone: dropped */
	TAILCUT_AGG_DUPLICATE,  /* an ADD from a member already in: dropped */
	TAILCUT_AGG_EARLY,  /* an ADD of an iteration the ring has not reached: dropped */
	TAILCUT_AGG_SHORT,  /* shorter than IPv4 + UDP + header */
	TAILCUT_AGG_BAD_MAGIC,
	TAILCUT_AGG_BAD_VERSION,
	TAILCUT_AGG_BAD_OP,  /* unknown op, a status or reserved field set */
	TAILCUT_AGG_BAD_SLOT,  /* slot past the gradient */
	TAILCUT_AGG_BAD_COUNT,  /* count is not the slot's length */
	TAILCUT_AGG_BAD_LENGTH,  /* the UDP payload is not header + 4 * count */
	TAILCUT_AGG_UNKNOWN_JOB,
	TAILCUT_AGG_BAD_WORKER,  /* not a member of this rack's group */
	TAILCUT_AGG_WRONG_PORT,  /* an op or worker field the arriving port may not carry */
	TAILCUT_AGG_CONTENDED,  /* the claim kept changing under us: dropped */
	TAILCUT_AGG_NO_PORT,  /* arrived on a port the loader did not describe */
	TAILCUT_AGG_BAD_IP,  /* a fragment, or IPv4 options (senders use neither) */
	TAILCUT_AGG_NO_ROUTE,  /* no next hop toward the PS set yet: dropped */
	TAILCUT_AGG_SEND_FAILED,  /* the sum or answer could not be built: dropped (after an
	                           * answer, counted besides the FLUSH's own reason) */
	TAILCUT_AGG_REASONS
};

struct tailcut_agg_hdr {
	__be32 magic;      /* TAILCUT_AGG_MAGIC */
	__u8 version;      /* TAILCUT_AGG_VERSION */
	__u8 op;           /* TAILCUT_AGG_OP_* */
	__u8 status;       /* 0 in a request; TAILCUT_AGG_OK ... in an answer */
	__u8 worker;       /* the adding worker, or TAILCUT_AGG_PS_WORKER */
	__be32 job;        /* job id: the first 4 bytes of sha256(job name), as partial.h */
	__be32 iteration;
	__be32 slot;
	__be32 count;      /* values in the payload (the slot's length) */
	__be32 members;    /* AGGREGATE and FLUSH answers: bit w set if worker w is in the sum */
	__be32 rack;       /* AGGREGATE and FLUSH answers: the rack; 0 in a request */
};

struct tailcut_agg_config {
	__u32 job;
	__u32 members;     /* bitmap of this rack's workers: the group whose sum is forwarded */
	__u32 expected;    /* how many they are */
	__u32 elements;    /* gradient elements; the last slot may be short */
	__u32 slots;       /* ceil(elements / STRIDE) */
	__u32 rack;
	__u32 address;     /* this rack's aggregation address, network order */
	__u32 ps_address;  /* where sums go, network order */
	__u8 next_hop[6];  /* MAC toward the PS: its own (in this rack) or the spine's port;
	                    * all zero: not known yet, sums are dropped (no_route) */
	__u16 reserved;
};

struct tailcut_agg_port {
	__u32 kind;        /* TAILCUT_AGG_PORT_*; 0: not described */
	__u32 workers;     /* a worker's port: bit w of the one worker who may add here */
};

/* Per slot and ring entry. claim = iteration << 33 | closed << 32 | bitmap of the
 * workers whose ADD was taken; `added` counts those whose values are in the sum
 * (an ADD claims first, then adds, then counts). Atomics are 64-bit: BCC's clang
 * emits no narrower fetch operations. */
struct tailcut_agg_entry {
	__u64 claim;
	__u64 added;
};

struct tailcut_agg_sum {
	__s64 v[TAILCUT_AGG_STRIDE];
};

#endif
