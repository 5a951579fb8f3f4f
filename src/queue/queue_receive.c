/*
 * queue_receive.c - eventgrid.receive(): the long poll of pull delivery
 * (queue event subscriptions, SPEC 14).
 *
 * The delivery workers move what becomes visible to a queue subscription
 * from its position into eventgrid.queue_events (_position_to_retries())
 * and, at commit, broadcast on the database's condition variable
 * (eg_queue_cv()).  receive() takes receivable events with
 * eventgrid._queue_take() (FOR UPDATE SKIP LOCKED, in the caller's
 * transaction) and, finding none, sleeps on that condition variable until
 * a broadcast, the next lock expiry or release delay, or the end of its
 * wait.  It reads no event table: a waiting call holds no lock a rotation
 * needs.  The other subscriber operations (acknowledge, release, reject,
 * renew_locks) are SQL functions.
 */
#include "core/eventgrid.h"

#include "access/xact.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

/* SPEC 14: maxEvents 1-100, maxWaitTime 10-120 s */
#define EG_RECEIVE_MAX_EVENTS 100
#define EG_RECEIVE_MIN_WAIT_S 10
#define EG_RECEIVE_MAX_WAIT_S 120
/* how long to sleep when receivable events are held by another consumer's open transaction */
#define EG_RECEIVE_HELD_RETRY_MS 50

PG_FUNCTION_INFO_V1(eventgrid_receive);

static void
check_range(const char *field, int32 v, int32 lo, int32 hi, const char *unit)
{
	if (v < lo || v > hi)
		ereport(ERROR,
				(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE),
				 errmsg("%s must be between %d and %d%s, got %d", field, lo, hi, unit, v)));
}

/*
 * eventgrid.receive(topic, subscription, max_events 1-100, max_wait_time
 * 10-120 s) -> (lock_token, delivery_count, event): up to max_events
 * receivable events of a queue event subscription, each now locked for its
 * receive_lock_duration; returns as soon as there is one, empty after
 * max_wait_time seconds.  READ COMMITTED only (each look needs a new
 * snapshot).  Errors: 22004 NULL, 22003 out of range, 42704 no such
 * subscription, 42809 not a queue subscription, 0A000 in REPEATABLE READ
 * or SERIALIZABLE, 55000 without shared_preload_libraries.  SECURITY
 * DEFINER: eventgrid_receiver may call it.
 */
Datum
eventgrid_receive(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int32		max_events;
	int32		max_wait;
	int64		sid;
	ConditionVariable *cv;
	TimestampTz deadline;
	Datum		args[2];
	Oid			types[2] = {INT8OID, INT4OID};
	bool		isnull;

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
	cv = eg_queue_cv(MyDatabaseId);
	if (cv == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("eventgrid.receive() needs eventgrid in shared_preload_libraries"),
				 errhint("The delivery workers bring events to queue subscriptions; add eventgrid to shared_preload_libraries and restart.")));

	InitMaterializedSRF(fcinfo, 0);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	args[0] = PG_GETARG_DATUM(0);
	args[1] = PG_GETARG_DATUM(1);
	if (SPI_execute_with_args("SELECT eventgrid._queue_subscription_id($1, $2)", 2,
							  (Oid[]) {TEXTOID, TEXTOID}, args, NULL, false, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not look up the queue subscription");
	sid = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));

	deadline = GetCurrentTimestamp() + (TimestampTz) max_wait * USECS_PER_SEC;
	args[0] = Int64GetDatum(sid);
	args[1] = Int32GetDatum(max_events);
	for (;;)
	{
		long		remaining_ms;
		long		sleep_ms;
		Datum		next;

		/* on the wait list before looking: a broadcast after the look wakes the sleep */
		ConditionVariablePrepareToSleep(cv);
		if (SPI_execute_with_args("SELECT t.lock_token, t.delivery_count, t.event FROM eventgrid._queue_take($1, $2) t",
								  2, types, args, NULL, false, 0) != SPI_OK_SELECT)
			elog(ERROR, "could not take events of the queue subscription");
		if (SPI_processed > 0)
		{
			for (uint64 i = 0; i < SPI_processed; i++)
			{
				Datum		values[3];
				bool		nulls[3];

				for (int c = 0; c < 3; c++)
					values[c] = SPI_getbinval(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, c + 1, &nulls[c]);
				tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
			}
			break;
		}
		SPI_freetuptable(SPI_tuptable);
		remaining_ms = (long) ((deadline - GetCurrentTimestamp()) / 1000);
		if (remaining_ms <= 0)
			break;
		/* the next lock expiry or end of a release delay, in milliseconds (NULL: none) */
		if (SPI_execute_with_args("SELECT ceil(extract(epoch FROM min(q.receivable_at) - eventgrid._clock_now()) * 1000)::int8"
								  "  FROM eventgrid.queue_events q WHERE q.subscription_id = $1",
								  1, types, args, NULL, false, 1) != SPI_OK_SELECT)
			elog(ERROR, "could not look for the next receivable event");
		next = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		sleep_ms = remaining_ms;
		if (!isnull)
			sleep_ms = Min(sleep_ms, Max(DatumGetInt64(next), EG_RECEIVE_HELD_RETRY_MS));
		SPI_freetuptable(SPI_tuptable);
		(void) ConditionVariableTimedSleep(cv, sleep_ms, PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
	SPI_finish();
	return (Datum) 0;
}
