/* The ToR's hot-parameter store: wire header, maps and counters shared by tor.bpf.c
 * and its loader (tailcut/datapath/tor.py; tailcut/transports/hot.py parses this
 * struct and these defines, so the two sides cannot drift apart).
 *
 * One UDP datagram to the job's hot-parameter address (port TAILCUT_TOR_PORT) is a
 * 32-byte header and `count` little-endian s32 values: slot `slot` of the hot vector,
 * elements [slot * STRIDE, slot * STRIDE + count). Values are fixed point, Q8.24:
 * v / 2^24 (step 6.0e-8, range +-128).
 *
 *   PULL  (worker -> ToR): payload of `count` zeros, the room for the reply; the ToR
 *         answers in place with the slot's values of iteration `iteration`, or with
 *         status NOT_READY (not every worker has pushed iteration - 1 yet: ask again)
 *         or STALE (that iteration is gone).
 *   PUSH  (worker -> ToR): the worker's update of the slot for `iteration`, already
 *         multiplied by -lr / workers; the ToR adds it, and when the last worker's
 *         push of the iteration arrives, the slot moves to iteration + 1. Answered
 *         with a header-only ACK (status OK, DUPLICATE or STALE).
 *   COUNTS (PS -> ToR): like PULL, but the reply carries how many pushes changed
 *         each element (its update count), as u32.
 */
#ifndef TAILCUT_TOR_H
#define TAILCUT_TOR_H

#define TAILCUT_TOR_MAGIC 0x54435452   /* "TCTR" */
#define TAILCUT_TOR_VERSION 1
#define TAILCUT_TOR_PORT 7100
#define TAILCUT_TOR_HEADER 32

#define TAILCUT_TOR_OP_PULL 1
#define TAILCUT_TOR_OP_PUSH 2
#define TAILCUT_TOR_OP_COUNTS 3

/* A reply's status. */
#define TAILCUT_TOR_OK 1
#define TAILCUT_TOR_NOT_READY 2
#define TAILCUT_TOR_STALE 3
#define TAILCUT_TOR_DUPLICATE 4

#define TAILCUT_TOR_FRAC_BITS 24     /* Q8.24 */
#define TAILCUT_TOR_MAX_WORKERS 32   /* one bit each in a slot's claim word */
#define TAILCUT_TOR_PS_WORKER 255    /* the header's worker field for the PS */

/* Elements per slot: (MTU 1500 - IPv4 20 - UDP 8 - header 32) / 4. */
#define TAILCUT_TOR_STRIDE 360
/* At most 65,520 hot elements (182 slots of 360). */
#define TAILCUT_TOR_SLOTS 182

/* Where a packet arrived: written by the loader per attached port, found by the
 * filter's classid (cls_bpf puts it in skb->tc_classid). */
#define TAILCUT_TOR_PORT_WORKER 1    /* a worker's own port: only that worker may write */
#define TAILCUT_TOR_PORT_PS 2        /* the PS's port: only the PS may read counts */
#define TAILCUT_TOR_PORT_UPLINK 3    /* from other racks: a worker of another rack */
#define TAILCUT_TOR_PORTS 64

/* Why a packet got the verdict it got: per-CPU counters in tor_stats, one per
 * packet addressed to the store (others are not counted and pass untouched). */
enum tailcut_tor_reason {
	TAILCUT_TOR_PULLED,  /* answered with values */
	TAILCUT_TOR_PUSHED,  /* added */
	TAILCUT_TOR_COUNTED,  /* answered with update counts */
	TAILCUT_TOR_R_NOT_READY,  /* a pull too early: answered NOT_READY */
	TAILCUT_TOR_R_STALE,  /* an iteration already gone: answered STALE */
	TAILCUT_TOR_R_DUPLICATE,  /* a push seen before: answered, not added again */
	TAILCUT_TOR_SHORT,  /* shorter than IPv4 + UDP + header */
	TAILCUT_TOR_BAD_MAGIC,
	TAILCUT_TOR_BAD_VERSION,
	TAILCUT_TOR_BAD_OP,
	TAILCUT_TOR_BAD_SLOT,  /* slot past the hot vector */
	TAILCUT_TOR_BAD_COUNT,  /* count is not the slot's length */
	TAILCUT_TOR_BAD_LENGTH,  /* the UDP payload is not header + 4 * count */
	TAILCUT_TOR_UNKNOWN_JOB,
	TAILCUT_TOR_BAD_WORKER,  /* not a worker of the job */
	TAILCUT_TOR_WRONG_PORT,  /* a worker field the arriving port may not carry */
	TAILCUT_TOR_FUTURE,  /* a push for an iteration the slot has not reached */
	TAILCUT_TOR_CONTENDED,  /* the claim kept changing under us: dropped, resent */
	TAILCUT_TOR_NO_PORT,  /* arrived on a port the loader did not describe */
	TAILCUT_TOR_BAD_IP,  /* a fragment, or IPv4 options (senders use neither) */
	TAILCUT_TOR_REPLY_FAILED,  /* answered, but the reply could not be built: dropped */
	TAILCUT_TOR_REASONS
};

struct tailcut_tor_hdr {
	__be32 magic;      /* TAILCUT_TOR_MAGIC */
	__u8 version;      /* TAILCUT_TOR_VERSION */
	__u8 op;           /* TAILCUT_TOR_OP_* */
	__u8 status;       /* 0 in a request; TAILCUT_TOR_OK ... in a reply */
	__u8 worker;       /* 0 .. workers - 1, or TAILCUT_TOR_PS_WORKER */
	__be32 job;        /* job id: the first 4 bytes of sha256(job name), as partial.h */
	__be32 iteration;  /* pulled or pushed; OK/DUPLICATE echo it, NOT_READY/STALE: the slot's */
	__be32 slot;       /* slot of the hot vector */
	__be32 count;      /* values in the payload (the slot's length; 0 in an ACK) */
	__be32 reserved0;  /* 0 (else the request is refused: bad_op) */
	__be32 reserved1;  /* 0 */
};

struct tailcut_tor_config {
	__u32 job;
	__u32 workers;     /* pushes that complete an iteration */
	__u32 elements;    /* hot elements; the last slot may be short */
	__u32 slots;       /* ceil(elements / STRIDE) */
	__u32 address;     /* the store's IPv4 address, network order */
	__u32 reserved;
};

struct tailcut_tor_port {
	__u32 kind;        /* TAILCUT_TOR_PORT_*; 0: not described */
	__u32 workers;     /* bit w set: worker w may arrive here (its own port: only its
	                    * bit; the uplink: the workers of the other racks) */
};

/* Per slot. The claim word is iteration << 32 | bitmap of the workers whose push of
 * that iteration was taken; `added` counts pushes whose values are in `acc`; the one
 * that makes it `workers` folds acc into the other buffer, then publishes the next
 * iteration (atomically: pulls read the iteration, then the values). Atomics are
 * 64-bit: BCC's clang emits no narrower fetch operations. */
struct tailcut_tor_slot {
	__u64 claim;
	__u64 added;
	__u64 iteration;   /* values of this iteration are in vals[iteration & 1] */
	__u64 folds;
};

struct tailcut_tor_values {
	__s64 v[TAILCUT_TOR_STRIDE];
};

struct tailcut_tor_counts {
	__u64 c[TAILCUT_TOR_STRIDE];
};

#endif
