/*
 * wal_source_decode.c - what a WAL source's stream becomes here (SPEC 19):
 * pgoutput's messages, read with PostgreSQL's own readers
 * (replication/logicalproto.h; a generic message, which has none, with
 * pqformat's), turned into events.  Each source transaction is one
 * transaction here, opened at its first event or reject and committed at
 * its COMMIT with the replication origin's progress set to the source's
 * commit end LSN (the worker's session origin): a replay after any fault
 * finds the transaction done or not done, never half.
 *
 * - A row change of a table mapped by publish_table_changes(..., source)
 *   is built as in-database table changes build theirs
 *   (table_change_event.c) from a row made of the text the source sent:
 *   a built-in type's value (the same type OID on every major) through its
 *   input function, a user-defined type's as its text.  Its id is a UUID
 *   derived from the source's system identifier, the commit LSN and the
 *   change's place in the transaction; its time the commit's.
 * - A transactional pg_logical_emit_message() with the source's prefix
 *   is {"topic": ..., "events": [...]} (or "event": {...}) and goes through
 *   eventgrid.publish() in a subtransaction; what cannot be published goes
 *   to eventgrid.wal_source_rejects and the rest of the transaction on.
 */
#include "publish/wal_source.h"
#include "publish/table_change.h"
#include "publish/publish.h"
#include "store/store.h"
#include "http/url.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "funcapi.h"
#include "libpq/pqformat.h"
#include "mb/pg_wchar.h"
#include "replication/logicalproto.h"
#include "replication/origin.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgrprotos.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/pg_lsn.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#define EG_REJECT_CONTENT_BYTES 4096

/* A relation the stream described ('R'), with a row shape to build events from. */
typedef struct EgWalRel
{
	LogicalRepRelId relid;		/* hash key */
	LogicalRepRelation *rel;
	char	   *qualified;		/* schema.table */
	TupleDesc	desc;			/* the source's types when built in, else text */
	FmgrInfo   *input;			/* per column: its input function (text: none) */
	Oid		   *ioparam;
	TupleTableSlot *newslot;
	TupleTableSlot *oldslot;
	int			generation;		/* bumped by each new description */
} EgWalRel;

/* A mapping of publish_table_changes(..., source), read once per source transaction. */
typedef struct EgWalMapping
{
	char	   *table_name;
	char	   *topic;
	char	   *input_schema;
	Datum		operations;
	Datum		columns;
	bool		columns_null;
	Datum		update_columns;
	bool		update_columns_null;
	char	   *type_prefix;
	/* the change builder for one relation's description, made at first use */
	EgChange   *change;
	LogicalRepRelId relid;
	int			generation;
} EgWalMapping;

static HTAB *relations = NULL;
static MemoryContext rel_cxt = NULL;
static int	generations = 0;

/* this transaction's: mappings (NULL: not read yet), the change builder last added to, value contexts */
static List *mappings = NIL;
static bool mappings_read = false;
static EgChange *pending = NULL;
static MemoryContext vals_cxt = NULL;
static MemoryContext row_cxt = NULL;

static EgStatement mappings_stmt = {
	.name = "WAL source table mappings",
	.sql =
	"SELECT m.table_name, m.topic, t.input_schema, m.operations, m.columns, m.update_columns, m.event_type_prefix"
	"  FROM eventgrid.wal_source_tables m JOIN eventgrid.topics t ON t.name = m.topic"
	" WHERE m.source_id = $1",
	.nargs = 1,
	.types = {INT8OID},
};

static EgStatement reject_stmt = {
	.name = "WAL source reject",
	.sql =
	"INSERT INTO eventgrid.wal_source_rejects (source, commit_lsn, reason, content) VALUES ($1, $2, $3, $4)",
	.nargs = 4,
	.types = {TEXTOID, PG_LSNOID, TEXTOID, TEXTOID},
};

static EgStatement publish_stmt = {
	.name = "WAL source message publish",
	.sql = "SELECT eventgrid.publish($1, $2)",
	.nargs = 2,
	.types = {TEXTOID, JSONBOID},
};

static EgStatement counts_stmt = {
	.name = "WAL source counts",
	.sql =
	"INSERT INTO eventgrid.wal_source_status AS s (source_id, state, events_published, rejects, last_commit_time)"
	" VALUES ($1, $5, $2, $3, $4)"
	" ON CONFLICT (source_id) DO UPDATE SET state = $5, events_published = s.events_published + $2,"
	"       rejects = s.rejects + $3, last_commit_time = coalesce($4, s.last_commit_time), updated_at = now()",
	.nargs = 5,
	.types = {INT8OID, INT8OID, INT8OID, TIMESTAMPTZOID, TEXTOID},
};

void
eg_wal_reset_relations(void)
{
	if (rel_cxt == NULL)
		rel_cxt = AllocSetContextCreate(TopMemoryContext, "eventgrid WAL source relations", ALLOCSET_DEFAULT_SIZES);
	MemoryContextReset(rel_cxt);
	relations = NULL;
}

/* A relation's description (made in rel_cxt), kept until the next one of it or the next connection. */
static void
describe(LogicalRepRelation *rel)
{
	MemoryContext old = MemoryContextSwitchTo(rel_cxt);
	EgWalRel   *r;
	bool		found;

	if (relations == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(LogicalRepRelId);
		ctl.entrysize = sizeof(EgWalRel);
		ctl.hcxt = rel_cxt;
		relations = hash_create("eventgrid WAL source relations", 64, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	r = hash_search(relations, &rel->remoteid, HASH_ENTER, &found);
	r->rel = rel;
	r->qualified = psprintf("%s.%s", rel->nspname, rel->relname);
	r->desc = CreateTemplateTupleDesc(rel->natts);
	r->input = palloc0(Max(rel->natts, 1) * sizeof(FmgrInfo));
	r->ioparam = palloc0(Max(rel->natts, 1) * sizeof(Oid));
	for (int i = 0; i < rel->natts; i++)
	{
		Oid			type = rel->atttyps[i];

		/* a built-in type has the same OID on every major; others go as their text */
		if (type >= FirstGenbkiObjectId || !SearchSysCacheExists1(TYPEOID, ObjectIdGetDatum(type)))
			type = TEXTOID;
		TupleDescInitEntry(r->desc, i + 1, rel->attnames[i], type, -1, 0);
		if (type != TEXTOID)
		{
			Oid			input;

			getTypeInputInfo(type, &input, &r->ioparam[i]);
			fmgr_info_cxt(input, &r->input[i], rel_cxt);
		}
	}
	r->newslot = MakeSingleTupleTableSlot(r->desc, &TTSOpsVirtual);
	r->oldslot = MakeSingleTupleTableSlot(r->desc, &TTSOpsVirtual);
	r->generation = ++generations;
	MemoryContextSwitchTo(old);
}

static void open_local(EgWalSource *src);

/* 'R': the stream describes a relation */
static void
describe_relation(StringInfo msg)
{
	MemoryContext old = MemoryContextSwitchTo(rel_cxt);
	LogicalRepRelation *rel = logicalrep_read_rel(msg);

	MemoryContextSwitchTo(old);
	describe(rel);
}

/* See wal_source.h.  In the open transaction here (the types are looked up). */
void
eg_wal_describe_table(EgWalSource *src, uint32 relid, const char *nspname, const char *relname,
					  int natts, char **attnames, Oid *atttyps, Bitmapset *keys)
{
	MemoryContext old;
	LogicalRepRelation *rel;

	if (rel_cxt == NULL)
		eg_wal_reset_relations();
	open_local(src);
	old = MemoryContextSwitchTo(rel_cxt);
	rel = palloc0(sizeof(LogicalRepRelation));
	rel->remoteid = relid;
	rel->nspname = pstrdup(nspname);
	rel->relname = pstrdup(relname);
	rel->natts = natts;
	rel->attnames = palloc(Max(natts, 1) * sizeof(char *));
	rel->atttyps = palloc(Max(natts, 1) * sizeof(Oid));
	for (int i = 0; i < natts; i++)
	{
		rel->attnames[i] = pstrdup(attnames[i]);
		rel->atttyps[i] = atttyps[i];
	}
	rel->replident = REPLICA_IDENTITY_DEFAULT;
	rel->attkeys = bms_copy(keys);
	MemoryContextSwitchTo(old);
	describe(rel);
}

/* Opens this source transaction's transaction here, at its first event or reject. */
static void
open_local(EgWalSource *src)
{
	if (src->txn.local_open)
		return;
	eg_wal_begin("eventgrid: publishing a WAL source's transaction");
	vals_cxt = AllocSetContextCreate(TopTransactionContext, "eventgrid WAL source values", ALLOCSET_DEFAULT_SIZES);
	row_cxt = AllocSetContextCreate(TopTransactionContext, "eventgrid WAL source row", ALLOCSET_DEFAULT_SIZES);
	mappings = NIL;
	mappings_read = false;
	pending = NULL;
	src->txn.local_open = true;
}

static void
read_mappings(EgWalSource *src)
{
	Datum		arg = Int64GetDatum(src->id);
	MemoryContext old;

	if (mappings_read)
		return;
	eg_store_run(&mappings_stmt, &arg, SPI_OK_SELECT);
	old = MemoryContextSwitchTo(TopTransactionContext);
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		EgWalMapping *m = palloc0(sizeof(EgWalMapping));
		bool		isnull;
		Datum		d;

		m->table_name = SPI_getvalue(row, desc, 1);
		m->topic = SPI_getvalue(row, desc, 2);
		m->input_schema = SPI_getvalue(row, desc, 3);
		m->operations = datumCopy(SPI_getbinval(row, desc, 4, &isnull), false, -1);
		d = SPI_getbinval(row, desc, 5, &m->columns_null);
		if (!m->columns_null)
			m->columns = datumCopy(d, false, -1);
		d = SPI_getbinval(row, desc, 6, &m->update_columns_null);
		if (!m->update_columns_null)
			m->update_columns = datumCopy(d, false, -1);
		m->type_prefix = SPI_getvalue(row, desc, 7);
		mappings = lappend(mappings, m);
	}
	MemoryContextSwitchTo(old);
	mappings_read = true;
}

/* Lets go of a change builder's slots (they pin the event table's row type until dropped). */
static void
drop_slots(EgChange *c)
{
	for (int i = 0; i < c->nslots; i++)
		ExecDropSingleTupleTableSlot(c->slots[i]);
	c->nslots = 0;
}

/* Stores the events built so far (in the order their changes came). */
static void
flush_pending(void)
{
	if (pending)
		eg_tc_flush(pending);
	pending = NULL;
}

/* A text array of the relation's key columns (replica identity; with FULL, none: every column is one). */
static Datum
key_names(EgWalRel *r, bool *isnull)
{
	Datum	   *names;
	int			n = 0;

	*isnull = true;
	if (r->rel->replident == 'f' || r->rel->attkeys == NULL)
		return (Datum) 0;
	names = palloc(r->rel->natts * sizeof(Datum));
	for (int i = 0; i < r->rel->natts; i++)
		if (bms_is_member(i, r->rel->attkeys))
			names[n++] = CStringGetTextDatum(r->rel->attnames[i]);
	if (n == 0)
		return (Datum) 0;
	*isnull = false;
	return PointerGetDatum(construct_array(names, n, TEXTOID, -1, false, TYPALIGN_INT));
}

/* The change builder of mapping m for relation r, made once per source transaction and description. */
static EgChange *
change_of(EgWalSource *src, EgWalMapping *m, EgWalRel *r)
{
	EgChange   *c;
	MemoryContext old;
	bool		keys_null;
	Datum		keys;
	char	   *db = src->database;

	if (m->change && m->relid == r->relid && m->generation == r->generation)
		return m->change;
	if (m->change == pending)
		flush_pending();
	if (m->change)
		drop_slots(m->change);
	old = MemoryContextSwitchTo(TopTransactionContext);
	c = palloc0(sizeof(EgChange));
	c->topic = m->topic;
	c->schema_name = r->rel->nspname;
	c->table_name = r->rel->relname;
	c->schema = strcmp(m->input_schema, "CloudEventSchemaV1_0") == 0 ? IN_CLOUDEVENTS
		: strcmp(m->input_schema, "CustomEventSchema") == 0 ? IN_CUSTOM : IN_EVENTGRID;
	keys = key_names(r, &keys_null);
	eg_tc_prepare_columns(c, r->desc, m->columns, m->columns_null, m->update_columns, m->update_columns_null,
						  keys, keys_null);
	c->head = psprintf("/%s/%s", eg_uri_escape(c->schema_name, strlen(c->schema_name)),
					   eg_uri_escape(c->table_name, strlen(c->table_name)));
	c->source = psprintf("/postgresql/%s%s", eg_uri_escape(db, strlen(db)), c->head);
	c->event_time = eg_tc_rfc3339(src->txn.commit_time);
	c->publish_time = TimestampTzGetDatum(eg_transaction_now());
	c->skeleton_size = -1;
	c->operation = "";
	initStringInfo(&c->text);
	c->events = palloc(EG_TC_BATCH * sizeof(Datum));
	c->sizes = palloc(EG_TC_BATCH * sizeof(Datum));
	c->batch_cxt = AllocSetContextCreate(TopTransactionContext, "eventgrid WAL source batch", ALLOCSET_DEFAULT_SIZES);
	/* the slots for storing live until commit_local() drops them, not in one message's context */
	c->slot_cxt = TopTransactionContext;
	MemoryContextSwitchTo(old);
	m->change = c;
	m->relid = r->relid;
	m->generation = r->generation;
	return c;
}

/*
 * Fills slot from a tuple the source sent; absent[i] says a column is left
 * out (a large value an UPDATE left unchanged: not in the WAL).  Values
 * are made in vals_cxt.
 */
static void
fill_slot(EgWalRel *r, LogicalRepTupleData *tup, TupleTableSlot *slot, bool *absent)
{
	MemoryContext old = MemoryContextSwitchTo(vals_cxt);

	ExecClearTuple(slot);
	for (int i = 0; i < r->rel->natts; i++)
	{
		char		status = i < tup->ncols ? tup->colstatus[i] : LOGICALREP_COLUMN_NULL;

		absent[i] = status == LOGICALREP_COLUMN_UNCHANGED;
		slot->tts_isnull[i] = status != LOGICALREP_COLUMN_TEXT;
		slot->tts_values[i] = (Datum) 0;
		if (status != LOGICALREP_COLUMN_TEXT)
			continue;
		if (TupleDescAttr(r->desc, i)->atttypid == TEXTOID)
			slot->tts_values[i] = CStringGetTextDatum(tup->colvalues[i].data);
		else
			slot->tts_values[i] = InputFunctionCall(&r->input[i], tup->colvalues[i].data, r->ioparam[i], -1);
	}
	ExecStoreVirtualTuple(slot);
	MemoryContextSwitchTo(old);
}

/* See wal_source.h. */
char *
eg_wal_uuid(const char *key)
{
	char	   *hex = text_to_cstring(DatumGetTextPP(DirectFunctionCall1(md5_text, CStringGetTextDatum(key))));
	static const char variant[] = "89ab";

	return psprintf("%.8s-%.4s-3%.3s-%c%.3s-%.12s", hex, hex + 8, hex + 13,
					variant[(hex[16] >= 'a' ? hex[16] - 'a' + 10 : hex[16] - '0') & 3], hex + 17, hex + 20);
}

/* The id of the source transaction's change number index. */
static char *
change_id(EgWalSource *src, int index)
{
	return eg_wal_uuid(psprintf("%s/%X/%X/%d", src->system_identifier, LSN_FORMAT_ARGS(src->txn.commit_lsn), index));
}

/*
 * A row change ('I', 'U', 'D') of relation relid: an event for each mapping
 * that takes it; or a backfilled row (BACKFILL, newtup the row): an event
 * of the mapping to topic alone, its id given.
 */
static void
apply_change(EgWalSource *src, LogicalRepRelId relid, const char *operation, LogicalRepTupleData *newtup,
			 LogicalRepTupleData *oldtup, const char *topic, const char *given_id)
{
	EgWalRel   *r = relations ? hash_search(relations, &relid, HASH_FIND, NULL) : NULL;
	int			index = src->txn.changes++;
	bool	   *absent_new = NULL;
	bool	   *absent_old = NULL;
	bool		full = r != NULL && r->rel->replident == 'f';
	char	   *id = NULL;
	TupleTableSlot *newslot = NULL;
	TupleTableSlot *oldslot = NULL;
	ListCell   *lc;

	if (r == NULL)
		elog(ERROR, "eventgrid: the source sent a change of relation %u it has not described", relid);
	open_local(src);
	read_mappings(src);
	foreach(lc, mappings)
	{
		EgWalMapping *m = lfirst(lc);
		EgChange   *c;

		if (strcmp(m->table_name, r->qualified) != 0 ||
			(topic ? strcmp(m->topic, topic) != 0 : !eg_tc_in_array(m->operations, false, operation)))
			continue;
		c = change_of(src, m, r);
		if (newslot == NULL && oldslot == NULL)
		{
			/* the row's versions, made once for every mapping that takes it */
			MemoryContextReset(vals_cxt);
			absent_new = MemoryContextAllocZero(vals_cxt, Max(r->rel->natts, 1) * sizeof(bool));
			absent_old = MemoryContextAllocZero(vals_cxt, Max(r->rel->natts, 1) * sizeof(bool));
			if (newtup)
			{
				newslot = r->newslot;
				fill_slot(r, newtup, newslot, absent_new);
			}
			if (oldtup)
			{
				oldslot = r->oldslot;
				fill_slot(r, oldtup, oldslot, absent_old);
			}
			else if (newtup && strcmp(operation, "UPDATE") == 0)
			{
				/* the key did not change: the old row's key is the new one's */
				oldslot = r->oldslot;
				fill_slot(r, newtup, oldslot, absent_old);
			}
			/* without REPLICA IDENTITY FULL the old row is its key columns */
			if (oldslot && !full)
				for (int i = 0; i < r->rel->natts; i++)
					absent_old[i] = absent_old[i] || !bms_is_member(i, r->rel->attkeys);
			/* an unchanged large value compares as the old row's, when the old row has it */
			if (newslot && oldtup && full)
			{
				MemoryContext old = MemoryContextSwitchTo(vals_cxt);

				for (int i = 0; i < r->rel->natts; i++)
					if (absent_new[i] && !oldslot->tts_isnull[i])
					{
						newslot->tts_values[i] = oldslot->tts_values[i];
						newslot->tts_isnull[i] = false;
					}
				MemoryContextSwitchTo(old);
			}
			id = MemoryContextStrdup(vals_cxt, given_id ? given_id : change_id(src, index));
		}
		/* update_columns: compared when the old row is whole (REPLICA IDENTITY FULL) */
		if (strcmp(operation, "UPDATE") == 0 && oldtup && full && !m->update_columns_null &&
			eg_tc_unchanged(c, newslot, oldslot, row_cxt))
			continue;
		if (strcmp(c->operation, operation) != 0)
		{
			const char *prefix = m->type_prefix ? m->type_prefix : r->qualified;

			if (c == pending)
				flush_pending();
			c->operation = operation;
			c->event_type = MemoryContextStrdup(TopTransactionContext,
												psprintf("%s.%s", prefix,
														 strcmp(operation, "INSERT") == 0 ? "Inserted"
														 : strcmp(operation, "UPDATE") == 0 ? "Updated"
														 : strcmp(operation, "DELETE") == 0 ? "Deleted" : "Backfilled"));
			c->skeleton_size = -1;
		}
		if (pending != c)
			flush_pending();
		pending = c;
		c->id = id;
		c->absent_new = absent_new;
		c->absent_old = absent_old;
		eg_tc_add_event(c, strcmp(operation, "DELETE") == 0 ? NULL : newslot,
						strcmp(operation, "INSERT") == 0 ? NULL : oldslot, row_cxt);
		if (c->n == 0)
			pending = NULL;		/* the batch was full and is stored */
		src->txn.events++;
	}
}

/* See wal_source.h: a reject (its content cut to its first 4 kB) in this source transaction's transaction. */
void
eg_wal_reject(EgWalSource *src, const char *reason, const char *content, int len, bool in_txn)
{
	Datum		args[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};

	open_local(src);
	flush_pending();
	args[0] = CStringGetTextDatum(src->name);
	args[1] = LSNGetDatum(src->txn.commit_lsn);
	if (!in_txn)
		nulls[1] = 'n';
	args[2] = CStringGetTextDatum(reason);
	if (content)
		args[3] = PointerGetDatum(cstring_to_text_with_len(content, pg_mbcliplen(content, len, EG_REJECT_CONTENT_BYTES)));
	else
		nulls[3] = 'n';
	eg_store_run_nulls(&reject_stmt, args, nulls, SPI_OK_INSERT);
	src->txn.rejects++;
}

/*
 * Commits this source transaction's transaction here, with the replication
 * origin's progress at end_lsn (InvalidXLogRecPtr: none, for a reject
 * outside any transaction) and its counts in wal_source_status.
 */
static void
commit_local(EgWalSource *src, XLogRecPtr end_lsn, TimestampTz commit_time)
{
	Datum		args[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};
	ListCell   *lc;

	flush_pending();
	args[4] = CStringGetTextDatum(src->state);
	args[0] = Int64GetDatum(src->id);
	args[1] = Int64GetDatum(src->txn.events);
	args[2] = Int64GetDatum(src->txn.rejects);
	args[3] = TimestampTzGetDatum(commit_time);
	if (XLogRecPtrIsInvalid(end_lsn))
		nulls[3] = 'n';
	eg_store_run_nulls(&counts_stmt, args, nulls, SPI_OK_INSERT);
	foreach(lc, mappings)
		if (((EgWalMapping *) lfirst(lc))->change)
			drop_slots(((EgWalMapping *) lfirst(lc))->change);
	if (!XLogRecPtrIsInvalid(end_lsn))
	{
		replorigin_session_origin_lsn = end_lsn;
		replorigin_session_origin_timestamp = commit_time;
	}
	eg_store_commit();
	src->txn.local_end = XactLastCommitEnd;
	replorigin_session_origin_lsn = InvalidXLogRecPtr;
	replorigin_session_origin_timestamp = 0;
	src->txn.local_open = false;
	mappings = NIL;
	mappings_read = false;
	pending = NULL;
	vals_cxt = row_cxt = NULL;	/* went with the transaction */
}

/* See wal_source.h. */
void
eg_wal_open(EgWalSource *src)
{
	open_local(src);
}

/* See wal_source.h. */
void
eg_wal_backfill_row(EgWalSource *src, uint32 relid, const char *topic, LogicalRepTupleData *row, const char *id)
{
	open_local(src);
	apply_change(src, relid, "BACKFILL", row, NULL, topic, id);
}

/* See wal_source.h.  Opens the transaction if nothing did: the caller's progress is committed. */
void
eg_wal_commit_backfill(EgWalSource *src)
{
	open_local(src);
	commit_local(src, InvalidXLogRecPtr, 0);
	memset(&src->txn, 0, sizeof(src->txn));
}

/*
 * 'M': a generic message.  One of another prefix is not ours.  One of the
 * source's prefix: a transactional one's content is published
 * (eventgrid.publish(), in a subtransaction), anything else is a reject.
 */
static void
apply_message(EgWalSource *src, StringInfo msg)
{
	uint8		flags = pq_getmsgbyte(msg);
	const char *prefix;
	const char *content;
	int			len;
	char	   *text;
	MemoryContext old;
	ResourceOwner owner;

	(void) pq_getmsgint64(msg);	/* the message's own LSN */
	prefix = pq_getmsgstring(msg);
	len = pq_getmsgint(msg, 4);
	content = pq_getmsgbytes(msg, len);
	if (strcmp(prefix, src->message_prefix) != 0)
		return;
	if (!src->in_txn)
		memset(&src->txn, 0, sizeof(src->txn));	/* counted on its own, not with the last transaction */
	if (!pg_verifymbstr(content, len, true))
		eg_wal_reject(src, "the message is not UTF-8 text", NULL, 0, src->in_txn);
	else if ((flags & 1) == 0 || !src->in_txn)
		eg_wal_reject(src, "the message is not transactional: pg_logical_emit_message(true, ...) publishes with its transaction",
			   content, len, false);
	else if (len > EG_MAX_EVENT_BYTES)
		eg_wal_reject(src, psprintf("the message is over 1 MB (%d bytes): publish at most 1048576 bytes of events at once", len),
			   content, len, true);
	else
	{
		text = pnstrdup(content, len);
		open_local(src);
		flush_pending();
		old = CurrentMemoryContext;
		owner = CurrentResourceOwner;	/* this transaction's, once open */
		BeginInternalSubTransaction(NULL);
		MemoryContextSwitchTo(old);
		PG_TRY();
		{
			Jsonb	   *jb = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(text)));
			JsonbValue	topic;
			JsonbValue	events;
			Datum		args[2];
			int			n;

			if (!JB_ROOT_IS_OBJECT(jb))
				ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
								errmsg("the message must be a JSON object {\"topic\": ..., \"events\": [...]}")));
			if (!getKeyJsonValueFromContainer(&jb->root, "topic", 5, &topic) || topic.type != jbvString)
				ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
								errmsg("the message has no \"topic\" string")));
			if (getKeyJsonValueFromContainer(&jb->root, "events", 6, &events))
			{
				if (events.type != jbvBinary || !JsonContainerIsArray(events.val.binary.data))
					ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
									errmsg("the message's \"events\" must be a JSON array")));
				n = JsonContainerSize(events.val.binary.data);
			}
			else if (getKeyJsonValueFromContainer(&jb->root, "event", 5, &events))
			{
				if (events.type != jbvBinary || !JsonContainerIsObject(events.val.binary.data))
					ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
									errmsg("the message's \"event\" must be a JSON object")));
				n = 1;
			}
			else
				ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
								errmsg("the message has neither \"events\" nor \"event\"")));
			args[0] = PointerGetDatum(cstring_to_text_with_len(topic.val.string.val, topic.val.string.len));
			args[1] = JsonbPGetDatum(JsonbValueToJsonb(&events));
			eg_store_run(&publish_stmt, args, SPI_OK_SELECT);
			ReleaseCurrentSubTransaction();
			MemoryContextSwitchTo(old);
			CurrentResourceOwner = owner;
			src->txn.events += n;
		}
		PG_CATCH();
		{
			ErrorData  *edata;

			MemoryContextSwitchTo(old);
			edata = CopyErrorData();
			FlushErrorState();
			RollbackAndReleaseCurrentSubTransaction();
			MemoryContextSwitchTo(old);
			CurrentResourceOwner = owner;
			eg_wal_reject(src, edata->message, text, len, true);
			FreeErrorData(edata);
		}
		PG_END_TRY();
	}
	/* a reject of a message outside any transaction is committed on its own */
	if (!src->in_txn && src->txn.local_open)
		commit_local(src, InvalidXLogRecPtr, 0);
}

XLogRecPtr
eg_wal_apply(EgWalSource *src, StringInfo msg)
{
	LogicalRepMsgType action = pq_getmsgbyte(msg);
	LogicalRepRelId relid;
	LogicalRepTupleData newtup;
	LogicalRepTupleData oldtup;

	switch (action)
	{
		case LOGICAL_REP_MSG_BEGIN:
			{
				LogicalRepBeginData b;

				logicalrep_read_begin(msg, &b);
				memset(&src->txn, 0, sizeof(src->txn));
				src->txn.commit_lsn = b.final_lsn;
				src->txn.commit_time = b.committime;
				src->in_txn = true;
				break;
			}
		case LOGICAL_REP_MSG_COMMIT:
			{
				LogicalRepCommitData c;

				logicalrep_read_commit(msg, &c);
				if (src->txn.local_open)
					commit_local(src, c.end_lsn, c.committime);
				src->in_txn = false;
				return c.end_lsn;
			}
		case LOGICAL_REP_MSG_RELATION:
			/* the types are looked up here: in this source transaction's transaction */
			open_local(src);
			describe_relation(msg);
			break;
		case LOGICAL_REP_MSG_TYPE:
			{
				LogicalRepTyp t;

				logicalrep_read_typ(msg, &t);
				break;
			}
		case LOGICAL_REP_MSG_ORIGIN:
			{
				XLogRecPtr	lsn;

				(void) logicalrep_read_origin(msg, &lsn);
				break;
			}
		case LOGICAL_REP_MSG_INSERT:
			relid = logicalrep_read_insert(msg, &newtup);
			apply_change(src, relid, "INSERT", &newtup, NULL, NULL, NULL);
			break;
		case LOGICAL_REP_MSG_UPDATE:
			{
				bool		has_old;

				relid = logicalrep_read_update(msg, &has_old, &oldtup, &newtup);
				apply_change(src, relid, "UPDATE", &newtup, has_old ? &oldtup : NULL, NULL, NULL);
				break;
			}
		case LOGICAL_REP_MSG_DELETE:
			relid = logicalrep_read_delete(msg, &oldtup);
			apply_change(src, relid, "DELETE", NULL, &oldtup, NULL, NULL);
			break;
		case LOGICAL_REP_MSG_TRUNCATE:
			{
				bool		cascade;
				bool		restart;

				/* TRUNCATE publishes nothing, as in-database table changes */
				(void) logicalrep_read_truncate(msg, &cascade, &restart);
				break;
			}
		case LOGICAL_REP_MSG_MESSAGE:
			apply_message(src, msg);
			break;
		default:
			ereport(ERROR, (errcode(ERRCODE_PROTOCOL_VIOLATION),
							errmsg("eventgrid: WAL source \"%s\": unexpected logical replication message type \"%c\"",
								   src->name, action)));
	}
	return InvalidXLogRecPtr;
}
