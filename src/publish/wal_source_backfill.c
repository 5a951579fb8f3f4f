/*
 * wal_source_backfill.c - a WAL source's backfill (SPEC 19):
 * create_wal_source(..., backfill => true) publishes every row held by the
 * tables mapped in its creating transaction before the changes after them.
 *
 * The worker makes the slot inside a repeatable read transaction on the
 * source that uses the slot's snapshot (as the apply worker's table
 * synchronization does), reads the tables in that transaction and streams
 * from the slot's start once they are read: each row is in the backfill or
 * in a change the stream brings, never in neither.  A table is read in
 * chunks of EG_BACKFILL_CHUNK rows in its primary key's order
 * ("WHERE (key) > (last) ORDER BY key LIMIT n"), each chunk's events
 * committed here in one transaction with the table's progress (the last
 * key published, in wal_source_tables), so that a restart goes on after
 * the last row published: with a snapshot of then, the slot's being gone
 * with the connection (rows deleted meanwhile are then in no backfill
 * event, but their DELETE is in the stream; rows inserted meanwhile are
 * in both).  A backfilled row's id is derived from the source's system
 * identifier, the slot, the table and the key, so a row read twice has
 * one id.  A table that is missing on the source or has no primary key is
 * a reject, and the others go on.
 */
#include "publish/wal_source.h"
#include "store/store.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "libpq/pqformat.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/interrupt.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#define EG_BACKFILL_CHUNK 1000		/* rows read, published and committed at once */
#define EG_BACKFILL_RELID PG_UINT32_MAX	/* the relation id the stream never sends */

/* One mapping to backfill, as wal_source_tables has it. */
typedef struct EgBackfill
{
	char	   *table_name;		/* schema.table as the source names it */
	char	   *topic;
	int			nafter;			/* the key of the last row published: nafter values, or none */
	char	  **after;
} EgBackfill;

/* A table as the source describes it: columns, their types and the primary key. */
typedef struct EgSourceTable
{
	char	   *quoted;			/* schema.table, quoted by the source */
	int			natts;
	char	  **names;
	char	  **quoted_names;
	int			nkeys;
	int		   *keys;			/* the key's columns (indexes into names), in the key's order */
} EgSourceTable;

static EgStatement pending_stmt = {
	.name = "WAL source backfills pending",
	.sql =
	"SELECT m.table_name, m.topic, m.backfill_after FROM eventgrid.wal_source_tables m"
	" WHERE m.source_id = $1 AND m.backfill_state = 'pending' ORDER BY m.table_name, m.topic",
	.nargs = 1,
	.types = {INT8OID},
};

static EgStatement progress_stmt = {
	.name = "WAL source backfill progress",
	.sql =
	"UPDATE eventgrid.wal_source_tables m SET backfill_after = coalesce($4, m.backfill_after),"
	"       backfilled_rows = m.backfilled_rows + $5, backfill_state = CASE WHEN $6 THEN 'done' ELSE 'pending' END"
	" WHERE m.source_id = $1 AND m.table_name = $2 AND m.topic = $3",
	.nargs = 6,
	.types = {INT8OID, TEXTOID, TEXTOID, TEXTARRAYOID, INT8OID, BOOLOID},
};

/* See wal_source.h. */
bool
eg_wal_backfill_pending(int64 id)
{
	Datum		arg = Int64GetDatum(id);

	eg_store_run(&pending_stmt, &arg, SPI_OK_SELECT);
	return SPI_processed > 0;
}

/* The mappings left to backfill (in the caller's memory context). */
static List *
read_pending(EgWalSource *src)
{
	Datum		arg = Int64GetDatum(src->id);
	MemoryContext cxt = CurrentMemoryContext;
	List	   *list = NIL;

	eg_wal_begin("eventgrid: reading a WAL source's backfill");
	eg_store_run(&pending_stmt, &arg, SPI_OK_SELECT);
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	row = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		MemoryContext old = MemoryContextSwitchTo(cxt);
		EgBackfill *b = palloc0(sizeof(EgBackfill));
		bool		isnull;
		Datum		after = SPI_getbinval(row, desc, 3, &isnull);

		b->table_name = SPI_getvalue(row, desc, 1);
		b->topic = SPI_getvalue(row, desc, 2);
		if (!isnull)
		{
			Datum	   *values;
			int			n;

			deconstruct_array(DatumGetArrayTypeP(after), TEXTOID, -1, false, TYPALIGN_INT, &values, NULL, &n);
			b->after = palloc(Max(n, 1) * sizeof(char *));
			for (int k = 0; k < n; k++)
				b->after[k] = TextDatumGetCString(values[k]);
			b->nafter = n;
		}
		list = lappend(list, b);
		MemoryContextSwitchTo(old);
	}
	eg_store_commit();
	MemoryContextSwitchTo(cxt);
	return list;
}

/*
 * The table's columns (not dropped, not generated: what pgoutput sends)
 * and primary key, as the source has them; false when it has no such
 * table.
 */
static bool
describe_source_table(EgWalSource *src, const char *table_name, EgSourceTable *t)
{
	const char *dot = strchr(table_name, '.');
	char	   *nspname = pnstrdup(table_name, dot - table_name);
	PGresult   *res;

	res = eg_wal_source_exec(src, psprintf(
		"SELECT a.attname, pg_catalog.quote_ident(a.attname), k.n,"
		"       pg_catalog.quote_ident(s.nspname) || '.' || pg_catalog.quote_ident(c.relname),"
		"       pg_catalog.has_table_privilege(c.oid, 'SELECT')"
		"  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace s ON s.oid = c.relnamespace"
		"  JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped"
		"                                 AND a.attgenerated = ''"
		"  LEFT JOIN pg_catalog.pg_index i ON i.indrelid = c.oid AND i.indisprimary"
		"  LEFT JOIN LATERAL (SELECT x.n FROM pg_catalog.unnest(i.indkey::pg_catalog.int2[]) WITH ORDINALITY x(attnum, n)"
		"                      WHERE x.attnum = a.attnum) k ON true"
		" WHERE s.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')"
		" ORDER BY a.attnum",
		quote_literal_cstr(nspname), quote_literal_cstr(dot + 1)), PGRES_TUPLES_OK);
	t->natts = PQntuples(res);
	if (t->natts == 0)
	{
		PQclear(res);
		return false;
	}
	if (strcmp(PQgetvalue(res, 0, 4), "t") != 0)
	{
		PQclear(res);
		ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
						errmsg("eventgrid: WAL source \"%s\": the source's role may not read table %s to backfill it",
							   src->name, table_name),
						errhint("On the source: GRANT SELECT ON %s TO the role of the WAL source's connection "
								"(logical replication's own table copy needs the same).", table_name)));
	}
	t->quoted = pstrdup(PQgetvalue(res, 0, 3));
	t->names = palloc(t->natts * sizeof(char *));
	t->quoted_names = palloc(t->natts * sizeof(char *));
	t->keys = palloc(t->natts * sizeof(int));
	t->nkeys = 0;
	for (int i = 0; i < t->natts; i++)
	{
		t->names[i] = pstrdup(PQgetvalue(res, i, 0));
		t->quoted_names[i] = pstrdup(PQgetvalue(res, i, 1));
		if (!PQgetisnull(res, i, 2))
			t->nkeys++;
	}
	/* the key's columns in the key's order (k.n counts from 1); a key column not sent (generated): no key */
	for (int k = 0; k < t->nkeys; k++)
		t->keys[k] = -1;
	for (int i = 0; i < t->natts; i++)
		if (!PQgetisnull(res, i, 2) && atoi(PQgetvalue(res, i, 2)) <= t->nkeys)
			t->keys[atoi(PQgetvalue(res, i, 2)) - 1] = i;
	for (int k = 0; k < t->nkeys; k++)
		if (t->keys[k] < 0)
			t->nkeys = 0;
	PQclear(res);
	return true;
}

/* The query of the chunk after the key b->after (none: the first). */
static char *
chunk_query(EgSourceTable *t, EgBackfill *b)
{
	StringInfoData q;
	StringInfoData key;

	initStringInfo(&q);
	initStringInfo(&key);
	for (int k = 0; k < t->nkeys; k++)
		appendStringInfo(&key, "%s%s", k ? ", " : "", t->quoted_names[t->keys[k]]);
	appendStringInfoString(&q, "SELECT ");
	for (int i = 0; i < t->natts; i++)
		appendStringInfo(&q, "%s%s", i ? ", " : "", t->quoted_names[i]);
	appendStringInfo(&q, " FROM %s", t->quoted);
	if (b->nafter == t->nkeys && b->nafter > 0)
	{
		appendStringInfo(&q, " WHERE (%s) > (", key.data);
		for (int k = 0; k < t->nkeys; k++)
			appendStringInfo(&q, "%s%s", k ? ", " : "", quote_literal_cstr(b->after[k]));
		appendStringInfoChar(&q, ')');
	}
	appendStringInfo(&q, " ORDER BY %s LIMIT %d", key.data, EG_BACKFILL_CHUNK);
	return q.data;
}

/* Commits a chunk here: its events, the rows counted and the key of its last row (after: NULL, none). */
static void
commit_chunk(EgWalSource *src, EgBackfill *b, char **after, int nafter, int64 rows, bool done)
{
	Datum		args[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};

	args[0] = Int64GetDatum(src->id);
	args[1] = CStringGetTextDatum(b->table_name);
	args[2] = CStringGetTextDatum(b->topic);
	if (after)
	{
		Datum	   *values = palloc(nafter * sizeof(Datum));

		for (int k = 0; k < nafter; k++)
			values[k] = CStringGetTextDatum(after[k]);
		args[3] = PointerGetDatum(construct_array(values, nafter, TEXTOID, -1, false, TYPALIGN_INT));
	}
	else
		nulls[3] = 'n';
	args[4] = Int64GetDatum(rows);
	args[5] = BoolGetDatum(done);
	eg_wal_open(src);
	eg_store_run_nulls(&progress_stmt, args, nulls, SPI_OK_UPDATE);
	eg_wal_commit_backfill(src);
}

/* The source's clock now (in its transaction: the snapshot's time), for the events' eventTime. */
static TimestampTz
source_now(EgWalSource *src)
{
	PGresult   *res = eg_wal_source_exec(src, "SELECT (pg_catalog.date_part('epoch', pg_catalog.now()) * 1000000)::pg_catalog.int8",
										 PGRES_TUPLES_OK);
	int64		unix_us = pg_strtoint64(PQgetvalue(res, 0, 0));

	PQclear(res);
	return (TimestampTz) (unix_us - ((int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * SECS_PER_DAY * USECS_PER_SEC));
}

/* Backfills one mapping, chunk after chunk, until a chunk comes short. */
static void
backfill_table(EgWalSource *src, EgBackfill *b, TimestampTz snapshot_time, MemoryContext chunk_cxt)
{
	EgSourceTable t;
	const char *dot = strchr(b->table_name, '.');
	bool		described = false;

	if (!describe_source_table(src, b->table_name, &t) || t.nkeys == 0)
	{
		eg_wal_reject(src, psprintf(t.natts == 0 ? "table %s is not on the source: it is not backfilled"
									: "table %s has no primary key: it is not backfilled (its changes are published)",
									b->table_name), NULL, 0, false);
		commit_chunk(src, b, NULL, 0, 0, true);
		return;
	}
	ereport(LOG, (errmsg("eventgrid: WAL source \"%s\": backfilling %s to topic \"%s\"%s",
						 src->name, b->table_name, b->topic, b->nafter ? " (going on after its last row published)" : "")));
	for (;;)
	{
		MemoryContext old = MemoryContextSwitchTo(chunk_cxt);
		PGresult   *res = eg_wal_source_exec(src, chunk_query(&t, b), PGRES_TUPLES_OK);
		int			n = PQntuples(res);
		Oid		   *types = palloc(t.natts * sizeof(Oid));
		LogicalRepTupleData row;
		char	  **last = palloc(t.nkeys * sizeof(char *));

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		if (PQnfields(res) != t.natts)
			elog(ERROR, "eventgrid: the source sent %d columns of %s for %d", PQnfields(res), b->table_name, t.natts);
		for (int i = 0; i < t.natts; i++)
			types[i] = PQftype(res, i);
		row.ncols = t.natts;
		row.colvalues = palloc0(t.natts * sizeof(StringInfoData));
		row.colstatus = palloc(t.natts * sizeof(char));
		src->txn.commit_time = snapshot_time;
		eg_wal_open(src);		/* this chunk's transaction here */
		if (!described)
		{
			Bitmapset  *keys = NULL;

			for (int k = 0; k < t.nkeys; k++)
				keys = bms_add_member(keys, t.keys[k]);
			eg_wal_describe_table(src, EG_BACKFILL_RELID, pnstrdup(b->table_name, dot - b->table_name), dot + 1,
								  t.natts, t.names, types, keys);
			described = true;
		}
		for (int r = 0; r < n; r++)
		{
			StringInfoData key;

			MemoryContextSwitchTo(chunk_cxt);	/* (opening the unit of work here switched to its own) */
			initStringInfo(&key);
			appendStringInfo(&key, "%s/%s/%s", src->system_identifier, src->slot, b->table_name);
			for (int i = 0; i < t.natts; i++)
			{
				row.colstatus[i] = PQgetisnull(res, r, i) ? LOGICALREP_COLUMN_NULL : LOGICALREP_COLUMN_TEXT;
				row.colvalues[i].data = PQgetvalue(res, r, i);
				row.colvalues[i].len = PQgetlength(res, r, i);
			}
			/* each key value with its length: no two keys make one text */
			for (int k = 0; k < t.nkeys; k++)
				appendStringInfo(&key, "/%d:%s", PQgetlength(res, r, t.keys[k]), PQgetvalue(res, r, t.keys[k]));
			eg_wal_backfill_row(src, EG_BACKFILL_RELID, b->topic, &row, eg_wal_uuid(key.data));
		}
		for (int k = 0; k < t.nkeys && n > 0; k++)
			last[k] = MemoryContextStrdup(chunk_cxt, PQgetvalue(res, n - 1, t.keys[k]));
		PQclear(res);
		commit_chunk(src, b, n > 0 ? last : NULL, t.nkeys, n, n < EG_BACKFILL_CHUNK);
		MemoryContextSwitchTo(old);
		if (n > 0)
		{
			b->after = MemoryContextAlloc(old, t.nkeys * sizeof(char *));
			for (int k = 0; k < t.nkeys; k++)
				b->after[k] = MemoryContextStrdup(old, last[k]);
			b->nafter = t.nkeys;
		}
		MemoryContextReset(chunk_cxt);
		if (n < EG_BACKFILL_CHUNK)
			break;
		pgstat_report_activity(STATE_RUNNING, "eventgrid: backfilling from the WAL source");
		eg_pause_point("wal-backfill-chunk");
	}
}

/* See wal_source.h. */
void
eg_wal_backfill_check(EgWalSource *src)
{
	MemoryContext cxt = CurrentMemoryContext;
	ListCell   *lc;

	foreach(lc, read_pending(src))
	{
		EgSourceTable t;

		(void) describe_source_table(src, ((EgBackfill *) lfirst(lc))->table_name, &t);
	}
	MemoryContextSwitchTo(cxt);
}

/* See wal_source.h. */
void
eg_wal_backfill(EgWalSource *src)
{
	MemoryContext cxt = CurrentMemoryContext;
	MemoryContext chunk_cxt = AllocSetContextCreate(cxt, "eventgrid WAL source backfill", ALLOCSET_DEFAULT_SIZES);
	TimestampTz snapshot_time = source_now(src);
	List	   *pending = read_pending(src);
	ListCell   *lc;

	foreach(lc, pending)
		backfill_table(src, lfirst(lc), snapshot_time, chunk_cxt);
	MemoryContextDelete(chunk_cxt);
	eg_wal_reset_relations();	/* the stream describes its own */
	ereport(LOG, (errmsg("eventgrid: WAL source \"%s\": backfill done", src->name)));
}
