/*
 * queue_receive.c - eventgrid.receive(): the long poll of pull delivery
 * (queue event subscriptions, SPEC 14).
 *
 * The delivery workers make what becomes visible to a queue subscription
 * receivable where it is, as references in eventgrid.queue_batches
 * (_position_to_queue()), and, at commit, broadcast on that subscription's
 * condition variable (eg_queue_cv()).  receive() takes receivable events
 * with eventgrid._queue_take() (FOR UPDATE SKIP LOCKED, in a subtransaction
 * of the caller's transaction, kept when it took something: it reads the
 * events in the event tables and writes a lock row for each) and, finding
 * none, sleeps on that condition variable until a broadcast, the next lock
 * expiry or release delay, or the end of its wait: commits for other
 * subscriptions do not wake it.  Events it sees receivable but cannot lock
 * are held by another consumer's open transaction: it counts itself among
 * the held waiters of the condition variable, and the end of that
 * transaction wakes it (no polling).  It holds no lock while it sleeps
 * (each look is a subtransaction, rolled back when it took nothing), so
 * the event tables rotate under waiting consumers.  The other subscriber
 * operations (acknowledge, release, reject, renew_locks) are in
 * queue_access.c.
 */
#include "core/eventgrid.h"
#include "queue/queue.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

/* SPEC 14: maxEvents 1-100, maxWaitTime 10-120 s */
#define EG_RECEIVE_MAX_EVENTS 100
#define EG_RECEIVE_MIN_WAIT_S 10
#define EG_RECEIVE_MAX_WAIT_S 120
/*
 * The longest sleep on receivable events that another transaction holds:
 * the end of the transaction that locked them wakes the sleep (commit.c),
 * so this only bounds a holder that ends without saying so (a prepared
 * transaction committed elsewhere, a crash).
 */
#define EG_RECEIVE_HELD_RECHECK_MS 5000
/* how long a look may start from where this backend's last look found events (below) */
#define EG_RECEIVE_HINT_MS 1000

/*
 * Where this backend's next look at a subscription's queue starts.  A
 * drained queue's index on (subscription_id, receivable_at, id) begins with
 * the entries of every event taken since the last VACUUM (a lock moves its
 * event to the index's end, an acknowledge deletes it): a look from the
 * start walks them all, more the longer a drain runs.  Events become
 * receivable in receivable_at order (each move into the queue, release
 * and lock is stamped with the time it is made), so the earliest
 * receivable_at the last look took is a bound below which only events that
 * another session skipped then can be; those (its transaction rolled back)
 * are found by a look from the start, which is made once a second, and
 * whenever a look from the bound finds nothing.
 */
static int64 hint_sid = 0;
static TimestampTz hint_at;
static TimestampTz hint_until;

PG_FUNCTION_INFO_V1(eventgrid_receive);

static void
check_range(const char *field, int32 v, int32 lo, int32 hi, const char *unit)
{
	if (v < lo || v > hi)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("%s must be between %d and %d%s, got %d", field, lo, hi, unit, v),
				 errhint("Choose a whole number from %d to %d%s.", lo, hi, unit)));
}

/* One look at the queue: take what is receivable (kept), or learn how long to sleep (rolled back). */
typedef struct Look
{
	ReturnSetInfo *rsinfo;
	int64		sid;
	int32		max_events;
	bool		hinted;			/* from the bound of this backend's last look */
	uint64		rows;			/* rows _queue_take() returned */
	int			got;			/* events among them */
	long		next_ms;		/* -1: no lock or release delay ends */
	bool		held;			/* receivable events that another transaction locks */
	bool		exists;			/* the subscription is still there */
	Datum		topic;			/* the names receive() was given */
	Datum		subscription;
	Oid			caller;			/* the role that called */
} Look;

static bool
take(void *arg)
{
	Look	   *l = arg;
	Datum		args[3] = {Int64GetDatum(l->sid), Int32GetDatum(l->max_events),
	TimestampTzGetDatum(l->hinted ? hint_at : DT_NOBEGIN)};

	/*
	 * FOR UPDATE SKIP LOCKED locks a row that another consumer locked and
	 * committed after this look's snapshot even when the row no longer
	 * qualifies; a look that finds nothing is rolled back, so that such
	 * locks are not held while it waits (another consumer's acknowledge of
	 * that row would wait with it).
	 */
	if (SPI_execute_with_args("SELECT t.lock_token, t.delivery_count, t.event, t.was_receivable_at"
							  "  FROM eventgrid._queue_take($1, $2, $3) t",
							  3, (Oid[]) {INT8OID, INT4OID, TIMESTAMPTZOID}, args, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "could not take events of the queue subscription");
	l->rows = SPI_processed;
	l->got = 0;
	for (uint64 i = 0; i < l->rows; i++)
	{
		Datum		values[4];
		bool		nulls[4];

		for (int c = 0; c < 4; c++)
			values[c] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, c + 1, &nulls[c]);
		if (nulls[0])
			continue;			/* the row that says it dead-lettered events and took none */
		tuplestore_putvalues(l->rsinfo->setResult, l->rsinfo->setDesc, values, nulls);
		if (l->got++ == 0 || DatumGetTimestampTz(values[3]) < hint_at)
			hint_at = DatumGetTimestampTz(values[3]);
	}
	SPI_freetuptable(SPI_tuptable);
	return l->rows > 0;
}

/*
 * Before a sleep: how long until the next lock or release delay of the
 * subscription ends, and whether events are receivable now after all
 * (other consumers' locks not committed yet, or events that came since the
 * take); neither once the subscription expired.  Rolled back: the sleep
 * holds no lock.
 */
static bool
look_ahead(void *arg)
{
	Look	   *l = arg;
	Datum		a = Int64GetDatum(l->sid);
	bool		isnull;
	Datum		next;

	/* an expired subscription (SPEC 17) has nothing receivable: the drop that follows wakes the sleep */
	if (SPI_execute_with_args("SELECT CASE WHEN NOT x.expired THEN"
							  "         ceil(extract(epoch FROM (SELECT min(q.receivable_at) FROM eventgrid.queue_events q"
							  "                                   WHERE q.subscription_id = $1"
							  "                                     AND q.receivable_at > eventgrid._clock_now()) - eventgrid._clock_now()) * 1000)::int8"
							  "       END,"
							  "       NOT x.expired AND (EXISTS (SELECT 1 FROM eventgrid.queue_events q WHERE q.subscription_id = $1"
							  "                                     AND q.receivable_at <= eventgrid._clock_now())"
							  "                          OR EXISTS (SELECT 1 FROM eventgrid.queue_batches b WHERE b.subscription_id = $1))"
							  "  FROM (SELECT coalesce((SELECT s.expiration_time <= eventgrid._clock_now()"
							  "                           FROM eventgrid.event_subscriptions s WHERE s.id = $1), false) AS expired) x",
							  1, (Oid[]) {INT8OID}, &a, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look for the next receivable event");
	next = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	l->next_ms = isnull ? -1 : Max(DatumGetInt64(next), 1);
	l->held = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	SPI_freetuptable(SPI_tuptable);
	return false;
}

/* The caller's right to the subscription, as receive() checked it first (look_while_there). */
static bool
check_right(void *arg)
{
	Look	   *l = arg;

	(void) eg_queue_subscription_for(l->topic, l->subscription, l->caller);
	return false;
}

static bool
look_for_subscription(void *arg)
{
	Look	   *l = arg;
	Datum		a = Int64GetDatum(l->sid);
	bool		isnull;

	if (SPI_execute_with_args("SELECT EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s WHERE s.id = $1)",
							  1, (Oid[]) {INT8OID}, &a, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look for the queue subscription");
	l->exists = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_freetuptable(SPI_tuptable);
	return false;
}

/*
 * The OID of extension eventgrid as committed now (InvalidOid: none), read
 * from pg_extension with the latest snapshot.  Not get_extension_oid():
 * the commit of DROP EXTENSION wakes the sleep before it sends its catalog
 * invalidations, and PostgreSQL 18 keeps extensions by name in a catalog
 * cache, whose entry would still show the dropped extension then.
 */
static Oid
extension_oid_now(void)
{
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData key;
	HeapTuple	tup;
	Snapshot	snapshot = RegisterSnapshot(GetLatestSnapshot());
	Oid			oid = InvalidOid;

	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum("eventgrid"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, snapshot, 1, &key);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
		oid = ((Form_pg_extension) GETSTRUCT(tup))->oid;
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	UnregisterSnapshot(snapshot);
	return oid;
}

static pg_noreturn void
extension_gone(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("extension eventgrid was dropped while eventgrid.receive() waited"),
			 errhint("Call receive() again once the extension and the queue subscription exist.")));
}

/*
 * eg_queue_in_subxact(look, arg), and when it fails because the
 * extension went away meanwhile, the error that says so (55000): a sleep woken by
 * the commit of DROP EXTENSION may look before that commit's catalog
 * invalidations arrive, see the extension still there, and then find its
 * tables gone (extension_oid_now() reads what has committed).
 */
static void
look_while_there(bool (*look) (void *arg), void *arg, Oid extension)
{
	MemoryContext cxt = CurrentMemoryContext;

	PG_TRY();
	{
		eg_queue_in_subxact(look, arg);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		if (extension_oid_now() != extension)
			extension_gone();
		ReThrowError(edata);
	}
	PG_END_TRY();
}

/*
 * After a sleep: the extension and the subscription are still there, and
 * the caller may still receive from it; else a clear ERROR (55000 the
 * extension dropped or created again, 42704 the subscription dropped,
 * 42501 its right revoked).
 */
static void
still_there(Oid extension, Look *l)
{
	if (extension_oid_now() != extension)
		extension_gone();
	look_while_there(look_for_subscription, l, extension);
	if (!l->exists)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("event subscription \"%s\" of topic \"%s\" was dropped while eventgrid.receive() waited",
						TextDatumGetCString(l->subscription), TextDatumGetCString(l->topic))));
	look_while_there(check_right, l, extension);
}

/*
 * eventgrid.receive(topic, subscription, max_events 1-100, max_wait_time
 * 10-120 s) -> (lock_token, delivery_count, event): up to max_events
 * receivable events of a queue event subscription, each now locked for its
 * receive_lock_duration; returns as soon as there is one, empty after
 * max_wait_time seconds.  READ COMMITTED only (each look needs a new
 * snapshot).  SECURITY INVOKER, so that the caller's right is known
 * (queue_access.c); it runs as the extension's owner.  Each look is a
 * subtransaction, rolled back when it took nothing: the wait holds no lock
 * (DROP EXTENSION, ALTER EXTENSION UPDATE and drop_event_subscription()
 * do not wait for it), and after each sleep the subscription, the
 * extension and the caller's right are looked at again.  Errors: 22004
 * NULL, 22003 out of range, 42501 no right to the subscription, 42704 no
 * such subscription (or dropped during the wait), 42809 not a queue
 * subscription, 0A000 in REPEATABLE READ or SERIALIZABLE, 55000 without
 * shared_preload_libraries or the extension dropped during the wait.
 */
Datum
eventgrid_receive(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int32		max_events;
	int32		max_wait;
	ConditionVariable *cv;
	TimestampTz deadline;
	pg_atomic_uint32 *held_waiters;
	pg_atomic_uint64 *wakes_seen;
	volatile bool counted = false;	/* among the held waiters */
	Look		l = {0};
	EgQueueCaller c;
	Oid			extension;
	volatile bool slept = false;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2) || PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("topic, subscription, max_events and max_wait_time must not be NULL")));
	max_events = PG_GETARG_INT32(2);
	max_wait = PG_GETARG_INT32(3);
	check_range("max_events", max_events, 1, EG_RECEIVE_MAX_EVENTS, "");
	check_range("max_wait_time", max_wait, EG_RECEIVE_MIN_WAIT_S, EG_RECEIVE_MAX_WAIT_S, " seconds");
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("eventgrid.receive() cannot wait in a REPEATABLE READ or SERIALIZABLE transaction"),
				 errhint("Call it in READ COMMITTED (the default), where each look sees what has committed since.")));
	if (eg_queue_cv(MyDatabaseId, 0) == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("eventgrid.receive() needs eventgrid in shared_preload_libraries"),
				 errhint("The delivery workers bring events to queue subscriptions; add eventgrid to shared_preload_libraries and restart.")));

	eg_materialized_srf(fcinfo);
	extension = get_extension_oid("eventgrid", false);
	eg_queue_enter(&c, fcinfo->flinfo->fn_oid);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	l.rsinfo = rsinfo;
	l.max_events = max_events;
	l.topic = PG_GETARG_DATUM(0);
	l.subscription = PG_GETARG_DATUM(1);
	l.caller = c.caller;
	l.sid = eg_queue_subscription_for(l.topic, l.subscription, l.caller);
	cv = eg_queue_cv(MyDatabaseId, l.sid);
	held_waiters = eg_queue_held_waiters(MyDatabaseId, l.sid);
	wakes_seen = eg_queue_wakes(MyDatabaseId, l.sid);

	deadline = GetCurrentTimestamp() + (TimestampTz) max_wait * USECS_PER_SEC;
	PG_TRY();
	{
		for (;;)
		{
			long		remaining_ms;
			long		sleep_ms;

			uint64		wakes = pg_atomic_read_u64(wakes_seen);

			if (slept)
				still_there(extension, &l);
			slept = false;
			l.hinted = hint_sid == l.sid && GetCurrentTimestamp() < hint_until;
			look_while_there(take, &l, extension);
			if (l.got > 0)
			{
				eg_wake_receivers_at_end(l.sid);
				if (!l.hinted)
				{
					hint_sid = l.sid;
					hint_until = GetCurrentTimestamp() + (TimestampTz) EG_RECEIVE_HINT_MS * 1000;
				}
				break;
			}
			if (l.rows > 0 || l.hinted)
			{
				/* events dead-lettered, or nothing from the bound: look again (from the start) */
				hint_sid = 0;
				continue;
			}
			remaining_ms = (long) ((deadline - GetCurrentTimestamp()) / 1000);
			if (remaining_ms <= 0)
				break;

			look_while_there(look_ahead, &l, extension);
			sleep_ms = l.next_ms < 0 ? remaining_ms : Min(remaining_ms, l.next_ms);
			if (l.held && !counted)
			{
				/*
				 * Counted first, then looked again: a holder that ended
				 * before it saw the count has ended before that look.
				 */
				pg_atomic_fetch_add_u32(held_waiters, 1);
				counted = true;
				continue;
			}
			if (!l.held && counted)
			{
				pg_atomic_fetch_sub_u32(held_waiters, 1);
				counted = false;
			}
			if (l.held)
				sleep_ms = Min(sleep_ms, EG_RECEIVE_HELD_RECHECK_MS);

			/*
			 * On the wait list only now (the looks' rollbacks would take it
			 * off): a broadcast since the take, which read the count, means
			 * a commit the looks may not have seen: look again at once.
			 */
			ConditionVariablePrepareToSleep(cv);
			if (pg_atomic_read_u64(wakes_seen) == wakes)
				(void) ConditionVariableTimedSleep(cv, sleep_ms, PG_WAIT_EXTENSION);
			ConditionVariableCancelSleep();
			slept = true;
		}
	}
	PG_FINALLY();
	{
		if (counted)
			pg_atomic_fetch_sub_u32(held_waiters, 1);
		counted = false;
	}
	PG_END_TRY();
	ConditionVariableCancelSleep();
	SPI_finish();
	eg_queue_leave(&c);
	return (Datum) 0;
}
