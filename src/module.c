/*
 * module.c - module entry: _PG_init defines the GUCs (core/settings.c) and,
 * preloaded, asks for the shared-memory block holding the databases' slots
 * and the workers' latches (core/databases.c), installs the utility and
 * error hooks (hooks.c) and registers the launcher
 * (launcher.c) and, with eventgrid.http_port set, the HTTP listener
 * (serve/listener.c); and the check run by CREATE EXTENSION.
 *
 * The library works in two modes.  Preloaded (shared_preload_libraries =
 * 'eventgrid') it registers the launcher and shared memory.  Loaded on demand
 * by CREATE EXTENSION or a trigger call, configuration and publishing work
 * but nothing is delivered, and the wake-up at commit is a no-op.
 */
#include "hooks.h"
#include "http/token.h"

#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"

PG_MODULE_MAGIC;

static shmem_startup_hook_type prev_shmem_startup_hook = NULL;
static void (*prev_shmem_request_hook) (void) = NULL;

void		_PG_init(void);

static void
eg_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(eg_shared_size()));
	RequestAddinShmemSpace(MAXALIGN(eg_token_shmem_size()));
	eg_token_shmem_request();
}

static void
eg_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();

	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	eg_shared_init();
	eg_token_shmem_init();
	LWLockRelease(AddinShmemInitLock);
}

void
_PG_init(void)
{
	BackgroundWorker worker;

	eg_define_gucs();

	if (!process_shared_preload_libraries_in_progress || IsBinaryUpgrade)
		return;

	eg_shmem_request_hook_install(eg_shmem_request, &prev_shmem_request_hook);
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = eg_shmem_startup;

	eg_ddl_holds_install();
	eg_log_hook_install();

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

	/* Event Grid's HTTP data plane (SPEC 16), when a port is set: one listener for the cluster */
	if (eg_http_port != 0)
	{
		memset(&worker, 0, sizeof(worker));
		worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
		worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
		worker.bgw_restart_time = 5;
		snprintf(worker.bgw_library_name, BGW_MAXLEN, "eventgrid");
		snprintf(worker.bgw_function_name, BGW_MAXLEN, "eventgrid_http_listener_main");
		snprintf(worker.bgw_name, BGW_MAXLEN, "eventgrid HTTP listener");
		snprintf(worker.bgw_type, BGW_MAXLEN, "eventgrid HTTP listener");
		RegisterBackgroundWorker(&worker);
	}
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
