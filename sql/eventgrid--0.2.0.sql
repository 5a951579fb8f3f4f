-- eventgrid 0.2.0: tables, configuration API, publish path, views, roles.
--
-- Safety rules every object here follows, whoever calls it: SQL functions
-- have SQL-standard bodies (RETURN / BEGIN ATOMIC), bound to pg_catalog's
-- functions and operators when the extension is created; PL/pgSQL functions
-- run with search_path = pg_catalog, pg_temp; PUBLIC may execute only
-- publish(), which checks the caller's privileges.  Two roles carry the privileges: eventgrid_admin (configuration,
-- statistics, dead letters) and eventgrid_publisher (publishing).
--
-- Publishing is an INSERT into eventgrid.events.  A C row trigger validates
-- and stamps each event (SPEC section 8), which is appended to one of three
-- event tables; a statement trigger wakes the delivery worker at commit.
-- Nothing per delivery is written at publish.  The worker (src/worker.c)
-- claims first attempts from each event subscription's position (snapshot
-- batches, SPEC sections 1, 2 and 9) and due retries from
-- eventgrid.retries, delivers them over HTTP and records outcomes: only
-- failures become rows; dead letters are copied to eventgrid.dead_letters;
-- an event table is emptied with TRUNCATE once everything has passed it.

\echo Use "CREATE EXTENSION eventgrid" to load this file. \quit

-- Preloaded, the worker serves one database: refuse to install anywhere else.
CREATE FUNCTION eventgrid._check_install_database() RETURNS void
AS 'MODULE_PATHNAME', 'eventgrid_check_install_database' LANGUAGE C;
SELECT eventgrid._check_install_database();

-- The two roles administrators grant (cluster-wide; kept if the extension is dropped).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'eventgrid_admin') THEN
        CREATE ROLE eventgrid_admin NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'eventgrid_publisher') THEN
        CREATE ROLE eventgrid_publisher NOLOGIN;
    END IF;
END $$;
COMMENT ON ROLE eventgrid_admin IS
    'eventgrid: may configure topics and event subscriptions, read statistics, and read and delete dead letters. Grant it to administrators.';
COMMENT ON ROLE eventgrid_publisher IS
    'eventgrid: may publish events (INSERT INTO eventgrid.events (topic, event), eventgrid.publish()). Grant it to applications.';

----------------------------------------------------------------------------
-- Validation rules, each written once: the table CHECK constraints and the
-- configuration functions (which raise friendlier errors first) share them.
----------------------------------------------------------------------------

CREATE FUNCTION eventgrid._is_topic_name(v text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN v ~ '^[A-Za-z0-9-]{3,50}$';
CREATE FUNCTION eventgrid._is_subscription_name(v text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN v ~ '^[A-Za-z0-9-]{3,64}$';
-- libcurl's URL parser decides (src/http.c): what it accepts, it can deliver to
CREATE FUNCTION eventgrid._endpoint_problem(endpoint text) RETURNS text
AS 'MODULE_PATHNAME', 'eventgrid_endpoint_problem' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION eventgrid._is_schema(v text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN v IN ('EventGridSchema', 'CloudEventSchemaV1_0', 'CustomEventSchema');
-- the sender's own header rule (src/request.c)
CREATE FUNCTION eventgrid._header_problem(header text, value text) RETURNS text
AS 'MODULE_PATHNAME', 'eventgrid_header_problem' LANGUAGE C IMMUTABLE PARALLEL SAFE;
CREATE FUNCTION eventgrid._is_source_field(v text) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN v ~ '^[^.]+(\.[^.]+)*$' AND length(v) <= 512;
-- error messages quote at most 64 characters of an argument
CREATE FUNCTION eventgrid._quote(v text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN '"' || CASE WHEN length(v) > 64 THEN left(v, 64) || '..."' ELSE v || '"' END;

----------------------------------------------------------------------------
-- Tables
----------------------------------------------------------------------------

CREATE TABLE eventgrid.topics (
    name          text PRIMARY KEY,
    input_schema  text NOT NULL DEFAULT 'EventGridSchema',
    created_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT topics_name_check
        CHECK (eventgrid._is_topic_name(name)),
    CONSTRAINT topics_input_schema_check
        CHECK (eventgrid._is_schema(input_schema))
);

CREATE FUNCTION eventgrid._lower_array(a text[]) RETURNS text[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
BEGIN ATOMIC
    SELECT array_agg(lower(x)) FROM unnest(a) AS x;
END;

CREATE TABLE eventgrid.event_subscriptions (
    id                          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic                       text NOT NULL REFERENCES eventgrid.topics (name) ON DELETE CASCADE,
    name                        text NOT NULL,
    endpoint                    text NOT NULL,
    event_delivery_schema       text NOT NULL,
    included_event_types        text[],
    included_event_types_lower  text[] GENERATED ALWAYS AS (eventgrid._lower_array(included_event_types)) STORED,
    subject_begins_with         text,
    subject_ends_with           text,
    is_subject_case_sensitive   boolean NOT NULL DEFAULT false,
    max_delivery_attempts       integer NOT NULL DEFAULT 30,
    event_ttl                   integer NOT NULL DEFAULT 1440,
    max_events_per_batch        integer,
    preferred_batch_size_in_kilobytes integer,
    deadletter                  boolean NOT NULL DEFAULT false,
    created_at                  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT event_subscriptions_topic_name_key UNIQUE (topic, name),
    CONSTRAINT event_subscriptions_name_check
        CHECK (eventgrid._is_subscription_name(name)),
    CONSTRAINT event_subscriptions_endpoint_check
        CHECK (eventgrid._endpoint_problem(endpoint) IS NULL),
    CONSTRAINT event_subscriptions_schema_check
        CHECK (eventgrid._is_schema(event_delivery_schema)),
    CONSTRAINT event_subscriptions_max_delivery_attempts_check
        CHECK (max_delivery_attempts BETWEEN 1 AND 30),
    CONSTRAINT event_subscriptions_event_ttl_check
        CHECK (event_ttl BETWEEN 1 AND 1440),
    CONSTRAINT event_subscriptions_max_events_per_batch_check
        CHECK (max_events_per_batch BETWEEN 1 AND 5000),
    CONSTRAINT event_subscriptions_preferred_batch_size_check
        CHECK (preferred_batch_size_in_kilobytes BETWEEN 1 AND 1024),
    CONSTRAINT event_subscriptions_included_event_types_check
        CHECK (included_event_types IS NULL OR
               (cardinality(included_event_types) > 0 AND array_position(included_event_types, NULL) IS NULL))
);

CREATE TABLE eventgrid.delivery_properties (
    subscription_id  bigint NOT NULL REFERENCES eventgrid.event_subscriptions (id) ON DELETE CASCADE,
    header           text NOT NULL,
    value            text,
    source_field     text,
    is_secret        boolean NOT NULL DEFAULT false,
    CONSTRAINT delivery_properties_header_check
        CHECK (eventgrid._header_problem(header, value) IS NULL),
    CONSTRAINT delivery_properties_source_field_check
        CHECK (eventgrid._is_source_field(source_field)),
    CONSTRAINT delivery_properties_kind_check
        CHECK ((value IS NULL) <> (source_field IS NULL) AND NOT (is_secret AND source_field IS NOT NULL))
);
CREATE UNIQUE INDEX delivery_properties_header_key
    ON eventgrid.delivery_properties (subscription_id, lower(header));

-- Published events are appended, never updated, to three event tables that
-- take turns (partitions of eventgrid.events chosen by the publishing
-- transaction's start time and eventgrid.event_table_rotation): the
-- delivery worker empties a table with TRUNCATE once every position has
-- passed it (see eventgrid.event_tables).  Nothing per delivery is written
-- at publish.  txid is the publishing transaction's id: the worker's
-- batches are the events whose transaction became visible between two of
-- its snapshots.  publish_time and event_bytes are stamped by the publish
-- trigger; a row that arrives with publish_time set (pg_restore; publishers
-- may only write topic and event) is stored as it is.
CREATE FUNCTION eventgrid._event_table() RETURNS smallint
AS 'MODULE_PATHNAME', 'eventgrid_event_table' LANGUAGE C VOLATILE PARALLEL SAFE;

CREATE FUNCTION eventgrid._system_identifier() RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
RETURN (SELECT system_identifier FROM pg_control_system());

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

CREATE TABLE eventgrid.dead_letters (
    id                          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    envelope_id                 uuid NOT NULL DEFAULT gen_random_uuid(),
    topic                       text NOT NULL,
    subscription_name           text NOT NULL,
    subscription_id             bigint,  -- the subscription it was for (which may since be dropped)
    input_schema                text NOT NULL,
    event_delivery_schema       text NOT NULL,
    event                       jsonb NOT NULL,
    dead_letter_reason          text NOT NULL CHECK (dead_letter_reason IN
                                    ('MaxDeliveryAttemptsExceeded', 'TimeToLiveExceeded', 'NonRetriableError')),
    delivery_attempts           integer NOT NULL CHECK (delivery_attempts BETWEEN 0 AND 30),
    last_delivery_outcome       text,
    last_http_status_code       integer,
    publish_time                timestamptz NOT NULL,
    last_delivery_attempt_time  timestamptz,
    dead_lettered_at            timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE eventgrid.subscription_counters (
    subscription_id  bigint PRIMARY KEY REFERENCES eventgrid.event_subscriptions (id) ON DELETE CASCADE,
    delivered        bigint NOT NULL DEFAULT 0,
    failed_attempts  bigint NOT NULL DEFAULT 0,
    dead_lettered    bigint NOT NULL DEFAULT 0,
    dropped          bigint NOT NULL DEFAULT 0
);

CREATE TABLE eventgrid.topic_counters (
    topic      text PRIMARY KEY REFERENCES eventgrid.topics (name) ON DELETE CASCADE,
    unmatched  bigint NOT NULL DEFAULT 0
);

COMMENT ON TABLE eventgrid.topics IS
    'Event Grid topics: named endpoints that events are published to, each with an input schema (SPEC 1).';
COMMENT ON TABLE eventgrid.event_subscriptions IS
    'Event subscriptions: one webhook consumer of a topic with filters, retry policy, batching and dead-letter switch (SPEC 1, 4, 5, 7, 9).';
COMMENT ON TABLE eventgrid.delivery_properties IS
    'Custom delivery properties (HTTP headers) of event subscriptions, at most 10 each (SPEC 8). Secret values are masked in eventgrid.event_subscription_delivery_properties.';
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
COMMENT ON TABLE eventgrid.dead_letters IS
    'Dead-lettered events with reason, attempts and last outcome (SPEC 7). Read them through eventgrid.dead_letter_events.';
COMMENT ON TABLE eventgrid.subscription_counters IS
    'Running totals per event subscription, maintained by the delivery worker.';
COMMENT ON TABLE eventgrid.topic_counters IS
    'Running totals per topic: events that matched no event subscription.';
COMMENT ON TABLE eventgrid.requests_in_flight IS
    'Internal: retries the worker handed to HTTP and has not recorded yet; after a crash only these are charged an attempt (outcome Aborted).';
COMMENT ON TABLE eventgrid.event_table_rotations IS
    'Internal: when the delivery worker last emptied each event table, and why its last try failed. Read through eventgrid.event_tables.';

-- Everything that holds user data goes into pg_dump, with its sequence
-- (requests_in_flight is transient and stays out; chunks in flight are kept:
-- restored, they become retries).
SELECT pg_catalog.pg_extension_config_dump('eventgrid.topics', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.event_subscriptions', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.delivery_properties', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.events_0', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.events_1', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.events_2', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.subscription_positions', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.topic_positions', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.retries', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.chunks_in_flight', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.dead_letters', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.subscription_counters', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.topic_counters', '');
SELECT pg_catalog.pg_extension_config_dump(pg_catalog.pg_get_serial_sequence('eventgrid.event_subscriptions', 'id'), '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.events_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump(pg_catalog.pg_get_serial_sequence('eventgrid.retries', 'id'), '');
SELECT pg_catalog.pg_extension_config_dump(pg_catalog.pg_get_serial_sequence('eventgrid.dead_letters', 'id'), '');

----------------------------------------------------------------------------
-- Pure helpers
----------------------------------------------------------------------------

CREATE FUNCTION eventgrid.rfc3339(ts timestamptz) RETURNS text
LANGUAGE sql STABLE STRICT PARALLEL SAFE
RETURN to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"');
COMMENT ON FUNCTION eventgrid.rfc3339(timestamptz) IS
    'Formats a timestamp as RFC 3339 in UTC with microseconds, as used in event and dead-letter fields.';

CREATE FUNCTION eventgrid.convert_event(event jsonb, from_schema text, to_schema text,
                                        publish_time timestamptz DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE  -- STABLE like jsonb_build_object, so it can be inlined
RETURN CASE
    WHEN from_schema = to_schema THEN event
    WHEN from_schema = 'EventGridSchema' AND to_schema = 'CloudEventSchemaV1_0' THEN
        jsonb_build_object('specversion', '1.0', 'id', event->'id', 'source', event->'topic',
                           'subject', event->'subject', 'type', event->'eventType',
                           'time', event->'eventTime', 'datacontenttype', 'application/json')
        || CASE WHEN event ? 'data' THEN jsonb_build_object('data', event->'data') ELSE '{}' END
        || CASE WHEN coalesce(event->>'dataVersion', '') <> ''
                THEN jsonb_build_object('dataversion', event->'dataVersion') ELSE '{}' END
    WHEN from_schema = 'CloudEventSchemaV1_0' AND to_schema = 'EventGridSchema' THEN
        jsonb_build_object('id', event->'id', 'topic', event->'source',
                           'subject', coalesce(event->'subject', '""'),
                           'eventType', event->'type',
                           'eventTime', coalesce(event->'time', to_jsonb(eventgrid.rfc3339(publish_time))),
                           'data', coalesce(event->'data', 'null'),
                           'dataVersion', coalesce(event->'dataversion', '""'),
                           'metadataVersion', '1')
END;
COMMENT ON FUNCTION eventgrid.convert_event(jsonb, text, text, timestamptz) IS
    'Maps an event between delivery schemas (Event Grid schema <-> CloudEvents 1.0; identity when the schemas are equal; NULL for mappings Event Grid does not offer). publish_time supplies eventTime for CloudEvents without time.';

----------------------------------------------------------------------------
-- Argument checking (used by the configuration functions)
----------------------------------------------------------------------------

CREATE FUNCTION eventgrid._check_range(field text, val integer, lo integer, hi integer, unit text DEFAULT '')
RETURNS void LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF val IS NOT NULL AND (val < lo OR val > hi) THEN
        RAISE EXCEPTION '% must be between % and %, got %', field, lo, hi || unit, val
            USING ERRCODE = 'numeric_value_out_of_range',
                  HINT = format('Choose a whole number from %s to %s%s.', lo, hi, unit);
    END IF;
END $$;

CREATE FUNCTION eventgrid._check_schema(field text, val text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF val IS NULL OR NOT eventgrid._is_schema(val) THEN
        RAISE EXCEPTION 'invalid % %', field, eventgrid._quote(val)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use EventGridSchema, CloudEventSchemaV1_0 or CustomEventSchema.';
    END IF;
END $$;

CREATE FUNCTION eventgrid._check_not_null(field text, val anyelement) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF val IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', field USING ERRCODE = 'null_value_not_allowed';
    END IF;
END $$;

CREATE FUNCTION eventgrid._subscription_id(topic text, name text, lock boolean DEFAULT false)
RETURNS bigint LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    sid bigint;
BEGIN
    PERFORM eventgrid._check_not_null('topic', topic);
    PERFORM eventgrid._check_not_null('event subscription name', name);
    IF lock THEN
        SELECT s.id INTO sid FROM eventgrid.event_subscriptions s
         WHERE s.topic = _subscription_id.topic AND s.name = _subscription_id.name FOR UPDATE;
    ELSE
        SELECT s.id INTO sid FROM eventgrid.event_subscriptions s
         WHERE s.topic = _subscription_id.topic AND s.name = _subscription_id.name;
    END IF;
    IF sid IS NULL THEN
        RAISE EXCEPTION 'event subscription % of topic % does not exist', eventgrid._quote(name), eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object',
                  HINT = 'List subscriptions with: SELECT topic, name FROM eventgrid.event_subscriptions;';
    END IF;
    RETURN sid;
END $$;

CREATE FUNCTION eventgrid._check_endpoint(endpoint text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    problem text := eventgrid._endpoint_problem(endpoint);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'invalid endpoint %: %', eventgrid._quote(endpoint), problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use an absolute http:// or https:// URL with a host and no user name or password; send credentials as a secret delivery property.';
    END IF;
END $$;

----------------------------------------------------------------------------
-- Topics.  The configuration functions are SECURITY DEFINER: members of
-- eventgrid_admin call them without any privilege on the tables themselves.
----------------------------------------------------------------------------

CREATE FUNCTION eventgrid.create_topic(name text, input_schema text DEFAULT 'EventGridSchema')
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
COMMENT ON FUNCTION eventgrid.create_topic(text, text) IS
    'Creates a topic. name: 3-50 letters, digits, hyphens. input_schema: EventGridSchema (default), CloudEventSchemaV1_0 or CustomEventSchema. Requires eventgrid_admin. Errors: 22004 NULL, 42602 bad name, 22023 bad schema, 42710 exists. SPEC 1.';

CREATE FUNCTION eventgrid.drop_topic(name text) RETURNS void
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
COMMENT ON FUNCTION eventgrid.drop_topic(text) IS
    'Drops a topic with its event subscriptions and their pending deliveries and retries. Dead letters are kept. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such topic.';

----------------------------------------------------------------------------
-- Event subscriptions
----------------------------------------------------------------------------

CREATE FUNCTION eventgrid.create_event_subscription(
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
COMMENT ON FUNCTION eventgrid.create_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean) IS
    'Creates an event subscription and returns its id. endpoint: http(s) URL that libcurl parses (no user name or password). event_delivery_schema: defaults to the topic''s input schema. Filters: included_event_types (case-insensitive), subject_begins_with / subject_ends_with (case-insensitive unless is_subject_case_sensitive). max_delivery_attempts 1-30 (30), event_ttl 1-1440 minutes (1440), max_events_per_batch 1-5000, preferred_batch_size_in_kilobytes 1-1024 (either turns batching on), deadletter (false). Requires eventgrid_admin. Errors: 42704, 42602, 22023, 22003, 22004, 42710. SPEC 1, 4, 5, 7, 9.';

CREATE FUNCTION eventgrid.drop_event_subscription(topic text, name text) RETURNS void
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
COMMENT ON FUNCTION eventgrid.drop_event_subscription(text, text) IS
    'Drops an event subscription with its pending deliveries and retries. Dead letters are kept. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription.';

CREATE FUNCTION eventgrid.set_retry_policy(topic text, name text,
                                           max_delivery_attempts integer DEFAULT NULL,
                                           event_ttl integer DEFAULT NULL)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, name, true);
BEGIN
    PERFORM eventgrid._check_range('max_delivery_attempts', max_delivery_attempts, 1, 30);
    PERFORM eventgrid._check_range('event_ttl', event_ttl, 1, 1440, ' minutes');
    UPDATE eventgrid.event_subscriptions s
       SET max_delivery_attempts = coalesce(set_retry_policy.max_delivery_attempts, s.max_delivery_attempts),
           event_ttl = coalesce(set_retry_policy.event_ttl, s.event_ttl)
     WHERE s.id = sid;
END $$;
COMMENT ON FUNCTION eventgrid.set_retry_policy(text, text, integer, integer) IS
    'Sets the retry policy of an event subscription; a NULL argument leaves that setting unchanged. max_delivery_attempts 1-30, event_ttl 1-1440 minutes; delivery stops at whichever limit comes first. Requires eventgrid_admin. Errors: 42704, 22003, 22004. SPEC 4.';

CREATE FUNCTION eventgrid.set_batching(topic text, name text,
                                       max_events_per_batch integer DEFAULT NULL,
                                       preferred_batch_size_in_kilobytes integer DEFAULT NULL)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, name, true);
BEGIN
    PERFORM eventgrid._check_range('max_events_per_batch', max_events_per_batch, 1, 5000);
    PERFORM eventgrid._check_range('preferred_batch_size_in_kilobytes', preferred_batch_size_in_kilobytes, 1, 1024, ' kilobytes');
    UPDATE eventgrid.event_subscriptions s
       SET max_events_per_batch = set_batching.max_events_per_batch,
           preferred_batch_size_in_kilobytes = set_batching.preferred_batch_size_in_kilobytes
     WHERE s.id = sid;
END $$;
COMMENT ON FUNCTION eventgrid.set_batching(text, text, integer, integer) IS
    'Sets output batching of an event subscription. max_events_per_batch 1-5000, preferred_batch_size_in_kilobytes 1-1024; setting either turns batching on (the other comes from GUC eventgrid.default_max_events_per_batch or eventgrid.default_preferred_batch_size_in_kilobytes); both NULL turns batching off. Requires eventgrid_admin. Errors: 42704, 22003, 22004. SPEC 5.';

CREATE FUNCTION eventgrid.set_deadletter(topic text, name text, enabled boolean)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, name, true);
BEGIN
    PERFORM eventgrid._check_not_null('enabled', enabled);
    UPDATE eventgrid.event_subscriptions s SET deadletter = enabled WHERE s.id = sid;
END $$;
COMMENT ON FUNCTION eventgrid.set_deadletter(text, text, boolean) IS
    'Turns dead-lettering of an event subscription on or off (off by default: undeliverable events are then dropped and counted). Requires eventgrid_admin. Errors: 42704, 22004. SPEC 7.';

CREATE FUNCTION eventgrid._put_delivery_property(p_topic text, p_subscription text, p_header text,
                                                 p_value text, p_source_field text, p_is_secret boolean)
RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(p_topic, p_subscription, true);
    problem text;
BEGIN
    PERFORM eventgrid._check_not_null('header', p_header);
    PERFORM eventgrid._check_not_null('is_secret', p_is_secret);
    IF p_source_field IS NULL AND p_value IS NULL THEN
        RAISE EXCEPTION 'delivery property value must not be NULL'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Remove a header with eventgrid.remove_delivery_property().';
    END IF;
    IF lower(p_header) LIKE 'aeg-%' THEN
        RAISE EXCEPTION 'delivery property header name % must not start with "aeg-"', eventgrid._quote(p_header)
            USING ERRCODE = 'reserved_name', HINT = 'Headers starting with aeg- are set by eventgrid itself.';
    END IF;
    IF octet_length(p_value) > 4096 THEN
        RAISE EXCEPTION 'delivery property value of header % is % bytes; at most 4096 bytes are allowed',
                        eventgrid._quote(p_header), octet_length(p_value)
            USING ERRCODE = 'string_data_right_truncation';
    END IF;
    problem := eventgrid._header_problem(p_header, p_value);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'invalid delivery property %: %', eventgrid._quote(p_header), problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Names are HTTP tokens of at most 256 characters other than Content-Length, Transfer-Encoding, Host, Connection, Upgrade, TE, Trailer, Expect, Keep-Alive, Content-Type and Proxy-*; values hold no control characters.';
    END IF;
    IF p_source_field IS NOT NULL AND NOT eventgrid._is_source_field(p_source_field) THEN
        RAISE EXCEPTION 'invalid source_field %', eventgrid._quote(p_source_field)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Name a field of the event as a dotted path such as data.orderId (at most 512 characters).';
    END IF;
    INSERT INTO eventgrid.delivery_properties AS p (subscription_id, header, value, source_field, is_secret)
    VALUES (sid, p_header, p_value, p_source_field, p_is_secret)
    ON CONFLICT (subscription_id, lower(header)) DO UPDATE
        SET header = EXCLUDED.header, value = EXCLUDED.value,
            source_field = EXCLUDED.source_field, is_secret = EXCLUDED.is_secret;
    IF (SELECT count(*) FROM eventgrid.delivery_properties p WHERE p.subscription_id = sid) > 10 THEN
        RAISE EXCEPTION 'event subscription "%" of topic "%" would have more than 10 delivery properties',
                        p_subscription, p_topic
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Remove one with eventgrid.remove_delivery_property() first.';
    END IF;
END $$;

CREATE FUNCTION eventgrid.set_delivery_property(topic text, subscription text, header text, value text,
                                                is_secret boolean DEFAULT false)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM eventgrid._put_delivery_property(topic, subscription, header, value, NULL, is_secret);
END $$;
COMMENT ON FUNCTION eventgrid.set_delivery_property(text, text, text, text, boolean) IS
    'Adds or replaces a static custom delivery property (HTTP header sent with every request). header: HTTP token, 1-256 chars, not aeg-*, not one that changes framing or routing (Content-Length, Transfer-Encoding, Host, Connection, Upgrade, TE, Trailer, Expect, Keep-Alive, Proxy-*) nor Content-Type. value: at most 4096 bytes, no control characters. is_secret: value is sent but shown masked. At most 10 per subscription. Requires eventgrid_admin. Errors: 42704, 22023, 42939, 22001, 54000, 22004. SPEC 8.';

CREATE FUNCTION eventgrid.set_dynamic_delivery_property(topic text, subscription text, header text,
                                                        source_field text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM eventgrid._check_not_null('source_field', source_field);
    PERFORM eventgrid._put_delivery_property(topic, subscription, header, NULL, source_field, false);
END $$;
COMMENT ON FUNCTION eventgrid.set_dynamic_delivery_property(text, text, text, text) IS
    'Adds or replaces a dynamic custom delivery property whose value is taken from a field of each event (dotted path such as data.orderId; strings, numbers and booleans only; a value that is of another type, longer than 4096 bytes or holding a control character leaves the header out). Same name rules as set_delivery_property. Requires eventgrid_admin. SPEC 8.';

CREATE FUNCTION eventgrid.remove_delivery_property(topic text, subscription text, header text)
RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM eventgrid._check_not_null('header', header);
    DELETE FROM eventgrid.delivery_properties p
     WHERE p.subscription_id = eventgrid._subscription_id(topic, subscription)
       AND lower(p.header) = lower(remove_delivery_property.header);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'event subscription % of topic % has no delivery property %',
                        eventgrid._quote(subscription), eventgrid._quote(topic), eventgrid._quote(header)
            USING ERRCODE = 'undefined_object';
    END IF;
END $$;
COMMENT ON FUNCTION eventgrid.remove_delivery_property(text, text, text) IS
    'Removes a custom delivery property. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription or header.';

----------------------------------------------------------------------------
-- Publishing
----------------------------------------------------------------------------

CREATE FUNCTION eventgrid._validate_event() RETURNS trigger
AS 'MODULE_PATHNAME', 'eventgrid_validate_event' LANGUAGE C;

CREATE FUNCTION eventgrid._wake_worker_at_commit() RETURNS void
AS 'MODULE_PATHNAME', 'eventgrid_wake_worker_at_commit' LANGUAGE C VOLATILE;

-- Publishing writes nothing but the event: the worker finds new events
-- through its snapshots.  This only wakes it when the transaction commits.
CREATE FUNCTION eventgrid._wake_at_commit() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM eventgrid._wake_worker_at_commit();
    RETURN NULL;
END $$;

CREATE FUNCTION eventgrid._refuse_change() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'published events are immutable'
        USING ERRCODE = 'feature_not_supported',
              HINT = 'Publish a new event instead; drop a topic or subscription to discard pending events.';
END $$;

CREATE TRIGGER events_validate BEFORE INSERT ON eventgrid.events
    FOR EACH ROW EXECUTE FUNCTION eventgrid._validate_event();
CREATE TRIGGER events_wake AFTER INSERT ON eventgrid.events
    FOR EACH STATEMENT EXECUTE FUNCTION eventgrid._wake_at_commit();
CREATE TRIGGER events_immutable BEFORE UPDATE ON eventgrid.events
    FOR EACH ROW EXECUTE FUNCTION eventgrid._refuse_change();

-- SECURITY INVOKER: the INSERT runs with the caller's own column privileges.
CREATE FUNCTION eventgrid.publish(topic text, events jsonb) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    n integer;
    bytes bigint;
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
    INSERT INTO eventgrid.events (topic, event)
    SELECT publish.topic, e FROM jsonb_array_elements(events) AS e;
    RETURN n;
END $$;
COMMENT ON FUNCTION eventgrid.publish(text, jsonb) IS
    'Publishes one event (a JSON object) or a JSON array of events to a topic; returns how many. At most 5000 events and 1 MB (1048576 bytes: the events'' JSON text, without the array''s brackets and separators) per call; each event is validated as for INSERT INTO eventgrid.events. Requires eventgrid_publisher. Errors: 22004 NULL, 42501 not a publisher, 22023, 54000, 42704. SPEC 2, 8.';

----------------------------------------------------------------------------
-- Retry schedule and outcomes (pure functions in src/retry.c)
----------------------------------------------------------------------------

CREATE FUNCTION eventgrid.retry_delay(attempt integer, http_status integer DEFAULT NULL)
RETURNS interval AS 'MODULE_PATHNAME', 'eventgrid_retry_delay' LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION eventgrid.retry_delay(integer, integer) IS
    'Delay before the next delivery attempt after failed attempt number attempt (1-30), without jitter: 10 s, 30 s, 1 min, 5 min, 10 min, 30 min, 1 h, 3 h, 6 h, then 12 h; at least 2 min after HTTP 408 and 30 s after 503. NULL when the status is not retried (400, 401, 403, 413) or is a success. Errors: 22003 attempt out of range. SPEC 3, 4.';

CREATE FUNCTION eventgrid.delivery_outcome(http_status integer) RETURNS text
AS 'MODULE_PATHNAME', 'eventgrid_delivery_outcome' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION eventgrid.delivery_outcome(integer) IS
    'lastDeliveryOutcome name recorded for an HTTP status: Delivered (200-204), BadRequest (400), Unauthorized (401), Forbidden (403), NotFound (404), TimedOut (408), PayloadTooLarge (413), Busy (429, 503), GenericError (anything else). Errors: 22003 status outside 100-599. SPEC 3.';

----------------------------------------------------------------------------
-- Views
----------------------------------------------------------------------------

CREATE VIEW eventgrid.dead_letter_events AS
SELECT d.id, d.topic, d.subscription_name, d.dead_letter_reason, d.delivery_attempts,
       d.last_delivery_outcome, d.last_http_status_code, d.publish_time,
       d.last_delivery_attempt_time, d.dead_lettered_at,
       CASE d.event_delivery_schema
       WHEN 'CloudEventSchemaV1_0' THEN
           eventgrid.convert_event(d.event, d.input_schema, d.event_delivery_schema, d.publish_time)
           || jsonb_build_object('deadletterreason', d.dead_letter_reason,
                                 'deliveryattempts', d.delivery_attempts,
                                 'lastdeliveryoutcome', d.last_delivery_outcome,
                                 'publishtime', eventgrid.rfc3339(d.publish_time))
           || CASE WHEN d.last_http_status_code IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('lasthttpstatuscode', d.last_http_status_code) END
       WHEN 'EventGridSchema' THEN
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
       END AS dead_letter_event
  FROM eventgrid.dead_letters d;
COMMENT ON VIEW eventgrid.dead_letter_events IS
    'Dead-lettered events, each as the JSON document Event Grid writes for its delivery schema (SPEC 7): Event Grid schema with camelCase deadLetterReason, deliveryAttempts, lastDeliveryOutcome, lastHttpStatusCode, publishTime, lastDeliveryAttemptTime; CloudEvents with lowercase attributes; custom schema wrapped in an Event Grid envelope with the event as data.';

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

CREATE VIEW eventgrid.event_subscription_delivery_properties AS
SELECT s.topic, s.name AS subscription, p.header,
       CASE WHEN p.source_field IS NOT NULL THEN 'dynamic' WHEN p.is_secret THEN 'secret' ELSE 'static' END AS kind,
       CASE WHEN p.is_secret THEN '********' ELSE p.value END AS value,
       p.source_field
  FROM eventgrid.delivery_properties p
  JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id;
COMMENT ON VIEW eventgrid.event_subscription_delivery_properties IS
    'Custom delivery properties of each event subscription; secret values are shown as ********.';

----------------------------------------------------------------------------
-- Privileges.  Everything belongs to the extension owner; PUBLIC may only
-- call publish(), which checks the caller's privileges.  eventgrid_publisher may insert (topic, event) into
-- eventgrid.events (no other column: ids and publish times are the
-- extension's) and call publish(); the publish trigger reads the topic's
-- input schema with the publisher's privileges.  eventgrid_admin calls the
-- configuration functions (SECURITY DEFINER), reads every table and view
-- except the raw delivery_properties (secrets show masked in
-- event_subscription_delivery_properties), and may delete dead letters.
----------------------------------------------------------------------------
REVOKE ALL ON SCHEMA eventgrid FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA eventgrid FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA eventgrid FROM PUBLIC;
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA eventgrid FROM PUBLIC;

-- The schema's names are visible to all, and publish() is callable by all:
-- it is SECURITY INVOKER, so it inserts with the caller's own privileges,
-- and refuses a caller who is not a publisher with a hint naming the role.
GRANT USAGE ON SCHEMA eventgrid TO PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.publish(text, jsonb) TO PUBLIC;

GRANT SELECT (name, input_schema) ON eventgrid.topics TO eventgrid_publisher;
GRANT INSERT (topic, event) ON eventgrid.events TO eventgrid_publisher;
GRANT USAGE ON SEQUENCE eventgrid.events_id_seq TO eventgrid_publisher;  -- the id default

GRANT SELECT ON eventgrid.topics, eventgrid.event_subscriptions, eventgrid.events,
    eventgrid.retries, eventgrid.subscription_positions, eventgrid.topic_positions,
    eventgrid.chunks_in_flight, eventgrid.event_table_rotations,
    eventgrid.dead_letters, eventgrid.subscription_counters,
    eventgrid.topic_counters, eventgrid.dead_letter_events, eventgrid.delivery_statistics,
    eventgrid.topic_statistics, eventgrid.event_subscription_delivery_properties, eventgrid.event_tables
    TO eventgrid_admin;
GRANT DELETE ON eventgrid.dead_letters TO eventgrid_admin;
GRANT EXECUTE ON FUNCTION
    eventgrid.create_topic(text, text),
    eventgrid.drop_topic(text),
    eventgrid.create_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean),
    eventgrid.drop_event_subscription(text, text),
    eventgrid.set_retry_policy(text, text, integer, integer),
    eventgrid.set_batching(text, text, integer, integer),
    eventgrid.set_deadletter(text, text, boolean),
    eventgrid.set_delivery_property(text, text, text, text, boolean),
    eventgrid.set_dynamic_delivery_property(text, text, text, text),
    eventgrid.remove_delivery_property(text, text, text)
    TO eventgrid_admin;
-- the views and the events table's default call these with the caller's privileges
GRANT EXECUTE ON FUNCTION eventgrid._event_table() TO eventgrid_publisher, eventgrid_admin;
GRANT EXECUTE ON FUNCTION
    eventgrid._pending(bigint),
    eventgrid._event_table_holders(smallint),
    eventgrid._matches(jsonb, text[], text, text, boolean),
    eventgrid._in_batch(xid8, pg_snapshot, pg_snapshot)
    TO eventgrid_admin;
GRANT EXECUTE ON FUNCTION
    eventgrid.retry_delay(integer, integer),
    eventgrid.delivery_outcome(integer),
    eventgrid.convert_event(jsonb, text, text, timestamptz),
    eventgrid.rfc3339(timestamptz)
    TO eventgrid_admin, eventgrid_publisher;

COMMENT ON FUNCTION eventgrid._validate_event() IS
    'Internal: BEFORE INSERT row trigger on eventgrid.events; validates each event against its topic''s input schema and stamps it (SPEC 8).';
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
COMMENT ON FUNCTION eventgrid._refuse_change() IS
    'Internal: refuses UPDATE of published events (0A000).';
COMMENT ON FUNCTION eventgrid._lower_array(text[]) IS
    'Internal: lower-cases every element; feeds event_subscriptions.included_event_types_lower.';
COMMENT ON FUNCTION eventgrid._check_range(text, integer, integer, integer, text) IS
    'Internal: raises 22003 naming the field and its range when val is outside lo..hi.';
COMMENT ON FUNCTION eventgrid._check_schema(text, text) IS
    'Internal: raises 22023 unless val is EventGridSchema, CloudEventSchemaV1_0 or CustomEventSchema.';
COMMENT ON FUNCTION eventgrid._subscription_id(text, text, boolean) IS
    'Internal: id of an event subscription (optionally locked FOR UPDATE); raises 42704 when there is none.';
COMMENT ON FUNCTION eventgrid._put_delivery_property(text, text, text, text, text, boolean) IS
    'Internal: validates and upserts one custom delivery property, enforcing at most 10 per subscription.';
COMMENT ON FUNCTION eventgrid._is_topic_name(text) IS 'Internal: a topic name has 3 to 50 letters, digits and hyphens.';
COMMENT ON FUNCTION eventgrid._is_subscription_name(text) IS 'Internal: an event subscription name has 3 to 64 letters, digits and hyphens.';
COMMENT ON FUNCTION eventgrid._endpoint_problem(text) IS 'Internal: NULL when libcurl''s URL parser accepts the endpoint (http or https, a host, port 1-65535, no user name or password), else why not.';
COMMENT ON FUNCTION eventgrid._check_endpoint(text) IS 'Internal: raises 22023 with libcurl''s reason when the endpoint is not usable.';
COMMENT ON FUNCTION eventgrid._check_not_null(text, anyelement) IS 'Internal: raises 22004 naming the field when val is NULL.';
COMMENT ON FUNCTION eventgrid._check_install_database() IS 'Internal: refuses CREATE EXTENSION outside eventgrid.database_name when preloaded (55000); a WARNING when not preloaded.';
COMMENT ON FUNCTION eventgrid._quote(text) IS 'Internal: double-quotes at most the first 64 characters of an argument for error messages.';
COMMENT ON FUNCTION eventgrid._is_schema(text) IS 'Internal: EventGridSchema, CloudEventSchemaV1_0 or CustomEventSchema.';
COMMENT ON FUNCTION eventgrid._header_problem(text, text) IS 'Internal: NULL when a custom delivery property may be sent (HTTP token name of 1-256 characters, not aeg-*, not a framing or routing header, not Content-Type; value at most 4096 bytes without control characters), else why not.';
COMMENT ON FUNCTION eventgrid._is_source_field(text) IS 'Internal: a dynamic property source is a dotted field path of at most 512 characters.';
