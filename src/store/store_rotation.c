/*
 * store_rotation.c - keeping the queue's size bounded without VACUUM (PgQ's
 * rotation): an event table other than the current one is emptied with
 * TRUNCATE once no position, chunk in flight, unmatched count, queue
 * subscription's unsettled event (copied out first) or logical
 * replication subscriber's initial copy (in progress, or still to come for
 * a new subscription's slot) needs its events (the events of a held event
 * subscription, paused or not validated, become its own retries first, so
 * that one held subscription cannot keep every topic's events), and the
 * attempt history's oldest table is emptied when the current one is due
 * (eventgrid.attempt_history_retention and _max_rows).  Each TRUNCATE
 * takes its lock only if it is free at once, so no publisher or reader
 * ever waits for it; why a table is not emptied yet is written to
 * eventgrid.event_table_rotations or eventgrid.attempt_log_rotation.
 */
#include "store/store.h"
#include "store/store_sql.h"

#include "catalog/pg_type.h"
#include "storage/lmgr.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

/*
 * What still needs the events of event table $1: '' for nothing, NULL when
 * the table is empty.  Positions, chunks in flight and unmatched counts
 * whose snapshots have not passed its events (positions and counts of the
 * topics and domain topics the table holds, EG_SQL_READ_KEYS: not
 * every subscription's, SPEC 20), with $4 queue
 * subscriptions' events read there (until the table must be emptied, and
 * after the copy those a consumer held, below), and a subscriber's initial
 * copy in progress (EG_SQL_SYNC_SLOTS) or still to come
 * (EG_SQL_NEW_SLOTS).  The query of eventgrid._event_table_holders() (which
 * the event_tables view shows), here as a statement of its own so that its
 * plan is made once per rotation (each TRUNCATE invalidates it), not at
 * every call as a SQL function's is: its second run holds the table's
 * ACCESS EXCLUSIVE lock, and with it every claim (a claim locks the three
 * event tables) until the rotation commits.  OFFSET 0 keeps each EXISTS a
 * subquery run per position, a probe of the (topic, txid, id) index from
 * the position's xmin: as a semi-join, the plan (made when a truncated
 * table looked empty) hashed every event of the table, 14-64 ms under load
 * at 1,000 events/s.  The SQL function took 3.7 ms on average there (20 ms
 * at worst), the statement 0.2 ms.
 */
/*
 * A logical replication subscriber's initial copy (table synchronization)
 * in progress: PostgreSQL names the slot of each copy pg_<subscription
 * oid>_sync_<table oid>_<system id>, made when the copy starts, kept while
 * it fails and is tried again, dropped once the table is synchronized.
 * Until then the subscriber's apply worker passes over the rows it is sent
 * for that table, counting on the copy to hold them: an event table the
 * rotation emptied meanwhile would lose them (README "Scaling out").  On
 * this side the slot cannot be tied to a table, so any copy in progress
 * keeps every event table.
 */
#define EG_SYNC_SLOT_PATTERN "'^pg_[0-9]+_sync_[0-9]+_[0-9]+$'"
#define EG_SQL_SYNC_SLOTS \
	"SELECT format('the initial copy of logical replication slot %s', r.slot_name)" \
	"  FROM pg_catalog.pg_replication_slots r" \
	" WHERE r.database = pg_catalog.current_database() AND r.slot_type = 'logical'" \
	"   AND r.slot_name ~ " EG_SYNC_SLOT_PATTERN

/*
 * The subscription's own slot exists from CREATE SUBSCRIPTION, but its
 * copies (and their slots) start only once its apply worker streams: a
 * subscription made disabled, or a worker slow to start, leaves a gap in
 * which the events committed are the copy's to bring, and none of them may
 * be emptied away.  The publisher cannot see a subscriber's table states,
 * so every other pgoutput slot of this database keeps the event tables
 * until the upkeep worker has seen it stream, without a break it saw, for
 * eventgrid.replication_sync_wait ($2: now, $3: the wait in seconds);
 * eventgrid.replication_slot_sightings keeps what it saw.
 */
#define EG_SQL_NEW_SLOTS \
	"SELECT format('logical replication slot %s, whose subscriber has not streamed for eventgrid.replication_sync_wait yet (its initial copy may be to come)', r.slot_name)" \
	"  FROM pg_catalog.pg_replication_slots r" \
	"  LEFT JOIN eventgrid.replication_slot_sightings g ON g.slot_name = r.slot_name" \
	" WHERE r.database = pg_catalog.current_database() AND r.slot_type = 'logical' AND r.plugin = 'pgoutput'" \
	"   AND r.slot_name !~ " EG_SYNC_SLOT_PATTERN \
	"   AND (g.streaming_since IS NULL" \
	"        OR g.streaming_since > $2 - pg_catalog.make_interval(secs => $3))"

static EgStatement holders = {
	.name = "event table holders",
	.sql =
	"WITH RECURSIVE " EG_SQL_READ_KEYS("e.event_table = $1::smallint")
	"SELECT CASE WHEN pg_relation_size(format('eventgrid.events_%s', $1)::regclass) > 0 THEN coalesce(("
	"  SELECT string_agg(DISTINCT h.holder, '; ' ORDER BY h.holder) FROM ("
	"    SELECT format('event subscription %s of topic %s', s.name, s.read_key) AS holder"
	"      FROM table_topics k JOIN eventgrid.event_subscriptions s ON s.topic = k.topic AND s.domain_topic IS NULL"
	"      JOIN eventgrid.subscription_positions p ON p.subscription_id = s.id"
	"     WHERE EXISTS (SELECT 1 FROM eventgrid.events e"
	"                    WHERE e.event_table = $1::smallint AND e.topic = s.topic"
	"                      AND e.txid >= pg_snapshot_xmin(p.done) AND NOT pg_visible_in_snapshot(e.txid, p.done) OFFSET 0)"
	"    UNION ALL"
	"    SELECT format('event subscription %s of topic %s', s.name, s.read_key)"
	"      FROM table_domain_topics k JOIN eventgrid.event_subscriptions s"
	"        ON " EG_SQL_READ_KEY_SUBSCRIPTION("s", "k.read_key")
	"      JOIN eventgrid.subscription_positions p ON p.subscription_id = s.id"
	"     WHERE EXISTS (SELECT 1 FROM eventgrid.events e"
	"                    WHERE e.event_table = $1::smallint"
	"                      AND e.domain_topic IS NOT NULL AND " EG_SQL_EVENT_READ_KEY " = s.read_key"
	"                      AND e.txid >= pg_snapshot_xmin(p.done) AND NOT pg_visible_in_snapshot(e.txid, p.done) OFFSET 0)"
	"    UNION ALL"
	"    SELECT format('first attempts in flight for topic %s', split_part(c.topic, '/', 1))"
	"      FROM eventgrid.chunks_in_flight c"
	"     WHERE EXISTS (SELECT 1 FROM eventgrid.events e"
	"                    WHERE e.event_table = $1::smallint AND e.topic = split_part(c.topic, '/', 1)"
	"                      AND e.txid >= pg_snapshot_xmin(c.done) AND NOT pg_visible_in_snapshot(e.txid, c.done) OFFSET 0)"
	"    UNION ALL"
	"    SELECT format('unmatched count of topic %s', tp.topic)"
	"      FROM table_topics k JOIN eventgrid.topic_positions tp ON tp.topic = k.topic"
	"     WHERE EXISTS (SELECT 1 FROM eventgrid.events e"
	"                    WHERE e.event_table = $1::smallint AND e.topic = tp.topic"
	"                      AND e.txid >= pg_snapshot_xmin(tp.done) AND NOT pg_visible_in_snapshot(e.txid, tp.done) OFFSET 0)"
	"    UNION ALL"
	"    SELECT format('events of queue event subscription %s of topic %s', s.name, s.topic)"
	"      FROM eventgrid.event_subscriptions s"
	"     WHERE $4 AND s.delivery_mode = 'queue'"
	"       AND (EXISTS (SELECT 1 FROM eventgrid.queue_batches b"
	"                     WHERE b.subscription_id = s.id AND b.event_table = $1::smallint)"
	"            OR EXISTS (SELECT 1 FROM eventgrid.queue_events q"
	"                        WHERE q.subscription_id = s.id AND q.event_table = $1::smallint))"
	"    UNION ALL"
	"    " EG_SQL_SYNC_SLOTS
	"    UNION ALL"
	"    " EG_SQL_NEW_SLOTS
	"  ) h), '') END",
	.nargs = 4,
	.types = {INT4OID, TIMESTAMPTZOID, INT4OID, BOOLOID},
	.generic = true,
};

/*
 * What the upkeep worker sees of this database's pgoutput slots (other
 * than synchronization slots; $1: now, $2: eventgrid.replication_sync_wait
 * in seconds): a new slot is noted, with the time it was first seen
 * streaming while no initial copy was in progress; a slot that stops
 * streaming, or sees a copy in progress, before the wait is over starts
 * again (a copy that fails drops its synchronization slot and makes a new
 * one at each try: the copy's own hold has gaps, this one does not); one
 * that streamed the whole wait is done for good; the rows of dropped slots
 * go.  A row is written only when it changes.
 */
static EgStatement note_slots = {
	.name = "replication slot sightings",
	.sql =
	"WITH slots AS ("
	"  SELECT r.slot_name, r.active AND NOT EXISTS (" EG_SQL_SYNC_SLOTS ") AS active"
	"    FROM pg_catalog.pg_replication_slots r"
	"   WHERE r.database = pg_catalog.current_database() AND r.slot_type = 'logical' AND r.plugin = 'pgoutput'"
	"     AND r.slot_name !~ " EG_SYNC_SLOT_PATTERN "),"
	" gone AS ("
	"  DELETE FROM eventgrid.replication_slot_sightings g"
	"   WHERE NOT EXISTS (SELECT 1 FROM slots s WHERE s.slot_name = g.slot_name))"
	"INSERT INTO eventgrid.replication_slot_sightings AS g (slot_name, first_seen_at, streaming_since)"
	" SELECT s.slot_name, $1, CASE WHEN s.active THEN $1 END FROM slots s"
	" ON CONFLICT (slot_name) DO UPDATE SET streaming_since = excluded.streaming_since"
	" WHERE (g.streaming_since IS NULL AND excluded.streaming_since IS NOT NULL)"
	"    OR (excluded.streaming_since IS NULL AND g.streaming_since > $1 - pg_catalog.make_interval(secs => $2))",
	.nargs = 2,
	.types = {TIMESTAMPTZOID, INT4OID},
};

static EgStatement table_used_st = {
	.name = "table size",
	.sql =
	"SELECT pg_relation_size($1) > 0",
	.nargs = 1,
	.types = {REGCLASSOID},
};

static EgStatement truncated = {
	.name = "event table rotation",
	.sql =
	"UPDATE eventgrid.event_table_rotations SET truncated_at = $2, last_try_at = $2, last_failure = NULL"
	" WHERE event_table = $1",
	.nargs = 2,
	.types = {INT4OID, TIMESTAMPTZOID},
};

static EgStatement truncate_failed = {
	.name = "event table rotation failure",
	.sql =
	"UPDATE eventgrid.event_table_rotations SET last_try_at = $2, last_failure = $3"
	" WHERE event_table = $1",
	.nargs = 3,
	.types = {INT4OID, TIMESTAMPTZOID, TEXTOID},
};

/* The attempt history's rotation: the table taking rows, and the last id used. */
static EgStatement history_state = {
	.name = "attempt history state",
	.sql =
	"SELECT h.history_table::int4, h.started_at, h.first_id,"
	"       (SELECT CASE WHEN q.is_called THEN q.last_value ELSE q.last_value - 1 END"
	"          FROM eventgrid.attempt_log_id_seq q)"
	"  FROM eventgrid.attempt_log_rotation h FOR UPDATE",
};

static EgStatement history_rotated = {
	.name = "attempt history rotation",
	.sql =
	"UPDATE eventgrid.attempt_log_rotation"
	"   SET history_table = $1, started_at = $2, first_id = $3, last_try_at = $2, last_failure = NULL",
	.nargs = 3,
	.types = {INT4OID, TIMESTAMPTZOID, INT8OID},
};

static EgStatement history_rotate_failed = {
	.name = "attempt history rotation failure",
	.sql =
	"UPDATE eventgrid.attempt_log_rotation SET last_try_at = $1, last_failure = $2",
	.nargs = 2,
	.types = {TIMESTAMPTZOID, TEXTOID},
};

/*
 * Held event subscriptions (paused, or their endpoint not validated) whose
 * position has not passed event table $1: their events would keep that
 * table, and with it every topic's events, from being emptied.  So their
 * committed events that match their filters become retries of their own
 * (no attempt made, due at $2: the claims pass them over until the
 * subscription is resumed or validated, and their time-to-live runs as it
 * would at the position), and the position moves to the current snapshot
 * (eventgrid._position_to_retries()).  A subscription whose validation
 * failed keeps nothing published since.  Positions another session holds
 * are left for the next upkeep.  Only the held subscriptions of the
 * topics and domain topics the table holds are looked at (not every held
 * one: a paused domain of 100,000 domain topics took 0.85 s a round), each
 * position locked in its own lateral probe.  OFFSET 0 keeps the EXISTS a
 * probe per held position (as in the holders' statement): as a semi-join its plan
 * hashed every event of the table, 134 ms for 200,000 events, at every
 * upkeep that found the table still needed.
 */
static EgStatement release_held = {
	.name = "held position release",
	.sql =
	"WITH RECURSIVE " EG_SQL_READ_KEYS("e.event_table = $1::smallint")
	"SELECT eventgrid._position_to_retries(x.subscription_id, $2, NOT x.failed)"
	"  FROM (SELECT s.id FROM table_topics k JOIN eventgrid.event_subscriptions s"
	"          ON s.topic = k.topic AND s.domain_topic IS NULL WHERE " EG_SQL_HELD("s")
	"        UNION ALL"
	"        SELECT s.id FROM table_domain_topics k JOIN eventgrid.event_subscriptions s"
	"          ON " EG_SQL_READ_KEY_SUBSCRIPTION("s", "k.read_key") " WHERE " EG_SQL_HELD("s") ") hs"
	"  CROSS JOIN LATERAL ("
	"    SELECT p.subscription_id, coalesce(v.state = 'Failed', false) AS failed"
	"      FROM eventgrid.subscription_positions p"
	"      JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id"
	"      LEFT JOIN eventgrid.endpoint_validations v ON v.subscription_id = s.id"
	"     WHERE p.subscription_id = hs.id"
	"       AND EXISTS (SELECT 1 FROM eventgrid.events e"
	"                    WHERE s.domain_topic IS NULL AND e.event_table = $1 AND e.topic = s.topic"
	"                      AND e.txid >= pg_snapshot_xmin(p.done) AND NOT pg_visible_in_snapshot(e.txid, p.done)"
	"                   UNION ALL"
	"                   SELECT 1 FROM eventgrid.events e"
	"                    WHERE s.domain_topic IS NOT NULL AND e.event_table = $1"
	"                      AND e.domain_topic IS NOT NULL AND " EG_SQL_EVENT_READ_KEY " = s.read_key"
	"                      AND e.txid >= pg_snapshot_xmin(p.done) AND NOT pg_visible_in_snapshot(e.txid, p.done)"
	"                   OFFSET 0)"
	"     FOR UPDATE OF p SKIP LOCKED) x",
	.nargs = 2,
	.types = {INT4OID, TIMESTAMPTZOID},
};

/*
 * The events of queue subscriptions (SPEC 14) are read in the event tables
 * until they are settled: once nothing else needs table $1 and it must be
 * emptied before its next turn, what they still need of it gets copies
 * (eventgrid._queue_set_aside()), never earlier.  Rows a consumer holds at
 * that moment are left, and hold the table (above) until the next upkeep.
 */
static EgStatement set_aside = {
	.name = "queue events set aside",
	.sql = "SELECT eventgrid._queue_set_aside($1::smallint)",
	.nargs = 1,
	.types = {INT4OID},
};

/*
 * The positions of subscriptions whose validation failed move along with
 * the events ($1: now), which are not for them (Event Grid never created
 * them); those another session holds are left for the next upkeep.
 */
static EgStatement pass_failed = {
	.name = "failed validation position",
	.sql =
	"SELECT eventgrid._position_to_retries(p.subscription_id, $1, false)"
	"  FROM eventgrid.subscription_positions p"
	"  JOIN eventgrid.endpoint_validations v ON v.subscription_id = p.subscription_id"
	" WHERE v.state = 'Failed'"
	"   AND EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s"
	"                CROSS JOIN LATERAL eventgrid._unpassed_events(s.read_key, p.done, p.upto, p.after_txid, p.after_id) e"
	"                WHERE s.id = p.subscription_id)"
	"   FOR UPDATE OF p SKIP LOCKED",
	.nargs = 1,
	.types = {TIMESTAMPTZOID},
};

/* See store.h. */
void
eg_store_pass_failed(TimestampTz now)
{
	Datum		arg = TimestampTzGetDatum(now);

	eg_store_run(&pass_failed, &arg, SPI_OK_SELECT);
}

/* TRUNCATE eventgrid.<name> (its lock already taken, or taken here). */
static void
truncate_table(const char *name)
{
	if (SPI_execute(psprintf("TRUNCATE eventgrid.%s", name), false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "eventgrid: TRUNCATE eventgrid.%s failed", name);
}

/*
 * Notes what the upkeep worker sees of this database's logical replication
 * slots in eventgrid.replication_slot_sightings (now: the real clock), for
 * the event tables' holders.
 */
void
eg_store_note_replication_slots(TimestampTz now)
{
	Datum		args[2];

	args[0] = TimestampTzGetDatum(now);
	args[1] = Int32GetDatum(eg_replication_sync_wait_s);
	eg_store_run(&note_slots, args, SPI_OK_INSERT);
}

/* Has table relid been written since it was last emptied? */
static bool
table_used(Oid relid)
{
	Datum		arg = ObjectIdGetDatum(relid);

	eg_store_run(&table_used_st, &arg, SPI_OK_SELECT);
	return eg_bool_col(SPI_tuptable, 0, 1);
}

/* Has event table eventgrid.events_<event_table> been written since it was last emptied? */
bool
eg_store_table_used(int event_table)
{
	char		name[NAMEDATALEN];

	snprintf(name, sizeof(name), "events_%d", event_table);
	return table_used(eg_store_table(name));
}

/*
 * Empties event table eventgrid.events_<event_table> when nothing needs its
 * events, with a lock taken only if it is free at once, so that no
 * publisher or reader ever waits for it.  Returns NULL when emptied, else
 * why not (also written to eventgrid.event_table_rotations).
 */
char *
eg_store_truncate(int event_table, TimestampTz now)
{
	char		name[NAMEDATALEN];
	Oid			relid;
	Datum		args[4];
	char	   *why = NULL;
	TimestampTz real_now;
	/* a table is emptied a third of a period (at least 1 s) before its next turn */
	int64		period = (int64) eg_event_table_rotation_s * USECS_PER_SEC;
	int64		margin = (int64) Max(eg_event_table_rotation_s / 3, 1) * USECS_PER_SEC;
	bool		must_empty;

	snprintf(name, sizeof(name), "events_%d", event_table);
	relid = eg_store_table(name);

	/*
	 * eventgrid.event_retention: kept for delivery servers to be fed again
	 * after a failover, up to twice the rotation period (a third of it
	 * left for the upkeep to empty the table before its next turn).
	 */
	if (eg_event_retention_s > 0)
	{
		int64		keep_s = Min(eg_event_retention_s, (2 * period - margin) / USECS_PER_SEC);

		real_now = GetCurrentTimestamp();

		if (real_now - eg_event_table_turn_end(event_table, real_now) < keep_s * USECS_PER_SEC &&
			eg_store_table_used(event_table))
		{
			why = psprintf("keeping its events for eventgrid.event_retention (%lld s)", (long long) keep_s);
			args[0] = Int32GetDatum(event_table);
			args[1] = TimestampTzGetDatum(now);
			args[2] = CStringGetTextDatum(why);
			eg_store_run(&truncate_failed, args, SPI_OK_UPDATE);
			return why;
		}
	}

	args[0] = Int32GetDatum(event_table);
	args[1] = TimestampTzGetDatum(now);
	eg_store_run(&release_held, args, SPI_OK_SELECT);
	/* the slots' times are the real clock's, as the event_tables view reads them */
	real_now = GetCurrentTimestamp();
	args[1] = TimestampTzGetDatum(real_now);
	args[2] = Int32GetDatum(eg_replication_sync_wait_s);

	/*
	 * Queue subscriptions' events still read there hold the table until it
	 * must be emptied, when its next turn is near (the margin
	 * eventgrid.event_retention leaves too); then, once nothing else needs
	 * it, they are copied aside: consumers that keep up never cause a copy.
	 */
	must_empty = real_now >= eg_event_table_turn_end(event_table, real_now) + 2 * period - margin;
	args[3] = BoolGetDatum(!must_empty);
	eg_store_run(&holders, args, SPI_OK_SELECT);
	why = eg_text_col(SPI_tuptable, 0, 1);
	if (why == NULL)
		return NULL;			/* empty already */
	if (why[0] != '\0')
		why = psprintf("waiting for %s", why);
	else
	{
		if (must_empty)
			eg_store_run(&set_aside, args, SPI_OK_SELECT);
		eg_pause_point("truncate-lock");	/* tests: between the first look and the lock */
		if (!ConditionalLockRelationOid(relid, AccessExclusiveLock))
			why = pstrdup("another session holds a lock on the table");
		else
			why = NULL;
	}
	if (why == NULL)
	{
		/*
		 * Rows committed since the first look, by a transaction that began
		 * earlier, and received events a consumer held (a new snapshot,
		 * taken under the lock: the unit of work's first one saw neither)
		 */
		args[3] = BoolGetDatum(true);
		eg_store_run(&holders, args, SPI_OK_SELECT);
		why = eg_text_col(SPI_tuptable, 0, 1);
		if (why && why[0] != '\0')
			why = psprintf("waiting for %s", why);
		else
			why = NULL;
	}
	args[1] = TimestampTzGetDatum(now);
	if (why)
	{
		args[2] = CStringGetTextDatum(why);
		eg_store_run(&truncate_failed, args, SPI_OK_UPDATE);
		return why;
	}
	truncate_table(name);
	eg_store_run(&truncated, args, SPI_OK_UPDATE);
	return NULL;
}

/*
 * Rotates the attempt history when the table taking rows has done so for
 * period_ms or holds max_rows: the oldest of the three tables is emptied
 * with TRUNCATE, under a lock taken only if it is free at once (a session
 * reading the history is never made to wait), and takes rows from now on.
 * Returns NULL when nothing was due or the rotation was made, else why not
 * (also written to eventgrid.attempt_log_rotation).
 */
char *
eg_store_rotate_history(TimestampTz now, int64 period_ms, int64 max_rows)
{
	int			current;
	int			next;
	TimestampTz started;
	int64		first_id;
	int64		last_id;
	char		name[NAMEDATALEN];
	Oid			relid;
	Datum		args[3];

	eg_store_run(&history_state, NULL, SPI_OK_SELECT);
	current = eg_int32_col(SPI_tuptable, 0, 1, 0);
	started = eg_timestamp_col(SPI_tuptable, 0, 2);
	first_id = eg_int64_col(SPI_tuptable, 0, 3, 0);
	last_id = eg_int64_col(SPI_tuptable, 0, 4, 0);
	if (now - started < period_ms * 1000 && last_id - first_id + 1 < max_rows)
		return NULL;

	next = (current + 1) % EG_HISTORY_TABLES;
	snprintf(name, sizeof(name), "attempt_log_%d", next);
	relid = eg_store_table(name);
	if (table_used(relid))
	{
		if (!ConditionalLockRelationOid(relid, AccessExclusiveLock))
		{
			char	   *why = pstrdup("another session holds a lock on the table");

			args[0] = TimestampTzGetDatum(now);
			args[1] = CStringGetTextDatum(why);
			eg_store_run(&history_rotate_failed, args, SPI_OK_UPDATE);
			return why;
		}
		truncate_table(name);
	}
	args[0] = Int32GetDatum(next);
	args[1] = TimestampTzGetDatum(now);
	args[2] = Int64GetDatum(last_id + 1);
	eg_store_run(&history_rotated, args, SPI_OK_UPDATE);
	return NULL;
}

