-- eventgrid 0.10.0 -> 0.11.0: at-least-once without conditions (the third
-- pass over what a hostile role, a hostile publisher and a new user's
-- scale-out found in 0.10.0).
\echo Use "ALTER EXTENSION eventgrid UPDATE" to load this file. \quit

-- ---------------------------------------------------------------------------
-- The claim scans of 0.10.0 as they landed last (installations made from an
-- earlier build of 0.10.0 have the bodies that start at the event table's
-- first entry; the same bodies again are harmless elsewhere)
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

-- ---------------------------------------------------------------------------
-- Dead-letter notifications that always fit: the fields of the event the
-- notification repeats (id, subject, event type) are cut to 1,024 characters
-- each, so that with the event itself (kept up to 900 kB) it stays within the
-- 1 MB event limit whatever the event; and eventgrid's own notifications are
-- told apart by their origin (events.source = '(dead-letter notification)',
-- a column no publisher may write), not by an event type any publisher can
-- give its events
DROP FUNCTION eventgrid._dead_letter_notification(text, text, text, jsonb, text, boolean, text, integer, text,
        integer, timestamptz, timestamptz);
CREATE FUNCTION eventgrid._dead_letter_notification(target_topic text, topic text, subscription text, event jsonb,
        input_schema text, dead_lettered boolean, reason text, attempts integer, outcome text, http_status integer,
        publish_time timestamptz, attempted_at timestamptz, event_source text)
    RETURNS TABLE(notification_topic text, notification jsonb)
    LANGUAGE sql
    SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH src AS (
        SELECT left(CASE WHEN _dead_letter_notification.input_schema = 'CloudEventSchemaV1_0'
                         THEN _dead_letter_notification.event ->> 'type'
                         ELSE _dead_letter_notification.event ->> 'eventType' END, 1024) AS event_type,
               left(_dead_letter_notification.event ->> 'id', 1024) AS id,
               left(_dead_letter_notification.event ->> 'subject', 1024) AS subject
    ), d AS (
        SELECT jsonb_strip_nulls(jsonb_build_object(
                   'topic', _dead_letter_notification.topic,
                   'eventSubscription', _dead_letter_notification.subscription,
                   'id', src.id, 'eventType', src.event_type, 'subject', src.subject,
                   'deadLetterReason', _dead_letter_notification.reason,
                   'deliveryAttempts', _dead_letter_notification.attempts,
                   'lastDeliveryOutcome', _dead_letter_notification.outcome,
                   'lastHttpStatusCode', nullif(_dead_letter_notification.http_status, 0),
                   'publishTime', eventgrid.rfc3339(_dead_letter_notification.publish_time),
                   'lastDeliveryAttemptTime', eventgrid.rfc3339(_dead_letter_notification.attempted_at)))
               || CASE WHEN octet_length(_dead_letter_notification.event::text) <= 900 * 1024
                       THEN jsonb_build_object('event', _dead_letter_notification.event)
                       ELSE jsonb_build_object('eventOmitted',
                                'larger than 900 kB: the notification must stay within the 1 MB event limit')
                  END AS data,
               CASE WHEN _dead_letter_notification.dead_lettered THEN 'Eventgrid.EventSubscription.EventDeadLettered'
                    ELSE 'Eventgrid.EventSubscription.EventDropped' END AS type,
               '/topics/' || _dead_letter_notification.topic || '/eventSubscriptions/'
                   || _dead_letter_notification.subscription AS source,
               coalesce(src.id, '') AS event_id
          FROM src
    )
    SELECT t.name AS notification_topic,
           CASE WHEN t.input_schema = 'CloudEventSchemaV1_0'
                THEN jsonb_build_object('specversion', '1.0', 'id', gen_random_uuid()::text, 'source', d.source,
                         'type', d.type, 'subject', d.event_id, 'time', eventgrid.rfc3339(now()),
                         'datacontenttype', 'application/json', 'data', d.data)
                ELSE jsonb_build_object('id', gen_random_uuid()::text, 'subject', d.source || '/events/' || d.event_id,
                         'eventType', d.type, 'eventTime', eventgrid.rfc3339(now()), 'dataVersion', '1.0',
                         'data', d.data)
           END AS notification
      FROM d, eventgrid.topics t
     WHERE t.name = _dead_letter_notification.target_topic
       AND _dead_letter_notification.event_source IS DISTINCT FROM '(dead-letter notification)';
END;
COMMENT ON FUNCTION eventgrid._dead_letter_notification(text, text, text, jsonb, text, boolean, text, integer, text,
        integer, timestamptz, timestamptz, text) IS
    'Internal: the notification event of an event dead-lettered (or, dead_lettered false, dropped) by an event subscription whose dead_letter_topic is target_topic, in that topic''s input schema, with what the dead letter records (the event''s id, subject and type cut to 1,024 characters each) and the event itself (up to 900 kB), so that it always fits the 1 MB event limit; no row for a notification that itself ended undelivered (event_source ''(dead-letter notification)'', which the delivery workers give the notifications they publish and publishers cannot write), or when the topic is gone. The delivery workers publish it in the transaction that records the dead letter.';
REVOKE ALL ON FUNCTION eventgrid._dead_letter_notification(text, text, text, jsonb, text, boolean, text, integer, text,
        integer, timestamptz, timestamptz, text) FROM PUBLIC;
COMMENT ON COLUMN eventgrid.events.source IS 'NULL: published in this database; ''(dead-letter notification)'': a dead-letter notification the delivery workers published (README "Dead-letter notifications"); else the logical replication subscription (CREATE SUBSCRIPTION) that brought the event from another server.';
COMMENT ON COLUMN eventgrid.retries.source IS 'The event''s events.source: NULL, ''(dead-letter notification)'', or the logical replication subscription it came through.';
COMMENT ON COLUMN eventgrid.dead_letters.source IS 'NULL: the event was published in this database; ''(dead-letter notification)'': a dead-letter notification the delivery workers published; else the logical replication subscription that brought it (README "Scaling out").';

-- ---------------------------------------------------------------------------
-- An empty event type in included_event_types is refused (it matched nothing)
CREATE OR REPLACE FUNCTION eventgrid._check_subscription_settings(input_schema text, topic_type text, endpoint text, event_delivery_schema text, included_event_types text[], is_subject_case_sensitive boolean, deadletter boolean, enable_advanced_filtering_on_arrays boolean, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, max_events_per_second integer) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM eventgrid._check_endpoint(endpoint);
    PERFORM eventgrid._check_schema('event_delivery_schema', event_delivery_schema);
    IF (input_schema = 'CustomEventSchema') <> (event_delivery_schema = 'CustomEventSchema') THEN
        RAISE EXCEPTION 'event_delivery_schema % is not available for a topic with input schema %',
                        event_delivery_schema, input_schema
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'EventGridSchema and CloudEventSchemaV1_0 map to each other; CustomEventSchema is delivered only as CustomEventSchema.';
    END IF;
    IF topic_type = 'namespace' AND event_delivery_schema <> 'CloudEventSchemaV1_0' THEN
        RAISE EXCEPTION 'event_delivery_schema % is not available for a namespace topic', event_delivery_schema
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A namespace topic delivers CloudEvents 1.0 only: omit event_delivery_schema.';
    END IF;
    IF included_event_types IS NOT NULL AND
       (cardinality(included_event_types) = 0 OR array_position(included_event_types, NULL) IS NOT NULL) THEN
        RAISE EXCEPTION 'included_event_types must be NULL (all types) or a non-empty array without NULLs'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT FROM unnest(included_event_types) AS t(v) WHERE btrim(t.v) = '') THEN
        RAISE EXCEPTION 'included_event_types must not hold an empty event type'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Name each event type to deliver, e.g. ARRAY[''Shop.OrderCreated''] (matched case-insensitively with eventType, or type for CloudEvents); NULL delivers all types.';
    END IF;
    IF is_subject_case_sensitive IS NULL OR deadletter IS NULL OR enable_advanced_filtering_on_arrays IS NULL THEN
        RAISE EXCEPTION 'is_subject_case_sensitive, deadletter and enable_advanced_filtering_on_arrays must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM eventgrid._check_range('max_events_per_batch', max_events_per_batch, 1, 5000);
    PERFORM eventgrid._check_range('preferred_batch_size_in_kilobytes', preferred_batch_size_in_kilobytes, 1, 1024, ' kilobytes');
    PERFORM eventgrid._check_range('max_events_per_second', max_events_per_second, 1, 100000, ' events a second');
END $$;

-- ---------------------------------------------------------------------------
-- A publication naming an event table by itself is refused, whatever its
-- options and whether CREATE or ALTER PUBLICATION (ADD or SET TABLE) names it
CREATE OR REPLACE FUNCTION eventgrid._check_event_publications() RETURNS event_trigger
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
               (SELECT min(pr.prrelid::regclass::text) FROM pg_publication_rel pr
                 WHERE pr.prpubid = pub.oid
                   AND pr.prrelid IN ('eventgrid.events_0'::regclass, 'eventgrid.events_1'::regclass,
                                      'eventgrid.events_2'::regclass)) AS event_table,
               EXISTS (SELECT 1 FROM pg_publication_namespace pn
                        WHERE pn.pnpubid = pub.oid AND pn.pnnspid = 'eventgrid'::regnamespace) AS in_schema
          FROM pg_publication pub
    LOOP
        IF p.event_table IS NOT NULL THEN
            RAISE EXCEPTION 'publication "%" names the event table % by itself', p.pubname, p.event_table
                USING ERRCODE = '22023',
                DETAIL = 'Each event table holds the events of one turn of the rotation: published alone, a delivery server would get some events and miss the others.',
                HINT = 'Publish the partitioned table: CREATE PUBLICATION ... FOR TABLE eventgrid.events (id, topic, event, publish_time, event_bytes) WITH (publish = ''insert'', publish_via_partition_root = true), or SELECT eventgrid.create_event_publication(name, topics).';
        ELSIF p.named AND (p.pubtruncate OR p.pubupdate OR p.pubdelete OR NOT p.pubviaroot) THEN
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
COMMENT ON FUNCTION eventgrid._check_event_publications() IS 'Internal: ddl_command_end event trigger on CREATE and ALTER PUBLICATION: refuses (22023) a publication that names an event table (eventgrid.events_0, _1, _2) by itself, and one of eventgrid.events that publishes UPDATE, DELETE or TRUNCATE or publishes the event tables one by one (publish_via_partition_root = false); warns about publications of every table or of schema eventgrid that replicate TRUNCATE.';

-- ---------------------------------------------------------------------------
-- Replicated rows are events: the delivery server checks each applied row
-- as a publish would (a JSON object, the topic's schema, no control
-- characters in the fields sent as headers, at most 1 MB, its size made
-- here whatever was sent) and keeps the ones a publish would refuse apart,
-- without stopping replication
CREATE TABLE eventgrid.rejected_events (
    id bigserial PRIMARY KEY,
    source text NOT NULL,
    source_event_id bigint,
    topic text,
    event jsonb,
    reason text NOT NULL,
    rejected_at timestamp with time zone NOT NULL DEFAULT now()
);
COMMENT ON TABLE eventgrid.rejected_events IS
    'Rows logical replication brought into eventgrid.events that a publish here would have refused (not a JSON object, a required field of the topic''s schema missing, a control character in a field sent as a header, over 1 MB, no topic or no event): source (the subscription), source_event_id (the id it had where it was published, when sent), topic, event (as it came), reason (the error a publish would have raised), rejected_at. They are not delivered; replication goes on. Readable by pg_monitor and eventgrid_admin, who may delete rows once seen. README "Scaling out".';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.rejected_events', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.rejected_events_id_seq', '');
REVOKE ALL ON TABLE eventgrid.rejected_events FROM PUBLIC;
GRANT SELECT ON TABLE eventgrid.rejected_events TO pg_monitor;
GRANT SELECT, DELETE ON TABLE eventgrid.rejected_events TO eventgrid_admin;

COMMENT ON FUNCTION eventgrid._apply_event() IS
    'Internal: BEFORE INSERT row trigger on eventgrid.events, enabled for replica sessions only (ENABLE REPLICA): a row a logical replication worker applies is checked as a publish would check it (one that would be refused is kept in eventgrid.rejected_events instead, and replication goes on), then gets this server''s transaction id and an id from this server''s sequence (the sent id is kept as source_event_id), source = the subscription''s name, the event stamped and its size made here, the publish time when not sent; a topic this database lacks is counted in eventgrid.unknown_topic_events; the delivery workers are woken when the applied transaction commits. Rows of other replica sessions (restores) are stored as they are.';

-- ---------------------------------------------------------------------------
-- No event lost while a delivery server synchronizes: until a subscriber's
-- initial copy of eventgrid.events has succeeded, its apply worker passes
-- over the rows it is sent, counting on the copy to hold them, so no event
-- table is emptied (1) while a copy is in progress (its table
-- synchronization slot, pg_<subscription oid>_sync_<table oid>_<system id>,
-- exists), and (2) while a subscription's own slot has not streamed for
-- eventgrid.replication_sync_wait: it exists from CREATE SUBSCRIPTION, its
-- copy starts only once it streams.  The upkeep worker notes the slots it
-- sees, and its own statement does the same (src/store/store_rotation.c).
CREATE TABLE eventgrid.replication_slot_sightings (
    slot_name name PRIMARY KEY,
    first_seen_at timestamp with time zone NOT NULL,
    streaming_since timestamp with time zone
);
COMMENT ON TABLE eventgrid.replication_slot_sightings IS
    'Internal: the logical replication slots (plugin pgoutput, other than table synchronization slots) of this database the upkeep worker has seen, when it first saw each, and since when it has seen each stream without a break (streaming_since; NULL: not streaming). No event table is emptied while a slot has streamed for less than eventgrid.replication_sync_wait: its subscriber''s initial copy may be to come. Read through eventgrid.event_tables.';
REVOKE ALL ON TABLE eventgrid.replication_slot_sightings FROM PUBLIC;
GRANT SELECT ON TABLE eventgrid.replication_slot_sightings TO eventgrid_admin;

CREATE OR REPLACE FUNCTION eventgrid._event_table_holders(event_table smallint) RETURNS text[]
    LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
    SELECT array_agg(DISTINCT h.holder ORDER BY h.holder)
      FROM (SELECT format('event subscription %s of topic %s', s.name, s.topic) AS holder
              FROM eventgrid.subscription_positions p JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id
             WHERE EXISTS (SELECT 1 FROM eventgrid.events e
                            WHERE e.event_table = _event_table_holders.event_table AND e.topic = s.topic
                              AND e.txid >= pg_snapshot_xmin(p.done) AND NOT pg_visible_in_snapshot(e.txid, p.done))
            UNION ALL
            SELECT format('first attempts in flight for topic %s', c.topic)
              FROM eventgrid.chunks_in_flight c
             WHERE EXISTS (SELECT 1 FROM eventgrid.events e
                            WHERE e.event_table = _event_table_holders.event_table AND e.topic = c.topic
                              AND e.txid >= pg_snapshot_xmin(c.done) AND NOT pg_visible_in_snapshot(e.txid, c.done))
            UNION ALL
            SELECT format('unmatched count of topic %s', tp.topic)
              FROM eventgrid.topic_positions tp
             WHERE EXISTS (SELECT 1 FROM eventgrid.events e
                            WHERE e.event_table = _event_table_holders.event_table AND e.topic = tp.topic
                              AND e.txid >= pg_snapshot_xmin(tp.done) AND NOT pg_visible_in_snapshot(e.txid, tp.done))
            UNION ALL
            SELECT format('the initial copy of logical replication slot %s', r.slot_name)
              FROM pg_catalog.pg_replication_slots r
             WHERE r.database = current_database() AND r.slot_type = 'logical'
               AND r.slot_name ~ '^pg_[0-9]+_sync_[0-9]+_[0-9]+$'
               AND EXISTS (SELECT 1 FROM eventgrid.events e WHERE e.event_table = _event_table_holders.event_table)
            UNION ALL
            SELECT format('logical replication slot %s, whose subscriber has not streamed for eventgrid.replication_sync_wait yet (its initial copy may be to come)', r.slot_name)
              FROM pg_catalog.pg_replication_slots r
              LEFT JOIN eventgrid.replication_slot_sightings g ON g.slot_name = r.slot_name
             WHERE r.database = current_database() AND r.slot_type = 'logical' AND r.plugin = 'pgoutput'
               AND r.slot_name !~ '^pg_[0-9]+_sync_[0-9]+_[0-9]+$'
               AND (g.streaming_since IS NULL
                    OR g.streaming_since > now() - coalesce(current_setting('eventgrid.replication_sync_wait', true), '300s')::interval)
               AND EXISTS (SELECT 1 FROM eventgrid.events e WHERE e.event_table = _event_table_holders.event_table)) h;
END;
COMMENT ON FUNCTION eventgrid._event_table_holders(smallint) IS
    'Internal: what still needs events of event table eventgrid.events_<event_table> (event subscriptions, first attempts in flight, unmatched counts, a logical replication subscriber''s initial copy in progress or possibly to come); NULL when it may be emptied.';

-- What the role a delivery server subscribes with needs on this side, in
-- one call: LOGIN and REPLICATION are the role's own attributes (ALTER
-- ROLE, a superuser's); CONNECT on the database and SELECT on
-- eventgrid.events, for the initial copy, are granted here.
CREATE FUNCTION eventgrid.grant_event_replication(role_name name) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    r pg_roles%ROWTYPE;
BEGIN
    IF role_name IS NULL THEN
        RAISE EXCEPTION 'role_name must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT * INTO r FROM pg_roles WHERE rolname = role_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'role "%" does not exist', role_name USING ERRCODE = 'undefined_object',
            HINT = 'CREATE ROLE ... LOGIN REPLICATION PASSWORD ... first (a superuser''s).';
    END IF;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), role_name);
    EXECUTE format('GRANT SELECT ON TABLE eventgrid.events TO %I', role_name);
    IF NOT (r.rolreplication OR r.rolsuper) OR NOT r.rolcanlogin THEN
        RAISE WARNING 'role "%" cannot open a replication connection yet', role_name
            USING DETAIL = format('It has%s%s.', CASE WHEN r.rolcanlogin THEN '' ELSE ' no LOGIN' END,
                                  CASE WHEN r.rolreplication OR r.rolsuper THEN '' ELSE ' no REPLICATION' END),
                  HINT = format('ALTER ROLE %I LOGIN REPLICATION (a superuser''s), and allow it in pg_hba.conf.', role_name);
    END IF;
END $$;
COMMENT ON FUNCTION eventgrid.grant_event_replication(name) IS
    'Grants the role a delivery server subscribes with (CREATE SUBSCRIPTION ... CONNECTION ''... user=<role>'') what it needs in this database: CONNECT on it and SELECT on eventgrid.events, which the initial copy reads; warns when the role lacks LOGIN or REPLICATION (role attributes a superuser gives with ALTER ROLE). README "Scaling out". Errors: 22004 NULL, 42704 no such role. Needs the right to grant on eventgrid.events (its owner: a superuser).';
REVOKE ALL ON FUNCTION eventgrid.grant_event_replication(name) FROM PUBLIC;

-- ---------------------------------------------------------------------------
-- src/ in folders: a comment that names a file follows it
COMMENT ON FUNCTION eventgrid._histogram_buckets(histogram text) IS 'Internal: the upper bounds (seconds) of the buckets of a histogram, the same as the delivery workers count with (src/store/store_metrics.c), +Inf last.';

-- ---------------------------------------------------------------------------
-- A dead-letter notification that cannot be made does not hold the dead
-- letter back: the delivery workers publish a record's notifications in one
-- subtransaction (eventgrid._publish_dead_letter_notifications), and when
-- that fails, one at a time; each one that still fails is left out, kept in
-- eventgrid.dead_letter_notification_failures and counted in one LOG line
-- per record, and the outcome is recorded as always.
CREATE TYPE eventgrid._dead_letter_notice AS (
    subscription_id bigint,
    event_id bigint,
    dead_letter_topic text,
    topic text,
    subscription text,
    event jsonb,
    input_schema text,
    dead_lettered boolean,
    reason text,
    attempts integer,
    outcome text,
    http_status integer,
    publish_time timestamp with time zone,
    attempted_at timestamp with time zone,
    event_source text
);
COMMENT ON TYPE eventgrid._dead_letter_notice IS
    'Internal: what the delivery workers know of a delivery that ended undelivered, for its dead-letter notification (eventgrid._publish_dead_letter_notifications).';

CREATE TABLE eventgrid.dead_letter_notification_failures (
    id bigserial PRIMARY KEY,
    subscription_id bigint NOT NULL,
    topic text NOT NULL,
    subscription_name text NOT NULL,
    event_id bigint NOT NULL,
    dead_letter_topic text NOT NULL,
    failed_at timestamp with time zone NOT NULL DEFAULT now(),
    sqlstate text NOT NULL,
    error text NOT NULL
);
COMMENT ON TABLE eventgrid.dead_letter_notification_failures IS
    'Dead-letter notifications that could not be published: the event subscription (id, topic, name), the id the event had in eventgrid.events (dead_letters.event_id), the notification topic, when, and the error (SQLSTATE and message). The dead letter itself is recorded as always; the delivery workers log each record that had such failures once. Readable by pg_monitor; eventgrid_admin reads and deletes.';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.dead_letter_notification_failures', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.dead_letter_notification_failures_id_seq', '');
REVOKE ALL ON TABLE eventgrid.dead_letter_notification_failures FROM PUBLIC;
GRANT SELECT ON TABLE eventgrid.dead_letter_notification_failures TO pg_monitor;
GRANT SELECT, DELETE ON TABLE eventgrid.dead_letter_notification_failures TO eventgrid_admin;

CREATE FUNCTION eventgrid._publish_dead_letter_notifications(notices eventgrid._dead_letter_notice[])
    RETURNS TABLE (failed_subscription_id bigint, failed_topic text, failed_subscription text, failed_event_id bigint,
                   failed_dead_letter_topic text, failed_sqlstate text, failed_error text)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    d eventgrid._dead_letter_notice;
    state text;
    msg text;
    failed integer := 0;
    first_state text;
BEGIN
    IF coalesce(cardinality(notices), 0) = 0 THEN
        RETURN;
    END IF;
    BEGIN
        INSERT INTO eventgrid.events (topic, event, source)
        SELECT n.notification_topic, n.notification, '(dead-letter notification)'
          FROM unnest(notices) x
         CROSS JOIN LATERAL eventgrid._dead_letter_notification(x.dead_letter_topic, x.topic, x.subscription, x.event,
                 x.input_schema, x.dead_lettered, x.reason, x.attempts, x.outcome, x.http_status, x.publish_time,
                 x.attempted_at, x.event_source) n;
        RETURN;
    EXCEPTION WHEN OTHERS THEN
        NULL;   -- one at a time below, so that only those that cannot be made are left out
    END;
    FOREACH d IN ARRAY notices LOOP
        BEGIN
            INSERT INTO eventgrid.events (topic, event, source)
            SELECT n.notification_topic, n.notification, '(dead-letter notification)'
              FROM eventgrid._dead_letter_notification(d.dead_letter_topic, d.topic, d.subscription, d.event,
                     d.input_schema, d.dead_lettered, d.reason, d.attempts, d.outcome, d.http_status, d.publish_time,
                     d.attempted_at, d.event_source) n;
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
            failed := failed + 1;
            first_state := coalesce(first_state, state);
            failed_subscription_id := d.subscription_id;
            failed_topic := d.topic;
            failed_subscription := d.subscription;
            failed_event_id := d.event_id;
            failed_dead_letter_topic := d.dead_letter_topic;
            failed_sqlstate := state;
            failed_error := left(msg, 1000);
            RETURN NEXT;
        END;
    END LOOP;
    IF failed > 0 THEN
        -- counts and SQLSTATE only: the message may quote the event
        PERFORM eventgrid._log(format('eventgrid: %s dead-letter notification(s) could not be published (SQLSTATE %s first); the dead letters are recorded; see eventgrid.dead_letter_notification_failures',
                                      failed, first_state));
    END IF;
END $$;
COMMENT ON FUNCTION eventgrid._publish_dead_letter_notifications(eventgrid._dead_letter_notice[]) IS
    'Internal: publishes the dead-letter notifications of a record of outcomes (eventgrid._dead_letter_notification builds each) in one subtransaction, and when that fails one at a time; returns each that still fails (what eventgrid.dead_letter_notification_failures keeps of it), and one LOG line counts them (SQLSTATE, never the message). The delivery workers call it in the statement that records the dead letters and store what it returns, so a notification that cannot be made never holds a dead letter back.';
REVOKE ALL ON FUNCTION eventgrid._publish_dead_letter_notifications(eventgrid._dead_letter_notice[]) FROM PUBLIC;
