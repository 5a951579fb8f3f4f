/*
 * redis_stream.c - the RedisStream destination (SPEC 21) through hiredis.
 *
 * The endpoint is redis://host[:port][/db]?stream=S[&maxlen=N][&mkstream=false],
 * parsed by libcurl's URL API (the same parser as the webhooks' URLs).  A
 * stored endpoint holds no credentials: create_event_subscription() takes
 * them out of the URL it was given (_endpoint_credentials()) into
 * destination_credentials, and the worker reads them with each claim.  Each event becomes
 * one entry: XADD S [NOMKSTREAM] [MAXLEN ~ N] * id <event id> event <JSON>,
 * formatted on the main thread (redisFormatCommandArgv) into the request's
 * body, so that the HTTP thread only writes bytes.
 *
 * The HTTP thread drives hiredis's asynchronous API beside libcurl: a
 * connection per endpoint (its URL before the '?'), whose socket joins
 * libcurl's wait (curl_multi_poll's extra descriptors) with the events
 * hiredis asks for.  Requests to a connection are pipelined; its replies
 * come in order.  A connection authenticates first when its subscription
 * has credentials (AUTH [user] password: they are part of the connection's
 * key, so subscriptions with other credentials never share it), and a
 * database other than 0 is SELECTed; nothing is written before those
 * answers (an entry must never land in database 0, nor go unauthenticated).
 * Each request has eventgrid.response_timeout: a connection whose oldest
 * request is past it is closed, and everything on it ends TimedOut.
 *
 * What a reply means, as the HTTP status Event Grid's policy treats alike
 * (outcome.c; the history records no HTTP status for it): an entry id is
 * 201 (Delivered); a nil reply (NOMKSTREAM, no such stream) or a database
 * SELECT refuses is 404 (NotFound); a refused AUTH, NOAUTH, WRONGPASS, NOPERM are 401
 * (Unauthorized); OOM is 507 (Full); LOADING, BUSY, TRYAGAIN, MASTERDOWN,
 * READONLY are 503 (Busy); other errors 500 (GenericError).  The error's
 * text is the answer the attempt history keeps.  A connection that fails
 * or closes ends its requests as SocketError.
 *
 * Like the rest of the HTTP thread, the thread side never calls into
 * PostgreSQL: plain C, malloc and hiredis only.
 */
#include "http/redis_stream.h"
#include "http/url.h"

#include "access/htup_details.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/builtins.h"

#include <time.h>

#include <curl/curl.h>
#include <hiredis/hiredis.h>
#include <hiredis/async.h>

/* ---- the endpoint URL (both threads: no PostgreSQL calls) ---- */

/* A query value decoded into out (of size cap); false when it does not fit or holds a NUL. */
static bool
decode_value(const char *value, char *out, size_t cap)
{
	int			len = 0;
	char	   *decoded = curl_easy_unescape(NULL, value, 0, &len);
	bool		ok = decoded != NULL && len > 0 && (size_t) len < cap && memchr(decoded, '\0', len) == NULL;

	if (ok)
	{
		memcpy(out, decoded, len);
		out[len] = '\0';
	}
	curl_free(decoded);
	return ok;
}

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
		if (!decode_value(eq + 1, value, sizeof(value)))
			return "a query parameter's value is empty, longer than 512 bytes or holds a NUL";
		if (strcmp(p, "stream") == 0 && !seen_stream)
		{
			strcpy(d->stream, value);
			seen_stream = true;
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
			return "the query takes stream, maxlen and mkstream, each once";
	}
	if (!seen_stream)
		return "the URL names no stream: add ?stream=<key>";
	return NULL;
}

/*
 * Parses a RedisStream endpoint into *d: scheme redis (lower case), "://"
 * and a host of at most 255 bytes, a port from 1 to 65535 (6379), a path
 * that is empty, "/" or "/<db>" (0-2147483647; 0), no user name or
 * password, no fragment, at most EG_MAX_ENDPOINT_BYTES bytes, and the query
 * above.  NULL, or why not (a static string).  (rediss://, TLS, is not
 * taken: Debian 12's hiredis has no TLS.)
 */
const char *
eg_redis_parse(const char *url, EgRedisDest *d)
{
	CURLU	   *h;
	char	   *host = NULL,
			   *port = NULL,
			   *path = NULL,
			   *query = NULL,
			   *user = NULL,
			   *password = NULL,
			   *fragment = NULL;
	const char *problem = NULL;
	const char *q;
	int64		n;
	CURLUcode	rc;

	memset(d, 0, sizeof(EgRedisDest));
	d->mkstream = true;
	d->port = EG_REDIS_DEFAULT_PORT;
	if (strlen(url) > EG_MAX_ENDPOINT_BYTES)
		return "the endpoint is longer than 2048 bytes";
	if (!eg_is_redis_url(url) || url[8] == '/' || url[8] == '\0')
		return "a RedisStream endpoint starts with redis:// and a host";
	for (const unsigned char *p = (const unsigned char *) url; *p; p++)
		if (*p <= ' ' || *p == 0x7f)
			return "the URL holds a space or a control character";
	h = curl_url();
	if (h == NULL)
		return "out of memory";
	if ((rc = curl_url_set(h, CURLUPART_URL, url, CURLU_NON_SUPPORT_SCHEME)) != CURLUE_OK)
		problem = rc == CURLUE_BAD_PORT_NUMBER ? "Port number was not a decimal number between 1 and 65535"
			: "libcurl cannot parse it as a URL";
	else if (curl_url_get(h, CURLUPART_USER, &user, 0) == CURLUE_OK ||
			 curl_url_get(h, CURLUPART_PASSWORD, &password, 0) == CURLUE_OK)
		problem = "the URL holds a user name or password";
	else if (curl_url_get(h, CURLUPART_FRAGMENT, &fragment, 0) == CURLUE_OK)
		problem = "the URL holds a fragment (#...)";
	else if (curl_url_get(h, CURLUPART_HOST, &host, 0) != CURLUE_OK || host[0] == '\0' ||
			 strlen(host) >= sizeof(d->host))
		problem = "the URL has no host after redis:// (or one longer than 255 bytes)";
	else if (curl_url_get(h, CURLUPART_PORT, &port, 0) == CURLUE_OK &&
			 !parse_number(port, 1, 65535, &n))
		problem = "Port number was not a decimal number between 1 and 65535";
	else
	{
		if (port != NULL)
			d->port = (int) n;
		strcpy(d->host, host);
		/* IPv6: libcurl gives "[::1]"; hiredis connects to "::1" */
		if (d->host[0] == '[')
		{
			size_t		len = strlen(d->host);

			memmove(d->host, d->host + 1, len - 2);
			d->host[len - 2] = '\0';
		}
		if (curl_url_get(h, CURLUPART_PATH, &path, 0) == CURLUE_OK && strcmp(path, "/") != 0 && path[0] != '\0')
		{
			if (!parse_number(path + 1, 0, PG_INT32_MAX, &n))
				problem = "the path must be empty or /<database number> (0-2147483647)";
			else
				d->db = (int) n;
		}
		if (problem == NULL)
		{
			curl_url_get(h, CURLUPART_QUERY, &query, 0);
			problem = parse_query(query, d);
		}
	}
	q = strchr(url, '?');
	d->key_len = q ? (int) (q - url) : (int) strlen(url);
	curl_free(host);
	curl_free(port);
	curl_free(path);
	curl_free(query);
	curl_free(user);
	curl_free(password);
	curl_free(fragment);
	curl_url_cleanup(h);
	return problem;
}

/*
 * SQL: eventgrid._endpoint_credentials(endpoint text, OUT endpoint text,
 * OUT user_name text, OUT password text): a RedisStream endpoint with a
 * user name and password (redis://[user]:password@host...) split into the
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
	if (eg_is_redis_url(url) &&
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
eg_redis_request_build(EgRequest *req, const EgRedisDest *d, const char *event_id, const EgEventPart *event)
{
	const char *argv[12];
	size_t		lens[12];
	int			argc = 0;
	char		maxlen[24];
	const char *body;
	int			body_len;
	char	   *cmd = NULL;
	long long	len;

#define ARG(s, n) do { argv[argc] = (s); lens[argc] = (n); argc++; } while (0)
	/* the event itself, not the one-element array a webhook's body is (Event Grid's queue messages) */
	body = eg_to_utf8(event->json, event->len, &body_len);
	if (body == NULL)
		return EG_OUTCOME_INVALID_ENCODING;
	ARG("XADD", 4);
	ARG(d->stream, strlen(d->stream));
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

/* ---- connections (the HTTP thread only) ---- */

typedef struct RedisConn
{
	char	   *key;			/* the endpoint's URL before its '?', and its AUTH command (malloc'd) */
	size_t		key_len;
	redisAsyncContext *ac;		/* NULL once closed */
	bool		want_read;
	bool		want_write;
	int			handshake;		/* AUTH and SELECT sent and not yet answered */
	bool		ready;			/* the handshake is done: requests may be written */
	bool		timed_out;		/* closed for a request past its time: its requests are TimedOut */
	EgRequest  *waiting;		/* not written yet (before ready), in order */
	EgRequest  *waiting_tail;
	EgRequest  *sent;			/* written, awaiting replies, in order */
	EgRequest  *sent_tail;
} RedisConn;

static RedisConn **conns = NULL;
static int	nconns = 0;
static int	conns_cap = 0;
static struct curl_waitfd *wait_fds = NULL;
static int	wait_cap = 0;

/* Milliseconds on CLOCK_MONOTONIC (a request's start and deadline; the wall clock may step). */
static double
mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec * 1000.0 + (double) ts.tv_nsec / 1e6;
}

static void
push(EgRequest **head, EgRequest **tail, EgRequest *req)
{
	req->next = NULL;
	if (*tail)
		(*tail)->next = req;
	else
		*head = req;
	*tail = req;
}

static EgRequest *
pop(EgRequest **head, EgRequest **tail)
{
	EgRequest  *req = *head;

	if (req)
	{
		*head = req->next;
		if (*head == NULL)
			*tail = NULL;
		req->next = NULL;
	}
	return req;
}

/*
 * Ends req: its duration (it held its start time since eg_redis_send), the
 * answer text kept for the history, and back to the main thread.
 */
static void
end_request(EgRequest *req, EgTransport transport, int status, const char *text)
{
	req->duration_ms = mono_ms() - req->duration_ms;
	if (text != NULL)
	{
		if (transport == EG_TRANSPORT_OK)
		{
			req->response_head_len = (int) Min(strlen(text), (size_t) EG_RESPONSE_HEAD_BYTES);
			memcpy(req->response_head, text, req->response_head_len);
		}
		else
			snprintf(req->errbuf, sizeof(req->errbuf), "%s", text);
	}
	eg_http_finish(req, transport, status);
}

/* Ends every request of c not written yet as transport (SocketError or TimedOut). */
static void
end_waiting(RedisConn *c, EgTransport transport, int status, const char *text)
{
	EgRequest  *req;

	while ((req = pop(&c->waiting, &c->waiting_tail)) != NULL)
		end_request(req, transport, status, text);
}

/* The HTTP status an error reply is treated as (see the file's comment). */
static int
error_status(const char *err)
{
	static const struct
	{
		const char *prefix;
		int			status;
	}			map[] = {
		{"NOAUTH", 401}, {"WRONGPASS", 401}, {"NOPERM", 401},
		{"OOM", 507},
		{"LOADING", 503}, {"BUSY", 503}, {"TRYAGAIN", 503}, {"MASTERDOWN", 503}, {"READONLY", 503},
	};

	for (int i = 0; i < (int) lengthof(map); i++)
	{
		size_t		n = strlen(map[i].prefix);

		if (strncmp(err, map[i].prefix, n) == 0 && (err[n] == ' ' || err[n] == '\0'))
			return map[i].status;
	}
	return 500;
}

/* hiredis: the reply to one XADD (NULL: the connection failed or was closed). */
static void
on_reply(redisAsyncContext *ac, void *r, void *privdata)
{
	RedisConn  *c = ac->data;
	redisReply *reply = r;
	EgRequest  *req = privdata;

	/* replies come in order: req is the oldest written */
	if (c->sent == req)
		pop(&c->sent, &c->sent_tail);
	else
	{
		for (EgRequest *p = c->sent; p != NULL; p = p->next)
			if (p->next == req)
			{
				p->next = req->next;
				if (c->sent_tail == req)
					c->sent_tail = p;
				break;
			}
		req->next = NULL;
	}
	if (reply == NULL)
		end_request(req, c->timed_out ? EG_TRANSPORT_TIMEOUT : EG_TRANSPORT_SOCKET, 0,
					c->timed_out ? "no reply from Redis within eventgrid.response_timeout"
					: ac->errstr[0] ? ac->errstr : "the connection to Redis was closed");
	else if (reply->type == REDIS_REPLY_ERROR)
		end_request(req, EG_TRANSPORT_OK, error_status(reply->str), reply->str);
	else if (reply->type == REDIS_REPLY_NIL)
		end_request(req, EG_TRANSPORT_OK, 404, "the stream does not exist (mkstream=false)");
	else
		end_request(req, EG_TRANSPORT_OK, 201, NULL);
}

/* Writes req on c (ready): hiredis queues its bytes and calls on_reply with its answer. */
static void
write_request(RedisConn *c, EgRequest *req)
{
	if (c->ac == NULL ||
		redisAsyncFormattedCommand(c->ac, on_reply, req, req->body, req->body_len) != REDIS_OK)
	{
		end_request(req, EG_TRANSPORT_SOCKET, 0, "the connection to Redis is closing");
		return;
	}
	push(&c->sent, &c->sent_tail, req);
}

/*
 * hiredis: the answer to AUTH or SELECT (a request of the handshake); once
 * every one is answered, the requests that waited go.  A refusal ends them
 * (and the connection): AUTH's as Unauthorized, SELECT's as NotFound (or
 * what its error means, e.g. NOAUTH).
 */
static void
handshake_reply(redisAsyncContext *ac, redisReply *reply, RedisConn *c, int refused_status)
{
	EgRequest  *req;

	if (reply != NULL && reply->type == REDIS_REPLY_STATUS)
	{
		if (--c->handshake > 0)
			return;
		c->ready = true;
		while ((req = pop(&c->waiting, &c->waiting_tail)) != NULL)
			write_request(c, req);
	}
	else if (reply != NULL && reply->type == REDIS_REPLY_ERROR)
	{
		int			status = error_status(reply->str);

		/* nothing may be written on this connection */
		end_waiting(c, EG_TRANSPORT_OK, status == 500 ? refused_status : status, reply->str);
		redisAsyncDisconnect(ac);
	}
	else
		end_waiting(c, c->timed_out ? EG_TRANSPORT_TIMEOUT : EG_TRANSPORT_SOCKET, 0,
					ac->errstr[0] ? ac->errstr : "the connection to Redis was closed");
}

static void
on_auth(redisAsyncContext *ac, void *r, void *privdata)
{
	handshake_reply(ac, r, privdata, 401);
}

static void
on_select(redisAsyncContext *ac, void *r, void *privdata)
{
	handshake_reply(ac, r, privdata, 404);
}

static void
on_connect(const redisAsyncContext *ac, int status)
{
	RedisConn  *c = ac->data;

	if (status != REDIS_OK)
	{
		/* hiredis frees the context after this, and fails what it holds */
		c->ac = NULL;
		c->want_read = c->want_write = false;
		end_waiting(c, EG_TRANSPORT_SOCKET, 0, ac->errstr[0] ? ac->errstr : "could not connect to Redis");
	}
}

static void
on_disconnect(const redisAsyncContext *ac, int status)
{
	RedisConn  *c = ac->data;

	c->ac = NULL;
	c->want_read = c->want_write = false;
	end_waiting(c, c->timed_out ? EG_TRANSPORT_TIMEOUT : EG_TRANSPORT_SOCKET, 0,
				ac->errstr[0] ? ac->errstr : "the connection to Redis was closed");
}

/* hiredis's event hooks: they only say which events the next wait asks for. */
static void
add_read(void *p)
{
	((RedisConn *) p)->want_read = true;
}

static void
del_read(void *p)
{
	((RedisConn *) p)->want_read = false;
}

static void
add_write(void *p)
{
	((RedisConn *) p)->want_write = true;
}

static void
del_write(void *p)
{
	((RedisConn *) p)->want_write = false;
}

static void
cleanup(void *p)
{
	((RedisConn *) p)->want_read = ((RedisConn *) p)->want_write = false;
}

/* Opens c's connection (its endpoint parsed again from the URL); false with req ended if it cannot. */
static bool
open_conn(RedisConn *c, EgRequest *req)
{
	EgRedisDest d;
	const char *problem = eg_redis_parse(req->url, &d);
	redisAsyncContext *ac;

	if (problem != NULL)
	{
		end_request(req, EG_TRANSPORT_SOCKET, 0, problem);
		return false;
	}
	ac = redisAsyncConnect(d.host, d.port);
	if (ac == NULL || ac->err)
	{
		end_request(req, EG_TRANSPORT_SOCKET, 0, ac && ac->errstr[0] ? ac->errstr : "could not connect to Redis");
		if (ac)
			redisAsyncFree(ac);
		return false;
	}
	c->ac = ac;
	c->timed_out = false;
	c->want_read = c->want_write = false;
	ac->data = c;
	ac->ev.data = c;
	ac->ev.addRead = add_read;
	ac->ev.delRead = del_read;
	ac->ev.addWrite = add_write;
	ac->ev.delWrite = del_write;
	ac->ev.cleanup = cleanup;
	/* the connect has begun: the first write tells when it is done */
	c->want_write = true;
	redisAsyncSetConnectCallback(ac, on_connect);
	redisAsyncSetDisconnectCallback(ac, on_disconnect);
	c->handshake = 0;
	if (req->auth_line != NULL)
	{
		redisAsyncFormattedCommand(ac, on_auth, c, req->auth_line, strlen(req->auth_line));
		c->handshake++;
	}
	if (d.db != 0)
	{
		char		db[16];
		const char *argv[2] = {"SELECT", db};
		size_t		lens[2];

		snprintf(db, sizeof(db), "%d", d.db);
		lens[0] = 6;
		lens[1] = strlen(db);
		redisAsyncCommandArgv(ac, on_select, c, 2, argv, lens);
		c->handshake++;
	}
	c->ready = c->handshake == 0;
	return true;
}

/* Forgets c, clearing its key (which holds its credentials). */
static void
free_conn(RedisConn *c)
{
	if (c->key != NULL)
	{
		explicit_bzero(c->key, c->key_len);
		free(c->key);
	}
	free(c);
}

/*
 * The connection of req's endpoint and credentials (opened if need be), or
 * NULL with req ended.  Its key: the URL before the '?', a newline, and
 * the AUTH command if any.
 */
static RedisConn *
conn_for(EgRequest *req)
{
	const char *q = strchr(req->url, '?');
	size_t		url_len = q ? (size_t) (q - req->url) : strlen(req->url);
	size_t		auth_len = req->auth_line ? strlen(req->auth_line) : 0;
	size_t		key_len = url_len + 1 + auth_len;
	RedisConn  *c = NULL;

	for (int i = 0; i < nconns; i++)
		if (conns[i]->key_len == key_len && strncmp(conns[i]->key, req->url, url_len) == 0 &&
			conns[i]->key[url_len] == '\n' &&
			(auth_len == 0 || memcmp(conns[i]->key + url_len + 1, req->auth_line, auth_len) == 0))
		{
			c = conns[i];
			break;
		}
	if (c == NULL)
	{
		if (nconns == conns_cap)
		{
			int			cap = Max(conns_cap * 2, 8);
			RedisConn **grown = realloc(conns, cap * sizeof(RedisConn *));

			if (grown == NULL)
			{
				end_request(req, EG_TRANSPORT_SOCKET, 0, "out of memory for a Redis connection");
				return NULL;
			}
			conns = grown;
			conns_cap = cap;
		}
		c = calloc(1, sizeof(RedisConn));
		if (c == NULL || (c->key = malloc(key_len + 1)) == NULL)
		{
			free(c);
			end_request(req, EG_TRANSPORT_SOCKET, 0, "out of memory for a Redis connection");
			return NULL;
		}
		memcpy(c->key, req->url, url_len);
		c->key[url_len] = '\n';
		if (auth_len > 0)
			memcpy(c->key + url_len + 1, req->auth_line, auth_len);
		c->key[key_len] = '\0';
		c->key_len = key_len;
		conns[nconns++] = c;
	}
	if (c->ac == NULL && !open_conn(c, req))
		return NULL;
	return c;
}

/*
 * HTTP thread: sends req (a RedisStream request: its body is the command);
 * it comes back through eg_http_finish().
 */
void
eg_redis_send(EgRequest *req)
{
	RedisConn  *c;

	req->duration_ms = mono_ms();	/* its start, until it ends */
	req->next = NULL;
	c = conn_for(req);
	if (c == NULL)
		return;
	if (c->ready)
		write_request(c, req);
	else
		push(&c->waiting, &c->waiting_tail, req);
}

/*
 * HTTP thread: closes c at once; what it holds ends TimedOut when c timed
 * out, else SocketError (hiredis fails what it wrote; this, what waited).
 */
static void
close_conn(RedisConn *c)
{
	redisAsyncContext *ac = c->ac;

	if (ac != NULL)
	{
		c->ac = NULL;
		redisAsyncFree(ac);		/* calls on_reply with NULL for each written request */
	}
	c->want_read = c->want_write = false;
	end_waiting(c, c->timed_out ? EG_TRANSPORT_TIMEOUT : EG_TRANSPORT_SOCKET, 0,
				c->timed_out ? "no reply from Redis within eventgrid.response_timeout"
				: "the worker is stopping");
}

/* The deadline of c's oldest request (ms on CLOCK_MONOTONIC), or 0 for none. */
static double
oldest_deadline(const RedisConn *c)
{
	double		first = 0;

	if (c->sent)
		first = c->sent->duration_ms + c->sent->timeout_ms;
	if (c->waiting && (first == 0 || c->waiting->duration_ms + c->waiting->timeout_ms < first))
		first = c->waiting->duration_ms + c->waiting->timeout_ms;
	return first;
}

/*
 * HTTP thread: the sockets of the open connections, with the events hiredis
 * wants, for curl_multi_poll's extra descriptors (*fds; their count is
 * returned); *timeout_ms is lowered so that the wait ends by the next
 * request's deadline.
 */
int
eg_redis_wait_fds(struct curl_waitfd **fds, int *timeout_ms)
{
	int			n = 0;
	double		now = mono_ms();

	if (nconns > wait_cap)
	{
		struct curl_waitfd *grown = realloc(wait_fds, conns_cap * sizeof(struct curl_waitfd));

		if (grown == NULL)
		{
			*fds = NULL;
			*timeout_ms = Min(*timeout_ms, 10);
			return 0;
		}
		wait_fds = grown;
		wait_cap = conns_cap;
	}
	for (int i = 0; i < nconns; i++)
	{
		RedisConn  *c = conns[i];
		double		deadline = oldest_deadline(c);

		if (deadline > 0)
			*timeout_ms = Max(0, Min(*timeout_ms, (int) (deadline - now) + 1));
		if (c->ac == NULL || (!c->want_read && !c->want_write))
			continue;
		wait_fds[n].fd = c->ac->c.fd;
		wait_fds[n].events = (c->want_read ? CURL_WAIT_POLLIN : 0) | (c->want_write ? CURL_WAIT_POLLOUT : 0);
		wait_fds[n].revents = 0;
		n++;
	}
	*fds = wait_fds;
	return n;
}

/*
 * HTTP thread: after the wait, hiredis reads and writes what is ready;
 * connections whose oldest request is past its deadline are closed
 * (TimedOut), and closed ones with nothing left are forgotten.
 */
void
eg_redis_after_wait(struct curl_waitfd *fds, int n)
{
	double		now;

	for (int k = 0; k < n; k++)
	{
		for (int i = 0; i < nconns; i++)
		{
			RedisConn  *c = conns[i];

			if (c->ac == NULL || c->ac->c.fd != fds[k].fd)
				continue;
			if (fds[k].revents & CURL_WAIT_POLLIN)
				redisAsyncHandleRead(c->ac);
			if (c->ac != NULL && (fds[k].revents & CURL_WAIT_POLLOUT))
				redisAsyncHandleWrite(c->ac);
			break;
		}
	}
	now = mono_ms();
	for (int i = 0; i < nconns;)
	{
		RedisConn  *c = conns[i];
		double		deadline = oldest_deadline(c);

		if (deadline > 0 && deadline <= now)
		{
			c->timed_out = true;
			close_conn(c);
			c->timed_out = false;
		}
		if (c->ac == NULL && c->sent == NULL && c->waiting == NULL)
		{
			free_conn(c);
			conns[i] = conns[--nconns];
			continue;
		}
		i++;
	}
}

/* The HTTP thread has stopped (or is stopping): every connection is closed and forgotten. */
void
eg_redis_close_all(void)
{
	for (int i = 0; i < nconns; i++)
	{
		close_conn(conns[i]);
		free_conn(conns[i]);
	}
	free(conns);
	conns = NULL;
	nconns = conns_cap = 0;
	free(wait_fds);
	wait_fds = NULL;
	wait_cap = 0;
}
