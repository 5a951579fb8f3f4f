/*
 * rabbitmq.h - the RabbitMQ destination (SPEC 21): an event subscription
 * whose endpoint is amqp[s]://host:port/vhost?exchange=X&routing_key=K
 * gets each event (or each batch, as a JSON array) as a persistent message
 * published to exchange X with routing key K, mandatory, and delivered
 * when the broker confirms it (publisher confirms).  The request is built
 * on the main thread and published by the HTTP thread, which drives
 * librabbitmq's connections beside libcurl's transfers (rabbitmq.c: the
 * endpoint and the requests; rabbitmq_connections.c: the connections).
 */
#ifndef EVENTGRID_RABBITMQ_H
#define EVENTGRID_RABBITMQ_H

#include "http/http.h"
#include "http/redis_stream.h"

#define EG_AMQP_DEFAULT_PORT 5672
#define EG_AMQPS_DEFAULT_PORT 5671
#define EG_AMQP_MAX_NAME_BYTES 255	/* an AMQP short string: exchange, routing key, vhost */

/* A RabbitMQ endpoint, as its URL names it. */
typedef struct EgAmqpDest
{
	bool		tls;			/* amqps:// */
	char		host[256];
	int			port;
	char		vhost[EG_AMQP_MAX_NAME_BYTES + 1];	/* "/" when the URL has no path */
	char		exchange[EG_AMQP_MAX_NAME_BYTES + 1];	/* "": the default exchange */
	char		routing_key[EG_AMQP_MAX_NAME_BYTES + 1];
	EgKeyFrom	routing_key_from;	/* routing_key_from=subject or ordering_key: each event's */
} EgAmqpDest;

/* Is url a RabbitMQ endpoint (lower-case amqp:// or amqps:// scheme)? */
static inline bool
eg_is_amqp_url(const char *url)
{
	return url != NULL && (strncmp(url, "amqp://", 7) == 0 || strncmp(url, "amqps://", 8) == 0);
}

/*
 * Is a request to url answered by a broker (Redis, RabbitMQ), not by HTTP?
 * Its outcome is still given as the HTTP status Event Grid's policy treats
 * alike, but the attempt history records no HTTP status for it.
 */
static inline bool
eg_is_broker_url(const char *url)
{
	return eg_is_redis_url(url) || eg_is_amqp_url(url);
}

/* Both threads: parses url into *d; NULL, or why it is not a usable endpoint (static text). */
extern const char *eg_amqp_parse(const char *url, EgAmqpDest *d);

/*
 * Main thread: req's body becomes one message: its content type, its
 * message id (the event's id; none for a batch) and its routing key (d's,
 * or the event's subject, or its ordering_key: the claim's text, NULL for
 * none), each NUL-terminated, then the message: the event's JSON object in
 * the delivery schema, or for a batch (nevents > 1) the JSON array a
 * webhook would get, as UTF-8.  EG_OUTCOME_NONE, EG_OUTCOME_INVALID_ENCODING
 * for text with no UTF-8 form, or EG_OUTCOME_INVALID_HEADER for a subject
 * or ordering key that cannot be a routing key (none, for the ordering
 * key; over 255 bytes).
 */
extern EgOutcomeCode eg_amqp_request_build(EgRequest *req, const EgAmqpDest *d, const char *schema,
										   const char *event_id, const EgEventPart *events, int nevents,
										   const char *ordering_key, StringInfo scratch);

/* Main thread: req logs its connection in as user with password (PLAIN); without them, guest. */
extern void eg_amqp_request_auth(EgRequest *req, const char *user, const char *password);

/*
 * rabbitmq_connections.c, for the HTTP thread (http.c): hand over a
 * request; the sockets to wait on beside libcurl's (appended to fds from
 * index n, at most cap; *timeout_ms lowered to the next deadline); what the
 * wait found; and, when the thread stops, every connection closed (their
 * requests finish as SocketError).
 */
struct curl_waitfd;
extern void eg_amqp_send(EgRequest *req, const char *ca_file);
extern int	eg_amqp_wait_fds(struct curl_waitfd *fds, int n, int cap, int *timeout_ms);
extern int	eg_amqp_fd_count(void);
extern void eg_amqp_after_wait(struct curl_waitfd *fds, int n);
extern void eg_amqp_close_all(void);

#endif							/* EVENTGRID_RABBITMQ_H */
