/*
 * url.c - endpoint URLs: the rule an event subscription's endpoint must
 * follow (checked by the CHECK constraint on event_subscriptions.endpoint
 * and by the configuration functions through eventgrid._endpoint_problem(),
 * so both apply the rule the sender applies), and the host key that the
 * delivery worker's per-host queues use (endpoint_queue.c).  libcurl's URL
 * API does the parsing: what it accepts here, the requests can use.
 */
#include "http/url.h"
#include "http/rabbitmq.h"
#include "http/redis_stream.h"

#include "fmgr.h"
#include "utils/builtins.h"

#include <curl/curl.h>

/*
 * Does "://" and then a host follow the scheme (of scheme_len bytes)?
 * libcurl reads "http:///x" and "http:/x" as http://x/: a URL written so is
 * refused rather than taken to mean a host it does not name.
 */
static bool
authority_follows(const char *url, size_t scheme_len)
{
	const char *rest = url + scheme_len;

	return strlen(url) > scheme_len + 3 && strncmp(rest, "://", 3) == 0 &&
		rest[3] != '/' && rest[3] != '\\';
}

/*
 * Why libcurl's parser refused url with rc, in words that do not change with
 * the libcurl version (its own, curl_url_strerror(), and some of its codes
 * do: 8.x refuses a space or a control character anywhere as malformed
 * input, where 7.88 named the part that held it).
 */
static const char *
url_parse_problem(const char *url, CURLUcode rc)
{
	for (const unsigned char *p = (const unsigned char *) url; *p; p++)
		if (*p <= ' ' || *p == 0x7f)
			return "the URL holds a space or a control character";
	switch (rc)
	{
		case CURLUE_NO_HOST:
			return "the URL has no host after its scheme's \"://\"";
		case CURLUE_BAD_PORT_NUMBER:
			return "Port number was not a decimal number between 1 and 65535";
		case CURLUE_BAD_IPV6:
			return "the URL's IPv6 address is malformed";
		case CURLUE_BAD_HOSTNAME:
			return "the URL's host name is malformed";
		default:
			return "libcurl cannot parse it as a URL";
	}
}

/*
 * Both threads (no PostgreSQL calls): the rules every destination URL
 * (redis://, amqp[s]://) shares, read by libcurl's parser: at most
 * EG_MAX_ENDPOINT_BYTES bytes, no space or control character, a host
 * right after the scheme's "://" (scheme_len bytes), no user name,
 * password or fragment, a host of at most host_cap - 1 bytes (an IPv6
 * address without its brackets, as a socket takes it) into host, a port
 * from 1 to 65535 into *port when the URL has one, and the path and query
 * (libcurl's strings, or NULL) into *path and *query, which the caller
 * frees with curl_free().  NULL, or why not (static text).
 */
const char *
eg_destination_url(const char *url, size_t scheme_len, char *host, size_t host_cap, int *port,
				   char **path, char **query)
{
	CURLU	   *h;
	char	   *got_host = NULL,
			   *got_port = NULL,
			   *user = NULL,
			   *password = NULL,
			   *fragment = NULL;
	const char *problem = NULL;
	CURLUcode	rc;

	*path = *query = NULL;
	if (strlen(url) > EG_MAX_ENDPOINT_BYTES)
		return "the endpoint is longer than 2048 bytes";
	if (!authority_follows(url, scheme_len))
		return "the URL has no host after its scheme's ://";
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
	else if (curl_url_get(h, CURLUPART_HOST, &got_host, 0) != CURLUE_OK || got_host[0] == '\0' ||
			 strlen(got_host) >= host_cap)
		problem = "the URL has no host (or one longer than 255 bytes)";
	else
	{
		char	   *end = NULL;
		long		n = 0;

		if (curl_url_get(h, CURLUPART_PORT, &got_port, 0) == CURLUE_OK &&
			((n = strtol(got_port, &end, 10)) < 1 || n > 65535 || *end != '\0'))
			problem = "Port number was not a decimal number between 1 and 65535";
		else
		{
			if (got_port != NULL)
				*port = (int) n;
			/* IPv6: libcurl gives "[::1]"; a socket connects to "::1" */
			if (got_host[0] == '[')
			{
				size_t		len = strlen(got_host);

				memcpy(host, got_host + 1, len - 2);
				host[len - 2] = '\0';
			}
			else
				strcpy(host, got_host);
			curl_url_get(h, CURLUPART_PATH, path, 0);
			curl_url_get(h, CURLUPART_QUERY, query, 0);
		}
	}
	curl_free(got_host);
	curl_free(got_port);
	curl_free(user);
	curl_free(password);
	curl_free(fragment);
	curl_url_cleanup(h);
	return problem;
}

/*
 * Both threads: a percent-encoded URL part decoded into out (of size cap,
 * NUL-terminated; it may be empty); false when it does not fit or holds a
 * NUL.
 */
bool
eg_url_decode(const char *value, char *out, size_t cap)
{
	int			len = 0;
	char	   *decoded = curl_easy_unescape(NULL, value, 0, &len);
	bool		ok = decoded != NULL && (size_t) len < cap && memchr(decoded, '\0', len) == NULL;

	if (ok)
	{
		memcpy(out, decoded, len);
		out[len] = '\0';
	}
	curl_free(decoded);
	return ok;
}

/*
 * Why libcurl could not deliver to url, or NULL when it can (a redis://
 * URL: a RedisStream destination's, redis_stream.c's rule; an amqp:// or
 * amqps:// URL: a RabbitMQ destination's, rabbitmq.c's): scheme http or
 * https, "://" and a host, a port from 1 to 65535, no user name or password (they
 * would be shown in the catalog and in logs; send credentials as a secret
 * delivery property instead), and at most EG_MAX_ENDPOINT_BYTES bytes.
 * Returns a static string.
 */
const char *
eg_endpoint_problem(const char *url)
{
	CURLU	   *h;
	CURLUcode	rc;
	char	   *scheme = NULL,
			   *host = NULL,
			   *user = NULL,
			   *password = NULL,
			   *port = NULL;
	const char *problem = NULL;

	if (strlen(url) > EG_MAX_ENDPOINT_BYTES)
		return "the endpoint is longer than 2048 bytes";
	if (eg_is_redis_url(url))
	{
		EgRedisDest d;

		return eg_redis_parse(url, &d);	/* a RedisStream destination (SPEC 21) */
	}
	if (eg_is_amqp_url(url))
	{
		EgAmqpDest d;

		return eg_amqp_parse(url, &d);	/* a RabbitMQ destination (SPEC 21) */
	}
	h = curl_url();
	if (h == NULL)
		return "out of memory";
	rc = curl_url_set(h, CURLUPART_URL, url, 0);
	if (rc != CURLUE_OK && strstr(url, "://") == NULL)
		problem = "not an absolute URL: it must start with http:// or https:// and a host, "
			"as https://receiver.example.com/events does";
	else if (rc != CURLUE_OK)
		problem = url_parse_problem(url, rc);
	else if (curl_url_get(h, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
			 (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0))
		problem = "the scheme must be http or https";
	else if (curl_url_get(h, CURLUPART_HOST, &host, 0) != CURLUE_OK || host[0] == '\0' ||
			 !authority_follows(url, strlen(scheme)))
		problem = "the URL has no host after its scheme's \"://\"";
	else if (curl_url_get(h, CURLUPART_USER, &user, 0) == CURLUE_OK ||
			 curl_url_get(h, CURLUPART_PASSWORD, &password, 0) == CURLUE_OK)
		problem = "the URL holds a user name or password";
	else if (curl_url_get(h, CURLUPART_PORT, &port, 0) == CURLUE_OK && strtol(port, NULL, 10) == 0)
		problem = "Port number was not a decimal number between 1 and 65535";
	curl_free(scheme);
	curl_free(host);
	curl_free(user);
	curl_free(password);
	curl_free(port);
	curl_url_cleanup(h);
	return problem;
}

/*
 * "scheme://host:port" of a URL, by libcurl's parser (the URL itself if it
 * does not parse), palloc'd: requests to one key share a queue and its
 * limit of eventgrid.max_requests_per_endpoint.
 */
char *
eg_url_host_key(const char *url)
{
	CURLU	   *h = curl_url();
	char	   *scheme = NULL,
			   *host = NULL,
			   *port = NULL;
	char	   *key;

	if (eg_is_redis_url(url))
	{
		EgRedisDest d;

		curl_url_cleanup(h);
		if (eg_redis_parse(url, &d) != NULL)
			return pstrdup(url);
		return psprintf("%s://%s:%d", d.tls ? "rediss" : "redis", d.host, d.port);
	}
	if (eg_is_amqp_url(url))
	{
		EgAmqpDest d;

		curl_url_cleanup(h);
		if (eg_amqp_parse(url, &d) != NULL)
			return pstrdup(url);
		return psprintf("%s://%s:%d", d.tls ? "amqps" : "amqp", d.host, d.port);
	}
	if (h != NULL && curl_url_set(h, CURLUPART_URL, url, 0) == CURLUE_OK &&
		curl_url_get(h, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
		curl_url_get(h, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
		curl_url_get(h, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK)
		key = psprintf("%s://%s:%s", scheme, host, port);
	else
		key = pstrdup(url);
	curl_free(scheme);
	curl_free(host);
	curl_free(port);
	curl_url_cleanup(h);
	return key;
}

PG_FUNCTION_INFO_V1(eventgrid_endpoint_problem);

/*
 * SQL: eventgrid._endpoint_problem(endpoint text) -> text: NULL for an
 * endpoint libcurl can deliver to, else the reason (see eg_endpoint_problem).
 * Used by the CHECK constraint on event_subscriptions.endpoint and by the
 * configuration functions, so both apply the same rule.
 */
Datum
eventgrid_endpoint_problem(PG_FUNCTION_ARGS)
{
	char	   *url = text_to_cstring(PG_GETARG_TEXT_PP(0));
	const char *problem = eg_endpoint_problem(url);

	if (problem == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(problem));
}

PG_FUNCTION_INFO_V1(eventgrid_endpoint_key_from);

/*
 * SQL: eventgrid._endpoint_key_from(endpoint text) -> text: where a broker
 * endpoint's messages take their key from, 'subject' or 'ordering_key'
 * (a RabbitMQ routing_key_from=, a Redis stream_from=; SPEC 21); NULL for
 * a fixed key, another kind of endpoint or one that does not parse.  The
 * configuration functions refuse ordering_key routing for an event
 * subscription without an ordering_key.
 */
Datum
eventgrid_endpoint_key_from(PG_FUNCTION_ARGS)
{
	char	   *url = text_to_cstring(PG_GETARG_TEXT_PP(0));
	EgKeyFrom	from = EG_KEY_FIXED;
	EgRedisDest r;
	EgAmqpDest	a;

	if (eg_is_redis_url(url) && eg_redis_parse(url, &r) == NULL)
		from = r.stream_from;
	else if (eg_is_amqp_url(url) && eg_amqp_parse(url, &a) == NULL)
		from = a.routing_key_from;
	if (from == EG_KEY_FROM_SUBJECT)
		PG_RETURN_TEXT_P(cstring_to_text("subject"));
	if (from == EG_KEY_FROM_ORDERING_KEY)
		PG_RETURN_TEXT_P(cstring_to_text("ordering_key"));
	PG_RETURN_NULL();
}

/*
 * len bytes of s percent-encoded for one segment of a URI path (RFC 3986:
 * every byte but the unreserved A-Z a-z 0-9 - . _ ~ becomes %XX), by
 * libcurl's curl_easy_escape; palloc'd.  Table change events' subjects.
 */
char *
eg_uri_escape(const char *s, int len)
{
	char	   *escaped;
	char	   *result;
	CURL	   *handle = NULL;	/* libcurl ignores it since 7.82.0 */

#if LIBCURL_VERSION_NUM < 0x075200
	static CURL *kept = NULL;

	if (kept == NULL)
		kept = curl_easy_init();
	handle = kept;
#endif
	escaped = handle || LIBCURL_VERSION_NUM >= 0x075200 ? curl_easy_escape(handle, s, len) : NULL;
	if (escaped == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory while escaping a URI path segment")));
	result = pstrdup(escaped);
	curl_free(escaped);
	return result;
}

PG_FUNCTION_INFO_V1(eventgrid_uri_escape);

/*
 * SQL: eventgrid._uri_escape(value text) -> text: value percent-encoded for
 * one segment of a URI path (eg_uri_escape).  Strict.
 */
Datum
eventgrid_uri_escape(PG_FUNCTION_ARGS)
{
	text	   *value = PG_GETARG_TEXT_PP(0);

	PG_RETURN_TEXT_P(cstring_to_text(eg_uri_escape(VARDATA_ANY(value), (int) VARSIZE_ANY_EXHDR(value))));
}
