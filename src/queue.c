/*
 * queue.c - the delivery queue's SQL and SPI, behind a few functions: open
 * and commit a unit of work, claim first attempts and due retries, note
 * requests in flight, record outcomes, recover after a crash, count
 * unmatched events and empty event tables (SPEC sections 2, 3, 4 and 7).
 * worker.c calls these from its loop and knows nothing of tables or
 * statements.
 *
 * Storage (sql/eventgrid--0.2.0.sql), PgQ's design adapted:
 *  - events are appended to three event tables that take turns; nothing
 *    per delivery is written at publish;
 *  - each event subscription has a position: the snapshot "done" (events
 *    whose transaction is visible in it were claimed) and the batch being
 *    worked through (snapshot "upto", last event claimed).  A claim takes a
 *    new snapshot; the batch is the events whose transaction is visible in
 *    it and not in "done", read in (txid, id) order a chunk at a time, so a
 *    transaction that commits late is still delivered and a rolled-back one
 *    never is;
 *  - a claim first reads narrow rows (which events, whether the filters
 *    take them, their size), cuts them at the byte budget in C, moves the
 *    positions and writes the chunks; then it reads what the chunks
 *    deliver (the events, headers) the way recovery reads a chunk, so the
 *    wide rows are never sorted or windowed, and makes each event's JSON
 *    text once however many subscriptions get it;
 *  - a chunk claimed is a row of eventgrid.chunks_in_flight, and the
 *    position moves past it in the same transaction; before its requests go
 *    to HTTP the chunk's sent mark is committed durably; its outcomes are
 *    recorded as a whole, and only failures become rows of
 *    eventgrid.retries, which are claimed by due time and leased;
 *  - after a crash the chunks left become retries, charged an attempt
 *    (Aborted) up to their sent mark; leased retries named in
 *    eventgrid.requests_in_flight are charged, the others only released;
 *  - an event table is emptied with TRUNCATE once no position, chunk or
 *    unmatched count needs its events, under a lock taken only if free.
 *
 * Every statement is prepared when first used and kept; a unit of work is
 * one transaction.  The extension's presence and version are checked at the
 * start of each unit: a library and schema of different versions would run
 * statements against tables they were not written for.
 */
#include "eventgrid.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "commands/dbcommands.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

/* The worker's statements, prepared when first used. */
typedef enum EgPlanId
{
	PLAN_CLAIM_FIRST,
	PLAN_CLAIM_LOAD,
	PLAN_DROP_CHUNKS,
	PLAN_ADVANCE,
	PLAN_CLAIM_RETRIES,
	PLAN_NEXT_DUE,
	PLAN_LOCK_SUBSCRIPTIONS,
	PLAN_NO_SYNC,
	PLAN_RECORD_FIRST,
	PLAN_RECORD_RETRIES,
	PLAN_RECORD_ATTEMPTS,
	PLAN_WAVES_DONE,
	PLAN_IN_FLIGHT,
	PLAN_SENT_MARKS,
	PLAN_RECOVER_CHUNKS,
	PLAN_RELEASE,
	PLAN_STALE,
	PLAN_RECOVERY_LOCK,
	PLAN_FOREIGN,
	PLAN_REBASE_PENDING,
	PLAN_REBASE_POSITIONS,
	PLAN_UNMATCHED,
	PLAN_HOLDERS,
	PLAN_POSITIONS,
	PLAN_TABLE_USED,
	PLAN_TRUNCATED,
	PLAN_TRUNCATE_FAILED,
	PLAN_HISTORY_STATE,
	PLAN_HISTORY_ROTATED,
	PLAN_HISTORY_ROTATE_FAILED,
	PLAN_BACKLOG_RETRIES,
	PLAN_BACKLOG_POSITIONS,
	PLAN_BACKLOG_EVENTS,
	PLAN_FINALS,
	PLAN_HEALTH_LOAD,
	PLAN_HEALTH_SAVE,
	PLAN_HEALTH_FORGET,
	PLAN_COUNT
} EgPlanId;

typedef struct EgPlanDef
{
	const char *sql;
	int			nargs;
	Oid			types[17];

	/*
	 * Always the generic plan: the plan cache otherwise planned these afresh
	 * at every call (their custom plans, sized by the arrays, looked
	 * cheaper), which cost about 0.7 ms per record of 1,000 deliveries.
	 */
	bool		generic;
} EgPlanDef;

/*
 * Is an event of transaction txid in the snapshot batch (since, upto]:
 * visible in upto and not in since (PgQ's rule)?  Written out in each
 * statement: a SQL function with this body (0.5.0's eventgrid._in_batch(),
 * STRICT around an AND) cannot be inlined by the planner, and calling it
 * cost about 1 us per event.  Callers pass columns that are never NULL.
 */
#define IN_BATCH(txid, since, upto) \
	"(pg_visible_in_snapshot(" txid ", " upto ") AND NOT pg_visible_in_snapshot(" txid ", " since "))"

/*
 * The events of a chunk c (joined before with its subscription s), as the
 * claim took them: those of its key range in its batch that the filters
 * take.  The first-attempt claim's second step and recovery both read a
 * chunk through this.  OFFSET 0 keeps it a scan of each chunk's own index
 * range (a nested loop under the chunk), whatever the planner believes
 * about the tables' sizes.
 *
 * The range is read in two index scans: the transactions before the
 * chunk's last one, and then the last one up to its last event.  A single
 * scan bounded above by the row comparison (txid, id) <= (last_txid,
 * last_id) does not stop at that bound when the transaction goes on:
 * PostgreSQL 15's btree ends a scan on a row comparison only where its
 * first column (txid) passes the bound, so each chunk of a transaction
 * that published 100,000 events read on to that transaction's last event.
 */
#define CHUNK_EVENTS_WHERE(range) \
	"   WHERE e.topic = c.topic AND e.txid >= pg_snapshot_xmin(c.done) AND " range \
	"     AND (e.txid, e.id) > (coalesce(c.after_txid, '0'::xid8), coalesce(c.after_id, 0))" \
	"     AND " IN_BATCH("e.txid", "c.done", "c.upto") \
	"     AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with," \
	"                            s.subject_ends_with, s.is_subject_case_sensitive," \
	"                            s.advanced_filters, s.enable_advanced_filtering_on_arrays)"
#define CHUNK_EVENTS \
	" CROSS JOIN LATERAL (" \
	"   (SELECT e.* FROM eventgrid.events e" CHUNK_EVENTS_WHERE("e.txid < c.last_txid") ")" \
	"   UNION ALL" \
	"   (SELECT e.* FROM eventgrid.events e" CHUNK_EVENTS_WHERE("e.txid = c.last_txid AND e.id <= c.last_id") ")" \
	"   OFFSET 0) e"

/* An event e converted to subscription s's delivery schema (topic t), as JSON text. */
#define PAYLOAD_TEXT \
	"(CASE WHEN t.input_schema = s.event_delivery_schema THEN e.event" \
	"      ELSE eventgrid.convert_event(e.event, t.input_schema, s.event_delivery_schema, e.publish_time) END)::text"

/*
 * The same in two parts, exactly one of them not NULL: the converted text
 * when the schemas differ, the event itself (jsonb) when they match, which
 * the caller turns into text once per event (json_texts()).
 */
#define PAYLOAD_CONVERTED \
	"(CASE WHEN t.input_schema = s.event_delivery_schema THEN NULL" \
	"      ELSE eventgrid.convert_event(e.event, t.input_schema, s.event_delivery_schema, e.publish_time)::text END)"
#define PAYLOAD_JSONB "(CASE WHEN t.input_schema = s.event_delivery_schema THEN e.event END)"

/* Custom headers of subscription s for event e: static ones from props pr, dynamic ones per event. */
#define CUSTOM_HEADERS(ev) \
	"nullif(concat_ws(E'\\n', pr.static_headers, CASE WHEN pr.has_dynamic THEN" \
	"  (SELECT string_agg(p.header || ': ' || v.value, E'\\n')" \
	"     FROM eventgrid.delivery_properties p" \
	"     CROSS JOIN LATERAL (SELECT CASE" \
	"          WHEN jsonb_typeof(" ev " #> string_to_array(p.source_field, '.')) IN ('string', 'number', 'boolean')" \
	"          THEN " ev " #>> string_to_array(p.source_field, '.') END AS value) v" \
	"    WHERE p.subscription_id = s.id AND p.source_field IS NOT NULL AND v.value IS NOT NULL" \
	"      AND v.value !~ '[\\x01-\\x1f\\x7f]' AND octet_length(v.value) <= 4096) END), '')"

/*
 * Static custom headers once per subscription among those in sub_ids.
 * MATERIALIZED: computed once per statement; inlined, the planner rescans
 * the aggregate and its index once per claimed row.
 */
#define PROPS(sub_ids) \
	"props AS MATERIALIZED (" \
	"  SELECT p.subscription_id," \
	"         string_agg(p.header || ': ' || p.value, E'\\n') FILTER (WHERE p.source_field IS NULL) AS static_headers," \
	"         bool_or(p.source_field IS NOT NULL) AS has_dynamic" \
	"    FROM eventgrid.delivery_properties p" \
	"   WHERE p.subscription_id = ANY (" sub_ids ")" \
	"   GROUP BY p.subscription_id" \
	")"

/*
 * Attempt history rows for deliveries a crash interrupted after they were
 * handed to HTTP (outcome Aborted, at time parameter at), from a CTE rows
 * with subscription_id, event_id and attempts (0: not charged, no row);
 * only when the boolean parameter keep is true.
 */
#define ABORTED_HISTORY(rows, at, keep) \
	"  INSERT INTO eventgrid.attempt_log (history_table, attempted_at, topic, subscription_id," \
	"         subscription_name, event_ids, attempt, outcome, error)" \
	"  SELECT h.history_table, " at ", s.topic, s.id, s.name, ARRAY[m.event_id], m.attempts, 'Aborted'," \
	"         'the delivery worker stopped before the outcome of this request was recorded'" \
	"    FROM " rows " m JOIN eventgrid.event_subscriptions s ON s.id = m.subscription_id" \
	"   CROSS JOIN eventgrid.attempt_log_rotation h" \
	"   WHERE " keep " AND m.attempts > 0"

/*
 * Owners of leases: a delivery worker's lease_owner is its pid.  An owner
 * is stale when no delivery worker with that pid runs (pg_stat_activity,
 * read when the statement first needs it, after its snapshot was taken: a
 * worker whose claims the statement sees had started before), or when it
 * is $1, the pid of a delivery worker that is just starting and holds
 * nothing yet ($1 = 0 names no one).  What a stale owner left is taken back.
 */
#define LIVE_WORKERS \
	"ARRAY(SELECT a.pid FROM pg_catalog.pg_stat_get_activity(NULL::int4) a" \
	"       WHERE a.backend_type = 'eventgrid delivery worker')"
#define STALE_OWNER(col) "(" col " = $1 OR " col " <> ALL (" LIVE_WORKERS "))"

static const EgPlanDef plan_defs[PLAN_COUNT] = {
	/*
	 * First attempts, step one: what to take.  For each position (locked;
	 * one worker at a time), the next events of its batch in (txid, id)
	 * order: those of transactions that were in progress at "done", and
	 * those that began after it, both visible in "upto" (a new snapshot when
	 * no batch is open).  At most $1 per subscription, each with whether the
	 * subscription's filters take it and its size; a position with nothing
	 * left in its batch gives one row with no event.  Rows are narrow and
	 * unordered: the caller orders them, cuts them at the byte budget and
	 * moves the positions (PLAN_ADVANCE); PLAN_CLAIM_LOAD then reads what
	 * is to be sent.  done and upto come as text, once per position.
	 */
	[PLAN_CLAIM_FIRST] = {
		"WITH snap AS MATERIALIZED ("
		"  SELECT pg_current_snapshot() AS s, eventgrid._system_identifier() AS sysid"
		"), pos AS MATERIALIZED ("
		"  SELECT p.subscription_id, p.done, coalesce(p.upto, snap.s) AS upto,"
		"         p.done::text AS done_text, coalesce(p.upto, snap.s)::text AS upto_text,"
		"         coalesce(p.after_txid, '0'::xid8) AS after_txid, coalesce(p.after_id, 0) AS after_id,"
		"         ARRAY(SELECT pg_snapshot_xip(p.done)) AS done_xip, p.upto IS NULL AS fresh,"
		"         coalesce(p.served_at, '-infinity') AS turn"
		"    FROM eventgrid.subscription_positions p CROSS JOIN snap"
		"   WHERE p.system_identifier = snap.sysid AND p.subscription_id <> ALL ($2)"
		"   ORDER BY p.subscription_id"
		"   FOR UPDATE OF p SKIP LOCKED"
		")"
		" SELECT pos.subscription_id, pos.turn, e.txid, e.id,"
		"        e.id IS NOT NULL AND eventgrid._matches(e.event, s.included_event_types_lower,"
		"            s.subject_begins_with, s.subject_ends_with, s.is_subject_case_sensitive,"
		"            s.advanced_filters, s.enable_advanced_filtering_on_arrays) AS matched,"
		"        coalesce(e.event_bytes, 0), pos.done_text, pos.upto_text, s.topic, pos.fresh,"
		"        pos.after_txid, pos.after_id"
		"   FROM pos JOIN eventgrid.event_subscriptions s ON s.id = pos.subscription_id"
		"   LEFT JOIN LATERAL ("
		"     SELECT u.* FROM ("
		"       (SELECT e.txid, e.id, e.event, e.event_bytes FROM eventgrid.events e"
		"         WHERE cardinality(pos.done_xip) > 0"
		"           AND e.topic = s.topic AND e.txid = ANY (pos.done_xip)"
		"           AND e.txid >= pg_snapshot_xmin(pos.done) AND e.txid < pg_snapshot_xmax(pos.done)"
		"           AND (e.txid, e.id) > (pos.after_txid, pos.after_id)"
		"           AND pg_visible_in_snapshot(e.txid, pos.upto)"
		"         ORDER BY e.txid, e.id LIMIT $1)"
		"       UNION ALL"
		"       (SELECT e.txid, e.id, e.event, e.event_bytes FROM eventgrid.events e"
		"         WHERE e.topic = s.topic"
		"           AND (e.txid, e.id) > (pos.after_txid, pos.after_id)"
		"           AND e.txid >= pg_snapshot_xmax(pos.done) AND e.txid < pg_snapshot_xmax(pos.upto)"
		"           AND pg_visible_in_snapshot(e.txid, pos.upto)"
		"         ORDER BY e.txid, e.id LIMIT $1)"
		"     ) u ORDER BY u.txid, u.id LIMIT $1"
		"   ) e ON true",
		2, {INT4OID, INT8ARRAYOID}
	},

	/*
	 * First attempts, step two: the deliveries of the chunks $1 just written
	 * by lease owner $2, read the way recovery reads a chunk (the events of
	 * its range in its batch that its subscription's filters take), with
	 * what their requests need; expired by the clock $3.  Unordered: the
	 * caller orders them by chunk and (txid, id), so that the wide rows with
	 * their events are not sorted here.  An event that goes in its topic's
	 * own schema comes as jsonb, and the caller makes its JSON text once
	 * for all the subscriptions that get it.
	 */
	[PLAN_CLAIM_LOAD] = {
		"WITH c AS MATERIALIZED ("
		"  SELECT c.* FROM eventgrid.chunks_in_flight c WHERE c.lease_owner = $2 AND c.chunk = ANY ($1)"
		"), " PROPS("ARRAY(SELECT c.subscription_id FROM c)")
		" SELECT c.chunk, s.id, e.txid, e.id, s.max_delivery_attempts,"
		"       (e.publish_time + make_interval(mins => s.event_ttl) <= $3) AS expired,"
		"       s.endpoint, s.name, s.event_delivery_schema,"
		"       s.max_events_per_batch, s.preferred_batch_size_in_kilobytes,"
		"       " PAYLOAD_CONVERTED ","
		"       coalesce(e.event->>'id', e.id::text),"
		"       coalesce(e.event->>'dataVersion', ''),"
		"       CASE WHEN s.event_delivery_schema = 'CloudEventSchemaV1_0' THEN '1.0' ELSE '1' END,"
		"       " CUSTOM_HEADERS("e.event") ","
		"       coalesce(e.event_bytes, 0), s.topic_type = 'namespace', s.topic, " PAYLOAD_JSONB
		"  FROM c JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id"
		"  JOIN eventgrid.topics t ON t.name = s.topic"
		CHUNK_EVENTS
		"  LEFT JOIN props pr ON pr.subscription_id = s.id",
		3, {INT8ARRAYOID, INT4OID, TIMESTAMPTZOID}
	},

	/*
	 * A chunk whose events the filters no longer take (the subscription was
	 * changed between the two steps of a claim) has nothing to send.
	 */
	[PLAN_DROP_CHUNKS] = {
		"DELETE FROM eventgrid.chunks_in_flight WHERE lease_owner = $2 AND chunk = ANY ($1)",
		2, {INT8ARRAYOID, INT4OID}
	},

	/*
	 * Moves positions past what a claim took, and writes its chunks.  Per
	 * subscription: complete (the batch is done: "done" becomes "upto"), or
	 * the batch "upto" with the last event taken; and a chunk when events
	 * were taken for delivery.
	 */
	[PLAN_ADVANCE] = {
		"WITH a AS ("
		"  SELECT * FROM unnest($1::int8[], $2::bool[], $3::text[], $4::xid8[], $5::int8[], $6::int8[],"
		"                       $7::text[], $8::text[], $11::xid8[], $12::int8[])"
		"         AS a(subscription_id, complete, upto, last_txid, last_id, chunk, topic, done,"
		"              old_after_txid, old_after_id)"
		"), moved AS ("
		"  UPDATE eventgrid.subscription_positions p"
		"     SET done = CASE WHEN a.complete THEN a.upto::pg_snapshot ELSE p.done END,"
		"         upto = CASE WHEN a.complete THEN NULL ELSE a.upto::pg_snapshot END,"
		"         after_txid = CASE WHEN a.complete THEN NULL ELSE a.last_txid END,"
		"         after_id = CASE WHEN a.complete THEN NULL ELSE a.last_id END,"
		"         served_at = $9"
		"    FROM a WHERE p.subscription_id = a.subscription_id"
		"  RETURNING p.subscription_id"
		")"
		"INSERT INTO eventgrid.chunks_in_flight (lease_owner, chunk, subscription_id, topic, done, upto,"
		"       after_txid, after_id, last_txid, last_id)"
		"SELECT $10, a.chunk, a.subscription_id, a.topic, a.done::pg_snapshot, a.upto::pg_snapshot,"
		"       nullif(a.old_after_txid, '0'::xid8), nullif(a.old_after_id, 0), a.last_txid, a.last_id"
		"  FROM a WHERE a.chunk IS NOT NULL",
		12, {INT8ARRAYOID, BOOLARRAYOID, TEXTARRAYOID, XID8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID,
		TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZOID, INT4OID, XID8ARRAYOID, INT8ARRAYOID},
		true
	},

	/*
	 * Due retries, within the byte budget, leased to $3.  A retry leased by
	 * a running delivery worker is not taken; one leased by a worker that no
	 * longer runs is, once its lease ($4 ms) ran out.  Custom headers are
	 * looked up once per subscription (props), and per row only for the
	 * subscriptions whose headers take values from the event.
	 */
	[PLAN_CLAIM_RETRIES] = {
		"WITH due AS ("
		"  SELECT r.ctid AS tid, r.next_attempt_at, r.id, r.event_bytes FROM eventgrid.retries r"
		"   WHERE r.next_attempt_at <= $1 AND (r.lease_owner IS NULL OR r.lease_owner <> ALL (" LIVE_WORKERS "))"
		"   ORDER BY r.next_attempt_at"
		"   LIMIT $2"
		"   FOR UPDATE SKIP LOCKED"
		"), sized AS ("
		"  SELECT due.tid, sum(due.event_bytes) OVER w - due.event_bytes AS before"
		"    FROM due WINDOW w AS (ORDER BY due.next_attempt_at, due.id ROWS UNBOUNDED PRECEDING)"
		"), claimed AS ("
		"  UPDATE eventgrid.retries r"
		"     SET next_attempt_at = $1 + $4 * interval '1 millisecond', lease_owner = $3"
		"   WHERE r.ctid = ANY (ARRAY(SELECT tid FROM sized WHERE before < $5))"
		"  RETURNING r.*"
		"), " PROPS("ARRAY(SELECT DISTINCT c.subscription_id FROM claimed c)")
		" SELECT c.id, s.id, c.attempts, s.max_delivery_attempts,"
		"       (s.id IS NOT NULL AND c.publish_time + make_interval(mins => s.event_ttl) <= $1) AS expired,"
		"       s.endpoint, s.name, s.event_delivery_schema,"
		"       s.max_events_per_batch, s.preferred_batch_size_in_kilobytes,"
		"       c.payload,"
		"       coalesce(c.event->>'id', c.event_id::text),"
		"       coalesce(c.event->>'dataVersion', ''),"
		"       CASE WHEN s.event_delivery_schema = 'CloudEventSchemaV1_0' THEN '1.0' ELSE '1' END,"
		"       " CUSTOM_HEADERS("c.event") ","
		"       c.last_outcome, c.last_http_status, c.last_attempt_at, c.event_bytes,"
		"       s.topic_type = 'namespace', c.event_id, s.topic"
		"  FROM claimed c"
		"  LEFT JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id"
		"  LEFT JOIN props pr ON pr.subscription_id = s.id"
		" ORDER BY s.id NULLS FIRST, c.next_attempt_at, c.id",
		5, {TIMESTAMPTZOID, INT4OID, INT4OID, INT8OID, INT8OID}
	},
	[PLAN_NEXT_DUE] = {
		"SELECT min(next_attempt_at) FROM eventgrid.retries"
		" WHERE lease_owner IS NULL OR lease_owner <> ALL (" LIVE_WORKERS ")",
		0, {0}
	},
	/* lock order of every writer: subscriptions first (drop_event_subscription does the same) */
	[PLAN_LOCK_SUBSCRIPTIONS] = {
		"SELECT s.id FROM eventgrid.event_subscriptions s WHERE s.id = ANY ($1) ORDER BY s.id FOR KEY SHARE",
		1, {INT8ARRAYOID}
	},
	[PLAN_NO_SYNC] = {"SET LOCAL synchronous_commit = off", 0, {0}},

	/*
	 * Outcomes of whole chunks of first attempts: failures ($1-$10, the
	 * outcomes other than delivered) become retries (with a copy of the
	 * event and its delivered text) or dead letters, counters move by what
	 * the caller counted per subscription ($13-$17), and the chunks are
	 * forgotten.  Only failures touch the event tables; delivered events
	 * are not sent here one by one.
	 */
	[PLAN_RECORD_FIRST] = {
		"WITH r AS ("
		"  SELECT * FROM unnest($1::int8[], $2::xid8[], $3::int8[], $4::text[], $5::text[], $6::int4[],"
		"                       $7::timestamptz[], $8::timestamptz[], $9::text[], $10::int4[])"
		"         AS r(subscription_id, txid, id, action, outcome, status, attempted_at, next_at, reason,"
		"              attempts)"
		"), st AS ("
		"  SELECT * FROM unnest($13::int8[], $14::int8[], $15::int8[], $16::int8[], $17::int8[])"
		"         AS st(subscription_id, matched, delivered, failed, finals)"
		"), subs AS ("
		"  SELECT s.*, t.input_schema FROM eventgrid.event_subscriptions s JOIN eventgrid.topics t ON t.name = s.topic"
		"   WHERE s.id = ANY ($13)"
		"), failed AS ("
		"  SELECT r.*, s.topic, s.name, s.deadletter, s.event_delivery_schema, s.input_schema, s.topic_type,"
		"         e.event, e.publish_time, e.event_bytes, " PAYLOAD_TEXT " AS payload"
		"    FROM r JOIN subs s ON s.id = r.subscription_id"
		"    JOIN eventgrid.topics t ON t.name = s.topic"
		"    JOIN eventgrid.events e ON e.topic = s.topic AND e.txid = r.txid AND e.id = r.id"
		"), retried AS ("
		"  INSERT INTO eventgrid.retries (subscription_id, event_id, event, payload, publish_time, event_bytes,"
		"         attempts, next_attempt_at, last_attempt_at, last_outcome, last_http_status)"
		"  SELECT f.subscription_id, f.id, f.event, f.payload, f.publish_time, coalesce(f.event_bytes, 0),"
		"         f.attempts, f.next_at, f.attempted_at, f.outcome, f.status"
		"    FROM failed f WHERE f.action = 'r'"
		"), dead AS ("
		"  INSERT INTO eventgrid.dead_letters (topic, subscription_name, subscription_id, input_schema,"
		"         event_delivery_schema, event, dead_letter_reason, delivery_attempts, last_delivery_outcome,"
		"         last_http_status_code, publish_time, last_delivery_attempt_time, topic_type, event_id)"
		"  SELECT f.topic, f.name, f.subscription_id, f.input_schema, f.event_delivery_schema, f.event,"
		"         f.reason, f.attempts, f.outcome, f.status, f.publish_time, f.attempted_at, f.topic_type, f.id"
		"    FROM failed f WHERE f.action = 'f' AND f.deadletter"
		"), counted AS ("
		"  UPDATE eventgrid.subscription_counters c"
		"     SET matched = c.matched + st.matched,"
		"         delivered = c.delivered + st.delivered, failed_attempts = c.failed_attempts + st.failed,"
		"         dead_lettered = c.dead_lettered + CASE WHEN s.deadletter THEN st.finals ELSE 0 END,"
		"         dropped = c.dropped + CASE WHEN s.deadletter THEN 0 ELSE st.finals END"
		"    FROM st JOIN subs s ON s.id = st.subscription_id"
		"   WHERE c.subscription_id = st.subscription_id"
		")"
		"DELETE FROM eventgrid.chunks_in_flight c WHERE c.lease_owner = $11 AND c.chunk = ANY ($12)",
		17, {INT8ARRAYOID, XID8ARRAYOID, INT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID, INT4ARRAYOID,
			TIMESTAMPTZARRAYOID, TIMESTAMPTZARRAYOID, TEXTARRAYOID, INT4ARRAYOID,
			INT4OID, INT8ARRAYOID,
		INT8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID, INT8ARRAYOID},
		true
	},

	/*
	 * Outcomes of retries: the next attempt is scheduled, or the row is
	 * deleted and dead-lettered or counted.  r.id = ANY ($1) lets the
	 * primary key drive the join with the outcome arrays.
	 */
	[PLAN_RECORD_RETRIES] = {
		"WITH o AS ("
		"  SELECT * FROM unnest($1::int8[], $2::text[], $3::text[], $4::int4[], $5::timestamptz[],"
		"                       $6::timestamptz[], $7::text[], $8::int4[], $9::bool[])"
		"         AS o(id, action, outcome, status, attempted_at, next_at, reason, attempts, attempted)"
		"), retried AS ("
		"  UPDATE eventgrid.retries r"
		"     SET attempts = o.attempts, next_attempt_at = o.next_at, last_attempt_at = o.attempted_at,"
		"         last_outcome = o.outcome, last_http_status = o.status, lease_owner = NULL"
		"    FROM o WHERE r.id = ANY ($1) AND r.id = o.id AND o.action = 'r'"
		"  RETURNING r.subscription_id, o.attempted"
		"), finished AS ("
		"  DELETE FROM eventgrid.retries r USING o"
		"   WHERE r.id = ANY ($1) AND r.id = o.id AND o.action <> 'r'"
		"  RETURNING r.subscription_id, r.event_id, r.event, r.publish_time, o.action, o.reason, o.attempts,"
		"            o.outcome, o.status, o.attempted_at, o.attempted"
		"), fin AS ("
		"  SELECT f.*, coalesce(s.deadletter, false) AS deadletter, s.topic, s.name, s.event_delivery_schema,"
		"         t.input_schema, s.topic_type"
		"    FROM finished f JOIN eventgrid.event_subscriptions s ON s.id = f.subscription_id"
		"    JOIN eventgrid.topics t ON t.name = s.topic"
		"), dead AS ("
		"  INSERT INTO eventgrid.dead_letters (topic, subscription_name, subscription_id, input_schema,"
		"         event_delivery_schema, event, dead_letter_reason, delivery_attempts, last_delivery_outcome,"
		"         last_http_status_code, publish_time, last_delivery_attempt_time, topic_type, event_id)"
		"  SELECT f.topic, f.name, f.subscription_id, f.input_schema, f.event_delivery_schema, f.event,"
		"         f.reason, f.attempts, f.outcome, f.status, f.publish_time, f.attempted_at, f.topic_type, f.event_id"
		"    FROM fin f WHERE f.action = 'f' AND f.deadletter"
		"), stats AS ("
		"  SELECT x.subscription_id, sum(x.delivered) AS delivered, sum(x.failed) AS failed,"
		"         sum(x.dead) AS dead, sum(x.dropped) AS dropped"
		"    FROM (SELECT subscription_id, 0 AS delivered, attempted::int AS failed, 0 AS dead, 0 AS dropped FROM retried"
		"          UNION ALL"
		"          SELECT subscription_id, (action = 'd')::int, (action = 'f' AND attempted)::int,"
		"                 (action = 'f' AND deadletter)::int, (action = 'f' AND NOT deadletter)::int"
		"            FROM fin) x"
		"   GROUP BY x.subscription_id"
		")"
		"UPDATE eventgrid.subscription_counters c"
		"   SET delivered = c.delivered + stats.delivered, failed_attempts = c.failed_attempts + stats.failed,"
		"       dead_lettered = c.dead_lettered + stats.dead, dropped = c.dropped + stats.dropped"
		"  FROM stats WHERE c.subscription_id = stats.subscription_id",
		9, {INT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID, INT4ARRAYOID, TIMESTAMPTZARRAYOID,
		TIMESTAMPTZARRAYOID, TEXTARRAYOID, INT4ARRAYOID, BOOLARRAYOID}
	},

	/*
	 * Delivery attempts, one row each, into the history table that takes
	 * rows now; $5 holds the event ids of all of them, attempt k's from
	 * $6[k] to $7[k].  The topic comes with each attempt ($12): a join with
	 * the subscriptions here became, in the generic plan, an index probe
	 * per attempt.
	 */
	[PLAN_RECORD_ATTEMPTS] = {
		"INSERT INTO eventgrid.attempt_log (history_table, attempted_at, topic, subscription_id,"
		"       subscription_name, event_ids, attempt, http_status, outcome, duration_ms, error)"
		"SELECT h.history_table, a.attempted_at, a.topic, a.subscription_id, a.subscription_name,"
		"       $5[a.first:a.last], a.attempt, a.status, a.outcome, a.duration_ms, a.error"
		"  FROM eventgrid.attempt_log_rotation h"
		" CROSS JOIN unnest($1::timestamptz[], $2::int8[], $3::text[], $4::int4[], $6::int4[], $7::int4[],"
		"                   $8::int4[], $9::text[], $10::float8[], $11::text[], $12::text[])"
		"       AS a(attempted_at, subscription_id, subscription_name, attempt, first, last, status, outcome,"
		"            duration_ms, error, topic)",
		12, {TIMESTAMPTZARRAYOID, INT8ARRAYOID, TEXTARRAYOID, INT4ARRAYOID, INT8ARRAYOID, INT4ARRAYOID,
		INT4ARRAYOID, INT4ARRAYOID, TEXTARRAYOID, FLOAT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID}
	},
	[PLAN_WAVES_DONE] = {
		"DELETE FROM eventgrid.requests_in_flight WHERE lease_owner = $1 AND wave = ANY ($2)",
		2, {INT4OID, INT8ARRAYOID}
	},
	[PLAN_IN_FLIGHT] = {
		"INSERT INTO eventgrid.requests_in_flight (lease_owner, wave, retry_ids) VALUES ($1, $2, $3)",
		3, {INT4OID, INT8OID, INT8ARRAYOID}
	},
	[PLAN_SENT_MARKS] = {
		"UPDATE eventgrid.chunks_in_flight c SET sent_txid = m.txid, sent_id = m.id"
		"  FROM unnest($2::int8[], $3::xid8[], $4::int8[]) AS m(chunk, txid, id)"
		" WHERE c.lease_owner = $1 AND c.chunk = m.chunk",
		4, {INT4OID, INT8ARRAYOID, XID8ARRAYOID, INT8ARRAYOID}
	},

	/*
	 * After a crash: the events of chunks left in flight become retries due
	 * at $2, charged an attempt (Aborted) up to the chunk's sent mark.  The
	 * chunks taken are those of stale owners (STALE_OWNER).
	 */
	[PLAN_RECOVER_CHUNKS] = {
		"WITH c AS ("
		"  DELETE FROM eventgrid.chunks_in_flight c WHERE " STALE_OWNER("c.lease_owner") " RETURNING c.*"
		"), made AS ("
		"  INSERT INTO eventgrid.retries (subscription_id, event_id, event, payload, publish_time, event_bytes,"
		"         attempts, next_attempt_at, last_attempt_at, last_outcome)"
		"  SELECT s.id, e.id, e.event, " PAYLOAD_TEXT ", e.publish_time, coalesce(e.event_bytes, 0),"
		"         x.sent::int, $2, CASE WHEN x.sent THEN $2 END, CASE WHEN x.sent THEN 'Aborted' END"
		"    FROM c JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id"
		"    JOIN eventgrid.topics t ON t.name = s.topic"
		CHUNK_EVENTS
		"   CROSS JOIN LATERAL (SELECT coalesce((e.txid, e.id) <= (c.sent_txid, c.sent_id), false) AS sent) x"
		"  RETURNING subscription_id, event_id, attempts"
		"), counted AS ("
		"  UPDATE eventgrid.subscription_counters sc SET matched = sc.matched + m.n"
		"    FROM (SELECT subscription_id, count(*) AS n FROM made GROUP BY subscription_id) m"
		"   WHERE sc.subscription_id = m.subscription_id"
		"), history AS ("
		ABORTED_HISTORY("made", "$2", "$3")
		")"
		"SELECT attempts FROM made",
		3, {INT4OID, TIMESTAMPTZOID, BOOLOID}
	},

	/*
	 * After a crash: retries leased by stale owners are released, due at $2
	 * at the latest; those an in-flight record of a stale owner names went
	 * to HTTP and are charged an attempt (Aborted), the others not.  With
	 * $4 every such lease is released (a scan of the retries, at a delivery
	 * worker's start); without, only those named in flight.  The owner is
	 * tested on r itself, so that a concurrent recovery's release is seen
	 * (EvalPlanQual) and nothing is charged twice.
	 */
	[PLAN_RELEASE] = {
		"WITH sent AS ("
		"  SELECT DISTINCT unnest(f.retry_ids) AS id FROM eventgrid.requests_in_flight f"
		"   WHERE " STALE_OWNER("f.lease_owner")
		"), forgot AS ("
		"  DELETE FROM eventgrid.requests_in_flight f WHERE " STALE_OWNER("f.lease_owner")
		"), taken AS ("
		"  SELECT sent.id, true AS sent FROM sent"
		"  UNION ALL"
		"  SELECT r0.id, false FROM eventgrid.retries r0"
		"   WHERE $4 AND r0.lease_owner IS NOT NULL AND r0.id NOT IN (SELECT id FROM sent)"
		"), released AS ("
		"  UPDATE eventgrid.retries r"
		"     SET next_attempt_at = least(r.next_attempt_at, $2), lease_owner = NULL,"
		"         attempts = CASE WHEN t.sent THEN least(r.attempts + 1, 30) ELSE r.attempts END,"
		"         last_outcome = CASE WHEN t.sent THEN 'Aborted' ELSE r.last_outcome END,"
		"         last_http_status = CASE WHEN t.sent THEN NULL ELSE r.last_http_status END,"
		"         last_attempt_at = CASE WHEN t.sent THEN $2 ELSE r.last_attempt_at END"
		"    FROM taken t"
		"   WHERE r.id = t.id AND r.lease_owner IS NOT NULL AND " STALE_OWNER("r.lease_owner")
		"  RETURNING r.subscription_id, r.event_id, r.attempts, t.sent"
		"), history AS ("
		ABORTED_HISTORY("(SELECT * FROM released WHERE sent)", "$2", "$3")
		")"
		"SELECT count(*), count(*) FILTER (WHERE sent) FROM released",
		4, {INT4OID, TIMESTAMPTZOID, BOOLOID, BOOLOID}
	},
	/* whether any chunk or in-flight record belongs to a stale owner */
	[PLAN_STALE] = {
		"SELECT EXISTS (SELECT 1 FROM eventgrid.chunks_in_flight c WHERE " STALE_OWNER("c.lease_owner") ")"
		"    OR EXISTS (SELECT 1 FROM eventgrid.requests_in_flight f WHERE " STALE_OWNER("f.lease_owner") ")",
		1, {INT4OID}
	},
	/* recoveries take turns (the lock conflicts with itself, not with claims or records) */
	[PLAN_RECOVERY_LOCK] = {
		"LOCK TABLE eventgrid.chunks_in_flight IN SHARE UPDATE EXCLUSIVE MODE",
		0, {0}
	},

	/* positions whose snapshots belong to another cluster (a restored dump) */
	[PLAN_FOREIGN] = {
		"SELECT EXISTS (SELECT 1 FROM eventgrid.subscription_positions p"
		"                WHERE p.system_identifier <> eventgrid._system_identifier())"
		"    OR EXISTS (SELECT 1 FROM eventgrid.topic_positions p"
		"                WHERE p.system_identifier <> eventgrid._system_identifier())",
		0, {0}
	},
	/* what such positions had not passed becomes retries, due at $1 */
	[PLAN_REBASE_PENDING] = {
		"INSERT INTO eventgrid.retries (subscription_id, event_id, event, payload, publish_time, event_bytes,"
		"       attempts, next_attempt_at)"
		"SELECT s.id, e.id, e.event, " PAYLOAD_TEXT ", e.publish_time, coalesce(e.event_bytes, 0), 0, $1"
		"  FROM eventgrid.subscription_positions p"
		"  JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id"
		"  JOIN eventgrid.topics t ON t.name = s.topic"
		"  JOIN eventgrid.events e ON e.topic = s.topic"
		" WHERE p.system_identifier <> eventgrid._system_identifier()"
		"   AND NOT pg_visible_in_snapshot(e.txid, p.done)"
		"   AND NOT (p.upto IS NOT NULL AND pg_visible_in_snapshot(e.txid, p.upto)"
		"            AND (e.txid, e.id) <= (coalesce(p.after_txid, '0'::xid8), coalesce(p.after_id, 0)))"
		"   AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with,"
		"                          s.subject_ends_with, s.is_subject_case_sensitive,"
		"                          s.advanced_filters, s.enable_advanced_filtering_on_arrays)",
		1, {TIMESTAMPTZOID}
	},
	/* ... and every position starts afresh from now, on emptied event tables */
	[PLAN_REBASE_POSITIONS] = {
		"WITH sub AS ("
		"  UPDATE eventgrid.subscription_positions"
		"     SET since = pg_current_snapshot(), done = pg_current_snapshot(), upto = NULL, after_txid = NULL,"
		"         after_id = NULL, system_identifier = eventgrid._system_identifier()"
		")"
		"UPDATE eventgrid.topic_positions"
		"   SET done = pg_current_snapshot(), system_identifier = eventgrid._system_identifier()",
		0, {0}
	},

	/*
	 * Published and unmatched events: per topic, the events visible in a new
	 * snapshot and not in its position's are counted, and of them those that
	 * no event subscription takes (a filter, or a subscription created after
	 * the event); the position moves on.
	 */
	[PLAN_UNMATCHED] = {
		"WITH snap AS MATERIALIZED (SELECT pg_current_snapshot() AS s),"
		" tp AS MATERIALIZED ("
		"  SELECT p.topic, p.done FROM eventgrid.topic_positions p"
		"   WHERE p.system_identifier = eventgrid._system_identifier()"
		"   ORDER BY p.topic FOR UPDATE SKIP LOCKED"
		"), n AS ("
		"  SELECT tp.topic,"
		"         (SELECT count(*) FROM eventgrid.events e"
		"           WHERE e.topic = tp.topic AND e.txid >= pg_snapshot_xmin(tp.done)"
		"             AND e.txid < pg_snapshot_xmax(snap.s)"
		"             AND " IN_BATCH("e.txid", "tp.done", "snap.s") ") AS published,"
		"         CASE WHEN EXISTS ("
		"           SELECT 1 FROM eventgrid.event_subscriptions s"
		"             JOIN eventgrid.subscription_positions p ON p.subscription_id = s.id"
		"            WHERE s.topic = tp.topic AND s.included_event_types IS NULL"
		"              AND s.subject_begins_with IS NULL AND s.subject_ends_with IS NULL"
		"              AND s.advanced_filters IS NULL"
		"              AND pg_snapshot_xmax(p.since) <= pg_snapshot_xmin(tp.done))"
		"         THEN 0 ELSE"
		"         (SELECT count(*) FROM eventgrid.events e"
		"           WHERE e.topic = tp.topic AND e.txid >= pg_snapshot_xmin(tp.done)"
		"             AND e.txid < pg_snapshot_xmax(snap.s)"
		"             AND " IN_BATCH("e.txid", "tp.done", "snap.s")
		"             AND NOT EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s"
		"                               JOIN eventgrid.subscription_positions p ON p.subscription_id = s.id"
		"                              WHERE s.topic = e.topic AND NOT pg_visible_in_snapshot(e.txid, p.since)"
		"                                AND eventgrid._matches(e.event, s.included_event_types_lower,"
		"                                      s.subject_begins_with, s.subject_ends_with,"
		"                                      s.is_subject_case_sensitive, s.advanced_filters,"
		"                                      s.enable_advanced_filtering_on_arrays))) END AS unmatched"
		"    FROM tp CROSS JOIN snap"
		"), counted AS ("
		"  UPDATE eventgrid.topic_counters c"
		"     SET unmatched = c.unmatched + n.unmatched, published = c.published + n.published"
		"    FROM n WHERE c.topic = n.topic AND (n.unmatched > 0 OR n.published > 0)"
		")"
		"UPDATE eventgrid.topic_positions p SET done = snap.s FROM snap, n WHERE p.topic = n.topic",
		0, {0}
	},
	[PLAN_HOLDERS] = {
		"SELECT CASE WHEN pg_relation_size(format('eventgrid.events_%s', $1)::regclass) > 0"
		"            THEN coalesce(array_to_string(eventgrid._event_table_holders($1::smallint), '; '), '') END",
		1, {INT4OID}
	},
	[PLAN_POSITIONS] = {
		"SELECT count(*) FROM eventgrid.subscription_positions p"
		" WHERE p.system_identifier = eventgrid._system_identifier()",
		0, {0}
	},
	[PLAN_TABLE_USED] = {
		"SELECT pg_relation_size($1) > 0",
		1, {REGCLASSOID}
	},
	[PLAN_TRUNCATED] = {
		"UPDATE eventgrid.event_table_rotations SET truncated_at = $2, last_try_at = $2, last_failure = NULL"
		" WHERE event_table = $1",
		2, {INT4OID, TIMESTAMPTZOID}
	},
	[PLAN_TRUNCATE_FAILED] = {
		"UPDATE eventgrid.event_table_rotations SET last_try_at = $2, last_failure = $3"
		" WHERE event_table = $1",
		3, {INT4OID, TIMESTAMPTZOID, TEXTOID}
	},

	/* The attempt history's rotation: the table taking rows, and the last id used. */
	[PLAN_HISTORY_STATE] = {
		"SELECT h.history_table::int4, h.started_at, h.first_id,"
		"       (SELECT CASE WHEN q.is_called THEN q.last_value ELSE q.last_value - 1 END"
		"          FROM eventgrid.attempt_log_id_seq q)"
		"  FROM eventgrid.attempt_log_rotation h FOR UPDATE",
		0, {0}
	},
	[PLAN_HISTORY_ROTATED] = {
		"UPDATE eventgrid.attempt_log_rotation"
		"   SET history_table = $1, started_at = $2, first_id = $3, last_try_at = $2, last_failure = NULL",
		3, {INT4OID, TIMESTAMPTZOID, INT8OID}
	},
	[PLAN_HISTORY_ROTATE_FAILED] = {
		"UPDATE eventgrid.attempt_log_rotation SET last_try_at = $1, last_failure = $2",
		2, {TIMESTAMPTZOID, TEXTOID}
	},

	/*
	 * The backlog (eg_queue_backlog): retries due at $1 and not leased, up
	 * to $2 of them.
	 */
	[PLAN_BACKLOG_RETRIES] = {
		"SELECT count(*) FROM (SELECT 1 FROM eventgrid.retries r"
		"                       WHERE r.next_attempt_at <= $1 AND r.lease_owner IS NULL LIMIT $2) x",
		2, {TIMESTAMPTZOID, INT8OID}
	},
	/* each position, with what PLAN_BACKLOG_EVENTS takes; upto is done when NULL */
	[PLAN_BACKLOG_POSITIONS] = {
		"SELECT s.topic, p.done, coalesce(p.after_txid, '0'::xid8), coalesce(p.after_id, 0),"
		"       coalesce(p.upto, p.done)"
		"  FROM eventgrid.subscription_positions p"
		"  JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id",
		0, {0}
	},

	/*
	 * Events of topic $1 a position has not passed, up to $6: not visible
	 * in its done snapshot ($2) and, while it works through a batch (upto
	 * $5), either after its last event ($3, $4) or not in the batch.  Two
	 * index scans, each bounded by the position: the first starts at the
	 * last event, the second ends before its transaction (every event of
	 * that transaction is in the batch).  One statement joining positions
	 * and events, as before, could use none of these bounds in its index
	 * scan: it read every event of the topic once per subscription at
	 * every count.  Outside a batch $3 is '0' and $5 is $2: the second
	 * scan is empty.
	 */
	[PLAN_BACKLOG_EVENTS] = {
		"SELECT count(*) FROM ("
		"  SELECT 1 FROM eventgrid.events e"
		"   WHERE e.topic = $1 AND e.txid >= pg_snapshot_xmin($2) AND (e.txid, e.id) > ($3, $4)"
		"     AND NOT pg_visible_in_snapshot(e.txid, $2)"
		"  UNION ALL"
		"  SELECT 1 FROM eventgrid.events e"
		"   WHERE e.topic = $1 AND e.txid >= greatest(pg_snapshot_xmin($2), pg_snapshot_xmin($5))"
		"     AND e.txid < $3"
		"     AND NOT pg_visible_in_snapshot(e.txid, $2) AND NOT pg_visible_in_snapshot(e.txid, $5)"
		"  LIMIT $6) x",
		6, {TEXTOID, PG_SNAPSHOTOID, XID8OID, INT8OID, PG_SNAPSHOTOID, INT8OID}
	},
	/* dead letters after id $1, by reason; the newest id; events dropped so far */
	[PLAN_FINALS] = {
		"SELECT (SELECT coalesce(max(d.id), 0) FROM eventgrid.dead_letters d),"
		"       (SELECT coalesce(sum(c.dropped), 0)::int8 FROM eventgrid.subscription_counters c),"
		"       string_agg(x.reason || ' ' || x.n, ', ' ORDER BY x.reason), coalesce(sum(x.n), 0)::int8"
		"  FROM (SELECT d.dead_letter_reason AS reason, count(*) AS n FROM eventgrid.dead_letters d"
		"         WHERE d.id > $1 GROUP BY 1) x",
		1, {INT8OID}
	},

	/* Endpoint health (SPEC 6), written only by the delivery worker. */
	[PLAN_HEALTH_LOAD] = {
		"SELECT endpoint, state, consecutive_failures, last_failure_outcome, probation_cause,"
		"       probation_started_at, probation_until, probations"
		"  FROM eventgrid.endpoint_states",
		0, {0}
	},
	/* a healthy endpoint with no failures in a row needs no row */
	[PLAN_HEALTH_SAVE] = {
		"WITH h AS ("
		"  SELECT * FROM unnest($1::text[], $2::text[], $3::int4[], $4::text[], $5::text[],"
		"                       $6::timestamptz[], $7::timestamptz[], $8::int4[])"
		"         AS h(endpoint, state, consecutive_failures, last_failure_outcome, probation_cause,"
		"              probation_started_at, probation_until, probations)"
		"), gone AS ("
		"  DELETE FROM eventgrid.endpoint_states s USING h"
		"   WHERE s.endpoint = h.endpoint AND h.state = 'healthy' AND h.consecutive_failures = 0"
		")"
		"INSERT INTO eventgrid.endpoint_states AS s (endpoint, state, consecutive_failures, last_failure_outcome,"
		"       probation_cause, probation_started_at, probation_until, probations, updated_at)"
		"SELECT h.*, $9 FROM h WHERE NOT (h.state = 'healthy' AND h.consecutive_failures = 0)"
		"    ON CONFLICT (endpoint) DO UPDATE"
		"   SET state = excluded.state, consecutive_failures = excluded.consecutive_failures,"
		"       last_failure_outcome = excluded.last_failure_outcome, probation_cause = excluded.probation_cause,"
		"       probation_started_at = excluded.probation_started_at, probation_until = excluded.probation_until,"
		"       probations = excluded.probations, updated_at = excluded.updated_at",
		9, {TEXTARRAYOID, TEXTARRAYOID, INT4ARRAYOID, TEXTARRAYOID, TEXTARRAYOID, TIMESTAMPTZARRAYOID,
		TIMESTAMPTZARRAYOID, INT4ARRAYOID, TIMESTAMPTZOID}
	},
	[PLAN_HEALTH_FORGET] = {
		"DELETE FROM eventgrid.endpoint_states h"
		" WHERE NOT EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s WHERE s.endpoint = h.endpoint)",
		0, {0}
	},
};

static SPIPlanPtr plans[PLAN_COUNT];

EgReadiness eg_queue_readiness = EG_READY_UNKNOWN;
bool		eg_queue_quiet = false; /* the upkeep worker leaves readiness messages to the delivery worker */

static SPIPlanPtr
get_plan(EgPlanId id)
{
	if (plans[id] == NULL)
	{
		const EgPlanDef *def = &plan_defs[id];
		SPIPlanPtr	plan = SPI_prepare_cursor(def->sql, def->nargs, (Oid *) def->types,
											  def->generic ? CURSOR_OPT_GENERIC_PLAN : 0);

		if (plan == NULL)
			elog(ERROR, "eventgrid: SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
		SPI_keepplan(plan);
		plans[id] = plan;
	}
	return plans[id];
}

static void
free_plans(void)
{
	for (int i = 0; i < PLAN_COUNT; i++)
	{
		if (plans[i])
			SPI_freeplan(plans[i]);
		plans[i] = NULL;
	}
}

static void
run_plan(EgPlanId id, Datum *args, bool read_only, int expected)
{
	int			rc = SPI_execute_plan(get_plan(id), args, NULL, read_only, 0);

	if (rc != expected)
		elog(ERROR, "eventgrid: queue statement %d failed: %s", (int) id, SPI_result_code_string(rc));
}

static Datum
make_array(Datum *values, bool *nulls, int n, Oid elemtype)
{
	int			dims[1] = {n};
	int			lbs[1] = {1};
	int16		typlen;
	bool		typbyval;
	char		typalign;

	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	return PointerGetDatum(construct_md_array(values, nulls, 1, dims, lbs, elemtype,
											  typlen, typbyval, typalign));
}

static Datum
int8_array(const int64 *values, int n)
{
	Datum	   *d = palloc(Max(n, 1) * sizeof(Datum));

	for (int i = 0; i < n; i++)
		d[i] = Int64GetDatum(values[i]);
	return make_array(d, NULL, n, INT8OID);
}

/*
 * The schema's version: NULL when the extension is not installed.  Read from
 * pg_extension directly, without SQL, so that it works whatever the schema
 * holds.
 */
static char *
installed_version(void)
{
	Relation	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	char	   *version = NULL;

	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum("eventgrid"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
	{
		bool		isnull;
		Datum		d = heap_getattr(tup, Anum_pg_extension_extversion, RelationGetDescr(rel), &isnull);

		if (!isnull)
			version = TextDatumGetCString(d);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return version;
}

/*
 * Is the extension installed here, in the version this library was built
 * for?  Logs each change of the answer once.  On a mismatch the worker idles
 * until ALTER EXTENSION eventgrid UPDATE.
 */
static bool
extension_ready(void)
{
	char	   *version = installed_version();
	EgReadiness now = version == NULL ? EG_READY_MISSING
		: strcmp(version, EG_VERSION) != 0 ? EG_READY_VERSION : EG_READY_OK;

	if (now != eg_queue_readiness)
	{
		if (eg_queue_quiet)
			;
		else if (now == EG_READY_MISSING)
			ereport(LOG,
					(errmsg("eventgrid: extension eventgrid is not installed in database \"%s\"; the delivery worker waits for it",
							get_database_name(MyDatabaseId)),
					 errhint("Run CREATE EXTENSION eventgrid in this database.")));
		else if (now == EG_READY_VERSION)
			ereport(LOG,
					(errmsg("eventgrid: the installed extension is version %s but the loaded library is version %s; the delivery worker idles",
							version, EG_VERSION),
					 errhint("Run ALTER EXTENSION eventgrid UPDATE TO '%s' in database \"%s\"; delivery resumes by itself.",
							 EG_VERSION, get_database_name(MyDatabaseId))));
		else if (eg_queue_readiness != EG_READY_UNKNOWN)
			ereport(LOG, (errmsg("eventgrid: extension eventgrid %s is ready; the delivery worker resumes",
								 EG_VERSION)));
		/* statements prepared for other tables must not be reused */
		free_plans();
		eg_queue_readiness = now;
	}
	return now == EG_READY_OK;
}

/*
 * Opens a unit of work (one transaction) reported in pg_stat_activity as
 * activity.  Returns false, with no transaction open, when the extension
 * is not installed in this database or is of another version than the
 * library (eg_queue_readiness says which).
 */
bool
eg_queue_begin(const char *activity)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "eventgrid: SPI_connect failed");
	PushActiveSnapshot(GetTransactionSnapshot());
	if (!extension_ready())
	{
		SPI_finish();
		PopActiveSnapshot();
		CommitTransactionCommand();
		return false;
	}
	pgstat_report_activity(STATE_RUNNING, activity);
	return true;
}

/* Commits the unit of work; what SPI allocated in it is freed. */
void
eg_queue_commit(void)
{
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
}

/*
 * Lets the unit of work commit without waiting for the WAL flush: for
 * statements whose loss in a crash only means doing them again.
 */
void
eg_queue_no_flush_wait(void)
{
	run_plan(PLAN_NO_SYNC, NULL, false, SPI_OK_UTILITY);
}

static char *
text_col(SPITupleTable *tt, int row, int col)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tt->vals[row], tt->tupdesc, col, &isnull);

	return isnull ? NULL : TextDatumGetCString(d);
}

static int32
int32_col(SPITupleTable *tt, int row, int col, int32 dflt)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tt->vals[row], tt->tupdesc, col, &isnull);

	return isnull ? dflt : DatumGetInt32(d);
}

/* A boolean column; NULL reads as false. */
static bool
bool_col(SPITupleTable *tt, int row, int col)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tt->vals[row], tt->tupdesc, col, &isnull);

	return !isnull && DatumGetBool(d);
}

static int64
int64_col(SPITupleTable *tt, int row, int col, int64 dflt)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tt->vals[row], tt->tupdesc, col, &isnull);

	return isnull ? dflt : DatumGetInt64(d);
}

static Datum
xid8_array(const uint64 *values, int n)
{
	Datum	   *d = palloc(Max(n, 1) * sizeof(Datum));

	for (int i = 0; i < n; i++)
		d[i] = UInt64GetDatum(values[i]);
	return make_array(d, NULL, n, XID8OID);
}

/* A text column borrowed from the result (valid until eg_queue_commit()). */
static void
payload_col(SPITupleTable *tt, int row, int col, EgEventPart *part)
{
	bool		isnull;
	Datum		v = SPI_getbinval(tt->vals[row], tt->tupdesc, col, &isnull);

	if (!isnull)
	{
		text	   *t = DatumGetTextPP(v);

		part->json = VARDATA_ANY(t);
		part->len = VARSIZE_ANY_EXHDR(t);
	}
}

/*
 * The twelve columns both claims return from column col on, in this order:
 * max_delivery_attempts, expired, endpoint, subscription name, delivery
 * schema, max_events_per_batch, preferred batch size, the event's delivered
 * text, aeg-output-event-id, aeg-data-version, aeg-metadata-version, custom
 * header lines.
 */
static void
request_cols(SPITupleTable *tt, int row, int col, EgClaimedRow *r)
{
	r->max_attempts = int32_col(tt, row, col, 1);
	r->expired = bool_col(tt, row, col + 1);
	r->endpoint = text_col(tt, row, col + 2);
	r->subscription_name = text_col(tt, row, col + 3);
	r->schema = text_col(tt, row, col + 4);
	r->max_events_per_batch = int32_col(tt, row, col + 5, 0);
	r->preferred_batch_kb = int32_col(tt, row, col + 6, 0);
	payload_col(tt, row, col + 7, &r->payload);
	r->output_event_id = text_col(tt, row, col + 8);
	r->data_version = text_col(tt, row, col + 9);
	r->metadata_version = text_col(tt, row, col + 10);
	r->custom_headers = text_col(tt, row, col + 11);
}

/*
 * Claims up to limit due retries whose events add up to about byte_budget
 * bytes (at least one), leasing them to lease_owner for lease_ms, ordered
 * by subscription.  *rows (allocated in the unit of work) stay valid until
 * eg_queue_commit(); event texts are not copied.
 */
int
eg_queue_claim_retries(TimestampTz now, int limit, int64 byte_budget, int lease_owner, int64 lease_ms,
					   EgClaimedRow **rows)
{
	Datum		args[5];
	SPITupleTable *tt;
	int			n;
	EgClaimedRow *out;

	args[0] = TimestampTzGetDatum(now);
	args[1] = Int32GetDatum(limit);
	args[2] = Int32GetDatum(lease_owner);
	args[3] = Int64GetDatum(lease_ms);
	args[4] = Int64GetDatum(Max(byte_budget, 1));
	run_plan(PLAN_CLAIM_RETRIES, args, false, SPI_OK_SELECT);
	n = (int) SPI_processed;
	tt = SPI_tuptable;
	out = palloc0(Max(n, 1) * sizeof(EgClaimedRow));
	for (int i = 0; i < n; i++)
	{
		EgClaimedRow *r = &out[i];
		bool		isnull;
		Datum		v;

		r->retry_id = int64_col(tt, i, 1, 0);
		r->subscription_id = int64_col(tt, i, 2, 0);
		r->attempts = int32_col(tt, i, 3, 0);
		request_cols(tt, i, 4, r);
		r->prev_outcome = text_col(tt, i, 16);
		r->prev_http_status = int32_col(tt, i, 17, 0);
		v = SPI_getbinval(tt->vals[i], tt->tupdesc, 18, &isnull);
		r->prev_attempted_at = isnull ? 0 : DatumGetTimestampTz(v);
		r->bytes = int32_col(tt, i, 19, 0);
		r->profile = bool_col(tt, i, 20) ? EG_PROFILE_NAMESPACE : EG_PROFILE_CUSTOM;
		r->event_id = int64_col(tt, i, 21, 0);
		r->topic = text_col(tt, i, 22);
	}
	*rows = out;
	return n;
}

/* Event order, (txid, id): the order of a batch and of a chunk's key range. */
static inline int
cmp_event_key(uint64 txid_a, int64 id_a, uint64 txid_b, int64 id_b)
{
	if (txid_a != txid_b)
		return txid_a < txid_b ? -1 : 1;
	return id_a < id_b ? -1 : id_a > id_b ? 1 : 0;
}

/* A scanned row of a first-attempt claim, with the keys it is ordered by. */
typedef struct EgScanRow
{
	TimestampTz turn;
	int64		subscription_id;
	uint64		txid;			/* 0: no event (the position's batch is empty) */
	int64		id;
	int64		bytes;
	bool		matched;
	HeapTuple	tuple;
} EgScanRow;

static int
cmp_scan_rows(const void *a, const void *b)
{
	const EgScanRow *x = a;
	const EgScanRow *y = b;

	if (x->turn != y->turn)
		return x->turn < y->turn ? -1 : 1;
	if (x->subscription_id != y->subscription_id)
		return x->subscription_id < y->subscription_id ? -1 : 1;
	return cmp_event_key(x->txid, x->id, y->txid, y->id);
}

/* A delivery read by PLAN_CLAIM_LOAD, with the keys it is ordered by. */
typedef struct EgLoadRow
{
	int64		chunk;
	uint64		txid;
	int64		id;
	HeapTuple	tuple;
	Datum		event;			/* the event as jsonb (json_texts()) */
} EgLoadRow;

static int
cmp_load_rows(const void *a, const void *b)
{
	const EgLoadRow *x = a;
	const EgLoadRow *y = b;

	if (x->chunk != y->chunk)
		return x->chunk < y->chunk ? -1 : 1;
	return cmp_event_key(x->txid, x->id, y->txid, y->id);
}

static int
cmp_load_events(const void *a, const void *b)
{
	const EgLoadRow *x = *(EgLoadRow *const *) a;
	const EgLoadRow *y = *(EgLoadRow *const *) b;

	return cmp_event_key(x->txid, x->id, y->txid, y->id);
}

/*
 * The JSON text of the rows out[0..n) (PLAN_CLAIM_LOAD's, in the order of
 * load) that came as jsonb (column col), made once per event: with
 * fan-out, every subscription that gets an event in the topic's own schema
 * gets the same text, which jsonb's own output function makes.
 */
static void
json_texts(SPITupleTable *tt, EgLoadRow *load, EgClaimedRow *out, int n, int col)
{
	EgLoadRow **by_event = palloc(Max(n, 1) * sizeof(EgLoadRow *));
	int			m = 0;

	for (int i = 0; i < n; i++)
	{
		bool		isnull;

		load[i].event = SPI_getbinval(tt->vals[i], tt->tupdesc, col, &isnull);
		if (!isnull)
			by_event[m++] = &load[i];
	}
	qsort(by_event, m, sizeof(EgLoadRow *), cmp_load_events);
	for (int i = 0; i < m;)
	{
		int			j = i;
		Jsonb	   *jb = DatumGetJsonbP(by_event[i]->event);
		char	   *text = JsonbToCString(NULL, &jb->root, VARSIZE(jb));
		int			len = strlen(text);

		/*
		 * Held until the claim commits: no more than the text itself (its
		 * buffer may have room to spare), and not the unpacked copy of an
		 * event that came compressed or out of line.
		 */
		text = repalloc(text, len + 1);
		if ((Pointer) jb != DatumGetPointer(by_event[i]->event))
			pfree(jb);

		while (j < m && cmp_load_events(&by_event[j], &by_event[i]) == 0)
		{
			EgClaimedRow *r = &out[by_event[j] - load];	/* out and load share their order */

			r->payload.json = text;
			r->payload.len = len;
			j++;
		}
		i = j;
	}
	pfree(by_event);
}

/*
 * Claims first attempts: for every event subscription whose position no
 * other session holds, the next events of its snapshot batch, at most limit
 * per subscription, cut where the events to deliver reach byte_budget bytes
 * (at least one event).  Subscriptions take turns by when they were last
 * served (never served first).  Events the subscription's filters leave out
 * are passed over.  Positions move past what was taken, and what is to be
 * delivered is written as chunks in flight numbered from *next_chunk (one
 * per subscription), in this unit of work; the deliveries are then read
 * from those chunks.  Returns the deliveries, ordered by chunk and then
 * (txid, id); *more says whether a position has more to give at once,
 * *locked that another session holds a position.  The nskip event
 * subscriptions in skip are left out (their endpoint is backed up).
 * *rows stay valid until eg_queue_commit().
 */
int
eg_queue_claim_first(TimestampTz now, int limit, int64 byte_budget, int lease_owner,
					 const int64 *skip, int nskip,
					 int64 *next_chunk, EgClaimedRow **rows, bool *more, bool *locked)
{
	int			nseen = 0;
	Datum		args[12];
	SPITupleTable *tt;
	int			n;
	int			nout = 0;
	int			nsubs = 0;
	int			nchunks = 0;
	int64		before = 0;
	int64		budget = Max(byte_budget, 1);
	EgScanRow  *scan;
	EgLoadRow  *load;
	EgClaimedRow *out;
	Datum	   *sub_ids,
			   *complete,
			   *uptos,
			   *chunks,
			   *topics,
			   *dones,
			   *last_ids,
			   *old_after_ids,
			   *written;
	bool	   *chunk_nulls;
	uint64	   *last_txids,
			   *old_after_txids;

	*more = false;
	*rows = palloc0(sizeof(EgClaimedRow));	/* none yet: never a NULL for memcpy */
	args[0] = Int32GetDatum(limit);
	args[1] = int8_array(skip, nskip);
	run_plan(PLAN_CLAIM_FIRST, args, false, SPI_OK_SELECT);
	n = (int) SPI_processed;
	tt = SPI_tuptable;

	scan = palloc(Max(n, 1) * sizeof(EgScanRow));
	for (int i = 0; i < n; i++)
	{
		bool		isnull;
		Datum		v;

		scan[i].tuple = tt->vals[i];
		scan[i].subscription_id = int64_col(tt, i, 1, 0);
		scan[i].turn = DatumGetTimestampTz(SPI_getbinval(tt->vals[i], tt->tupdesc, 2, &isnull));
		v = SPI_getbinval(tt->vals[i], tt->tupdesc, 3, &isnull);
		scan[i].txid = isnull ? 0 : DatumGetUInt64(v);
		scan[i].id = int64_col(tt, i, 4, 0);
		scan[i].matched = bool_col(tt, i, 5);
		scan[i].bytes = int32_col(tt, i, 6, 0);
	}
	qsort(scan, n, sizeof(EgScanRow), cmp_scan_rows);

	sub_ids = palloc(Max(n, 1) * sizeof(Datum));
	complete = palloc(Max(n, 1) * sizeof(Datum));
	uptos = palloc(Max(n, 1) * sizeof(Datum));
	chunks = palloc(Max(n, 1) * sizeof(Datum));
	chunk_nulls = palloc(Max(n, 1) * sizeof(bool));
	topics = palloc(Max(n, 1) * sizeof(Datum));
	dones = palloc(Max(n, 1) * sizeof(Datum));
	last_ids = palloc(Max(n, 1) * sizeof(Datum));
	old_after_ids = palloc(Max(n, 1) * sizeof(Datum));
	last_txids = palloc(Max(n, 1) * sizeof(uint64));
	old_after_txids = palloc(Max(n, 1) * sizeof(uint64));
	written = palloc(Max(n, 1) * sizeof(Datum));

	/* rows grouped by subscription in turn order, events in (txid, id) order */
	for (int i = 0; i < n;)
	{
		int64		sub = scan[i].subscription_id;
		HeapTuple	first = scan[i].tuple;
		int			j = i;
		int			scanned = 0;
		int			taken = 0;
		bool		delivered = false;
		bool		isnull;

		while (j < n && scan[j].subscription_id == sub)
			j++;
		nseen++;
		if (scan[i].txid != 0)
			scanned = j - i;

		/*
		 * Take events while the bytes to deliver before them, in this claim,
		 * stay under the budget (at least 1: the first event always).
		 */
		while (taken < scanned && before < budget)
		{
			if (scan[i + taken].matched)
				before += scan[i + taken].bytes;
			taken++;
		}

		/*
		 * Nothing in the batch: it is complete (nothing to write for an idle
		 * position with no batch open).  All it had was taken: the batch is
		 * complete unless the limit stopped the scan.  Cut by the byte
		 * budget: the position stops at the last event taken, or does not
		 * move when the cut came before its first event.
		 */
		if ((scanned == 0 && DatumGetBool(SPI_getbinval(first, tt->tupdesc, 10, &isnull))) ||
			(scanned > 0 && taken == 0))
		{
			if (scanned > 0)
				*more = true;
			i = j;
			continue;
		}
		sub_ids[nsubs] = Int64GetDatum(sub);
		complete[nsubs] = BoolGetDatum(taken == scanned && scanned < limit);
		if (!(taken == scanned && scanned < limit))
			*more = true;
		dones[nsubs] = PointerGetDatum(DatumGetTextPP(SPI_getbinval(first, tt->tupdesc, 7, &isnull)));
		uptos[nsubs] = PointerGetDatum(DatumGetTextPP(SPI_getbinval(first, tt->tupdesc, 8, &isnull)));
		topics[nsubs] = PointerGetDatum(DatumGetTextPP(SPI_getbinval(first, tt->tupdesc, 9, &isnull)));
		old_after_txids[nsubs] = DatumGetUInt64(SPI_getbinval(first, tt->tupdesc, 11, &isnull));
		old_after_ids[nsubs] = SPI_getbinval(first, tt->tupdesc, 12, &isnull);
		last_txids[nsubs] = 0;
		last_ids[nsubs] = Int64GetDatum(0);
		for (int k = i; k < i + taken; k++)
		{
			last_txids[nsubs] = scan[k].txid;
			last_ids[nsubs] = Int64GetDatum(scan[k].id);
			delivered = delivered || scan[k].matched;
		}
		chunk_nulls[nsubs] = !delivered;
		chunks[nsubs] = Int64GetDatum(delivered ? (*next_chunk)++ : 0);
		if (delivered)
			written[nchunks++] = chunks[nsubs];
		nsubs++;
		i = j;
	}

	if (nsubs > 0)
	{
		args[0] = make_array(sub_ids, NULL, nsubs, INT8OID);
		args[1] = make_array(complete, NULL, nsubs, BOOLOID);
		args[2] = make_array(uptos, NULL, nsubs, TEXTOID);
		args[3] = xid8_array(last_txids, nsubs);
		args[4] = make_array(last_ids, NULL, nsubs, INT8OID);
		args[5] = make_array(chunks, chunk_nulls, nsubs, INT8OID);
		args[6] = make_array(topics, NULL, nsubs, TEXTOID);
		args[7] = make_array(dones, NULL, nsubs, TEXTOID);
		args[8] = TimestampTzGetDatum(now);
		args[9] = Int32GetDatum(lease_owner);
		args[10] = xid8_array(old_after_txids, nsubs);
		args[11] = make_array(old_after_ids, NULL, nsubs, INT8OID);
		run_plan(PLAN_ADVANCE, args, false, SPI_OK_INSERT);
	}
	run_plan(PLAN_POSITIONS, NULL, true, SPI_OK_SELECT);
	*locked = int64_col(SPI_tuptable, 0, 1, 0) > nseen + nskip;
	if (nchunks == 0)
		return 0;

	/* step two: what the chunks just written deliver */
	args[0] = make_array(written, NULL, nchunks, INT8OID);
	args[1] = Int32GetDatum(lease_owner);
	args[2] = TimestampTzGetDatum(now);
	run_plan(PLAN_CLAIM_LOAD, args, false, SPI_OK_SELECT);
	n = (int) SPI_processed;
	tt = SPI_tuptable;
	load = palloc(Max(n, 1) * sizeof(EgLoadRow));
	for (int i = 0; i < n; i++)
	{
		bool		isnull;

		load[i].tuple = tt->vals[i];
		load[i].chunk = int64_col(tt, i, 1, 0);
		load[i].txid = DatumGetUInt64(SPI_getbinval(tt->vals[i], tt->tupdesc, 3, &isnull));
		load[i].id = int64_col(tt, i, 4, 0);
	}
	qsort(load, n, sizeof(EgLoadRow), cmp_load_rows);
	out = palloc0(Max(n, 1) * sizeof(EgClaimedRow));
	for (int i = 0; i < n; i++)
	{
		EgClaimedRow *r = &out[nout++];

		tt->vals[i] = load[i].tuple;
		r->chunk = load[i].chunk;
		r->txid = load[i].txid;
		r->event_id = load[i].id;
		r->subscription_id = int64_col(tt, i, 2, 0);
		r->attempts = 0;
		request_cols(tt, i, 5, r);
		r->bytes = int32_col(tt, i, 17, 0);
		r->profile = bool_col(tt, i, 18) ? EG_PROFILE_NAMESPACE : EG_PROFILE_CUSTOM;
		r->topic = text_col(tt, i, 19);
	}
	json_texts(tt, load, out, n, 20);

	/*
	 * A chunk that gave nothing (its subscription's filters were changed
	 * between the two steps) is not in flight.
	 */
	{
		int			nempty = 0;

		for (int c = 0, i = 0; c < nchunks; c++)
		{
			int64		no = DatumGetInt64(written[c]);

			while (i < n && out[i].chunk < no)
				i++;
			if (i >= n || out[i].chunk != no)
				written[nempty++] = written[c];
		}
		if (nempty > 0)
		{
			args[0] = make_array(written, NULL, nempty, INT8OID);
			args[1] = Int32GetDatum(lease_owner);
			run_plan(PLAN_DROP_CHUNKS, args, false, SPI_OK_DELETE);
		}
	}
	*rows = out;
	return nout;
}

/*
 * Fresh statistics for eventgrid.retries.  Queue tables swing between
 * empty and large; after a VACUUM finds one empty the planner believes it
 * empty until the next ANALYZE and picks nested loops that cost the square
 * of the rows per statement.  The event tables are always reached through
 * their index, in (topic, txid, id) order.
 */
void
eg_queue_analyze(void)
{
	if (SPI_execute("ANALYZE eventgrid.retries", false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "eventgrid: ANALYZE of eventgrid.retries failed");
}

/*
 * Records, before a wave of requests goes to HTTP, what it carries: the
 * retries retry_ids[0..nretries) under wave number wave, and for each chunk
 * in marks[0..nmarks) the last of its events handed to HTTP so far.
 */
void
eg_queue_mark_in_flight(int lease_owner, int64 wave, const int64 *retry_ids, int nretries,
						const EgChunkMark *marks, int nmarks)
{
	Datum		args[4];

	if (nretries > 0)
	{
		args[0] = Int32GetDatum(lease_owner);
		args[1] = Int64GetDatum(wave);
		args[2] = int8_array(retry_ids, nretries);
		run_plan(PLAN_IN_FLIGHT, args, false, SPI_OK_INSERT);
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
		args[1] = int8_array(chunks, nmarks);
		args[2] = xid8_array(txids, nmarks);
		args[3] = int8_array(ids, nmarks);
		run_plan(PLAN_SENT_MARKS, args, false, SPI_OK_UPDATE);
	}
}

/* Forgets the in-flight records of waves whose retries are all recorded. */
void
eg_queue_forget_waves(int lease_owner, const int64 *waves, int n)
{
	Datum		args[2];

	if (n == 0)
		return;
	args[0] = Int32GetDatum(lease_owner);
	args[1] = int8_array(waves, n);
	run_plan(PLAN_WAVES_DONE, args, false, SPI_OK_DELETE);
}

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
	char		act[2] = {o->action, '\0'};

	a->ids[i] = Int64GetDatum(o->retry_id);
	a->subs[i] = Int64GetDatum(o->subscription_id);
	a->event_ids[i] = Int64GetDatum(o->event_id);
	a->txids[i] = o->txid;
	a->actions[i] = CStringGetTextDatum(act);
	a->n_name[i] = o->outcome == NULL;
	a->names[i] = o->outcome ? CStringGetTextDatum(o->outcome) : (Datum) 0;
	a->n_status[i] = o->http_status == 0;
	a->statuses[i] = Int32GetDatum(o->http_status);
	a->n_attempted[i] = o->attempted_at == 0;
	a->attempted[i] = TimestampTzGetDatum(o->attempted_at);
	a->n_next[i] = o->action != 'r';
	a->next_at[i] = TimestampTzGetDatum(o->next_at);
	a->n_reason[i] = o->reason == NULL;
	a->reasons[i] = o->reason ? CStringGetTextDatum(o->reason) : (Datum) 0;
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
	args[0] = make_array(a->actions, NULL, a->n, TEXTOID);
	args[1] = make_array(a->names, a->n_name, a->n, TEXTOID);
	args[2] = make_array(a->statuses, a->n_status, a->n, INT4OID);
	args[3] = make_array(a->attempted, a->n_attempted, a->n, TIMESTAMPTZOID);
	args[4] = make_array(a->next_at, a->n_next, a->n, TIMESTAMPTZOID);
	args[5] = make_array(a->reasons, a->n_reason, a->n, TEXTOID);
	args[6] = make_array(a->attempts, NULL, a->n, INT4OID);
	if (with_attempted)
		args[7] = make_array(a->flags, NULL, a->n, BOOLOID);
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
 * arrays PLAN_RECORD_FIRST counts with.
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
		c[k].delivered = o->action == 'd';
		c[k].failed = o->action != 'd' && o->attempted;
		c[k].finals = o->action == 'f';
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
		args[j] = make_array(cols[j], NULL, m, INT8OID);
}

/* Writes delivery attempts to the attempt history (PLAN_RECORD_ATTEMPTS). */
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
	bool	   *n_topic = palloc(n * sizeof(bool));
	bool	   *n_status = palloc(n * sizeof(bool));
	bool	   *n_duration = palloc(n * sizeof(bool));
	bool	   *n_error = palloc(n * sizeof(bool));
	int			nids = 0;
	int64	   *ids;
	Datum		args[12];

	for (int i = 0; i < n; i++)
		nids += attempts[i].nevents;
	ids = palloc(Max(nids, 1) * sizeof(int64));
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
		nids += a->nevents;
		lasts[i] = Int32GetDatum(nids);
		n_status[i] = a->http_status == 0;
		statuses[i] = Int32GetDatum(a->http_status);
		outcomes[i] = CStringGetTextDatum(a->outcome);
		n_duration[i] = a->duration_ms < 0;
		durations[i] = Float8GetDatum(a->duration_ms);
		n_error[i] = a->error == NULL;
		errors[i] = a->error ? CStringGetTextDatum(a->error) : (Datum) 0;
		n_topic[i] = a->topic == NULL;
		topics[i] = a->topic ? CStringGetTextDatum(a->topic) : (Datum) 0;
	}
	args[0] = make_array(at, NULL, n, TIMESTAMPTZOID);
	args[1] = make_array(subs, NULL, n, INT8OID);
	args[2] = make_array(names, NULL, n, TEXTOID);
	args[3] = make_array(numbers, NULL, n, INT4OID);
	args[4] = int8_array(ids, nids);
	args[5] = make_array(firsts, NULL, n, INT4OID);
	args[6] = make_array(lasts, NULL, n, INT4OID);
	args[7] = make_array(statuses, n_status, n, INT4OID);
	args[8] = make_array(outcomes, NULL, n, TEXTOID);
	args[9] = make_array(durations, n_duration, n, FLOAT8OID);
	args[10] = make_array(errors, n_error, n, TEXTOID);
	args[11] = make_array(topics, n_topic, n, TEXTOID);
	run_plan(PLAN_RECORD_ATTEMPTS, args, false, SPI_OK_INSERT);
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
eg_queue_record(EgOutcome *const *outcomes, int n, int lease_owner, const int64 *chunks, int nchunks,
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
			if (o->action != 'd')
				outcome_arrays_add(&first, o);
		}
		if (o->action == 'r' && o->next_at < earliest)
			earliest = o->next_at;
	}
	args[0] = make_array(subs, NULL, n, INT8OID);
	run_plan(PLAN_LOCK_SUBSCRIPTIONS, args, false, SPI_OK_SELECT);

	if (nfirst > 0 || nchunks > 0)
	{
		OutcomeArrays *a = &first;

		args[0] = make_array(a->subs, NULL, a->n, INT8OID);
		args[1] = xid8_array(a->txids, a->n);
		args[2] = make_array(a->event_ids, NULL, a->n, INT8OID);
		outcome_args(a, &args[3], false);
		args[10] = Int32GetDatum(lease_owner);
		args[11] = int8_array(chunks, nchunks);
		first_counts_args(outcomes, n, &args[12]);
		run_plan(PLAN_RECORD_FIRST, args, false, SPI_OK_DELETE);
	}
	if (retry.n > 0)
	{
		OutcomeArrays *a = &retry;

		args[0] = make_array(a->ids, NULL, a->n, INT8OID);
		outcome_args(a, &args[1], true);
		run_plan(PLAN_RECORD_RETRIES, args, false, SPI_OK_UPDATE);
	}
	if (nattempts > 0)
		record_attempts(attempts, nattempts);
	return earliest;
}

/*
 * Earliest next_attempt_at of retries that no running delivery worker holds
 * (unleased, or leased by a worker that no longer runs), or DT_NOEND.
 */
TimestampTz
eg_queue_next_due(void)
{
	bool		isnull;
	Datum		v;

	run_plan(PLAN_NEXT_DUE, NULL, true, SPI_OK_SELECT);
	v = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return isnull ? DT_NOEND : DatumGetTimestampTz(v);
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
 * how many deliveries were charged and how many taken back in all.
 */
void
eg_queue_recover(int starting_pid, TimestampTz now, bool history, uint64 *charged, uint64 *released)
{
	Datum		args[4];

	args[0] = Int32GetDatum(starting_pid);
	args[1] = TimestampTzGetDatum(now);
	args[2] = BoolGetDatum(history);
	args[3] = BoolGetDatum(starting_pid != 0);
	*charged = 0;
	*released = 0;
	if (starting_pid == 0)
	{
		bool		stale;

		run_plan(PLAN_STALE, args, true, SPI_OK_SELECT);
		stale = bool_col(SPI_tuptable, 0, 1);
		if (!stale)
			return;
	}
	run_plan(PLAN_RECOVERY_LOCK, NULL, false, SPI_OK_UTILITY);

	/* who runs is read again by each statement, after its snapshot */
	pgstat_clear_snapshot();
	run_plan(PLAN_RECOVER_CHUNKS, args, false, SPI_OK_SELECT);
	*released = SPI_processed;
	for (uint64 i = 0; i < SPI_processed; i++)
		if (int32_col(SPI_tuptable, (int) i, 1, 0) > 0)
			(*charged)++;
	pgstat_clear_snapshot();
	run_plan(PLAN_RELEASE, args, false, SPI_OK_SELECT);
	*released += (uint64) int64_col(SPI_tuptable, 0, 1, 0);
	*charged += (uint64) int64_col(SPI_tuptable, 0, 2, 0);
}

/*
 * Positions restored from another cluster (pg_restore elsewhere,
 * pg_upgrade) hold snapshots of that cluster's transaction ids: what they
 * had not passed becomes retries due at now, the event tables are emptied
 * (their transaction ids mean nothing here) and every position starts
 * afresh.  Returns the number of retries made; 0 and nothing done when
 * every position is this cluster's.
 */
uint64
eg_queue_rebase(TimestampTz now)
{
	Datum		arg = TimestampTzGetDatum(now);
	bool		isnull;
	uint64		made;

	run_plan(PLAN_FOREIGN, NULL, true, SPI_OK_SELECT);
	if (!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
		return 0;
	run_plan(PLAN_REBASE_PENDING, &arg, false, SPI_OK_INSERT);
	made = SPI_processed;
	if (SPI_execute("TRUNCATE eventgrid.events_0, eventgrid.events_1, eventgrid.events_2", false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "eventgrid: emptying the event tables failed");
	run_plan(PLAN_REBASE_POSITIONS, NULL, false, SPI_OK_UPDATE);
	ereport(LOG,
			(errmsg("eventgrid: positions restored from another cluster start afresh; %llu pending deliveries became retries",
					(unsigned long long) made)));
	return made;
}

/* Counts the events that no event subscription takes, per topic (SPEC 9). */
void
eg_queue_count_unmatched(void)
{
	run_plan(PLAN_UNMATCHED, NULL, false, SPI_OK_UPDATE);
}

/* The oid of eventgrid's table eventgrid.<name>, which must exist. */
static Oid
eventgrid_table(const char *name)
{
	Oid			relid = get_relname_relid(name, get_namespace_oid("eventgrid", false));

	if (!OidIsValid(relid))
		elog(ERROR, "eventgrid: table eventgrid.%s is missing", name);
	return relid;
}

/* TRUNCATE eventgrid.<name> (its lock already taken, or taken here). */
static void
truncate_table(const char *name)
{
	if (SPI_execute(psprintf("TRUNCATE eventgrid.%s", name), false, 0) != SPI_OK_UTILITY)
		elog(ERROR, "eventgrid: TRUNCATE eventgrid.%s failed", name);
}

/* Has table relid been written since it was last emptied? */
static bool
table_used(Oid relid)
{
	Datum		arg = ObjectIdGetDatum(relid);

	run_plan(PLAN_TABLE_USED, &arg, true, SPI_OK_SELECT);
	return bool_col(SPI_tuptable, 0, 1);
}

/* Has event table eventgrid.events_<event_table> been written since it was last emptied? */
bool
eg_queue_table_used(int event_table)
{
	char		name[NAMEDATALEN];

	snprintf(name, sizeof(name), "events_%d", event_table);
	return table_used(eventgrid_table(name));
}

/*
 * Empties event table eventgrid.events_<event_table> when nothing needs its
 * events, with a lock taken only if it is free at once, so that no
 * publisher or reader ever waits for it.  Returns NULL when emptied, else
 * why not (also written to eventgrid.event_table_rotations).
 */
char *
eg_queue_truncate(int event_table, TimestampTz now)
{
	char		name[NAMEDATALEN];
	Oid			relid;
	Datum		args[3];
	char	   *why = NULL;

	snprintf(name, sizeof(name), "events_%d", event_table);
	relid = eventgrid_table(name);

	args[0] = Int32GetDatum(event_table);
	run_plan(PLAN_HOLDERS, args, true, SPI_OK_SELECT);
	why = text_col(SPI_tuptable, 0, 1);
	if (why == NULL)
		return NULL;			/* empty already */
	if (why[0] != '\0')
		why = psprintf("waiting for %s", why);
	else if (!ConditionalLockRelationOid(relid, AccessExclusiveLock))
		why = pstrdup("another session holds a lock on the table");
	else
	{
		/* rows committed since the first look, by a transaction that began earlier */
		run_plan(PLAN_HOLDERS, args, true, SPI_OK_SELECT);
		why = text_col(SPI_tuptable, 0, 1);
		if (why && why[0] != '\0')
			why = psprintf("waiting for %s", why);
		else
			why = NULL;
	}
	args[1] = TimestampTzGetDatum(now);
	if (why)
	{
		args[2] = CStringGetTextDatum(why);
		run_plan(PLAN_TRUNCATE_FAILED, args, false, SPI_OK_UPDATE);
		return why;
	}
	truncate_table(name);
	run_plan(PLAN_TRUNCATED, args, false, SPI_OK_UPDATE);
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
eg_queue_rotate_history(TimestampTz now, int64 period_ms, int64 max_rows)
{
	int			current;
	int			next;
	TimestampTz started;
	int64		first_id;
	int64		last_id;
	bool		isnull;
	char		name[NAMEDATALEN];
	Oid			relid;
	Datum		args[3];

	run_plan(PLAN_HISTORY_STATE, NULL, false, SPI_OK_SELECT);
	current = int32_col(SPI_tuptable, 0, 1, 0);
	started = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	first_id = int64_col(SPI_tuptable, 0, 3, 0);
	last_id = int64_col(SPI_tuptable, 0, 4, 0);
	if (now - started < period_ms * 1000 && last_id - first_id + 1 < max_rows)
		return NULL;

	next = (current + 1) % EG_HISTORY_TABLES;
	snprintf(name, sizeof(name), "attempt_log_%d", next);
	relid = eventgrid_table(name);
	if (table_used(relid))
	{
		if (!ConditionalLockRelationOid(relid, AccessExclusiveLock))
		{
			char	   *why = pstrdup("another session holds a lock on the table");

			args[0] = TimestampTzGetDatum(now);
			args[1] = CStringGetTextDatum(why);
			run_plan(PLAN_HISTORY_ROTATE_FAILED, args, false, SPI_OK_UPDATE);
			return why;
		}
		truncate_table(name);
	}
	args[0] = Int32GetDatum(next);
	args[1] = TimestampTzGetDatum(now);
	args[2] = Int64GetDatum(last_id + 1);
	run_plan(PLAN_HISTORY_ROTATED, args, false, SPI_OK_UPDATE);
	return NULL;
}

/*
 * Deliveries ready at now and not claimed yet: due retries, and events the
 * positions have not passed, counted before filters (an upper bound), each
 * kind up to EG_BACKLOG_COUNT_LIMIT ("that many or more").  Events are
 * counted position by position, each from where it stands
 * (PLAN_BACKLOG_EVENTS), so a count reads at most about the rows it counts.
 */
int64
eg_queue_backlog(TimestampTz now)
{
	Datum		args[6];
	int64		retries;
	int64		events = 0;
	SPITupleTable *positions;

	args[0] = TimestampTzGetDatum(now);
	args[1] = Int64GetDatum(EG_BACKLOG_COUNT_LIMIT);
	run_plan(PLAN_BACKLOG_RETRIES, args, true, SPI_OK_SELECT);
	retries = int64_col(SPI_tuptable, 0, 1, 0);

	run_plan(PLAN_BACKLOG_POSITIONS, NULL, true, SPI_OK_SELECT);
	positions = SPI_tuptable;
	for (uint64 i = 0; i < positions->numvals && events < EG_BACKLOG_COUNT_LIMIT; i++)
	{
		bool		isnull;

		for (int k = 0; k < 5; k++)
			args[k] = SPI_getbinval(positions->vals[i], positions->tupdesc, k + 1, &isnull);
		args[5] = Int64GetDatum(EG_BACKLOG_COUNT_LIMIT - events);
		run_plan(PLAN_BACKLOG_EVENTS, args, true, SPI_OK_SELECT);
		events += int64_col(SPI_tuptable, 0, 1, 0);
		SPI_freetuptable(SPI_tuptable);
	}
	SPI_freetuptable(positions);
	return retries + events;
}

/*
 * Dead letters and dropped events so far: the newest dead letter id, the
 * sum of the dropped counters, and the dead letters written after
 * after_dead_letter_id, counted and by reason (text valid until
 * eg_queue_commit()).
 */
EgFinals
eg_queue_finals(int64 after_dead_letter_id)
{
	Datum		arg = Int64GetDatum(after_dead_letter_id);
	EgFinals	f;

	run_plan(PLAN_FINALS, &arg, true, SPI_OK_SELECT);
	f.last_dead_letter_id = int64_col(SPI_tuptable, 0, 1, 0);
	f.dropped = int64_col(SPI_tuptable, 0, 2, 0);
	f.by_reason = text_col(SPI_tuptable, 0, 3);
	f.dead_lettered = int64_col(SPI_tuptable, 0, 4, 0);
	return f;
}

/*
 * The health of every endpoint as an earlier run of the delivery worker
 * left it (SPEC 6); *rows stay valid until eg_queue_commit().
 */
int
eg_queue_load_health(EgHealth **rows)
{
	SPITupleTable *tt;
	int			n;
	EgHealth   *out;

	run_plan(PLAN_HEALTH_LOAD, NULL, true, SPI_OK_SELECT);
	n = (int) SPI_processed;
	tt = SPI_tuptable;
	out = palloc0(Max(n, 1) * sizeof(EgHealth));
	for (int i = 0; i < n; i++)
	{
		bool		isnull;
		Datum		v;

		out[i].endpoint = text_col(tt, i, 1);
		out[i].state = text_col(tt, i, 2);
		out[i].consecutive_failures = int32_col(tt, i, 3, 0);
		out[i].last_failure_outcome = text_col(tt, i, 4);
		out[i].probation_cause = text_col(tt, i, 5);
		v = SPI_getbinval(tt->vals[i], tt->tupdesc, 6, &isnull);
		out[i].probation_started_at = isnull ? 0 : DatumGetTimestampTz(v);
		v = SPI_getbinval(tt->vals[i], tt->tupdesc, 7, &isnull);
		out[i].probation_until = isnull ? 0 : DatumGetTimestampTz(v);
		out[i].probations = int32_col(tt, i, 8, 0);
	}
	*rows = out;
	return n;
}

static Datum
text_array(const char *const *values, int n)
{
	Datum	   *d = palloc(Max(n, 1) * sizeof(Datum));
	bool	   *nulls = palloc(Max(n, 1) * sizeof(bool));

	for (int i = 0; i < n; i++)
	{
		nulls[i] = values[i] == NULL;
		d[i] = nulls[i] ? (Datum) 0 : CStringGetTextDatum(values[i]);
	}
	return make_array(d, nulls, n, TEXTOID);
}

/* Writes the health of n endpoints, as of now (SPEC 6). */
void
eg_queue_save_health(const EgHealth *rows, int n, TimestampTz now)
{
	const char **endpoints = palloc(Max(n, 1) * sizeof(char *));
	const char **states = palloc(Max(n, 1) * sizeof(char *));
	const char **lasts = palloc(Max(n, 1) * sizeof(char *));
	const char **causes = palloc(Max(n, 1) * sizeof(char *));
	Datum	   *failures = palloc(Max(n, 1) * sizeof(Datum));
	Datum	   *probations = palloc(Max(n, 1) * sizeof(Datum));
	Datum	   *started = palloc(Max(n, 1) * sizeof(Datum));
	Datum	   *until = palloc(Max(n, 1) * sizeof(Datum));
	bool	   *started_null = palloc(Max(n, 1) * sizeof(bool));
	bool	   *until_null = palloc(Max(n, 1) * sizeof(bool));
	Datum		args[9];

	if (n == 0)
		return;
	for (int i = 0; i < n; i++)
	{
		endpoints[i] = rows[i].endpoint;
		states[i] = rows[i].state;
		lasts[i] = rows[i].last_failure_outcome;
		causes[i] = rows[i].probation_cause;
		failures[i] = Int32GetDatum(rows[i].consecutive_failures);
		probations[i] = Int32GetDatum(rows[i].probations);
		started_null[i] = rows[i].probation_started_at == 0;
		started[i] = TimestampTzGetDatum(rows[i].probation_started_at);
		until_null[i] = rows[i].probation_until == 0;
		until[i] = TimestampTzGetDatum(rows[i].probation_until);
	}
	args[0] = text_array(endpoints, n);
	args[1] = text_array(states, n);
	args[2] = make_array(failures, NULL, n, INT4OID);
	args[3] = text_array(lasts, n);
	args[4] = text_array(causes, n);
	args[5] = make_array(started, started_null, n, TIMESTAMPTZOID);
	args[6] = make_array(until, until_null, n, TIMESTAMPTZOID);
	args[7] = make_array(probations, NULL, n, INT4OID);
	args[8] = TimestampTzGetDatum(now);
	run_plan(PLAN_HEALTH_SAVE, args, false, SPI_OK_INSERT);
}

/* Forgets the health of endpoint URLs that no event subscription uses any more. */
void
eg_queue_forget_health(void)
{
	run_plan(PLAN_HEALTH_FORGET, NULL, false, SPI_OK_DELETE);
}
