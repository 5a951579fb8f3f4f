-- eventgrid 0.9.0 -> 0.10.0: delivery apart from the application's primary,
-- over PostgreSQL's own logical replication.
--
-- A database that publishes events (INSERT, publish(), table changes) may
-- leave their delivery to another server: a publication of
-- eventgrid.events there, a subscription to it on the delivery server.
-- Rows the logical replication apply worker writes into eventgrid.events
-- are taken over by eventgrid._apply_event() (an ENABLE REPLICA trigger):
-- they get this server's transaction id and an id from this server's
-- sequence, say where they came from (source, source_event_id) and wake the
-- delivery workers when the applied transaction commits.
\echo Use "ALTER EXTENSION eventgrid UPDATE" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Where an event came from

ALTER TABLE eventgrid.events ADD COLUMN source text, ADD COLUMN source_event_id bigint;
COMMENT ON COLUMN eventgrid.events.source IS
    'NULL: published in this database; else the logical replication subscription (CREATE SUBSCRIPTION) that brought the event from another server.';
COMMENT ON COLUMN eventgrid.events.source_event_id IS
    'For an event brought by logical replication: its id on the server that published it (NULL when the publication did not send the id column).';

ALTER TABLE eventgrid.retries ADD COLUMN source text, ADD COLUMN source_event_id bigint;
COMMENT ON COLUMN eventgrid.retries.source IS 'The event''s events.source: NULL, or the logical replication subscription it came through.';
COMMENT ON COLUMN eventgrid.retries.source_event_id IS 'The event''s events.source_event_id: its id on the server that published it.';

ALTER TABLE eventgrid.dead_letters ADD COLUMN source text, ADD COLUMN source_event_id bigint;
COMMENT ON COLUMN eventgrid.dead_letters.source IS
    'NULL: the event was published in this database; else the logical replication subscription that brought it (README "Scaling out").';
COMMENT ON COLUMN eventgrid.dead_letters.source_event_id IS
    'For an event brought by logical replication: its id on the server that published it.';

-- The id of a new event: from eventgrid.events_id_seq, except in a logical
-- replication worker, where NULL says "not sent" to eventgrid._apply_event(),
-- which numbers the row itself.
CREATE FUNCTION eventgrid._new_event_id() RETURNS bigint
    LANGUAGE c VOLATILE
    AS 'MODULE_PATHNAME', 'eventgrid_new_event_id';
COMMENT ON FUNCTION eventgrid._new_event_id() IS
    'Internal: default of events.id: nextval(''eventgrid.events_id_seq''); NULL in a logical replication worker, whose rows eventgrid._apply_event() numbers.';
REVOKE ALL ON FUNCTION eventgrid._new_event_id() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid._new_event_id() TO eventgrid_publisher;
ALTER TABLE eventgrid.events ALTER COLUMN id SET DEFAULT eventgrid._new_event_id();
ALTER TABLE eventgrid.events_0 ALTER COLUMN id SET DEFAULT eventgrid._new_event_id();
ALTER TABLE eventgrid.events_1 ALTER COLUMN id SET DEFAULT eventgrid._new_event_id();
ALTER TABLE eventgrid.events_2 ALTER COLUMN id SET DEFAULT eventgrid._new_event_id();

-- the functions that return events rows return the new columns too; and the
-- row comparison that resumes after a position's last event starts no lower
-- than the scalar bound beside it: a B-tree scan starts at a row comparison
-- rather than at a scalar bound on the same column, so a position with no last
-- event (0, 0) read its topic's index entries from the event table's start
CREATE OR REPLACE FUNCTION eventgrid._chunk_events(topic text, done pg_snapshot, upto pg_snapshot, after_txid xid8,
        after_id bigint, last_txid xid8, last_id bigint) RETURNS SETOF eventgrid.events
    LANGUAGE sql STABLE PARALLEL SAFE
    BEGIN ATOMIC
 SELECT e.id, e.topic, e.event, e.publish_time, e.event_bytes, e.txid, e.event_table, e.source, e.source_event_id
    FROM eventgrid.events e
   WHERE ((e.topic = _chunk_events.topic) AND (e.txid >= pg_snapshot_xmin(_chunk_events.done)) AND (e.txid < _chunk_events.last_txid) AND (ROW(e.txid, e.id) > ROW(GREATEST(_chunk_events.after_txid, pg_snapshot_xmin(_chunk_events.done)), CASE WHEN (_chunk_events.after_txid >= pg_snapshot_xmin(_chunk_events.done)) THEN _chunk_events.after_id ELSE (0)::bigint END)) AND eventgrid._in_batch(e.txid, _chunk_events.done, _chunk_events.upto))
 UNION ALL
  SELECT e.id, e.topic, e.event, e.publish_time, e.event_bytes, e.txid, e.event_table, e.source, e.source_event_id
    FROM eventgrid.events e
   WHERE ((e.topic = _chunk_events.topic) AND (e.txid >= pg_snapshot_xmin(_chunk_events.done)) AND (e.txid = _chunk_events.last_txid) AND (e.id <= _chunk_events.last_id) AND (ROW(e.txid, e.id) > ROW(GREATEST(_chunk_events.after_txid, pg_snapshot_xmin(_chunk_events.done)), CASE WHEN (_chunk_events.after_txid >= pg_snapshot_xmin(_chunk_events.done)) THEN _chunk_events.after_id ELSE (0)::bigint END)) AND eventgrid._in_batch(e.txid, _chunk_events.done, _chunk_events.upto));
END;

CREATE OR REPLACE FUNCTION eventgrid._unpassed_events(topic text, done pg_snapshot, upto pg_snapshot, after_txid xid8,
        after_id bigint) RETURNS SETOF eventgrid.events
    LANGUAGE sql STABLE PARALLEL SAFE
    BEGIN ATOMIC
 SELECT e.id, e.topic, e.event, e.publish_time, e.event_bytes, e.txid, e.event_table, e.source, e.source_event_id
    FROM eventgrid.events e
   WHERE ((e.topic = _unpassed_events.topic) AND (e.txid >= pg_snapshot_xmin(_unpassed_events.done)) AND (ROW(e.txid, e.id) > ROW(GREATEST(_unpassed_events.after_txid, pg_snapshot_xmin(_unpassed_events.done)), CASE WHEN (_unpassed_events.after_txid >= pg_snapshot_xmin(_unpassed_events.done)) THEN _unpassed_events.after_id ELSE (0)::bigint END)) AND (NOT pg_visible_in_snapshot(e.txid, _unpassed_events.done)))
 UNION ALL
  SELECT e.id, e.topic, e.event, e.publish_time, e.event_bytes, e.txid, e.event_table, e.source, e.source_event_id
    FROM eventgrid.events e
   WHERE ((_unpassed_events.upto IS NOT NULL) AND (e.topic = _unpassed_events.topic) AND (e.txid >= GREATEST(pg_snapshot_xmin(_unpassed_events.done), pg_snapshot_xmin(_unpassed_events.upto))) AND (e.txid < _unpassed_events.after_txid) AND (NOT pg_visible_in_snapshot(e.txid, _unpassed_events.done)) AND (NOT pg_visible_in_snapshot(e.txid, _unpassed_events.upto)));
END;

-- parsed again, so that its column list names the new columns too
CREATE OR REPLACE FUNCTION eventgrid._backlog(subscription_id bigint, OUT pending bigint,
        OUT oldest timestamp with time zone, OUT due_since timestamp with time zone) RETURNS record
    LANGUAGE sql STABLE PARALLEL SAFE
    BEGIN ATOMIC
 SELECT u.n + c.n + r.n AS pending,
        LEAST(u.oldest, c.oldest, r.oldest) AS oldest,
        LEAST(u.oldest, c.oldest, r.due_since) AS due_since
   FROM (SELECT count(*) AS n, min(e.publish_time) AS oldest
           FROM eventgrid.subscription_positions p
           JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id
          CROSS JOIN LATERAL eventgrid._unpassed_events(s.topic, p.done, p.upto, p.after_txid, p.after_id) e
          WHERE p.subscription_id = _backlog.subscription_id
            AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with, s.subject_ends_with,
                                   s.is_subject_case_sensitive, s.advanced_filters,
                                   s.enable_advanced_filtering_on_arrays)) u,
        (SELECT count(*) AS n, min(e.publish_time) AS oldest
           FROM eventgrid.chunks_in_flight c
           JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id
          CROSS JOIN LATERAL eventgrid._chunk_events(c.topic, c.done, c.upto, c.after_txid, c.after_id, c.last_txid,
                                                     c.last_id) e
          WHERE c.subscription_id = _backlog.subscription_id
            AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with, s.subject_ends_with,
                                   s.is_subject_case_sensitive, s.advanced_filters,
                                   s.enable_advanced_filtering_on_arrays)) c,
        (SELECT count(*) AS n, min(r.publish_time) AS oldest,
                min(r.next_attempt_at) FILTER (WHERE r.next_attempt_at <= eventgrid._now()) AS due_since
           FROM eventgrid.retries r
          WHERE r.subscription_id = _backlog.subscription_id) r;
END;

-- retries made from a position carry the event's source
CREATE OR REPLACE FUNCTION eventgrid._position_to_retries(sid bigint, due timestamp with time zone, keep boolean) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    snap pg_snapshot := pg_current_snapshot();
    n bigint := 0;
BEGIN
    IF keep THEN
        INSERT INTO eventgrid.retries (subscription_id, event_id, event, payload, publish_time, event_bytes,
                                       attempts, next_attempt_at, source, source_event_id)
        SELECT s.id, e.id, e.event,
               (CASE WHEN t.input_schema = s.event_delivery_schema THEN e.event
                     ELSE eventgrid.convert_event(e.event, t.input_schema, s.event_delivery_schema, e.publish_time) END)::text,
               e.publish_time, coalesce(e.event_bytes, 0), 0, due, e.source, e.source_event_id
          FROM eventgrid.subscription_positions p
          JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id
          JOIN eventgrid.topics t ON t.name = s.topic
         CROSS JOIN LATERAL eventgrid._unpassed_events(s.topic, p.done, p.upto, p.after_txid, p.after_id) e
         WHERE p.subscription_id = sid AND pg_visible_in_snapshot(e.txid, snap)
           AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with, s.subject_ends_with,
                                  s.is_subject_case_sensitive, s.advanced_filters, s.enable_advanced_filtering_on_arrays);
        GET DIAGNOSTICS n = ROW_COUNT;
        UPDATE eventgrid.subscription_counters c SET matched = c.matched + n WHERE c.subscription_id = sid AND n > 0;
    END IF;
    UPDATE eventgrid.subscription_positions p SET done = snap, upto = NULL, after_txid = NULL, after_id = NULL
     WHERE p.subscription_id = sid;
    RETURN n;
END $$;

-- dead letters queued again keep their source
CREATE OR REPLACE FUNCTION eventgrid.redeliver_dead_letters(topic text DEFAULT NULL::text, subscription text DEFAULT NULL::text,
        reason text DEFAULT NULL::text, dead_lettered_after timestamp with time zone DEFAULT NULL::timestamp with time zone,
        dead_lettered_before timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sids bigint[];
    ids bigint[];
    n bigint;
BEGIN
    -- the subscriptions first (the delivery worker's lock order), then the dead letters
    SELECT array_agg(s.id ORDER BY s.id) INTO sids
      FROM (SELECT s.id FROM eventgrid.event_subscriptions s
             WHERE (redeliver_dead_letters.topic IS NULL OR s.topic = redeliver_dead_letters.topic)
               AND (redeliver_dead_letters.subscription IS NULL OR s.name = redeliver_dead_letters.subscription)
             ORDER BY s.id FOR KEY SHARE) s;
    ids := eventgrid._dead_letter_ids(topic, subscription, reason, dead_lettered_after, dead_lettered_before, true);
    WITH gone AS (
        DELETE FROM eventgrid.dead_letters d
         WHERE d.id = ANY (ids) AND d.subscription_id = ANY (sids)
        RETURNING d.*
    ), queued AS (
        -- a fresh start: no attempts made, the time-to-live counted from now
        INSERT INTO eventgrid.retries (subscription_id, event_id, event, payload, publish_time, event_bytes,
                                       attempts, next_attempt_at, source, source_event_id)
        SELECT g.subscription_id, coalesce(g.event_id, 0), g.event,
               eventgrid.convert_event(g.event, g.input_schema, s.event_delivery_schema, g.publish_time)::text,
               eventgrid._now(), octet_length(g.event::text), 0, eventgrid._now(), g.source, g.source_event_id
          FROM gone g JOIN eventgrid.event_subscriptions s ON s.id = g.subscription_id
        RETURNING subscription_id
    ), counted AS (
        SELECT q.subscription_id, count(*) AS n FROM queued q GROUP BY q.subscription_id
    ), bumped AS (
        UPDATE eventgrid.subscription_counters c SET redelivered = c.redelivered + counted.n
          FROM counted WHERE c.subscription_id = counted.subscription_id
    )
    SELECT coalesce(sum(counted.n), 0) INTO n FROM counted;
    IF n > 0 THEN
        PERFORM eventgrid._wake_worker_at_commit();
    END IF;
    RETURN n;
END $$;

CREATE OR REPLACE VIEW eventgrid.dead_letter_events AS
 SELECT d.id,
    d.topic,
    d.subscription_name,
    d.dead_letter_reason,
    d.delivery_attempts,
    d.last_delivery_outcome,
    d.last_http_status_code,
    d.publish_time,
    d.last_delivery_attempt_time,
    d.dead_lettered_at,
        CASE
            WHEN (d.topic_type = 'namespace'::text) THEN jsonb_build_object('deadLetterProperties', jsonb_build_object('deadletterreason',
            CASE d.dead_letter_reason
                WHEN 'MaxDeliveryAttemptsExceeded'::text THEN 'Maximum delivery attempts was exceeded.'::text
                WHEN 'TimeToLiveExceeded'::text THEN 'Time to live was exceeded.'::text
                ELSE 'Delivery failed with an error that is not retried.'::text
            END, 'deliveryattempts', d.delivery_attempts, 'deliveryresult', COALESCE((d.last_delivery_outcome || COALESCE(((' (HTTP '::text || d.last_http_status_code) || ')'::text), ''::text)), 'NotAttempted'::text), 'publishutc', eventgrid.rfc3339(d.publish_time), 'deliveryattemptutc', eventgrid.rfc3339(d.last_delivery_attempt_time)), 'event', d.event)
            WHEN (d.event_delivery_schema = 'CloudEventSchemaV1_0'::text) THEN ((eventgrid.convert_event(d.event, d.input_schema, d.event_delivery_schema, d.publish_time) || jsonb_build_object('deadletterreason', d.dead_letter_reason, 'deliveryattempts', d.delivery_attempts, 'lastdeliveryoutcome', d.last_delivery_outcome, 'publishtime', eventgrid.rfc3339(d.publish_time))) ||
            CASE
                WHEN (d.last_http_status_code IS NULL) THEN '{}'::jsonb
                ELSE jsonb_build_object('lasthttpstatuscode', d.last_http_status_code)
            END)
            WHEN (d.event_delivery_schema = 'EventGridSchema'::text) THEN ((eventgrid.convert_event(d.event, d.input_schema, d.event_delivery_schema, d.publish_time) || jsonb_build_object('deadLetterReason', d.dead_letter_reason, 'deliveryAttempts', d.delivery_attempts, 'lastDeliveryOutcome', d.last_delivery_outcome, 'publishTime', eventgrid.rfc3339(d.publish_time), 'lastDeliveryAttemptTime', eventgrid.rfc3339(d.last_delivery_attempt_time))) ||
            CASE
                WHEN (d.last_http_status_code IS NULL) THEN '{}'::jsonb
                ELSE jsonb_build_object('lastHttpStatusCode', d.last_http_status_code)
            END)
            ELSE (jsonb_build_object('id', d.envelope_id, 'eventTime', eventgrid.rfc3339(d.publish_time), 'eventType', 'CustomEvent', 'dataVersion', '', 'metadataVersion', '1', 'topic', d.topic, 'subject', '', 'deadLetterReason', d.dead_letter_reason, 'deliveryAttempts', d.delivery_attempts, 'lastDeliveryOutcome', d.last_delivery_outcome, 'publishTime', eventgrid.rfc3339(d.publish_time), 'lastDeliveryAttemptTime', eventgrid.rfc3339(d.last_delivery_attempt_time), 'data', d.event) ||
            CASE
                WHEN (d.last_http_status_code IS NULL) THEN '{}'::jsonb
                ELSE jsonb_build_object('lastHttpStatusCode', d.last_http_status_code)
            END)
        END AS dead_letter_event,
    d.event_id,
    d.source,
    d.source_event_id
   FROM eventgrid.dead_letters d;

COMMENT ON VIEW eventgrid.dead_letter_events IS 'Dead-lettered events, each as the JSON document Event Grid writes for its delivery schema (SPEC 7): Event Grid schema with camelCase deadLetterReason, deliveryAttempts, lastDeliveryOutcome, lastHttpStatusCode, publishTime, lastDeliveryAttemptTime; CloudEvents with lowercase attributes; custom schema wrapped in an Event Grid envelope with the event as data. Namespace topics: {"deadLetterProperties": {deadletterreason (a sentence), deliveryattempts, deliveryresult (last outcome and HTTP status, or NotAttempted), publishutc, deliveryattemptutc}, "event": the CloudEvent}. source and source_event_id: for an event brought by logical replication, the subscription it came through and its id on the server that published it (README "Scaling out").';

-- the attempt history names the source of each event that has one
ALTER TABLE eventgrid.attempt_log ADD COLUMN event_sources text[];
COMMENT ON COLUMN eventgrid.attempt_log.event_sources IS
    'Parallel to event_ids: the logical replication subscription each event came through (NULL: published here); NULL when none came so.';
CREATE OR REPLACE VIEW eventgrid.delivery_attempts AS
 SELECT a.id, a.attempted_at, a.topic, a.subscription_name AS subscription, a.event_ids, a.attempt, a.http_status,
        a.outcome, a.duration_ms, a.error, a.response_body, a.event_sources
   FROM eventgrid.attempt_log a;
COMMENT ON VIEW eventgrid.delivery_attempts IS 'Delivery attempt history: one row per attempt (one HTTP request; a batch names all its events): id, when it started (attempted_at, on the worker''s clock), topic, event subscription, event_ids (the ids publish() returned), attempt (1 for the first; for a batch, its first event''s, the aeg-delivery-count header plus 1), http_status (NULL: no HTTP answer), outcome (the outcome names of SPEC 3: Delivered, GenericError, Busy, NotFound, TimedOut, SocketError, ResolutionError, ...; Probation for an attempt that delayed delivery held back; Aborted for a request in flight when the worker stopped), duration_ms (libcurl''s total time of the request), error (libcurl''s message when there was no HTTP answer; for a failed answer with Retry-After, what it asked for), response_body (the first 512 bytes of a failed answer''s body, bytes outside printable ASCII as ?; NULL for a success or no body), event_sources (parallel to event_ids, for events brought by logical replication: the subscription each came through, NULL for one published here; NULL when none was: README "Scaling out"). Kept per GUC eventgrid.attempt_history (all, failures, off) for eventgrid.attempt_history_retention and eventgrid.attempt_history_max_rows. An attempt whose outcome was not yet written when the worker stopped shows as Aborted.';

-- ---------------------------------------------------------------------------
-- Rows applied by logical replication

CREATE TABLE eventgrid.replication_progress (
    source text PRIMARY KEY,
    transactions bigint NOT NULL DEFAULT 0,
    last_publish_time timestamp with time zone,
    last_applied_at timestamp with time zone
);
COMMENT ON TABLE eventgrid.replication_progress IS
    'Internal: per logical replication subscription feeding eventgrid.events, the transactions applied, the publish time of the last applied transaction''s first event and when it was applied; the apply worker writes it at most once a second. Read through eventgrid.replication_sources.';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.replication_progress', '');

CREATE TABLE eventgrid.unknown_topic_events (
    source text NOT NULL,
    topic text NOT NULL,
    events bigint NOT NULL DEFAULT 0,
    first_at timestamp with time zone NOT NULL DEFAULT now(),
    last_at timestamp with time zone NOT NULL DEFAULT now(),
    PRIMARY KEY (source, topic)
);
COMMENT ON TABLE eventgrid.unknown_topic_events IS
    'Events logical replication brought for a topic this database does not have: per subscription (source) and topic, how many, first and last seen. They are kept in the event tables like unmatched events (no event subscription can take them) and never stop replication; create the topic (eventgrid.create_topic) with the input schema it has on the publishing server. README "Scaling out".';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.unknown_topic_events', '');

CREATE FUNCTION eventgrid._apply_event() RETURNS trigger
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_apply_event';
COMMENT ON FUNCTION eventgrid._apply_event() IS
    'Internal: BEFORE INSERT row trigger on eventgrid.events, enabled for replica sessions only (ENABLE REPLICA): a row a logical replication worker applies gets this server''s transaction id and an id from this server''s sequence (the sent id is kept as source_event_id), source = the subscription''s name, publish time and size when not sent; a topic this database lacks is counted in eventgrid.unknown_topic_events; the delivery workers are woken when the applied transaction commits. Rows of other replica sessions (restores) are stored as they are.';
REVOKE ALL ON FUNCTION eventgrid._apply_event() FROM PUBLIC;

CREATE TRIGGER events_apply BEFORE INSERT ON eventgrid.events
    FOR EACH ROW EXECUTE FUNCTION eventgrid._apply_event();
ALTER TABLE eventgrid.events ENABLE REPLICA TRIGGER events_apply;
ALTER TABLE eventgrid.events_0 ENABLE REPLICA TRIGGER events_apply;
ALTER TABLE eventgrid.events_1 ENABLE REPLICA TRIGGER events_apply;
ALTER TABLE eventgrid.events_2 ENABLE REPLICA TRIGGER events_apply;

-- What feeds this database (the delivery server's side)
CREATE FUNCTION eventgrid._replication_sources(OUT source text, OUT enabled boolean, OUT apply_pid integer,
        OUT transactions bigint, OUT last_publish_time timestamp with time zone,
        OUT last_applied_at timestamp with time zone, OUT apply_lag_seconds double precision,
        OUT received_lsn pg_lsn, OUT last_msg_receipt_time timestamp with time zone,
        OUT unknown_topic_events bigint) RETURNS SETOF record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT s.subname::text, s.subenabled, st.pid, coalesce(p.transactions, 0), p.last_publish_time, p.last_applied_at,
        coalesce(extract(epoch FROM p.last_applied_at - p.last_publish_time)::float8, 0),
        st.received_lsn, st.last_msg_receipt_time,
        (SELECT coalesce(sum(u.events), 0)::bigint FROM eventgrid.unknown_topic_events u WHERE u.source = s.subname)
   FROM pg_subscription s
   LEFT JOIN pg_stat_subscription st ON st.subid = s.oid AND st.relid IS NULL
   LEFT JOIN eventgrid.replication_progress p ON p.source = s.subname
  WHERE s.subdbid = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database());
END;
COMMENT ON FUNCTION eventgrid._replication_sources() IS 'Internal: the rows of the view eventgrid.replication_sources.';
REVOKE ALL ON FUNCTION eventgrid._replication_sources() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid._replication_sources() TO pg_monitor, eventgrid_admin;

CREATE VIEW eventgrid.replication_sources AS
 SELECT * FROM eventgrid._replication_sources();
COMMENT ON VIEW eventgrid.replication_sources IS
    'Delivery server side of README "Scaling out": each logical replication subscription of this database (CREATE SUBSCRIPTION ... PUBLICATION <a publication of eventgrid.events>): source (its name, also events.source and dead_letters.source), enabled, apply_pid (NULL: its apply worker does not run, e.g. the publishing server is unreachable or the subscription is disabled), transactions applied with events (written at most once a second), last_publish_time (publish time of the last applied transaction''s first event), last_applied_at, apply_lag_seconds (how long that event took from its publish to being applied here: the replication hop, larger while a backlog drains; 0 before any), received_lsn and last_msg_receipt_time (pg_stat_subscription), unknown_topic_events (events it brought for topics this database lacks; see eventgrid.unknown_topic_events). Readable by pg_monitor and eventgrid_admin.';
REVOKE ALL ON TABLE eventgrid.replication_sources FROM PUBLIC;
GRANT SELECT ON TABLE eventgrid.replication_sources TO pg_monitor, eventgrid_admin;
REVOKE ALL ON TABLE eventgrid.unknown_topic_events FROM PUBLIC;
GRANT SELECT ON TABLE eventgrid.unknown_topic_events TO pg_monitor, eventgrid_admin;

-- What this database feeds (the application server's side)
CREATE FUNCTION eventgrid._replication_slots(OUT slot_name text, OUT active boolean, OUT active_pid integer,
        OUT lag_bytes numeric, OUT retained_bytes numeric, OUT replay_lag_seconds double precision)
        RETURNS SETOF record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT r.slot_name::text, r.active, r.active_pid,
        CASE WHEN NOT pg_is_in_recovery() THEN pg_wal_lsn_diff(pg_current_wal_lsn(), r.confirmed_flush_lsn) END,
        CASE WHEN NOT pg_is_in_recovery() THEN pg_wal_lsn_diff(pg_current_wal_lsn(), r.restart_lsn) END,
        coalesce(extract(epoch FROM a.replay_lag)::float8, 0)
   FROM pg_replication_slots r
   LEFT JOIN pg_stat_replication a ON a.pid = r.active_pid
  WHERE r.slot_type = 'logical' AND r.plugin = 'pgoutput' AND r.database = current_database();
END;
COMMENT ON FUNCTION eventgrid._replication_slots() IS 'Internal: the rows of the view eventgrid.replication_slots.';
REVOKE ALL ON FUNCTION eventgrid._replication_slots() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid._replication_slots() TO pg_monitor, eventgrid_admin;

CREATE VIEW eventgrid.replication_slots AS
 SELECT * FROM eventgrid._replication_slots();
COMMENT ON VIEW eventgrid.replication_slots IS
    'Application server side of README "Scaling out": each logical replication slot (pgoutput) of this database, one per delivery server subscribed: slot_name, active (a delivery server is connected), active_pid, lag_bytes (WAL written here that the delivery server has not confirmed yet), retained_bytes (WAL the slot keeps on this server''s disk; grows while a delivery server is away), replay_lag_seconds (pg_stat_replication.replay_lag: how long the last changes took to be applied there; 0 when caught up or not connected). Readable by pg_monitor and eventgrid_admin.';
REVOKE ALL ON TABLE eventgrid.replication_slots FROM PUBLIC;
GRANT SELECT ON TABLE eventgrid.replication_slots TO pg_monitor, eventgrid_admin;

-- The standard publication of events, in one statement
CREATE FUNCTION eventgrid.create_event_publication(name text, topics text[] DEFAULT NULL) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    missing text;
BEGIN
    IF name IS NULL THEN
        RAISE EXCEPTION 'name of an event publication must not be NULL' USING ERRCODE = '22004';
    ELSIF name = '' THEN
        RAISE EXCEPTION 'name of an event publication must not be empty' USING ERRCODE = '22023',
            HINT = 'Name it as CREATE PUBLICATION would, e.g. eventgrid_events.';
    END IF;
    IF topics IS NOT NULL THEN
        IF cardinality(topics) = 0 OR array_position(topics, NULL) IS NOT NULL THEN
            RAISE EXCEPTION 'topics must be NULL (every topic) or a non-empty list of topic names without NULL'
                USING ERRCODE = '22023';
        END IF;
        SELECT string_agg(format('%L', x), ', ') INTO missing
          FROM unnest(topics) x WHERE NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = x);
        IF missing IS NOT NULL THEN
            RAISE EXCEPTION 'topic % does not exist', missing USING ERRCODE = '42704',
                HINT = 'Create it with eventgrid.create_topic() first, here and on the delivery server.';
        END IF;
    END IF;
    EXECUTE format('CREATE PUBLICATION %I FOR TABLE eventgrid.events (id, topic, event, publish_time, event_bytes)%s'
                   ' WITH (publish = ''insert'', publish_via_partition_root = true)',
                   name,
                   CASE WHEN topics IS NULL THEN ''
                        ELSE format(' WHERE (topic IN (%s))',
                                    (SELECT string_agg(format('%L', x), ', ') FROM unnest(topics) x)) END);
END $$;
COMMENT ON FUNCTION eventgrid.create_event_publication(text, text[]) IS
    'Creates the publication a delivery server subscribes to (README "Scaling out"): CREATE PUBLICATION name FOR TABLE eventgrid.events (id, topic, event, publish_time, event_bytes) [WHERE (topic IN (topics))] WITH (publish = ''insert'', publish_via_partition_root = true). topics: NULL for every topic, else the topics whose events this publication carries (row filter; for splitting topics across delivery servers). Needs the privileges of CREATE PUBLICATION (the owner of eventgrid.events: a superuser). Errors: 22004 NULL name, 22023 empty name or topics list, 42704 unknown topic; 42710 a publication of that name exists.';
REVOKE ALL ON FUNCTION eventgrid.create_event_publication(text, text[]) FROM PUBLIC;

-- A publication that would replicate TRUNCATE (the rotation) or the event
-- tables one by one would empty or break a delivery server's event tables:
-- refused.  Publications of every table only get a warning.
CREATE FUNCTION eventgrid._check_event_publications() RETURNS event_trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    p record;
BEGIN
    FOR p IN
        SELECT pub.pubname, pub.puballtables, pub.pubviaroot, pub.pubinsert, pub.pubupdate, pub.pubdelete,
               pub.pubtruncate,
               EXISTS (SELECT 1 FROM pg_publication_rel pr
                        WHERE pr.prpubid = pub.oid
                          AND pr.prrelid IN ('eventgrid.events'::regclass, 'eventgrid.events_0'::regclass,
                                             'eventgrid.events_1'::regclass, 'eventgrid.events_2'::regclass)) AS named,
               EXISTS (SELECT 1 FROM pg_publication_namespace pn
                        WHERE pn.pnpubid = pub.oid AND pn.pnnspid = 'eventgrid'::regnamespace) AS in_schema
          FROM pg_publication pub
    LOOP
        IF p.named AND (p.pubtruncate OR p.pubupdate OR p.pubdelete OR NOT p.pubviaroot) THEN
            RAISE EXCEPTION 'publication "%" of eventgrid.events must publish inserts only, through the partitioned table',
                            p.pubname
                USING ERRCODE = '22023',
                DETAIL = 'The event tables are emptied with TRUNCATE as they rotate; replicated, that would empty a delivery server''s event tables, and row by row they would not fit its rotation.',
                HINT = 'CREATE PUBLICATION ... FOR TABLE eventgrid.events (id, topic, event, publish_time, event_bytes) WITH (publish = ''insert'', publish_via_partition_root = true), or SELECT eventgrid.create_event_publication(name, topics).';
        ELSIF (p.puballtables OR p.in_schema) AND p.pubtruncate THEN
            RAISE WARNING 'publication "%" replicates TRUNCATE of eventgrid''s event tables', p.pubname
                USING HINT = 'A database with eventgrid must not subscribe to it; use a publication of eventgrid.events with publish = ''insert'' (README "Scaling out").';
        END IF;
    END LOOP;
END $$;
COMMENT ON FUNCTION eventgrid._check_event_publications() IS
    'Internal: ddl_command_end event trigger on CREATE and ALTER PUBLICATION: refuses (22023) a publication of eventgrid.events that publishes UPDATE, DELETE or TRUNCATE or publishes the event tables one by one (publish_via_partition_root = false); warns about publications of every table or of schema eventgrid that replicate TRUNCATE.';
REVOKE ALL ON FUNCTION eventgrid._check_event_publications() FROM PUBLIC;

CREATE EVENT TRIGGER eventgrid_check_event_publications ON ddl_command_end
         WHEN TAG IN ('CREATE PUBLICATION', 'ALTER PUBLICATION')
   EXECUTE FUNCTION eventgrid._check_event_publications();
COMMENT ON EVENT TRIGGER eventgrid_check_event_publications IS
    'eventgrid: refuses publications of eventgrid.events that would replicate the rotation''s TRUNCATE or the event tables one by one (README "Scaling out").';

-- A database with no event subscription (an application server whose
-- events are delivered elsewhere) wakes no delivery worker at each commit
-- (the upkeep worker notes it in shared memory); a subscription created
-- clears the note when its transaction commits, as a change does.
CREATE FUNCTION eventgrid._subscriptions_created() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM eventgrid._subscriptions_changed_at_commit();
    RETURN NULL;
END $$;
COMMENT ON FUNCTION eventgrid._subscriptions_created() IS
    'Internal: AFTER INSERT statement trigger on eventgrid.event_subscriptions: tells the workers at commit that the database has event subscriptions (commits that publish wake the delivery workers again).';
REVOKE ALL ON FUNCTION eventgrid._subscriptions_created() FROM PUBLIC;
CREATE TRIGGER event_subscriptions_created AFTER INSERT ON eventgrid.event_subscriptions
    FOR EACH STATEMENT EXECUTE FUNCTION eventgrid._subscriptions_created();

-- the wake-up of a commit that publishes is told apart from other wake-ups:
-- it needs no delivery worker while the database has no event subscription
CREATE OR REPLACE FUNCTION eventgrid._wake_at_commit() RETURNS trigger
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_wake_at_commit';
COMMENT ON FUNCTION eventgrid._wake_at_commit() IS
    'Internal: AFTER INSERT statement trigger on eventgrid.events; when the publishing transaction commits, wakes (or starts) the delivery workers, unless the database has no event subscription, and tells the upkeep worker (SPEC 2).';

-- Table change triggers keep what they looked up of their publication for
-- the next statements; a change of eventgrid.table_publications tells them
-- it is stale (in the session at once, everywhere at commit).
CREATE FUNCTION eventgrid._table_publications_changed() RETURNS trigger
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_table_publications_changed';
COMMENT ON FUNCTION eventgrid._table_publications_changed() IS
    'Internal: AFTER INSERT, UPDATE, DELETE or TRUNCATE statement trigger on eventgrid.table_publications: what the table change triggers keep of their publications is looked up again (in this session at once, in the others once the transaction commits).';
REVOKE ALL ON FUNCTION eventgrid._table_publications_changed() FROM PUBLIC;
CREATE TRIGGER table_publications_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON eventgrid.table_publications
    FOR EACH STATEMENT EXECUTE FUNCTION eventgrid._table_publications_changed();

-- worker_status shows the apply workers that bring this database its events
CREATE OR REPLACE FUNCTION eventgrid._worker_status(OUT worker text, OUT pid integer, OUT state text, OUT activity text,
        OUT state_since timestamp with time zone, OUT wait_event_type text, OUT wait_event text,
        OUT backend_start timestamp with time zone) RETURNS SETOF record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT w.worker, w.pid, a.state, a.query, a.state_change, a.wait_event_type, a.wait_event, a.backend_start
    FROM (eventgrid._worker_pids() w(worker, pid)
      LEFT JOIN pg_stat_activity a ON ((a.pid = w.pid)))
 UNION ALL
 SELECT 'logical replication apply worker of subscription ' || r.source, r.apply_pid,
        CASE WHEN r.apply_pid IS NULL THEN NULL ELSE coalesce(a.state, 'active') END,
        CASE WHEN NOT r.enabled THEN 'subscription disabled'
             WHEN r.apply_pid IS NULL THEN 'not running: the publishing server is unreachable or the last apply failed (see the server log)'
             ELSE format('applies events; last applied at %s, %s s after their publish', r.last_applied_at,
                         round(r.apply_lag_seconds::numeric, 3)) END,
        a.state_change, a.wait_event_type, a.wait_event, a.backend_start
    FROM eventgrid._replication_sources() r
    LEFT JOIN pg_stat_activity a ON a.pid = r.apply_pid;
END;

COMMENT ON VIEW eventgrid.worker_status IS 'Each eventgrid worker of this database (delivery worker 1..eventgrid.delivery_workers, upkeep worker) and each logical replication apply worker that brings it events (README "Scaling out"): pid (NULL when it does not run: eventgrid''s workers run only while the database has work), state (idle or active), activity (its status line: what it delivers, waits for or failed at; for an apply worker, when it last applied events and their apply lag), state_since, wait_event_type, wait_event, backend_start. Readable by eventgrid_admin, which pg_stat_activity would show only <insufficient privilege>. eventgrid.served_databases shows every database''s.';
