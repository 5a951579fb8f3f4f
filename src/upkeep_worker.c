/*
 * upkeep_worker.c - the upkeep worker, a process of its own beside the
 * delivery workers (TRUNCATE and its commit take milliseconds that would
 * otherwise stall delivery), started by the launcher when it looks into a
 * database or upkeep is due, and leaving when idle.  About once a second
 * while there is work or an event table holds rows it starts afresh
 * positions restored from another
 * cluster, turns chunks and leases that stopped delivery workers left into
 * retries, counts published and unmatched events, forgets the health of
 * endpoints no subscription uses, empties event tables that nothing needs
 * any more, rotates the attempt history, sends endpoint validation
 * handshakes (validation.c), counts the backlog (every 5 s)
 * and logs a summary of dead-lettered and dropped events (every minute).
 * Each step is its own unit of work (worker.c).
 */
#include "store/store.h"
#include "publish/wal_source.h"
#include "store/worker.h"
#include "delivery/validation.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "storage/latch.h"
#include "utils/timestamp.h"

#define EG_UPKEEP_INTERVAL_MS 1000
#define EG_UPKEEP_IDLE_INTERVAL_MS 60000	/* upkeep while idle (the summary of dead letters among it) */
#define EG_BACKLOG_INTERVAL_MS 5000
#define EG_SUMMARY_INTERVAL_MS 60000
#define EG_CERTIFICATE_CHECK_INTERVAL_MS (60 * 60 * 1000)
#define EG_CERTIFICATE_WARN_DAYS 7
#define EG_QUEUE_SWEEP_INTERVAL_MS 10000	/* queue subscriptions' expired events (a scan of their receivable ones) */

static TimestampTz backlog_at = 0;
static TimestampTz certificates_checked_at = 0;
static TimestampTz next_expiration = DT_NOEND;	/* the next event subscription's expiration (workers' clock) */
static TimestampTz queue_swept_at = 0;	/* 0: at the next upkeep (also after new settings: the clock may have moved) */

static void log_summary(void);
static void warn_expiring_certificates(void);
static bool drop_expired(void);

/*
 * Notes in shared memory whether the database has no event subscription:
 * an application server whose events delivery servers receive by logical
 * replication then wakes no delivery worker at each commit (eg_db_wake()).
 * A subscription created, changed or dropped since the generation was read
 * (its commit clears the note) keeps it from being set; the subscriptions
 * are read in a snapshot taken after the generation (not the unit's, which
 * is older), so that one created before is seen.
 */
static void
note_subscriptions(void)
{
	uint64		generation;
	bool		none;

	SpinLockAcquire(&eg_shared->mutex);
	generation = eg_my_db->change_generation;
	SpinLockRelease(&eg_shared->mutex);
	none = !eg_store_has_subscriptions();
	SpinLockAcquire(&eg_shared->mutex);
	if (eg_my_db->dboid == MyDatabaseId)
		eg_my_db->no_subscriptions = none && eg_my_db->change_generation == generation;
	SpinLockRelease(&eg_shared->mutex);
}

/*
 * Upkeep of the queue: positions restored from another cluster start
 * afresh, the positions of subscriptions whose endpoint validation failed
 * pass what is published, chunks and in-flight retries of delivery workers that no longer
 * run become retries (eg_store_recover), published and unmatched events
 * are counted, receive grants of dropped roles deleted (and the others'
 * role names kept current), queue subscriptions' events past their time to live or
 * delivery count are dead-lettered (eg_store_expire_queue; every 10 s, and
 * after new settings) (and whether the database has an event subscription is
 * noted), each event table other than the current one is emptied if
 * nothing needs it, expired event subscriptions are dropped
 * (drop_expired), and the attempt history is rotated when its current
 * table is due.  Each step is its own unit of work.  Runs in the upkeep worker.  Returns whether an event
 * table holds rows still (upkeep is then wanted again soon).
 */
static bool
upkeep(void)
{
	bool		used = false;

	TimestampTz now = eg_now();
	uint64		charged;
	uint64		taken;
	uint64		rebased = 0;
	int			current = eg_event_table_at(GetCurrentTimestamp());

	if (!eg_begin_work("eventgrid: counting published and unmatched events"))
		return false;
	/* not while paused: a pg_restore may still be writing positions and events */
	if (!eg_delivery_paused)
	{
		rebased = eg_store_rebase(now);
		eg_store_pass_failed(now);
	}
	eg_store_recover(0, now, eg_attempt_history != EG_HISTORY_OFF, &charged, &taken);
	eg_store_count_unmatched();
	eg_store_refresh_receive_grants();
	eg_store_forget_health();
	if (GetCurrentTimestamp() - queue_swept_at >= (TimestampTz) EG_QUEUE_SWEEP_INTERVAL_MS * 1000)
	{
		(void) eg_store_expire_queue(now);
		queue_swept_at = GetCurrentTimestamp();
	}
	note_subscriptions();
	eg_end_work();
	/*
	 * Retries made here are due at once: the delivery workers may be asleep
	 * until their next due time; and the positions whose leases were taken
	 * back (or that started afresh) are no worker's to look at again: their
	 * next claims sweep.
	 */
	if (rebased > 0 || taken > 0)
	{
		eg_subscriptions_changed();
		eg_wake_worker();
	}

	/* the slots a subscriber's initial copy may need the event tables for (store_rotation.c) */
	if (!eg_begin_work("eventgrid: noting replication slots"))
		return used;
	eg_store_note_replication_slots(GetCurrentTimestamp());
	eg_end_work();

	for (int k = 0; k < EG_EVENT_TABLES; k++)
	{
		if (!eg_begin_work("eventgrid: emptying an event table"))
			return used;
		/*
		 * Not while paused either: pg_restore (delivery paused, as the
		 * README asks) commits each table on its own, and an event table
		 * restored before the positions would look needed by nothing.
		 */
		if (k == current || eg_delivery_paused)
			used |= eg_store_table_used(k);
		else
			used |= eg_store_truncate(k, now) != NULL;
		eg_end_work();
	}

	/*
	 * Expired subscriptions after the event tables: one that cannot be
	 * dropped (locked elsewhere: skipped; or an ERROR) holds back nothing
	 * else.  Not while paused: a pg_restore may be writing subscriptions
	 * whose time has passed.
	 */
	if (eg_delivery_paused)
		next_expiration = DT_NOEND;
	else if (!drop_expired())
		return used;

	if (!eg_begin_work("eventgrid: rotating the attempt history"))
		return used;
	(void) eg_store_rotate_history(eg_now(), (int64) eg_attempt_history_retention_s * 500,
								   Max(eg_attempt_history_max_rows / 2, 1));
	eg_end_work();

	/* endpoint validations (validation.c): sent outside a unit of work, 30 s at most */
	used |= eg_validate_endpoints();

	/* a worker for each WAL source that has none (SPEC 19; they stay when this worker leaves) */
	if (!eg_begin_work("eventgrid: starting WAL source workers"))
		return used;
	eg_wal_sources_start();
	eg_end_work();

	if (GetCurrentTimestamp() - backlog_at >= (TimestampTz) EG_BACKLOG_INTERVAL_MS * 1000)
	{
		int64		backlog;

		if (!eg_begin_work("eventgrid: counting the backlog"))
			return used;
		backlog = eg_store_backlog(now);
		eg_end_work();
		backlog_at = GetCurrentTimestamp();
		SpinLockAcquire(&eg_shared->mutex);
		eg_my_db->backlog = backlog;
		SpinLockRelease(&eg_shared->mutex);
	}
	if (certificates_checked_at == 0 ||
		GetCurrentTimestamp() - certificates_checked_at >= (TimestampTz) EG_CERTIFICATE_CHECK_INTERVAL_MS * 1000)
	{
		if (!eg_begin_work("eventgrid: looking for client certificates about to expire"))
			return used;
		warn_expiring_certificates();
		eg_end_work();
		certificates_checked_at = GetCurrentTimestamp();
	}
	if (GetCurrentTimestamp() - eg_my_db->summary_at >= (TimestampTz) EG_SUMMARY_INTERVAL_MS * 1000)
	{
		if (!eg_begin_work("eventgrid: summing up dead-lettered and dropped events"))
			return used;
		log_summary();
		eg_end_work();
		eg_my_db->summary_at = GetCurrentTimestamp();
	}
	return used;
}

/*
 * Drops the event subscriptions whose expiration_time has come on the
 * workers' clock (SPEC 17), as drop_event_subscription() would (their dead
 * letters kept), once what each still owed is dead-lettered with reason
 * SubscriptionExpired (or dropped) and its final counts kept; logs each
 * once it has committed, with its topic and name (checked identifiers:
 * nothing else of the subscription is written).  One that another session
 * holds locked is passed over without waiting, tried again at each round,
 * and logged at most once a minute.  Notes when the next one expires, for
 * an upkeep round then.  Returns whether it ran (false: its unit of work
 * could not start).
 */
static bool
drop_expired(void)
{
	static TimestampTz skipped_logged_at = 0;
	EgExpired  *expired;
	int			n;
	char	  **lines;
	char	  **details;
	bool		log_skipped = GetCurrentTimestamp() - skipped_logged_at >= (TimestampTz) 60 * 1000 * 1000;
	bool		any_skipped = false;
	MemoryContext old;

	if (!eg_begin_work("eventgrid: dropping expired event subscriptions"))
		return false;
	n = eg_store_drop_expired(&expired, &next_expiration);
	/* the lines outlive the unit of work: they are logged once it has committed */
	old = MemoryContextSwitchTo(TopMemoryContext);
	lines = palloc0(Max(n, 1) * sizeof(char *));
	details = palloc0(Max(n, 1) * sizeof(char *));
	for (int i = 0; i < n; i++)
	{
		EgExpired  *x = &expired[i];

		if (x->skipped)
		{
			any_skipped = true;
			if (log_skipped)
				lines[i] = psprintf("eventgrid: event subscription \"%s\" of topic \"%s\" expired at %s and is not dropped yet",
									x->name, x->topic, timestamptz_to_str(x->expired_at));
			details[i] = pstrdup("Another session holds a lock on it or on its events, or deliveries of it are in flight; "
								 "the upkeep worker tries again at each round and goes on with its other work meanwhile.");
			continue;
		}
		lines[i] = psprintf("eventgrid: event subscription \"%s\" of topic \"%s\" expired at %s and was dropped",
							x->name, x->topic, timestamptz_to_str(x->expired_at));
		details[i] = psprintf(INT64_FORMAT " events it still owed were dead-lettered with reason SubscriptionExpired "
							  "(dropped, and counted so, when it does not dead-letter); its final counts are in "
							  "eventgrid.expired_event_subscriptions.", x->owed);
	}
	MemoryContextSwitchTo(old);
	eg_end_work();
	if (any_skipped && log_skipped)
		skipped_logged_at = GetCurrentTimestamp();
	for (int i = 0; i < n; i++)
	{
		if (lines[i])
		{
			ereport(LOG, (errmsg_internal("%s", lines[i]), errdetail_internal("%s", details[i])));
			pfree(lines[i]);
		}
		if (details[i])
			pfree(details[i]);
	}
	pfree(lines);
	pfree(details);
	return true;
}

/*
 * Warns, once an hour (and when the upkeep worker starts), of each client
 * certificate (SPEC 12, mutual TLS) that expires within 7 days or has
 * expired: a receiver that checks it will refuse the subscription's
 * requests from then on.  In a unit of work.
 */
static void
warn_expiring_certificates(void)
{
	char	  **topics;
	char	  **names;
	TimestampTz *not_after;
	int			n = eg_store_expiring_certificates(eg_now() + (TimestampTz) EG_CERTIFICATE_WARN_DAYS * USECS_PER_DAY,
												   &topics, &names, &not_after);

	for (int i = 0; i < n; i++)
		ereport(WARNING,
				(errmsg("eventgrid: the client certificate of event subscription \"%s\" of topic \"%s\" %s at %s",
						names[i], topics[i], not_after[i] <= eg_now() ? "expired" : "expires",
						timestamptz_to_str(not_after[i])),
				 errhint("Give it a new certificate with eventgrid.set_client_certificate().")));
}

/*
 * Logs, at most once a minute and only when there were any, how many events
 * were dead-lettered (by reason) and dropped since the last summary; the
 * first call only takes the baseline.  Never a line per event.  The
 * baseline is kept in the database's slot (only its upkeep worker writes
 * it), so that a new upkeep worker goes on from where the last one left.
 */
static void
log_summary(void)
{
	EgDbSlot   *db = eg_my_db;
	EgFinals	f = eg_store_finals(db->summary_dead_letter_id < 0 ? PG_INT64_MAX : db->summary_dead_letter_id);
	int64		dropped = db->summary_dead_letter_id < 0 ? 0 : Max(f.dropped - db->summary_dropped, 0);

	if (f.dead_lettered > 0 || dropped > 0)
		ereport(LOG,
				(errmsg("eventgrid: since the last summary %lld events were dead-lettered and %lld dropped",
						(long long) f.dead_lettered, (long long) dropped),
				 f.by_reason ? errdetail("Dead-lettered by reason: %s.", f.by_reason) : 0,
				 errhint("eventgrid.dead_letter_events lists the dead letters; eventgrid.delivery_statistics counts both per event subscription.")));
	db->summary_dead_letter_id = Max(f.last_dead_letter_id, db->summary_dead_letter_id < 0 ? 0 : db->summary_dead_letter_id);
	db->summary_dropped = f.dropped;
}

/*
 * Whether a delivery worker of this database runs; *short_of_slots (when
 * not NULL) says whether a database waits for a free worker slot.
 */
static bool
delivery_running(bool *short_of_slots)
{
	bool		running = false;

	SpinLockAcquire(&eg_shared->mutex);
	for (int k = 0; k < EG_MAX_DELIVERY_WORKERS; k++)
		running |= eg_my_db->worker_pid[k] != 0;
	if (short_of_slots)
		*short_of_slots = eg_shared->slots_short;
	SpinLockRelease(&eg_shared->mutex);
	return running;
}

/*
 * When no delivery worker of this database runs, whether they are wanted:
 * at once when work waits (events at a position, chunks a stopped worker
 * left), else when the first retry comes due.  The upkeep worker asks when
 * it first looks into a database (after a restart nothing else would
 * start them) and when it leaves.
 */
static void
want_delivery_if_due(void)
{
	TimestampTz due;

	if (delivery_running(NULL) || !eg_begin_work("eventgrid: looking for waiting deliveries"))
		return;
	due = eg_store_delivery_wanted(eg_now());
	eg_end_work();
	if (due <= eg_now())
		eg_db_wake(MyDatabaseId, true, false);	/* the delivery workers; their work asks for upkeep */
	else if (due < DT_NOEND)
		eg_db_want(eg_my_db, false, due);
}

/*
 * Leaves, wanted again when upkeep is next due (the next validation try
 * or manual validation expiry, the attempt history's rotation by age) or
 * when work comes.  The delivery workers are wanted first if work waits.
 */
static void
leave(void)
{
	TimestampTz due = DT_NOEND;

	want_delivery_if_due();
	if (eg_begin_work("eventgrid: summing up dead-lettered and dropped events"))
	{
		/* what the next summary would have said is not left unsaid */
		if (eg_my_db->summary_dead_letter_id >= 0)
			log_summary();
		eg_end_work();
	}
	if (eg_begin_work("eventgrid: looking for the next upkeep"))
	{
		due = eg_store_upkeep_due(eg_now(), (int64) eg_attempt_history_retention_s * 500);
		eg_end_work();
	}
	eg_worker_leave(due);
}

/* the entry point of an upkeep worker (the launcher starts it by name) */
extern PGDLLEXPORT void eventgrid_upkeep_main(Datum arg);

/*
 * Background worker entry point of the upkeep worker, started by the
 * launcher for the database dboid when it looks into the database or
 * upkeep is due: upkeep about once a second while the delivery workers
 * have work or an event table holds rows; it leaves when idle for
 * eventgrid.worker_idle_timeout (at once when it was started only to look
 * into the database, or while another database waits for a worker slot),
 * or when the database has no
 * extension of this library's version (its slot says which).
 */
void
eventgrid_upkeep_main(Datum arg)
{
	sigjmp_buf	local_sigjmp_buf;
	volatile bool again = true;
	volatile bool looked = false;
	volatile TimestampTz last_upkeep = 0;
	volatile TimestampTz idle_since = 0;	/* 0: busy; 1: started only to look (leaves as soon as idle) */

	eg_worker_start(arg, "upkeep worker", 0);
	/* started to look into the database, not for work: it leaves as soon as it finds none */
	SpinLockAcquire(&eg_shared->mutex);
	if (eg_my_db->state == EG_DB_UNKNOWN || eg_my_db->recheck)
		idle_since = 1;
	SpinLockRelease(&eg_shared->mutex);

	if (sigsetjmp(local_sigjmp_buf, 1) != 0)
		eg_recover_from_error(NULL);
	PG_exception_stack = &local_sigjmp_buf;

	for (;;)
	{
		bool		wanted;
		bool		short_of_slots;

		if (eg_begin_round())
		{
			again = true;
			queue_swept_at = 0;
		}		/* new settings (e.g. the attempt history's) apply at once */
		SpinLockAcquire(&eg_shared->mutex);
		wanted = eg_my_db->upkeep_wanted;
		SpinLockRelease(&eg_shared->mutex);

		if (GetCurrentTimestamp() >= eg_db_retry_at &&
			(wanted || again || eg_now() >= next_expiration ||
			 GetCurrentTimestamp() - last_upkeep >= (TimestampTz) EG_UPKEEP_IDLE_INTERVAL_MS * 1000))
		{
			last_upkeep = GetCurrentTimestamp();
			SpinLockAcquire(&eg_shared->mutex);
			eg_my_db->upkeep_wanted = false;
			SpinLockRelease(&eg_shared->mutex);
			again = true;		/* until upkeep says otherwise, also after an error */
			again = upkeep();
			/* not the name of the last unit of work, as if it were still running */
			pgstat_report_activity(STATE_IDLE, "eventgrid: idle");
		}
		if (eg_store_readiness == EG_READY_MISSING || eg_store_readiness == EG_READY_VERSION)
			eg_worker_leave(DT_NOEND);
		if (eg_store_readiness == EG_READY_OK && !looked)
		{
			want_delivery_if_due();
			looked = true;
		}
		/*
		 * Event tables that hold rows keep it busy while the delivery
		 * workers run, or could: while another database waits for a worker
		 * slot and none of this database's delivery workers got one, it
		 * leaves rather than hold a slot they may need.
		 */
		if (wanted || (again && (delivery_running(&short_of_slots) || !short_of_slots)))
			idle_since = 0;
		else if (idle_since == 0)
			idle_since = GetCurrentTimestamp();
		if (eg_store_readiness == EG_READY_OK && eg_error_streak == 0 && eg_worker_should_leave(idle_since))
			leave();
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 EG_UPKEEP_INTERVAL_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}
