/*
 * listener.c - the HTTP listener (SPEC 16): a background worker of the
 * cluster, started when eventgrid.http_port is set, serving Event Grid's
 * data plane on eventgrid.http_listen_addresses (HTTPS with
 * eventgrid.http_ssl_cert_file and eventgrid.http_ssl_key_file).
 *
 * HTTP itself is libmicrohttpd's: one daemon per listen address, each in
 * its "external epoll" mode, so that every callback runs on this process's
 * only thread, between waits on its latch and the daemons' epoll sockets
 * (a WaitEventSet) that also watches the database connections (serve_db.c).
 * The listener reads a request's headers and body (at most EG_HTTP_MAX_BODY;
 * a larger Content-Length is 413 before the body is read), routes it by its
 * URL to one statement, starts that statement in the database the URL
 * names and suspends the request; the statement's result resumes it, and
 * it is answered.  Slow and idle clients are bounded by libmicrohttpd's
 * connection timeout and connection limit; each holds only its own
 * connection and at most EG_HTTP_MAX_BODY of memory.
 *
 * Nothing of a request reaches a log line: the listener logs its own
 * start, its sockets' failures and the database connections' failures.
 */
#include "serve/serve.h"

#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include "lib/ilist.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/memutils.h"
#include "utils/varlena.h"
#include "utils/wait_event.h"

#define EG_HTTP_MAX_DAEMONS 16

/* A request: its own memory, its body so far, its statement while the database runs it. */
typedef struct ListenerRequest
{
	MemoryContext cxt;
	StringInfoData body;
	struct MHD_Connection *conn;
	EgServeCall call;			/* call.status 0: not answered yet */
	bool		suspended;		/* waiting for its statement's result */
	TimestampTz read_at;		/* when it was read whole */
} ListenerRequest;

/*
 * A client connection, from libmicrohttpd's start notification to its
 * close: what the listener watches itself (watch_connections()).
 */
typedef struct ListenerConnection
{
	dlist_node	node;
	int			fd;
	TimestampTz request_started;	/* connected, or its last request answered */
	bool		in_request;		/* a whole request was read: running, or being answered */
	bool		cut;			/* shut down by the listener; libmicrohttpd closes it */
} ListenerConnection;

static dlist_head connections = DLIST_STATIC_INIT(connections);

#define EG_HTTP_WATCH_MS 100	/* how often connections that are not in a request are looked at */
#define EG_HTTP_LOG_BURST 10	/* libmicrohttpd's messages logged per minute; the rest are counted */

#define PUBLISH_SQL "SELECT status, answer FROM eventgrid._http_publish($1, $2, $3, $4, $5, $6, $7)"
#define NAMESPACE_SQL "SELECT status, answer FROM eventgrid._http_namespace($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"

extern PGDLLEXPORT void eventgrid_http_listener_main(Datum arg);

static void
disconnect_at_exit(int code, Datum arg)
{
	eg_serve_disconnect();
}

/* Queues an answer with a JSON body (none when body is ""). */
static enum MHD_Result
answer(struct MHD_Connection *conn, unsigned int status, const char *body)
{
	struct MHD_Response *resp;
	enum MHD_Result ret;

	resp = MHD_create_response_from_buffer(strlen(body), (void *) body, MHD_RESPMEM_MUST_COPY);
	if (resp == NULL)
		return MHD_NO;
	if (body[0] != '\0')
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json; charset=utf-8");
	ret = MHD_queue_response(conn, status, resp);
	MHD_destroy_response(resp);
	return ret;
}

static enum MHD_Result
answer_error(struct MHD_Connection *conn, unsigned int status, const char *code, const char *message)
{
	char	   *body = eg_serve_error_body(code, message);
	enum MHD_Result ret = answer(conn, status, body);

	pfree(body);
	return ret;
}

static const char *
header(struct MHD_Connection *conn, const char *name)
{
	return MHD_lookup_connection_value(conn, MHD_HEADER_KIND, name);
}

/*
 * The path's segments between slashes, when it has exactly n of them, none
 * empty; else NULL.  The path is as libmicrohttpd gives it (percent-decoded).
 */
static char **
path_segments(const char *url, int n)
{
	char	  **seg = palloc0(sizeof(char *) * n);
	char	   *copy = pstrdup(url);
	char	   *p = copy;

	if (*p != '/')
		return NULL;
	for (int i = 0; i < n; i++)
	{
		char	   *end;

		p++;
		end = strchr(p, '/');
		if (end != NULL)
			*end = '\0';
		if (*p == '\0' || (i < n - 1) != (end != NULL))
			return NULL;
		seg[i] = p;
		if (end != NULL)
			p = end;
	}
	return seg;
}

/*
 * A database or topic name from a URL: at most NAMEDATALEN - 1 bytes (a
 * database's) or 128 (a topic's), without control characters.
 */
static bool
name_ok(const char *s, size_t max)
{
	size_t		len = strlen(s);

	if (len == 0 || len > max)
		return false;
	for (; *s; s++)
		if ((unsigned char) *s < 0x20 || (unsigned char) *s == 0x7f)
			return false;
	return true;
}

/* The statement's result arrived: the request is answered when libmicrohttpd resumes it. */
static void
call_done(EgServeCall *call)
{
	ListenerRequest *req = call->arg;

	if (req->suspended)
	{
		req->suspended = false;
		MHD_resume_connection(req->conn);
	}
}

static const char *
query_arg(struct MHD_Connection *conn, const char *name)
{
	return MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, name);
}

/* The namespace operation a path's last segment names after its colon (NULL: none of them). */
static const char *
namespace_operation(char *segment)
{
	static const char *const ops[] = {"receive", "acknowledge", "release", "reject", "renewLock"};
	char	   *colon = strrchr(segment, ':');

	if (colon == NULL)
		return NULL;
	*colon = '\0';
	for (size_t i = 0; i < lengthof(ops); i++)
		if (strcmp(colon + 1, ops[i]) == 0)
			return ops[i];
	return strcmp(colon + 1, "publish") == 0 ? "publish" : NULL;
}

/*
 * Routes a whole request to its statement: a custom topic's
 * /{database}/topics/{topic}/api/events, a namespace topic's
 * /{database}/topics/{topic}:publish and
 * /{database}/topics/{topic}/eventsubscriptions/{subscription}:{operation}.
 * False when no route matches.
 */
static bool
route(struct MHD_Connection *conn, const char *url, EgServeCall *call)
{
	char	  **seg;
	const char *op = NULL;
	const char *topic = NULL;
	const char *subscription = NULL;

	if ((seg = path_segments(url, 5)) != NULL && strcmp(seg[1], "topics") == 0 &&
		strcmp(seg[3], "api") == 0 && strcmp(seg[4], "events") == 0)
		topic = seg[2];
	else if ((seg = path_segments(url, 3)) != NULL && strcmp(seg[1], "topics") == 0 &&
			 (op = namespace_operation(seg[2])) != NULL && strcmp(op, "publish") == 0)
		topic = seg[2];
	else if ((seg = path_segments(url, 5)) != NULL && strcmp(seg[1], "topics") == 0 &&
			 strcmp(seg[3], "eventsubscriptions") == 0 &&
			 (op = namespace_operation(seg[4])) != NULL && strcmp(op, "publish") != 0)
	{
		topic = seg[2];
		subscription = seg[4];
	}
	if (topic == NULL || !name_ok(seg[0], NAMEDATALEN - 1) || !name_ok(topic, 128) ||
		(subscription != NULL && !name_ok(subscription, 128)))
		return false;

	call->database = seg[0];
	call->topic = topic;
	call->long_poll = op != NULL && strcmp(op, "receive") == 0;
	if (op == NULL)
	{
		call->sql = PUBLISH_SQL;
		call->nparams = 7;
		call->params[0] = topic;
		call->params[1] = url;
		call->params[2] = header(conn, "aeg-sas-key");
		call->params[3] = header(conn, "aeg-sas-token");
		call->params[4] = header(conn, MHD_HTTP_HEADER_AUTHORIZATION);
		call->params[5] = header(conn, MHD_HTTP_HEADER_CONTENT_TYPE);
		return true;
	}
	call->sql = NAMESPACE_SQL;
	call->nparams = 12;
	call->params[0] = topic;
	call->params[1] = subscription;
	call->params[2] = op;
	call->params[3] = url;
	call->params[4] = header(conn, "aeg-sas-key");
	call->params[5] = header(conn, "aeg-sas-token");
	call->params[6] = header(conn, MHD_HTTP_HEADER_AUTHORIZATION);
	call->params[7] = header(conn, MHD_HTTP_HEADER_CONTENT_TYPE);
	call->params[9] = query_arg(conn, "maxEvents");
	call->params[10] = query_arg(conn, "maxWaitTime");
	call->params[11] = query_arg(conn, "releaseDelayInSeconds");
	return true;
}

/*
 * Counts an answer to a publish request (a custom topic's api/events, a
 * namespace topic's :publish) for the metrics (publish_counts.c); other
 * requests are not counted.  started: when the request was read whole (0:
 * answered before).
 */
static void
count_publish(const char *url, unsigned int status, TimestampTz started)
{
	static MemoryContext cxt = NULL;
	MemoryContext old;
	char	  **seg;
	const char *topic = NULL;
	double		ms = 0;

	/* the path's pieces in memory of their own: also called with no request's context */
	if (cxt == NULL)
		cxt = AllocSetContextCreate(TopMemoryContext, "eventgrid publish count", ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(cxt);

	if ((seg = path_segments(url, 5)) != NULL && strcmp(seg[1], "topics") == 0 &&
		strcmp(seg[3], "api") == 0 && strcmp(seg[4], "events") == 0)
		topic = seg[2];
	else if ((seg = path_segments(url, 3)) != NULL && strcmp(seg[1], "topics") == 0)
	{
		const char *op = namespace_operation(seg[2]);

		if (op != NULL && strcmp(op, "publish") == 0)
			topic = seg[2];
	}
	if (started != 0)
		ms = (double) (GetCurrentTimestamp() - started) / 1000.0;
	if (topic != NULL && name_ok(seg[0], NAMEDATALEN - 1))
		eg_publish_count(seg[0], topic, (int) status, ms);
	MemoryContextSwitchTo(old);
	MemoryContextReset(cxt);
}

/* Answers a whole request with an error, counted if it was a publish. */
static enum MHD_Result
refuse(struct MHD_Connection *conn, const char *url, unsigned int status, const char *code, const char *message)
{
	count_publish(url, status, 0);
	return answer_error(conn, status, code, message);
}

/* A whole request: routes it and starts its statement (answered now, or when the result arrives). */
static enum MHD_Result
dispatch(struct MHD_Connection *conn, const char *url, ListenerRequest *req)
{
	EgServeCall *call = &req->call;

	if (!route(conn, url, call))
		return answer_error(conn, MHD_HTTP_NOT_FOUND, "NotFound",
							"No such resource: a custom topic's endpoint is /{database}/topics/{topic}/api/events, "
							"a namespace topic's /{database}/topics/{topic}:publish and "
							"/{database}/topics/{topic}/eventsubscriptions/{subscription}:{operation}.");
	/* no credential at all: refused before anything is looked up (nothing tells which databases or topics exist) */
	if (header(conn, "aeg-sas-key") == NULL && header(conn, "aeg-sas-token") == NULL &&
		header(conn, MHD_HTTP_HEADER_AUTHORIZATION) == NULL)
		return refuse(conn, url, MHD_HTTP_UNAUTHORIZED, "Unauthorized", EG_HTTP_UNAUTHORIZED_MESSAGE);
	if (memchr(req->body.data, '\0', req->body.len) != NULL)
		return refuse(conn, url, MHD_HTTP_BAD_REQUEST, "BadRequest", "The request body must be JSON text.");
	call->params[call->nparams == 7 ? 6 : 8] = req->body.data;	/* the body: last of a publish, ninth of a namespace operation */
	call->cxt = req->cxt;
	call->done = call_done;
	call->arg = req;
	eg_serve_start(call);
	if (call->status != 0)
	{
		count_publish(url, (unsigned int) call->status, req->read_at);
		return answer(conn, (unsigned int) call->status, call->answer);
	}
	req->suspended = true;
	MHD_suspend_connection(conn);
	return MHD_YES;
}

/* The connection's request was read whole (or is answered early): no deadline while it runs. */
static void
mark_in_request(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	ListenerConnection *lc = ci != NULL ? ci->socket_context : NULL;

	if (lc != NULL)
		lc->in_request = true;
}

/* libmicrohttpd's access handler: called for the headers, each piece of the body, and the end. */
static enum MHD_Result
on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
		   const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls)
{
	ListenerRequest *req = *con_cls;
	enum MHD_Result ret;
	MemoryContext old;

	if (req == NULL)
	{
		const char *length = header(conn, MHD_HTTP_HEADER_CONTENT_LENGTH);
		MemoryContext cxt;

		/* the headers: refused now, the body is never read */
		if (strcmp(method, MHD_HTTP_METHOD_POST) != 0)
		{
			mark_in_request(conn);
			return refuse(conn, url, MHD_HTTP_METHOD_NOT_ALLOWED, "MethodNotAllowed",
						  "Event Grid's data plane takes POST requests only.");
		}
		if (length != NULL && strtoull(length, NULL, 10) > EG_HTTP_MAX_BODY)
		{
			mark_in_request(conn);
			return refuse(conn, url, MHD_HTTP_CONTENT_TOO_LARGE, "PayloadTooLarge",
						  "A request may carry at most 1 MB (1048576 bytes).");
		}
		cxt = AllocSetContextCreate(TopMemoryContext, "eventgrid HTTP request", ALLOCSET_SMALL_SIZES);
		req = MemoryContextAllocZero(cxt, sizeof(ListenerRequest));
		req->cxt = cxt;
		req->conn = conn;
		old = MemoryContextSwitchTo(cxt);
		initStringInfo(&req->body);
		MemoryContextSwitchTo(old);
		*con_cls = req;
		return MHD_YES;
	}
	if (*upload_data_size > 0)
	{
		if (req->body.len + *upload_data_size > EG_HTTP_MAX_BODY)
			return MHD_NO;		/* a chunked body grown past the limit: the connection is closed */
		old = MemoryContextSwitchTo(req->cxt);
		appendBinaryStringInfo(&req->body, upload_data, (int) *upload_data_size);
		MemoryContextSwitchTo(old);
		*upload_data_size = 0;
		return MHD_YES;
	}
	if (req->call.status != 0)
	{
		/* resumed */
		count_publish(url, (unsigned int) req->call.status, req->read_at);
		return answer(conn, (unsigned int) req->call.status, req->call.answer);
	}
	if (req->call.sql != NULL)
		return MHD_YES;			/* still running (not resumed by it) */
	mark_in_request(conn);
	req->read_at = GetCurrentTimestamp();
	old = MemoryContextSwitchTo(req->cxt);
	ret = dispatch(conn, url, req);
	MemoryContextSwitchTo(old);
	return ret;
}

/* The request is over (answered, or the connection closed): its memory goes. */
static void
on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe)
{
	ListenerRequest *req = *con_cls;
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	ListenerConnection *lc = ci != NULL ? ci->socket_context : NULL;

	if (req != NULL)
		MemoryContextDelete(req->cxt);
	*con_cls = NULL;
	/* the next request on the connection has its own deadline */
	if (lc != NULL)
	{
		lc->in_request = false;
		lc->request_started = GetCurrentTimestamp();
	}
}

/*
 * A new connection: its answers go out at once, without waiting for the
 * client's acknowledgement, and the listener watches it until it closes.
 */
static void
on_connection(void *cls, struct MHD_Connection *conn, void **socket_context, enum MHD_ConnectionNotificationCode toe)
{
	const union MHD_ConnectionInfo *ci;
	ListenerConnection *lc;
	int			one = 1;

	if (toe == MHD_CONNECTION_NOTIFY_CLOSED)
	{
		lc = *socket_context;
		if (lc != NULL)
		{
			dlist_delete(&lc->node);
			pfree(lc);
			*socket_context = NULL;
		}
		return;
	}
	ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	if (ci == NULL)
		return;
	(void) setsockopt(ci->connect_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	lc = MemoryContextAllocZero(TopMemoryContext, sizeof(ListenerConnection));
	lc->fd = ci->connect_fd;
	lc->request_started = GetCurrentTimestamp();
	dlist_push_tail(&connections, &lc->node);
	*socket_context = lc;
}

/*
 * Closes the connections that can no longer bring a request, so that they
 * free their slots at once: a client that closed its side while its
 * request was incomplete (libmicrohttpd's edge-triggered epoll misses a
 * FIN that came with the last data: the slot stayed until
 * eventgrid.http_connection_timeout), and one that has not sent a whole
 * request within eventgrid.http_request_timeout (slowloris).  A request
 * read whole is not watched while it runs.  The connection's socket is
 * shut down, which libmicrohttpd sees at once and closes it.  Returns how
 * many it closed.
 */
static int
watch_connections(void)
{
	TimestampTz now = GetCurrentTimestamp();
	dlist_iter	it;
	int			n = 0;

	dlist_foreach(it, &connections)
	{
		ListenerConnection *lc = dlist_container(ListenerConnection, node, it.cur);
		struct pollfd p = {.fd = lc->fd,.events = POLLRDHUP};
		int			unread = 0;
		bool		peer_gone;

		if (lc->in_request || lc->cut)
			continue;
		/* closed by the peer with nothing left to read: nothing more can come */
		peer_gone = poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0 &&
			ioctl(lc->fd, FIONREAD, &unread) == 0 && unread == 0;
		if (peer_gone || now - lc->request_started >= (TimestampTz) eg_http_request_timeout_s * USECS_PER_SEC)
		{
			(void) shutdown(lc->fd, SHUT_RDWR);
			lc->cut = true;
			n++;
		}
	}
	return n;
}

/* Whether a connection is being watched for its request (watch_connections() is due often). */
static bool
watching(void)
{
	dlist_iter	it;

	dlist_foreach(it, &connections)
	{
		ListenerConnection *lc = dlist_container(ListenerConnection, node, it.cur);

		if (!lc->in_request && !lc->cut)
			return true;
	}
	return false;
}

/* libmicrohttpd's own messages (socket and TLS failures), never a request's content. */
static void on_log(void *cls, const char *fmt, va_list ap) pg_attribute_printf(2, 0);

static TimestampTz log_window_start = 0;
static int	log_window_lines = 0;
static int	log_suppressed = 0;

/*
 * Says how many of libmicrohttpd's messages were not logged in the minute
 * that has passed (at most EG_HTTP_LOG_BURST a minute are), and starts a
 * new minute.
 */
static void
log_window_turn(TimestampTz now)
{
	if (log_suppressed > 0)
		ereport(LOG,
				(errmsg("eventgrid HTTP listener: %d more messages about clients' connections in the last minute were not logged",
						log_suppressed)));
	log_window_start = now;
	log_window_lines = 0;
	log_suppressed = 0;
}

static void
on_log(void *cls, const char *fmt, va_list ap)
{
	char		buf[512];
	TimestampTz now = GetCurrentTimestamp();

	/* a client can make these at will (a connection closed mid-request): at most a few a minute */
	if (now - log_window_start >= (TimestampTz) 60 * USECS_PER_SEC)
		log_window_turn(now);
	if (log_window_lines >= EG_HTTP_LOG_BURST)
	{
		log_suppressed++;
		return;
	}
	log_window_lines++;
	vsnprintf(buf, sizeof(buf), fmt, ap);
	buf[strcspn(buf, "\r\n")] = '\0';
	ereport(LOG, (errmsg("eventgrid HTTP listener: %s", buf)));
}

/* The contents of a PEM file the settings name (FATAL when it cannot be read). */
static char *
read_pem(const char *setting, const char *path)
{
	FILE	   *f = AllocateFile(path, "r");
	StringInfoData s;
	char		buf[4096];
	size_t		n;

	if (f == NULL)
		ereport(FATAL,
				(errcode_for_file_access(),
				 errmsg("eventgrid HTTP listener: could not open %s \"%s\": %m", setting, path)));
	initStringInfo(&s);
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0)
		appendBinaryStringInfo(&s, buf, (int) n);
	FreeFile(f);
	return s.data;
}

/* Starts a daemon on one listen address (FATAL when it cannot). */
static struct MHD_Daemon *
start_daemon(const char *address, const char *cert, const char *key)
{
	struct addrinfo hints;
	struct addrinfo *ai;
	struct MHD_OptionItem opts[14];
	unsigned int flags = MHD_USE_EPOLL | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME;
	char		port[16];
	int			n = 0;
	int			rc;
	struct MHD_Daemon *d;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	snprintf(port, sizeof(port), "%d", eg_http_port);
	rc = getaddrinfo(strcmp(address, "*") == 0 ? "0.0.0.0" : address, port, &hints, &ai);
	if (rc != 0)
		ereport(FATAL,
				(errmsg("eventgrid HTTP listener: could not resolve eventgrid.http_listen_addresses entry \"%s\": %s",
						address, gai_strerror(rc))));
	if (ai->ai_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	if (cert != NULL)
		flags |= MHD_USE_TLS;
	/* the logger first, so that libmicrohttpd's messages about the other options go to it */
	opts[n++] = (struct MHD_OptionItem) {MHD_OPTION_EXTERNAL_LOGGER, (intptr_t) on_log, NULL};
	opts[n++] = (struct MHD_OptionItem) {MHD_OPTION_SOCK_ADDR, 0, ai->ai_addr};
	opts[n++] = (struct MHD_OptionItem) {MHD_OPTION_CONNECTION_LIMIT, eg_http_max_connections, NULL};
	opts[n++] = (struct MHD_OptionItem) {MHD_OPTION_CONNECTION_TIMEOUT, eg_http_connection_timeout_s, NULL};
	opts[n++] = (struct MHD_OptionItem) {MHD_OPTION_PER_IP_CONNECTION_LIMIT, eg_http_max_connections_per_address, NULL};
	opts[n++] = (struct MHD_OptionItem) {MHD_OPTION_CONNECTION_MEMORY_LIMIT, 64 * 1024, NULL};
	opts[n++] = (struct MHD_OptionItem) {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t) on_completed, NULL};
	opts[n++] = (struct MHD_OptionItem) {MHD_OPTION_NOTIFY_CONNECTION, (intptr_t) on_connection, NULL};
	if (cert != NULL)
	{
		opts[n++] = (struct MHD_OptionItem) {MHD_OPTION_HTTPS_MEM_CERT, 0, (void *) cert};
		opts[n++] = (struct MHD_OptionItem) {MHD_OPTION_HTTPS_MEM_KEY, 0, (void *) key};
	}
	opts[n++] = (struct MHD_OptionItem) {MHD_OPTION_END, 0, NULL};

	d = MHD_start_daemon(flags, (uint16_t) eg_http_port, NULL, NULL, on_request, NULL,
						 MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
	freeaddrinfo(ai);
	if (d == NULL)
		ereport(FATAL,
				(errmsg("eventgrid HTTP listener: could not listen on %s port %d", address, eg_http_port),
				 errhint("Check eventgrid.http_listen_addresses, eventgrid.http_port and the certificate files; the lines before say why.")));
	return d;
}

/*
 * The listener's entry point (registered by _PG_init when
 * eventgrid.http_port is not 0; restarted by the postmaster 5 s after it
 * exits on an error).  Connected to no database itself: each request runs
 * in the database its URL names (serve_db.c).
 */
void
eventgrid_http_listener_main(Datum arg)
{
	struct MHD_Daemon *daemons[EG_HTTP_MAX_DAEMONS];
	int			ndaemons = 0;
	char	   *cert = NULL;
	char	   *key = NULL;
	char	   *addresses;
	List	   *names;
	ListCell   *lc;
	WaitEventSet *set;
	TimestampTz tidied_at = 0;
	TimestampTz watched_at = 0;
	TimestampTz counted_at = 0;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	/* connected to no database: only to be seen in pg_stat_activity */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	on_proc_exit(disconnect_at_exit, (Datum) 0);

	if ((eg_http_ssl_cert_file[0] != '\0') != (eg_http_ssl_key_file[0] != '\0'))
		ereport(FATAL,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("eventgrid HTTP listener: eventgrid.http_ssl_cert_file and eventgrid.http_ssl_key_file must be set together")));
	if (eg_http_ssl_cert_file[0] != '\0')
	{
		cert = read_pem("eventgrid.http_ssl_cert_file", eg_http_ssl_cert_file);
		key = read_pem("eventgrid.http_ssl_key_file", eg_http_ssl_key_file);
	}
	addresses = pstrdup(eg_http_listen_addresses);
	if (!SplitGUCList(addresses, ',', &names) || names == NIL)
		ereport(FATAL,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("eventgrid HTTP listener: eventgrid.http_listen_addresses must list at least one address")));
	foreach(lc, names)
	{
		if (ndaemons == EG_HTTP_MAX_DAEMONS)
			ereport(FATAL,
					(errmsg("eventgrid HTTP listener: eventgrid.http_listen_addresses lists more than %d addresses",
							EG_HTTP_MAX_DAEMONS)));
		daemons[ndaemons++] = start_daemon((const char *) lfirst(lc), cert, key);
	}

	set = eg_wait_event_set_create(ndaemons + 3);
	AddWaitEventToSet(set, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
	AddWaitEventToSet(set, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
	AddWaitEventToSet(set, WL_SOCKET_READABLE, eg_serve_wait_fd(), NULL, NULL);
	for (int i = 0; i < ndaemons; i++)
		AddWaitEventToSet(set, WL_SOCKET_READABLE,
						  MHD_get_daemon_info(daemons[i], MHD_DAEMON_INFO_EPOLL_FD)->epoll_fd, NULL, NULL);
	ereport(LOG,
			(errmsg("eventgrid HTTP listener serving %s on port %d (%s)",
					cert != NULL ? "HTTPS" : "HTTP", eg_http_port, eg_http_listen_addresses)));

	for (;;)
	{
		WaitEvent	events[EG_HTTP_MAX_DAEMONS + 3];
		long		timeout = 1000;

		for (int i = 0; i < ndaemons; i++)
		{
			MHD_UNSIGNED_LONG_LONG t;

			if (MHD_get_timeout(daemons[i], &t) == MHD_YES && (long) t < timeout)
				timeout = (long) t;
		}
		if (watching())
			timeout = Min(timeout, EG_HTTP_WATCH_MS);
		(void) WaitEventSetWait(set, timeout, events, lengthof(events), PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		/* the results that arrived first: their requests resume in the daemons' run */
		eg_serve_poll();
		for (int i = 0; i < ndaemons; i++)
			(void) MHD_run(daemons[i]);
		if (TimestampDifferenceExceeds(watched_at, GetCurrentTimestamp(), EG_HTTP_WATCH_MS))
		{
			/* what it shut down is closed by libmicrohttpd in the same turn */
			if (watch_connections() > 0)
				for (int i = 0; i < ndaemons; i++)
					(void) MHD_run(daemons[i]);
			watched_at = GetCurrentTimestamp();
		}
		if (log_suppressed > 0 && TimestampDifferenceExceeds(log_window_start, GetCurrentTimestamp(), 60000))
			log_window_turn(GetCurrentTimestamp());
		if (TimestampDifferenceExceeds(counted_at, GetCurrentTimestamp(), EG_HTTP_COUNT_FLUSH_MS))
		{
			eg_publish_counts_write();
			counted_at = GetCurrentTimestamp();
		}
		if (TimestampDifferenceExceeds(tidied_at, GetCurrentTimestamp(), 1000))
		{
			eg_serve_tidy();
			tidied_at = GetCurrentTimestamp();
		}
	}
}
