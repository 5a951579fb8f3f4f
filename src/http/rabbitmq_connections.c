/*
 * rabbitmq_connections.c - the RabbitMQ destination's connections (SPEC
 * 21), on the HTTP thread: librabbitmq (rabbitmq-c) driven beside
 * libcurl.  A connection per endpoint (its whole URL: virtual host,
 * exchange and routing key) and login; one channel in confirm mode.
 * Messages are published as they come (persistent, mandatory, each with a
 * header eventgrid-publish-seq: its sequence number on the channel) and
 * end when the broker confirms them: an ack delivers, a nack is Full, an
 * ack after a basic.return (unroutable, matched by that header) is
 * NotFound.  The socket joins libcurl's wait (curl_multi_poll's extra
 * descriptors) for the confirms, and for room to write when the kernel's
 * send buffer was full: a message is published only when the socket can
 * take it.
 *
 * Opening a connection (TCP or TLS, the AMQP handshake, the login, the
 * channel and confirm.select) is librabbitmq's blocking API, bounded by
 * the request's time (eventgrid.response_timeout); a connection that
 * failed to open fails the requests that come for it in the next second at
 * once, so that a broker that does not answer holds the thread once per
 * second at most.  The socket has TCP_USER_TIMEOUT of that time too, so a
 * broker that stops reading cannot hold a write for longer.  Each request
 * has its deadline: a connection whose oldest unconfirmed message is past
 * it is closed, and everything on it ends TimedOut.  What each outcome
 * means is rabbitmq.c's file comment.
 *
 * Like the rest of the HTTP thread, nothing here calls into PostgreSQL:
 * plain C, malloc and librabbitmq only.
 */
#include "http/broker.h"
#include "http/rabbitmq.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <curl/curl.h>
#include <openssl/ssl.h>

#if defined(__has_include) && __has_include(<rabbitmq-c/amqp.h>)
#include <rabbitmq-c/amqp.h>
#include <rabbitmq-c/framing.h>
#include <rabbitmq-c/ssl_socket.h>
#include <rabbitmq-c/tcp_socket.h>
#else
#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#endif

#define SEQ_HEADER "eventgrid-publish-seq"
#define CHANNEL 1
#define FAILED_OPEN_MS 1000		/* how long a failed open fails the requests that come */

/* A published message awaiting its confirm. */
typedef struct Unconfirmed
{
	uint64_t	tag;			/* its delivery tag: the channel's publish sequence number */
	EgRequest  *req;			/* NULL once ended */
} Unconfirmed;

typedef struct AmqpConn
{
	EgBrokerKey id;				/* the endpoint's URL and the login */
	amqp_connection_state_t st; /* NULL once closed */
	EgAmqpDest dest;
	int			fd;
	bool		want_write;		/* messages wait for room in the socket */
	bool		timed_out;		/* closed for a request past its time: its requests are TimedOut */
	uint64_t	next_tag;		/* the next message's delivery tag (the first is 1) */
	Unconfirmed *pending;		/* published, in tag order, from pending_head */
	int			pending_head;
	int			pending_n;
	int			pending_cap;
	EgRequest  *waiting;		/* not published yet, in order */
	EgRequest  *waiting_tail;
	bool		returning;		/* a basic.return's content follows */
	uint64_t	return_tag;		/* of the message returned (0: not matched) */
	uint64_t	return_left;	/* its body's bytes still to come */
	int			return_code;
	char		return_text[128];
	double		failed_at;		/* the last open failed at (ms on CLOCK_MONOTONIC), or 0 */
	EgTransport failed_transport;
	int			failed_status;
	char		failed_text[200];
} AmqpConn;

static EgBrokerTable table;

#define CONN(i) ((AmqpConn *) table.conns[i])

/* ---- a request's parts: content type, message id, routing key, message (rabbitmq.c's layout) ---- */

static const char *
content_type_of(const EgRequest *req)
{
	return req->body;
}

static const char *
message_id_of(const EgRequest *req)
{
	return req->body + strlen(req->body) + 1;
}

static const char *
routing_key_of(const EgRequest *req)
{
	const char *id = message_id_of(req);

	return id + strlen(id) + 1;
}

static size_t
message_offset(const EgRequest *req)
{
	const char *key = routing_key_of(req);

	return (size_t) (key + strlen(key) + 1 - req->body);
}

/* ---- closing ---- */

/* Can the socket take more bytes now? */
static bool
writable(AmqpConn *c)
{
	struct pollfd p = {.fd = c->fd,.events = POLLOUT};

	return poll(&p, 1, 0) == 1 && (p.revents & POLLOUT);
}

/*
 * Closes c's connection (a connection.close is sent, not waited for) and
 * ends what it holds: the unconfirmed messages with status (when
 * transport is OK) or as transport, what waited as transport.
 */
static void
close_conn(AmqpConn *c, EgTransport transport, int status, const char *text)
{
	EgRequest  *req;
	EgTransport waited = transport == EG_TRANSPORT_OK ? EG_TRANSPORT_SOCKET : transport;

	if (c->st != NULL)
	{
		amqp_connection_close_t close;

		memset(&close, 0, sizeof(close));
		close.reply_code = AMQP_REPLY_SUCCESS;
		close.reply_text = amqp_cstring_bytes("closed by eventgrid");
		if (writable(c))		/* never waits on a broker that stopped reading */
			amqp_send_method(c->st, 0, AMQP_CONNECTION_CLOSE_METHOD, &close);
		amqp_destroy_connection(c->st);
		c->st = NULL;
	}
	for (int i = c->pending_head; i < c->pending_head + c->pending_n; i++)
		if ((req = c->pending[i].req) != NULL)
			eg_broker_end(req, transport, transport == EG_TRANSPORT_OK ? status : 0, text);
	c->pending_head = c->pending_n = 0;
	while ((req = eg_request_pop(&c->waiting, &c->waiting_tail)) != NULL)
		eg_broker_end(req, waited, 0, transport == EG_TRANSPORT_OK ? "the channel to RabbitMQ was closed" : text);
	c->want_write = false;
	c->returning = false;
}

/* The HTTP status an AMQP reply code closing a channel or connection is treated as. */
static int
close_status(int code, const char *text)
{
	switch (code)
	{
		case 404:				/* NOT_FOUND: no such exchange */
			return 404;
		case 403:				/* ACCESS_REFUSED */
			return 401;
		case 530:				/* NOT_ALLOWED: a virtual host missing or refused */
			return strstr(text, "not found") != NULL ? 404 : 401;
		case 311:				/* CONTENT_TOO_LARGE */
			return 413;
		case 406:				/* PRECONDITION_FAILED, e.g. a message over max_message_size */
			return strstr(text, "max size") != NULL ? 413 : 500;
		default:
			return 500;
	}
}

/*
 * The broker closed the channel (or the connection): a message over the
 * broker's size is PayloadTooLarge, the others that were not confirmed are
 * lost with the channel and go again (SocketError); a missing exchange,
 * refused access or another error ends them all with its status.
 */
static void
closed_by_broker(AmqpConn *c, int code, amqp_bytes_t reply_text, bool connection)
{
	char		text[EG_RESPONSE_HEAD_BYTES];
	int			status;
	long		max_size = 0;
	const char *at;

	snprintf(text, sizeof(text), "%.*s", (int) Min(reply_text.len, sizeof(text) - 1), (const char *) reply_text.bytes);
	status = close_status(code, text);
	if (connection && status == 500)
	{
		close_conn(c, EG_TRANSPORT_SOCKET, 0, text);	/* e.g. CONNECTION_FORCED: the broker is stopping */
		return;
	}
	if (status == 413 && (at = strstr(text, "max size ")) != NULL)
		max_size = strtol(at + 9, NULL, 10);
	if (max_size > 0)
	{
		for (int i = c->pending_head; i < c->pending_head + c->pending_n; i++)
		{
			EgRequest  *req = c->pending[i].req;

			if (req != NULL && (long) (req->body_len - message_offset(req)) > max_size)
			{
				eg_broker_end(req, EG_TRANSPORT_OK, 413, text);
				c->pending[i].req = NULL;
			}
		}
		close_conn(c, EG_TRANSPORT_SOCKET, 0, "the channel to RabbitMQ was closed for another message");
		return;
	}
	close_conn(c, EG_TRANSPORT_OK, status, text);
}

/* ---- confirms ---- */

/* The unconfirmed entry of tag, or NULL. */
static Unconfirmed *
find_tag(AmqpConn *c, uint64_t tag)
{
	int			lo = c->pending_head,
				hi = c->pending_head + c->pending_n - 1;

	while (lo <= hi)
	{
		int			mid = (lo + hi) / 2;

		if (c->pending[mid].tag == tag)
			return &c->pending[mid];
		if (c->pending[mid].tag < tag)
			lo = mid + 1;
		else
			hi = mid - 1;
	}
	return NULL;
}

/* One message confirmed: delivered, NotFound when it was returned, Full when nacked. */
static void
confirm_one(Unconfirmed *u, bool nack)
{
	EgRequest  *req = u->req;

	if (req == NULL)
		return;
	u->req = NULL;
	if (nack)
		eg_broker_end(req, EG_TRANSPORT_OK, 507,
					"the broker refused the message (basic.nack): a queue at its x-max-length with overflow "
					"reject-publish, or an internal error of the broker");
	else if (req->http_status == 404)	/* marked when its basic.return came */
		eg_broker_end(req, EG_TRANSPORT_OK, 404, NULL);
	else
		eg_broker_end(req, EG_TRANSPORT_OK, 201, NULL);
}

/* basic.ack or basic.nack of tag (and of every earlier one when multiple). */
static void
confirm(AmqpConn *c, uint64_t tag, bool multiple, bool nack)
{
	if (multiple)
	{
		for (int i = c->pending_head; i < c->pending_head + c->pending_n && c->pending[i].tag <= tag; i++)
			confirm_one(&c->pending[i], nack);
	}
	else
	{
		Unconfirmed *u = find_tag(c, tag);

		if (u != NULL)
			confirm_one(u, nack);
	}
	/* forget the ended ones at the head */
	while (c->pending_n > 0 && c->pending[c->pending_head].req == NULL)
	{
		c->pending_head++;
		c->pending_n--;
	}
	if (c->pending_n == 0)
		c->pending_head = 0;
}

/* The returned message's properties: its sequence header names which one it was. */
static void
returned_properties(AmqpConn *c, const amqp_basic_properties_t *p, uint64_t body_size)
{
	c->return_left = body_size;
	c->return_tag = 0;
	if (p != NULL && (p->_flags & AMQP_BASIC_HEADERS_FLAG))
		for (int i = 0; i < p->headers.num_entries; i++)
		{
			const amqp_table_entry_t *e = &p->headers.entries[i];

			if (e->key.len == strlen(SEQ_HEADER) && memcmp(e->key.bytes, SEQ_HEADER, e->key.len) == 0 &&
				e->value.kind == AMQP_FIELD_KIND_I64)
				c->return_tag = (uint64_t) e->value.value.i64;
		}
	if (c->return_tag != 0)
	{
		Unconfirmed *u = find_tag(c, c->return_tag);

		if (u != NULL && u->req != NULL)
		{
			u->req->http_status = 404;	/* its ack follows: NotFound */
			u->req->response_head_len = snprintf(u->req->response_head, EG_RESPONSE_HEAD_BYTES,
												 "%d %s (returned: the message could not be routed to a queue)",
												 c->return_code, c->return_text);
			u->req->response_head_len = Min(u->req->response_head_len, EG_RESPONSE_HEAD_BYTES - 1);
		}
	}
	c->returning = body_size > 0;
}

/* Reads every frame the socket and librabbitmq's buffer hold; the connection may close. */
static void
read_frames(AmqpConn *c)
{
	struct timeval zero = {0, 0};

	while (c->st != NULL)
	{
		amqp_frame_t f;
		int			rc = amqp_simple_wait_frame_noblock(c->st, &f, &zero);

		if (rc == AMQP_STATUS_TIMEOUT)
			break;
		if (rc != AMQP_STATUS_OK)
		{
			close_conn(c, EG_TRANSPORT_SOCKET, 0, amqp_error_string2(rc));
			return;
		}
		if (f.frame_type == AMQP_FRAME_METHOD)
		{
			void	   *m = f.payload.method.decoded;

			switch (f.payload.method.id)
			{
				case AMQP_BASIC_ACK_METHOD:
					confirm(c, ((amqp_basic_ack_t *) m)->delivery_tag, ((amqp_basic_ack_t *) m)->multiple, false);
					break;
				case AMQP_BASIC_NACK_METHOD:
					confirm(c, ((amqp_basic_nack_t *) m)->delivery_tag, ((amqp_basic_nack_t *) m)->multiple, true);
					break;
				case AMQP_BASIC_RETURN_METHOD:
					{
						amqp_basic_return_t *r = m;

						c->returning = true;
						c->return_code = r->reply_code;
						snprintf(c->return_text, sizeof(c->return_text), "%.*s",
								 (int) Min(r->reply_text.len, sizeof(c->return_text) - 1),
								 (const char *) r->reply_text.bytes);
						break;
					}
				case AMQP_CHANNEL_CLOSE_METHOD:
					closed_by_broker(c, ((amqp_channel_close_t *) m)->reply_code,
									 ((amqp_channel_close_t *) m)->reply_text, false);
					return;
				case AMQP_CONNECTION_CLOSE_METHOD:
					closed_by_broker(c, ((amqp_connection_close_t *) m)->reply_code,
									 ((amqp_connection_close_t *) m)->reply_text, true);
					return;
				default:
					break;
			}
		}
		else if (f.frame_type == AMQP_FRAME_HEADER && c->returning)
			returned_properties(c, f.payload.properties.decoded, f.payload.properties.body_size);
		else if (f.frame_type == AMQP_FRAME_BODY && c->returning)
		{
			c->return_left -= Min(c->return_left, (uint64_t) f.payload.body_fragment.len);
			c->returning = c->return_left > 0;
		}
	}
	if (c->st != NULL)
		amqp_maybe_release_buffers(c->st);
}

/* ---- publishing ---- */

/* Publishes req on c (open); false when the connection failed (req and the rest are ended). */
static bool
publish(AmqpConn *c, EgRequest *req)
{
	amqp_basic_properties_t props;
	amqp_table_entry_t seq;
	amqp_bytes_t body;
	const char *id = message_id_of(req);
	size_t		off = message_offset(req);
	int			rc;

	if (c->pending_head + c->pending_n == c->pending_cap)
	{
		if (c->pending_head > 0)
		{
			memmove(c->pending, c->pending + c->pending_head, c->pending_n * sizeof(Unconfirmed));
			c->pending_head = 0;
		}
		else
		{
			int			cap = Max(c->pending_cap * 2, 64);
			Unconfirmed *grown = realloc(c->pending, cap * sizeof(Unconfirmed));

			if (grown == NULL)
			{
				eg_broker_end(req, EG_TRANSPORT_SOCKET, 0, "out of memory for a RabbitMQ message");
				return true;
			}
			c->pending = grown;
			c->pending_cap = cap;
		}
	}
	memset(&props, 0, sizeof(props));
	props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_HEADERS_FLAG;
	props.content_type = amqp_cstring_bytes(content_type_of(req));
	props.delivery_mode = 2;	/* persistent */
	if (id[0] != '\0' && strlen(id) <= EG_AMQP_MAX_NAME_BYTES)
	{
		props._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
		props.message_id = amqp_cstring_bytes(id);
	}
	seq.key = amqp_cstring_bytes(SEQ_HEADER);
	seq.value.kind = AMQP_FIELD_KIND_I64;
	seq.value.value.i64 = (int64_t) c->next_tag;
	props.headers.num_entries = 1;
	props.headers.entries = &seq;
	body.bytes = req->body + off;
	body.len = req->body_len - off;
	req->http_status = 0;
	rc = amqp_basic_publish(c->st, CHANNEL, amqp_cstring_bytes(c->dest.exchange),
							amqp_cstring_bytes(routing_key_of(req)), 1, 0, &props, body);
	c->pending[c->pending_head + c->pending_n].tag = c->next_tag++;
	c->pending[c->pending_head + c->pending_n].req = req;
	c->pending_n++;
	if (rc != AMQP_STATUS_OK)
	{
		close_conn(c, EG_TRANSPORT_SOCKET, 0, amqp_error_string2(rc));
		return false;
	}
	return true;
}

/* Publishes what waits while the socket takes it; what is left waits for room (want_write). */
static void
publish_waiting(AmqpConn *c)
{
	c->want_write = false;
	while (c->st != NULL && c->waiting != NULL)
	{
		EgRequest  *req;

		if (!writable(c))
		{
			c->want_write = true;
			return;
		}
		req = eg_request_pop(&c->waiting, &c->waiting_tail);
		if (!publish(c, req))
			return;
	}
}

/* ---- opening ---- */

/* Why an RPC of the handshake failed, as status (0: a socket error) and text. */
static int
rpc_problem(amqp_rpc_reply_t r, char *text, size_t cap)
{
	if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
		(r.reply.id == AMQP_CONNECTION_CLOSE_METHOD || r.reply.id == AMQP_CHANNEL_CLOSE_METHOD))
	{
		amqp_connection_close_t *m = r.reply.decoded;	/* both start with code and text */

		snprintf(text, cap, "%.*s", (int) Min(m->reply_text.len, cap - 1), (const char *) m->reply_text.bytes);
		return close_status(m->reply_code, text);
	}
	if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION)
		snprintf(text, cap, "%s", amqp_error_string2(r.library_error));
	else
		snprintf(text, cap, "the broker refused the connection's setup");
	return 0;
}

/*
 * Opens c's connection for req: socket (TLS for amqps, verified against
 * ca_file or the system's store), login, channel, confirm mode; false
 * with the failure remembered in c (the caller ends the requests).
 */
static bool
open_conn(AmqpConn *c, EgRequest *req, const char *ca_file)
{
	const char *problem = eg_amqp_parse(req->url, &c->dest);
	struct timeval tv;
	amqp_socket_t *sock;
	amqp_rpc_reply_t r;
	int			rc;
	const char *login = req->auth_line ? req->auth_line : "5:guestguest";
	char	   *colon;
	size_t		ulen;
	char		user[EG_AMQP_MAX_NAME_BYTES * 4 + 1];
	unsigned int user_timeout = (unsigned int) req->timeout_ms;

	c->failed_transport = EG_TRANSPORT_SOCKET;
	c->failed_status = 0;
	if (problem != NULL)
	{
		snprintf(c->failed_text, sizeof(c->failed_text), "%s", problem);
		return false;
	}
	ulen = strtoul(login, &colon, 10);
	if (*colon != ':' || ulen >= sizeof(user) || strlen(colon + 1) < ulen)
	{
		snprintf(c->failed_text, sizeof(c->failed_text), "the stored user name is too long");
		return false;
	}
	memcpy(user, colon + 1, ulen);
	user[ulen] = '\0';
	tv.tv_sec = req->timeout_ms / 1000;
	tv.tv_usec = (req->timeout_ms % 1000) * 1000;
	c->st = amqp_new_connection();
	if (c->st == NULL)
	{
		snprintf(c->failed_text, sizeof(c->failed_text), "out of memory for a RabbitMQ connection");
		return false;
	}
	sock = c->dest.tls ? amqp_ssl_socket_new(c->st) : amqp_tcp_socket_new(c->st);
	if (sock == NULL)
	{
		snprintf(c->failed_text, sizeof(c->failed_text), "could not set up a %s socket", c->dest.tls ? "TLS" : "TCP");
		goto failed;
	}
	if (c->dest.tls)
	{
		amqp_ssl_socket_set_verify_peer(sock, 1);
		amqp_ssl_socket_set_verify_hostname(sock, 1);
		if (ca_file != NULL && ca_file[0] != '\0')
			rc = amqp_ssl_socket_set_cacert(sock, ca_file);
		else
			rc = SSL_CTX_set_default_verify_paths(amqp_ssl_socket_get_context(sock)) == 1
				? AMQP_STATUS_OK : AMQP_STATUS_SSL_ERROR;
		if (rc != AMQP_STATUS_OK)
		{
			snprintf(c->failed_text, sizeof(c->failed_text), "could not load the CA certificates: %s",
					 amqp_error_string2(rc));
			goto failed;
		}
	}
	rc = amqp_socket_open_noblock(sock, c->dest.host, c->dest.port, &tv);
	if (rc != AMQP_STATUS_OK)
	{
		snprintf(c->failed_text, sizeof(c->failed_text), "could not connect to RabbitMQ at %s:%d: %s",
				 c->dest.host, c->dest.port, amqp_error_string2(rc));
		goto failed;
	}
	c->fd = amqp_get_sockfd(c->st);
	/* a broker that stops reading fails a write after the request's time, not never */
	setsockopt(c->fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof(user_timeout));
	amqp_set_handshake_timeout(c->st, &tv);
	amqp_set_rpc_timeout(c->st, &tv);
	r = amqp_login(c->st, c->dest.vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, user, colon + 1 + ulen);
	explicit_bzero(user, sizeof(user));
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		c->failed_status = rpc_problem(r, c->failed_text, sizeof(c->failed_text));
		goto failed;
	}
	if (amqp_channel_open(c->st, CHANNEL) == NULL || amqp_confirm_select(c->st, CHANNEL) == NULL)
	{
		c->failed_status = rpc_problem(amqp_get_rpc_reply(c->st), c->failed_text, sizeof(c->failed_text));
		goto failed;
	}
	c->next_tag = 1;
	c->timed_out = false;
	c->failed_at = 0;
	return true;

failed:
	if (c->failed_status != 0)
		c->failed_transport = EG_TRANSPORT_OK;
	amqp_destroy_connection(c->st);
	c->st = NULL;
	return false;
}

/*
 * The connection of req's endpoint and login (opened if need be), or NULL
 * with req ended.  Its key: the URL, a newline, and the login.
 */
static AmqpConn *
conn_for(EgRequest *req, const char *ca_file)
{
	AmqpConn   *c = eg_broker_conn_for(&table, sizeof(AmqpConn), req->url, strlen(req->url), req->auth_line);

	if (c == NULL)
	{
		eg_broker_end(req, EG_TRANSPORT_SOCKET, 0, "out of memory for a RabbitMQ connection");
		return NULL;
	}
	if (c->st == NULL)
	{
		if (c->failed_at > 0 && eg_mono_ms() - c->failed_at < FAILED_OPEN_MS)
		{
			eg_broker_end(req, c->failed_transport, c->failed_status, c->failed_text);
			return NULL;
		}
		if (!open_conn(c, req, ca_file))
		{
			c->failed_at = eg_mono_ms();
			eg_broker_end(req, c->failed_transport, c->failed_status, c->failed_text);
			return NULL;
		}
	}
	return c;
}

/*
 * HTTP thread: publishes req (a RabbitMQ request, rabbitmq.c's layout);
 * it comes back through eg_http_finish() once the broker confirms it, or
 * fails.  ca_file: the thread's eventgrid.ssl_ca_file ("": the system's).
 */
void
eg_amqp_send(EgRequest *req, const char *ca_file)
{
	AmqpConn   *c;

	req->duration_ms = eg_mono_ms();	/* its start, until it ends */
	req->next = NULL;
	c = conn_for(req, ca_file);
	if (c == NULL)
		return;
	eg_request_push(&c->waiting, &c->waiting_tail, req);
	publish_waiting(c);
}

/* The deadline of c's oldest request (ms on CLOCK_MONOTONIC), or 0 for none. */
static double
oldest_deadline(const AmqpConn *c)
{
	double		first = 0;

	for (int i = c->pending_head; i < c->pending_head + c->pending_n; i++)
		if (c->pending[i].req != NULL)
		{
			first = c->pending[i].req->duration_ms + c->pending[i].req->timeout_ms;
			break;
		}
	if (c->waiting && (first == 0 || c->waiting->duration_ms + c->waiting->timeout_ms < first))
		first = c->waiting->duration_ms + c->waiting->timeout_ms;
	return first;
}

/* HTTP thread: how many descriptors eg_amqp_wait_fds may add. */
int
eg_amqp_fd_count(void)
{
	return table.n;
}

/*
 * HTTP thread: the sockets of the open connections (for their confirms,
 * and for room to write when messages wait) into fds[n..cap); returns the
 * new count; *timeout_ms is lowered so that the wait ends by the next
 * request's deadline.
 */
int
eg_amqp_wait_fds(struct curl_waitfd *fds, int n, int cap, int *timeout_ms)
{
	double		now = eg_mono_ms();

	for (int i = 0; i < table.n; i++)
	{
		AmqpConn   *c = CONN(i);
		double		deadline = oldest_deadline(c);

		if (deadline > 0)
			*timeout_ms = Max(0, Min(*timeout_ms, (int) (deadline - now) + 1));
		if (c->st == NULL || n >= cap)
			continue;
		fds[n].fd = c->fd;
		fds[n].events = CURL_WAIT_POLLIN | (c->want_write ? CURL_WAIT_POLLOUT : 0);
		fds[n].revents = 0;
		n++;
	}
	return n;
}

/*
 * HTTP thread: after the wait, the confirms are read and waiting messages
 * published; connections whose oldest request is past its deadline are
 * closed (TimedOut), and closed ones with nothing left are forgotten.
 */
void
eg_amqp_after_wait(struct curl_waitfd *fds, int n)
{
	double		now;

	for (int k = 0; k < n; k++)
		for (int i = 0; i < table.n; i++)
		{
			AmqpConn   *c = CONN(i);

			if (c->st == NULL || c->fd != fds[k].fd)
				continue;
			if (fds[k].revents & (CURL_WAIT_POLLIN | CURL_WAIT_POLLPRI))
				read_frames(c);
			if (c->st != NULL && c->waiting != NULL && (fds[k].revents & CURL_WAIT_POLLOUT))
				publish_waiting(c);
			break;
		}
	now = eg_mono_ms();
	for (int i = 0; i < table.n;)
	{
		AmqpConn   *c = CONN(i);
		double		deadline = oldest_deadline(c);

		if (deadline > 0 && deadline <= now)
			close_conn(c, EG_TRANSPORT_TIMEOUT, 0, "no confirm from RabbitMQ within eventgrid.response_timeout");
		if (c->st == NULL && c->pending_n == 0 && c->waiting == NULL &&
			(c->failed_at == 0 || now - c->failed_at >= FAILED_OPEN_MS))
		{
			free(c->pending);
			eg_broker_conn_forget(&table, i);
			continue;
		}
		i++;
	}
}

/* The HTTP thread has stopped (or is stopping): every connection is closed and forgotten. */
void
eg_amqp_close_all(void)
{
	while (table.n > 0)
	{
		AmqpConn   *c = CONN(table.n - 1);

		close_conn(c, EG_TRANSPORT_SOCKET, 0, "the worker is stopping");
		free(c->pending);
		eg_broker_conn_forget(&table, table.n - 1);
	}
	free(table.conns);
	table.conns = NULL;
	table.cap = 0;
}
