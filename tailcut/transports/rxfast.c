/* rxfast.c: the bounded-loss receive thread's two per-batch steps in compiled code.
 *
 * Each step replaces about fifteen numpy calls whose fixed cost (3-5 us each on
 * 2-core machines) was most of the receive thread's CPU (docs/bounded-loss.md, "One
 * sender's goodput"). The numpy versions stay, and the tests hold the two to the same
 * result (tests/transports/test_rxfast.py); tailcut/transports/rxfast.py builds and
 * loads this file, and says when it is not used.
 *
 * Nothing here trusts a datagram: rxfast_accept_run checks each datagram before it
 * writes anything, and writes only whole slots inside the message's arrays.
 */
#define _GNU_SOURCE  /* struct mmsghdr */
#include <arpa/inet.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <linux/types.h>

/* The types partial.h has from BCC in the kernel's programs. */
typedef __u32 u32;
typedef __u64 u64;
#include "partial.h"

#define RXFAST_ABI 2

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#define UDP_GRO 104

/* What a recvmmsg under UDP_GRO leaves per message (batch._CmsgTsGro). */
struct ts_gro {
	uint64_t ts_len;
	int32_t ts_level, ts_type;
	int64_t tv_sec, tv_nsec;
	uint64_t gro_len;
	int32_t gro_level, gro_type;
	int32_t gso, pad;
};

/* The control messages of one message read under UDP_GRO, as the kernel lays them out. */
_Static_assert(sizeof(struct ts_gro) == CMSG_SPACE(16) + CMSG_SPACE(sizeof(int)),
	       "struct ts_gro is SO_TIMESTAMPNS's then UDP_GRO's control message");

int rxfast_abi(void)
{
	return RXFAST_ABI;
}

/* The datagrams of `got` messages just read, message i into rows [i * block_rows, ...)
 * of `data`, moved so that they fill rows 0 .. n-1 in order; per datagram its length
 * (the real one for a datagram read alone, which may exceed a row), source address
 * (host-order IPv4) and kernel arrival time (0: none). A GSO message cut at another
 * size than a row is dropped and counted. counts: [0] misfits, [1] GSO messages of
 * more than one datagram, [2] packets as the interface counted them.
 * Returns n. batch.GroInbox._split is the same in numpy. */
long rxfast_gro_split(const struct mmsghdr *msgs, long got, const struct ts_gro *ctrl,
		      const struct sockaddr_in *names, uint8_t *data, long block_rows,
		      long row_bytes, int64_t *lengths, int64_t *sources, int64_t *arrivals,
		      int64_t *counts)
{
	long n = 0;
	for (long i = 0; i < got; i++) {
		const struct ts_gro *c = &ctrl[i];
		int64_t length = msgs[i].msg_len;
		int64_t gso = 0;
		if (msgs[i].msg_hdr.msg_controllen >= sizeof(*c) && c->gro_level == SOL_UDP &&
		    c->gro_type == UDP_GRO)
			gso = c->gso;
		if (gso != 0 && gso != row_bytes) {
			counts[0]++;
			continue;
		}
		int64_t rows = gso > 0 ? (length + row_bytes - 1) / row_bytes : 1;
		if (rows > block_rows)  /* never, for a read of at most 64 KiB */
			rows = block_rows;
		if (rows > 1)
			counts[1]++;
		counts[2]++;
		int64_t at = 0;
		if (c->ts_level == SOL_SOCKET && c->ts_type == SO_TIMESTAMPNS)
			at = c->tv_sec * 1000000000 + c->tv_nsec;
		int64_t source = ntohl(names[i].sin_addr.s_addr);
		if (n != i * block_rows)
			memmove(data + n * row_bytes, data + i * block_rows * row_bytes,
				rows * row_bytes);
		for (int64_t j = 0; j < rows; j++, n++) {
			int64_t left = length - j * row_bytes;
			lengths[n] = gso > 0 && left > row_bytes ? row_bytes : left;
			sources[n] = source;
			arrivals[n] = at;
		}
	}
	return n;
}

/* One live message, as receiver.Rx keeps it. */
struct rx_message {
	uint32_t template_words[TAILCUT_BL_HDR_BYTES / 4];  /* under shared_bits */
	uint32_t shared_bits[TAILCUT_BL_HDR_BYTES / 4];
	int64_t source;
	int64_t total;
	int64_t stride;
	float *values;    /* total */
	uint8_t *mask;    /* total */
	uint8_t *seen;    /* slots */
};

/* For the loader to check its ctypes view of struct rx_message against. */
long rxfast_message_bytes(void)
{
	return sizeof(struct rx_message);
}

static int64_t be32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return ntohl(v);
}

/* How many rows from the first on carry its message id and come from its source: the
 * run receiver.py hands to numpy whole when C cannot take it (rows of at least a
 * header's bytes). */
long rxfast_same_message(const uint8_t *data, long n, long row_bytes, const int64_t *sources)
{
	const size_t at = offsetof(struct tailcut_bl_hdr, message);
	long i = 1;
	while (i < n && sources[i] == sources[0] &&
	       memcmp(data + i * row_bytes + at, data + at, 4) == 0)
		i++;
	return n > 0 ? i : 0;
}

static int good_packet(const uint8_t *row, int64_t length, int64_t source,
		       const struct rx_message *m, int64_t *start, int64_t *end)
{
	if (source != m->source)
		return 0;
	for (long w = 0; w < TAILCUT_BL_HDR_BYTES / 4; w++) {
		uint32_t v;
		memcpy(&v, row + 4 * w, 4);
		if ((v & m->shared_bits[w]) != m->template_words[w])
			return 0;
	}
	const struct tailcut_bl_hdr *h = (const void *)row;
	*start = be32((const uint8_t *)&h->start);
	*end = be32((const uint8_t *)&h->end);
	int64_t full = *start + m->stride;
	return *start % m->stride == 0 && *start < m->total &&
	       *end == (full < m->total ? full : m->total) &&
	       length == TAILCUT_BL_HDR_BYTES + 4 * (*end - *start);
}

/* receiver.Receiver._accept_run for the first datagrams of a batch: the leading run of
 * rows (of row_bytes each, real lengths in `lengths`) that are each a well-formed
 * packet of message m from its peer. Their new slots are put in place (of several
 * copies of a slot the first is kept, as receiver._add keeps it); returns the run's
 * length, 0 if the first row is not one, with out[0] the new slots, out[1] the
 * duplicates, out[2] the elements added, out[3] their datagrams' bytes. A row after
 * the run is not read beyond its header. */
long rxfast_accept_run(const uint8_t *data, long n, long row_bytes, const int64_t *lengths,
		       const int64_t *sources, struct rx_message *m, int64_t *out)
{
	out[0] = out[1] = out[2] = out[3] = 0;
	if (row_bytes < TAILCUT_BL_HDR_BYTES + 4 * m->stride)
		return 0;
	long i = 0;
	for (; i < n; i++) {
		const uint8_t *row = data + i * row_bytes;
		int64_t start, end;
		if (!good_packet(row, lengths[i], sources[i], m, &start, &end))
			break;
		int64_t slot = start / m->stride;
		if (m->seen[slot]) {
			out[1]++;
			continue;
		}
		m->seen[slot] = 1;
		memcpy(m->values + start, row + TAILCUT_BL_HDR_BYTES, 4 * (end - start));
		memset(m->mask + start, 1, end - start);
		out[0]++;
		out[2] += end - start;
		out[3] += lengths[i];
	}
	return i;
}
