/*
 * worker.c - what the delivery workers (delivery_worker.c) and the upkeep
 * worker (upkeep_worker.c) share: start-up, with the settings their
 * statements depend on pinned and the process's pid published in its
 * database's shared slot only once the exit callback that clears it is
 * registered; leaving when idle or asked to, and saying when the
 * database wants the worker again;
 * the top of each loop round; units of database work; and recovery from
 * any ERROR, after which the failed unit is tried again after a pause that
 * grows to 10 s (the error is logged once, not at every try).  SIGINT
 * (pg_cancel_backend) cancels the statement running, nothing more.
 */
#include "store/worker.h"
#include "store/store.h"

#include "access/xact.h"
#include "commands/dbcommands.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/pmsignal.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/timeout.h"
#include "utils/timestamp.h"

#define EG_WORK_MEM "64MB"		/* the workers' work_mem: see eg_pin_settings() */
#define EG_LOCK_TIMEOUT "10s"
#define EG_NOT_READY_RETRY_MS 10000 /* extension missing, or of another version */
#define EG_ERROR_BACKOFF_MIN_MS 100
#define EG_ERROR_BACKOFF_MAX_MS 10000

const char *eg_worker_kind = "delivery worker";
MemoryContext eg_round_cxt = NULL;
int			eg_error_streak = 0;
TimestampTz eg_db_retry_at = 0;
uint64		eg_units_committed = 0;

static char *last_error = NULL;
static long error_backoff_ms = 0;
static int	my_number = -1;		/* 1..: delivery worker; 0: the upkeep worker */
static bool leaving_on_purpose = false;
static uint64 seen_wakes = 0;	/* eg_my_db->wakes when this worker last looked for work */

/*
 * Settings the worker's statements depend on, set here so that database
 * and role defaults (ALTER DATABASE ... SET, ALTER ROLE ... SET) cannot
 * change them: a search_path with only pg_catalog and pg_temp (last), so no
 * function or operator anyone created can run in place of the built-in one;
 * writable READ COMMITTED transactions; no statement or idle timeout; a
 * lock timeout of its own, so a lock held elsewhere delays the worker's
 * work without stopping HTTP.
 *
 * Plans: queue tables swing between empty and large.  After a VACUUM finds
 * one empty, the planner takes it for empty until the next ANALYZE and the
 * cached plans scan every page of it on each statement (measured: drain
 * rate 18,000 -> 2,800 events/s after a steady run), or bitmap-scan and
 * sort every due row to take the first thousand, so that each claim costs
 * the whole backlog.  Every statement of this worker has a plain index
 * path, so sequential and bitmap scans are ruled out here.
 *
 * Memory: the due-retry claim sorts its rows (up to 1,000) with their JSON
 * text; at the default work_mem of 4 MB a thousand 1-KB events already
 * spill to disk, and EG_WORK_MEM keeps such a claim in memory.  A
 * first-attempt claim sorts nothing wide in SQL: its rows are put in order
 * in C.
 */
void
eg_pin_settings(void)
{
	static const char *const settings[][2] = {
		{"search_path", "pg_catalog, pg_temp"},
		{"default_transaction_read_only", "off"},
		{"default_transaction_isolation", "read committed"},
		{"default_transaction_deferrable", "off"},
		{"session_replication_role", "origin"},
		{"statement_timeout", "0"},
		{"idle_in_transaction_session_timeout", "0"},
		{"lock_timeout", EG_LOCK_TIMEOUT},
		{"synchronous_commit", "on"},
		{"jit", "off"},
		{"work_mem", EG_WORK_MEM},
		{"enable_seqscan", "off"},
		{"enable_bitmapscan", "off"},
	};

	for (int i = 0; i < (int) lengthof(settings); i++)
		SetConfigOption(settings[i][0], settings[i][1], PGC_SUSET, PGC_S_OVERRIDE);
}

/*
 * Error recovery, entered through longjmp from any ERROR in the loop: the
 * failed unit of work is rolled back and the loop goes on.  Requests in
 * HTTP and outcomes decided but not recorded are untouched; drop_partial
 * (if any) drops what the unit was building in memory.  The error is
 * logged the first time; the same error again is not.
 */
void
eg_recover_from_error(void (*drop_partial) (void))
{
	ErrorData  *edata;
	bool		repeated;

	error_context_stack = NULL;
	HOLD_INTERRUPTS();
	disable_all_timeouts(false);
	QueryCancelPending = false;

	MemoryContextSwitchTo(TopMemoryContext);
	edata = CopyErrorData();
	repeated = last_error != NULL && edata->message != NULL && strcmp(last_error, edata->message) == 0;
	if (!repeated)
	{
		EmitErrorReport();
		if (last_error)
			pfree(last_error);
		last_error = pstrdup(edata->message ? edata->message : "");
	}
	FreeErrorData(edata);
	FlushErrorState();

	AbortCurrentTransaction();
	if (drop_partial)
		drop_partial();
	pgstat_report_activity(STATE_IDLE, NULL);

	eg_error_streak++;
	error_backoff_ms = Min(Max(error_backoff_ms * 2, EG_ERROR_BACKOFF_MIN_MS), EG_ERROR_BACKOFF_MAX_MS);
	eg_db_retry_at = GetCurrentTimestamp() + (TimestampTz) error_backoff_ms * 1000;
	if (!repeated)
		ereport(LOG,
				(errmsg("eventgrid: the %s will try that again in %ld ms; requests in flight and recorded outcomes are kept",
						eg_worker_kind, error_backoff_ms)));
	MemoryContextSwitchTo(eg_round_cxt);
	RESUME_INTERRUPTS();
}

/* This process's pid slot in its database's slot (under the mutex). */
static pid_t *
my_pid_slot(void)
{
	return my_number == 0 ? &eg_my_db->upkeep_pid : &eg_my_db->worker_pid[my_number - 1];
}

/*
 * Exit callback: the process's pid slot and latch no longer name it, and
 * whether it left on purpose (an idle worker, or one asked to leave) is
 * kept for the launcher, which restarts a worker that failed only after a
 * pause.  Commits that asked for delivery after the worker last looked
 * want it back at once.
 */
static void
clear_slot(int code, Datum arg)
{
	SpinLockAcquire(&eg_shared->mutex);
	if (*my_pid_slot() == MyProcPid)
	{
		*my_pid_slot() = 0;
		if (my_number == 0)
			eg_my_db->upkeep_latch = NULL;
		else
			eg_my_db->worker_latch[my_number - 1] = NULL;
		eg_my_db->clean_exit[my_number] = leaving_on_purpose;
		/* one that did not leave on purpose may have left work: wanted again (after a pause) */
		if (my_number > 0 && (eg_my_db->wakes != seen_wakes || !leaving_on_purpose))
			eg_my_db->delivery_at = 0;
		if (my_number == 0 && (eg_my_db->upkeep_wanted || !leaving_on_purpose))
			eg_my_db->upkeep_at = 0;
	}
	SpinLockRelease(&eg_shared->mutex);
	eg_wake_launcher();
}

/*
 * What both workers do first: signal handlers (SIGINT cancels only the
 * statement running), a connection to database dboid, the pinned settings,
 * the names shown in pg_stat_activity and logged (which name the
 * database), and the process's pid and latch in its database's slot (a
 * delivery worker's worker_pid entry, or upkeep_pid).
 */
void
eg_worker_start(Datum dboid, const char *kind, int number)
{
	const char *dbname;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	pqsignal(SIGINT, StatementCancelHandler);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnectionByOid(DatumGetObjectId(dboid), InvalidOid, 0);
	StartTransactionCommand();
	dbname = MemoryContextStrdup(TopMemoryContext, get_database_name(MyDatabaseId));
	CommitTransactionCommand();
	eg_worker_kind = number > 0 && eg_delivery_workers > 1 ? psprintf("%s %d", kind, number) : kind;
	pgstat_report_appname(psprintf("eventgrid %s [%s]", eg_worker_kind, dbname));
	eg_log_database = dbname;
	eg_pin_settings();
	eg_round_cxt = AllocSetContextCreate(TopMemoryContext, "eventgrid round", ALLOCSET_DEFAULT_SIZES);

	eg_my_db = eg_db_find(MyDatabaseId, true);
	if (eg_my_db == NULL)
		proc_exit(0);			/* every slot taken (logged); the launcher does not start one then */
	my_number = number;

	/*
	 * The slot is published only once the callback that clears it is
	 * registered: a start that fails later still leaves no stale pid.
	 */
	before_shmem_exit(clear_slot, (Datum) 0);
	SpinLockAcquire(&eg_shared->mutex);
	*my_pid_slot() = MyProcPid;
	if (number == 0)
		eg_my_db->upkeep_latch = MyLatch;
	else
		eg_my_db->worker_latch[number - 1] = MyLatch;
	namestrcpy(&eg_my_db->name, dbname);
	seen_wakes = eg_my_db->wakes;
	SpinLockRelease(&eg_shared->mutex);
}

/*
 * A delivery worker is about to look for work: commits that asked for
 * delivery up to now are covered by this look.
 */
void
eg_worker_saw_wakes(void)
{
	SpinLockAcquire(&eg_shared->mutex);
	seen_wakes = eg_my_db->wakes;
	SpinLockRelease(&eg_shared->mutex);
}

/* This worker had work now: its database is active. */
void
eg_worker_busy(void)
{
	TimestampTz now = GetCurrentTimestamp();

	SpinLockAcquire(&eg_shared->mutex);
	eg_my_db->last_active = now;
	SpinLockRelease(&eg_shared->mutex);
}

/*
 * Should a worker that has been idle since idle_since (0: it is not idle)
 * leave now?  When its database asks it to (DDL, or another database's
 * turn), when it has been idle for eventgrid.worker_idle_timeout, or at
 * once when idle while another database waits for a worker slot.
 */
bool
eg_worker_should_leave(TimestampTz idle_since)
{
	bool		leave;
	bool		short_of_slots;

	SpinLockAcquire(&eg_shared->mutex);
	leave = eg_my_db->leave;
	short_of_slots = eg_shared->slots_short;
	SpinLockRelease(&eg_shared->mutex);
	if (leave)
		return true;
	if (idle_since == 0)
		return false;
	return short_of_slots ||
		GetCurrentTimestamp() - idle_since >= (TimestampTz) eg_worker_idle_timeout_s * USECS_PER_SEC;
}

/*
 * Leaves on purpose: wanted again at next_at (DT_NOEND: when work comes;
 * 0: at once, it left with work to do), which the launcher keeps in the
 * database's slot.
 */
void
eg_worker_leave(TimestampTz next_at)
{
	if (next_at != DT_NOEND)
		eg_db_want(eg_my_db, my_number == 0, next_at);
	leaving_on_purpose = true;
	ereport(DEBUG1, (errmsg("eventgrid: the %s leaves", eg_worker_kind)));
	proc_exit(0);
}

/*
 * What both workers do at the top of each loop round: fresh scratch memory,
 * interrupts, exit with the postmaster, configuration reload.  Returns
 * whether the configuration was reloaded.
 */
bool
eg_begin_round(void)
{
	MemoryContextSwitchTo(eg_round_cxt);
	MemoryContextReset(eg_round_cxt);
	CHECK_FOR_INTERRUPTS();
	if (!PostmasterIsAlive())
		proc_exit(1);
	if (!ConfigReloadPending)
		return false;
	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);	/* pinned settings outrank the file */
	return true;
}

/*
 * Opens a unit of database work; false (nothing open) when the extension is
 * missing or of another version, and then no database work for a while.
 */
bool
eg_begin_work(const char *activity)
{
	if (eg_store_begin(activity))
		return true;
	MemoryContextSwitchTo(eg_round_cxt);
	eg_db_retry_at = GetCurrentTimestamp() + (TimestampTz) EG_NOT_READY_RETRY_MS * 1000;
	return false;
}

/* Commits a unit of work; a run of failed tries before it is over. */
void
eg_end_work(void)
{
	eg_store_commit();
	eg_units_committed++;
	MemoryContextSwitchTo(eg_round_cxt);
	if (eg_error_streak > 0)
		ereport(LOG,
				(errmsg("eventgrid: the %s's database work succeeds again after %d failed tries",
						eg_worker_kind, eg_error_streak)));
	eg_error_streak = 0;
	error_backoff_ms = 0;
	if (last_error)
		pfree(last_error);
	last_error = NULL;
}

