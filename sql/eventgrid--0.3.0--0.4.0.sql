-- eventgrid 0.3.0 -> 0.4.0: advanced filters and the namespace-topic
-- delivery profile.
--
-- Advanced filters (SPEC 9): an event subscription may hold up to 25 of
-- Event Grid's advanced filters, as Event Grid's own JSON; the delivery
-- worker tests them in its claim queries (eventgrid._advanced_match, C in
-- src/filter.c).
--
-- Namespace topics (SPEC 4 and 7): a
-- topic created with topic_type => 'namespace' takes CloudEvents 1.0 only,
-- and its event subscriptions are delivered with the namespace profile:
-- retries 10 s, 30 s, 1 min, 5 min after the first attempt and then every
-- 5 minutes, max_delivery_count 1-10, event_time_to_live PT1M-P7D, no retry
-- after 400, 401, 403, 404, 413, 414, a timeout or a socket error, and dead
-- letters in the namespace shape.  CREATE EXTENSION installs 0.2.0 and runs
-- the upgrade scripts, so a fresh installation and an updated one are the
-- same.
\echo Use "CREATE EXTENSION eventgrid" or "ALTER EXTENSION eventgrid UPDATE" to load this file. \quit

----------------------------------------------------------------------------
-- Helpers
----------------------------------------------------------------------------

CREATE FUNCTION eventgrid._check_advanced_filters(filters jsonb) RETURNS boolean
AS 'MODULE_PATHNAME', 'eventgrid_check_advanced_filters' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION eventgrid._check_advanced_filters(jsonb) IS
    'Internal: true when filters is a valid array of Event Grid advanced filters; otherwise raises 22023 (malformed) or 54000 (over a limit) naming the filter''s position and field (SPEC 9).';

CREATE FUNCTION eventgrid._advanced_match(event jsonb, filters jsonb, on_arrays boolean) RETURNS boolean
AS 'MODULE_PATHNAME', 'eventgrid_advanced_match' LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION eventgrid._advanced_match(jsonb, jsonb, boolean) IS
    'Internal: does an event pass every advanced filter (true when filters is NULL)? on_arrays: enableAdvancedFilteringOnArrays (SPEC 9).';

-- ISO 8601 durations with minute precision: P[nW][nD][T[nH][nM]].
CREATE FUNCTION eventgrid._duration_minutes(field text, v text) RETURNS integer
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    m text[];
    minutes bigint;
BEGIN
    IF v IS NULL THEN
        RETURN NULL;
    END IF;
    m := regexp_match(v, '^P(?:([0-9]{1,6})W)?(?:([0-9]{1,6})D)?(?:T(?:([0-9]{1,7})H)?(?:([0-9]{1,9})M)?)?$');
    IF m IS NULL OR v IN ('P', 'PT') OR v ~ 'T$' THEN
        RAISE EXCEPTION '% must be an ISO 8601 duration with minute precision from PT1M to P7D, got %',
                        field, eventgrid._quote(v)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = CASE WHEN v ~ '^P.*T.*[0-9.]S$'
                              THEN 'The duration has minute precision: no seconds. For example PT20M, PT1H30M, P1DT2H, P7D.'
                              ELSE 'For example PT20M, PT1H30M, P1DT2H, P7D (days, hours and minutes; no years or months).' END;
    END IF;
    minutes := coalesce(m[1]::bigint, 0) * 7 * 24 * 60 + coalesce(m[2]::bigint, 0) * 24 * 60
             + coalesce(m[3]::bigint, 0) * 60 + coalesce(m[4]::bigint, 0);
    IF minutes < 1 OR minutes > 7 * 24 * 60 THEN
        RAISE EXCEPTION '% must be between PT1M (1 minute) and P7D (7 days), got %', field, eventgrid._quote(v)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'For example PT20M, PT1H30M, P1DT2H, P7D.';
    END IF;
    RETURN minutes;
END $$;
COMMENT ON FUNCTION eventgrid._duration_minutes(text, text) IS
    'Internal: minutes of an ISO 8601 duration of minute precision (weeks, days, hours, minutes) from PT1M to P7D; raises 22023 naming the field and the range otherwise.';

CREATE FUNCTION eventgrid._iso8601_minutes(minutes integer) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN 'P' || CASE WHEN minutes >= 1440 THEN (minutes / 1440) || 'D' ELSE '' END
       || CASE WHEN minutes % 1440 = 0 THEN ''
               ELSE 'T' || CASE WHEN minutes % 1440 >= 60 THEN (minutes % 1440 / 60) || 'H' ELSE '' END
                        || CASE WHEN minutes % 60 > 0 THEN (minutes % 60) || 'M' ELSE '' END END;
COMMENT ON FUNCTION eventgrid._iso8601_minutes(integer) IS
    'Internal: a number of minutes as an ISO 8601 duration (e.g. 1560 -> P1DT2H, 20 -> PT20M).';

----------------------------------------------------------------------------
-- Tables
----------------------------------------------------------------------------

ALTER TABLE eventgrid.topics
    ADD COLUMN topic_type text NOT NULL DEFAULT 'custom',
    ADD CONSTRAINT topics_topic_type_check CHECK (topic_type IN ('custom', 'namespace')),
    ADD CONSTRAINT topics_namespace_schema_check
        CHECK (topic_type <> 'namespace' OR input_schema = 'CloudEventSchemaV1_0');
COMMENT ON COLUMN eventgrid.topics.topic_type IS
    'custom (Event Grid''s custom topic: the topic delivery profile) or namespace (a namespace topic: CloudEvents 1.0 only, the namespace delivery profile).';

ALTER TABLE eventgrid.event_subscriptions
    ADD COLUMN topic_type text NOT NULL DEFAULT 'custom',
    ADD COLUMN advanced_filters jsonb,
    ADD COLUMN enable_advanced_filtering_on_arrays boolean NOT NULL DEFAULT false,
    ADD COLUMN max_delivery_count integer
        GENERATED ALWAYS AS (CASE WHEN topic_type = 'namespace' THEN max_delivery_attempts END) STORED,
    ADD COLUMN event_time_to_live text
        GENERATED ALWAYS AS (CASE WHEN topic_type = 'namespace' THEN eventgrid._iso8601_minutes(event_ttl) END) STORED,
    DROP CONSTRAINT event_subscriptions_max_delivery_attempts_check,
    DROP CONSTRAINT event_subscriptions_event_ttl_check,
    ADD CONSTRAINT event_subscriptions_max_delivery_attempts_check
        CHECK (max_delivery_attempts BETWEEN 1 AND CASE WHEN topic_type = 'namespace' THEN 10 ELSE 30 END),
    ADD CONSTRAINT event_subscriptions_event_ttl_check
        CHECK (event_ttl BETWEEN 1 AND CASE WHEN topic_type = 'namespace' THEN 10080 ELSE 1440 END),
    ADD CONSTRAINT event_subscriptions_topic_type_check CHECK (topic_type IN ('custom', 'namespace')),
    ADD CONSTRAINT event_subscriptions_namespace_schema_check
        CHECK (topic_type <> 'namespace' OR event_delivery_schema = 'CloudEventSchemaV1_0'),
    ADD CONSTRAINT event_subscriptions_advanced_filters_check
        CHECK (advanced_filters IS NULL OR eventgrid._check_advanced_filters(advanced_filters));
COMMENT ON COLUMN eventgrid.event_subscriptions.topic_type IS
    'The delivery profile, from the topic: custom or namespace.';
COMMENT ON COLUMN eventgrid.event_subscriptions.max_delivery_attempts IS
    'Delivery attempts at most: max_delivery_attempts (1-30) of a custom topic''s subscription, max_delivery_count (1-10) of a namespace topic''s.';
COMMENT ON COLUMN eventgrid.event_subscriptions.event_ttl IS
    'Event time-to-live in minutes from the publish time: event_ttl (1-1440) of a custom topic''s subscription, event_time_to_live (PT1M-P7D, 1-10080 minutes) of a namespace topic''s.';
COMMENT ON COLUMN eventgrid.event_subscriptions.advanced_filters IS
    'Event Grid advanced filters as set (a JSON array of {operatorType, key, value or values}), or NULL for none (SPEC 9).';
COMMENT ON COLUMN eventgrid.event_subscriptions.enable_advanced_filtering_on_arrays IS
    'Event Grid''s enableAdvancedFilteringOnArrays: an array value in the event is tested element by element.';
COMMENT ON COLUMN eventgrid.event_subscriptions.max_delivery_count IS
    'Namespace topic subscriptions: max_delivery_count (the same number as max_delivery_attempts); NULL otherwise.';
COMMENT ON COLUMN eventgrid.event_subscriptions.event_time_to_live IS
    'Namespace topic subscriptions: event_time_to_live as an ISO 8601 duration (event_ttl in minutes); NULL otherwise.';

ALTER TABLE eventgrid.dead_letters ADD COLUMN topic_type text NOT NULL DEFAULT 'custom',
    ADD COLUMN event_id bigint;
COMMENT ON COLUMN eventgrid.dead_letters.event_id IS
    'The event''s id in eventgrid.events (what publish() and INSERT ... RETURNING id gave the publisher); NULL for dead letters written before 0.4.0.';
ALTER TABLE eventgrid.subscription_counters ADD COLUMN redelivered bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN eventgrid.dead_letters.topic_type IS
    'Delivery profile of the subscription it was for: custom or namespace (sets the shape in eventgrid.dead_letter_events).';

----------------------------------------------------------------------------
-- Filters: the simple ones and the advanced ones together
----------------------------------------------------------------------------

CREATE FUNCTION eventgrid._matches(event jsonb, types_lower text[], subject_begins_with text,
                                   subject_ends_with text, case_sensitive boolean,
                                   advanced_filters jsonb, on_arrays boolean) RETURNS boolean
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
                 ELSE lower(right(event->>'subject', length(subject_ends_with))) = lower(subject_ends_with) END)
    AND (advanced_filters IS NULL OR eventgrid._advanced_match(event, advanced_filters, on_arrays)),
    false);
COMMENT ON FUNCTION eventgrid._matches(jsonb, text[], text, text, boolean, jsonb, boolean) IS
    'Internal: does an event pass an event subscription''s filters (included event types, case-insensitive; subject begins/ends with; advanced filters) (SPEC 9)?';

CREATE OR REPLACE FUNCTION eventgrid._pending(subscription_id bigint) RETURNS bigint
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
                                 s.subject_ends_with, s.is_subject_case_sensitive,
                                 s.advanced_filters, s.enable_advanced_filtering_on_arrays))
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
                                   s.subject_ends_with, s.is_subject_case_sensitive,
                                   s.advanced_filters, s.enable_advanced_filtering_on_arrays))
      + (SELECT count(*) FROM eventgrid.retries r WHERE r.subscription_id = _pending.subscription_id);
END;

DROP FUNCTION eventgrid._matches(jsonb, text[], text, text, boolean);

----------------------------------------------------------------------------
-- Configuration
----------------------------------------------------------------------------

DROP FUNCTION eventgrid.create_topic(text, text);
CREATE FUNCTION eventgrid.create_topic(name text, input_schema text DEFAULT 'EventGridSchema',
                                       topic_type text DEFAULT 'custom')
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM eventgrid._check_not_null('topic name', name);
    IF NOT eventgrid._is_topic_name(name) THEN
        RAISE EXCEPTION 'invalid topic name %', eventgrid._quote(name)
            USING ERRCODE = 'invalid_name',
                  HINT = 'A topic name has 3 to 50 characters: letters, digits and hyphens.';
    END IF;
    PERFORM eventgrid._check_schema('input_schema', input_schema);
    PERFORM eventgrid._check_not_null('topic_type', topic_type);
    IF topic_type NOT IN ('custom', 'namespace') THEN
        RAISE EXCEPTION 'topic_type must be custom or namespace, got %', eventgrid._quote(topic_type)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'custom: Event Grid''s custom topic delivery profile (the default); namespace: the namespace topic profile.';
    END IF;
    IF topic_type = 'namespace' AND input_schema <> 'CloudEventSchemaV1_0' THEN
        RAISE EXCEPTION 'a namespace topic takes CloudEvents 1.0 only, not %', input_schema
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass input_schema => ''CloudEventSchemaV1_0''.';
    END IF;
    IF EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = create_topic.name) THEN
        RAISE EXCEPTION 'topic "%" already exists', name USING ERRCODE = 'duplicate_object';
    END IF;
    INSERT INTO eventgrid.topics (name, input_schema, topic_type) VALUES (name, input_schema, topic_type);
    INSERT INTO eventgrid.topic_counters (topic) VALUES (name);
    INSERT INTO eventgrid.topic_positions (topic, done) VALUES (name, pg_current_snapshot());
END $$;
COMMENT ON FUNCTION eventgrid.create_topic(text, text, text) IS
    'Creates a topic. name: 3-50 letters, digits, hyphens. input_schema: EventGridSchema (default), CloudEventSchemaV1_0 or CustomEventSchema. topic_type: custom (default; the topic delivery profile) or namespace (CloudEvents 1.0 only; its subscriptions get the namespace delivery profile). Requires eventgrid_admin. Errors: 22004 NULL, 42602 bad name, 22023 bad schema or type, 42710 exists. SPEC 1.';

DROP FUNCTION eventgrid.create_event_subscription(text, text, text, text, text[], text, text, boolean,
                                                  integer, integer, integer, integer, boolean);
CREATE FUNCTION eventgrid.create_event_subscription(
    topic text,
    name text,
    endpoint text,
    event_delivery_schema text DEFAULT NULL,
    included_event_types text[] DEFAULT NULL,
    subject_begins_with text DEFAULT NULL,
    subject_ends_with text DEFAULT NULL,
    is_subject_case_sensitive boolean DEFAULT false,
    max_delivery_attempts integer DEFAULT NULL,
    event_ttl integer DEFAULT NULL,
    max_events_per_batch integer DEFAULT NULL,
    preferred_batch_size_in_kilobytes integer DEFAULT NULL,
    deadletter boolean DEFAULT false,
    advanced_filters jsonb DEFAULT NULL,
    enable_advanced_filtering_on_arrays boolean DEFAULT false,
    max_delivery_count integer DEFAULT NULL,
    event_time_to_live text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
    IF ttype = 'namespace' AND event_delivery_schema <> 'CloudEventSchemaV1_0' THEN
        RAISE EXCEPTION 'event_delivery_schema % is not available for a namespace topic', event_delivery_schema
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A namespace topic delivers CloudEvents 1.0 only: omit event_delivery_schema.';
    END IF;
    IF included_event_types IS NOT NULL AND
       (cardinality(included_event_types) = 0 OR array_position(included_event_types, NULL) IS NOT NULL) THEN
        RAISE EXCEPTION 'included_event_types must be NULL (all types) or a non-empty array without NULLs'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF is_subject_case_sensitive IS NULL OR deadletter IS NULL OR enable_advanced_filtering_on_arrays IS NULL THEN
        RAISE EXCEPTION 'is_subject_case_sensitive, deadletter and enable_advanced_filtering_on_arrays must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT r.attempts, r.ttl INTO attempts, ttl
      FROM eventgrid._retry_policy_args(ttype, max_delivery_attempts, event_ttl, max_delivery_count,
                                        event_time_to_live) r;
    PERFORM eventgrid._check_range('max_events_per_batch', max_events_per_batch, 1, 5000);
    PERFORM eventgrid._check_range('preferred_batch_size_in_kilobytes', preferred_batch_size_in_kilobytes, 1, 1024, ' kilobytes');
    advanced_filters := eventgrid._advanced_filters_arg(advanced_filters);
    IF EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s
                WHERE s.topic = create_event_subscription.topic AND s.name = create_event_subscription.name) THEN
        RAISE EXCEPTION 'event subscription "%" already exists for topic "%"', name, topic
            USING ERRCODE = 'duplicate_object';
    END IF;
    INSERT INTO eventgrid.event_subscriptions AS s
        (topic, name, endpoint, event_delivery_schema, included_event_types, subject_begins_with,
         subject_ends_with, is_subject_case_sensitive, max_delivery_attempts, event_ttl,
         max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter, topic_type,
         advanced_filters, enable_advanced_filtering_on_arrays)
    VALUES (topic, name, endpoint, event_delivery_schema, included_event_types, subject_begins_with,
            subject_ends_with, is_subject_case_sensitive, coalesce(attempts, CASE ttype WHEN 'namespace' THEN 10 ELSE 30 END),
            coalesce(ttl, CASE ttype WHEN 'namespace' THEN 10080 ELSE 1440 END),
            max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter, ttype,
            advanced_filters, enable_advanced_filtering_on_arrays)
    RETURNING s.id INTO sid;
    INSERT INTO eventgrid.subscription_counters (subscription_id) VALUES (sid);
    -- events of transactions that commit after this one's snapshot are for it
    INSERT INTO eventgrid.subscription_positions (subscription_id, since, done)
    VALUES (sid, pg_current_snapshot(), pg_current_snapshot());
    RETURN sid;
END $$;

-- The retry policy arguments of one profile, checked; the other profile's are refused.
CREATE FUNCTION eventgrid._retry_policy_args(topic_type text, max_delivery_attempts integer, event_ttl integer,
                                             max_delivery_count integer, event_time_to_live text,
                                             OUT attempts integer, OUT ttl integer)
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF topic_type = 'namespace' THEN
        IF max_delivery_attempts IS NOT NULL OR event_ttl IS NOT NULL THEN
            RAISE EXCEPTION '% does not apply to a namespace topic''s event subscription',
                            CASE WHEN max_delivery_attempts IS NOT NULL THEN 'max_delivery_attempts' ELSE 'event_ttl' END
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'A namespace topic''s retry policy is max_delivery_count (1-10) and event_time_to_live (an ISO 8601 duration from PT1M to P7D).';
        END IF;
        PERFORM eventgrid._check_range('max_delivery_count', max_delivery_count, 1, 10);
        attempts := max_delivery_count;
        ttl := eventgrid._duration_minutes('event_time_to_live', event_time_to_live);
    ELSE
        IF max_delivery_count IS NOT NULL OR event_time_to_live IS NOT NULL THEN
            RAISE EXCEPTION '% applies only to a namespace topic''s event subscription',
                            CASE WHEN max_delivery_count IS NOT NULL THEN 'max_delivery_count' ELSE 'event_time_to_live' END
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'This topic''s retry policy is max_delivery_attempts (1-30) and event_ttl (1-1440 minutes).';
        END IF;
        PERFORM eventgrid._check_range('max_delivery_attempts', max_delivery_attempts, 1, 30);
        PERFORM eventgrid._check_range('event_ttl', event_ttl, 1, 1440, ' minutes');
        attempts := max_delivery_attempts;
        ttl := event_ttl;
    END IF;
END $$;
COMMENT ON FUNCTION eventgrid._retry_policy_args(text, integer, integer, integer, text) IS
    'Internal: checks the retry policy arguments of a custom (max_delivery_attempts 1-30, event_ttl 1-1440 minutes) or namespace (max_delivery_count 1-10, event_time_to_live PT1M-P7D) subscription and returns attempts and minutes (NULL: not given); the other profile''s arguments are refused with 22023 and a hint.';

-- Advanced filters as given: NULL, JSON null and [] mean none; anything else is checked.
CREATE FUNCTION eventgrid._advanced_filters_arg(filters jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF filters IS NULL OR filters = 'null'::jsonb OR filters = '[]'::jsonb THEN
        RETURN NULL;
    END IF;
    PERFORM eventgrid._check_advanced_filters(filters);
    RETURN filters;
END $$;
COMMENT ON FUNCTION eventgrid._advanced_filters_arg(jsonb) IS
    'Internal: NULL for no advanced filters (NULL, JSON null or []), else the filters once eventgrid._check_advanced_filters accepts them.';

COMMENT ON FUNCTION eventgrid.create_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text) IS
    'Creates an event subscription and returns its id. endpoint: http(s) URL that libcurl parses (no user name or password). event_delivery_schema: defaults to the topic''s input schema (namespace topics: CloudEvents only). Filters: included_event_types (case-insensitive), subject_begins_with / subject_ends_with (case-insensitive unless is_subject_case_sensitive), advanced_filters (Event Grid JSON, see set_advanced_filters) with enable_advanced_filtering_on_arrays (false). Retry policy of a custom topic: max_delivery_attempts 1-30 (30), event_ttl 1-1440 minutes (1440); of a namespace topic: max_delivery_count 1-10 (10), event_time_to_live ISO 8601 PT1M-P7D (P7D); the other profile''s arguments are refused. max_events_per_batch 1-5000, preferred_batch_size_in_kilobytes 1-1024 (either turns batching on), deadletter (false). Requires eventgrid_admin. Errors: 42704, 42602, 22023, 22003, 22004, 54000, 42710. SPEC 1, 4, 5, 7, 9.';

DROP FUNCTION eventgrid.set_retry_policy(text, text, integer, integer);
CREATE FUNCTION eventgrid.set_retry_policy(topic text, name text,
                                           max_delivery_attempts integer DEFAULT NULL,
                                           event_ttl integer DEFAULT NULL,
                                           max_delivery_count integer DEFAULT NULL,
                                           event_time_to_live text DEFAULT NULL)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, name, true);
    attempts integer;
    ttl integer;
BEGIN
    SELECT r.attempts, r.ttl INTO attempts, ttl
      FROM eventgrid.event_subscriptions s,
           eventgrid._retry_policy_args(s.topic_type, set_retry_policy.max_delivery_attempts,
                                        set_retry_policy.event_ttl, set_retry_policy.max_delivery_count,
                                        set_retry_policy.event_time_to_live) r
     WHERE s.id = sid;
    UPDATE eventgrid.event_subscriptions s
       SET max_delivery_attempts = coalesce(attempts, s.max_delivery_attempts),
           event_ttl = coalesce(ttl, s.event_ttl)
     WHERE s.id = sid;
END $$;
COMMENT ON FUNCTION eventgrid.set_retry_policy(text, text, integer, integer, integer, text) IS
    'Sets the retry policy of an event subscription; a NULL argument leaves that setting unchanged. Custom topic: max_delivery_attempts 1-30, event_ttl 1-1440 minutes. Namespace topic: max_delivery_count 1-10, event_time_to_live ISO 8601 duration of minute precision PT1M-P7D (e.g. PT20M, P1DT2H). Delivery stops at whichever limit comes first; the other profile''s arguments are refused. Requires eventgrid_admin. Errors: 42704, 22003, 22004, 22023. SPEC 4.';

CREATE FUNCTION eventgrid.set_advanced_filters(topic text, subscription text, filters jsonb,
                                               enable_advanced_filtering_on_arrays boolean DEFAULT NULL)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, subscription, true);
BEGIN
    UPDATE eventgrid.event_subscriptions s
       SET advanced_filters = eventgrid._advanced_filters_arg(filters),
           enable_advanced_filtering_on_arrays = coalesce(set_advanced_filters.enable_advanced_filtering_on_arrays,
                                                          s.enable_advanced_filtering_on_arrays)
     WHERE s.id = sid;
END $$;
COMMENT ON FUNCTION eventgrid.set_advanced_filters(text, text, jsonb, boolean) IS
    'Replaces the advanced filters of an event subscription. filters: Event Grid''s JSON, an array of {"operatorType", "key", "value"} or {"operatorType", "key", "values": [...]}; NULL or [] removes them. Operators: NumberIn, NumberNotIn, NumberLessThan, NumberGreaterThan, NumberLessThanOrEquals, NumberGreaterThanOrEquals (value), NumberInRange, NumberNotInRange (values: [low, high] pairs), BoolEquals (value), StringContains, StringNotContains, StringBeginsWith, StringNotBeginsWith, StringEndsWith, StringNotEndsWith, StringIn, StringNotIn (values), IsNullOrUndefined, IsNotNull. At most 25 filters and 25 values in all, strings up to 512 characters. enable_advanced_filtering_on_arrays: NULL leaves it unchanged. Events published after the commit are filtered with the new filters. Requires eventgrid_admin. Errors: 42704, 22004, 22023, 54000. SPEC 9.';

----------------------------------------------------------------------------
-- The retry schedule of either profile
----------------------------------------------------------------------------

DROP FUNCTION eventgrid.retry_delay(integer, integer);
CREATE FUNCTION eventgrid.retry_delay(attempt integer, http_status integer DEFAULT NULL,
                                      topic_type text DEFAULT 'custom')
RETURNS interval AS 'MODULE_PATHNAME', 'eventgrid_retry_delay' LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION eventgrid.retry_delay(integer, integer, text) IS
    'Delay before the next delivery attempt after failed attempt number attempt, without jitter. topic_type custom (default; attempt 1-30): 10 s, 30 s, 1 min, 5 min, 10 min, 30 min, 1 h, 3 h, 6 h, then 12 h; NULL for 400, 401, 403, 413. topic_type namespace (attempt 1-10): retries 10 s, 30 s, 1 min and 5 min after the first attempt and then every 5 minutes, so the delays are 10 s, 20 s, 30 s, 4 min, then 5 min; NULL for 400, 401, 403, 404, 413, 414. Either: at least 2 min after HTTP 408 and 30 s after 503; NULL for a success. Errors: 22003 attempt or status out of range, 22023 unknown topic_type. SPEC 3, 4.';

----------------------------------------------------------------------------
-- Views
----------------------------------------------------------------------------

CREATE OR REPLACE VIEW eventgrid.dead_letter_events AS
SELECT d.id, d.topic, d.subscription_name, d.dead_letter_reason, d.delivery_attempts,
       d.last_delivery_outcome, d.last_http_status_code, d.publish_time,
       d.last_delivery_attempt_time, d.dead_lettered_at,
       CASE
       WHEN d.topic_type = 'namespace' THEN
           jsonb_build_object(
               'deadLetterProperties', jsonb_build_object(
                   'deadletterreason', CASE d.dead_letter_reason
                                       WHEN 'MaxDeliveryAttemptsExceeded' THEN 'Maximum delivery attempts was exceeded.'
                                       WHEN 'TimeToLiveExceeded' THEN 'Time to live was exceeded.'
                                       ELSE 'Delivery failed with an error that is not retried.' END,
                   'deliveryattempts', d.delivery_attempts,
                   'deliveryresult', coalesce(d.last_delivery_outcome
                                              || coalesce(' (HTTP ' || d.last_http_status_code || ')', ''),
                                              'NotAttempted'),
                   'publishutc', eventgrid.rfc3339(d.publish_time),
                   'deliveryattemptutc', eventgrid.rfc3339(d.last_delivery_attempt_time)),
               'event', d.event)
       WHEN d.event_delivery_schema = 'CloudEventSchemaV1_0' THEN
           eventgrid.convert_event(d.event, d.input_schema, d.event_delivery_schema, d.publish_time)
           || jsonb_build_object('deadletterreason', d.dead_letter_reason,
                                 'deliveryattempts', d.delivery_attempts,
                                 'lastdeliveryoutcome', d.last_delivery_outcome,
                                 'publishtime', eventgrid.rfc3339(d.publish_time))
           || CASE WHEN d.last_http_status_code IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('lasthttpstatuscode', d.last_http_status_code) END
       WHEN d.event_delivery_schema = 'EventGridSchema' THEN
           eventgrid.convert_event(d.event, d.input_schema, d.event_delivery_schema, d.publish_time)
           || jsonb_build_object('deadLetterReason', d.dead_letter_reason,
                                 'deliveryAttempts', d.delivery_attempts,
                                 'lastDeliveryOutcome', d.last_delivery_outcome,
                                 'publishTime', eventgrid.rfc3339(d.publish_time),
                                 'lastDeliveryAttemptTime', eventgrid.rfc3339(d.last_delivery_attempt_time))
           || CASE WHEN d.last_http_status_code IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('lastHttpStatusCode', d.last_http_status_code) END
       ELSE
           jsonb_build_object('id', d.envelope_id, 'eventTime', eventgrid.rfc3339(d.publish_time),
                              'eventType', 'CustomEvent', 'dataVersion', '', 'metadataVersion', '1',
                              'topic', d.topic, 'subject', '',
                              'deadLetterReason', d.dead_letter_reason,
                              'deliveryAttempts', d.delivery_attempts,
                              'lastDeliveryOutcome', d.last_delivery_outcome,
                              'publishTime', eventgrid.rfc3339(d.publish_time),
                              'lastDeliveryAttemptTime', eventgrid.rfc3339(d.last_delivery_attempt_time),
                              'data', d.event)
           || CASE WHEN d.last_http_status_code IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('lastHttpStatusCode', d.last_http_status_code) END
       END AS dead_letter_event,
       d.event_id
  FROM eventgrid.dead_letters d;
COMMENT ON VIEW eventgrid.dead_letter_events IS
    'Dead-lettered events, each as the JSON document Event Grid writes for its delivery schema (SPEC 7): Event Grid schema with camelCase deadLetterReason, deliveryAttempts, lastDeliveryOutcome, lastHttpStatusCode, publishTime, lastDeliveryAttemptTime; CloudEvents with lowercase attributes; custom schema wrapped in an Event Grid envelope with the event as data. Namespace topics: {"deadLetterProperties": {deadletterreason (a sentence), deliveryattempts, deliveryresult (last outcome and HTTP status, or NotAttempted), publishutc, deliveryattemptutc}, "event": the CloudEvent}.';

CREATE OR REPLACE VIEW eventgrid.topic_statistics AS
SELECT t.name AS topic, t.input_schema,
       (SELECT count(*) FROM eventgrid.event_subscriptions s WHERE s.topic = t.name) AS event_subscriptions,
       (SELECT count(*) FROM eventgrid.events e WHERE e.topic = t.name) AS events_stored,
       coalesce(c.unmatched, 0) AS unmatched_events,
       t.topic_type
  FROM eventgrid.topics t
  LEFT JOIN eventgrid.topic_counters c ON c.topic = t.name;

----------------------------------------------------------------------------
-- Event ids back to publishers: publish() returns them, and a publisher may
-- read the id column, so INSERT ... RETURNING id works too.
----------------------------------------------------------------------------

DROP FUNCTION eventgrid.publish(text, jsonb);
-- SECURITY INVOKER: the INSERT runs with the caller's own column privileges.
CREATE FUNCTION eventgrid.publish(topic text, events jsonb) RETURNS bigint[]
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
    bytes bigint;
    ids bigint[];
BEGIN
    -- SECURITY INVOKER: only functions every caller may execute are used here
    IF topic IS NULL OR events IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', CASE WHEN topic IS NULL THEN 'topic' ELSE 'events' END
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT has_column_privilege('eventgrid.events', 'event', 'INSERT') THEN
        RAISE EXCEPTION 'permission denied to publish to topic "%"',
                        CASE WHEN length(topic) > 64 THEN left(topic, 64) || '...' ELSE topic END
            USING ERRCODE = 'insufficient_privilege',
                  DETAIL = format('Role %I may not insert into eventgrid.events.', current_user),
                  HINT = format('An administrator grants publishing with: GRANT eventgrid_publisher TO %I;', current_user);
    END IF;
    bytes := octet_length(events::text);
    IF jsonb_typeof(events) <> 'array' THEN
        events := jsonb_build_array(events);
        n := 1;
    ELSE
        n := jsonb_array_length(events);
        -- the events' own text: without the brackets and the ", " between elements
        bytes := bytes - 2 - 2 * greatest(n - 1, 0);
    END IF;
    IF n = 0 THEN
        RAISE EXCEPTION 'a publish call must hold at least one event' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF n > 5000 THEN
        RAISE EXCEPTION 'a publish call holds at most 5000 events, got %', n
            USING ERRCODE = 'program_limit_exceeded', HINT = 'Split the events over several calls.';
    END IF;
    IF bytes > 1048576 THEN
        RAISE EXCEPTION 'a publish call holds at most 1 MB (1048576 bytes) of events, got % bytes', bytes
            USING ERRCODE = 'program_limit_exceeded', HINT = 'Split the events over several calls.';
    END IF;
    -- rows are inserted in the order given and draw their ids from the
    -- sequence in that order, so ascending ids are the order given
    WITH stored AS (
        INSERT INTO eventgrid.events (topic, event)
        SELECT publish.topic, e.value FROM jsonb_array_elements(events) WITH ORDINALITY AS e(value, n)
         ORDER BY e.n
        RETURNING id
    )
    SELECT array_agg(stored.id ORDER BY stored.id) INTO ids FROM stored;
    RETURN ids;
END $$;
COMMENT ON FUNCTION eventgrid.publish(text, jsonb) IS
    'Publishes one event (a JSON object) or a JSON array of events to a topic; returns the ids the events were stored under (eventgrid.events.id), in the order given. At most 5000 events and 1 MB (1048576 bytes: the events'' JSON text, without the array''s brackets and separators) per call; each event is validated as for INSERT INTO eventgrid.events. Requires eventgrid_publisher. Errors: 22004 NULL, 42501 not a publisher, 22023, 54000, 42704. SPEC 2, 8.';
GRANT EXECUTE ON FUNCTION eventgrid.publish(text, jsonb) TO PUBLIC;
GRANT SELECT (id) ON eventgrid.events TO eventgrid_publisher;

----------------------------------------------------------------------------
-- Dead letters: delivered again, or purged
----------------------------------------------------------------------------

-- The dead letters a filter selects (NULL: any), locked.
CREATE FUNCTION eventgrid._dead_letter_ids(topic text, subscription text, reason text,
                                           dead_lettered_after timestamptz, dead_lettered_before timestamptz)
RETURNS bigint[] LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ids bigint[];
BEGIN
    IF reason IS NOT NULL AND reason NOT IN ('MaxDeliveryAttemptsExceeded', 'TimeToLiveExceeded', 'NonRetriableError') THEN
        RAISE EXCEPTION 'reason must be MaxDeliveryAttemptsExceeded, TimeToLiveExceeded or NonRetriableError, got %',
                        eventgrid._quote(reason)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Pass NULL for any reason.';
    END IF;
    IF dead_lettered_after IS NOT NULL AND dead_lettered_before IS NOT NULL
       AND dead_lettered_after >= dead_lettered_before THEN
        RAISE EXCEPTION 'dead_lettered_after must be earlier than dead_lettered_before'
            USING ERRCODE = 'invalid_parameter_value';
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
COMMENT ON FUNCTION eventgrid._dead_letter_ids(text, text, text, timestamptz, timestamptz) IS
    'Internal: ids of the dead letters a filter selects (NULL: any), locked FOR UPDATE; 22023 for an unknown reason or an empty time range.';

CREATE FUNCTION eventgrid.redeliver_dead_letters(topic text DEFAULT NULL, subscription text DEFAULT NULL,
                                                 reason text DEFAULT NULL,
                                                 dead_lettered_after timestamptz DEFAULT NULL,
                                                 dead_lettered_before timestamptz DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
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
    ids := eventgrid._dead_letter_ids(topic, subscription, reason, dead_lettered_after, dead_lettered_before);
    WITH gone AS (
        DELETE FROM eventgrid.dead_letters d
         WHERE d.id = ANY (ids) AND d.subscription_id = ANY (sids)
        RETURNING d.*
    ), queued AS (
        -- a fresh start: no attempts made, the time-to-live counted from now
        INSERT INTO eventgrid.retries (subscription_id, event_id, event, payload, publish_time, event_bytes,
                                       attempts, next_attempt_at)
        SELECT g.subscription_id, coalesce(g.event_id, 0), g.event,
               eventgrid.convert_event(g.event, g.input_schema, s.event_delivery_schema, g.publish_time)::text,
               now(), octet_length(g.event::text), 0, now()
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
COMMENT ON FUNCTION eventgrid.redeliver_dead_letters(text, text, text, timestamptz, timestamptz) IS
    'Queues dead letters for delivery again and returns how many: each becomes a delivery with no attempts made and its time-to-live counted from now, due at once, and leaves eventgrid.dead_letters (if it fails again it is dead-lettered again). Filters (NULL: any): topic, subscription name, reason (MaxDeliveryAttemptsExceeded, TimeToLiveExceeded, NonRetriableError), dead_lettered_at >= dead_lettered_after and < dead_lettered_before. Dead letters of dropped subscriptions stay. Running it twice queues nothing the second time. Counted in subscription_counters.redelivered. Requires eventgrid_admin. Errors: 22023. SPEC 7.';

CREATE FUNCTION eventgrid.purge_dead_letters(topic text DEFAULT NULL, subscription text DEFAULT NULL,
                                             reason text DEFAULT NULL,
                                             dead_lettered_after timestamptz DEFAULT NULL,
                                             dead_lettered_before timestamptz DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    ids bigint[] := eventgrid._dead_letter_ids(topic, subscription, reason, dead_lettered_after,
                                               dead_lettered_before);
    n bigint;
BEGIN
    DELETE FROM eventgrid.dead_letters d WHERE d.id = ANY (ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;
COMMENT ON FUNCTION eventgrid.purge_dead_letters(text, text, text, timestamptz, timestamptz) IS
    'Deletes the dead letters a filter selects and returns how many; the same filters as redeliver_dead_letters (NULL: any). Running it twice deletes nothing the second time. Requires eventgrid_admin. Errors: 22023. SPEC 7.';

CREATE OR REPLACE VIEW eventgrid.delivery_statistics AS
SELECT s.topic, s.name AS subscription,
       eventgrid._pending(s.id) AS pending,
       (SELECT count(*) FROM eventgrid.retries r WHERE r.subscription_id = s.id) AS retrying,
       coalesce(c.delivered, 0) AS delivered,
       coalesce(c.failed_attempts, 0) AS failed_attempts,
       coalesce(c.dead_lettered, 0) AS dead_lettered,
       coalesce(c.dropped, 0) AS dropped,
       coalesce(c.redelivered, 0) AS redelivered
  FROM eventgrid.event_subscriptions s
  LEFT JOIN eventgrid.subscription_counters c ON c.subscription_id = s.id;
COMMENT ON VIEW eventgrid.delivery_statistics IS
    'Per event subscription: deliveries pending (not yet delivered, dead-lettered or dropped, retries included), of which waiting for a retry, events delivered, failed delivery attempts (requests sent that failed; attempts held back by probation are not counted), events dead-lettered, events dropped (undeliverable with dead-lettering off), and dead letters queued again by redeliver_dead_letters.';

----------------------------------------------------------------------------
-- Batching as the worker applies it
----------------------------------------------------------------------------

CREATE VIEW eventgrid.event_subscription_batching AS
SELECT s.topic, s.name AS subscription,
       (s.max_events_per_batch IS NOT NULL OR s.preferred_batch_size_in_kilobytes IS NOT NULL) AS batching,
       CASE WHEN s.max_events_per_batch IS NOT NULL OR s.preferred_batch_size_in_kilobytes IS NOT NULL
            THEN coalesce(s.max_events_per_batch,
                          coalesce((SELECT g.setting::integer FROM pg_catalog.pg_settings g WHERE g.name = 'eventgrid.default_max_events_per_batch'), 10))
            ELSE 1 END AS max_events_per_batch,
       CASE WHEN s.max_events_per_batch IS NOT NULL OR s.preferred_batch_size_in_kilobytes IS NOT NULL
            THEN coalesce(s.preferred_batch_size_in_kilobytes,
                          coalesce((SELECT g.setting::integer FROM pg_catalog.pg_settings g WHERE g.name = 'eventgrid.default_preferred_batch_size_in_kilobytes'), 64))
            END AS preferred_batch_size_in_kilobytes,
       CASE WHEN s.max_events_per_batch IS NOT NULL THEN 'subscription'
            WHEN s.preferred_batch_size_in_kilobytes IS NOT NULL THEN 'eventgrid.default_max_events_per_batch'
            ELSE 'batching off' END AS max_events_per_batch_from,
       CASE WHEN s.preferred_batch_size_in_kilobytes IS NOT NULL THEN 'subscription'
            WHEN s.max_events_per_batch IS NOT NULL THEN 'eventgrid.default_preferred_batch_size_in_kilobytes'
            ELSE 'batching off' END AS preferred_batch_size_from
  FROM eventgrid.event_subscriptions s;
COMMENT ON VIEW eventgrid.event_subscription_batching IS
    'Per event subscription, the output batching the delivery worker applies (SPEC 5): off (one event per request), or the event count and size ceiling it uses, each from the subscription or, where the subscription set only the other one, from GUC eventgrid.default_max_events_per_batch / eventgrid.default_preferred_batch_size_in_kilobytes (the server''s values; 10 and 64 when the library is not loaded).';
REVOKE ALL ON eventgrid.event_subscription_batching FROM PUBLIC;
GRANT SELECT ON eventgrid.event_subscription_batching TO eventgrid_admin;

----------------------------------------------------------------------------
-- Privileges
----------------------------------------------------------------------------

REVOKE EXECUTE ON FUNCTION
    eventgrid._check_advanced_filters(jsonb),
    eventgrid._advanced_match(jsonb, jsonb, boolean),
    eventgrid._duration_minutes(text, text),
    eventgrid._iso8601_minutes(integer),
    eventgrid._matches(jsonb, text[], text, text, boolean, jsonb, boolean),
    eventgrid._retry_policy_args(text, integer, integer, integer, text),
    eventgrid._advanced_filters_arg(jsonb),
    eventgrid.create_topic(text, text, text),
    eventgrid.create_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text),
    eventgrid.set_retry_policy(text, text, integer, integer, integer, text),
    eventgrid.set_advanced_filters(text, text, jsonb, boolean),
    eventgrid.retry_delay(integer, integer, text),
    eventgrid._dead_letter_ids(text, text, text, timestamptz, timestamptz),
    eventgrid.redeliver_dead_letters(text, text, text, timestamptz, timestamptz),
    eventgrid.purge_dead_letters(text, text, text, timestamptz, timestamptz)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    eventgrid.create_topic(text, text, text),
    eventgrid.create_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text),
    eventgrid.set_retry_policy(text, text, integer, integer, integer, text),
    eventgrid.set_advanced_filters(text, text, jsonb, boolean),
    eventgrid.redeliver_dead_letters(text, text, text, timestamptz, timestamptz),
    eventgrid.purge_dead_letters(text, text, text, timestamptz, timestamptz)
    TO eventgrid_admin;
-- the views call these with the caller's privileges
GRANT EXECUTE ON FUNCTION
    eventgrid._matches(jsonb, text[], text, text, boolean, jsonb, boolean),
    eventgrid._advanced_match(jsonb, jsonb, boolean)
    TO eventgrid_admin;
GRANT EXECUTE ON FUNCTION eventgrid.retry_delay(integer, integer, text) TO eventgrid_admin, eventgrid_publisher;
