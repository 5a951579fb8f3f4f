/*
 * table_change_event.c - the event of one row change of a table change
 * publication (its trigger: table_change_trigger.c), built directly as
 * jsonb in the topic's input schema, already as the publish trigger would
 * stamp it (Event Grid schema: topic and metadataVersion), with its size
 * as JSON text checked against the 1 MB limit.  A column's JSON value is
 * to_jsonb()'s for a built-in type (domains over one included) and its
 * text form for a user-defined type; the subject is made of
 * percent-encoded key values, so no character of a row reaches a header.
 */
#include "publish/table_change.h"
#include "publish/publish.h"
#include "store/store.h"
#include "http/url.h"

#include "access/htup_details.h"
#include "access/heapam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/partition.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/json.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/numeric.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/xid8.h"


/* Does text array (isnull: none) hold name? */
bool
eg_tc_in_array(Datum array, bool isnull, const char *name)
{
	Datum	   *elems;
	bool	   *nulls;
	int			n;

	if (isnull)
		return false;
	deconstruct_array(DatumGetArrayTypeP(array), TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &n);
	for (int i = 0; i < n; i++)
		if (!nulls[i] && strcmp(TextDatumGetCString(elems[i]), name) == 0)
			return true;
	return false;
}

/* RFC 3339 in UTC with microseconds, as eventgrid.eg_tc_rfc3339() writes it. */
char *
eg_tc_rfc3339(TimestampTz ts)
{
	struct pg_tm tm;
	fsec_t		fsec;

	if (timestamp2tm(ts, NULL, &tm, &fsec, NULL, NULL) != 0)
		ereport(ERROR, (errcode(ERRCODE_DATETIME_VALUE_OUT_OF_RANGE), errmsg("timestamp out of range")));
	return psprintf("%04d-%02d-%02dT%02d:%02d:%02d.%06dZ", tm.tm_year, tm.tm_mon, tm.tm_mday,
					tm.tm_hour, tm.tm_min, tm.tm_sec, (int) fsec);
}

/* A random (version 4) UUID as text, as gen_random_uuid() makes one. */
static char *
random_uuid(void)
{
	static const int groups[] = {4, 2, 2, 2, 6};
	uint8		b[16];
	char	   *out = palloc(37);
	char	   *p = out;

	if (!pg_strong_random(b, sizeof(b)))
		ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("could not generate random values")));
	b[6] = (b[6] & 0x0f) | 0x40;
	b[8] = (b[8] & 0x3f) | 0x80;
	for (int g = 0, i = 0; g < (int) lengthof(groups); g++)
	{
		if (g > 0)
			*p++ = '-';
		p += hex_encode((const char *) b + i, groups[g], p);
		i += groups[g];
	}
	*p = '\0';
	return out;
}

static void
push_key(JsonbParseState **st, const char *key)
{
	JsonbValue	k;

	k.type = jbvString;
	k.val.string.val = (char *) key;
	k.val.string.len = strlen(key);
	pushJsonbValue(st, WJB_KEY, &k);
}

static void
push_string(JsonbParseState **st, const char *key, const char *value)
{
	JsonbValue	v;

	push_key(st, key);
	v.type = jbvString;
	v.val.string.val = (char *) value;
	v.val.string.len = strlen(value);
	pushJsonbValue(st, WJB_VALUE, &v);
}

static void
push_null_value(JsonbParseState **st)
{
	JsonbValue	v;

	v.type = jbvNull;
	pushJsonbValue(st, WJB_VALUE, &v);
}

static void
push_null(JsonbParseState **st, const char *key)
{
	push_key(st, key);
	push_null_value(st);
}

static void
push_jsonb(JsonbParseState **st, const char *key, Jsonb *jb)
{
	JsonbValue	v;

	push_key(st, key);
	v.type = jbvBinary;
	v.val.binary.data = &jb->root;
	v.val.binary.len = VARSIZE(jb) - VARHDRSZ;
	pushJsonbValue(st, WJB_VALUE, &v);
}

/*
 * The size of a value's JSON text, as jsonb's output function writes it
 * inside an event (which writes a value the same wherever it stands).
 */
static int64
jsonb_text_size(EgChange *c, Jsonb *jb)
{
	resetStringInfo(&c->text);
	(void) JsonbToCString(&c->text, &jb->root, VARSIZE(jb));
	return c->text.len;
}

static int64
string_text_size(EgChange *c, const char *s)
{
	resetStringInfo(&c->text);
	escape_json(&c->text, s);
	return c->text.len;
}

/*
 * Does the text of a json value hold the escape \u0000, which a json
 * column accepts and jsonb (so to_jsonb()) refuses?  An escaped backslash
 * before "u0000" is not one.
 */
static bool
json_has_nul_escape(const char *text)
{
	for (const char *p = text; *p; p++)
	{
		if (*p != '\\')
			continue;
		if (p[1] == 'u' && strncmp(p + 2, "0000", 4) == 0)
			return true;
		if (p[1] != '\0')
			p++;				/* the escaped character */
	}
	return false;
}

/*
 * Pushes the JSON object of the columns of a row (published, or watched
 * with watched) into st; returns pushJsonbValue's result for its end (the
 * whole value when st held nothing else).  The published values' text
 * sizes are added to c->values_size.
 */
static JsonbValue *
push_row(JsonbParseState **st, EgChange *c, TupleTableSlot *slot, bool watched, const bool *absent)
{
	pushJsonbValue(st, WJB_BEGIN_OBJECT, NULL);
	for (int i = 0; i < c->ncols; i++)
	{
		EgColumn   *col = &c->cols[i];
		bool		isnull;
		Datum		d;
		int64		size;
		char	   *json_text;

		if (watched ? !col->watched : !col->published)
			continue;
		if (absent && absent[col->attnum - 1])
			continue;
		d = slot_getattr(slot, col->attnum, &isnull);
		if (isnull)
		{
			push_null(st, col->name);
			size = strlen("null");
		}
		else if (col->kind == VALUE_TO_JSONB && col->base == JSONOID &&
				 json_has_nul_escape(json_text = TextDatumGetCString(d)))
		{
			/* a json value jsonb cannot hold: carried as its JSON text, a string */
			JsonbValue	v;

			v.type = jbvString;
			v.val.string.val = json_text;
			v.val.string.len = strlen(v.val.string.val);
			size = watched ? 0 : string_text_size(c, v.val.string.val);
			push_key(st, col->name);
			pushJsonbValue(st, WJB_VALUE, &v);
		}
		else if (col->kind == VALUE_TO_JSONB)
		{
			Jsonb	   *value = DatumGetJsonbP(FunctionCall1(&col->to_jsonb, d));

			push_jsonb(st, col->name, value);
			size = watched ? 0 : jsonb_text_size(c, value);
		}
		else
		{
			JsonbValue	v;
			char		digits[MAXINT8LEN + 1];

			switch (col->kind)
			{
				case VALUE_INTEGER:
					{
						int64		n = col->base == INT2OID ? DatumGetInt16(d)
							: col->base == INT4OID ? DatumGetInt32(d) : DatumGetInt64(d);

						v.type = jbvNumeric;
						v.val.numeric = int64_to_numeric(n);
						size = pg_lltoa(n, digits);
					}
					break;
				case VALUE_BOOL:
					v.type = jbvBool;
					v.val.boolean = DatumGetBool(d);
					size = v.val.boolean ? strlen("true") : strlen("false");
					break;
				default:
					v.type = jbvString;
					v.val.string.val = col->kind == VALUE_TEXT ? TextDatumGetCString(d)
						: OutputFunctionCall(&col->output, d);
					v.val.string.len = strlen(v.val.string.val);
					size = watched ? 0 : string_text_size(c, v.val.string.val);
					break;
			}
			push_key(st, col->name);
			pushJsonbValue(st, WJB_VALUE, &v);
		}
		if (!watched)
			c->values_size += size;
	}
	return pushJsonbValue(st, WJB_END_OBJECT, NULL);
}

/* The JSON object of the watched columns of a row. */
static Jsonb *
watched_object(EgChange *c, TupleTableSlot *slot)
{
	JsonbParseState *st = NULL;

	return JsonbValueToJsonb(push_row(&st, c, slot, true, NULL));
}

/* /<schema>/<table>, then each primary key value, percent-encoded. */
static char *
subject_of(EgChange *c, TupleTableSlot *slot)
{
	StringInfoData s;

	initStringInfo(&s);
	appendStringInfoString(&s, c->head);
	for (int k = 0; k < c->nkeys; k++)
	{
		EgColumn   *col = &c->cols[c->keys[k]];
		bool		isnull;
		Datum		d = slot_getattr(slot, col->attnum, &isnull);
		char	   *text = isnull ? "" : OutputFunctionCall(&col->output, d);

		appendStringInfoChar(&s, '/');
		appendStringInfoString(&s, eg_uri_escape(text, strlen(text)));
	}
	return s.data;
}

/* The number of column name of desc (which has it). */
AttrNumber
eg_tc_column_number(TupleDesc desc, const char *name)
{
	int			n = SPI_fnumber(desc, name);

	if (n <= 0)
		elog(ERROR, "eventgrid: the event table has no column %s", name);
	return n;
}

/* The members of the change's data object, in jsonb's key order: new, old, table, schema, operation. */
static void
push_data(JsonbParseState **st, EgChange *c, TupleTableSlot *newslot, TupleTableSlot *oldslot)
{
	push_key(st, "new");
	if (newslot)
		push_row(st, c, newslot, false, c->absent_new);
	else
		push_null_value(st);
	push_key(st, "old");
	if (oldslot)
		push_row(st, c, oldslot, false, c->absent_old);
	else
		push_null_value(st);
	push_string(st, "table", c->table_name);
	push_string(st, "schema", c->schema_name);
	push_string(st, "operation", c->operation);
}

/*
 * The event of one row change (newslot, oldslot: the row's new and old
 * versions, either NULL), built in the current memory context, and its
 * size as JSON text (*size), checked against the 1 MB limit.
 */
Jsonb *
eg_tc_build_event(EgChange *c, TupleTableSlot *newslot, TupleTableSlot *oldslot, int64 *size)
{
	JsonbParseState *st = NULL;
	Jsonb	   *event;
	char	   *subject = c->schema == IN_CUSTOM ? NULL : subject_of(c, newslot ? newslot : oldslot);

	/*
	 * One parse state for the whole event: its parts are not made into jsonb
	 * one by one.  Keys go in jsonb's order (shorter first, then bytewise),
	 * so that sorting each object at its end finds it sorted.
	 */
	c->values_size = 0;
	pushJsonbValue(&st, WJB_BEGIN_OBJECT, NULL);
	if (c->schema == IN_CUSTOM)
		push_data(&st, c, newslot, oldslot);
	else
	{
		/* the id's text is 36 characters in every event: in the skeleton */
		c->values_size += string_text_size(c, subject);
		push_string(&st, "id", c->id ? c->id : random_uuid());
		push_key(&st, "data");
		pushJsonbValue(&st, WJB_BEGIN_OBJECT, NULL);
		push_data(&st, c, newslot, oldslot);
		pushJsonbValue(&st, WJB_END_OBJECT, NULL);
		if (c->schema == IN_CLOUDEVENTS)
		{
			push_string(&st, "time", c->event_time);
			push_string(&st, "type", c->event_type);
			push_string(&st, "source", c->source);
			push_string(&st, "subject", subject);
			push_string(&st, "specversion", "1.0");
			push_string(&st, "datacontenttype", "application/json");
		}
		else
		{
			/* topic and metadataVersion: what the publish trigger stamps */
			push_string(&st, "topic", c->topic);
			push_string(&st, "subject", subject);
			push_string(&st, "eventTime", c->event_time);
			push_string(&st, "eventType", c->event_type);
			push_string(&st, "dataVersion", "1");
			push_string(&st, "metadataVersion", "1");
		}
	}
	event = JsonbValueToJsonb(pushJsonbValue(&st, WJB_END_OBJECT, NULL));
	if (c->skeleton_size < 0)
	{
		*size = eg_event_text_size(event);
		c->skeleton_size = *size - c->values_size;
	}
	else
		*size = c->skeleton_size + c->values_size;
	eg_check_event_size(*size);
	return event;
}

/* Are the watched columns of the two versions of a row the same? */
bool
eg_tc_unchanged(EgChange *c, TupleTableSlot *newslot, TupleTableSlot *oldslot, MemoryContext row_cxt)
{
	MemoryContext old = MemoryContextSwitchTo(row_cxt);
	bool		same = compareJsonbContainers(&watched_object(c, newslot)->root,
											  &watched_object(c, oldslot)->root) == 0;

	MemoryContextSwitchTo(old);
	MemoryContextReset(row_cxt);
	return same;
}

/* jsonb's order of object keys, for columns: shorter names first, then bytewise. */
static int
column_cmp(const void *a, const void *b)
{
	const char *x = ((const EgColumn *) a)->name;
	const char *y = ((const EgColumn *) b)->name;
	size_t		xl = strlen(x);
	size_t		yl = strlen(y);

	if (xl != yl)
		return xl < yl ? -1 : 1;
	return memcmp(x, y, xl);
}

/* The columns of a relation (desc), and how each goes into events. */
void
eg_tc_prepare_columns(EgChange *c, TupleDesc desc, Datum columns, bool columns_null, Datum watched,
					  bool watched_null, Datum keys, bool keys_null)
{
	Datum	   *key_names = NULL;
	bool	   *key_nulls;
	int			nkey_names = 0;

	c->cols = palloc0(desc->natts * sizeof(EgColumn));
	c->ncols = 0;
	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		EgColumn   *col;
		Oid			base;
		Oid			output;
		bool		varlena;

		if (att->attisdropped)
			continue;
		col = &c->cols[c->ncols++];
		col->attnum = att->attnum;
		col->name = NameStr(att->attname);
		col->published = columns_null || eg_tc_in_array(columns, false, col->name);
		col->watched = watched_null || eg_tc_in_array(watched, false, col->name);
		base = getBaseType(att->atttypid);
		col->base = base;
		col->kind = base == INT2OID || base == INT4OID || base == INT8OID ? VALUE_INTEGER
			: base == BOOLOID ? VALUE_BOOL
			: base == TEXTOID || base == VARCHAROID ? VALUE_TEXT
			: base < FirstNormalObjectId ? VALUE_TO_JSONB : VALUE_TEXT_FORM;
		getTypeOutputInfo(att->atttypid, &output, &varlena);
		fmgr_info(output, &col->output);
		if (col->kind == VALUE_TO_JSONB)
		{
			/* to_jsonb(anyelement) learns the type from its call expression */
			Param	   *arg = makeNode(Param);

			arg->paramkind = PARAM_EXTERN;
			arg->paramid = 1;
			arg->paramtype = att->atttypid;
			arg->paramtypmod = att->atttypmod;
			arg->paramcollid = att->attcollation;
			arg->location = -1;
			fmgr_info(F_TO_JSONB, &col->to_jsonb);
			fmgr_info_set_expr((Node *) makeFuncExpr(F_TO_JSONB, JSONBOID, list_make1(arg), InvalidOid,
													 InvalidOid, COERCE_EXPLICIT_CALL), &col->to_jsonb);
		}
	}

	/* in jsonb's key order, so that each row's object is built sorted (push_row) */
	qsort(c->cols, c->ncols, sizeof(EgColumn), column_cmp);

	/* the subject names the primary key's values when every key column is published */
	c->keys = NULL;
	c->nkeys = 0;
	if (!keys_null)
		deconstruct_array(DatumGetArrayTypeP(keys), TEXTOID, -1, false, TYPALIGN_INT, &key_names, &key_nulls,
						  &nkey_names);
	if (nkey_names > 0)
	{
		c->keys = palloc(nkey_names * sizeof(AttrNumber));
		for (int k = 0; k < nkey_names; k++)
		{
			const char *name = TextDatumGetCString(key_names[k]);
			int			i;

			for (i = 0; i < c->ncols && strcmp(c->cols[i].name, name) != 0; i++)
				;
			if (i == c->ncols || !c->cols[i].published)
			{
				c->nkeys = 0;
				c->keys = NULL;
				break;
			}
			c->keys[c->nkeys++] = i;
		}
	}
}
