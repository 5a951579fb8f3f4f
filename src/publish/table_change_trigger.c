/*
 * table_change_trigger.c - the statement trigger of a table change
 * publication (README "Publishing table changes"): each row of the
 * statement's transition tables becomes an event of the publication's
 * topic, built here directly (no SQL per row) and stored a thousand at a
 * time as COPY stores rows (heap_multi_insert).
 *
 * An event is built (table_change_event.c) in the topic's input schema,
 * with its publish time and its size as JSON text, as eventgrid.events'
 * BEFORE INSERT trigger would store it (it stores rows with a publish time
 * as they are; only the extension's owner, whose rights this trigger runs
 * with, may write those columns).
 *
 * The trigger looks up its publication (table_change_lookup.c) and reads
 * the columns from the relation the statement wrote, by name: a
 * partition's own column order, an ALTER TABLE since the last statement,
 * need nothing kept.  Refuses (42501) to run as any trigger
 * publish_table_changes() did not make.
 */
#include "publish/table_change.h"
#include "publish/publish.h"
#include "store/store.h"
#include "http/url.h"

#include "access/htup_details.h"
#include "access/genam.h"
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

/* Text column col (1-based) of row, or NULL. */
static char *
row_text(HeapTuple row, TupleDesc desc, int col)
{
	bool		isnull;
	Datum		d = SPI_getbinval(row, desc, col, &isnull);

	return isnull ? NULL : TextDatumGetCString(d);
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
void
eg_tc_flush(EgChange *c)
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
	a_id = eg_tc_column_number(desc, "id");
	a_topic = eg_tc_column_number(desc, "topic");
	a_event = eg_tc_column_number(desc, "event");
	a_time = eg_tc_column_number(desc, "publish_time");
	a_bytes = eg_tc_column_number(desc, "event_bytes");
	a_txid = eg_tc_column_number(desc, "txid");
	a_table = eg_tc_column_number(desc, "event_table");

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
	{
		MemoryContext old = MemoryContextSwitchTo(c->slot_cxt ? c->slot_cxt : CurrentMemoryContext);

		if (c->slots == NULL)
		{
			c->slots = palloc(EG_TC_BATCH * sizeof(TupleTableSlot *));
			/* a copy that is not reference-counted: a slot made on it pins nothing in the resource owner */
			c->slot_desc = CreateTupleDescCopy(desc);
		}
		for (; c->nslots < c->n; c->nslots++)
			c->slots[c->nslots] = MakeSingleTupleTableSlot(c->slot_desc, &TTSOpsHeapTuple);
		MemoryContextSwitchTo(old);
	}
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
		ExecInsertIndexTuplesCompat(rri, slots[i], estate);
		ExecClearTuple(slots[i]);
	}
	ExecCloseIndices(rri);
	FreeExecutorState(estate);
	table_close(rel, NoLock);
	eg_wake_for_events_at_commit();

	c->n = 0;
	MemoryContextReset(c->batch_cxt);
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

/*
 * Copies of the n rows of store, read through slot without copying the
 * tuples (each value is copied, in CurrentMemoryContext); slot is empty on
 * return.  A tuple copied into the slot would be allocated in
 * CurrentMemoryContext and freed by the slot's next store: after the
 * caller's short-lived context is gone, that free corrupted a freed
 * context's memory and crashed the backend (0.21.0).
 */
static EgRowImage *
row_images(Tuplestorestate *store, TupleTableSlot *slot, int64 n)
{
	EgRowImage *rows = palloc(n * sizeof(EgRowImage));
	int			natts = slot->tts_tupleDescriptor->natts;

	tuplestore_rescan(store);
	for (int64 k = 0; k < n && tuplestore_gettupleslot(store, true, false, slot); k++)
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
	ExecClearTuple(slot);
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

/* Builds the event of one row change (table_change_event.c) and adds it to the batch (stored by eg_tc_flush() once full). */
void
eg_tc_add_event(EgChange *c, TupleTableSlot *newslot, TupleTableSlot *oldslot, MemoryContext row_cxt)
{
	MemoryContext old = MemoryContextSwitchTo(row_cxt);
	int64		size;
	Jsonb	   *event = eg_tc_build_event(c, newslot, oldslot, &size);

	/* the batch's events live in its context until stored; the row's is reset */
	MemoryContextSwitchTo(c->batch_cxt);
	c->events[c->n] = PointerGetDatum(DatumGetJsonbPCopy(PointerGetDatum(event)));
	MemoryContextSwitchTo(old);
	c->sizes[c->n] = Int32GetDatum((int32) size);
	if (++c->n == EG_TC_BATCH)
		eg_tc_flush(c);
	MemoryContextReset(row_cxt);
}

/*
 * Refuses (42501) a trigger that is not the one publish_table_changes()
 * made for publication row pubrow (NULL: none) of its relation: another
 * name, another timing, another operation, no transition table.
 */
static void
check_trigger(TriggerData *td, EgChange *c, HeapTuple pubrow, TupleDesc pubdesc)
{
	bool		valid = pubrow != NULL && td->tg_trigger->tgnargs == 1 && TRIGGER_FIRED_FOR_STATEMENT(td->tg_event)
		&& TRIGGER_FIRED_AFTER(td->tg_event);

	if (valid)
	{
		bool		isnull;
		Datum		ops = SPI_getbinval(pubrow, pubdesc, 1, &isnull);
		char	   *expected_name = row_text(pubrow, pubdesc, 10);

		valid = eg_tc_in_array(ops, isnull, c->operation)
			&& expected_name != NULL && strcmp(expected_name, td->tg_trigger->tgname) == 0
			&& (strcmp(c->operation, "DELETE") == 0 ? td->tg_oldtable != NULL : td->tg_newtable != NULL)
			&& (strcmp(c->operation, "UPDATE") != 0 || td->tg_oldtable != NULL);
	}
	if (!valid)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("trigger %s on table %s does not belong to a publication of its changes to topic \"%s\"",
						td->tg_trigger->tgname,
						quote_qualified_identifier(get_namespace_name(RelationGetNamespace(td->tg_relation)),
												   RelationGetRelationName(td->tg_relation)),
						c->topic),
				 errhint("Only eventgrid.publish_table_changes() sets up publications; drop this trigger.")));
}

/*
 * Fills in what every event of the statement shares, from publication row
 * pubrow: the columns and how each goes into events, the topic's input
 * schema, the names, type, time, source and publish time; returns the
 * event type's prefix (the publication's, or <schema>.<table>).
 */
static const char *
prepare_change(EgChange *c, Relation rel, HeapTuple pubrow, TupleDesc pubdesc)
{
	bool		columns_null,
				watched_null,
				keys_null;
	Datum		columns = SPI_getbinval(pubrow, pubdesc, 2, &columns_null);
	Datum		watched = SPI_getbinval(pubrow, pubdesc, 3, &watched_null);
	Datum		keys = SPI_getbinval(pubrow, pubdesc, 8, &keys_null);
	char	   *prefix = row_text(pubrow, pubdesc, 4);
	char	   *input_schema = row_text(pubrow, pubdesc, 5);
	const char *type_prefix;
	const char *db = get_database_name(MyDatabaseId);

	c->schema_name = row_text(pubrow, pubdesc, 6);
	c->table_name = row_text(pubrow, pubdesc, 7);
	c->schema = strcmp(input_schema, "CloudEventSchemaV1_0") == 0 ? IN_CLOUDEVENTS
		: strcmp(input_schema, "CustomEventSchema") == 0 ? IN_CUSTOM : IN_EVENTGRID;
	eg_tc_prepare_columns(c, RelationGetDescr(rel), columns, columns_null, watched, watched_null, keys, keys_null);

	/* events name the published table, also for a write that named one of its partitions */
	c->head = psprintf("/%s/%s", eg_uri_escape(c->schema_name, strlen(c->schema_name)),
					   eg_uri_escape(c->table_name, strlen(c->table_name)));
	type_prefix = prefix ? prefix : psprintf("%s.%s", c->schema_name, c->table_name);
	c->event_type = psprintf("%s.%s", type_prefix,
							 strcmp(c->operation, "INSERT") == 0 ? "Inserted"
							 : strcmp(c->operation, "UPDATE") == 0 ? "Updated" : "Deleted");
	c->event_time = eg_tc_rfc3339(GetCurrentStatementStartTimestamp());
	c->source = psprintf("/postgresql/%s%s", eg_uri_escape(db, strlen(db)), c->head);
	c->publish_time = TimestampTzGetDatum(eg_transaction_now());
	c->skeleton_size = -1;
	initStringInfo(&c->text);
	c->events = palloc(EG_TC_BATCH * sizeof(Datum));
	c->sizes = palloc(EG_TC_BATCH * sizeof(Datum));
	/* kept blocks: a batch's events are about half a megabyte, again and again */
	c->batch_cxt = AllocSetContextCreate(CurrentMemoryContext, "eventgrid table change batch",
										 1024 * 1024, 1024 * 1024, 8 * 1024 * 1024);
	return type_prefix;
}

/*
 * The events of an UPDATE: the old and the new version of each row,
 * paired by their place (PostgreSQL fills both in step), except for a row
 * moved to another partition whose BEFORE INSERT trigger there skipped
 * it: its old version is there and its new one is not (skipped_olds finds
 * it), and it is reported as the table shows it: deleted.
 */
static void
publish_updates(EgChange *c, TriggerData *td, const char *type_prefix, TupleTableSlot *newslot,
				TupleTableSlot *oldslot, MemoryContext row_cxt)
{
	int64		nold = tuplestore_tuple_count(td->tg_oldtable);
	bool	   *gone = skipped_olds(c, td->tg_oldtable, td->tg_newtable, oldslot, newslot, row_cxt);
	int64		i = 0;

	tuplestore_rescan(td->tg_newtable);
	tuplestore_rescan(td->tg_oldtable);
	while (tuplestore_gettupleslot(td->tg_newtable, true, false, newslot))
	{
		while (tuplestore_gettupleslot(td->tg_oldtable, true, false, oldslot) && gone && gone[i])
			i++;
		i++;
		if (!eg_tc_unchanged(c, newslot, oldslot, row_cxt))
			eg_tc_add_event(c, newslot, oldslot, row_cxt);
	}
	if (gone)
	{
		eg_tc_flush(c);
		c->operation = "DELETE";
		c->event_type = psprintf("%s.Deleted", type_prefix);
		c->skeleton_size = -1;
		tuplestore_rescan(td->tg_oldtable);
		for (i = 0; i < nold && tuplestore_gettupleslot(td->tg_oldtable, true, false, oldslot); i++)
			if (gone[i])
				eg_tc_add_event(c, NULL, oldslot, row_cxt);
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
	HeapTuple	pubrow;
	TupleDesc	pubdesc = NULL;
	const char *type_prefix;
	TupleTableSlot *newslot = NULL;
	TupleTableSlot *oldslot = NULL;
	MemoryContext row_cxt;

	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("eventgrid._table_change_trigger() must be called as a trigger")));
	c.operation = TRIGGER_FIRED_BY_INSERT(td->tg_event) ? "INSERT"
		: TRIGGER_FIRED_BY_UPDATE(td->tg_event) ? "UPDATE"
		: TRIGGER_FIRED_BY_DELETE(td->tg_event) ? "DELETE" : "TRUNCATE";
	c.topic = td->tg_trigger->tgnargs == 1 ? td->tg_trigger->tgargs[0] : "";

	SPI_connect();
	pubrow = eg_tc_publication(td->tg_relation, c.topic, c.operation, &pubdesc);
	check_trigger(td, &c, pubrow, pubdesc);
	type_prefix = prepare_change(&c, td->tg_relation, pubrow, pubdesc);

	row_cxt = AllocSetContextCreate(CurrentMemoryContext, "eventgrid table change row", ALLOCSET_DEFAULT_SIZES);
	if (td->tg_newtable)
		newslot = MakeSingleTupleTableSlot(RelationGetDescr(td->tg_relation), &TTSOpsMinimalTuple);
	if (td->tg_oldtable)
		oldslot = MakeSingleTupleTableSlot(RelationGetDescr(td->tg_relation), &TTSOpsMinimalTuple);
	if (strcmp(c.operation, "INSERT") == 0)
	{
		tuplestore_rescan(td->tg_newtable);
		while (tuplestore_gettupleslot(td->tg_newtable, true, false, newslot))
			eg_tc_add_event(&c, newslot, NULL, row_cxt);
	}
	else if (strcmp(c.operation, "DELETE") == 0)
	{
		tuplestore_rescan(td->tg_oldtable);
		while (tuplestore_gettupleslot(td->tg_oldtable, true, false, oldslot))
			eg_tc_add_event(&c, NULL, oldslot, row_cxt);
	}
	else
		publish_updates(&c, td, type_prefix, newslot, oldslot, row_cxt);
	eg_tc_flush(&c);
	for (int i = 0; i < c.nslots; i++)
		ExecDropSingleTupleTableSlot(c.slots[i]);
	if (newslot)
		ExecDropSingleTupleTableSlot(newslot);
	if (oldslot)
		ExecDropSingleTupleTableSlot(oldslot);
	SPI_finish();
	return PointerGetDatum(NULL);
}
