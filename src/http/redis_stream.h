/*
 * redis_stream.h - the RedisStream destination (SPEC 21): an event
 * subscription whose endpoint is redis://host:port/db?stream=S gets each
 * event as an entry XADDed to stream S.  The request is built on the main
 * thread (one event per request, the command already in Redis's wire
 * format) and sent by the HTTP thread, which drives hiredis's asynchronous
 * connections beside libcurl's transfers (redis_stream.c: the endpoint and
 * the requests; redis_connections.c: the connections).
 */
#ifndef EVENTGRID_REDIS_STREAM_H
#define EVENTGRID_REDIS_STREAM_H

#include "http/http.h"

#define EG_REDIS_DEFAULT_PORT 6379
#define EG_REDIS_MAX_STREAM_BYTES 512

/* A Redis stream endpoint, as its URL names it. */
typedef struct EgRedisDest
{
	char		host[256];
	int			port;
	int			db;				/* SELECTed when not 0 */
	char		stream[EG_REDIS_MAX_STREAM_BYTES + 1];	/* "" with stream_from */
	EgKeyFrom	stream_from;	/* stream_from=subject or ordering_key: each event's is its stream */
	int64		maxlen;			/* > 0: XADD ... MAXLEN ~ maxlen */
	bool		mkstream;		/* false: XADD ... NOMKSTREAM (a missing stream is NotFound) */
	int			key_len;		/* bytes of the URL before its '?': one connection per key */
	bool		tls;			/* rediss:// */
} EgRedisDest;

/* Is url a RedisStream endpoint (lower-case redis:// or rediss:// scheme)? */
static inline bool
eg_is_redis_url(const char *url)
{
	return url != NULL && (strncmp(url, "redis://", 8) == 0 || strncmp(url, "rediss://", 9) == 0);
}

/* Both threads: parses url into *d; NULL, or why it is not a usable endpoint (static text). */
extern const char *eg_redis_parse(const char *url, EgRedisDest *d);

/*
 * Main thread: req's body becomes the XADD of one event (fields id and
 * event: the event's id and its JSON object in the delivery schema, as
 * UTF-8) to d's stream, or to the event's subject (stream_from=subject)
 * or ordering key (stream_from=ordering_key: ordering_key, the claim's
 * text, NULL for none).  EG_OUTCOME_NONE, EG_OUTCOME_INVALID_ENCODING for
 * text with no UTF-8 form, or EG_OUTCOME_INVALID_HEADER for a subject or
 * ordering key that cannot be a stream key (none or empty, or over 512
 * bytes).
 */
extern EgOutcomeCode eg_redis_request_build(EgRequest *req, const EgRedisDest *d, const char *event_id,
											const EgEventPart *event, const char *ordering_key);

/* Main thread: req authenticates its connection with AUTH [user] password first. */
extern void eg_redis_request_auth(EgRequest *req, const char *user, const char *password);

/*
 * redis_connections.c, for the HTTP thread (http.c): hand over a request;
 * the sockets to wait on beside libcurl's (how many at most; appended to
 * fds from index n, at most cap; *timeout_ms lowered to the next
 * deadline); what the wait found; and, when the thread stops, every
 * connection closed (their requests finish as SocketError).
 */
struct curl_waitfd;
extern void eg_redis_send(EgRequest *req, const char *ca_file);
extern int	eg_redis_fd_count(void);
extern int	eg_redis_wait_fds(struct curl_waitfd *fds, int n, int cap, int *timeout_ms);
extern void eg_redis_after_wait(struct curl_waitfd *fds, int n);
extern void eg_redis_close_all(void);

#endif							/* EVENTGRID_REDIS_STREAM_H */
