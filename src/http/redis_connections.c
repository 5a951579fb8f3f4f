/*
 * redis_connections.c - the RedisStream destination's connections (SPEC
 * 21), on the HTTP thread: hiredis's asynchronous API driven beside
 * libcurl.  A connection per endpoint (its URL before the '?') and
 * credentials, whose socket joins libcurl's wait (curl_multi_poll's extra
 * descriptors) with the events hiredis asks for.  Requests to a connection
 * are pipelined; its replies come in order.  A connection authenticates
 * first when its subscription has credentials (AUTH [user] password: they
 * are part of the connection's key, so subscriptions with other
 * credentials never share it), and a database other than 0 is SELECTed;
 * nothing is written before those answers (an entry must never land in
 * database 0, nor go unauthenticated).  Each request has
 * eventgrid.response_timeout: a connection whose oldest request is past it
 * is closed, and everything on it ends TimedOut.  What each reply means is
 * redis_stream.c's file comment.
 *
 * Like the rest of the HTTP thread, nothing here calls into PostgreSQL:
 * plain C, malloc and hiredis only.
 */
#include "http/broker.h"
#include "http/redis_stream.h"

#include <arpa/inet.h>

#include <curl/curl.h>
#include <hiredis/hiredis.h>
#include <hiredis/async.h>
#ifdef EG_HAVE_REDIS_TLS
#include <hiredis/hiredis_ssl.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#endif

/* ---- connections (the HTTP thread only) ---- */

typedef struct RedisConn
{
	EgBrokerKey id;				/* the endpoint's URL before its '?', and its AUTH command */
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

static EgBrokerTable table;

#define CONN(i) ((RedisConn *) table.conns[i])

/* Ends every request of c not written yet as transport (SocketError or TimedOut). */
static void
end_waiting(RedisConn *c, EgTransport transport, int status, const char *text)
{
	EgRequest  *req;

	while ((req = eg_request_pop(&c->waiting, &c->waiting_tail)) != NULL)
		eg_broker_end(req, transport, status, text);
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
		eg_request_pop(&c->sent, &c->sent_tail);
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
		eg_broker_end(req, c->timed_out ? EG_TRANSPORT_TIMEOUT : EG_TRANSPORT_SOCKET, 0,
					c->timed_out ? "no reply from Redis within eventgrid.response_timeout"
					: ac->errstr[0] ? ac->errstr : "the connection to Redis was closed");
	else if (reply->type == REDIS_REPLY_ERROR)
		eg_broker_end(req, EG_TRANSPORT_OK, error_status(reply->str), reply->str);
	else if (reply->type == REDIS_REPLY_NIL)
		eg_broker_end(req, EG_TRANSPORT_OK, 404, "the stream does not exist (mkstream=false)");
	else
		eg_broker_end(req, EG_TRANSPORT_OK, 201, NULL);
}

/* Writes req on c (ready): hiredis queues its bytes and calls on_reply with its answer. */
static void
write_request(RedisConn *c, EgRequest *req)
{
	if (c->ac == NULL ||
		redisAsyncFormattedCommand(c->ac, on_reply, req, req->body, req->body_len) != REDIS_OK)
	{
		eg_broker_end(req, EG_TRANSPORT_SOCKET, 0, "the connection to Redis is closing");
		return;
	}
	eg_request_push(&c->sent, &c->sent_tail, req);
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
		while ((req = eg_request_pop(&c->waiting, &c->waiting_tail)) != NULL)
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

#ifdef EG_HAVE_REDIS_TLS
static SSL_CTX *tls_ctx = NULL; /* rediss:// connections' (the HTTP thread's) */
static char *tls_ctx_ca = NULL; /* the CA file tls_ctx verifies against ("": the system's store) */

/*
 * Starts TLS on ac, whose connect has begun (hiredis goes on with the
 * handshake as the socket allows): the server's certificate verified
 * against ca_file (or the system's store) and required to name host (an
 * address as an IP address, a name as a DNS name, also sent as SNI), as
 * libcurl checks the webhooks'.  NULL, or why not.
 */
static const char *
start_tls(redisAsyncContext *ac, const char *host, const char *ca_file)
{
	SSL		   *ssl;
	unsigned char addr[16];
	bool		is_address = inet_pton(AF_INET, host, addr) == 1 || inet_pton(AF_INET6, host, addr) == 1;

	if (tls_ctx == NULL || strcmp(tls_ctx_ca, ca_file) != 0)
	{
		if (tls_ctx != NULL)
			SSL_CTX_free(tls_ctx);
		free(tls_ctx_ca);
		tls_ctx_ca = NULL;
		tls_ctx = SSL_CTX_new(TLS_client_method());
		if (tls_ctx == NULL)
			return "could not set up TLS";
		SSL_CTX_set_verify(tls_ctx, SSL_VERIFY_PEER, NULL);
		SSL_CTX_set_min_proto_version(tls_ctx, TLS1_2_VERSION);
		if ((ca_file[0] != '\0' ? SSL_CTX_load_verify_locations(tls_ctx, ca_file, NULL)
			 : SSL_CTX_set_default_verify_paths(tls_ctx)) != 1 ||
			(tls_ctx_ca = strdup(ca_file)) == NULL)
		{
			SSL_CTX_free(tls_ctx);
			tls_ctx = NULL;
			return "could not load the CA certificates for rediss://";
		}
	}
	ssl = SSL_new(tls_ctx);
	if (ssl == NULL)
		return "could not set up TLS";
	if (is_address ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host) != 1
		: SSL_set_tlsext_host_name(ssl, host) != 1 || SSL_set1_host(ssl, host) != 1)
	{
		SSL_free(ssl);
		return "could not set up TLS for the server's name";
	}
	/* hiredis owns ssl from here */
	if (redisInitiateSSL(&ac->c, ssl) != REDIS_OK)
		return ac->c.errstr[0] ? ac->c.errstr : "could not start TLS";
	return NULL;
}
#endif

/* Opens c's connection (its endpoint parsed again from the URL); false with req ended if it cannot. */
static bool
open_conn(RedisConn *c, EgRequest *req, const char *ca_file)
{
	EgRedisDest d;
	const char *problem = eg_redis_parse(req->url, &d);
	redisAsyncContext *ac;

	if (problem != NULL)
	{
		eg_broker_end(req, EG_TRANSPORT_SOCKET, 0, problem);
		return false;
	}
	ac = redisAsyncConnect(d.host, d.port);
	if (ac == NULL || ac->err)
	{
		eg_broker_end(req, EG_TRANSPORT_SOCKET, 0, ac && ac->errstr[0] ? ac->errstr : "could not connect to Redis");
		if (ac)
			redisAsyncFree(ac);
		return false;
	}
#ifdef EG_HAVE_REDIS_TLS
	if (d.tls && (problem = start_tls(ac, d.host, ca_file)) != NULL)
	{
		eg_broker_end(req, EG_TRANSPORT_SOCKET, 0, problem);
		redisAsyncFree(ac);
		return false;
	}
#endif
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

/*
 * The connection of req's endpoint and credentials (opened if need be), or
 * NULL with req ended.  Its key: the URL before the '?', a newline, and
 * the AUTH command if any.
 */
static RedisConn *
conn_for(EgRequest *req, const char *ca_file)
{
	const char *q = strchr(req->url, '?');
	RedisConn  *c = eg_broker_conn_for(&table, sizeof(RedisConn), req->url,
									   q ? (size_t) (q - req->url) : strlen(req->url), req->auth_line);

	if (c == NULL)
	{
		eg_broker_end(req, EG_TRANSPORT_SOCKET, 0, "out of memory for a Redis connection");
		return NULL;
	}
	if (c->ac == NULL && !open_conn(c, req, ca_file))
		return NULL;
	return c;
}

/*
 * HTTP thread: sends req (a RedisStream request: its body is the command);
 * it comes back through eg_http_finish().
 */
void
eg_redis_send(EgRequest *req, const char *ca_file)
{
	RedisConn  *c;

	req->duration_ms = eg_mono_ms();	/* its start, until it ends */
	req->next = NULL;
	c = conn_for(req, ca_file);
	if (c == NULL)
		return;
	if (c->ready)
		write_request(c, req);
	else
		eg_request_push(&c->waiting, &c->waiting_tail, req);
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

/* HTTP thread: how many descriptors eg_redis_wait_fds may add. */
int
eg_redis_fd_count(void)
{
	return table.n;
}

/*
 * HTTP thread: the sockets of the open connections, with the events hiredis
 * wants, for curl_multi_poll's extra descriptors, into fds[n..cap); returns
 * the new count; *timeout_ms is lowered so that the wait ends by the next
 * request's deadline.
 */
int
eg_redis_wait_fds(struct curl_waitfd *fds, int n, int cap, int *timeout_ms)
{
	double		now = eg_mono_ms();

	for (int i = 0; i < table.n; i++)
	{
		RedisConn  *c = CONN(i);
		double		deadline = oldest_deadline(c);

		if (deadline > 0)
			*timeout_ms = Max(0, Min(*timeout_ms, (int) (deadline - now) + 1));
		if (c->ac == NULL || (!c->want_read && !c->want_write) || n >= cap)
			continue;
		fds[n].fd = c->ac->c.fd;
		fds[n].events = (c->want_read ? CURL_WAIT_POLLIN : 0) | (c->want_write ? CURL_WAIT_POLLOUT : 0);
		fds[n].revents = 0;
		n++;
	}
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
		for (int i = 0; i < table.n; i++)
		{
			RedisConn  *c = CONN(i);

			if (c->ac == NULL || c->ac->c.fd != fds[k].fd)
				continue;
			if (fds[k].revents & CURL_WAIT_POLLIN)
				redisAsyncHandleRead(c->ac);
			if (c->ac != NULL && (fds[k].revents & CURL_WAIT_POLLOUT))
				redisAsyncHandleWrite(c->ac);
			break;
		}
	}
	now = eg_mono_ms();
	for (int i = 0; i < table.n;)
	{
		RedisConn  *c = CONN(i);
		double		deadline = oldest_deadline(c);

		if (deadline > 0 && deadline <= now)
		{
			c->timed_out = true;
			close_conn(c);
			c->timed_out = false;
		}
		if (c->ac == NULL && c->sent == NULL && c->waiting == NULL)
		{
			eg_broker_conn_forget(&table, i);
			continue;
		}
		i++;
	}
}

/* The HTTP thread has stopped (or is stopping): every connection is closed and forgotten. */
void
eg_redis_close_all(void)
{
	while (table.n > 0)
	{
		close_conn(CONN(table.n - 1));
		eg_broker_conn_forget(&table, table.n - 1);
	}
	free(table.conns);
	table.conns = NULL;
	table.cap = 0;
#ifdef EG_HAVE_REDIS_TLS
	if (tls_ctx != NULL)
		SSL_CTX_free(tls_ctx);
	tls_ctx = NULL;
	free(tls_ctx_ca);
	tls_ctx_ca = NULL;
#endif
}
