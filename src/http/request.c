/*
 * request.c - builds the HTTP request of one delivery attempt (SPEC sections
 * 2, 5 and 8): body, content type, batch boundaries, Event Grid's aeg-*
 * headers and the subscription's custom delivery properties, and checks
 * every header line before it is written.  The event texts come already
 * converted to the subscription's delivery schema (by
 * eventgrid.convert_event() in the claim query).
 *
 * Header values come partly from events (id, dataVersion, dynamic delivery
 * properties), which are untrusted.  Publishing already refuses control
 * characters in those fields; the check here is the second line of defence
 * (rows written around the publish trigger, a restored dump, a future
 * field): a request with a header line holding a control character is not
 * sent at all, so no event can inject a header or smuggle a second request.
 *
 * Requests say charset=utf-8: in a database of another encoding the body
 * and every header value are converted to UTF-8 by PostgreSQL's default
 * conversion; text that has no UTF-8 form (a SQL_ASCII database's bytes
 * that are not UTF-8) is not sent as something it is not.
 */
#include "http/http.h"
#include "http/signing.h"

#include "catalog/namespace.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/formatting.h"
#include "utils/jsonb.h"

#define EG_HEADER_NAME_MAX 256
#define EG_HEADER_VALUE_MAX 4096

/* Header names a delivery property may not use: they change framing or routing. */
static const char *const reserved_names[] = {
	"content-length", "transfer-encoding", "host", "connection", "upgrade", "te",
	"trailer", "expect", "keep-alive", "content-type"
};

/*
 * The offset of the first control character (C0, tab included, or DEL) in
 * s[0..len), or -1.  Such a byte in a header value could end the header
 * line: the publish trigger and the request builder both refuse it.
 */
int
eg_control_char_at(const char *s, int len)
{
	for (int i = 0; i < len; i++)
		if ((unsigned char) s[i] < 0x20 || (unsigned char) s[i] == 0x7f)
			return i;
	return -1;
}

/*
 * A palloc'd copy of len bytes of text that an endpoint's answer may have
 * put there (an answer's body, libcurl's message), fit for a table or a
 * log: bytes outside printable ASCII become '?'.
 */
char *
eg_printable_copy(const char *text, int len)
{
	char	   *copy = palloc(len + 1);

	for (int i = 0; i < len; i++)
		copy[i] = ((unsigned char) text[i] < 0x20 || (unsigned char) text[i] > 0x7e) ? '?' : text[i];
	copy[len] = '\0';
	return copy;
}

/*
 * text[0..len), in the database's encoding, as UTF-8 (NUL-terminated):
 * text itself when it needs no conversion (a UTF-8 database, or ASCII
 * only, which every server encoding shares), else a palloc'd copy made by
 * PostgreSQL's default conversion, which does not raise here; its length
 * in *out_len.  NULL when the text has no UTF-8 form: a SQL_ASCII
 * database's bytes that are not valid UTF-8, or a character the
 * conversion cannot map.  Runs in a transaction (the first call looks the
 * conversion up in the catalog).
 */
const char *
eg_to_utf8(const char *text, int len, int *out_len)
{
	static Oid	proc = InvalidOid;
	int			encoding = GetDatabaseEncoding();
	bool		ascii = true;
	unsigned char *dst;
	int			done;

	*out_len = len;
	if (encoding == PG_UTF8)
		return text;
	for (int i = 0; i < len && ascii; i++)
		ascii = !IS_HIGHBIT_SET(text[i]);
	if (ascii)
		return text;
	if (encoding == PG_SQL_ASCII)
		return pg_verify_mbstr(PG_UTF8, text, len, true) ? text : NULL;
	if (!OidIsValid(proc))
		proc = FindDefaultConversionProc(encoding, PG_UTF8);
	if (!OidIsValid(proc))
		return NULL;
	dst = palloc((Size) len * MAX_CONVERSION_GROWTH + 1);
	done = pg_do_encoding_conversion_buf(proc, encoding, PG_UTF8, (unsigned char *) text, len,
										 dst, len * MAX_CONVERSION_GROWTH + 1, true);
	if (done < len)
	{
		pfree(dst);
		return NULL;
	}
	*out_len = strlen((char *) dst);
	return (char *) dst;
}

/* A header value as UTF-8 (see eg_to_utf8), or NULL. */
static const char *
header_utf8(const char *value)
{
	int			len;

	return eg_to_utf8(value, strlen(value), &len);
}

static bool
is_token_char(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/*
 * NULL when "name: value" may be sent, else a static reason.  Every header
 * line: name an HTTP token, value without control characters (C0 and DEL;
 * tabs included).  Custom delivery properties (custom = true) also: name at
 * most 256 characters, not aeg-* (Event Grid's own), not one that changes
 * HTTP framing or routing (Content-Length, Transfer-Encoding, Host,
 * Connection, Upgrade, TE, Trailer, Expect, Keep-Alive, Proxy-*, and
 * Content-Type, which eventgrid sets per delivery schema); value at most
 * 4096 bytes.
 */
const char *
eg_header_problem(const char *name, const char *value, bool custom)
{
	size_t		len = strlen(name);

	if (len == 0)
		return "the header name is empty";
	for (size_t i = 0; i < len; i++)
		if (!is_token_char((unsigned char) name[i]))
			return "the header name is not an HTTP token (letters, digits and !#$%&'*+-.^_`|~)";
	if (eg_control_char_at(value, strlen(value)) >= 0)
		return "the header value holds a control character";
	if (!custom)
		return NULL;
	if (len > EG_HEADER_NAME_MAX)
		return "the header name is longer than 256 characters";
	if (pg_strncasecmp(name, "aeg-", 4) == 0)
		return "header names starting with aeg- are set by eventgrid itself";
	if (pg_strncasecmp(name, "proxy-", 6) == 0)
		return "Proxy-* headers change HTTP routing";
	for (int i = 0; i < (int) lengthof(reserved_names); i++)
		if (pg_strcasecmp(name, reserved_names[i]) == 0)
			return "the header changes HTTP framing or routing, or is set by eventgrid itself";
	if (strlen(value) > EG_HEADER_VALUE_MAX)
		return "the header value is longer than 4096 bytes";
	return NULL;
}

/*
 * Content-Type of a request.  Event Grid schema: application/json (a JSON
 * array even for one event).  CloudEvents structured mode:
 * application/cloudevents+json for one event, application/cloudevents-batch+json
 * for a batch.  Custom schema: application/json.
 */
const char *
eg_content_type(const char *delivery_schema, int nevents)
{
	if (strcmp(delivery_schema, "CloudEventSchemaV1_0") == 0)
		return nevents == 1 ? "application/cloudevents+json; charset=utf-8"
			: "application/cloudevents-batch+json; charset=utf-8";
	return "application/json; charset=utf-8";
}

/*
 * Builds the body: a JSON array for the Event Grid schema always and for any
 * batch of more than one event; the bare event for one CloudEvent or one
 * custom-schema event.
 */
void
eg_build_body(StringInfo buf, const char *delivery_schema,
			  const EgEventPart *events, int nevents)
{
	bool		array = nevents > 1 || strcmp(delivery_schema, "EventGridSchema") == 0;

	if (array)
		appendStringInfoChar(buf, '[');
	for (int i = 0; i < nevents; i++)
	{
		if (i > 0)
			appendStringInfoChar(buf, ',');
		appendBinaryStringInfo(buf, events[i].json, events[i].len);
	}
	if (array)
		appendStringInfoChar(buf, ']');
}

/*
 * How many of the leading events form the next batch: at most max_events,
 * and no more than max_bytes of body, except that the first event always goes
 * (an event larger than the preferred size travels alone, never dropped).
 * Optimistic: takes what is there, never waits for more.
 */
int
eg_batch_take(const EgEventPart *events, int nevents, int max_events, int64 max_bytes)
{
	int64		bytes = 2;		/* [ and ] */
	int			n = 0;

	while (n < nevents && n < max_events)
	{
		int64		add = events[n].len + (n > 0 ? 1 : 0);

		if (n > 0 && bytes + add > max_bytes)
			break;
		bytes += add;
		n++;
	}
	return Max(n, 1);
}

PG_FUNCTION_INFO_V1(eventgrid_header_problem);

/*
 * SQL: eventgrid._header_problem(header text, value text) -> text: NULL when
 * a custom delivery property may be sent, else why not (see
 * eg_header_problem; a NULL value, as dynamic properties have, is not
 * checked).  The CHECK constraint of eventgrid.delivery_properties and the
 * configuration functions use it, so both apply the rule the sender applies.
 */
Datum
eventgrid_header_problem(PG_FUNCTION_ARGS)
{
	char	   *name;
	char	   *value = "";
	const char *problem;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	name = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (!PG_ARGISNULL(1))
		value = text_to_cstring(PG_GETARG_TEXT_PP(1));
	problem = eg_header_problem(name, value, true);
	if (problem == NULL)
		PG_RETURN_NULL();
	PG_RETURN_TEXT_P(cstring_to_text(problem));
}

/*
 * Appends the line "name: value" (NUL-terminated), value in UTF-8, to lines
 * after checking it and counts it in *n; EG_OUTCOME_NONE, or why the line
 * may not be sent (nothing added): EG_OUTCOME_INVALID_HEADER, or
 * EG_OUTCOME_INVALID_ENCODING for a value with no UTF-8 form.  libcurl
 * drops a header written with an empty value, so an empty one is written
 * as "name;", which it sends as "name:".
 */
static EgOutcomeCode
add_header(StringInfo lines, int *n, const char *name, const char *value, bool custom)
{
	value = header_utf8(value);
	if (value == NULL)
		return EG_OUTCOME_INVALID_ENCODING;
	if (eg_header_problem(name, value, custom) != NULL)
		return EG_OUTCOME_INVALID_HEADER;
	if (value[0])
		appendStringInfo(lines, "%s: %s", name, value);
	else
		appendStringInfo(lines, "%s;", name);
	appendStringInfoChar(lines, '\0');
	(*n)++;
	return EG_OUTCOME_NONE;
}

/*
 * Fills req with the request carrying events[0..nevents) of one
 * subscription: the body (malloc'd, handed to the HTTP thread), the content
 * type, the aeg-* headers (describing the first event of a batch), the
 * custom delivery properties ("Name: value" lines separated by '\n') and,
 * for a signed subscription, the Standard Webhooks headers (signing.c),
 * whose signature covers the body; body and header values in UTF-8.
 * Returns EG_OUTCOME_NONE, or, with nothing allocated, why the request
 * must not be sent: EG_OUTCOME_INVALID_HEADER when a header line holds a
 * control character or is otherwise unsendable, EG_OUTCOME_INVALID_ENCODING
 * when the body or a header value has no UTF-8 form.  scratch is a buffer
 * the caller reuses between requests.
 */
EgOutcomeCode
eg_request_build(EgRequest *req, const EgRequestSpec *spec,
				 const EgEventPart *events, int nevents, StringInfo scratch)
{
	char		count_text[16];
	EgOutcomeCode problem = EG_OUTCOME_NONE;
	int			n = 0;
	EgSignature sig;
	const char *body;
	int			body_len;

	resetStringInfo(scratch);
	eg_build_body(scratch, spec->schema, events, nevents);
	body = eg_to_utf8(scratch->data, scratch->len, &body_len);
	if (body == NULL)
		return EG_OUTCOME_INVALID_ENCODING;
	/* signed before the body is copied out, so that an error leaks nothing */
	if (spec->signing_keys)
		eg_sign_request(&sig, spec->signing_keys, spec->webhook_id, body, body_len);
	req->body = malloc(body_len + 1);
	if (req->body == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("eventgrid: out of memory for a %d-byte request body", body_len)));
	memcpy(req->body, body, body_len);
	req->body[body_len] = '\0';
	req->body_len = body_len;
	if (body != scratch->data)
		pfree((char *) body);

#define ADD(name, value, custom) \
	do { if (problem == EG_OUTCOME_NONE) problem = add_header(scratch, &n, name, value, custom); } while (0)
	resetStringInfo(scratch);
	ADD("Content-Type", eg_content_type(spec->schema, nevents), false);
	ADD("aeg-event-type", "Notification", false);
	ADD("aeg-subscription-name", asc_toupper(spec->subscription_name, strlen(spec->subscription_name)), false);
	snprintf(count_text, sizeof(count_text), "%d", spec->delivery_count);
	ADD("aeg-delivery-count", count_text, false);
	ADD("aeg-metadata-version", spec->metadata_version, false);
	if (strcmp(spec->schema, "CloudEventSchemaV1_0") != 0)
		ADD("aeg-data-version", spec->data_version, false);
	ADD("aeg-output-event-id", spec->output_event_id, false);
	if (spec->signing_keys)
	{
		ADD("webhook-id", spec->webhook_id, false);
		ADD("webhook-timestamp", sig.timestamp, false);
		ADD("webhook-signature", sig.signature.data, false);
		pfree(sig.signature.data);
	}

	if (problem == EG_OUTCOME_NONE && spec->custom_headers)
	{
		char	   *copy = pstrdup(spec->custom_headers);
		char	   *save = NULL;

		for (char *h = strtok_r(copy, "\n", &save); h && problem == EG_OUTCOME_NONE; h = strtok_r(NULL, "\n", &save))
		{
			char	   *sep = strstr(h, ": ");

			if (sep == NULL)
			{
				problem = EG_OUTCOME_INVALID_HEADER;
				break;
			}
			*sep = '\0';
			/* a signed request's webhook-* headers are the signature's own */
			if (spec->signing_keys && (pg_strcasecmp(h, "webhook-id") == 0 ||
									   pg_strcasecmp(h, "webhook-timestamp") == 0 ||
									   pg_strcasecmp(h, "webhook-signature") == 0))
				continue;
			ADD(h, sep + 2, true);
		}
		pfree(copy);
	}
#undef ADD
	if (problem != EG_OUTCOME_NONE)
	{
		free(req->body);
		req->body = NULL;
		req->body_len = 0;
		return problem;
	}
	eg_http_set_headers(req, scratch->data, scratch->len, n);
	return EG_OUTCOME_NONE;
}

/*
 * A routing_key_from= or stream_from= value into *from: "subject" or
 * "ordering_key"; false for any other.
 */
bool
eg_key_from_name(const char *name, EgKeyFrom *from)
{
	if (strcmp(name, "subject") == 0)
		*from = EG_KEY_FROM_SUBJECT;
	else if (strcmp(name, "ordering_key") == 0)
		*from = EG_KEY_FROM_ORDERING_KEY;
	else
		return false;
	return true;
}

/*
 * The key of a broker message (a RabbitMQ routing key, a Redis stream's
 * key) that carries event: fixed; the event's subject, copied into buf (of
 * cap bytes; "" when it has none); or ordering_key, the event's ordering
 * key as the claim read it (eventgrid._ordering_key(), SPEC 13; NULL when
 * it has none).  NULL when it has no ordering key or the key is over
 * cap - 1 bytes: the message cannot be sent (InvalidHeader).  Main
 * thread, in a transaction (jsonb's parser, for the subject).
 */
const char *
eg_message_key(EgKeyFrom from, const char *fixed, const EgEventPart *event, const char *ordering_key,
			   char *buf, size_t cap)
{
	switch (from)
	{
		case EG_KEY_FIXED:
			return fixed;
		case EG_KEY_FROM_SUBJECT:
			return eg_event_subject(event->json, event->len, buf, cap) ? buf : NULL;
		case EG_KEY_FROM_ORDERING_KEY:
			return ordering_key != NULL && strlen(ordering_key) < cap ? ordering_key : NULL;
	}
	return NULL;
}

/*
 * The subject of an event (its JSON text, of len bytes: an Event Grid
 * event's or a CloudEvent's "subject") into out (of cap bytes,
 * NUL-terminated): "" when it has none (a custom-schema event, or text
 * that does not parse as a JSON object); false when it does not fit.
 * Main thread, in a transaction (jsonb's parser).  A destination whose
 * key comes from the event (a RabbitMQ routing key, a Redis stream).
 */
bool
eg_event_subject(const char *json, int len, char *out, size_t cap)
{
	Jsonb	   *jb = eg_json_object(json, len);
	JsonbValue	v;
	bool		ok = true;

	out[0] = '\0';
	if (jb != NULL &&
		getKeyJsonValueFromContainer(&jb->root, "subject", 7, &v) != NULL && v.type == jbvString)
	{
		ok = (size_t) v.val.string.len < cap;
		if (ok)
		{
			memcpy(out, v.val.string.val, v.val.string.len);
			out[v.val.string.len] = '\0';
		}
	}
	if (jb != NULL)
		pfree(jb);
	return ok;
}

/*
 * len bytes of JSON text (untrusted: an event, a server's answer) as a
 * jsonb object, by jsonb's own parser; NULL when it does not parse or is
 * not an object (the parser's error is swallowed).  Main thread, in a
 * transaction; palloc'd.
 */
Jsonb *
eg_json_object(const char *text, size_t len)
{
	MemoryContext cxt = CurrentMemoryContext;
	char	   *copy = pnstrdup(text, len);
	Jsonb	   *jb = NULL;

	PG_TRY();
	{
		jb = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(copy)));
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		FlushErrorState();
		jb = NULL;
	}
	PG_END_TRY();
	pfree(copy);
	if (jb != NULL && !JB_ROOT_IS_OBJECT(jb))
	{
		pfree(jb);
		jb = NULL;
	}
	return jb;
}
