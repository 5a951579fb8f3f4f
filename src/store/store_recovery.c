/*
 * store_recovery.c - taking back what delivery workers that no longer run
 * left (a crash, an exit on ERROR, a restored dump), so that nothing is
 * lost and nothing is charged twice (SPEC section 2: at least once), and
 * starting afresh positions restored from another cluster, whose snapshots
 * hold that cluster's transaction ids.
 *
 * A chunk left in flight becomes retries, charged an attempt (outcome
 * Aborted) up to its sent mark; a leased retry that an in-flight record
 * names went to HTTP and is charged, the others are only released.  Both
 * run under a lock that makes recoveries take turns.
 */
#include "store/store.h"
#include "store/store_sql.h"

#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "pgstat.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

/*
 * Attempt history rows for deliveries a crash interrupted after they were
 * handed to HTTP (outcome Aborted, at time parameter at), from a CTE rows
 * with subscription_id, event_id, attempts (0: not charged, no row) and source;
 * only when the boolean parameter keep is true.
 */
#define ABORTED_HISTORY(rows, at, keep) \
	"  INSERT INTO eventgrid.attempt_log (history_table, attempted_at, topic, subscription_id," \
	"         subscription_name, event_ids, attempt, outcome, error, event_sources)" \
	"  SELECT h.history_table, " at ", s.topic, s.id, s.name, ARRAY[m.event_id], m.attempts, 'Aborted'," \
	"         'the delivery worker stopped before the outcome of this request was recorded'," \
	"         CASE WHEN m.source IS NOT NULL THEN ARRAY[m.source] END" \
	"    FROM " rows " m JOIN eventgrid.event_subscriptions s ON s.id = m.subscription_id" \
	"   CROSS JOIN eventgrid.attempt_log_rotation h" \
	"   WHERE " keep " AND m.attempts > 0"

/*
 * After a crash: the events of chunks left in flight become retries due
 * at $2, charged an attempt (Aborted) up to the chunk's sent mark.  The
 * chunks taken are those of stale owners (EG_SQL_STALE_OWNER).
 */
static EgStatement recover_chunks = {
	.name = "chunk recovery",
	.sql =
	"WITH c AS ("
	"  DELETE FROM eventgrid.chunks_in_flight c WHERE " EG_SQL_STALE_OWNER("c.lease_owner") " RETURNING c.*"
	"), made AS ("
	/* an ordered subscription's keyed events wait in publish order; start_keys makes each key's oldest due */
	"  INSERT INTO eventgrid.retries (subscription_id, event_id, event, payload, publish_time, event_bytes,"
	"         attempts, next_attempt_at, last_attempt_at, last_outcome, source, source_event_id, ordering_key)"
	"  SELECT s.id, e.id, e.event, " EG_SQL_PAYLOAD_TEXT ", e.publish_time, coalesce(e.event_bytes, 0),"
	"         x.sent::int, CASE WHEN x.okey IS NULL THEN $2 ELSE 'infinity' END, CASE WHEN x.sent THEN $2 END,"
	"         CASE WHEN x.sent THEN 'Aborted' END, e.source, e.source_event_id, x.okey"
	"    FROM c JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id"
	"    JOIN eventgrid.topics t ON t.name = s.topic"
	EG_SQL_CHUNK_EVENTS
	"   CROSS JOIN LATERAL (SELECT coalesce((e.txid, e.id) <= (c.sent_txid, c.sent_id), false) AS sent,"
	"                              CASE WHEN s.ordering_key IS NOT NULL"
	"                                   THEN eventgrid._ordering_key(e.event, s.ordering_key) END AS okey) x"
	/* a chunk's publish order is id order (its batch's); chunks follow one another (store_batch_order.c) */
	"   ORDER BY c.subscription_id, c.chunk, e.id"
	"  RETURNING id, subscription_id, event_id, attempts, source, ordering_key_hash, ordering_key IS NOT NULL AS keyed"
	"), unleased AS ("
	/* ordered subscriptions' positions the stale owners held (lease_owner) are free again */
	"  UPDATE eventgrid.subscription_positions p SET lease_owner = NULL"
	"   WHERE p.lease_owner IS NOT NULL AND " EG_SQL_STALE_OWNER("p.lease_owner")
	"), counted AS ("
	"  UPDATE eventgrid.subscription_counters sc SET matched = sc.matched + m.n"
	"    FROM (SELECT subscription_id, count(*) AS n FROM made GROUP BY subscription_id) m"
	"   WHERE sc.subscription_id = m.subscription_id"
	"), history AS ("
	ABORTED_HISTORY("made", "$2", "$3")
	")"
	"SELECT attempts, subscription_id, ordering_key_hash, id, keyed FROM made",
	.nargs = 3,
	.types = {INT4OID, TIMESTAMPTZOID, BOOLOID},
};

/*
 * After a crash, in three statements that each read the retries at most
 * once, whatever the planner thinks of them: a single statement joining
 * the named retries with all leased ones was planned, with statistics taken
 * while every leased retry had one owner (so no stale lease expected), as
 * a nested loop that read the whole retries table again for each leased
 * retry: minutes for 60,000 leases (the soak, bench/RESULTS.md; test 050),
 * with the database's deliveries stopped meanwhile.
 *
 * 1. The in-flight records of stale owners are removed, and the retries
 *    they name (which went to HTTP) returned as one array.
 */
static EgStatement forget_in_flight = {
	.name = "in-flight record removal",
	.sql =
	"WITH forgot AS ("
	"  DELETE FROM eventgrid.requests_in_flight f WHERE " EG_SQL_STALE_OWNER("f.lease_owner")
	"  RETURNING f.retry_ids"
	")"
	"SELECT coalesce(array_agg(DISTINCT x.id), '{}') FROM forgot CROSS JOIN LATERAL unnest(forgot.retry_ids) x(id)",
	.nargs = 1,
	.types = {INT4OID},
};

/*
 * 2. Those retries ($5, planned as the constant array it is: a probe of
 *    the primary key per id, or one scan with a hashed ANY), when still
 *    leased by a stale owner, are released due at $2 at the latest and
 *    charged an attempt (Aborted, up to $4: EG_MAX_DELIVERY_ATTEMPTS,
 *    the most the retries table holds; history as $3 says).  The owner
 *    is tested on r itself, so that a concurrent recovery's release is
 *    seen (EvalPlanQual) and nothing is charged twice.
 */
static EgStatement release_sent = {
	.name = "lease release of sent retries",
	.sql =
	"WITH released AS ("
	"  UPDATE eventgrid.retries r"
	"     SET next_attempt_at = least(r.next_attempt_at, $2), lease_owner = NULL,"
	"         attempts = least(r.attempts + 1, $4), last_outcome = 'Aborted',"
	"         last_http_status = NULL, last_attempt_at = $2"
	"   WHERE r.id = ANY ($5) AND r.lease_owner IS NOT NULL AND " EG_SQL_STALE_OWNER("r.lease_owner")
	"  RETURNING r.subscription_id, r.event_id, r.attempts, r.source"
	"), history AS ("
	ABORTED_HISTORY("released", "$2", "$3")
	")"
	"SELECT count(*) FROM released",
	.nargs = 5,
	.types = {INT4OID, TIMESTAMPTZOID, BOOLOID, INT4OID, INT8ARRAYOID},
	.custom = true,
};

/*
 * 3. At a delivery worker's start, every other retry a stale owner leased
 *    (it never reached HTTP) is released, due at $2 at the latest, not
 *    charged: one scan of the retries.
 */
static EgStatement release_unsent = {
	.name = "lease release",
	.sql =
	"UPDATE eventgrid.retries r SET next_attempt_at = least(r.next_attempt_at, $2), lease_owner = NULL"
	" WHERE r.lease_owner IS NOT NULL AND " EG_SQL_STALE_OWNER("r.lease_owner"),
	.nargs = 2,
	.types = {INT4OID, TIMESTAMPTZOID},
};

/* Keys of recovered ordered first attempts: each key without a head gets its oldest, due at $4. */
static EgStatement start_recovered = {
	.name = "ordering key start",
	.sql = "SELECT eventgrid._start_ordering_keys($1, $2, $3, $4)",
	.nargs = 4,
	.types = {INT8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID, TIMESTAMPTZOID},
};

/* whether any chunk, in-flight record or position lease belongs to a stale owner */
static EgStatement stale_owners = {
	.name = "stale owner lookup",
	.sql =
	"SELECT EXISTS (SELECT 1 FROM eventgrid.chunks_in_flight c WHERE " EG_SQL_STALE_OWNER("c.lease_owner") ")"
	"    OR EXISTS (SELECT 1 FROM eventgrid.requests_in_flight f WHERE " EG_SQL_STALE_OWNER("f.lease_owner") ")"
	"    OR EXISTS (SELECT 1 FROM eventgrid.subscription_positions p"
	"                WHERE p.lease_owner IS NOT NULL AND " EG_SQL_STALE_OWNER("p.lease_owner") ")",
	.nargs = 1,
	.types = {INT4OID},
};

/* recoveries take turns (the lock conflicts with itself, not with claims or records) */
static EgStatement recovery_lock = {
	.name = "recovery lock",
	.sql =
	"LOCK TABLE eventgrid.chunks_in_flight IN SHARE UPDATE EXCLUSIVE MODE",
};

/*
 * The keyed rows among the n chunk recovery made (tt: attempts,
 * subscription, key hash, retry id, keyed) wait behind their keys' heads,
 * or become them, due at now (start_recovered).
 */
static void
start_recovered_keys(SPITupleTable *tt, int n, TimestampTz now)
{
	Datum		args[4];

	if (eg_key_arrays(tt, n, 2, 5, args) == 0)
		return;
	args[3] = TimestampTzGetDatum(now);
	eg_store_run(&start_recovered, args, SPI_OK_SELECT);
}

/*
 * Takes back what delivery workers that no longer run left (a crash, an
 * exit on ERROR, or a restored dump): chunks of first attempts become
 * retries due at now, and retries they leased are released, due at now.
 * What an in-flight record named went to HTTP and is charged an attempt
 * (outcome Aborted); the rest is not charged.  starting_pid is the pid of
 * a delivery worker that is starting (what names it is stale too, and every
 * stale lease is released, which scans the retries); 0 at upkeep, which
 * looks first whether any chunk or in-flight record is stale and takes
 * only those and the retries they name.  Recoveries take turns.  Returns
 * how many deliveries were charged and how many taken back in all, and
 * logs it when there were any.
 */
void
eg_store_recover(int starting_pid, TimestampTz now, bool history, uint64 *charged, uint64 *released)
{
	Datum		args[3];
	Datum		sent_args[5];
	bool		isnull;
	uint64		sent;

	args[0] = Int32GetDatum(starting_pid);
	args[1] = TimestampTzGetDatum(now);
	args[2] = BoolGetDatum(history);
	*charged = 0;
	*released = 0;
	if (starting_pid == 0)
	{
		bool		stale;

		eg_store_run(&stale_owners, args, SPI_OK_SELECT);
		stale = eg_bool_col(SPI_tuptable, 0, 1);
		if (!stale)
			return;
	}
	eg_store_run(&recovery_lock, NULL, SPI_OK_UTILITY);

	/* who runs is read again by each statement, after its snapshot */
	pgstat_clear_snapshot();
	eg_store_run(&recover_chunks, args, SPI_OK_SELECT);
	*released = SPI_processed;
	for (uint64 i = 0; i < SPI_processed; i++)
		if (eg_int32_col(SPI_tuptable, (int) i, 1, 0) > 0)
			(*charged)++;
	start_recovered_keys(SPI_tuptable, (int) SPI_processed, now);
	pgstat_clear_snapshot();
	eg_store_run(&forget_in_flight, args, SPI_OK_SELECT);
	sent_args[0] = args[0];
	sent_args[1] = args[1];
	sent_args[2] = args[2];
	sent_args[3] = Int32GetDatum(EG_MAX_DELIVERY_ATTEMPTS);
	sent_args[4] = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	Assert(!isnull);
	eg_store_run(&release_sent, sent_args, SPI_OK_SELECT);
	sent = (uint64) eg_int64_col(SPI_tuptable, 0, 1, 0);
	*released += sent;
	*charged += sent;
	if (starting_pid != 0)
	{
		eg_store_run(&release_unsent, args, SPI_OK_UPDATE);
		*released += SPI_processed;
	}
	if (*released > 0)
		ereport(LOG,
				(errmsg("eventgrid: %llu deliveries left in flight by %s will be retried",
						(unsigned long long) *released,
						starting_pid != 0 ? "an earlier run of the delivery workers"
						: "a delivery worker that no longer exists"),
				 errdetail("%llu of them had been sent and are counted as attempts with outcome Aborted.",
						   (unsigned long long) *charged)));
}

/*
 * positions whose snapshots belong to another cluster (a restored dump):
 * the lowest and highest system identifier of the positions, two probes of
 * subscription_positions_system_identifier_idx, not a scan of every one
 */
static EgStatement foreign = {
	.name = "foreign position lookup",
	.sql =
	"SELECT coalesce((SELECT min(p.system_identifier) FROM eventgrid.subscription_positions p)"
	"                  <> eventgrid._system_identifier(), false)"
	"    OR coalesce((SELECT max(p.system_identifier) FROM eventgrid.subscription_positions p)"
	"                  <> eventgrid._system_identifier(), false)"
	"    OR EXISTS (SELECT 1 FROM eventgrid.topic_positions p"
	"                WHERE p.system_identifier <> eventgrid._system_identifier())",
};

/*
 * The events e (of subscription s's topic) that position p, restored from
 * another cluster, had not passed and s's filters take.
 */
#define EG_SQL_FOREIGN_UNPASSED \
	"   AND p.system_identifier <> eventgrid._system_identifier()" \
	"   AND (s.domain_topic IS NULL OR e.domain_topic = s.domain_topic)" \
	"   AND NOT pg_visible_in_snapshot(e.txid, p.done)" \
	"   AND NOT (p.upto IS NOT NULL AND pg_visible_in_snapshot(e.txid, p.upto)" \
	"            AND (e.txid, e.id) <= (coalesce(p.after_txid, '0'::xid8), coalesce(p.after_id, 0)))" \
	"   AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with," \
	"                          s.subject_ends_with, s.is_subject_case_sensitive," \
	"                          s.advanced_filters, s.enable_advanced_filtering_on_arrays)"

/*
 * what such positions had not passed becomes retries, due at $1; of an
 * ordered subscription in publish order (id order: the batches of another
 * cluster's snapshots cannot be told apart here) with their keys, waiting
 * (start_keys then makes each new key's oldest due)
 */
static EgStatement rebase_pending = {
	.name = "rebase of pending deliveries",
	.sql =
	"INSERT INTO eventgrid.retries (subscription_id, event_id, event, payload, publish_time, event_bytes,"
	"       attempts, next_attempt_at, source, source_event_id, ordering_key)"
	"SELECT x.* FROM ("
	"SELECT s.id, e.id AS event_id, e.event, " EG_SQL_PAYLOAD_TEXT ", e.publish_time, coalesce(e.event_bytes, 0), 0,"
	"       CASE WHEN k.okey IS NULL THEN $1 ELSE 'infinity' END, e.source, e.source_event_id, k.okey"
	"  FROM eventgrid.subscription_positions p"
	"  JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id"
	"  JOIN eventgrid.topics t ON t.name = s.topic"
	"  JOIN eventgrid.events e ON e.topic = s.topic"
	" CROSS JOIN LATERAL (SELECT eventgrid._ordering_key(e.event, s.ordering_key) AS okey) k"
	" WHERE s.delivery_mode = 'push'"
	EG_SQL_FOREIGN_UNPASSED
	" ORDER BY s.id, e.id) x",
	.nargs = 1,
	.types = {TIMESTAMPTZOID},
};

/* ... and of a queue subscription (SPEC 14) receivable events, at $1 */
static EgStatement rebase_queue = {
	.name = "rebase of queue events",
	.sql =
	"WITH moved AS ("
	"  INSERT INTO eventgrid.queue_events (subscription_id, event_id, event, publish_time, event_bytes,"
	"         receivable_at, source, source_event_id)"
	"  SELECT x.* FROM ("
	"  SELECT s.id, e.id AS event_id, e.event, e.publish_time, coalesce(e.event_bytes, 0), $1,"
	"         e.source, e.source_event_id"
	"    FROM eventgrid.subscription_positions p"
	"    JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id"
	"    JOIN eventgrid.events e ON e.topic = s.topic"
	"   WHERE s.delivery_mode = 'queue'"
	EG_SQL_FOREIGN_UNPASSED
	"   ORDER BY s.id, e.id) x"
	"  RETURNING 1"
	")"
	"SELECT count(*) FROM moved",
	.nargs = 1,
	.types = {TIMESTAMPTZOID},
};

/* of each key of the ordered subscriptions that has no head, the oldest waiting retry is due at $1 */
static EgStatement start_keys = {
	.name = "rebase of ordering keys",
	.sql =
	"SELECT eventgrid._start_ordering_keys(array_agg(r.subscription_id), array_agg(r.ordering_key_hash),"
	"                                      array_agg(r.id), $1)"
	"  FROM eventgrid.retries r WHERE r.ordering_key IS NOT NULL AND r.next_attempt_at = 'infinity'",
	.nargs = 1,
	.types = {TIMESTAMPTZOID},
};

/* ... and every position starts afresh from now, on emptied event tables */
static EgStatement rebase_positions = {
	.name = "position rebase",
	.sql =
	"WITH sub AS ("
	"  UPDATE eventgrid.subscription_positions"
	"     SET since = pg_current_snapshot(), done = pg_current_snapshot(), upto = NULL, after_txid = NULL,"
	"         after_id = NULL, lease_owner = NULL, system_identifier = eventgrid._system_identifier()"
	")"
	"UPDATE eventgrid.topic_positions"
	"   SET done = pg_current_snapshot(), system_identifier = eventgrid._system_identifier()",
};

/*
 * Positions restored from another cluster (pg_restore elsewhere,
 * pg_upgrade) hold snapshots of that cluster's transaction ids: what they
 * had not passed becomes retries due at now, the event tables are emptied
 * (their transaction ids mean nothing here) and every position starts
 * afresh.  Returns the number of retries made; 0 and nothing done when
 * every position is this cluster's.
 */
uint64
eg_store_rebase(TimestampTz now)
{
	Datum		arg = TimestampTzGetDatum(now);
	uint64		made;

	eg_store_run(&foreign, NULL, SPI_OK_SELECT);
	if (!eg_bool_col(SPI_tuptable, 0, 1))
		return 0;
	eg_store_run(&rebase_pending, &arg, SPI_OK_INSERT);
	made = SPI_processed;
	eg_store_run(&start_keys, &arg, SPI_OK_SELECT);
	eg_store_run(&rebase_queue, &arg, SPI_OK_SELECT);
	if (eg_int64_col(SPI_tuptable, 0, 1, 0) > 0)
	{
		made += eg_int64_col(SPI_tuptable, 0, 1, 0);
		eg_wake_receivers_at_commit(-1);
	}
	if (SPI_execute("TRUNCATE eventgrid.events_0, eventgrid.events_1, eventgrid.events_2", false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "eventgrid: emptying the event tables failed");
	eg_store_run(&rebase_positions, NULL, SPI_OK_UPDATE);
	ereport(LOG,
			(errmsg("eventgrid: positions restored from another cluster start afresh; %llu pending deliveries became retries or receivable queue events",
					(unsigned long long) made)));
	return made;
}


PG_FUNCTION_INFO_V1(eventgrid_system_identifier);

/*
 * SQL: eventgrid._system_identifier() -> bigint: this cluster's system
 * identifier, as pg_control_system() reports it but from memory
 * (GetSystemIdentifier()) rather than by reading the control file at each
 * call; stamped on positions, so that recovery tells a restore into
 * another cluster.  The claims call it at every round.  STABLE.
 */
Datum
eventgrid_system_identifier(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64((int64) GetSystemIdentifier());
}
