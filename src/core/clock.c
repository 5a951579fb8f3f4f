/*
 * clock.c - eventgrid's clock (the real one moved ahead by
 * eventgrid.clock_offset, for tests and demos) and the turns of the three
 * event tables, which follow it.
 */
#include "core/eventgrid.h"

#include "access/xact.h"
#include "fmgr.h"
#include "utils/timestamp.h"

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

PG_FUNCTION_INFO_V1(eventgrid_clock_now);

/*
 * SQL: eventgrid._clock_now(), eg_now(): clock_timestamp() moved ahead by
 * eventgrid.clock_offset, for the lock times of pull delivery, which a
 * long-polling receive() compares with the time it looks, not with its
 * transaction's start.  VOLATILE, like clock_timestamp().
 */
Datum
eventgrid_clock_now(PG_FUNCTION_ARGS)
{
	PG_RETURN_TIMESTAMPTZ(eg_now());
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
