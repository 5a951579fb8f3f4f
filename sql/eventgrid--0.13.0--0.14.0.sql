-- eventgrid 0.13.0 -> 0.14.0: pull delivery (SPEC 14): queue event
-- subscriptions on namespace topics, whose events consumers receive,
-- acknowledge, release, reject or renew the locks of in SQL.

\echo Use "ALTER EXTENSION eventgrid UPDATE TO '0.14.0'" to load this file. \quit

-- the role consumers are granted (cluster-wide; kept if the extension is dropped)
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'eventgrid_receiver') THEN
        CREATE ROLE eventgrid_receiver NOLOGIN;
    END IF;
END $$;
COMMENT ON ROLE eventgrid_receiver IS
    'eventgrid: may receive the events of queue event subscriptions and acknowledge, release or reject them or renew their locks (eventgrid.receive() and the other subscriber operations). Grant it to consumers.';

ALTER TABLE eventgrid.event_subscriptions
    ALTER COLUMN endpoint DROP NOT NULL,
    ADD COLUMN delivery_mode text NOT NULL DEFAULT 'push',
    ADD COLUMN receive_lock_duration integer,
    ADD CONSTRAINT event_subscriptions_delivery_mode_check CHECK (
        (delivery_mode = 'push' AND endpoint IS NOT NULL AND receive_lock_duration IS NULL)
        OR (delivery_mode = 'queue' AND endpoint IS NULL AND topic_type = 'namespace'
            AND receive_lock_duration BETWEEN 60 AND 300 AND ordering_key IS NULL
            AND max_events_per_batch IS NULL AND preferred_batch_size_in_kilobytes IS NULL
            AND max_events_per_second IS NULL));
COMMENT ON COLUMN eventgrid.event_subscriptions.delivery_mode IS 'push: delivered to endpoint over HTTP; queue: kept for consumers to receive (pull delivery, namespace topics only; endpoint NULL). Cannot change.';
COMMENT ON COLUMN eventgrid.event_subscriptions.receive_lock_duration IS 'Of a queue event subscription: seconds (60-300) a received event stays locked to its consumer before it can be received again.';

ALTER TABLE eventgrid.dead_letters DROP CONSTRAINT dead_letters_dead_letter_reason_check,
    ADD CONSTRAINT dead_letters_dead_letter_reason_check CHECK (dead_letter_reason = ANY (ARRAY[
        'MaxDeliveryAttemptsExceeded', 'TimeToLiveExceeded', 'NonRetriableError', 'MaxDeliveryCountExceeded', 'Rejected']));

CREATE TABLE eventgrid.queue_events (
    id bigserial PRIMARY KEY,
    subscription_id bigint NOT NULL REFERENCES eventgrid.event_subscriptions (id) ON DELETE CASCADE,
    event_id bigint NOT NULL,
    event jsonb NOT NULL,
    publish_time timestamptz NOT NULL,
    event_bytes integer NOT NULL,
    source text,
    source_event_id bigint,
    delivery_count integer NOT NULL DEFAULT 0 CHECK (delivery_count BETWEEN 0 AND 10),
    receivable_at timestamptz NOT NULL,
    lock_secret uuid,
    received_at timestamptz
);
CREATE INDEX queue_events_receivable_idx ON eventgrid.queue_events (subscription_id, receivable_at, id);
COMMENT ON TABLE eventgrid.queue_events IS 'The events of queue event subscriptions (pull delivery, SPEC 14) that are neither acknowledged nor dead-lettered: a copy of each (the event tables rotate), how many times it was received (delivery_count), and when it can be received (receivable_at: now or earlier when available, the end of its lock or of its release delay otherwise). lock_secret: the random part of its last receive''s lock token (id:lock_secret; the lock is valid while receivable_at is later than now); received_at: when that receive took it. Read through eventgrid.queue_metrics; consumers use receive() and the other subscriber operations.';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.queue_events', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.queue_events_id_seq', '');
-- administrators read the queue (delivery_statistics counts it with their privileges), not its lock tokens
GRANT SELECT (id, subscription_id, event_id, event, publish_time, event_bytes, source, source_event_id, delivery_count,
              receivable_at, received_at) ON eventgrid.queue_events TO eventgrid_admin;
-- The functions that read and write it by key run with enable_seqscan off: its statistics may
-- come from an ANALYZE of an empty queue while it holds a backlog (a plan that scans the whole
-- queue for each acknowledge would cost every consumer).
-- a lock moves only the narrow row: the event stays where it was written (out of line, uncompressed)
ALTER TABLE eventgrid.queue_events ALTER COLUMN event SET STORAGE EXTERNAL;
ALTER TABLE eventgrid.queue_events SET (toast_tuple_target = 128);

CREATE TABLE eventgrid.queue_counters (
    subscription_id bigint NOT NULL REFERENCES eventgrid.event_subscriptions (id) ON DELETE CASCADE,
    slot integer NOT NULL CHECK (slot BETWEEN 0 AND 15),
    received bigint NOT NULL DEFAULT 0,
    acknowledged bigint NOT NULL DEFAULT 0,
    released bigint NOT NULL DEFAULT 0,
    rejected bigint NOT NULL DEFAULT 0,
    lock_expired bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (subscription_id, slot)
);
COMMENT ON TABLE eventgrid.queue_counters IS 'Internal: running totals of the subscriber operations per queue event subscription, in 16 slots (by the consumer''s backend pid) so that concurrent consumers do not wait for each other''s counter rows; summed by eventgrid.queue_metrics and delivery_statistics.';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.queue_counters', '');
GRANT SELECT ON eventgrid.queue_counters TO eventgrid_admin;

CREATE FUNCTION eventgrid._clock_now() RETURNS timestamptz
    LANGUAGE c VOLATILE PARALLEL SAFE
    AS 'MODULE_PATHNAME', 'eventgrid_clock_now';
REVOKE ALL ON FUNCTION eventgrid._clock_now() FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._clock_now() IS 'Internal: clock_timestamp() on the delivery workers'' clock (moved ahead by eventgrid.clock_offset): the time the locks of pull delivery are taken, compared and renewed at.';

CREATE FUNCTION eventgrid._wake_receivers_at_commit() RETURNS void
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_wake_receivers_at_commit';
REVOKE ALL ON FUNCTION eventgrid._wake_receivers_at_commit() FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._wake_receivers_at_commit() IS 'Internal: wakes the consumers waiting in eventgrid.receive() in this database when the current transaction commits; no-op without shared_preload_libraries.';

CREATE FUNCTION eventgrid._check_delivery_mode(delivery_mode text, topic_type text, endpoint text,
        receive_lock_duration integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer,
        max_events_per_second integer, endpoint_validation text, ordering_key text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF delivery_mode IS NULL OR delivery_mode NOT IN ('push', 'queue') THEN
        RAISE EXCEPTION 'delivery_mode must be push or queue, got %', coalesce(eventgrid._quote(delivery_mode), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'push delivers to the endpoint over HTTP; queue keeps the events for consumers to receive (namespace topics).';
    END IF;
    IF delivery_mode = 'push' THEN
        IF endpoint IS NULL THEN
            RAISE EXCEPTION 'endpoint must not be NULL for a push event subscription'
                USING ERRCODE = 'null_value_not_allowed',
                      HINT = 'Give the webhook URL, or delivery_mode => ''queue'' for pull delivery.';
        END IF;
        IF receive_lock_duration IS NOT NULL THEN
            RAISE EXCEPTION 'receive_lock_duration is a setting of queue event subscriptions only'
                USING ERRCODE = 'invalid_parameter_value', HINT = 'Omit it for a push event subscription.';
        END IF;
        RETURN;
    END IF;
    IF topic_type <> 'namespace' THEN
        RAISE EXCEPTION 'queue event subscriptions are for namespace topics only'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Create the topic with topic_type => ''namespace'' (CloudEvents 1.0).';
    END IF;
    IF endpoint IS NOT NULL THEN
        RAISE EXCEPTION 'a queue event subscription has no endpoint'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Consumers receive its events with eventgrid.receive(); omit endpoint.';
    END IF;
    PERFORM eventgrid._check_range('receive_lock_duration', receive_lock_duration, 60, 300, ' seconds');
    IF coalesce(max_events_per_batch, preferred_batch_size_in_kilobytes, max_events_per_second) IS NOT NULL
       OR coalesce(endpoint_validation, 'none') <> 'none' OR ordering_key IS NOT NULL THEN
        RAISE EXCEPTION 'max_events_per_batch, preferred_batch_size_in_kilobytes, max_events_per_second, endpoint_validation and ordering_key are settings of push event subscriptions only'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A consumer chooses how many events to take with receive(max_events => ...).';
    END IF;
END $$;
REVOKE ALL ON FUNCTION eventgrid._check_delivery_mode(text, text, text, integer, integer, integer, integer, text, text) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._check_delivery_mode(text, text, text, integer, integer, integer, integer, text, text) IS 'Internal: checks delivery_mode (push or queue, 22023) and what goes with it: a push event subscription has an endpoint (22004) and no receive_lock_duration; a queue one belongs to a namespace topic, has no endpoint, batching, rate limit, endpoint validation or ordering_key (22023) and a receive_lock_duration of 60-300 seconds (22003).';


-- the backlog of a queue subscription: what it has not moved yet and what is in eventgrid.queue_events
CREATE OR REPLACE FUNCTION eventgrid._backlog(subscription_id bigint, OUT pending bigint, OUT oldest timestamp with time zone, OUT due_since timestamp with time zone) RETURNS record
    LANGUAGE sql STABLE PARALLEL SAFE
    BEGIN ATOMIC
 SELECT (((u.n + c.n) + r.n) + q.n) AS pending,
     LEAST(u.oldest, c.oldest, r.oldest, q.oldest) AS oldest,
     LEAST(u.oldest, c.oldest, r.due_since, q.due_since) AS due_since
    FROM ( SELECT count(*) AS n,
             min(e.publish_time) AS oldest
            FROM ((eventgrid.subscription_positions p
              JOIN eventgrid.event_subscriptions s ON ((s.id = p.subscription_id)))
              CROSS JOIN LATERAL eventgrid._unpassed_events(s.topic, p.done, p.upto, p.after_txid, p.after_id) e(id, topic, event, publish_time, event_bytes, txid, event_table, source, source_event_id))
           WHERE ((p.subscription_id = _backlog.subscription_id) AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with, s.subject_ends_with, s.is_subject_case_sensitive, s.advanced_filters, s.enable_advanced_filtering_on_arrays))) u,
     ( SELECT count(*) AS n,
             min(e.publish_time) AS oldest
            FROM ((eventgrid.chunks_in_flight c_1
              JOIN eventgrid.event_subscriptions s ON ((s.id = c_1.subscription_id)))
              CROSS JOIN LATERAL eventgrid._chunk_events(c_1.topic, c_1.done, c_1.upto, c_1.after_txid, c_1.after_id, c_1.last_txid, c_1.last_id) e(id, topic, event, publish_time, event_bytes, txid, event_table, source, source_event_id))
           WHERE ((c_1.subscription_id = _backlog.subscription_id) AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with, s.subject_ends_with, s.is_subject_case_sensitive, s.advanced_filters, s.enable_advanced_filtering_on_arrays))) c,
     ( SELECT count(*) AS n,
             min(r_1.publish_time) AS oldest,
             min(r_1.next_attempt_at) FILTER (WHERE (r_1.next_attempt_at <= eventgrid._now())) AS due_since
            FROM eventgrid.retries r_1
           WHERE (r_1.subscription_id = _backlog.subscription_id)) r,
     ( SELECT count(*) AS n,
             min(q_1.publish_time) AS oldest,
             min(q_1.receivable_at) FILTER (WHERE (q_1.receivable_at <= eventgrid._now())) AS due_since
            FROM eventgrid.queue_events q_1
           WHERE (q_1.subscription_id = _backlog.subscription_id)) q;
END;


-- moves a queue subscription's events into eventgrid.queue_events
CREATE OR REPLACE FUNCTION eventgrid._position_to_retries(sid bigint, due timestamp with time zone, keep boolean)
    RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    snap pg_snapshot := pg_current_snapshot();
    n bigint := 0;
    path text;
    hashes bigint[];
    ids bigint[];
    mode text;
BEGIN
    SELECT s.ordering_key, s.delivery_mode INTO path, mode FROM eventgrid.event_subscriptions s WHERE s.id = sid;
    IF keep AND mode = 'queue' THEN
        -- pull delivery: receivable from due on, in publish order (the ids the rows get)
        WITH moved AS (
            INSERT INTO eventgrid.queue_events (subscription_id, event_id, event, publish_time, event_bytes,
                                                receivable_at, source, source_event_id)
            SELECT x.* FROM (
                SELECT s.id, e.id AS event_id, e.event, e.publish_time, coalesce(e.event_bytes, 0), due,
                       e.source, e.source_event_id
                  FROM eventgrid.subscription_positions p
                  JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id
                 CROSS JOIN LATERAL eventgrid._unpassed_events(s.topic, p.done, p.upto, p.after_txid, p.after_id) e
                 WHERE p.subscription_id = sid AND pg_visible_in_snapshot(e.txid, snap)
                   AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with, s.subject_ends_with,
                                          s.is_subject_case_sensitive, s.advanced_filters, s.enable_advanced_filtering_on_arrays)
                 ORDER BY e.id) x
            RETURNING 1
        )
        SELECT count(*) INTO n FROM moved;
        UPDATE eventgrid.subscription_counters c SET matched = c.matched + n WHERE c.subscription_id = sid AND n > 0;
        IF n > 0 THEN
            PERFORM eventgrid._wake_receivers_at_commit();
        END IF;
    ELSIF keep THEN
        -- in publish order (the ids the rows get): by id, all that became visible since the last move
        -- having become visible together
        WITH moved AS (
            INSERT INTO eventgrid.retries (subscription_id, event_id, event, payload, publish_time, event_bytes,
                                           attempts, next_attempt_at, source, source_event_id, ordering_key)
            SELECT x.* FROM (
                SELECT s.id, e.id AS event_id, e.event,
                       (CASE WHEN t.input_schema = s.event_delivery_schema THEN e.event
                             ELSE eventgrid.convert_event(e.event, t.input_schema, s.event_delivery_schema, e.publish_time) END)::text,
                       e.publish_time, coalesce(e.event_bytes, 0), 0,
                       CASE WHEN k.okey IS NULL THEN due ELSE 'infinity' END, e.source, e.source_event_id, k.okey
                  FROM eventgrid.subscription_positions p
                  JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id
                  JOIN eventgrid.topics t ON t.name = s.topic
                 CROSS JOIN LATERAL eventgrid._unpassed_events(s.topic, p.done, p.upto, p.after_txid, p.after_id) e
                 CROSS JOIN LATERAL (SELECT eventgrid._ordering_key(e.event, path) AS okey) k
                 WHERE p.subscription_id = sid AND pg_visible_in_snapshot(e.txid, snap)
                   AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with, s.subject_ends_with,
                                          s.is_subject_case_sensitive, s.advanced_filters, s.enable_advanced_filtering_on_arrays)
                 ORDER BY e.id) x
            RETURNING id, ordering_key_hash, ordering_key IS NOT NULL AS keyed
        )
        SELECT count(*), array_agg(m.ordering_key_hash) FILTER (WHERE m.keyed),
               array_agg(m.id) FILTER (WHERE m.keyed)
          INTO n, hashes, ids FROM moved m;
        UPDATE eventgrid.subscription_counters c SET matched = c.matched + n WHERE c.subscription_id = sid AND n > 0;
        IF hashes IS NOT NULL THEN
            PERFORM eventgrid._start_ordering_keys(array_fill(sid, ARRAY[cardinality(hashes)]), hashes, ids, due);
        END IF;
    END IF;
    UPDATE eventgrid.subscription_positions p SET done = snap, upto = NULL, after_txid = NULL, after_id = NULL
     WHERE p.subscription_id = sid;
    RETURN n;
END $$;
COMMENT ON FUNCTION eventgrid._position_to_retries(sid bigint, due timestamp with time zone, keep boolean) IS 'Internal: moves an event subscription''s position to the current snapshot; with keep, the committed events it passes that match its filters become its retries (no attempt made, due at due) first, in publish order, else they are passed over; of an ordered subscription each with its key, due only when it is the oldest of its key (_start_ordering_keys); of a queue subscription they become receivable in eventgrid.queue_events instead (from due on; waiting receive() calls are woken at commit). Returns how many were moved. The upkeep worker calls it for held subscriptions whose events would keep an event table from being emptied, a delivery worker''s claim for ordered and queue ones; the caller holds the position''s lock.';

CREATE OR REPLACE FUNCTION eventgrid._check_subscription_settings(input_schema text, topic_type text, endpoint text, event_delivery_schema text, included_event_types text[], is_subject_case_sensitive boolean, deadletter boolean, enable_advanced_filtering_on_arrays boolean, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, max_events_per_second integer) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF endpoint IS NOT NULL THEN  -- a queue event subscription has none (_check_delivery_mode)
        PERFORM eventgrid._check_endpoint(endpoint);
    END IF;
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

CREATE OR REPLACE FUNCTION eventgrid._dead_letter_ids(topic text, subscription text, reason text, dead_lettered_after timestamp with time zone, dead_lettered_before timestamp with time zone, existing_only boolean) RETURNS bigint[]
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    ids bigint[];
BEGIN
    IF reason IS NOT NULL AND reason NOT IN ('MaxDeliveryAttemptsExceeded', 'TimeToLiveExceeded', 'NonRetriableError',
                                             'MaxDeliveryCountExceeded', 'Rejected') THEN
        RAISE EXCEPTION 'reason must be MaxDeliveryAttemptsExceeded, TimeToLiveExceeded, NonRetriableError, MaxDeliveryCountExceeded or Rejected, got %',
                        eventgrid._quote(reason)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Pass NULL for any reason.';
    END IF;
    IF dead_lettered_after IS NOT NULL AND dead_lettered_before IS NOT NULL
       AND dead_lettered_after >= dead_lettered_before THEN
        RAISE EXCEPTION 'dead_lettered_after must be earlier than dead_lettered_before'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- a name that is nowhere is a mistake, as in drop_topic(); purging may
    -- name a topic or subscription dropped since, whose dead letters stay
    IF topic IS NOT NULL AND NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = _dead_letter_ids.topic)
       AND (existing_only OR NOT EXISTS (SELECT 1 FROM eventgrid.dead_letters d WHERE d.topic = _dead_letter_ids.topic)) THEN
        RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object',
                  HINT = CASE WHEN existing_only
                              THEN 'Dead letters are redelivered to existing topics only; eventgrid.dead_letter_events lists them.'
                              ELSE 'No topic and no dead letter has this name; eventgrid.dead_letter_events lists the dead letters.' END;
    END IF;
    IF subscription IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s
                        WHERE s.name = _dead_letter_ids.subscription
                          AND (_dead_letter_ids.topic IS NULL OR s.topic = _dead_letter_ids.topic))
       AND (existing_only OR NOT EXISTS (SELECT 1 FROM eventgrid.dead_letters d
                                          WHERE d.subscription_name = _dead_letter_ids.subscription
                                            AND (_dead_letter_ids.topic IS NULL OR d.topic = _dead_letter_ids.topic))) THEN
        RAISE EXCEPTION 'event subscription % does not exist%', eventgrid._quote(subscription),
                        CASE WHEN topic IS NULL THEN '' ELSE format(' for topic %s', eventgrid._quote(topic)) END
            USING ERRCODE = 'undefined_object',
                  HINT = CASE WHEN existing_only
                              THEN 'Dead letters are redelivered to existing event subscriptions only; eventgrid.dead_letter_events lists them.'
                              ELSE 'No event subscription and no dead letter has this name; eventgrid.dead_letter_events lists the dead letters.' END;
    END IF;
    SELECT array_agg(d.id ORDER BY d.id) INTO ids
      FROM (SELECT d.id FROM eventgrid.dead_letters d
             WHERE (_dead_letter_ids.topic IS NULL OR d.topic = _dead_letter_ids.topic)
               AND (_dead_letter_ids.subscription IS NULL OR d.subscription_name = _dead_letter_ids.subscription)
               AND (_dead_letter_ids.reason IS NULL OR d.dead_letter_reason = _dead_letter_ids.reason)
               AND (dead_lettered_after IS NULL OR d.dead_lettered_at >= dead_lettered_after)
               AND (dead_lettered_before IS NULL OR d.dead_lettered_at < dead_lettered_before)
             ORDER BY d.id FOR UPDATE) d;
    RETURN coalesce(ids, '{}');
END $$;

-- create_event_subscription(): endpoint optional, delivery_mode and receive_lock_duration
DROP FUNCTION eventgrid.create_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text, text, text);
DROP FUNCTION eventgrid.update_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text, text, text);
CREATE FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text DEFAULT NULL::text, event_delivery_schema text DEFAULT NULL::text, included_event_types text[] DEFAULT NULL::text[], subject_begins_with text DEFAULT NULL::text, subject_ends_with text DEFAULT NULL::text, is_subject_case_sensitive boolean DEFAULT false, max_delivery_attempts integer DEFAULT NULL::integer, event_ttl integer DEFAULT NULL::integer, max_events_per_batch integer DEFAULT NULL::integer, preferred_batch_size_in_kilobytes integer DEFAULT NULL::integer, deadletter boolean DEFAULT false, advanced_filters jsonb DEFAULT NULL::jsonb, enable_advanced_filtering_on_arrays boolean DEFAULT false, max_delivery_count integer DEFAULT NULL::integer, event_time_to_live text DEFAULT NULL::text, max_events_per_second integer DEFAULT NULL::integer, endpoint_validation text DEFAULT 'none'::text, dead_letter_topic text DEFAULT NULL::text, ordering_key text DEFAULT NULL::text, delivery_mode text DEFAULT 'push'::text, receive_lock_duration integer DEFAULT NULL::integer) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    in_schema text;
    ttype text;
    attempts integer;
    ttl integer;
    sid bigint;
BEGIN
    PERFORM eventgrid._check_not_null('topic', topic);
    SELECT t.input_schema, t.topic_type INTO in_schema, ttype
      FROM eventgrid.topics t WHERE t.name = topic FOR KEY SHARE;
    IF in_schema IS NULL THEN
        RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object', HINT = 'Create it first with eventgrid.create_topic().';
    END IF;
    IF name IS NULL THEN
        RAISE EXCEPTION 'event subscription name must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM eventgrid._check_delivery_mode(delivery_mode, ttype, endpoint, receive_lock_duration,
        max_events_per_batch, preferred_batch_size_in_kilobytes, max_events_per_second, endpoint_validation,
        ordering_key);
    IF delivery_mode = 'queue' THEN
        receive_lock_duration := coalesce(receive_lock_duration, 60);
    END IF;
    IF NOT eventgrid._is_subscription_name(name) THEN
        RAISE EXCEPTION 'invalid event subscription name %', eventgrid._quote(name)
            USING ERRCODE = 'invalid_name',
                  HINT = 'An event subscription name has 3 to 64 characters: letters, digits and hyphens.';
    END IF;
    event_delivery_schema := coalesce(event_delivery_schema, in_schema);
    PERFORM eventgrid._check_subscription_settings(in_schema, ttype, endpoint, event_delivery_schema,
        included_event_types, is_subject_case_sensitive, deadletter, enable_advanced_filtering_on_arrays,
        max_events_per_batch, preferred_batch_size_in_kilobytes, max_events_per_second);
    SELECT r.attempts, r.ttl INTO attempts, ttl
      FROM eventgrid._retry_policy_args(ttype, max_delivery_attempts, event_ttl, max_delivery_count,
                                        event_time_to_live) r;
    advanced_filters := eventgrid._advanced_filters_arg(advanced_filters);
    PERFORM eventgrid._check_endpoint_validation(endpoint_validation);
    PERFORM eventgrid._check_dead_letter_topic(dead_letter_topic);
    PERFORM eventgrid._check_ordering_key(ordering_key);
    IF EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s
                WHERE s.topic = create_event_subscription.topic AND s.name = create_event_subscription.name) THEN
        RAISE EXCEPTION 'event subscription "%" already exists for topic "%"', name, topic
            USING ERRCODE = 'duplicate_object';
    END IF;
    INSERT INTO eventgrid.event_subscriptions AS s
        (topic, name, endpoint, event_delivery_schema, included_event_types, subject_begins_with,
         subject_ends_with, is_subject_case_sensitive, max_delivery_attempts, event_ttl,
         max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter, topic_type,
         advanced_filters, enable_advanced_filtering_on_arrays, max_events_per_second, dead_letter_topic, ordering_key,
         delivery_mode, receive_lock_duration)
    VALUES (topic, name, endpoint, event_delivery_schema, included_event_types, subject_begins_with,
            subject_ends_with, is_subject_case_sensitive, coalesce(attempts, CASE ttype WHEN 'namespace' THEN 10 ELSE 30 END),
            coalesce(ttl, CASE ttype WHEN 'namespace' THEN 10080 ELSE 1440 END),
            max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter, ttype,
            advanced_filters, enable_advanced_filtering_on_arrays, max_events_per_second, dead_letter_topic, ordering_key,
            delivery_mode, receive_lock_duration)
    RETURNING s.id INTO sid;
    INSERT INTO eventgrid.subscription_counters (subscription_id) VALUES (sid);
    -- events of transactions that commit after this one's snapshot are for it
    INSERT INTO eventgrid.subscription_positions (subscription_id, since, done)
    VALUES (sid, pg_current_snapshot(), pg_current_snapshot());
    IF endpoint_validation = 'handshake' THEN
        -- nothing is delivered until the endpoint answers the handshake
        PERFORM eventgrid._start_validation(sid);
        PERFORM eventgrid._wake_worker_at_commit();
    END IF;
    RETURN sid;
END $$;
CREATE FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text DEFAULT NULL::text, event_delivery_schema text DEFAULT NULL::text, included_event_types text[] DEFAULT NULL::text[], subject_begins_with text DEFAULT NULL::text, subject_ends_with text DEFAULT NULL::text, is_subject_case_sensitive boolean DEFAULT NULL::boolean, max_delivery_attempts integer DEFAULT NULL::integer, event_ttl integer DEFAULT NULL::integer, max_events_per_batch integer DEFAULT NULL::integer, preferred_batch_size_in_kilobytes integer DEFAULT NULL::integer, deadletter boolean DEFAULT NULL::boolean, advanced_filters jsonb DEFAULT NULL::jsonb, enable_advanced_filtering_on_arrays boolean DEFAULT NULL::boolean, max_delivery_count integer DEFAULT NULL::integer, event_time_to_live text DEFAULT NULL::text, max_events_per_second integer DEFAULT NULL::integer, endpoint_validation text DEFAULT NULL::text, dead_letter_topic text DEFAULT NULL::text, ordering_key text DEFAULT NULL::text, receive_lock_duration integer DEFAULT NULL::integer) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, name, true);
    cur eventgrid.event_subscriptions;
    in_schema text;
    attempts integer;
    ttl integer;
BEGIN
    SELECT s.* INTO cur FROM eventgrid.event_subscriptions s WHERE s.id = sid;
    SELECT t.input_schema INTO in_schema FROM eventgrid.topics t WHERE t.name = cur.topic;
    IF cur.delivery_mode = 'queue' AND update_event_subscription.endpoint IS NOT NULL THEN
        RAISE EXCEPTION 'event subscription "%" of topic "%" is a queue event subscription: it has no endpoint', name, topic
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'delivery_mode cannot change: create a push event subscription beside it.';
    END IF;
    -- NULL keeps a setting; an empty array, '' or 0 clears one that may be unset
    endpoint := coalesce(endpoint, cur.endpoint);
    receive_lock_duration := coalesce(receive_lock_duration, cur.receive_lock_duration);
    event_delivery_schema := coalesce(event_delivery_schema, cur.event_delivery_schema);
    included_event_types := CASE WHEN included_event_types IS NULL THEN cur.included_event_types
                                 WHEN cardinality(included_event_types) = 0 THEN NULL
                                 ELSE included_event_types END;
    subject_begins_with := CASE WHEN subject_begins_with IS NULL THEN cur.subject_begins_with
                                ELSE nullif(subject_begins_with, '') END;
    subject_ends_with := CASE WHEN subject_ends_with IS NULL THEN cur.subject_ends_with
                              ELSE nullif(subject_ends_with, '') END;
    is_subject_case_sensitive := coalesce(is_subject_case_sensitive, cur.is_subject_case_sensitive);
    deadletter := coalesce(deadletter, cur.deadletter);
    enable_advanced_filtering_on_arrays := coalesce(enable_advanced_filtering_on_arrays,
                                                    cur.enable_advanced_filtering_on_arrays);
    max_events_per_batch := CASE WHEN max_events_per_batch IS NULL THEN cur.max_events_per_batch
                                 ELSE nullif(max_events_per_batch, 0) END;
    preferred_batch_size_in_kilobytes := CASE WHEN preferred_batch_size_in_kilobytes IS NULL
                                              THEN cur.preferred_batch_size_in_kilobytes
                                              ELSE nullif(preferred_batch_size_in_kilobytes, 0) END;
    max_events_per_second := CASE WHEN max_events_per_second IS NULL THEN cur.max_events_per_second
                                  ELSE nullif(max_events_per_second, 0) END;
    PERFORM eventgrid._check_subscription_settings(in_schema, cur.topic_type, endpoint, event_delivery_schema,
        included_event_types, is_subject_case_sensitive, deadletter, enable_advanced_filtering_on_arrays,
        max_events_per_batch, preferred_batch_size_in_kilobytes, max_events_per_second);
    PERFORM eventgrid._check_delivery_mode(cur.delivery_mode, cur.topic_type, endpoint, receive_lock_duration,
        max_events_per_batch, preferred_batch_size_in_kilobytes, max_events_per_second, endpoint_validation,
        nullif(coalesce(ordering_key, cur.ordering_key), ''));
    SELECT r.attempts, r.ttl INTO attempts, ttl
      FROM eventgrid._retry_policy_args(cur.topic_type, max_delivery_attempts, event_ttl, max_delivery_count,
                                        event_time_to_live) r;
    advanced_filters := CASE WHEN advanced_filters IS NULL THEN cur.advanced_filters
                             ELSE eventgrid._advanced_filters_arg(advanced_filters) END;
    IF endpoint_validation IS NOT NULL THEN
        PERFORM eventgrid._check_endpoint_validation(endpoint_validation);
    END IF;
    dead_letter_topic := CASE WHEN dead_letter_topic IS NULL THEN cur.dead_letter_topic
                              ELSE nullif(dead_letter_topic, '') END;
    PERFORM eventgrid._check_dead_letter_topic(dead_letter_topic);
    ordering_key := CASE WHEN ordering_key IS NULL THEN cur.ordering_key ELSE nullif(ordering_key, '') END;
    PERFORM eventgrid._check_ordering_key(ordering_key);
    IF ordering_key IS DISTINCT FROM cur.ordering_key THEN
        -- after the claim or record that holds the position: events it moved are in the retries
        PERFORM 1 FROM eventgrid.subscription_positions p WHERE p.subscription_id = sid FOR UPDATE;
        IF ordering_key IS NULL THEN
            -- unordered from now on: what waited for its key is due at once
            UPDATE eventgrid.retries r
               SET ordering_key = NULL,
                   next_attempt_at = CASE WHEN r.next_attempt_at = 'infinity' THEN eventgrid._now()
                                          ELSE r.next_attempt_at END
             WHERE r.subscription_id = sid AND r.ordering_key IS NOT NULL;
            DELETE FROM eventgrid.ordering_keys k WHERE k.subscription_id = sid;
        END IF;
    END IF;
    UPDATE eventgrid.event_subscriptions s
       SET endpoint = update_event_subscription.endpoint,
           event_delivery_schema = update_event_subscription.event_delivery_schema,
           included_event_types = update_event_subscription.included_event_types,
           subject_begins_with = update_event_subscription.subject_begins_with,
           subject_ends_with = update_event_subscription.subject_ends_with,
           is_subject_case_sensitive = update_event_subscription.is_subject_case_sensitive,
           max_delivery_attempts = coalesce(attempts, s.max_delivery_attempts),
           event_ttl = coalesce(ttl, s.event_ttl),
           max_events_per_batch = update_event_subscription.max_events_per_batch,
           preferred_batch_size_in_kilobytes = update_event_subscription.preferred_batch_size_in_kilobytes,
           deadletter = update_event_subscription.deadletter,
           advanced_filters = update_event_subscription.advanced_filters,
           enable_advanced_filtering_on_arrays = update_event_subscription.enable_advanced_filtering_on_arrays,
           max_events_per_second = update_event_subscription.max_events_per_second,
           dead_letter_topic = update_event_subscription.dead_letter_topic,
           ordering_key = update_event_subscription.ordering_key,
           receive_lock_duration = update_event_subscription.receive_lock_duration
     WHERE s.id = sid;
    IF event_delivery_schema <> cur.event_delivery_schema THEN
        -- a retry keeps the text it is sent as: made again in the new schema
        UPDATE eventgrid.retries r
           SET payload = eventgrid.convert_event(r.event, in_schema, update_event_subscription.event_delivery_schema,
                                                 r.publish_time)::text
         WHERE r.subscription_id = sid;
    END IF;
    IF endpoint <> cur.endpoint THEN
        -- without the statement, which holds the URL
        PERFORM eventgrid._log(format('eventgrid: endpoint of event subscription "%s" of topic "%s" changed by %s',
                                      name, topic, eventgrid._caller()));
    END IF;
    -- a new endpoint, or a new handshake, is validated again; none ends validation
    IF endpoint_validation = 'none' THEN
        DELETE FROM eventgrid.endpoint_validations v WHERE v.subscription_id = sid;
    ELSIF endpoint_validation = 'handshake'
          OR (endpoint <> cur.endpoint
              AND EXISTS (SELECT 1 FROM eventgrid.endpoint_validations v WHERE v.subscription_id = sid))
          OR (event_delivery_schema <> cur.event_delivery_schema
              AND EXISTS (SELECT 1 FROM eventgrid.endpoint_validations v WHERE v.subscription_id = sid)) THEN
        PERFORM eventgrid._start_validation(sid);
    END IF;
    -- requests claimed with the old settings and not sent yet go back
    PERFORM eventgrid._subscriptions_changed_at_commit();
END $$;
REVOKE ALL ON FUNCTION eventgrid.create_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text, text, text, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.create_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text, text, text, text, integer) TO eventgrid_admin;
COMMENT ON FUNCTION eventgrid.create_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text, text, text, text, integer) IS 'Creates an event subscription and returns its id. endpoint (push): http(s) URL that libcurl parses, with a host, at most 2048 bytes (no user name or password). event_delivery_schema: defaults to the topic''s input schema (namespace topics: CloudEvents only). Filters: included_event_types (case-insensitive), subject_begins_with / subject_ends_with (case-insensitive unless is_subject_case_sensitive), advanced_filters (Event Grid JSON, see set_advanced_filters) with enable_advanced_filtering_on_arrays (false). Retry policy of a custom topic: max_delivery_attempts 1-30 (30), event_ttl 1-1440 minutes (1440); of a namespace topic: max_delivery_count 1-10 (10), event_time_to_live ISO 8601 PT1M-P7D (P7D); the other profile''s arguments are refused. max_events_per_batch 1-5000, preferred_batch_size_in_kilobytes 1-1024 (either turns batching on), deadletter (false). max_events_per_second 1-100,000 (NULL: no rate limit; a batch counts its events, retries count; events over the rate wait in the queue). endpoint_validation: none (default) or handshake (Event Grid''s SubscriptionValidationEvent, or for CloudEvents the webhook OPTIONS request; nothing is delivered until the endpoint is validated, see event_subscription_validation). dead_letter_topic: a topic (of this database) to which each event this subscription dead-letters or drops is published as a notification, in the transaction that records it (see README, Dead-letter notifications; NULL: none). ordering_key: a dotted field path (1-512 characters, as a dynamic delivery property''s source_field: subject, data.orderId, partitionkey) whose value (string, number or boolean) is each event''s key: events of one key are delivered in publish order, one request at a time across all delivery workers, the next only once the one before is delivered, dead-lettered or dropped; events without it go unordered (NULL: unordered; see README, Ordered delivery). delivery_mode: push (default: delivered to endpoint) or queue (pull delivery, namespace topics only: no endpoint, batching, rate limit, endpoint validation or ordering_key; consumers call receive(), see README, Pull delivery); receive_lock_duration: of a queue subscription, seconds 60-300 (60) a received event stays locked. Requires eventgrid_admin. Errors: 42704 (also no such dead_letter_topic), 42602, 22023, 22003, 22004, 54000, 42710. SPEC 1, 4, 5, 7, 9, 13, 14.';
REVOKE ALL ON FUNCTION eventgrid.update_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text, text, text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.update_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text, text, text, integer) TO eventgrid_admin;
COMMENT ON FUNCTION eventgrid.update_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text, text, text, integer) IS 'Changes an event subscription in place (as az eventgrid event-subscription update); the arguments are create_event_subscription''s, with the same ranges, checks and SQLSTATEs. A NULL argument keeps the setting; to clear one pass an empty array (included_event_types: all types), an empty string (subject_begins_with, subject_ends_with, dead_letter_topic), [] (advanced_filters) or 0 (max_events_per_batch, preferred_batch_size_in_kilobytes: both cleared turns batching off; max_events_per_second: no rate limit). endpoint_validation: handshake validates the endpoint again (so does a new endpoint or delivery schema of a subscription that validates), none stops validating. The position, the first attempts in flight and the retries are kept, and the next claim uses the new settings: a new endpoint gets its own health state; with a new event_delivery_schema the retries are converted. ordering_key: a new path keys the events claimed from now on (those waiting keep their keys); '''' makes the subscription unordered and what waited for its key due at once. A changed endpoint is logged, without the URL. delivery_mode cannot change (a queue subscription refuses an endpoint, 22023); receive_lock_duration (60-300 seconds, queue subscriptions only) applies to the locks taken from then on. Requires eventgrid_admin. Errors: 22004, 42704, 22023, 22003, 54000. SPEC 1, 4, 5, 7, 9, 13, 14.';

-- the dead letters of a queue subscription are receivable again
CREATE OR REPLACE FUNCTION eventgrid.redeliver_dead_letters(topic text DEFAULT NULL::text, subscription text DEFAULT NULL::text, reason text DEFAULT NULL::text, dead_lettered_after timestamp with time zone DEFAULT NULL::timestamp with time zone, dead_lettered_before timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sids bigint[];
    ids bigint[];
    n bigint;
    ksids bigint[];
    khashes bigint[];
    kids bigint[];
    nreceived bigint;
BEGIN
    -- the subscriptions first (the delivery worker's lock order), then the dead letters
    SELECT array_agg(s.id ORDER BY s.id) INTO sids
      FROM (SELECT s.id FROM eventgrid.event_subscriptions s
             WHERE (redeliver_dead_letters.topic IS NULL OR s.topic = redeliver_dead_letters.topic)
               AND (redeliver_dead_letters.subscription IS NULL OR s.name = redeliver_dead_letters.subscription)
             ORDER BY s.id FOR KEY SHARE) s;
    -- an ordered subscription's position too (as a claim takes it), before the counters
    PERFORM 1 FROM eventgrid.subscription_positions p
      JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id
     WHERE p.subscription_id = ANY (sids) AND s.ordering_key IS NOT NULL
     ORDER BY p.subscription_id FOR UPDATE OF p;
    ids := eventgrid._dead_letter_ids(topic, subscription, reason, dead_lettered_after, dead_lettered_before, true);
    WITH gone AS (
        DELETE FROM eventgrid.dead_letters d
         WHERE d.id = ANY (ids) AND d.subscription_id = ANY (sids)
        RETURNING d.*
    ), queued AS (
        -- a fresh start: no attempts made, the time-to-live counted from now
        -- of an ordered subscription: after the events of its key already waiting
        INSERT INTO eventgrid.retries (subscription_id, event_id, event, payload, publish_time, event_bytes,
                                       attempts, next_attempt_at, source, source_event_id, ordering_key)
        SELECT x.* FROM (
            SELECT g.subscription_id, coalesce(g.event_id, 0), g.event,
                   eventgrid.convert_event(g.event, g.input_schema, s.event_delivery_schema, g.publish_time)::text,
                   eventgrid._now(), octet_length(g.event::text), 0,
                   CASE WHEN k.okey IS NULL THEN eventgrid._now() ELSE 'infinity' END, g.source, g.source_event_id,
                   k.okey
              FROM gone g JOIN eventgrid.event_subscriptions s ON s.id = g.subscription_id
             CROSS JOIN LATERAL (SELECT eventgrid._ordering_key(g.event, s.ordering_key) AS okey) k
             WHERE s.delivery_mode = 'push'
             ORDER BY g.id) x
        RETURNING id, subscription_id, ordering_key_hash, ordering_key IS NOT NULL AS keyed
    ), received AS (
        -- of a queue subscription: receivable at once, its delivery count from 0
        INSERT INTO eventgrid.queue_events (subscription_id, event_id, event, publish_time, event_bytes,
                                            receivable_at, source, source_event_id)
        SELECT x.* FROM (
            SELECT g.subscription_id, coalesce(g.event_id, 0), g.event, eventgrid._now(), octet_length(g.event::text),
                   eventgrid._now(), g.source, g.source_event_id
              FROM gone g JOIN eventgrid.event_subscriptions s ON s.id = g.subscription_id
             WHERE s.delivery_mode = 'queue'
             ORDER BY g.id) x
        RETURNING subscription_id
    ), keyed AS (
        SELECT array_agg(q.subscription_id) AS sids, array_agg(q.ordering_key_hash) AS hashes,
               array_agg(q.id) AS ids
          FROM queued q WHERE q.keyed
    ), counted AS (
        SELECT q.subscription_id, count(*) AS n
          FROM (SELECT q.subscription_id FROM queued q UNION ALL SELECT r.subscription_id FROM received r) q
         GROUP BY q.subscription_id
    ), bumped AS (
        UPDATE eventgrid.subscription_counters c SET redelivered = c.redelivered + counted.n
          FROM counted WHERE c.subscription_id = counted.subscription_id
    )
    SELECT coalesce(sum(counted.n), 0), (SELECT k.sids FROM keyed k), (SELECT k.hashes FROM keyed k),
           (SELECT k.ids FROM keyed k), (SELECT count(*) FROM received)
      INTO n, ksids, khashes, kids, nreceived FROM counted;
    IF ksids IS NOT NULL THEN
        PERFORM eventgrid._start_ordering_keys(ksids, khashes, kids, eventgrid._now());
    END IF;
    IF n > nreceived THEN
        PERFORM eventgrid._wake_worker_at_commit();
    END IF;
    IF nreceived > 0 THEN
        PERFORM eventgrid._wake_receivers_at_commit();
    END IF;
    RETURN n;
END $$;
COMMENT ON FUNCTION eventgrid.redeliver_dead_letters(text, text, text, timestamptz, timestamptz) IS 'Queues dead letters for delivery again and returns how many: each becomes a delivery with no attempts made and its time-to-live counted from now, due at once, and leaves eventgrid.dead_letters (if it fails again it is dead-lettered again). Filters (NULL: any): topic, subscription name, reason (MaxDeliveryAttemptsExceeded, TimeToLiveExceeded, NonRetriableError, and for queue subscriptions MaxDeliveryCountExceeded, Rejected), dead_lettered_at >= dead_lettered_after and < dead_lettered_before. Of an ordered subscription (ordering_key) each goes after the events of its key that wait, in the order the dead letters were written: not back in its place. Of a queue subscription each becomes receivable at once with a delivery count of 0. Dead letters of dropped subscriptions stay. Running it twice queues nothing the second time. Counted in subscription_counters.redelivered. Requires eventgrid_admin. Errors: 22023 unknown reason or empty time range, 42704 no such topic or subscription. SPEC 7.';

-- namespace dead letters: the reasons of queue subscriptions
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
                WHEN 'MaxDeliveryCountExceeded'::text THEN 'Maximum delivery count was exceeded.'::text
                WHEN 'Rejected'::text THEN 'The event was rejected by a receiver.'::text
                ELSE 'Delivery failed with an error that is not retried.'::text
            END, 'deliveryattempts', d.delivery_attempts, 'deliveryresult', COALESCE((d.last_delivery_outcome || COALESCE(((' (HTTP '::text || d.last_http_status_code) || ')'::text), ''::text)), CASE WHEN (d.delivery_attempts > 0) THEN 'Received'::text ELSE 'NotAttempted'::text END), 'publishutc', eventgrid.rfc3339(d.publish_time), 'deliveryattemptutc', eventgrid.rfc3339(d.last_delivery_attempt_time)), 'event', d.event)
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

CREATE OR REPLACE VIEW eventgrid.event_subscription_metric_labels AS
 SELECT s.topic,
    s.name AS event_subscription,
    'delivery_attempt_fail_total'::text AS metric,
    m.label,
    m.value
   FROM (eventgrid.event_subscriptions s
     JOIN eventgrid.subscription_metric_counts m ON (((m.subscription_id = s.id) AND (m.metric = 'attempt_fail'::text))))
UNION ALL
 SELECT s.topic,
    s.name AS event_subscription,
    (k.metric || '_total'::text) AS metric,
    r.reason AS label,
    COALESCE(m.value, (0)::double precision) AS value
   FROM (((eventgrid.event_subscriptions s
     CROSS JOIN ( VALUES ('dead_lettered'::text), ('dropped'::text)) k(metric))
     CROSS JOIN LATERAL unnest(CASE s.delivery_mode WHEN 'queue'::text THEN ARRAY['MaxDeliveryCountExceeded'::text, 'TimeToLiveExceeded'::text, 'Rejected'::text] ELSE ARRAY['MaxDeliveryAttemptsExceeded'::text, 'TimeToLiveExceeded'::text, 'NonRetriableError'::text] END) r(reason))
     LEFT JOIN eventgrid.subscription_metric_counts m ON (((m.subscription_id = s.id) AND (m.metric = k.metric) AND (m.label = r.reason))));

CREATE FUNCTION eventgrid._queue_subscription_id(topic text, subscription text) RETURNS bigint
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, subscription);
BEGIN
    IF NOT EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s WHERE s.id = sid AND s.delivery_mode = 'queue') THEN
        RAISE EXCEPTION 'event subscription % of topic % delivers by push, not from a queue', eventgrid._quote(subscription),
                        eventgrid._quote(topic)
            USING ERRCODE = 'wrong_object_type',
                  HINT = 'Pull delivery needs a queue event subscription: create_event_subscription(topic, name, delivery_mode => ''queue'').';
    END IF;
    RETURN sid;
END $$;
REVOKE ALL ON FUNCTION eventgrid._queue_subscription_id(text, text) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._queue_subscription_id(text, text) IS 'Internal: the id of a queue event subscription; 22004 NULL, 42704 none, 42809 a push event subscription.';

CREATE FUNCTION eventgrid._queue_count(sid bigint, received bigint, acknowledged bigint, released bigint,
                                       rejected bigint, lock_expired bigint) RETURNS void
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
    INSERT INTO eventgrid.queue_counters AS c (subscription_id, slot, received, acknowledged, released, rejected, lock_expired)
    SELECT sid, pg_backend_pid() % 16, received, acknowledged, released, rejected, lock_expired
     WHERE received + acknowledged + released + rejected + lock_expired > 0
    ON CONFLICT (subscription_id, slot) DO UPDATE
       SET received = c.received + excluded.received, acknowledged = c.acknowledged + excluded.acknowledged,
           released = c.released + excluded.released, rejected = c.rejected + excluded.rejected,
           lock_expired = c.lock_expired + excluded.lock_expired;
END;
REVOKE ALL ON FUNCTION eventgrid._queue_count(bigint, bigint, bigint, bigint, bigint, bigint) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._queue_count(bigint, bigint, bigint, bigint, bigint, bigint) IS 'Internal: adds to the subscriber operations'' totals of a queue event subscription, in the counter slot of this backend.';

CREATE FUNCTION eventgrid._queue_finish(sid bigint, ids bigint[], reason text) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    sub eventgrid.event_subscriptions;
    n integer;
BEGIN
    SELECT * INTO sub FROM eventgrid.event_subscriptions x WHERE x.id = sid;
    WITH gone AS (
        DELETE FROM eventgrid.queue_events q WHERE q.id = ANY (ids) AND q.subscription_id = sid
        RETURNING q.*
    ), dead AS (
        INSERT INTO eventgrid.dead_letters (topic, subscription_name, subscription_id, input_schema,
               event_delivery_schema, event, dead_letter_reason, delivery_attempts, publish_time,
               last_delivery_attempt_time, topic_type, event_id, source, source_event_id)
        SELECT sub.topic, sub.name, sid, 'CloudEventSchemaV1_0', sub.event_delivery_schema, g.event, reason,
               g.delivery_count, g.publish_time, g.received_at, sub.topic_type, g.event_id, g.source, g.source_event_id
          FROM gone g WHERE sub.deadletter
         ORDER BY g.id
    ), notified AS (
        INSERT INTO eventgrid.dead_letter_notification_failures (subscription_id, topic, subscription_name,
               event_id, dead_letter_topic, sqlstate, error)
        SELECT x.* FROM (SELECT ARRAY(
            SELECT ROW(sid, g.event_id, sub.dead_letter_topic, sub.topic, sub.name, g.event, 'CloudEventSchemaV1_0',
                       sub.deadletter, reason, g.delivery_count, NULL, NULL, g.publish_time, g.received_at,
                       g.source)::eventgrid._dead_letter_notice
              FROM gone g ORDER BY g.id) AS a) q
         CROSS JOIN LATERAL eventgrid._publish_dead_letter_notifications(q.a) x
         WHERE sub.dead_letter_topic IS NOT NULL AND cardinality(q.a) > 0
    )
    SELECT count(*) INTO n FROM gone;
    IF n > 0 THEN
        UPDATE eventgrid.subscription_counters c
           SET dead_lettered = c.dead_lettered + CASE WHEN sub.deadletter THEN n ELSE 0 END,
               dropped = c.dropped + CASE WHEN sub.deadletter THEN 0 ELSE n END
         WHERE c.subscription_id = sid;
        INSERT INTO eventgrid.subscription_metric_counts AS m (subscription_id, metric, label, value)
        VALUES (sid, CASE WHEN sub.deadletter THEN 'dead_lettered' ELSE 'dropped' END, reason, n)
        ON CONFLICT (subscription_id, metric, label) DO UPDATE SET value = m.value + excluded.value;
    END IF;
    RETURN n;
END $$;
REVOKE ALL ON FUNCTION eventgrid._queue_finish(bigint, bigint[], text) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._queue_finish(bigint, bigint[], text) IS 'Internal: removes events ids of queue event subscription sid from eventgrid.queue_events and dead-letters them with reason (MaxDeliveryCountExceeded, TimeToLiveExceeded, Rejected; delivery_attempts: how many times they were received), or drops them when dead-lettering is off; publishes their dead-letter notifications and counts them as the delivery workers do. Returns how many.';

CREATE FUNCTION eventgrid._queue_take(sid bigint, max_events integer, after timestamptz DEFAULT '-infinity')
    RETURNS TABLE (lock_token text, delivery_count integer, event jsonb, was_receivable_at timestamptz)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    sub eventgrid.event_subscriptions;
    t_now timestamptz := eventgrid._clock_now();
    live tid[];
    low timestamptz;
    over_count bigint[];
    over_ttl bigint[];
    expired integer;
    got integer := 0;
    lost integer := 0;
    finished integer := 0;
BEGIN
    SELECT * INTO sub FROM eventgrid.event_subscriptions x WHERE x.id = sid;
    LOOP
        -- receivable now: never received, released, or locked by a receive whose lock expired;
        -- those another session is taking are skipped
        SELECT array_agg(c.tid) FILTER (WHERE c.state = 'live'), min(c.receivable_at) FILTER (WHERE c.state = 'live'),
               array_agg(c.id) FILTER (WHERE c.state = 'count'),
               array_agg(c.id) FILTER (WHERE c.state = 'ttl'),
               count(*) FILTER (WHERE c.was_locked)
          INTO live, low, over_count, over_ttl, expired
          FROM (SELECT q.ctid AS tid, q.id, q.receivable_at, q.lock_secret IS NOT NULL AS was_locked,
                       CASE WHEN q.publish_time + sub.event_ttl * interval '1 minute' <= t_now THEN 'ttl'
                            WHEN q.delivery_count >= sub.max_delivery_attempts THEN 'count'
                            ELSE 'live' END AS state
                  FROM eventgrid.queue_events q
                 WHERE q.subscription_id = sid AND q.receivable_at <= t_now AND q.receivable_at >= after
                 ORDER BY q.receivable_at, q.id
                 LIMIT max_events - got
                 FOR UPDATE SKIP LOCKED) c;
        lost := lost + expired;
        IF over_count IS NOT NULL THEN
            finished := finished + eventgrid._queue_finish(sid, over_count, 'MaxDeliveryCountExceeded');
        END IF;
        IF over_ttl IS NOT NULL THEN
            finished := finished + eventgrid._queue_finish(sid, over_ttl, 'TimeToLiveExceeded');
        END IF;
        IF live IS NOT NULL THEN
            -- each lock a new token: the event's id and a new random secret (gen_random_uuid: 122 random bits),
            -- valid receive_lock_duration seconds
            RETURN QUERY
            -- by tid: the rows are locked by this transaction, so they stay where they are
            WITH taken AS (
                UPDATE eventgrid.queue_events q
                   SET lock_secret = gen_random_uuid(), delivery_count = q.delivery_count + 1,
                       receivable_at = t_now + sub.receive_lock_duration * interval '1 second', received_at = t_now
                 WHERE q.ctid = ANY (live)
                RETURNING q.id, q.lock_secret, q.delivery_count, q.event
            )
            SELECT t.id || ':' || t.lock_secret, t.delivery_count, t.event, low FROM taken t ORDER BY t.id;
            got := got + cardinality(live);
        END IF;
        -- what was dead-lettered made room: look again, until enough or nothing is left
        EXIT WHEN got >= max_events OR (over_count IS NULL AND over_ttl IS NULL);
    END LOOP;
    PERFORM eventgrid._queue_count(sid, got, 0, 0, 0, lost);
    IF got = 0 AND finished > 0 THEN
        -- one row of NULLs: something was done (receive() keeps its subtransaction) though nothing was taken
        RETURN QUERY SELECT NULL::text, NULL::integer, NULL::jsonb, NULL::timestamptz;
    END IF;
END $$;
REVOKE ALL ON FUNCTION eventgrid._queue_take(bigint, integer, timestamptz) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._queue_take(bigint, integer, timestamptz) IS 'Internal: takes up to max_events receivable events of queue event subscription sid whose receivable_at is not before after (FOR UPDATE SKIP LOCKED, oldest receivable first, in publish order among those receivable together), locks each with a new random lock token for the subscription''s receive_lock_duration and adds 1 to its delivery count (was_receivable_at: the earliest receivable_at the taken rows had, which receive() starts its next look from); those past their time to live or already received max_delivery_count times are dead-lettered instead (_queue_finish), and when that was all it did it returns one row of NULLs. eventgrid.receive() calls it in a subtransaction of the caller''s transaction.';

CREATE FUNCTION eventgrid._queue_expire(now timestamptz) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    r record;
    n bigint := 0;
BEGIN
    FOR r IN
        SELECT s.id, x.reason, array_agg(x.id ORDER BY x.id) AS ids, count(*) FILTER (WHERE x.was_locked) AS lost
          FROM eventgrid.event_subscriptions s
         CROSS JOIN LATERAL (
               SELECT q.id, q.lock_secret IS NOT NULL AS was_locked,
                      CASE WHEN q.publish_time + s.event_ttl * interval '1 minute' <= now THEN 'TimeToLiveExceeded'
                           ELSE 'MaxDeliveryCountExceeded' END AS reason
                 FROM eventgrid.queue_events q
                WHERE q.subscription_id = s.id AND q.receivable_at <= now
                  AND (q.publish_time + s.event_ttl * interval '1 minute' <= now
                       OR q.delivery_count >= s.max_delivery_attempts)
                FOR UPDATE OF q SKIP LOCKED) x
         WHERE s.delivery_mode = 'queue'
         GROUP BY s.id, x.reason
    LOOP
        n := n + eventgrid._queue_finish(r.id, r.ids, r.reason);
        PERFORM eventgrid._queue_count(r.id, 0, 0, 0, 0, r.lost);
    END LOOP;
    RETURN n;
END $$;
REVOKE ALL ON FUNCTION eventgrid._queue_expire(timestamptz) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._queue_expire(timestamptz) IS 'Internal: dead-letters (or drops) the receivable events of every queue event subscription that are past their time to live or were received max_delivery_count times and not settled, as receive() would when it came to them; returns how many. The upkeep worker runs it every 10 s (and after new settings), so that they leave without a consumer.';

CREATE FUNCTION eventgrid._parse_lock_tokens(lock_tokens text[])
    RETURNS TABLE (ord bigint, tok text, id bigint, secret uuid)
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
    SELECT x.ord, x.tok,
           CASE WHEN x.ok THEN split_part(x.tok, ':', 1)::bigint END,
           CASE WHEN x.ok THEN split_part(x.tok, ':', 2)::uuid END
      FROM (SELECT u.tok, u.ord,
                   coalesce(u.tok ~ '^[0-9]{1,18}:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$', false) AS ok
              FROM unnest(lock_tokens) WITH ORDINALITY AS u(tok, ord)) x;
END;
REVOKE ALL ON FUNCTION eventgrid._parse_lock_tokens(text[]) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._parse_lock_tokens(text[]) IS 'Internal: each lock token of an operation''s argument, in order, with the event id and lock secret it is made of (id:secret, as receive() makes them; NULL when it is not of that form).';

CREATE FUNCTION eventgrid._lock_token_results(sid bigint, lock_tokens text[], done text[], operation text)
    RETURNS TABLE (lock_token text, succeeded boolean, error text)
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    BEGIN ATOMIC
    SELECT t.tok, t.settled,
           CASE WHEN t.settled THEN NULL
                WHEN t.id IS NULL THEN 'InvalidLockToken: not a lock token of eventgrid.receive()'
                WHEN (t.id || ':' || t.secret) = ANY (done) THEN 'TokenLost: the same lock token came earlier in this call'
                WHEN EXISTS (SELECT 1 FROM eventgrid.queue_events q
                              WHERE q.id = t.id AND q.lock_secret = t.secret AND q.subscription_id = sid
                                AND q.receivable_at <= eventgrid._clock_now())
                THEN 'TokenLost: the lock expired; the event can be received again'
                WHEN operation = 'renew' AND EXISTS (SELECT 1 FROM eventgrid.queue_events q
                                                      WHERE q.id = t.id AND q.lock_secret = t.secret
                                                        AND q.subscription_id = sid)
                THEN 'LockRenewalLimitExceeded: a lock can be renewed within 1 hour of its receive only'
                ELSE 'TokenLost: no such lock; the event was settled, received again after its lock expired, or belongs to another event subscription'
           END
      FROM (SELECT p.tok, p.ord, p.id, p.secret,
                   coalesce((p.id || ':' || p.secret) = ANY (done), false)
                   AND row_number() OVER (PARTITION BY p.id, p.secret ORDER BY p.ord) = 1 AS settled
              FROM eventgrid._parse_lock_tokens(lock_tokens) p) t
     ORDER BY t.ord;
END;
REVOKE ALL ON FUNCTION eventgrid._lock_token_results(bigint, text[], text[], text) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._lock_token_results(bigint, text[], text[], text) IS 'Internal: the result row of each lock token an operation was given, in the order given: succeeded when the operation settled it (done: the tokens it settled, as id:secret), else why not (InvalidLockToken, TokenLost, LockRenewalLimitExceeded).';

CREATE FUNCTION eventgrid._lock_token_keys(lock_tokens text[], OUT ids bigint[], OUT tokens text[])
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM eventgrid._check_not_null('lock_tokens', lock_tokens);
    IF cardinality(lock_tokens) > 1000 THEN
        RAISE EXCEPTION 'lock_tokens must hold at most 1000 lock tokens, got %', cardinality(lock_tokens)
            USING ERRCODE = 'program_limit_exceeded', HINT = 'Settle the events of up to ten receive() calls at a time.';
    END IF;
    SELECT coalesce(array_agg(t.id), '{}'), coalesce(array_agg(t.id || ':' || t.secret), '{}') INTO ids, tokens
      FROM eventgrid._parse_lock_tokens(lock_tokens) t WHERE t.id IS NOT NULL;
END $$;
REVOKE ALL ON FUNCTION eventgrid._lock_token_keys(text[]) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._lock_token_keys(text[]) IS 'Internal: the well-formed lock tokens of an operation''s argument as the event ids they name and the tokens normalized (id:secret), which the operations find their rows by (primary key, then the token); 22004 when lock_tokens is NULL, 54000 when it holds more than 1000.';

CREATE FUNCTION eventgrid.receive(topic text, subscription text, max_events integer DEFAULT 1,
                                  max_wait_time integer DEFAULT 60)
    RETURNS TABLE (lock_token text, delivery_count integer, event jsonb)
    LANGUAGE c SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS 'MODULE_PATHNAME', 'eventgrid_receive';
REVOKE ALL ON FUNCTION eventgrid.receive(text, text, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.receive(text, text, integer, integer) TO eventgrid_receiver, eventgrid_admin;
COMMENT ON FUNCTION eventgrid.receive(text, text, integer, integer) IS 'Pull delivery (SPEC 14): receives up to max_events (1-100, default 1) events of a queue event subscription, each locked to the caller for the subscription''s receive_lock_duration: rows (lock_token, delivery_count: how many times it was received, this one included, event: the CloudEvent). Returns as soon as any event is receivable (a long poll woken by the commit that published it) or empty after max_wait_time seconds (10-120, default 60); while it waits it holds its transaction''s snapshot and connection, no lock on the event tables. Settle each event with acknowledge(), release() or reject(), or renew_locks(); an expired lock makes the event receivable again. Events past their time to live, or received max_delivery_count times, are dead-lettered (or dropped) instead of returned. READ COMMITTED only. Requires eventgrid_receiver (or eventgrid_admin). Errors: 22004 NULL, 22003 out of range, 42704 no such subscription, 42809 a push subscription, 0A000 REPEATABLE READ or SERIALIZABLE, 55000 not in shared_preload_libraries.';

CREATE FUNCTION eventgrid.acknowledge(topic text, subscription text, lock_tokens text[])
    RETURNS TABLE (lock_token text, succeeded boolean, error text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    sid bigint := eventgrid._queue_subscription_id(topic, subscription);
    k record := eventgrid._lock_token_keys(lock_tokens);
    done text[];
BEGIN
    -- by primary key (no join: a plan that cannot become a scan of the queue), then the secret
    WITH gone AS (
        DELETE FROM eventgrid.queue_events q
         WHERE q.id = ANY (k.ids) AND (q.id || ':' || q.lock_secret) = ANY (k.tokens) AND q.subscription_id = sid
           AND q.receivable_at > eventgrid._clock_now()
        RETURNING q.id || ':' || q.lock_secret AS tok
    )
    SELECT coalesce(array_agg(g.tok), '{}') INTO done FROM gone g;
    PERFORM eventgrid._queue_count(sid, 0, cardinality(done), 0, 0, 0);
    RETURN QUERY SELECT * FROM eventgrid._lock_token_results(sid, lock_tokens, done, 'acknowledge');
END $$;
REVOKE ALL ON FUNCTION eventgrid.acknowledge(text, text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.acknowledge(text, text, text[]) TO eventgrid_receiver, eventgrid_admin;
COMMENT ON FUNCTION eventgrid.acknowledge(text, text, text[]) IS 'Pull delivery (SPEC 14): the events whose locks lock_tokens (at most 1000, from receive()) name are delivered and leave the queue subscription. One row per token, in order: (lock_token, succeeded, error); a token that is malformed, unknown, expired or already settled fails only itself (error: InvalidLockToken or TokenLost, and why). Requires eventgrid_receiver (or eventgrid_admin). Errors: 22004 NULL, 54000 over 1000 tokens, 42704, 42809.';

CREATE FUNCTION eventgrid._queue_locked(sid bigint, key_ids bigint[], key_tokens text[], OUT ids bigint[], OUT tokens text[])
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    BEGIN ATOMIC
    SELECT coalesce(array_agg(l.id ORDER BY l.id), '{}'), coalesce(array_agg(l.id || ':' || l.lock_secret), '{}')
      FROM (SELECT q.id, q.lock_secret FROM eventgrid.queue_events q
             WHERE q.id = ANY (key_ids) AND (q.id || ':' || q.lock_secret) = ANY (key_tokens)
               AND q.subscription_id = sid AND q.receivable_at > eventgrid._clock_now()
             ORDER BY q.id FOR UPDATE) l;
END;
REVOKE ALL ON FUNCTION eventgrid._queue_locked(bigint, bigint[], text[]) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._queue_locked(bigint, bigint[], text[]) IS 'Internal: locks (FOR UPDATE) the events of queue event subscription sid whose locks the keys of _lock_token_keys() name and have not expired; their ids and tokens (id:secret).';

CREATE FUNCTION eventgrid.release(topic text, subscription text, lock_tokens text[], release_delay integer DEFAULT 0)
    RETURNS TABLE (lock_token text, succeeded boolean, error text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    sid bigint := eventgrid._queue_subscription_id(topic, subscription);
    k record := eventgrid._lock_token_keys(lock_tokens);
    l record;
BEGIN
    IF release_delay IS NULL OR release_delay NOT IN (0, 10, 60, 600, 3600) THEN
        RAISE EXCEPTION 'release_delay must be 0, 10, 60, 600 or 3600 seconds, got %', coalesce(release_delay::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'These are Event Grid''s release delays.';
    END IF;
    l := eventgrid._queue_locked(sid, k.ids, k.tokens);
    UPDATE eventgrid.queue_events q
       SET lock_secret = NULL, receivable_at = eventgrid._clock_now() + release_delay * interval '1 second'
     WHERE q.id = ANY (l.ids);
    IF cardinality(l.ids) > 0 THEN
        -- receivable again now, or waiting consumers look when the delay ends
        PERFORM eventgrid._wake_receivers_at_commit();
    END IF;
    PERFORM eventgrid._queue_count(sid, 0, 0, cardinality(l.ids), 0, 0);
    RETURN QUERY SELECT * FROM eventgrid._lock_token_results(sid, lock_tokens, l.tokens, 'release');
END $$;
REVOKE ALL ON FUNCTION eventgrid.release(text, text, text[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.release(text, text, text[], integer) TO eventgrid_receiver, eventgrid_admin;
COMMENT ON FUNCTION eventgrid.release(text, text, text[], integer) IS 'Pull delivery (SPEC 14): the events whose locks lock_tokens (at most 1000) name are unlocked and can be received again after release_delay seconds (0, 10, 60, 600 or 3600; default 0), with their delivery count raised by the next receive (past max_delivery_count they are dead-lettered). One row per token, in order: (lock_token, succeeded, error); a malformed, unknown, expired or settled token fails only itself. Requires eventgrid_receiver (or eventgrid_admin). Errors: 22004, 22023 another release_delay, 54000, 42704, 42809.';

CREATE FUNCTION eventgrid.reject(topic text, subscription text, lock_tokens text[])
    RETURNS TABLE (lock_token text, succeeded boolean, error text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    sid bigint := eventgrid._queue_subscription_id(topic, subscription);
    k record := eventgrid._lock_token_keys(lock_tokens);
    l record;
BEGIN
    l := eventgrid._queue_locked(sid, k.ids, k.tokens);
    PERFORM eventgrid._queue_finish(sid, l.ids, 'Rejected');
    PERFORM eventgrid._queue_count(sid, 0, 0, 0, cardinality(l.ids), 0);
    RETURN QUERY SELECT * FROM eventgrid._lock_token_results(sid, lock_tokens, l.tokens, 'reject');
END $$;
REVOKE ALL ON FUNCTION eventgrid.reject(text, text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.reject(text, text, text[]) TO eventgrid_receiver, eventgrid_admin;
COMMENT ON FUNCTION eventgrid.reject(text, text, text[]) IS 'Pull delivery (SPEC 14): the events whose locks lock_tokens (at most 1000) name are dead-lettered at once with reason Rejected (dropped when the subscription does not dead-letter; a dead_letter_topic gets its notification). One row per token, in order: (lock_token, succeeded, error); a malformed, unknown, expired or settled token fails only itself. Requires eventgrid_receiver (or eventgrid_admin). Errors: 22004, 54000, 42704, 42809.';

CREATE FUNCTION eventgrid.renew_locks(topic text, subscription text, lock_tokens text[])
    RETURNS TABLE (lock_token text, succeeded boolean, error text)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
DECLARE
    sid bigint := eventgrid._queue_subscription_id(topic, subscription);
    t_now timestamptz := eventgrid._clock_now();
    k record := eventgrid._lock_token_keys(lock_tokens);
    lock_seconds integer;
    done text[];
BEGIN
    SELECT s.receive_lock_duration INTO lock_seconds FROM eventgrid.event_subscriptions s WHERE s.id = sid;
    WITH renewed AS (
        UPDATE eventgrid.queue_events q
           SET receivable_at = t_now + lock_seconds * interval '1 second'
         WHERE q.id = ANY (k.ids) AND (q.id || ':' || q.lock_secret) = ANY (k.tokens) AND q.subscription_id = sid
           AND q.receivable_at > t_now
           AND q.received_at > t_now - interval '1 hour'
        RETURNING q.id || ':' || q.lock_secret AS tok
    )
    SELECT coalesce(array_agg(r.tok), '{}') INTO done FROM renewed r;
    RETURN QUERY SELECT * FROM eventgrid._lock_token_results(sid, lock_tokens, done, 'renew');
END $$;
REVOKE ALL ON FUNCTION eventgrid.renew_locks(text, text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.renew_locks(text, text, text[]) TO eventgrid_receiver, eventgrid_admin;
COMMENT ON FUNCTION eventgrid.renew_locks(text, text, text[]) IS 'Pull delivery (SPEC 14): the locks lock_tokens (at most 1000) name last the subscription''s receive_lock_duration again from now, within 1 hour of the receive that took them (after that: LockRenewalLimitExceeded). One row per token, in order: (lock_token, succeeded, error); a malformed, unknown, expired or settled token fails only itself. Requires eventgrid_receiver (or eventgrid_admin). Errors: 22004, 54000, 42704, 42809.';


CREATE VIEW eventgrid.queue_metrics AS
SELECT s.topic, s.name AS event_subscription,
       coalesce(k.received, 0) AS received_total, coalesce(k.acknowledged, 0) AS acknowledged_total,
       coalesce(k.released, 0) AS released_total, coalesce(k.rejected, 0) AS rejected_total,
       coalesce(k.lock_expired, 0) AS lock_expired_total,
       coalesce(c.dead_lettered, 0) AS dead_lettered_total, coalesce(c.dropped, 0) AS dropped_total,
       q.receivable AS receivable_events, q.locked AS locked_events, q.delayed AS delayed_events,
       coalesce(extract(epoch FROM eventgrid._now() - q.oldest)::float8, 0) AS oldest_receivable_event_age_seconds
  FROM eventgrid.event_subscriptions s
  LEFT JOIN (SELECT x.subscription_id, sum(x.received)::bigint AS received, sum(x.acknowledged)::bigint AS acknowledged,
                    sum(x.released)::bigint AS released, sum(x.rejected)::bigint AS rejected,
                    sum(x.lock_expired)::bigint AS lock_expired
               FROM eventgrid.queue_counters x GROUP BY x.subscription_id) k ON k.subscription_id = s.id
  LEFT JOIN eventgrid.subscription_counters c ON c.subscription_id = s.id
 CROSS JOIN LATERAL (
       SELECT count(*) FILTER (WHERE e.receivable_at <= eventgrid._now()) AS receivable,
              count(*) FILTER (WHERE e.lock_secret IS NOT NULL AND e.receivable_at > eventgrid._now()) AS locked,
              count(*) FILTER (WHERE e.lock_secret IS NULL AND e.receivable_at > eventgrid._now()) AS delayed,
              min(e.publish_time) FILTER (WHERE e.receivable_at <= eventgrid._now()) AS oldest
         FROM eventgrid.queue_events e WHERE e.subscription_id = s.id) q
 WHERE s.delivery_mode = 'queue';
GRANT SELECT ON eventgrid.queue_metrics TO pg_monitor, eventgrid_admin;
-- the view's ages are on the workers' clock
GRANT EXECUTE ON FUNCTION eventgrid._now() TO pg_monitor;
COMMENT ON VIEW eventgrid.queue_metrics IS 'Pull delivery (SPEC 14), per queue event subscription: Event Grid''s pull metrics as Prometheus counters (received_total: events returned by receive(), each receive of an event counted; acknowledged_total, released_total, rejected_total; lock_expired_total: locks that ran out, counted when their event is next received or dead-lettered; dead_lettered_total and dropped_total, all reasons) and gauges: receivable_events (can be received now), locked_events (received, lock running), delayed_events (released with a delay), oldest_receivable_event_age_seconds (since the publish of the oldest receivable event; 0: none). Readable by pg_monitor and eventgrid_admin. README "Pull delivery".';


CREATE OR REPLACE VIEW eventgrid.delivery_statistics AS
 SELECT s.topic,
    s.name AS subscription,
    eventgrid._pending(s.id) AS pending,
    ( SELECT count(*) AS count
           FROM eventgrid.retries r
          WHERE (r.subscription_id = s.id)) AS retrying,
    COALESCE(c.delivered, (0)::bigint) AS delivered,
    COALESCE(c.failed_attempts, (0)::bigint) AS failed_attempts,
    COALESCE(c.dead_lettered, (0)::bigint) AS dead_lettered,
    COALESCE(c.dropped, (0)::bigint) AS dropped,
    COALESCE(c.redelivered, (0)::bigint) AS redelivered,
    (s.id IN ( SELECT p.p
           FROM eventgrid._paused_subscriptions() p(p))) AS paused,
    s.delivery_mode,
    CASE WHEN (s.delivery_mode = 'queue'::text) THEN COALESCE(k.received, (0)::bigint) ELSE NULL::bigint END AS received,
    CASE WHEN (s.delivery_mode = 'queue'::text) THEN COALESCE(k.acknowledged, (0)::bigint) ELSE NULL::bigint END AS acknowledged,
    CASE WHEN (s.delivery_mode = 'queue'::text) THEN COALESCE(k.released, (0)::bigint) ELSE NULL::bigint END AS released,
    CASE WHEN (s.delivery_mode = 'queue'::text) THEN COALESCE(k.rejected, (0)::bigint) ELSE NULL::bigint END AS rejected,
    CASE WHEN (s.delivery_mode = 'queue'::text) THEN COALESCE(k.lock_expired, (0)::bigint) ELSE NULL::bigint END AS lock_expired
   FROM ((eventgrid.event_subscriptions s
     LEFT JOIN eventgrid.subscription_counters c ON ((c.subscription_id = s.id)))
     LEFT JOIN LATERAL ( SELECT sum(x.received)::bigint AS received, sum(x.acknowledged)::bigint AS acknowledged,
            sum(x.released)::bigint AS released, sum(x.rejected)::bigint AS rejected, sum(x.lock_expired)::bigint AS lock_expired
           FROM eventgrid.queue_counters x
          WHERE x.subscription_id = s.id AND s.delivery_mode = 'queue') k ON true);

COMMENT ON VIEW eventgrid.delivery_statistics IS 'Per event subscription: deliveries pending (not yet delivered, dead-lettered or dropped, retries included), of which waiting for a retry, events delivered, failed delivery attempts (requests sent that failed; attempts held back by probation are not counted), events dead-lettered, events dropped (undeliverable with dead-lettering off), dead letters queued again by redeliver_dead_letters, whether pause_delivery() paused it (itself, its topic or everything; the GUC eventgrid.delivery_paused is not shown here), and its delivery_mode (push or queue). Of a queue event subscription (pull delivery, SPEC 14) pending counts the events not yet acknowledged or dead-lettered, and received, acknowledged, released, rejected and lock_expired count the subscriber operations (NULL for push).';

