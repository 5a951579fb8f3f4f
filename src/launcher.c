/*
 * launcher.c - the eventgrid launcher: a background worker connected to no
 * database that starts the delivery workers (delivery_worker.c; as many as
 * eventgrid.delivery_workers) and the upkeep worker (upkeep_worker.c) in
 * the database named by eventgrid.database_name, and starts each again
 * when it exits.
 *
 * Why a launcher: a background worker that connects to a missing database
 * dies with FATAL and the postmaster restarts it every few seconds, filling
 * the log without naming the setting at fault.  The launcher reads
 * pg_database (a shared catalog) instead, says once which GUC names a
 * missing database, and looks again with growing pauses; when a worker
 * exits (an ERROR it could not handle, the database dropped, SIGTERM) it is
 * restarted after a pause that grows while it keeps exiting soon after
 * starting, each worker on its own.  Each worker runs as one process at a
 * time: the launcher starts it only once its previous process is gone, as
 * the handle it got says or, for a worker it did not start (an earlier
 * launcher's), as the worker's shared pid slot says (set and cleared by the
 * worker itself, so never a stale or reused pid).  A
 * crash of any process makes the postmaster restart everything, as for any
 * backend.
 */
#include "eventgrid.h"

#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#define EG_BACKOFF_MIN_MS 1000
#define EG_BACKOFF_MAX_MS 60000
#define EG_WORKER_HEALTHY_MS 60000	/* a worker that ran this long restarts at once */

/* Sleeps up to ms milliseconds, waking on the latch; exits with the postmaster. */
static void
launcher_sleep(long ms)
{
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, ms, PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
	}
}

/* The pause to take now, *backoff_ms; the next one is twice as long, up to EG_BACKOFF_MAX_MS. */
static long
take_backoff(long *backoff_ms)
{
	long		ms = *backoff_ms;

	*backoff_ms = Min(ms * 2, EG_BACKOFF_MAX_MS);
	return ms;
}

/* Whether the worker of a pid slot runs: the slot holds its pid exactly while it lives. */
static bool
slot_alive(const pid_t *slot)
{
	pid_t		pid;

	SpinLockAcquire(&eg_shared->mutex);
	pid = *slot;
	SpinLockRelease(&eg_shared->mutex);
	return pid != 0;
}

/*
 * The OID of database name, or InvalidOid.  A heap scan of pg_database: with
 * no database selected, catalog indexes may not be usable yet.
 */
static Oid
lookup_database(const char *name)
{
	Oid			oid = InvalidOid;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);

		if (strcmp(NameStr(db->datname), name) == 0)
		{
			oid = db->oid;
			break;
		}
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	PopActiveSnapshot();
	CommitTransactionCommand();
	return oid;
}

/* Starts delivery worker number (1-based), or the upkeep worker (0); NULL if it could not start. */
static BackgroundWorkerHandle *
start_worker(Oid dboid, int number)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	pid_t		pid;

	if (number == 0)
		eg_worker_spec(&worker, "eventgrid_upkeep_main", "upkeep worker", dboid, 0);
	else
		eg_worker_spec(&worker, "eventgrid_worker_main", "delivery worker", dboid, number);
	if (eg_delivery_workers > 1 && number > 0)
		snprintf(worker.bgw_name, BGW_MAXLEN, "eventgrid delivery worker %d", number);
	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
		return NULL;
	if (WaitForBackgroundWorkerStartup(handle, &pid) != BGWH_STARTED)
		return NULL;
	return handle;
}

/* What the launcher knows of one worker. */
typedef struct EgWorkerSlot
{
	BackgroundWorkerHandle *handle; /* NULL: not started by this launcher, or exited */
	TimestampTz started;
	TimestampTz start_at;		/* no (re)start before this */
	long		backoff_ms;
} EgWorkerSlot;

/*
 * Starts delivery worker number (the upkeep worker for 0) in slot when it
 * is due and not running; notes its exit.  Returns the time this slot next
 * wants attention.
 */
static TimestampTz
tend_worker(Oid dboid, int number, EgWorkerSlot *slot)
{
	TimestampTz now = GetCurrentTimestamp();
	pid_t		pid;

	if (slot->handle != NULL)
	{
		if (GetBackgroundWorkerPid(slot->handle, &pid) != BGWH_STOPPED)
			return DT_NOEND;	/* its exit sets our latch (bgw_notify_pid) */
		pfree(slot->handle);
		slot->handle = NULL;
		/* a worker that kept running restarts at once; one that keeps dying, slower */
		if (now - slot->started >= (TimestampTz) EG_WORKER_HEALTHY_MS * 1000)
			slot->backoff_ms = EG_BACKOFF_MIN_MS;
		slot->start_at = now + (TimestampTz) take_backoff(&slot->backoff_ms) * 1000;
		return slot->start_at;
	}
	if (now < slot->start_at)
		return slot->start_at;

	/*
	 * A launcher restarted on its own (pg_terminate_backend) finds the
	 * workers it started still running: one process per worker number.
	 */
	if (slot_alive(number == 0 ? &eg_shared->upkeep_pid : &eg_shared->worker_pid[number - 1]))
	{
		slot->start_at = now + (TimestampTz) EG_BACKOFF_MIN_MS * 1000;
		return slot->start_at;
	}
	slot->started = now;
	slot->handle = start_worker(dboid, number);
	if (slot->handle == NULL)
	{
		ereport(LOG,
				(errmsg("eventgrid: could not start the %s%s; trying again in %ld s",
						number == 0 ? "upkeep worker" : "delivery worker ",
						number == 0 ? "" : psprintf("%d", number), slot->backoff_ms / 1000),
				 errhint("Raise max_worker_processes if all background worker slots are taken.")));
		slot->start_at = now + (TimestampTz) take_backoff(&slot->backoff_ms) * 1000;
		return slot->start_at;
	}
	return DT_NOEND;
}

/* Launcher entry point, registered in _PG_init(). */
void
eventgrid_launcher_main(Datum arg)
{
	long		backoff_ms = EG_BACKOFF_MIN_MS;
	bool		reported_missing = false;
	EgWorkerSlot slots[EG_MAX_DELIVERY_WORKERS + 1];	/* [0]: the upkeep worker */

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("eventgrid launcher");
	for (int i = 0; i <= EG_MAX_DELIVERY_WORKERS; i++)
	{
		slots[i].handle = NULL;
		slots[i].started = 0;
		slots[i].start_at = 0;
		slots[i].backoff_ms = EG_BACKOFF_MIN_MS;
	}

	/* find the database */
	for (;;)
	{
		Oid			dboid;
		TimestampTz wake_at = DT_NOEND;
		TimestampTz now;

		CHECK_FOR_INTERRUPTS();
		dboid = lookup_database(eg_database_name);
		if (!OidIsValid(dboid))
		{
			if (!reported_missing)
				ereport(LOG,
						(errmsg("eventgrid: database \"%s\" does not exist; the delivery worker waits for it",
								eg_database_name),
						 errdetail("The database is named by the setting eventgrid.database_name."),
						 errhint("Create the database and run CREATE EXTENSION eventgrid in it, or set eventgrid.database_name in postgresql.conf to the database where the extension is and restart the server.")));
			reported_missing = true;
			launcher_sleep(take_backoff(&backoff_ms));
			continue;
		}
		if (reported_missing)
			ereport(LOG, (errmsg("eventgrid: database \"%s\" exists now; starting the delivery worker",
								 eg_database_name)));
		reported_missing = false;
		backoff_ms = EG_BACKOFF_MIN_MS;

		/*
		 * Each delivery worker and the upkeep worker is started, and started
		 * again when it exits, on its own: one that fails does not stop the
		 * others.
		 */
		for (int k = 0; k <= eg_delivery_workers; k++)
			wake_at = Min(wake_at, tend_worker(dboid, k, &slots[k]));
		pgstat_report_activity(STATE_IDLE, NULL);
		now = GetCurrentTimestamp();
		if (wake_at > now)
			launcher_sleep(wake_at == DT_NOEND ? EG_BACKOFF_MAX_MS
						   : (long) Min((wake_at - now + 999) / 1000, (TimestampTz) EG_BACKOFF_MAX_MS));
	}
}
