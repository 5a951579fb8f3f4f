/*
 * launcher.c - the eventgrid launcher: one background worker per cluster,
 * connected to no database, that finds the databases with the extension
 * and starts their delivery workers (delivery_worker.c; as many as
 * eventgrid.delivery_workers) and upkeep worker (upkeep_worker.c) while
 * they have work.
 *
 * Finding databases: every two seconds (and whenever woken) it reads
 * pg_database, a shared catalog, and gives each database it does not know
 * yet a slot (databases.c); a database that allows connections and is not
 * a template is looked into by starting its upkeep worker, which says
 * whether the extension is there and in which version, does any upkeep due
 * and leaves when idle.  So a database created, or cloned with CREATE
 * DATABASE ... TEMPLATE from one that has the extension, is served within
 * a few seconds, and CREATE, ALTER or DROP EXTENSION (followed by the
 * utility hook in hooks.c) has it looked at again at once.
 *
 * Workers on demand: a database's workers are started when its slot says
 * they are wanted (a commit that published woke it, a worker that left
 * idle is due again, upkeep is due) and leave by themselves when idle
 * (eventgrid.worker_idle_timeout), so idle databases hold no worker.  When
 * a worker cannot be started because every background worker slot is
 * taken, the database waits its turn: waiting databases are started in
 * the order they began to wait, the others' idle workers leave at once,
 * and a database whose workers have had the slots for EG_TURN_MS while
 * another waits is asked to leave (they finish what they sent and go,
 * coming back in turn when they still have work).  That is logged once,
 * with a HINT naming max_worker_processes and how many would let every
 * busy database run at once.
 *
 * Failures: a worker that exits without leaving on purpose (an ERROR it
 * could not handle, SIGTERM) is started again after a pause that grows
 * while it keeps failing soon after starting, each worker on its own.
 * Each worker runs as one process at a time: the launcher starts it only
 * once its previous process is gone, as the handle it got says or, for a
 * worker it did not start (an earlier launcher's), as the worker's pid
 * slot says.  A crash of any process makes the postmaster restart
 * everything, as for any backend.
 */
#include "core/eventgrid.h"

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
#include "storage/proc.h"
#include "storage/procarray.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#define EG_BACKOFF_MIN_MS 1000
#define EG_BACKOFF_MAX_MS 60000
#define EG_WORKER_HEALTHY_MS 60000	/* a worker that ran this long restarts at once */
#define EG_SCAN_INTERVAL_MS 2000	/* pg_database is read this often */
#define EG_TURN_MS 15000		/* while others wait, a busy database's turn lasts this long */
#define EG_SHORT_LOG_QUIET_MS 60000	/* slots short again after this long is logged again */

/* What the launcher knows of one worker of one database slot. */
typedef struct EgWorkerHandle
{
	BackgroundWorkerHandle *handle; /* NULL: not started by this launcher, or exited */
	TimestampTz started;
	TimestampTz start_at;		/* no (re)start before this */
	long		backoff_ms;
} EgWorkerHandle;

#define NWORKERS (EG_MAX_DELIVERY_WORKERS + 1)	/* per database: [0] the upkeep worker, [k] delivery worker k */

static EgWorkerHandle *handles;	/* [slot index * NWORKERS + number] */
static bool slots_full_logged = false;	/* said once that every database slot is taken */
static bool short_logged = false;
static TimestampTz short_since = 0;
static TimestampTz last_short = 0;

/* Sleeps up to ms milliseconds, waking on the latch; exits with the postmaster. */
static void
launcher_sleep(long ms)
{
	(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, ms, PG_WAIT_EXTENSION);
	ResetLatch(MyLatch);
	CHECK_FOR_INTERRUPTS();
	if (ConfigReloadPending)
	{
		bool		was_paused = eg_delivery_paused;

		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
		/* delivery resumed (eventgrid.delivery_paused off): what waited is wanted at once */
		if (was_paused && !eg_delivery_paused)
		{
			SpinLockAcquire(&eg_shared->mutex);
			for (int s = 0; s < eg_shared->ndb; s++)
				if (eg_shared->db[s].dboid != InvalidOid)
					eg_shared->db[s].delivery_at = 0;
			SpinLockRelease(&eg_shared->mutex);
		}
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

/* Exit callback: the launcher no longer takes wake-ups. */
static void
clear_launcher(int code, Datum arg)
{
	SpinLockAcquire(&eg_shared->mutex);
	if (eg_shared->launcher_pid == MyProcPid)
	{
		eg_shared->launcher_pid = 0;
		eg_shared->launcher_latch = NULL;
	}
	SpinLockRelease(&eg_shared->mutex);
}

/* A database pg_database lists, as scan_databases keeps it (sorted by oid). */
typedef struct ListedDb
{
	Oid			oid;
	NameData	name;
} ListedDb;

static int
listed_cmp(const void *a, const void *b)
{
	Oid			x = ((const ListedDb *) a)->oid;
	Oid			y = ((const ListedDb *) b)->oid;

	return (x > y) - (x < y);
}

/*
 * Reads pg_database (a heap scan: with no database selected, catalog
 * indexes may not be usable yet) and brings the slots up to date: a slot
 * for each database that allows connections and is not a template (a new
 * one is looked into at once), its name as it is now, and the slots of
 * databases that are gone freed once their workers are.  The list is
 * sorted so that the pass under the spinlock costs a binary search per
 * slot, however many databases there are.
 */
static void
scan_databases(void)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	int			n = 0;
	int			cap = 64;
	ListedDb   *listed = palloc(cap * sizeof(ListedDb));

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	PushActiveSnapshot(GetTransactionSnapshot());
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database d = (Form_pg_database) GETSTRUCT(tup);

		if (!d->datallowconn || d->datistemplate)
			continue;
		if (n == cap)
		{
			cap *= 2;
			listed = repalloc(listed, cap * sizeof(ListedDb));
		}
		listed[n].oid = d->oid;
		listed[n].name = d->datname;
		n++;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	PopActiveSnapshot();
	CommitTransactionCommand();
	qsort(listed, n, sizeof(ListedDb), listed_cmp);

	for (int i = 0; i < n; i++)
		if (eg_db_find(listed[i].oid, true) == NULL && !slots_full_logged)
		{
			slots_full_logged = true;
			ereport(LOG,
					(errmsg("eventgrid: all %d database slots are taken; database \"%s\" is not served",
							eg_max_databases, NameStr(listed[i].name)),
					 errdetail("Every database that allows connections takes a slot, whether or not it has the extension."),
					 errhint("Raise eventgrid.max_databases (a restart is needed).")));
		}
	SpinLockAcquire(&eg_shared->mutex);
	for (int s = 0; s < eg_shared->ndb; s++)
	{
		EgDbSlot   *db = &eg_shared->db[s];
		ListedDb	key;
		ListedDb   *found;

		if (db->dboid == InvalidOid)
			continue;
		key.oid = db->dboid;
		found = bsearch(&key, listed, n, sizeof(ListedDb), listed_cmp);
		if (found != NULL)
			db->name = found->name;
		db->present = found != NULL;
	}
	SpinLockRelease(&eg_shared->mutex);
	pfree(listed);
}

/* Starts worker number (0: the upkeep worker) of database dboid; NULL if no slot was free. */
static BackgroundWorkerHandle *
start_worker(Oid dboid, const char *dbname, int number)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	pid_t		pid;

	if (number == 0)
		eg_worker_spec(&worker, "eventgrid_upkeep_main", "upkeep worker", dboid, dbname, 0);
	else
		eg_worker_spec(&worker, "eventgrid_worker_main", "delivery worker", dboid, dbname, number);
	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
		return NULL;
	if (WaitForBackgroundWorkerStartup(handle, &pid) != BGWH_STARTED)
		return NULL;
	return handle;
}

/* A snapshot of a slot's fields, taken under the mutex. */
typedef struct EgSlotView
{
	int			index;
	EgDbSlot	db;
	bool		wants[NWORKERS];
	bool		running[NWORKERS];
} EgSlotView;

/*
 * Which workers a database wants now (clock: the workers' clock, eg_now(),
 * on which its slot says when they are wanted): none, the upkeep worker
 * only (to look into it), or those due.
 */
static void
wanted_workers(EgSlotView *v, TimestampTz clock)
{
	EgDbSlot   *db = &v->db;
	bool		held = db->hold_pid != 0;

	memset(v->wants, 0, sizeof(v->wants));
	if (!db->present || held || db->leave)
		return;
	if (db->state == EG_DB_UNKNOWN || db->recheck)
		v->wants[0] = true;
	else if (db->state == EG_DB_READY)
	{
		v->wants[0] = db->upkeep_at <= clock;
		for (int k = 1; k <= eg_delivery_workers; k++)
			v->wants[k] = db->delivery_at <= clock;
	}
}

/*
 * Notes the exits of the workers of slot view v (a worker that failed
 * restarts after a growing pause, one that left on purpose when wanted);
 * whether each runs.
 */
static void
reap(EgSlotView *v, TimestampTz now)
{
	for (int k = 0; k < NWORKERS; k++)
	{
		EgWorkerHandle *h = &handles[v->index * NWORKERS + k];
		pid_t		pid;
		pid_t		slot_pid = k == 0 ? v->db.upkeep_pid : v->db.worker_pid[k - 1];

		if (h->handle != NULL)
		{
			if (GetBackgroundWorkerPid(h->handle, &pid) != BGWH_STOPPED)
			{
				v->running[k] = true;
				continue;
			}
			pfree(h->handle);
			h->handle = NULL;
			if (v->db.clean_exit[k] || now - h->started >= (TimestampTz) EG_WORKER_HEALTHY_MS * 1000)
			{
				h->backoff_ms = EG_BACKOFF_MIN_MS;
				h->start_at = 0;
			}
			else
				h->start_at = now + (TimestampTz) take_backoff(&h->backoff_ms) * 1000;
			if (!v->db.clean_exit[k])
			{
				/*
				 * It failed: what it was started for is not done, so it is
				 * still wanted (after its pause), whether or not a commit
				 * or a due retry asks again.
				 */
				SpinLockAcquire(&eg_shared->mutex);
				if (eg_shared->db[v->index].dboid == v->db.dboid)
				{
					if (k == 0)
						eg_shared->db[v->index].upkeep_at = 0;
					else
						eg_shared->db[v->index].delivery_at = 0;
				}
				SpinLockRelease(&eg_shared->mutex);
				if (k == 0)
					v->db.upkeep_at = 0;
				else
					v->db.delivery_at = 0;
			}
		}
		/* a worker an earlier launcher started still runs: one process per worker */
		v->running[k] = slot_pid != 0;
	}
}

/*
 * Starts the wanted workers of v that do not run; false when a worker slot
 * was not free (the database then waits its turn).
 */
static bool
start_wanted(EgSlotView *v, TimestampTz now, TimestampTz *wake_at)
{
	bool		started[NWORKERS] = {0};
	bool		started_any = false;
	bool		all_delivery = true;

	/*
	 * The delivery workers first, the upkeep worker last: a database that
	 * got no slot for a delivery worker starts no upkeep worker either,
	 * which would hold a slot waiting for deliveries no one makes.
	 */
	for (int i = 0; i < NWORKERS; i++)
	{
		int			k = (i + 1) % NWORKERS;
		EgWorkerHandle *h = &handles[v->index * NWORKERS + k];

		if (!v->wants[k] || v->running[k])
			continue;
		if (now < h->start_at)
		{
			*wake_at = Min(*wake_at, h->start_at);
			all_delivery &= k == 0;
			continue;
		}
		h->started = now;
		/* a process that dies before it can say it left on purpose failed */
		SpinLockAcquire(&eg_shared->mutex);
		if (eg_shared->db[v->index].dboid == v->db.dboid)
			eg_shared->db[v->index].clean_exit[k] = false;
		SpinLockRelease(&eg_shared->mutex);
		h->handle = start_worker(v->db.dboid, NameStr(v->db.name), k);
		if (h->handle == NULL)
			return false;
		v->running[k] = true;
		started[k] = true;
		started_any = true;
	}

	/*
	 * What was wanted is started: the workers say when they are wanted
	 * again as they leave.  (Only on a start: a worker that just left may
	 * have asked for its successor, and the launcher's view of whether it
	 * still runs can be late.)
	 */
	SpinLockAcquire(&eg_shared->mutex);
	if (eg_shared->db[v->index].dboid == v->db.dboid)
	{
		EgDbSlot   *db = &eg_shared->db[v->index];
		bool		any_delivery = false;

		db->waiting_since = 0;
		if (started_any)
			db->turn_since = now;
		/*
		 * Unless a worker that already left, or a commit, asked again since
		 * the launcher looked
		 */
		if (started[0] && db->upkeep_at == v->db.upkeep_at)
			db->upkeep_at = DT_NOEND;
		for (int k = 1; k < NWORKERS; k++)
			any_delivery |= started[k];
		if (any_delivery && all_delivery && db->delivery_at == v->db.delivery_at)
			db->delivery_at = DT_NOEND;
	}
	SpinLockRelease(&eg_shared->mutex);
	return true;
}

/*
 * The earliest time after clock (the workers' clock) at which slot view v
 * wants a worker, as a real time, or DT_NOEND.
 */
static TimestampTz
next_wanted(const EgSlotView *v, TimestampTz clock)
{
	TimestampTz at = DT_NOEND;

	if (!v->db.present || v->db.hold_pid != 0 || v->db.state != EG_DB_READY)
		return at;
	if (v->db.upkeep_at > clock)
		at = Min(at, v->db.upkeep_at);
	if (v->db.delivery_at > clock)
		at = Min(at, v->db.delivery_at);
	return at == DT_NOEND ? at : at - (TimestampTz) eg_clock_offset_s * USECS_PER_SEC;
}

static int
cmp_waiting(const void *a, const void *b)
{
	const EgSlotView *x = a;
	const EgSlotView *y = b;
	TimestampTz wx = x->db.waiting_since ? x->db.waiting_since : DT_NOEND;
	TimestampTz wy = y->db.waiting_since ? y->db.waiting_since : DT_NOEND;

	return wx < wy ? -1 : wx > wy ? 1 : x->index - y->index;
}

/*
 * Databases short of worker slots take turns: of the databases whose
 * workers run (and are not already leaving), those whose turn began
 * EG_TURN_MS ago or more are asked to leave, as many as databases wait.
 */
static void
take_turns(EgSlotView *views, int n, int nwaiting, TimestampTz now)
{
	for (int i = 0; i < n && nwaiting > 0; i++)
	{
		EgSlotView *v = &views[i];
		bool		any = false;
		Latch	   *latches[NWORKERS];
		int			nl = 0;

		for (int k = 0; k < NWORKERS; k++)
			any |= v->running[k];
		if (!any || v->db.leave || v->db.waiting_since != 0 ||
			now - v->db.turn_since < (TimestampTz) EG_TURN_MS * 1000)
			continue;
		SpinLockAcquire(&eg_shared->mutex);
		if (eg_shared->db[v->index].dboid == v->db.dboid)
		{
			EgDbSlot   *db = &eg_shared->db[v->index];

			db->leave = true;
			for (int k = 0; k < EG_MAX_DELIVERY_WORKERS; k++)
				if (db->worker_latch[k])
					latches[nl++] = db->worker_latch[k];
			if (db->upkeep_latch)
				latches[nl++] = db->upkeep_latch;
		}
		SpinLockRelease(&eg_shared->mutex);
		for (int l = 0; l < nl; l++)
			SetLatch(latches[l]);
		nwaiting--;
	}
}

/* Logs once per episode that worker slots ran out, and how many would let every busy database run. */
static void
log_short(EgSlotView *views, int n, int nwaiting, TimestampTz now)
{
	int			busy = 0;

	if (nwaiting == 0)
	{
		if (short_logged && now - last_short >= (TimestampTz) EG_SHORT_LOG_QUIET_MS * 1000)
			short_logged = false;
		return;
	}
	last_short = now;
	if (short_logged)
		return;
	short_logged = true;
	for (int i = 0; i < n; i++)
	{
		bool		any = views[i].db.waiting_since != 0;

		for (int k = 0; k < NWORKERS; k++)
			any |= views[i].running[k];
		busy += any;
	}
	ereport(LOG,
			(errmsg("eventgrid: %d database%s with work wait for a free background worker slot; databases take turns",
					nwaiting, nwaiting == 1 ? "" : "s"),
			 errdetail("%d databases have work; each uses %d worker processes while it does (eventgrid.delivery_workers + 1).",
					   busy, eg_delivery_workers + 1),
			 errhint("Raise max_worker_processes (now %d) to at least %d so that every busy database runs at once (a restart is needed); parallel queries and logical replication use these slots too.",
					 max_worker_processes, max_worker_processes + nwaiting * (eg_delivery_workers + 1))));
}

/*
 * One look at every database slot: exits noted, holds of DDL backends that
 * are gone dropped, slots of databases that are gone freed, and the
 * wanted workers started, waiting databases first in the order they began
 * to wait.  Returns when the launcher is next wanted (a pause running out,
 * a worker wanted later).
 */
static TimestampTz
tend_databases(TimestampTz now)
{
	int			n = 0;
	int			nwaiting = 0;
	TimestampTz wake_at = DT_NOEND;
	EgSlotView *views = palloc(eg_shared->ndb * sizeof(EgSlotView));
	bool		short_now = false;
	TimestampTz clock = eg_now();

	SpinLockAcquire(&eg_shared->mutex);
	for (int s = 0; s < eg_shared->ndb; s++)
	{
		if (eg_shared->db[s].dboid == InvalidOid)
			continue;
		views[n].index = s;
		views[n].db = eg_shared->db[s];
		n++;
	}
	SpinLockRelease(&eg_shared->mutex);
	qsort(views, n, sizeof(EgSlotView), cmp_waiting);

	for (int i = 0; i < n; i++)
	{
		EgSlotView *v = &views[i];
		bool		any = false;

		reap(v, now);
		for (int k = 0; k < NWORKERS; k++)
			any |= v->running[k];
		if (v->db.hold_pid != 0 && BackendPidGetProc(v->db.hold_pid) == NULL)
		{
			/* the backend that held it is gone without ending its transaction */
			SpinLockAcquire(&eg_shared->mutex);
			if (eg_shared->db[v->index].hold_pid == v->db.hold_pid)
			{
				eg_shared->db[v->index].hold_pid = 0;
				eg_shared->db[v->index].leave = false;
			}
			SpinLockRelease(&eg_shared->mutex);
			v->db.hold_pid = 0;
			v->db.leave = false;
		}
		if (!any && v->db.leave && v->db.hold_pid == 0)
		{
			/* its workers left as asked: its turn is over */
			SpinLockAcquire(&eg_shared->mutex);
			if (eg_shared->db[v->index].dboid == v->db.dboid && eg_shared->db[v->index].hold_pid == 0)
				eg_shared->db[v->index].leave = false;
			SpinLockRelease(&eg_shared->mutex);
			v->db.leave = false;
		}
		if (!v->db.present && !any && v->db.hold_pid == 0)
		{
			SpinLockAcquire(&eg_shared->mutex);
			if (eg_shared->db[v->index].dboid == v->db.dboid && !eg_shared->db[v->index].present)
				memset(&eg_shared->db[v->index], 0, sizeof(EgDbSlot));
			SpinLockRelease(&eg_shared->mutex);
			for (int k = 0; k < NWORKERS; k++)
				handles[v->index * NWORKERS + k].start_at = 0;
			continue;
		}
		wanted_workers(v, clock);
		if (!short_now && !start_wanted(v, now, &wake_at))
			short_now = true;
		if (short_now)
		{
			bool		wants_more = false;

			for (int k = 0; k < NWORKERS; k++)
				wants_more |= v->wants[k] && !v->running[k];
			if (wants_more)
			{
				nwaiting++;
				SpinLockAcquire(&eg_shared->mutex);
				if (eg_shared->db[v->index].dboid == v->db.dboid && eg_shared->db[v->index].waiting_since == 0)
					eg_shared->db[v->index].waiting_since = now;
				SpinLockRelease(&eg_shared->mutex);
				if (v->db.waiting_since == 0)
					v->db.waiting_since = now;
			}
		}
		wake_at = Min(wake_at, next_wanted(v, clock));
	}
	SpinLockAcquire(&eg_shared->mutex);
	eg_shared->slots_short = nwaiting > 0;
	SpinLockRelease(&eg_shared->mutex);
	if (nwaiting > 0)
	{
		take_turns(views, n, nwaiting, now);
		short_since = short_since ? short_since : now;
		/* slots free up as workers leave: look again soon */
		wake_at = Min(wake_at, now + 200 * 1000);
	}
	else
		short_since = 0;
	log_short(views, n, nwaiting, now);
	pfree(views);
	return wake_at;
}

/* the entry point of the launcher (registered by _PG_init, by name) */
extern PGDLLEXPORT void eventgrid_launcher_main(Datum arg);

/* Launcher entry point, registered in _PG_init(). */
void
eventgrid_launcher_main(Datum arg)
{
	TimestampTz next_scan = 0;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("eventgrid launcher");
	handles = MemoryContextAllocZero(TopMemoryContext, eg_shared->ndb * NWORKERS * sizeof(EgWorkerHandle));
	for (int i = 0; i < eg_shared->ndb * NWORKERS; i++)
		handles[i].backoff_ms = EG_BACKOFF_MIN_MS;

	before_shmem_exit(clear_launcher, (Datum) 0);
	SpinLockAcquire(&eg_shared->mutex);
	eg_shared->launcher_pid = MyProcPid;
	eg_shared->launcher_latch = MyLatch;
	SpinLockRelease(&eg_shared->mutex);

	if (strcmp(eg_database_name, "postgres") != 0)
		ereport(LOG,
				(errmsg("eventgrid: eventgrid.database_name (\"%s\") is no longer used; every database where the extension is created is served",
						eg_database_name),
				 errhint("Remove the setting from postgresql.conf.")));

	for (;;)
	{
		TimestampTz now = GetCurrentTimestamp();
		TimestampTz wake_at;

		CHECK_FOR_INTERRUPTS();
		if (now >= next_scan)
		{
			scan_databases();
			next_scan = now + (TimestampTz) EG_SCAN_INTERVAL_MS * 1000;
		}
		wake_at = Min(tend_databases(now), next_scan);
		pgstat_report_activity(STATE_IDLE, NULL);
		now = GetCurrentTimestamp();
		if (wake_at > now)
			launcher_sleep((long) Min((wake_at - now + 999) / 1000, (TimestampTz) EG_BACKOFF_MAX_MS));
	}
}
