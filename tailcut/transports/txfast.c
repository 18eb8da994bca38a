/* txfast.c: the bounded-loss sender's burst in compiled code.
 *
 * batch.Batch builds a pass's iovecs and mmsghdrs with numpy before the first burst
 * (about 150 us a pass) and picks each burst's GSO messages in Python
 * (docs/bounded-loss.md). Here one call builds a burst's messages on the stack from
 * the pass's arrays and sends them. batch.Batch stays as the fallback and as the
 * reference the tests hold this to (tests/transports/test_txfast.py); rxfast.py
 * builds this file into the same library as rxfast.c.
 *
 * Nothing here trusts its indices: a slot outside the pass or a range outside the
 * values is refused (ERANGE) before anything of its burst is sent.
 */
#define _GNU_SOURCE  /* struct mmsghdr, sendmmsg */
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#define UDP_SEGMENT 103

/* A sendmmsg call carries at most this many messages and iovecs. */
#define CHUNK_MSGS 64
#define CHUNK_IOVS 1024
#define CTRL_BYTES (CMSG_SPACE(sizeof(uint16_t)) + CMSG_SPACE(sizeof(int)))

/* One pass over a message's slots (batch.CompiledBatch fills it): the datagram of
 * slot s is headers[s] then values[starts[s] .. ends[s]). Datagram i of the pass is
 * slot order[i]. */
struct tx_pass {
	int64_t fd;
	const struct sockaddr_in *to;
	const uint8_t *headers;
	int64_t header_bytes;
	const uint8_t *values;
	int64_t value_bytes;    /* of one value */
	int64_t values_count;
	const int64_t *starts;  /* per slot, in values */
	const int64_t *ends;
	int64_t slots;
	const int64_t *order;   /* per datagram, a slot */
	int64_t datagrams;
	const int32_t *tos;     /* per slot, or NULL: the socket's own */
	int64_t gso_size;       /* 0: one datagram a message */
	int64_t max_segments;   /* datagrams in a GSO message, at most */
	int64_t sent_any;       /* set once a message has gone out */
	/* txfast_pace's state. interrupt: set by another thread (a grant, DONE, another
	 * pass) to end the call after its current burst; next: the first datagram not yet
	 * sent; due_ns: when the link has carried what went before the last burst
	 * (CLOCK_MONOTONIC, as Python's time.monotonic). */
	volatile int64_t interrupt;
	int64_t next;
	int64_t last;           /* the first datagram of the last burst */
	int64_t due_ns;
};

long txfast_pass_bytes(void)
{
	return sizeof(struct tx_pass);
}

static int64_t datagram_bytes(const struct tx_pass *p, int64_t slot)
{
	return p->header_bytes + p->value_bytes * (p->ends[slot] - p->starts[slot]);
}

/* Whether datagram i (of the pass) may be followed by i + 1 in one GSO message: the
 * kernel cuts a message at gso_size, so all but its last must be exactly that long,
 * and one message carries one TOS. */
static int joins(const struct tx_pass *p, int64_t i)
{
	int64_t slot = p->order[i], next = p->order[i + 1];
	if (datagram_bytes(p, slot) != p->gso_size)
		return 0;
	return p->tos == NULL || p->tos[slot] == p->tos[next];
}

static void add_cmsg(struct msghdr *h, int level, int type, const void *data, size_t len)
{
	struct cmsghdr *c = (struct cmsghdr *)((uint8_t *)h->msg_control + h->msg_controllen);
	c->cmsg_len = CMSG_LEN(len);
	c->cmsg_level = level;
	c->cmsg_type = type;
	memcpy(CMSG_DATA(c), data, len);
	h->msg_controllen += CMSG_SPACE(len);
}

static long send_all(int fd, struct mmsghdr *msgs, int m, struct tx_pass *p)
{
	int done = 0;
	while (done < m) {
		int sent = sendmmsg(fd, msgs + done, m - done, 0);
		if (sent < 0) {
			if (errno == EINTR || errno == EAGAIN || errno == ENOBUFS)
				continue;
			return -errno;
		}
		p->sent_any = 1;
		done += sent;
	}
	return 0;
}

/* Send datagrams first .. first + count - 1 of the pass, with gso_size in runs of
 * full datagrams (batch._Gso's messages), each message carrying its first slot's TOS.
 * Returns 0, or -errno: ERANGE for an index out of bounds (then nothing of the call
 * has gone out), else the kernel's error (what went before it has). */
long txfast_send(struct tx_pass *p, long first, long count)
{
	if (first < 0 || count < 0 || first > p->datagrams || count > p->datagrams - first)
		return -ERANGE;
	/* a message's iovecs fit one chunk; UDP_SEGMENT is a u16 */
	if (p->max_segments > CHUNK_IOVS / 2 || p->gso_size > 0xFFFF)
		return -EINVAL;
	for (long i = first; i < first + count; i++) {
		int64_t s = p->order[i];
		if (s < 0 || s >= p->slots || p->starts[s] < 0 || p->ends[s] < p->starts[s] ||
		    p->ends[s] > p->values_count)
			return -ERANGE;
	}
	struct iovec iov[CHUNK_IOVS];
	struct mmsghdr msgs[CHUNK_MSGS];
	union {
		struct cmsghdr align;
		uint8_t bytes[CTRL_BYTES];
	} ctrl[CHUNK_MSGS];
	const long stop = first + count;
	long i = first;
	while (i < stop) {
		int m = 0;
		long v = 0;
		while (i < stop && m < CHUNK_MSGS) {
			long take = 1;
			if (p->gso_size > 0)
				while (i + take < stop && take < p->max_segments &&
				       joins(p, i + take - 1))
					take++;
			if (v + 2 * take > CHUNK_IOVS)
				break;
			struct msghdr *h = &msgs[m].msg_hdr;
			memset(h, 0, sizeof(*h));
			h->msg_name = (void *)p->to;
			h->msg_namelen = sizeof(*p->to);
			h->msg_iov = &iov[v];
			h->msg_iovlen = 2 * take;
			for (long j = i; j < i + take; j++) {
				int64_t s = p->order[j];
				iov[v].iov_base = (void *)(p->headers + s * p->header_bytes);
				iov[v++].iov_len = p->header_bytes;
				iov[v].iov_base = (void *)(p->values + p->starts[s] * p->value_bytes);
				iov[v++].iov_len = (p->ends[s] - p->starts[s]) * p->value_bytes;
			}
			h->msg_control = ctrl[m].bytes;
			if (p->gso_size > 0) {
				uint16_t size = (uint16_t)p->gso_size;
				add_cmsg(h, SOL_UDP, UDP_SEGMENT, &size, sizeof(size));
			}
			if (p->tos != NULL) {
				int tos = p->tos[p->order[i]];
				add_cmsg(h, IPPROTO_IP, IP_TOS, &tos, sizeof(tos));
			}
			if (h->msg_controllen == 0)
				h->msg_control = NULL;
			m++;
			i += take;
		}
		long err = send_all((int)p->fd, msgs, m, p);
		if (err)
			return err;
	}
	return 0;
}

static int64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* sender._pace's loop over bursts, without the interpreter: from datagram p->next on,
 * send bursts of `burst` datagrams (the first of `first_burst`), at most `bursts` of
 * them, sleeping between two until the link has carried the one before at `rate_bit`
 * (0: no pacing). wire[i] is the wire bytes before datagram i. Pacing keeps to the
 * running total in p->due_ns, as sender._pace does: a late wake-up is made up by the
 * next bursts, at most catch_up_ns of link time of it. Returns after a burst once the
 * pass is sent, the bursts are done, p->interrupt is set (a grant, DONE or another
 * pass: the caller looks at its rate again) or the clock is past until_ns (0: never),
 * with p->last at that burst's first datagram and p->next past it; the caller paces
 * that last burst. -errno: that burst failed (what went before it was sent). */
long txfast_pace(struct tx_pass *p, const int64_t *wire, long first_burst, long burst,
		 double rate_bit, long bursts, int64_t until_ns, int64_t catch_up_ns)
{
	long count = first_burst;
	if (p->next < 0 || p->next >= p->datagrams || count <= 0 || burst <= 0 || bursts <= 0)
		return -ERANGE;
	for (;;) {
		if (count > p->datagrams - p->next)
			count = p->datagrams - p->next;
		p->last = p->next;
		long err = txfast_send(p, p->last, count);
		if (err == -ERANGE)
			return err;   /* nothing of it went out: p->next stays */
		p->next = p->last + count;
		if (err)
			return err;
		int64_t now = now_ns();
		if (p->next >= p->datagrams || --bursts == 0 || p->interrupt ||
		    (until_ns && now > until_ns))
			return 0;
		if (rate_bit > 0) {
			p->due_ns += (int64_t)(8e9 * (double)(wire[p->next] - wire[p->last]) / rate_bit);
			if (p->due_ns > now) {
				struct timespec t = {p->due_ns / 1000000000, p->due_ns % 1000000000};
				while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR)
					;
			} else if (p->due_ns < now - catch_up_ns) {
				p->due_ns = now - catch_up_ns;
			}
		}
		count = burst;
	}
}
