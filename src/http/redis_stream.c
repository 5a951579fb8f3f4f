/*
 * redis_stream.c - the RedisStream destination (SPEC 21): its endpoint
 * and its requests; redis_connections.c sends them.
 *
 * The endpoint is redis://host[:port][/db]?stream=S[&maxlen=N][&mkstream=false]
 * (stream_from=subject instead of stream=S: each event's subject is the
 * key of its stream; stream_from=ordering_key: its ordering key, by the
 * subscription's ordering_key path, SPEC 13),
 * parsed by libcurl's URL API (the same parser as the webhooks' URLs).  A
 * stored endpoint holds no credentials: create_event_subscription() takes
 * them out of the URL it was given (_endpoint_credentials()) into
 * destination_credentials, and the worker reads them with each claim.
 * Each event becomes one entry: XADD S [NOMKSTREAM] [MAXLEN ~ N] * id
 * <event id> event <JSON>, formatted on the main thread
 * (redisFormatCommandArgv) into the request's body, so that the HTTP
 * thread only writes bytes.
 *
 * What a reply means, as the HTTP status Event Grid's policy treats alike
 * (outcome.c; the history records no HTTP status for it): an entry id is
 * 201 (Delivered); a nil reply (NOMKSTREAM, no such stream) or a database
 * SELECT refuses is 404 (NotFound); a refused AUTH, NOAUTH, WRONGPASS,
 * NOPERM are 401 (Unauthorized); OOM is 507 (Full); LOADING, BUSY,
 * TRYAGAIN, MASTERDOWN, READONLY are 503 (Busy); other errors 500
 * (GenericError).  The error's text is the answer the attempt history
 * keeps.  A connection that fails or closes ends its requests as
 * SocketError.
 */
#include "http/rabbitmq.h"
#include "http/redis_stream.h"
#include "http/url.h"

#include "access/htup_details.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/builtins.h"

#include <curl/curl.h>
#include <hiredis/hiredis.h>

/* ---- the endpoint URL (both threads: no PostgreSQL calls) ---- */

/* A whole decimal number in [min, max] into *out. */
static bool
parse_number(const char *text, int64 min, int64 max, int64 *out)
{
	char	   *end = NULL;
	long long	v;

	if (text[0] < '0' || text[0] > '9')
		return false;
	errno = 0;
	v = strtoll(text, &end, 10);
	if (errno != 0 || *end != '\0' || v < min || v > max)
		return false;
	*out = (int64) v;
	return true;
}

/* The query's parameters into d; NULL or why not. */
static const char *
parse_query(const char *query, EgRedisDest *d)
{
	char		copy[EG_MAX_ENDPOINT_BYTES + 1];
	char	   *save = NULL;
	bool		seen_stream = false,
				seen_from = false,
				seen_maxlen = false,
				seen_mkstream = false;

	if (query == NULL || strlen(query) > EG_MAX_ENDPOINT_BYTES)
		return "the URL names no stream: add ?stream=<key>";
	strcpy(copy, query);
	for (char *p = strtok_r(copy, "&", &save); p != NULL; p = strtok_r(NULL, "&", &save))
	{
		char	   *eq = strchr(p, '=');
		char		value[EG_REDIS_MAX_STREAM_BYTES + 1];

		if (eq == NULL)
			return "a query parameter has no value (stream=, maxlen= or mkstream=)";
		*eq = '\0';
		if (!eg_url_decode(eq + 1, value, sizeof(value)) || value[0] == '\0')
			return "a query parameter's value is empty, longer than 512 bytes or holds a NUL";
		if (strcmp(p, "stream") == 0 && !seen_stream && !seen_from)
		{
			strcpy(d->stream, value);
			seen_stream = true;
		}
		else if (strcmp(p, "stream_from") == 0 && !seen_stream && !seen_from)
		{
			if (!eg_key_from_name(value, &d->stream_from))
				return "stream_from takes subject or ordering_key (each event's subject or ordering key is its stream's key)";
			seen_from = true;
		}
		else if (strcmp(p, "maxlen") == 0 && !seen_maxlen)
		{
			if (!parse_number(value, 1, PG_INT64_MAX, &d->maxlen))
				return "maxlen must be a whole number from 1 to 9223372036854775807";
			seen_maxlen = true;
		}
		else if (strcmp(p, "mkstream") == 0 && !seen_mkstream)
		{
			if (strcmp(value, "true") != 0 && strcmp(value, "false") != 0)
				return "mkstream must be true or false";
			d->mkstream = strcmp(value, "true") == 0;
			seen_mkstream = true;
		}
		else
			return "the query takes stream (or stream_from=subject or ordering_key), maxlen and mkstream, each once";
	}
	if (!seen_stream && !seen_from)
		return "the URL names no stream: add ?stream=<key>";
	return NULL;
}

/*
 * Parses a RedisStream endpoint into *d: scheme redis or rediss (lower case), "://"
 * and a host of at most 255 bytes, a port from 1 to 65535 (6379), a path
 * that is empty, "/" or "/<db>" (0-2147483647; 0), no user name or
 * password, no fragment, at most EG_MAX_ENDPOINT_BYTES bytes, and the query
 * above.  NULL, or why not (a static string).  rediss:// (TLS) only
 * where hiredis has TLS (EG_HAVE_REDIS_TLS: hiredis 1.0 or later; Debian
 * 12's 0.14 has none).
 */
const char *
eg_redis_parse(const char *url, EgRedisDest *d)
{
	char	   *path = NULL,
			   *query = NULL;
	const char *problem;
	const char *q;
	int64		n;

	memset(d, 0, sizeof(EgRedisDest));
	d->mkstream = true;
	d->port = EG_REDIS_DEFAULT_PORT;
	if (!eg_is_redis_url(url))
		return "a RedisStream endpoint starts with redis:// (or rediss://) and a host";
	d->tls = url[5] == 's';
#ifndef EG_HAVE_REDIS_TLS
	if (d->tls)
		return "rediss:// (Redis over TLS) needs hiredis 1.0 or later with TLS, which this build of eventgrid lacks";
#endif
	problem = eg_destination_url(url, d->tls ? 6 : 5, d->host, sizeof(d->host), &d->port, &path, &query);
	if (problem == NULL && path != NULL && strcmp(path, "/") != 0 && path[0] != '\0')
	{
		if (!parse_number(path + 1, 0, PG_INT32_MAX, &n))
			problem = "the path must be empty or /<database number> (0-2147483647)";
		else
			d->db = (int) n;
	}
	if (problem == NULL)
		problem = parse_query(query, d);
	q = strchr(url, '?');
	d->key_len = q ? (int) (q - url) : (int) strlen(url);
	curl_free(path);
	curl_free(query);
	return problem;
}

/*
 * SQL: eventgrid._endpoint_credentials(endpoint text, OUT endpoint text,
 * OUT user_name text, OUT password text): a RedisStream or RabbitMQ
 * endpoint with a user name and password (redis://[user]:password@host...,
 * amqp[s]://user:password@host...) split into the
 * endpoint without them (libcurl's form of the URL) and the two, decoded;
 * any other endpoint, or one libcurl cannot parse, as it is with NULLs
 * (the endpoint's check refuses it then).  The configuration functions
 * store the endpoint in event_subscriptions and the credentials in
 * destination_credentials, which only the extension's owner reads.
 */
PG_FUNCTION_INFO_V1(eventgrid_endpoint_credentials);

Datum
eventgrid_endpoint_credentials(PG_FUNCTION_ARGS)
{
	char	   *url = text_to_cstring(PG_GETARG_TEXT_PP(0));
	TupleDesc	desc;
	Datum		values[3];
	bool		nulls[3] = {false, true, true};
	CURLU	   *h;
	char	   *user = NULL,
			   *password = NULL,
			   *stripped = NULL;

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "eventgrid: _endpoint_credentials must return a row");
	values[0] = PG_GETARG_DATUM(0);
	h = curl_url();
	if (h == NULL)
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("eventgrid: out of memory")));
	if ((eg_is_redis_url(url) || eg_is_amqp_url(url)) &&
		curl_url_set(h, CURLUPART_URL, url, CURLU_NON_SUPPORT_SCHEME) == CURLUE_OK &&
		curl_url_get(h, CURLUPART_PASSWORD, &password, CURLU_URLDECODE) == CURLUE_OK)
	{
		if (curl_url_get(h, CURLUPART_USER, &user, CURLU_URLDECODE) == CURLUE_OK && user[0] != '\0')
		{
			values[1] = CStringGetTextDatum(user);
			nulls[1] = false;
		}
		values[2] = CStringGetTextDatum(password);
		nulls[2] = false;
		if (curl_url_set(h, CURLUPART_USER, NULL, 0) != CURLUE_OK ||
			curl_url_set(h, CURLUPART_PASSWORD, NULL, 0) != CURLUE_OK ||
			curl_url_get(h, CURLUPART_URL, &stripped, 0) != CURLUE_OK)
			ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("eventgrid: out of memory")));
		values[0] = CStringGetTextDatum(stripped);
		explicit_bzero(password, strlen(password));
	}
	curl_free(user);
	curl_free(password);
	curl_free(stripped);
	curl_url_cleanup(h);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}

/* ---- the request (main thread) ---- */

/*
 * Main thread: req's connection credentials, as hiredis's AUTH command
 * (AUTH [user] password) in req->auth_line (malloc'd; the HTTP thread
 * clears and frees it, or eg_http_free_body() for a request never sent).
 */
void
eg_redis_request_auth(EgRequest *req, const char *user, const char *password)
{
	const char *argv[3] = {"AUTH"};
	size_t		lens[3] = {4};
	int			argc = 1;
	char	   *cmd = NULL;
	long long	len;

	if (user != NULL)
	{
		argv[argc] = user;
		lens[argc++] = strlen(user);
	}
	argv[argc] = password;
	lens[argc++] = strlen(password);
	len = redisFormatCommandArgv(&cmd, argc, argv, lens);
	if (len < 0 || cmd == NULL)
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("eventgrid: out of memory for a Redis AUTH")));
	req->auth_line = cmd;		/* NUL-terminated by hiredis */
}

EgOutcomeCode
eg_redis_request_build(EgRequest *req, const EgRedisDest *d, const char *event_id, const EgEventPart *event,
					   const char *ordering_key)
{
	const char *argv[12];
	size_t		lens[12];
	int			argc = 0;
	char		maxlen[24];
	const char *body;
	int			body_len;
	char	   *cmd = NULL;
	long long	len;
	char		subject[EG_REDIS_MAX_STREAM_BYTES + 1];
	const char *stream = eg_message_key(d->stream_from, d->stream, event, ordering_key, subject, sizeof(subject));

	if (stream == NULL || stream[0] == '\0')
		return EG_OUTCOME_INVALID_HEADER;
#define ARG(s, n) do { argv[argc] = (s); lens[argc] = (n); argc++; } while (0)
	/* the event itself, not the one-element array a webhook's body is (Event Grid's queue messages) */
	body = eg_to_utf8(event->json, event->len, &body_len);
	if (body == NULL)
		return EG_OUTCOME_INVALID_ENCODING;
	ARG("XADD", 4);
	ARG(stream, strlen(stream));
	if (!d->mkstream)
		ARG("NOMKSTREAM", 10);
	if (d->maxlen > 0)
	{
		snprintf(maxlen, sizeof(maxlen), INT64_FORMAT, d->maxlen);
		ARG("MAXLEN", 6);
		ARG("~", 1);
		ARG(maxlen, strlen(maxlen));
	}
	ARG("*", 1);
	if (event_id != NULL)
	{
		ARG("id", 2);
		ARG(event_id, strlen(event_id));
	}
	ARG("event", 5);
	ARG(body, body_len);
#undef ARG
	len = redisFormatCommandArgv(&cmd, argc, argv, lens);
	if (body != event->json)
		pfree((char *) body);
	if (len < 0 || cmd == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("eventgrid: out of memory for a Redis command of %d bytes", body_len)));
	req->body = cmd;			/* malloc'd by hiredis; freed with free() like every body */
	req->body_len = (size_t) len;
	return EG_OUTCOME_NONE;
}
