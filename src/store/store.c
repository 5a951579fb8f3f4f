/*
 * store.c - the part of the delivery queue's SQL layer every other store_*
 * file uses: a unit of work (one transaction) and the check at its start
 * that the extension is installed here in this library's version, the
 * statements' preparation and execution, and helpers for reading SPI
 * results and building array parameters.
 *
 * Storage (sql/eventgrid--<version>.sql), PgQ's design adapted:
 *  - events are appended to three event tables that take turns; nothing
 *    per delivery is written at publish;
 *  - each event subscription has a position: the snapshot "done" (events
 *    whose transaction is visible in it were claimed) and the batch being
 *    worked through (snapshot "upto", last event claimed).  A claim takes a
 *    new snapshot; the batch is the events whose transaction is visible in
 *    it and not in "done" (eventgrid._in_batch()), read in (txid, id) order
 *    a chunk at a time, so a transaction that commits late is still
 *    delivered and a rolled-back one never is (store_claim.c);
 *  - a chunk claimed is a row of eventgrid.chunks_in_flight, and the
 *    position moves past it in the same transaction; before its requests go
 *    to HTTP the chunk's sent mark is committed durably; its outcomes are
 *    recorded as a whole, and only failures become rows of
 *    eventgrid.retries, which are claimed by due time and leased
 *    (store_record.c);
 *  - after a crash the chunks left become retries, charged an attempt
 *    (Aborted) up to their sent mark; leased retries named in
 *    eventgrid.requests_in_flight are charged, the others only released
 *    (store_recovery.c);
 *  - an event table is emptied with TRUNCATE once no position, chunk or
 *    unmatched count needs its events, under a lock taken only if free
 *    (store_rotation.c).
 *
 * Every statement is prepared when first used and kept.  The extension's
 * presence and version are checked at the start of each unit of work, and
 * the extension is then locked against DROP EXTENSION until the unit ends:
 * a library and schema of different versions would run statements against
 * tables they were not written for, and a schema dropped mid-unit would
 * fail them with "relation does not exist".
 */
#include "store/store.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"

EgReadiness eg_store_readiness = EG_READY_UNKNOWN;
bool		eg_store_quiet = false; /* the delivery workers leave readiness messages to the upkeep worker */

/* statements prepared, so that they can be dropped together */
static EgStatement *prepared = NULL;

static EgStatement no_sync = {
	.name = "synchronous_commit",
	.sql = "SET LOCAL synchronous_commit = off",
};

static SPIPlanPtr
get_plan(EgStatement *st)
{
	if (st->plan == NULL)
	{
		SPIPlanPtr	plan = SPI_prepare_cursor(st->sql, st->nargs, st->types,
											  st->generic ? CURSOR_OPT_GENERIC_PLAN :
											  st->custom ? CURSOR_OPT_CUSTOM_PLAN : 0);

		if (plan == NULL)
			elog(ERROR, "eventgrid: preparing the %s statement failed: %s", st->name,
				 SPI_result_code_string(SPI_result));
		SPI_keepplan(plan);
		st->plan = plan;
		st->next_prepared = prepared;
		prepared = st;
	}
	return st->plan;
}

static void
free_plans(void)
{
	while (prepared)
	{
		EgStatement *st = prepared;

		prepared = st->next_prepared;
		SPI_freeplan(st->plan);
		st->plan = NULL;
		st->next_prepared = NULL;
	}
}

/* See eventgrid.h. */
ErrorData *
eg_try(void (*work) (void *arg), void *arg)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	ErrorData  *volatile edata = NULL;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		work(arg);
		ReleaseCurrentSubTransaction();
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
	}
	PG_END_TRY();
	MemoryContextSwitchTo(cxt);
	CurrentResourceOwner = owner;
	return edata;
}

/* Error context: which of eventgrid's statements raised an ERROR. */
static void
statement_context(void *arg)
{
	errcontext("eventgrid's %s statement", ((EgStatement *) arg)->name);
}

/* See store.h. */
void
eg_store_run_nulls(EgStatement *st, Datum *args, const char *nulls, int expected)
{
	ErrorContextCallback context;
	int			rc;

	context.callback = statement_context;
	context.arg = st;
	context.previous = error_context_stack;
	error_context_stack = &context;
	rc = SPI_execute_plan(get_plan(st), args, nulls, false, 0);
	error_context_stack = context.previous;
	if (rc != expected)
		elog(ERROR, "eventgrid: the %s statement failed: %s", st->name, SPI_result_code_string(rc));
}

/* See store.h. */
void
eg_store_run(EgStatement *st, Datum *args, int expected)
{
	eg_store_run_nulls(st, args, NULL, expected);
}

Datum
eg_make_array(Datum *values, bool *nulls, int n, Oid elemtype)
{
	int			dims[1] = {n};
	int			lbs[1] = {1};
	int16		typlen;
	bool		typbyval;
	char		typalign;

	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	return PointerGetDatum(construct_md_array(values, nulls, 1, dims, lbs, elemtype,
											  typlen, typbyval, typalign));
}

Datum
eg_int8_array(const int64 *values, int n)
{
	Datum	   *d = palloc(Max(n, 1) * sizeof(Datum));

	for (int i = 0; i < n; i++)
		d[i] = Int64GetDatum(values[i]);
	return eg_make_array(d, NULL, n, INT8OID);
}
/* See store.h. */
int64 *
eg_int8_array_col(SPITupleTable *tt, int row, int col, int *n)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tt->vals[row], tt->tupdesc, col, &isnull);
	Datum	   *elems;
	int64	   *ids;

	*n = 0;
	if (isnull)
		return palloc(sizeof(int64));
	deconstruct_array(DatumGetArrayTypeP(d), INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE,
					  &elems, NULL, n);
	ids = palloc(Max(*n, 1) * sizeof(int64));
	for (int i = 0; i < *n; i++)
		ids[i] = DatumGetInt64(elems[i]);
	return ids;
}

/* A timestamptz column; NULL reads as 0. */
TimestampTz
eg_timestamp_col(SPITupleTable *tt, int row, int col)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tt->vals[row], tt->tupdesc, col, &isnull);

	return isnull ? 0 : DatumGetTimestampTz(d);
}


Datum
eg_xid8_array(const uint64 *values, int n)
{
	Datum	   *d = palloc(Max(n, 1) * sizeof(Datum));

	for (int i = 0; i < n; i++)
		d[i] = UInt64GetDatum(values[i]);
	return eg_make_array(d, NULL, n, XID8OID);
}

char *
eg_text_col(SPITupleTable *tt, int row, int col)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tt->vals[row], tt->tupdesc, col, &isnull);

	return isnull ? NULL : TextDatumGetCString(d);
}

int32
eg_int32_col(SPITupleTable *tt, int row, int col, int32 dflt)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tt->vals[row], tt->tupdesc, col, &isnull);

	return isnull ? dflt : DatumGetInt32(d);
}

/* A boolean column; NULL reads as false. */
bool
eg_bool_col(SPITupleTable *tt, int row, int col)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tt->vals[row], tt->tupdesc, col, &isnull);

	return !isnull && DatumGetBool(d);
}

int64
eg_int64_col(SPITupleTable *tt, int row, int col, int64 dflt)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tt->vals[row], tt->tupdesc, col, &isnull);

	return isnull ? dflt : DatumGetInt64(d);
}

Datum
eg_text_array(const char *const *values, int n)
{
	Datum	   *d = palloc(Max(n, 1) * sizeof(Datum));
	bool	   *nulls = palloc(Max(n, 1) * sizeof(bool));

	for (int i = 0; i < n; i++)
	{
		nulls[i] = values[i] == NULL;
		d[i] = nulls[i] ? (Datum) 0 : CStringGetTextDatum(values[i]);
	}
	return eg_make_array(d, nulls, n, TEXTOID);
}

/* The oid of eventgrid's relation (table, sequence) eventgrid.<name>, which must exist. */
Oid
eg_store_table(const char *name)
{
	Oid			relid = get_relname_relid(name, get_namespace_oid("eventgrid", false));

	if (!OidIsValid(relid))
		elog(ERROR, "eventgrid: relation eventgrid.%s is missing", name);
	return relid;
}

/*
 * The schema's version (NULL when the extension is not installed) and
 * *oid the extension's.  Read from pg_extension directly, without SQL, so
 * that it works whatever the schema holds.
 */
static char *
installed_version(Oid *oid)
{
	Relation	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	char	   *version = NULL;

	*oid = InvalidOid;
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum("eventgrid"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
	{
		bool		isnull;
		Datum		d = heap_getattr(tup, Anum_pg_extension_extversion, RelationGetDescr(rel), &isnull);

		*oid = ((Form_pg_extension) GETSTRUCT(tup))->oid;
		if (!isnull)
			version = TextDatumGetCString(d);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return version;
}

/*
 * Is the extension installed here, in the version this library was built
 * for?  When it is, it stays so until the transaction ends: the extension
 * is locked (as DROP EXTENSION locks it, in a mode that only conflicts with
 * dropping it) before it is looked up, so a drop either committed before
 * the look or waits for this unit of work.  The lock is taken on the
 * extension the last unit found; when that one is gone (or none was known
 * yet) the one found is locked and looked up again.  Logs each change of
 * the answer once.  On a mismatch the worker idles until ALTER EXTENSION
 * eventgrid UPDATE.
 */
static bool
extension_ready(void)
{
	static Oid	known = InvalidOid;	/* the extension found by the last unit of work */
	Oid			extoid;
	char	   *version;
	EgReadiness now;

	if (OidIsValid(known))
		LockDatabaseObject(ExtensionRelationId, known, 0, AccessShareLock);
	version = installed_version(&extoid);
	if (version != NULL && extoid != known)
	{
		/* first look, or dropped and created again since the last one */
		LockDatabaseObject(ExtensionRelationId, extoid, 0, AccessShareLock);
		known = extoid;
		version = installed_version(&extoid);
		if (extoid != known)
			version = NULL;		/* dropped meanwhile */
	}
	now = version == NULL ? EG_READY_MISSING
		: strcmp(version, EG_VERSION) != 0 ? EG_READY_VERSION : EG_READY_OK;
	if (now != eg_store_readiness)
	{
		/*
		 * Most databases have no extension: a worker looking into one says
		 * nothing; one whose extension was dropped under it says so once.
		 */
		if (eg_store_quiet)
			;
		else if (now == EG_READY_MISSING && eg_store_readiness == EG_READY_OK)
			ereport(LOG,
					(errmsg("eventgrid: extension eventgrid was dropped from database \"%s\"; its workers leave",
							get_database_name(MyDatabaseId)),
					 errhint("CREATE EXTENSION eventgrid in it brings them back.")));
		else if (now == EG_READY_VERSION)
			ereport(LOG,
					(errmsg("eventgrid: the extension in database \"%s\" is version %s but the loaded library is version %s; nothing is delivered there",
							get_database_name(MyDatabaseId), version, EG_VERSION),
					 errhint("Run ALTER EXTENSION eventgrid UPDATE TO '%s' in database \"%s\"; delivery resumes by itself.",
							 EG_VERSION, get_database_name(MyDatabaseId))));
		else if (now == EG_READY_OK &&
				 (eg_store_readiness == EG_READY_VERSION || (eg_my_db != NULL && eg_my_db->state == EG_DB_OTHER_VERSION)))
			ereport(LOG, (errmsg("eventgrid: extension eventgrid %s is ready in database \"%s\"; delivery resumes",
								 EG_VERSION, get_database_name(MyDatabaseId))));
		/* statements prepared for other tables must not be reused */
		free_plans();
		eg_store_readiness = now;
	}
	/* the launcher keeps what the workers find (a look without the lock: only this process writes it) */
	if (eg_my_db != NULL)
	{
		EgDbState	state = now == EG_READY_OK ? EG_DB_READY : now == EG_READY_VERSION ? EG_DB_OTHER_VERSION : EG_DB_ABSENT;

		if (eg_my_db->state != state || eg_my_db->recheck)
		{
			SpinLockAcquire(&eg_shared->mutex);
			eg_my_db->state = state;
			eg_my_db->recheck = false;
			SpinLockRelease(&eg_shared->mutex);
		}
	}
	return now == EG_READY_OK;
}

/*
 * Opens a unit of work (one transaction) reported in pg_stat_activity as
 * activity.  Returns false, with no transaction open, when the extension
 * is not installed in this database or is of another version than the
 * library (eg_store_readiness says which).
 */
bool
eg_store_begin(const char *activity)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "eventgrid: SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	if (!extension_ready())
	{
		SPI_finish();
		PopActiveSnapshot();
		CommitTransactionCommand();
		return false;
	}
	pgstat_report_activity(STATE_RUNNING, activity);
	return true;
}

/* Commits the unit of work; what SPI allocated in it is freed. */
void
eg_store_commit(void)
{
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
}

/*
 * Lets the unit of work commit without waiting for the WAL flush: for
 * statements whose loss in a crash only means doing them again.
 */
void
eg_store_no_flush_wait(void)
{
	eg_store_run(&no_sync, NULL, SPI_OK_UTILITY);
}

/* See store.h. */
int
eg_key_arrays(SPITupleTable *tt, int n, int first, int keyed_col, Datum *args)
{
	Datum	   *cols[3];
	int			k = 0;

	for (int c = 0; c < 3; c++)
		cols[c] = palloc(Max(n, 1) * sizeof(Datum));
	for (int i = 0; i < n; i++)
	{
		if (keyed_col > 0 && !eg_bool_col(tt, i, keyed_col))
			continue;
		for (int c = 0; c < 3; c++)
			cols[c][k] = Int64GetDatum(eg_int64_col(tt, i, first + c, 0));
		k++;
	}
	for (int c = 0; c < 3; c++)
		args[c] = eg_make_array(cols[c], NULL, k, INT8OID);
	return k;
}
