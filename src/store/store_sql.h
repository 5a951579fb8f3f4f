/*
 * store_sql.h - SQL fragments that several store_*.c statements share,
 * each written once.  The rules themselves live in the schema as SQL
 * functions the planner inlines (eventgrid._chunk_events(),
 * eventgrid._unpassed_events(), eventgrid._in_batch()), so that the
 * workers and the views (eventgrid._pending()) read the queue the same way.
 */
#ifndef EVENTGRID_STORE_SQL_H
#define EVENTGRID_STORE_SQL_H

/*
 * The columns of a delivery authentication a (eventgrid.delivery_authentications)
 * that eg_auth_row_cols() reads, in its order.
 */
#define EG_SQL_AUTH_COLS \
	"a.method, a.token_endpoint, a.tenant_id, a.client_id, a.client_secret, a.scope, a.audience"

/*
 * The events of a chunk c (joined before with its subscription s), as the
 * claim took them: those of its key range in its batch that the filters
 * take.  The first-attempt claim's second step and recovery both read a
 * chunk through this.  OFFSET 0 keeps it a scan of each chunk's own index
 * range (a nested loop under the chunk), whatever the planner believes
 * about the tables' sizes.
 */
#define EG_SQL_CHUNK_EVENTS \
	" CROSS JOIN LATERAL (" \
	"   SELECT ce.* FROM eventgrid._chunk_events(c.topic, c.done, c.upto, c.after_txid, c.after_id," \
	"                                            c.last_txid, c.last_id) ce" \
	"    WHERE eventgrid._matches(ce.event, s.included_event_types_lower, s.subject_begins_with," \
	"                             s.subject_ends_with, s.is_subject_case_sensitive," \
	"                             s.advanced_filters, s.enable_advanced_filtering_on_arrays)" \
	"   OFFSET 0) e"

/* An event e converted to subscription s's delivery schema (topic t), as JSON text. */
#define EG_SQL_PAYLOAD_TEXT \
	"(CASE WHEN t.input_schema = s.event_delivery_schema THEN e.event" \
	"      ELSE eventgrid.convert_event(e.event, t.input_schema, s.event_delivery_schema, e.publish_time) END)::text"

/*
 * Owners of leases: a delivery worker's lease_owner is its pid.  An owner
 * is stale when no delivery worker of this database with that pid runs
 * (pg_stat_activity,
 * read when the statement first needs it, after its snapshot was taken: a
 * worker whose claims the statement sees had started before), or when it
 * is $1, the pid of a delivery worker that is just starting and holds
 * nothing yet ($1 = 0 names no one).  What a stale owner left is taken back.
 */
#define EG_SQL_LIVE_WORKERS \
	"ARRAY(SELECT a.pid FROM pg_catalog.pg_stat_get_activity(NULL::int4) a" \
	"       WHERE a.backend_type = 'eventgrid delivery worker'" \
	"         AND a.datid = (SELECT d.oid FROM pg_catalog.pg_database d" \
	"                         WHERE d.datname = pg_catalog.current_database()))"
#define EG_SQL_STALE_OWNER(col) "(" col " = $1 OR " col " <> ALL (" EG_SQL_LIVE_WORKERS "))"

/*
 * the ids of the event subscriptions whose positions the claim does not
 * take events from but makes receivable where they are
 * (eventgrid._position_to_queue()): queue ones (SPEC 14: pull delivery),
 * whose events consumers read through eventgrid.queue_batches
 */
#define EG_SQL_TRANSFERRED_SUBSCRIPTIONS \
	"SELECT o.id FROM eventgrid.event_subscriptions o WHERE o.delivery_mode = 'queue'"

#endif							/* EVENTGRID_STORE_SQL_H */
