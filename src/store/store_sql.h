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
 * Whether event subscription s (a row of eventgrid.event_subscriptions) is
 * held: paused by pause_delivery() (itself, its topic or domain, or
 * everything), its endpoint not validated, or expired on the workers'
 * clock; what eventgrid._held_subscriptions() lists, asked of one
 * subscription (a claim's cost must not be that of every paused one).
 */
#define EG_SQL_HELD(s) \
	"(EXISTS (SELECT 1 FROM eventgrid.delivery_pauses dp" \
	"          WHERE dp.subscription_id = " s ".id" \
	"             OR (dp.subscription_id IS NULL AND (dp.topic IS NULL OR dp.topic = " s ".topic)))" \
	" OR EXISTS (SELECT 1 FROM eventgrid.endpoint_validations v" \
	"             WHERE v.subscription_id = " s ".id AND v.state <> 'Succeeded')" \
	" OR coalesce(" s ".expiration_time <= eventgrid._now(), false))"

/*
 * A domain topic's read key ('domain/topic', event_subscriptions.read_key)
 * of event e: the expression events_read_key_idx is on, so that only that
 * index serves a domain topic's events (the planner, which knows nothing of
 * a freshly emptied event table, took the (topic, txid, id) index as often
 * when the two were both on offer).
 */
#define EG_SQL_EVENT_READ_KEY "(e.topic || '/' || e.domain_topic)"

/*
 * The topics (table_topics) and domain topics (table_domain_topics, by
 * read key) that the events where cond holds (of event e: e.g. one event
 * table's) are of, as CTEs of a WITH RECURSIVE: loose scans of the (topic,
 * txid, id) and read key indexes, a descent per topic or domain topic,
 * whatever the number of events or event subscriptions (SPEC 20).  What
 * walked every subscription walks these instead: the subscriptions of
 * other topics and domain topics have no events.
 */
#define EG_SQL_READ_KEYS(cond) \
	"table_topics(topic) AS (" \
	"  SELECT x.topic FROM (" \
	"    WITH RECURSIVE r(topic) AS (" \
	"      (SELECT e.topic FROM eventgrid.events e WHERE " cond " ORDER BY e.topic LIMIT 1)" \
	"      UNION ALL" \
	"      SELECT (SELECT e.topic FROM eventgrid.events e" \
	"               WHERE " cond " AND e.topic > r.topic ORDER BY e.topic LIMIT 1)" \
	"        FROM r WHERE r.topic IS NOT NULL)" \
	"    SELECT r.topic FROM r WHERE r.topic IS NOT NULL) x" \
	"), table_domain_topics(read_key) AS (" \
	"  SELECT x.read_key FROM (" \
	"    WITH RECURSIVE r(read_key) AS (" \
	"      (SELECT " EG_SQL_EVENT_READ_KEY " FROM eventgrid.events e" \
	"        WHERE " cond " AND e.domain_topic IS NOT NULL ORDER BY " EG_SQL_EVENT_READ_KEY " LIMIT 1)" \
	"      UNION ALL" \
	"      SELECT (SELECT " EG_SQL_EVENT_READ_KEY " FROM eventgrid.events e" \
	"               WHERE " cond " AND e.domain_topic IS NOT NULL AND " EG_SQL_EVENT_READ_KEY " > r.read_key" \
	"               ORDER BY " EG_SQL_EVENT_READ_KEY " LIMIT 1)" \
	"        FROM r WHERE r.read_key IS NOT NULL)" \
	"    SELECT r.read_key FROM r WHERE r.read_key IS NOT NULL) x" \
	") "

/*
 * The subscription s of domain topic read key k (its topic and domain
 * topic: the unique index on (topic, domain_topic, name)).
 */
#define EG_SQL_READ_KEY_SUBSCRIPTION(s, k) \
	s ".topic = split_part(" k ", '/', 1) AND " s ".domain_topic = substr(" k ", strpos(" k ", '/') + 1)"

/*
 * The event subscriptions s (with their positions p) of the topics and
 * domain topics of EG_SQL_READ_KEYS: a FROM list.  A topic's (or a
 * domain's, every domain topic's events) by the topic, a domain topic's by
 * both names.
 */
#define EG_SQL_KEYED_POSITIONS \
	" (SELECT s.id FROM table_topics k JOIN eventgrid.event_subscriptions s" \
	"     ON s.topic = k.topic AND s.domain_topic IS NULL" \
	"  UNION ALL" \
	"  SELECT s.id FROM table_domain_topics k JOIN eventgrid.event_subscriptions s" \
	"     ON " EG_SQL_READ_KEY_SUBSCRIPTION("s", "k.read_key") ") ks" \
	" JOIN eventgrid.event_subscriptions s ON s.id = ks.id" \
	" JOIN eventgrid.subscription_positions p ON p.subscription_id = s.id "

#endif							/* EVENTGRID_STORE_SQL_H */
