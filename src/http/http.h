/*
 * http.h - one HTTP delivery request (EgRequest), how it is built
 * (request.c: body, content type, aeg-* and custom headers, batch
 * boundaries; SPEC sections 5 and 8) and how it is sent (http.c: libcurl's
 * multi interface on a thread of its own).
 */
#ifndef EVENTGRID_HTTP_H
#define EVENTGRID_HTTP_H

#include "core/eventgrid.h"
#include "core/outcome.h"
#include "utils/jsonb.h"

#include <curl/curl.h>

/* Bytes of an answer's body kept for the attempt history (a failed answer's). */
#define EG_RESPONSE_HEAD_BYTES 512

struct EgTarget;

/*
 * A client certificate for mutual TLS (client_certificate.c checks it when
 * it is set): PEM texts as stored, the certificate with any chain and its
 * private key.  libcurl copies both when a transfer starts.
 */
typedef struct EgClientCert
{
	char	   *cert;
	size_t		cert_len;
	char	   *key;
	size_t		key_len;
} EgClientCert;

/*
 * One request.  1,024 bytes on a 64-bit build, which a claim's memory
 * context (delivery_claim.c) rounds to no more: a field more would take it
 * to a 2 kB chunk per request (seen as +20 % memory held per delivery,
 * test 010), so per-request state of other rooms is kept beside it.
 */
typedef struct EgRequest
{
	const char *url;
	long		timeout_ms;
	void	   *easy;			/* CURL * */
	struct curl_slist *headers;
	size_t		headers_size;	/* bytes of the header list's one malloc'd block */
	char	   *body;			/* malloc'd, freed when the request ends */
	size_t		body_len;
	const EgClientCert *client_cert;	/* presented to an HTTPS endpoint, or NULL */
	char	   *auth_line;		/* malloc'd "Authorization: Bearer ..." sent first, or NULL; freed when it ends */
	struct curl_slist auth_node;	/* the list node of auth_line (the thread's) */
	bool		keep_body;		/* body and headers stay when it ends (it may be sent again) */
	bool		token_request;	/* a token request (token.c): its body and headers hold a secret */
	bool		azure_storage;	/* to Azure Storage: a 403 AuthenticationFailed is read as 401 (storage_queue.c) */
	bool		read_as_401;	/* result: its 403 (AuthenticationFailed) is read as 401 in http_status */
	size_t		answer_max;		/* > 0: the answer's body is kept whole, up to this many bytes */
	char		errbuf[256];
	/* results */
	EgTransport transport;
	int			http_status;	/* as Event Grid's policy reads the answer (a broker's: rabbitmq.c, redis_stream.c) */
	int64		retry_after_s;	/* the answer's Retry-After, in seconds from now (0: none) */
	char		response_head[EG_RESPONSE_HEAD_BYTES];	/* the first bytes of the answer's body */
	int			response_head_len;
	char	   *answer;			/* malloc'd, answer_max > 0: the answer's body (answer_len bytes, NUL-terminated) */
	size_t		answer_len;
	double		duration_ms;	/* libcurl's total time of the transfer */
	int			http_version;	/* 2: the answer came over HTTP/2, 1: HTTP/1.x, 0: unknown */
	/* caller's bookkeeping */
	void	  **items;			/* the rows this request carries */
	int			count;
	int64		subscription_id;
	const char *subscription_name;
	const char *topic;			/* the subscription's topic */
	int64		bytes;			/* event bytes carried */
	struct EgTarget *target;	/* its endpoint (endpoint_queue.c) */
	struct EgTokenUse *token_use;	/* its bearer token's credentials (delivery_auth.c), or NULL */
	uint64		token_generation;	/* of the token it carries */
	bool		token_waited;	/* it waited for a token: the one it carries is new */
	bool		token_resent;	/* sent again after a 401 to an older token */
	bool		probe;			/* sent to end its endpoint's probation */
	TimestampTz started_at;
	struct EgRequest *next;
} EgRequest;

/*
 * http.c: the options every request eventgrid sends has (http and https
 * only, no redirects, certificates verified against ca_file or the
 * system's store, eventgrid's User-Agent); libcurl's code of the first it
 * refused.
 */
extern CURLcode eg_http_safe_options(CURL *h, const char *ca_file);
extern CURLcode eg_http_client_cert_options(CURL *h, const EgClientCert *c);
extern void eg_http_end_token_request(EgRequest *req);
extern void eg_http_perform(EgRequest *req, const char *ca_file, long timeout_ms);
extern int	eg_http_recorded_status(const EgRequest *req);

/*
 * request.c: eg_header_problem() returns NULL when "name: value" may be
 * sent, else why not (a name that is not an HTTP token, a control
 * character, a name that changes HTTP framing or routing).
 */
extern const char *eg_header_problem(const char *name, const char *value, bool custom);
extern int	eg_control_char_at(const char *s, int len);
extern const char *eg_to_utf8(const char *text, int len, int *out_len);
extern char *eg_printable_copy(const char *text, int len);
extern const char *eg_content_type(const char *delivery_schema, int nevents);
extern void eg_build_body(StringInfo buf, const char *delivery_schema,
						  const EgEventPart *events, int nevents);
extern bool eg_event_subject(const char *json, int len, char *out, size_t cap);
extern Jsonb *eg_json_object(const char *text, size_t len);

/*
 * Where a broker message's key (a RabbitMQ routing key, a Redis stream's
 * key) comes from: the endpoint's fixed one, the event's subject
 * (routing_key_from=subject, stream_from=subject) or its ordering key
 * (=ordering_key: the subscription's ordering_key path, SPEC 13).
 */
typedef enum EgKeyFrom
{
	EG_KEY_FIXED = 0,
	EG_KEY_FROM_SUBJECT,
	EG_KEY_FROM_ORDERING_KEY
} EgKeyFrom;

extern bool eg_key_from_name(const char *name, EgKeyFrom *from);
extern const char *eg_message_key(EgKeyFrom from, const char *fixed, const EgEventPart *event,
								  const char *ordering_key, char *buf, size_t cap);
extern int	eg_batch_take(const EgEventPart *events, int nevents,
						  int max_events, int64 max_bytes);

/* What the headers of one request say (the first event's values for a batch). */
typedef struct EgRequestSpec
{
	const char *schema;			/* delivery schema */
	const char *subscription_name;
	int			delivery_count; /* attempts made before this one */
	const char *metadata_version;
	const char *data_version;
	const char *output_event_id;
	const char *custom_headers; /* "Name: value" lines separated by '\n', or NULL */
	const char *signing_keys;	/* Standard Webhooks secrets, space-separated, or NULL: unsigned */
	const char *webhook_id;		/* the message id when signed (eg_webhook_id) */
} EgRequestSpec;

extern EgOutcomeCode eg_request_build(EgRequest *req, const EgRequestSpec *spec,
									  const EgEventPart *events, int nevents, StringInfo scratch);

/* http.c */
extern void eg_http_init(void);
extern void eg_http_set_max_connections(long n);
extern void eg_http_set_ca_file(const char *path);
extern void eg_http_shutdown(void);
extern void eg_http_start(EgRequest **reqs, int n, long timeout_ms);
extern void eg_http_set_headers(EgRequest *req, const char *lines, size_t len, int n);
extern void eg_http_free_headers(EgRequest *req);
extern void eg_http_free_body(EgRequest *req);
extern int	eg_http_in_flight(void);
extern void eg_http_wait(int want, int timeout_ms);
extern EgRequest *eg_http_take_finished(void);

#endif							/* EVENTGRID_HTTP_H */
