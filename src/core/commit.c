/*
 * commit.c - what a transaction leaves for when it commits: the wake-up
 * that publishing transactions use so delivery starts at once without
 * polling (SPEC section 2), the consumers waiting in receive() woken for
 * their own queue subscriptions (SPEC 14), the delivery workers told that
 * subscriptions or publications changed, the launcher told that the
 * extension changed, and the holds of a database's workers for DDL let go
 * (eg_xact_callback, one per backend, registered on first use).  No-ops
 * where the library is not preloaded.
 */
#include "core/eventgrid.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/array.h"

static bool wake_at_commit = false;
static bool subscriptions_changed_at_commit = false;
static bool events_at_commit = false;	/* the transaction published events */

/*
 * Queue subscriptions whose waiting consumers are woken: at commit, those
 * the transaction made events of receivable; at its end, those it locked
 * events of with receive().  Past EG_WAKE_SIDS (or for -1) every
 * subscription of the database.
 */
#define EG_WAKE_SIDS 32
typedef struct EgSidSet
{
	int			n;				/* -1: every subscription */
	int64		sids[EG_WAKE_SIDS];
} EgSidSet;
static EgSidSet receivers_at_commit = {0};
static EgSidSet receivers_at_end = {0};
static bool publications_changed_at_commit = false;
static uint64 local_publications_changes = 0;	/* this backend's own, seen at once */
static bool extension_changed_at_commit = false;
static bool dropped_at_commit = false;
static bool xact_callback_registered = false;

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

static void
sid_set_add(EgSidSet *set, int64 sid)
{
	if (set->n < 0)
		return;
	if (sid < 0 || set->n == EG_WAKE_SIDS)
	{
		set->n = -1;
		return;
	}
	for (int i = 0; i < set->n; i++)
		if (set->sids[i] == sid)
			return;
	set->sids[set->n++] = sid;
}

/*
 * Wakes the consumers waiting for the subscriptions of set (only those
 * sleeping on events a transaction holds when held_only); every condition
 * variable for "every subscription" (a commit that changed many, or the
 * extension: waiters of other databases that share one look once more).
 */
static void
wake_receivers(const EgSidSet *set, bool held_only)
{
	if (set->n == 0 || eg_queue_cv(MyDatabaseId, 0) == NULL)
		return;
	if (set->n < 0)
	{
		for (int i = 0; i < EG_QUEUE_CVS; i++)
			if (!held_only || pg_atomic_read_u32(&eg_shared->queue_held_waiters[i]) > 0)
				eg_queue_broadcast(i);
		return;
	}
	for (int i = 0; i < set->n; i++)
		if (!held_only || pg_atomic_read_u32(eg_queue_held_waiters(MyDatabaseId, set->sids[i])) > 0)
			eg_queue_broadcast(eg_queue_cv_index(MyDatabaseId, set->sids[i]));
}

/* See eventgrid.h. */
void
eg_subscriptions_changed(void)
{
	EgDbSlot   *db = eg_shared ? eg_db_find(MyDatabaseId, true) : NULL;

	if (db == NULL)
		return;
	SpinLockAcquire(&eg_shared->mutex);
	if (db->dboid == MyDatabaseId)
	{
		db->change_generation++;
		db->no_subscriptions = false;
	}
	SpinLockRelease(&eg_shared->mutex);
}

static void
eg_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_COMMIT:
			if (subscriptions_changed_at_commit)
				eg_subscriptions_changed();
			if (publications_changed_at_commit && eg_shared != NULL)
				pg_atomic_fetch_add_u64(&eg_shared->publications_generation, 1);
			if (wake_at_commit)
				eg_wake_worker();
			else if (events_at_commit)
				eg_db_wake_for_events(MyDatabaseId);
			/* the extension's waiters see it gone, or of another version */
			if (extension_changed_at_commit)
				sid_set_add(&receivers_at_commit, -1);
			wake_receivers(&receivers_at_commit, false);
			wake_receivers(&receivers_at_end, true);
			if (extension_changed_at_commit)
				eg_db_extension_changed(MyDatabaseId);
			eg_db_release_holds(dropped_at_commit);
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			wake_receivers(&receivers_at_end, true);
			eg_db_release_holds(false);
			break;
		default:
			return;
	}
	wake_at_commit = false;
	events_at_commit = false;
	receivers_at_commit.n = 0;
	receivers_at_end.n = 0;
	publications_changed_at_commit = false;
	subscriptions_changed_at_commit = false;
	extension_changed_at_commit = false;
	dropped_at_commit = false;
}

PG_FUNCTION_INFO_V1(eventgrid_wake_worker_at_commit);

/* The commit callback, registered once per backend.  See eventgrid.h. */
void
eg_register_xact_callback(void)
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
	eg_register_xact_callback();
	wake_at_commit = true;
}

/*
 * SQL: eventgrid._wake_worker_at_commit().  Called by configuration
 * changes that give the delivery workers something to do without
 * publishing (an endpoint validated, dead letters redelivered, a
 * subscription created or updated): sets their latches once when the
 * current transaction commits, and counts as a change to event
 * subscriptions (eg_subscriptions_changed()), so that their next claim
 * sweeps.  No-op when not preloaded.
 */
Datum
eventgrid_wake_worker_at_commit(PG_FUNCTION_ARGS)
{
	if (eg_shared == NULL)
		PG_RETURN_VOID();
	eg_wake_worker_at_commit();
	subscriptions_changed_at_commit = true;
	PG_RETURN_VOID();
}

/* See eventgrid.h. */
void
eg_wake_receivers_at_commit(int64 sid)
{
	eg_register_xact_callback();
	sid_set_add(&receivers_at_commit, sid);
}

/* See eventgrid.h. */
void
eg_wake_receivers_at_end(int64 sid)
{
	eg_register_xact_callback();
	sid_set_add(&receivers_at_end, sid);
}

PG_FUNCTION_INFO_V1(eventgrid_wake_receivers_at_commit);

/*
 * SQL: eventgrid._wake_receivers_at_commit([subscription_ids bigint[]]):
 * wakes the consumers waiting in receive() for those queue subscriptions
 * (without the argument, or NULL: for every one of the database) when the
 * current transaction commits.  No-op without shared_preload_libraries.
 */
Datum
eventgrid_wake_receivers_at_commit(PG_FUNCTION_ARGS)
{
	if (PG_NARGS() == 0 || PG_ARGISNULL(0))
		eg_wake_receivers_at_commit(-1);
	else
	{
		ArrayType  *a = PG_GETARG_ARRAYTYPE_P(0);
		Datum	   *ids;
		bool	   *nulls;
		int			n;

		deconstruct_array(a, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE, &ids, &nulls, &n);
		for (int i = 0; i < n; i++)
			if (!nulls[i])
				eg_wake_receivers_at_commit(DatumGetInt64(ids[i]));
	}
	PG_RETURN_VOID();
}

void
eg_wake_for_events_at_commit(void)
{
	eg_register_xact_callback();
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
	eg_register_xact_callback();
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

/* See eventgrid.h. */
void
eg_extension_changed_at_commit(void)
{
	eg_register_xact_callback();
	extension_changed_at_commit = true;
}

/* See eventgrid.h. */
void
eg_database_dropped_at_commit(void)
{
	dropped_at_commit = true;
}
