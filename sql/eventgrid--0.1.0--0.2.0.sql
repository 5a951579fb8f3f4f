-- eventgrid 0.1.0 -> 0.2.0: queue storage without a row per delivery.
--
-- 0.1.0 kept one eventgrid.deliveries row per event x subscription.  0.2.0
-- appends events to three event tables that take turns, gives each event
-- subscription a position (snapshot batches), and keeps only failures as
-- rows of eventgrid.retries.  This script moves the queue over: every
-- pending delivery becomes a retry (with its attempts, due time and last
-- outcome; one that was in flight is released, and charged an attempt with
-- outcome Aborted when it had been sent), unmatched events not yet counted
-- are counted, and every subscription's position starts at this
-- transaction.  Configuration, dead letters and counters stay as they are.

\echo Use "ALTER EXTENSION eventgrid UPDATE TO '0.2.0'" to load this file. \quit

-- what depends on the tables that go
DROP VIEW eventgrid.delivery_statistics;
DROP VIEW eventgrid.topic_statistics;
DROP TRIGGER events_fan_out ON eventgrid.events;
DROP FUNCTION eventgrid._fan_out();

CREATE FUNCTION eventgrid._event_table() RETURNS smallint
AS 'MODULE_PATHNAME', 'eventgrid_event_table' LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE FUNCTION eventgrid._system_identifier() RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
RETURN (SELECT system_identifier FROM pg_control_system());

-- A snapshot batch: the transactions visible in snapshot "upto" and not in
-- snapshot "since" (PgQ's rule).  An event is delivered iff its transaction
-- committed, whenever it commits.
CREATE FUNCTION eventgrid._in_batch(txid xid8, since pg_snapshot, upto pg_snapshot) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN pg_visible_in_snapshot(txid, upto) AND NOT pg_visible_in_snapshot(txid, since);

-- Does an event pass an event subscription's filters (SPEC 9)?
CREATE FUNCTION eventgrid._matches(event jsonb, types_lower text[], subject_begins_with text,
                                   subject_ends_with text, case_sensitive boolean) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN coalesce(
        (types_lower IS NULL
         OR lower(coalesce(event->>'eventType', event->>'type')) = ANY (types_lower))
    AND (subject_begins_with IS NULL
         OR CASE WHEN case_sensitive
                 THEN starts_with(event->>'subject', subject_begins_with)
                 ELSE starts_with(lower(event->>'subject'), lower(subject_begins_with)) END)
    AND (subject_ends_with IS NULL
         OR CASE WHEN case_sensitive
                 THEN right(event->>'subject', length(subject_ends_with)) = subject_ends_with
                 ELSE lower(right(event->>'subject', length(subject_ends_with))) = lower(subject_ends_with) END),
    false);

-- Each event subscription's position in the event stream.  since: the
-- snapshot at creation (events of transactions visible in it are not for
-- this subscription); done: every event visible in it has been claimed;
-- upto, after_txid, after_id: the batch being worked through (events
-- visible in upto and not in done) and the last event claimed from it.
-- Claimed by one worker at a time (FOR UPDATE SKIP LOCKED).
CREATE TABLE eventgrid.subscription_positions (
    subscription_id  bigint PRIMARY KEY REFERENCES eventgrid.event_subscriptions (id) ON DELETE CASCADE,
    since            pg_snapshot NOT NULL,
    done             pg_snapshot NOT NULL,
    upto             pg_snapshot,
    after_txid       xid8,
    after_id         bigint,
    served_at        timestamptz,
    -- the cluster whose transaction ids the snapshots hold: restored into
    -- another cluster, the worker turns what was pending into retries and
    -- starts the position afresh
    system_identifier bigint NOT NULL DEFAULT eventgrid._system_identifier()
);

-- Per topic: events visible in done have been counted as unmatched or not.
CREATE TABLE eventgrid.topic_positions (
    topic  text PRIMARY KEY REFERENCES eventgrid.topics (name) ON DELETE CASCADE,
    done   pg_snapshot NOT NULL,
    system_identifier bigint NOT NULL DEFAULT eventgrid._system_identifier()
);

-- Only failures become rows: a delivery whose first attempt failed, with a
-- copy of the event and of the JSON text its receiver gets, so that it never
-- holds an event table back.  Retries are claimed by due time; a claim
-- leases the row (lease_owner, next_attempt_at pushed past the timeout).
-- No foreign keys: drop_event_subscription deletes a subscription's rows.
CREATE TABLE eventgrid.retries (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    subscription_id   bigint NOT NULL,
    event_id          bigint NOT NULL,
    event             jsonb NOT NULL,
    payload           text NOT NULL,
    publish_time      timestamptz NOT NULL,
    event_bytes       integer NOT NULL,
    attempts          integer NOT NULL DEFAULT 0 CHECK (attempts BETWEEN 0 AND 30),
    next_attempt_at   timestamptz NOT NULL,
    last_attempt_at   timestamptz,
    last_outcome      text,
    last_http_status  integer CHECK (last_http_status BETWEEN 100 AND 599),
    lease_owner       integer
);
CREATE INDEX retries_due_idx ON eventgrid.retries (next_attempt_at);
CREATE INDEX retries_subscription_idx ON eventgrid.retries (subscription_id);

-- First attempts claimed and not yet recorded, one row per chunk: the
-- events of one subscription's batch after (after_txid, after_id) up to
-- (last_txid, last_id).  Written when claimed; sent_txid/sent_id is set,
-- durably, before requests go to HTTP: after a crash the chunk's events
-- become retries, those up to the sent mark charged an attempt (Aborted).
CREATE TABLE eventgrid.chunks_in_flight (
    lease_owner      integer NOT NULL,
    chunk            bigint NOT NULL,
    subscription_id  bigint NOT NULL,
    topic            text NOT NULL,
    done             pg_snapshot NOT NULL,
    upto             pg_snapshot NOT NULL,
    after_txid       xid8,
    after_id         bigint,
    last_txid        xid8 NOT NULL,
    last_id          bigint NOT NULL,
    sent_txid        xid8,
    sent_id          bigint,
    PRIMARY KEY (lease_owner, chunk)
);

-- the queue moves over: pending deliveries become retries
INSERT INTO eventgrid.retries (subscription_id, event_id, event, payload, publish_time, event_bytes,
       attempts, next_attempt_at, last_attempt_at, last_outcome, last_http_status)
SELECT d.subscription_id, e.id, e.event,
       (CASE WHEN t.input_schema = s.event_delivery_schema THEN e.event
             ELSE eventgrid.convert_event(e.event, t.input_schema, s.event_delivery_schema, e.publish_time) END)::text,
       e.publish_time, coalesce(e.event_bytes, octet_length(e.event::text)),
       CASE WHEN x.sent THEN least(d.attempts + 1, 30) ELSE d.attempts END,
       CASE WHEN d.lease_owner IS NULL THEN d.next_attempt_at ELSE least(d.next_attempt_at, now()) END,
       CASE WHEN x.sent THEN now() ELSE d.last_attempt_at END,
       CASE WHEN x.sent THEN 'Aborted' ELSE d.last_outcome END,
       CASE WHEN x.sent THEN NULL ELSE d.last_http_status END
  FROM eventgrid.deliveries d
  JOIN eventgrid.events e ON e.id = d.event_id
  JOIN eventgrid.event_subscriptions s ON s.id = d.subscription_id
  JOIN eventgrid.topics t ON t.name = s.topic
  CROSS JOIN LATERAL (SELECT d.lease_owner IS NOT NULL AND EXISTS (
      SELECT 1 FROM eventgrid.requests_in_flight f WHERE d.id = ANY (f.delivery_ids)) AS sent) x;
UPDATE eventgrid.topic_counters c SET unmatched = c.unmatched + u.n
  FROM (SELECT e.topic, count(*) AS n FROM eventgrid.deliveries d JOIN eventgrid.events e ON e.id = d.event_id
         WHERE d.subscription_id IS NULL GROUP BY e.topic) u
 WHERE c.topic = u.topic;

-- the old queue goes; the event tables keep the ids going
SELECT pg_catalog.set_config('eventgrid_upgrade.last_event_id',
       greatest((SELECT max(id) FROM eventgrid.events), (SELECT last_value FROM eventgrid.events_id_seq))::text, true);
DROP TABLE eventgrid.requests_in_flight;
DROP TABLE eventgrid.deliveries;
DROP TABLE eventgrid.events;

CREATE SEQUENCE eventgrid.events_id_seq;
CREATE TABLE eventgrid.events (
    id            bigint NOT NULL DEFAULT nextval('eventgrid.events_id_seq'),
    topic         text NOT NULL,
    event         jsonb NOT NULL,
    publish_time  timestamptz NOT NULL,
    event_bytes   integer,
    txid          xid8 NOT NULL DEFAULT pg_current_xact_id(),
    event_table   smallint NOT NULL DEFAULT eventgrid._event_table()
) PARTITION BY LIST (event_table);
ALTER SEQUENCE eventgrid.events_id_seq OWNED BY eventgrid.events.id;
CREATE TABLE eventgrid.events_0 PARTITION OF eventgrid.events FOR VALUES IN (0);
CREATE TABLE eventgrid.events_1 PARTITION OF eventgrid.events FOR VALUES IN (1);
CREATE TABLE eventgrid.events_2 PARTITION OF eventgrid.events FOR VALUES IN (2);
CREATE INDEX events_batch_idx ON eventgrid.events (topic, txid, id);

SELECT pg_catalog.setval('eventgrid.events_id_seq', current_setting('eventgrid_upgrade.last_event_id')::bigint);

-- Retries handed to HTTP, one row per wave of requests, written before
-- they are sent and deleted once their outcomes are recorded: after a crash
-- only these are charged an attempt.  Transient: not dumped.
CREATE TABLE eventgrid.requests_in_flight (
    lease_owner  integer NOT NULL,
    wave         bigint NOT NULL,
    retry_ids    bigint[] NOT NULL,
    PRIMARY KEY (lease_owner, wave)
);

-- The worker's last TRUNCATE of each event table, and why the last try failed.
CREATE TABLE eventgrid.event_table_rotations (
    event_table      smallint PRIMARY KEY,
    truncated_at     timestamptz,
    last_try_at      timestamptz,
    last_failure     text
);
INSERT INTO eventgrid.event_table_rotations (event_table) VALUES (0), (1), (2);

-- every subscription and topic starts from now: what was published before is in the retries
INSERT INTO eventgrid.subscription_positions (subscription_id, since, done)
SELECT s.id, pg_current_snapshot(), pg_current_snapshot() FROM eventgrid.event_subscriptions s;
INSERT INTO eventgrid.topic_positions (topic, done) SELECT t.name, pg_current_snapshot() FROM eventgrid.topics t;

COMMENT ON TABLE eventgrid.events IS
    'Published events. Publish with INSERT INTO eventgrid.events (topic, event); rows are validated and stamped in the publishing transaction and appended to one of the event tables eventgrid.events_0..2, which the delivery worker empties with TRUNCATE once every event subscription has passed them (SPEC 1, 2, 8).';
COMMENT ON TABLE eventgrid.subscription_positions IS
    'Internal: each event subscription''s position in the event stream (snapshots of the delivery worker); first delivery attempts are claimed from here.';
COMMENT ON TABLE eventgrid.topic_positions IS
    'Internal: how far the delivery worker has counted each topic''s events that match no event subscription.';
COMMENT ON TABLE eventgrid.retries IS
    'Deliveries whose first attempt failed and that will be retried: attempts made, next attempt time, last outcome and HTTP status, and a copy of the event (SPEC 3, 4).';
COMMENT ON TABLE eventgrid.chunks_in_flight IS
    'Internal: first delivery attempts claimed by the delivery worker and not yet recorded; after a crash they become retries, charged an attempt (outcome Aborted) only up to what had been handed to HTTP.';
COMMENT ON TABLE eventgrid.requests_in_flight IS
    'Internal: retries the worker handed to HTTP and has not recorded yet; after a crash only these are charged an attempt (outcome Aborted).';
COMMENT ON TABLE eventgrid.event_table_rotations IS
    'Internal: when the delivery worker last emptied each event table, and why its last try failed. Read through eventgrid.event_tables.';

SELECT pg_catalog.pg_extension_config_dump('eventgrid.events_0', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.events_1', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.events_2', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.subscription_positions', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.topic_positions', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.retries', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.chunks_in_flight', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.events_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump(pg_catalog.pg_get_serial_sequence('eventgrid.retries', 'id'), '');

-- configuration functions that write positions and retries
CREATE OR REPLACE FUNCTION eventgrid.create_topic(name text, input_schema text DEFAULT 'EventGridSchema')
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM eventgrid._check_not_null('topic name', name);
    IF NOT eventgrid._is_topic_name(name) THEN
        RAISE EXCEPTION 'invalid topic name %', eventgrid._quote(name)
            USING ERRCODE = 'invalid_name',
                  HINT = 'A topic name has 3 to 50 characters: letters, digits and hyphens.';
    END IF;
    PERFORM eventgrid._check_schema('input_schema', input_schema);
    IF EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = create_topic.name) THEN
        RAISE EXCEPTION 'topic "%" already exists', name USING ERRCODE = 'duplicate_object';
    END IF;
    INSERT INTO eventgrid.topics (name, input_schema) VALUES (name, input_schema);
    INSERT INTO eventgrid.topic_counters (topic) VALUES (name);
    INSERT INTO eventgrid.topic_positions (topic, done) VALUES (name, pg_current_snapshot());
END $$;
CREATE OR REPLACE FUNCTION eventgrid.drop_topic(name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    sids bigint[];
BEGIN
    PERFORM eventgrid._check_not_null('topic name', name);
    IF NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = drop_topic.name FOR UPDATE) THEN
        RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(name) USING ERRCODE = 'undefined_object';
    END IF;
    -- the subscriptions first (the delivery worker's lock order), then their retries
    SELECT array_agg(s.id ORDER BY s.id) INTO sids
      FROM (SELECT s.id FROM eventgrid.event_subscriptions s WHERE s.topic = drop_topic.name
             ORDER BY s.id FOR UPDATE) s;
    DELETE FROM eventgrid.retries r WHERE r.subscription_id = ANY (sids);
    -- subscriptions, positions and counters go with the topic (ON DELETE CASCADE);
    -- its events stay in the event tables until they are emptied
    DELETE FROM eventgrid.topics t WHERE t.name = drop_topic.name;
END $$;
CREATE OR REPLACE FUNCTION eventgrid.create_event_subscription(
    topic text,
    name text,
    endpoint text,
    event_delivery_schema text DEFAULT NULL,
    included_event_types text[] DEFAULT NULL,
    subject_begins_with text DEFAULT NULL,
    subject_ends_with text DEFAULT NULL,
    is_subject_case_sensitive boolean DEFAULT false,
    max_delivery_attempts integer DEFAULT 30,
    event_ttl integer DEFAULT 1440,
    max_events_per_batch integer DEFAULT NULL,
    preferred_batch_size_in_kilobytes integer DEFAULT NULL,
    deadletter boolean DEFAULT false)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    in_schema text;
    sid bigint;
BEGIN
    PERFORM eventgrid._check_not_null('topic', topic);
    SELECT t.input_schema INTO in_schema FROM eventgrid.topics t WHERE t.name = topic FOR KEY SHARE;
    IF in_schema IS NULL THEN
        RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object', HINT = 'Create it first with eventgrid.create_topic().';
    END IF;
    IF name IS NULL OR endpoint IS NULL THEN
        RAISE EXCEPTION 'event subscription name and endpoint must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT eventgrid._is_subscription_name(name) THEN
        RAISE EXCEPTION 'invalid event subscription name %', eventgrid._quote(name)
            USING ERRCODE = 'invalid_name',
                  HINT = 'An event subscription name has 3 to 64 characters: letters, digits and hyphens.';
    END IF;
    PERFORM eventgrid._check_endpoint(endpoint);
    event_delivery_schema := coalesce(event_delivery_schema, in_schema);
    PERFORM eventgrid._check_schema('event_delivery_schema', event_delivery_schema);
    IF (in_schema = 'CustomEventSchema') <> (event_delivery_schema = 'CustomEventSchema') THEN
        RAISE EXCEPTION 'event_delivery_schema % is not available for a topic with input schema %',
                        event_delivery_schema, in_schema
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'EventGridSchema and CloudEventSchemaV1_0 map to each other; CustomEventSchema is delivered only as CustomEventSchema.';
    END IF;
    IF included_event_types IS NOT NULL AND
       (cardinality(included_event_types) = 0 OR array_position(included_event_types, NULL) IS NOT NULL) THEN
        RAISE EXCEPTION 'included_event_types must be NULL (all types) or a non-empty array without NULLs'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF is_subject_case_sensitive IS NULL OR deadletter IS NULL THEN
        RAISE EXCEPTION 'is_subject_case_sensitive and deadletter must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF max_delivery_attempts IS NULL OR event_ttl IS NULL THEN
        RAISE EXCEPTION 'max_delivery_attempts and event_ttl must not be NULL'
            USING ERRCODE = 'null_value_not_allowed', HINT = 'Omit them to get the defaults 30 and 1440.';
    END IF;
    PERFORM eventgrid._check_range('max_delivery_attempts', max_delivery_attempts, 1, 30);
    PERFORM eventgrid._check_range('event_ttl', event_ttl, 1, 1440, ' minutes');
    PERFORM eventgrid._check_range('max_events_per_batch', max_events_per_batch, 1, 5000);
    PERFORM eventgrid._check_range('preferred_batch_size_in_kilobytes', preferred_batch_size_in_kilobytes, 1, 1024, ' kilobytes');
    IF EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s
                WHERE s.topic = create_event_subscription.topic AND s.name = create_event_subscription.name) THEN
        RAISE EXCEPTION 'event subscription "%" already exists for topic "%"', name, topic
            USING ERRCODE = 'duplicate_object';
    END IF;
    INSERT INTO eventgrid.event_subscriptions AS s
        (topic, name, endpoint, event_delivery_schema, included_event_types, subject_begins_with,
         subject_ends_with, is_subject_case_sensitive, max_delivery_attempts, event_ttl,
         max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter)
    VALUES (topic, name, endpoint, event_delivery_schema, included_event_types, subject_begins_with,
            subject_ends_with, is_subject_case_sensitive, max_delivery_attempts, event_ttl,
            max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter)
    RETURNING s.id INTO sid;
    INSERT INTO eventgrid.subscription_counters (subscription_id) VALUES (sid);
    -- events of transactions that commit after this one's snapshot are for it
    INSERT INTO eventgrid.subscription_positions (subscription_id, since, done)
    VALUES (sid, pg_current_snapshot(), pg_current_snapshot());
    RETURN sid;
END $$;
CREATE OR REPLACE FUNCTION eventgrid.drop_event_subscription(topic text, name text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    sid bigint;
BEGIN
    -- the subscription first (the delivery worker's lock order), then its retries;
    -- its position and counters go with it (ON DELETE CASCADE)
    sid := eventgrid._subscription_id(topic, name, true);
    DELETE FROM eventgrid.retries r WHERE r.subscription_id = sid;
    DELETE FROM eventgrid.event_subscriptions s WHERE s.id = sid;
END $$;
COMMENT ON FUNCTION eventgrid.drop_topic(text) IS
    'Drops a topic with its event subscriptions and their pending deliveries and retries. Dead letters are kept. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such topic.';

COMMENT ON FUNCTION eventgrid.drop_event_subscription(text, text) IS
    'Drops an event subscription with its pending deliveries and retries. Dead letters are kept. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription.';

-- publishing: the events table's triggers
-- Publishing writes nothing but the event: the worker finds new events
-- through its snapshots.  This only wakes it when the transaction commits.
CREATE FUNCTION eventgrid._wake_at_commit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM eventgrid._wake_worker_at_commit();
    RETURN NULL;
END $$;

CREATE TRIGGER events_validate BEFORE INSERT ON eventgrid.events
    FOR EACH ROW EXECUTE FUNCTION eventgrid._validate_event();
CREATE TRIGGER events_wake AFTER INSERT ON eventgrid.events
    FOR EACH STATEMENT EXECUTE FUNCTION eventgrid._wake_at_commit();
CREATE TRIGGER events_immutable BEFORE UPDATE ON eventgrid.events
    FOR EACH ROW EXECUTE FUNCTION eventgrid._refuse_change();

-- views
CREATE FUNCTION eventgrid._pending(subscription_id bigint) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
    SELECT
      -- events its position has not passed
      (SELECT count(*)
         FROM eventgrid.subscription_positions p
         JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id
         JOIN eventgrid.events e ON e.topic = s.topic AND e.txid >= pg_snapshot_xmin(p.done)
        WHERE p.subscription_id = _pending.subscription_id
          AND NOT pg_visible_in_snapshot(e.txid, p.done)
          AND NOT (p.upto IS NOT NULL AND pg_visible_in_snapshot(e.txid, p.upto)
                   AND (e.txid, e.id) <= (coalesce(p.after_txid, '0'::xid8), coalesce(p.after_id, 0)))
          AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with,
                                 s.subject_ends_with, s.is_subject_case_sensitive))
      -- first attempts claimed and not recorded yet
      + (SELECT count(*)
           FROM eventgrid.chunks_in_flight c
           JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id
           JOIN eventgrid.events e ON e.topic = c.topic AND e.txid >= pg_snapshot_xmin(c.done)
          WHERE c.subscription_id = _pending.subscription_id
            AND eventgrid._in_batch(e.txid, c.done, c.upto)
            AND (e.txid, e.id) > (coalesce(c.after_txid, '0'::xid8), coalesce(c.after_id, 0))
            AND (e.txid, e.id) <= (c.last_txid, c.last_id)
            AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with,
                                   s.subject_ends_with, s.is_subject_case_sensitive))
      + (SELECT count(*) FROM eventgrid.retries r WHERE r.subscription_id = _pending.subscription_id);
END;

CREATE VIEW eventgrid.delivery_statistics AS
SELECT s.topic, s.name AS subscription,
       eventgrid._pending(s.id) AS pending,
       (SELECT count(*) FROM eventgrid.retries r WHERE r.subscription_id = s.id) AS retrying,
       coalesce(c.delivered, 0) AS delivered,
       coalesce(c.failed_attempts, 0) AS failed_attempts,
       coalesce(c.dead_lettered, 0) AS dead_lettered,
       coalesce(c.dropped, 0) AS dropped
  FROM eventgrid.event_subscriptions s
  LEFT JOIN eventgrid.subscription_counters c ON c.subscription_id = s.id;
COMMENT ON VIEW eventgrid.delivery_statistics IS
    'Per event subscription: deliveries pending (not yet delivered, dead-lettered or dropped, retries included), of which waiting for a retry, events delivered, failed delivery attempts, events dead-lettered and events dropped (undeliverable with dead-lettering off).';

CREATE VIEW eventgrid.topic_statistics AS
SELECT t.name AS topic, t.input_schema,
       (SELECT count(*) FROM eventgrid.event_subscriptions s WHERE s.topic = t.name) AS event_subscriptions,
       (SELECT count(*) FROM eventgrid.events e WHERE e.topic = t.name) AS events_stored,
       coalesce(c.unmatched, 0) AS unmatched_events
  FROM eventgrid.topics t
  LEFT JOIN eventgrid.topic_counters c ON c.topic = t.name;
COMMENT ON VIEW eventgrid.topic_statistics IS
    'Per topic: input schema, number of event subscriptions, events still in the event tables (delivered or not: a table is emptied as a whole), and events that matched no event subscription (counted by the delivery worker within about a second).';

-- What keeps an event table from being emptied: a position, a chunk in
-- flight or an unmatched count that has not passed all of its events.  The
-- delivery worker asks this same function before it truncates.
CREATE FUNCTION eventgrid._event_table_holders(event_table smallint) RETURNS text[]
LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
    SELECT array_agg(DISTINCT h.holder ORDER BY h.holder) FROM (
        SELECT format('event subscription %s of topic %s', s.name, s.topic) AS holder
          FROM eventgrid.subscription_positions p
          JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id
         WHERE EXISTS (SELECT 1 FROM eventgrid.events e
                        WHERE e.event_table = _event_table_holders.event_table AND e.topic = s.topic
                          AND e.txid >= pg_snapshot_xmin(p.done)
                          AND NOT pg_visible_in_snapshot(e.txid, p.done))
        UNION ALL
        SELECT format('first attempts in flight for topic %s', c.topic)
          FROM eventgrid.chunks_in_flight c
         WHERE EXISTS (SELECT 1 FROM eventgrid.events e
                        WHERE e.event_table = _event_table_holders.event_table AND e.topic = c.topic
                          AND e.txid >= pg_snapshot_xmin(c.done)
                          AND NOT pg_visible_in_snapshot(e.txid, c.done))
        UNION ALL
        SELECT format('unmatched count of topic %s', tp.topic)
          FROM eventgrid.topic_positions tp
         WHERE EXISTS (SELECT 1 FROM eventgrid.events e
                        WHERE e.event_table = _event_table_holders.event_table AND e.topic = tp.topic
                          AND e.txid >= pg_snapshot_xmin(tp.done)
                          AND NOT pg_visible_in_snapshot(e.txid, tp.done))) h;
END;
COMMENT ON FUNCTION eventgrid._event_table_holders(smallint) IS
    'Internal: what still needs events of event table eventgrid.events_<event_table> (event subscriptions, first attempts in flight, unmatched counts); NULL when it may be emptied.';

CREATE VIEW eventgrid.event_tables AS
SELECT r.event_table, format('eventgrid.events_%s', r.event_table) AS table_name,
       r.event_table = eventgrid._event_table() AS current,
       pg_total_relation_size(format('eventgrid.events_%s', r.event_table)::regclass) AS bytes,
       eventgrid._event_table_holders(r.event_table) AS waiting_for,
       r.truncated_at, r.last_try_at, r.last_failure
  FROM eventgrid.event_table_rotations r;
COMMENT ON VIEW eventgrid.event_tables IS
    'The three event tables that take turns: which one new events go to now (current), size in bytes, what must pass their events before the delivery worker may empty them with TRUNCATE (waiting_for; NULL: nothing), when it last did, and why its last try failed (e.g. another session held a lock on the table).';

-- privileges of the new objects (see eventgrid--0.2.0.sql)
REVOKE ALL ON ALL TABLES IN SCHEMA eventgrid FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA eventgrid FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA eventgrid FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.publish(text, jsonb) TO PUBLIC;
GRANT INSERT (topic, event) ON eventgrid.events TO eventgrid_publisher;
GRANT USAGE ON SEQUENCE eventgrid.events_id_seq TO eventgrid_publisher;
GRANT SELECT ON eventgrid.events, eventgrid.retries, eventgrid.subscription_positions, eventgrid.topic_positions,
    eventgrid.chunks_in_flight, eventgrid.event_table_rotations, eventgrid.delivery_statistics,
    eventgrid.topic_statistics, eventgrid.event_tables
    TO eventgrid_admin;
GRANT EXECUTE ON FUNCTION eventgrid._event_table() TO eventgrid_publisher, eventgrid_admin;
GRANT EXECUTE ON FUNCTION
    eventgrid._pending(bigint),
    eventgrid._event_table_holders(smallint),
    eventgrid._matches(jsonb, text[], text, text, boolean),
    eventgrid._in_batch(xid8, pg_snapshot, pg_snapshot)
    TO eventgrid_admin;

COMMENT ON FUNCTION eventgrid._wake_at_commit() IS
    'Internal: AFTER INSERT statement trigger on eventgrid.events; wakes the delivery worker when the publishing transaction commits (SPEC 2).';
COMMENT ON FUNCTION eventgrid._event_table() IS
    'Internal: default of events.event_table: which of the three event tables the current transaction appends to, from its start time and GUC eventgrid.event_table_rotation.';
COMMENT ON FUNCTION eventgrid._system_identifier() IS
    'Internal: this cluster''s system identifier (pg_control_system()), stamped on positions.';
COMMENT ON FUNCTION eventgrid._in_batch(xid8, pg_snapshot, pg_snapshot) IS
    'Internal: is transaction txid visible in snapshot upto and not in snapshot since (a snapshot batch)?';
COMMENT ON FUNCTION eventgrid._matches(jsonb, text[], text, text, boolean) IS
    'Internal: does an event pass an event subscription''s filters (included event types, case-insensitive; subject begins/ends with) (SPEC 9)?';
COMMENT ON FUNCTION eventgrid._pending(bigint) IS
    'Internal: deliveries of an event subscription not finished yet: events its position has not passed, first attempts in flight, and retries.';
COMMENT ON FUNCTION eventgrid._wake_worker_at_commit() IS
    'Internal: sets the delivery worker''s latch when the current transaction commits; no-op without shared_preload_libraries.';
