/*
 * delivery_status.c - what a delivery worker shows in pg_stat_activity
 * (its status line: delivering, idle, paused, waiting for the extension,
 * failing) and logs when eventgrid.delivery_paused changes.
 */
#include "delivery/delivery.h"
#include "core/rate.h"
#include "delivery/endpoint.h"
#include "store/worker.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#define EG_STATUS_INTERVAL_MS 250
#define EG_PAUSE_READ_INTERVAL_MS 1000
static char status_kind = 0;
static TimestampTz status_at = 0;
static uint64 status_units = 0;	/* eg_units_committed when the text was set */
static bool was_paused = false;


/*
 * What pause_delivery() paused, for the status line: read again when a
 * pause or resume committed (eg_my_db->change_generation) and, while the
 * worker delivers, at most every EG_PAUSE_READ_INTERVAL_MS (a dropped
 * subscription takes its pause with it).
 */
static void
pause_suffix(char *buf, size_t len, TimestampTz now, bool idle)
{
	static TimestampTz read_at = 0;
	static uint64 read_generation = PG_UINT64_MAX;
	static int64 paused = 0;
	static bool all = false;
	uint64		generation;

	SpinLockAcquire(&eg_shared->mutex);
	generation = eg_my_db->change_generation;
	SpinLockRelease(&eg_shared->mutex);
	if ((generation != read_generation ||
		 (!idle && now - read_at >= (TimestampTz) EG_PAUSE_READ_INTERVAL_MS * 1000)) &&
		eg_store_readiness == EG_READY_OK)
	{
		read_at = now;
		if (eg_begin_work("eventgrid: reading what pause_delivery() paused"))
		{
			paused = eg_store_pauses(&all);
			eg_end_work();
			read_generation = generation;
		}
	}
	if (all)
		snprintf(buf, len, "; every event subscription paused by pause_delivery()");
	else if (paused > 0)
		snprintf(buf, len, "; %lld event subscription%s paused by pause_delivery()",
				 (long long) paused, paused == 1 ? "" : "s");
	else
		buf[0] = '\0';
}

/*
 * Shows in pg_stat_activity what the delivery worker does: waiting for the
 * extension, retrying failed database work, paused, delivering (requests in
 * flight and waiting, outcomes to record, the memory its deliveries hold
 * against eventgrid.max_bytes_in_flight, the backlog the upkeep worker last
 * counted) or idle (and when the next retry is due).  The text is replaced
 * when its kind changes or a unit of work replaced it, else at most every
 * EG_STATUS_INTERVAL_MS.  Logs pausing and resuming once each.
 */
void
eg_delivery_report_status(TimestampTz next_claim_at)
{
	char		text[320];
	char		paused[80];
	char		kind;
	int			in_flight = eg_http_in_flight();
	int			waiting = eg_targets_queued() + eg_ordering_waiting();	/* queued, or behind an earlier request of their ordering keys */
	TimestampTz now = GetCurrentTimestamp();

	if (eg_delivery_paused != was_paused)
	{
		was_paused = eg_delivery_paused;
		if (was_paused)
			ereport(LOG,
					(errmsg("eventgrid: delivery paused (eventgrid.delivery_paused = on); %d requests in flight will finish, nothing new is claimed",
							in_flight)));
		else
			ereport(LOG, (errmsg("eventgrid: delivery resumed (eventgrid.delivery_paused = off)")));
	}

	kind = eg_store_readiness == EG_READY_MISSING ? 'm'
		: eg_store_readiness == EG_READY_VERSION ? 'v'
		: eg_error_streak > 0 ? 'e'
		: eg_delivery_paused ? 'p'
		: (in_flight > 0 || waiting > 0 || eg_dw.to_record_n > 0) ? 'd'
		: 'i';
	if (kind == status_kind && status_units == eg_units_committed &&
		now - status_at < (TimestampTz) EG_STATUS_INTERVAL_MS * 1000)
		return;

	if (kind == 'd' || kind == 'i')
		pause_suffix(paused, sizeof(paused), now, kind == 'i');
	switch (kind)
	{
		case 'm':
			snprintf(text, sizeof(text), "eventgrid: waiting for CREATE EXTENSION eventgrid in this database");
			break;
		case 'v':
			snprintf(text, sizeof(text), "eventgrid: waiting for ALTER EXTENSION eventgrid UPDATE TO '%s'", EG_VERSION);
			break;
		case 'e':
			snprintf(text, sizeof(text), "eventgrid: database work failed %d times in a row (see the server log); trying again",
					 eg_error_streak);
			break;
		case 'p':
			snprintf(text, sizeof(text), "eventgrid: paused (eventgrid.delivery_paused); %d requests in flight", in_flight);
			break;
		case 'd':
			{
				int64		backlog;

				SpinLockAcquire(&eg_shared->mutex);
				backlog = eg_my_db->backlog;
				SpinLockRelease(&eg_shared->mutex);
				snprintf(text, sizeof(text),
						 "eventgrid: delivering: %d requests in flight, %d waiting to be sent, %d outcomes to record, %lld kB held; backlog of %s %lld deliveries%s",
						 in_flight, waiting, eg_dw.to_record_n, (long long) ((eg_dw.bytes_held + 1023) / 1024),
						 backlog >= EG_BACKLOG_COUNT_LIMIT ? "at least" : "about",
						 (long long) Min(backlog, EG_BACKLOG_COUNT_LIMIT), paused);
				break;
			}
		default:
			if (next_claim_at > 0 && next_claim_at < DT_NOEND)
				snprintf(text, sizeof(text), "eventgrid: idle; next retry due at %s%s",
						 timestamptz_to_str(next_claim_at), paused);
			else
				snprintf(text, sizeof(text), "eventgrid: idle%s", paused);
			break;
	}
	status_kind = kind;
	status_units = eg_units_committed;
	status_at = now;
	pgstat_report_activity(kind == 'd' ? STATE_RUNNING : STATE_IDLE, text);
}
