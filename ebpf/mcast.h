/* Multicast of the PS's parameters at a rack's ToR: wire header, maps and counters
 * shared by mcast.bpf.c and its loader (tailcut/datapath/mcast.py;
 * tailcut/transports/mcast.py packs and parses this struct and these defines).
 *
 * One UDP datagram (port TAILCUT_MCAST_PORT) is a 32-byte header and `count` values:
 *
 *   PARAMS (PS -> the rack's multicast address): slot `slot` of the model of
 *          `iteration`, elements [slot * STRIDE, slot * STRIDE + count), float32
 *          little-endian (the ToR copies them, it does not compute on them). The
 *          ToR sends one copy out of each of the rack's workers' ports, addressed to
 *          that worker (its MAC and IP; `worker` and `rack` set), and drops the
 *          original. The same op from the PS to one worker's own address is a repair:
 *          the ToR lets it pass (not addressed to it).
 *   REPAIR (worker -> PS's address): `count` little-endian u32 slot numbers of
 *          `iteration` that did not arrive; the PS sends those PARAMS again, to the
 *          worker alone. Never seen by the ToR program.
 */
#ifndef TAILCUT_MCAST_H
#define TAILCUT_MCAST_H

#define TAILCUT_MCAST_MAGIC 0x54434d43   /* "TCMC" */
#define TAILCUT_MCAST_VERSION 1
#define TAILCUT_MCAST_PORT 7102
#define TAILCUT_MCAST_HEADER 32

#define TAILCUT_MCAST_OP_PARAMS 1
#define TAILCUT_MCAST_OP_REPAIR 2

/* Values per slot: (MTU 1500 - IPv4 20 - UDP 8 - header 32) / 4. */
#define TAILCUT_MCAST_STRIDE 360
/* At most 368,640 values (1024 slots), as in-network aggregation. */
#define TAILCUT_MCAST_SLOTS 1024

/* Where a packet arrived or goes (tailcut_mcast_port.kind), by the filter's classid. */
#define TAILCUT_MCAST_PORT_WORKER 1  /* a worker's port: where copies go; sends none */
#define TAILCUT_MCAST_PORT_PS 2      /* the way from the PS (its port, or the uplink) */
#define TAILCUT_MCAST_PORTS 64

/* Why a packet got the verdict it got: per-CPU counters in mcast_stats, one per packet
 * addressed to the multicast address (others are not counted and pass to the next
 * filter); clone_failed is counted once per copy that could not be sent, besides. */
enum tailcut_mcast_reason {
	TAILCUT_MCAST_REPLICATED,  /* copied to every worker's port; the original ends here */
	TAILCUT_MCAST_SHORT,  /* shorter than IPv4 + UDP + header */
	TAILCUT_MCAST_BAD_MAGIC,
	TAILCUT_MCAST_BAD_VERSION,
	TAILCUT_MCAST_BAD_OP,  /* not PARAMS, or status, worker or rack set */
	TAILCUT_MCAST_UNKNOWN_JOB,
	TAILCUT_MCAST_WRONG_PORT,  /* not from the way from the PS */
	TAILCUT_MCAST_BAD_SLOT,  /* slot past the model */
	TAILCUT_MCAST_BAD_COUNT,  /* count is not the slot's length */
	TAILCUT_MCAST_BAD_LENGTH,  /* the UDP or IP length is not header + 4 * count */
	TAILCUT_MCAST_NO_PORT,  /* arrived on a port the loader did not describe */
	TAILCUT_MCAST_BAD_IP,  /* a fragment, or IPv4 options */
	TAILCUT_MCAST_CLONE_FAILED,  /* a copy that could not be made or sent */
	TAILCUT_MCAST_REASONS
};

struct tailcut_mcast_hdr {
	__be32 magic;      /* TAILCUT_MCAST_MAGIC */
	__u8 version;      /* TAILCUT_MCAST_VERSION */
	__u8 op;           /* TAILCUT_MCAST_OP_* */
	__u8 status;       /* 0 */
	__u8 worker;       /* 0 from the PS; the worker a copy or a repair is for */
	__be32 job;        /* job id: the first 4 bytes of sha256(job name), as partial.h */
	__be32 iteration;
	__be32 slot;
	__be32 count;      /* values (PARAMS) or slot numbers (REPAIR) in the payload */
	__be32 rack;       /* 0 from the PS; the rack that made the copy */
	__be32 reserved;   /* 0 */
};

struct tailcut_mcast_config {
	__u32 job;
	__u32 elements;    /* the model's values; the last slot may be short */
	__u32 slots;       /* ceil(elements / STRIDE) */
	__u32 rack;
	__u32 address;     /* this rack's multicast address, network order */
	__u32 reserved;
};

/* The loader writes one per attached port; the program only reads them. */
struct tailcut_mcast_port {
	__u32 kind;        /* TAILCUT_MCAST_PORT_*; 0: not described */
	__u32 workers;     /* a worker's port: bit w of its worker */
	__u32 ifindex;     /* the port (in the rack's namespace): where its copies go */
	__u32 ip;          /* the worker's address, network order */
	__u8 mac[6];       /* the worker's MAC */
	__u8 worker;
	__u8 reserved;
};

#endif
