/*
 * rabbitmq.c - the RabbitMQ destination (SPEC 21): its endpoint and its
 * requests; rabbitmq_connections.c publishes them.
 *
 * The endpoint is amqp[s]://host[:port][/vhost]?exchange=X&routing_key=K,
 * parsed by libcurl's URL API (the same parser as the webhooks' and Redis
 * streams' URLs).  The port defaults to 5672 (amqps: 5671); the path is the
 * virtual host, percent-decoded (none, or "/", is the default virtual host
 * "/"; "/%2F" names it too); exchange defaults to the default exchange
 * (""), which routes by queue name, and routing_key to "" (at least one of
 * the two is given); routing_key_from=subject, instead of routing_key,
 * makes each event's subject its message's routing key, and
 * routing_key_from=ordering_key its ordering key (the subscription's
 * ordering_key path, SPEC 13; an event without one is not sent:
 * InvalidHeader): one event per message then.  A stored endpoint holds no
 * credentials: create_event_subscription() takes user:password out of the
 * URL it was given (_endpoint_credentials()) into destination_credentials,
 * and the worker reads them with each claim; without them the connection
 * logs in as guest.
 *
 * Each event becomes one message, persistent (delivery mode 2), mandatory,
 * with content type application/json (CloudEvents: application/cloudevents+json)
 * and the event's id as message id; with batching (max_events_per_batch)
 * a batch is one message holding the JSON array a webhook would get.
 *
 * What the broker says, as the HTTP status Event Grid's policy treats alike
 * (outcome.c; the history records no HTTP status for it): a publisher
 * confirm's ack is 201 (Delivered); a message returned as unroutable
 * (mandatory) 404, a channel closed for a missing exchange (404
 * NOT_FOUND) 404 (NotFound); a refused login or ACCESS_REFUSED 401
 * (Unauthorized); a nack (a queue at its x-max-length with overflow
 * reject-publish) 507 (Full); a channel closed for a message over the
 * broker's max_message_size 413 (PayloadTooLarge); other closings 500
 * (GenericError).  The broker's reply text is the answer the attempt
 * history keeps.  A connection that fails or closes ends its unconfirmed
 * requests as SocketError: they are retried.
 */
#include "http/rabbitmq.h"
#include "http/url.h"

#include <curl/curl.h>

/* The query's parameters into d; NULL or why not. */
static const char *
parse_query(const char *query, EgAmqpDest *d)
{
	char		copy[EG_MAX_ENDPOINT_BYTES + 1];
	char	   *save = NULL;
	bool		seen_exchange = false,
				seen_key = false,
				seen_from = false;

	if (query == NULL || strlen(query) > EG_MAX_ENDPOINT_BYTES)
		return "the URL names no exchange or routing key: add ?exchange=<name>&routing_key=<key>";
	strcpy(copy, query);
	for (char *p = strtok_r(copy, "&", &save); p != NULL; p = strtok_r(NULL, "&", &save))
	{
		char	   *eq = strchr(p, '=');

		if (eq == NULL)
			return "a query parameter has no value (exchange= or routing_key=)";
		*eq = '\0';
		if (strcmp(p, "exchange") == 0 && !seen_exchange)
		{
			if (!eg_url_decode(eq + 1, d->exchange, sizeof(d->exchange)))
				return "the exchange is longer than 255 bytes or holds a NUL";
			seen_exchange = true;
		}
		else if (strcmp(p, "routing_key") == 0 && !seen_key && !seen_from)
		{
			if (!eg_url_decode(eq + 1, d->routing_key, sizeof(d->routing_key)))
				return "the routing key is longer than 255 bytes or holds a NUL";
			seen_key = true;
		}
		else if (strcmp(p, "routing_key_from") == 0 && !seen_key && !seen_from)
		{
			if (!eg_key_from_name(eq + 1, &d->routing_key_from))
				return "routing_key_from takes subject or ordering_key (each event's subject or ordering key is its routing key)";
			seen_from = true;
		}
		else
			return "the query takes exchange and routing_key (or routing_key_from=subject or ordering_key), each once";
	}
	if (!seen_exchange && !seen_key && !seen_from)
		return "the URL names no exchange or routing key: add ?exchange=<name>&routing_key=<key>";
	return NULL;
}

/*
 * Parses a RabbitMQ endpoint into *d: scheme amqp or amqps (lower case),
 * "://" and a host of at most 255 bytes, a port from 1 to 65535, a path
 * that is empty or "/<vhost>" (percent-decoded, at most 255 bytes), no
 * user name or password, no fragment, at most EG_MAX_ENDPOINT_BYTES
 * bytes, and the query above.  NULL, or why not (a static string).
 */
const char *
eg_amqp_parse(const char *url, EgAmqpDest *d)
{
	char	   *path = NULL,
			   *query = NULL;
	const char *problem;

	memset(d, 0, sizeof(EgAmqpDest));
	if (!eg_is_amqp_url(url))
		return "a RabbitMQ endpoint starts with amqp:// or amqps:// and a host";
	d->tls = url[4] == 's';
	d->port = d->tls ? EG_AMQPS_DEFAULT_PORT : EG_AMQP_DEFAULT_PORT;
	strcpy(d->vhost, "/");
	problem = eg_destination_url(url, d->tls ? 5 : 4, d->host, sizeof(d->host), &d->port, &path, &query);
	if (problem == NULL && path != NULL && strcmp(path, "/") != 0 && path[0] != '\0')
	{
		if (strchr(path + 1, '/') != NULL)
			problem = "the path must be empty or /<virtual host> (a / inside the name is %2F)";
		else if (!eg_url_decode(path + 1, d->vhost, sizeof(d->vhost)) || d->vhost[0] == '\0')
			problem = "the virtual host is longer than 255 bytes or holds a NUL";
	}
	if (problem == NULL)
		problem = parse_query(query, d);
	curl_free(path);
	curl_free(query);
	return problem;
}

/* ---- the request (main thread) ---- */

/*
 * req's login as the HTTP thread reads it, in req->auth_line (malloc'd;
 * cleared and freed with the request): the user name's length in decimal,
 * ':', the user name, then the password.
 */
void
eg_amqp_request_auth(EgRequest *req, const char *user, const char *password)
{
	size_t		ulen = strlen(user ? user : "guest");
	size_t		plen = strlen(password);
	char	   *line = malloc(ulen + plen + 24);

	if (line == NULL)
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("eventgrid: out of memory for a RabbitMQ login")));
	snprintf(line, ulen + plen + 24, "%zu:%s%s", ulen, user ? user : "guest", password);
	req->auth_line = line;
}

EgOutcomeCode
eg_amqp_request_build(EgRequest *req, const EgAmqpDest *d, const char *schema, const char *event_id,
					  const EgEventPart *events, int nevents, const char *ordering_key, StringInfo scratch)
{
	bool		cloud = strcmp(schema, "CloudEventSchemaV1_0") == 0;
	const char *content_type = nevents > 1 ? eg_content_type(schema, nevents)
		: cloud ? "application/cloudevents+json; charset=utf-8" : "application/json; charset=utf-8";
	char		subject[EG_AMQP_MAX_NAME_BYTES + 1];
	const char *routing_key = eg_message_key(d->routing_key_from, d->routing_key, &events[0], ordering_key,
											 subject, sizeof(subject));
	const char *message;
	int			message_len;
	size_t		head_len;
	size_t		ct_len,
				id_len,
				key_len;

	if (routing_key == NULL)
		return EG_OUTCOME_INVALID_HEADER;
	/* one event is the event itself (a queue message's shape), a batch the webhook's array */
	resetStringInfo(scratch);
	if (nevents > 1)
		eg_build_body(scratch, schema, events, nevents);
	else
		appendBinaryStringInfo(scratch, events[0].json, events[0].len);
	message = eg_to_utf8(scratch->data, scratch->len, &message_len);
	if (message == NULL)
		return EG_OUTCOME_INVALID_ENCODING;
	if (nevents > 1 || event_id == NULL)
		event_id = "";
	ct_len = strlen(content_type) + 1;
	id_len = strlen(event_id) + 1;
	key_len = strlen(routing_key) + 1;
	head_len = ct_len + id_len + key_len;
	req->body = malloc(head_len + message_len + 1);
	if (req->body == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("eventgrid: out of memory for a %d-byte RabbitMQ message", message_len)));
	memcpy(req->body, content_type, ct_len);
	memcpy(req->body + ct_len, event_id, id_len);
	memcpy(req->body + ct_len + id_len, routing_key, key_len);
	memcpy(req->body + head_len, message, message_len);
	req->body[head_len + message_len] = '\0';
	req->body_len = head_len + message_len;
	if (message != scratch->data)
		pfree((char *) message);
	return EG_OUTCOME_NONE;
}
