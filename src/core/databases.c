/*
 * databases.c - the databases eventgrid serves, in shared memory: a slot per
 * database the launcher knows, with what it knows of it (whether the
 * extension is there and in which version, when its workers are wanted,
 * whether a DDL statement needs it to itself) and its workers' pids and
 * latches; and the SQL view of them all.
 *
 * Any database that has the extension is served, with no setting: the
 * launcher reads pg_database and has a worker look into each database it
 * does not know yet (launcher.c).  Workers run only while their database
 * has work: a commit that publishes (or changes what the workers do) wakes
 * the database's delivery workers through its slot, or, when none runs,
 * asks the launcher to start them (eg_db_wake); a worker that exits idle
 * leaves in its slot when it is wanted again (a retry coming due, upkeep
 * being due).  A backend about to run DROP DATABASE, ALTER DATABASE ...
 * RENAME or SET TABLESPACE, or CREATE DATABASE ... TEMPLATE on a served
 * database, once PostgreSQL's checks let it run, holds its slot: the
 * workers leave at once and are not started again until the statement
 * ends (eg_db_hold_for_ddl, eg_db_release_holds).
 */
#include "core/eventgrid.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

#define EG_DDL_WAIT_MS 4000		/* how long a DDL statement waits for the workers to leave */

EgShared   *eg_shared = NULL;
EgDbSlot   *eg_my_db = NULL;
const char *eg_log_database = NULL;

static bool holding = false;	/* this backend holds a slot for DDL */

/* Size of the shared state for eventgrid.max_databases slots. */
Size
eg_shared_size(void)
{
	return add_size(offsetof(EgShared, db), mul_size(eg_max_databases, sizeof(EgDbSlot)));
}

/* Creates or attaches to the shared state (in the shmem startup hook, under AddinShmemInitLock). */
void
eg_shared_init(void)
{
	bool		found;

	eg_shared = ShmemInitStruct("eventgrid", eg_shared_size(), &found);
	if (found)
		return;
	memset(eg_shared, 0, eg_shared_size());
	SpinLockInit(&eg_shared->mutex);
	pg_atomic_init_u64(&eg_shared->publications_generation, 0);
	for (int i = 0; i < EG_QUEUE_CVS; i++)
	{
		ConditionVariableInit(&eg_shared->queue_cv[i]);
		pg_atomic_init_u32(&eg_shared->queue_held_waiters[i], 0);
		pg_atomic_init_u64(&eg_shared->queue_wakes[i], 0);
	}
	eg_shared->ndb = eg_max_databases;
}

/* See eventgrid.h. */
int
eg_queue_cv_index(Oid dboid, int64 sid)
{
	uint64		h = hash_bytes_uint32_extended(dboid, (uint64) sid);

	return (int) (h % EG_QUEUE_CVS);
}

/* See eventgrid.h. */
ConditionVariable *
eg_queue_cv(Oid dboid, int64 sid)
{
	return eg_shared == NULL ? NULL : &eg_shared->queue_cv[eg_queue_cv_index(dboid, sid)];
}

/* See eventgrid.h. */
pg_atomic_uint64 *
eg_queue_wakes(Oid dboid, int64 sid)
{
	return eg_shared == NULL ? NULL : &eg_shared->queue_wakes[eg_queue_cv_index(dboid, sid)];
}

/* See eventgrid.h. */
void
eg_queue_broadcast(int i)
{
	pg_atomic_fetch_add_u64(&eg_shared->queue_wakes[i], 1);
	ConditionVariableBroadcast(&eg_shared->queue_cv[i]);
}

/* See eventgrid.h. */
pg_atomic_uint32 *
eg_queue_held_waiters(Oid dboid, int64 sid)
{
	return eg_shared == NULL ? NULL : &eg_shared->queue_held_waiters[eg_queue_cv_index(dboid, sid)];
}

/*
 * The slot of database dboid, under the mutex; a free one made its own when
 * create.  The slot found last is tried first: a backend asks for its own
 * database's at every commit that publishes, and the mutex is a spinlock.
 */
static EgDbSlot *
find_locked(Oid dboid, bool create)
{
	static EgDbSlot *last = NULL;
	EgDbSlot   *free_slot = NULL;

	if (last != NULL && last->dboid == dboid)
		return last;
	for (int i = 0; i < eg_shared->ndb; i++)
	{
		EgDbSlot   *db = &eg_shared->db[i];

		if (db->dboid == dboid)
			return last = db;
		if (free_slot == NULL && db->dboid == InvalidOid)
			free_slot = db;
	}
	if (!create || free_slot == NULL)
		return NULL;
	memset(free_slot, 0, sizeof(EgDbSlot));
	free_slot->dboid = dboid;
	free_slot->state = EG_DB_UNKNOWN;
	free_slot->delivery_at = DT_NOEND;
	free_slot->upkeep_at = 0;	/* looked into at once */
	free_slot->summary_dead_letter_id = -1;
	return last = free_slot;
}

/*
 * The slot of database dboid (a free slot made its own when create), or
 * NULL when there is none (every slot taken: the launcher says so).  The
 * pointer stays valid; whether it still names dboid is checked under the
 * mutex.
 */
EgDbSlot *
eg_db_find(Oid dboid, bool create)
{
	EgDbSlot   *db;

	SpinLockAcquire(&eg_shared->mutex);
	db = find_locked(dboid, create);
	SpinLockRelease(&eg_shared->mutex);
	return db;
}

/* Sets the launcher's latch. */
void
eg_wake_launcher(void)
{
	Latch	   *latch;

	SpinLockAcquire(&eg_shared->mutex);
	latch = eg_shared->launcher_latch;
	SpinLockRelease(&eg_shared->mutex);
	if (latch)
		SetLatch(latch);
}

/*
 * Work came in for database dboid (a commit that published, paused,
 * updated or dropped something): its delivery workers (delivery) are
 * woken, its upkeep worker (upkeep) is told; those not running are wanted
 * now and the launcher is woken to start them.  for_events: the commit
 * published events, which need no delivery worker while the database has
 * no event subscription (EgDbSlot.no_subscriptions).
 */
static void
db_wake(Oid dboid, bool delivery, bool upkeep, bool for_events)
{
	Latch	   *latches[EG_MAX_DELIVERY_WORKERS];
	int			n = 0;
	bool		launcher = false;
	EgDbSlot   *db;

	if (eg_shared == NULL)
		return;
	SpinLockAcquire(&eg_shared->mutex);
	db = find_locked(dboid, true);
	if (db != NULL)
	{
		/*
		 * Events published in a database with no event subscription (an
		 * application server whose events are delivered elsewhere): nothing
		 * to deliver, only upkeep.
		 */
		if (delivery && !(for_events && db->no_subscriptions))
		{
			db->wakes++;
			for (int k = 0; k < EG_MAX_DELIVERY_WORKERS; k++)
				if (db->worker_latch[k] != NULL)
					latches[n++] = db->worker_latch[k];
			if (n == 0)
			{
				db->delivery_at = 0;
				launcher = true;
			}
		}
		if (upkeep)
		{
			db->upkeep_wanted = true;
			if (db->upkeep_pid == 0)
			{
				db->upkeep_at = 0;
				launcher = true;
			}
		}
		/* a database that publishes has the extension now, whatever was seen before */
		if (db->state == EG_DB_ABSENT && !db->recheck)
		{
			db->recheck = true;
			db->upkeep_at = 0;
			launcher = true;
		}
	}
	SpinLockRelease(&eg_shared->mutex);
	for (int i = 0; i < n; i++)
		SetLatch(latches[i]);
	if (launcher)
		eg_wake_launcher();
}

/* See eventgrid.h. */
void
eg_db_wake(Oid dboid, bool delivery, bool upkeep)
{
	db_wake(dboid, delivery, upkeep, false);
}

/* See eventgrid.h. */
void
eg_db_wake_for_events(Oid dboid)
{
	db_wake(dboid, true, true, true);
}

/*
 * CREATE, ALTER or DROP EXTENSION eventgrid committed in database dboid:
 * the launcher has a worker look again at once.
 */
void
eg_db_extension_changed(Oid dboid)
{
	EgDbSlot   *db;

	SpinLockAcquire(&eg_shared->mutex);
	db = find_locked(dboid, true);
	if (db != NULL)
	{
		db->recheck = true;
		db->upkeep_at = 0;
	}
	SpinLockRelease(&eg_shared->mutex);
	eg_wake_launcher();
}

/*
 * The database of slot db wants its delivery workers (or, upkeep, its
 * upkeep worker) at at (0: now), unless they are wanted sooner already.
 * Called by a worker that leaves with work left for later.
 */
void
eg_db_want(EgDbSlot *db, bool upkeep, TimestampTz at)
{
	SpinLockAcquire(&eg_shared->mutex);
	if (upkeep)
		db->upkeep_at = Min(db->upkeep_at, at);
	else
		db->delivery_at = Min(db->delivery_at, at);
	SpinLockRelease(&eg_shared->mutex);
	if (at == 0)
		eg_wake_launcher();
}

/*
 * Whether this worker's database asks its workers to leave: a DDL
 * statement needs the database, or another database waits for a worker
 * slot and this one has had its turn.
 */
bool
eg_db_leaving(void)
{
	bool		leave;

	SpinLockAcquire(&eg_shared->mutex);
	leave = eg_my_db->leave;
	SpinLockRelease(&eg_shared->mutex);
	return leave;
}

/* Are any workers of slot db running?  Under the mutex. */
static bool
workers_running(const EgDbSlot *db)
{
	if (db->upkeep_pid != 0)
		return true;
	for (int k = 0; k < EG_MAX_DELIVERY_WORKERS; k++)
		if (db->worker_pid[k] != 0)
			return true;
	return false;
}

/*
 * Before a DDL statement that needs database dboid to itself (no other
 * session connected: DROP DATABASE, ALTER DATABASE ... RENAME TO or SET
 * TABLESPACE, CREATE DATABASE ... TEMPLATE) that will run: its workers
 * are asked to leave, are not started again until eg_db_release_holds
 * (the caller's, when the statement ends; at the latest, the transaction's
 * end), and are waited for, at most EG_DDL_WAIT_MS, processing interrupts.
 * A worker that has not left by then is left to PostgreSQL's own wait.
 */
void
eg_db_hold_for_ddl(Oid dboid)
{
	Latch	   *latches[EG_MAX_DELIVERY_WORKERS + 1];
	int			n = 0;
	EgDbSlot   *db;
	TimestampTz until = GetCurrentTimestamp() + (TimestampTz) EG_DDL_WAIT_MS * 1000;

	if (eg_shared == NULL || !OidIsValid(dboid))
		return;
	SpinLockAcquire(&eg_shared->mutex);
	db = find_locked(dboid, false);
	if (db != NULL)
	{
		db->hold_pid = MyProcPid;
		db->leave = true;
		for (int k = 0; k < EG_MAX_DELIVERY_WORKERS; k++)
			if (db->worker_latch[k] != NULL)
				latches[n++] = db->worker_latch[k];
		if (db->upkeep_latch != NULL)
			latches[n++] = db->upkeep_latch;
	}
	SpinLockRelease(&eg_shared->mutex);
	if (db == NULL)
		return;
	holding = true;
	for (int i = 0; i < n; i++)
		SetLatch(latches[i]);
	for (;;)
	{
		bool		running;

		SpinLockAcquire(&eg_shared->mutex);
		running = db->dboid == dboid && workers_running(db);
		SpinLockRelease(&eg_shared->mutex);
		if (!running || GetCurrentTimestamp() >= until)
			break;
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 10, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * When the DDL statement of a backend that held slots ends (or, for DROP
 * DATABASE, its transaction commits), or its transaction aborts: the
 * workers may come back (dropped: the database is gone, its slot is freed
 * once its workers are).  The launcher looks at once.
 */
void
eg_db_release_holds(bool dropped)
{
	if (!holding || eg_shared == NULL)
		return;
	holding = false;
	SpinLockAcquire(&eg_shared->mutex);
	for (int i = 0; i < eg_shared->ndb; i++)
	{
		EgDbSlot   *db = &eg_shared->db[i];

		if (db->dboid == InvalidOid || db->hold_pid != MyProcPid)
			continue;
		db->hold_pid = 0;
		db->leave = false;
		if (dropped)
			db->present = false;
		else
		{
			/* what the workers left behind, they take up again (they leave again at once if idle) */
			db->delivery_at = 0;
			db->upkeep_at = 0;
		}
	}
	SpinLockRelease(&eg_shared->mutex);
	eg_wake_launcher();
}

static const char *
state_name(EgDbState state)
{
	switch (state)
	{
		case EG_DB_UNKNOWN:
			return "looking";
		case EG_DB_ABSENT:
			return "no extension";
		case EG_DB_OTHER_VERSION:
			return "other version";
		case EG_DB_READY:
			return "served";
		default:
			return "free";
	}
}

PG_FUNCTION_INFO_V1(eventgrid_served_databases);

/*
 * SQL: eventgrid._served_databases() -> SETOF (database, state,
 * delivery_workers, upkeep_worker, delivery_wanted_at, upkeep_wanted_at,
 * waiting_since, held_by, last_active): the launcher's view of every
 * database it knows (state: served, looking, no extension, other version),
 * how many of its workers run, when they are wanted next (NULL: not
 * until work comes), since when it waits for a free worker slot, the
 * backend whose DDL needs it, when a worker last had work.  Empty when
 * the library is not preloaded.
 */
Datum
eventgrid_served_databases(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	EgDbSlot   *copy;
	int			n = 0;

	eg_materialized_srf(fcinfo);
	if (eg_shared == NULL)
		return (Datum) 0;
	copy = palloc(eg_shared->ndb * sizeof(EgDbSlot));
	SpinLockAcquire(&eg_shared->mutex);
	for (int i = 0; i < eg_shared->ndb; i++)
		if (eg_shared->db[i].dboid != InvalidOid)
			copy[n++] = eg_shared->db[i];
	SpinLockRelease(&eg_shared->mutex);
	for (int i = 0; i < n; i++)
	{
		EgDbSlot   *db = &copy[i];
		Datum		values[9];
		bool		nulls[9] = {0};
		int			running = 0;

		for (int k = 0; k < EG_MAX_DELIVERY_WORKERS; k++)
			running += db->worker_pid[k] != 0;
		values[0] = CStringGetTextDatum(NameStr(db->name)[0] ? NameStr(db->name) : psprintf("%u", db->dboid));
		values[1] = CStringGetTextDatum(state_name(db->state));
		values[2] = Int32GetDatum(running);
		values[3] = BoolGetDatum(db->upkeep_pid != 0);
		values[4] = TimestampTzGetDatum(db->delivery_at);
		nulls[4] = db->delivery_at == DT_NOEND || running > 0;
		values[5] = TimestampTzGetDatum(db->upkeep_at);
		nulls[5] = db->upkeep_at == DT_NOEND || db->upkeep_pid != 0;
		values[6] = TimestampTzGetDatum(db->waiting_since);
		nulls[6] = db->waiting_since == 0;
		values[7] = Int32GetDatum(db->hold_pid);
		nulls[7] = db->hold_pid == 0;
		values[8] = TimestampTzGetDatum(db->last_active);
		nulls[8] = db->last_active == 0;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
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

	eg_materialized_srf(fcinfo);
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
