-- eventgrid 0.18.0 -> 0.19.0: event subscriptions that expire (Event
-- Grid's expirationTimeUtc, SPEC 17): expiration_time on
-- create_event_subscription() and update_event_subscription(); from that
-- time on the delivery workers' clock nothing more is claimed or received
-- for the subscription, and the upkeep worker drops it (its dead letters
-- kept).  Prometheus sees the expiration times through
-- eventgrid.event_subscription_expiration_metrics.

\echo Use "ALTER EXTENSION eventgrid UPDATE TO '0.19.0'" to load this file. \quit

ALTER TABLE eventgrid.event_subscriptions ADD COLUMN expiration_time timestamp with time zone;
COMMENT ON COLUMN eventgrid.event_subscriptions.expiration_time IS
    'When the event subscription expires (Event Grid''s expirationTimeUtc; NULL: never): from then on (the delivery workers'' clock) nothing more is delivered or received for it and the upkeep worker drops it. SPEC 17.';
CREATE INDEX event_subscriptions_expiration_time_idx ON eventgrid.event_subscriptions (expiration_time)
    WHERE expiration_time IS NOT NULL;

CREATE FUNCTION eventgrid._expiration_time_arg(expiration_time timestamp with time zone)
    RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF expiration_time IS NULL OR expiration_time = 'infinity' THEN
        RETURN NULL;
    END IF;
    IF expiration_time <= clock_timestamp() THEN
        RAISE EXCEPTION 'expiration time must be in the future, got %', expiration_time
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass a time after now(), or ''infinity'' for an event subscription that never expires.';
    END IF;
    RETURN expiration_time;
END $$;
COMMENT ON FUNCTION eventgrid._expiration_time_arg(expiration_time timestamp with time zone) IS
    'Internal: the expiration_time argument of create_event_subscription() and update_event_subscription() as stored: NULL for NULL and ''infinity'' (never expires); 22023 for a time not in the future of the real clock (clock_timestamp(), -infinity included).';
REVOKE ALL ON FUNCTION eventgrid._expiration_time_arg(expiration_time timestamp with time zone) FROM PUBLIC;

CREATE OR REPLACE FUNCTION eventgrid._held_subscriptions() RETURNS SETOF bigint
    LANGUAGE sql STABLE
    BEGIN ATOMIC
 SELECT ps.ps
    FROM eventgrid._paused_subscriptions() ps(ps)
 UNION ALL
  SELECT v.subscription_id
    FROM eventgrid.endpoint_validations v
   WHERE (v.state <> 'Succeeded'::text)
 UNION ALL
  SELECT s.id
    FROM eventgrid.event_subscriptions s
   WHERE (s.expiration_time <= eventgrid._now());
END;
COMMENT ON FUNCTION eventgrid._held_subscriptions() IS 'Internal: the ids of the event subscriptions the delivery workers claim nothing for: paused by pause_delivery() (eventgrid._paused_subscriptions()), whose endpoint is not validated yet (eventgrid.endpoint_validations), or expired (expiration_time reached on the delivery workers'' clock; the upkeep worker drops them). Inlined into the claims, read once per statement.';

CREATE FUNCTION eventgrid._drop_expired_subscriptions()
    RETURNS TABLE(topic text, name text, expiration_time timestamp with time zone)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    s record;
BEGIN
    FOR s IN SELECT x.topic, x.name, x.expiration_time FROM eventgrid.event_subscriptions x
              WHERE x.expiration_time <= eventgrid._now() ORDER BY x.expiration_time, x.id LIMIT 1000
    LOOP
        PERFORM eventgrid.drop_event_subscription(s.topic, s.name);
        topic := s.topic;
        name := s.name;
        expiration_time := s.expiration_time;
        RETURN NEXT;
    END LOOP;
END $$;
COMMENT ON FUNCTION eventgrid._drop_expired_subscriptions() IS
    'Internal: drops (as drop_event_subscription() does: dead letters kept) the event subscriptions whose expiration_time has come on the delivery workers'' clock, at most 1000 a call, the earliest first; returns their topics, names and expiration times, which the upkeep worker logs.';
REVOKE ALL ON FUNCTION eventgrid._drop_expired_subscriptions() FROM PUBLIC;

CREATE VIEW eventgrid.event_subscription_expiration_metrics AS
 SELECT s.topic,
    s.name AS event_subscription,
    (EXTRACT(epoch FROM s.expiration_time))::double precision AS expiration_timestamp_seconds
   FROM eventgrid.event_subscriptions s
  WHERE (s.expiration_time IS NOT NULL);
COMMENT ON VIEW eventgrid.event_subscription_expiration_metrics IS 'Prometheus gauge per event subscription that expires: expiration_timestamp_seconds, its expiration_time as Unix time (the alert EventgridSubscriptionExpiring fires a day before). Readable by pg_monitor and eventgrid_admin. README "Expiration", SPEC 17.';
GRANT SELECT ON eventgrid.event_subscription_expiration_metrics TO pg_monitor, eventgrid_admin;

DROP FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text, ordering_key text, delivery_mode text, receive_lock_duration integer);
CREATE FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text DEFAULT NULL::text, event_delivery_schema text DEFAULT NULL::text, included_event_types text[] DEFAULT NULL::text[], subject_begins_with text DEFAULT NULL::text, subject_ends_with text DEFAULT NULL::text, is_subject_case_sensitive boolean DEFAULT false, max_delivery_attempts integer DEFAULT NULL::integer, event_ttl integer DEFAULT NULL::integer, max_events_per_batch integer DEFAULT NULL::integer, preferred_batch_size_in_kilobytes integer DEFAULT NULL::integer, deadletter boolean DEFAULT false, advanced_filters jsonb DEFAULT NULL::jsonb, enable_advanced_filtering_on_arrays boolean DEFAULT false, max_delivery_count integer DEFAULT NULL::integer, event_time_to_live text DEFAULT NULL::text, max_events_per_second integer DEFAULT NULL::integer, endpoint_validation text DEFAULT 'none'::text, dead_letter_topic text DEFAULT NULL::text, ordering_key text DEFAULT NULL::text, delivery_mode text DEFAULT 'push'::text, receive_lock_duration integer DEFAULT NULL::integer, expiration_time timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS bigint
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
    expiration_time := eventgrid._expiration_time_arg(expiration_time);
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
         delivery_mode, receive_lock_duration, expiration_time)
    VALUES (topic, name, endpoint, event_delivery_schema, included_event_types, subject_begins_with,
            subject_ends_with, is_subject_case_sensitive, coalesce(attempts, CASE ttype WHEN 'namespace' THEN 10 ELSE 30 END),
            coalesce(ttl, CASE ttype WHEN 'namespace' THEN 10080 ELSE 1440 END),
            max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter, ttype,
            advanced_filters, enable_advanced_filtering_on_arrays, max_events_per_second, dead_letter_topic, ordering_key,
            delivery_mode, receive_lock_duration, expiration_time)
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
    IF expiration_time IS NOT NULL THEN
        -- the upkeep worker plans its next round by the earliest expiration
        PERFORM eventgrid._wake_worker_at_commit();
    END IF;
    RETURN sid;
END $$;

COMMENT ON FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text, ordering_key text, delivery_mode text, receive_lock_duration integer, expiration_time timestamp with time zone) IS 'Creates an event subscription and returns its id. endpoint (push): http(s) URL that libcurl parses, with a host, at most 2048 bytes (no user name or password). event_delivery_schema: defaults to the topic''s input schema (namespace topics: CloudEvents only). Filters: included_event_types (case-insensitive), subject_begins_with / subject_ends_with (case-insensitive unless is_subject_case_sensitive), advanced_filters (Event Grid JSON, see set_advanced_filters) with enable_advanced_filtering_on_arrays (false). Retry policy of a custom topic: max_delivery_attempts 1-30 (30), event_ttl 1-1440 minutes (1440); of a namespace topic: max_delivery_count 1-10 (10), event_time_to_live ISO 8601 PT1M-P7D (P7D); the other profile''s arguments are refused. max_events_per_batch 1-5000, preferred_batch_size_in_kilobytes 1-1024 (either turns batching on), deadletter (false). max_events_per_second 1-100,000 (NULL: no rate limit; a batch counts its events, retries count; events over the rate wait in the queue). endpoint_validation: none (default) or handshake (Event Grid''s SubscriptionValidationEvent, or for CloudEvents the webhook OPTIONS request; nothing is delivered until the endpoint is validated, see event_subscription_validation). dead_letter_topic: a topic (of this database) to which each event this subscription dead-letters or drops is published as a notification, in the transaction that records it (see README, Dead-letter notifications; NULL: none). ordering_key: a dotted field path (1-512 characters, as a dynamic delivery property''s source_field: subject, data.orderId, partitionkey) whose value (string, number or boolean) is each event''s key: events of one key are delivered in publish order, one request at a time across all delivery workers, the next only once the one before is delivered, dead-lettered or dropped; events without it go unordered (NULL: unordered; see README, Ordered delivery). delivery_mode: push (default: delivered to endpoint) or queue (pull delivery, namespace topics only: no endpoint, batching, rate limit, endpoint validation or ordering_key; consumers call receive(), see README, Pull delivery); receive_lock_duration: of a queue subscription, seconds 60-300 (60) a received event stays locked. expiration_time: when the event subscription expires (NULL or ''infinity'': never; else it must be in the future of the real clock): from then on nothing more is delivered or received for it, and the upkeep worker drops it as drop_event_subscription() would (its dead letters are kept; see README, Expiration). Requires eventgrid_admin. Errors: 42704 (also no such dead_letter_topic), 42602, 22023, 22003, 22004, 54000, 42710. SPEC 1, 4, 5, 7, 9, 13, 14, 17.';
REVOKE ALL ON FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text, ordering_key text, delivery_mode text, receive_lock_duration integer, expiration_time timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text, ordering_key text, delivery_mode text, receive_lock_duration integer, expiration_time timestamp with time zone) TO eventgrid_admin;

DROP FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text, ordering_key text, receive_lock_duration integer);
CREATE FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text DEFAULT NULL::text, event_delivery_schema text DEFAULT NULL::text, included_event_types text[] DEFAULT NULL::text[], subject_begins_with text DEFAULT NULL::text, subject_ends_with text DEFAULT NULL::text, is_subject_case_sensitive boolean DEFAULT NULL::boolean, max_delivery_attempts integer DEFAULT NULL::integer, event_ttl integer DEFAULT NULL::integer, max_events_per_batch integer DEFAULT NULL::integer, preferred_batch_size_in_kilobytes integer DEFAULT NULL::integer, deadletter boolean DEFAULT NULL::boolean, advanced_filters jsonb DEFAULT NULL::jsonb, enable_advanced_filtering_on_arrays boolean DEFAULT NULL::boolean, max_delivery_count integer DEFAULT NULL::integer, event_time_to_live text DEFAULT NULL::text, max_events_per_second integer DEFAULT NULL::integer, endpoint_validation text DEFAULT NULL::text, dead_letter_topic text DEFAULT NULL::text, ordering_key text DEFAULT NULL::text, receive_lock_duration integer DEFAULT NULL::integer, expiration_time timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS void
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
    -- NULL keeps it, 'infinity' clears it
    expiration_time := CASE WHEN expiration_time IS NULL THEN cur.expiration_time
                            ELSE eventgrid._expiration_time_arg(expiration_time) END;
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
           receive_lock_duration = update_event_subscription.receive_lock_duration,
           expiration_time = update_event_subscription.expiration_time
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
    IF expiration_time IS DISTINCT FROM cur.expiration_time THEN
        -- the upkeep worker plans its next round by the earliest expiration
        PERFORM eventgrid._wake_worker_at_commit();
    END IF;
    -- requests claimed with the old settings and not sent yet go back
    PERFORM eventgrid._subscriptions_changed_at_commit();
END $$;

COMMENT ON FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text, ordering_key text, receive_lock_duration integer, expiration_time timestamp with time zone) IS 'Changes an event subscription in place (as az eventgrid event-subscription update); the arguments are create_event_subscription''s, with the same ranges, checks and SQLSTATEs. A NULL argument keeps the setting; to clear one pass an empty array (included_event_types: all types), an empty string (subject_begins_with, subject_ends_with, dead_letter_topic), [] (advanced_filters) or 0 (max_events_per_batch, preferred_batch_size_in_kilobytes: both cleared turns batching off; max_events_per_second: no rate limit). endpoint_validation: handshake validates the endpoint again (so does a new endpoint or delivery schema of a subscription that validates), none stops validating. The position, the first attempts in flight and the retries are kept, and the next claim uses the new settings: a new endpoint gets its own health state; with a new event_delivery_schema the retries are converted. ordering_key: a new path keys the events claimed from now on (those waiting keep their keys); '''' makes the subscription unordered and what waited for its key due at once. A changed endpoint is logged, without the URL. delivery_mode cannot change (a queue subscription refuses an endpoint, 22023); receive_lock_duration (60-300 seconds, queue subscriptions only) applies to the locks taken from then on. expiration_time: a new expiration time (in the future), or ''infinity'' to clear it (never expires). Requires eventgrid_admin. Errors: 22004, 42704, 22023, 22003, 54000. SPEC 1, 4, 5, 7, 9, 13, 14, 17.';
REVOKE ALL ON FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text, ordering_key text, receive_lock_duration integer, expiration_time timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text, ordering_key text, receive_lock_duration integer, expiration_time timestamp with time zone) TO eventgrid_admin;

CREATE OR REPLACE FUNCTION eventgrid._queue_take(sid bigint, max_events integer, after timestamp with time zone DEFAULT '-infinity'::timestamp with time zone) RETURNS TABLE(lock_token text, delivery_count integer, event jsonb, was_receivable_at timestamp with time zone)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    SET enable_bitmapscan TO 'off'
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
    IF sub.expiration_time <= t_now THEN
        -- expired: nothing more is received (the upkeep worker drops it)
        RETURN;
    END IF;
    LOOP
        -- receivable now: never received, released, or locked by a receive whose lock expired;
        -- those another session is taking are skipped
        -- (an index scan in the index's order, stopping at the limit: statistics taken of an emptier
        -- queue make a bitmap scan look cheaper, which reads and sorts every receivable event)
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

CREATE OR REPLACE VIEW eventgrid.delivery_statistics AS
 SELECT s.topic,
    s.name AS subscription,
    eventgrid._pending(s.id) AS pending,
    ( SELECT count(*) AS count
           FROM eventgrid.retries r
          WHERE (r.subscription_id = s.id)) AS retrying,
    (COALESCE(c.delivered, (0)::bigint) + COALESCE(k.acknowledged, (0)::bigint)) AS delivered,
    COALESCE(c.failed_attempts, (0)::bigint) AS failed_attempts,
    COALESCE(c.dead_lettered, (0)::bigint) AS dead_lettered,
    COALESCE(c.dropped, (0)::bigint) AS dropped,
    COALESCE(c.redelivered, (0)::bigint) AS redelivered,
    (s.id IN ( SELECT p.p
           FROM eventgrid._paused_subscriptions() p(p))) AS paused,
    s.delivery_mode,
        CASE
            WHEN (s.delivery_mode = 'queue'::text) THEN COALESCE(k.received, (0)::bigint)
            ELSE NULL::bigint
        END AS received,
        CASE
            WHEN (s.delivery_mode = 'queue'::text) THEN COALESCE(k.acknowledged, (0)::bigint)
            ELSE NULL::bigint
        END AS acknowledged,
        CASE
            WHEN (s.delivery_mode = 'queue'::text) THEN COALESCE(k.released, (0)::bigint)
            ELSE NULL::bigint
        END AS released,
        CASE
            WHEN (s.delivery_mode = 'queue'::text) THEN COALESCE(k.rejected, (0)::bigint)
            ELSE NULL::bigint
        END AS rejected,
        CASE
            WHEN (s.delivery_mode = 'queue'::text) THEN COALESCE(k.lock_expired, (0)::bigint)
            ELSE NULL::bigint
        END AS lock_expired,
    s.expiration_time
   FROM ((eventgrid.event_subscriptions s
     LEFT JOIN eventgrid.subscription_counters c ON ((c.subscription_id = s.id)))
     LEFT JOIN LATERAL ( SELECT (sum(x.received))::bigint AS received,
            (sum(x.acknowledged))::bigint AS acknowledged,
            (sum(x.released))::bigint AS released,
            (sum(x.rejected))::bigint AS rejected,
            (sum(x.lock_expired))::bigint AS lock_expired
           FROM eventgrid.queue_counters x
          WHERE ((x.subscription_id = s.id) AND (s.delivery_mode = 'queue'::text))) k ON (true));
COMMENT ON VIEW eventgrid.delivery_statistics IS 'Per event subscription: deliveries pending (not yet delivered, dead-lettered or dropped, retries included), of which waiting for a retry, events delivered, failed delivery attempts (requests sent that failed; attempts held back by probation are not counted), events dead-lettered, events dropped (undeliverable with dead-lettering off), dead letters queued again by redeliver_dead_letters, whether pause_delivery() paused it (itself, its topic or everything; the GUC eventgrid.delivery_paused is not shown here), and its delivery_mode (push or queue). Of a queue event subscription (pull delivery, SPEC 14) delivered counts the events acknowledged, pending the events not yet acknowledged or dead-lettered, and received, acknowledged, released, rejected and lock_expired count the subscriber operations (NULL for push); expiration_time: when it expires (NULL: never; SPEC 17).';
