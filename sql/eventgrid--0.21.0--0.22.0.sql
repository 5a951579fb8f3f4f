-- eventgrid 0.21.0 -> 0.22.0: an event subscription that expires (SPEC 17)
-- no longer takes the events it still owes with it.  The upkeep worker
-- dead-letters them with reason SubscriptionExpired (drops and counts them
-- when dead-lettering is off), keeps the subscription's final counts in
-- eventgrid.expired_event_subscriptions, and passes over a subscription it
-- cannot lock at once (a consumer's open transaction holding its events)
-- until the next round instead of waiting for its lock timeout and
-- abandoning the round.  The HTTP data plane (SPEC 16) checks the key
-- before it says whether a topic exists, reads a SAS token's expiry only as
-- a date and time, answers 400 to a body nested too deeply, and validates a
-- request's events before it stores any (_first_invalid_event), and
-- counts what it answers to publish requests (http_publish_counts,
-- _http_count, topic_publish_metrics; PublishFailCount and
-- PublishSuccessLatencyInMs in metrics).  Receive grants follow the role,
-- not its name (receive_grants.role_oid).

\echo Use "ALTER EXTENSION eventgrid UPDATE TO '0.22.0'" to load this file. \quit

ALTER TABLE eventgrid.dead_letters DROP CONSTRAINT dead_letters_dead_letter_reason_check,
    ADD CONSTRAINT dead_letters_dead_letter_reason_check CHECK (dead_letter_reason = ANY (ARRAY[
        'MaxDeliveryAttemptsExceeded', 'TimeToLiveExceeded', 'NonRetriableError', 'MaxDeliveryCountExceeded',
        'Rejected', 'SubscriptionExpired']));

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
                WHEN 'SubscriptionExpired'::text THEN 'The event subscription expired before the event was delivered.'::text
                ELSE 'Delivery failed with an error that is not retried.'::text
            END, 'deliveryattempts', d.delivery_attempts, 'deliveryresult', COALESCE((d.last_delivery_outcome || COALESCE(((' (HTTP '::text || d.last_http_status_code) || ')'::text), ''::text)),
            CASE
                WHEN (d.delivery_attempts > 0) THEN 'Received'::text
                ELSE 'NotAttempted'::text
            END), 'publishutc', eventgrid.rfc3339(d.publish_time), 'deliveryattemptutc', eventgrid.rfc3339(d.last_delivery_attempt_time)), 'event', d.event)
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

CREATE OR REPLACE FUNCTION eventgrid._dead_letter_ids(topic text, subscription text, reason text, dead_lettered_after timestamp with time zone, dead_lettered_before timestamp with time zone, existing_only boolean) RETURNS bigint[]
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    ids bigint[];
BEGIN
    IF reason IS NOT NULL AND reason NOT IN ('MaxDeliveryAttemptsExceeded', 'TimeToLiveExceeded', 'NonRetriableError',
                                             'MaxDeliveryCountExceeded', 'Rejected', 'SubscriptionExpired') THEN
        RAISE EXCEPTION 'reason must be MaxDeliveryAttemptsExceeded, TimeToLiveExceeded, NonRetriableError, MaxDeliveryCountExceeded, Rejected or SubscriptionExpired, got %',
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


CREATE TABLE eventgrid.expired_event_subscriptions (
    id bigserial PRIMARY KEY,
    topic text NOT NULL,
    event_subscription text NOT NULL,
    subscription_id bigint NOT NULL,
    delivery_mode text NOT NULL,
    expiration_time timestamp with time zone NOT NULL,
    dropped_at timestamp with time zone NOT NULL,
    deadletter boolean NOT NULL,
    matched_events bigint NOT NULL,
    delivered_events bigint NOT NULL,
    failed_delivery_attempts bigint NOT NULL,
    dead_lettered_events bigint NOT NULL,
    dropped_events bigint NOT NULL,
    owed_at_expiration bigint NOT NULL
);
CREATE INDEX expired_event_subscriptions_topic_idx ON eventgrid.expired_event_subscriptions (topic, event_subscription);
COMMENT ON TABLE eventgrid.expired_event_subscriptions IS 'The final counts of each event subscription the upkeep worker dropped because its expiration_time came (SPEC 17), one row per drop: topic (''domain/topic'' for a domain topic''s), event_subscription, its id, delivery_mode, expiration_time, dropped_at (the workers'' clock), whether it dead-lettered, and its totals from creation to drop as delivery_statistics showed them: matched_events, delivered_events (acknowledged, for a queue subscription), failed_delivery_attempts, dead_lettered_events and dropped_events (these two include owed_at_expiration: the events it still owed when dropped, dead-lettered with reason SubscriptionExpired, or dropped). Rows stay until an administrator deletes them. Readable by pg_monitor and eventgrid_admin (who may delete).';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.expired_event_subscriptions', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.expired_event_subscriptions_id_seq', '');
GRANT SELECT ON eventgrid.expired_event_subscriptions TO pg_monitor;
GRANT SELECT, DELETE ON eventgrid.expired_event_subscriptions TO eventgrid_admin;

CREATE FUNCTION eventgrid._expire_subscription(sid bigint, expired_at timestamp with time zone) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sub eventgrid.event_subscriptions;
    owed bigint := 0;
    ids bigint[];
    at timestamptz := eventgrid._now();
BEGIN
    SELECT * INTO sub FROM eventgrid.event_subscriptions x WHERE x.id = sid;
    -- what it still owes: the events past its position first become its retries (or queue rows) ...
    PERFORM eventgrid._position_to_retries(sid, at, true);
    IF sub.delivery_mode = 'queue' THEN
        -- ... the batches of a queue subscription become rows (references) ...
        INSERT INTO eventgrid.queue_events (subscription_id, event_id, event_table, event_txid, publish_time, event_bytes,
                                            receivable_at, source, source_event_id)
        SELECT x.* FROM (
            SELECT b.subscription_id, e.id, b.event_table, e.txid, e.publish_time, coalesce(e.event_bytes, 0),
                   b.receivable_at, e.source, e.source_event_id
              FROM eventgrid.queue_batches b
             CROSS JOIN LATERAL eventgrid._batch_events(sub.topic, b.event_table, b.txids, b.event_ids) e
             WHERE b.subscription_id = sid
             ORDER BY b.id, e.id) x;
        DELETE FROM eventgrid.queue_batches b WHERE b.subscription_id = sid;
        -- ... and every one is dead-lettered (or dropped), locked by a consumer or not
        SELECT array_agg(q.id ORDER BY q.id) INTO ids FROM eventgrid.queue_events q WHERE q.subscription_id = sid;
        IF ids IS NOT NULL THEN
            owed := eventgrid._queue_finish(sid, ids, 'SubscriptionExpired');
        END IF;
    ELSE
        WITH gone AS (
            DELETE FROM eventgrid.retries r WHERE r.subscription_id = sid
            RETURNING r.id, r.event_id, r.event, r.publish_time, r.attempts, r.last_outcome, r.last_http_status,
                      r.last_attempt_at, r.source, r.source_event_id
        ), t AS (
            SELECT t.input_schema FROM eventgrid.topics t WHERE t.name = sub.topic
        ), dead AS (
            INSERT INTO eventgrid.dead_letters (topic, subscription_name, subscription_id, input_schema,
                   event_delivery_schema, event, dead_letter_reason, delivery_attempts, last_delivery_outcome,
                   last_http_status_code, publish_time, last_delivery_attempt_time, topic_type, event_id,
                   source, source_event_id)
            SELECT sub.topic, sub.name, sid, t.input_schema, sub.event_delivery_schema, g.event, 'SubscriptionExpired',
                   g.attempts, g.last_outcome, g.last_http_status, g.publish_time, g.last_attempt_at, sub.topic_type,
                   g.event_id, g.source, g.source_event_id
              FROM gone g, t WHERE sub.deadletter
             ORDER BY g.id
        ), notified AS (
            INSERT INTO eventgrid.dead_letter_notification_failures (subscription_id, topic, subscription_name,
                   event_id, dead_letter_topic, sqlstate, error)
            SELECT x.* FROM (SELECT ARRAY(
                SELECT ROW(sid, g.event_id, sub.dead_letter_topic, sub.topic, sub.name, g.event, t.input_schema,
                           sub.deadletter, 'SubscriptionExpired', g.attempts, g.last_outcome, g.last_http_status,
                           g.publish_time, g.last_attempt_at, g.source)::eventgrid._dead_letter_notice
                  FROM gone g, t ORDER BY g.id) AS a) q
             CROSS JOIN LATERAL eventgrid._publish_dead_letter_notifications(q.a) x
             WHERE sub.dead_letter_topic IS NOT NULL AND cardinality(q.a) > 0
        )
        SELECT count(*) INTO owed FROM gone;
        IF owed > 0 THEN
            UPDATE eventgrid.subscription_counters c
               SET dead_lettered = c.dead_lettered + CASE WHEN sub.deadletter THEN owed ELSE 0 END,
                   dropped = c.dropped + CASE WHEN sub.deadletter THEN 0 ELSE owed END
             WHERE c.subscription_id = sid;
            INSERT INTO eventgrid.subscription_metric_counts AS m (subscription_id, metric, label, value)
            VALUES (sid, CASE WHEN sub.deadletter THEN 'dead_lettered' ELSE 'dropped' END, 'SubscriptionExpired', owed)
            ON CONFLICT (subscription_id, metric, label) DO UPDATE SET value = m.value + excluded.value;
        END IF;
    END IF;
    -- its final counts outlive it
    INSERT INTO eventgrid.expired_event_subscriptions (topic, event_subscription, subscription_id, delivery_mode,
           expiration_time, dropped_at, deadletter, matched_events, delivered_events, failed_delivery_attempts,
           dead_lettered_events, dropped_events, owed_at_expiration)
    SELECT sub.read_key, sub.name, sid, sub.delivery_mode, expired_at, at, sub.deadletter,
           coalesce(c.matched, 0),
           coalesce(c.delivered, 0) + coalesce((SELECT sum(x.acknowledged) FROM eventgrid.queue_counters x
                                                 WHERE x.subscription_id = sid), 0),
           coalesce(c.failed_attempts, 0), coalesce(c.dead_lettered, 0), coalesce(c.dropped, 0), owed
      FROM (SELECT 1) one
      LEFT JOIN eventgrid.subscription_counters c ON c.subscription_id = sid;
    RETURN owed;
END $$;

REVOKE ALL ON FUNCTION eventgrid._expire_subscription(sid bigint, expired_at timestamp with time zone) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._expire_subscription(sid bigint, expired_at timestamp with time zone) IS 'Internal: settles what event subscription sid, whose expiration_time expired_at has come, still owes before the upkeep worker drops it (SPEC 17): the events past its position, its retries (also those an ordered subscription holds behind their keys), its queue batches and its receivable or locked queue events are dead-lettered with reason SubscriptionExpired (dropped when it does not dead-letter; counted either way, and notified to its dead_letter_topic), and its final counts are kept in eventgrid.expired_event_subscriptions. Returns how many events it owed. The caller has locked the subscription, its retries and its queue events.';

DROP FUNCTION eventgrid._drop_expired_subscriptions();
CREATE FUNCTION eventgrid._drop_expired_subscriptions(OUT topic text, OUT name text, OUT expiration_time timestamp with time zone, OUT owed bigint, OUT skipped boolean) RETURNS SETOF record
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    s record;
BEGIN
    -- read_key: its topic, or 'domain/topic' for a domain topic's subscription (SPEC 18)
    FOR s IN SELECT x.id, x.read_key, x.name, x.expiration_time FROM eventgrid.event_subscriptions x
              WHERE x.expiration_time <= eventgrid._now() ORDER BY x.expiration_time, x.id LIMIT 1000
    LOOP
        topic := s.read_key;
        name := s.name;
        expiration_time := s.expiration_time;
        owed := 0;
        skipped := false;
        BEGIN
            -- what it is made of, locked only if free at once (the delivery workers' order: the subscription,
            -- then its retries); one that a session holds, or whose deliveries are in flight, waits for the
            -- next call
            PERFORM 1 FROM eventgrid.event_subscriptions x WHERE x.id = s.id FOR UPDATE NOWAIT;
            PERFORM 1 FROM eventgrid.retries r WHERE r.subscription_id = s.id FOR UPDATE NOWAIT;
            PERFORM 1 FROM eventgrid.queue_events q WHERE q.subscription_id = s.id FOR UPDATE NOWAIT;
            PERFORM 1 FROM eventgrid.queue_batches b WHERE b.subscription_id = s.id FOR UPDATE NOWAIT;
            PERFORM 1 FROM eventgrid.subscription_positions p WHERE p.subscription_id = s.id FOR UPDATE NOWAIT;
            IF EXISTS (SELECT 1 FROM eventgrid.chunks_in_flight c WHERE c.subscription_id = s.id)
               OR EXISTS (SELECT 1 FROM eventgrid.retries r WHERE r.subscription_id = s.id AND r.lease_owner IS NOT NULL) THEN
                skipped := true;
            ELSE
                owed := eventgrid._expire_subscription(s.id, s.expiration_time);
                PERFORM eventgrid.drop_event_subscription(s.read_key, s.name);
            END IF;
        EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
            skipped := true;
        END;
        RETURN NEXT;
    END LOOP;
END $$;

REVOKE ALL ON FUNCTION eventgrid._drop_expired_subscriptions() FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._drop_expired_subscriptions(OUT topic text, OUT name text, OUT expiration_time timestamp with time zone, OUT owed bigint, OUT skipped boolean) IS 'Internal: drops (as drop_event_subscription() does: dead letters kept) the event subscriptions whose expiration_time has come on the delivery workers'' clock, at most 1000 a call, the earliest first, each after _expire_subscription() has dead-lettered (or dropped) what it still owed and kept its final counts; one whose rows another session holds locked, or with deliveries in flight, is skipped (skipped true) and tried again at the next call, without waiting. Returns each one''s topic, name, expiration time and how many events it owed, which the upkeep worker logs.';

CREATE FUNCTION eventgrid._first_invalid_event(topic text, events jsonb, OUT event_index integer, OUT problem text, OUT sqlstate text) RETURNS record
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_first_invalid_event';
REVOKE ALL ON FUNCTION eventgrid._first_invalid_event(topic text, events jsonb, OUT event_index integer, OUT problem text, OUT sqlstate text) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._first_invalid_event(topic text, events jsonb, OUT event_index integer, OUT problem text, OUT sqlstate text) IS 'Internal: validates events (a JSON array, or one event) as publishing them to topic would, storing none, in one subtransaction for them all: the first that fails by its index (0 the first), its error message and SQLSTATE (22023 invalid, 54000 over 1 MB); NULLs when all are valid. The HTTP data plane checks a request with it before it publishes (SPEC 16). Errors: 22004 NULL, 42704 no such topic.';

CREATE FUNCTION eventgrid._http_unauthorized_message() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN 'The request must carry one of the topic''s access keys (aeg-sas-key, or Authorization: SharedAccessKey) or a shared access signature signed with one (aeg-sas-token) that has not expired.';
REVOKE ALL ON FUNCTION eventgrid._http_unauthorized_message() FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._http_unauthorized_message() IS 'Internal: the message of every 401 of the HTTP data plane (SPEC 16), whatever was wrong and whether the topic exists; the HTTP listener answers the same for a database it does not serve and for a request without any credential.';

-- The HTTP data plane (SPEC 16): a key is checked before anything that tells whether a topic exists; a SAS
-- token's expiry is a date and time in digits (no 'infinity' or 'tomorrow'); a body nested too deeply is 400;
-- a request's events are all validated before any is stored.

CREATE OR REPLACE FUNCTION eventgrid._http_authorized(topic text, path text, sas_key text, sas_token text, auth_header text) RETURNS boolean
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET "DateStyle" TO 'ISO, MDY'
    SET "TimeZone" TO 'UTC'
    AS $$
DECLARE
    k eventgrid.topic_access_keys;
    given text := sas_key;
    signed record;
    expires timestamptz;
BEGIN
    SELECT * INTO k FROM eventgrid.topic_access_keys a WHERE a.topic = _http_authorized.topic;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF given IS NULL AND auth_header ~* '^SharedAccessKey +' THEN
        given := regexp_replace(auth_header, '^SharedAccessKey +', '', 'i');
    END IF;
    IF given IS NOT NULL THEN
        RETURN eventgrid._secret_equal(given, k.key1) OR eventgrid._secret_equal(given, k.key2);
    END IF;
    IF sas_token IS NULL THEN
        RETURN false;
    END IF;
    signed := eventgrid._sas_token_check(sas_token, k.key1, k.key2);
    -- the resource's path (scheme and host as the client saw them, any query) is the request's
    IF signed.resource IS NULL OR
       rtrim(split_part(regexp_replace(signed.resource, '^[A-Za-z][A-Za-z0-9+.-]*://[^/?]*', ''), '?', 1), '/')
           IS DISTINCT FROM rtrim(path, '/') THEN
        RETURN false;
    END IF;
    -- 2026-11-27 14:15:33.201349+00:00 (Python) or 11/27/2026 2:15:33 PM (JavaScript), UTC: a date and a
    -- time of day in digits, nothing else that timestamptz reads ('infinity', 'tomorrow', 'epoch', ...)
    IF signed.expiry !~ '^([0-9]{4}-[0-9]{1,2}-[0-9]{1,2}|[0-9]{1,2}/[0-9]{1,2}/[0-9]{4})[ T][0-9]{1,2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,9})?)?( ?[AaPp][Mm])?( ?(Z|[+-][0-9]{2}(:?[0-9]{2})?))?$' THEN
        RETURN false;
    END IF;
    BEGIN
        expires := signed.expiry::timestamptz;
    EXCEPTION WHEN data_exception THEN
        RETURN false;
    END;
    RETURN isfinite(expires) AND expires > clock_timestamp();
END $$;

CREATE OR REPLACE FUNCTION eventgrid._http_publish(topic text, path text, sas_key text, sas_token text, auth_header text, content_type text, body text, OUT status integer, OUT answer text) RETURNS record
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    t eventgrid.topics;
    media text := lower(btrim(split_part(coalesce(content_type, ''), ';', 1)));
    events jsonb;
BEGIN
    -- the key first: a missing topic is refused as a wrong key is, never which part was wrong
    IF NOT eventgrid._http_authorized(topic, path, sas_key, sas_token, auth_header) THEN
        status := 401;
        answer := eventgrid._http_error('Unauthorized', eventgrid._http_unauthorized_message());
        RETURN;
    END IF;
    SELECT * INTO t FROM eventgrid.topics x WHERE x.name = _http_publish.topic AND x.topic_type = 'custom';
    IF NOT FOUND THEN
        status := 404;
        answer := eventgrid._http_error('NotFound', format('No custom topic %s in this database.', eventgrid._quote(topic)));
        RETURN;
    END IF;
    IF media NOT IN ('application/json', 'application/cloudevents+json', 'application/cloudevents-batch+json') OR
       (media <> 'application/json' AND t.input_schema <> 'CloudEventSchemaV1_0') THEN
        status := 400;
        answer := eventgrid._http_error('BadRequest', format(
            'Content-Type must be %s for topic %s (input schema %s).',
            CASE WHEN t.input_schema = 'CloudEventSchemaV1_0'
                 THEN 'application/cloudevents-batch+json, application/cloudevents+json or application/json'
                 ELSE 'application/json' END,
            eventgrid._quote(topic), t.input_schema));
        RETURN;
    END IF;
    BEGIN
        events := body::jsonb;
    EXCEPTION WHEN data_exception OR statement_too_complex OR program_limit_exceeded THEN
        -- statement_too_complex: nested deeper than the server's stack allows
        status := 400;
        answer := eventgrid._http_error('BadRequest', 'The request body is not valid JSON: ' || SQLERRM);
        RETURN;
    END;
    IF media = 'application/cloudevents+json' THEN
        events := jsonb_build_array(events);
    END IF;
    IF jsonb_typeof(events) <> 'array' AND NOT (t.input_schema = 'CustomEventSchema' AND jsonb_typeof(events) = 'object') THEN
        status := 400;
        answer := eventgrid._http_error('BadRequest', 'The request body must be a JSON array of events.');
        RETURN;
    END IF;
    SELECT p.status, p.answer INTO status, answer FROM eventgrid._http_publish_events(topic, events) p;
END $$;

CREATE OR REPLACE FUNCTION eventgrid._http_namespace(topic text, subscription text, operation text, path text, sas_key text, sas_token text, auth_header text, content_type text, body text, max_events text, max_wait_time text, release_delay text, OUT status integer, OUT answer text) RETURNS record
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    media text := lower(btrim(split_part(coalesce(content_type, ''), ';', 1)));
    doc jsonb;
    tokens text[];
    got text[];
    ok boolean[];
    why text[];
    n integer;
    wait integer;
    delay integer;
BEGIN
    -- the key first: a missing topic is refused as a wrong key is, never which part was wrong
    IF NOT eventgrid._http_authorized(topic, path, sas_key, sas_token, auth_header) THEN
        status := 401;
        answer := eventgrid._http_error('Unauthorized', eventgrid._http_unauthorized_message());
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM eventgrid.topics x WHERE x.name = _http_namespace.topic AND x.topic_type = 'namespace') THEN
        status := 404;
        answer := eventgrid._http_error('NotFound', format('No namespace topic %s in this database.', eventgrid._quote(topic)));
        RETURN;
    END IF;
    IF subscription IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM eventgrid.event_subscriptions s
             WHERE s.topic = _http_namespace.topic AND s.name = _http_namespace.subscription AND s.delivery_mode = 'queue') THEN
        status := 404;
        answer := eventgrid._http_error('NotFound', format('No queue event subscription %s of namespace topic %s.',
                                                           eventgrid._quote(subscription), eventgrid._quote(topic)));
        RETURN;
    END IF;
    IF operation = 'receive' THEN
        BEGIN
            n := coalesce(max_events, '1')::integer;
            wait := coalesce(max_wait_time, '60')::integer;
            SELECT coalesce(jsonb_agg(jsonb_build_object(
                       'brokerProperties', jsonb_build_object('lockToken', r.lock_token, 'deliveryCount', r.delivery_count),
                       'event', r.event)), '[]'::jsonb)
              INTO doc FROM eventgrid.receive(topic, subscription, n, wait) r;
        EXCEPTION WHEN data_exception THEN
            status := 400;
            answer := eventgrid._http_error('BadRequest',
                'maxEvents must be 1-100 and maxWaitTime 10-120 (seconds): ' || SQLERRM);
            RETURN;
        END;
        status := 200;
        answer := jsonb_build_object('value', doc)::text;
        RETURN;
    END IF;
    -- the others take a body: one CloudEvent or an array (publish), {"lockTokens": [...]} (settling)
    IF (operation = 'publish' AND media NOT IN ('application/cloudevents+json', 'application/cloudevents-batch+json', 'application/json'))
       OR (operation <> 'publish' AND media <> 'application/json') THEN
        status := 400;
        answer := eventgrid._http_error('BadRequest', CASE WHEN operation = 'publish'
            THEN 'Content-Type must be application/cloudevents+json (one event) or application/cloudevents-batch+json (an array).'
            ELSE 'Content-Type must be application/json.' END);
        RETURN;
    END IF;
    BEGIN
        doc := body::jsonb;
    EXCEPTION WHEN data_exception OR statement_too_complex OR program_limit_exceeded THEN
        status := 400;
        answer := eventgrid._http_error('BadRequest', 'The request body is not valid JSON: ' || SQLERRM);
        RETURN;
    END;
    IF operation = 'publish' THEN
        IF jsonb_typeof(doc) = 'object' AND media <> 'application/cloudevents-batch+json' THEN
            doc := jsonb_build_array(doc);
        END IF;
        IF jsonb_typeof(doc) <> 'array' THEN
            status := 400;
            answer := eventgrid._http_error('BadRequest', 'The request body must be one CloudEvent or a JSON array of them.');
            RETURN;
        END IF;
        SELECT p.status, CASE WHEN p.status = 200 THEN '{}' ELSE p.answer END INTO status, answer
          FROM eventgrid._http_publish_events(topic, doc) p;
        RETURN;
    END IF;
    IF jsonb_typeof(doc -> 'lockTokens') IS DISTINCT FROM 'array' OR jsonb_array_length(doc -> 'lockTokens') = 0
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(doc -> 'lockTokens') e WHERE jsonb_typeof(e) <> 'string') THEN
        status := 400;
        answer := eventgrid._http_error('BadRequest', 'The request body must be {"lockTokens": [...]}: at least one lock token, each a string.');
        RETURN;
    END IF;
    tokens := ARRAY(SELECT jsonb_array_elements_text(doc -> 'lockTokens'));
    BEGIN
        delay := coalesce(release_delay, '0')::integer;
        IF operation = 'acknowledge' THEN
            SELECT array_agg(x.lock_token), array_agg(x.succeeded), array_agg(x.error) INTO got, ok, why
              FROM eventgrid.acknowledge(topic, subscription, tokens) x;
        ELSIF operation = 'release' THEN
            SELECT array_agg(x.lock_token), array_agg(x.succeeded), array_agg(x.error) INTO got, ok, why
              FROM eventgrid.release(topic, subscription, tokens, delay) x;
        ELSIF operation = 'reject' THEN
            SELECT array_agg(x.lock_token), array_agg(x.succeeded), array_agg(x.error) INTO got, ok, why
              FROM eventgrid.reject(topic, subscription, tokens) x;
        ELSE
            SELECT array_agg(x.lock_token), array_agg(x.succeeded), array_agg(x.error) INTO got, ok, why
              FROM eventgrid.renew_locks(topic, subscription, tokens) x;
        END IF;
        SELECT jsonb_build_object(
                   'succeededLockTokens', coalesce(jsonb_agg(r.tok ORDER BY r.ord) FILTER (WHERE r.ok), '[]'::jsonb),
                   'failedLockTokens', coalesce(jsonb_agg(jsonb_build_object(
                        'lockToken', r.tok,
                        'error', jsonb_build_object('code', split_part(r.why, ': ', 1),
                                                    'message', substr(r.why, length(split_part(r.why, ': ', 1)) + 3)))
                        ORDER BY r.ord) FILTER (WHERE NOT r.ok), '[]'::jsonb))
          INTO doc FROM unnest(got, ok, why) WITH ORDINALITY AS r(tok, ok, why, ord);
    EXCEPTION WHEN data_exception OR program_limit_exceeded THEN
        status := 400;
        answer := eventgrid._http_error('BadRequest', SQLERRM);
        RETURN;
    END;
    status := 200;
    answer := doc::text;
END $$;

CREATE OR REPLACE FUNCTION eventgrid._http_publish_events(topic text, events jsonb, OUT status integer, OUT answer text) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v record;
    problem text;
    state text;
BEGIN
    -- every event checked first, in one pass that stores nothing: the first bad one answers 400 (or 413)
    SELECT * INTO v FROM eventgrid._first_invalid_event(topic, events) v;
    IF v.event_index IS NOT NULL THEN
        IF v.sqlstate = '54000' THEN
            status := 413;
            answer := eventgrid._http_error('PayloadTooLarge', format('Event at index %s: %s', v.event_index, v.problem));
        ELSE
            status := 400;
            answer := eventgrid._http_error('BadRequest', format('Event at index %s: %s', v.event_index, v.problem));
        END IF;
        RETURN;
    END IF;
    BEGIN
        PERFORM eventgrid.publish(topic, events);
    EXCEPTION WHEN data_exception OR program_limit_exceeded OR null_value_not_allowed THEN
        -- what holds for the request as a whole (over 1 MB together: 54000)
        GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, problem = MESSAGE_TEXT;
        status := CASE WHEN state = '54000' THEN 413 ELSE 400 END;
        answer := eventgrid._http_error(CASE WHEN state = '54000' THEN 'PayloadTooLarge' ELSE 'BadRequest' END, problem);
        RETURN;
    END;
    status := 200;
    answer := '';
END $$;

-- Receive grants follow the role, not its name (SPEC 14): each names its role by OID (role_oid); a rename
-- keeps the grant, a dropped role's grants go (the upkeep worker deletes them), a new role with an old name
-- gets nothing.  role_name stays as the role's current name, which dumps carry: a restore binds each grant to
-- the role of that name there, as pg_dump does for privileges.
ALTER TABLE eventgrid.receive_grants ADD COLUMN role_oid oid;
UPDATE eventgrid.receive_grants g SET role_oid = coalesce((SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = g.role_name), 0);
ALTER TABLE eventgrid.receive_grants ALTER COLUMN role_oid SET NOT NULL;
ALTER TABLE eventgrid.receive_grants DROP CONSTRAINT receive_grants_topic_subscription_id_role_name_key;
DELETE FROM eventgrid.receive_grants g WHERE g.role_oid = 0;
ALTER TABLE eventgrid.receive_grants ADD CONSTRAINT receive_grants_topic_subscription_id_role_oid_key
    UNIQUE NULLS NOT DISTINCT (topic, subscription_id, role_oid);
COMMENT ON TABLE eventgrid.receive_grants IS 'Internal: what grant_receive() granted: role role_oid (its name role_name, kept current by the upkeep worker) may receive from queue event subscription subscription_id of topic (NULL: every queue event subscription of the topic, present and future). The role is named by OID: renamed, it keeps the grant; dropped, its grants are deleted; a new role of the same name gets nothing. Restored from a dump, a grant is bound to the role of its role_name (as pg_dump does for privileges) by a trigger; the view event_subscription_receivers shows them.';
COMMENT ON COLUMN eventgrid.receive_grants.role_oid IS 'The role granted (pg_roles.oid); 0 when a restore found no role of role_name.';

CREATE FUNCTION eventgrid._bind_receive_grant() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    -- a row whose OID is not the role of its name here (restored from a dump of another cluster, or of this one
    -- after the role changed) is bound by name
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = NEW.role_oid AND r.rolname = NEW.role_name) THEN
        NEW.role_oid := coalesce((SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = NEW.role_name), 0);
    END IF;
    RETURN NEW;
END $$;
REVOKE ALL ON FUNCTION eventgrid._bind_receive_grant() FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._bind_receive_grant() IS 'Internal: BEFORE INSERT trigger of eventgrid.receive_grants: a grant whose role_oid is not the role named role_name in this cluster (a restored dump) is bound to the role of that name (0: none, which nobody gets), as pg_dump binds privileges by name.';
CREATE TRIGGER receive_grants_bind BEFORE INSERT ON eventgrid.receive_grants
    FOR EACH ROW EXECUTE FUNCTION eventgrid._bind_receive_grant();

CREATE FUNCTION eventgrid._refresh_receive_grants() RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM eventgrid.receive_grants g
     WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.oid = g.role_oid);
    UPDATE eventgrid.receive_grants g SET role_name = r.rolname
      FROM pg_catalog.pg_roles r WHERE r.oid = g.role_oid AND g.role_name <> r.rolname;
END $$;
REVOKE ALL ON FUNCTION eventgrid._refresh_receive_grants() FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._refresh_receive_grants() IS 'Internal: deletes the receive grants of dropped roles and writes each remaining grant''s role''s current name into role_name (what a dump carries). The upkeep worker calls it every round.';

CREATE OR REPLACE VIEW eventgrid.event_subscription_receivers AS
 SELECT g.topic,
    s.name AS subscription,
    coalesce(r.rolname, g.role_name) AS role_name,
    (r.oid IS NOT NULL) AS role_exists,
    g.granted_at,
    g.granted_by
   FROM eventgrid.receive_grants g
     LEFT JOIN eventgrid.event_subscriptions s ON s.id = g.subscription_id
     LEFT JOIN pg_catalog.pg_roles r ON r.oid = g.role_oid
  ORDER BY g.topic, s.name NULLS FIRST, coalesce(r.rolname, g.role_name);
COMMENT ON VIEW eventgrid.event_subscription_receivers IS 'The receive rights grant_receive() gave (SPEC 14): per row, a role that may call receive(), acknowledge(), release(), reject() and renew_locks() on queue event subscription subscription of topic (NULL: every queue event subscription of the topic), by its current name (a renamed role keeps its grants; a dropped one loses them), whether it exists (false only until the upkeep worker deletes a dropped role''s grants, or for a restored grant whose role is missing), when and by whom it was granted. Members of eventgrid_receiver reach every queue without a row here. For eventgrid_admin.';

CREATE OR REPLACE FUNCTION eventgrid._receive_subscription_id(topic text, subscription text, role oid) RETURNS bigint
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    -- eventgrid_receiver and eventgrid_admin reach every queue (superusers are members of every role)
    IF NOT (pg_has_role(role, 'eventgrid_receiver', 'USAGE') OR pg_has_role(role, 'eventgrid_admin', 'USAGE'))
       AND NOT EXISTS (
           SELECT 1 FROM eventgrid.receive_grants g
             LEFT JOIN eventgrid.event_subscriptions s ON s.id = g.subscription_id
             JOIN pg_catalog.pg_roles r ON r.oid = g.role_oid
            WHERE g.topic = _receive_subscription_id.topic
              AND (g.subscription_id IS NULL OR s.name = _receive_subscription_id.subscription)
              AND pg_has_role(role, r.oid, 'USAGE')) THEN
        RAISE EXCEPTION 'permission denied to receive from event subscription % of topic %',
                        eventgrid._quote(subscription), eventgrid._quote(topic)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('An admin grants it for this subscription with: SELECT eventgrid.grant_receive(%L, %L, %L); or for every queue with: GRANT eventgrid_receiver TO %s;',
                                topic, subscription, pg_catalog.pg_get_userbyid(role), quote_ident(pg_catalog.pg_get_userbyid(role)));
    END IF;
    -- the receivers' own words: they cannot read the subscription list an admin's hint names
    IF topic IS NOT NULL AND subscription IS NOT NULL AND NOT pg_has_role(role, 'eventgrid_admin', 'USAGE')
       AND NOT EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s
                        WHERE s.topic = _receive_subscription_id.topic AND s.name = _receive_subscription_id.subscription) THEN
        RAISE EXCEPTION 'event subscription % of topic % does not exist', eventgrid._quote(subscription), eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object',
                  HINT = 'Check the topic and subscription names: receive() takes those an admin gave the queue event subscription (create_event_subscription(topic, name, delivery_mode => ''queue'')).';
    END IF;
    RETURN eventgrid._queue_subscription_id(topic, subscription);
END $$;

CREATE OR REPLACE FUNCTION eventgrid.grant_receive(topic text, subscription text, role_name text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    t record := eventgrid._receive_grant_target(topic, subscription, role_name);
    role_id oid;
BEGIN
    SELECT r.oid INTO role_id FROM pg_catalog.pg_roles r WHERE r.rolname = role_name;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'role % does not exist', eventgrid._quote(role_name)
            USING ERRCODE = 'undefined_object', HINT = 'Create the role first (CREATE ROLE), then grant it.';
    END IF;
    -- the role itself (its OID): renamed it keeps the grant, dropped it loses it, a new role of its name gets nothing
    INSERT INTO eventgrid.receive_grants (topic, subscription_id, role_name, role_oid, granted_by)
    VALUES (topic, t.sid, role_name, role_id, eventgrid._caller())
    ON CONFLICT ON CONSTRAINT receive_grants_topic_subscription_id_role_oid_key DO NOTHING;
    IF FOUND THEN
        PERFORM eventgrid._log(format('eventgrid: role %s may receive from %s, granted by %s',
                                      eventgrid._quote(role_name), t.label, eventgrid._caller()));
    END IF;
END $$;

CREATE OR REPLACE FUNCTION eventgrid.revoke_receive(topic text, subscription text, role_name text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    t record := eventgrid._receive_grant_target(topic, subscription, role_name);
BEGIN
    DELETE FROM eventgrid.receive_grants g
     WHERE g.topic = revoke_receive.topic AND g.subscription_id IS NOT DISTINCT FROM t.sid
       AND g.role_oid = (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname = revoke_receive.role_name);
    IF FOUND THEN
        PERFORM eventgrid._log(format('eventgrid: role %s may no longer receive from %s, revoked by %s',
                                      eventgrid._quote(role_name), t.label, eventgrid._caller()));
    ELSE
        RAISE NOTICE 'role % had no receive right on %: nothing revoked', eventgrid._quote(role_name), t.label
            USING HINT = 'SELECT * FROM eventgrid.event_subscription_receivers; lists the grants.';
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid.grant_receive(topic text, subscription text, role_name text) IS 'Pull delivery rights for one queue (SPEC 14, as Event Grid''s Data Receiver role scoped to a subscription or a topic): role role_name (and its members) may call receive(), acknowledge(), release(), reject() and renew_locks() on queue event subscription subscription of topic (NULL: on every queue event subscription of the topic, present and future), without being a member of eventgrid_receiver; elsewhere they get 42501. Granting what is granted does nothing; logged once. The grant goes with its subscription or topic and follows the role itself: renamed, the role keeps it; dropped, it goes; a new role of the same name gets nothing. Dumped and restored by the role''s name. Shown in event_subscription_receivers. Requires eventgrid_admin. Errors: 22004 NULL topic or role_name, 42704 no such topic, subscription or role, 42809 a push subscription.';

-- Publishing over HTTP is seen (SPEC 16): the HTTP listener counts what it answers to publish requests per
-- database, topic and outcome, and writes the counts every few seconds (one statement per database, whatever
-- the traffic) through _http_count().
CREATE TABLE eventgrid.http_publish_counts (
    topic text REFERENCES eventgrid.topics (name) ON UPDATE CASCADE ON DELETE CASCADE,
    outcome text NOT NULL,
    requests bigint DEFAULT 0 NOT NULL,
    latency_ms_sum double precision DEFAULT 0 NOT NULL,
    CONSTRAINT http_publish_counts_outcome_check CHECK (outcome = ANY (ARRAY['Success', 'Unauthorized', 'BadRequest',
        'NotFound', 'MethodNotAllowed', 'PayloadTooLarge', 'ServiceUnavailable', 'Other'])),
    CONSTRAINT http_publish_counts_key UNIQUE NULLS NOT DISTINCT (topic, outcome)
);
COMMENT ON TABLE eventgrid.http_publish_counts IS 'Internal: publish requests the HTTP listener answered (SPEC 16), per topic (NULL: the URL named no topic of this database) and outcome: Success (200) or the error code of the answer (Unauthorized 401, BadRequest 400, NotFound 404, MethodNotAllowed 405, PayloadTooLarge 413, ServiceUnavailable 503, Other); requests, and for successes the milliseconds from the whole request read to its answer, summed. Written by the listener every 5 s. Read it through topic_publish_metrics and metrics.';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.http_publish_counts', '');
GRANT SELECT ON eventgrid.http_publish_counts TO eventgrid_admin;

CREATE FUNCTION eventgrid._http_count(counts jsonb) RETURNS void
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 INSERT INTO eventgrid.http_publish_counts AS c (topic, outcome, requests, latency_ms_sum)
 SELECT t.name,
        CASE WHEN x.outcome = ANY (ARRAY['Success', 'Unauthorized', 'BadRequest', 'NotFound', 'MethodNotAllowed',
                                         'PayloadTooLarge', 'ServiceUnavailable']) THEN x.outcome ELSE 'Other' END,
        sum(greatest(x.requests, 0)), sum(greatest(coalesce(x.latency_ms, 0), 0))
   FROM jsonb_to_recordset(_http_count.counts) x(topic text, outcome text, requests bigint, latency_ms double precision)
   LEFT JOIN eventgrid.topics t ON t.name = x.topic
  GROUP BY 1, 2
 ON CONFLICT ON CONSTRAINT http_publish_counts_key DO UPDATE
    SET requests = c.requests + excluded.requests, latency_ms_sum = c.latency_ms_sum + excluded.latency_ms_sum;
END;
REVOKE ALL ON FUNCTION eventgrid._http_count(counts jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid._http_count(counts jsonb) TO eventgrid_http;
COMMENT ON FUNCTION eventgrid._http_count(counts jsonb) IS 'Internal: adds the HTTP listener''s counts of publish requests (SPEC 16), a JSON array of {topic, outcome, requests, latency_ms}, to eventgrid.http_publish_counts; a topic this database does not have is counted under NULL, an unknown outcome as Other. Executable by eventgrid_http, the listener''s role.';

CREATE VIEW eventgrid.topic_publish_metrics AS
 SELECT h.topic,
    h.outcome,
    h.requests AS requests_total,
    CASE WHEN h.outcome = 'Success' THEN h.latency_ms_sum / 1000.0 END AS latency_seconds_sum
   FROM eventgrid.http_publish_counts h;
COMMENT ON VIEW eventgrid.topic_publish_metrics IS 'Prometheus counters of the publish requests the HTTP data plane answered (SPEC 16), per topic (NULL: the URL named no topic of this database) and outcome: Success (PublishSuccessCount counts the events; this the requests), or the error code answered (Unauthorized, BadRequest, NotFound, MethodNotAllowed, PayloadTooLarge, ServiceUnavailable, Other): Event Grid''s PublishFailCount by reason; latency_seconds_sum of the successes, from the whole request read to the answer (with requests_total, PublishSuccessLatencyInMs). Counted by the listener and written every 5 s. Readable by pg_monitor and eventgrid_admin. README "Monitoring".';
GRANT SELECT ON eventgrid.topic_publish_metrics TO pg_monitor, eventgrid_admin;

CREATE OR REPLACE VIEW eventgrid.metrics AS
 SELECT t.name AS topic,
    NULL::text AS event_subscription,
    m.metric_name,
    m.aggregation,
    m.unit,
    m.value
   FROM ((eventgrid.topics t
     LEFT JOIN eventgrid.topic_counters c ON ((c.topic = t.name)))
     CROSS JOIN LATERAL ( SELECT COALESCE(sum(h.requests) FILTER (WHERE h.outcome <> 'Success'), 0)::double precision AS failed,
            (sum(h.latency_ms_sum) FILTER (WHERE h.outcome = 'Success') / NULLIF(sum(h.requests) FILTER (WHERE h.outcome = 'Success'), 0))::double precision AS latency
           FROM eventgrid.http_publish_counts h WHERE h.topic = t.name) p
     CROSS JOIN LATERAL ( VALUES ('PublishSuccessCount'::text,'Total'::text,'Count'::text,(COALESCE(c.published, (0)::bigint))::double precision), ('UnmatchedEventCount'::text,'Total'::text,'Count'::text,(COALESCE(c.unmatched, (0)::bigint))::double precision), ('PublishFailCount'::text,'Total'::text,'Count'::text,p.failed), ('PublishSuccessLatencyInMs'::text,'Average'::text,'Milliseconds'::text,p.latency)) m(metric_name, aggregation, unit, value))
UNION ALL
 SELECT s.topic,
    s.name AS event_subscription,
    m.metric_name,
    m.aggregation,
    m.unit,
    m.value
   FROM (((eventgrid.event_subscriptions s
     LEFT JOIN eventgrid.subscription_counters c ON ((c.subscription_id = s.id)))
     LEFT JOIN ( SELECT a.subscription_id,
            avg(a.duration_ms) AS average,
            percentile_cont((0.95)::double precision) WITHIN GROUP (ORDER BY a.duration_ms) AS p95
           FROM eventgrid.attempt_log a
          WHERE ((a.http_status IS NOT NULL) AND (a.duration_ms IS NOT NULL))
          GROUP BY a.subscription_id) d ON ((d.subscription_id = s.id)))
     CROSS JOIN LATERAL ( VALUES ('MatchedEventCount'::text,'Total'::text,'Count'::text,(COALESCE(c.matched, (0)::bigint))::double precision), ('DeliverySuccessCount'::text,'Total'::text,'Count'::text,((COALESCE(c.delivered, (0)::bigint) + (( SELECT COALESCE(sum(x.acknowledged), (0)::numeric) AS "coalesce"
                   FROM eventgrid.queue_counters x
                  WHERE (x.subscription_id = s.id)))::bigint))::double precision), ('DeliveryAttemptFailCount'::text,'Total'::text,'Count'::text,(COALESCE(c.failed_attempts, (0)::bigint))::double precision), ('DeadLetteredCount'::text,'Total'::text,'Count'::text,(COALESCE(c.dead_lettered, (0)::bigint))::double precision), ('DroppedEventCount'::text,'Total'::text,'Count'::text,(COALESCE(c.dropped, (0)::bigint))::double precision), ('DestinationProcessingDurationInMs'::text,'Average'::text,'Milliseconds'::text,d.average), ('DestinationProcessingDurationInMs'::text,'P95'::text,'Milliseconds'::text,d.p95)) m(metric_name, aggregation, unit, value));

COMMENT ON VIEW eventgrid.metrics IS 'Event Grid''s metrics, one row per metric and topic (event_subscription NULL: PublishSuccessCount, UnmatchedEventCount, and of requests to the HTTP data plane PublishFailCount, refused requests, and PublishSuccessLatencyInMs Average, from a whole request read to its answer, NULL before the first) or event subscription (MatchedEventCount, DeliverySuccessCount, DeliveryAttemptFailCount, DeadLetteredCount, DroppedEventCount, DestinationProcessingDurationInMs Average and P95). Counts are totals since the topic or subscription was created; published events are counted by the upkeep worker, about a second after commit. Durations: libcurl''s total time of the retained attempts that had an HTTP answer (NULL when there are none); they follow eventgrid.attempt_history.';
