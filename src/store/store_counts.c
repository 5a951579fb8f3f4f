/*
 * store_counts.c - what the upkeep worker counts: events published and
 * events no event subscription takes, per topic (SPEC section 9, moved on
 * by each topic's own position); the backlog of deliveries ready and not
 * yet claimed (shown in the delivery workers' status); and the dead
 * letters and dropped events behind the per-minute summary in the log.
 */
#include "store/store.h"
#include "store/store_sql.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

/* an event e of the round: visible in the new snapshot, not in the topic's position's */
#define EG_SQL_IN_ROUND(e) \
	" AND " e ".txid >= pg_snapshot_xmin(tp.done) AND " e ".txid < pg_snapshot_xmax(snap.s)" \
	" AND eventgrid._in_batch(" e ".txid, tp.done, snap.s)"
/* subscription s has no filter */
#define EG_SQL_NO_FILTER \
	" s.included_event_types IS NULL AND s.subject_begins_with IS NULL" \
	" AND s.subject_ends_with IS NULL AND s.advanced_filters IS NULL"
/* a subscription of scope <domain_topic> takes every event of the round */
#define EG_SQL_TAKES_ALL(domain_topic) \
	" EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s" \
	"           JOIN eventgrid.subscription_positions p ON p.subscription_id = s.id" \
	"          WHERE s.topic = tp.topic AND " domain_topic " AND" EG_SQL_NO_FILTER \
	"            AND pg_snapshot_xmax(p.since) <= pg_snapshot_xmin(tp.done))"
/* a subscription of scope <domain_topic> existing before event e takes it */
#define EG_SQL_TAKES(domain_topic) \
	" EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s" \
	"           JOIN eventgrid.subscription_positions p ON p.subscription_id = s.id" \
	"          WHERE s.topic = e.topic AND " domain_topic \
	"            AND NOT pg_visible_in_snapshot(e.txid, p.since)" \
	"            AND eventgrid._matches(e.event, s.included_event_types_lower," \
	"                  s.subject_begins_with, s.subject_ends_with," \
	"                  s.is_subject_case_sensitive, s.advanced_filters," \
	"                  s.enable_advanced_filtering_on_arrays))"

/*
 * Published and unmatched events: per topic, the events visible in a new
 * snapshot and not in its position's are counted, and of them those that
 * no event subscription takes (a filter, or a subscription created after
 * the event); the position moves on.  A domain's event is taken only by a
 * subscription of the whole domain or of the event's own domain topic.
 * Nothing is looked at one by one where a subscription without filters
 * takes everything: of the topic or domain (one look), or of a domain
 * topic with events in the round (one look per domain topic, a gate on
 * that domain topic's own count, which reads it through the index on
 * (topic, domain_topic, txid, id)).
 */
static EgStatement unmatched = {
	.name = "unmatched count",
	.sql =
	"WITH snap AS MATERIALIZED (SELECT pg_current_snapshot() AS s),"
	" tp AS MATERIALIZED ("
	"  SELECT p.topic, p.done FROM eventgrid.topic_positions p"
	"   WHERE p.system_identifier = eventgrid._system_identifier()"
	"   ORDER BY p.topic FOR UPDATE SKIP LOCKED"
	"), n AS ("
	"  SELECT tp.topic,"
	"         (SELECT count(*) FROM eventgrid.events e WHERE e.topic = tp.topic" EG_SQL_IN_ROUND("e") ") AS published,"
	"         CASE WHEN" EG_SQL_TAKES_ALL("s.domain_topic IS NULL") " THEN 0 ELSE"
	"         (SELECT count(*) FROM eventgrid.events e"
	"           WHERE e.topic = tp.topic AND e.domain_topic IS NULL" EG_SQL_IN_ROUND("e")
	"             AND NOT" EG_SQL_TAKES("s.domain_topic IS NULL") ")"
	"       + (SELECT coalesce(sum(u.n), 0)"
	"            FROM (SELECT DISTINCT e.domain_topic FROM eventgrid.events e"
	"                   WHERE e.topic = tp.topic AND e.domain_topic IS NOT NULL" EG_SQL_IN_ROUND("e") ") g"
	"            CROSS JOIN LATERAL ("
	"              SELECT count(*) AS n FROM eventgrid.events e"
	"               WHERE NOT" EG_SQL_TAKES_ALL("s.domain_topic = g.domain_topic")
	"                 AND e.topic = tp.topic AND e.domain_topic = g.domain_topic" EG_SQL_IN_ROUND("e")
	"                 AND NOT" EG_SQL_TAKES("s.domain_topic IS NULL")
	"                 AND NOT" EG_SQL_TAKES("s.domain_topic = e.domain_topic") ") u) END AS unmatched"
	"    FROM tp CROSS JOIN snap"
	"), counted AS ("
	"  UPDATE eventgrid.topic_counters c"
	"     SET unmatched = c.unmatched + n.unmatched, published = c.published + n.published"
	"    FROM n WHERE c.topic = n.topic AND (n.unmatched > 0 OR n.published > 0)"
	")"
	"UPDATE eventgrid.topic_positions p SET done = snap.s FROM snap, n WHERE p.topic = n.topic",
};

static EgStatement any_subscription = {
	.name = "event subscription check",
	.sql = "SELECT EXISTS (SELECT 1 FROM eventgrid.event_subscriptions)",
};

/*
 * Does this database have an event subscription?  Read in a snapshot of its
 * own, taken now (as every store statement's is: store.h), not the unit's,
 * which is older than the caller's look at the subscription
 * changes (note_subscriptions() in upkeep_worker.c): a subscription created
 * in between was seen as absent and as not changed since, and the next
 * publishing commits woke no delivery worker (test 052).
 */
bool
eg_store_has_subscriptions(void)
{
	eg_store_run(&any_subscription, NULL, SPI_OK_SELECT);
	return eg_bool_col(SPI_tuptable, 0, 1);
}

static EgStatement refresh_grants = {
	.name = "receive grants refresh",
	.sql = "SELECT eventgrid._refresh_receive_grants()",
};

/*
 * Deletes the receive grants of dropped roles and keeps each grant's role
 * name current, for dumps (SPEC 14; eventgrid._refresh_receive_grants()).
 * In a unit of work (the upkeep worker's).
 */
void
eg_store_refresh_receive_grants(void)
{
	eg_store_run(&refresh_grants, NULL, SPI_OK_SELECT);
}

/* Counts the events that no event subscription takes, per topic (SPEC 9). */
void
eg_store_count_unmatched(void)
{
	eg_store_run(&unmatched, NULL, SPI_OK_UPDATE);
}

/*
 * The backlog (eg_store_backlog): retries due at $1 and not leased, up
 * to $2 of them.
 */
static EgStatement backlog_retries = {
	.name = "retry backlog count",
	.sql =
	"SELECT count(*) FROM (SELECT 1 FROM eventgrid.retries r"
	"                       WHERE r.next_attempt_at <= $1 AND r.lease_owner IS NULL LIMIT $2) x",
	.nargs = 2,
	.types = {TIMESTAMPTZOID, INT8OID},
};

/* whether anything is paused: the count below is planned for every subscription */
static EgStatement any_pause = {
	.name = "pause check",
	.sql = "SELECT EXISTS (SELECT 1 FROM eventgrid.delivery_pauses)",
};

/* what pause_delivery() paused: how many event subscriptions, and whether everything */
static EgStatement pauses = {
	.name = "pause count",
	.sql =
	"SELECT (SELECT count(*) FROM eventgrid._paused_subscriptions()),"
	"       EXISTS (SELECT 1 FROM eventgrid.delivery_pauses dp WHERE dp.topic IS NULL)",
};

/*
 * How many event subscriptions pause_delivery() paused (itself, its topic or
 * everything); *all: whether it paused everything.  For the delivery
 * workers' status line, every second while they deliver.  Nothing paused
 * (the usual case) is one probe: the count's plan, made for as many rows
 * as there are subscriptions, set up a hash table that size at each run
 * even with nothing paused (7-270 ms a run beside 1,000,000 subscriptions,
 * pg_stat_statements in the bench, figure 26).
 */
int64
eg_store_pauses(bool *all)
{
	*all = false;
	eg_store_run(&any_pause, NULL, SPI_OK_SELECT);
	if (!eg_bool_col(SPI_tuptable, 0, 1))
		return 0;
	eg_store_run(&pauses, NULL, SPI_OK_SELECT);
	*all = eg_bool_col(SPI_tuptable, 0, 2);
	return eg_int64_col(SPI_tuptable, 0, 1, 0);
}

/*
 * each position of the topics and domain topics with events in the event
 * tables (the others have none to count), with what backlog_events takes
 */
static EgStatement backlog_positions = {
	.name = "position list",
	.sql =
	"WITH RECURSIVE " EG_SQL_READ_KEYS("true")
	"SELECT s.read_key, p.done, p.upto, p.after_txid, p.after_id FROM" EG_SQL_KEYED_POSITIONS,
};

/*
 * Events of topic $1 a position ($2 done, $3 upto or NULL, $4 and $5 its
 * last event) has not passed, up to $6: eventgrid._unpassed_events(), the
 * rule eventgrid._pending() counts with too, which reads them in two index
 * scans bounded where the position stands.
 */
static EgStatement backlog_events = {
	.name = "event backlog count",
	.sql =
	"SELECT count(*) FROM (SELECT 1 FROM eventgrid._unpassed_events($1, $2, $3, $4, $5) LIMIT $6) x",
	.nargs = 6,
	.types = {TEXTOID, PG_SNAPSHOTOID, PG_SNAPSHOTOID, XID8OID, INT8OID, INT8OID},
};

/*
 * Deliveries ready at now and not claimed yet: due retries, and events the
 * positions have not passed, counted before filters (an upper bound), each
 * kind up to EG_BACKLOG_COUNT_LIMIT ("that many or more").  Events are
 * counted position by position, each from where it stands
 * (backlog_events), so a count reads at most about the rows it counts.
 */
int64
eg_store_backlog(TimestampTz now)
{
	Datum		args[6];
	int64		retries;
	int64		events = 0;
	SPITupleTable *positions;

	args[0] = TimestampTzGetDatum(now);
	args[1] = Int64GetDatum(EG_BACKLOG_COUNT_LIMIT);
	eg_store_run(&backlog_retries, args, SPI_OK_SELECT);
	retries = eg_int64_col(SPI_tuptable, 0, 1, 0);

	eg_store_run(&backlog_positions, NULL, SPI_OK_SELECT);
	positions = SPI_tuptable;
	for (uint64 i = 0; i < positions->numvals && events < EG_BACKLOG_COUNT_LIMIT; i++)
	{
		char		nulls[7] = "      ";	/* 6 arguments, as SPI_execute_plan reads them */

		for (int k = 0; k < 5; k++)
		{
			bool		isnull;

			args[k] = SPI_getbinval(positions->vals[i], positions->tupdesc, k + 1, &isnull);
			nulls[k] = isnull ? 'n' : ' ';
		}
		args[5] = Int64GetDatum(EG_BACKLOG_COUNT_LIMIT - events);
		eg_store_run_nulls(&backlog_events, args, nulls, SPI_OK_SELECT);
		events += eg_int64_col(SPI_tuptable, 0, 1, 0);
		SPI_freetuptable(SPI_tuptable);
	}
	SPI_freetuptable(positions);
	return retries + events;
}

/* dead letters after id $1, by reason; the newest id; events dropped so far */
static EgStatement finals = {
	.name = "dead-letter summary",
	.sql =
	"SELECT (SELECT coalesce(max(d.id), 0) FROM eventgrid.dead_letters d),"
	"       (SELECT coalesce(sum(c.dropped), 0)::int8 FROM eventgrid.subscription_counters c),"
	"       string_agg(x.reason || ' ' || x.n, ', ' ORDER BY x.reason), coalesce(sum(x.n), 0)::int8"
	"  FROM (SELECT d.dead_letter_reason AS reason, count(*) AS n FROM eventgrid.dead_letters d"
	"         WHERE d.id > $1 GROUP BY 1) x",
	.nargs = 1,
	.types = {INT8OID},
};

/*
 * Dead letters and dropped events so far: the newest dead letter id, the
 * sum of the dropped counters, and the dead letters written after
 * after_dead_letter_id, counted and by reason (text valid until
 * eg_store_commit()).
 */
EgFinals
eg_store_finals(int64 after_dead_letter_id)
{
	Datum		arg = Int64GetDatum(after_dead_letter_id);
	EgFinals	f;

	eg_store_run(&finals, &arg, SPI_OK_SELECT);
	f.last_dead_letter_id = eg_int64_col(SPI_tuptable, 0, 1, 0);
	f.dropped = eg_int64_col(SPI_tuptable, 0, 2, 0);
	f.by_reason = eg_text_col(SPI_tuptable, 0, 3);
	f.dead_lettered = eg_int64_col(SPI_tuptable, 0, 4, 0);
	return f;
}


/* What has become of event subscriptions ($1): gone, held back by the claims, and their endpoint now. */
static EgStatement subscription_states = {
	.name = "event subscription state",
	.sql =
	"SELECT i.id, s.id IS NULL, s.id IN (SELECT h FROM eventgrid._held_subscriptions() h), s.endpoint"
	"  FROM unnest($1::int8[]) WITH ORDINALITY AS i(id, n) LEFT JOIN eventgrid.event_subscriptions s ON s.id = i.id"
	" ORDER BY i.n",
	.nargs = 1,
	.types = {INT8ARRAYOID},
};

/*
 * For each event subscription ids[0..n), what the claims would do with it
 * now (states[i], texts in the unit of work's memory): whether it is gone,
 * held (paused, or its endpoint not validated) and its endpoint.
 */
void
eg_store_subscription_states(const int64 *ids, int n, EgSubscriptionState *states)
{
	Datum		arg = eg_int8_array(ids, n);
	enum
	{
		COL_ID = 1, COL_GONE, COL_HELD, COL_ENDPOINT
	};

	eg_store_run(&subscription_states, &arg, SPI_OK_SELECT);
	for (uint64 i = 0; i < SPI_processed && i < (uint64) n; i++)
	{
		states[i].id = eg_int64_col(SPI_tuptable, i, COL_ID, 0);
		states[i].gone = eg_bool_col(SPI_tuptable, i, COL_GONE);
		states[i].held = !states[i].gone && eg_bool_col(SPI_tuptable, i, COL_HELD);
		states[i].endpoint = states[i].gone ? NULL : eg_text_col(SPI_tuptable, i, COL_ENDPOINT);
	}
}

/*
 * When the delivery workers are wanted ($1: now): now when a position that
 * is not held has events to pass, or chunks are in flight (a worker that
 * stopped left them); else when the first retry of a subscription that is
 * not held comes due; NULL (never) when there is none.
 */
static EgStatement delivery_wanted = {
	.name = "delivery due time",
	.sql =
	"WITH RECURSIVE " EG_SQL_READ_KEYS("true")
	"SELECT CASE WHEN EXISTS (SELECT 1 FROM eventgrid.chunks_in_flight)"
	"              OR EXISTS (SELECT 1 FROM" EG_SQL_KEYED_POSITIONS
	"                          WHERE s.id NOT IN (SELECT h FROM eventgrid._held_subscriptions() h)"
	"                            AND EXISTS (SELECT 1 FROM eventgrid._unpassed_events(s.read_key, p.done, p.upto,"
	"                                                                                p.after_txid, p.after_id) e))"
	"            THEN $1"
	"            ELSE (SELECT min(r.next_attempt_at) FROM eventgrid.retries r"
	"                   WHERE r.subscription_id NOT IN (SELECT h FROM eventgrid._held_subscriptions() h)) END",
	.nargs = 1,
	.types = {TIMESTAMPTZOID},
};

/* See store.h. */
TimestampTz
eg_store_delivery_wanted(TimestampTz now)
{
	Datum		arg = TimestampTzGetDatum(now);
	TimestampTz t;

	eg_store_run(&delivery_wanted, &arg, SPI_OK_SELECT);
	t = eg_timestamp_col(SPI_tuptable, 0, 1);
	return t == 0 ? DT_NOEND : t;
}

/*
 * When upkeep is next due ($1: now, $2: the attempt history's period in
 * ms): the next endpoint validation try or manual validation expiry, the
 * attempt history's next rotation by age, the earliest expiration of an
 * event subscription; NULL (never) when none.
 */
static EgStatement upkeep_due = {
	.name = "upkeep due time",
	.sql =
	"SELECT least((SELECT min(CASE WHEN v.state = 'Creating' THEN v.next_try_at"
	"                              ELSE v.manual_since + interval '10 minutes' END)"
	"                FROM eventgrid.endpoint_validations v WHERE v.state IN ('Creating', 'AwaitingManualAction')),"
	"             (SELECT h.started_at + $2 * interval '1 millisecond' FROM eventgrid.attempt_log_rotation h),"
	"             (SELECT min(s.expiration_time) FROM eventgrid.event_subscriptions s))",
	.nargs = 2,
	.types = {TIMESTAMPTZOID, INT8OID},
};

/* See store.h. */
TimestampTz
eg_store_upkeep_due(TimestampTz now, int64 history_period_ms)
{
	Datum		args[2];
	TimestampTz t;

	args[0] = TimestampTzGetDatum(now);
	args[1] = Int64GetDatum(history_period_ms);
	eg_store_run(&upkeep_due, args, SPI_OK_SELECT);
	t = eg_timestamp_col(SPI_tuptable, 0, 1);
	return t == 0 ? DT_NOEND : t;
}

static EgStatement expiring_certificates = {
	.name = "expiring client certificates",
	.sql =
	"SELECT s.topic, s.name, c.not_after FROM eventgrid.client_certificates c"
	"  JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id"
	" WHERE c.not_after < $1 ORDER BY c.not_after LIMIT 100",
	.nargs = 1,
	.types = {TIMESTAMPTZOID},
};

static EgStatement drop_expired = {
	.name = "expired subscriptions",
	.sql = "SELECT x.topic, x.name, x.expiration_time, x.owed, x.skipped FROM eventgrid._drop_expired_subscriptions() x",
};

static EgStatement next_expiration = {
	.name = "next expiration",
	.sql = "SELECT min(s.expiration_time) FROM eventgrid.event_subscriptions s",
};

/*
 * The rows (topic, name, time) of the statement just run, in arrays valid
 * until the unit of work ends; returns how many.
 */
static int
subscription_times(char ***topics, char ***names, TimestampTz **times)
{
	int			n = (int) SPI_processed;

	*topics = palloc(Max(n, 1) * sizeof(char *));
	*names = palloc(Max(n, 1) * sizeof(char *));
	*times = palloc(Max(n, 1) * sizeof(TimestampTz));
	for (int i = 0; i < n; i++)
	{
		(*topics)[i] = eg_text_col(SPI_tuptable, i, 1);
		(*names)[i] = eg_text_col(SPI_tuptable, i, 2);
		(*times)[i] = eg_timestamp_col(SPI_tuptable, i, 3);
	}
	return n;
}

/*
 * The client certificates that expire before "before" (at most 100, the
 * soonest first): their subscriptions' topics and names and the expiry,
 * in arrays valid until the unit of work ends.  Returns how many.  In a
 * unit of work.
 */
int
eg_store_expiring_certificates(TimestampTz before, char ***topics, char ***names, TimestampTz **not_after)
{
	Datum		args[1] = {TimestampTzGetDatum(before)};

	eg_store_run(&expiring_certificates, args, SPI_OK_SELECT);
	return subscription_times(topics, names, not_after);
}

/*
 * Drops the event subscriptions whose expiration_time has come on the
 * workers' clock (SPEC 17; eventgrid._drop_expired_subscriptions(): at
 * most 1000, the events each still owed dead-lettered with reason
 * SubscriptionExpired or dropped, its final counts kept, its older dead
 * letters kept; one locked elsewhere is skipped without waiting), and
 * returns how many it looked at, in *expired (valid until the unit of work
 * ends); *next gets the earliest expiration left (DT_NOEND: none).  In a
 * unit of work (the upkeep worker's).
 */
int
eg_store_drop_expired(EgExpired **expired, TimestampTz *next)
{
	int			n;

	eg_store_run(&drop_expired, NULL, SPI_OK_SELECT);
	n = (int) SPI_processed;
	*expired = palloc0(Max(n, 1) * sizeof(EgExpired));
	for (int i = 0; i < n; i++)
	{
		(*expired)[i].topic = eg_text_col(SPI_tuptable, i, 1);
		(*expired)[i].name = eg_text_col(SPI_tuptable, i, 2);
		(*expired)[i].expired_at = eg_timestamp_col(SPI_tuptable, i, 3);
		(*expired)[i].owed = eg_int64_col(SPI_tuptable, i, 4, 0);
		(*expired)[i].skipped = eg_bool_col(SPI_tuptable, i, 5);
	}
	eg_store_run(&next_expiration, NULL, SPI_OK_SELECT);
	*next = eg_timestamp_col(SPI_tuptable, 0, 1);
	if (*next == 0)
		*next = DT_NOEND;
	return n;
}
