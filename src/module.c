/*
 * module.c - module entry: GUCs, the shared-memory block holding the
 * delivery workers' latches and the workers' pid slots, registration of
 * the launcher, the commit-time
 * wake-up that publishing transactions use so delivery starts immediately
 * without polling (SPEC section 2), including after COMMIT PREPARED, and
 * the check that CREATE EXTENSION runs in the database the worker serves.
 *
 * The library works in two modes.  Preloaded (shared_preload_libraries =
 * 'eventgrid') it registers the launcher and shared memory.  Loaded on demand
 * by CREATE EXTENSION or a trigger call, configuration and publishing work
 * but nothing is delivered, and the wake-up is a no-op.
 */
#include "eventgrid.h"

#include <unistd.h>

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_attribute.h"
#include "catalog/pg_database.h"
#include "catalog/pg_proc.h"
#include "commands/dbcommands.h"
#include "commands/defrem.h"
#include "commands/trigger.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "tcop/tcopprot.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/catcache.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

PG_MODULE_MAGIC;

char	   *eg_database_name = NULL;
int			eg_max_databases = 1000;
int			eg_worker_idle_timeout_s = 120;
int			eg_delivery_workers = 1;
int			eg_max_concurrent_requests = 64;
int			eg_response_timeout_ms = 30000;
int			eg_retry_jitter_percent = 10;
int			eg_max_retry_after_s = 3600;
int			eg_clock_offset_s = 0;
int			eg_default_max_events_per_batch = 10;
int			eg_default_preferred_batch_kb = 64;
bool		eg_delivery_paused = false;
int			eg_max_bytes_in_flight_kb = 64 * 1024;
int			eg_event_table_rotation_s = 10;
int			eg_event_retention_s = 0;
int			eg_replication_sync_wait_s = 300;
int			eg_max_requests_per_endpoint = 32;
int			eg_probation_failures = 10;
int			eg_attempt_history = EG_HISTORY_ALL;
int			eg_attempt_history_retention_s = 24 * 3600;
int			eg_attempt_history_max_rows = 1000000;
char	   *eg_ssl_ca_file = NULL;
char	   *eg_webhook_request_origin = NULL;

static const struct config_enum_entry history_modes[] = {
	{"all", EG_HISTORY_ALL, false},
	{"failures", EG_HISTORY_FAILURES, false},
	{"off", EG_HISTORY_OFF, false},
	{NULL, 0, false}
};

static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static ProcessUtility_hook_type prev_process_utility_hook = NULL;
static emit_log_hook_type prev_emit_log_hook = NULL;
#if PG_VERSION_NUM >= 150000
static shmem_request_hook_type prev_shmem_request_hook = NULL;
#endif

static bool wake_at_commit = false;
static bool subscriptions_changed_at_commit = false;
static bool events_at_commit = false;	/* the transaction published events */
static bool publications_changed_at_commit = false;
static uint64 local_publications_changes = 0;	/* this backend's own, seen at once */
static bool extension_changed_at_commit = false;
static bool dropped_at_commit = false;
static bool xact_callback_registered = false;

void		_PG_init(void);
static void register_xact_callback(void);
static void eg_process_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
							   ProcessUtilityContext context, ParamListInfo params,
							   QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc);
static void eg_emit_log(ErrorData *edata);

static void
eg_shmem_request(void)
{
#if PG_VERSION_NUM >= 150000
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
#endif
	RequestAddinShmemSpace(MAXALIGN(eg_shared_size()));
}

static void
eg_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	eg_shared_init();
	LWLockRelease(AddinShmemInitLock);
}

/* eventgrid.webhook_request_origin: printable ASCII, at most 255 bytes (it becomes a header). */
static bool
check_request_origin(char **newval, void **extra, GucSource source)
{
	const char *v = *newval;

	if (v == NULL)
		return true;
	if (strlen(v) > 255)
	{
		GUC_check_errdetail("eventgrid.webhook_request_origin may be at most 255 bytes.");
		return false;
	}
	for (; *v; v++)
		if ((unsigned char) *v < 0x20 || (unsigned char) *v >= 0x7f)
		{
			GUC_check_errdetail("eventgrid.webhook_request_origin may hold printable ASCII only.");
			return false;
		}
	return true;
}

/* eventgrid.ssl_ca_file: empty, or a file the server can read. */
static bool
check_ssl_ca_file(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || (*newval)[0] == '\0')
		return true;
	if (!is_absolute_path(*newval))
	{
		GUC_check_errdetail("eventgrid.ssl_ca_file must be an absolute path.");
		return false;
	}
	if (access(*newval, R_OK) != 0)
	{
		GUC_check_errdetail("File \"%s\" cannot be read: %m.", *newval);
		return false;
	}
	return true;
}

static void
eg_define_gucs(void)
{
	/*
	 * A PGC_POSTMASTER variable can only be defined while the postmaster
	 * loads the library; loaded on demand, defining it would be FATAL.  It
	 * only matters to the worker, which exists only when preloaded.
	 */
	if (process_shared_preload_libraries_in_progress)
		DefineCustomStringVariable("eventgrid.database_name",
								   gettext_noop("No longer used: every database where the extension is created is served."),
								   gettext_noop("Kept so that a configuration from before 0.9.0 still loads; the launcher logs once that it is ignored."),
								   &eg_database_name, "postgres",
								   PGC_POSTMASTER, GUC_SUPERUSER_ONLY, NULL, NULL, NULL);
	if (process_shared_preload_libraries_in_progress)
		DefineCustomIntVariable("eventgrid.max_databases",
								gettext_noop("Most databases the launcher keeps track of (and so serves) at once."),
								gettext_noop("Each takes a slot of shared memory whether or not it has the extension; databases that do not allow connections and templates are not counted."),
								&eg_max_databases, 1000, 1, 10000,
								PGC_POSTMASTER, 0, NULL, NULL, NULL);
	if (process_shared_preload_libraries_in_progress)
		DefineCustomIntVariable("eventgrid.delivery_workers",
								gettext_noop("Number of delivery workers per database; they share its queue, each event subscription's position moved by one at a time."),
								gettext_noop("Each worker has its own eventgrid.max_concurrent_requests and eventgrid.max_bytes_in_flight; eventgrid.max_requests_per_endpoint bounds them all together."),
								&eg_delivery_workers, 1, 1, EG_MAX_DELIVERY_WORKERS,
								PGC_POSTMASTER, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.worker_idle_timeout",
							gettext_noop("How long a database's workers stay with nothing to do before they exit; work brings them back."),
							gettext_noop("While another database waits for a free worker slot, idle workers exit at once."),
							&eg_worker_idle_timeout_s, 120, 1, 24 * 3600,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.max_concurrent_requests",
							gettext_noop("Maximum number of HTTP delivery requests in flight at once."),
							NULL, &eg_max_concurrent_requests, 64, 1, EG_MAX_CONCURRENT_REQUESTS_LIMIT,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.response_timeout",
							gettext_noop("Time an endpoint has to answer a delivery request before the attempt counts as TimedOut."),
							gettext_noop("Event Grid waits 30 seconds."),
							&eg_response_timeout_ms, 30000, 100, 300000,
							PGC_SIGHUP, GUC_UNIT_MS, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.retry_jitter_percent",
							gettext_noop("Random extra delay added to each retry step, as a percentage of the step (0 to this value)."),
							NULL, &eg_retry_jitter_percent, 10, 0, 50,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.max_retry_after",
							gettext_noop("Longest Retry-After of an endpoint's answer that delays a retry; longer ones count as this long."),
							gettext_noop("A retry waits for the later of its schedule step and the answer's Retry-After (delta-seconds or HTTP-date), this at most. 0 ignores Retry-After."),
							&eg_max_retry_after_s, 3600, 0, 7 * 24 * 3600,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.clock_offset",
							gettext_noop("Shifts the delivery workers' clock forward, for tests and drills of the retry schedule."),
							gettext_noop("Leave at 0 in production."),
							&eg_clock_offset_s, 0, 0, 400 * 24 * 3600,
							PGC_SIGHUP, GUC_UNIT_S | GUC_SUPERUSER_ONLY, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.default_max_events_per_batch",
							gettext_noop("max_events_per_batch used when a subscription sets only preferred_batch_size_in_kilobytes."),
							NULL, &eg_default_max_events_per_batch, 10, 1, 5000,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.default_preferred_batch_size_in_kilobytes",
							gettext_noop("preferred_batch_size_in_kilobytes used when a subscription sets only max_events_per_batch."),
							NULL, &eg_default_preferred_batch_kb, 64, 1, 1024,
							PGC_SIGHUP, GUC_UNIT_KB, NULL, NULL, NULL);
	DefineCustomBoolVariable("eventgrid.delivery_paused",
							 gettext_noop("Pauses delivery: the worker finishes requests in flight and claims nothing new."),
							 gettext_noop("Publishing goes on; deliveries wait and their time-to-live keeps running."),
							 &eg_delivery_paused, false,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.max_bytes_in_flight",
							gettext_noop("Event bytes each delivery worker may hold at once: claimed, in flight, or awaiting their outcome."),
							gettext_noop("Bounds the worker's memory; an event larger than this still goes, alone."),
							&eg_max_bytes_in_flight_kb, 64 * 1024, 1024, 1024 * 1024,
							PGC_SIGHUP, GUC_UNIT_KB, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.max_requests_per_endpoint",
							gettext_noop("Maximum number of HTTP delivery requests in flight at once to one endpoint host (scheme, host and port)."),
							gettext_noop("Hosts take turns for the free connections; a host that hangs holds at most this many."),
							&eg_max_requests_per_endpoint, 32, 1, 1000,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.probation_failures",
							gettext_noop("Consecutive failed delivery attempts to an endpoint that put it on probation (delayed delivery)."),
							gettext_noop("Event Grid's example: the first 10 events to an endpoint all fail."),
							&eg_probation_failures, 10, 1, 1000,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.event_table_rotation",
							gettext_noop("How long each of the three event tables takes new events before the next one does."),
							gettext_noop("A table is emptied once everything has passed its events, so the queue holds about two of these periods of events."),
							&eg_event_table_rotation_s, 10, 1, 3600,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.event_retention",
							gettext_noop("How long an event table is kept after its turn ended, even when nothing needs its events any more."),
							gettext_noop("For a server whose events delivery servers receive by logical replication: after a failover, what they had not received is fed again from the event tables (README \"Scaling out\"). At most 5/3 of eventgrid.event_table_rotation counts (so the oldest table is still emptied before its next turn); 0 keeps nothing."),
							&eg_event_retention_s, 0, 0, 7200,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.replication_sync_wait",
							gettext_noop("How long a new logical replication slot of this database must have streamed before the event tables stop being kept for its subscriber's initial copy."),
							gettext_noop("A subscriber passes over the rows it is sent until its initial copy of eventgrid.events is done, and the copy starts only once the subscription streams: no event table is emptied while a slot has not streamed this long (README \"Scaling out\")."),
							&eg_replication_sync_wait_s, 300, 1, 86400,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomEnumVariable("eventgrid.attempt_history",
							 gettext_noop("Which delivery attempts the history (view eventgrid.delivery_attempts) keeps: all, failures or off."),
							 gettext_noop("failures keeps every attempt that did not deliver; off keeps none."),
							 &eg_attempt_history, EG_HISTORY_ALL, history_modes,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.attempt_history_retention",
							gettext_noop("How long the delivery attempt history keeps an attempt at least."),
							gettext_noop("Three tables take turns, each for half of this; an attempt is removed between one and one and a half times this after it was made."),
							&eg_attempt_history_retention_s, 24 * 3600, 120, 90 * 24 * 3600,
							PGC_SIGHUP, GUC_UNIT_S, NULL, NULL, NULL);
	DefineCustomIntVariable("eventgrid.attempt_history_max_rows",
							gettext_noop("How many delivery attempts the history keeps at least before the oldest are removed."),
							gettext_noop("A history table takes half of this many rows before the next one does; the history holds at most one and a half times this."),
							&eg_attempt_history_max_rows, 1000000, 1000, INT_MAX,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomStringVariable("eventgrid.webhook_request_origin",
							   gettext_noop("WebHook-Request-Origin of the CloudEvents endpoint validation handshake: who sends the events."),
							   gettext_noop("A DNS name or other printable text of at most 255 bytes; empty sends \"eventgrid\"."),
							   &eg_webhook_request_origin, "",
							   PGC_SIGHUP, 0, check_request_origin, NULL, NULL);
	DefineCustomStringVariable("eventgrid.ssl_ca_file",
							   gettext_noop("PEM file of the certificate authorities HTTPS endpoints are verified against; empty: the system's store."),
							   gettext_noop("Set it for receivers whose certificates a private CA signed. Certificates are always verified."),
							   &eg_ssl_ca_file, "",
							   PGC_SIGHUP, GUC_SUPERUSER_ONLY, check_ssl_ca_file, NULL, NULL);
#if PG_VERSION_NUM >= 150000
	MarkGUCPrefixReserved("eventgrid");
#else
	EmitWarningsOnPlaceholders("eventgrid");
#endif
}

void
_PG_init(void)
{
	BackgroundWorker worker;

	eg_define_gucs();

	if (!process_shared_preload_libraries_in_progress || IsBinaryUpgrade)
		return;

#if PG_VERSION_NUM >= 150000
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = eg_shmem_request;
#else
	eg_shmem_request();
#endif
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = eg_shmem_startup;

	prev_process_utility_hook = ProcessUtility_hook;
	ProcessUtility_hook = eg_process_utility;
	prev_emit_log_hook = emit_log_hook;
	emit_log_hook = eg_emit_log;

	/* the launcher starts each database's delivery workers and upkeep worker when it has work */
	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 5;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "eventgrid");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "eventgrid_launcher_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "eventgrid launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "eventgrid launcher");
	RegisterBackgroundWorker(&worker);
}

/*
 * See eventgrid.h.  The upkeep worker is told too: what woke the delivery
 * workers (events published, a validation to send, a subscription
 * changed) is upkeep's business as well.
 */
void
eg_wake_worker(void)
{
	eg_db_wake(MyDatabaseId, true, true);
}

/* See eventgrid.h. */
void
eg_want_upkeep(void)
{
	eg_db_wake(MyDatabaseId, false, true);
}

/* The database a DDL statement needs to itself (no other session connected), or InvalidOid. */
static Oid
database_needed(Node *stmt)
{
	ListCell   *lc;

	if (IsA(stmt, DropdbStmt))
		return get_database_oid(((DropdbStmt *) stmt)->dbname, true);
	if (IsA(stmt, RenameStmt) && ((RenameStmt *) stmt)->renameType == OBJECT_DATABASE)
		return get_database_oid(((RenameStmt *) stmt)->subname, true);
	if (IsA(stmt, AlterDatabaseStmt))
	{
		foreach(lc, ((AlterDatabaseStmt *) stmt)->options)
			if (strcmp(lfirst_node(DefElem, lc)->defname, "tablespace") == 0)
				return get_database_oid(((AlterDatabaseStmt *) stmt)->dbname, true);
	}
	if (IsA(stmt, CreatedbStmt))
	{
		foreach(lc, ((CreatedbStmt *) stmt)->options)
		{
			DefElem    *d = lfirst_node(DefElem, lc);

			if (strcmp(d->defname, "template") == 0 && d->arg != NULL)
				return get_database_oid(defGetString(d), true);
		}
	}
	return InvalidOid;
}

/* Is the current user the owner of database dboid (or a superuser)? */
static bool
owns_database(Oid dboid)
{
#if PG_VERSION_NUM >= 160000
	return object_ownercheck(DatabaseRelationId, dboid, GetUserId());
#else
	return pg_database_ownercheck(dboid, GetUserId());
#endif
}

/*
 * Will PostgreSQL run stmt, which needs database dboid to itself?  The
 * checks PostgreSQL makes before it looks for other sessions: the
 * transaction block (DROP DATABASE, CREATE DATABASE and ALTER DATABASE
 * ... SET TABLESPACE refuse one: PreventInTransactionBlock raises
 * PostgreSQL's own error here), the ownership of the database (DROP,
 * RENAME, SET TABLESPACE), the CREATEDB privilege (RENAME, CREATE), and
 * for a template that is not marked as one, its ownership.  false: the
 * statement fails, so the database's workers are not asked to leave for it.
 */
static bool
ddl_will_run(Node *stmt, Oid dboid, ProcessUtilityContext context)
{
	bool		top = context == PROCESS_UTILITY_TOPLEVEL;

	if (dboid == MyDatabaseId)
		return false;		/* PostgreSQL refuses the open database */
	if (IsA(stmt, DropdbStmt))
	{
		PreventInTransactionBlock(top, "DROP DATABASE");
		return owns_database(dboid);
	}
	if (IsA(stmt, RenameStmt))
		return owns_database(dboid) && have_createdb_privilege();
	if (IsA(stmt, AlterDatabaseStmt))
	{
		PreventInTransactionBlock(top, "ALTER DATABASE SET TABLESPACE");
		return owns_database(dboid);
	}
	if (IsA(stmt, CreatedbStmt))
	{
		HeapTuple	tup;
		bool		istemplate;

		PreventInTransactionBlock(top, "CREATE DATABASE");
		if (!have_createdb_privilege())
			return false;
		tup = SearchSysCache1(DATABASEOID, ObjectIdGetDatum(dboid));
		if (!HeapTupleIsValid(tup))
			return false;
		istemplate = ((Form_pg_database) GETSTRUCT(tup))->datistemplate;
		ReleaseSysCache(tup);
		return istemplate || owns_database(dboid);
	}
	return false;
}

/* Does stmt create, alter or drop extension eventgrid? */
static bool
changes_extension(Node *stmt)
{
	ListCell   *lc;

	if (IsA(stmt, CreateExtensionStmt))
		return strcmp(((CreateExtensionStmt *) stmt)->extname, "eventgrid") == 0;
	if (IsA(stmt, AlterExtensionStmt))
		return strcmp(((AlterExtensionStmt *) stmt)->extname, "eventgrid") == 0;
	if (IsA(stmt, DropStmt) && ((DropStmt *) stmt)->removeType == OBJECT_EXTENSION)
	{
		foreach(lc, ((DropStmt *) stmt)->objects)
			if (strcmp(strVal(lfirst(lc)), "eventgrid") == 0)
				return true;
	}
	return false;
}

/*
 * Utility statements eventgrid follows (in every backend, as the library is
 * preloaded):
 *  - DROP DATABASE, ALTER DATABASE ... RENAME TO / SET TABLESPACE and
 *    CREATE DATABASE ... TEMPLATE need their database to themselves: when
 *    PostgreSQL's own checks let the statement run (ddl_will_run), its
 *    workers leave first (eg_db_hold_for_ddl), so eventgrid never makes it
 *    wait, and come back as soon as the statement ends, failed or not (a
 *    dropped database's slot is let go at commit, which follows DROP
 *    DATABASE at once: it runs in no transaction block);
 *  - CREATE, ALTER and DROP EXTENSION eventgrid: once committed, the
 *    launcher looks at the database again at once;
 *  - COMMIT PREPARED runs in a session that may never have published, so
 *    the commit callback of the publishing transaction cannot wake the
 *    workers: they are woken after every COMMIT PREPARED instead (an idle
 *    worker finds nothing new).
 */
static void
eg_process_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
				   ProcessUtilityContext context, ParamListInfo params,
				   QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *stmt = pstmt->utilityStmt;
	bool		commit_prepared = IsA(stmt, TransactionStmt) &&
		((TransactionStmt *) stmt)->kind == TRANS_STMT_COMMIT_PREPARED;
	Oid			needed = database_needed(stmt);

	if (OidIsValid(needed) && !ddl_will_run(stmt, needed, context))
		needed = InvalidOid;
	if (OidIsValid(needed))
	{
		register_xact_callback();
		eg_db_hold_for_ddl(needed);
	}
	if (changes_extension(stmt))
	{
		register_xact_callback();
		extension_changed_at_commit = true;
	}
	PG_TRY();
	{
		if (prev_process_utility_hook)
			prev_process_utility_hook(pstmt, queryString, readOnlyTree, context, params,
									  queryEnv, dest, qc);
		else
			standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params,
									queryEnv, dest, qc);
	}
	PG_CATCH();
	{
		if (OidIsValid(needed))
			eg_db_release_holds(false);
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (OidIsValid(needed) && IsA(stmt, DropdbStmt))
		dropped_at_commit = true;
	else if (OidIsValid(needed))
		eg_db_release_holds(false);
	if (commit_prepared)
		eg_wake_worker();
}

/*
 * eventgrid's one clock for what it writes about deliveries (attempts, next
 * attempts, dead letters, publish times, truncations): the real clock moved
 * ahead by eventgrid.clock_offset (0 in production).
 */
TimestampTz
eg_now(void)
{
	return GetCurrentTimestamp() + (TimestampTz) eg_clock_offset_s * USECS_PER_SEC;
}

/* The same clock at the start of the current transaction (publish times). */
TimestampTz
eg_transaction_now(void)
{
	return GetCurrentTransactionStartTimestamp() + (TimestampTz) eg_clock_offset_s * USECS_PER_SEC;
}

PG_FUNCTION_INFO_V1(eventgrid_now);

/*
 * SQL: eventgrid._now(), eg_transaction_now(): now() moved ahead by
 * eventgrid.clock_offset, for the times SQL writes about deliveries
 * (dead_letters.dead_lettered_at, the retries redeliver_dead_letters()
 * queues).  STABLE, like now().
 */
Datum
eventgrid_now(PG_FUNCTION_ARGS)
{
	PG_RETURN_TIMESTAMPTZ(eg_transaction_now());
}

static void
eg_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
			if (subscriptions_changed_at_commit)
			{
				EgDbSlot   *db = eg_db_find(MyDatabaseId, true);

				if (db != NULL)
				{
					SpinLockAcquire(&eg_shared->mutex);
					if (db->dboid == MyDatabaseId)
					{
						db->change_generation++;
						db->no_subscriptions = false;
					}
					SpinLockRelease(&eg_shared->mutex);
				}
			}
			if (publications_changed_at_commit && eg_shared != NULL)
				pg_atomic_fetch_add_u64(&eg_shared->publications_generation, 1);
			if (wake_at_commit)
				eg_wake_worker();
			else if (events_at_commit)
				eg_db_wake_for_events(MyDatabaseId);
			if (extension_changed_at_commit)
				eg_db_extension_changed(MyDatabaseId);
			eg_db_release_holds(dropped_at_commit);
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			eg_db_release_holds(false);
			break;
		default:
			return;
	}
	wake_at_commit = false;
	events_at_commit = false;
	publications_changed_at_commit = false;
	subscriptions_changed_at_commit = false;
	extension_changed_at_commit = false;
	dropped_at_commit = false;
}

PG_FUNCTION_INFO_V1(eventgrid_wake_worker_at_commit);

/* The commit callback, registered once per backend. */
static void
register_xact_callback(void)
{
	if (!xact_callback_registered)
	{
		RegisterXactCallback(eg_xact_callback, NULL);
		xact_callback_registered = true;
	}
}

/*
 * Sets the delivery workers' latches once when the current transaction
 * commits (or asks the launcher for them); no-op when not preloaded.  See
 * eventgrid.h.
 */
void
eg_wake_worker_at_commit(void)
{
	register_xact_callback();
	wake_at_commit = true;
}

/*
 * SQL: eventgrid._wake_worker_at_commit().  Called by the fan-out trigger:
 * sets the delivery workers' latches once when the current transaction
 * commits, so new deliveries start at once.  No-op when not preloaded.
 */
Datum
eventgrid_wake_worker_at_commit(PG_FUNCTION_ARGS)
{
	eg_wake_worker_at_commit();
	PG_RETURN_VOID();
}

/* See eventgrid.h. */
void
eg_wake_for_events_at_commit(void)
{
	register_xact_callback();
	events_at_commit = true;
}

PG_FUNCTION_INFO_V1(eventgrid_wake_at_commit);

/*
 * Trigger function eventgrid._wake_at_commit(): AFTER INSERT FOR EACH
 * STATEMENT on eventgrid.events: when the publishing transaction commits,
 * the delivery workers are woken (or started), unless the database has no
 * event subscription, and the upkeep worker is told (SPEC 2).
 */
Datum
eventgrid_wake_at_commit(PG_FUNCTION_ARGS)
{
	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("eventgrid._wake_at_commit() must be called as a trigger")));
	eg_wake_for_events_at_commit();
	return PointerGetDatum(NULL);
}

/* See eventgrid.h. */
uint64
eg_publications_generation(void)
{
	uint64		shared = eg_shared ? pg_atomic_read_u64(&eg_shared->publications_generation) : 0;

	return shared + local_publications_changes;
}

PG_FUNCTION_INFO_V1(eventgrid_table_publications_changed);

/*
 * Trigger function eventgrid._table_publications_changed(): AFTER INSERT,
 * UPDATE, DELETE or TRUNCATE FOR EACH STATEMENT on
 * eventgrid.table_publications: what table change triggers keep of the
 * publications is stale, in this backend at once and everywhere when the
 * transaction commits (eg_publications_generation()).
 */
Datum
eventgrid_table_publications_changed(PG_FUNCTION_ARGS)
{
	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("eventgrid._table_publications_changed() must be called as a trigger")));
	register_xact_callback();
	publications_changed_at_commit = true;
	local_publications_changes++;
	return PointerGetDatum(NULL);
}

PG_FUNCTION_INFO_V1(eventgrid_subscriptions_changed_at_commit);
PG_FUNCTION_INFO_V1(eventgrid_pauses_changed_at_commit);

/*
 * SQL: eventgrid._subscriptions_changed_at_commit(), called by
 * pause_delivery(), resume_delivery(), update_event_subscription(),
 * drop_event_subscription() and drop_topic(): when the transaction
 * commits, the delivery workers are told (eg_shared->change_generation)
 * and woken; they put back unsent what they claimed for a subscription now
 * paused, dropped or sent elsewhere, and their status lines read the
 * pauses again.  eventgrid_pauses_changed_at_commit is its name in 0.8.0's
 * scripts.  No-op when not preloaded.
 */
Datum
eventgrid_subscriptions_changed_at_commit(PG_FUNCTION_ARGS)
{
	if (eg_shared == NULL)
		PG_RETURN_VOID();
	eg_wake_worker_at_commit();
	subscriptions_changed_at_commit = true;
	PG_RETURN_VOID();
}

Datum
eventgrid_pauses_changed_at_commit(PG_FUNCTION_ARGS)
{
	return eventgrid_subscriptions_changed_at_commit(fcinfo);
}

PG_FUNCTION_INFO_V1(eventgrid_log);

/*
 * SQL: eventgrid._log(message): a LOG line without the STATEMENT and
 * CONTEXT lines PL/pgSQL's RAISE LOG would add (the statement may name a
 * secret endpoint URL).
 */
Datum
eventgrid_log(PG_FUNCTION_ARGS)
{
	ereport(LOG, (errmsg("%s", text_to_cstring(PG_GETARG_TEXT_PP(0))), errhidestmt(true), errhidecontext(true)));
	PG_RETURN_VOID();
}

/*
 * Which event table (0, 1 or 2) a transaction that started at ts appends
 * to: they take turns every eventgrid.event_table_rotation seconds.
 */
int
eg_event_table_at(TimestampTz ts)
{
	int64		period = (int64) eg_event_table_rotation_s * USECS_PER_SEC;

	return (int) (((ts / period) % EG_EVENT_TABLES + EG_EVENT_TABLES) % EG_EVENT_TABLES);
}

/*
 * When event table k's last turn ended, seen at ts (k not the table of ts):
 * the table before the current one ended when the current turn began, the
 * one before that a period earlier.
 */
TimestampTz
eg_event_table_turn_end(int k, TimestampTz ts)
{
	int64		period = (int64) eg_event_table_rotation_s * USECS_PER_SEC;
	TimestampTz turn_start = ts - ((ts % period) + period) % period;
	int			behind = ((eg_event_table_at(ts) - k) % EG_EVENT_TABLES + EG_EVENT_TABLES) % EG_EVENT_TABLES;

	return turn_start - (TimestampTz) (behind - 1) * period;
}

/* See eventgrid.h. */
void
eg_worker_spec(BackgroundWorker *worker, const char *function, const char *type, Oid dboid,
			   const char *dbname, int number)
{
	memset(worker, 0, sizeof(*worker));
	worker->bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker->bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker->bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker->bgw_library_name, BGW_MAXLEN, "eventgrid");
	snprintf(worker->bgw_function_name, BGW_MAXLEN, "%s", function);
	if (number > 0 && eg_delivery_workers > 1)
		snprintf(worker->bgw_name, BGW_MAXLEN, "eventgrid %s %d [%s]", type, number, dbname);
	else
		snprintf(worker->bgw_name, BGW_MAXLEN, "eventgrid %s [%s]", type, dbname);
	snprintf(worker->bgw_type, BGW_MAXLEN, "eventgrid %s", type);
	worker->bgw_main_arg = ObjectIdGetDatum(dboid);
	memcpy(worker->bgw_extra, &number, sizeof(number));
	worker->bgw_notify_pid = MyProcPid;
}

PG_FUNCTION_INFO_V1(eventgrid_event_table);

/*
 * SQL: eventgrid._event_table(), the default of events.event_table: the
 * event table of the current transaction's start time.  Every row of a
 * transaction goes to the same table.
 */
Datum
eventgrid_event_table(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT16((int16) eg_event_table_at(GetCurrentTransactionStartTimestamp()));
}

/*
 * Is the object that "permission denied for <kind> <name>" names one of
 * eventgrid's (a relation or function in schema eventgrid)?  Syscache
 * look-ups only: called from the error hook, inside the failing transaction.
 */
static bool
eventgrid_object(const char *message, const char *name)
{
	Oid			nsp = get_namespace_oid("eventgrid", true);
	bool		found = false;

	if (!OidIsValid(nsp))
		return false;
	if (strstr(message, "for function ") != NULL || strstr(message, "for procedure ") != NULL)
	{
		CatCList   *list = SearchSysCacheList1(PROCNAMEARGSNSP, CStringGetDatum(name));

		for (int i = 0; i < list->n_members && !found; i++)
			found = ((Form_pg_proc) GETSTRUCT(&list->members[i]->tuple))->pronamespace == nsp;
		ReleaseSysCacheList(list);
		return found;
	}
	return OidIsValid(get_relname_relid(name, nsp));
}

/* Does s contain needle, ignoring ASCII case?  (Queries may be large: no copy.) */
static bool
contains_ci(const char *s, const char *needle)
{
	size_t		n = strlen(needle);

	for (; *s; s++)
		if (pg_strncasecmp(s, needle, n) == 0)
			return true;
	return false;
}

/*
 * The columns of eventgrid's relation relname that role may use for mode
 * (ACL_INSERT, ACL_SELECT) by column privileges, comma-separated, or NULL
 * when there are none (or the relation is not found).  Syscache look-ups
 * only: called from the error hook, inside the failing transaction.
 */
static char *
granted_columns(const char *relname, Oid role, AclMode mode)
{
	Oid			nsp = get_namespace_oid("eventgrid", true);
	Oid			relid = OidIsValid(nsp) ? get_relname_relid(relname, nsp) : InvalidOid;
	StringInfoData cols;

	if (!OidIsValid(relid))
		return NULL;
	initStringInfo(&cols);
	/* user columns are numbered 1, 2, ... with no gap (dropped ones keep their row) */
	for (AttrNumber a = 1;; a++)
	{
		HeapTuple	tup = SearchSysCache2(ATTNUM, ObjectIdGetDatum(relid), Int16GetDatum(a));
		Form_pg_attribute att;

		if (!HeapTupleIsValid(tup))
			break;
		att = (Form_pg_attribute) GETSTRUCT(tup);
		if (!att->attisdropped && pg_attribute_aclcheck(relid, a, role, mode) == ACLCHECK_OK)
			appendStringInfo(&cols, "%s%s", cols.len ? ", " : "", NameStr(att->attname));
		ReleaseSysCache(tup);
	}
	if (cols.len == 0)
	{
		pfree(cols.data);
		return NULL;
	}
	return cols.data;
}

/* The start of the context frame after the one at line (NULL: it is the last). */
static const char *
next_frame(const char *line)
{
	static const char *const starts[] = {"PL/pgSQL function ", "SQL statement \"", "SQL function \""};

	for (const char *nl = strchr(line, '\n'); nl != NULL; nl = strchr(nl + 1, '\n'))
		for (int i = 0; i < (int) lengthof(starts); i++)
			if (strncmp(nl + 1, starts[i], strlen(starts[i])) == 0)
				return nl + 1;
	return NULL;
}

/*
 * An error a user caused inside eventgrid's PL/pgSQL functions (a bad
 * argument, a missing topic, an event the publish trigger refuses) carries
 * CONTEXT frames naming eventgrid's own helpers ("PL/pgSQL function
 * eventgrid._check_range(...) line 4 at RAISE") and the statements they
 * ran ("SQL statement \"WITH stored AS (INSERT INTO eventgrid.events
 * ..."), each statement of as many lines as its text.  Those frames are
 * dropped: the leading run of frames that are eventgrid's PL/pgSQL
 * functions or statements run inside them, up to the last of eventgrid's
 * frames in the run; the frames of the caller's own functions, after them,
 * stay.  Errors of the internal classes (XX, 53, 57, 58) keep their
 * context, which tells where to look.  SQLSTATE, message, DETAIL and HINT
 * are unchanged.
 */
static void
drop_internal_context(ErrorData *edata)
{
	const char *ours = "PL/pgSQL function eventgrid.";
	int			class = ERRCODE_TO_CATEGORY(edata->sqlerrcode);
	const char *frame;
	const char *keep_from = NULL;

	if (edata->context == NULL || edata->elevel < ERROR ||
		class == ERRCODE_TO_CATEGORY(ERRCODE_INTERNAL_ERROR) ||
		class == ERRCODE_TO_CATEGORY(ERRCODE_INSUFFICIENT_RESOURCES) ||
		class == ERRCODE_TO_CATEGORY(ERRCODE_OPERATOR_INTERVENTION) ||
		class == ERRCODE_TO_CATEGORY(ERRCODE_SYSTEM_ERROR))
		return;
	for (frame = edata->context; frame != NULL && *frame != '\0'; frame = next_frame(frame))
	{
		if (strncmp(frame, ours, strlen(ours)) == 0)
			keep_from = next_frame(frame);
		else if (strncmp(frame, "SQL statement \"", 15) != 0)
			break;
		if (keep_from == NULL && strncmp(frame, ours, strlen(ours)) == 0)
		{
			edata->context = NULL;	/* every frame was ours */
			return;
		}
	}
	if (keep_from != NULL)
		edata->context = pstrdup(keep_from);
}

/*
 * PostgreSQL's own "permission denied for table events" or "... for function
 * create_topic" names no role.  For such an error (42501 from the privilege
 * check) about one of eventgrid's objects, in a statement that names
 * eventgrid.*, add a hint saying which of eventgrid's roles to grant, or,
 * for a role that may use some of the table's columns (a publisher
 * inserting a column eventgrid sets, or reading a table it may read only in
 * part), which columns it may use.  Only the hint is added; the error is
 * unchanged.  Runs in backends that loaded the library at start
 * (shared_preload_libraries), for errors that reach the server log;
 * drop_internal_context() first.
 */
static void
eg_emit_log(ErrorData *edata)
{
	const char *object;
	const char *user = NULL;
	char	   *cols = NULL;
	bool		inserting;
	bool		admin;

	if (prev_emit_log_hook)
		prev_emit_log_hook(edata);
	drop_internal_context(edata);
	/* a worker's lines name its database (several are served) */
	if (eg_log_database != NULL && edata->message != NULL && edata->output_to_server &&
		strstr(edata->message, "database \"") == NULL)
		edata->message = psprintf("%s (database \"%s\")", edata->message, eg_log_database);
	if (edata->elevel < ERROR || edata->sqlerrcode != ERRCODE_INSUFFICIENT_PRIVILEGE ||
		edata->hint != NULL || edata->message_id == NULL || edata->message == NULL ||
		strncmp(edata->message_id, "permission denied for ", 22) != 0 ||
		debug_query_string == NULL || !contains_ci(debug_query_string, "eventgrid."))
		return;

	object = strrchr(edata->message, ' ');
	object = object ? object + 1 : edata->message;
	if (!IsTransactionState() || !eventgrid_object(edata->message, object))
		return;
	inserting = strcmp(object, "events") == 0 && contains_ci(debug_query_string, "insert");
	user = GetUserNameFromId(GetUserId(), true);
	if (object[0] != '_' && strstr(edata->message, "for table ") != NULL)
		cols = granted_columns(object, GetUserId(), inserting ? ACL_INSERT : ACL_SELECT);
	if (user == NULL)
		user = "<role>";
	admin = OidIsValid(get_role_oid("eventgrid_admin", true)) &&
		has_privs_of_role(GetUserId(), get_role_oid("eventgrid_admin", true));
	if (strcmp(object, "served_databases") == 0 || strcmp(object, "_served_databases") == 0)
		edata->hint = psprintf("The launcher's view of every database is for superusers and members of pg_monitor: GRANT pg_monitor TO %s;",
							   quote_identifier(user));
	else if (object[0] == '_')
		edata->hint = pstrdup("Functions whose names start with an underscore are eventgrid's internals; they are not meant to be called directly.");
	else if (inserting && cols != NULL)
		edata->hint = psprintf("Role %s may set only these columns of eventgrid.events: %s; eventgrid sets the others. Write INSERT INTO eventgrid.events (%s) VALUES (...), without OVERRIDING SYSTEM VALUE.",
							   quote_identifier(user), cols, cols);
	else if (inserting)
		edata->hint = psprintf("Publishing requires the role eventgrid_publisher: GRANT eventgrid_publisher TO %s;",
							   quote_identifier(user));
	else if (cols != NULL)
		edata->hint = psprintf("Role %s may read only these columns of eventgrid.%s: %s; name them instead of *, or read it as a member of eventgrid_admin.",
							   quote_identifier(user), object, cols);
	else if (admin)
	{
		/* what a member of eventgrid_admin may not do: read secrets, write tables directly */
		static const char *const masked[][2] = {
			{"delivery_properties", "event_subscription_delivery_properties"},
			{"signing_secrets", "event_subscription_signing"},
			{"endpoint_validations", "event_subscription_validation"},
		};

		for (int i = 0; i < (int) lengthof(masked) && edata->hint == NULL; i++)
			if (strcmp(object, masked[i][0]) == 0)
				edata->hint = psprintf("eventgrid.%s holds secrets and is readable only by the extension's owner; read eventgrid.%s, which shows them masked.",
									   masked[i][0], masked[i][1]);
		if (edata->hint == NULL)
			edata->hint = pstrdup("Members of eventgrid_admin change eventgrid's tables through its functions (create_topic(), create_event_subscription(), ...), not directly; only dead_letters may be deleted from.");
	}
	else
		edata->hint = psprintf("Configuring eventgrid and reading its tables, statistics and dead letters requires the role eventgrid_admin: GRANT eventgrid_admin TO %s;",
							   quote_identifier(user));
}

PG_FUNCTION_INFO_V1(eventgrid_check_install_database);

/*
 * SQL: eventgrid._check_install_database(), run first by the install
 * script.  Preloaded, every database where the extension is created is
 * served (before 0.9.0 only eventgrid.database_name was).  Not preloaded,
 * installing works and a WARNING says that nothing is delivered until the
 * library is preloaded.
 */
Datum
eventgrid_check_install_database(PG_FUNCTION_ARGS)
{
	if (IsBinaryUpgrade)
		PG_RETURN_VOID();

	/*
	 * A WARNING, not a NOTICE: CREATE EXTENSION raises client_min_messages
	 * to WARNING while its script runs, so a NOTICE would never be seen.
	 */
	if (eg_shared == NULL)
		ereport(WARNING,
				(errmsg("eventgrid is not in shared_preload_libraries: events are stored but not delivered until it is"),
				 errdetail("Once preloaded, the delivery workers serve every database where the extension is created."),
				 errhint("Add eventgrid to shared_preload_libraries in postgresql.conf and restart the server.")));
	PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(eventgrid_worker_pids);

/*
 * SQL: eventgrid._worker_pids() -> SETOF (worker text, pid integer): each
 * delivery worker ("delivery worker 1" to eventgrid.delivery_workers) and
 * the upkeep worker of the current database, with the pid in its shared
 * slot, NULL when it is not running (or the library is not preloaded).  A
 * slot is set by the worker only once its exit callback is registered and
 * cleared by that callback, so a pid here is a running process.
 */
Datum
eventgrid_worker_pids(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	pid_t		pids[EG_MAX_DELIVERY_WORKERS + 1] = {0};
	EgDbSlot   *db = eg_shared ? eg_db_find(MyDatabaseId, false) : NULL;

	InitMaterializedSRF(fcinfo, 0);
	if (db != NULL)
	{
		SpinLockAcquire(&eg_shared->mutex);
		if (db->dboid == MyDatabaseId)
		{
			memcpy(pids, db->worker_pid, sizeof(db->worker_pid));
			pids[EG_MAX_DELIVERY_WORKERS] = db->upkeep_pid;
		}
		SpinLockRelease(&eg_shared->mutex);
	}
	for (int i = 0; i <= eg_delivery_workers; i++)
	{
		int			slot = i < eg_delivery_workers ? i : EG_MAX_DELIVERY_WORKERS;
		Datum		values[2];
		bool		nulls[2] = {false, pids[slot] == 0};

		values[0] = CStringGetTextDatum(i < eg_delivery_workers ? psprintf("delivery worker %d", i + 1)
										: "upkeep worker");
		values[1] = Int32GetDatum((int32) pids[slot]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
