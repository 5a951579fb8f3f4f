/*
 * launcher.c - the eventgrid launcher: a background worker connected to no
 * database that starts the delivery worker (worker.c) in the database named
 * by eventgrid.database_name and starts it again when it exits.
 *
 * Why a launcher: a background worker that connects to a missing database
 * dies with FATAL and the postmaster restarts it every few seconds, filling
 * the log without naming the setting at fault.  The launcher reads
 * pg_database (a shared catalog) instead, says once which GUC names a
 * missing database, and looks again with growing pauses; when the worker
 * exits (an ERROR it could not handle, the database dropped, SIGTERM) it is
 * restarted after a pause that grows while it keeps exiting soon after
 * starting.  A crash of either process makes the postmaster restart
 * everything, as for any backend.
 */
#include "eventgrid.h"

#include <signal.h>

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

static bool
worker_alive(void)
{
	pid_t		pid;

	SpinLockAcquire(&eg_shared->mutex);
	pid = eg_shared->worker_pid;
	SpinLockRelease(&eg_shared->mutex);
	return pid != 0 && kill(pid, 0) == 0;
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

static BackgroundWorkerHandle *
start_delivery_worker(Oid dboid)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	pid_t		pid;

	eg_worker_spec(&worker, "eventgrid_worker_main", "delivery worker", dboid);
	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
		return NULL;
	if (WaitForBackgroundWorkerStartup(handle, &pid) != BGWH_STARTED)
		return NULL;
	return handle;
}

/* Launcher entry point, registered in _PG_init(). */
void
eventgrid_launcher_main(Datum arg)
{
	long		backoff_ms = EG_BACKOFF_MIN_MS;
	bool		reported_missing = false;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("eventgrid launcher");

	for (;;)
	{
		Oid			dboid;
		BackgroundWorkerHandle *handle;
		TimestampTz started;

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
			launcher_sleep(backoff_ms);
			backoff_ms = Min(backoff_ms * 2, EG_BACKOFF_MAX_MS);
			continue;
		}
		if (reported_missing)
			ereport(LOG, (errmsg("eventgrid: database \"%s\" exists now; starting the delivery worker",
								 eg_database_name)));
		reported_missing = false;

		/*
		 * A launcher restarted on its own (pg_terminate_backend) finds the
		 * worker it started still running: one worker at a time.
		 */
		if (worker_alive())
		{
			launcher_sleep(EG_BACKOFF_MIN_MS);
			continue;
		}

		started = GetCurrentTimestamp();
		handle = start_delivery_worker(dboid);
		if (handle == NULL)
		{
			ereport(LOG,
					(errmsg("eventgrid: could not start the delivery worker; trying again in %ld s",
							backoff_ms / 1000),
					 errhint("Raise max_worker_processes if all background worker slots are taken.")));
			launcher_sleep(backoff_ms);
			backoff_ms = Min(backoff_ms * 2, EG_BACKOFF_MAX_MS);
			continue;
		}
		pgstat_report_activity(STATE_IDLE, NULL);
		(void) WaitForBackgroundWorkerShutdown(handle);
		pfree(handle);

		/* a worker that kept running restarts at once; one that keeps dying, slower */
		if (GetCurrentTimestamp() - started >= (TimestampTz) EG_WORKER_HEALTHY_MS * 1000)
			backoff_ms = EG_BACKOFF_MIN_MS;
		launcher_sleep(backoff_ms);
		backoff_ms = Min(backoff_ms * 2, EG_BACKOFF_MAX_MS);
	}
}
