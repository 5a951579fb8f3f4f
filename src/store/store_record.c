/*
 * store_record.c - what is in flight and what came of it (SPEC sections 3,
 * 4 and 7): before requests go to HTTP, the retries they carry (one
 * in-flight record per wave) and how far each chunk's first attempts went
 * (its sent mark), committed durably; then the outcomes, set-based, in
 * hundreds per statement: failures of first attempts become retries or
 * dead letters, retries are rescheduled or ended, counters move, chunks
 * are forgotten, and the attempts go to the attempt history.
 */
#include "store/store.h"
#include "store/store_sql.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

/* lock order of every writer: subscriptions first (drop_event_subscription does the same) */
static EgStatement lock_subscriptions = {
	.name = "subscription lock",
	.sql = "SELECT s.id FROM eventgrid.event_subscriptions s WHERE s.id = ANY ($1) ORDER BY s.id FOR KEY SHARE",
	.nargs = 1,
	.types = {INT8ARRAYOID},
	.generic = true,
};

/*
 * Then their counters, in id order.  Two delivery workers recording
 * outcomes of the same subscriptions update their counters in whatever
 * order the record statements' plans visit them, which depends on the
 * statistics the plans were made with: in opposite orders they deadlock,
 * and one waits deadlock_timeout (1 s) before it is cancelled (seen as
 * bench figure 9's healthy subscription waiting a second, after figure 6
 * had left other statistics behind).  Locked here in one order first, the
 * updates that follow cannot deadlock.
 */
static EgStatement lock_counters = {
	.name = "counter lock",
	.sql =
	"SELECT c.subscription_id FROM eventgrid.subscription_counters c"
	" WHERE c.subscription_id = ANY ($1) ORDER BY c.subscription_id FOR NO KEY UPDATE",
	.nargs = 1,
	.types = {INT8ARRAYOID},
	.generic = true,
};

/*
 * Ordered subscriptions' first attempts just parked in the retries
 * (subscriptions $1, keys $2, retry ids $3): each key without a head gets
 * its oldest as head, due at its time in $4.
 */
static EgStatement park_keys = {
	.name = "ordering key parking",
	.sql = "SELECT eventgrid._park_ordering_keys($1, $2, $3, $4)",
	.nargs = 4,
	.types = {INT8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID, TIMESTAMPTZARRAYOID},
};

/* Ordered subscriptions' keys whose head ($3) was finished: the next is due at $4. */
static EgStatement promote_keys = {
	.name = "ordering key promotion",
	.sql = "SELECT eventgrid._promote_ordering_keys($1, $2, $3, $4)",
	.nargs = 4,
	.types = {INT8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID, TIMESTAMPTZOID},
};

static EgStatement in_flight = {
	.name = "in-flight record",
	.sql =
	"INSERT INTO eventgrid.requests_in_flight (lease_owner, wave, retry_ids) VALUES ($1, $2, $3)",
	.nargs = 3,
	.types = {INT4OID, INT8OID, INT8ARRAYOID},
};

static EgStatement sent_marks = {
	.name = "sent mark",
	.sql =
	/* never lower: an ordered chunk's requests go per key, not in (txid, id) order */
	"UPDATE eventgrid.chunks_in_flight c"
	"   SET sent_txid = CASE WHEN coalesce((m.txid, m.id) > (c.sent_txid, c.sent_id), true) THEN m.txid ELSE c.sent_txid END,"
	"       sent_id = CASE WHEN coalesce((m.txid, m.id) > (c.sent_txid, c.sent_id), true) THEN m.id ELSE c.sent_id END"
	"  FROM unnest($2::int8[], $3::xid8[], $4::int8[]) AS m(chunk, txid, id)"
	" WHERE c.lease_owner = $1 AND c.chunk = m.chunk",
	.nargs = 4,
	.types = {INT4OID, INT8ARRAYOID, XID8ARRAYOID, INT8ARRAYOID},
};

static EgStatement waves_done = {
	.name = "in-flight record removal",
	.sql =
	"DELETE FROM eventgrid.requests_in_flight WHERE lease_owner = $1 AND wave = ANY ($2)",
	.nargs = 2,
	.types = {INT4OID, INT8ARRAYOID},
};

/*
 * Records, before a wave of requests goes to HTTP, what it carries: the
 * retries retry_ids[0..nretries) under wave number wave, and for each chunk
 * in marks[0..nmarks) the last of its events handed to HTTP so far.
 */
void
eg_store_mark_in_flight(int lease_owner, int64 wave, const int64 *retry_ids, int nretries,
						const EgChunkMark *marks, int nmarks)
{
	Datum		args[4];

	if (nretries > 0)
	{
		args[0] = Int32GetDatum(lease_owner);
		args[1] = Int64GetDatum(wave);
		args[2] = eg_int8_array(retry_ids, nretries);
		eg_store_run(&in_flight, args, SPI_OK_INSERT);
	}
	if (nmarks > 0)
	{
		int64	   *chunks = palloc(nmarks * sizeof(int64));
		uint64	   *txids = palloc(nmarks * sizeof(uint64));
		int64	   *ids = palloc(nmarks * sizeof(int64));

		for (int i = 0; i < nmarks; i++)
		{
			chunks[i] = marks[i].chunk;
			txids[i] = marks[i].txid;
			ids[i] = marks[i].event_id;
		}
		args[0] = Int32GetDatum(lease_owner);
		args[1] = eg_int8_array(chunks, nmarks);
		args[2] = eg_xid8_array(txids, nmarks);
		args[3] = eg_int8_array(ids, nmarks);
		eg_store_run(&sent_marks, args, SPI_OK_UPDATE);
	}
}

/* Forgets the in-flight records of waves whose retries are all recorded. */
void
eg_store_forget_waves(int lease_owner, const int64 *waves, int n)
{
	Datum		args[2];

	if (n == 0)
		return;
	args[0] = Int32GetDatum(lease_owner);
	args[1] = eg_int8_array(waves, n);
	eg_store_run(&waves_done, args, SPI_OK_DELETE);
}

/*
 * Dead-letter notifications: each delivery of the rows of cte that ends
 * undelivered (action 'f'), of a subscription with a dead_letter_topic,
 * is published to that topic as an event, in the record's transaction
 * (eventgrid._dead_letter_notification builds it, always within the 1 MB
 * event limit, or nothing for a notification that itself ended
 * undelivered).  Notifications are stored with source '(dead-letter
 * notification)', which no publisher can write: that, not their event
 * type, tells them apart.  eventgrid._publish_dead_letter_notifications
 * publishes them in a subtransaction (one at a time when that fails) and
 * returns those that cannot be made, which are kept in
 * dead_letter_notification_failures: a notification never holds the
 * record back.  Called only when the record has any (cardinality > 0);
 * event_id names cte's column of the event's id.
 */
#define EG_SQL_NOTIFY(cte, event_id) \
	"  INSERT INTO eventgrid.dead_letter_notification_failures (subscription_id, topic, subscription_name," \
	"         event_id, dead_letter_topic, sqlstate, error)" \
	"  SELECT x.* FROM (SELECT ARRAY(" \
	"    SELECT ROW(f.subscription_id, f." event_id ", f.dead_letter_topic, f.topic, f.name, f.event," \
	"               f.input_schema, f.deadletter, f.reason, f.attempts, f.outcome, f.status, f.publish_time," \
	"               f.attempted_at, f.source)::eventgrid._dead_letter_notice" \
	"      FROM " cte " f WHERE f.action = 'f' AND f.dead_letter_topic IS NOT NULL) AS a) q" \
	"   CROSS JOIN LATERAL eventgrid._publish_dead_letter_notifications(q.a) x" \
	"   WHERE cardinality(q.a) > 0"

/*
 * Outcomes of whole chunks of first attempts: failures ($1-$10, the
 * outcomes other than delivered) become retries (with a copy of the
 * event and its delivered text) or dead letters, counters move by what
 * the caller counted per subscription ($13-$17), and the chunks are
 * forgotten.  Only failures touch the event tables; delivered events
 * are not sent here one by one.
 *
 * Each outcome row finds its subscription by primary key and its event by
 * the full (topic, txid, id) key, in LATERAL subqueries the planner may
 * not pull up: the plan is kept (generic) for the worker's life, and made
 * from the statistics of the moment, so it must not depend on them.  Left
 * to choose, a plan made while a topic had one subscription rescanned
 * every outcome for each of 700 subscriptions later (n x m per record,
 * a second per record at 5,000 failures a second: bench figure 9 after
 * figure 6).
 */
static EgStatement record_first = {
	.name = "first-attempt record",
	.sql =
	"WITH r AS ("
	"  SELECT * FROM unnest($1::int8[], $2::xid8[], $3::int8[], $4::text[], $5::text[], $6::int4[],"
	"                       $7::timestamptz[], $8::timestamptz[], $9::text[], $10::int4[]) WITH ORDINALITY"
	"         AS r(subscription_id, txid, id, action, outcome, status, attempted_at, next_at, reason,"
	"              attempts, ord)"
	"), st AS ("
	"  SELECT * FROM unnest($13::int8[], $14::int8[], $15::int8[], $16::int8[], $17::int8[])"
	"         AS st(subscription_id, matched, delivered, failed, finals)"
	"), failed AS ("
	"  SELECT r.*, s.topic, s.name, s.deadletter, s.event_delivery_schema, t.input_schema, s.topic_type,"
	"         s.dead_letter_topic,"
	"         e.event, e.publish_time, e.event_bytes, e.source, e.source_event_id,"
	"         " EG_SQL_PAYLOAD_TEXT " AS payload,"
	"         CASE WHEN s.ordering_key IS NOT NULL THEN eventgrid._ordering_key(e.event, s.ordering_key) END AS okey"
	"    FROM r"
	"   CROSS JOIN LATERAL (SELECT s.* FROM eventgrid.event_subscriptions s"
	"                        WHERE s.id = r.subscription_id OFFSET 0) s"
	"   CROSS JOIN LATERAL (SELECT t.input_schema FROM eventgrid.topics t WHERE t.name = s.topic OFFSET 0) t"
	"   CROSS JOIN LATERAL (SELECT e.event, e.publish_time, e.event_bytes, e.source, e.source_event_id"
	"                         FROM eventgrid.events e"
	"                        WHERE e.topic = s.topic AND e.txid = r.txid AND e.id = r.id OFFSET 0) e"
	"), retried AS ("
	/* a key's rows wait ('infinity') in the order decided (ord): _park_ordering_keys makes each new key's oldest its head */
	"  INSERT INTO eventgrid.retries (subscription_id, event_id, event, payload, publish_time, event_bytes,"
	"         attempts, next_attempt_at, last_attempt_at, last_outcome, last_http_status, source, source_event_id,"
	"         ordering_key)"
	"  SELECT f.subscription_id, f.id, f.event, f.payload, f.publish_time, coalesce(f.event_bytes, 0),"
	"         f.attempts, CASE WHEN f.okey IS NULL THEN f.next_at ELSE 'infinity' END, f.attempted_at,"
	"         f.outcome, f.status, f.source, f.source_event_id, f.okey"
	"    FROM failed f WHERE f.action IN ('r', 'w') ORDER BY f.ord"
	"  RETURNING id, subscription_id, event_id, ordering_key_hash, ordering_key IS NOT NULL AS keyed"
	"), dead AS ("
	"  INSERT INTO eventgrid.dead_letters (topic, subscription_name, subscription_id, input_schema,"
	"         event_delivery_schema, event, dead_letter_reason, delivery_attempts, last_delivery_outcome,"
	"         last_http_status_code, publish_time, last_delivery_attempt_time, topic_type, event_id,"
	"         source, source_event_id)"
	"  SELECT f.topic, f.name, f.subscription_id, f.input_schema, f.event_delivery_schema, f.event,"
	"         f.reason, f.attempts, f.outcome, f.status, f.publish_time, f.attempted_at, f.topic_type, f.id,"
	"         f.source, f.source_event_id"
	"    FROM failed f WHERE f.action = 'f' AND f.deadletter"
	"), notified AS ("
	EG_SQL_NOTIFY("failed", "id")
	"), counted AS ("
	"  UPDATE eventgrid.subscription_counters c"
	"     SET matched = c.matched + st.matched,"
	"         delivered = c.delivered + st.delivered, failed_attempts = c.failed_attempts + st.failed,"
	"         dead_lettered = c.dead_lettered + CASE WHEN s.deadletter THEN st.finals ELSE 0 END,"
	"         dropped = c.dropped + CASE WHEN s.deadletter THEN 0 ELSE st.finals END"
	"    FROM st CROSS JOIN LATERAL (SELECT s.deadletter FROM eventgrid.event_subscriptions s"
	"                                 WHERE s.id = st.subscription_id OFFSET 0) s"
	"   WHERE c.subscription_id = st.subscription_id"
	"), gone AS ("
	"  DELETE FROM eventgrid.chunks_in_flight c WHERE c.lease_owner = $11 AND c.chunk = ANY ($12)"
	"  RETURNING c.subscription_id"
	"), released AS ("
	/* ordered subscriptions of which this worker holds nothing more in flight: others may claim them */
	"  UPDATE eventgrid.subscription_positions p SET lease_owner = NULL"
	"   WHERE p.lease_owner = $11 AND p.subscription_id IN (SELECT g.subscription_id FROM gone g)"
	"     AND NOT EXISTS (SELECT 1 FROM eventgrid.chunks_in_flight c"
	"                      WHERE c.lease_owner = $11 AND c.subscription_id = p.subscription_id"
	"                        AND c.chunk <> ALL ($12))"
	")"
	/* the keyed rows parked: park_keys gives each new key its head */
	"SELECT rt.subscription_id, rt.ordering_key_hash, rt.id, f.next_at"
	"  FROM retried rt JOIN failed f ON f.subscription_id = rt.subscription_id AND f.id = rt.event_id"
	" WHERE rt.keyed",
	.nargs = 17,
	.types = {INT8ARRAYOID, XID8ARRAYOID, INT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID, INT4ARRAYOID, TIMESTAMPTZARRAYOID, TIMESTAMPTZARRAYOID, TEXTARRAYOID, INT4ARRAYOID, INT4OID, INT8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID},
	.generic = true,
};

/*
 * Outcomes of retries: the next attempt is scheduled, or the row is
 * deleted and dead-lettered or counted.  Each outcome row finds its retry
 * and its subscription by primary key, in LATERAL subqueries (see
 * record_first: the plan must not depend on the statistics it was made
 * with).
 */
static EgStatement record_retries = {
	.name = "retry record",
	.sql =
	"WITH o AS ("
	"  SELECT * FROM unnest($1::int8[], $2::text[], $3::text[], $4::int4[], $5::timestamptz[],"
	"                       $6::timestamptz[], $7::text[], $8::int4[], $9::bool[])"
	"         AS o(id, action, outcome, status, attempted_at, next_at, reason, attempts, attempted)"
	"), target AS MATERIALIZED ("
	"  SELECT o.*, rr.tid, rr.subscription_id, rr.event_id, rr.event, rr.publish_time, rr.source, rr.source_event_id"
	"    FROM o CROSS JOIN LATERAL (SELECT r.ctid AS tid, r.subscription_id, r.event_id, r.event, r.publish_time,"
	"                                      r.source, r.source_event_id"
	"                                 FROM eventgrid.retries r WHERE r.id = o.id OFFSET 0) rr"
	"), retried AS ("
	"  UPDATE eventgrid.retries r"
	"     SET attempts = x.attempts, next_attempt_at = x.next_at, last_attempt_at = x.attempted_at,"
	"         last_outcome = x.outcome, last_http_status = x.status, lease_owner = NULL"
	"    FROM target x WHERE r.ctid = x.tid AND x.action = 'r'"
	"  RETURNING r.subscription_id, x.attempted"
	"), finished AS ("
	"  DELETE FROM eventgrid.retries r USING target x"
	"   WHERE r.ctid = x.tid AND x.action <> 'r'"
	"  RETURNING r.subscription_id, r.event_id, r.event, r.publish_time, x.action, x.reason, x.attempts,"
	"            x.outcome, x.status, x.attempted_at, x.attempted, r.source, r.source_event_id,"
	"            r.ordering_key IS NOT NULL AS keyed, r.ordering_key_hash, r.id AS retry_id"
	"), fin AS ("
	"  SELECT f.*, coalesce(s.deadletter, false) AS deadletter, s.topic, s.name, s.event_delivery_schema,"
	"         t.input_schema, s.topic_type, s.dead_letter_topic"
	"    FROM finished f"
	"   CROSS JOIN LATERAL (SELECT s.* FROM eventgrid.event_subscriptions s"
	"                        WHERE s.id = f.subscription_id OFFSET 0) s"
	"   CROSS JOIN LATERAL (SELECT t.input_schema FROM eventgrid.topics t WHERE t.name = s.topic OFFSET 0) t"
	"), dead AS ("
	"  INSERT INTO eventgrid.dead_letters (topic, subscription_name, subscription_id, input_schema,"
	"         event_delivery_schema, event, dead_letter_reason, delivery_attempts, last_delivery_outcome,"
	"         last_http_status_code, publish_time, last_delivery_attempt_time, topic_type, event_id,"
	"         source, source_event_id)"
	"  SELECT f.topic, f.name, f.subscription_id, f.input_schema, f.event_delivery_schema, f.event,"
	"         f.reason, f.attempts, f.outcome, f.status, f.publish_time, f.attempted_at, f.topic_type, f.event_id,"
	"         f.source, f.source_event_id"
	"    FROM fin f WHERE f.action = 'f' AND f.deadletter"
	"), notified AS ("
	EG_SQL_NOTIFY("fin", "event_id")
	"), stats AS ("
	"  SELECT x.subscription_id, sum(x.delivered) AS delivered, sum(x.failed) AS failed,"
	"         sum(x.dead) AS dead, sum(x.dropped) AS dropped"
	"    FROM (SELECT subscription_id, 0 AS delivered, attempted::int AS failed, 0 AS dead, 0 AS dropped FROM retried"
	"          UNION ALL"
	"          SELECT subscription_id, (action = 'd')::int, (action = 'f' AND attempted)::int,"
	"                 (action = 'f' AND deadletter)::int, (action = 'f' AND NOT deadletter)::int"
	"            FROM fin) x"
	"   GROUP BY x.subscription_id"
	"), counted AS ("
	"  UPDATE eventgrid.subscription_counters c"
	"     SET delivered = c.delivered + stats.delivered, failed_attempts = c.failed_attempts + stats.failed,"
	"         dead_lettered = c.dead_lettered + stats.dead, dropped = c.dropped + stats.dropped"
	"    FROM stats WHERE c.subscription_id = stats.subscription_id"
	")"
	/* the keys whose oldest event was finished: the next of each is promoted (promote_keys) */
	"SELECT f.subscription_id, f.ordering_key_hash, f.retry_id FROM finished f WHERE f.keyed",
	.nargs = 9,
	.types = {INT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID, INT4ARRAYOID, TIMESTAMPTZARRAYOID, TIMESTAMPTZARRAYOID, TEXTARRAYOID, INT4ARRAYOID, BOOLARRAYOID},
};

/*
 * Delivery attempts, one row each, into the history table that takes
 * rows now; $5 holds the event ids of all of them, attempt k's from
 * $6[k] to $7[k].  The topic comes with each attempt ($12): a join with
 * the subscriptions here became, in the generic plan, an index probe
 * per attempt.
 */
static EgStatement record_attempts_st = {
	.name = "attempt history",
	.sql =
	"INSERT INTO eventgrid.attempt_log (history_table, attempted_at, topic, subscription_id,"
	"       subscription_name, event_ids, attempt, http_status, outcome, duration_ms, error, response_body,"
	"       event_sources)"
	"SELECT h.history_table, a.attempted_at, a.topic, a.subscription_id, a.subscription_name,"
	"       $5[a.first:a.last], a.attempt, a.status, a.outcome, a.duration_ms, a.error, a.response_body,"
	"       nullif($14[a.first:a.last], array_fill(NULL::text, ARRAY[a.last - a.first + 1]))"
	"  FROM eventgrid.attempt_log_rotation h"
	" CROSS JOIN unnest($1::timestamptz[], $2::int8[], $3::text[], $4::int4[], $6::int4[], $7::int4[],"
	"                   $8::int4[], $9::text[], $10::float8[], $11::text[], $12::text[], $13::text[])"
	"       AS a(attempted_at, subscription_id, subscription_name, attempt, first, last, status, outcome,"
	"            duration_ms, error, topic, response_body)",
	.nargs = 14,
	.types = {TIMESTAMPTZARRAYOID, INT8ARRAYOID, TEXTARRAYOID, INT4ARRAYOID, INT8ARRAYOID, INT4ARRAYOID, INT4ARRAYOID, INT4ARRAYOID, TEXTARRAYOID, FLOAT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID, TEXTARRAYOID, TEXTARRAYOID},
	.generic = true,
};

/* Outcome arrays of one record statement. */
typedef struct OutcomeArrays
{
	int			n;
	Datum	   *ids,
			   *subs,
			   *event_ids,
			   *actions,
			   *names,
			   *statuses,
			   *attempted,
			   *next_at,
			   *reasons,
			   *attempts,
			   *flags;
	uint64	   *txids;
	bool	   *n_name,
			   *n_status,
			   *n_attempted,
			   *n_next,
			   *n_reason;
} OutcomeArrays;

static void
outcome_arrays_init(OutcomeArrays *a, int cap)
{
	cap = Max(cap, 1);
	a->n = 0;
	a->ids = palloc(cap * sizeof(Datum));
	a->subs = palloc(cap * sizeof(Datum));
	a->event_ids = palloc(cap * sizeof(Datum));
	a->actions = palloc(cap * sizeof(Datum));
	a->names = palloc(cap * sizeof(Datum));
	a->statuses = palloc(cap * sizeof(Datum));
	a->attempted = palloc(cap * sizeof(Datum));
	a->next_at = palloc(cap * sizeof(Datum));
	a->reasons = palloc(cap * sizeof(Datum));
	a->attempts = palloc(cap * sizeof(Datum));
	a->flags = palloc(cap * sizeof(Datum));
	a->txids = palloc(cap * sizeof(uint64));
	a->n_name = palloc(cap * sizeof(bool));
	a->n_status = palloc(cap * sizeof(bool));
	a->n_attempted = palloc(cap * sizeof(bool));
	a->n_next = palloc(cap * sizeof(bool));
	a->n_reason = palloc(cap * sizeof(bool));
}

static void
outcome_arrays_add(OutcomeArrays *a, const EgOutcome *o)
{
	int			i = a->n++;
	char		act[2] = {(char) o->action, '\0'};
	const char *outcome = eg_outcome_name(o->outcome);
	const char *reason = eg_reason_name(o->reason);

	a->ids[i] = Int64GetDatum(o->retry_id);
	a->subs[i] = Int64GetDatum(o->subscription_id);
	a->event_ids[i] = Int64GetDatum(o->event_id);
	a->txids[i] = o->txid;
	a->actions[i] = CStringGetTextDatum(act);
	a->n_name[i] = outcome == NULL;
	a->names[i] = outcome ? CStringGetTextDatum(outcome) : (Datum) 0;
	a->n_status[i] = o->http_status == 0;
	a->statuses[i] = Int32GetDatum(o->http_status);
	a->n_attempted[i] = o->attempted_at == 0;
	a->attempted[i] = TimestampTzGetDatum(o->attempted_at);
	a->n_next[i] = o->action != EG_ACTION_RETRY && o->action != EG_ACTION_WAIT;
	a->next_at[i] = TimestampTzGetDatum(o->next_at);
	a->n_reason[i] = reason == NULL;
	a->reasons[i] = reason ? CStringGetTextDatum(reason) : (Datum) 0;
	a->attempts[i] = Int32GetDatum(o->attempts_after);
	a->flags[i] = BoolGetDatum(o->attempted);
}

/*
 * The outcome arrays both recording statements take, in their order:
 * action, outcome, HTTP status, attempted at, next attempt at, dead-letter
 * reason, attempts, and (when with_attempted) attempted (a request was
 * sent).
 */
static void
outcome_args(const OutcomeArrays *a, Datum *args, bool with_attempted)
{
	args[0] = eg_make_array(a->actions, NULL, a->n, TEXTOID);
	args[1] = eg_make_array(a->names, a->n_name, a->n, TEXTOID);
	args[2] = eg_make_array(a->statuses, a->n_status, a->n, INT4OID);
	args[3] = eg_make_array(a->attempted, a->n_attempted, a->n, TIMESTAMPTZOID);
	args[4] = eg_make_array(a->next_at, a->n_next, a->n, TIMESTAMPTZOID);
	args[5] = eg_make_array(a->reasons, a->n_reason, a->n, TEXTOID);
	args[6] = eg_make_array(a->attempts, NULL, a->n, INT4OID);
	if (with_attempted)
		args[7] = eg_make_array(a->flags, NULL, a->n, BOOLOID);
}

/* Counter increments of one event subscription from a record's first attempts. */
typedef struct SubCounts
{
	int64		subscription_id;
	int64		matched;
	int64		delivered;
	int64		failed;			/* attempts that failed */
	int64		finals;			/* dead-lettered or dropped */
} SubCounts;

static int
cmp_sub_counts(const void *a, const void *b)
{
	const SubCounts *x = a;
	const SubCounts *y = b;

	return x->subscription_id < y->subscription_id ? -1 : x->subscription_id > y->subscription_id ? 1 : 0;
}

/*
 * Sums the first-attempt outcomes per subscription into args[0..4]
 * (subscription ids, matched, delivered, failed attempts, finals), the
 * arrays record_first counts with.
 */
static void
first_counts_args(EgOutcome *const *outcomes, int n, Datum *args)
{
	SubCounts  *c = palloc(Max(n, 1) * sizeof(SubCounts));
	Datum	   *cols[5];
	int			k = 0;
	int			m = 0;

	for (int i = 0; i < n; i++)
	{
		const EgOutcome *o = outcomes[i];

		if (o->retry_id != 0)
			continue;
		c[k].subscription_id = o->subscription_id;
		c[k].matched = 1;
		c[k].delivered = o->action == EG_ACTION_DELIVERED;
		c[k].failed = o->action != EG_ACTION_DELIVERED && o->attempted;
		c[k].finals = o->action == EG_ACTION_FINAL;
		k++;
	}
	qsort(c, k, sizeof(SubCounts), cmp_sub_counts);
	for (int i = 0; i < k; i++)
	{
		if (m > 0 && c[m - 1].subscription_id == c[i].subscription_id)
		{
			c[m - 1].matched += c[i].matched;
			c[m - 1].delivered += c[i].delivered;
			c[m - 1].failed += c[i].failed;
			c[m - 1].finals += c[i].finals;
		}
		else
			c[m++] = c[i];
	}
	for (int j = 0; j < 5; j++)
		cols[j] = palloc(Max(m, 1) * sizeof(Datum));
	for (int i = 0; i < m; i++)
	{
		cols[0][i] = Int64GetDatum(c[i].subscription_id);
		cols[1][i] = Int64GetDatum(c[i].matched);
		cols[2][i] = Int64GetDatum(c[i].delivered);
		cols[3][i] = Int64GetDatum(c[i].failed);
		cols[4][i] = Int64GetDatum(c[i].finals);
	}
	for (int j = 0; j < 5; j++)
		args[j] = eg_make_array(cols[j], NULL, m, INT8OID);
}

/* Writes delivery attempts to the attempt history (record_attempts_st). */
static void
record_attempts(const EgAttempt *attempts, int n)
{
	Datum	   *at = palloc(n * sizeof(Datum));
	Datum	   *subs = palloc(n * sizeof(Datum));
	Datum	   *names = palloc(n * sizeof(Datum));
	Datum	   *numbers = palloc(n * sizeof(Datum));
	Datum	   *firsts = palloc(n * sizeof(Datum));
	Datum	   *lasts = palloc(n * sizeof(Datum));
	Datum	   *statuses = palloc(n * sizeof(Datum));
	Datum	   *outcomes = palloc(n * sizeof(Datum));
	Datum	   *durations = palloc(n * sizeof(Datum));
	Datum	   *errors = palloc(n * sizeof(Datum));
	Datum	   *topics = palloc(n * sizeof(Datum));
	Datum	   *bodies = palloc(n * sizeof(Datum));
	bool	   *n_topic = palloc(n * sizeof(bool));
	bool	   *n_body = palloc(n * sizeof(bool));
	bool	   *n_status = palloc(n * sizeof(bool));
	bool	   *n_duration = palloc(n * sizeof(bool));
	bool	   *n_error = palloc(n * sizeof(bool));
	int			nids = 0;
	int64	   *ids;
	Datum	   *sources = NULL;	/* each event's source; NULL when none has one */
	bool	   *n_source = NULL;
	bool		any_source = false;
	Datum		args[14];
	char		argnulls[14];

	for (int i = 0; i < n; i++)
	{
		nids += attempts[i].nevents;
		any_source |= attempts[i].event_sources != NULL;
	}
	ids = palloc(Max(nids, 1) * sizeof(int64));
	if (any_source)
	{
		sources = palloc0(nids * sizeof(Datum));
		n_source = palloc(nids * sizeof(bool));
		memset(n_source, true, nids * sizeof(bool));
	}
	nids = 0;
	for (int i = 0; i < n; i++)
	{
		const EgAttempt *a = &attempts[i];

		at[i] = TimestampTzGetDatum(a->attempted_at);
		subs[i] = Int64GetDatum(a->subscription_id);
		names[i] = CStringGetTextDatum(a->subscription_name);
		numbers[i] = Int32GetDatum(a->attempt);
		firsts[i] = Int32GetDatum(nids + 1);
		memcpy(ids + nids, a->event_ids, a->nevents * sizeof(int64));
		for (int k = 0; a->event_sources != NULL && k < a->nevents; k++)
		{
			n_source[nids + k] = a->event_sources[k] == NULL;
			if (a->event_sources[k] != NULL)
				sources[nids + k] = CStringGetTextDatum(a->event_sources[k]);
		}
		nids += a->nevents;
		lasts[i] = Int32GetDatum(nids);
		n_status[i] = a->http_status == 0;
		statuses[i] = Int32GetDatum(a->http_status);
		outcomes[i] = CStringGetTextDatum(eg_outcome_name(a->outcome));
		n_duration[i] = a->duration_ms < 0;
		durations[i] = Float8GetDatum(a->duration_ms);
		n_error[i] = a->error == NULL;
		errors[i] = a->error ? CStringGetTextDatum(a->error) : (Datum) 0;
		n_topic[i] = a->topic == NULL;
		topics[i] = a->topic ? CStringGetTextDatum(a->topic) : (Datum) 0;
		n_body[i] = a->response_body == NULL;
		bodies[i] = a->response_body ? CStringGetTextDatum(a->response_body) : (Datum) 0;
	}
	args[0] = eg_make_array(at, NULL, n, TIMESTAMPTZOID);
	args[1] = eg_make_array(subs, NULL, n, INT8OID);
	args[2] = eg_make_array(names, NULL, n, TEXTOID);
	args[3] = eg_make_array(numbers, NULL, n, INT4OID);
	args[4] = eg_int8_array(ids, nids);
	args[5] = eg_make_array(firsts, NULL, n, INT4OID);
	args[6] = eg_make_array(lasts, NULL, n, INT4OID);
	args[7] = eg_make_array(statuses, n_status, n, INT4OID);
	args[8] = eg_make_array(outcomes, NULL, n, TEXTOID);
	args[9] = eg_make_array(durations, n_duration, n, FLOAT8OID);
	args[10] = eg_make_array(errors, n_error, n, TEXTOID);
	args[11] = eg_make_array(topics, n_topic, n, TEXTOID);
	args[12] = eg_make_array(bodies, n_body, n, TEXTOID);
	memset(argnulls, ' ', sizeof(argnulls));
	if (sources != NULL)
		args[13] = eg_make_array(sources, n_source, nids, TEXTOID);
	else
	{
		args[13] = (Datum) 0;
		argnulls[13] = 'n';
	}
	eg_store_run_nulls(&record_attempts_st, args, argnulls, SPI_OK_INSERT);
}

/*
 * The keyed first attempts record_first parked (rows tt[0..n): subscription,
 * key hash, retry id, due): park_keys; *earliest moves to the earliest due
 * of them.
 */
static void
park_parked_keys(SPITupleTable *tt, int n, TimestampTz *earliest)
{
	Datum	   *dues = palloc(n * sizeof(Datum));
	Datum		args[4];

	for (int i = 0; i < n; i++)
	{
		TimestampTz due = eg_timestamp_col(tt, i, 4);

		dues[i] = TimestampTzGetDatum(due);
		if (due < *earliest)
			*earliest = due;
	}
	(void) eg_key_arrays(tt, n, 1, 0, args);
	args[3] = eg_make_array(dues, NULL, n, TIMESTAMPTZOID);
	eg_store_run(&park_keys, args, SPI_OK_SELECT);
}

/*
 * Writes outcomes back: for first attempts (whose chunks chunks[0..nchunks)
 * are then complete and forgotten) and for retries, set-based, and the
 * attempts attempts[0..nattempts) to the attempt history.  Locks the
 * subscriptions concerned first (FOR KEY SHARE), the lock order of every
 * writer, so that a subscription dropped meanwhile gets no new rows.
 * Returns the earliest retry time recorded, or DT_NOEND.
 */
TimestampTz
eg_store_record(EgOutcome *const *outcomes, int n, int lease_owner, const int64 *chunks, int nchunks,
				const EgAttempt *attempts, int nattempts)
{
	OutcomeArrays first,
				retry;
	Datum	   *subs = palloc(Max(n, 1) * sizeof(Datum));
	Datum		args[17];
	int			nfirst = 0;
	TimestampTz earliest = DT_NOEND;

	outcome_arrays_init(&first, n);
	outcome_arrays_init(&retry, n);
	for (int i = 0; i < n; i++)
	{
		const EgOutcome *o = outcomes[i];

		subs[i] = Int64GetDatum(o->subscription_id);
		if (o->retry_id != 0)
			outcome_arrays_add(&retry, o);
		else
		{
			nfirst++;
			if (o->action != EG_ACTION_DELIVERED)
				outcome_arrays_add(&first, o);
		}
		if (o->action == EG_ACTION_RETRY && o->next_at < earliest)
			earliest = o->next_at;
	}
	args[0] = eg_make_array(subs, NULL, n, INT8OID);
	eg_store_run(&lock_subscriptions, args, SPI_OK_SELECT);
	eg_store_run(&lock_counters, args, SPI_OK_SELECT);
	eg_store_record_metrics(outcomes, n);

	if (nfirst > 0 || nchunks > 0)
	{
		OutcomeArrays *a = &first;

		args[0] = eg_make_array(a->subs, NULL, a->n, INT8OID);
		args[1] = eg_xid8_array(a->txids, a->n);
		args[2] = eg_make_array(a->event_ids, NULL, a->n, INT8OID);
		outcome_args(a, &args[3], false);
		args[10] = Int32GetDatum(lease_owner);
		args[11] = eg_int8_array(chunks, nchunks);
		first_counts_args(outcomes, n, &args[12]);
		eg_store_run(&record_first, args, SPI_OK_SELECT);
		if (SPI_processed > 0)
			park_parked_keys(SPI_tuptable, (int) SPI_processed, &earliest);
	}
	if (retry.n > 0)
	{
		OutcomeArrays *a = &retry;

		args[0] = eg_make_array(a->ids, NULL, a->n, INT8OID);
		outcome_args(a, &args[1], true);
		eg_store_run(&record_retries, args, SPI_OK_SELECT);
		if (SPI_processed > 0)
		{
			TimestampTz now = eg_now();

			(void) eg_key_arrays(SPI_tuptable, (int) SPI_processed, 1, 0, args);
			args[3] = TimestampTzGetDatum(now);
			eg_store_run(&promote_keys, args, SPI_OK_SELECT);
			if (eg_int32_col(SPI_tuptable, 0, 1, 0) > 0 && now < earliest)
				earliest = now;
		}
	}
	if (nattempts > 0)
		record_attempts(attempts, nattempts);
	return earliest;
}

