/*
 * table_change_trigger.c - the statement trigger of a table change
 * publication (README "Publishing table changes"): each row of the
 * statement's transition tables becomes an event of the publication's
 * topic, built here directly (no SQL per row) and stored a thousand at a
 * time as COPY stores rows (heap_multi_insert).
 *
 * An event is built in the topic's input schema, already as the publish
 * trigger would stamp it (Event Grid schema: topic and metadataVersion),
 * with its publish time and its size as JSON text, as eventgrid.events'
 * BEFORE INSERT trigger would store it (it stores rows with a publish time
 * as they are; only the extension's owner, whose rights this trigger runs
 * with, may write those columns).  What comes
 * from the row is checked here: each event's size against the 1 MB limit;
 * the subject is made of percent-encoded key values, so no character of a
 * row reaches a header.  A column's JSON value is to_jsonb()'s for a
 * built-in type (domains over one included) and its text form for a
 * user-defined type.
 *
 * The trigger looks up its publication (one prepared query, its row kept
 * for the session's next statements until the publications, the relation
 * or a schema change) and reads the columns from the relation the
 * statement wrote, by name: a partition's own column order, an ALTER
 * TABLE since the last statement, need nothing kept.  Refuses (42501) to run as any trigger
 * publish_table_changes() did not make.
 */
#include "core/eventgrid.h"
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

#define EG_TC_BATCH 1000		/* events stored at once */

/*
 * The publications to the trigger's topic of its relation and of the
 * tables above it (a partition is covered by its nearest published
 * ancestor), with the names the events carry.  A plain prepared query: no
 * SQL function to plan again at each statement.
 */
static SPIPlanPtr lookup_plan = NULL;
static const char *lookup_sql =
"SELECT p.operations, p.columns, p.update_columns, p.event_type_prefix, t.input_schema, n.nspname::pg_catalog.text,"
"       c.relname::pg_catalog.text,"
"       ARRAY(SELECT a.attname::pg_catalog.text FROM pg_catalog.pg_index x,"
"                    pg_catalog.unnest(x.indkey) WITH ORDINALITY k(attnum, i), pg_catalog.pg_attribute a"
"              WHERE x.indrelid OPERATOR(pg_catalog.=) p.source_table AND x.indisprimary"
"                AND a.attrelid OPERATOR(pg_catalog.=) p.source_table AND a.attnum OPERATOR(pg_catalog.=) k.attnum"
"              ORDER BY k.i),"
"       p.source_table::pg_catalog.oid, eventgrid._table_change_trigger_name($2, $3)"
"  FROM eventgrid.table_publications p"
"  JOIN eventgrid.topics t ON t.name OPERATOR(pg_catalog.=) p.topic"
"  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) p.source_table"
"  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace"
" WHERE p.source_table::pg_catalog.oid OPERATOR(pg_catalog.=) ANY ($1) AND p.topic OPERATOR(pg_catalog.=) $2";

/*
 * What the lookup found, kept per backend for the next statements on the
 * same relation, topic and operation: the publication's row (with the
 * names of the published table and its primary key's columns).  Dropped
 * when eventgrid.table_publications changes (eg_publications_generation():
 * a statement trigger on it), when the relation or the published table
 * is invalidated in the relation cache (ALTER TABLE, a rename, a new
 * primary key, ANALYZE) and when any schema changes (its name is in the
 * events).
 */
#define EG_TC_KEPT 16
typedef struct EgKeptPublication
{
	bool		used;
	bool		stale;			/* invalidated: freed at the next look-up, not in the callback */
	Oid			relid;			/* the relation written */
	Oid			source;			/* the published table (relid or an ancestor) */
	char		topic[NAMEDATALEN * 2];
	char		operation[8];
	uint64		generation;
	HeapTuple	row;			/* the lookup's row, in TopMemoryContext */
	TupleDesc	desc;
} EgKeptPublication;

static EgKeptPublication kept[EG_TC_KEPT];
static int	kept_next = 0;		/* the entry replaced next when all are used */
static bool kept_callbacks = false;

static void
forget_kept(EgKeptPublication *k)
{
	if (!k->used)
		return;
	heap_freetuple(k->row);
	FreeTupleDesc(k->desc);
	k->used = false;
}

/*
 * A relation changed (InvalidOid: any): the publications kept for it are
 * marked stale.  Not freed here: invalidations are taken in the middle of
 * a statement (at a lock), perhaps while the trigger reads that row.
 */
static void
kept_relcache_callback(Datum arg, Oid relid)
{
	for (int i = 0; i < EG_TC_KEPT; i++)
		if (kept[i].used && (relid == InvalidOid || kept[i].relid == relid || kept[i].source == relid))
			kept[i].stale = true;
}

/* A schema changed: every kept publication is forgotten (the events carry schema names). */
static void
kept_syscache_callback(Datum arg, int cacheid, uint32 hashvalue)
{
	kept_relcache_callback(arg, InvalidOid);
}

static EgKeptPublication *
find_kept(Oid relid, const char *topic, const char *operation)
{
	uint64		generation = eg_publications_generation();

	for (int i = 0; i < EG_TC_KEPT; i++)
	{
		EgKeptPublication *k = &kept[i];

		if (k->used && (k->stale || k->generation != generation))
			forget_kept(k);
		if (!k->used || k->relid != relid || strcmp(k->topic, topic) != 0 || strcmp(k->operation, operation) != 0)
			continue;
		return k;
	}
	return NULL;
}

/* Keeps the lookup's row for relid's statements to come, when it fits. */
static EgKeptPublication *
keep(Oid relid, Oid source, const char *topic, const char *operation, uint64 generation, HeapTuple row,
	 TupleDesc desc)
{
	EgKeptPublication *k;
	MemoryContext old;

	if (strlen(topic) >= sizeof(kept[0].topic))
		return NULL;
	if (!kept_callbacks)
	{
		CacheRegisterRelcacheCallback(kept_relcache_callback, (Datum) 0);
		CacheRegisterSyscacheCallback(NAMESPACEOID, kept_syscache_callback, (Datum) 0);
		kept_callbacks = true;
	}
	k = &kept[kept_next];
	kept_next = (kept_next + 1) % EG_TC_KEPT;
	forget_kept(k);
	old = MemoryContextSwitchTo(TopMemoryContext);
	k->row = heap_copytuple(row);
	k->desc = CreateTupleDescCopy(desc);
	MemoryContextSwitchTo(old);
	k->relid = relid;
	k->source = source;
	strlcpy(k->topic, topic, sizeof(k->topic));
	strlcpy(k->operation, operation, sizeof(k->operation));
	k->generation = generation;
	k->stale = false;
	k->used = true;
	return k;
}

/* Text column col (1-based) of row, or NULL. */
static char *
row_text(HeapTuple row, TupleDesc desc, int col)
{
	bool		isnull;
	Datum		d = SPI_getbinval(row, desc, col, &isnull);

	return isnull ? NULL : TextDatumGetCString(d);
}

typedef enum EgInputSchema
{
	IN_EVENTGRID,
	IN_CLOUDEVENTS,
	IN_CUSTOM
} EgInputSchema;

/*
 * How a column's value becomes JSON: the value to_jsonb() gives for a
 * built-in type (domains over one included), made here directly for the
 * commonest ones (what to_jsonb() makes of them: a number, true or false,
 * the string itself), through to_jsonb() for the others; the text form,
 * as a string, for a user-defined type.
 */
typedef enum EgValueKind
{
	VALUE_INTEGER,				/* int2, int4, int8: a number */
	VALUE_BOOL,					/* true or false */
	VALUE_TEXT,					/* text, varchar: the string */
	VALUE_TO_JSONB,				/* other built-in types: to_jsonb() */
	VALUE_TEXT_FORM				/* user-defined types: the output function's string */
} EgValueKind;

/* How one column of the written relation goes into events. */
typedef struct EgColumn
{
	AttrNumber	attnum;
	char	   *name;
	bool		published;		/* in the publication's columns */
	bool		watched;		/* in its update_columns: an UPDATE that changes none is no event */
	EgValueKind kind;
	Oid			base;			/* the base type (of a domain: the type under it) */
	FmgrInfo	to_jsonb;
	FmgrInfo	output;
} EgColumn;

/* What one statement publishes. */
typedef struct EgChange
{
	const char *topic;
	const char *operation;		/* INSERT, UPDATE, DELETE */
	EgInputSchema schema;
	char	   *schema_name;	/* of the published table */
	char	   *table_name;
	char	   *event_type;
	char	   *event_time;
	char	   *source;			/* CloudEvents: /postgresql/<database>/<schema>/<table> */
	char	   *head;			/* /<schema>/<table>, percent-encoded */
	EgColumn   *cols;
	int			ncols;
	AttrNumber *keys;			/* the primary key's columns, or NULL: the subject is head alone */
	int			nkeys;
	Datum		publish_time;
	/*
	 * Each event's size as JSON text (add_event): the text of the first
	 * event is made in full; the others are sized from its skeleton (what
	 * is the same in every event of the statement: keys, punctuation, the
	 * names and stamps) and the text of their own values.
	 */
	int64		skeleton_size;	/* -1 until the first event */
	int64		values_size;	/* of the event being built */
	StringInfoData text;		/* scratch for the text of one value */
	/* the batch being filled, its events in batch_cxt */
	Datum	   *events;
	Datum	   *sizes;
	int			n;
	MemoryContext batch_cxt;
	TupleTableSlot **slots;		/* for storing a batch: nslots made so far, as many as a batch needed */
	int			nslots;
} EgChange;

/* The place of oid in list (which holds it). */
static int
list_oid_position(List *list, Oid oid)
{
	ListCell   *lc;

	foreach(lc, list)
		if (lfirst_oid(lc) == oid)
			return foreach_current_index(lc);
	return list_length(list);
}

static bool
in_array(Datum array, bool isnull, const char *name)
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

/* RFC 3339 in UTC with microseconds, as eventgrid.rfc3339() writes it. */
static char *
rfc3339(TimestampTz ts)
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
push_row(JsonbParseState **st, EgChange *c, TupleTableSlot *slot, bool watched)
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

	return JsonbValueToJsonb(push_row(&st, c, slot, true));
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
static AttrNumber
column_number(TupleDesc desc, const char *name)
{
	int			n = SPI_fnumber(desc, name);

	if (n <= 0)
		elog(ERROR, "eventgrid: the event table has no column %s", name);
	return n;
}

/*
 * Stores the batch's events as COPY stores rows: straight into the event
 * table of the current transaction (what eventgrid._event_table() says,
 * as an INSERT would route them), with heap_multi_insert and their index
 * entries, each row as eventgrid.events' defaults and publish trigger
 * would make it (id from events_id_seq, the transaction's id, the publish
 * time and size given).  Nothing else fires on these rows: the BEFORE
 * INSERT trigger stores such rows as they are, and its wake-up at commit
 * is asked for here.
 */
static void
flush(EgChange *c)
{
	char		name[NAMEDATALEN];
	Relation	rel;
	TupleDesc	desc;
	Oid			seq;
	Datum	   *values;
	bool	   *nulls;
	AttrNumber	a_id,
				a_topic,
				a_event,
				a_time,
				a_bytes,
				a_txid,
				a_table;
	int			table = eg_event_table_at(GetCurrentTransactionStartTimestamp());
	EState	   *estate;
	ResultRelInfo *rri;
	TupleTableSlot **slots;
	BulkInsertState bistate;

	if (c->n == 0)
		return;
	snprintf(name, sizeof(name), "events_%d", table);
	rel = table_open(eg_store_table(name), RowExclusiveLock);
	desc = RelationGetDescr(rel);
	seq = eg_event_id_sequence();
	a_id = column_number(desc, "id");
	a_topic = column_number(desc, "topic");
	a_event = column_number(desc, "event");
	a_time = column_number(desc, "publish_time");
	a_bytes = column_number(desc, "event_bytes");
	a_txid = column_number(desc, "txid");
	a_table = column_number(desc, "event_table");

	values = palloc(desc->natts * sizeof(Datum));
	nulls = palloc(desc->natts * sizeof(bool));
	memset(nulls, true, desc->natts * sizeof(bool));
	nulls[a_id - 1] = nulls[a_topic - 1] = nulls[a_event - 1] = nulls[a_time - 1] = false;
	nulls[a_bytes - 1] = nulls[a_txid - 1] = nulls[a_table - 1] = false;
	values[a_topic - 1] = CStringGetTextDatum(c->topic);
	values[a_time - 1] = c->publish_time;
	values[a_txid - 1] = FullTransactionIdGetDatum(GetTopFullTransactionId());
	values[a_table - 1] = Int16GetDatum((int16) table);

	estate = CreateExecutorState();
	rri = makeNode(ResultRelInfo);
	InitResultRelInfo(rri, rel, 1, NULL, 0);
	ExecOpenIndices(rri, false);
	/* every batch of the statement goes to the same event table (its transaction's): slots are kept */
	if (c->slots == NULL)
		c->slots = MemoryContextAlloc(CurrentMemoryContext, EG_TC_BATCH * sizeof(TupleTableSlot *));
	for (; c->nslots < c->n; c->nslots++)
		c->slots[c->nslots] = MakeSingleTupleTableSlot(desc, &TTSOpsHeapTuple);
	slots = c->slots;
	for (int i = 0; i < c->n; i++)
	{
		values[a_id - 1] = Int64GetDatum(nextval_internal(seq, false));
		values[a_event - 1] = c->events[i];
		values[a_bytes - 1] = c->sizes[i];
		ExecStoreHeapTuple(heap_form_tuple(desc, values, nulls), slots[i], true);
	}
	bistate = GetBulkInsertState();
	table_multi_insert(rel, slots, c->n, GetCurrentCommandId(true), 0, bistate);
	FreeBulkInsertState(bistate);
	for (int i = 0; i < c->n; i++)
	{
		ResetPerTupleExprContext(estate);
		ExecInsertIndexTuples(rri, slots[i], estate, false, false, NULL, NIL);
		ExecClearTuple(slots[i]);
	}
	ExecCloseIndices(rri);
	FreeExecutorState(estate);
	table_close(rel, NoLock);
	eg_wake_for_events_at_commit();

	c->n = 0;
	MemoryContextReset(c->batch_cxt);
}

/* The members of the change's data object, in jsonb's key order: new, old, table, schema, operation. */
static void
push_data(JsonbParseState **st, EgChange *c, TupleTableSlot *newslot, TupleTableSlot *oldslot)
{
	push_key(st, "new");
	if (newslot)
		push_row(st, c, newslot, false);
	else
		push_null_value(st);
	push_key(st, "old");
	if (oldslot)
		push_row(st, c, oldslot, false);
	else
		push_null_value(st);
	push_string(st, "table", c->table_name);
	push_string(st, "schema", c->schema_name);
	push_string(st, "operation", c->operation);
}

/*
 * The old versions of an UPDATE's rows that have no new version: NULL when
 * the transition tables are as long as each other (then paired by place),
 * else a flag per old row.  A row moved to another partition and skipped
 * by a BEFORE INSERT trigger there left the table: its old version was
 * captured, its new one not, and the rest are still in step.  Keys cannot
 * tell them apart (a partition's key includes the partition key, which the
 * move changed), so each new version, in order, takes the old version that
 * differs from it in the fewest columns among the next ones that may be
 * its own (as many as old versions are still left over, at most
 * EG_TC_PAIR_WINDOW), the earliest on a tie; the old versions it passes
 * over are the skipped ones, and so are those left at the end.
 */
#define EG_TC_PAIR_WINDOW 64

typedef struct EgRowImage
{
	Datum	   *values;
	bool	   *nulls;
} EgRowImage;

static EgRowImage *
row_images(Tuplestorestate *store, TupleTableSlot *slot, int64 n)
{
	EgRowImage *rows = palloc(n * sizeof(EgRowImage));
	int			natts = slot->tts_tupleDescriptor->natts;

	tuplestore_rescan(store);
	for (int64 k = 0; k < n && tuplestore_gettupleslot(store, true, true, slot); k++)
	{
		slot_getallattrs(slot);
		rows[k].values = palloc(natts * sizeof(Datum));
		rows[k].nulls = palloc(natts * sizeof(bool));
		for (int a = 0; a < natts; a++)
		{
			Form_pg_attribute att = TupleDescAttr(slot->tts_tupleDescriptor, a);

			rows[k].nulls[a] = slot->tts_isnull[a];
			rows[k].values[a] = slot->tts_isnull[a] ? (Datum) 0
				: datumCopy(slot->tts_values[a], att->attbyval, att->attlen);
		}
	}
	return rows;
}

/* In how many columns two row images differ. */
static int
row_distance(TupleDesc desc, const EgRowImage *a, const EgRowImage *b)
{
	int			d = 0;

	for (int k = 0; k < desc->natts; k++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, k);

		if (att->attisdropped)
			continue;
		if (a->nulls[k] != b->nulls[k] ||
			(!a->nulls[k] && !datum_image_eq(a->values[k], b->values[k], att->attbyval, att->attlen)))
			d++;
	}
	return d;
}

static bool *
skipped_olds(EgChange *c, Tuplestorestate *olds, Tuplestorestate *news, TupleTableSlot *oldslot,
			 TupleTableSlot *newslot, MemoryContext row_cxt)
{
	int64		nold = tuplestore_tuple_count(olds);
	int64		nnew = tuplestore_tuple_count(news);
	int64		extra = nold - nnew;
	TupleDesc	desc = oldslot->tts_tupleDescriptor;
	MemoryContext cxt;
	MemoryContext old;
	EgRowImage *o;
	EgRowImage *n;
	bool	   *gone;
	int64		i = 0;

	if (extra <= 0)
		return NULL;
	gone = palloc0(nold * sizeof(bool));
	cxt = AllocSetContextCreate(CurrentMemoryContext, "eventgrid update pairing", ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(cxt);
	o = row_images(olds, oldslot, nold);
	n = row_images(news, newslot, nnew);
	for (int64 j = 0; j < nnew; j++)
	{
		int64		best = i;
		int			best_d = row_distance(desc, &o[i], &n[j]);

		for (int64 k = i + 1; k <= i + Min(extra, EG_TC_PAIR_WINDOW) && k < nold && best_d > 0; k++)
		{
			int			d = row_distance(desc, &o[k], &n[j]);

			if (d < best_d)
			{
				best = k;
				best_d = d;
			}
		}
		for (int64 g = i; g < best; g++)
			gone[g] = true;
		extra -= best - i;
		i = best + 1;
	}
	for (; i < nold; i++)
		gone[i] = true;
	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
	return gone;
}

/* Builds the event of one row change and adds it to the batch. */
static void
add_event(EgChange *c, TupleTableSlot *newslot, TupleTableSlot *oldslot, MemoryContext row_cxt)
{
	MemoryContext old = MemoryContextSwitchTo(row_cxt);
	JsonbParseState *st = NULL;
	Jsonb	   *event;
	char	   *subject = c->schema == IN_CUSTOM ? NULL : subject_of(c, newslot ? newslot : oldslot);
	int64		size;

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
		push_string(&st, "id", random_uuid());
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
		size = eg_event_text_size(event);
		c->skeleton_size = size - c->values_size;
	}
	else
		size = c->skeleton_size + c->values_size;
	eg_check_event_size(size);
	MemoryContextSwitchTo(old);

	/* the batch's events live in its context until stored; the row's is reset */
	old = MemoryContextSwitchTo(c->batch_cxt);
	c->events[c->n] = PointerGetDatum(DatumGetJsonbPCopy(PointerGetDatum(event)));
	MemoryContextSwitchTo(old);
	c->sizes[c->n] = Int32GetDatum((int32) size);
	if (++c->n == EG_TC_BATCH)
		flush(c);
	MemoryContextReset(row_cxt);
}

/* Are the watched columns of the two versions of a row the same? */
static bool
unchanged(EgChange *c, TupleTableSlot *newslot, TupleTableSlot *oldslot, MemoryContext row_cxt)
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

/* The columns of rel, and how each goes into events. */
static void
prepare_columns(EgChange *c, Relation rel, Datum columns, bool columns_null, Datum watched,
				bool watched_null, Datum keys, bool keys_null)
{
	TupleDesc	desc = RelationGetDescr(rel);
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
		col->published = columns_null || in_array(columns, false, col->name);
		col->watched = watched_null || in_array(watched, false, col->name);
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

PG_FUNCTION_INFO_V1(eventgrid_table_change_trigger);

/*
 * Trigger function eventgrid._table_change_trigger(topic): AFTER INSERT,
 * UPDATE or DELETE ... FOR EACH STATEMENT with the transition tables
 * eventgrid_rows (and, for UPDATE, eventgrid_old_rows) that
 * publish_table_changes() makes; publishes one event per row (an UPDATE
 * that changes none of the publication's update_columns: none).
 */
Datum
eventgrid_table_change_trigger(PG_FUNCTION_ARGS)
{
	TriggerData *td = (TriggerData *) fcinfo->context;
	EgChange	c = {0};
	Datum		args[3];
	Oid			types[3] = {OIDARRAYOID, TEXTOID, TEXTOID};
	List	   *ancestors;
	SPITupleTable *tt;
	int			pub;			/* the row of the nearest publication, or -1 */
	HeapTuple	pubrow = NULL;
	TupleDesc	pubdesc;
	bool		isnull;
	bool		columns_null,
				watched_null,
				keys_null;
	Datum		ops,
				columns,
				watched,
				keys;
	char	   *prefix;
	const char *type_prefix;
	char	   *input_schema;
	char	   *expected_name;
	bool		valid;
	TupleTableSlot *newslot = NULL;
	TupleTableSlot *oldslot = NULL;
	MemoryContext row_cxt;
	EgKeptPublication *kept_pub;
	uint64		generation;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("eventgrid._table_change_trigger() must be called as a trigger")));
	c.operation = TRIGGER_FIRED_BY_INSERT(td->tg_event) ? "INSERT"
		: TRIGGER_FIRED_BY_UPDATE(td->tg_event) ? "UPDATE"
		: TRIGGER_FIRED_BY_DELETE(td->tg_event) ? "DELETE" : "TRUNCATE";
	c.topic = td->tg_trigger->tgnargs == 1 ? td->tg_trigger->tgargs[0] : "";

	SPI_connect();
	kept_pub = find_kept(RelationGetRelid(td->tg_relation), c.topic, c.operation);
	if (kept_pub != NULL)
	{
		pubrow = kept_pub->row;
		pubdesc = kept_pub->desc;
		goto found;
	}
	generation = eg_publications_generation();
	if (lookup_plan == NULL)
	{
		SPIPlanPtr	plan = SPI_prepare(lookup_sql, 3, types);

		if (plan == NULL || SPI_keepplan(plan) != 0)
			elog(ERROR, "eventgrid: preparing the table change lookup failed");
		lookup_plan = plan;
	}
	/* the relation, then its ancestors, nearest first */
	ancestors = list_make1_oid(RelationGetRelid(td->tg_relation));
	if (td->tg_relation->rd_rel->relispartition)
		ancestors = list_concat(ancestors, get_partition_ancestors(RelationGetRelid(td->tg_relation)));
	{
		Datum	   *oids = palloc(list_length(ancestors) * sizeof(Datum));
		int			k = 0;
		ListCell   *lc;

		foreach(lc, ancestors)
			oids[k++] = ObjectIdGetDatum(lfirst_oid(lc));
		args[0] = PointerGetDatum(construct_array(oids, k, OIDOID, sizeof(Oid), true, TYPALIGN_INT));
	}
	args[1] = CStringGetTextDatum(c.topic);
	args[2] = CStringGetTextDatum(c.operation);
	/*
	 * Read under a snapshot taken now, after the generation: a row kept
	 * under this generation then holds every change that generation
	 * counts (the count moves after the change is visible).  The
	 * statement's or transaction's snapshot (REPEATABLE READ, SERIALIZABLE)
	 * may be older than a change the generation already counts: the row
	 * read under it would be kept as current for the session's life.
	 */
	pg_memory_barrier();
	PushActiveSnapshot(GetLatestSnapshot());
	if (SPI_execute_plan(lookup_plan, args, NULL, true, 0) != SPI_OK_SELECT)
		elog(ERROR, "eventgrid: looking up the table change publication failed");
	PopActiveSnapshot();
	tt = SPI_tuptable;
	pubdesc = tt->tupdesc;
	pub = -1;
	{
		int			best = list_length(ancestors);

		for (uint64 r = 0; r < SPI_processed; r++)
		{
			Oid			source = DatumGetObjectId(SPI_getbinval(tt->vals[r], pubdesc, 9, &isnull));
			int			depth = list_member_oid(ancestors, source) ? list_oid_position(ancestors, source) : best;

			if (depth < best)
			{
				best = depth;
				pub = (int) r;
			}
		}
	}
	if (pub >= 0)
	{
		pubrow = tt->vals[pub];
		/* kept only when the publications did not change meanwhile (read before the lookup) */
		if (eg_shared != NULL)
			(void) keep(RelationGetRelid(td->tg_relation),
						DatumGetObjectId(SPI_getbinval(pubrow, pubdesc, 9, &isnull)),
						c.topic, c.operation, generation, pubrow, pubdesc);
	}
found:
	valid = pubrow != NULL && td->tg_trigger->tgnargs == 1 && TRIGGER_FIRED_FOR_STATEMENT(td->tg_event)
		&& TRIGGER_FIRED_AFTER(td->tg_event);
	if (valid)
	{
		ops = SPI_getbinval(pubrow, pubdesc, 1, &isnull);
		expected_name = row_text(pubrow, pubdesc, 10);
		valid = in_array(ops, isnull, c.operation)
			&& expected_name != NULL && strcmp(expected_name, td->tg_trigger->tgname) == 0
			&& (strcmp(c.operation, "DELETE") == 0 ? td->tg_oldtable != NULL : td->tg_newtable != NULL)
			&& (strcmp(c.operation, "UPDATE") != 0 || td->tg_oldtable != NULL);
	}
	if (!valid)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("trigger %s on table %s does not belong to a publication of its changes to topic \"%s\"",
						td->tg_trigger->tgname,
						quote_qualified_identifier(get_namespace_name(RelationGetNamespace(td->tg_relation)),
												   RelationGetRelationName(td->tg_relation)),
						c.topic),
				 errhint("Only eventgrid.publish_table_changes() sets up publications; drop this trigger.")));

	columns = SPI_getbinval(pubrow, pubdesc, 2, &columns_null);
	watched = SPI_getbinval(pubrow, pubdesc, 3, &watched_null);
	prefix = row_text(pubrow, pubdesc, 4);
	input_schema = row_text(pubrow, pubdesc, 5);
	c.schema_name = row_text(pubrow, pubdesc, 6);
	c.table_name = row_text(pubrow, pubdesc, 7);
	keys = SPI_getbinval(pubrow, pubdesc, 8, &keys_null);
	c.schema = strcmp(input_schema, "CloudEventSchemaV1_0") == 0 ? IN_CLOUDEVENTS
		: strcmp(input_schema, "CustomEventSchema") == 0 ? IN_CUSTOM : IN_EVENTGRID;
	prepare_columns(&c, td->tg_relation, columns, columns_null, watched, watched_null, keys, keys_null);

	/* events name the published table, also for a write that named one of its partitions */
	c.head = psprintf("/%s/%s", eg_uri_escape(c.schema_name, strlen(c.schema_name)),
					  eg_uri_escape(c.table_name, strlen(c.table_name)));
	type_prefix = prefix ? prefix : psprintf("%s.%s", c.schema_name, c.table_name);
	c.event_type = psprintf("%s.%s", type_prefix,
							strcmp(c.operation, "INSERT") == 0 ? "Inserted"
							: strcmp(c.operation, "UPDATE") == 0 ? "Updated" : "Deleted");
	c.event_time = rfc3339(GetCurrentStatementStartTimestamp());
	{
		const char *db = get_database_name(MyDatabaseId);

		c.source = psprintf("/postgresql/%s%s", eg_uri_escape(db, strlen(db)), c.head);
	}
	c.publish_time = TimestampTzGetDatum(eg_transaction_now());
	c.skeleton_size = -1;
	initStringInfo(&c.text);
	c.events = palloc(EG_TC_BATCH * sizeof(Datum));
	c.sizes = palloc(EG_TC_BATCH * sizeof(Datum));

	row_cxt = AllocSetContextCreate(CurrentMemoryContext, "eventgrid table change row", ALLOCSET_DEFAULT_SIZES);
	/* kept blocks: a batch's events are about half a megabyte, again and again */
	c.batch_cxt = AllocSetContextCreate(CurrentMemoryContext, "eventgrid table change batch",
										1024 * 1024, 1024 * 1024, 8 * 1024 * 1024);
	if (td->tg_newtable)
		newslot = MakeSingleTupleTableSlot(RelationGetDescr(td->tg_relation), &TTSOpsMinimalTuple);
	if (td->tg_oldtable)
		oldslot = MakeSingleTupleTableSlot(RelationGetDescr(td->tg_relation), &TTSOpsMinimalTuple);
	if (strcmp(c.operation, "INSERT") == 0)
	{
		tuplestore_rescan(td->tg_newtable);
		while (tuplestore_gettupleslot(td->tg_newtable, true, false, newslot))
			add_event(&c, newslot, NULL, row_cxt);
	}
	else if (strcmp(c.operation, "DELETE") == 0)
	{
		tuplestore_rescan(td->tg_oldtable);
		while (tuplestore_gettupleslot(td->tg_oldtable, true, false, oldslot))
			add_event(&c, NULL, oldslot, row_cxt);
	}
	else
	{
		/*
		 * The old and the new version of each row, paired by their place:
		 * PostgreSQL fills both in step, except for a row moved to another
		 * partition whose BEFORE INSERT trigger there skipped it: its old
		 * version is there and its new one is not (skipped_olds finds it).
		 */
		int64		nold = tuplestore_tuple_count(td->tg_oldtable);
		bool	   *gone = skipped_olds(&c, td->tg_oldtable, td->tg_newtable, oldslot, newslot, row_cxt);
		int64		i = 0;

		tuplestore_rescan(td->tg_newtable);
		tuplestore_rescan(td->tg_oldtable);
		while (tuplestore_gettupleslot(td->tg_newtable, true, false, newslot))
		{
			while (tuplestore_gettupleslot(td->tg_oldtable, true, false, oldslot) && gone && gone[i])
				i++;
			i++;
			if (!unchanged(&c, newslot, oldslot, row_cxt))
				add_event(&c, newslot, oldslot, row_cxt);
		}
		if (gone)
		{
			/* a row the UPDATE took out of the table is reported as the table shows it: deleted */
			flush(&c);
			c.operation = "DELETE";
			c.event_type = psprintf("%s.Deleted", type_prefix);
			c.skeleton_size = -1;
			tuplestore_rescan(td->tg_oldtable);
			for (i = 0; i < nold && tuplestore_gettupleslot(td->tg_oldtable, true, false, oldslot); i++)
				if (gone[i])
					add_event(&c, NULL, oldslot, row_cxt);
		}
	}
	flush(&c);
	for (int i = 0; i < c.nslots; i++)
		ExecDropSingleTupleTableSlot(c.slots[i]);
	if (newslot)
		ExecDropSingleTupleTableSlot(newslot);
	if (oldslot)
		ExecDropSingleTupleTableSlot(oldslot);
	SPI_finish();
	return PointerGetDatum(NULL);
}
