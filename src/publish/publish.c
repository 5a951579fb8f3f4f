/*
 * publish.c - the BEFORE INSERT row trigger on eventgrid.events: validates
 * each published event against its topic's input schema and stamps it
 * (SPEC section 8).  Event Grid schema: id, subject, eventType and eventTime
 * (RFC 3339) required, dataVersion stamped "" when absent, metadataVersion
 * must be "1" (stamped when absent), topic stamped with the topic name.
 * CloudEvents 1.0: id, source, type and specversion "1.0" required.  Custom
 * schema: any JSON object.  In every schema, id and dataVersion become HTTP
 * headers, so they may hold no control characters.  Every event is at most
 * 1 MB of JSON text; its publish_time is the publishing transaction's start
 * time on eventgrid's clock (eg_transaction_now(): with
 * eventgrid.clock_offset) and event_bytes its size.
 *
 * A row that arrives with publish_time already set comes from someone
 * allowed to write that column (the extension's owner: pg_restore of a dump,
 * publishers cannot) and is stored as it is: it was validated when first
 * published, and its topic may not be restored yet.
 */
#include "publish/publish.h"
#include "http/http.h"
#include "store/store.h"

#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "mb/pg_wchar.h"
#include "storage/proc.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

typedef enum EgSchema
{
	EG_SCHEMA_EVENTGRID,
	EG_SCHEMA_CLOUDEVENTS,
	EG_SCHEMA_CUSTOM
} EgSchema;

/* One-entry cache of the topic looked up by the current statement. */
static char cached_topic[256];
static EgSchema cached_schema;
static bool cached_domain;
static LocalTransactionId cached_lxid = InvalidLocalTransactionId;
static CommandId cached_cid = InvalidCommandId;
static SPIPlanPtr topic_plan = NULL;
static SPIPlanPtr domain_plan = NULL;	/* the same, saying whether it is a domain (SPEC 18) */

/* the row of the current statement an event is (1 the first), for error messages */
static LocalTransactionId row_lxid = InvalidLocalTransactionId;
static CommandId row_cid = InvalidCommandId;
static int64 row_no = 0;


/*
 * At most the first 64 bytes of s (cut at a character boundary), with "..."
 * when s is longer: error messages quote the topic, which may be a megabyte.
 */
static char *
quote_prefix(const char *s)
{
	int			len = strlen(s);

	if (len <= 64)
		return pstrdup(s);
	return psprintf("%.*s...", pg_mbcliplen(s, len, 64), s);
}

/* See eventgrid.h. */
LocalTransactionId
eg_current_lxid(void)
{
	return eg_proc_lxid(MyProc);
}

/*
 * A plan of "SELECT input_schema, whether a domain" for a topic name $1,
 * kept for the backend's life.  A database whose extension predates domains
 * (0.20.0: no eventgrid.domains) has none: the plan that reads it is made
 * only once the table is there.
 */
static SPIPlanPtr
topic_lookup_plan(void)
{
	Oid			nsp = get_namespace_oid("eventgrid", true);
	bool		domains = OidIsValid(nsp) && OidIsValid(get_relname_relid("domains", nsp));
	SPIPlanPtr *slot = domains ? &domain_plan : &topic_plan;

	if (*slot == NULL)
	{
		Oid			argtypes[1] = {TEXTOID};
		SPIPlanPtr	plan = SPI_prepare(domains
									   ? "SELECT t.input_schema, EXISTS (SELECT 1 FROM eventgrid.domains d"
									   "                             WHERE d.name OPERATOR(pg_catalog.=) t.name)"
									   "  FROM eventgrid.topics t WHERE t.name OPERATOR(pg_catalog.=) $1"
									   : "SELECT t.input_schema, false FROM eventgrid.topics t"
									   " WHERE t.name OPERATOR(pg_catalog.=) $1",
									   1, argtypes);

		if (plan == NULL)
			elog(ERROR, "eventgrid: SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
		SPI_keepplan(plan);
		*slot = plan;
	}
	return *slot;
}

/*
 * The input schema of topic, read from eventgrid.topics (one prepared
 * query, its own SPI connection); *found says whether the topic exists,
 * *domain whether it is a domain.
 */
static EgSchema
query_topic_schema(const char *topic, bool *found, bool *domain)
{
	Datum		arg;
	char	   *schema;
	bool		isnull;
	EgSchema	result = EG_SCHEMA_EVENTGRID;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "eventgrid: SPI_connect failed");
	arg = CStringGetTextDatum(topic);
	if (SPI_execute_plan(topic_lookup_plan(), &arg, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "eventgrid: topic lookup failed");
	*found = SPI_processed > 0;
	*domain = false;
	if (*found)
	{
		schema = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
		if (strcmp(schema, "CloudEventSchemaV1_0") == 0)
			result = EG_SCHEMA_CLOUDEVENTS;
		else if (strcmp(schema, "CustomEventSchema") == 0)
			result = EG_SCHEMA_CUSTOM;
		*domain = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	}
	SPI_finish();
	return result;
}

/* See eventgrid.h. */
bool
eg_topic_exists(const char *topic)
{
	bool		found;
	bool		domain;

	(void) query_topic_schema(topic, &found, &domain);
	return found;
}

/*
 * The input schema of topic, which must exist (42704), and whether it is a
 * domain (*domain), kept for the rest of the statement.
 */
static EgSchema
lookup_topic_schema(const char *topic, bool *domain)
{
	EgSchema	result;
	bool		found;

	if (cached_lxid == eg_current_lxid() && cached_cid == GetCurrentCommandId(false) &&
		strcmp(cached_topic, topic) == 0)
	{
		*domain = cached_domain;
		return cached_schema;
	}

	result = query_topic_schema(topic, &found, domain);
	if (!found)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("topic \"%s\" does not exist", quote_prefix(topic)),
				 errhint("Create it with eventgrid.create_topic() before publishing to it.")));
	if (strlen(topic) < sizeof(cached_topic))
	{
		strcpy(cached_topic, topic);
		cached_schema = result;
		cached_domain = *domain;
		cached_lxid = eg_current_lxid();
		cached_cid = GetCurrentCommandId(false);
	}
	return result;
}

/* Strict RFC 3339 date-time: YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM). */
static bool
is_rfc3339(const char *s, int len)
{
	static const int mdays[] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
	int			i = 0;
	int			v[6];
	const char *seps = "--T::";

	for (int f = 0; f < 6; f++)
	{
		int			width = (f == 0) ? 4 : 2;

		v[f] = 0;
		for (int k = 0; k < width; k++, i++)
		{
			if (i >= len || s[i] < '0' || s[i] > '9')
				return false;
			v[f] = v[f] * 10 + (s[i] - '0');
		}
		if (f < 5)
		{
			if (i >= len || !(s[i] == seps[f] || (f == 2 && (s[i] == 't' || s[i] == ' '))))
				return false;
			i++;
		}
	}
	if (v[1] < 1 || v[1] > 12 || v[2] < 1 || v[2] > mdays[v[1] - 1] ||
		v[3] > 23 || v[4] > 59 || v[5] > 60)
		return false;
	if (v[1] == 2 && v[2] == 29 && !((v[0] % 4 == 0 && v[0] % 100 != 0) || v[0] % 400 == 0))
		return false;
	if (i < len && s[i] == '.')
	{
		int			digits = 0;

		for (i++; i < len && s[i] >= '0' && s[i] <= '9'; i++)
			digits++;
		if (digits == 0)
			return false;
	}
	if (i < len && (s[i] == 'Z' || s[i] == 'z'))
		return i + 1 == len;
	if (i < len && (s[i] == '+' || s[i] == '-'))
	{
		if (len - i != 6 || s[i + 3] != ':' ||
			!isdigit((unsigned char) s[i + 1]) || !isdigit((unsigned char) s[i + 2]) ||
			!isdigit((unsigned char) s[i + 4]) || !isdigit((unsigned char) s[i + 5]))
			return false;
		return (s[i + 1] - '0') * 10 + (s[i + 2] - '0') <= 23 &&
			(s[i + 4] - '0') * 10 + (s[i + 5] - '0') <= 59;
	}
	return false;
}

static const char *
schema_requirements(EgSchema schema)
{
	return schema == EG_SCHEMA_CLOUDEVENTS
		? "CloudEvents 1.0 events require the string attributes id, source, specversion (\"1.0\") and type."
		: "Event Grid schema events require the string fields id, subject, eventType and eventTime (RFC 3339).";
}

/*
 * Fetches a top-level field that must be a string when present.  Returns
 * false when absent; errors when required and absent, not a string, or
 * empty while nonempty is asked for.
 */
static bool
get_string_field(Jsonb *jb, const char *key, bool required, bool nonempty,
				 EgSchema schema, const char *topic, JsonbValue *out)
{
	if (getKeyJsonValueFromContainer(&jb->root, key, strlen(key), out) == NULL)
	{
		if (required)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("event is missing required field \"%s\"", key),
					 errdetail("Topic \"%s\" takes %s", topic,
							   schema == EG_SCHEMA_CLOUDEVENTS ? "CloudEvents 1.0 events." : "Event Grid schema events."),
					 errhint("%s", schema_requirements(schema))));
		return false;
	}
	if (out->type != jbvString)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("event field \"%s\" must be a JSON string", key),
				 errhint("%s", schema_requirements(schema))));
	if (nonempty && out->val.string.len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("event field \"%s\" must not be empty", key),
				 errhint("%s", schema_requirements(schema))));
	return true;
}

static void
check_time_field(JsonbValue *v, const char *key)
{
	if (!is_rfc3339(v->val.string.val, v->val.string.len))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_DATETIME_FORMAT),
				 errmsg("event field \"%s\" must be an RFC 3339 date-time, got \"%.*s\"",
						key, Min(v->val.string.len, 64), v->val.string.val),
				 errhint("Use the form 2024-05-01T12:34:56.789Z or 2024-05-01T14:34:56+02:00.")));
}

static void
push_string_pair(JsonbParseState **st, const char *key, const char *val)
{
	JsonbValue	k,
				v;

	k.type = jbvString;
	k.val.string.val = (char *) key;
	k.val.string.len = strlen(key);
	v.type = jbvString;
	v.val.string.val = (char *) val;
	v.val.string.len = strlen(val);
	pushJsonbValue(st, WJB_KEY, &k);
	pushJsonbValue(st, WJB_VALUE, &v);
}

/*
 * id and dataVersion, when strings, become the aeg-output-event-id and
 * aeg-data-version headers: a control character there could end the header
 * line and inject others (request smuggling), so it is refused.
 */
static void
check_header_fields(Jsonb *jb)
{
	static const char *const keys[] = {"id", "dataVersion"};

	for (int k = 0; k < (int) lengthof(keys); k++)
	{
		JsonbValue	v;
		int			at;

		if (getKeyJsonValueFromContainer(&jb->root, keys[k], strlen(keys[k]), &v) == NULL ||
			v.type != jbvString)
			continue;
		at = eg_control_char_at(v.val.string.val, v.val.string.len);
		if (at >= 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("event field \"%s\" must not contain control characters", keys[k]),
					 errdetail("It holds character U+%04X at byte %d.",
							   (unsigned char) v.val.string.val[at], at + 1),
					 errhint("The field is sent as an HTTP header; remove line breaks, tabs and other control characters.")));
	}
}

/* jsonb's order of object keys: shorter first, then bytewise. */
static int
jsonb_key_cmp(const char *a, int alen, const char *b, int blen)
{
	if (alen != blen)
		return alen < blen ? -1 : 1;
	return memcmp(a, b, alen);
}

/*
 * The event with topic set to the topic's name and, when absent,
 * dataVersion "" and metadataVersion "1", built in one pass over the event's
 * top-level pairs (nested values are copied by pushJsonbValue).  Each stamp
 * is pushed where jsonb's key order puts it, and a topic the publisher sent
 * is left out: the pairs arrive already sorted and unique, so the sort that
 * ends every object finds them in order and returns after one pass (a sort
 * of out-of-order keys was a fifth of this trigger's time).  The result is
 * the one jsonb_concat of the event and the stamps would give.
 */
static Jsonb *
stamp_eventgrid(Jsonb *jb, const char *topic, bool add_data_version, bool add_metadata_version)
{
	/* in jsonb key order: "topic" < "dataVersion" < "metadataVersion" */
	const char *keys[3];
	const char *vals[3];
	int			nstamps = 0;
	int			next = 0;
	JsonbParseState *st = NULL;
	JsonbIterator *it = JsonbIteratorInit(&jb->root);
	JsonbIteratorToken tok;
	JsonbValue	v;
	JsonbValue *res = NULL;

	keys[nstamps] = "topic";
	vals[nstamps++] = topic;
	if (add_data_version)
	{
		keys[nstamps] = "dataVersion";
		vals[nstamps++] = "";
	}
	if (add_metadata_version)
	{
		keys[nstamps] = "metadataVersion";
		vals[nstamps++] = "1";
	}

	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		if (tok == WJB_KEY)
		{
			bool		replaced = false;

			while (next < nstamps)
			{
				int			c = jsonb_key_cmp(keys[next], strlen(keys[next]),
											  v.val.string.val, v.val.string.len);

				if (c > 0)
					break;
				push_string_pair(&st, keys[next], vals[next]);
				next++;
				if (c == 0)
					replaced = true;
			}
			if (replaced)
			{
				/* the publisher's pair under a stamped key: skip its value */
				tok = JsonbIteratorNext(&it, &v, true);
				Assert(tok == WJB_VALUE);
				continue;
			}
		}
		else if (tok == WJB_END_OBJECT)
		{
			while (next < nstamps)
			{
				push_string_pair(&st, keys[next], vals[next]);
				next++;
			}
		}
		res = pushJsonbValue(&st, tok, tok < WJB_BEGIN_ARRAY ? &v : NULL);
	}
	return JsonbValueToJsonb(res);
}

/*
 * Validates one Event Grid schema event of topic and returns it stamped,
 * its "topic" set to stamp.
 */
static Jsonb *
validate_eventgrid(Jsonb *jb, const char *topic, const char *stamp)
{
	JsonbValue	v;
	bool		has_data_version;
	bool		has_metadata_version;

	get_string_field(jb, "id", true, true, EG_SCHEMA_EVENTGRID, topic, &v);
	get_string_field(jb, "subject", true, false, EG_SCHEMA_EVENTGRID, topic, &v);
	get_string_field(jb, "eventType", true, true, EG_SCHEMA_EVENTGRID, topic, &v);
	get_string_field(jb, "eventTime", true, true, EG_SCHEMA_EVENTGRID, topic, &v);
	check_time_field(&v, "eventTime");
	has_data_version = get_string_field(jb, "dataVersion", false, false, EG_SCHEMA_EVENTGRID, topic, &v);
	has_metadata_version = get_string_field(jb, "metadataVersion", false, false, EG_SCHEMA_EVENTGRID, topic, &v);
	if (has_metadata_version && !(v.val.string.len == 1 && v.val.string.val[0] == '1'))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("event field \"metadataVersion\" must be \"1\", got \"%.*s\"",
						Min(v.val.string.len, 64), v.val.string.val),
				 errhint("Leave metadataVersion out; eventgrid stamps it.")));

	return stamp_eventgrid(jb, stamp, !has_data_version, !has_metadata_version);
}

static void
validate_cloudevent(Jsonb *jb, const char *topic)
{
	JsonbValue	v;

	get_string_field(jb, "id", true, true, EG_SCHEMA_CLOUDEVENTS, topic, &v);
	get_string_field(jb, "source", true, true, EG_SCHEMA_CLOUDEVENTS, topic, &v);
	get_string_field(jb, "specversion", true, true, EG_SCHEMA_CLOUDEVENTS, topic, &v);
	if (!(v.val.string.len == 3 && memcmp(v.val.string.val, "1.0", 3) == 0))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("event attribute \"specversion\" must be \"1.0\", got \"%.*s\"",
						Min(v.val.string.len, 64), v.val.string.val),
				 errhint("Topic \"%s\" takes CloudEvents 1.0 events.", topic)));
	get_string_field(jb, "type", true, true, EG_SCHEMA_CLOUDEVENTS, topic, &v);
	get_string_field(jb, "subject", false, false, EG_SCHEMA_CLOUDEVENTS, topic, &v);
	get_string_field(jb, "datacontenttype", false, false, EG_SCHEMA_CLOUDEVENTS, topic, &v);
	if (get_string_field(jb, "time", false, true, EG_SCHEMA_CLOUDEVENTS, topic, &v))
		check_time_field(&v, "time");
}

/*
 * Size of the event's JSON text, as the delivery worker sends it (jsonb's
 * own output function makes both).  Made in full for every event: no
 * shortcut from the binary size holds, since a number such as 1e1000 is a
 * few bytes in jsonb and 1,001 characters as text.  It is the size the
 * 1 MB limit applies to and event_bytes records, which bounds the worker's
 * memory through eventgrid.max_bytes_in_flight.
 */
int64
eg_event_text_size(Jsonb *jb)
{
	StringInfoData text;
	int64		len;

	initStringInfo(&text);
	(void) JsonbToCString(&text, &jb->root, VARSIZE(jb));
	len = text.len;
	pfree(text.data);
	return len;
}

/* Refuses (54000) an event of size bytes of JSON text over the 1 MB limit. */
void
eg_check_event_size(int64 size)
{
	if (size > EG_MAX_EVENT_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("event is %lld bytes; an event may be at most 1 MB (%d bytes)",
						(long long) size, EG_MAX_EVENT_BYTES),
				 errhint("Store large payloads elsewhere and publish a reference to them.")));
}

/*
 * The position of the current row in its statement (1 the first): which
 * event an error is about, without quoting the event.
 */
static int64
row_of_statement(void)
{
	if (row_lxid != eg_current_lxid() || row_cid != GetCurrentCommandId(false))
	{
		row_lxid = eg_current_lxid();
		row_cid = GetCurrentCommandId(false);
		row_no = 0;
	}
	return ++row_no;
}

/*
 * The domain topic event jb, published to domain (of input schema schema),
 * names (SPEC 18): its "topic" (Event Grid schema: a name, or the path
 * "/domains/{domain}/topics/{name}" of this domain, as a publish stamps
 * it) or its "source" (CloudEvents); a domain topic's name, 3 to 50
 * letters, digits and hyphens (as create_domain_topic() takes).  An event
 * that names none, names one badly, or whose path names another domain
 * refuses the statement (22023, naming the event by its position, never
 * quoting what it names): the position is row (1 the first; 0: the
 * caller says where).  jb is a JSON object (validate_event() checked).
 */
static char *
domain_topic_of(Jsonb *jb, EgSchema schema, const char *domain, int64 row)
{
	const char *field = schema == EG_SCHEMA_CLOUDEVENTS ? "source" : "topic";
	JsonbValue *v = getKeyJsonValueFromContainer(&jb->root, field, strlen(field), NULL);
	char	   *name;
	char	   *which = row > 0 ? psprintf("event %lld of the statement", (long long) row) : pstrdup("the event");

	if (v == NULL || v->type != jbvString || v->val.string.len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s names no domain topic of domain \"%s\"", which, quote_prefix(domain)),
				 errdetail("An event published to a domain names its domain topic in \"%s\", a non-empty string.", field),
				 errhint("Nothing of the statement was published.")));
	name = pnstrdup(v->val.string.val, v->val.string.len);
	if (schema == EG_SCHEMA_EVENTGRID && strncmp(name, "/domains/", strlen("/domains/")) == 0)
	{
		char	   *prefix = psprintf("/domains/%s/topics/", domain);

		if (strncmp(name, prefix, strlen(prefix)) != 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s names its domain topic by a path that is not of domain \"%s\"", which, quote_prefix(domain)),
					 errdetail("A path in \"topic\" must be /domains/%s/topics/{name}; or give the domain topic's name alone.",
							   quote_prefix(domain)),
					 errhint("Nothing of the statement was published.")));
		name += strlen(prefix);
	}
	if (!eg_is_topic_name(name))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s names an invalid domain topic of domain \"%s\"", which, quote_prefix(domain)),
				 errdetail("Its \"%s\" must be a domain topic name: 3 to %d letters, digits and hyphens%s.", field,
						   EG_TOPIC_NAME_MAX,
						   schema == EG_SCHEMA_EVENTGRID ? ", alone or as /domains/{domain}/topics/{name}" : ""),
				 errhint("Nothing of the statement was published.")));
	return name;
}

/*
 * Validates event jb of topic (of input schema schema) as a publish does:
 * a JSON object, the schema's required fields, no control characters in
 * the fields sent as headers, at most 1 MB of JSON text (its size in
 * *size).  Returns it stamped (Event Grid schema: topic, dataVersion and
 * metadataVersion); raises 22023 or 54000 otherwise.  Of a domain (SPEC
 * 18), *domain_topic gets the domain topic it names (domain_topic_of()),
 * and an Event Grid schema event's topic is stamped as its path
 * "/domains/{domain}/topics/{name}"; otherwise *domain_topic is NULL.
 */
static Jsonb *
validate_event(Jsonb *jb, const char *topic, EgSchema schema, bool domain, char **domain_topic, int64 *size,
			   int64 row)
{
	const char *stamp = topic;

	*domain_topic = NULL;
	if (!JB_ROOT_IS_OBJECT(jb) || JB_ROOT_IS_SCALAR(jb))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("an event must be a JSON object"),
				 errhint("To publish several events, insert one row per event or call eventgrid.publish() with an array.")));
	if (domain)
	{
		*domain_topic = domain_topic_of(jb, schema, topic, row);
		stamp = psprintf("/domains/%s/topics/%s", topic, *domain_topic);
	}

	if (schema == EG_SCHEMA_EVENTGRID)
		jb = validate_eventgrid(jb, topic, stamp);
	else if (schema == EG_SCHEMA_CLOUDEVENTS)
		validate_cloudevent(jb, topic);
	check_header_fields(jb);

	*size = eg_event_text_size(jb);
	eg_check_event_size(*size);
	return jb;
}

typedef struct EgReplicatedCheck
{
	const char *topic;
	bool		topic_known;
	Jsonb	   *event;
	Jsonb	   *stored;
	char	   *domain_topic;
	int64		size;
} EgReplicatedCheck;

static void
check_replicated(void *arg)
{
	EgReplicatedCheck *c = arg;

	bool		domain = false;
	EgSchema	schema = c->topic_known ? lookup_topic_schema(c->topic, &domain) : EG_SCHEMA_CUSTOM;

	/* a topic this database lacks: what holds for every schema */
	c->stored = validate_event(c->event, c->topic, schema, domain, &c->domain_topic, &c->size, 0);
}

/*
 * See eventgrid.h.  The checks raise errors: they run in a subtransaction
 * of their own (eg_try), whose error is taken as the reason and dropped, so
 * that an invalid row never stops the apply worker.
 */
char *
eg_check_replicated_event(const char *topic, bool topic_known, Jsonb *jb, Jsonb **stored, char **domain_topic,
						  int64 *size)
{
	EgReplicatedCheck c = {.topic = topic,.topic_known = topic_known,.event = jb};
	ErrorData  *edata = eg_try(check_replicated, &c);

	if (edata != NULL)
		return edata->message;
	*stored = c.stored;
	*domain_topic = c.domain_topic;
	*size = c.size;
	return NULL;
}

PG_FUNCTION_INFO_V1(eventgrid_validate_event);

/* Trigger function eventgrid._validate_event(): BEFORE INSERT FOR EACH ROW. */
Datum
eventgrid_validate_event(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	TupleDesc	tupdesc;
	HeapTuple	tuple;
	int			cols[4];
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};
	int			ncols = 3;
	bool		isnull;
	Datum		d;
	char	   *topic;
	Jsonb	   *jb;
	EgSchema	schema;
	bool		domain;
	char	   *domain_topic;
	int64		size;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BEFORE(trigdata->tg_event) ||
		!TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) || !TRIGGER_FIRED_BY_INSERT(trigdata->tg_event))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("eventgrid._validate_event() must be called as a BEFORE INSERT FOR EACH ROW trigger")));

	tupdesc = trigdata->tg_relation->rd_att;
	tuple = trigdata->tg_trigtuple;

	/* restored rows (publish_time given) are stored as they are */
	(void) SPI_getbinval(tuple, tupdesc, SPI_fnumber(tupdesc, "publish_time"), &isnull);
	if (!isnull)
		return PointerGetDatum(tuple);

	d = SPI_getbinval(tuple, tupdesc, SPI_fnumber(tupdesc, "topic"), &isnull);
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NOT_NULL_VIOLATION),
				 errmsg("topic of a published event must not be NULL")));
	topic = TextDatumGetCString(d);
	schema = lookup_topic_schema(topic, &domain);

	cols[0] = SPI_fnumber(tupdesc, "event");
	d = SPI_getbinval(tuple, tupdesc, cols[0], &isnull);
	if (isnull)
		ereport(ERROR,
				(errcode(ERRCODE_NOT_NULL_VIOLATION),
				 errmsg("event published to topic \"%s\" must not be NULL", quote_prefix(topic))));
	jb = validate_event(DatumGetJsonbP(d), topic, schema, domain, &domain_topic, &size,
						domain ? row_of_statement() : 0);

	values[0] = JsonbPGetDatum(jb);
	cols[1] = SPI_fnumber(tupdesc, "publish_time");
	values[1] = TimestampTzGetDatum(eg_transaction_now());
	cols[2] = SPI_fnumber(tupdesc, "event_bytes");
	values[2] = Int32GetDatum((int32) size);
	/* routed within a domain (SPEC 18); a publisher cannot set it itself */
	if ((cols[3] = SPI_fnumber(tupdesc, "domain_topic")) > 0)
	{
		values[3] = domain_topic ? CStringGetTextDatum(domain_topic) : (Datum) 0;
		nulls[3] = domain_topic == NULL;
		ncols = 4;
	}

	return PointerGetDatum(heap_modify_tuple_by_cols(tuple, tupdesc, ncols, cols, values, nulls));
}

/* The events of one request, validated in order; at: the one being validated. */
typedef struct EgBatchCheck
{
	const char *topic;
	EgSchema	schema;
	bool		domain;
	Jsonb	   *events;
	int			n;
	volatile int at;			/* stored at each step: read after the error's longjmp */
} EgBatchCheck;

static void
check_batch(void *arg)
{
	EgBatchCheck *c = arg;
	MemoryContext cxt = AllocSetContextCreate(CurrentMemoryContext, "eventgrid event check", ALLOCSET_DEFAULT_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);

	for (c->at = 0; c->at < c->n; c->at++)
	{
		JsonbValue *v = JB_ROOT_IS_ARRAY(c->events) && !JB_ROOT_IS_SCALAR(c->events)
			? getIthJsonbValueFromContainer(&c->events->root, (uint32) c->at) : NULL;
		Jsonb	   *jb = v != NULL ? JsonbValueToJsonb(v) : c->events;
		char	   *domain_topic;
		int64		size;

		(void) validate_event(jb, c->topic, c->schema, c->domain, &domain_topic, &size, 0);
		MemoryContextReset(cxt);
		CHECK_FOR_INTERRUPTS();
	}
	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
}

PG_FUNCTION_INFO_V1(eventgrid_first_invalid_event);

/*
 * eventgrid._first_invalid_event(topic text, events jsonb, OUT event_index
 * integer, OUT problem text, OUT sqlstate text): validates events (an
 * array, or one event) as publishing them to topic would, without storing
 * any, in one subtransaction for all of them: the first that fails, by its
 * index (0 the first), with the error's message and SQLSTATE (22023 invalid,
 * 54000 over 1 MB); NULLs when every one is valid.  The HTTP data plane
 * checks a request with it before storing its events (SPEC 16), so that a
 * bad event costs no subtransaction per event.  Errors: 42704 no such topic.
 */
Datum
eventgrid_first_invalid_event(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	Datum		values[3];
	bool		nulls[3] = {true, true, true};
	EgBatchCheck c = {0};
	ErrorData  *edata;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be NULL", PG_ARGISNULL(0) ? "topic" : "events")));
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "eventgrid._first_invalid_event() must return a record");
	c.topic = text_to_cstring(PG_GETARG_TEXT_PP(0));
	c.events = PG_GETARG_JSONB_P(1);
	c.schema = lookup_topic_schema(c.topic, &c.domain);
	c.n = JB_ROOT_IS_ARRAY(c.events) && !JB_ROOT_IS_SCALAR(c.events) ? (int) JB_ROOT_COUNT(c.events) : 1;
	edata = eg_try(check_batch, &c);
	if (edata != NULL)
	{
		values[0] = Int32GetDatum(c.at);
		values[1] = CStringGetTextDatum(edata->message ? edata->message : "invalid event");
		values[2] = CStringGetTextDatum(unpack_sql_state(edata->sqlerrcode));
		nulls[0] = nulls[1] = nulls[2] = false;
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(desc), values, nulls)));
}
