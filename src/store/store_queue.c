/*
 * store_queue.c - the upkeep of queue event subscriptions (SPEC 14, pull
 * delivery) that no consumer's call does: events whose time to live ran
 * out, or whose lock expired on their last allowed delivery, while nobody
 * received.
 */
#include "store/store.h"

#include "catalog/pg_type_d.h"
#include "utils/timestamp.h"

static EgStatement expire_queue = {
	.name = "queue expiry",
	.sql = "SELECT eventgrid._queue_expire($1)",
	.nargs = 1,
	.types = {TIMESTAMPTZOID},
};

/*
 * Dead-letters (or drops) the receivable events of every queue
 * subscription that are past their time to live or were delivered
 * max_delivery_count times (eventgrid._queue_expire()); returns how many.
 * In a unit of work (the upkeep worker's).
 */
int64
eg_store_expire_queue(TimestampTz now)
{
	Datum		arg = TimestampTzGetDatum(now);

	eg_store_run(&expire_queue, &arg, false, SPI_OK_SELECT);
	return eg_int64_col(SPI_tuptable, 0, 1, 0);
}
