-- eventgrid 0.28.0: the full install script of this version.
--
-- Made by scripts/install-script.sh from what the upgrade scripts build
-- (sql/eventgrid--A--B.sql, from the oldest full script on): edit those,
-- never this file, and make it again.  test/t/023_install_script.pl checks
-- that installing this script and updating from the oldest version give
-- the same schema, privileges and comments.
--
-- Safety rules every object here follows, whoever calls it: SQL functions
-- have SQL-standard bodies (RETURN / BEGIN ATOMIC), bound to pg_catalog's
-- functions and operators when the extension is created; PL/pgSQL functions
-- run with search_path = pg_catalog, pg_temp; PUBLIC may execute only
-- publish(), which checks the caller's privileges, and the internal
-- functions that read with the caller's own privileges.  Three roles carry
-- the privileges: eventgrid_admin (configuration, statistics, dead letters),
-- eventgrid_publisher (publishing) and eventgrid_receiver (pull delivery);
-- a fourth, eventgrid_http, is the HTTP listener's (SPEC 16) and is
-- granted to no one.

\echo Use "CREATE EXTENSION eventgrid" to load this file. \quit

-- Preloaded, the worker serves one database: refuse to install anywhere else.
CREATE FUNCTION eventgrid._check_install_database() RETURNS void
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_check_install_database';
SELECT eventgrid._check_install_database();

-- The roles (cluster-wide; kept if the extension is dropped): three administrators grant, and the HTTP listener's.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'eventgrid_admin') THEN
        CREATE ROLE eventgrid_admin NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'eventgrid_publisher') THEN
        CREATE ROLE eventgrid_publisher NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'eventgrid_receiver') THEN
        CREATE ROLE eventgrid_receiver NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'eventgrid_http') THEN
        CREATE ROLE eventgrid_http NOLOGIN;
    END IF;
END $$;
COMMENT ON ROLE eventgrid_admin IS
    'eventgrid: may configure topics and event subscriptions, read statistics, and read and delete dead letters. Grant it to administrators.';
COMMENT ON ROLE eventgrid_publisher IS
    'eventgrid: may publish events (INSERT INTO eventgrid.events (topic, event), eventgrid.publish()). Grant it to applications.';
COMMENT ON ROLE eventgrid_receiver IS
    'eventgrid: may receive the events of queue event subscriptions and acknowledge, release or reject them or renew their locks (eventgrid.receive() and the other subscriber operations). Grant it to consumers.';
COMMENT ON ROLE eventgrid_http IS
    'eventgrid: the role of the HTTP listener''s connections (eventgrid.http_port): may run Event Grid''s data plane (eventgrid._http_publish() and eventgrid._http_namespace(), which check the topic''s access keys) and nothing else. Grant it to no one.';

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

COMMENT ON TYPE eventgrid._dead_letter_notice IS 'Internal: what the delivery workers know of a delivery that ended undelivered, for its dead-letter notification (eventgrid._publish_dead_letter_notifications).';

CREATE FUNCTION eventgrid._acknowledge(topic text, subscription text, lock_tokens text[]) RETURNS TABLE(lock_token text, succeeded boolean, error text)
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
         WHERE q.id = ANY (eventgrid._queue_ids(sid, k.ids)) AND (q.id || ':' || q.lock_secret) = ANY (k.tokens)
           AND q.receivable_at > eventgrid._clock_now()
        RETURNING q.id || ':' || q.lock_secret AS tok
    )
    SELECT coalesce(array_agg(g.tok), '{}') INTO done FROM gone g;
    PERFORM eventgrid._queue_count(sid, 0, cardinality(done), 0, 0, 0);
    RETURN QUERY SELECT * FROM eventgrid._lock_token_results(sid, lock_tokens, done, 'acknowledge');
END $$;

COMMENT ON FUNCTION eventgrid._acknowledge(topic text, subscription text, lock_tokens text[]) IS 'Internal: the body of eventgrid.acknowledge(), which checks the caller''s right and runs it as the extension''s owner.';

CREATE FUNCTION eventgrid._advanced_filters_arg(filters jsonb) RETURNS jsonb
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF filters IS NULL OR filters = 'null'::jsonb OR filters = '[]'::jsonb THEN
        RETURN NULL;
    END IF;
    PERFORM eventgrid._check_advanced_filters(filters);
    RETURN filters;
END $$;

COMMENT ON FUNCTION eventgrid._advanced_filters_arg(filters jsonb) IS 'Internal: NULL for no advanced filters (NULL, JSON null or []), else the filters once eventgrid._check_advanced_filters accepts them.';

CREATE FUNCTION eventgrid._advanced_match(event jsonb, filters jsonb, on_arrays boolean) RETURNS boolean
    LANGUAGE c IMMUTABLE PARALLEL SAFE
    AS 'MODULE_PATHNAME', 'eventgrid_advanced_match';

COMMENT ON FUNCTION eventgrid._advanced_match(event jsonb, filters jsonb, on_arrays boolean) IS 'Internal: does an event pass every advanced filter (true when filters is NULL)? on_arrays: enableAdvancedFilteringOnArrays (SPEC 9).';

CREATE FUNCTION eventgrid._apply_event() RETURNS trigger
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_apply_event';

COMMENT ON FUNCTION eventgrid._apply_event() IS 'Internal: BEFORE INSERT row trigger on eventgrid.events, enabled for replica sessions only (ENABLE REPLICA): a row a logical replication worker applies is checked as a publish would check it (one that would be refused is kept in eventgrid.rejected_events instead, and replication goes on), then gets this server''s transaction id and an id from this server''s sequence (the sent id is kept as source_event_id), source = the subscription''s name, the event stamped and its size made here, the publish time when not sent; a topic this database lacks is counted in eventgrid.unknown_topic_events; the delivery workers are woken when the applied transaction commits. Rows of other replica sessions (restores) are stored as they are.';

CREATE FUNCTION eventgrid._check_advanced_filters(filters jsonb) RETURNS boolean
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
    AS 'MODULE_PATHNAME', 'eventgrid_check_advanced_filters';

COMMENT ON FUNCTION eventgrid._check_advanced_filters(filters jsonb) IS 'Internal: true when filters is a valid array of Event Grid advanced filters; otherwise raises 22023 (malformed) or 54000 (over a limit) naming the filter''s position and field (SPEC 9).';

CREATE FUNCTION eventgrid._event_table() RETURNS smallint
    LANGUAGE c PARALLEL SAFE
    AS 'MODULE_PATHNAME', 'eventgrid_event_table';

COMMENT ON FUNCTION eventgrid._event_table() IS 'Internal: default of events.event_table: which of the three event tables the current transaction appends to, from its start time and GUC eventgrid.event_table_rotation.';

CREATE FUNCTION eventgrid._in_batch(txid xid8, since pg_snapshot, upto pg_snapshot) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN (pg_visible_in_snapshot(txid, upto) AND (NOT pg_visible_in_snapshot(txid, since)));

COMMENT ON FUNCTION eventgrid._in_batch(txid xid8, since pg_snapshot, upto pg_snapshot) IS 'Internal: is an event of transaction txid in the snapshot batch (since, upto]: visible in upto and not in since (PgQ''s rule)? Inlined by the planner.';

CREATE FUNCTION eventgrid._new_event_id() RETURNS bigint
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_new_event_id';

COMMENT ON FUNCTION eventgrid._new_event_id() IS 'Internal: default of events.id: nextval(''eventgrid.events_id_seq''); NULL in a logical replication worker, whose rows eventgrid._apply_event() numbers.';

CREATE TABLE eventgrid.events (
    id bigint DEFAULT eventgrid._new_event_id() NOT NULL,
    topic text NOT NULL,
    event jsonb NOT NULL,
    publish_time timestamp with time zone NOT NULL,
    event_bytes integer,
    txid xid8 DEFAULT pg_current_xact_id() NOT NULL,
    event_table smallint DEFAULT eventgrid._event_table() NOT NULL,
    source text,
    source_event_id bigint,
    domain_topic text
)
PARTITION BY LIST (event_table);

COMMENT ON TABLE eventgrid.events IS 'Published events. Publish with INSERT INTO eventgrid.events (topic, event); rows are validated and stamped in the publishing transaction and appended to one of the event tables eventgrid.events_0..2, which the delivery worker empties with TRUNCATE once every event subscription has passed them (SPEC 1, 2, 8).';

COMMENT ON COLUMN eventgrid.events.source IS 'NULL: published in this database; ''(dead-letter notification)'': a dead-letter notification the delivery workers published (README "Dead-letter notifications"); else the logical replication subscription (CREATE SUBSCRIPTION) that brought the event from another server.';

COMMENT ON COLUMN eventgrid.events.source_event_id IS 'For an event brought by logical replication: its id on the server that published it (NULL when the publication did not send the id column).';

COMMENT ON COLUMN eventgrid.events.domain_topic IS 'The domain topic an event published to a domain names (its "topic" in the Event Grid schema, its "source" in CloudEvents; SPEC 18); NULL for a topic''s events.';

CREATE FUNCTION eventgrid._chunk_events(topic text, done pg_snapshot, upto pg_snapshot, after_txid xid8, after_id bigint, last_txid xid8, last_id bigint) RETURNS SETOF eventgrid.events
    LANGUAGE sql STABLE PARALLEL SAFE
    BEGIN ATOMIC
 SELECT e.id,
     e.topic,
     e.event,
     e.publish_time,
     e.event_bytes,
     e.txid,
     e.event_table,
     e.source,
     e.source_event_id,
     e.domain_topic
    FROM eventgrid.events e
   WHERE ((strpos(_chunk_events.topic, '/'::text) = 0) AND (e.topic = _chunk_events.topic) AND (e.txid >= pg_snapshot_xmin(_chunk_events.done)) AND (e.txid < _chunk_events.last_txid) AND (ROW(e.txid, e.id) > ROW(GREATEST(_chunk_events.after_txid, pg_snapshot_xmin(_chunk_events.done)),
         CASE
             WHEN (_chunk_events.after_txid >= pg_snapshot_xmin(_chunk_events.done)) THEN _chunk_events.after_id
             ELSE (0)::bigint
         END)) AND eventgrid._in_batch(e.txid, _chunk_events.done, _chunk_events.upto))
 UNION ALL
  SELECT e.id,
     e.topic,
     e.event,
     e.publish_time,
     e.event_bytes,
     e.txid,
     e.event_table,
     e.source,
     e.source_event_id,
     e.domain_topic
    FROM eventgrid.events e
   WHERE ((strpos(_chunk_events.topic, '/'::text) > 0) AND (e.domain_topic IS NOT NULL) AND (((e.topic || '/'::text) || e.domain_topic) = _chunk_events.topic) AND (e.txid >= pg_snapshot_xmin(_chunk_events.done)) AND (e.txid < _chunk_events.last_txid) AND (ROW(e.txid, e.id) > ROW(GREATEST(_chunk_events.after_txid, pg_snapshot_xmin(_chunk_events.done)),
         CASE
             WHEN (_chunk_events.after_txid >= pg_snapshot_xmin(_chunk_events.done)) THEN _chunk_events.after_id
             ELSE (0)::bigint
         END)) AND eventgrid._in_batch(e.txid, _chunk_events.done, _chunk_events.upto))
 UNION ALL
  SELECT e.id,
     e.topic,
     e.event,
     e.publish_time,
     e.event_bytes,
     e.txid,
     e.event_table,
     e.source,
     e.source_event_id,
     e.domain_topic
    FROM eventgrid.events e
   WHERE ((strpos(_chunk_events.topic, '/'::text) = 0) AND (e.topic = _chunk_events.topic) AND (e.txid >= pg_snapshot_xmin(_chunk_events.done)) AND (e.txid = _chunk_events.last_txid) AND (e.id <= _chunk_events.last_id) AND (ROW(e.txid, e.id) > ROW(GREATEST(_chunk_events.after_txid, pg_snapshot_xmin(_chunk_events.done)),
         CASE
             WHEN (_chunk_events.after_txid >= pg_snapshot_xmin(_chunk_events.done)) THEN _chunk_events.after_id
             ELSE (0)::bigint
         END)) AND eventgrid._in_batch(e.txid, _chunk_events.done, _chunk_events.upto))
 UNION ALL
  SELECT e.id,
     e.topic,
     e.event,
     e.publish_time,
     e.event_bytes,
     e.txid,
     e.event_table,
     e.source,
     e.source_event_id,
     e.domain_topic
    FROM eventgrid.events e
   WHERE ((strpos(_chunk_events.topic, '/'::text) > 0) AND (e.domain_topic IS NOT NULL) AND (((e.topic || '/'::text) || e.domain_topic) = _chunk_events.topic) AND (e.txid >= pg_snapshot_xmin(_chunk_events.done)) AND (e.txid = _chunk_events.last_txid) AND (e.id <= _chunk_events.last_id) AND (ROW(e.txid, e.id) > ROW(GREATEST(_chunk_events.after_txid, pg_snapshot_xmin(_chunk_events.done)),
         CASE
             WHEN (_chunk_events.after_txid >= pg_snapshot_xmin(_chunk_events.done)) THEN _chunk_events.after_id
             ELSE (0)::bigint
         END)) AND eventgrid._in_batch(e.txid, _chunk_events.done, _chunk_events.upto));
END;

COMMENT ON FUNCTION eventgrid._chunk_events(topic text, done pg_snapshot, upto pg_snapshot, after_txid xid8, after_id bigint, last_txid xid8, last_id bigint) IS 'Internal: the events of a chunk in flight (eventgrid.chunks_in_flight), as the claim took them: its key range in its batch, before filters. Inlined by the planner; the delivery workers and eventgrid._pending() read chunks through it. topic is the subscription''s read_key, as for _unpassed_events().';

CREATE FUNCTION eventgrid._endpoint_problem(endpoint text) RETURNS text
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
    AS 'MODULE_PATHNAME', 'eventgrid_endpoint_problem';

COMMENT ON FUNCTION eventgrid._endpoint_problem(endpoint text) IS 'Internal: NULL when the endpoint can be delivered to, else why not: an http(s) URL libcurl''s URL parser accepts (a host, port 1-65535, no user name or password, at most 2048 bytes), a RedisStream endpoint redis://host[:port][/db]?stream=<key>[&maxlen=N][&mkstream=false] or a RabbitMQ endpoint amqp[s]://host[:port][/vhost]?exchange=<name>&routing_key=<key> (parsed by the same parser; no user name or password).';

CREATE FUNCTION eventgrid._is_schema(v text) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN (v = ANY (ARRAY['EventGridSchema'::text, 'CloudEventSchemaV1_0'::text, 'CustomEventSchema'::text]));

COMMENT ON FUNCTION eventgrid._is_schema(v text) IS 'Internal: EventGridSchema, CloudEventSchemaV1_0 or CustomEventSchema.';

CREATE FUNCTION eventgrid._is_source_field(v text) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN ((v ~ '^[^.]+(\.[^.]+)*$'::text) AND (length(v) <= 512));

COMMENT ON FUNCTION eventgrid._is_source_field(v text) IS 'Internal: a dynamic property source is a dotted field path of at most 512 characters.';

CREATE FUNCTION eventgrid._is_subscription_name(v text) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN (v ~ '^[A-Za-z0-9-]{3,64}$'::text);

COMMENT ON FUNCTION eventgrid._is_subscription_name(v text) IS 'Internal: an event subscription name has 3 to 64 letters, digits and hyphens.';

CREATE FUNCTION eventgrid._iso8601_minutes(minutes integer) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN (('P'::text || CASE WHEN (minutes >= 1440) THEN ((minutes / 1440) || 'D'::text) ELSE ''::text END) || CASE WHEN ((minutes % 1440) = 0) THEN ''::text ELSE (('T'::text || CASE WHEN ((minutes % 1440) >= 60) THEN (((minutes % 1440) / 60) || 'H'::text) ELSE ''::text END) || CASE WHEN ((minutes % 60) > 0) THEN ((minutes % 60) || 'M'::text) ELSE ''::text END) END);

COMMENT ON FUNCTION eventgrid._iso8601_minutes(minutes integer) IS 'Internal: a number of minutes as an ISO 8601 duration (e.g. 1560 -> P1DT2H, 20 -> PT20M).';

CREATE FUNCTION eventgrid._lower_array(a text[]) RETURNS text[]
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    BEGIN ATOMIC
 SELECT array_agg(lower(x.x)) AS array_agg
    FROM unnest(_lower_array.a) x(x);
END;

COMMENT ON FUNCTION eventgrid._lower_array(a text[]) IS 'Internal: lower-cases every element; feeds event_subscriptions.included_event_types_lower.';

CREATE FUNCTION eventgrid._matches(event jsonb, types_lower text[], subject_begins_with text, subject_ends_with text, case_sensitive boolean, advanced_filters jsonb, on_arrays boolean) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN COALESCE((((types_lower IS NULL) OR (lower(COALESCE((event ->> 'eventType'::text), (event ->> 'type'::text))) = ANY (types_lower))) AND ((subject_begins_with IS NULL) OR CASE WHEN case_sensitive THEN starts_with((event ->> 'subject'::text), subject_begins_with) ELSE starts_with(lower((event ->> 'subject'::text)), lower(subject_begins_with)) END) AND ((subject_ends_with IS NULL) OR CASE WHEN case_sensitive THEN ("right"((event ->> 'subject'::text), length(subject_ends_with)) = subject_ends_with) ELSE (lower("right"((event ->> 'subject'::text), length(subject_ends_with))) = lower(subject_ends_with)) END) AND ((advanced_filters IS NULL) OR eventgrid._advanced_match(event, advanced_filters, on_arrays))), false);

COMMENT ON FUNCTION eventgrid._matches(event jsonb, types_lower text[], subject_begins_with text, subject_ends_with text, case_sensitive boolean, advanced_filters jsonb, on_arrays boolean) IS 'Internal: does an event pass an event subscription''s filters (included event types, case-insensitive; subject begins/ends with; advanced filters) (SPEC 9)?';

CREATE FUNCTION eventgrid._now() RETURNS timestamp with time zone
    LANGUAGE c STABLE PARALLEL SAFE
    AS 'MODULE_PATHNAME', 'eventgrid_now';

COMMENT ON FUNCTION eventgrid._now() IS 'Internal: now() on the delivery workers'' clock (moved ahead by eventgrid.clock_offset): the time eventgrid writes about deliveries from SQL.';

CREATE FUNCTION eventgrid._system_identifier() RETURNS bigint
    LANGUAGE c STABLE PARALLEL SAFE
    AS 'MODULE_PATHNAME', 'eventgrid_system_identifier';

COMMENT ON FUNCTION eventgrid._system_identifier() IS 'Internal: this cluster''s system identifier (as pg_control_system() reports it, read from memory), stamped on positions.';

CREATE FUNCTION eventgrid._unpassed_events(topic text, done pg_snapshot, upto pg_snapshot, after_txid xid8, after_id bigint) RETURNS SETOF eventgrid.events
    LANGUAGE sql STABLE PARALLEL SAFE
    BEGIN ATOMIC
 SELECT e.id,
     e.topic,
     e.event,
     e.publish_time,
     e.event_bytes,
     e.txid,
     e.event_table,
     e.source,
     e.source_event_id,
     e.domain_topic
    FROM eventgrid.events e
   WHERE ((strpos(_unpassed_events.topic, '/'::text) = 0) AND (e.topic = _unpassed_events.topic) AND (e.txid >= pg_snapshot_xmin(_unpassed_events.done)) AND (ROW(e.txid, e.id) > ROW(GREATEST(_unpassed_events.after_txid, pg_snapshot_xmin(_unpassed_events.done)),
         CASE
             WHEN (_unpassed_events.after_txid >= pg_snapshot_xmin(_unpassed_events.done)) THEN _unpassed_events.after_id
             ELSE (0)::bigint
         END)) AND (NOT pg_visible_in_snapshot(e.txid, _unpassed_events.done)))
 UNION ALL
  SELECT e.id,
     e.topic,
     e.event,
     e.publish_time,
     e.event_bytes,
     e.txid,
     e.event_table,
     e.source,
     e.source_event_id,
     e.domain_topic
    FROM eventgrid.events e
   WHERE ((strpos(_unpassed_events.topic, '/'::text) > 0) AND (e.domain_topic IS NOT NULL) AND (((e.topic || '/'::text) || e.domain_topic) = _unpassed_events.topic) AND (e.txid >= pg_snapshot_xmin(_unpassed_events.done)) AND (ROW(e.txid, e.id) > ROW(GREATEST(_unpassed_events.after_txid, pg_snapshot_xmin(_unpassed_events.done)),
         CASE
             WHEN (_unpassed_events.after_txid >= pg_snapshot_xmin(_unpassed_events.done)) THEN _unpassed_events.after_id
             ELSE (0)::bigint
         END)) AND (NOT pg_visible_in_snapshot(e.txid, _unpassed_events.done)))
 UNION ALL
  SELECT e.id,
     e.topic,
     e.event,
     e.publish_time,
     e.event_bytes,
     e.txid,
     e.event_table,
     e.source,
     e.source_event_id,
     e.domain_topic
    FROM eventgrid.events e
   WHERE ((_unpassed_events.upto IS NOT NULL) AND (strpos(_unpassed_events.topic, '/'::text) = 0) AND (e.topic = _unpassed_events.topic) AND (e.txid >= GREATEST(pg_snapshot_xmin(_unpassed_events.done), pg_snapshot_xmin(_unpassed_events.upto))) AND (e.txid < _unpassed_events.after_txid) AND (NOT pg_visible_in_snapshot(e.txid, _unpassed_events.done)) AND (NOT pg_visible_in_snapshot(e.txid, _unpassed_events.upto)))
 UNION ALL
  SELECT e.id,
     e.topic,
     e.event,
     e.publish_time,
     e.event_bytes,
     e.txid,
     e.event_table,
     e.source,
     e.source_event_id,
     e.domain_topic
    FROM eventgrid.events e
   WHERE ((_unpassed_events.upto IS NOT NULL) AND (strpos(_unpassed_events.topic, '/'::text) > 0) AND (e.domain_topic IS NOT NULL) AND (((e.topic || '/'::text) || e.domain_topic) = _unpassed_events.topic) AND (e.txid >= GREATEST(pg_snapshot_xmin(_unpassed_events.done), pg_snapshot_xmin(_unpassed_events.upto))) AND (e.txid < _unpassed_events.after_txid) AND (NOT pg_visible_in_snapshot(e.txid, _unpassed_events.done)) AND (NOT pg_visible_in_snapshot(e.txid, _unpassed_events.upto)));
END;

COMMENT ON FUNCTION eventgrid._unpassed_events(topic text, done pg_snapshot, upto pg_snapshot, after_txid xid8, after_id bigint) IS 'Internal: the events of a topic that a position (done, upto, last event) has not passed, before filters. Inlined by the planner; the upkeep worker''s backlog count and eventgrid._pending() read through it. topic is a subscription''s read_key: a topic or domain, or ''domain/topic'' (that domain topic''s events, through events_domain_topic_idx).';

CREATE TABLE eventgrid.chunks_in_flight (
    lease_owner integer NOT NULL,
    chunk bigint NOT NULL,
    subscription_id bigint NOT NULL,
    topic text NOT NULL,
    done pg_snapshot NOT NULL,
    upto pg_snapshot NOT NULL,
    after_txid xid8,
    after_id bigint,
    last_txid xid8 NOT NULL,
    last_id bigint NOT NULL,
    sent_txid xid8,
    sent_id bigint
);

COMMENT ON TABLE eventgrid.chunks_in_flight IS 'Internal: first delivery attempts claimed by the delivery worker and not yet recorded; after a crash they become retries, charged an attempt (outcome Aborted) only up to what had been handed to HTTP.';

CREATE TABLE eventgrid.event_subscriptions (
    id bigint NOT NULL,
    topic text NOT NULL,
    name text NOT NULL,
    endpoint text,
    event_delivery_schema text NOT NULL,
    included_event_types text[],
    included_event_types_lower text[] GENERATED ALWAYS AS (eventgrid._lower_array(included_event_types)) STORED,
    subject_begins_with text,
    subject_ends_with text,
    is_subject_case_sensitive boolean DEFAULT false NOT NULL,
    max_delivery_attempts integer DEFAULT 30 NOT NULL,
    event_ttl integer DEFAULT 1440 NOT NULL,
    max_events_per_batch integer,
    preferred_batch_size_in_kilobytes integer,
    deadletter boolean DEFAULT false NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    topic_type text DEFAULT 'custom'::text NOT NULL,
    advanced_filters jsonb,
    enable_advanced_filtering_on_arrays boolean DEFAULT false NOT NULL,
    max_delivery_count integer GENERATED ALWAYS AS (
CASE
    WHEN (topic_type = 'namespace'::text) THEN max_delivery_attempts
    ELSE NULL::integer
END) STORED,
    event_time_to_live text GENERATED ALWAYS AS (
CASE
    WHEN (topic_type = 'namespace'::text) THEN eventgrid._iso8601_minutes(event_ttl)
    ELSE NULL::text
END) STORED,
    max_events_per_second integer,
    dead_letter_topic text,
    ordering_key text,
    delivery_mode text DEFAULT 'push'::text NOT NULL,
    receive_lock_duration integer,
    expiration_time timestamp with time zone,
    domain_topic text,
    read_key text GENERATED ALWAYS AS (
CASE
    WHEN (domain_topic IS NULL) THEN topic
    ELSE ((topic || '/'::text) || domain_topic)
END) STORED,
    endpoint_type text DEFAULT 'WebHook'::text NOT NULL,
    CONSTRAINT event_subscriptions_advanced_filters_check CHECK (((advanced_filters IS NULL) OR eventgrid._check_advanced_filters(advanced_filters))),
    CONSTRAINT event_subscriptions_delivery_mode_check CHECK ((((delivery_mode = 'push'::text) AND (endpoint IS NOT NULL) AND (receive_lock_duration IS NULL)) OR ((delivery_mode = 'queue'::text) AND (endpoint IS NULL) AND (topic_type = 'namespace'::text) AND ((receive_lock_duration >= 60) AND (receive_lock_duration <= 300)) AND (ordering_key IS NULL) AND (max_events_per_batch IS NULL) AND (preferred_batch_size_in_kilobytes IS NULL) AND (max_events_per_second IS NULL)))),
    CONSTRAINT event_subscriptions_endpoint_check CHECK ((eventgrid._endpoint_problem(endpoint) IS NULL)),
    CONSTRAINT event_subscriptions_endpoint_type_check CHECK (((endpoint_type = ANY (ARRAY['WebHook'::text, 'RedisStream'::text, 'StorageQueue'::text, 'RabbitMQ'::text])) AND ((endpoint IS NULL) OR (((endpoint_type = 'RedisStream'::text) = (starts_with(endpoint, 'redis://'::text) OR starts_with(endpoint, 'rediss://'::text))) AND ((endpoint_type = 'RabbitMQ'::text) = (starts_with(endpoint, 'amqp://'::text) OR starts_with(endpoint, 'amqps://'::text))))))),
    CONSTRAINT event_subscriptions_event_ttl_check CHECK (((event_ttl >= 1) AND (event_ttl <=
CASE
    WHEN (topic_type = 'namespace'::text) THEN 10080
    ELSE 1440
END))),
    CONSTRAINT event_subscriptions_included_event_types_check CHECK (((included_event_types IS NULL) OR ((cardinality(included_event_types) > 0) AND (array_position(included_event_types, NULL::text) IS NULL)))),
    CONSTRAINT event_subscriptions_max_delivery_attempts_check CHECK (((max_delivery_attempts >= 1) AND (max_delivery_attempts <=
CASE
    WHEN (topic_type = 'namespace'::text) THEN 10
    ELSE 30
END))),
    CONSTRAINT event_subscriptions_max_events_per_batch_check CHECK (((max_events_per_batch >= 1) AND (max_events_per_batch <= 5000))),
    CONSTRAINT event_subscriptions_max_events_per_second_check CHECK (((max_events_per_second >= 1) AND (max_events_per_second <= 100000))),
    CONSTRAINT event_subscriptions_name_check CHECK (eventgrid._is_subscription_name(name)),
    CONSTRAINT event_subscriptions_namespace_schema_check CHECK (((topic_type <> 'namespace'::text) OR (event_delivery_schema = 'CloudEventSchemaV1_0'::text))),
    CONSTRAINT event_subscriptions_ordering_key_check CHECK (eventgrid._is_source_field(ordering_key)),
    CONSTRAINT event_subscriptions_preferred_batch_size_check CHECK (((preferred_batch_size_in_kilobytes >= 1) AND (preferred_batch_size_in_kilobytes <= 1024))),
    CONSTRAINT event_subscriptions_schema_check CHECK (eventgrid._is_schema(event_delivery_schema)),
    CONSTRAINT event_subscriptions_topic_type_check CHECK ((topic_type = ANY (ARRAY['custom'::text, 'namespace'::text])))
);

COMMENT ON TABLE eventgrid.event_subscriptions IS 'Event subscriptions: one webhook consumer of a topic with filters, retry policy, batching and dead-letter switch (SPEC 1, 4, 5, 7, 9).';

COMMENT ON COLUMN eventgrid.event_subscriptions.max_delivery_attempts IS 'Delivery attempts at most: max_delivery_attempts (1-30) of a custom topic''s subscription, max_delivery_count (1-10) of a namespace topic''s.';

COMMENT ON COLUMN eventgrid.event_subscriptions.event_ttl IS 'Event time-to-live in minutes from the publish time: event_ttl (1-1440) of a custom topic''s subscription, event_time_to_live (PT1M-P7D, 1-10080 minutes) of a namespace topic''s.';

COMMENT ON COLUMN eventgrid.event_subscriptions.topic_type IS 'The delivery profile, from the topic: custom or namespace.';

COMMENT ON COLUMN eventgrid.event_subscriptions.advanced_filters IS 'Event Grid advanced filters as set (a JSON array of {operatorType, key, value or values}), or NULL for none (SPEC 9).';

COMMENT ON COLUMN eventgrid.event_subscriptions.enable_advanced_filtering_on_arrays IS 'Event Grid''s enableAdvancedFilteringOnArrays: an array value in the event is tested element by element.';

COMMENT ON COLUMN eventgrid.event_subscriptions.max_delivery_count IS 'Namespace topic subscriptions: max_delivery_count (the same number as max_delivery_attempts); NULL otherwise.';

COMMENT ON COLUMN eventgrid.event_subscriptions.event_time_to_live IS 'Namespace topic subscriptions: event_time_to_live as an ISO 8601 duration (event_ttl in minutes); NULL otherwise.';

COMMENT ON COLUMN eventgrid.event_subscriptions.max_events_per_second IS 'Rate limit: events delivered a second at most (1-100,000; a batch counts its events, retries count), or NULL for none.';

COMMENT ON COLUMN eventgrid.event_subscriptions.dead_letter_topic IS 'The topic each event this subscription dead-letters or drops is published to as a notification (NULL: none); set by create_event_subscription() and update_event_subscription(); dropping that topic sets it NULL.';

COMMENT ON COLUMN eventgrid.event_subscriptions.ordering_key IS 'Ordered delivery per key (SPEC 13): the dotted field path of each event whose value (a string, number or boolean) is its key; events of one key are delivered one at a time in publish order. NULL: unordered.';

COMMENT ON COLUMN eventgrid.event_subscriptions.delivery_mode IS 'push: delivered to endpoint over HTTP; queue: kept for consumers to receive (pull delivery, namespace topics only; endpoint NULL). Cannot change.';

COMMENT ON COLUMN eventgrid.event_subscriptions.receive_lock_duration IS 'Of a queue event subscription: seconds (60-300) a received event stays locked to its consumer before it can be received again.';

COMMENT ON COLUMN eventgrid.event_subscriptions.expiration_time IS 'When the event subscription expires (Event Grid''s expirationTimeUtc; NULL: never): from then on (the delivery workers'' clock) nothing more is delivered or received for it and the upkeep worker drops it. SPEC 17.';

COMMENT ON COLUMN eventgrid.event_subscriptions.domain_topic IS 'Of a subscription of a domain (topic): the domain topic it is scoped to, NULL at domain scope (it sees every domain topic''s events). Functions name it ''domain/topic''. SPEC 18.';

COMMENT ON COLUMN eventgrid.event_subscriptions.read_key IS 'Internal: what the subscription reads of the event tables: its topic, or ''domain/topic'' for a domain-topic subscription (eventgrid._unpassed_events(), eventgrid._chunk_events()).';

COMMENT ON COLUMN eventgrid.event_subscriptions.endpoint_type IS 'Where a push event subscription delivers (SPEC 21): WebHook (HTTP POSTs to endpoint, an http(s) URL), RedisStream (an XADD per event to the Redis stream endpoint names, a redis:// URL), StorageQueue (a Put Message per event to the Azure Storage queue endpoint names, an http(s) URL) or RabbitMQ (a message per event or batch published to the exchange and routing key endpoint names, an amqp:// or amqps:// URL). A queue event subscription keeps WebHook and has no endpoint.';

CREATE TABLE eventgrid.queue_batches (
    id bigint NOT NULL,
    subscription_id bigint NOT NULL,
    event_table smallint NOT NULL,
    txids xid8[] NOT NULL,
    event_ids bigint[] NOT NULL,
    oldest_publish_time timestamp with time zone NOT NULL,
    receivable_at timestamp with time zone NOT NULL,
    CONSTRAINT queue_batches_events_check CHECK (((cardinality(txids) = cardinality(event_ids)) AND (cardinality(event_ids) > 0)))
);

COMMENT ON TABLE eventgrid.queue_batches IS 'Internal: events of queue event subscriptions (pull delivery, SPEC 14) that no consumer has received yet, by reference: up to 100 per row, all in one event table (event_table), each by its publishing transaction (txids) and id (event_ids), in publish order; oldest_publish_time: the earliest publish time among them; receivable_at: when they became receivable. The delivery workers write a row for what becomes visible to a subscription; receive() takes a row''s events from the front (FOR UPDATE SKIP LOCKED: one consumer at a time per row), reads them in the event table and writes a lock row in eventgrid.queue_events for each. Before an event table is emptied, the rows reading it are moved into queue_events with copies of their events (_queue_set_aside()). Counted by eventgrid.queue_metrics.';

CREATE TABLE eventgrid.queue_events (
    id bigint NOT NULL,
    subscription_id bigint NOT NULL,
    event_id bigint NOT NULL,
    event jsonb,
    publish_time timestamp with time zone NOT NULL,
    event_bytes integer NOT NULL,
    source text,
    source_event_id bigint,
    delivery_count integer DEFAULT 0 NOT NULL,
    receivable_at timestamp with time zone NOT NULL,
    lock_secret uuid,
    received_at timestamp with time zone,
    event_table smallint,
    event_txid xid8,
    CONSTRAINT queue_events_delivery_count_check CHECK (((delivery_count >= 0) AND (delivery_count <= 10))),
    CONSTRAINT queue_events_event_check CHECK (((event IS NOT NULL) OR ((event_table IS NOT NULL) AND (event_txid IS NOT NULL))))
)
WITH (toast_tuple_target='128');
ALTER TABLE ONLY eventgrid.queue_events ALTER COLUMN event SET STORAGE EXTERNAL;

COMMENT ON TABLE eventgrid.queue_events IS 'The events of queue event subscriptions (pull delivery, SPEC 14) that were received at least once, or set aside, and are neither acknowledged nor dead-lettered (those not received yet are in eventgrid.queue_batches): how many times each was received (delivery_count), and when it can be received (receivable_at: now or earlier when available, the end of its lock or of its release delay otherwise). event: a copy of the event, or NULL while it is in event table event_table (by event_txid and event_id; the copy is made when that table is to be emptied). lock_secret: the random part of its last receive''s lock token (id:lock_secret; the lock is valid while receivable_at is later than now); received_at: when that receive took it. Read through eventgrid.queue_metrics; consumers use receive() and the other subscriber operations.';

COMMENT ON COLUMN eventgrid.queue_events.event IS 'A copy of the event, or NULL while it is read in its event table (event_table, event_txid, event_id).';

CREATE TABLE eventgrid.retries (
    id bigint NOT NULL,
    subscription_id bigint NOT NULL,
    event_id bigint NOT NULL,
    event jsonb NOT NULL,
    payload text NOT NULL,
    publish_time timestamp with time zone NOT NULL,
    event_bytes integer NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone NOT NULL,
    last_attempt_at timestamp with time zone,
    last_outcome text,
    last_http_status integer,
    lease_owner integer,
    source text,
    source_event_id bigint,
    ordering_key text,
    ordering_key_hash bigint GENERATED ALWAYS AS (hashtextextended(ordering_key, (0)::bigint)) STORED,
    CONSTRAINT retries_attempts_check CHECK (((attempts >= 0) AND (attempts <= 30))),
    CONSTRAINT retries_last_http_status_check CHECK (((last_http_status >= 100) AND (last_http_status <= 599)))
);

COMMENT ON TABLE eventgrid.retries IS 'Deliveries whose first attempt failed and that will be retried: attempts made, next attempt time, last outcome and HTTP status, and a copy of the event (SPEC 3, 4).';

COMMENT ON COLUMN eventgrid.retries.source IS 'The event''s events.source: NULL, ''(dead-letter notification)'', or the logical replication subscription it came through.';

COMMENT ON COLUMN eventgrid.retries.source_event_id IS 'The event''s events.source_event_id: its id on the server that published it.';

COMMENT ON COLUMN eventgrid.retries.ordering_key IS 'For an ordered event subscription: the event''s key (NULL: it has none and goes unordered). Of the rows of one key only the one with the lowest id is ever due; the others wait with next_attempt_at ''infinity''.';

COMMENT ON COLUMN eventgrid.retries.ordering_key_hash IS 'Internal: the hash the rows of one key are found by (keys of equal hash wait for each other).';

CREATE TABLE eventgrid.subscription_positions (
    subscription_id bigint NOT NULL,
    since pg_snapshot NOT NULL,
    done pg_snapshot NOT NULL,
    upto pg_snapshot,
    after_txid xid8,
    after_id bigint,
    served_at timestamp with time zone,
    system_identifier bigint DEFAULT eventgrid._system_identifier() NOT NULL,
    lease_owner integer
);

COMMENT ON TABLE eventgrid.subscription_positions IS 'Internal: each event subscription''s position in the event stream (snapshots of the delivery worker); first delivery attempts are claimed from here.';

COMMENT ON COLUMN eventgrid.subscription_positions.lease_owner IS 'Internal: of an ordered event subscription (SPEC 13), the pid of the delivery worker that holds first attempts of it in flight (NULL: none); only that worker claims from the position until it has recorded them, so that one worker orders each key''s events. Cleared when it has, or by the recovery when it no longer runs.';

CREATE FUNCTION eventgrid._backlog(subscription_id bigint, OUT pending bigint, OUT oldest timestamp with time zone, OUT due_since timestamp with time zone) RETURNS record
    LANGUAGE sql STABLE PARALLEL SAFE
    BEGIN ATOMIC
 SELECT ((((u.n + c.n) + r.n) + q.n) + qb.n) AS pending,
     LEAST(u.oldest, c.oldest, r.oldest, q.oldest, qb.oldest) AS oldest,
     LEAST(u.oldest, c.oldest, r.due_since, q.due_since, qb.due_since) AS due_since
    FROM ( SELECT count(*) AS n,
             min(e.publish_time) AS oldest
            FROM ((eventgrid.subscription_positions p
              JOIN eventgrid.event_subscriptions s ON ((s.id = p.subscription_id)))
              CROSS JOIN LATERAL eventgrid._unpassed_events(s.read_key, p.done, p.upto, p.after_txid, p.after_id) e(id, topic, event, publish_time, event_bytes, txid, event_table, source, source_event_id, domain_topic))
           WHERE ((p.subscription_id = _backlog.subscription_id) AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with, s.subject_ends_with, s.is_subject_case_sensitive, s.advanced_filters, s.enable_advanced_filtering_on_arrays))) u,
     ( SELECT count(*) AS n,
             min(e.publish_time) AS oldest
            FROM ((eventgrid.chunks_in_flight c_1
              JOIN eventgrid.event_subscriptions s ON ((s.id = c_1.subscription_id)))
              CROSS JOIN LATERAL eventgrid._chunk_events(c_1.topic, c_1.done, c_1.upto, c_1.after_txid, c_1.after_id, c_1.last_txid, c_1.last_id) e(id, topic, event, publish_time, event_bytes, txid, event_table, source, source_event_id, domain_topic))
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
           WHERE (q_1.subscription_id = _backlog.subscription_id)) q,
     ( SELECT COALESCE(sum(cardinality(b.event_ids)), (0)::bigint) AS n,
             min(b.oldest_publish_time) AS oldest,
             min(b.receivable_at) FILTER (WHERE (b.receivable_at <= eventgrid._now())) AS due_since
            FROM eventgrid.queue_batches b
           WHERE (b.subscription_id = _backlog.subscription_id)) qb;
END;

COMMENT ON FUNCTION eventgrid._backlog(subscription_id bigint, OUT pending bigint, OUT oldest timestamp with time zone, OUT due_since timestamp with time zone) IS 'Internal: in one pass, the deliveries of an event subscription not finished yet (pending: events its position has not passed, first attempts in flight, retries, and of a queue subscription its unsettled events in eventgrid.queue_events and eventgrid.queue_batches; eventgrid._pending() returns it), the publish time of the oldest of their events (oldest), and since when the delivery due longest has been due (due_since: an event not attempted yet since its publish, a retry since its next attempt time if that has come); NULL times when there is none.';

CREATE FUNCTION eventgrid._backlogged_subscriptions() RETURNS SETOF bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    BEGIN ATOMIC
 WITH RECURSIVE table_topics(topic) AS (
         ( SELECT e.topic
            FROM eventgrid.events e
           ORDER BY e.topic
          LIMIT 1)
         UNION ALL
          SELECT ( SELECT e.topic
                    FROM eventgrid.events e
                   WHERE (e.topic > r.topic)
                   ORDER BY e.topic
                  LIMIT 1) AS topic
            FROM table_topics r
           WHERE (r.topic IS NOT NULL)
         ), table_domain_topics(read_key) AS (
         ( SELECT ((e.topic || '/'::text) || e.domain_topic) AS "?column?"
            FROM eventgrid.events e
           WHERE (e.domain_topic IS NOT NULL)
           ORDER BY ((e.topic || '/'::text) || e.domain_topic)
          LIMIT 1)
         UNION ALL
          SELECT ( SELECT ((e.topic || '/'::text) || e.domain_topic)
                    FROM eventgrid.events e
                   WHERE ((e.domain_topic IS NOT NULL) AND (((e.topic || '/'::text) || e.domain_topic) > d.read_key))
                   ORDER BY ((e.topic || '/'::text) || e.domain_topic)
                  LIMIT 1)
            FROM table_domain_topics d
           WHERE (d.read_key IS NOT NULL)
         ), retried(id) AS (
         ( SELECT r.subscription_id
            FROM eventgrid.retries r
           ORDER BY r.subscription_id
          LIMIT 1)
         UNION ALL
          SELECT ( SELECT r.subscription_id
                    FROM eventgrid.retries r
                   WHERE (r.subscription_id > x.id)
                   ORDER BY r.subscription_id
                  LIMIT 1) AS subscription_id
            FROM retried x
           WHERE (x.id IS NOT NULL)
         ), queued(id) AS (
         ( SELECT q.subscription_id
            FROM eventgrid.queue_events q
           ORDER BY q.subscription_id
          LIMIT 1)
         UNION ALL
          SELECT ( SELECT q.subscription_id
                    FROM eventgrid.queue_events q
                   WHERE (q.subscription_id > x.id)
                   ORDER BY q.subscription_id
                  LIMIT 1) AS subscription_id
            FROM queued x
           WHERE (x.id IS NOT NULL)
         )
  SELECT s.id
    FROM (table_topics k
      JOIN eventgrid.event_subscriptions s ON (((s.topic = k.topic) AND (s.domain_topic IS NULL))))
 UNION
  SELECT s.id
    FROM (table_domain_topics k
      JOIN eventgrid.event_subscriptions s ON (((s.topic = split_part(k.read_key, '/'::text, 1)) AND (s.domain_topic = substr(k.read_key, (strpos(k.read_key, '/'::text) + 1))))))
 UNION
  SELECT c.subscription_id
    FROM eventgrid.chunks_in_flight c
 UNION
  SELECT x.id
    FROM retried x
   WHERE (x.id IS NOT NULL)
 UNION
  SELECT x.id
    FROM queued x
   WHERE (x.id IS NOT NULL)
 UNION
  SELECT b.subscription_id
    FROM eventgrid.queue_batches b;
END;

COMMENT ON FUNCTION eventgrid._backlogged_subscriptions() IS 'Internal: the ids of the event subscriptions that may have a backlog (eventgrid._backlog()): whose topic or domain topic has events in the event tables, or with first attempts in flight, retries, or queue events or batches not settled; any other has nothing pending. Loose scans of indexes: its cost follows the topics with events and the subscriptions with work, not how many subscriptions exist. event_subscription_metrics and delivery_statistics compute backlogs for these only.';

CREATE FUNCTION eventgrid._batch_events(topic text, event_table smallint, txids xid8[], event_ids bigint[]) RETURNS SETOF eventgrid.events
    LANGUAGE sql STABLE
    BEGIN ATOMIC
 SELECT e.id,
     e.topic,
     e.event,
     e.publish_time,
     e.event_bytes,
     e.txid,
     e.event_table,
     e.source,
     e.source_event_id,
     e.domain_topic
    FROM (UNNEST(_batch_events.txids, _batch_events.event_ids) u(txid, id)
      CROSS JOIN LATERAL ( SELECT x.id,
             x.topic,
             x.event,
             x.publish_time,
             x.event_bytes,
             x.txid,
             x.event_table,
             x.source,
             x.source_event_id,
             x.domain_topic
            FROM eventgrid.events x
           WHERE ((x.event_table = _batch_events.event_table) AND (x.topic = _batch_events.topic) AND (x.txid = u.txid) AND (x.id = u.id))
          OFFSET 0) e);
END;

COMMENT ON FUNCTION eventgrid._batch_events(topic text, event_table smallint, txids xid8[], event_ids bigint[]) IS 'Internal: the events a row of eventgrid.queue_batches names (or a slice of its arrays), each found by its own probe of the (topic, txid, id) index of its event table (OFFSET 0: statistics of an emptier event table would otherwise make a scan of the topic''s events look cheaper); those no longer there are left out. Sort by id for publish order.';

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

COMMENT ON FUNCTION eventgrid._bind_receive_grant() IS 'Internal: BEFORE INSERT trigger of eventgrid.receive_grants: a grant whose role_oid is not the role named role_name in this cluster (a restored dump) is bound to the role of that name (0: none, which nobody gets), as pg_dump binds privileges by name.';

CREATE FUNCTION eventgrid._caller() RETURNS name
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN CASE WHEN (current_setting('role'::text) <> 'none'::text) THEN (current_setting('role'::text))::name ELSE SESSION_USER END;

COMMENT ON FUNCTION eventgrid._caller() IS 'Internal: the role that called a SECURITY DEFINER function (the role SET ROLE chose, else the session user), named in log lines only; privilege checks use the role current at the call.';

CREATE FUNCTION eventgrid._check_credential_text(field text, val text, max_bytes integer, required boolean) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF val IS NULL THEN
        IF required THEN
            RAISE EXCEPTION '% must not be NULL', field USING ERRCODE = 'null_value_not_allowed';
        END IF;
        RETURN;
    END IF;
    IF val = '' OR octet_length(val) > max_bytes THEN
        RAISE EXCEPTION '% must be 1 to % bytes long, got %', field, max_bytes, octet_length(val)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF val ~ '[\x01-\x1f\x7f]' THEN
        RAISE EXCEPTION '% must not hold control characters', field
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Line breaks and tabs are not part of client ids, secrets, scopes or audiences; check what was pasted.';
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid._check_credential_text(field text, val text, max_bytes integer, required boolean) IS 'Internal: raises 22004 when a required credential field is NULL, 22023 when it is empty, longer than max_bytes or holds a control character (never quoting it).';

CREATE FUNCTION eventgrid._check_dead_letter_topic(dead_letter_topic text) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF dead_letter_topic IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = dead_letter_topic) THEN
        RAISE EXCEPTION 'dead_letter_topic % does not exist', eventgrid._quote(dead_letter_topic)
            USING ERRCODE = 'undefined_object',
                  HINT = 'Create the topic that takes the notifications first, with eventgrid.create_topic(), and subscribe the receiver to be notified to it.';
    END IF;
    IF EXISTS (SELECT 1 FROM eventgrid.domains d WHERE d.name = dead_letter_topic) THEN
        -- a notification names no domain topic (SPEC 18): every one would fail to publish
        RAISE EXCEPTION 'dead_letter_topic % is an event domain', eventgrid._quote(dead_letter_topic)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Dead-letter notifications go to a topic (eventgrid.create_topic()).';
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid._check_dead_letter_topic(dead_letter_topic text) IS 'Internal: refuses (42704) a dead_letter_topic that is not a topic of this database, and (22023) an event domain.';

CREATE FUNCTION eventgrid._check_delivery_mode(delivery_mode text, topic_type text, endpoint text, receive_lock_duration integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, max_events_per_second integer, endpoint_validation text, ordering_key text) RETURNS void
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

COMMENT ON FUNCTION eventgrid._check_delivery_mode(delivery_mode text, topic_type text, endpoint text, receive_lock_duration integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, max_events_per_second integer, endpoint_validation text, ordering_key text) IS 'Internal: checks delivery_mode (push or queue, 22023) and what goes with it: a push event subscription has an endpoint (22004) and no receive_lock_duration; a queue one belongs to a namespace topic, has no endpoint, batching, rate limit, endpoint validation or ordering_key (22023) and a receive_lock_duration of 60-300 seconds (22003).';

CREATE FUNCTION eventgrid._check_endpoint(endpoint text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    problem text := eventgrid._endpoint_problem(endpoint);
BEGIN
    IF problem IS NOT NULL THEN
        -- a credential in a URL that could not be parsed is not shown
        RAISE EXCEPTION 'invalid endpoint %: %',
                        eventgrid._quote(regexp_replace(endpoint, '^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@', '\1***@')), problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = CASE WHEN starts_with(endpoint, 'redis') THEN
                      'A RedisStream endpoint is redis[s]://[[user]:password@]host[:port][/db]?stream=<key> (or stream_from=subject or ordering_key: each event''s subject or ordering key), with maxlen=<entries> and mkstream=false optional.'
                  WHEN starts_with(endpoint, 'amqp') THEN
                      'A RabbitMQ endpoint is amqp[s]://[user:password@]host[:port][/vhost]?exchange=<name>&routing_key=<key> (either may be left out, not both; routing_key_from=subject or ordering_key instead of routing_key routes each event by its subject or its ordering key).'
                  ELSE 'Use an absolute http:// or https:// URL of at most 2048 bytes with a host and no user name or password; send credentials as a secret delivery property.' END;
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid._check_endpoint(endpoint text) IS 'Internal: raises 22023 with libcurl''s reason when the endpoint is not usable.';

CREATE FUNCTION eventgrid._check_endpoint_key(endpoint text, ordering_key text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF ordering_key IS NULL AND eventgrid._endpoint_key_from(endpoint) = 'ordering_key' THEN
        RAISE EXCEPTION 'an endpoint that routes by the ordering key needs an ordering_key'
            USING ERRCODE = 'invalid_parameter_value',
                  DETAIL = 'routing_key_from=ordering_key or stream_from=ordering_key makes each event''s ordering key its routing key or stream; this event subscription has no ordering_key.',
                  HINT = 'Pass ordering_key => ''<field path>'' (for example ''data.customerId''), or route by subject or a fixed routing_key / stream.';
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid._check_endpoint_key(endpoint text, ordering_key text) IS 'Internal: raises 22023 when a RabbitMQ or RedisStream endpoint takes each message''s key from the ordering key (routing_key_from=ordering_key, stream_from=ordering_key) and the event subscription has no ordering_key.';

CREATE FUNCTION eventgrid._check_endpoint_type(endpoint_type text, endpoint text, endpoint_validation text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
BEGIN
    IF endpoint_type IS NULL OR endpoint_type NOT IN ('WebHook', 'RedisStream', 'StorageQueue', 'RabbitMQ') THEN
        RAISE EXCEPTION 'endpoint_type must be WebHook, RedisStream, StorageQueue or RabbitMQ, got %', coalesce(eventgrid._quote(endpoint_type), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'WebHook (the default) POSTs to an http(s) URL; RedisStream XADDs each event to the stream a redis:// URL names; StorageQueue puts each event on the Azure Storage queue an http(s) URL names; RabbitMQ publishes each event to the exchange an amqp(s):// URL names.';
    END IF;
    IF endpoint IS NOT NULL AND ((endpoint_type = 'RedisStream') <> (starts_with(endpoint, 'redis://') OR starts_with(endpoint, 'rediss://'))
                                 OR (endpoint_type = 'RabbitMQ') <> (starts_with(endpoint, 'amqp://') OR starts_with(endpoint, 'amqps://'))) THEN
        RAISE EXCEPTION 'an endpoint of type % must be %', endpoint_type,
                        CASE endpoint_type WHEN 'RedisStream' THEN 'a redis:// or rediss:// URL'
                                           WHEN 'RabbitMQ' THEN 'an amqp:// or amqps:// URL'
                                           ELSE 'an http:// or https:// URL' END
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass the endpoint_type that goes with the endpoint: RedisStream for redis://host:port/db?stream=<key>, RabbitMQ for amqp[s]://host:port/vhost?exchange=<name>&routing_key=<key>, WebHook or StorageQueue for http(s).';
    END IF;
    IF endpoint IS NOT NULL AND endpoint_type = 'StorageQueue'
       AND endpoint !~ '^https?://([a-z0-9]{3,24}\.queue\.[^/?#]+/|[^/?#]+/[a-z0-9]{3,24}/)[a-z0-9](-?[a-z0-9]){2,62}(\?queueMessageTimeToLiveInSeconds=(-1|[1-9][0-9]{0,9}))?$' THEN
        RAISE EXCEPTION 'a StorageQueue endpoint must be a queue''s URL'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'https://<account>.queue.core.windows.net/<queue> or, path-style (an emulator), http://127.0.0.1:10001/<account>/<queue>: an account name of 3-24 lower-case letters and digits, a queue name of 3-63 lower-case letters, digits and single hyphens; queueMessageTimeToLiveInSeconds=<-1 or 1-2147483647> and a SAS token may follow as its query.';
    END IF;
    IF endpoint_type = 'StorageQueue' AND substring(endpoint FROM 'queueMessageTimeToLiveInSeconds=([0-9]+)$')::bigint > 2147483647 THEN
        RAISE EXCEPTION 'queueMessageTimeToLiveInSeconds must be -1 (never expires) or 1 to 2147483647 seconds'
            USING ERRCODE = 'numeric_value_out_of_range';
    END IF;
    IF endpoint_type <> 'WebHook' AND endpoint_validation = 'handshake' THEN
        RAISE EXCEPTION 'endpoint_validation handshake is for WebHook endpoints only'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A destination such as a Redis stream or a RabbitMQ exchange does not answer a validation handshake: omit endpoint_validation.';
    END IF;
END $_$;

COMMENT ON FUNCTION eventgrid._check_endpoint_type(endpoint_type text, endpoint text, endpoint_validation text) IS 'Internal: checks a push event subscription''s endpoint_type (WebHook, RedisStream, StorageQueue or RabbitMQ, 22023), that its endpoint goes with it (redis:// or rediss:// for RedisStream; amqp:// or amqps:// for RabbitMQ; a queue''s URL for StorageQueue, with queueMessageTimeToLiveInSeconds -1 or 1-2147483647 as its only query once the SAS token is taken out: 22023, 22003), and that only a WebHook is validated by a handshake (22023).';

CREATE FUNCTION eventgrid._check_endpoint_validation(v text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF v IS NULL OR v NOT IN ('none', 'handshake') THEN
        RAISE EXCEPTION 'endpoint_validation must be none or handshake, got %', coalesce(eventgrid._quote(v), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'handshake sends Event Grid''s SubscriptionValidationEvent (CloudEvents: the webhook OPTIONS request) and delivers only once the endpoint answers it.';
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid._check_endpoint_validation(v text) IS 'Internal: raises 22023 unless v is none or handshake.';

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

COMMENT ON FUNCTION eventgrid._check_install_database() IS 'Internal: run first by the install script; warns when the library is not preloaded (nothing is delivered until it is). Every database where the extension is created is served.';

CREATE FUNCTION eventgrid._check_no_endpoint_type(endpoint_type text, name text, topic text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF endpoint_type IS NOT NULL THEN
        RAISE EXCEPTION 'event subscription "%" of topic "%" is a queue event subscription: it has no endpoint type', name, topic
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Consumers receive a queue event subscription''s events with receive(); omit endpoint_type.';
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid._check_no_endpoint_type(endpoint_type text, name text, topic text) IS 'Internal: 22023 when an endpoint_type is given for a queue event subscription (pull delivery has no endpoint).';

CREATE FUNCTION eventgrid._check_not_null(field text, val anyelement) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF val IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', field USING ERRCODE = 'null_value_not_allowed';
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid._check_not_null(field text, val anyelement) IS 'Internal: raises 22004 naming the field when val is NULL.';

CREATE FUNCTION eventgrid._check_ordering_key(ordering_key text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF ordering_key IS NOT NULL AND NOT eventgrid._is_source_field(ordering_key) THEN
        RAISE EXCEPTION 'invalid ordering_key %', eventgrid._quote(left(ordering_key, 100))
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'ordering_key is a dotted field path of 1 to 512 characters, such as subject, data.orderId or partitionkey.';
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid._check_ordering_key(ordering_key text) IS 'Internal: raises 22023 for an ordering_key that is not a dotted field path of at most 512 characters.';

CREATE FUNCTION eventgrid._check_range(field text, val integer, lo integer, hi integer, unit text DEFAULT ''::text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF val IS NOT NULL AND (val < lo OR val > hi) THEN
        RAISE EXCEPTION '% must be between % and %, got %', field, lo, hi || unit, val
            USING ERRCODE = 'numeric_value_out_of_range',
                  HINT = format('Choose a whole number from %s to %s%s.', lo, hi, unit);
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid._check_range(field text, val integer, lo integer, hi integer, unit text) IS 'Internal: raises 22003 naming the field and its range when val is outside lo..hi.';

CREATE FUNCTION eventgrid._check_schema(field text, val text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF val IS NULL OR NOT eventgrid._is_schema(val) THEN
        RAISE EXCEPTION 'invalid % %', field, eventgrid._quote(val)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use EventGridSchema, CloudEventSchemaV1_0 or CustomEventSchema.';
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid._check_schema(field text, val text) IS 'Internal: raises 22023 unless val is EventGridSchema, CloudEventSchemaV1_0 or CustomEventSchema.';

CREATE FUNCTION eventgrid._check_subscription_settings(input_schema text, topic_type text, endpoint text, event_delivery_schema text, included_event_types text[], is_subject_case_sensitive boolean, deadletter boolean, enable_advanced_filtering_on_arrays boolean, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, max_events_per_second integer) RETURNS void
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

COMMENT ON FUNCTION eventgrid._check_subscription_settings(input_schema text, topic_type text, endpoint text, event_delivery_schema text, included_event_types text[], is_subject_case_sensitive boolean, deadletter boolean, enable_advanced_filtering_on_arrays boolean, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, max_events_per_second integer) IS 'Internal: checks an event subscription''s settings for a topic of input_schema and topic_type, as create_event_subscription() and update_event_subscription() take them: endpoint (22023), event_delivery_schema (22023), included_event_types (22023), the switches not NULL (22004), batching and rate ranges (22003).';

CREATE FUNCTION eventgrid._check_table_publication(caller regrole, source_table regclass, columns text[], update_columns text[]) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    kind "char";
    nsp oid;
    missing text;
    unreadable text;
BEGIN
    SELECT c.relkind, c.relnamespace INTO kind, nsp FROM pg_class c WHERE c.oid = source_table;
    IF kind IS NULL OR kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION '% is not a table', source_table
            USING ERRCODE = 'wrong_object_type',
                  HINT = 'Table changes are published from ordinary and partitioned tables, not from views, foreign tables or other relations.';
    END IF;
    IF nsp = 'eventgrid'::regnamespace THEN
        RAISE EXCEPTION 'the changes of eventgrid''s own table % cannot be published', source_table
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Tables in schema eventgrid hold its queue, configuration and secrets; publish your application''s tables.';
    END IF;
    IF NOT has_table_privilege(caller, source_table, 'TRIGGER') THEN
        RAISE EXCEPTION 'permission denied to publish the changes of table %', source_table
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('Publishing needs the TRIGGER privilege on the table or its ownership: GRANT TRIGGER ON %s TO %I;',
                                source_table, caller);
    END IF;
    SELECT string_agg(format('%I', c), ', ') INTO missing
      FROM unnest(columns || update_columns) c
     WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a
                        WHERE a.attrelid = source_table AND a.attname = c AND a.attnum > 0 AND NOT a.attisdropped);
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'table % has no column %', source_table, missing
            USING ERRCODE = 'undefined_column',
                  HINT = 'columns and update_columns name columns of the table.';
    END IF;
    SELECT string_agg(format('%I', a.attname), ', ' ORDER BY a.attnum) INTO unreadable
      FROM pg_attribute a
     WHERE a.attrelid = source_table AND a.attnum > 0 AND NOT a.attisdropped
       AND (columns IS NULL OR a.attname = ANY (columns) OR a.attname = ANY (update_columns))
       AND NOT has_column_privilege(caller, source_table, a.attnum, 'SELECT');
    IF unreadable IS NOT NULL THEN
        RAISE EXCEPTION 'permission denied to publish column % of table %', unreadable, source_table
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'An event carries only what its publisher may read: name the readable columns in columns and update_columns, or get SELECT on these.';
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid._check_table_publication(caller regrole, source_table regclass, columns text[], update_columns text[]) IS 'Internal: raises 42809 unless source_table is a table, 42501 for a table of schema eventgrid or unless role caller has TRIGGER on it and SELECT on the columns an event carries or compares, 42703 for a column it does not have.';

CREATE FUNCTION eventgrid._client_certificate_info(certificate text, private_key text, OUT subject text, OUT not_before timestamp with time zone, OUT not_after timestamp with time zone) RETURNS record
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_client_certificate_info';

COMMENT ON FUNCTION eventgrid._client_certificate_info(certificate text, private_key text, OUT subject text, OUT not_before timestamp with time zone, OUT not_after timestamp with time zone) IS 'Internal: the subject (RFC 2253) and validity of a PEM client certificate whose PEM private key (unencrypted) matches it; 22023 when either does not parse, the key is not the certificate''s, or the certificate is not valid now (never quoting either text); 22004 NULL.';

CREATE FUNCTION eventgrid._clock_now() RETURNS timestamp with time zone
    LANGUAGE c PARALLEL SAFE
    AS 'MODULE_PATHNAME', 'eventgrid_clock_now';

COMMENT ON FUNCTION eventgrid._clock_now() IS 'Internal: clock_timestamp() on the delivery workers'' clock (moved ahead by eventgrid.clock_offset): the time the locks of pull delivery are taken, compared and renewed at.';

CREATE FUNCTION eventgrid._cover_partitions(rel regclass) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    p record;
BEGIN
    -- every publication of a table above rel (or of rel itself, for the partitions below it)
    FOR p IN SELECT t.source_table, t.topic, t.operations FROM eventgrid.table_publications t
              WHERE t.source_table IN (SELECT a.relid FROM eventgrid._table_ancestry(rel) a) LOOP
        PERFORM eventgrid._create_topic_triggers(m.m, p.topic, p.operations)
           FROM eventgrid._publication_members(p.source_table, p.topic) m(m)
          WHERE m.m IN (SELECT d.d FROM eventgrid._table_tree(rel) d(d)) AND m.m <> p.source_table;
    END LOOP;
END $$;

COMMENT ON FUNCTION eventgrid._cover_partitions(rel regclass) IS 'Internal: after rel was created as or attached as a partition, gives it and the partitions below it the triggers of the publications of the tables above it.';

CREATE FUNCTION eventgrid._create_topic_triggers(rel regclass, topic text, operations text[]) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    op text;
BEGIN
    PERFORM eventgrid._drop_topic_triggers(rel, topic);
    FOREACH op IN ARRAY operations LOOP
        EXECUTE format('CREATE TRIGGER %I AFTER %s ON %s REFERENCING %s TABLE AS eventgrid_rows %s'
                       ' FOR EACH STATEMENT EXECUTE FUNCTION eventgrid._table_change_trigger(%L)',
                       eventgrid._table_change_trigger_name(topic, op), op, rel,
                       CASE op WHEN 'DELETE' THEN 'OLD' ELSE 'NEW' END,
                       CASE op WHEN 'UPDATE' THEN 'OLD TABLE AS eventgrid_old_rows' ELSE '' END, topic);
    END LOOP;
END $$;

COMMENT ON FUNCTION eventgrid._create_topic_triggers(rel regclass, topic text, operations text[]) IS 'Internal: creates the AFTER ... FOR EACH STATEMENT triggers (with transition tables) that publish table rel''s changes of operations to topic.';

CREATE FUNCTION eventgrid._table_ancestry(rel regclass, OUT relid regclass, OUT depth bigint) RETURNS SETOF record
    LANGUAGE sql STABLE
    BEGIN ATOMIC
 SELECT _table_ancestry.rel AS rel,
     0
 UNION ALL
  SELECT a.relid,
     a.depth
    FROM pg_partition_ancestors(_table_ancestry.rel) WITH ORDINALITY a(relid, depth)
   WHERE ((a.relid)::oid <> (_table_ancestry.rel)::oid);
END;

COMMENT ON FUNCTION eventgrid._table_ancestry(rel regclass, OUT relid regclass, OUT depth bigint) IS 'Internal: table rel (depth 0) and the partitioned tables above it, nearest first.';

CREATE FUNCTION eventgrid._table_tree(rel regclass) RETURNS SETOF regclass
    LANGUAGE sql STABLE
    BEGIN ATOMIC
 SELECT _table_tree.rel AS rel
 UNION
  SELECT t.relid
    FROM pg_partition_tree(_table_tree.rel) t(relid, parentrelid, isleaf, level);
END;

COMMENT ON FUNCTION eventgrid._table_tree(rel regclass) IS 'Internal: table rel and the partitions below it, at every level.';

CREATE TABLE eventgrid.table_publications (
    source_table regclass NOT NULL,
    topic text NOT NULL,
    operations text[] NOT NULL,
    columns text[],
    update_columns text[],
    event_type_prefix text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    shape text,
    statements jsonb,
    CONSTRAINT table_publications_columns_check CHECK ((cardinality(columns) > 0)),
    CONSTRAINT table_publications_operations_check CHECK (((operations <@ ARRAY['INSERT'::text, 'UPDATE'::text, 'DELETE'::text]) AND (cardinality(operations) > 0))),
    CONSTRAINT table_publications_update_columns_check CHECK ((cardinality(update_columns) > 0))
);

COMMENT ON TABLE eventgrid.table_publications IS 'Internal: the table change publications (eventgrid.publish_table_changes); read eventgrid.table_change_publications.';

COMMENT ON COLUMN eventgrid.table_publications.shape IS 'Not used since 0.9.0 (the trigger reads the table''s columns at each statement); always NULL.';

COMMENT ON COLUMN eventgrid.table_publications.statements IS 'Not used since 0.9.0 (the trigger builds events in C); always NULL.';

CREATE FUNCTION eventgrid._publication_members(source_table regclass, topic text) RETURNS SETOF regclass
    LANGUAGE sql STABLE
    BEGIN ATOMIC
 SELECT m.relid
    FROM eventgrid._table_tree(_publication_members.source_table) m(relid)
   WHERE (((m.relid)::oid = (_publication_members.source_table)::oid) OR (NOT (EXISTS ( SELECT 1
            FROM eventgrid.table_publications o
           WHERE ((o.topic = _publication_members.topic) AND ((o.source_table)::oid <> (_publication_members.source_table)::oid) AND ((o.source_table)::oid IN ( SELECT a.relid
                    FROM eventgrid._table_ancestry(m.relid) a(relid, depth))) AND (NOT ((o.source_table)::oid IN ( SELECT a.relid
                    FROM eventgrid._table_ancestry(o.source_table) a(relid, depth)))))))));
END;

COMMENT ON FUNCTION eventgrid._publication_members(source_table regclass, topic text) IS 'Internal: the tables whose writes a publication of source_table to topic publishes: the table and the partitions below it (at every level) that do not publish to the topic themselves.';

CREATE FUNCTION eventgrid._create_table_change_triggers(source_table regclass, topic text, operations text[]) RETURNS void
    LANGUAGE sql
    BEGIN ATOMIC
 SELECT eventgrid._create_topic_triggers(m.m, _create_table_change_triggers.topic, _create_table_change_triggers.operations) AS _create_topic_triggers
    FROM eventgrid._publication_members(_create_table_change_triggers.source_table, _create_table_change_triggers.topic) m(m);
END;

COMMENT ON FUNCTION eventgrid._create_table_change_triggers(source_table regclass, topic text, operations text[]) IS 'Internal: creates the statement triggers that publish source_table''s changes of operations to topic, on the table and the partitions it covers.';

CREATE FUNCTION eventgrid._dead_letter_ids(topic text, subscription text, reason text, dead_lettered_after timestamp with time zone, dead_lettered_before timestamp with time zone, existing_only boolean) RETURNS bigint[]
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

COMMENT ON FUNCTION eventgrid._dead_letter_ids(topic text, subscription text, reason text, dead_lettered_after timestamp with time zone, dead_lettered_before timestamp with time zone, existing_only boolean) IS 'Internal: ids of the dead letters a filter selects (NULL: any), locked FOR UPDATE; 22023 for an unknown reason or an empty time range, 42704 for a topic or subscription that does not exist (unless existing_only is false and dead letters name it).';

CREATE FUNCTION eventgrid._is_topic_name(v text) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN (v ~ '^[A-Za-z0-9-]{3,50}$'::text);

COMMENT ON FUNCTION eventgrid._is_topic_name(v text) IS 'Internal: a topic name has 3 to 50 letters, digits and hyphens.';

CREATE FUNCTION eventgrid.rfc3339(ts timestamp with time zone) RETURNS text
    LANGUAGE sql STABLE STRICT PARALLEL SAFE
    RETURN to_char((ts AT TIME ZONE 'UTC'::text), 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'::text);

COMMENT ON FUNCTION eventgrid.rfc3339(ts timestamp with time zone) IS 'Formats a timestamp as RFC 3339 in UTC with microseconds, as used in event and dead-letter fields.';

CREATE TABLE eventgrid.topics (
    name text NOT NULL,
    input_schema text DEFAULT 'EventGridSchema'::text NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    topic_type text DEFAULT 'custom'::text NOT NULL,
    CONSTRAINT topics_input_schema_check CHECK (eventgrid._is_schema(input_schema)),
    CONSTRAINT topics_name_check CHECK (eventgrid._is_topic_name(name)),
    CONSTRAINT topics_namespace_schema_check CHECK (((topic_type <> 'namespace'::text) OR (input_schema = 'CloudEventSchemaV1_0'::text))),
    CONSTRAINT topics_topic_type_check CHECK ((topic_type = ANY (ARRAY['custom'::text, 'namespace'::text])))
);

COMMENT ON TABLE eventgrid.topics IS 'Event Grid topics: named endpoints that events are published to, each with an input schema (SPEC 1).';

COMMENT ON COLUMN eventgrid.topics.topic_type IS 'custom (Event Grid''s custom topic: the topic delivery profile) or namespace (a namespace topic: CloudEvents 1.0 only, the namespace delivery profile).';

CREATE FUNCTION eventgrid._dead_letter_notification(target_topic text, topic text, subscription text, event jsonb, input_schema text, dead_lettered boolean, reason text, attempts integer, outcome text, http_status integer, publish_time timestamp with time zone, attempted_at timestamp with time zone, event_source text) RETURNS TABLE(notification_topic text, notification jsonb)
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 WITH src AS (
          SELECT "left"(
                 CASE
                     WHEN (_dead_letter_notification.input_schema = 'CloudEventSchemaV1_0'::text) THEN (_dead_letter_notification.event ->> 'type'::text)
                     ELSE (_dead_letter_notification.event ->> 'eventType'::text)
                 END, 1024) AS event_type,
             "left"((_dead_letter_notification.event ->> 'id'::text), 1024) AS id,
             "left"((_dead_letter_notification.event ->> 'subject'::text), 1024) AS subject
         ), d AS (
          SELECT (jsonb_strip_nulls(jsonb_build_object('topic', _dead_letter_notification.topic, 'eventSubscription', _dead_letter_notification.subscription, 'id', src.id, 'eventType', src.event_type, 'subject', src.subject, 'deadLetterReason', _dead_letter_notification.reason, 'deliveryAttempts', _dead_letter_notification.attempts, 'lastDeliveryOutcome', _dead_letter_notification.outcome, 'lastHttpStatusCode', NULLIF(_dead_letter_notification.http_status, 0), 'publishTime', eventgrid.rfc3339(_dead_letter_notification.publish_time), 'lastDeliveryAttemptTime', eventgrid.rfc3339(_dead_letter_notification.attempted_at))) ||
                 CASE
                     WHEN (octet_length((_dead_letter_notification.event)::text) <= (900 * 1024)) THEN jsonb_build_object('event', _dead_letter_notification.event)
                     ELSE jsonb_build_object('eventOmitted', 'larger than 900 kB: the notification must stay within the 1 MB event limit')
                 END) AS data,
                 CASE
                     WHEN _dead_letter_notification.dead_lettered THEN 'Eventgrid.EventSubscription.EventDeadLettered'::text
                     ELSE 'Eventgrid.EventSubscription.EventDropped'::text
                 END AS type,
             ((('/topics/'::text || _dead_letter_notification.topic) || '/eventSubscriptions/'::text) || _dead_letter_notification.subscription) AS source,
             COALESCE(src.id, ''::text) AS event_id
            FROM src
         )
  SELECT t.name AS notification_topic,
         CASE
             WHEN (t.input_schema = 'CloudEventSchemaV1_0'::text) THEN jsonb_build_object('specversion', '1.0', 'id', (gen_random_uuid())::text, 'source', d.source, 'type', d.type, 'subject', d.event_id, 'time', eventgrid.rfc3339(now()), 'datacontenttype', 'application/json', 'data', d.data)
             ELSE jsonb_build_object('id', (gen_random_uuid())::text, 'subject', ((d.source || '/events/'::text) || d.event_id), 'eventType', d.type, 'eventTime', eventgrid.rfc3339(now()), 'dataVersion', '1.0', 'data', d.data)
         END AS notification
    FROM d,
     eventgrid.topics t
   WHERE ((t.name = _dead_letter_notification.target_topic) AND (_dead_letter_notification.event_source IS DISTINCT FROM '(dead-letter notification)'::text));
END;

COMMENT ON FUNCTION eventgrid._dead_letter_notification(target_topic text, topic text, subscription text, event jsonb, input_schema text, dead_lettered boolean, reason text, attempts integer, outcome text, http_status integer, publish_time timestamp with time zone, attempted_at timestamp with time zone, event_source text) IS 'Internal: the notification event of an event dead-lettered (or, dead_lettered false, dropped) by an event subscription whose dead_letter_topic is target_topic, in that topic''s input schema, with what the dead letter records (the event''s id, subject and type cut to 1,024 characters each) and the event itself (up to 900 kB), so that it always fits the 1 MB event limit; no row for a notification that itself ended undelivered (event_source ''(dead-letter notification)'', which the delivery workers give the notifications they publish and publishers cannot write), or when the topic is gone. The delivery workers publish it in the transaction that records the dead letter.';

CREATE FUNCTION eventgrid._dead_letter_reasons(delivery_mode text) RETURNS text[]
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN CASE delivery_mode WHEN 'queue'::text THEN ARRAY['MaxDeliveryCountExceeded'::text, 'TimeToLiveExceeded'::text, 'Rejected'::text] ELSE ARRAY['MaxDeliveryAttemptsExceeded'::text, 'TimeToLiveExceeded'::text, 'NonRetriableError'::text] END;

COMMENT ON FUNCTION eventgrid._dead_letter_reasons(delivery_mode text) IS 'Internal: the deadLetterReason values event_subscription_metric_labels reports for a subscription of this delivery_mode (queue: MaxDeliveryCountExceeded, TimeToLiveExceeded, Rejected; push: MaxDeliveryAttemptsExceeded, TimeToLiveExceeded, NonRetriableError), each always, 0 until it happens.';

CREATE FUNCTION eventgrid._delivery_tokens(OUT token_endpoint text, OUT client_id text, OUT scope text, OUT audience text, OUT token_obtained_at timestamp with time zone, OUT token_expires_at timestamp with time zone, OUT token_serves_until timestamp with time zone, OUT token_requests bigint, OUT token_failures bigint, OUT last_failure_at timestamp with time zone, OUT last_error text) RETURNS SETOF record
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_delivery_tokens';

COMMENT ON FUNCTION eventgrid._delivery_tokens(OUT token_endpoint text, OUT client_id text, OUT scope text, OUT audience text, OUT token_obtained_at timestamp with time zone, OUT token_expires_at timestamp with time zone, OUT token_serves_until timestamp with time zone, OUT token_requests bigint, OUT token_failures bigint, OUT last_failure_at timestamp with time zone, OUT last_error text) IS 'Internal: the bearer tokens this database''s workers keep in shared memory, per token endpoint, client, scope and audience: when obtained, when they expire, until when they serve, token requests and failures counted since the slot was made, the last failure; never a token or secret.';

CREATE FUNCTION eventgrid._domain_of(name text) RETURNS text
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM eventgrid._check_not_null('domain name', name);
    IF NOT EXISTS (SELECT 1 FROM eventgrid.domains d WHERE d.name = _domain_of.name) THEN
        RAISE EXCEPTION 'domain % does not exist', eventgrid._quote(name)
            USING ERRCODE = 'undefined_object', HINT = 'List the domains with: SELECT name FROM eventgrid.domains;';
    END IF;
    RETURN name;
END $$;

COMMENT ON FUNCTION eventgrid._domain_of(name text) IS 'Internal: name, when it is a domain; 22004 NULL, 42704 no such domain.';

CREATE FUNCTION eventgrid._domain_topic_for_subscription(domain text, domain_topic text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    d eventgrid.domains;
BEGIN
    SELECT * INTO d FROM eventgrid.domains x WHERE x.name = _domain_topic_for_subscription.domain FOR KEY SHARE;
    IF d.name IS NULL THEN
        RAISE EXCEPTION 'topic % is not a domain: it has no domain topic %', eventgrid._quote(domain), eventgrid._quote(domain_topic)
            USING ERRCODE = 'undefined_object',
                  HINT = 'A subscription names ''domain/topic'' only for a domain (eventgrid.create_domain()).';
    END IF;
    IF NOT eventgrid._is_topic_name(domain_topic) THEN
        RAISE EXCEPTION 'invalid domain topic name %', eventgrid._quote(domain_topic)
            USING ERRCODE = 'invalid_name',
                  HINT = 'A domain topic name has 3 to 50 characters: letters, digits and hyphens.';
    END IF;
    IF EXISTS (SELECT 1 FROM eventgrid.domain_topic_entries e
                WHERE e.domain = d.name AND e.name = _domain_topic_for_subscription.domain_topic FOR KEY SHARE) THEN
        RETURN;
    END IF;
    IF NOT d.auto_create_topic_with_first_subscription THEN
        RAISE EXCEPTION 'domain topic % of domain % does not exist', eventgrid._quote(domain_topic), eventgrid._quote(domain)
            USING ERRCODE = 'undefined_object',
                  HINT = 'Create it with eventgrid.create_domain_topic(); this domain does not create its topics with their first subscription.';
    END IF;
    INSERT INTO eventgrid.domain_topic_entries (domain, name, created_automatically)
    VALUES (d.name, _domain_topic_for_subscription.domain_topic, true)
    ON CONFLICT DO NOTHING;
END $$;

COMMENT ON FUNCTION eventgrid._domain_topic_for_subscription(domain text, domain_topic text) IS 'Internal: makes sure a subscription may be created at domain-topic scope: domain is a domain (42704 otherwise), domain_topic a valid name (42602), existing or created now when the domain creates topics with their first subscription (42704 when it does not).';

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

COMMENT ON FUNCTION eventgrid._drop_expired_subscriptions(OUT topic text, OUT name text, OUT expiration_time timestamp with time zone, OUT owed bigint, OUT skipped boolean) IS 'Internal: drops (as drop_event_subscription() does: dead letters kept) the event subscriptions whose expiration_time has come on the delivery workers'' clock, at most 1000 a call, the earliest first, each after _expire_subscription() has dead-lettered (or dropped) what it still owed and kept its final counts; one whose rows another session holds locked, or with deliveries in flight, is skipped (skipped true) and tried again at the next call, without waiting. Returns each one''s topic, name, expiration time and how many events it owed, which the upkeep worker logs.';

CREATE FUNCTION eventgrid._drop_topic_triggers(rel regclass, topic text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    op text;
BEGIN
    FOREACH op IN ARRAY ARRAY['INSERT', 'UPDATE', 'DELETE'] LOOP
        IF EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = rel
                      AND t.tgname = eventgrid._table_change_trigger_name(topic, op)
                      AND t.tgfoid = 'eventgrid._table_change_trigger()'::regprocedure) THEN
            EXECUTE format('DROP TRIGGER %I ON %s', eventgrid._table_change_trigger_name(topic, op), rel);
        END IF;
    END LOOP;
END $$;

COMMENT ON FUNCTION eventgrid._drop_topic_triggers(rel regclass, topic text) IS 'Internal: drops eventgrid''s statement triggers that publish table rel''s changes to topic.';

CREATE FUNCTION eventgrid._drop_table_change_triggers(source_table regclass, topic text) RETURNS void
    LANGUAGE sql
    BEGIN ATOMIC
 SELECT eventgrid._drop_topic_triggers(m.m, _drop_table_change_triggers.topic) AS _drop_topic_triggers
    FROM eventgrid._publication_members(_drop_table_change_triggers.source_table, _drop_table_change_triggers.topic) m(m);
END;

COMMENT ON FUNCTION eventgrid._drop_table_change_triggers(source_table regclass, topic text) IS 'Internal: drops the statement triggers that publish source_table''s changes to topic, from the table and the partitions it covers.';

CREATE FUNCTION eventgrid._drop_topic(name text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sids bigint[];
BEGIN
    PERFORM eventgrid._check_not_null('topic name', name);
    IF NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = _drop_topic.name FOR UPDATE) THEN
        RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(name)
            USING ERRCODE = 'undefined_object', HINT = 'List the topics with: SELECT name FROM eventgrid.topics;';
    END IF;
    -- publications of table changes to it stop: their triggers go
    PERFORM eventgrid._drop_topic_triggers(t.tgrelid::regclass, name)
       FROM (SELECT DISTINCT m.m AS tgrelid
               FROM eventgrid.table_publications p, eventgrid._publication_members(p.source_table, p.topic) m(m)
              WHERE p.topic = _drop_topic.name) t;
    -- the subscriptions first (the delivery worker's lock order), then their retries
    SELECT array_agg(s.id ORDER BY s.id) INTO sids
      FROM (SELECT s.id FROM eventgrid.event_subscriptions s WHERE s.topic = _drop_topic.name
             ORDER BY s.id FOR UPDATE) s;
    DELETE FROM eventgrid.retries r WHERE r.subscription_id = ANY (sids);
    -- subscriptions, positions, counters and publications go with the topic
    -- (ON DELETE CASCADE); its events stay in the event tables until they are emptied
    DELETE FROM eventgrid.topics t WHERE t.name = _drop_topic.name;
    IF sids IS NOT NULL THEN
        PERFORM eventgrid._subscriptions_changed_at_commit();
        PERFORM eventgrid._wake_receivers_at_commit(sids);
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid._drop_topic(name text) IS 'Internal: drops topic or domain name with its event subscriptions, their pending deliveries and retries, the publications of table changes to it, and (a domain) its domain topics; 22004 NULL, 42704 none. drop_topic() and drop_domain() call it.';

CREATE FUNCTION eventgrid._duration_minutes(field text, v text) RETURNS integer
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
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
END $_$;

COMMENT ON FUNCTION eventgrid._duration_minutes(field text, v text) IS 'Internal: minutes of an ISO 8601 duration of minute precision (weeks, days, hours, minutes) from PT1M to P7D; raises 22023 naming the field and the range otherwise.';

CREATE FUNCTION eventgrid._endpoint_credentials(endpoint text, OUT endpoint text, OUT user_name text, OUT password text) RETURNS record
    LANGUAGE c IMMUTABLE STRICT
    AS 'MODULE_PATHNAME', 'eventgrid_endpoint_credentials';

COMMENT ON FUNCTION eventgrid._endpoint_credentials(endpoint text, OUT endpoint text, OUT user_name text, OUT password text) IS 'Internal: a RedisStream or RabbitMQ endpoint with a user name and password (redis://[user]:password@host..., amqp[s]://user:password@host...) as the endpoint without them (libcurl''s form of the URL) and the two, decoded; any other endpoint as it is, with NULLs.';

CREATE FUNCTION eventgrid._endpoint_key_from(endpoint text) RETURNS text
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
    AS 'MODULE_PATHNAME', 'eventgrid_endpoint_key_from';

COMMENT ON FUNCTION eventgrid._endpoint_key_from(endpoint text) IS 'Internal: where the messages of a RabbitMQ or RedisStream endpoint take their key (routing key, stream) from: subject or ordering_key (routing_key_from=, stream_from=); NULL for a fixed key or any other endpoint.';

CREATE TABLE eventgrid.delivery_pauses (
    topic text,
    subscription_id bigint,
    paused_at timestamp with time zone DEFAULT now() NOT NULL,
    paused_by name NOT NULL,
    CONSTRAINT delivery_pauses_check CHECK (((subscription_id IS NULL) OR (topic IS NOT NULL)))
);

COMMENT ON TABLE eventgrid.delivery_pauses IS 'Internal: what pause_delivery() paused: everything (topic and subscription_id NULL), a topic (subscription_id NULL) or one event subscription.';

CREATE FUNCTION eventgrid._paused_subscriptions() RETURNS SETOF bigint
    LANGUAGE sql STABLE
    BEGIN ATOMIC
 SELECT dp.subscription_id
    FROM eventgrid.delivery_pauses dp
   WHERE (dp.subscription_id IS NOT NULL)
 UNION
  SELECT s.id
    FROM (eventgrid.delivery_pauses dp
      JOIN eventgrid.event_subscriptions s ON ((s.topic = dp.topic)))
   WHERE ((dp.subscription_id IS NULL) AND (dp.topic IS NOT NULL))
 UNION
  SELECT s.id
    FROM (eventgrid.delivery_pauses dp
      CROSS JOIN eventgrid.event_subscriptions s)
   WHERE ((dp.subscription_id IS NULL) AND (dp.topic IS NULL));
END;

COMMENT ON FUNCTION eventgrid._paused_subscriptions() IS 'Internal: the ids of the event subscriptions pause_delivery() paused (itself, its topic or domain, or everything), each once, read from eventgrid.delivery_pauses: its cost follows what is paused, not the number of subscriptions. The delivery workers'' claims and delivery_statistics use it.';

CREATE TABLE eventgrid.endpoint_states (
    endpoint text NOT NULL,
    state text NOT NULL,
    consecutive_failures integer NOT NULL,
    last_failure_outcome text,
    probation_cause text,
    probation_started_at timestamp with time zone,
    probation_until timestamp with time zone,
    probations integer DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    CONSTRAINT endpoint_states_check CHECK (((state = 'healthy'::text) = (probation_started_at IS NULL))),
    CONSTRAINT endpoint_states_consecutive_failures_check CHECK ((consecutive_failures >= 0)),
    CONSTRAINT endpoint_states_probations_check CHECK ((probations >= 0)),
    CONSTRAINT endpoint_states_state_check CHECK ((state = ANY (ARRAY['healthy'::text, 'probation'::text, 'probing'::text])))
);

COMMENT ON TABLE eventgrid.endpoint_states IS 'Internal: health of each endpoint URL as the delivery worker keeps it (delayed delivery, SPEC 6); read it through eventgrid.endpoint_health.';

CREATE TABLE eventgrid.queue_counters (
    subscription_id bigint NOT NULL,
    slot integer NOT NULL,
    received bigint DEFAULT 0 NOT NULL,
    acknowledged bigint DEFAULT 0 NOT NULL,
    released bigint DEFAULT 0 NOT NULL,
    rejected bigint DEFAULT 0 NOT NULL,
    lock_expired bigint DEFAULT 0 NOT NULL,
    CONSTRAINT queue_counters_slot_check CHECK (((slot >= 0) AND (slot <= 15)))
);

COMMENT ON TABLE eventgrid.queue_counters IS 'Internal: running totals of the subscriber operations per queue event subscription, in 16 slots (by the consumer''s backend pid) so that concurrent consumers do not wait for each other''s counter rows; summed by eventgrid.queue_metrics and delivery_statistics.';

CREATE TABLE eventgrid.subscription_counters (
    subscription_id bigint NOT NULL,
    delivered bigint DEFAULT 0 NOT NULL,
    failed_attempts bigint DEFAULT 0 NOT NULL,
    dead_lettered bigint DEFAULT 0 NOT NULL,
    dropped bigint DEFAULT 0 NOT NULL,
    redelivered bigint DEFAULT 0 NOT NULL,
    matched bigint DEFAULT 0 NOT NULL
);

COMMENT ON TABLE eventgrid.subscription_counters IS 'Running totals per event subscription, maintained by the delivery worker.';

CREATE FUNCTION eventgrid._event_subscription_metrics(OUT topic text, OUT event_subscription text, OUT matched_events_total bigint, OUT delivery_success_total bigint, OUT pending_events bigint, OUT oldest_pending_event_age_seconds double precision, OUT overdue_seconds double precision, OUT paused integer, OUT endpoint_on_probation integer) RETURNS SETOF record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT s.read_key AS topic,
     s.name AS event_subscription,
     COALESCE(c.matched, (0)::bigint) AS matched_events_total,
     (((COALESCE(c.delivered, (0)::bigint))::numeric + COALESCE(q.acknowledged, (0)::numeric)))::bigint AS delivery_success_total,
     COALESCE(b.pending, (0)::bigint) AS pending_events,
     COALESCE((EXTRACT(epoch FROM (eventgrid._now() - b.oldest)))::double precision, (0)::double precision) AS oldest_pending_event_age_seconds,
     COALESCE((EXTRACT(epoch FROM (eventgrid._now() - b.due_since)))::double precision, (0)::double precision) AS overdue_seconds,
     ((s.id IN ( SELECT p.p
            FROM eventgrid._paused_subscriptions() p(p))))::integer AS paused,
     ((COALESCE(h.state, 'healthy'::text) <> 'healthy'::text))::integer AS endpoint_on_probation
    FROM ((((eventgrid.event_subscriptions s
      LEFT JOIN eventgrid.subscription_counters c ON ((c.subscription_id = s.id)))
      LEFT JOIN ( SELECT x.subscription_id,
             sum(x.acknowledged) AS acknowledged
            FROM eventgrid.queue_counters x
           GROUP BY x.subscription_id) q ON ((q.subscription_id = s.id)))
      LEFT JOIN eventgrid.endpoint_states h ON ((h.endpoint = s.endpoint)))
      LEFT JOIN ( SELECT a.id,
             x.pending,
             x.oldest,
             x.due_since
            FROM (eventgrid._backlogged_subscriptions() a(id)
              CROSS JOIN LATERAL eventgrid._backlog(a.id) x(pending, oldest, due_since))) b ON ((b.id = s.id)));
END;

COMMENT ON FUNCTION eventgrid._event_subscription_metrics(OUT topic text, OUT event_subscription text, OUT matched_events_total bigint, OUT delivery_success_total bigint, OUT pending_events bigint, OUT oldest_pending_event_age_seconds double precision, OUT overdue_seconds double precision, OUT paused integer, OUT endpoint_on_probation integer) IS 'Internal: the rows of the view eventgrid.event_subscription_metrics, for pg_monitor and eventgrid_admin.';

CREATE TABLE eventgrid.replication_slot_sightings (
    slot_name name NOT NULL,
    first_seen_at timestamp with time zone NOT NULL,
    streaming_since timestamp with time zone
);

COMMENT ON TABLE eventgrid.replication_slot_sightings IS 'Internal: the logical replication slots (plugin pgoutput, other than table synchronization slots) of this database the upkeep worker has seen, when it first saw each, and since when it has seen each stream without a break (streaming_since; NULL: not streaming). No event table is emptied while a slot has streamed for less than eventgrid.replication_sync_wait: its subscriber''s initial copy may be to come. Read through eventgrid.event_tables.';

CREATE TABLE eventgrid.topic_positions (
    topic text NOT NULL,
    done pg_snapshot NOT NULL,
    system_identifier bigint DEFAULT eventgrid._system_identifier() NOT NULL
);

COMMENT ON TABLE eventgrid.topic_positions IS 'Internal: how far the delivery worker has counted each topic''s events that match no event subscription.';

CREATE FUNCTION eventgrid._event_table_holders(event_table smallint) RETURNS text[]
    LANGUAGE sql STABLE PARALLEL SAFE
    BEGIN ATOMIC
 WITH RECURSIVE table_topics(topic) AS (
         ( SELECT e.topic
            FROM eventgrid.events e
           WHERE (e.event_table = _event_table_holders.event_table)
           ORDER BY e.topic
          LIMIT 1)
         UNION ALL
          SELECT ( SELECT e.topic
                    FROM eventgrid.events e
                   WHERE ((e.event_table = _event_table_holders.event_table) AND (e.topic > r.topic))
                   ORDER BY e.topic
                  LIMIT 1) AS topic
            FROM table_topics r
           WHERE (r.topic IS NOT NULL)
         ), table_domain_topics(read_key) AS (
         ( SELECT ((e.topic || '/'::text) || e.domain_topic) AS "?column?"
            FROM eventgrid.events e
           WHERE ((e.event_table = _event_table_holders.event_table) AND (e.domain_topic IS NOT NULL))
           ORDER BY ((e.topic || '/'::text) || e.domain_topic)
          LIMIT 1)
         UNION ALL
          SELECT ( SELECT ((e.topic || '/'::text) || e.domain_topic)
                    FROM eventgrid.events e
                   WHERE ((e.event_table = _event_table_holders.event_table) AND (e.domain_topic IS NOT NULL) AND (((e.topic || '/'::text) || e.domain_topic) > d.read_key))
                   ORDER BY ((e.topic || '/'::text) || e.domain_topic)
                  LIMIT 1)
            FROM table_domain_topics d
           WHERE (d.read_key IS NOT NULL)
         )
  SELECT array_agg(DISTINCT h.holder ORDER BY h.holder) AS array_agg
    FROM ( SELECT format('event subscription %s of topic %s'::text, s.name, s.read_key) AS holder
            FROM ((table_topics k
              JOIN eventgrid.event_subscriptions s ON (((s.topic = k.topic) AND (s.domain_topic IS NULL))))
              JOIN eventgrid.subscription_positions p ON ((p.subscription_id = s.id)))
           WHERE (EXISTS ( SELECT 1
                    FROM eventgrid.events e
                   WHERE ((e.event_table = _event_table_holders.event_table) AND (e.topic = s.topic) AND (e.txid >= pg_snapshot_xmin(p.done)) AND (NOT pg_visible_in_snapshot(e.txid, p.done)))))
         UNION ALL
          SELECT format('event subscription %s of topic %s'::text, s.name, s.read_key) AS format
            FROM ((table_domain_topics k
              JOIN eventgrid.event_subscriptions s ON (((s.topic = split_part(k.read_key, '/'::text, 1)) AND (s.domain_topic = substr(k.read_key, (strpos(k.read_key, '/'::text) + 1))))))
              JOIN eventgrid.subscription_positions p ON ((p.subscription_id = s.id)))
           WHERE (EXISTS ( SELECT 1
                    FROM eventgrid.events e
                   WHERE ((e.event_table = _event_table_holders.event_table) AND (e.domain_topic IS NOT NULL) AND (((e.topic || '/'::text) || e.domain_topic) = s.read_key) AND (e.txid >= pg_snapshot_xmin(p.done)) AND (NOT pg_visible_in_snapshot(e.txid, p.done)))))
         UNION ALL
          SELECT format('first attempts in flight for topic %s'::text, split_part(c.topic, '/'::text, 1)) AS format
            FROM eventgrid.chunks_in_flight c
           WHERE (EXISTS ( SELECT 1
                    FROM eventgrid.events e
                   WHERE ((e.event_table = _event_table_holders.event_table) AND (e.topic = split_part(c.topic, '/'::text, 1)) AND (e.txid >= pg_snapshot_xmin(c.done)) AND (NOT pg_visible_in_snapshot(e.txid, c.done)))))
         UNION ALL
          SELECT format('unmatched count of topic %s'::text, tp.topic) AS format
            FROM (table_topics k
              JOIN eventgrid.topic_positions tp ON ((tp.topic = k.topic)))
           WHERE (EXISTS ( SELECT 1
                    FROM eventgrid.events e
                   WHERE ((e.event_table = _event_table_holders.event_table) AND (e.topic = tp.topic) AND (e.txid >= pg_snapshot_xmin(tp.done)) AND (NOT pg_visible_in_snapshot(e.txid, tp.done)))))
         UNION ALL
          SELECT format('events of queue event subscription %s of topic %s'::text, s.name, s.topic) AS format
            FROM eventgrid.event_subscriptions s
           WHERE ((s.delivery_mode = 'queue'::text) AND ((EXISTS ( SELECT 1
                    FROM eventgrid.queue_batches b
                   WHERE ((b.subscription_id = s.id) AND (b.event_table = _event_table_holders.event_table)))) OR (EXISTS ( SELECT 1
                    FROM eventgrid.queue_events q
                   WHERE ((q.subscription_id = s.id) AND (q.event_table = _event_table_holders.event_table))))))
         UNION ALL
          SELECT format('the initial copy of logical replication slot %s'::text, r.slot_name) AS format
            FROM pg_replication_slots r
           WHERE ((r.database = current_database()) AND (r.slot_type = 'logical'::text) AND (r.slot_name ~ '^pg_[0-9]+_sync_[0-9]+_[0-9]+$'::text) AND (EXISTS ( SELECT 1
                    FROM eventgrid.events e
                   WHERE (e.event_table = _event_table_holders.event_table))))
         UNION ALL
          SELECT format('logical replication slot %s, whose subscriber has not streamed for eventgrid.replication_sync_wait yet (its initial copy may be to come)'::text, r.slot_name) AS format
            FROM (pg_replication_slots r
              LEFT JOIN eventgrid.replication_slot_sightings g ON ((g.slot_name = r.slot_name)))
           WHERE ((r.database = current_database()) AND (r.slot_type = 'logical'::text) AND (r.plugin = 'pgoutput'::name) AND (r.slot_name !~ '^pg_[0-9]+_sync_[0-9]+_[0-9]+$'::text) AND ((g.streaming_since IS NULL) OR (g.streaming_since > (now() - (COALESCE(current_setting('eventgrid.replication_sync_wait'::text, true), '300s'::text))::interval))) AND (EXISTS ( SELECT 1
                    FROM eventgrid.events e
                   WHERE (e.event_table = _event_table_holders.event_table))))) h;
END;

COMMENT ON FUNCTION eventgrid._event_table_holders(event_table smallint) IS 'Internal: what still needs events of event table eventgrid.events_<event_table> (event subscriptions of the topics and domain topics it holds events of, first attempts in flight, unmatched counts, queue event subscriptions'' events read there that a consumer held while the rotation copied the others, a logical replication subscriber''s initial copy in progress or possibly to come); NULL when it may be emptied. Its cost follows the topics and domain topics the table holds, not the number of subscriptions (SPEC 20).';

CREATE FUNCTION eventgrid._expiration_time_arg(expiration_time timestamp with time zone) RETURNS timestamp with time zone
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

COMMENT ON FUNCTION eventgrid._expiration_time_arg(expiration_time timestamp with time zone) IS 'Internal: the expiration_time argument of create_event_subscription() and update_event_subscription() as stored: NULL for NULL and ''infinity'' (never expires); 22023 for a time not in the future of the real clock (clock_timestamp(), -infinity included).';

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

COMMENT ON FUNCTION eventgrid._expire_subscription(sid bigint, expired_at timestamp with time zone) IS 'Internal: settles what event subscription sid, whose expiration_time expired_at has come, still owes before the upkeep worker drops it (SPEC 17): the events past its position, its retries (also those an ordered subscription holds behind their keys), its queue batches and its receivable or locked queue events are dead-lettered with reason SubscriptionExpired (dropped when it does not dead-letter; counted either way, and notified to its dead_letter_topic), and its final counts are kept in eventgrid.expired_event_subscriptions. Returns how many events it owed. The caller has locked the subscription, its retries and its queue events.';

CREATE FUNCTION eventgrid._fail_validation(sid bigint, why text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    UPDATE eventgrid.endpoint_validations x SET state = 'Failed', last_error = left(why, 512)
     WHERE x.subscription_id = sid;
    PERFORM eventgrid._position_to_retries(sid, eventgrid._now(), true);
END $$;

COMMENT ON FUNCTION eventgrid._fail_validation(sid bigint, why text) IS 'Internal: an endpoint validation has failed (provisioning state Failed, why in last_error); the events that waited at its position become its retries, and from now on its position passes everything published (the upkeep worker moves it along): a subscription whose validation failed keeps nothing new.';

CREATE FUNCTION eventgrid._first_invalid_event(topic text, events jsonb, OUT event_index integer, OUT problem text, OUT sqlstate text) RETURNS record
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_first_invalid_event';

COMMENT ON FUNCTION eventgrid._first_invalid_event(topic text, events jsonb, OUT event_index integer, OUT problem text, OUT sqlstate text) IS 'Internal: validates events (a JSON array, or one event) as publishing them to topic would, storing none, in one subtransaction for them all: the first that fails by its index (0 the first), its error message and SQLSTATE (22023 invalid, 54000 over 1 MB); NULLs when all are valid. The HTTP data plane checks a request with it before it publishes (SPEC 16). Errors: 22004 NULL, 42704 no such topic.';

CREATE FUNCTION eventgrid._forget_dropped_columns(rel regclass) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT t.source_table, t.topic, t.columns, t.update_columns,
                    ARRAY(SELECT c FROM unnest(t.columns) c
                           WHERE EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.source_table
                                            AND a.attname = c AND a.attnum > 0 AND NOT a.attisdropped)
                           ORDER BY c) AS live,
                    ARRAY(SELECT c FROM unnest(t.update_columns) c
                           WHERE EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.source_table
                                            AND a.attname = c AND a.attnum > 0 AND NOT a.attisdropped)
                           ORDER BY c) AS live_update
               FROM eventgrid.table_publications t
              WHERE t.source_table IN (SELECT m.m FROM eventgrid._table_tree(rel) m(m))
             FOR UPDATE LOOP
        IF (p.columns IS NOT NULL AND p.live IS DISTINCT FROM p.columns)
           OR (p.update_columns IS NOT NULL AND p.live_update IS DISTINCT FROM p.update_columns) THEN
            IF (p.columns IS NOT NULL AND cardinality(p.live) = 0)
               OR (p.update_columns IS NOT NULL AND cardinality(p.live_update) = 0) THEN
                RAISE EXCEPTION 'cannot drop the last column that the publication of table % to topic % names', p.source_table, eventgrid._quote(p.topic)
                    USING ERRCODE = 'dependent_objects_still_exist',
                          HINT = 'Publish other columns first with eventgrid.publish_table_changes(), or stop the publication with eventgrid.stop_publishing_table_changes().';
            END IF;
            UPDATE eventgrid.table_publications t
               SET columns = CASE WHEN p.columns IS NULL THEN NULL ELSE p.live END,
                   update_columns = CASE WHEN p.update_columns IS NULL THEN NULL ELSE p.live_update END,
                   shape = NULL, statements = NULL
             WHERE t.source_table = p.source_table AND t.topic = p.topic;
        END IF;
    END LOOP;
END $$;

COMMENT ON FUNCTION eventgrid._forget_dropped_columns(rel regclass) IS 'Internal: after ALTER TABLE on table rel, removes the columns that no longer exist from the columns and update_columns of the publications of rel and its partitions; 2BP01 when a list would be left empty.';

CREATE FUNCTION eventgrid._forget_dropped_tables() RETURNS event_trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM eventgrid.table_publications p
     USING pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND d.objid = p.source_table::oid;
END $$;

COMMENT ON FUNCTION eventgrid._forget_dropped_tables() IS 'Internal: sql_drop event trigger function; a dropped table''s publications go with it.';

CREATE FUNCTION eventgrid._header_problem(header text, value text) RETURNS text
    LANGUAGE c IMMUTABLE PARALLEL SAFE
    AS 'MODULE_PATHNAME', 'eventgrid_header_problem';

COMMENT ON FUNCTION eventgrid._header_problem(header text, value text) IS 'Internal: NULL when a custom delivery property may be sent (HTTP token name of 1-256 characters, not aeg-*, not a framing or routing header, not Content-Type; value at most 4096 bytes without control characters), else why not.';

CREATE TABLE eventgrid.endpoint_validations (
    subscription_id bigint NOT NULL,
    state text NOT NULL,
    code text NOT NULL,
    started_at timestamp with time zone NOT NULL,
    tries integer DEFAULT 0 NOT NULL,
    next_try_at timestamp with time zone NOT NULL,
    manual_since timestamp with time zone,
    last_error text,
    validated_at timestamp with time zone,
    CONSTRAINT endpoint_validations_state_check CHECK ((state = ANY (ARRAY['Creating'::text, 'AwaitingManualAction'::text, 'Succeeded'::text, 'Failed'::text])))
);

COMMENT ON TABLE eventgrid.endpoint_validations IS 'Internal: the endpoint validation of each event subscription that asked for it (endpoint_validation => ''handshake''): Event Grid''s provisioning state, the validation code sent (readable by the extension''s owner only), tries, errors. Read through eventgrid.event_subscription_validation.';

CREATE FUNCTION eventgrid._held_subscriptions() RETURNS SETOF bigint
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

CREATE FUNCTION eventgrid._histogram_buckets(histogram text) RETURNS double precision[]
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN CASE histogram WHEN 'destination_processing_duration_seconds'::text THEN '{0.005,0.01,0.025,0.05,0.1,0.25,0.5,1,2.5,5,10,30,Infinity}'::double precision[] WHEN 'delivery_latency_seconds'::text THEN '{0.005,0.01,0.025,0.05,0.1,0.25,0.5,1,2.5,5,10,30,60,300,900,3600,21600,86400,Infinity}'::double precision[] ELSE NULL::double precision[] END;

COMMENT ON FUNCTION eventgrid._histogram_buckets(histogram text) IS 'Internal: the upper bounds (seconds) of the buckets of a histogram, the same as the delivery workers count with (src/store/store_metrics.c), +Inf last.';

CREATE FUNCTION eventgrid._http_authorized(topic text, path text, sas_key text, sas_token text, auth_header text) RETURNS boolean
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET "DateStyle" TO 'ISO, MDY'
    SET "TimeZone" TO 'UTC'
    AS $_$
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
END $_$;

COMMENT ON FUNCTION eventgrid._http_authorized(topic text, path text, sas_key text, sas_token text, auth_header text) IS 'Internal: whether an HTTP request to path may publish to topic (SPEC 16): its aeg-sas-key header, or its Authorization: SharedAccessKey header, is one of the topic''s keys (compared in constant time); or its aeg-sas-token is signed with one of them, names path as its resource (scheme, host and query aside) and has not expired (its expiry in UTC, as the Azure SDKs write it).';

CREATE FUNCTION eventgrid._http_error(code text, message text) RETURNS text
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    RETURN (jsonb_build_object('error', jsonb_build_object('code', code, 'message', message)))::text;

COMMENT ON FUNCTION eventgrid._http_error(code text, message text) IS 'Internal: the body of an error answer of the HTTP data plane, {"error":{"code":code,"message":message}}, as Event Grid''s.';

CREATE FUNCTION eventgrid._http_namespace(topic text, subscription text, operation text, path text, sas_key text, sas_token text, auth_header text, content_type text, body text, max_events text, max_wait_time text, release_delay text, OUT status integer, OUT answer text) RETURNS record
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

COMMENT ON FUNCTION eventgrid._http_namespace(topic text, subscription text, operation text, path text, sas_key text, sas_token text, auth_header text, content_type text, body text, max_events text, max_wait_time text, release_delay text, OUT status integer, OUT answer text) IS 'Internal: a namespace topic''s request of the HTTP listener (SPEC 16), run as eventgrid_http: operation publish (POST /{database}/topics/{topic}:publish: one CloudEvent or a batch, all or none; 200 {}), or for queue event subscription subscription receive (maxEvents, maxWaitTime: receive(); 200 {"value":[{"brokerProperties":{"lockToken","deliveryCount"},"event"}]}), acknowledge, release (releaseDelayInSeconds), reject and renewLock (body {"lockTokens":[...]}; 200 {"succeededLockTokens":[...],"failedLockTokens":[{"lockToken","error":{"code","message"}}]}, also when every token failed). The key or SAS token is checked as for publishing (_http_authorized); 400 BadRequest, 401 Unauthorized, 404 NotFound (no such namespace topic or queue subscription) with Event Grid''s error body.';

CREATE FUNCTION eventgrid._http_publish(topic text, path text, sas_key text, sas_token text, auth_header text, content_type text, body text, OUT status integer, OUT answer text) RETURNS record
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

COMMENT ON FUNCTION eventgrid._http_publish(topic text, path text, sas_key text, sas_token text, auth_header text, content_type text, body text, OUT status integer, OUT answer text) IS 'Internal: a publish request of the HTTP listener to a custom topic (SPEC 16: POST /{database}/topics/{topic}/api/events), run as eventgrid_http: checks the request''s key or SAS token (_http_authorized), its Content-Type against the topic''s input schema and its body (a JSON array of events; one CloudEvent with application/cloudevents+json; one object for CustomEventSchema), and publishes all its events in one transaction or none (_http_publish_events). Returns the HTTP status and the answer''s body: 200 and nothing; 400 BadRequest naming the first bad event''s index and field; 401 Unauthorized; 404 NotFound; 413 PayloadTooLarge (over 5000 events).';

CREATE FUNCTION eventgrid._http_publish_events(topic text, events jsonb, OUT status integer, OUT answer text) RETURNS record
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

COMMENT ON FUNCTION eventgrid._http_publish_events(topic text, events jsonb, OUT status integer, OUT answer text) IS 'Internal: publishes the events of an HTTP request (a JSON array, or one event) to topic, all or none (publish() in a subtransaction): 200 and no body; 400 BadRequest naming the first event that fails alone, its index and field; 413 PayloadTooLarge (over 5000 events or 1 MB).';

CREATE FUNCTION eventgrid._http_unauthorized_message() RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN 'The request must carry one of the topic''s access keys (aeg-sas-key, or Authorization: SharedAccessKey) or a shared access signature signed with one (aeg-sas-token) that has not expired.'::text;

COMMENT ON FUNCTION eventgrid._http_unauthorized_message() IS 'Internal: the message of every 401 of the HTTP data plane (SPEC 16), whatever was wrong and whether the topic exists; the HTTP listener answers the same for a database it does not serve and for a request without any credential.';

CREATE FUNCTION eventgrid._insert_dead_letter_notifications(notices eventgrid._dead_letter_notice[]) RETURNS void
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 INSERT INTO eventgrid.events (topic, event, source)  SELECT n.notification_topic,
             n.notification,
             '(dead-letter notification)'
            FROM (unnest(_insert_dead_letter_notifications.notices) x(subscription_id, event_id, dead_letter_topic, topic, subscription, event, input_schema, dead_lettered, reason, attempts, outcome, http_status, publish_time, attempted_at, event_source)
              CROSS JOIN LATERAL eventgrid._dead_letter_notification(x.dead_letter_topic, x.topic, x.subscription, x.event, x.input_schema, x.dead_lettered, x.reason, x.attempts, x.outcome, x.http_status, x.publish_time, x.attempted_at, x.event_source) n(notification_topic, notification));
END;

COMMENT ON FUNCTION eventgrid._insert_dead_letter_notifications(notices eventgrid._dead_letter_notice[]) IS 'Internal: publishes the dead-letter notifications of the notices (eventgrid._dead_letter_notification builds each) into eventgrid.events, source ''(dead-letter notification)''; eventgrid._publish_dead_letter_notifications calls it for the whole set, then for each notice alone.';

CREATE FUNCTION eventgrid._lock_token_keys(lock_tokens text[], OUT ids bigint[], OUT tokens text[]) RETURNS record
    LANGUAGE c IMMUTABLE
    AS 'MODULE_PATHNAME', 'eventgrid_lock_token_keys';

COMMENT ON FUNCTION eventgrid._lock_token_keys(lock_tokens text[], OUT ids bigint[], OUT tokens text[]) IS 'Internal: the well-formed lock tokens of an operation''s argument as the event ids they name and the tokens normalized (id:secret), which the operations find their rows by (primary key, then the token); 22004 when lock_tokens is NULL, 54000 when it holds more than 1000.';

CREATE FUNCTION eventgrid._lock_token_results(sid bigint, lock_tokens text[], done text[], operation text) RETURNS TABLE(lock_token text, succeeded boolean, error text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    AS $$
BEGIN
    IF cardinality(done) = cardinality(lock_tokens) THEN
        -- each token settled an event of its own: nothing to look up
        RETURN QUERY SELECT u.tok, true, NULL::text FROM unnest(lock_tokens) WITH ORDINALITY u(tok, ord) ORDER BY u.ord;
        RETURN;
    END IF;
    -- why each other token did not settle: its event looked up by primary key (OFFSET 0 keeps the
    -- other conditions out of that scan, as in _queue_ids)
    RETURN QUERY
    SELECT t.tok, t.settled,
           CASE WHEN t.settled THEN NULL::text
                WHEN t.id IS NULL THEN 'InvalidLockToken: not a lock token of eventgrid.receive()'
                WHEN (t.id || ':' || t.secret) = ANY (done) THEN 'TokenLost: the same lock token came earlier in this call'
                WHEN EXISTS (SELECT 1 FROM (SELECT q.lock_secret, q.subscription_id, q.receivable_at
                                              FROM eventgrid.queue_events q WHERE q.id = t.id OFFSET 0) q
                              WHERE q.lock_secret = t.secret AND q.subscription_id = sid
                                AND q.receivable_at <= eventgrid._clock_now())
                    THEN 'TokenLost: the lock expired; the event can be received again'
                WHEN operation = 'renew'
                     AND EXISTS (SELECT 1 FROM (SELECT q.lock_secret, q.subscription_id
                                                  FROM eventgrid.queue_events q WHERE q.id = t.id OFFSET 0) q
                                  WHERE q.lock_secret = t.secret AND q.subscription_id = sid)
                    THEN 'LockRenewalLimitExceeded: a lock can be renewed within 1 hour of its receive only'
                ELSE 'TokenLost: no such lock; the event was settled, received again after its lock expired, or belongs to another event subscription'
           END
      FROM (SELECT p.tok, p.ord, p.id, p.secret,
                   coalesce((p.id || ':' || p.secret) = ANY (done), false)
                   AND row_number() OVER (PARTITION BY p.id, p.secret ORDER BY p.ord) = 1 AS settled
              FROM eventgrid._parse_lock_tokens(lock_tokens) p) t
     ORDER BY t.ord;
END $$;

COMMENT ON FUNCTION eventgrid._lock_token_results(sid bigint, lock_tokens text[], done text[], operation text) IS 'Internal: the result row of each lock token an operation was given, in the order given: succeeded when the operation settled it (done: the tokens it settled, as id:secret), else why not (InvalidLockToken, TokenLost, LockRenewalLimitExceeded).';

CREATE FUNCTION eventgrid._log(message text) RETURNS void
    LANGUAGE c STRICT
    AS 'MODULE_PATHNAME', 'eventgrid_log';

COMMENT ON FUNCTION eventgrid._log(message text) IS 'Internal: writes message to the server log (LOG), without the STATEMENT and CONTEXT lines.';

CREATE FUNCTION eventgrid._metrics_per_topic() RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN (COALESCE(current_setting('eventgrid.metrics_per_topic'::text, true), 'off'::text))::boolean;

COMMENT ON FUNCTION eventgrid._metrics_per_topic() IS 'Internal: whether the GUC eventgrid.metrics_per_topic is on in this session (off when the library is not loaded): event_subscription_metrics, event_subscription_metric_labels and event_subscription_histograms then give one row per topic.';

CREATE FUNCTION eventgrid._random_bytes(n integer) RETURNS bytea
    LANGUAGE c STRICT
    AS 'MODULE_PATHNAME', 'eventgrid_random_bytes';

COMMENT ON FUNCTION eventgrid._random_bytes(n integer) IS 'Internal: n (1-1024) bytes from pg_strong_random(), the server''s cryptographically strong source.';

CREATE FUNCTION eventgrid._new_access_key() RETURNS text
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    RETURN encode(eventgrid._random_bytes(32), 'base64'::text);

COMMENT ON FUNCTION eventgrid._new_access_key() IS 'Internal: a new topic access key: the base64 of 32 bytes from pg_strong_random() (44 characters, as Event Grid''s keys).';

CREATE FUNCTION eventgrid._ordering_key(event jsonb, path text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE jsonb_typeof((event #> string_to_array(path, '.'::text))) WHEN 'string'::text THEN (event #>> string_to_array(path, '.'::text)) WHEN 'boolean'::text THEN (event #>> string_to_array(path, '.'::text)) WHEN 'number'::text THEN (trim_scale(((event #> string_to_array(path, '.'::text)))::numeric))::text ELSE NULL::text END;

COMMENT ON FUNCTION eventgrid._ordering_key(event jsonb, path text) IS 'Internal: the ordering key of an event (SPEC 13): the value at the dotted field path as text when it is a string (its text), a number (its value in plain decimal without trailing zeros: 1, 1.0 and 1e0 are key 1, as is the string "1") or a boolean (true, false); else NULL (unordered). Events that waited at the update keep the key they were given.';

CREATE TABLE eventgrid.ordering_keys (
    subscription_id bigint NOT NULL,
    ordering_key_hash bigint NOT NULL,
    head_id bigint NOT NULL
);

COMMENT ON TABLE eventgrid.ordering_keys IS 'Internal: per ordered event subscription, each key with events in its retries and the id of the one due or in flight (head_id); the others of the key wait with next_attempt_at ''infinity''. Read it through eventgrid.blocked_ordering_keys.';

CREATE FUNCTION eventgrid._park_ordering_keys(sids bigint[], key_hashes bigint[], ids bigint[], dues timestamp with time zone[]) RETURNS integer
    LANGUAGE sql
    BEGIN ATOMIC
 WITH firsts AS (
          SELECT DISTINCT ON (k.sid, k.h) k.sid,
             k.h,
             k.id,
             k.due
            FROM UNNEST(_park_ordering_keys.sids, _park_ordering_keys.key_hashes, _park_ordering_keys.ids, _park_ordering_keys.dues) k(sid, h, id, due)
           ORDER BY k.sid, k.h, k.id
         ), started AS (
          INSERT INTO eventgrid.ordering_keys AS k (subscription_id, ordering_key_hash, head_id)  SELECT f.sid,
                     f.h,
                     f.id
                    FROM firsts f
                   ORDER BY f.sid, f.h ON CONFLICT(subscription_id, ordering_key_hash) DO UPDATE SET head_id = k.head_id
           RETURNING k.head_id,
             (k.xmax = 0) AS started
         ), due_now AS (
          UPDATE eventgrid.retries AS r SET next_attempt_at = f.due
            FROM (started
              JOIN firsts f ON ((f.id = started.head_id)))
           WHERE (started.started AND (r.id = started.head_id))
           RETURNING 1 AS "?column?"
         )
  SELECT (count(*))::integer AS count
    FROM due_now;
END;

COMMENT ON FUNCTION eventgrid._park_ordering_keys(sids bigint[], key_hashes bigint[], ids bigint[], dues timestamp with time zone[]) IS 'Internal: first attempts ids of ordered event subscriptions (subscription sids, key key_hashes) were just written into the retries waiting (next_attempt_at ''infinity''), a key''s in publish order: an attempt failed, or an event waits behind one that did; of each key that had no head, the oldest becomes its head, due at its own time in dues; returns how many. Locks the keys'' rows of eventgrid.ordering_keys, in order, as _promote_ordering_keys does.';

CREATE FUNCTION eventgrid._parse_lock_tokens(lock_tokens text[]) RETURNS TABLE(ord bigint, tok text, id bigint, secret uuid)
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT x.ord,
     x.tok,
         CASE
             WHEN x.ok THEN (split_part(x.tok, ':'::text, 1))::bigint
             ELSE NULL::bigint
         END AS "case",
         CASE
             WHEN x.ok THEN (split_part(x.tok, ':'::text, 2))::uuid
             ELSE NULL::uuid
         END AS "case"
    FROM ( SELECT u.tok,
             u.ord,
             COALESCE((u.tok ~ '^[0-9]{1,18}:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'::text), false) AS ok
            FROM unnest(_parse_lock_tokens.lock_tokens) WITH ORDINALITY u(tok, ord)) x;
END;

COMMENT ON FUNCTION eventgrid._parse_lock_tokens(lock_tokens text[]) IS 'Internal: each lock token of an operation''s argument, in order, with the event id and lock secret it is made of (id:secret, as receive() makes them; NULL when it is not of that form).';

CREATE FUNCTION eventgrid._pause_target(topic text, subscription text, OUT target_topic text, OUT target_sid bigint, OUT label text) RETURNS record
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF topic IS NULL AND subscription IS NOT NULL THEN
        RAISE EXCEPTION 'a subscription is named with its topic'
            USING ERRCODE = 'null_value_not_allowed', HINT = 'Pass the topic too, or both NULL for all delivery.';
    END IF;
    IF subscription IS NOT NULL THEN
        target_sid := eventgrid._subscription_id(topic, subscription);
        label := format('event subscription "%s" of topic "%s"', subscription, topic);
    ELSIF topic IS NOT NULL THEN
        IF NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = _pause_target.topic) THEN
            RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(topic) USING ERRCODE = 'undefined_object';
        END IF;
        label := format('topic "%s"', topic);
    ELSE
        label := 'all event subscriptions';
    END IF;
    -- a domain topic's subscription ('domain/topic', SPEC 18) is kept with its domain's name
    target_topic := split_part(topic, '/', 1);
END $$;

COMMENT ON FUNCTION eventgrid._pause_target(topic text, subscription text, OUT target_topic text, OUT target_sid bigint, OUT label text) IS 'Internal: what pause_delivery() and resume_delivery() name (both NULL: everything), checked to exist.';

CREATE FUNCTION eventgrid._pending(subscription_id bigint) RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    BEGIN ATOMIC
 SELECT b.pending
    FROM eventgrid._backlog(_pending.subscription_id) b(pending, oldest, due_since);
END;

COMMENT ON FUNCTION eventgrid._pending(subscription_id bigint) IS 'Internal: deliveries of an event subscription not finished yet: events its position has not passed, first attempts in flight, and retries.';

CREATE FUNCTION eventgrid._position_to_queue(sid bigint, due timestamp with time zone) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    snap pg_snapshot := pg_current_snapshot();
    n bigint := 0;
BEGIN
    WITH ev AS (
        SELECT e.event_table, e.txid, e.id, e.publish_time,
               (row_number() OVER (PARTITION BY e.event_table ORDER BY e.id) - 1) / 100 AS part
          FROM eventgrid.subscription_positions p
          JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id
         CROSS JOIN LATERAL eventgrid._unpassed_events(s.read_key, p.done, p.upto, p.after_txid, p.after_id) e
         WHERE p.subscription_id = sid AND pg_visible_in_snapshot(e.txid, snap)
           AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with, s.subject_ends_with,
                                  s.is_subject_case_sensitive, s.advanced_filters, s.enable_advanced_filtering_on_arrays)
    ), made AS (
        -- in publish order (the ids the rows get)
        INSERT INTO eventgrid.queue_batches (subscription_id, event_table, txids, event_ids, oldest_publish_time, receivable_at)
        SELECT x.* FROM (
            SELECT sid, ev.event_table, array_agg(ev.txid ORDER BY ev.id), array_agg(ev.id ORDER BY ev.id),
                   min(ev.publish_time), due
              FROM ev GROUP BY ev.event_table, ev.part ORDER BY min(ev.id)) x
        RETURNING cardinality(event_ids) AS k
    )
    SELECT coalesce(sum(m.k), 0) INTO n FROM made m;
    IF n > 0 THEN
        UPDATE eventgrid.subscription_counters c SET matched = c.matched + n WHERE c.subscription_id = sid;
        PERFORM eventgrid._wake_receivers_at_commit(ARRAY[sid]);
    END IF;
    UPDATE eventgrid.subscription_positions p SET done = snap, upto = NULL, after_txid = NULL, after_id = NULL
     WHERE p.subscription_id = sid;
    RETURN n;
END $$;

COMMENT ON FUNCTION eventgrid._position_to_queue(sid bigint, due timestamp with time zone) IS 'Internal: moves queue event subscription sid''s position to the current snapshot; the committed events it passes that match its filters become receivable from due on, as references in eventgrid.queue_batches (100 a row, in publish order; the events stay in the event tables), and waiting receive() calls are woken at commit. Returns how many. A delivery worker''s claim calls it, holding the position''s lock.';

CREATE FUNCTION eventgrid._position_to_retries(sid bigint, due timestamp with time zone, keep boolean) RETURNS bigint
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
                 CROSS JOIN LATERAL eventgrid._unpassed_events(s.read_key, p.done, p.upto, p.after_txid, p.after_id) e
                 WHERE p.subscription_id = sid AND pg_visible_in_snapshot(e.txid, snap)
                   AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with, s.subject_ends_with,
                                          s.is_subject_case_sensitive, s.advanced_filters, s.enable_advanced_filtering_on_arrays)
                 ORDER BY e.id) x
            RETURNING 1
        )
        SELECT count(*) INTO n FROM moved;
        UPDATE eventgrid.subscription_counters c SET matched = c.matched + n WHERE c.subscription_id = sid AND n > 0;
        IF n > 0 THEN
            PERFORM eventgrid._wake_receivers_at_commit(ARRAY[sid]);
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
                 CROSS JOIN LATERAL eventgrid._unpassed_events(s.read_key, p.done, p.upto, p.after_txid, p.after_id) e
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

CREATE FUNCTION eventgrid._promote_ordering_keys(sids bigint[], key_hashes bigint[], finished_ids bigint[], due timestamp with time zone) RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n integer;
BEGIN
    -- first the keys' rows, in order: a transfer adding to a key holds its row until it commits,
    -- and what it added is seen by the next statement
    PERFORM 1 FROM eventgrid.ordering_keys k
      JOIN unnest(sids, key_hashes) AS f(sid, h) ON k.subscription_id = f.sid AND k.ordering_key_hash = f.h
     ORDER BY k.subscription_id, k.ordering_key_hash FOR UPDATE OF k;
    WITH f AS (
        SELECT * FROM unnest(sids, key_hashes, finished_ids) AS f(sid, h, id)
    ), nxt AS (
        -- the key's next row: after the finished one, past the dead rows of those before
        SELECT f.sid, f.h, n.id
          FROM f LEFT JOIN LATERAL (SELECT r.id FROM eventgrid.retries r
                                     WHERE r.subscription_id = f.sid AND r.ordering_key_hash = f.h
                                       AND r.ordering_key IS NOT NULL AND r.id > f.id
                                     ORDER BY r.id LIMIT 1) n ON true
    ), gone AS (
        DELETE FROM eventgrid.ordering_keys k USING nxt
         WHERE k.subscription_id = nxt.sid AND k.ordering_key_hash = nxt.h AND nxt.id IS NULL
    ), moved AS (
        INSERT INTO eventgrid.ordering_keys AS k (subscription_id, ordering_key_hash, head_id)
        SELECT nxt.sid, nxt.h, nxt.id FROM nxt WHERE nxt.id IS NOT NULL ORDER BY nxt.sid, nxt.h
        ON CONFLICT (subscription_id, ordering_key_hash) DO UPDATE SET head_id = EXCLUDED.head_id
        RETURNING k.head_id
    ), due_now AS (
        UPDATE eventgrid.retries r SET next_attempt_at = due FROM moved
         WHERE r.id = moved.head_id AND r.next_attempt_at = 'infinity' RETURNING 1
    )
    SELECT count(*)::integer INTO n FROM due_now;
    RETURN n;
END $$;

COMMENT ON FUNCTION eventgrid._promote_ordering_keys(sids bigint[], key_hashes bigint[], finished_ids bigint[], due timestamp with time zone) IS 'Internal: the heads finished_ids of keys key_hashes of subscriptions sids were delivered, dead-lettered or dropped (and deleted in this transaction): the next row of each key becomes its head, due at due, or the key is forgotten when none is left; returns how many became due. Locks the keys'' rows first, so that a transfer adding to a key (_start_ordering_keys) has committed and is seen.';

CREATE FUNCTION eventgrid._publish_dead_letter_notifications(notices eventgrid._dead_letter_notice[]) RETURNS TABLE(failed_subscription_id bigint, failed_topic text, failed_subscription text, failed_event_id bigint, failed_dead_letter_topic text, failed_sqlstate text, failed_error text)
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
        PERFORM eventgrid._insert_dead_letter_notifications(notices);
        RETURN;
    EXCEPTION WHEN OTHERS THEN
        NULL;   -- one at a time below, so that only those that cannot be made are left out
    END;
    FOREACH d IN ARRAY notices LOOP
        BEGIN
            PERFORM eventgrid._insert_dead_letter_notifications(ARRAY[d]);
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

COMMENT ON FUNCTION eventgrid._publish_dead_letter_notifications(notices eventgrid._dead_letter_notice[]) IS 'Internal: publishes the dead-letter notifications of a record of outcomes (eventgrid._dead_letter_notification builds each) in one subtransaction, and when that fails one at a time; returns each that still fails (what eventgrid.dead_letter_notification_failures keeps of it), and one LOG line counts them (SQLSTATE, never the message). The delivery workers call it in the statement that records the dead letters and store what it returns, so a notification that cannot be made never holds a dead letter back.';

CREATE FUNCTION eventgrid._publish_table_changes(caller regrole, source_table regclass, topic text, operations text[], columns text[], update_columns text[], event_type_prefix text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    ops text[];
BEGIN
    PERFORM eventgrid._check_not_null('source_table', source_table);
    PERFORM eventgrid._check_not_null('topic', topic);
    PERFORM eventgrid._check_not_null('operations', operations);
    IF NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = _publish_table_changes.topic FOR KEY SHARE) THEN
        RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object', HINT = 'Create it first with eventgrid.create_topic().';
    END IF;
    IF EXISTS (SELECT 1 FROM eventgrid.domains d WHERE d.name = _publish_table_changes.topic) THEN
        -- a table change event names no domain topic (SPEC 18): every write to the table would fail
        RAISE EXCEPTION '% is an event domain: table changes are published to a topic', eventgrid._quote(topic)
            USING ERRCODE = 'wrong_object_type', HINT = 'Publish them to a topic of their own (eventgrid.create_topic()).';
    END IF;
    SELECT array_agg(DISTINCT upper(o) ORDER BY upper(o)) INTO ops FROM unnest(operations) o;
    IF ops IS NULL OR NOT ops <@ ARRAY['INSERT', 'UPDATE', 'DELETE'] OR array_position(ops, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'operations must be one or more of INSERT, UPDATE and DELETE, got %', eventgrid._quote(operations::text)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'TRUNCATE publishes nothing; pass for example ARRAY[''INSERT'', ''UPDATE''].';
    END IF;
    IF cardinality(columns) = 0 OR cardinality(update_columns) = 0
       OR array_position(columns, NULL) IS NOT NULL OR array_position(update_columns, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'columns and update_columns must be NULL or name at least one column, without NULLs'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'NULL columns carries every column; NULL update_columns publishes an UPDATE that changed any column.';
    END IF;
    IF event_type_prefix IS NOT NULL AND (length(event_type_prefix) NOT BETWEEN 1 AND 200 OR event_type_prefix ~ '[[:cntrl:]]') THEN
        RAISE EXCEPTION 'event_type_prefix must have 1 to 200 characters and no control characters, got %', eventgrid._quote(event_type_prefix)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'NULL gives <schema>.<table>; the event types are the prefix and .Inserted, .Updated or .Deleted.';
    END IF;
    PERFORM eventgrid._check_table_publication(caller, source_table, columns, update_columns);
    SELECT array_agg(DISTINCT c ORDER BY c) INTO columns FROM unnest(columns) c;
    SELECT array_agg(DISTINCT c ORDER BY c) INTO update_columns FROM unnest(update_columns) c;

    PERFORM eventgrid._drop_table_change_triggers(source_table, topic);
    INSERT INTO eventgrid.table_publications AS p
           (source_table, topic, operations, columns, update_columns, event_type_prefix)
    VALUES (source_table, topic, ops, columns, update_columns, event_type_prefix)
    ON CONFLICT ON CONSTRAINT table_publications_pkey DO UPDATE
       SET operations = excluded.operations, columns = excluded.columns,
           update_columns = excluded.update_columns, event_type_prefix = excluded.event_type_prefix,
           shape = NULL, statements = NULL;
    PERFORM eventgrid._create_table_change_triggers(source_table, topic, ops);
END $$;

COMMENT ON FUNCTION eventgrid._publish_table_changes(caller regrole, source_table regclass, topic text, operations text[], columns text[], update_columns text[], event_type_prefix text) IS 'Internal: publish_table_changes() for role caller, the role current where it was called.';

CREATE FUNCTION eventgrid._put_delivery_property(p_topic text, p_subscription text, p_header text, p_value text, p_source_field text, p_is_secret boolean) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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
    IF lower(p_header) = 'authorization'
       AND EXISTS (SELECT 1 FROM eventgrid.delivery_authentications a WHERE a.subscription_id = sid) THEN
        RAISE EXCEPTION 'event subscription % of topic % sends bearer tokens: it cannot have an Authorization delivery property',
                        eventgrid._quote(p_subscription), eventgrid._quote(p_topic)
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Its Authorization header carries the token of its delivery authentication; remove that first with eventgrid.remove_delivery_authentication().';
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

COMMENT ON FUNCTION eventgrid._put_delivery_property(p_topic text, p_subscription text, p_header text, p_value text, p_source_field text, p_is_secret boolean) IS 'Internal: validates and upserts one custom delivery property, enforcing at most 10 per subscription.';

CREATE FUNCTION eventgrid._queue_count(sid bigint, received bigint, acknowledged bigint, released bigint, rejected bigint, lock_expired bigint) RETURNS void
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 INSERT INTO eventgrid.queue_counters AS c (subscription_id, slot, received, acknowledged, released, rejected, lock_expired)  SELECT _queue_count.sid AS sid,
             (pg_backend_pid() % 16),
             _queue_count.received AS received,
             _queue_count.acknowledged AS acknowledged,
             _queue_count.released AS released,
             _queue_count.rejected AS rejected,
             _queue_count.lock_expired AS lock_expired
           WHERE (((((_queue_count.received + _queue_count.acknowledged) + _queue_count.released) + _queue_count.rejected) + _queue_count.lock_expired) > 0) ON CONFLICT(subscription_id, slot) DO UPDATE SET received = (c.received + excluded.received), acknowledged = (c.acknowledged + excluded.acknowledged), released = (c.released + excluded.released), rejected = (c.rejected + excluded.rejected), lock_expired = (c.lock_expired + excluded.lock_expired);
END;

COMMENT ON FUNCTION eventgrid._queue_count(sid bigint, received bigint, acknowledged bigint, released bigint, rejected bigint, lock_expired bigint) IS 'Internal: adds to the subscriber operations'' totals of a queue event subscription, in the counter slot of this backend.';

CREATE FUNCTION eventgrid._queue_event(topic text, event_table smallint, txid xid8, event_id bigint) RETURNS jsonb
    LANGUAGE sql STABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    RETURN (SELECT e.event FROM eventgrid.events e WHERE ((e.event_table = _queue_event.event_table) AND (e.topic = _queue_event.topic) AND (e.txid = _queue_event.txid) AND (e.id = _queue_event.event_id)));

COMMENT ON FUNCTION eventgrid._queue_event(topic text, event_table smallint, txid xid8, event_id bigint) IS 'Internal: the event a queue_events row without a copy refers to, read in its event table through the (topic, txid, id) index; NULL if it is not there.';

CREATE FUNCTION eventgrid._queue_expire(now timestamp with time zone) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    r record;
    n bigint := 0;
    sids bigint[];
BEGIN
    -- batches holding an event past its time to live become rows of queue_events (references, not copies),
    -- which the sweep below dead-letters when they are past it, and receive() takes when not
    WITH taken AS (
        DELETE FROM eventgrid.queue_batches b
         WHERE b.id IN (SELECT x.id FROM eventgrid.queue_batches x
                          JOIN eventgrid.event_subscriptions s ON s.id = x.subscription_id
                         WHERE x.oldest_publish_time + s.event_ttl * interval '1 minute' <= now
                           FOR UPDATE OF x SKIP LOCKED)
        RETURNING b.*
    )
    , moved AS (
        INSERT INTO eventgrid.queue_events (subscription_id, event_id, event_table, event_txid, publish_time, event_bytes,
                                            receivable_at, source, source_event_id)
        SELECT x.* FROM (
            SELECT b.subscription_id, e.id, b.event_table, e.txid, e.publish_time, coalesce(e.event_bytes, 0),
                   b.receivable_at, e.source, e.source_event_id
              FROM taken b
              JOIN eventgrid.event_subscriptions s ON s.id = b.subscription_id
             CROSS JOIN LATERAL eventgrid._batch_events(s.topic, b.event_table, b.txids, b.event_ids) e
             ORDER BY b.id, e.id) x
        RETURNING subscription_id
    )
    SELECT array_agg(DISTINCT m.subscription_id) INTO sids FROM moved m;
    IF sids IS NOT NULL THEN
        PERFORM eventgrid._wake_receivers_at_commit(sids);
    END IF;
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

COMMENT ON FUNCTION eventgrid._queue_expire(now timestamp with time zone) IS 'Internal: dead-letters (or drops) the receivable events of every queue event subscription that are past their time to live or were received max_delivery_count times and not settled, as receive() would when it came to them (a batch of eventgrid.queue_batches holding an event past its time to live first becomes rows of eventgrid.queue_events); returns how many. The upkeep worker runs it every 10 s (and after new settings), so that they leave without a consumer.';

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
        DELETE FROM eventgrid.queue_events q WHERE q.id = ANY (eventgrid._queue_ids(sid, ids))
        RETURNING q.id, q.event_id, q.delivery_count, q.publish_time, q.received_at, q.source, q.source_event_id,
                  coalesce(q.event, eventgrid._queue_event(sub.topic, q.event_table, q.event_txid, q.event_id)) AS event
    ), dead AS (
        INSERT INTO eventgrid.dead_letters (topic, subscription_name, subscription_id, input_schema,
               event_delivery_schema, event, dead_letter_reason, delivery_attempts, publish_time,
               last_delivery_attempt_time, topic_type, event_id, source, source_event_id)
        SELECT sub.topic, sub.name, sid, 'CloudEventSchemaV1_0', sub.event_delivery_schema, g.event, reason,
               g.delivery_count, g.publish_time, g.received_at, sub.topic_type, g.event_id, g.source, g.source_event_id
          FROM gone g WHERE sub.deadletter AND g.event IS NOT NULL
         ORDER BY g.id
    ), notified AS (
        INSERT INTO eventgrid.dead_letter_notification_failures (subscription_id, topic, subscription_name,
               event_id, dead_letter_topic, sqlstate, error)
        SELECT x.* FROM (SELECT ARRAY(
            SELECT ROW(sid, g.event_id, sub.dead_letter_topic, sub.topic, sub.name, g.event, 'CloudEventSchemaV1_0',
                       sub.deadletter, reason, g.delivery_count, NULL, NULL, g.publish_time, g.received_at,
                       g.source)::eventgrid._dead_letter_notice
              FROM gone g WHERE g.event IS NOT NULL ORDER BY g.id) AS a) q
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

COMMENT ON FUNCTION eventgrid._queue_finish(sid bigint, ids bigint[], reason text) IS 'Internal: removes events ids of queue event subscription sid from eventgrid.queue_events and dead-letters them with reason (MaxDeliveryCountExceeded, TimeToLiveExceeded, Rejected; delivery_attempts: how many times they were received), or drops them when dead-lettering is off; publishes their dead-letter notifications and counts them as the delivery workers do. Returns how many.';

CREATE FUNCTION eventgrid._queue_ids(sid bigint, ids bigint[]) RETURNS bigint[]
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT COALESCE(array_agg(x.id), '{}'::bigint[]) AS "coalesce"
    FROM ( SELECT q.id,
             q.subscription_id
            FROM eventgrid.queue_events q
           WHERE (q.id = ANY (_queue_ids.ids))
          OFFSET 0) x
   WHERE (x.subscription_id = _queue_ids.sid);
END;

COMMENT ON FUNCTION eventgrid._queue_ids(sid bigint, ids bigint[]) IS 'Internal: those of ids that are events of queue event subscription sid in eventgrid.queue_events, found by primary key only (the subscription is compared above the scan: with it in the scan, statistics of an emptier queue lead the planner to walk the subscription''s whole receivable index). The subscriber operations find their rows with it.';

CREATE FUNCTION eventgrid._queue_locked(sid bigint, key_ids bigint[], key_tokens text[], OUT ids bigint[], OUT tokens text[]) RETURNS record
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET enable_seqscan TO 'off'
    BEGIN ATOMIC
 SELECT COALESCE(array_agg(l.id ORDER BY l.id), '{}'::bigint[]) AS "coalesce",
     COALESCE(array_agg(((l.id || ':'::text) || l.lock_secret)), '{}'::text[]) AS "coalesce"
    FROM ( SELECT q.id,
             q.lock_secret
            FROM eventgrid.queue_events q
           WHERE ((q.id = ANY (eventgrid._queue_ids(_queue_locked.sid, _queue_locked.key_ids))) AND (((q.id || ':'::text) || q.lock_secret) = ANY (_queue_locked.key_tokens)) AND (q.receivable_at > eventgrid._clock_now()))
           ORDER BY q.id
          FOR UPDATE OF q) l;
END;

COMMENT ON FUNCTION eventgrid._queue_locked(sid bigint, key_ids bigint[], key_tokens text[], OUT ids bigint[], OUT tokens text[]) IS 'Internal: locks (FOR UPDATE) the events of queue event subscription sid whose locks the keys of _lock_token_keys() name and have not expired; their ids and tokens (id:secret).';

CREATE FUNCTION eventgrid._queue_set_aside(event_table smallint) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n bigint;
    m bigint;
    sids bigint[];
BEGIN
    -- events not received yet: receivable rows with their copies, in publish order
    WITH taken AS (
        DELETE FROM eventgrid.queue_batches b
         WHERE b.id IN (SELECT x.id FROM eventgrid.queue_batches x WHERE x.event_table = _queue_set_aside.event_table
                         FOR UPDATE SKIP LOCKED)
        RETURNING b.*
    ), moved AS (
        INSERT INTO eventgrid.queue_events (subscription_id, event_id, event, publish_time, event_bytes,
                                            receivable_at, source, source_event_id)
        SELECT x.* FROM (
            SELECT b.subscription_id, e.id, e.event, e.publish_time, coalesce(e.event_bytes, 0), b.receivable_at,
                   e.source, e.source_event_id
              FROM taken b
              JOIN eventgrid.event_subscriptions s ON s.id = b.subscription_id
             CROSS JOIN LATERAL eventgrid._batch_events(s.topic, b.event_table, b.txids, b.event_ids) e
             ORDER BY b.id, e.id) x
        RETURNING subscription_id
    )
    SELECT count(*), array_agg(DISTINCT m.subscription_id) INTO n, sids FROM moved m;
    IF sids IS NOT NULL THEN
        -- consumers that found these batches locked wait for this transaction's end
        PERFORM eventgrid._wake_receivers_at_commit(sids);
    END IF;
    -- events received (locked, released, or with their lock expired): the copy goes into their row
    UPDATE eventgrid.queue_events q
       SET event = c.event, event_table = NULL, event_txid = NULL
      FROM (SELECT x.id, eventgrid._queue_event(s.topic, x.event_table, x.event_txid, x.event_id) AS event
              FROM eventgrid.queue_events x
              JOIN eventgrid.event_subscriptions s ON s.id = x.subscription_id
             WHERE x.event_table = _queue_set_aside.event_table
               FOR UPDATE OF x SKIP LOCKED) c
     WHERE q.id = c.id AND c.event IS NOT NULL;
    GET DIAGNOSTICS m = ROW_COUNT;
    RETURN n + m;
END $$;

COMMENT ON FUNCTION eventgrid._queue_set_aside(event_table smallint) IS 'Internal: before event table eventgrid.events_<event_table> is emptied (once nothing else needs it and its next turn is near), the queue event subscriptions'' events still read there get copies: the rows of eventgrid.queue_batches that name it become receivable rows of eventgrid.queue_events, and rows of queue_events that refer to it get their event copied in. Rows a consumer holds are left (the rotation waits for them). Each event is found by its own index probe (_batch_events()). Returns how many events were copied. The upkeep worker''s rotation calls it.';

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

COMMENT ON FUNCTION eventgrid._queue_subscription_id(topic text, subscription text) IS 'Internal: the id of a queue event subscription; 22004 NULL, 42704 none, 42809 a push event subscription.';

CREATE FUNCTION eventgrid._queue_take(sid bigint, max_events integer, after timestamp with time zone DEFAULT '-infinity'::timestamp with time zone) RETURNS TABLE(lock_token text, delivery_count integer, event jsonb, was_receivable_at timestamp with time zone)
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
    bat eventgrid.queue_batches;
    k integer;
    toks text[];
    evs jsonb[];
BEGIN
    SELECT * INTO sub FROM eventgrid.event_subscriptions x WHERE x.id = sid;
    IF sub.expiration_time <= t_now THEN
        -- expired: nothing more is received (the upkeep worker drops it)
        RETURN;
    END IF;
    LOOP
        -- receivable again first: released, or locked by a receive whose lock expired (or set aside);
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
                RETURNING q.id, q.lock_secret, q.delivery_count,
                          coalesce(q.event, eventgrid._queue_event(sub.topic, q.event_table, q.event_txid, q.event_id)) AS event
            )
            SELECT t.id || ':' || t.lock_secret, t.delivery_count, t.event, low FROM taken t ORDER BY t.id;
            got := got + cardinality(live);
        END IF;
        -- what was dead-lettered made room: look again, until enough or nothing is left
        EXIT WHEN got >= max_events OR (over_count IS NULL AND over_ttl IS NULL);
    END LOOP;
    -- then events never received, read where they are: the subscription's batches in publish order,
    -- each taken from the front by one consumer at a time; a lock row (no copy) for each event taken
    WHILE got < max_events LOOP
        SELECT b.* INTO bat FROM eventgrid.queue_batches b WHERE b.subscription_id = sid
         ORDER BY b.id LIMIT 1 FOR UPDATE SKIP LOCKED;
        EXIT WHEN NOT FOUND;
        k := least(max_events - got, cardinality(bat.event_ids));
        IF k = cardinality(bat.event_ids) THEN
            DELETE FROM eventgrid.queue_batches b WHERE b.id = bat.id;
        ELSE
            UPDATE eventgrid.queue_batches b SET txids = b.txids[k + 1:], event_ids = b.event_ids[k + 1:]
             WHERE b.id = bat.id;
        END IF;
        IF bat.oldest_publish_time + sub.event_ttl * interval '1 minute' > t_now THEN
            -- none past its time to live: each event read once, its lock row's id and secret made first,
            -- so that the rows returned come from the one read (no join back to it)
            RETURN QUERY
            WITH ev AS MATERIALIZED (
                SELECT nextval('eventgrid.queue_events_id_seq'::regclass) AS qid, gen_random_uuid() AS secret,
                       e.id, e.txid, e.event, e.publish_time, e.event_bytes, e.source, e.source_event_id
                  FROM eventgrid._batch_events(sub.topic, bat.event_table, bat.txids[1:k], bat.event_ids[1:k]) e
                 ORDER BY e.id
            ), ins AS (
                INSERT INTO eventgrid.queue_events (id, subscription_id, event_id, event_table, event_txid, publish_time,
                       event_bytes, source, source_event_id, delivery_count, receivable_at, lock_secret, received_at)
                SELECT ev.qid, sid, ev.id, bat.event_table, ev.txid, ev.publish_time, coalesce(ev.event_bytes, 0),
                       ev.source, ev.source_event_id, 1, t_now + sub.receive_lock_duration * interval '1 second',
                       ev.secret, t_now
                  FROM ev ORDER BY ev.qid
            )
            SELECT ev.qid || ':' || ev.secret, 1, ev.event, t_now FROM ev ORDER BY ev.qid;
            GET DIAGNOSTICS k = ROW_COUNT;
            got := got + k;
            CONTINUE;
        END IF;
        -- past its time to live already: a row that is not locked, dead-lettered below
        WITH ev AS MATERIALIZED (
            SELECT e.id, e.txid, e.event, e.publish_time, e.event_bytes, e.source, e.source_event_id,
                   e.publish_time + sub.event_ttl * interval '1 minute' <= t_now AS too_old
              FROM eventgrid._batch_events(sub.topic, bat.event_table, bat.txids[1:k], bat.event_ids[1:k]) e
        ), ins AS (
            INSERT INTO eventgrid.queue_events AS q (subscription_id, event_id, event_table, event_txid, publish_time,
                   event_bytes, source, source_event_id, delivery_count, receivable_at, lock_secret, received_at)
            SELECT sid, ev.id, bat.event_table, ev.txid, ev.publish_time, coalesce(ev.event_bytes, 0), ev.source,
                   ev.source_event_id,
                   CASE WHEN ev.too_old THEN 0 ELSE 1 END,
                   CASE WHEN ev.too_old THEN bat.receivable_at
                        ELSE t_now + sub.receive_lock_duration * interval '1 second' END,
                   CASE WHEN ev.too_old THEN NULL ELSE gen_random_uuid() END,
                   CASE WHEN ev.too_old THEN NULL ELSE t_now END
              FROM ev ORDER BY ev.id
            RETURNING q.id, q.lock_secret, q.event_id
        )
        SELECT array_agg(i.id || ':' || i.lock_secret ORDER BY i.id) FILTER (WHERE i.lock_secret IS NOT NULL),
               array_agg(ev.event ORDER BY i.id) FILTER (WHERE i.lock_secret IS NOT NULL),
               array_agg(i.id ORDER BY i.id) FILTER (WHERE i.lock_secret IS NULL)
          INTO toks, evs, over_ttl
          FROM ins i JOIN ev ON ev.id = i.event_id;
        IF toks IS NOT NULL THEN
            RETURN QUERY SELECT x.t, 1, x.e, t_now FROM unnest(toks, evs) x(t, e);
            got := got + cardinality(toks);
        END IF;
        IF over_ttl IS NOT NULL THEN
            finished := finished + eventgrid._queue_finish(sid, over_ttl, 'TimeToLiveExceeded');
        END IF;
    END LOOP;
    PERFORM eventgrid._queue_count(sid, got, 0, 0, 0, lost);
    IF got = 0 AND finished > 0 THEN
        -- one row of NULLs: something was done (receive() keeps its subtransaction) though nothing was taken
        RETURN QUERY SELECT NULL::text, NULL::integer, NULL::jsonb, NULL::timestamptz;
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid._queue_take(sid bigint, max_events integer, after timestamp with time zone) IS 'Internal: takes up to max_events receivable events of queue event subscription sid: first those received before whose lock expired, released ones and those set aside (eventgrid.queue_events, receivable_at not before after; FOR UPDATE SKIP LOCKED, oldest receivable first), each locked with a new random lock token for the subscription''s receive_lock_duration and its delivery count raised by 1; then events never received, from the subscription''s eventgrid.queue_batches in publish order (a batch FOR UPDATE SKIP LOCKED, taken from its front), read in the event tables, each given a lock row in queue_events (no copy of the event). was_receivable_at: the earliest receivable_at the taken rows of queue_events had (the time of the take for events from batches), which receive() starts its next look from. Those past their time to live or already received max_delivery_count times are dead-lettered instead (_queue_finish), and when that was all it did it returns one row of NULLs. eventgrid.receive() calls it in a subtransaction of the caller''s transaction.';

CREATE FUNCTION eventgrid._quote(v text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN ('"'::text || CASE WHEN (length(v) > 64) THEN ("left"(v, 64) || '..."'::text) ELSE (v || '"'::text) END);

COMMENT ON FUNCTION eventgrid._quote(v text) IS 'Internal: double-quotes at most the first 64 characters of an argument for error messages.';

CREATE FUNCTION eventgrid._receive_grant_target(topic text, subscription text, role_name text, OUT sid bigint, OUT label text) RETURNS record
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM eventgrid._check_not_null('topic', topic);
    PERFORM eventgrid._check_not_null('role_name', role_name);
    IF NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = _receive_grant_target.topic) THEN
        RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object', HINT = 'List the topics with: SELECT name FROM eventgrid.topics;';
    END IF;
    IF subscription IS NOT NULL THEN
        sid := eventgrid._queue_subscription_id(topic, subscription);
        label := format('queue event subscription %s of topic %s', eventgrid._quote(subscription), eventgrid._quote(topic));
    ELSE
        label := format('every queue event subscription of topic %s', eventgrid._quote(topic));
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid._receive_grant_target(topic text, subscription text, role_name text, OUT sid bigint, OUT label text) IS 'Internal: what grant_receive() and revoke_receive() name: the subscription id (NULL: every queue subscription of the topic) and how log lines name it; 22004 NULL topic or role, 42704 no such topic or subscription, 42809 a push subscription.';

CREATE FUNCTION eventgrid._receive_subscription_id(topic text, subscription text, role oid) RETURNS bigint
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

COMMENT ON FUNCTION eventgrid._receive_subscription_id(topic text, subscription text, role oid) IS 'Internal: the id of queue event subscription subscription of topic when role may receive from it (a member of eventgrid_receiver or eventgrid_admin, or of a role grant_receive() named for it or its topic), else 42501; then 22004, 42704 and 42809 as _queue_subscription_id. receive() and the other subscriber operations call it with the role that called them.';

CREATE FUNCTION eventgrid._record_validation(sid bigint, sent_code text, http_status integer, body text, allowed_origin text, allowed_rate text, origin text, error text) RETURNS text
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    v eventgrid.endpoint_validations;
    cloudevents boolean;
    answer text;
    problem text;
    per_minute bigint;
    validated boolean := false;
BEGIN
    SELECT * INTO v FROM eventgrid.endpoint_validations x
     WHERE x.subscription_id = sid AND x.code = sent_code AND x.state = 'Creating' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT s.event_delivery_schema = 'CloudEventSchemaV1_0' INTO cloudevents
      FROM eventgrid.event_subscriptions s WHERE s.id = sid;
    IF error IS NOT NULL THEN
        problem := error;
    ELSIF cloudevents THEN
        IF http_status NOT BETWEEN 200 AND 299 THEN
            problem := format('the OPTIONS request was answered with HTTP %s', http_status);
        ELSIF allowed_origin IS NULL THEN
            problem := 'the answer has no WebHook-Allowed-Origin header';
        ELSIF allowed_origin <> '*' AND lower(allowed_origin) <> lower(origin) THEN
            problem := format('WebHook-Allowed-Origin %s is neither * nor %s', eventgrid._quote(allowed_origin),
                              eventgrid._quote(origin));
        ELSE
            -- WebHook-Allowed-Rate: requests a minute; one event per request unless batched
            IF allowed_rate ~ '^[0-9]{1,12}$' AND allowed_rate::bigint > 0 THEN
                per_minute := allowed_rate::bigint;
                UPDATE eventgrid.event_subscriptions s
                   SET max_events_per_second = least(100000, greatest(1, ceil(per_minute / 60.0)))::integer
                 WHERE s.id = sid;
            END IF;
            validated := true;
        END IF;
    ELSIF http_status <> 200 THEN
        problem := format('the SubscriptionValidationEvent was answered with HTTP %s', http_status);
    ELSE
        -- whatever the receiver sent: a body that is not JSON jsonb can hold
        -- (\u0000, a number beyond numeric's range, not JSON at all) is a
        -- failed try; an empty one asks for manual validation
        BEGIN
            answer := nullif(body, '')::jsonb ->> 'validationResponse';
        EXCEPTION WHEN data_exception OR program_limit_exceeded OR statement_too_complex THEN
            GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
            problem := 'the answer is not JSON eventgrid can read: ' || problem;
        END;
        IF problem IS NOT NULL THEN
            NULL;   -- tried again below
        ELSIF answer = sent_code THEN
            validated := true;
        ELSIF answer IS NULL THEN
            UPDATE eventgrid.endpoint_validations x SET state = 'AwaitingManualAction', manual_since = eventgrid._now(),
                   tries = x.tries + 1, last_error = NULL
             WHERE x.subscription_id = sid;
            RETURN 'AwaitingManualAction';
        ELSE
            UPDATE eventgrid.endpoint_validations x SET tries = x.tries + 1 WHERE x.subscription_id = sid;
            PERFORM eventgrid._fail_validation(sid, 'validationResponse is not the validation code sent');
            RETURN 'Failed';
        END IF;
    END IF;
    IF validated THEN
        UPDATE eventgrid.endpoint_validations x SET state = 'Succeeded', validated_at = eventgrid._now(),
               tries = x.tries + 1, last_error = NULL
         WHERE x.subscription_id = sid;
        RETURN 'Succeeded';
    END IF;
    -- not validated: again 5 s later, three tries in all
    UPDATE eventgrid.endpoint_validations x
       SET tries = x.tries + 1, last_error = left(problem, 512),
           next_try_at = eventgrid._now() + interval '5 seconds'
     WHERE x.subscription_id = sid
    RETURNING CASE WHEN x.tries >= 3 THEN 'Failed' ELSE 'Creating' END INTO answer;
    IF answer = 'Failed' THEN
        PERFORM eventgrid._fail_validation(sid, problem);
    END IF;
    RETURN answer;
END $_$;

COMMENT ON FUNCTION eventgrid._record_validation(sid bigint, sent_code text, http_status integer, body text, allowed_origin text, allowed_rate text, origin text, error text) IS 'Internal: records the answer to an endpoint validation request and returns the new provisioning state (NULL when the validation was started again meanwhile). Event Grid schema: HTTP 200 with {"validationResponse": code} validates, 200 with an empty body or JSON without it awaits validate_event_subscription() for 10 minutes, another code fails, a body that is not JSON eventgrid can read is a failed try. CloudEvents: a 2xx answer whose WebHook-Allowed-Origin is * or the origin sent validates, and WebHook-Allowed-Rate (requests a minute) becomes max_events_per_second. Otherwise tried again 5 s later, three tries in all, then Failed.';

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

COMMENT ON FUNCTION eventgrid._refresh_receive_grants() IS 'Internal: deletes the receive grants of dropped roles and writes each remaining grant''s role''s current name into role_name (what a dump carries). The upkeep worker calls it every round.';

CREATE FUNCTION eventgrid._refuse_change() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    RAISE EXCEPTION 'published events are immutable'
        USING ERRCODE = 'feature_not_supported',
              HINT = 'Publish a new event instead; drop a topic or subscription to discard pending events.';
END $$;

COMMENT ON FUNCTION eventgrid._refuse_change() IS 'Internal: refuses UPDATE of published events (0A000).';

CREATE FUNCTION eventgrid._reject(topic text, subscription text, lock_tokens text[]) RETURNS TABLE(lock_token text, succeeded boolean, error text)
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

COMMENT ON FUNCTION eventgrid._reject(topic text, subscription text, lock_tokens text[]) IS 'Internal: the body of eventgrid.reject(), which checks the caller''s right and runs it as the extension''s owner.';

CREATE FUNCTION eventgrid._release(topic text, subscription text, lock_tokens text[], release_delay integer DEFAULT 0) RETURNS TABLE(lock_token text, succeeded boolean, error text)
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
        PERFORM eventgrid._wake_receivers_at_commit(ARRAY[sid]);
    END IF;
    PERFORM eventgrid._queue_count(sid, 0, 0, cardinality(l.ids), 0, 0);
    RETURN QUERY SELECT * FROM eventgrid._lock_token_results(sid, lock_tokens, l.tokens, 'release');
END $$;

COMMENT ON FUNCTION eventgrid._release(topic text, subscription text, lock_tokens text[], release_delay integer) IS 'Internal: the body of eventgrid.release(), which checks the caller''s right and runs it as the extension''s owner.';

CREATE FUNCTION eventgrid._rename_published_column(rel regclass, recurse boolean, old_name text, new_name text) RETURNS void
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 UPDATE eventgrid.table_publications AS p SET columns = ( SELECT array_agg(c.c ORDER BY c.c) AS array_agg
            FROM unnest(array_replace(p.columns, _rename_published_column.old_name, _rename_published_column.new_name)) c(c)), update_columns = ( SELECT array_agg(c.c ORDER BY c.c) AS array_agg
            FROM unnest(array_replace(p.update_columns, _rename_published_column.old_name, _rename_published_column.new_name)) c(c)), shape = NULL::text, statements = NULL::jsonb
   WHERE ((((p.source_table)::oid = (_rename_published_column.rel)::oid) OR (_rename_published_column.recurse AND ((p.source_table)::oid IN ( SELECT t.t
            FROM eventgrid._table_tree(_rename_published_column.rel) t(t))))) AND ((_rename_published_column.old_name = ANY (p.columns)) OR (_rename_published_column.old_name = ANY (p.update_columns))));
END;

COMMENT ON FUNCTION eventgrid._rename_published_column(rel regclass, recurse boolean, old_name text, new_name text) IS 'Internal: follows ALTER TABLE ... RENAME COLUMN in the columns and update_columns of the publications of table rel (and of its partitions when recurse).';

CREATE FUNCTION eventgrid._renew_locks(topic text, subscription text, lock_tokens text[]) RETURNS TABLE(lock_token text, succeeded boolean, error text)
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
         WHERE q.id = ANY (eventgrid._queue_ids(sid, k.ids)) AND (q.id || ':' || q.lock_secret) = ANY (k.tokens)
           AND q.receivable_at > t_now
           AND q.received_at > t_now - interval '1 hour'
        RETURNING q.id || ':' || q.lock_secret AS tok
    )
    SELECT coalesce(array_agg(r.tok), '{}') INTO done FROM renewed r;
    RETURN QUERY SELECT * FROM eventgrid._lock_token_results(sid, lock_tokens, done, 'renew');
END $$;

COMMENT ON FUNCTION eventgrid._renew_locks(topic text, subscription text, lock_tokens text[]) IS 'Internal: the body of eventgrid.renew_locks(), which checks the caller''s right and runs it as the extension''s owner.';

CREATE FUNCTION eventgrid._replication_slots(OUT slot_name text, OUT active boolean, OUT active_pid integer, OUT lag_bytes numeric, OUT retained_bytes numeric, OUT replay_lag_seconds double precision) RETURNS SETOF record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT (r.slot_name)::text AS slot_name,
     r.active,
     r.active_pid,
         CASE
             WHEN (NOT pg_is_in_recovery()) THEN pg_wal_lsn_diff(pg_current_wal_lsn(), r.confirmed_flush_lsn)
             ELSE NULL::numeric
         END AS "case",
         CASE
             WHEN (NOT pg_is_in_recovery()) THEN pg_wal_lsn_diff(pg_current_wal_lsn(), r.restart_lsn)
             ELSE NULL::numeric
         END AS "case",
     COALESCE((EXTRACT(epoch FROM a.replay_lag))::double precision, (0)::double precision) AS "coalesce"
    FROM (pg_replication_slots r
      LEFT JOIN pg_stat_replication a ON ((a.pid = r.active_pid)))
   WHERE ((r.slot_type = 'logical'::text) AND (r.plugin = 'pgoutput'::name) AND (r.database = current_database()));
END;

COMMENT ON FUNCTION eventgrid._replication_slots(OUT slot_name text, OUT active boolean, OUT active_pid integer, OUT lag_bytes numeric, OUT retained_bytes numeric, OUT replay_lag_seconds double precision) IS 'Internal: the rows of the view eventgrid.replication_slots.';

CREATE TABLE eventgrid.replication_progress (
    source text NOT NULL,
    transactions bigint DEFAULT 0 NOT NULL,
    last_publish_time timestamp with time zone,
    last_applied_at timestamp with time zone
);

COMMENT ON TABLE eventgrid.replication_progress IS 'Internal: per logical replication subscription feeding eventgrid.events, the transactions applied, the publish time of the last applied transaction''s first event and when it was applied; the apply worker writes it at most once a second. Read through eventgrid.replication_sources.';

CREATE TABLE eventgrid.unknown_topic_events (
    source text NOT NULL,
    topic text NOT NULL,
    events bigint DEFAULT 0 NOT NULL,
    first_at timestamp with time zone DEFAULT now() NOT NULL,
    last_at timestamp with time zone DEFAULT now() NOT NULL
);

COMMENT ON TABLE eventgrid.unknown_topic_events IS 'Events logical replication brought for a topic this database does not have: per subscription (source) and topic, how many, first and last seen. They are kept in the event tables like unmatched events (no event subscription can take them) and never stop replication; create the topic (eventgrid.create_topic) with the input schema it has on the publishing server. README "Scaling out".';

CREATE FUNCTION eventgrid._replication_sources(OUT source text, OUT enabled boolean, OUT apply_pid integer, OUT transactions bigint, OUT last_publish_time timestamp with time zone, OUT last_applied_at timestamp with time zone, OUT apply_lag_seconds double precision, OUT received_lsn pg_lsn, OUT last_msg_receipt_time timestamp with time zone, OUT unknown_topic_events bigint) RETURNS SETOF record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT (s.subname)::text AS subname,
     s.subenabled,
     st.pid,
     COALESCE(p.transactions, (0)::bigint) AS "coalesce",
     p.last_publish_time,
     p.last_applied_at,
     COALESCE((EXTRACT(epoch FROM (p.last_applied_at - p.last_publish_time)))::double precision, (0)::double precision) AS "coalesce",
     st.received_lsn,
     st.last_msg_receipt_time,
     ( SELECT (COALESCE(sum(u.events), (0)::numeric))::bigint AS "coalesce"
            FROM eventgrid.unknown_topic_events u
           WHERE (u.source = s.subname)) AS "coalesce"
    FROM ((pg_subscription s
      LEFT JOIN pg_stat_subscription st ON (((st.subid = s.oid) AND (st.relid IS NULL))))
      LEFT JOIN eventgrid.replication_progress p ON ((p.source = s.subname)))
   WHERE (s.subdbid = ( SELECT d.oid
            FROM pg_database d
           WHERE (d.datname = current_database())));
END;

COMMENT ON FUNCTION eventgrid._replication_sources(OUT source text, OUT enabled boolean, OUT apply_pid integer, OUT transactions bigint, OUT last_publish_time timestamp with time zone, OUT last_applied_at timestamp with time zone, OUT apply_lag_seconds double precision, OUT received_lsn pg_lsn, OUT last_msg_receipt_time timestamp with time zone, OUT unknown_topic_events bigint) IS 'Internal: the rows of the view eventgrid.replication_sources.';

CREATE FUNCTION eventgrid._retry_policy_args(topic_type text, max_delivery_attempts integer, event_ttl integer, max_delivery_count integer, event_time_to_live text, OUT attempts integer, OUT ttl integer) RETURNS record
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

COMMENT ON FUNCTION eventgrid._retry_policy_args(topic_type text, max_delivery_attempts integer, event_ttl integer, max_delivery_count integer, event_time_to_live text, OUT attempts integer, OUT ttl integer) IS 'Internal: checks the retry policy arguments of a custom (max_delivery_attempts 1-30, event_ttl 1-1440 minutes) or namespace (max_delivery_count 1-10, event_time_to_live PT1M-P7D) subscription and returns attempts and minutes (NULL: not given); the other profile''s arguments are refused with 22023 and a hint.';

CREATE FUNCTION eventgrid._sas_token_check(token text, key1 text, key2 text, OUT resource text, OUT expiry text) RETURNS record
    LANGUAGE c STABLE
    AS 'MODULE_PATHNAME', 'eventgrid_sas_token_check';

COMMENT ON FUNCTION eventgrid._sas_token_check(token text, key1 text, key2 text, OUT resource text, OUT expiry text) IS 'Internal: when SAS token "r={resource}&e={expiry}&s={signature}" (each part percent-encoded) is signed with HMAC-SHA256 under key1 or key2 (base64, decoded), the resource and expiry it names, decoded; else NULLs. The caller checks them against the request''s path and the clock.';

CREATE FUNCTION eventgrid._secret_equal(a text, b text) RETURNS boolean
    LANGUAGE c IMMUTABLE STRICT
    AS 'MODULE_PATHNAME', 'eventgrid_secret_equal';

COMMENT ON FUNCTION eventgrid._secret_equal(a text, b text) IS 'Internal: whether two secrets are equal, compared in time that depends on their length only (CRYPTO_memcmp).';

CREATE FUNCTION eventgrid._served_databases(OUT database text, OUT state text, OUT delivery_workers integer, OUT upkeep_worker boolean, OUT delivery_wanted_at timestamp with time zone, OUT upkeep_wanted_at timestamp with time zone, OUT waiting_since timestamp with time zone, OUT held_by integer, OUT last_active timestamp with time zone) RETURNS SETOF record
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_served_databases';

COMMENT ON FUNCTION eventgrid._served_databases(OUT database text, OUT state text, OUT delivery_workers integer, OUT upkeep_worker boolean, OUT delivery_wanted_at timestamp with time zone, OUT upkeep_wanted_at timestamp with time zone, OUT waiting_since timestamp with time zone, OUT held_by integer, OUT last_active timestamp with time zone) IS 'Internal: the launcher''s view of every database it knows; read eventgrid.served_databases.';

CREATE FUNCTION eventgrid._set_delivery_authentication(topic text, subscription text, method text, token_endpoint text, tenant_id text, client_id text, client_secret text, scope text, audience text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, subscription, true);
BEGIN
    PERFORM eventgrid._check_credential_text('client_id', client_id, 500, true);
    PERFORM eventgrid._check_credential_text('client_secret', client_secret, 1000, true);
    PERFORM eventgrid._check_credential_text('scope', scope, 500, false);
    PERFORM eventgrid._check_credential_text('audience', audience, 500, false);
    IF EXISTS (SELECT 1 FROM eventgrid.delivery_properties p
                WHERE p.subscription_id = sid AND lower(p.header) = 'authorization') THEN
        RAISE EXCEPTION 'event subscription % of topic % has an Authorization delivery property',
                        eventgrid._quote(subscription), eventgrid._quote(topic)
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'The bearer token goes in the Authorization header; remove the property first with eventgrid.remove_delivery_property().';
    END IF;
    INSERT INTO eventgrid.delivery_authentications AS a
           (subscription_id, method, token_endpoint, tenant_id, client_id, client_secret, scope, audience)
    VALUES (sid, method, token_endpoint, tenant_id, client_id, client_secret, scope, audience)
    ON CONFLICT (subscription_id) DO UPDATE
       SET method = excluded.method, token_endpoint = excluded.token_endpoint, tenant_id = excluded.tenant_id,
           client_id = excluded.client_id, client_secret = excluded.client_secret, scope = excluded.scope,
           audience = excluded.audience, set_at = clock_timestamp();
END $$;

COMMENT ON FUNCTION eventgrid._set_delivery_authentication(topic text, subscription text, method text, token_endpoint text, tenant_id text, client_id text, client_secret text, scope text, audience text) IS 'Internal: checks and stores the delivery authentication of an event subscription for set_oauth2_authentication() and set_entra_authentication(); refuses (55000) one whose subscription has an Authorization delivery property.';

CREATE FUNCTION eventgrid._signing_secret_problem(secret text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    key bytea;
BEGIN
    IF secret IS NULL THEN
        RETURN NULL;
    END IF;
    IF left(secret, 6) <> 'whsec_' OR substr(secret, 7) !~ '^[A-Za-z0-9+/]+={0,2}$' THEN
        RETURN 'a signing secret is "whsec_" followed by base64';
    END IF;
    BEGIN
        key := decode(substr(secret, 7), 'base64');
    EXCEPTION WHEN OTHERS THEN
        RETURN 'the part after "whsec_" is not valid base64';
    END;
    IF length(key) NOT BETWEEN 24 AND 64 THEN
        RETURN format('the key must be 24 to 64 bytes, got %s', length(key));
    END IF;
    RETURN NULL;
END $_$;

COMMENT ON FUNCTION eventgrid._signing_secret_problem(secret text) IS 'Internal: NULL for a Standard Webhooks secret ("whsec_" and the base64 of a 24-64 byte key), else why not (never quoting it).';

CREATE FUNCTION eventgrid._start_ordering_keys(sids bigint[], key_hashes bigint[], ids bigint[], due timestamp with time zone) RETURNS integer
    LANGUAGE sql
    BEGIN ATOMIC
 WITH firsts AS (
          SELECT k.sid,
             k.h,
             min(k.id) AS id
            FROM UNNEST(_start_ordering_keys.sids, _start_ordering_keys.key_hashes, _start_ordering_keys.ids) k(sid, h, id)
           GROUP BY k.sid, k.h
         ), started AS (
          INSERT INTO eventgrid.ordering_keys AS k (subscription_id, ordering_key_hash, head_id)  SELECT f.sid,
                     f.h,
                     f.id
                    FROM firsts f
                   ORDER BY f.sid, f.h ON CONFLICT(subscription_id, ordering_key_hash) DO UPDATE SET head_id = k.head_id
           RETURNING k.head_id,
             (k.xmax = 0) AS started
         ), due_now AS (
          UPDATE eventgrid.retries AS r SET next_attempt_at = _start_ordering_keys.due
            FROM started
           WHERE (started.started AND (r.id = started.head_id))
           RETURNING 1 AS "?column?"
         )
  SELECT (count(*))::integer AS count
    FROM due_now;
END;

COMMENT ON FUNCTION eventgrid._start_ordering_keys(sids bigint[], key_hashes bigint[], ids bigint[], due timestamp with time zone) IS 'Internal: retries ids (subscription sids, key key_hashes) were just written waiting (next_attempt_at ''infinity''): of each key that had no head, the oldest becomes its head, due at due; returns how many. Locks the keys'' rows of eventgrid.ordering_keys, in order, as _promote_ordering_keys does.';

CREATE FUNCTION eventgrid._start_validation(sid bigint) RETURNS void
    LANGUAGE sql
    BEGIN ATOMIC
 INSERT INTO eventgrid.endpoint_validations AS v (subscription_id, state, code, started_at, next_try_at)
   VALUES (_start_validation.sid, 'Creating'::text, upper((gen_random_uuid())::text), eventgrid._now(), eventgrid._now()) ON CONFLICT(subscription_id) DO UPDATE SET state = 'Creating'::text, code = excluded.code, started_at = excluded.started_at, tries = 0, next_try_at = excluded.next_try_at, manual_since = NULL::timestamp with time zone, last_error = NULL::text, validated_at = NULL::timestamp with time zone;
END;

COMMENT ON FUNCTION eventgrid._start_validation(sid bigint) IS 'Internal: (re)starts the endpoint validation of an event subscription with a new random validation code: provisioning state Creating, the upkeep worker sends the handshake at once.';

CREATE FUNCTION eventgrid._stop_publishing_table_changes(caller regrole, source_table regclass, topic text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM eventgrid._check_not_null('source_table', source_table);
    PERFORM eventgrid._check_not_null('topic', topic);
    IF NOT has_table_privilege(caller, source_table, 'TRIGGER') THEN
        RAISE EXCEPTION 'permission denied to stop publishing the changes of table %', source_table
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('Stopping a publication needs the TRIGGER privilege on the table or its ownership: GRANT TRIGGER ON %s TO %I;',
                                source_table, caller);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM eventgrid.table_publications p
                    WHERE p.source_table = _stop_publishing_table_changes.source_table
                      AND p.topic = _stop_publishing_table_changes.topic) THEN
        RAISE EXCEPTION 'the changes of table % are not published to topic %', source_table, eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object', HINT = 'eventgrid.table_change_publications lists the publications.';
    END IF;
    PERFORM eventgrid._drop_table_change_triggers(source_table, topic);
    DELETE FROM eventgrid.table_publications p
     WHERE p.source_table = _stop_publishing_table_changes.source_table AND p.topic = _stop_publishing_table_changes.topic;
    -- partitions that have publications of their own to the topic keep them
END $$;

COMMENT ON FUNCTION eventgrid._stop_publishing_table_changes(caller regrole, source_table regclass, topic text) IS 'Internal: stop_publishing_table_changes() for role caller, the role current where it was called.';

CREATE FUNCTION eventgrid._storage_queue_sas(given text, OUT endpoint text, OUT sas text) RETURNS record
    LANGUAGE plpgsql IMMUTABLE STRICT
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    base text := split_part(given, '?', 1);
    params text[] := CASE WHEN strpos(given, '?') > 0
                          THEN string_to_array(substr(given, strpos(given, '?') + 1), '&') ELSE '{}' END;
    keep text[];
BEGIN
    keep := ARRAY(SELECT p FROM unnest(params) p WHERE p LIKE 'queueMessageTimeToLiveInSeconds=%');
    sas := nullif(array_to_string(ARRAY(SELECT p FROM unnest(params) p
                                         WHERE p NOT LIKE 'queueMessageTimeToLiveInSeconds=%' AND p <> ''), '&'), '');
    endpoint := base || CASE WHEN cardinality(keep) > 0 THEN '?' || array_to_string(keep, '&') ELSE '' END;
    IF sas IS NOT NULL AND sas !~ '(^|&)sig=' THEN
        RAISE EXCEPTION 'the StorageQueue endpoint''s query is not a SAS token (it has no sig parameter)'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Its query takes queueMessageTimeToLiveInSeconds=<seconds> and a SAS token (sv=...&sig=...); an account key goes through set_storage_account_key().';
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid._storage_queue_sas(given text, OUT endpoint text, OUT sas text) IS 'Internal: a StorageQueue endpoint as given (given), split into the endpoint to store (its queueMessageTimeToLiveInSeconds kept) and the SAS token (every other query parameter; 22023 without sig), which goes to destination_credentials.';

CREATE FUNCTION eventgrid._subscription_id(topic text, name text, lock boolean DEFAULT false) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint;
    base text := split_part(topic, '/', 1);
    dt text := CASE WHEN strpos(topic, '/') > 0 THEN substr(topic, strpos(topic, '/') + 1) END;
BEGIN
    PERFORM eventgrid._check_not_null('topic', topic);
    PERFORM eventgrid._check_not_null('event subscription name', name);
    -- 'domain/topic' names a subscription at domain-topic scope (SPEC 18)
    -- (IS NULL and = each by the unique index; IS NOT DISTINCT FROM would walk every subscription of the domain)
    IF dt IS NULL THEN
        SELECT s.id INTO sid FROM eventgrid.event_subscriptions s
         WHERE s.topic = base AND s.domain_topic IS NULL AND s.name = _subscription_id.name;
    ELSE
        SELECT s.id INTO sid FROM eventgrid.event_subscriptions s
         WHERE s.topic = base AND s.domain_topic = dt AND s.name = _subscription_id.name;
    END IF;
    IF lock AND sid IS NOT NULL THEN
        SELECT s.id INTO sid FROM eventgrid.event_subscriptions s WHERE s.id = sid FOR UPDATE;
    END IF;
    IF sid IS NULL THEN
        RAISE EXCEPTION 'event subscription % of topic % does not exist', eventgrid._quote(name), eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object',
                  HINT = 'List subscriptions with: SELECT topic, name FROM eventgrid.event_subscriptions;';
    END IF;
    RETURN sid;
END $$;

COMMENT ON FUNCTION eventgrid._subscription_id(topic text, name text, lock boolean) IS 'Internal: id of an event subscription (topic a topic, a domain, or ''domain/topic'') (optionally locked FOR UPDATE); raises 42704 when there is none.';

CREATE FUNCTION eventgrid._subscriptions_changed_at_commit() RETURNS void
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_subscriptions_changed_at_commit';

COMMENT ON FUNCTION eventgrid._subscriptions_changed_at_commit() IS 'Internal: when the current transaction commits, tells the delivery workers that event subscriptions were created, paused, resumed, updated or dropped (requests they claimed and did not start yet go back unsent; their status lines read the pauses again; their next claims look at every topic with events, README "Scale in subscriptions"), and wakes them; no-op without shared_preload_libraries.';

CREATE FUNCTION eventgrid._subscriptions_created() RETURNS trigger
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM eventgrid._subscriptions_changed_at_commit();
    RETURN NULL;
END $$;

COMMENT ON FUNCTION eventgrid._subscriptions_created() IS 'Internal: AFTER INSERT statement trigger on eventgrid.event_subscriptions: tells the workers at commit that the database has event subscriptions (commits that publish wake the delivery workers again).';

CREATE FUNCTION eventgrid._table_change_trigger() RETURNS trigger
    LANGUAGE c SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS 'MODULE_PATHNAME', 'eventgrid_table_change_trigger';

COMMENT ON FUNCTION eventgrid._table_change_trigger() IS 'Internal: AFTER ... FOR EACH STATEMENT trigger of a table change publication (argument: the topic), on the published table and on the partitions it covers; publishes one event per row of the statement''s transition tables (an UPDATE that changes none of update_columns: none), naming the published table, built in C and stored with its publish time and size. Each event at most 1 MB (54000). Refuses (42501) to run as any trigger publish_table_changes() did not make.';

CREATE FUNCTION eventgrid._table_change_trigger_name(topic text, operation text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN ((('eg_'::text || topic) || '_'::text) || lower(operation));

COMMENT ON FUNCTION eventgrid._table_change_trigger_name(topic text, operation text) IS 'Internal: name of the statement trigger that publishes a table''s changes of one operation (INSERT, UPDATE, DELETE) to a topic: eg_<topic>_<insert|update|delete>, at most 60 bytes.';

CREATE FUNCTION eventgrid._table_ddl() RETURNS event_trigger
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_table_ddl';

COMMENT ON FUNCTION eventgrid._table_ddl() IS 'Internal: ddl_command_end event trigger function: follows RENAME COLUMN and DROP COLUMN in the publications of table changes, and gives partitions created or attached below a published table its triggers (detached ones lose them).';

CREATE FUNCTION eventgrid._table_publication_of(rel regclass, topic text) RETURNS eventgrid.table_publications
    LANGUAGE sql STABLE
    BEGIN ATOMIC
 SELECT p.source_table,
     p.topic,
     p.operations,
     p.columns,
     p.update_columns,
     p.event_type_prefix,
     p.created_at,
     p.shape,
     p.statements
    FROM eventgrid.table_publications p,
     eventgrid._table_ancestry(_table_publication_of.rel) a(relid, depth)
   WHERE (((p.source_table)::oid = (a.relid)::oid) AND (p.topic = _table_publication_of.topic))
   ORDER BY a.depth
  LIMIT 1;
END;

COMMENT ON FUNCTION eventgrid._table_publication_of(rel regclass, topic text) IS 'Internal: the publication to topic that covers table rel: its own, or the nearest partitioned table''s above it.';

CREATE FUNCTION eventgrid._table_publications_changed() RETURNS trigger
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_table_publications_changed';

COMMENT ON FUNCTION eventgrid._table_publications_changed() IS 'Internal: AFTER INSERT, UPDATE, DELETE or TRUNCATE statement trigger on eventgrid.table_publications: what the table change triggers keep of their publications is looked up again (in this session at once, in the others once the transaction commits).';

CREATE TABLE eventgrid.topic_counters (
    topic text NOT NULL,
    unmatched bigint DEFAULT 0 NOT NULL,
    published bigint DEFAULT 0 NOT NULL
);

COMMENT ON TABLE eventgrid.topic_counters IS 'Running totals per topic: events that matched no event subscription.';

CREATE FUNCTION eventgrid._topic_metrics(OUT topic text, OUT publish_success_total bigint, OUT unmatched_events_total bigint) RETURNS SETOF record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT t.name AS topic,
     COALESCE(c.published, (0)::bigint) AS publish_success_total,
     COALESCE(c.unmatched, (0)::bigint) AS unmatched_events_total
    FROM (eventgrid.topics t
      LEFT JOIN eventgrid.topic_counters c ON ((c.topic = t.name)));
END;

COMMENT ON FUNCTION eventgrid._topic_metrics(OUT topic text, OUT publish_success_total bigint, OUT unmatched_events_total bigint) IS 'Internal: the rows of the view eventgrid.topic_metrics, for pg_monitor and eventgrid_admin.';

CREATE FUNCTION eventgrid._uncover_partitions(rel regclass) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    t record;
BEGIN
    -- triggers of ours below rel that no publication covers any more
    FOR t IN SELECT DISTINCT g.tgrelid::regclass AS rel, g.tgargs
               FROM pg_trigger g
              WHERE g.tgrelid IN (SELECT d.d FROM eventgrid._table_tree(rel) d(d))
                AND g.tgfoid = 'eventgrid._table_change_trigger()'::regprocedure AND g.tgnargs = 1 LOOP
        IF (eventgrid._table_publication_of(t.rel, convert_from(substr(t.tgargs, 1, length(t.tgargs) - 1), 'UTF8'))).source_table IS NULL THEN
            PERFORM eventgrid._drop_topic_triggers(t.rel, convert_from(substr(t.tgargs, 1, length(t.tgargs) - 1), 'UTF8'));
        END IF;
    END LOOP;
END $$;

COMMENT ON FUNCTION eventgrid._uncover_partitions(rel regclass) IS 'Internal: after rel was detached, drops from it and the partitions below it the triggers of publications that no longer cover them.';

CREATE FUNCTION eventgrid._uri_escape(value text) RETURNS text
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
    AS 'MODULE_PATHNAME', 'eventgrid_uri_escape';

COMMENT ON FUNCTION eventgrid._uri_escape(value text) IS 'Internal: value percent-encoded as one URI path segment (RFC 3986 unreserved characters kept), by libcurl.';

CREATE FUNCTION eventgrid._validate_event() RETURNS trigger
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_validate_event';

COMMENT ON FUNCTION eventgrid._validate_event() IS 'Internal: BEFORE INSERT row trigger on eventgrid.events; validates each event against its topic''s input schema and stamps it (SPEC 8).';

CREATE FUNCTION eventgrid._wake_at_commit() RETURNS trigger
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_wake_at_commit';

COMMENT ON FUNCTION eventgrid._wake_at_commit() IS 'Internal: AFTER INSERT statement trigger on eventgrid.events; when the publishing transaction commits, wakes (or starts) the delivery workers, unless the database has no event subscription, and tells the upkeep worker (SPEC 2).';

CREATE FUNCTION eventgrid._wake_receivers_at_commit() RETURNS void
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_wake_receivers_at_commit';

COMMENT ON FUNCTION eventgrid._wake_receivers_at_commit() IS 'Internal: wakes the consumers waiting in eventgrid.receive() for every queue event subscription of this database when the current transaction commits; no-op without shared_preload_libraries.';

CREATE FUNCTION eventgrid._wake_receivers_at_commit(subscription_ids bigint[]) RETURNS void
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_wake_receivers_at_commit';

COMMENT ON FUNCTION eventgrid._wake_receivers_at_commit(subscription_ids bigint[]) IS 'Internal: wakes the consumers waiting in eventgrid.receive() for these queue event subscriptions (NULL: every one of the database) when the current transaction commits; no-op without shared_preload_libraries.';

CREATE FUNCTION eventgrid._wake_worker_at_commit() RETURNS void
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_wake_worker_at_commit';

COMMENT ON FUNCTION eventgrid._wake_worker_at_commit() IS 'Internal: sets the delivery workers'' latches when the current transaction commits, and counts as a change to event subscriptions (their next claims look at every topic with events); called by configuration changes that give them work without publishing. No-op without shared_preload_libraries.';

CREATE FUNCTION eventgrid._wal_source_check_connection(connection text, owner_role oid) RETURNS text
    LANGUAGE c STRICT
    AS 'MODULE_PATHNAME', 'eventgrid_wal_source_check_connection';

COMMENT ON FUNCTION eventgrid._wal_source_check_connection(connection text, owner_role oid) IS 'Internal: checks a WAL source''s libpq connection string (it parses; for a role that is not a superuser, it carries a password, as postgres_fdw''s password_required) and returns it with the password masked as ********. Errors: 22023, 28000.';

CREATE FUNCTION eventgrid._wal_source_drop_slot(connection text, slot_name text, owner_role oid) RETURNS boolean
    LANGUAGE c STRICT
    AS 'MODULE_PATHNAME', 'eventgrid_wal_source_drop_slot';

COMMENT ON FUNCTION eventgrid._wal_source_drop_slot(connection text, slot_name text, owner_role oid) IS 'Internal: drops a WAL source''s replication slot on the source (waiting up to 10 s for its worker to let it go); true when it was dropped, false when there was none. A source of a role that is not a superuser is reached only with a password used, as its worker. Errors: 08001 the source cannot be reached, 28000 it did not ask for the password, 55006 the slot stays in use.';

CREATE FUNCTION eventgrid._wal_source_named(name text) RETURNS bigint
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint;
BEGIN
    PERFORM eventgrid._check_not_null('WAL source name', name);
    SELECT w.id INTO sid FROM eventgrid.wal_source_definitions w WHERE w.name = _wal_source_named.name;
    IF sid IS NULL THEN
        RAISE EXCEPTION 'WAL source "%" does not exist', name
            USING ERRCODE = 'undefined_object', HINT = 'The view eventgrid.wal_sources lists them.';
    END IF;
    RETURN sid;
END $$;

COMMENT ON FUNCTION eventgrid._wal_source_named(name text) IS 'Internal: the id of the WAL source of that name. Errors: 22004, 42704.';

CREATE FUNCTION eventgrid._wal_source_origin_lsn(source_id bigint) RETURNS pg_lsn
    LANGUAGE c STRICT
    AS 'MODULE_PATHNAME', 'eventgrid_wal_source_origin_lsn';

COMMENT ON FUNCTION eventgrid._wal_source_origin_lsn(source_id bigint) IS 'Internal: the source position whose events are committed here (the replication origin eventgrid_wal_source_<id>), or NULL before the first.';

CREATE FUNCTION eventgrid._wal_source_stop(source_id bigint, drop_origin boolean) RETURNS void
    LANGUAGE c STRICT
    AS 'MODULE_PATHNAME', 'eventgrid_wal_source_stop';

COMMENT ON FUNCTION eventgrid._wal_source_stop(source_id bigint, drop_origin boolean) IS 'Internal: stops the worker of a WAL source (waiting up to 10 s for it to go) and, with drop_origin, drops its replication origin.';

CREATE FUNCTION eventgrid._worker_pids(OUT worker text, OUT pid integer) RETURNS SETOF record
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_worker_pids';

COMMENT ON FUNCTION eventgrid._worker_pids(OUT worker text, OUT pid integer) IS 'Internal: each delivery worker and the upkeep worker with the pid in its shared-memory slot, NULL when it does not run. A worker sets its slot once its exit callback is registered and that callback clears it, so a pid here is a running process.';

CREATE FUNCTION eventgrid._worker_metrics(OUT delivery_workers_running integer, OUT upkeep_workers_running integer, OUT waiting_for_worker_slot_seconds double precision) RETURNS record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT (( SELECT count(w.pid) FILTER (WHERE (w.worker <> 'upkeep worker'::text)) AS count
            FROM eventgrid._worker_pids() w(worker, pid)))::integer AS count,
     (( SELECT count(w.pid) FILTER (WHERE (w.worker = 'upkeep worker'::text)) AS count
            FROM eventgrid._worker_pids() w(worker, pid)))::integer AS count,
     COALESCE(( SELECT (EXTRACT(epoch FROM (now() - d.waiting_since)))::double precision AS "extract"
            FROM eventgrid._served_databases() d(database, state, delivery_workers, upkeep_worker, delivery_wanted_at, upkeep_wanted_at, waiting_since, held_by, last_active)
           WHERE (d.database = current_database())), (0)::double precision) AS "coalesce";
END;

COMMENT ON FUNCTION eventgrid._worker_metrics(OUT delivery_workers_running integer, OUT upkeep_workers_running integer, OUT waiting_for_worker_slot_seconds double precision) IS 'Internal: the rows of the view eventgrid.worker_metrics, for pg_monitor and eventgrid_admin.';

CREATE FUNCTION eventgrid._worker_status(OUT worker text, OUT pid integer, OUT state text, OUT activity text, OUT state_since timestamp with time zone, OUT wait_event_type text, OUT wait_event text, OUT backend_start timestamp with time zone) RETURNS SETOF record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT w.worker,
     w.pid,
     a.state,
     a.query,
     a.state_change,
     a.wait_event_type,
     a.wait_event,
     a.backend_start
    FROM (eventgrid._worker_pids() w(worker, pid)
      LEFT JOIN pg_stat_activity a ON ((a.pid = w.pid)))
 UNION ALL
  SELECT ('logical replication apply worker of subscription '::text || r.source),
     r.apply_pid,
         CASE
             WHEN (r.apply_pid IS NULL) THEN NULL::text
             ELSE COALESCE(a.state, 'active'::text)
         END AS "coalesce",
         CASE
             WHEN (NOT r.enabled) THEN 'subscription disabled'::text
             WHEN (r.apply_pid IS NULL) THEN 'not running: the publishing server is unreachable or the last apply failed (see the server log)'::text
             ELSE format('applies events; last applied at %s, %s s after their publish'::text, r.last_applied_at, round((r.apply_lag_seconds)::numeric, 3))
         END AS format,
     a.state_change,
     a.wait_event_type,
     a.wait_event,
     a.backend_start
    FROM (eventgrid._replication_sources() r(source, enabled, apply_pid, transactions, last_publish_time, last_applied_at, apply_lag_seconds, received_lsn, last_msg_receipt_time, unknown_topic_events)
      LEFT JOIN pg_stat_activity a ON ((a.pid = r.apply_pid)));
END;

COMMENT ON FUNCTION eventgrid._worker_status(OUT worker text, OUT pid integer, OUT state text, OUT activity text, OUT state_since timestamp with time zone, OUT wait_event_type text, OUT wait_event text, OUT backend_start timestamp with time zone) IS 'Internal: each eventgrid worker with its pg_stat_activity state, status line and wait; read eventgrid.worker_status.';

CREATE FUNCTION eventgrid.acknowledge(topic text, subscription text, lock_tokens text[]) RETURNS TABLE(lock_token text, succeeded boolean, error text)
    LANGUAGE c
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS 'MODULE_PATHNAME', 'eventgrid_queue_settle';

COMMENT ON FUNCTION eventgrid.acknowledge(topic text, subscription text, lock_tokens text[]) IS 'Pull delivery (SPEC 14): the events whose locks lock_tokens (at most 1000, from receive()) name are delivered and leave the queue subscription. One row per token, in order: (lock_token, succeeded, error); a token that is malformed, unknown, expired or already settled fails only itself (error: InvalidLockToken or TokenLost, and why). Requires eventgrid_receiver or eventgrid_admin, or a grant_receive() for the subscription or its topic. Errors: 42501 no right to the subscription, 22004 NULL, 54000 over 1000 tokens, 42704, 42809.';

CREATE FUNCTION eventgrid.convert_event(event jsonb, from_schema text, to_schema text, publish_time timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS jsonb
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN CASE WHEN (from_schema = to_schema) THEN event WHEN ((from_schema = 'EventGridSchema'::text) AND (to_schema = 'CloudEventSchemaV1_0'::text)) THEN ((jsonb_build_object('specversion', '1.0', 'id', (event -> 'id'::text), 'source', (event -> 'topic'::text), 'subject', (event -> 'subject'::text), 'type', (event -> 'eventType'::text), 'time', (event -> 'eventTime'::text), 'datacontenttype', 'application/json') || CASE WHEN (event ? 'data'::text) THEN jsonb_build_object('data', (event -> 'data'::text)) ELSE '{}'::jsonb END) || CASE WHEN (COALESCE((event ->> 'dataVersion'::text), ''::text) <> ''::text) THEN jsonb_build_object('dataversion', (event -> 'dataVersion'::text)) ELSE '{}'::jsonb END) WHEN ((from_schema = 'CloudEventSchemaV1_0'::text) AND (to_schema = 'EventGridSchema'::text)) THEN jsonb_build_object('id', (event -> 'id'::text), 'topic', (event -> 'source'::text), 'subject', COALESCE((event -> 'subject'::text), '""'::jsonb), 'eventType', (event -> 'type'::text), 'eventTime', COALESCE((event -> 'time'::text), to_jsonb(eventgrid.rfc3339(publish_time))), 'data', COALESCE((event -> 'data'::text), 'null'::jsonb), 'dataVersion', COALESCE((event -> 'dataversion'::text), '""'::jsonb), 'metadataVersion', '1') ELSE NULL::jsonb END;

COMMENT ON FUNCTION eventgrid.convert_event(event jsonb, from_schema text, to_schema text, publish_time timestamp with time zone) IS 'Maps an event between delivery schemas (Event Grid schema <-> CloudEvents 1.0; identity when the schemas are equal; NULL for mappings Event Grid does not offer). publish_time supplies eventTime for CloudEvents without time.';

CREATE FUNCTION eventgrid.create_domain(name text, input_schema text DEFAULT 'EventGridSchema'::text, auto_create_topic_with_first_subscription boolean DEFAULT true, auto_delete_topic_with_last_subscription boolean DEFAULT true) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM eventgrid._check_not_null('domain name', name);
    PERFORM eventgrid._check_not_null('auto_create_topic_with_first_subscription', auto_create_topic_with_first_subscription);
    PERFORM eventgrid._check_not_null('auto_delete_topic_with_last_subscription', auto_delete_topic_with_last_subscription);
    IF input_schema = 'CustomEventSchema' THEN
        RAISE EXCEPTION 'a domain takes EventGridSchema or CloudEventSchemaV1_0 events, not CustomEventSchema'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Each event names its domain topic in "topic" (Event Grid schema) or "source" (CloudEvents).';
    END IF;
    IF EXISTS (SELECT 1 FROM eventgrid.domains d WHERE d.name = create_domain.name) THEN
        RAISE EXCEPTION 'domain "%" already exists', name USING ERRCODE = 'duplicate_object';
    END IF;
    -- a topic of the same name (the names are shared: 42710), the keys, counters and position
    PERFORM eventgrid.create_topic(name, input_schema);
    INSERT INTO eventgrid.domains (name, auto_create_topic_with_first_subscription, auto_delete_topic_with_last_subscription)
    VALUES (name, auto_create_topic_with_first_subscription, auto_delete_topic_with_last_subscription);
END $$;

COMMENT ON FUNCTION eventgrid.create_domain(name text, input_schema text, auto_create_topic_with_first_subscription boolean, auto_delete_topic_with_last_subscription boolean) IS 'Creates an event domain (SPEC 18): publishing to it (INSERT INTO eventgrid.events or publish() with its name, or over HTTP with its access keys) routes each event to the domain topic its "topic" (Event Grid schema) or "source" (CloudEvents) names. name: 3-50 letters, digits, hyphens, shared with the topics. input_schema: EventGridSchema (default) or CloudEventSchemaV1_0. auto_create_topic_with_first_subscription (true): a subscription on ''domain/topic'' creates the domain topic; auto_delete_topic_with_last_subscription (true): dropping its last subscription drops it. Requires eventgrid_admin. Errors: 22004 NULL, 42602 bad name, 22023 bad or custom schema, 42710 a domain or topic of that name exists. README "Event domains".';

CREATE FUNCTION eventgrid.create_domain_topic(domain text, name text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM eventgrid._domain_of(domain);
    PERFORM eventgrid._check_not_null('domain topic name', name);
    IF NOT eventgrid._is_topic_name(name) THEN
        RAISE EXCEPTION 'invalid domain topic name %', eventgrid._quote(name)
            USING ERRCODE = 'invalid_name',
                  HINT = 'A domain topic name has 3 to 50 characters: letters, digits and hyphens.';
    END IF;
    INSERT INTO eventgrid.domain_topic_entries (domain, name) VALUES (domain, name) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'domain topic "%" of domain "%" already exists', name, domain USING ERRCODE = 'duplicate_object';
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid.create_domain_topic(domain text, name text) IS 'Creates a domain topic of a domain (SPEC 18), for subscriptions on ''domain/name''. name: 3-50 letters, digits, hyphens. Events may name a domain topic that does not exist: they reach the domain-scope subscriptions only. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such domain, 42602 bad name, 42710 exists.';

CREATE FUNCTION eventgrid.create_event_publication(name text, topics text[] DEFAULT NULL::text[]) RETURNS void
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

COMMENT ON FUNCTION eventgrid.create_event_publication(name text, topics text[]) IS 'Creates the publication a delivery server subscribes to (README "Scaling out"): CREATE PUBLICATION name FOR TABLE eventgrid.events (id, topic, event, publish_time, event_bytes) [WHERE (topic IN (topics))] WITH (publish = ''insert'', publish_via_partition_root = true). topics: NULL for every topic, else the topics whose events this publication carries (row filter; for splitting topics across delivery servers). Needs the privileges of CREATE PUBLICATION (the owner of eventgrid.events: a superuser). Errors: 22004 NULL name, 22023 empty name or topics list, 42704 unknown topic; 42710 a publication of that name exists.';

CREATE FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text DEFAULT NULL::text, event_delivery_schema text DEFAULT NULL::text, included_event_types text[] DEFAULT NULL::text[], subject_begins_with text DEFAULT NULL::text, subject_ends_with text DEFAULT NULL::text, is_subject_case_sensitive boolean DEFAULT false, max_delivery_attempts integer DEFAULT NULL::integer, event_ttl integer DEFAULT NULL::integer, max_events_per_batch integer DEFAULT NULL::integer, preferred_batch_size_in_kilobytes integer DEFAULT NULL::integer, deadletter boolean DEFAULT false, advanced_filters jsonb DEFAULT NULL::jsonb, enable_advanced_filtering_on_arrays boolean DEFAULT false, max_delivery_count integer DEFAULT NULL::integer, event_time_to_live text DEFAULT NULL::text, max_events_per_second integer DEFAULT NULL::integer, endpoint_validation text DEFAULT 'none'::text, dead_letter_topic text DEFAULT NULL::text, ordering_key text DEFAULT NULL::text, delivery_mode text DEFAULT 'push'::text, receive_lock_duration integer DEFAULT NULL::integer, expiration_time timestamp with time zone DEFAULT NULL::timestamp with time zone, endpoint_type text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    in_schema text;
    ttype text;
    attempts integer;
    ttl integer;
    sid bigint;
    dt text;
    cred_user text;
    cred_password text;
    cred_kind text;
BEGIN
    PERFORM eventgrid._check_not_null('topic', topic);
    -- 'domain/topic': a subscription at domain-topic scope (SPEC 18)
    IF strpos(topic, '/') > 0 THEN
        dt := substr(topic, strpos(topic, '/') + 1);
        topic := split_part(topic, '/', 1);
    END IF;
    SELECT t.input_schema, t.topic_type INTO in_schema, ttype
      FROM eventgrid.topics t WHERE t.name = topic FOR KEY SHARE;
    IF in_schema IS NULL THEN
        RAISE EXCEPTION '% % does not exist', CASE WHEN dt IS NULL THEN 'topic' ELSE 'domain' END, eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object',
                  HINT = CASE WHEN dt IS NULL THEN 'Create it first with eventgrid.create_topic().'
                              ELSE 'Create it first with eventgrid.create_domain().' END;
    END IF;
    IF dt IS NOT NULL THEN
        PERFORM eventgrid._domain_topic_for_subscription(topic, dt);
    END IF;
    IF name IS NULL THEN
        RAISE EXCEPTION 'event subscription name must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM eventgrid._check_delivery_mode(delivery_mode, ttype, endpoint, receive_lock_duration,
        max_events_per_batch, preferred_batch_size_in_kilobytes, max_events_per_second, endpoint_validation,
        ordering_key);
    IF delivery_mode = 'queue' THEN
        receive_lock_duration := coalesce(receive_lock_duration, 60);
        PERFORM eventgrid._check_no_endpoint_type(endpoint_type, name, topic);
    ELSE
        endpoint_type := coalesce(endpoint_type, 'WebHook');
        -- a Redis or RabbitMQ password or a SAS token goes where secrets go, not into the stored endpoint
        IF endpoint_type IN ('RedisStream', 'RabbitMQ') THEN
            SELECT c.endpoint, c.user_name, c.password, 'password' INTO endpoint, cred_user, cred_password, cred_kind
              FROM eventgrid._endpoint_credentials(endpoint) c;
        ELSIF endpoint_type = 'StorageQueue' THEN
            SELECT c.endpoint, c.sas, 'sas' INTO endpoint, cred_password, cred_kind
              FROM eventgrid._storage_queue_sas(endpoint) c;
        END IF;
        PERFORM eventgrid._check_endpoint_type(endpoint_type, endpoint, endpoint_validation);
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
    PERFORM eventgrid._check_endpoint_key(endpoint, ordering_key);
    expiration_time := eventgrid._expiration_time_arg(expiration_time);
    IF EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s
                WHERE s.topic = create_event_subscription.topic AND s.name = create_event_subscription.name
                  AND s.domain_topic IS NULL AND dt IS NULL)
       OR EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s
                   WHERE s.topic = create_event_subscription.topic AND s.name = create_event_subscription.name
                     AND s.domain_topic = dt) THEN
        RAISE EXCEPTION 'event subscription "%" already exists for topic "%"', name,
                        topic || coalesce('/' || dt, '')
            USING ERRCODE = 'duplicate_object';
    END IF;
    INSERT INTO eventgrid.event_subscriptions AS s
        (topic, name, endpoint, event_delivery_schema, included_event_types, subject_begins_with,
         subject_ends_with, is_subject_case_sensitive, max_delivery_attempts, event_ttl,
         max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter, topic_type,
         advanced_filters, enable_advanced_filtering_on_arrays, max_events_per_second, dead_letter_topic, ordering_key,
         delivery_mode, receive_lock_duration, expiration_time, domain_topic, endpoint_type)
    VALUES (topic, name, endpoint, event_delivery_schema, included_event_types, subject_begins_with,
            subject_ends_with, is_subject_case_sensitive, coalesce(attempts, CASE ttype WHEN 'namespace' THEN 10 ELSE 30 END),
            coalesce(ttl, CASE ttype WHEN 'namespace' THEN 10080 ELSE 1440 END),
            max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter, ttype,
            advanced_filters, enable_advanced_filtering_on_arrays, max_events_per_second, dead_letter_topic, ordering_key,
            delivery_mode, receive_lock_duration, expiration_time, dt, coalesce(endpoint_type, 'WebHook'))
    RETURNING s.id INTO sid;
    INSERT INTO eventgrid.subscription_counters (subscription_id) VALUES (sid);
    IF cred_password IS NOT NULL THEN
        INSERT INTO eventgrid.destination_credentials (subscription_id, kind, user_name, secret)
        VALUES (sid, cred_kind, cred_user, cred_password);
    END IF;
    -- events of transactions that commit after this one's snapshot are for it.  The upkeep worker
    -- cannot see this position before it commits: were an event table emptied meanwhile, the events
    -- of a transaction in progress at the snapshot that committed since would be lost to it.  So the
    -- event tables are locked first (ACCESS SHARE, until this transaction ends: the rotation's
    -- TRUNCATE takes its lock only if it is free), and the snapshot taken after the lock.  A
    -- REPEATABLE READ or SERIALIZABLE transaction took its snapshot earlier: if a table was emptied
    -- since (a new relfilenode, which pg_class as of the snapshot does not have yet), it is refused
    LOCK TABLE eventgrid.events IN ACCESS SHARE MODE;
    IF current_setting('transaction_isolation') <> 'read committed'
       AND EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                    WHERE i.inhparent = 'eventgrid.events'::regclass
                      AND c.relfilenode IS DISTINCT FROM pg_relation_filenode(c.oid)) THEN
        RAISE EXCEPTION 'an event table was emptied after this transaction''s snapshot was taken'
            USING ERRCODE = 'serialization_failure',
                  DETAIL = 'The new event subscription is owed the events of the transactions in progress at the snapshot; some may be gone.',
                  HINT = 'Retry the transaction, or create the event subscription in a READ COMMITTED transaction.';
    END IF;
    INSERT INTO eventgrid.subscription_positions (subscription_id, since, done)
    VALUES (sid, pg_current_snapshot(), pg_current_snapshot());
    PERFORM eventgrid._subscriptions_changed_at_commit();
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

COMMENT ON FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text, ordering_key text, delivery_mode text, receive_lock_duration integer, expiration_time timestamp with time zone, endpoint_type text) IS 'Creates an event subscription and returns its id. topic: a topic, a domain (domain scope: every domain topic''s events) or ''domain/topic'' (domain-topic scope: that domain topic''s events; created with it when the domain creates topics with their first subscription, else 42704; SPEC 18); names are unique per topic, domain or domain topic. endpoint (push): for endpoint_type WebHook (the default) an http(s) URL that libcurl parses, with a host, at most 2048 bytes (no user name or password); for RedisStream redis[s]://[[user]:password@]host[:port][/db]?stream=<key>[&maxlen=N][&mkstream=false] (rediss: TLS, where this builds hiredis has it; stream_from=subject or ordering_key instead of stream: each event''s subject or ordering key names its stream, ordering_key needing the subscription''s ordering_key (22023); SPEC 21; the user name and password are stored apart, readable by the extension''s owner only; see README, Redis streams). event_delivery_schema: defaults to the topic''s input schema (namespace topics: CloudEvents only). Filters: included_event_types (case-insensitive), subject_begins_with / subject_ends_with (case-insensitive unless is_subject_case_sensitive), advanced_filters (Event Grid JSON, see set_advanced_filters) with enable_advanced_filtering_on_arrays (false). Retry policy of a custom topic: max_delivery_attempts 1-30 (30), event_ttl 1-1440 minutes (1440); of a namespace topic: max_delivery_count 1-10 (10), event_time_to_live ISO 8601 PT1M-P7D (P7D); the other profile''s arguments are refused. max_events_per_batch 1-5000, preferred_batch_size_in_kilobytes 1-1024 (either turns batching on), deadletter (false). max_events_per_second 1-100,000 (NULL: no rate limit; a batch counts its events, retries count; events over the rate wait in the queue). endpoint_validation: none (default) or handshake (Event Grid''s SubscriptionValidationEvent, or for CloudEvents the webhook OPTIONS request; nothing is delivered until the endpoint is validated, see event_subscription_validation). dead_letter_topic: a topic (of this database) to which each event this subscription dead-letters or drops is published as a notification, in the transaction that records it (see README, Dead-letter notifications; NULL: none). ordering_key: a dotted field path (1-512 characters, as a dynamic delivery property''s source_field: subject, data.orderId, partitionkey) whose value (string, number or boolean) is each event''s key: events of one key are delivered in publish order, one request at a time across all delivery workers, the next only once the one before is delivered, dead-lettered or dropped; events without it go unordered (NULL: unordered; see README, Ordered delivery). delivery_mode: push (default: delivered to endpoint) or queue (pull delivery, namespace topics only: no endpoint, batching, rate limit, endpoint validation or ordering_key; consumers call receive(), see README, Pull delivery); receive_lock_duration: of a queue subscription, seconds 60-300 (60) a received event stays locked. expiration_time: when the event subscription expires (NULL or ''infinity'': never; else it must be in the future of the real clock): from then on nothing more is delivered or received for it, and the upkeep worker drops it as drop_event_subscription() would (its dead letters are kept; see README, Expiration). endpoint_type: WebHook (default), RedisStream (each event XADDed to a Redis stream; no endpoint validation, batching or bearer tokens: see README, Redis streams) or StorageQueue (endpoint: the queue''s URL, https://<account>.queue.core.windows.net/<queue> or path-style http://127.0.0.1:10001/<account>/<queue>, queueMessageTimeToLiveInSeconds and a SAS token as its query, the token stored apart; each event a message, base64 JSON; an account key through set_storage_account_key(), or a Microsoft Entra ID bearer token; see README, Storage queues); RabbitMQ (endpoint amqp[s]://[user:password@]host[:port][/vhost]?exchange=<name>&routing_key=<key>, or routing_key_from=subject or ordering_key for each event''s subject or ordering key as its routing key (ordering_key: only with the subscription''s ordering_key, 22023; an event without a key is not sent, InvalidHeader), the user name and password stored apart; each event, or each batch as a JSON array, a persistent message published mandatory and delivered once the broker confirms it: see README, RabbitMQ); a queue subscription takes none (22023). Requires eventgrid_admin. Errors: 42704 (also no such dead_letter_topic), 42602, 22023, 22003, 22004, 54000, 42710, 40001 (a REPEATABLE READ or SERIALIZABLE transaction whose snapshot an event table''s emptying followed: retry it). SPEC 1, 4, 5, 7, 9, 13, 14, 17, 18, 21.';

CREATE FUNCTION eventgrid.create_topic(name text, input_schema text DEFAULT 'EventGridSchema'::text, topic_type text DEFAULT 'custom'::text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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
    INSERT INTO eventgrid.topic_access_keys (topic) VALUES (name);
END $$;

COMMENT ON FUNCTION eventgrid.create_topic(name text, input_schema text, topic_type text) IS 'Creates a topic, with two new access keys for HTTP publishers (eventgrid.topic_keys). name: 3-50 letters, digits, hyphens. input_schema: EventGridSchema (default), CloudEventSchemaV1_0 or CustomEventSchema. topic_type: custom (default; the topic delivery profile) or namespace (CloudEvents 1.0 only; its subscriptions get the namespace delivery profile). Requires eventgrid_admin. Errors: 22004 NULL, 42602 bad name, 22023 bad schema or type, 42710 exists. SPEC 1.';

CREATE FUNCTION eventgrid.create_wal_source(name text, connection text, publication text, slot_name text DEFAULT NULL::text, message_prefix text DEFAULT 'eventgrid'::text, backfill boolean DEFAULT false) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    sid bigint;
    slot text := coalesce(slot_name, 'eventgrid_' || lower(replace(name, '-', '_')));
BEGIN
    PERFORM eventgrid._check_not_null('WAL source name', name);
    PERFORM eventgrid._check_not_null('connection', connection);
    PERFORM eventgrid._check_not_null('publication', publication);
    PERFORM eventgrid._check_not_null('message_prefix', message_prefix);
    PERFORM eventgrid._check_not_null('backfill', backfill);
    IF NOT eventgrid._is_topic_name(name) THEN  -- the same shape as a topic's name
        RAISE EXCEPTION 'invalid WAL source name %', eventgrid._quote(name)
            USING ERRCODE = 'invalid_name',
                  HINT = 'A WAL source name has 3 to 50 characters: letters, digits and hyphens.';
    END IF;
    IF publication = '' OR length(publication) > 63 THEN
        RAISE EXCEPTION 'publication must be 1 to 63 characters, got %', eventgrid._quote(publication)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'The name of a publication of the source database.';
    END IF;
    IF slot !~ '^[a-z0-9_]{1,63}$' THEN
        RAISE EXCEPTION 'invalid slot_name %', eventgrid._quote(slot)
            USING ERRCODE = 'invalid_name',
                  HINT = 'A replication slot name has 1 to 63 lower-case letters, digits and underscores.';
    END IF;
    IF message_prefix = '' OR length(message_prefix) > 200 THEN
        RAISE EXCEPTION 'message_prefix must be 1 to 200 characters, got %', eventgrid._quote(message_prefix)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The prefix of pg_logical_emit_message() taken as events (default eventgrid).';
    END IF;
    IF EXISTS (SELECT 1 FROM eventgrid.wal_source_definitions w WHERE w.name = create_wal_source.name) THEN
        RAISE EXCEPTION 'WAL source "%" already exists', name USING ERRCODE = 'duplicate_object';
    END IF;
    IF EXISTS (SELECT 1 FROM eventgrid.wal_source_definitions w WHERE w.slot_name = slot
                  AND w.connection = create_wal_source.connection) THEN
        RAISE EXCEPTION 'WAL source of slot "%" on that connection already exists', slot
            USING ERRCODE = 'duplicate_object', HINT = 'Give each WAL source of one source database a slot of its own.';
    END IF;
    -- the role that called (SET ROLE's, else the session's): a superuser's may use any authentication
    PERFORM eventgrid._wal_source_check_connection(connection, eventgrid._caller()::text::regrole::oid);
    INSERT INTO eventgrid.wal_source_definitions (name, connection, publication, slot_name, message_prefix, owner_role, backfill)
    VALUES (name, connection, publication, slot, message_prefix, eventgrid._caller()::text::regrole::oid, backfill)
    RETURNING id INTO sid;
    INSERT INTO eventgrid.wal_source_status (source_id) VALUES (sid);
    PERFORM eventgrid._wake_worker_at_commit();
    RETURN sid;
END $_$;

COMMENT ON FUNCTION eventgrid.create_wal_source(name text, connection text, publication text, slot_name text, message_prefix text, backfill boolean) IS 'Creates a WAL source: a background worker of this server reads the source database''s write-ahead log through the logical replication slot slot_name (default eventgrid_<name>, hyphens as underscores; created with pgoutput if missing, else resumed) for publication, and publishes the pg_logical_emit_message(true, message_prefix, ''{"topic": ..., "events": [...]}'') messages and the changes of the tables mapped with publish_table_changes(..., source => name). name: 3-50 letters, digits and hyphens. connection: a libpq connection string to the source (PostgreSQL 14 or later, with wal_level = logical, a role with REPLICATION); for a role that is not a superuser it must hold a password. Mappings made in the same transaction are in place before it first reads; with backfill, every row their tables hold is published first (<prefix>.Backfilled events, data.operation BACKFILL), as of the snapshot the slot is made at: each row is in the backfill or in a later change (state backfilling, progress in wal_sources.backfilled_rows; a restart goes on after the last row published). Returns its id. Requires eventgrid_admin. Errors: 22004 NULL, 42602 name or slot_name, 22023, 42710 exists, 28000 no password. SPEC 19.';

CREATE FUNCTION eventgrid.delivery_outcome(http_status integer) RETURNS text
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
    AS 'MODULE_PATHNAME', 'eventgrid_delivery_outcome';

COMMENT ON FUNCTION eventgrid.delivery_outcome(http_status integer) IS 'lastDeliveryOutcome name recorded for an HTTP status: Delivered (200-204), BadRequest (400), Unauthorized (401), Forbidden (403), NotFound (404), TimedOut (408), PayloadTooLarge (413), Busy (429, 503), GenericError (anything else). Errors: 22003 status outside 100-599. SPEC 3.';

CREATE FUNCTION eventgrid.drop_domain(name text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM eventgrid._domain_of(name);
    -- as drop_topic() drops a topic: its subscriptions (every scope), their retries and positions,
    -- its domain topics (ON DELETE CASCADE); dead letters are kept
    PERFORM eventgrid._drop_topic(name);
END $$;

COMMENT ON FUNCTION eventgrid.drop_domain(name text) IS 'Drops an event domain with its domain topics and every subscription of it (domain and domain-topic scope), their pending deliveries and retries (SPEC 18). Dead letters are kept. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such domain.';

CREATE FUNCTION eventgrid.drop_domain_topic(domain text, name text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sids bigint[];
BEGIN
    PERFORM eventgrid._domain_of(domain);
    PERFORM eventgrid._check_not_null('domain topic name', name);
    IF NOT EXISTS (SELECT 1 FROM eventgrid.domain_topic_entries e
                    WHERE e.domain = drop_domain_topic.domain AND e.name = drop_domain_topic.name FOR UPDATE) THEN
        RAISE EXCEPTION 'domain topic % of domain % does not exist', eventgrid._quote(name), eventgrid._quote(domain)
            USING ERRCODE = 'undefined_object',
                  HINT = 'List them with: SELECT domain_topic FROM eventgrid.domain_topics WHERE domain = ...;';
    END IF;
    -- the subscriptions first (the delivery worker's lock order), then their retries
    SELECT array_agg(s.id ORDER BY s.id) INTO sids
      FROM (SELECT s.id FROM eventgrid.event_subscriptions s
             WHERE s.topic = drop_domain_topic.domain AND s.domain_topic = drop_domain_topic.name
             ORDER BY s.id FOR UPDATE) s;
    DELETE FROM eventgrid.retries r WHERE r.subscription_id = ANY (sids);
    DELETE FROM eventgrid.event_subscriptions s WHERE s.id = ANY (sids);
    DELETE FROM eventgrid.domain_topic_entries e WHERE e.domain = drop_domain_topic.domain AND e.name = drop_domain_topic.name;
    IF sids IS NOT NULL THEN
        PERFORM eventgrid._subscriptions_changed_at_commit();
        PERFORM eventgrid._wake_receivers_at_commit(sids);
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid.drop_domain_topic(domain text, name text) IS 'Drops a domain topic with its subscriptions, their pending deliveries and retries (SPEC 18); events naming it still reach the domain-scope subscriptions. Dead letters are kept. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such domain or domain topic.';

CREATE FUNCTION eventgrid.drop_event_subscription(topic text, name text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint;
    s eventgrid.event_subscriptions;
BEGIN
    -- the subscription first (the delivery worker's lock order), then its retries;
    -- its position and counters go with it (ON DELETE CASCADE)
    sid := eventgrid._subscription_id(topic, name, true);
    SELECT * INTO s FROM eventgrid.event_subscriptions x WHERE x.id = sid;
    DELETE FROM eventgrid.retries r WHERE r.subscription_id = sid;
    DELETE FROM eventgrid.event_subscriptions x WHERE x.id = sid;
    -- the last subscription of a domain topic takes it along, unless its domain says otherwise (SPEC 18)
    IF s.domain_topic IS NOT NULL
       AND EXISTS (SELECT 1 FROM eventgrid.domains d
                    WHERE d.name = s.topic AND d.auto_delete_topic_with_last_subscription)
       AND NOT EXISTS (SELECT 1 FROM eventgrid.event_subscriptions x
                        WHERE x.topic = s.topic AND x.domain_topic = s.domain_topic) THEN
        DELETE FROM eventgrid.domain_topic_entries e WHERE e.domain = s.topic AND e.name = s.domain_topic;
    END IF;
    -- its requests claimed and not sent yet are not sent; its waiting consumers are told
    PERFORM eventgrid._subscriptions_changed_at_commit();
    PERFORM eventgrid._wake_receivers_at_commit(ARRAY[sid]);
END $$;

COMMENT ON FUNCTION eventgrid.drop_event_subscription(topic text, name text) IS 'Drops an event subscription with its pending deliveries and retries. Dead letters are kept. topic may be ''domain/topic'': the last subscription of a domain topic drops it when its domain auto-deletes topics (SPEC 18). Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription.';

CREATE FUNCTION eventgrid.drop_topic(name text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM eventgrid.domains d WHERE d.name = drop_topic.name) THEN
        RAISE EXCEPTION '% is a domain, not a topic', eventgrid._quote(name)
            USING ERRCODE = 'wrong_object_type', HINT = 'Drop it with eventgrid.drop_domain().';
    END IF;
    PERFORM eventgrid._drop_topic(name);
END $$;

COMMENT ON FUNCTION eventgrid.drop_topic(name text) IS 'Drops a topic with its event subscriptions and their pending deliveries and retries, and stops the publications of table changes to it. Dead letters are kept. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such topic, 42809 a domain (drop_domain() drops those).';

CREATE FUNCTION eventgrid.drop_wal_source(name text, drop_slot boolean DEFAULT true) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    w eventgrid.wal_source_definitions;
BEGIN
    PERFORM eventgrid._check_not_null('drop_slot', drop_slot);
    SELECT * INTO w FROM eventgrid.wal_source_definitions d
     WHERE d.id = eventgrid._wal_source_named(drop_wal_source.name) FOR UPDATE;
    DELETE FROM eventgrid.wal_source_definitions d WHERE d.id = w.id;
    PERFORM eventgrid._wal_source_stop(w.id, true);
    IF drop_slot THEN
        PERFORM eventgrid._wal_source_drop_slot(w.connection, w.slot_name, w.owner_role);
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid.drop_wal_source(name text, drop_slot boolean) IS 'Drops a WAL source: its worker stops, its table mappings and its position here go, and with drop_slot (the default) its replication slot is dropped on the source, so that the source keeps no WAL for it. The slot is dropped before this transaction commits: a rollback keeps the source, which then makes a new slot and reads from there. Requires eventgrid_admin. Errors: 22004, 42704 no such source, 08001 the source cannot be reached, 28000 a source of a role that is not a superuser did not ask for the password (drop_slot => false drops the source here alone). SPEC 19.';

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

COMMENT ON FUNCTION eventgrid.grant_event_replication(role_name name) IS 'Grants the role a delivery server subscribes with (CREATE SUBSCRIPTION ... CONNECTION ''... user=<role>'') what it needs in this database: CONNECT on it and SELECT on eventgrid.events, which the initial copy reads; warns when the role lacks LOGIN or REPLICATION (role attributes a superuser gives with ALTER ROLE). README "Scaling out". Errors: 22004 NULL, 42704 no such role. Needs the right to grant on eventgrid.events (its owner: a superuser).';

CREATE FUNCTION eventgrid.grant_receive(topic text, subscription text, role_name text) RETURNS void
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

COMMENT ON FUNCTION eventgrid.grant_receive(topic text, subscription text, role_name text) IS 'Pull delivery rights for one queue (SPEC 14, as Event Grid''s Data Receiver role scoped to a subscription or a topic): role role_name (and its members) may call receive(), acknowledge(), release(), reject() and renew_locks() on queue event subscription subscription of topic (NULL: on every queue event subscription of the topic, present and future), without being a member of eventgrid_receiver; elsewhere they get 42501. Granting what is granted does nothing; logged once. The grant goes with its subscription or topic and follows the role itself: renamed, the role keeps it; dropped, it goes; a new role of the same name gets nothing. Dumped and restored by the role''s name. Shown in event_subscription_receivers. Requires eventgrid_admin. Errors: 22004 NULL topic or role_name, 42704 no such topic, subscription or role, 42809 a push subscription.';

CREATE FUNCTION eventgrid.pause_delivery(topic text DEFAULT NULL::text, subscription text DEFAULT NULL::text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    t record := eventgrid._pause_target(topic, subscription);
BEGIN
    INSERT INTO eventgrid.delivery_pauses (topic, subscription_id, paused_by)
    VALUES (t.target_topic, t.target_sid, eventgrid._caller())
    ON CONFLICT ON CONSTRAINT delivery_pauses_topic_subscription_id_key DO NOTHING;
    IF FOUND THEN
        PERFORM eventgrid._log(format('eventgrid: delivery paused for %s by %s', t.label, eventgrid._caller()));
        -- requests claimed and not sent yet go back; the workers' status lines say so
        PERFORM eventgrid._subscriptions_changed_at_commit();
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid.pause_delivery(topic text, subscription text) IS 'Pauses delivery: both NULL everything (as the GUC eventgrid.delivery_paused, which stays), a topic its event subscriptions, a subscription itself. The delivery workers claim nothing more for it: its events wait at its position and its retries stay due (nothing is lost; time-to-live runs); requests already sent finish. Pausing what is paused does nothing. Logged once. Shown in delivery_statistics.paused. Requires eventgrid_admin. Errors: 22004 a subscription without its topic, 42704 no such topic or subscription.';

CREATE FUNCTION eventgrid.pause_wal_source(name text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._wal_source_named(name);
BEGIN
    UPDATE eventgrid.wal_source_definitions d SET paused = true WHERE d.id = sid;
    UPDATE eventgrid.wal_source_status s SET state = 'paused', updated_at = now() WHERE s.source_id = sid;
    PERFORM eventgrid._wal_source_stop(sid, false);
END $$;

COMMENT ON FUNCTION eventgrid.pause_wal_source(name text) IS 'Pauses a WAL source: its worker stops reading (the slot keeps the source''s WAL from then on: watch its size). Requires eventgrid_admin. Errors: 22004, 42704. SPEC 19.';

CREATE FUNCTION eventgrid.probation_duration(outcome text, probation integer DEFAULT 1) RETURNS interval
    LANGUAGE c IMMUTABLE PARALLEL SAFE
    AS 'MODULE_PATHNAME', 'eventgrid_probation_duration';

COMMENT ON FUNCTION eventgrid.probation_duration(outcome text, probation integer) IS 'How long an endpoint stays on probation when a failure with lastDeliveryOutcome outcome puts it there for the probation-th time in a row (1-1000, default 1): Busy and TimedOut 10 s, SocketError 30 s, NotFound, ResolutionError, Unauthorized, Forbidden, Disabled and Full 5 min, any other failure 10 s; each further probation in a row twice the one before, at most 4 hours. NULL for Delivered, BadRequest, PayloadTooLarge and Probation, which do not count against an endpoint. Errors: 22023 unknown outcome name, 22003 probation outside 1-1000. SPEC 6.';

CREATE FUNCTION eventgrid.publish(topic text, events jsonb) RETURNS bigint[]
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

COMMENT ON FUNCTION eventgrid.publish(topic text, events jsonb) IS 'Publishes one event (a JSON object) or a JSON array of events to a topic; returns the ids the events were stored under (eventgrid.events.id), in the order given. At most 5000 events and 1 MB (1048576 bytes: the events'' JSON text, without the array''s brackets and separators) per call; each event is validated as for INSERT INTO eventgrid.events. Requires eventgrid_publisher. Errors: 22004 NULL, 42501 not a publisher, 22023, 54000, 42704. SPEC 2, 8.';

CREATE FUNCTION eventgrid.publish_table_changes(source_table regclass, topic text, operations text[] DEFAULT ARRAY['INSERT'::text, 'UPDATE'::text, 'DELETE'::text], columns text[] DEFAULT NULL::text[], update_columns text[] DEFAULT NULL::text[], event_type_prefix text DEFAULT NULL::text) RETURNS void
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_publish_table_changes';

COMMENT ON FUNCTION eventgrid.publish_table_changes(source_table regclass, topic text, operations text[], columns text[], update_columns text[], event_type_prefix text) IS 'Publishes the changes of a table to a topic: every row an INSERT, UPDATE or DELETE on it changes becomes one event, in the changing transaction (statement triggers with transition tables; COPY and INSERT ... ON CONFLICT included; TRUNCATE publishes nothing). A partitioned table''s publication covers its partitions, also those created or attached later, and writes that name a partition. operations: any of INSERT, UPDATE, DELETE (all three). columns: the columns an event carries (NULL: all). update_columns: an UPDATE publishes a row only when one of these changed (NULL: when any column changed). Renamed columns are followed; dropped ones leave the lists. event_type_prefix: 1-200 characters (NULL: <schema>.<table>); event types <prefix>.Inserted, .Updated, .Deleted. Called again for the same table and topic it replaces the settings. The role current at the call (not the session user) needs eventgrid_admin, TRIGGER on the table (or owning it) and SELECT on the columns carried and compared; tables of schema eventgrid are refused, and so is a call during a security-restricted operation (an index expression, ANALYZE). Errors: 22004 NULL, 42704 no such topic, 22023, 42809 not a table, 42501, 42703.';

CREATE FUNCTION eventgrid.publish_table_changes(table_name text, topic text, source text, operations text[] DEFAULT ARRAY['INSERT'::text, 'UPDATE'::text, 'DELETE'::text], columns text[] DEFAULT NULL::text[], update_columns text[] DEFAULT NULL::text[], event_type_prefix text DEFAULT NULL::text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
DECLARE
    sid bigint := eventgrid._wal_source_named(source);
    ops text[];
BEGIN
    PERFORM eventgrid._check_not_null('table_name', table_name);
    PERFORM eventgrid._check_not_null('topic', topic);
    PERFORM eventgrid._check_not_null('operations', operations);
    IF table_name !~ '^[^.]+\.[^.]+$' OR length(table_name) > 127 THEN
        RAISE EXCEPTION 'table_name must be schema.table as the source names it, got %', eventgrid._quote(table_name)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'For example public.orders (names as they are, unquoted).';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = publish_table_changes.topic FOR KEY SHARE) THEN
        RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object', HINT = 'Create it first with eventgrid.create_topic().';
    END IF;
    IF EXISTS (SELECT 1 FROM eventgrid.domains d WHERE d.name = publish_table_changes.topic) THEN
        RAISE EXCEPTION '% is an event domain: table changes are published to a topic', eventgrid._quote(topic)
            USING ERRCODE = 'wrong_object_type', HINT = 'Publish them to a topic of their own (eventgrid.create_topic()).';
    END IF;
    SELECT array_agg(DISTINCT upper(o) ORDER BY upper(o)) INTO ops FROM unnest(operations) o;
    IF ops IS NULL OR NOT ops <@ ARRAY['INSERT', 'UPDATE', 'DELETE'] OR array_position(ops, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'operations must be one or more of INSERT, UPDATE and DELETE, got %', eventgrid._quote(operations::text)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'TRUNCATE publishes nothing; pass for example ARRAY[''INSERT'', ''UPDATE''].';
    END IF;
    IF event_type_prefix IS NOT NULL AND (length(event_type_prefix) NOT BETWEEN 1 AND 200) THEN
        RAISE EXCEPTION 'event_type_prefix must be 1 to 200 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- mapped in the transaction that created a source with backfill: its rows are backfilled
    INSERT INTO eventgrid.wal_source_tables AS m (source_id, table_name, topic, operations, columns, update_columns,
                                                  event_type_prefix, backfill_state)
    SELECT sid, table_name, topic, ops, columns, update_columns, event_type_prefix,
           CASE WHEN d.backfill AND d.created_xact = pg_current_xact_id() THEN 'pending' END
      FROM eventgrid.wal_source_definitions d WHERE d.id = sid
    ON CONFLICT ON CONSTRAINT wal_source_tables_pkey DO UPDATE
       SET operations = EXCLUDED.operations, columns = EXCLUDED.columns, update_columns = EXCLUDED.update_columns,
           event_type_prefix = EXCLUDED.event_type_prefix;
END $_$;

COMMENT ON FUNCTION eventgrid.publish_table_changes(table_name text, topic text, source text, operations text[], columns text[], update_columns text[], event_type_prefix text) IS 'Publishes the changes of a table of a WAL source to a topic (SPEC 19): each row an INSERT, UPDATE or DELETE there changes becomes one event, with the same subject, event types and data as in-database table changes; the table is named as the source names it (schema.table) and must be in the source''s publication. data.old is the whole row when the source table has REPLICA IDENTITY FULL, else its key columns; a large value an UPDATE left unchanged is not in the WAL and is left out of data.new. Called again for the same table and topic it replaces the settings; takes effect for the transactions the source''s worker reads from then on. Mapped in the transaction that created the source with backfill => true, the table''s existing rows are published first. Requires eventgrid_admin. Errors: 22004, 42704 no such source or topic, 42809 an event domain, 22023. SPEC 19.';

CREATE FUNCTION eventgrid.purge_dead_letters(topic text DEFAULT NULL::text, subscription text DEFAULT NULL::text, reason text DEFAULT NULL::text, dead_lettered_after timestamp with time zone DEFAULT NULL::timestamp with time zone, dead_lettered_before timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    ids bigint[] := eventgrid._dead_letter_ids(topic, subscription, reason, dead_lettered_after,
                                               dead_lettered_before, false);
    n bigint;
BEGIN
    DELETE FROM eventgrid.dead_letters d WHERE d.id = ANY (ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;

COMMENT ON FUNCTION eventgrid.purge_dead_letters(topic text, subscription text, reason text, dead_lettered_after timestamp with time zone, dead_lettered_before timestamp with time zone) IS 'Deletes the dead letters a filter selects and returns how many; the same filters as redeliver_dead_letters (NULL: any), where topic and subscription may also name ones dropped since that dead letters still name. Running it twice deletes nothing the second time. Requires eventgrid_admin. Errors: 22023, 42704 a topic or subscription that neither exists nor is named by a dead letter. SPEC 7.';

CREATE FUNCTION eventgrid.receive(topic text, subscription text, max_events integer DEFAULT 1, max_wait_time integer DEFAULT 60) RETURNS TABLE(lock_token text, delivery_count integer, event jsonb)
    LANGUAGE c
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS 'MODULE_PATHNAME', 'eventgrid_receive';

COMMENT ON FUNCTION eventgrid.receive(topic text, subscription text, max_events integer, max_wait_time integer) IS 'Pull delivery (SPEC 14): receives up to max_events (1-100, default 1) events of a queue event subscription, each locked to the caller for the subscription''s receive_lock_duration: rows (lock_token, delivery_count: how many times it was received, this one included, event: the CloudEvent). Returns as soon as any event is receivable (a long poll woken by the commit that published it) or empty after max_wait_time seconds (10-120, default 60); while it waits it holds its connection and no lock (DROP EXTENSION, ALTER EXTENSION UPDATE and drop_event_subscription() do not wait for it; it then fails with 55000 or 42704), and only a commit for its own subscription wakes it. Settle each event with acknowledge(), release() or reject(), or renew_locks(); an expired lock makes the event receivable again. Events past their time to live, or received max_delivery_count times, are dead-lettered (or dropped) instead of returned. READ COMMITTED only. Requires eventgrid_receiver or eventgrid_admin, or a grant_receive() for the subscription or its topic. Errors: 42501 no right to the subscription, 22004 NULL, 22003 out of range, 42704 no such subscription, 42809 a push subscription, 0A000 REPEATABLE READ or SERIALIZABLE, 55000 not in shared_preload_libraries.';

CREATE FUNCTION eventgrid.redeliver_dead_letters(topic text DEFAULT NULL::text, subscription text DEFAULT NULL::text, reason text DEFAULT NULL::text, dead_lettered_after timestamp with time zone DEFAULT NULL::timestamp with time zone, dead_lettered_before timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sids bigint[];
    rsids bigint[];
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
           (SELECT k.ids FROM keyed k), (SELECT count(*) FROM received),
           (SELECT array_agg(DISTINCT r.subscription_id) FROM received r)
      INTO n, ksids, khashes, kids, nreceived, rsids FROM counted;
    IF ksids IS NOT NULL THEN
        PERFORM eventgrid._start_ordering_keys(ksids, khashes, kids, eventgrid._now());
    END IF;
    IF n > nreceived THEN
        PERFORM eventgrid._wake_worker_at_commit();
    END IF;
    IF nreceived > 0 THEN
        PERFORM eventgrid._wake_receivers_at_commit(rsids);
    END IF;
    RETURN n;
END $$;

COMMENT ON FUNCTION eventgrid.redeliver_dead_letters(topic text, subscription text, reason text, dead_lettered_after timestamp with time zone, dead_lettered_before timestamp with time zone) IS 'Queues dead letters for delivery again and returns how many: each becomes a delivery with no attempts made and its time-to-live counted from now, due at once, and leaves eventgrid.dead_letters (if it fails again it is dead-lettered again). Filters (NULL: any): topic, subscription name, reason (MaxDeliveryAttemptsExceeded, TimeToLiveExceeded, NonRetriableError, and for queue subscriptions MaxDeliveryCountExceeded, Rejected), dead_lettered_at >= dead_lettered_after and < dead_lettered_before. Of an ordered subscription (ordering_key) each goes after the events of its key that wait, in the order the dead letters were written: not back in its place. Of a queue subscription each becomes receivable at once with a delivery count of 0. Dead letters of dropped subscriptions stay. Running it twice queues nothing the second time. Counted in subscription_counters.redelivered. Requires eventgrid_admin. Errors: 22023 unknown reason or empty time range, 42704 no such topic or subscription. SPEC 7.';

CREATE FUNCTION eventgrid.regenerate_topic_key(topic text, key_name text) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    new_key text := eventgrid._new_access_key();
BEGIN
    PERFORM eventgrid._check_not_null('topic', topic);
    PERFORM eventgrid._check_not_null('key_name', key_name);
    IF key_name NOT IN ('key1', 'key2') THEN
        RAISE EXCEPTION 'key_name must be key1 or key2, got %', eventgrid._quote(key_name)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Regenerate one key while clients use the other, then move them over.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = regenerate_topic_key.topic) THEN
        RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(topic) USING ERRCODE = 'undefined_object';
    END IF;
    INSERT INTO eventgrid.topic_access_keys (topic) VALUES (regenerate_topic_key.topic) ON CONFLICT DO NOTHING;
    IF key_name = 'key1' THEN
        UPDATE eventgrid.topic_access_keys k SET key1 = new_key, key1_set_at = now()
         WHERE k.topic = regenerate_topic_key.topic;
    ELSE
        UPDATE eventgrid.topic_access_keys k SET key2 = new_key, key2_set_at = now()
         WHERE k.topic = regenerate_topic_key.topic;
    END IF;
    RETURN new_key;
END $$;

COMMENT ON FUNCTION eventgrid.regenerate_topic_key(topic text, key_name text) IS 'Replaces access key key_name (key1 or key2) of a topic with a new random one (the base64 of 32 bytes from pg_strong_random) and returns it (SPEC 16); requests carrying the old key, or a SAS token signed with it, are refused from the commit on. Requires eventgrid_admin. Errors: 22004 NULL, 22023 key_name not key1 or key2, 42704 no such topic.';

CREATE FUNCTION eventgrid.reject(topic text, subscription text, lock_tokens text[]) RETURNS TABLE(lock_token text, succeeded boolean, error text)
    LANGUAGE c
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS 'MODULE_PATHNAME', 'eventgrid_queue_settle';

COMMENT ON FUNCTION eventgrid.reject(topic text, subscription text, lock_tokens text[]) IS 'Pull delivery (SPEC 14): the events whose locks lock_tokens (at most 1000) name are dead-lettered at once with reason Rejected (dropped when the subscription does not dead-letter; a dead_letter_topic gets its notification). One row per token, in order: (lock_token, succeeded, error); a malformed, unknown, expired or settled token fails only itself. Requires eventgrid_receiver or eventgrid_admin, or a grant_receive() for the subscription or its topic. Errors: 42501 no right to the subscription, 22004, 54000, 42704, 42809.';

CREATE FUNCTION eventgrid.release(topic text, subscription text, lock_tokens text[], release_delay integer DEFAULT 0) RETURNS TABLE(lock_token text, succeeded boolean, error text)
    LANGUAGE c
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS 'MODULE_PATHNAME', 'eventgrid_queue_settle';

COMMENT ON FUNCTION eventgrid.release(topic text, subscription text, lock_tokens text[], release_delay integer) IS 'Pull delivery (SPEC 14): the events whose locks lock_tokens (at most 1000) name are unlocked and can be received again after release_delay seconds (0, 10, 60, 600 or 3600; default 0), with their delivery count raised by the next receive (past max_delivery_count they are dead-lettered). One row per token, in order: (lock_token, succeeded, error); a malformed, unknown, expired or settled token fails only itself. Requires eventgrid_receiver or eventgrid_admin, or a grant_receive() for the subscription or its topic. Errors: 42501 no right to the subscription, 22004, 22023 another release_delay, 54000, 42704, 42809.';

CREATE FUNCTION eventgrid.remove_client_certificate(topic text, subscription text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM eventgrid.client_certificates c WHERE c.subscription_id = eventgrid._subscription_id(topic, subscription, true);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'event subscription % of topic % has no client certificate', eventgrid._quote(subscription), eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object', HINT = 'eventgrid.event_subscription_certificates lists the subscriptions that have one.';
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid.remove_client_certificate(topic text, subscription text) IS 'Removes the client certificate of an event subscription: its requests present none from the next claim on. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription or no certificate.';

CREATE FUNCTION eventgrid.remove_delivery_authentication(topic text, subscription text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM eventgrid.delivery_authentications a
     WHERE a.subscription_id = eventgrid._subscription_id(topic, subscription, true);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'event subscription % of topic % has no delivery authentication', eventgrid._quote(subscription), eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object', HINT = 'eventgrid.event_subscription_authentication lists the subscriptions that have one.';
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid.remove_delivery_authentication(topic text, subscription text) IS 'Removes the delivery authentication (OAuth 2.0 or Entra ID) of an event subscription: its requests carry no bearer token from the next claim on. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription or none set.';

CREATE FUNCTION eventgrid.remove_delivery_property(topic text, subscription text, header text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

COMMENT ON FUNCTION eventgrid.remove_delivery_property(topic text, subscription text, header text) IS 'Removes a custom delivery property. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription or header.';

CREATE FUNCTION eventgrid.remove_signing_secret(topic text, subscription text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM eventgrid.signing_secrets k WHERE k.subscription_id = eventgrid._subscription_id(topic, subscription, true);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'event subscription % of topic % has no signing secret', eventgrid._quote(subscription), eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object', HINT = 'eventgrid.event_subscription_signing lists the signed subscriptions.';
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid.remove_signing_secret(topic text, subscription text) IS 'Removes the signing secret of an event subscription (and a previous one still signing): its requests are no longer signed. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription or no secret.';

CREATE FUNCTION eventgrid.renew_locks(topic text, subscription text, lock_tokens text[]) RETURNS TABLE(lock_token text, succeeded boolean, error text)
    LANGUAGE c
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS 'MODULE_PATHNAME', 'eventgrid_queue_settle';

COMMENT ON FUNCTION eventgrid.renew_locks(topic text, subscription text, lock_tokens text[]) IS 'Pull delivery (SPEC 14): the locks lock_tokens (at most 1000) name last the subscription''s receive_lock_duration again from now, within 1 hour of the receive that took them (after that: LockRenewalLimitExceeded). One row per token, in order: (lock_token, succeeded, error); a malformed, unknown, expired or settled token fails only itself. Requires eventgrid_receiver or eventgrid_admin, or a grant_receive() for the subscription or its topic. Errors: 42501 no right to the subscription, 22004, 54000, 42704, 42809.';

CREATE FUNCTION eventgrid.resume_delivery(topic text DEFAULT NULL::text, subscription text DEFAULT NULL::text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    t record := eventgrid._pause_target(topic, subscription);
BEGIN
    IF t.target_topic IS NULL THEN
        DELETE FROM eventgrid.delivery_pauses;   -- everything: every pause
    ELSE
        DELETE FROM eventgrid.delivery_pauses p
         WHERE p.topic = t.target_topic AND p.subscription_id IS NOT DISTINCT FROM t.target_sid;
    END IF;
    IF FOUND THEN
        PERFORM eventgrid._log(format('eventgrid: delivery resumed for %s by %s', t.label, eventgrid._caller()));
        PERFORM eventgrid._subscriptions_changed_at_commit();   -- and they take up what waited
    END IF;
END $$;

COMMENT ON FUNCTION eventgrid.resume_delivery(topic text, subscription text) IS 'Resumes what pause_delivery() paused at the same level: a subscription, a topic (its subscriptions paused one by one stay paused), or, both NULL, every pause. The delivery workers take up the waiting events and due retries at once. Logged once. Requires eventgrid_admin. Errors: 22004, 42704.';

CREATE FUNCTION eventgrid.resume_wal_source(name text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._wal_source_named(name);
BEGIN
    UPDATE eventgrid.wal_source_definitions d SET paused = false WHERE d.id = sid;
    UPDATE eventgrid.wal_source_status s SET state = 'connecting', updated_at = now() WHERE s.source_id = sid;
    PERFORM eventgrid._wake_worker_at_commit();
END $$;

COMMENT ON FUNCTION eventgrid.resume_wal_source(name text) IS 'Resumes a paused WAL source: its worker starts again and reads on from where it stopped. Requires eventgrid_admin. Errors: 22004, 42704. SPEC 19.';

CREATE FUNCTION eventgrid.retry_delay(attempt integer, http_status integer DEFAULT NULL::integer, topic_type text DEFAULT 'custom'::text) RETURNS interval
    LANGUAGE c IMMUTABLE PARALLEL SAFE
    AS 'MODULE_PATHNAME', 'eventgrid_retry_delay';

COMMENT ON FUNCTION eventgrid.retry_delay(attempt integer, http_status integer, topic_type text) IS 'Delay before the next delivery attempt after failed attempt number attempt, without jitter. topic_type custom (default; attempt 1-30): 10 s, 30 s, 1 min, 5 min, 10 min, 30 min, 1 h, 3 h, 6 h, then 12 h; NULL for 400, 401, 403, 413. topic_type namespace (attempt 1-10): retries 10 s, 30 s, 1 min and 5 min after the first attempt and then every 5 minutes, so the delays are 10 s, 20 s, 30 s, 4 min, then 5 min; NULL for 400, 401, 403, 404, 413, 414. Either: at least 2 min after HTTP 408 and 30 s after 503; NULL for a success. Errors: 22003 attempt or status out of range, 22023 unknown topic_type. SPEC 3, 4.';

CREATE FUNCTION eventgrid.revoke_receive(topic text, subscription text, role_name text) RETURNS void
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

COMMENT ON FUNCTION eventgrid.revoke_receive(topic text, subscription text, role_name text) IS 'Takes back what grant_receive(topic, subscription, role_name) gave (the same three: a topic-wide grant is revoked with subscription NULL); a NOTICE when there was none. A consumer already waiting in receive() gets 42501 when it next looks. Logged once. Requires eventgrid_admin. Errors: 22004 NULL topic or role_name, 42704 no such topic or subscription, 42809 a push subscription.';

CREATE FUNCTION eventgrid.set_advanced_filters(topic text, subscription text, filters jsonb, enable_advanced_filtering_on_arrays boolean DEFAULT NULL::boolean) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, subscription, true);
BEGIN
    UPDATE eventgrid.event_subscriptions s
       SET advanced_filters = eventgrid._advanced_filters_arg(filters),
           enable_advanced_filtering_on_arrays = coalesce(set_advanced_filters.enable_advanced_filtering_on_arrays,
                                                          s.enable_advanced_filtering_on_arrays)
     WHERE s.id = sid;
END $$;

COMMENT ON FUNCTION eventgrid.set_advanced_filters(topic text, subscription text, filters jsonb, enable_advanced_filtering_on_arrays boolean) IS 'Replaces the advanced filters of an event subscription. filters: Event Grid''s JSON, an array of {"operatorType", "key", "value"} or {"operatorType", "key", "values": [...]}; NULL or [] removes them. Operators: NumberIn, NumberNotIn, NumberLessThan, NumberGreaterThan, NumberLessThanOrEquals, NumberGreaterThanOrEquals (value), NumberInRange, NumberNotInRange (values: [low, high] pairs), BoolEquals (value), StringContains, StringNotContains, StringBeginsWith, StringNotBeginsWith, StringEndsWith, StringNotEndsWith, StringIn, StringNotIn (values), IsNullOrUndefined, IsNotNull. At most 25 filters and 25 values in all, strings up to 512 characters. enable_advanced_filtering_on_arrays: NULL leaves it unchanged. Events published after the commit are filtered with the new filters. Requires eventgrid_admin. Errors: 42704, 22004, 22023, 54000. SPEC 9.';

CREATE FUNCTION eventgrid.set_batching(topic text, name text, max_events_per_batch integer DEFAULT NULL::integer, preferred_batch_size_in_kilobytes integer DEFAULT NULL::integer) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

COMMENT ON FUNCTION eventgrid.set_batching(topic text, name text, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer) IS 'Sets output batching of an event subscription. max_events_per_batch 1-5000, preferred_batch_size_in_kilobytes 1-1024; setting either turns batching on (the other comes from GUC eventgrid.default_max_events_per_batch or eventgrid.default_preferred_batch_size_in_kilobytes); both NULL turns batching off. Requires eventgrid_admin. Errors: 42704, 22003, 22004. SPEC 5.';

CREATE FUNCTION eventgrid.set_client_certificate(topic text, subscription text, certificate text, private_key text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, subscription, true);
    info record;
BEGIN
    SELECT i.subject, i.not_after INTO info FROM eventgrid._client_certificate_info(certificate, private_key) i;
    INSERT INTO eventgrid.client_certificates AS c (subscription_id, certificate, private_key, subject, not_after)
    VALUES (sid, certificate, private_key, info.subject, info.not_after)
    ON CONFLICT (subscription_id) DO UPDATE
       SET certificate = excluded.certificate, private_key = excluded.private_key, subject = excluded.subject,
           not_after = excluded.not_after, set_at = clock_timestamp();
END $$;

COMMENT ON FUNCTION eventgrid.set_client_certificate(topic text, subscription text, certificate text, private_key text) IS 'Sets the client certificate an event subscription presents to its HTTPS endpoint (mutual TLS; SPEC 12), for deliveries, retries, batches and validation handshakes alike. certificate: PEM, the client certificate first, then any chain; private_key: its PEM private key, unencrypted. The key is never shown (event_subscription_certificates shows subject and expiry); a certificate within 7 days of expiry is warned about in the server log. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription, 22023 a certificate or key that does not parse, a key that is not the certificate''s, a certificate not valid now.';

CREATE FUNCTION eventgrid.set_deadletter(topic text, name text, enabled boolean) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, name, true);
BEGIN
    PERFORM eventgrid._check_not_null('enabled', enabled);
    UPDATE eventgrid.event_subscriptions s SET deadletter = enabled WHERE s.id = sid;
END $$;

COMMENT ON FUNCTION eventgrid.set_deadletter(topic text, name text, enabled boolean) IS 'Turns dead-lettering of an event subscription on or off (off by default: undeliverable events are then dropped and counted). Requires eventgrid_admin. Errors: 42704, 22004. SPEC 7.';

CREATE FUNCTION eventgrid.set_delivery_property(topic text, subscription text, header text, value text, is_secret boolean DEFAULT false) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM eventgrid._put_delivery_property(topic, subscription, header, value, NULL, is_secret);
END $$;

COMMENT ON FUNCTION eventgrid.set_delivery_property(topic text, subscription text, header text, value text, is_secret boolean) IS 'Adds or replaces a static custom delivery property (HTTP header sent with every request). header: HTTP token, 1-256 chars, not aeg-*, not one that changes framing or routing (Content-Length, Transfer-Encoding, Host, Connection, Upgrade, TE, Trailer, Expect, Keep-Alive, Proxy-*) nor Content-Type. value: at most 4096 bytes, no control characters. is_secret: value is sent but shown masked. At most 10 per subscription. Requires eventgrid_admin. Errors: 42704, 22023, 42939, 22001, 54000, 22004. SPEC 8.';

CREATE FUNCTION eventgrid.set_dynamic_delivery_property(topic text, subscription text, header text, source_field text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM eventgrid._check_not_null('source_field', source_field);
    PERFORM eventgrid._put_delivery_property(topic, subscription, header, NULL, source_field, false);
END $$;

COMMENT ON FUNCTION eventgrid.set_dynamic_delivery_property(topic text, subscription text, header text, source_field text) IS 'Adds or replaces a dynamic custom delivery property whose value is taken from a field of each event (dotted path such as data.orderId; strings, numbers and booleans only; a value that is of another type, longer than 4096 bytes or holding a control character leaves the header out). Same name rules as set_delivery_property. Requires eventgrid_admin. SPEC 8.';

CREATE FUNCTION eventgrid.set_entra_authentication(topic text, subscription text, tenant_id text, application_id_or_uri text, client_id text, client_secret text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
BEGIN
    PERFORM eventgrid._check_not_null('tenant_id', tenant_id);
    PERFORM eventgrid._check_not_null('application_id_or_uri', application_id_or_uri);
    IF tenant_id !~ '^[A-Za-z0-9][A-Za-z0-9.-]{0,99}$' THEN
        RAISE EXCEPTION 'invalid tenant_id %', eventgrid._quote(tenant_id)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Give the directory (tenant) ID, a GUID, or a domain name of the tenant such as contoso.onmicrosoft.com.';
    END IF;
    IF octet_length(application_id_or_uri) > 480 OR application_id_or_uri !~ '^[!-~]+$' THEN
        RAISE EXCEPTION 'invalid application_id_or_uri %', eventgrid._quote(application_id_or_uri)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Give the application (client) ID or the application ID URI of the receiver''s app registration, such as api://orders-webhook: 1 to 480 printable characters without spaces.';
    END IF;
    PERFORM eventgrid._set_delivery_authentication(topic, subscription, 'entra', NULL, tenant_id, client_id,
                                                   client_secret, rtrim(application_id_or_uri, '/') || '/.default', NULL);
END $_$;

COMMENT ON FUNCTION eventgrid.set_entra_authentication(topic text, subscription text, tenant_id text, application_id_or_uri text, client_id text, client_secret text) IS 'Makes every request of an event subscription carry a Microsoft Entra ID bearer token, as Event Grid does for Entra-protected endpoints: the client-credentials grant at {eventgrid.entra_authority}/{tenant_id}/oauth2/v2.0/token for scope {application_id_or_uri}/.default, client_id and client_secret sent in the form. tenant_id: a GUID or domain (1-100 characters); application_id_or_uri: the receiver app''s ID or ID URI (1-480 printable characters). Otherwise as set_oauth2_authentication(). SPEC 12. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription, 22023 a bad field, 55000 the subscription has an Authorization delivery property.';

CREATE FUNCTION eventgrid.set_oauth2_authentication(topic text, subscription text, token_endpoint text, client_id text, client_secret text, scope text DEFAULT NULL::text, audience text DEFAULT NULL::text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
BEGIN
    PERFORM eventgrid._check_not_null('token_endpoint', token_endpoint);
    PERFORM eventgrid._check_endpoint(token_endpoint);
    IF octet_length(token_endpoint) > 1000 THEN
        RAISE EXCEPTION 'token_endpoint must be at most 1000 bytes long, got %', octet_length(token_endpoint)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF token_endpoint !~* '^https://' AND token_endpoint !~* '^http://(127\.0\.0\.1|localhost|\[::1\])(:[0-9]+)?(/|$)' THEN
        RAISE EXCEPTION 'token_endpoint % must be an https URL', eventgrid._quote(token_endpoint)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The client secret goes to it: plain http is allowed only to this machine (127.0.0.1, localhost, [::1]), for tests.';
    END IF;
    PERFORM eventgrid._set_delivery_authentication(topic, subscription, 'oauth2', token_endpoint, NULL,
                                                   client_id, client_secret, scope, audience);
END $_$;

COMMENT ON FUNCTION eventgrid.set_oauth2_authentication(topic text, subscription text, token_endpoint text, client_id text, client_secret text, scope text, audience text) IS 'Makes every request of an event subscription (deliveries, retries, batches, validation handshakes) carry Authorization: Bearer <access token>, the token got from token_endpoint (an http or https URL of at most 1000 bytes) with the OAuth 2.0 client-credentials grant (RFC 6749 4.4); http only to 127.0.0.1, localhost or [::1]: client_id and client_secret (1-500 and 1-1000 bytes) sent with HTTP Basic, scope and audience (each at most 500 bytes, NULL: not sent) in the form. A token serves until expires_in less min(10 %, 60 s), shared by the subscriptions with the same endpoint, client, scope and audience; a 401 to a token that was not new drops it and sends the event again at once. SPEC 12. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription, 22023 a bad URL or field, 55000 the subscription has an Authorization delivery property.';

CREATE FUNCTION eventgrid.set_retry_policy(topic text, name text, max_delivery_attempts integer DEFAULT NULL::integer, event_ttl integer DEFAULT NULL::integer, max_delivery_count integer DEFAULT NULL::integer, event_time_to_live text DEFAULT NULL::text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
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

COMMENT ON FUNCTION eventgrid.set_retry_policy(topic text, name text, max_delivery_attempts integer, event_ttl integer, max_delivery_count integer, event_time_to_live text) IS 'Sets the retry policy of an event subscription; a NULL argument leaves that setting unchanged. Custom topic: max_delivery_attempts 1-30, event_ttl 1-1440 minutes. Namespace topic: max_delivery_count 1-10, event_time_to_live ISO 8601 duration of minute precision PT1M-P7D (e.g. PT20M, P1DT2H). Delivery stops at whichever limit comes first; the other profile''s arguments are refused. Requires eventgrid_admin. Errors: 42704, 22003, 22004, 22023. SPEC 4.';

CREATE FUNCTION eventgrid.set_signing_secret(topic text, subscription text, secret text DEFAULT NULL::text, previous_valid_for interval DEFAULT '00:00:00'::interval) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, subscription, true);
    problem text := eventgrid._signing_secret_problem(secret);
    old text;
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'invalid signing secret: %', problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass NULL to have one generated, or "whsec_" and the base64 of 24 to 64 random bytes.';
    END IF;
    PERFORM eventgrid._check_not_null('previous_valid_for', previous_valid_for);
    IF previous_valid_for < interval '0' OR previous_valid_for > interval '30 days' THEN
        RAISE EXCEPTION 'previous_valid_for must be between 0 and 30 days, got %', previous_valid_for
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'How long the secret being replaced keeps signing beside the new one; 0 replaces it at once.';
    END IF;
    secret := COALESCE(secret, 'whsec_' || encode(eventgrid._random_bytes(32), 'base64'));
    SELECT k.secret INTO old FROM eventgrid.signing_secrets k WHERE k.subscription_id = sid FOR UPDATE;
    INSERT INTO eventgrid.signing_secrets AS k (subscription_id, secret, previous_secret, previous_valid_until)
    VALUES (sid, secret, NULL, NULL)
    ON CONFLICT (subscription_id) DO UPDATE
       SET secret = excluded.secret,
           previous_secret = CASE WHEN previous_valid_for > interval '0' AND old <> excluded.secret THEN old END,
           previous_valid_until = CASE WHEN previous_valid_for > interval '0' AND old <> excluded.secret
                                       THEN now() + previous_valid_for END,
           set_at = now();
    RETURN secret;
END $$;

COMMENT ON FUNCTION eventgrid.set_signing_secret(topic text, subscription text, secret text, previous_valid_for interval) IS 'Sets the Standard Webhooks signing secret of an event subscription and returns it; every request to it then carries webhook-id, webhook-timestamp and webhook-signature (v1, HMAC-SHA256 of "id.timestamp.body"). secret: "whsec_" and the base64 of 24-64 bytes; NULL generates one (32 bytes from pg_strong_random). previous_valid_for: 0-30 days (0); when more than 0, the secret being replaced keeps signing beside the new one for that long (both signatures in webhook-signature). Secrets are never shown (event_subscription_signing masks them). Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription, 22023 bad secret or interval.';

CREATE FUNCTION eventgrid.set_storage_account_key(topic text, subscription text, account_key text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, subscription, true);
    key_bytes integer;
BEGIN
    PERFORM eventgrid._check_not_null('account_key', account_key);
    IF (SELECT s.endpoint_type FROM eventgrid.event_subscriptions s WHERE s.id = sid) <> 'StorageQueue' THEN
        RAISE EXCEPTION 'event subscription "%" of topic "%" is not a StorageQueue subscription', subscription, topic
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    BEGIN
        key_bytes := octet_length(decode(account_key, 'base64'));
    EXCEPTION WHEN invalid_parameter_value THEN
        key_bytes := 0;
    END;
    IF key_bytes < 16 THEN
        RAISE EXCEPTION 'account_key must be a storage account key: base64 of at least 16 bytes'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Copy key1 or key2 of the storage account (az storage account keys list), e.g. 88 characters ending in ==.';
    END IF;
    INSERT INTO eventgrid.destination_credentials AS c (subscription_id, kind, secret)
    VALUES (sid, 'shared_key', account_key)
    ON CONFLICT (subscription_id) DO UPDATE SET kind = 'shared_key', user_name = NULL, secret = EXCLUDED.secret,
                                                set_at = clock_timestamp();
END $$;

COMMENT ON FUNCTION eventgrid.set_storage_account_key(topic text, subscription text, account_key text) IS 'Gives a StorageQueue event subscription its storage account''s key (SPEC 21): each Put Message is signed with it (Authorization: SharedKey); it replaces a SAS token the endpoint brought, and a later endpoint with a SAS token replaces it. account_key: the account''s key1 or key2, base64 of at least 16 bytes (22023). Stored in destination_credentials, which only the extension''s owner reads; no view shows it. Requires eventgrid_admin. Errors: 42704 no such subscription, 22023 not a StorageQueue subscription or not a key, 22004 NULL. SPEC 21.';

CREATE FUNCTION eventgrid.stop_publishing_table_changes(source_table regclass, topic text) RETURNS void
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_stop_publishing_table_changes';

COMMENT ON FUNCTION eventgrid.stop_publishing_table_changes(source_table regclass, topic text) IS 'Stops publishing the changes of a table to a topic (drops its triggers, from its partitions too); events already published stay queued. The role current at the call needs eventgrid_admin and TRIGGER on the table (or owning it). Errors: 22004 NULL, 42501, 42704 no such publication.';

CREATE FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text DEFAULT NULL::text, event_delivery_schema text DEFAULT NULL::text, included_event_types text[] DEFAULT NULL::text[], subject_begins_with text DEFAULT NULL::text, subject_ends_with text DEFAULT NULL::text, is_subject_case_sensitive boolean DEFAULT NULL::boolean, max_delivery_attempts integer DEFAULT NULL::integer, event_ttl integer DEFAULT NULL::integer, max_events_per_batch integer DEFAULT NULL::integer, preferred_batch_size_in_kilobytes integer DEFAULT NULL::integer, deadletter boolean DEFAULT NULL::boolean, advanced_filters jsonb DEFAULT NULL::jsonb, enable_advanced_filtering_on_arrays boolean DEFAULT NULL::boolean, max_delivery_count integer DEFAULT NULL::integer, event_time_to_live text DEFAULT NULL::text, max_events_per_second integer DEFAULT NULL::integer, endpoint_validation text DEFAULT NULL::text, dead_letter_topic text DEFAULT NULL::text, ordering_key text DEFAULT NULL::text, receive_lock_duration integer DEFAULT NULL::integer, expiration_time timestamp with time zone DEFAULT NULL::timestamp with time zone, endpoint_type text DEFAULT NULL::text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, name, true);
    cur eventgrid.event_subscriptions;
    in_schema text;
    attempts integer;
    ttl integer;
    cred_user text;
    cred_password text;
    cred_kind text;
    new_endpoint boolean;
BEGIN
    SELECT s.* INTO cur FROM eventgrid.event_subscriptions s WHERE s.id = sid;
    SELECT t.input_schema INTO in_schema FROM eventgrid.topics t WHERE t.name = cur.topic;
    IF cur.delivery_mode = 'queue' AND update_event_subscription.endpoint IS NOT NULL THEN
        RAISE EXCEPTION 'event subscription "%" of topic "%" is a queue event subscription: it has no endpoint', name, topic
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'delivery_mode cannot change: create a push event subscription beside it.';
    END IF;
    IF cur.delivery_mode = 'queue' THEN
        PERFORM eventgrid._check_no_endpoint_type(endpoint_type, name, topic);
    END IF;
    -- NULL keeps a setting; an empty array, '' or 0 clears one that may be unset
    endpoint_type := coalesce(endpoint_type, cur.endpoint_type);
    -- a Redis or RabbitMQ password or a SAS token goes where secrets go, not into the stored endpoint
    IF endpoint IS NOT NULL AND endpoint_type IN ('RedisStream', 'RabbitMQ') THEN
        SELECT c.endpoint, c.user_name, c.password, 'password' INTO endpoint, cred_user, cred_password, cred_kind
          FROM eventgrid._endpoint_credentials(endpoint) c;
    ELSIF endpoint IS NOT NULL AND endpoint_type = 'StorageQueue' THEN
        SELECT c.endpoint, c.sas, 'sas' INTO endpoint, cred_password, cred_kind
          FROM eventgrid._storage_queue_sas(endpoint) c;
    END IF;
    new_endpoint := endpoint IS NOT NULL;
    endpoint := coalesce(endpoint, cur.endpoint);
    IF cur.delivery_mode = 'push' THEN
        PERFORM eventgrid._check_endpoint_type(endpoint_type, endpoint, endpoint_validation);
        IF endpoint_type <> 'WebHook' THEN
            endpoint_validation := 'none';  -- a destination is not validated by a handshake
        END IF;
    END IF;
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
    PERFORM eventgrid._check_endpoint_key(endpoint, ordering_key);
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
           expiration_time = update_event_subscription.expiration_time,
           endpoint_type = update_event_subscription.endpoint_type
     WHERE s.id = sid;
    IF new_endpoint THEN
        -- a new endpoint brings its own credentials, or none; a Storage queue keeps an account key
        -- (set_storage_account_key()) unless the endpoint brings a SAS token
        DELETE FROM eventgrid.destination_credentials c
         WHERE c.subscription_id = sid
           AND (c.kind <> 'shared_key' OR cred_password IS NOT NULL OR endpoint_type <> 'StorageQueue');
        IF cred_password IS NOT NULL THEN
            INSERT INTO eventgrid.destination_credentials (subscription_id, kind, user_name, secret)
            VALUES (sid, cred_kind, cred_user, cred_password);
        END IF;
    END IF;
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

COMMENT ON FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text, ordering_key text, receive_lock_duration integer, expiration_time timestamp with time zone, endpoint_type text) IS 'Changes an event subscription in place (as az eventgrid event-subscription update); the arguments are create_event_subscription''s, with the same ranges, checks and SQLSTATEs. A NULL argument keeps the setting; to clear one pass an empty array (included_event_types: all types), an empty string (subject_begins_with, subject_ends_with, dead_letter_topic), [] (advanced_filters) or 0 (max_events_per_batch, preferred_batch_size_in_kilobytes: both cleared turns batching off; max_events_per_second: no rate limit). endpoint_validation: handshake validates the endpoint again (so does a new endpoint or delivery schema of a subscription that validates), none stops validating. The position, the first attempts in flight and the retries are kept, and the next claim uses the new settings: a new endpoint gets its own health state; with a new event_delivery_schema the retries are converted. ordering_key: a new path keys the events claimed from now on (those waiting keep their keys); '''' makes the subscription unordered and what waited for its key due at once. A changed endpoint is logged, without the URL. delivery_mode cannot change (a queue subscription refuses an endpoint, 22023); receive_lock_duration (60-300 seconds, queue subscriptions only) applies to the locks taken from then on. expiration_time: a new expiration time (in the future), or ''infinity'' to clear it (never expires). endpoint_type: WebHook, RedisStream, StorageQueue or RabbitMQ, changed together with an endpoint of that type (a destination that is not a WebHook ends any endpoint validation); a new endpoint replaces the destination''s credentials with its own (or none; a Storage queue keeps an account key unless the endpoint brings a SAS token). Requires eventgrid_admin. Errors: 22004, 42704, 22023, 22003, 54000. SPEC 1, 4, 5, 7, 9, 13, 14, 17, 18, 21.';

CREATE FUNCTION eventgrid.validate_event_subscription(topic text, subscription text, validation_code text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, subscription, true);
    v eventgrid.endpoint_validations;
BEGIN
    PERFORM eventgrid._check_not_null('validation_code', validation_code);
    SELECT * INTO v FROM eventgrid.endpoint_validations x WHERE x.subscription_id = sid FOR UPDATE;
    IF NOT FOUND OR v.state <> 'AwaitingManualAction' THEN
        RAISE EXCEPTION 'event subscription "%" of topic "%" is not awaiting manual validation', subscription, topic
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = format('Its provisioning state is %s.', coalesce(v.state, 'Succeeded (no endpoint validation)')),
                  HINT = 'See eventgrid.event_subscription_validation.';
    END IF;
    IF v.manual_since + interval '10 minutes' <= eventgrid._now() THEN
        PERFORM eventgrid._fail_validation(sid, 'not validated manually within 10 minutes');
        RAISE EXCEPTION 'the manual validation of event subscription "%" of topic "%" expired', subscription, topic
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Start it again: eventgrid.update_event_subscription(topic, name, endpoint_validation => ''handshake'').';
    END IF;
    IF validation_code <> v.code THEN
        RAISE EXCEPTION 'validation_code is not the code sent to the endpoint'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use the validationCode of the SubscriptionValidationEvent the endpoint received.';
    END IF;
    UPDATE eventgrid.endpoint_validations x SET state = 'Succeeded', validated_at = eventgrid._now()
     WHERE x.subscription_id = sid;
    PERFORM eventgrid._wake_worker_at_commit();
END $$;

COMMENT ON FUNCTION eventgrid.validate_event_subscription(topic text, subscription text, validation_code text) IS 'Validates an event subscription''s endpoint by hand, as Event Grid''s validationUrl does: when the endpoint answered the SubscriptionValidationEvent with HTTP 200 but no validationResponse (provisioning state AwaitingManualAction), the validationCode it received, within 10 minutes of its answer. Delivery starts once it commits. Requires eventgrid_admin. Errors: 22004, 42704, 55000 not awaiting manual validation or expired (then Failed), 22023 another code.';

CREATE TABLE eventgrid.attempt_log (
    history_table smallint NOT NULL,
    id bigint NOT NULL,
    attempted_at timestamp with time zone NOT NULL,
    topic text,
    subscription_id bigint,
    subscription_name text NOT NULL,
    event_ids bigint[] NOT NULL,
    attempt integer NOT NULL,
    http_status integer,
    outcome text NOT NULL,
    duration_ms double precision,
    error text,
    response_body text,
    event_sources text[]
)
PARTITION BY LIST (history_table);

COMMENT ON TABLE eventgrid.attempt_log IS 'Internal: the delivery attempt history, in three tables eventgrid.attempt_log_0..2 that take turns; read it through eventgrid.delivery_attempts.';

COMMENT ON COLUMN eventgrid.attempt_log.event_sources IS 'Parallel to event_ids: the logical replication subscription each event came through (NULL: published here); NULL when none came so.';

CREATE SEQUENCE eventgrid.attempt_log_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE eventgrid.attempt_log_id_seq OWNED BY eventgrid.attempt_log.id;

CREATE TABLE eventgrid.attempt_log_0 (
    history_table smallint NOT NULL,
    id bigint DEFAULT nextval('eventgrid.attempt_log_id_seq'::regclass) NOT NULL,
    attempted_at timestamp with time zone NOT NULL,
    topic text,
    subscription_id bigint,
    subscription_name text NOT NULL,
    event_ids bigint[] NOT NULL,
    attempt integer NOT NULL,
    http_status integer,
    outcome text NOT NULL,
    duration_ms double precision,
    error text,
    response_body text,
    event_sources text[]
);

CREATE TABLE eventgrid.attempt_log_1 (
    history_table smallint NOT NULL,
    id bigint DEFAULT nextval('eventgrid.attempt_log_id_seq'::regclass) NOT NULL,
    attempted_at timestamp with time zone NOT NULL,
    topic text,
    subscription_id bigint,
    subscription_name text NOT NULL,
    event_ids bigint[] NOT NULL,
    attempt integer NOT NULL,
    http_status integer,
    outcome text NOT NULL,
    duration_ms double precision,
    error text,
    response_body text,
    event_sources text[]
);

CREATE TABLE eventgrid.attempt_log_2 (
    history_table smallint NOT NULL,
    id bigint DEFAULT nextval('eventgrid.attempt_log_id_seq'::regclass) NOT NULL,
    attempted_at timestamp with time zone NOT NULL,
    topic text,
    subscription_id bigint,
    subscription_name text NOT NULL,
    event_ids bigint[] NOT NULL,
    attempt integer NOT NULL,
    http_status integer,
    outcome text NOT NULL,
    duration_ms double precision,
    error text,
    response_body text,
    event_sources text[]
);

CREATE TABLE eventgrid.attempt_log_rotation (
    singleton boolean DEFAULT true NOT NULL,
    history_table smallint NOT NULL,
    started_at timestamp with time zone NOT NULL,
    first_id bigint NOT NULL,
    last_try_at timestamp with time zone,
    last_failure text,
    CONSTRAINT attempt_log_rotation_history_table_check CHECK (((history_table >= 0) AND (history_table <= 2))),
    CONSTRAINT attempt_log_rotation_singleton_check CHECK (singleton)
);

COMMENT ON TABLE eventgrid.attempt_log_rotation IS 'Which attempt history table takes rows now (history_table), since when (started_at) and from which id (first_id); when the upkeep worker last tried to rotate and, if that failed, why (e.g. a session reading the history held a lock).';

CREATE VIEW eventgrid.blocked_ordering_keys AS
 SELECT s.topic,
    s.name AS subscription,
    h.ordering_key,
    h.event_id,
    h.publish_time,
    h.attempts,
    h.last_outcome,
    h.last_http_status,
    h.last_attempt_at,
    h.next_attempt_at,
    w.waiting,
    w.oldest_waiting_publish_time
   FROM (((eventgrid.ordering_keys k
     JOIN eventgrid.retries h ON ((h.id = k.head_id)))
     JOIN eventgrid.event_subscriptions s ON ((s.id = k.subscription_id)))
     CROSS JOIN LATERAL ( SELECT count(*) AS waiting,
            min(x.publish_time) AS oldest_waiting_publish_time
           FROM eventgrid.retries x
          WHERE ((x.subscription_id = k.subscription_id) AND (x.ordering_key_hash = k.ordering_key_hash) AND (x.ordering_key IS NOT NULL) AND (x.id > k.head_id))) w)
  WHERE ((h.attempts > 0) AND (w.waiting > 0));

COMMENT ON VIEW eventgrid.blocked_ordering_keys IS 'Ordered delivery (SPEC 13): one row per key of an ordered event subscription whose oldest event has failed at least once and holds later events of its key back: topic, subscription, ordering_key (the key''s value), the holding event (event_id, publish_time, attempts made, last_outcome, last_http_status, last_attempt_at, next_attempt_at) and how many events wait behind it (waiting, oldest_waiting_publish_time). The key goes on once that event is delivered, dead-lettered or dropped. Readable by eventgrid_admin.';

CREATE TABLE eventgrid.client_certificates (
    subscription_id bigint NOT NULL,
    certificate text NOT NULL,
    private_key text NOT NULL,
    subject text NOT NULL,
    not_after timestamp with time zone NOT NULL,
    set_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);

COMMENT ON TABLE eventgrid.client_certificates IS 'Internal: the client certificates (PEM, with any chain) and private keys event subscriptions present to HTTPS endpoints; readable by the extension''s owner only (eventgrid.event_subscription_certificates shows subject and expiry).';

CREATE VIEW eventgrid.client_certificate_metrics AS
 SELECT s.read_key AS topic,
    s.name AS event_subscription,
    (EXTRACT(epoch FROM c.not_after))::double precision AS expiry_timestamp_seconds
   FROM (eventgrid.client_certificates c
     JOIN eventgrid.event_subscriptions s ON ((s.id = c.subscription_id)));

COMMENT ON VIEW eventgrid.client_certificate_metrics IS 'Prometheus gauge per event subscription with a client certificate (mutual TLS): expiry_timestamp_seconds, the certificate''s not_after as Unix time. Readable by pg_monitor and eventgrid_admin. README "Monitoring".';

CREATE TABLE eventgrid.dead_letters (
    id bigint NOT NULL,
    envelope_id uuid DEFAULT gen_random_uuid() NOT NULL,
    topic text NOT NULL,
    subscription_name text NOT NULL,
    subscription_id bigint,
    input_schema text NOT NULL,
    event_delivery_schema text NOT NULL,
    event jsonb NOT NULL,
    dead_letter_reason text NOT NULL,
    delivery_attempts integer NOT NULL,
    last_delivery_outcome text,
    last_http_status_code integer,
    publish_time timestamp with time zone NOT NULL,
    last_delivery_attempt_time timestamp with time zone,
    dead_lettered_at timestamp with time zone DEFAULT eventgrid._now() NOT NULL,
    topic_type text DEFAULT 'custom'::text NOT NULL,
    event_id bigint,
    source text,
    source_event_id bigint,
    CONSTRAINT dead_letters_dead_letter_reason_check CHECK ((dead_letter_reason = ANY (ARRAY['MaxDeliveryAttemptsExceeded'::text, 'TimeToLiveExceeded'::text, 'NonRetriableError'::text, 'MaxDeliveryCountExceeded'::text, 'Rejected'::text, 'SubscriptionExpired'::text]))),
    CONSTRAINT dead_letters_delivery_attempts_check CHECK (((delivery_attempts >= 0) AND (delivery_attempts <= 30)))
);

COMMENT ON TABLE eventgrid.dead_letters IS 'Dead-lettered events with reason, attempts and last outcome (SPEC 7). Read them through eventgrid.dead_letter_events.';

COMMENT ON COLUMN eventgrid.dead_letters.topic_type IS 'Delivery profile of the subscription it was for: custom or namespace (sets the shape in eventgrid.dead_letter_events).';

COMMENT ON COLUMN eventgrid.dead_letters.event_id IS 'The event''s id in eventgrid.events (what publish() and INSERT ... RETURNING id gave the publisher); NULL for dead letters written before 0.4.0.';

COMMENT ON COLUMN eventgrid.dead_letters.source IS 'NULL: the event was published in this database; ''(dead-letter notification)'': a dead-letter notification the delivery workers published; else the logical replication subscription that brought it (README "Scaling out").';

COMMENT ON COLUMN eventgrid.dead_letters.source_event_id IS 'For an event brought by logical replication: its id on the server that published it.';

CREATE VIEW eventgrid.dead_letter_events AS
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

COMMENT ON VIEW eventgrid.dead_letter_events IS 'Dead-lettered events, each as the JSON document Event Grid writes for its delivery schema (SPEC 7): Event Grid schema with camelCase deadLetterReason, deliveryAttempts, lastDeliveryOutcome, lastHttpStatusCode, publishTime, lastDeliveryAttemptTime; CloudEvents with lowercase attributes; custom schema wrapped in an Event Grid envelope with the event as data. Namespace topics: {"deadLetterProperties": {deadletterreason (a sentence), deliveryattempts, deliveryresult (last outcome and HTTP status, or NotAttempted), publishutc, deliveryattemptutc}, "event": the CloudEvent}. source and source_event_id: for an event brought by logical replication, the subscription it came through and its id on the server that published it (README "Scaling out").';

CREATE TABLE eventgrid.dead_letter_notification_failures (
    id bigint NOT NULL,
    subscription_id bigint NOT NULL,
    topic text NOT NULL,
    subscription_name text NOT NULL,
    event_id bigint NOT NULL,
    dead_letter_topic text NOT NULL,
    failed_at timestamp with time zone DEFAULT now() NOT NULL,
    sqlstate text NOT NULL,
    error text NOT NULL
);

COMMENT ON TABLE eventgrid.dead_letter_notification_failures IS 'Dead-letter notifications that could not be published: the event subscription (id, topic, name), the id the event had in eventgrid.events (dead_letters.event_id), the notification topic, when, and the error (SQLSTATE and message). The dead letter itself is recorded as always; the delivery workers log each record that had such failures once. Readable by pg_monitor; eventgrid_admin reads and deletes.';

CREATE SEQUENCE eventgrid.dead_letter_notification_failures_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE eventgrid.dead_letter_notification_failures_id_seq OWNED BY eventgrid.dead_letter_notification_failures.id;

ALTER TABLE eventgrid.dead_letters ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME eventgrid.dead_letters_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE VIEW eventgrid.delivery_attempts AS
 SELECT a.id,
    a.attempted_at,
    a.topic,
    a.subscription_name AS subscription,
    a.event_ids,
    a.attempt,
    a.http_status,
    a.outcome,
    a.duration_ms,
    a.error,
    a.response_body,
    a.event_sources
   FROM eventgrid.attempt_log a;

COMMENT ON VIEW eventgrid.delivery_attempts IS 'Delivery attempt history: one row per attempt (one HTTP request; a batch names all its events): id, when it started (attempted_at, on the worker''s clock), topic, event subscription, event_ids (the ids publish() returned), attempt (1 for the first; for a batch, its first event''s, the aeg-delivery-count header plus 1), http_status (NULL: no HTTP answer), outcome (the outcome names of SPEC 3: Delivered, GenericError, Busy, NotFound, TimedOut, SocketError, ResolutionError, ...; Probation for an attempt that delayed delivery held back; Aborted for a request in flight when the worker stopped), duration_ms (libcurl''s total time of the request), error (libcurl''s message when there was no HTTP answer; for a failed answer with Retry-After, what it asked for), response_body (the first 512 bytes of a failed answer''s body, bytes outside printable ASCII as ?; NULL for a success or no body), event_sources (parallel to event_ids, for events brought by logical replication: the subscription each came through, NULL for one published here; NULL when none was: README "Scaling out"). Kept per GUC eventgrid.attempt_history (all, failures, off) for eventgrid.attempt_history_retention and eventgrid.attempt_history_max_rows. An attempt whose outcome was not yet written when the worker stopped shows as Aborted.';

CREATE TABLE eventgrid.delivery_authentications (
    subscription_id bigint NOT NULL,
    method text NOT NULL,
    token_endpoint text,
    tenant_id text,
    client_id text NOT NULL,
    client_secret text NOT NULL,
    scope text,
    audience text,
    set_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT delivery_authentications_check CHECK (((method = 'oauth2'::text) = (token_endpoint IS NOT NULL))),
    CONSTRAINT delivery_authentications_check1 CHECK (((method = 'entra'::text) = (tenant_id IS NOT NULL))),
    CONSTRAINT delivery_authentications_method_check CHECK ((method = ANY (ARRAY['oauth2'::text, 'entra'::text])))
);

COMMENT ON TABLE eventgrid.delivery_authentications IS 'Internal: the OAuth 2.0 and Microsoft Entra ID client credentials whose bearer tokens event subscriptions send; readable by the extension''s owner only (eventgrid.event_subscription_authentication shows them without the secret).';

CREATE TABLE eventgrid.delivery_properties (
    subscription_id bigint NOT NULL,
    header text NOT NULL,
    value text,
    source_field text,
    is_secret boolean DEFAULT false NOT NULL,
    CONSTRAINT delivery_properties_header_check CHECK ((eventgrid._header_problem(header, value) IS NULL)),
    CONSTRAINT delivery_properties_kind_check CHECK ((((value IS NULL) <> (source_field IS NULL)) AND (NOT (is_secret AND (source_field IS NOT NULL))))),
    CONSTRAINT delivery_properties_source_field_check CHECK (eventgrid._is_source_field(source_field))
);

COMMENT ON TABLE eventgrid.delivery_properties IS 'Custom delivery properties (HTTP headers) of event subscriptions, at most 10 each (SPEC 8). Secret values are masked in eventgrid.event_subscription_delivery_properties.';

CREATE VIEW eventgrid.delivery_statistics AS
 SELECT s.topic,
    s.name AS subscription,
    COALESCE(b.pending, (0)::bigint) AS pending,
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
    s.expiration_time,
    s.domain_topic
   FROM ((((eventgrid.event_subscriptions s
     LEFT JOIN eventgrid.subscription_counters c ON ((c.subscription_id = s.id)))
     LEFT JOIN eventgrid._backlogged_subscriptions() a(id) ON ((a.id = s.id)))
     LEFT JOIN LATERAL ( SELECT x.pending
           FROM eventgrid._backlog(s.id) x(pending, oldest, due_since)
          WHERE (a.id IS NOT NULL)
         OFFSET 0) b ON (true))
     LEFT JOIN LATERAL ( SELECT (sum(x.received))::bigint AS received,
            (sum(x.acknowledged))::bigint AS acknowledged,
            (sum(x.released))::bigint AS released,
            (sum(x.rejected))::bigint AS rejected,
            (sum(x.lock_expired))::bigint AS lock_expired
           FROM eventgrid.queue_counters x
          WHERE ((x.subscription_id = s.id) AND (s.delivery_mode = 'queue'::text))) k ON (true));

COMMENT ON VIEW eventgrid.delivery_statistics IS 'Per event subscription: deliveries pending (not yet delivered, dead-lettered or dropped, retries included), of which waiting for a retry, events delivered, failed delivery attempts (requests sent that failed; attempts held back by probation are not counted), events dead-lettered, events dropped (undeliverable with dead-lettering off), dead letters queued again by redeliver_dead_letters, whether pause_delivery() paused it (itself, its topic or everything; the GUC eventgrid.delivery_paused is not shown here), and its delivery_mode (push or queue). Of a queue event subscription (pull delivery, SPEC 14) delivered counts the events acknowledged, pending the events not yet acknowledged or dead-lettered, and received, acknowledged, released, rejected and lock_expired count the subscriber operations (NULL for push); expiration_time: when it expires (NULL: never; SPEC 17); domain_topic: of a subscription at domain-topic scope, its domain topic (topic is then its domain; SPEC 18).';

CREATE VIEW eventgrid.delivery_token_metrics AS
 SELECT d.token_endpoint,
    d.client_id,
    d.token_requests AS token_requests_total,
    d.token_failures AS token_failures_total,
    COALESCE((EXTRACT(epoch FROM d.token_expires_at))::double precision, (0)::double precision) AS token_expiry_timestamp_seconds
   FROM eventgrid._delivery_tokens() d(token_endpoint, client_id, scope, audience, token_obtained_at, token_expires_at, token_serves_until, token_requests, token_failures, last_failure_at, last_error);

COMMENT ON VIEW eventgrid.delivery_token_metrics IS 'Prometheus counters per token endpoint and client of delivery authentication: token_requests_total and token_failures_total (since the server started), and token_expiry_timestamp_seconds, when the token now kept expires (0: none). Readable by pg_monitor and eventgrid_admin. README "Monitoring".';

CREATE TABLE eventgrid.destination_credentials (
    subscription_id bigint NOT NULL,
    kind text NOT NULL,
    user_name text,
    secret text NOT NULL,
    set_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT destination_credentials_check CHECK (((user_name IS NULL) OR (kind = 'password'::text))),
    CONSTRAINT destination_credentials_kind_check CHECK ((kind = ANY (ARRAY['password'::text, 'sas'::text, 'shared_key'::text])))
);

COMMENT ON TABLE eventgrid.destination_credentials IS 'Internal: the credentials a destination is reached with (SPEC 21): kind password (a Redis server''s AUTH or a RabbitMQ broker''s login: user_name, NULL for none, and secret) or sas (a Storage queue''s SAS token), both taken out of the endpoint URL given to create_event_subscription() or update_event_subscription(), or shared_key (a Storage account''s key, set_storage_account_key()); readable by the extension''s owner only (never in a view); the delivery workers read them with each claim.';

CREATE TABLE eventgrid.domain_topic_entries (
    domain text NOT NULL,
    name text NOT NULL,
    created_automatically boolean DEFAULT false NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

COMMENT ON TABLE eventgrid.domain_topic_entries IS 'Internal: the domain topics of each domain (SPEC 18), created by create_domain_topic() or with their first subscription (created_automatically); read them through eventgrid.domain_topics.';

CREATE TABLE eventgrid.domains (
    name text NOT NULL,
    auto_create_topic_with_first_subscription boolean DEFAULT true NOT NULL,
    auto_delete_topic_with_last_subscription boolean DEFAULT true NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL
);

COMMENT ON TABLE eventgrid.domains IS 'Event domains (SPEC 18): each is a topic (eventgrid.topics, same name: it has the topic''s input schema and access keys) whose events name their domain topic; with its autoCreateTopicWithFirstSubscription and autoDeleteTopicWithLastSubscription. Made by create_domain(), dropped by drop_domain().';

CREATE VIEW eventgrid.domain_statistics AS
 SELECT d.name AS domain,
    t.input_schema,
    d.auto_create_topic_with_first_subscription,
    d.auto_delete_topic_with_last_subscription,
    ( SELECT count(*) AS count
           FROM eventgrid.domain_topic_entries e
          WHERE (e.domain = d.name)) AS domain_topics,
    ( SELECT count(*) AS count
           FROM eventgrid.event_subscriptions s
          WHERE ((s.topic = d.name) AND (s.domain_topic IS NULL))) AS domain_scope_subscriptions,
    ( SELECT count(*) AS count
           FROM eventgrid.event_subscriptions s
          WHERE ((s.topic = d.name) AND (s.domain_topic IS NOT NULL))) AS domain_topic_subscriptions,
    COALESCE(c.published, (0)::bigint) AS published
   FROM ((eventgrid.domains d
     JOIN eventgrid.topics t ON ((t.name = d.name)))
     LEFT JOIN eventgrid.topic_counters c ON ((c.topic = d.name)));

COMMENT ON VIEW eventgrid.domain_statistics IS 'Per domain (SPEC 18): its input schema and auto-create / auto-delete settings, how many domain topics it has, its event subscriptions at domain scope and at domain-topic scope, and the events published to it.';

CREATE VIEW eventgrid.domain_topics AS
 SELECT e.domain,
    e.name AS domain_topic,
    ( SELECT count(*) AS count
           FROM eventgrid.event_subscriptions s
          WHERE ((s.topic = e.domain) AND (s.domain_topic = e.name))) AS subscriptions,
    e.created_automatically,
    e.created_at
   FROM eventgrid.domain_topic_entries e;

COMMENT ON VIEW eventgrid.domain_topics IS 'Per domain topic (SPEC 18): its domain, name, how many event subscriptions it has, and whether its first subscription created it (created_automatically) or create_domain_topic() did.';

CREATE VIEW eventgrid.endpoint_health AS
 SELECT s.topic,
    s.name AS subscription,
    s.endpoint,
    COALESCE(h.state, 'healthy'::text) AS state,
    h.probation_until,
    h.probation_started_at,
    h.probation_cause,
    COALESCE(h.probations, 0) AS probations,
    COALESCE(h.consecutive_failures, 0) AS consecutive_failures,
    h.last_failure_outcome,
    h.updated_at
   FROM (eventgrid.event_subscriptions s
     LEFT JOIN eventgrid.endpoint_states h ON ((h.endpoint = s.endpoint)));

COMMENT ON VIEW eventgrid.endpoint_health IS 'Per event subscription, the health of its endpoint (subscriptions with the same endpoint URL share it): state healthy, probation (nothing is sent until probation_until) or probing (probation is over and one request is testing the endpoint); consecutive failed delivery attempts; the outcome that started the probation and when; probations in a row since the last success (each lasts twice the one before, at most 4 hours). Times are the delivery worker''s clock (eventgrid.clock_offset included). SPEC 6.';

CREATE VIEW eventgrid.event_subscription_authentication AS
 SELECT s.topic,
    s.name AS subscription,
    a.method,
    e.token_endpoint,
    a.client_id,
    a.scope,
    a.audience,
    a.set_at,
    t.token_obtained_at,
    t.token_expires_at,
    t.token_serves_until,
    COALESCE(t.token_requests, (0)::bigint) AS token_requests,
    COALESCE(t.token_failures, (0)::bigint) AS token_failures,
    t.last_failure_at,
    t.last_error
   FROM (((eventgrid.delivery_authentications a
     JOIN eventgrid.event_subscriptions s ON ((s.id = a.subscription_id)))
     CROSS JOIN LATERAL ( SELECT
                CASE a.method
                    WHEN 'entra'::text THEN (((rtrim(current_setting('eventgrid.entra_authority'::text, true), '/'::text) || '/'::text) || a.tenant_id) || '/oauth2/v2.0/token'::text)
                    ELSE a.token_endpoint
                END AS token_endpoint) e)
     LEFT JOIN LATERAL ( SELECT d.token_endpoint,
            d.client_id,
            d.scope,
            d.audience,
            d.token_obtained_at,
            d.token_expires_at,
            d.token_serves_until,
            d.token_requests,
            d.token_failures,
            d.last_failure_at,
            d.last_error
           FROM eventgrid._delivery_tokens() d(token_endpoint, client_id, scope, audience, token_obtained_at, token_expires_at, token_serves_until, token_requests, token_failures, last_failure_at, last_error)
          WHERE ((d.token_endpoint = e.token_endpoint) AND (d.client_id = a.client_id) AND (NOT (d.scope IS DISTINCT FROM a.scope)) AND (NOT (d.audience IS DISTINCT FROM a.audience)))) t ON (true));

COMMENT ON VIEW eventgrid.event_subscription_authentication IS 'The event subscriptions that send bearer tokens (SPEC 12): topic, subscription, method (oauth2 or entra), token_endpoint, client_id, scope, audience, set_at, and from the workers'' shared memory token_obtained_at, token_expires_at and token_serves_until (expires_in less min(10 %, 60 s); NULL: no token now), token_requests and token_failures (since the server started or the token was last asked for after a while unused), last_failure_at and last_error (what the token endpoint answered; NULL once a token came); never the secret or a token. Readable by eventgrid_admin.';

CREATE VIEW eventgrid.event_subscription_batching AS
 SELECT s.topic,
    s.name AS subscription,
    ((s.max_events_per_batch IS NOT NULL) OR (s.preferred_batch_size_in_kilobytes IS NOT NULL)) AS batching,
        CASE
            WHEN ((s.max_events_per_batch IS NOT NULL) OR (s.preferred_batch_size_in_kilobytes IS NOT NULL)) THEN COALESCE(s.max_events_per_batch, COALESCE(( SELECT (g.setting)::integer AS setting
               FROM pg_settings g
              WHERE (g.name = 'eventgrid.default_max_events_per_batch'::text)), 10))
            ELSE 1
        END AS max_events_per_batch,
        CASE
            WHEN ((s.max_events_per_batch IS NOT NULL) OR (s.preferred_batch_size_in_kilobytes IS NOT NULL)) THEN COALESCE(s.preferred_batch_size_in_kilobytes, COALESCE(( SELECT (g.setting)::integer AS setting
               FROM pg_settings g
              WHERE (g.name = 'eventgrid.default_preferred_batch_size_in_kilobytes'::text)), 64))
            ELSE NULL::integer
        END AS preferred_batch_size_in_kilobytes,
        CASE
            WHEN (s.max_events_per_batch IS NOT NULL) THEN 'subscription'::text
            WHEN (s.preferred_batch_size_in_kilobytes IS NOT NULL) THEN 'eventgrid.default_max_events_per_batch'::text
            ELSE 'batching off'::text
        END AS max_events_per_batch_from,
        CASE
            WHEN (s.preferred_batch_size_in_kilobytes IS NOT NULL) THEN 'subscription'::text
            WHEN (s.max_events_per_batch IS NOT NULL) THEN 'eventgrid.default_preferred_batch_size_in_kilobytes'::text
            ELSE 'batching off'::text
        END AS preferred_batch_size_from,
    s.max_events_per_second
   FROM eventgrid.event_subscriptions s;

COMMENT ON VIEW eventgrid.event_subscription_batching IS 'Per event subscription, the output batching the delivery worker applies (SPEC 5): off (one event per request), or the event count and size ceiling it uses, each from the subscription or, where the subscription set only the other one, from GUC eventgrid.default_max_events_per_batch / eventgrid.default_preferred_batch_size_in_kilobytes (the server''s values; 10 and 64 when the library is not loaded), and the rate limit, max_events_per_second (NULL: none).';

CREATE VIEW eventgrid.event_subscription_certificates AS
 SELECT s.topic,
    s.name AS subscription,
    c.subject,
    c.not_after,
    (c.not_after < (now() + '7 days'::interval)) AS expires_within_7_days,
    c.set_at
   FROM (eventgrid.client_certificates c
     JOIN eventgrid.event_subscriptions s ON ((s.id = c.subscription_id)));

COMMENT ON VIEW eventgrid.event_subscription_certificates IS 'The event subscriptions that present a client certificate (mutual TLS): topic, subscription, the certificate''s subject (RFC 2253) and not_after, expires_within_7_days, set_at; never the key. Readable by eventgrid_admin.';

CREATE VIEW eventgrid.event_subscription_delivery_properties AS
 SELECT s.topic,
    s.name AS subscription,
    p.header,
        CASE
            WHEN (p.source_field IS NOT NULL) THEN 'dynamic'::text
            WHEN p.is_secret THEN 'secret'::text
            ELSE 'static'::text
        END AS kind,
        CASE
            WHEN p.is_secret THEN '********'::text
            ELSE p.value
        END AS value,
    p.source_field
   FROM (eventgrid.delivery_properties p
     JOIN eventgrid.event_subscriptions s ON ((s.id = p.subscription_id)));

COMMENT ON VIEW eventgrid.event_subscription_delivery_properties IS 'Custom delivery properties of each event subscription; secret values are shown as ********.';

CREATE VIEW eventgrid.event_subscription_expiration_metrics AS
 SELECT s.read_key AS topic,
    s.name AS event_subscription,
    (EXTRACT(epoch FROM s.expiration_time))::double precision AS expiration_timestamp_seconds
   FROM eventgrid.event_subscriptions s
  WHERE (s.expiration_time IS NOT NULL);

COMMENT ON VIEW eventgrid.event_subscription_expiration_metrics IS 'Prometheus gauge per event subscription that expires: expiration_timestamp_seconds, its expiration_time as Unix time (the alert EventgridSubscriptionExpiring fires a day before). Readable by pg_monitor and eventgrid_admin. README "Expiration", SPEC 17.';

CREATE TABLE eventgrid.subscription_metric_counts (
    subscription_id bigint NOT NULL,
    metric text NOT NULL,
    label text NOT NULL,
    value double precision NOT NULL,
    CONSTRAINT subscription_metric_counts_metric_check CHECK ((metric = ANY (ARRAY['attempt_fail'::text, 'dead_lettered'::text, 'dropped'::text, 'processing_bucket'::text, 'processing_sum'::text, 'latency_bucket'::text, 'latency_sum'::text])))
);

COMMENT ON TABLE eventgrid.subscription_metric_counts IS 'Internal: per event subscription, failed delivery attempts by outcome (attempt_fail), events dead-lettered and dropped by reason, and the histograms of the destination''s processing duration per request and of publish-to-delivery latency per event (label: the bucket''s upper bound in seconds; *_sum: seconds in all); kept by the delivery workers with the outcomes. Read it through eventgrid.event_subscription_metrics, event_subscription_metric_labels and event_subscription_histograms.';

CREATE VIEW eventgrid.event_subscription_histograms AS
 SELECT x.topic,
    x.name AS event_subscription,
    x.histogram,
    x.le_text AS le,
    sum(x.n) OVER (PARTITION BY x.id, x.histogram ORDER BY x.le) AS bucket,
    x.total AS sum,
    sum(x.n) OVER (PARTITION BY x.id, x.histogram) AS count
   FROM ( SELECT (s.id)::text AS id,
            s.read_key AS topic,
            s.name,
            h.histogram,
            b.le,
            l.le_text,
            COALESCE(m.value, (0)::double precision) AS n,
            COALESCE(ms.value, (0)::double precision) AS total
           FROM (((((eventgrid.event_subscriptions s
             CROSS JOIN ( VALUES ('destination_processing_duration_seconds'::text,'processing'::text), ('delivery_latency_seconds'::text,'latency'::text)) h(histogram, kind))
             CROSS JOIN LATERAL unnest(eventgrid._histogram_buckets(h.histogram)) b(le))
             CROSS JOIN LATERAL ( SELECT
                        CASE
                            WHEN (b.le = 'Infinity'::double precision) THEN '+Inf'::text
                            ELSE (b.le)::text
                        END AS le) l(le_text))
             LEFT JOIN eventgrid.subscription_metric_counts m ON (((m.subscription_id = s.id) AND (m.metric = (h.kind || '_bucket'::text)) AND (m.label = l.le_text))))
             LEFT JOIN eventgrid.subscription_metric_counts ms ON (((ms.subscription_id = s.id) AND (ms.metric = (h.kind || '_sum'::text)) AND (ms.label = ''::text))))
          WHERE (NOT eventgrid._metrics_per_topic())
        UNION ALL
         SELECT t.topic AS id,
            t.topic,
            ''::text AS name,
            h.histogram,
            b.le,
            l.le_text,
            COALESCE(m.value, (0)::double precision) AS n,
            COALESCE(ms.value, (0)::double precision) AS total
           FROM (((((( SELECT DISTINCT s.topic
                   FROM eventgrid.event_subscriptions s
                  WHERE eventgrid._metrics_per_topic()) t
             CROSS JOIN ( VALUES ('destination_processing_duration_seconds'::text,'processing'::text), ('delivery_latency_seconds'::text,'latency'::text)) h(histogram, kind))
             CROSS JOIN LATERAL unnest(eventgrid._histogram_buckets(h.histogram)) b(le))
             CROSS JOIN LATERAL ( SELECT
                        CASE
                            WHEN (b.le = 'Infinity'::double precision) THEN '+Inf'::text
                            ELSE (b.le)::text
                        END AS le) l(le_text))
             LEFT JOIN ( SELECT s.topic,
                    c.metric,
                    c.label,
                    sum(c.value) AS value
                   FROM (eventgrid.subscription_metric_counts c
                     JOIN eventgrid.event_subscriptions s ON ((s.id = c.subscription_id)))
                  WHERE ((c.metric = ANY (ARRAY['processing_bucket'::text, 'latency_bucket'::text])) AND eventgrid._metrics_per_topic())
                  GROUP BY s.topic, c.metric, c.label) m ON (((m.topic = t.topic) AND (m.metric = (h.kind || '_bucket'::text)) AND (m.label = l.le_text))))
             LEFT JOIN ( SELECT s.topic,
                    c.metric,
                    sum(c.value) AS value
                   FROM (eventgrid.subscription_metric_counts c
                     JOIN eventgrid.event_subscriptions s ON ((s.id = c.subscription_id)))
                  WHERE ((c.metric = ANY (ARRAY['processing_sum'::text, 'latency_sum'::text])) AND (c.label = ''::text) AND eventgrid._metrics_per_topic())
                  GROUP BY s.topic, c.metric) ms ON (((ms.topic = t.topic) AND (ms.metric = (h.kind || '_sum'::text)))))) x;

COMMENT ON VIEW eventgrid.event_subscription_histograms IS 'Prometheus histograms per event subscription, one row per bucket: histogram destination_processing_duration_seconds (each request that got an HTTP answer, from sending to the answer: DestinationProcessingDurationInMs) or delivery_latency_seconds (each event delivered, from publish to the successful answer); le (the bucket''s upper bound in seconds, +Inf last), bucket (observations up to le, cumulative), sum (seconds in all) and count (observations; the +Inf bucket). Kept by the delivery workers as they record outcomes, not computed from the attempt history. With the GUC eventgrid.metrics_per_topic on, one histogram per topic (a domain for all its domain topics), event_subscription '''', summed over its subscriptions (SPEC 20). Readable by pg_monitor and eventgrid_admin. README "Monitoring".';

CREATE VIEW eventgrid.event_subscription_metric_labels AS
 WITH per_subscription AS (
         SELECT s.read_key AS topic,
            s.name AS event_subscription,
            'delivery_attempt_fail_total'::text AS metric,
            m.label,
            m.value
           FROM (eventgrid.event_subscriptions s
             JOIN eventgrid.subscription_metric_counts m ON (((m.subscription_id = s.id) AND (m.metric = 'attempt_fail'::text))))
        UNION ALL
         SELECT s.read_key AS topic,
            s.name AS event_subscription,
            (k.metric || '_total'::text) AS metric,
            r.reason AS label,
            COALESCE(m.value, (0)::double precision) AS value
           FROM (((eventgrid.event_subscriptions s
             CROSS JOIN ( VALUES ('dead_lettered'::text), ('dropped'::text)) k(metric))
             CROSS JOIN LATERAL unnest(eventgrid._dead_letter_reasons(s.delivery_mode)) r(reason))
             LEFT JOIN eventgrid.subscription_metric_counts m ON (((m.subscription_id = s.id) AND (m.metric = k.metric) AND (m.label = r.reason))))
        )
 SELECT p.topic,
    p.event_subscription,
    p.metric,
    p.label,
    p.value
   FROM per_subscription p
  WHERE (NOT eventgrid._metrics_per_topic())
UNION ALL
 SELECT s.topic,
    ''::text AS event_subscription,
    'delivery_attempt_fail_total'::text AS metric,
    m.label,
    sum(m.value) AS value
   FROM (eventgrid.event_subscriptions s
     JOIN eventgrid.subscription_metric_counts m ON (((m.subscription_id = s.id) AND (m.metric = 'attempt_fail'::text))))
  WHERE eventgrid._metrics_per_topic()
  GROUP BY s.topic, m.label
UNION ALL
 SELECT r.topic,
    ''::text AS event_subscription,
    (k.metric || '_total'::text) AS metric,
    r.reason AS label,
    COALESCE(m.value, (0)::double precision) AS value
   FROM ((( SELECT DISTINCT t.topic,
            x.reason
           FROM (( SELECT DISTINCT s.topic,
                    s.delivery_mode
                   FROM eventgrid.event_subscriptions s
                  WHERE eventgrid._metrics_per_topic()) t
             CROSS JOIN LATERAL unnest(eventgrid._dead_letter_reasons(t.delivery_mode)) x(reason))) r
     CROSS JOIN ( VALUES ('dead_lettered'::text), ('dropped'::text)) k(metric))
     LEFT JOIN ( SELECT s.topic,
            c.metric,
            c.label,
            sum(c.value) AS value
           FROM (eventgrid.subscription_metric_counts c
             JOIN eventgrid.event_subscriptions s ON ((s.id = c.subscription_id)))
          WHERE ((c.metric = ANY (ARRAY['dead_lettered'::text, 'dropped'::text])) AND eventgrid._metrics_per_topic())
          GROUP BY s.topic, c.metric, c.label) m ON (((m.topic = r.topic) AND (m.metric = k.metric) AND (m.label = r.reason))));

COMMENT ON VIEW eventgrid.event_subscription_metric_labels IS 'Prometheus counters per event subscription and label: delivery_attempt_fail_total by outcome (label: the lastDeliveryOutcome of each failed attempt, one per event; DeliveryAttemptFailCount; a row once an attempt failed so), dead_lettered_total and dropped_total by reason (label: deadLetterReason; DeadLetteredCount, DroppedEventCount; every reason always, 0 until it happens). Counted from 0.9.0 on. With the GUC eventgrid.metrics_per_topic on, one row per topic (a domain for all its domain topics), metric and label, with event_subscription '''' and the sum (SPEC 20). Readable by pg_monitor and eventgrid_admin. README "Monitoring".';

CREATE VIEW eventgrid.event_subscription_metrics AS
 SELECT m.topic,
    m.event_subscription,
    m.matched_events_total,
    m.delivery_success_total,
    m.pending_events,
    m.oldest_pending_event_age_seconds,
    m.overdue_seconds,
    m.paused,
    m.endpoint_on_probation
   FROM eventgrid._event_subscription_metrics() m(topic, event_subscription, matched_events_total, delivery_success_total, pending_events, oldest_pending_event_age_seconds, overdue_seconds, paused, endpoint_on_probation)
  WHERE (NOT eventgrid._metrics_per_topic())
UNION ALL
 SELECT split_part(m.topic, '/'::text, 1) AS topic,
    ''::text AS event_subscription,
    (sum(m.matched_events_total))::bigint AS matched_events_total,
    (sum(m.delivery_success_total))::bigint AS delivery_success_total,
    (sum(m.pending_events))::bigint AS pending_events,
    COALESCE(max(m.oldest_pending_event_age_seconds) FILTER (WHERE (m.paused = 0)), (0)::double precision) AS oldest_pending_event_age_seconds,
    COALESCE(max(m.overdue_seconds) FILTER (WHERE (m.paused = 0)), (0)::double precision) AS overdue_seconds,
    min(m.paused) AS paused,
    (sum(m.endpoint_on_probation))::integer AS endpoint_on_probation
   FROM eventgrid._event_subscription_metrics() m(topic, event_subscription, matched_events_total, delivery_success_total, pending_events, oldest_pending_event_age_seconds, overdue_seconds, paused, endpoint_on_probation)
  WHERE eventgrid._metrics_per_topic()
  GROUP BY (split_part(m.topic, '/'::text, 1));

COMMENT ON VIEW eventgrid.event_subscription_metrics IS 'Prometheus metrics per event subscription: counters matched_events_total (MatchedEventCount) and delivery_success_total (events delivered, DeliverySuccessCount); gauges pending_events (deliveries not finished, as delivery_statistics.pending), oldest_pending_event_age_seconds (since the oldest of them was published; 0 when none), overdue_seconds (how long the delivery due longest has been due: an event not attempted yet since its publish, a retry since its next attempt time; 0 when none is due; grows when nothing delivers), paused (1 when pause_delivery() holds it) and endpoint_on_probation (1 while its endpoint is on probation or probing, SPEC 6). With the GUC eventgrid.metrics_per_topic on, one row per topic (a domain for all its domain topics) with event_subscription '''': the sums, the oldest age and overdue time of its subscriptions not paused, paused 1 when every one is, endpoint_on_probation the number on probation (SPEC 20). Readable by pg_monitor and eventgrid_admin. README "Monitoring".';

CREATE TABLE eventgrid.receive_grants (
    topic text NOT NULL,
    subscription_id bigint,
    role_name name NOT NULL,
    granted_at timestamp with time zone DEFAULT now() NOT NULL,
    granted_by name NOT NULL,
    role_oid oid NOT NULL
);

COMMENT ON TABLE eventgrid.receive_grants IS 'Internal: what grant_receive() granted: role role_oid (its name role_name, kept current by the upkeep worker) may receive from queue event subscription subscription_id of topic (NULL: every queue event subscription of the topic, present and future). The role is named by OID: renamed, it keeps the grant; dropped, its grants are deleted; a new role of the same name gets nothing. Restored from a dump, a grant is bound to the role of its role_name (as pg_dump does for privileges) by a trigger; the view event_subscription_receivers shows them.';

COMMENT ON COLUMN eventgrid.receive_grants.role_oid IS 'The role granted (pg_roles.oid); 0 when a restore found no role of role_name.';

CREATE VIEW eventgrid.event_subscription_receivers AS
 SELECT g.topic,
    s.name AS subscription,
    COALESCE(r.rolname, g.role_name) AS role_name,
    (r.oid IS NOT NULL) AS role_exists,
    g.granted_at,
    g.granted_by
   FROM ((eventgrid.receive_grants g
     LEFT JOIN eventgrid.event_subscriptions s ON ((s.id = g.subscription_id)))
     LEFT JOIN pg_roles r ON ((r.oid = g.role_oid)))
  ORDER BY g.topic, s.name NULLS FIRST, COALESCE(r.rolname, g.role_name);

COMMENT ON VIEW eventgrid.event_subscription_receivers IS 'The receive rights grant_receive() gave (SPEC 14): per row, a role that may call receive(), acknowledge(), release(), reject() and renew_locks() on queue event subscription subscription of topic (NULL: every queue event subscription of the topic), by its current name (a renamed role keeps its grants; a dropped one loses them), whether it exists (false only until the upkeep worker deletes a dropped role''s grants, or for a restored grant whose role is missing), when and by whom it was granted. Members of eventgrid_receiver reach every queue without a row here. For eventgrid_admin.';

CREATE TABLE eventgrid.signing_secrets (
    subscription_id bigint NOT NULL,
    secret text NOT NULL,
    previous_secret text,
    previous_valid_until timestamp with time zone,
    set_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT signing_secrets_check CHECK (((previous_secret IS NULL) = (previous_valid_until IS NULL))),
    CONSTRAINT signing_secrets_previous_secret_check CHECK ((eventgrid._signing_secret_problem(previous_secret) IS NULL)),
    CONSTRAINT signing_secrets_secret_check CHECK ((eventgrid._signing_secret_problem(secret) IS NULL))
);

COMMENT ON TABLE eventgrid.signing_secrets IS 'Internal: the Standard Webhooks signing secrets of event subscriptions; readable by the extension''s owner only (eventgrid.event_subscription_signing shows them masked).';

CREATE VIEW eventgrid.event_subscription_signing AS
 SELECT s.topic,
    s.name AS subscription,
    '********'::text AS secret,
        CASE
            WHEN (k.previous_valid_until > now()) THEN '********'::text
            ELSE NULL::text
        END AS previous_secret,
        CASE
            WHEN (k.previous_valid_until > now()) THEN k.previous_valid_until
            ELSE NULL::timestamp with time zone
        END AS previous_valid_until,
    k.set_at
   FROM (eventgrid.signing_secrets k
     JOIN eventgrid.event_subscriptions s ON ((s.id = k.subscription_id)));

COMMENT ON VIEW eventgrid.event_subscription_signing IS 'The signed event subscriptions: topic, subscription, secret (always ********), previous_secret (******** while a replaced secret still signs) and previous_valid_until, set_at. Readable by eventgrid_admin.';

CREATE VIEW eventgrid.event_subscription_validation AS
 SELECT s.topic,
    s.name AS subscription,
        CASE
            WHEN (v.subscription_id IS NULL) THEN 'none'::text
            ELSE 'handshake'::text
        END AS endpoint_validation,
        CASE
            WHEN (v.subscription_id IS NULL) THEN NULL::text
            WHEN (s.event_delivery_schema = 'CloudEventSchemaV1_0'::text) THEN 'CloudEvents OPTIONS'::text
            ELSE 'SubscriptionValidationEvent'::text
        END AS handshake,
    COALESCE(v.state, 'Succeeded'::text) AS provisioning_state,
    v.started_at,
    v.tries,
    v.last_error,
    v.validated_at,
    (v.manual_since + '00:10:00'::interval) AS manual_validation_until
   FROM (eventgrid.event_subscriptions s
     LEFT JOIN eventgrid.endpoint_validations v ON ((v.subscription_id = s.id)));

COMMENT ON VIEW eventgrid.event_subscription_validation IS 'Per event subscription, its endpoint validation: endpoint_validation (none or handshake), the handshake sent (SubscriptionValidationEvent, or the CloudEvents OPTIONS request), Event Grid''s provisioning_state (Creating, AwaitingManualAction, Succeeded, Failed; Succeeded without validation), when it started, tries, the last error, when it was validated and until when validate_event_subscription() is accepted. Nothing is delivered to a subscription until Succeeded. Readable by eventgrid_admin; the validation code is not shown.';

ALTER TABLE eventgrid.event_subscriptions ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME eventgrid.event_subscriptions_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE eventgrid.event_table_rotations (
    event_table smallint NOT NULL,
    truncated_at timestamp with time zone,
    last_try_at timestamp with time zone,
    last_failure text
);

COMMENT ON TABLE eventgrid.event_table_rotations IS 'Internal: when the delivery worker last emptied each event table, and why its last try failed. Read through eventgrid.event_tables.';

CREATE VIEW eventgrid.event_tables AS
 SELECT r.event_table,
    format('eventgrid.events_%s'::text, r.event_table) AS table_name,
    (r.event_table = eventgrid._event_table()) AS current,
    pg_total_relation_size((format('eventgrid.events_%s'::text, r.event_table))::regclass) AS bytes,
    eventgrid._event_table_holders(r.event_table) AS waiting_for,
    r.truncated_at,
    r.last_try_at,
    r.last_failure
   FROM eventgrid.event_table_rotations r;

COMMENT ON VIEW eventgrid.event_tables IS 'The three event tables that take turns: which one new events go to now (current), size in bytes, what must pass their events before the delivery worker may empty them with TRUNCATE (waiting_for; NULL: nothing), when it last did, and why its last try failed (e.g. another session held a lock on the table).';

CREATE TABLE eventgrid.events_0 (
    id bigint DEFAULT eventgrid._new_event_id() NOT NULL,
    topic text NOT NULL,
    event jsonb NOT NULL,
    publish_time timestamp with time zone NOT NULL,
    event_bytes integer,
    txid xid8 DEFAULT pg_current_xact_id() NOT NULL,
    event_table smallint DEFAULT eventgrid._event_table() NOT NULL,
    source text,
    source_event_id bigint,
    domain_topic text
);

CREATE TABLE eventgrid.events_1 (
    id bigint DEFAULT eventgrid._new_event_id() NOT NULL,
    topic text NOT NULL,
    event jsonb NOT NULL,
    publish_time timestamp with time zone NOT NULL,
    event_bytes integer,
    txid xid8 DEFAULT pg_current_xact_id() NOT NULL,
    event_table smallint DEFAULT eventgrid._event_table() NOT NULL,
    source text,
    source_event_id bigint,
    domain_topic text
);

CREATE TABLE eventgrid.events_2 (
    id bigint DEFAULT eventgrid._new_event_id() NOT NULL,
    topic text NOT NULL,
    event jsonb NOT NULL,
    publish_time timestamp with time zone NOT NULL,
    event_bytes integer,
    txid xid8 DEFAULT pg_current_xact_id() NOT NULL,
    event_table smallint DEFAULT eventgrid._event_table() NOT NULL,
    source text,
    source_event_id bigint,
    domain_topic text
);

CREATE SEQUENCE eventgrid.events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE eventgrid.events_id_seq OWNED BY eventgrid.events.id;

CREATE TABLE eventgrid.expired_event_subscriptions (
    id bigint NOT NULL,
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

COMMENT ON TABLE eventgrid.expired_event_subscriptions IS 'The final counts of each event subscription the upkeep worker dropped because its expiration_time came (SPEC 17), one row per drop: topic (''domain/topic'' for a domain topic''s), event_subscription, its id, delivery_mode, expiration_time, dropped_at (the workers'' clock), whether it dead-lettered, and its totals from creation to drop as delivery_statistics showed them: matched_events, delivered_events (acknowledged, for a queue subscription), failed_delivery_attempts, dead_lettered_events and dropped_events (these two include owed_at_expiration: the events it still owed when dropped, dead-lettered with reason SubscriptionExpired, or dropped). Rows stay until an administrator deletes them. Readable by pg_monitor and eventgrid_admin (who may delete).';

CREATE SEQUENCE eventgrid.expired_event_subscriptions_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE eventgrid.expired_event_subscriptions_id_seq OWNED BY eventgrid.expired_event_subscriptions.id;

CREATE TABLE eventgrid.http_publish_counts (
    topic text,
    outcome text NOT NULL,
    requests bigint DEFAULT 0 NOT NULL,
    latency_ms_sum double precision DEFAULT 0 NOT NULL,
    CONSTRAINT http_publish_counts_outcome_check CHECK ((outcome = ANY (ARRAY['Success'::text, 'Unauthorized'::text, 'BadRequest'::text, 'NotFound'::text, 'MethodNotAllowed'::text, 'PayloadTooLarge'::text, 'ServiceUnavailable'::text, 'Other'::text])))
);

COMMENT ON TABLE eventgrid.http_publish_counts IS 'Internal: publish requests the HTTP listener answered (SPEC 16), per topic (NULL: the URL named no topic of this database) and outcome: Success (200) or the error code of the answer (Unauthorized 401, BadRequest 400, NotFound 404, MethodNotAllowed 405, PayloadTooLarge 413, ServiceUnavailable 503, Other); requests, and for successes the milliseconds from the whole request read to its answer, summed. Written by the listener every 5 s. Read it through topic_publish_metrics and metrics.';

CREATE VIEW eventgrid.metrics AS
 SELECT t.name AS topic,
    NULL::text AS event_subscription,
    m.metric_name,
    m.aggregation,
    m.unit,
    m.value
   FROM (((eventgrid.topics t
     LEFT JOIN eventgrid.topic_counters c ON ((c.topic = t.name)))
     CROSS JOIN LATERAL ( SELECT (COALESCE(sum(h.requests) FILTER (WHERE (h.outcome <> 'Success'::text)), (0)::numeric))::double precision AS failed,
            (sum(h.latency_ms_sum) FILTER (WHERE (h.outcome = 'Success'::text)) / (NULLIF(sum(h.requests) FILTER (WHERE (h.outcome = 'Success'::text)), (0)::numeric))::double precision) AS latency
           FROM eventgrid.http_publish_counts h
          WHERE (h.topic = t.name)) p)
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

CREATE VIEW eventgrid.ordering_metrics AS
 SELECT s.read_key AS topic,
    s.name AS subscription,
    s.ordering_key,
    COALESCE(b.blocked_keys, (0)::bigint) AS blocked_keys,
    COALESCE(w.waiting_events, (0)::bigint) AS waiting_events
   FROM ((eventgrid.event_subscriptions s
     LEFT JOIN ( SELECT k.subscription_id,
            count(*) AS blocked_keys
           FROM (eventgrid.ordering_keys k
             JOIN eventgrid.retries h ON ((h.id = k.head_id)))
          WHERE ((h.attempts > 0) AND (EXISTS ( SELECT 1
                   FROM eventgrid.retries x
                  WHERE ((x.subscription_id = k.subscription_id) AND (x.ordering_key_hash = k.ordering_key_hash) AND (x.ordering_key IS NOT NULL) AND (x.id > k.head_id)))))
          GROUP BY k.subscription_id) b ON ((b.subscription_id = s.id)))
     LEFT JOIN ( SELECT x.subscription_id,
            count(*) AS waiting_events
           FROM eventgrid.retries x
          WHERE ((x.ordering_key IS NOT NULL) AND (x.next_attempt_at = 'infinity'::timestamp with time zone))
          GROUP BY x.subscription_id) w ON ((w.subscription_id = s.id)))
  WHERE (s.ordering_key IS NOT NULL);

COMMENT ON VIEW eventgrid.ordering_metrics IS 'Prometheus gauges per ordered event subscription (SPEC 13): blocked_keys, the keys whose oldest event has failed and holds others back (eventgrid.blocked_ordering_keys lists them), and waiting_events, the events waiting for an earlier one of their key. Readable by pg_monitor and eventgrid_admin. README "Monitoring".';

CREATE SEQUENCE eventgrid.queue_batches_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE eventgrid.queue_batches_id_seq OWNED BY eventgrid.queue_batches.id;

CREATE SEQUENCE eventgrid.queue_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE eventgrid.queue_events_id_seq OWNED BY eventgrid.queue_events.id;

CREATE VIEW eventgrid.queue_metrics AS
 SELECT s.read_key AS topic,
    s.name AS event_subscription,
    COALESCE(k.received, (0)::bigint) AS received_total,
    COALESCE(k.acknowledged, (0)::bigint) AS acknowledged_total,
    COALESCE(k.released, (0)::bigint) AS released_total,
    COALESCE(k.rejected, (0)::bigint) AS rejected_total,
    COALESCE(k.lock_expired, (0)::bigint) AS lock_expired_total,
    COALESCE(c.dead_lettered, (0)::bigint) AS dead_lettered_total,
    COALESCE(c.dropped, (0)::bigint) AS dropped_total,
    (q.receivable + b.receivable) AS receivable_events,
    q.locked AS locked_events,
    q.delayed AS delayed_events,
    COALESCE((EXTRACT(epoch FROM (eventgrid._now() - LEAST(q.oldest, b.oldest))))::double precision, (0)::double precision) AS oldest_receivable_event_age_seconds
   FROM ((((eventgrid.event_subscriptions s
     LEFT JOIN ( SELECT x.subscription_id,
            (sum(x.received))::bigint AS received,
            (sum(x.acknowledged))::bigint AS acknowledged,
            (sum(x.released))::bigint AS released,
            (sum(x.rejected))::bigint AS rejected,
            (sum(x.lock_expired))::bigint AS lock_expired
           FROM eventgrid.queue_counters x
          GROUP BY x.subscription_id) k ON ((k.subscription_id = s.id)))
     LEFT JOIN eventgrid.subscription_counters c ON ((c.subscription_id = s.id)))
     CROSS JOIN LATERAL ( SELECT count(*) FILTER (WHERE (e.receivable_at <= eventgrid._now())) AS receivable,
            count(*) FILTER (WHERE ((e.lock_secret IS NOT NULL) AND (e.receivable_at > eventgrid._now()))) AS locked,
            count(*) FILTER (WHERE ((e.lock_secret IS NULL) AND (e.receivable_at > eventgrid._now()))) AS delayed,
            min(e.publish_time) FILTER (WHERE (e.receivable_at <= eventgrid._now())) AS oldest
           FROM eventgrid.queue_events e
          WHERE (e.subscription_id = s.id)) q)
     CROSS JOIN LATERAL ( SELECT COALESCE(sum(cardinality(x.event_ids)), (0)::bigint) AS receivable,
            min(x.oldest_publish_time) AS oldest
           FROM eventgrid.queue_batches x
          WHERE (x.subscription_id = s.id)) b)
  WHERE (s.delivery_mode = 'queue'::text);

COMMENT ON VIEW eventgrid.queue_metrics IS 'Pull delivery (SPEC 14), per queue event subscription: Event Grid''s pull metrics as Prometheus counters (received_total: events returned by receive(), each receive of an event counted; acknowledged_total, released_total, rejected_total; lock_expired_total: locks that ran out, counted when their event is next received or dead-lettered; dead_lettered_total and dropped_total, all reasons) and gauges: receivable_events (can be received now), locked_events (received, lock running), delayed_events (released with a delay), oldest_receivable_event_age_seconds (since the publish of the oldest receivable event; 0: none). Readable by pg_monitor and eventgrid_admin. README "Pull delivery".';

CREATE TABLE eventgrid.rejected_events (
    id bigint NOT NULL,
    source text NOT NULL,
    source_event_id bigint,
    topic text,
    event jsonb,
    reason text NOT NULL,
    rejected_at timestamp with time zone DEFAULT now() NOT NULL
);

COMMENT ON TABLE eventgrid.rejected_events IS 'Rows logical replication brought into eventgrid.events that a publish here would have refused (not a JSON object, a required field of the topic''s schema missing, a control character in a field sent as a header, over 1 MB, no topic or no event): source (the subscription), source_event_id (the id it had where it was published, when sent), topic, event (as it came), reason (the error a publish would have raised), rejected_at. They are not delivered; replication goes on. Readable by pg_monitor and eventgrid_admin, who may delete rows once seen. README "Scaling out".';

CREATE SEQUENCE eventgrid.rejected_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

ALTER SEQUENCE eventgrid.rejected_events_id_seq OWNED BY eventgrid.rejected_events.id;

CREATE VIEW eventgrid.replication_slots AS
 SELECT _replication_slots.slot_name,
    _replication_slots.active,
    _replication_slots.active_pid,
    _replication_slots.lag_bytes,
    _replication_slots.retained_bytes,
    _replication_slots.replay_lag_seconds
   FROM eventgrid._replication_slots() _replication_slots(slot_name, active, active_pid, lag_bytes, retained_bytes, replay_lag_seconds);

COMMENT ON VIEW eventgrid.replication_slots IS 'Application server side of README "Scaling out": each logical replication slot (pgoutput) of this database, one per delivery server subscribed: slot_name, active (a delivery server is connected), active_pid, lag_bytes (WAL written here that the delivery server has not confirmed yet), retained_bytes (WAL the slot keeps on this server''s disk; grows while a delivery server is away), replay_lag_seconds (pg_stat_replication.replay_lag: how long the last changes took to be applied there; 0 when caught up or not connected). Readable by pg_monitor and eventgrid_admin.';

CREATE VIEW eventgrid.replication_sources AS
 SELECT _replication_sources.source,
    _replication_sources.enabled,
    _replication_sources.apply_pid,
    _replication_sources.transactions,
    _replication_sources.last_publish_time,
    _replication_sources.last_applied_at,
    _replication_sources.apply_lag_seconds,
    _replication_sources.received_lsn,
    _replication_sources.last_msg_receipt_time,
    _replication_sources.unknown_topic_events
   FROM eventgrid._replication_sources() _replication_sources(source, enabled, apply_pid, transactions, last_publish_time, last_applied_at, apply_lag_seconds, received_lsn, last_msg_receipt_time, unknown_topic_events);

COMMENT ON VIEW eventgrid.replication_sources IS 'Delivery server side of README "Scaling out": each logical replication subscription of this database (CREATE SUBSCRIPTION ... PUBLICATION <a publication of eventgrid.events>): source (its name, also events.source and dead_letters.source), enabled, apply_pid (NULL: its apply worker does not run, e.g. the publishing server is unreachable or the subscription is disabled), transactions applied with events (written at most once a second), last_publish_time (publish time of the last applied transaction''s first event), last_applied_at, apply_lag_seconds (how long that event took from its publish to being applied here: the replication hop, larger while a backlog drains; 0 before any), received_lsn and last_msg_receipt_time (pg_stat_subscription), unknown_topic_events (events it brought for topics this database lacks; see eventgrid.unknown_topic_events). Readable by pg_monitor and eventgrid_admin.';

CREATE TABLE eventgrid.requests_in_flight (
    lease_owner integer NOT NULL,
    wave bigint NOT NULL,
    retry_ids bigint[] NOT NULL
);

COMMENT ON TABLE eventgrid.requests_in_flight IS 'Internal: retries the worker handed to HTTP and has not recorded yet; after a crash only these are charged an attempt (outcome Aborted).';

ALTER TABLE eventgrid.retries ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME eventgrid.retries_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE VIEW eventgrid.served_databases AS
 SELECT _served_databases.database,
    _served_databases.state,
    _served_databases.delivery_workers,
    _served_databases.upkeep_worker,
    _served_databases.delivery_wanted_at,
    _served_databases.upkeep_wanted_at,
    _served_databases.waiting_since,
    _served_databases.held_by,
    _served_databases.last_active
   FROM eventgrid._served_databases() _served_databases(database, state, delivery_workers, upkeep_worker, delivery_wanted_at, upkeep_wanted_at, waiting_since, held_by, last_active);

COMMENT ON VIEW eventgrid.served_databases IS 'The launcher''s view of every database of the cluster (that allows connections and is not a template): database, state (served: the extension in this library''s version; no extension; other version: waits for ALTER EXTENSION eventgrid UPDATE; looking: a worker is finding out), delivery_workers and upkeep_worker running now, when they are wanted next (delivery_wanted_at, upkeep_wanted_at; NULL: running, or not until work comes), waiting_since (wanted, but every background worker slot was taken), held_by (the pid of a backend whose DDL needs the database to itself), last_active (when a worker last had work). Readable by superusers and members of pg_monitor; the same in every database.';

CREATE VIEW eventgrid.table_change_publications AS
 SELECT p.source_table,
    p.topic,
    p.operations,
    p.columns,
    p.update_columns,
    COALESCE(p.event_type_prefix, (((n.nspname)::text || '.'::text) || (c.relname)::text)) AS event_type_prefix,
    (p.event_type_prefix IS NULL) AS default_prefix,
    p.created_at
   FROM ((eventgrid.table_publications p
     JOIN pg_class c ON ((c.oid = (p.source_table)::oid)))
     JOIN pg_namespace n ON ((n.oid = c.relnamespace)));

COMMENT ON VIEW eventgrid.table_change_publications IS 'The table change publications: source_table, topic, operations, columns carried (NULL: all), update_columns (NULL: any column), event_type_prefix (default_prefix: <schema>.<table>, following renames), created_at. Readable by eventgrid_admin.';

CREATE TABLE eventgrid.topic_access_keys (
    topic text NOT NULL,
    key1 text DEFAULT eventgrid._new_access_key() NOT NULL,
    key2 text DEFAULT eventgrid._new_access_key() NOT NULL,
    key1_set_at timestamp with time zone DEFAULT now() NOT NULL,
    key2_set_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT topic_access_keys_key1_check CHECK (((length(key1) >= 16) AND (length(key1) <= 256))),
    CONSTRAINT topic_access_keys_key2_check CHECK (((length(key2) >= 16) AND (length(key2) <= 256)))
);

COMMENT ON TABLE eventgrid.topic_access_keys IS 'Internal: the two access keys of each topic (SPEC 16), with which HTTP publishers authenticate (aeg-sas-key, a SAS token, Authorization: SharedAccessKey); readable by the extension''s owner only (eventgrid.topic_keys shows them to eventgrid_admin; regenerate_topic_key() replaces one).';

CREATE VIEW eventgrid.topic_keys AS
 SELECT k.topic,
    k.key1,
    k.key2,
    k.key1_set_at,
    k.key2_set_at
   FROM eventgrid.topic_access_keys k;

COMMENT ON VIEW eventgrid.topic_keys IS 'Each topic''s two access keys (SPEC 16): topic, key1, key2 (base64), when each was set. A request to the HTTP listener carrying either key, or a SAS token signed with either, may publish to the topic and receive from its queue subscriptions. Readable by eventgrid_admin; eventgrid.regenerate_topic_key() replaces a key.';

CREATE VIEW eventgrid.topic_metrics AS
 SELECT _topic_metrics.topic,
    _topic_metrics.publish_success_total,
    _topic_metrics.unmatched_events_total
   FROM eventgrid._topic_metrics() _topic_metrics(topic, publish_success_total, unmatched_events_total);

COMMENT ON VIEW eventgrid.topic_metrics IS 'Prometheus counters per topic: publish_success_total (events published, counted by the upkeep worker about a second after commit; Event Grid''s PublishSuccessCount) and unmatched_events_total (events no event subscription''s filters took; UnmatchedEventCount). Totals since the topic was created. Readable by pg_monitor and eventgrid_admin. README "Monitoring".';

CREATE VIEW eventgrid.topic_publish_metrics AS
 SELECT h.topic,
    h.outcome,
    h.requests AS requests_total,
        CASE
            WHEN (h.outcome = 'Success'::text) THEN (h.latency_ms_sum / (1000.0)::double precision)
            ELSE NULL::double precision
        END AS latency_seconds_sum
   FROM eventgrid.http_publish_counts h;

COMMENT ON VIEW eventgrid.topic_publish_metrics IS 'Prometheus counters of the publish requests the HTTP data plane answered (SPEC 16), per topic (NULL: the URL named no topic of this database) and outcome: Success (PublishSuccessCount counts the events; this the requests), or the error code answered (Unauthorized, BadRequest, NotFound, MethodNotAllowed, PayloadTooLarge, ServiceUnavailable, Other): Event Grid''s PublishFailCount by reason; latency_seconds_sum of the successes, from the whole request read to the answer (with requests_total, PublishSuccessLatencyInMs). Counted by the listener and written every 5 s. Readable by pg_monitor and eventgrid_admin. README "Monitoring".';

CREATE VIEW eventgrid.topic_statistics AS
 SELECT t.name AS topic,
    t.input_schema,
    ( SELECT count(*) AS count
           FROM eventgrid.event_subscriptions s
          WHERE (s.topic = t.name)) AS event_subscriptions,
    ( SELECT count(*) AS count
           FROM eventgrid.events e
          WHERE (e.topic = t.name)) AS events_stored,
    COALESCE(c.unmatched, (0)::bigint) AS unmatched_events,
    t.topic_type
   FROM (eventgrid.topics t
     LEFT JOIN eventgrid.topic_counters c ON ((c.topic = t.name)));

COMMENT ON VIEW eventgrid.topic_statistics IS 'Per topic: input schema, number of event subscriptions, events still in the event tables (delivered or not: a table is emptied as a whole), and events that matched no event subscription (counted by the delivery worker within about a second).';

CREATE TABLE eventgrid.wal_source_definitions (
    id bigint NOT NULL,
    name text NOT NULL,
    connection text NOT NULL,
    publication text NOT NULL,
    slot_name text NOT NULL,
    message_prefix text NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    owner_role oid NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    backfill boolean DEFAULT false NOT NULL,
    created_xact xid8 DEFAULT pg_current_xact_id(),
    CONSTRAINT wal_source_definitions_message_prefix_check CHECK ((message_prefix <> ''::text)),
    CONSTRAINT wal_source_definitions_name_check CHECK ((name ~ '^[A-Za-z0-9-]{3,50}$'::text)),
    CONSTRAINT wal_source_definitions_publication_check CHECK ((publication <> ''::text)),
    CONSTRAINT wal_source_definitions_slot_name_check CHECK ((slot_name ~ '^[a-z0-9_]{1,63}$'::text))
);

COMMENT ON TABLE eventgrid.wal_source_definitions IS 'WAL sources (create_wal_source()): the source database''s libpq connection string (a password in it is never shown: the view wal_sources masks it), its publication, the logical replication slot read there, the message prefix taken as events, whether it is paused, the role that created it (a non-superuser''s connection must authenticate with a password), whether the tables mapped in its creating transaction (created_xact) are backfilled. Read by the WAL source workers. SPEC 19.';

ALTER TABLE eventgrid.wal_source_definitions ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME eventgrid.wal_source_definitions_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE eventgrid.wal_source_status (
    source_id bigint NOT NULL,
    state text DEFAULT 'connecting'::text NOT NULL,
    source_lsn pg_lsn,
    events_published bigint DEFAULT 0 NOT NULL,
    rejects bigint DEFAULT 0 NOT NULL,
    last_commit_time timestamp with time zone,
    last_error text,
    last_error_time timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    confirmed_lsn pg_lsn,
    CONSTRAINT wal_source_status_state_check CHECK ((state = ANY (ARRAY['connecting'::text, 'backfilling'::text, 'streaming'::text, 'paused'::text, 'failing'::text])))
);

COMMENT ON TABLE eventgrid.wal_source_status IS 'Internal: what each WAL source''s worker last reported (state, the source''s WAL end, counts, the source commit time of the last transaction it published, the last error); the views wal_sources and wal_source_metrics show it. SPEC 19.';

CREATE TABLE eventgrid.wal_source_tables (
    source_id bigint NOT NULL,
    table_name text NOT NULL,
    topic text NOT NULL,
    operations text[] NOT NULL,
    columns text[],
    update_columns text[],
    event_type_prefix text,
    backfill_state text,
    backfill_after text[],
    backfilled_rows bigint DEFAULT 0 NOT NULL,
    CONSTRAINT wal_source_tables_backfill_state_check CHECK ((backfill_state = ANY (ARRAY['pending'::text, 'done'::text])))
);

COMMENT ON TABLE eventgrid.wal_source_tables IS 'Tables of WAL sources whose changes are published (publish_table_changes(..., source => ...)): the table as the source names it (schema.table), the topic, the options of in-database table changes, and its backfill''s progress (pending or done, the primary key of the last row published, the rows published). SPEC 19.';

CREATE VIEW eventgrid.wal_sources AS
 SELECT d.name,
    eventgrid._wal_source_check_connection(d.connection, (10)::oid) AS connection,
    d.publication,
    d.slot_name,
        CASE
            WHEN d.paused THEN 'paused'::text
            ELSE COALESCE(s.state, 'connecting'::text)
        END AS state,
    GREATEST(eventgrid._wal_source_origin_lsn(d.id), s.confirmed_lsn) AS confirmed_lsn,
    s.source_lsn,
    (GREATEST((s.source_lsn - GREATEST(eventgrid._wal_source_origin_lsn(d.id), s.confirmed_lsn)), (0)::numeric))::bigint AS lag_bytes,
    (
        CASE
            WHEN ((s.source_lsn > GREATEST(eventgrid._wal_source_origin_lsn(d.id), s.confirmed_lsn)) AND (s.last_commit_time IS NOT NULL)) THEN GREATEST(EXTRACT(epoch FROM (now() - s.last_commit_time)), (0)::numeric)
            ELSE (0)::numeric
        END)::double precision AS lag_seconds,
    COALESCE(s.events_published, (0)::bigint) AS events_published,
    COALESCE(s.rejects, (0)::bigint) AS rejects,
    s.last_error,
    s.last_error_time,
    (COALESCE(( SELECT sum(m.backfilled_rows) AS sum
           FROM eventgrid.wal_source_tables m
          WHERE (m.source_id = d.id)), (0)::numeric))::bigint AS backfilled_rows
   FROM (eventgrid.wal_source_definitions d
     LEFT JOIN eventgrid.wal_source_status s ON ((s.source_id = d.id)));

COMMENT ON VIEW eventgrid.wal_sources IS 'WAL sources (SPEC 19): name, connection (its password as ********), publication, slot_name, state (connecting, backfilling, streaming, paused, failing), confirmed_lsn (the source position whose events are committed here: the last source transaction published, or beyond it what had nothing to publish), source_lsn (the source''s WAL end last reported), lag_bytes (source_lsn less confirmed_lsn), lag_seconds (while lag_bytes is above 0: how long ago the source committed the last transaction published here; else 0), events_published, rejects (rows in wal_source_rejects), the last error with its time, and backfilled_rows (rows of the source''s tables published by its backfill so far: create_wal_source(..., backfill => true)).';

CREATE VIEW eventgrid.wal_source_metrics AS
 SELECT w.name AS wal_source,
    w.state,
    ((w.state = 'streaming'::text))::integer AS streaming,
    COALESCE(w.lag_bytes, (0)::bigint) AS lag_bytes,
    w.lag_seconds,
    w.events_published AS events_published_total,
    w.rejects AS rejects_total,
    w.backfilled_rows AS backfilled_rows_total
   FROM eventgrid.wal_sources w;

COMMENT ON VIEW eventgrid.wal_source_metrics IS 'What the Prometheus exporter reads of each WAL source (SPEC 19; monitoring/postgres_exporter.yml): its name and state, 1 while streaming, lag_bytes, lag_seconds, and the counters events_published_total, rejects_total and backfilled_rows_total; no connection string. Readable by pg_monitor.';

CREATE TABLE eventgrid.wal_source_rejects (
    id bigint NOT NULL,
    source text NOT NULL,
    commit_lsn pg_lsn,
    reason text NOT NULL,
    content text,
    rejected_at timestamp with time zone DEFAULT now() NOT NULL
);

COMMENT ON TABLE eventgrid.wal_source_rejects IS 'What a WAL source read and could not publish (an unknown topic, an invalid event, a message that is not JSON, over 1 MB, or not transactional): the source, the commit LSN of its transaction there (NULL: not in one), why, and the content (its first 4 kB). Never stops the stream; the rest of the transaction is published. SPEC 19.';

ALTER TABLE eventgrid.wal_source_rejects ALTER COLUMN id ADD GENERATED BY DEFAULT AS IDENTITY (
    SEQUENCE NAME eventgrid.wal_source_rejects_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE VIEW eventgrid.worker_metrics AS
 SELECT _worker_metrics.delivery_workers_running,
    _worker_metrics.upkeep_workers_running,
    _worker_metrics.waiting_for_worker_slot_seconds
   FROM eventgrid._worker_metrics() _worker_metrics(delivery_workers_running, upkeep_workers_running, waiting_for_worker_slot_seconds);

COMMENT ON VIEW eventgrid.worker_metrics IS 'Prometheus gauges of this database''s eventgrid workers: delivery_workers_running and upkeep_workers_running (workers run while the database has work and leave after eventgrid.worker_idle_timeout: 0 is normal when idle), and waiting_for_worker_slot_seconds (how long the database has wanted a worker that no background worker slot was free for, 0 when it does not: see max_worker_processes). Readable by pg_monitor and eventgrid_admin. README "Monitoring".';

CREATE VIEW eventgrid.worker_status AS
 SELECT _worker_status.worker,
    _worker_status.pid,
    _worker_status.state,
    _worker_status.activity,
    _worker_status.state_since,
    _worker_status.wait_event_type,
    _worker_status.wait_event,
    _worker_status.backend_start
   FROM eventgrid._worker_status() _worker_status(worker, pid, state, activity, state_since, wait_event_type, wait_event, backend_start);

COMMENT ON VIEW eventgrid.worker_status IS 'Each eventgrid worker of this database (delivery worker 1..eventgrid.delivery_workers, upkeep worker) and each logical replication apply worker that brings it events (README "Scaling out"): pid (NULL when it does not run: eventgrid''s workers run only while the database has work), state (idle or active), activity (its status line: what it delivers, waits for or failed at; for an apply worker, when it last applied events and their apply lag), state_since, wait_event_type, wait_event, backend_start. Readable by eventgrid_admin, which pg_stat_activity would show only <insufficient privilege>. eventgrid.served_databases shows every database''s.';

ALTER TABLE ONLY eventgrid.attempt_log ATTACH PARTITION eventgrid.attempt_log_0 FOR VALUES IN ('0');

ALTER TABLE ONLY eventgrid.attempt_log ATTACH PARTITION eventgrid.attempt_log_1 FOR VALUES IN ('1');

ALTER TABLE ONLY eventgrid.attempt_log ATTACH PARTITION eventgrid.attempt_log_2 FOR VALUES IN ('2');

ALTER TABLE ONLY eventgrid.events ATTACH PARTITION eventgrid.events_0 FOR VALUES IN ('0');

ALTER TABLE ONLY eventgrid.events ATTACH PARTITION eventgrid.events_1 FOR VALUES IN ('1');

ALTER TABLE ONLY eventgrid.events ATTACH PARTITION eventgrid.events_2 FOR VALUES IN ('2');

ALTER TABLE ONLY eventgrid.attempt_log ALTER COLUMN id SET DEFAULT nextval('eventgrid.attempt_log_id_seq'::regclass);

ALTER TABLE ONLY eventgrid.dead_letter_notification_failures ALTER COLUMN id SET DEFAULT nextval('eventgrid.dead_letter_notification_failures_id_seq'::regclass);

ALTER TABLE ONLY eventgrid.expired_event_subscriptions ALTER COLUMN id SET DEFAULT nextval('eventgrid.expired_event_subscriptions_id_seq'::regclass);

ALTER TABLE ONLY eventgrid.queue_batches ALTER COLUMN id SET DEFAULT nextval('eventgrid.queue_batches_id_seq'::regclass);

ALTER TABLE ONLY eventgrid.queue_events ALTER COLUMN id SET DEFAULT nextval('eventgrid.queue_events_id_seq'::regclass);

ALTER TABLE ONLY eventgrid.rejected_events ALTER COLUMN id SET DEFAULT nextval('eventgrid.rejected_events_id_seq'::regclass);

ALTER TABLE ONLY eventgrid.http_publish_counts
    ADD CONSTRAINT http_publish_counts_key UNIQUE NULLS NOT DISTINCT (topic, outcome);

CREATE FUNCTION eventgrid._http_count(counts jsonb) RETURNS void
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 INSERT INTO eventgrid.http_publish_counts AS c (topic, outcome, requests, latency_ms_sum)  SELECT t.name,
                 CASE
                     WHEN (x.outcome = ANY (ARRAY['Success'::text, 'Unauthorized'::text, 'BadRequest'::text, 'NotFound'::text, 'MethodNotAllowed'::text, 'PayloadTooLarge'::text, 'ServiceUnavailable'::text])) THEN x.outcome
                     ELSE 'Other'::text
                 END AS "case",
             sum(GREATEST(x.requests, (0)::bigint)) AS sum,
             sum(GREATEST(COALESCE(x.latency_ms, (0)::double precision), (0)::double precision)) AS sum
            FROM (jsonb_to_recordset(_http_count.counts) x(topic text, outcome text, requests bigint, latency_ms double precision)
              LEFT JOIN eventgrid.topics t ON ((t.name = x.topic)))
           GROUP BY t.name,
                 CASE
                     WHEN (x.outcome = ANY (ARRAY['Success'::text, 'Unauthorized'::text, 'BadRequest'::text, 'NotFound'::text, 'MethodNotAllowed'::text, 'PayloadTooLarge'::text, 'ServiceUnavailable'::text])) THEN x.outcome
                     ELSE 'Other'::text
                 END ON CONFLICT ON CONSTRAINT http_publish_counts_key DO UPDATE SET requests = (c.requests + excluded.requests), latency_ms_sum = (c.latency_ms_sum + excluded.latency_ms_sum);
END;

COMMENT ON FUNCTION eventgrid._http_count(counts jsonb) IS 'Internal: adds the HTTP listener''s counts of publish requests (SPEC 16), a JSON array of {topic, outcome, requests, latency_ms}, to eventgrid.http_publish_counts; a topic this database does not have is counted under NULL, an unknown outcome as Other. Executable by eventgrid_http, the listener''s role.';

ALTER TABLE ONLY eventgrid.attempt_log_rotation
    ADD CONSTRAINT attempt_log_rotation_pkey PRIMARY KEY (singleton);

ALTER TABLE ONLY eventgrid.chunks_in_flight
    ADD CONSTRAINT chunks_in_flight_pkey PRIMARY KEY (lease_owner, chunk);

ALTER TABLE ONLY eventgrid.client_certificates
    ADD CONSTRAINT client_certificates_pkey PRIMARY KEY (subscription_id);

ALTER TABLE ONLY eventgrid.dead_letter_notification_failures
    ADD CONSTRAINT dead_letter_notification_failures_pkey PRIMARY KEY (id);

ALTER TABLE ONLY eventgrid.dead_letters
    ADD CONSTRAINT dead_letters_pkey PRIMARY KEY (id);

ALTER TABLE ONLY eventgrid.delivery_authentications
    ADD CONSTRAINT delivery_authentications_pkey PRIMARY KEY (subscription_id);

ALTER TABLE ONLY eventgrid.delivery_pauses
    ADD CONSTRAINT delivery_pauses_topic_subscription_id_key UNIQUE NULLS NOT DISTINCT (topic, subscription_id);

ALTER TABLE ONLY eventgrid.destination_credentials
    ADD CONSTRAINT destination_credentials_pkey PRIMARY KEY (subscription_id);

ALTER TABLE ONLY eventgrid.domain_topic_entries
    ADD CONSTRAINT domain_topic_entries_pkey PRIMARY KEY (domain, name);

ALTER TABLE ONLY eventgrid.domains
    ADD CONSTRAINT domains_pkey PRIMARY KEY (name);

ALTER TABLE ONLY eventgrid.endpoint_states
    ADD CONSTRAINT endpoint_states_pkey PRIMARY KEY (endpoint);

ALTER TABLE ONLY eventgrid.endpoint_validations
    ADD CONSTRAINT endpoint_validations_pkey PRIMARY KEY (subscription_id);

ALTER TABLE ONLY eventgrid.event_subscriptions
    ADD CONSTRAINT event_subscriptions_pkey PRIMARY KEY (id);

ALTER TABLE ONLY eventgrid.event_subscriptions
    ADD CONSTRAINT event_subscriptions_topic_name_key UNIQUE NULLS NOT DISTINCT (topic, domain_topic, name);

ALTER TABLE ONLY eventgrid.event_table_rotations
    ADD CONSTRAINT event_table_rotations_pkey PRIMARY KEY (event_table);

ALTER TABLE ONLY eventgrid.expired_event_subscriptions
    ADD CONSTRAINT expired_event_subscriptions_pkey PRIMARY KEY (id);

ALTER TABLE ONLY eventgrid.ordering_keys
    ADD CONSTRAINT ordering_keys_pkey PRIMARY KEY (subscription_id, ordering_key_hash);

ALTER TABLE ONLY eventgrid.queue_batches
    ADD CONSTRAINT queue_batches_pkey PRIMARY KEY (id);

ALTER TABLE ONLY eventgrid.queue_counters
    ADD CONSTRAINT queue_counters_pkey PRIMARY KEY (subscription_id, slot);

ALTER TABLE ONLY eventgrid.queue_events
    ADD CONSTRAINT queue_events_pkey PRIMARY KEY (id);

ALTER TABLE ONLY eventgrid.receive_grants
    ADD CONSTRAINT receive_grants_topic_subscription_id_role_oid_key UNIQUE NULLS NOT DISTINCT (topic, subscription_id, role_oid);

ALTER TABLE ONLY eventgrid.rejected_events
    ADD CONSTRAINT rejected_events_pkey PRIMARY KEY (id);

ALTER TABLE ONLY eventgrid.replication_progress
    ADD CONSTRAINT replication_progress_pkey PRIMARY KEY (source);

ALTER TABLE ONLY eventgrid.replication_slot_sightings
    ADD CONSTRAINT replication_slot_sightings_pkey PRIMARY KEY (slot_name);

ALTER TABLE ONLY eventgrid.requests_in_flight
    ADD CONSTRAINT requests_in_flight_pkey PRIMARY KEY (lease_owner, wave);

ALTER TABLE ONLY eventgrid.retries
    ADD CONSTRAINT retries_pkey PRIMARY KEY (id);

ALTER TABLE ONLY eventgrid.signing_secrets
    ADD CONSTRAINT signing_secrets_pkey PRIMARY KEY (subscription_id);

ALTER TABLE ONLY eventgrid.subscription_counters
    ADD CONSTRAINT subscription_counters_pkey PRIMARY KEY (subscription_id);

ALTER TABLE ONLY eventgrid.subscription_metric_counts
    ADD CONSTRAINT subscription_metric_counts_pkey PRIMARY KEY (subscription_id, metric, label);

ALTER TABLE ONLY eventgrid.subscription_positions
    ADD CONSTRAINT subscription_positions_pkey PRIMARY KEY (subscription_id);

ALTER TABLE ONLY eventgrid.table_publications
    ADD CONSTRAINT table_publications_pkey PRIMARY KEY (source_table, topic);

ALTER TABLE ONLY eventgrid.topic_access_keys
    ADD CONSTRAINT topic_access_keys_pkey PRIMARY KEY (topic);

ALTER TABLE ONLY eventgrid.topic_counters
    ADD CONSTRAINT topic_counters_pkey PRIMARY KEY (topic);

ALTER TABLE ONLY eventgrid.topic_positions
    ADD CONSTRAINT topic_positions_pkey PRIMARY KEY (topic);

ALTER TABLE ONLY eventgrid.topics
    ADD CONSTRAINT topics_pkey PRIMARY KEY (name);

ALTER TABLE ONLY eventgrid.unknown_topic_events
    ADD CONSTRAINT unknown_topic_events_pkey PRIMARY KEY (source, topic);

ALTER TABLE ONLY eventgrid.wal_source_definitions
    ADD CONSTRAINT wal_source_definitions_name_key UNIQUE (name);

ALTER TABLE ONLY eventgrid.wal_source_definitions
    ADD CONSTRAINT wal_source_definitions_pkey PRIMARY KEY (id);

ALTER TABLE ONLY eventgrid.wal_source_rejects
    ADD CONSTRAINT wal_source_rejects_pkey PRIMARY KEY (id);

ALTER TABLE ONLY eventgrid.wal_source_status
    ADD CONSTRAINT wal_source_status_pkey PRIMARY KEY (source_id);

ALTER TABLE ONLY eventgrid.wal_source_tables
    ADD CONSTRAINT wal_source_tables_pkey PRIMARY KEY (source_id, table_name, topic);

CREATE UNIQUE INDEX delivery_properties_header_key ON eventgrid.delivery_properties USING btree (subscription_id, lower(header));

CREATE INDEX event_subscriptions_endpoint_idx ON eventgrid.event_subscriptions USING btree (endpoint);

CREATE INDEX event_subscriptions_expiration_time_idx ON eventgrid.event_subscriptions USING btree (expiration_time) WHERE (expiration_time IS NOT NULL);

CREATE INDEX event_subscriptions_queue_idx ON eventgrid.event_subscriptions USING btree (id) WHERE (delivery_mode = 'queue'::text);

CREATE INDEX events_read_key_idx ON ONLY eventgrid.events USING btree ((((topic || '/'::text) || domain_topic)), txid, id) WHERE (domain_topic IS NOT NULL);

CREATE INDEX events_0_expr_txid_id_idx ON eventgrid.events_0 USING btree ((((topic || '/'::text) || domain_topic)), txid, id) WHERE (domain_topic IS NOT NULL);

CREATE INDEX events_batch_idx ON ONLY eventgrid.events USING btree (topic, txid, id);

CREATE INDEX events_0_topic_txid_id_idx ON eventgrid.events_0 USING btree (topic, txid, id);

CREATE INDEX events_1_expr_txid_id_idx ON eventgrid.events_1 USING btree ((((topic || '/'::text) || domain_topic)), txid, id) WHERE (domain_topic IS NOT NULL);

CREATE INDEX events_1_topic_txid_id_idx ON eventgrid.events_1 USING btree (topic, txid, id);

CREATE INDEX events_2_expr_txid_id_idx ON eventgrid.events_2 USING btree ((((topic || '/'::text) || domain_topic)), txid, id) WHERE (domain_topic IS NOT NULL);

CREATE INDEX events_2_topic_txid_id_idx ON eventgrid.events_2 USING btree (topic, txid, id);

CREATE INDEX expired_event_subscriptions_topic_idx ON eventgrid.expired_event_subscriptions USING btree (topic, event_subscription);

CREATE INDEX queue_batches_subscription_idx ON eventgrid.queue_batches USING btree (subscription_id, id);

CREATE INDEX queue_events_receivable_idx ON eventgrid.queue_events USING btree (subscription_id, receivable_at, id);

CREATE INDEX retries_due_idx ON eventgrid.retries USING btree (next_attempt_at);

CREATE INDEX retries_ordering_idx ON eventgrid.retries USING btree (subscription_id, ordering_key_hash, id) WHERE (ordering_key IS NOT NULL);

CREATE INDEX retries_subscription_idx ON eventgrid.retries USING btree (subscription_id);

CREATE INDEX subscription_positions_lease_owner_idx ON eventgrid.subscription_positions USING btree (lease_owner) WHERE (lease_owner IS NOT NULL);

CREATE INDEX subscription_positions_system_identifier_idx ON eventgrid.subscription_positions USING btree (system_identifier);

ALTER INDEX eventgrid.events_read_key_idx ATTACH PARTITION eventgrid.events_0_expr_txid_id_idx;

ALTER INDEX eventgrid.events_batch_idx ATTACH PARTITION eventgrid.events_0_topic_txid_id_idx;

ALTER INDEX eventgrid.events_read_key_idx ATTACH PARTITION eventgrid.events_1_expr_txid_id_idx;

ALTER INDEX eventgrid.events_batch_idx ATTACH PARTITION eventgrid.events_1_topic_txid_id_idx;

ALTER INDEX eventgrid.events_read_key_idx ATTACH PARTITION eventgrid.events_2_expr_txid_id_idx;

ALTER INDEX eventgrid.events_batch_idx ATTACH PARTITION eventgrid.events_2_topic_txid_id_idx;

CREATE TRIGGER event_subscriptions_created AFTER INSERT ON eventgrid.event_subscriptions FOR EACH STATEMENT EXECUTE FUNCTION eventgrid._subscriptions_created();

CREATE TRIGGER events_apply BEFORE INSERT ON eventgrid.events FOR EACH ROW EXECUTE FUNCTION eventgrid._apply_event();

ALTER TABLE eventgrid.events ENABLE REPLICA TRIGGER events_apply;

CREATE TRIGGER events_immutable BEFORE UPDATE ON eventgrid.events FOR EACH ROW EXECUTE FUNCTION eventgrid._refuse_change();

CREATE TRIGGER events_validate BEFORE INSERT ON eventgrid.events FOR EACH ROW EXECUTE FUNCTION eventgrid._validate_event();

CREATE TRIGGER events_wake AFTER INSERT ON eventgrid.events FOR EACH STATEMENT EXECUTE FUNCTION eventgrid._wake_at_commit();

CREATE TRIGGER receive_grants_bind BEFORE INSERT ON eventgrid.receive_grants FOR EACH ROW EXECUTE FUNCTION eventgrid._bind_receive_grant();

CREATE TRIGGER table_publications_changed AFTER INSERT OR DELETE OR UPDATE OR TRUNCATE ON eventgrid.table_publications FOR EACH STATEMENT EXECUTE FUNCTION eventgrid._table_publications_changed();

ALTER TABLE ONLY eventgrid.client_certificates
    ADD CONSTRAINT client_certificates_subscription_id_fkey FOREIGN KEY (subscription_id) REFERENCES eventgrid.event_subscriptions(id) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.delivery_authentications
    ADD CONSTRAINT delivery_authentications_subscription_id_fkey FOREIGN KEY (subscription_id) REFERENCES eventgrid.event_subscriptions(id) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.delivery_pauses
    ADD CONSTRAINT delivery_pauses_subscription_id_fkey FOREIGN KEY (subscription_id) REFERENCES eventgrid.event_subscriptions(id) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.delivery_pauses
    ADD CONSTRAINT delivery_pauses_topic_fkey FOREIGN KEY (topic) REFERENCES eventgrid.topics(name) ON UPDATE CASCADE ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.delivery_properties
    ADD CONSTRAINT delivery_properties_subscription_id_fkey FOREIGN KEY (subscription_id) REFERENCES eventgrid.event_subscriptions(id) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.destination_credentials
    ADD CONSTRAINT destination_credentials_subscription_id_fkey FOREIGN KEY (subscription_id) REFERENCES eventgrid.event_subscriptions(id) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.domain_topic_entries
    ADD CONSTRAINT domain_topic_entries_domain_fkey FOREIGN KEY (domain) REFERENCES eventgrid.domains(name) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.domains
    ADD CONSTRAINT domains_name_fkey FOREIGN KEY (name) REFERENCES eventgrid.topics(name) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.endpoint_validations
    ADD CONSTRAINT endpoint_validations_subscription_id_fkey FOREIGN KEY (subscription_id) REFERENCES eventgrid.event_subscriptions(id) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.event_subscriptions
    ADD CONSTRAINT event_subscriptions_dead_letter_topic_fkey FOREIGN KEY (dead_letter_topic) REFERENCES eventgrid.topics(name) ON DELETE SET NULL;

ALTER TABLE ONLY eventgrid.event_subscriptions
    ADD CONSTRAINT event_subscriptions_domain_topic_fkey FOREIGN KEY (topic, domain_topic) REFERENCES eventgrid.domain_topic_entries(domain, name);

ALTER TABLE ONLY eventgrid.event_subscriptions
    ADD CONSTRAINT event_subscriptions_topic_fkey FOREIGN KEY (topic) REFERENCES eventgrid.topics(name) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.http_publish_counts
    ADD CONSTRAINT http_publish_counts_topic_fkey FOREIGN KEY (topic) REFERENCES eventgrid.topics(name) ON UPDATE CASCADE ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.ordering_keys
    ADD CONSTRAINT ordering_keys_subscription_id_fkey FOREIGN KEY (subscription_id) REFERENCES eventgrid.event_subscriptions(id) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.queue_batches
    ADD CONSTRAINT queue_batches_subscription_id_fkey FOREIGN KEY (subscription_id) REFERENCES eventgrid.event_subscriptions(id) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.queue_counters
    ADD CONSTRAINT queue_counters_subscription_id_fkey FOREIGN KEY (subscription_id) REFERENCES eventgrid.event_subscriptions(id) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.queue_events
    ADD CONSTRAINT queue_events_subscription_id_fkey FOREIGN KEY (subscription_id) REFERENCES eventgrid.event_subscriptions(id) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.receive_grants
    ADD CONSTRAINT receive_grants_subscription_id_fkey FOREIGN KEY (subscription_id) REFERENCES eventgrid.event_subscriptions(id) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.receive_grants
    ADD CONSTRAINT receive_grants_topic_fkey FOREIGN KEY (topic) REFERENCES eventgrid.topics(name) ON UPDATE CASCADE ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.signing_secrets
    ADD CONSTRAINT signing_secrets_subscription_id_fkey FOREIGN KEY (subscription_id) REFERENCES eventgrid.event_subscriptions(id) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.subscription_counters
    ADD CONSTRAINT subscription_counters_subscription_id_fkey FOREIGN KEY (subscription_id) REFERENCES eventgrid.event_subscriptions(id) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.subscription_metric_counts
    ADD CONSTRAINT subscription_metric_counts_subscription_id_fkey FOREIGN KEY (subscription_id) REFERENCES eventgrid.event_subscriptions(id) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.subscription_positions
    ADD CONSTRAINT subscription_positions_subscription_id_fkey FOREIGN KEY (subscription_id) REFERENCES eventgrid.event_subscriptions(id) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.table_publications
    ADD CONSTRAINT table_publications_topic_fkey FOREIGN KEY (topic) REFERENCES eventgrid.topics(name) ON UPDATE CASCADE ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.topic_access_keys
    ADD CONSTRAINT topic_access_keys_topic_fkey FOREIGN KEY (topic) REFERENCES eventgrid.topics(name) ON UPDATE CASCADE ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.topic_counters
    ADD CONSTRAINT topic_counters_topic_fkey FOREIGN KEY (topic) REFERENCES eventgrid.topics(name) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.topic_positions
    ADD CONSTRAINT topic_positions_topic_fkey FOREIGN KEY (topic) REFERENCES eventgrid.topics(name) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.wal_source_status
    ADD CONSTRAINT wal_source_status_source_id_fkey FOREIGN KEY (source_id) REFERENCES eventgrid.wal_source_definitions(id) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.wal_source_tables
    ADD CONSTRAINT wal_source_tables_source_id_fkey FOREIGN KEY (source_id) REFERENCES eventgrid.wal_source_definitions(id) ON DELETE CASCADE;

ALTER TABLE ONLY eventgrid.wal_source_tables
    ADD CONSTRAINT wal_source_tables_topic_fkey FOREIGN KEY (topic) REFERENCES eventgrid.topics(name) ON DELETE CASCADE;

GRANT USAGE ON SCHEMA eventgrid TO PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._acknowledge(topic text, subscription text, lock_tokens text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._advanced_filters_arg(filters jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._advanced_match(event jsonb, filters jsonb, on_arrays boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._advanced_match(event jsonb, filters jsonb, on_arrays boolean) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._apply_event() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._check_advanced_filters(filters jsonb) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._event_table() FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._event_table() TO eventgrid_publisher;
GRANT ALL ON FUNCTION eventgrid._event_table() TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._in_batch(txid xid8, since pg_snapshot, upto pg_snapshot) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._in_batch(txid xid8, since pg_snapshot, upto pg_snapshot) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._new_event_id() FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._new_event_id() TO eventgrid_publisher;

GRANT SELECT ON TABLE eventgrid.events TO eventgrid_admin;

GRANT SELECT(id) ON TABLE eventgrid.events TO eventgrid_publisher;

GRANT INSERT(topic) ON TABLE eventgrid.events TO eventgrid_publisher;

GRANT INSERT(event) ON TABLE eventgrid.events TO eventgrid_publisher;

REVOKE ALL ON FUNCTION eventgrid._chunk_events(topic text, done pg_snapshot, upto pg_snapshot, after_txid xid8, after_id bigint, last_txid xid8, last_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._chunk_events(topic text, done pg_snapshot, upto pg_snapshot, after_txid xid8, after_id bigint, last_txid xid8, last_id bigint) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._endpoint_problem(endpoint text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._is_schema(v text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._is_source_field(v text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._is_subscription_name(v text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._iso8601_minutes(minutes integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._lower_array(a text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._matches(event jsonb, types_lower text[], subject_begins_with text, subject_ends_with text, case_sensitive boolean, advanced_filters jsonb, on_arrays boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._matches(event jsonb, types_lower text[], subject_begins_with text, subject_ends_with text, case_sensitive boolean, advanced_filters jsonb, on_arrays boolean) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._now() FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._now() TO eventgrid_admin;
GRANT ALL ON FUNCTION eventgrid._now() TO pg_monitor;

REVOKE ALL ON FUNCTION eventgrid._system_identifier() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._unpassed_events(topic text, done pg_snapshot, upto pg_snapshot, after_txid xid8, after_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._unpassed_events(topic text, done pg_snapshot, upto pg_snapshot, after_txid xid8, after_id bigint) TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.chunks_in_flight TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.event_subscriptions TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.queue_batches TO eventgrid_admin;

GRANT SELECT(id) ON TABLE eventgrid.queue_events TO eventgrid_admin;

GRANT SELECT(subscription_id) ON TABLE eventgrid.queue_events TO eventgrid_admin;

GRANT SELECT(event_id) ON TABLE eventgrid.queue_events TO eventgrid_admin;

GRANT SELECT(event) ON TABLE eventgrid.queue_events TO eventgrid_admin;

GRANT SELECT(publish_time) ON TABLE eventgrid.queue_events TO eventgrid_admin;

GRANT SELECT(event_bytes) ON TABLE eventgrid.queue_events TO eventgrid_admin;

GRANT SELECT(source) ON TABLE eventgrid.queue_events TO eventgrid_admin;

GRANT SELECT(source_event_id) ON TABLE eventgrid.queue_events TO eventgrid_admin;

GRANT SELECT(delivery_count) ON TABLE eventgrid.queue_events TO eventgrid_admin;

GRANT SELECT(receivable_at) ON TABLE eventgrid.queue_events TO eventgrid_admin;

GRANT SELECT(received_at) ON TABLE eventgrid.queue_events TO eventgrid_admin;

GRANT SELECT(event_table) ON TABLE eventgrid.queue_events TO eventgrid_admin;

GRANT SELECT(event_txid) ON TABLE eventgrid.queue_events TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.retries TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.subscription_positions TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._backlog(subscription_id bigint, OUT pending bigint, OUT oldest timestamp with time zone, OUT due_since timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._backlog(subscription_id bigint, OUT pending bigint, OUT oldest timestamp with time zone, OUT due_since timestamp with time zone) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._backlogged_subscriptions() FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._backlogged_subscriptions() TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._batch_events(topic text, event_table smallint, txids xid8[], event_ids bigint[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._bind_receive_grant() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._caller() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._check_credential_text(field text, val text, max_bytes integer, required boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._check_dead_letter_topic(dead_letter_topic text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._check_delivery_mode(delivery_mode text, topic_type text, endpoint text, receive_lock_duration integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, max_events_per_second integer, endpoint_validation text, ordering_key text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._check_endpoint(endpoint text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._check_endpoint_key(endpoint text, ordering_key text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._check_endpoint_type(endpoint_type text, endpoint text, endpoint_validation text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._check_endpoint_validation(v text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._check_event_publications() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._check_install_database() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._check_no_endpoint_type(endpoint_type text, name text, topic text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._check_not_null(field text, val anyelement) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._check_ordering_key(ordering_key text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._check_range(field text, val integer, lo integer, hi integer, unit text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._check_schema(field text, val text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._check_subscription_settings(input_schema text, topic_type text, endpoint text, event_delivery_schema text, included_event_types text[], is_subject_case_sensitive boolean, deadletter boolean, enable_advanced_filtering_on_arrays boolean, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, max_events_per_second integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._check_table_publication(caller regrole, source_table regclass, columns text[], update_columns text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._client_certificate_info(certificate text, private_key text, OUT subject text, OUT not_before timestamp with time zone, OUT not_after timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._clock_now() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._cover_partitions(rel regclass) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._create_topic_triggers(rel regclass, topic text, operations text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._table_ancestry(rel regclass, OUT relid regclass, OUT depth bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._table_tree(rel regclass) FROM PUBLIC;

GRANT SELECT ON TABLE eventgrid.table_publications TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._publication_members(source_table regclass, topic text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._create_table_change_triggers(source_table regclass, topic text, operations text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._dead_letter_ids(topic text, subscription text, reason text, dead_lettered_after timestamp with time zone, dead_lettered_before timestamp with time zone, existing_only boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._is_topic_name(v text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid.rfc3339(ts timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.rfc3339(ts timestamp with time zone) TO eventgrid_admin;
GRANT ALL ON FUNCTION eventgrid.rfc3339(ts timestamp with time zone) TO eventgrid_publisher;

GRANT SELECT ON TABLE eventgrid.topics TO eventgrid_admin;

GRANT SELECT(name) ON TABLE eventgrid.topics TO eventgrid_publisher;

GRANT SELECT(input_schema) ON TABLE eventgrid.topics TO eventgrid_publisher;

REVOKE ALL ON FUNCTION eventgrid._dead_letter_notification(target_topic text, topic text, subscription text, event jsonb, input_schema text, dead_lettered boolean, reason text, attempts integer, outcome text, http_status integer, publish_time timestamp with time zone, attempted_at timestamp with time zone, event_source text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._dead_letter_reasons(delivery_mode text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._dead_letter_reasons(delivery_mode text) TO pg_monitor;
GRANT ALL ON FUNCTION eventgrid._dead_letter_reasons(delivery_mode text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._delivery_tokens(OUT token_endpoint text, OUT client_id text, OUT scope text, OUT audience text, OUT token_obtained_at timestamp with time zone, OUT token_expires_at timestamp with time zone, OUT token_serves_until timestamp with time zone, OUT token_requests bigint, OUT token_failures bigint, OUT last_failure_at timestamp with time zone, OUT last_error text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._delivery_tokens(OUT token_endpoint text, OUT client_id text, OUT scope text, OUT audience text, OUT token_obtained_at timestamp with time zone, OUT token_expires_at timestamp with time zone, OUT token_serves_until timestamp with time zone, OUT token_requests bigint, OUT token_failures bigint, OUT last_failure_at timestamp with time zone, OUT last_error text) TO eventgrid_admin;
GRANT ALL ON FUNCTION eventgrid._delivery_tokens(OUT token_endpoint text, OUT client_id text, OUT scope text, OUT audience text, OUT token_obtained_at timestamp with time zone, OUT token_expires_at timestamp with time zone, OUT token_serves_until timestamp with time zone, OUT token_requests bigint, OUT token_failures bigint, OUT last_failure_at timestamp with time zone, OUT last_error text) TO pg_monitor;

REVOKE ALL ON FUNCTION eventgrid._domain_of(name text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._domain_topic_for_subscription(domain text, domain_topic text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._drop_expired_subscriptions(OUT topic text, OUT name text, OUT expiration_time timestamp with time zone, OUT owed bigint, OUT skipped boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._drop_topic_triggers(rel regclass, topic text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._drop_table_change_triggers(source_table regclass, topic text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._drop_topic(name text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._duration_minutes(field text, v text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._endpoint_credentials(endpoint text, OUT endpoint text, OUT user_name text, OUT password text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._endpoint_key_from(endpoint text) FROM PUBLIC;

GRANT SELECT ON TABLE eventgrid.delivery_pauses TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._paused_subscriptions() FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._paused_subscriptions() TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.endpoint_states TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.queue_counters TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.subscription_counters TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._event_subscription_metrics(OUT topic text, OUT event_subscription text, OUT matched_events_total bigint, OUT delivery_success_total bigint, OUT pending_events bigint, OUT oldest_pending_event_age_seconds double precision, OUT overdue_seconds double precision, OUT paused integer, OUT endpoint_on_probation integer) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._event_subscription_metrics(OUT topic text, OUT event_subscription text, OUT matched_events_total bigint, OUT delivery_success_total bigint, OUT pending_events bigint, OUT oldest_pending_event_age_seconds double precision, OUT overdue_seconds double precision, OUT paused integer, OUT endpoint_on_probation integer) TO pg_monitor;
GRANT ALL ON FUNCTION eventgrid._event_subscription_metrics(OUT topic text, OUT event_subscription text, OUT matched_events_total bigint, OUT delivery_success_total bigint, OUT pending_events bigint, OUT oldest_pending_event_age_seconds double precision, OUT overdue_seconds double precision, OUT paused integer, OUT endpoint_on_probation integer) TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.replication_slot_sightings TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.topic_positions TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._event_table_holders(event_table smallint) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._event_table_holders(event_table smallint) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._expiration_time_arg(expiration_time timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._expire_subscription(sid bigint, expired_at timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._fail_validation(sid bigint, why text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._first_invalid_event(topic text, events jsonb, OUT event_index integer, OUT problem text, OUT sqlstate text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._forget_dropped_columns(rel regclass) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._forget_dropped_tables() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._header_problem(header text, value text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._held_subscriptions() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._histogram_buckets(histogram text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._histogram_buckets(histogram text) TO pg_monitor;
GRANT ALL ON FUNCTION eventgrid._histogram_buckets(histogram text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._http_authorized(topic text, path text, sas_key text, sas_token text, auth_header text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._http_error(code text, message text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._http_namespace(topic text, subscription text, operation text, path text, sas_key text, sas_token text, auth_header text, content_type text, body text, max_events text, max_wait_time text, release_delay text, OUT status integer, OUT answer text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._http_namespace(topic text, subscription text, operation text, path text, sas_key text, sas_token text, auth_header text, content_type text, body text, max_events text, max_wait_time text, release_delay text, OUT status integer, OUT answer text) TO eventgrid_http;

REVOKE ALL ON FUNCTION eventgrid._http_publish(topic text, path text, sas_key text, sas_token text, auth_header text, content_type text, body text, OUT status integer, OUT answer text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._http_publish(topic text, path text, sas_key text, sas_token text, auth_header text, content_type text, body text, OUT status integer, OUT answer text) TO eventgrid_http;

REVOKE ALL ON FUNCTION eventgrid._http_publish_events(topic text, events jsonb, OUT status integer, OUT answer text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._http_unauthorized_message() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._insert_dead_letter_notifications(notices eventgrid._dead_letter_notice[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._lock_token_keys(lock_tokens text[], OUT ids bigint[], OUT tokens text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._lock_token_results(sid bigint, lock_tokens text[], done text[], operation text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._log(message text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._metrics_per_topic() FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._metrics_per_topic() TO pg_monitor;
GRANT ALL ON FUNCTION eventgrid._metrics_per_topic() TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._random_bytes(n integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._new_access_key() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._ordering_key(event jsonb, path text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._park_ordering_keys(sids bigint[], key_hashes bigint[], ids bigint[], dues timestamp with time zone[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._parse_lock_tokens(lock_tokens text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._pause_target(topic text, subscription text, OUT target_topic text, OUT target_sid bigint, OUT label text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._pending(subscription_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._pending(subscription_id bigint) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._position_to_queue(sid bigint, due timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._position_to_retries(sid bigint, due timestamp with time zone, keep boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._promote_ordering_keys(sids bigint[], key_hashes bigint[], finished_ids bigint[], due timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._publish_dead_letter_notifications(notices eventgrid._dead_letter_notice[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._publish_table_changes(caller regrole, source_table regclass, topic text, operations text[], columns text[], update_columns text[], event_type_prefix text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._put_delivery_property(p_topic text, p_subscription text, p_header text, p_value text, p_source_field text, p_is_secret boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._queue_count(sid bigint, received bigint, acknowledged bigint, released bigint, rejected bigint, lock_expired bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._queue_event(topic text, event_table smallint, txid xid8, event_id bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._queue_expire(now timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._queue_finish(sid bigint, ids bigint[], reason text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._queue_ids(sid bigint, ids bigint[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._queue_locked(sid bigint, key_ids bigint[], key_tokens text[], OUT ids bigint[], OUT tokens text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._queue_set_aside(event_table smallint) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._queue_subscription_id(topic text, subscription text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._queue_take(sid bigint, max_events integer, after timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._quote(v text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._receive_grant_target(topic text, subscription text, role_name text, OUT sid bigint, OUT label text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._receive_subscription_id(topic text, subscription text, role oid) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._record_validation(sid bigint, sent_code text, http_status integer, body text, allowed_origin text, allowed_rate text, origin text, error text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._refresh_receive_grants() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._refuse_change() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._reject(topic text, subscription text, lock_tokens text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._release(topic text, subscription text, lock_tokens text[], release_delay integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._rename_published_column(rel regclass, recurse boolean, old_name text, new_name text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._renew_locks(topic text, subscription text, lock_tokens text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._replication_slots(OUT slot_name text, OUT active boolean, OUT active_pid integer, OUT lag_bytes numeric, OUT retained_bytes numeric, OUT replay_lag_seconds double precision) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._replication_slots(OUT slot_name text, OUT active boolean, OUT active_pid integer, OUT lag_bytes numeric, OUT retained_bytes numeric, OUT replay_lag_seconds double precision) TO pg_monitor;
GRANT ALL ON FUNCTION eventgrid._replication_slots(OUT slot_name text, OUT active boolean, OUT active_pid integer, OUT lag_bytes numeric, OUT retained_bytes numeric, OUT replay_lag_seconds double precision) TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.unknown_topic_events TO pg_monitor;
GRANT SELECT ON TABLE eventgrid.unknown_topic_events TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._replication_sources(OUT source text, OUT enabled boolean, OUT apply_pid integer, OUT transactions bigint, OUT last_publish_time timestamp with time zone, OUT last_applied_at timestamp with time zone, OUT apply_lag_seconds double precision, OUT received_lsn pg_lsn, OUT last_msg_receipt_time timestamp with time zone, OUT unknown_topic_events bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._replication_sources(OUT source text, OUT enabled boolean, OUT apply_pid integer, OUT transactions bigint, OUT last_publish_time timestamp with time zone, OUT last_applied_at timestamp with time zone, OUT apply_lag_seconds double precision, OUT received_lsn pg_lsn, OUT last_msg_receipt_time timestamp with time zone, OUT unknown_topic_events bigint) TO pg_monitor;
GRANT ALL ON FUNCTION eventgrid._replication_sources(OUT source text, OUT enabled boolean, OUT apply_pid integer, OUT transactions bigint, OUT last_publish_time timestamp with time zone, OUT last_applied_at timestamp with time zone, OUT apply_lag_seconds double precision, OUT received_lsn pg_lsn, OUT last_msg_receipt_time timestamp with time zone, OUT unknown_topic_events bigint) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._retry_policy_args(topic_type text, max_delivery_attempts integer, event_ttl integer, max_delivery_count integer, event_time_to_live text, OUT attempts integer, OUT ttl integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._sas_token_check(token text, key1 text, key2 text, OUT resource text, OUT expiry text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._secret_equal(a text, b text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._served_databases(OUT database text, OUT state text, OUT delivery_workers integer, OUT upkeep_worker boolean, OUT delivery_wanted_at timestamp with time zone, OUT upkeep_wanted_at timestamp with time zone, OUT waiting_since timestamp with time zone, OUT held_by integer, OUT last_active timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._served_databases(OUT database text, OUT state text, OUT delivery_workers integer, OUT upkeep_worker boolean, OUT delivery_wanted_at timestamp with time zone, OUT upkeep_wanted_at timestamp with time zone, OUT waiting_since timestamp with time zone, OUT held_by integer, OUT last_active timestamp with time zone) TO pg_monitor;

REVOKE ALL ON FUNCTION eventgrid._set_delivery_authentication(topic text, subscription text, method text, token_endpoint text, tenant_id text, client_id text, client_secret text, scope text, audience text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._signing_secret_problem(secret text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._start_ordering_keys(sids bigint[], key_hashes bigint[], ids bigint[], due timestamp with time zone) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._start_validation(sid bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._stop_publishing_table_changes(caller regrole, source_table regclass, topic text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._storage_queue_sas(given text, OUT endpoint text, OUT sas text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._subscription_id(topic text, name text, lock boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._subscriptions_changed_at_commit() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._subscriptions_created() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._table_change_trigger() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._table_change_trigger_name(topic text, operation text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._table_ddl() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._table_publication_of(rel regclass, topic text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._table_publications_changed() FROM PUBLIC;

GRANT SELECT ON TABLE eventgrid.topic_counters TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._topic_metrics(OUT topic text, OUT publish_success_total bigint, OUT unmatched_events_total bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._topic_metrics(OUT topic text, OUT publish_success_total bigint, OUT unmatched_events_total bigint) TO pg_monitor;
GRANT ALL ON FUNCTION eventgrid._topic_metrics(OUT topic text, OUT publish_success_total bigint, OUT unmatched_events_total bigint) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._uncover_partitions(rel regclass) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._uri_escape(value text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._validate_event() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._wake_at_commit() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._wake_receivers_at_commit() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._wake_receivers_at_commit(subscription_ids bigint[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._wake_worker_at_commit() FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._wal_source_check_connection(connection text, owner_role oid) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._wal_source_check_connection(connection text, owner_role oid) TO eventgrid_admin;
GRANT ALL ON FUNCTION eventgrid._wal_source_check_connection(connection text, owner_role oid) TO pg_monitor;

REVOKE ALL ON FUNCTION eventgrid._wal_source_drop_slot(connection text, slot_name text, owner_role oid) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._wal_source_named(name text) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._wal_source_origin_lsn(source_id bigint) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._wal_source_origin_lsn(source_id bigint) TO eventgrid_admin;
GRANT ALL ON FUNCTION eventgrid._wal_source_origin_lsn(source_id bigint) TO pg_monitor;

REVOKE ALL ON FUNCTION eventgrid._wal_source_stop(source_id bigint, drop_origin boolean) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._worker_pids(OUT worker text, OUT pid integer) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid._worker_metrics(OUT delivery_workers_running integer, OUT upkeep_workers_running integer, OUT waiting_for_worker_slot_seconds double precision) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._worker_metrics(OUT delivery_workers_running integer, OUT upkeep_workers_running integer, OUT waiting_for_worker_slot_seconds double precision) TO pg_monitor;
GRANT ALL ON FUNCTION eventgrid._worker_metrics(OUT delivery_workers_running integer, OUT upkeep_workers_running integer, OUT waiting_for_worker_slot_seconds double precision) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._worker_status(OUT worker text, OUT pid integer, OUT state text, OUT activity text, OUT state_since timestamp with time zone, OUT wait_event_type text, OUT wait_event text, OUT backend_start timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._worker_status(OUT worker text, OUT pid integer, OUT state text, OUT activity text, OUT state_since timestamp with time zone, OUT wait_event_type text, OUT wait_event text, OUT backend_start timestamp with time zone) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.convert_event(event jsonb, from_schema text, to_schema text, publish_time timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.convert_event(event jsonb, from_schema text, to_schema text, publish_time timestamp with time zone) TO eventgrid_admin;
GRANT ALL ON FUNCTION eventgrid.convert_event(event jsonb, from_schema text, to_schema text, publish_time timestamp with time zone) TO eventgrid_publisher;

REVOKE ALL ON FUNCTION eventgrid.create_domain(name text, input_schema text, auto_create_topic_with_first_subscription boolean, auto_delete_topic_with_last_subscription boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.create_domain(name text, input_schema text, auto_create_topic_with_first_subscription boolean, auto_delete_topic_with_last_subscription boolean) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.create_domain_topic(domain text, name text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.create_domain_topic(domain text, name text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.create_event_publication(name text, topics text[]) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text, ordering_key text, delivery_mode text, receive_lock_duration integer, expiration_time timestamp with time zone, endpoint_type text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text, ordering_key text, delivery_mode text, receive_lock_duration integer, expiration_time timestamp with time zone, endpoint_type text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.create_topic(name text, input_schema text, topic_type text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.create_topic(name text, input_schema text, topic_type text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.create_wal_source(name text, connection text, publication text, slot_name text, message_prefix text, backfill boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.create_wal_source(name text, connection text, publication text, slot_name text, message_prefix text, backfill boolean) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.delivery_outcome(http_status integer) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.delivery_outcome(http_status integer) TO eventgrid_admin;
GRANT ALL ON FUNCTION eventgrid.delivery_outcome(http_status integer) TO eventgrid_publisher;

REVOKE ALL ON FUNCTION eventgrid.drop_domain(name text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.drop_domain(name text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.drop_domain_topic(domain text, name text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.drop_domain_topic(domain text, name text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.drop_event_subscription(topic text, name text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.drop_event_subscription(topic text, name text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.drop_topic(name text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.drop_topic(name text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.drop_wal_source(name text, drop_slot boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.drop_wal_source(name text, drop_slot boolean) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.grant_event_replication(role_name name) FROM PUBLIC;

REVOKE ALL ON FUNCTION eventgrid.grant_receive(topic text, subscription text, role_name text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.grant_receive(topic text, subscription text, role_name text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.pause_delivery(topic text, subscription text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.pause_delivery(topic text, subscription text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.pause_wal_source(name text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.pause_wal_source(name text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.probation_duration(outcome text, probation integer) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.probation_duration(outcome text, probation integer) TO eventgrid_admin;
GRANT ALL ON FUNCTION eventgrid.probation_duration(outcome text, probation integer) TO eventgrid_publisher;

REVOKE ALL ON FUNCTION eventgrid.publish_table_changes(source_table regclass, topic text, operations text[], columns text[], update_columns text[], event_type_prefix text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.publish_table_changes(source_table regclass, topic text, operations text[], columns text[], update_columns text[], event_type_prefix text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.publish_table_changes(table_name text, topic text, source text, operations text[], columns text[], update_columns text[], event_type_prefix text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.publish_table_changes(table_name text, topic text, source text, operations text[], columns text[], update_columns text[], event_type_prefix text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.purge_dead_letters(topic text, subscription text, reason text, dead_lettered_after timestamp with time zone, dead_lettered_before timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.purge_dead_letters(topic text, subscription text, reason text, dead_lettered_after timestamp with time zone, dead_lettered_before timestamp with time zone) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.redeliver_dead_letters(topic text, subscription text, reason text, dead_lettered_after timestamp with time zone, dead_lettered_before timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.redeliver_dead_letters(topic text, subscription text, reason text, dead_lettered_after timestamp with time zone, dead_lettered_before timestamp with time zone) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.regenerate_topic_key(topic text, key_name text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.regenerate_topic_key(topic text, key_name text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.remove_client_certificate(topic text, subscription text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.remove_client_certificate(topic text, subscription text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.remove_delivery_authentication(topic text, subscription text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.remove_delivery_authentication(topic text, subscription text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.remove_delivery_property(topic text, subscription text, header text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.remove_delivery_property(topic text, subscription text, header text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.remove_signing_secret(topic text, subscription text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.remove_signing_secret(topic text, subscription text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.resume_delivery(topic text, subscription text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.resume_delivery(topic text, subscription text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.resume_wal_source(name text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.resume_wal_source(name text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.retry_delay(attempt integer, http_status integer, topic_type text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.retry_delay(attempt integer, http_status integer, topic_type text) TO eventgrid_admin;
GRANT ALL ON FUNCTION eventgrid.retry_delay(attempt integer, http_status integer, topic_type text) TO eventgrid_publisher;

REVOKE ALL ON FUNCTION eventgrid.revoke_receive(topic text, subscription text, role_name text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.revoke_receive(topic text, subscription text, role_name text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.set_advanced_filters(topic text, subscription text, filters jsonb, enable_advanced_filtering_on_arrays boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.set_advanced_filters(topic text, subscription text, filters jsonb, enable_advanced_filtering_on_arrays boolean) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.set_batching(topic text, name text, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.set_batching(topic text, name text, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.set_client_certificate(topic text, subscription text, certificate text, private_key text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.set_client_certificate(topic text, subscription text, certificate text, private_key text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.set_deadletter(topic text, name text, enabled boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.set_deadletter(topic text, name text, enabled boolean) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.set_delivery_property(topic text, subscription text, header text, value text, is_secret boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.set_delivery_property(topic text, subscription text, header text, value text, is_secret boolean) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.set_dynamic_delivery_property(topic text, subscription text, header text, source_field text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.set_dynamic_delivery_property(topic text, subscription text, header text, source_field text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.set_entra_authentication(topic text, subscription text, tenant_id text, application_id_or_uri text, client_id text, client_secret text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.set_entra_authentication(topic text, subscription text, tenant_id text, application_id_or_uri text, client_id text, client_secret text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.set_oauth2_authentication(topic text, subscription text, token_endpoint text, client_id text, client_secret text, scope text, audience text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.set_oauth2_authentication(topic text, subscription text, token_endpoint text, client_id text, client_secret text, scope text, audience text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.set_retry_policy(topic text, name text, max_delivery_attempts integer, event_ttl integer, max_delivery_count integer, event_time_to_live text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.set_retry_policy(topic text, name text, max_delivery_attempts integer, event_ttl integer, max_delivery_count integer, event_time_to_live text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.set_signing_secret(topic text, subscription text, secret text, previous_valid_for interval) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.set_signing_secret(topic text, subscription text, secret text, previous_valid_for interval) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.set_storage_account_key(topic text, subscription text, account_key text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.set_storage_account_key(topic text, subscription text, account_key text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.stop_publishing_table_changes(source_table regclass, topic text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.stop_publishing_table_changes(source_table regclass, topic text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text, ordering_key text, receive_lock_duration integer, expiration_time timestamp with time zone, endpoint_type text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text, ordering_key text, receive_lock_duration integer, expiration_time timestamp with time zone, endpoint_type text) TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid.validate_event_subscription(topic text, subscription text, validation_code text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.validate_event_subscription(topic text, subscription text, validation_code text) TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.attempt_log_rotation TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.blocked_ordering_keys TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.client_certificate_metrics TO pg_monitor;
GRANT SELECT ON TABLE eventgrid.client_certificate_metrics TO eventgrid_admin;

GRANT SELECT,DELETE ON TABLE eventgrid.dead_letters TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.dead_letter_events TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.dead_letter_notification_failures TO pg_monitor;
GRANT SELECT,DELETE ON TABLE eventgrid.dead_letter_notification_failures TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.delivery_attempts TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.delivery_statistics TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.delivery_token_metrics TO pg_monitor;
GRANT SELECT ON TABLE eventgrid.delivery_token_metrics TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.domains TO eventgrid_admin;

GRANT SELECT(name) ON TABLE eventgrid.domains TO eventgrid_publisher;

GRANT SELECT ON TABLE eventgrid.domain_statistics TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.domain_topics TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.endpoint_health TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.event_subscription_authentication TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.event_subscription_batching TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.event_subscription_certificates TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.event_subscription_delivery_properties TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.event_subscription_expiration_metrics TO pg_monitor;
GRANT SELECT ON TABLE eventgrid.event_subscription_expiration_metrics TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.subscription_metric_counts TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.event_subscription_histograms TO pg_monitor;
GRANT SELECT ON TABLE eventgrid.event_subscription_histograms TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.event_subscription_metric_labels TO pg_monitor;
GRANT SELECT ON TABLE eventgrid.event_subscription_metric_labels TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.event_subscription_metrics TO pg_monitor;
GRANT SELECT ON TABLE eventgrid.event_subscription_metrics TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.event_subscription_receivers TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.event_subscription_signing TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.event_subscription_validation TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.event_table_rotations TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.event_tables TO eventgrid_admin;

GRANT USAGE ON SEQUENCE eventgrid.events_id_seq TO eventgrid_publisher;

GRANT SELECT ON TABLE eventgrid.expired_event_subscriptions TO pg_monitor;
GRANT SELECT,DELETE ON TABLE eventgrid.expired_event_subscriptions TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.http_publish_counts TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.metrics TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.ordering_metrics TO pg_monitor;
GRANT SELECT ON TABLE eventgrid.ordering_metrics TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.queue_metrics TO pg_monitor;
GRANT SELECT ON TABLE eventgrid.queue_metrics TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.rejected_events TO pg_monitor;
GRANT SELECT,DELETE ON TABLE eventgrid.rejected_events TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.replication_slots TO pg_monitor;
GRANT SELECT ON TABLE eventgrid.replication_slots TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.replication_sources TO pg_monitor;
GRANT SELECT ON TABLE eventgrid.replication_sources TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.served_databases TO pg_monitor;

GRANT SELECT ON TABLE eventgrid.table_change_publications TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.topic_keys TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.topic_metrics TO pg_monitor;
GRANT SELECT ON TABLE eventgrid.topic_metrics TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.topic_publish_metrics TO pg_monitor;
GRANT SELECT ON TABLE eventgrid.topic_publish_metrics TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.topic_statistics TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.wal_sources TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.wal_source_metrics TO pg_monitor;
GRANT SELECT ON TABLE eventgrid.wal_source_metrics TO eventgrid_admin;

GRANT SELECT,DELETE ON TABLE eventgrid.wal_source_rejects TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.worker_metrics TO pg_monitor;
GRANT SELECT ON TABLE eventgrid.worker_metrics TO eventgrid_admin;

GRANT SELECT ON TABLE eventgrid.worker_status TO eventgrid_admin;

REVOKE ALL ON FUNCTION eventgrid._http_count(counts jsonb) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid._http_count(counts jsonb) TO eventgrid_http;

-- The rows the rotations start from.
INSERT INTO eventgrid.event_table_rotations (event_table) VALUES (0), (1), (2);
INSERT INTO eventgrid.attempt_log_rotation (history_table, started_at, first_id) VALUES (0, now(), 1);

-- Event triggers (no schema holds them).

CREATE EVENT TRIGGER eventgrid_check_event_publications ON ddl_command_end
         WHEN TAG IN ('CREATE PUBLICATION', 'ALTER PUBLICATION')
   EXECUTE FUNCTION eventgrid._check_event_publications();

COMMENT ON EVENT TRIGGER eventgrid_check_event_publications IS 'eventgrid: refuses publications of eventgrid.events that would replicate the rotation''s TRUNCATE or the event tables one by one (README "Scaling out").';

CREATE EVENT TRIGGER eventgrid_forget_dropped_tables ON sql_drop
   EXECUTE FUNCTION eventgrid._forget_dropped_tables();

COMMENT ON EVENT TRIGGER eventgrid_forget_dropped_tables IS 'eventgrid: forgets the table change publications of a dropped table (its triggers go with it).';

CREATE EVENT TRIGGER eventgrid_table_ddl ON ddl_command_end
         WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE')
   EXECUTE FUNCTION eventgrid._table_ddl();

COMMENT ON EVENT TRIGGER eventgrid_table_ddl IS 'eventgrid: follows column renames and drops in the publications of table changes, and covers partitions created or attached below a published table.';


-- What pg_dump copies of the extension's tables (user data and the queue).
SELECT pg_catalog.pg_extension_config_dump('eventgrid.attempt_log_0', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.attempt_log_1', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.attempt_log_2', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.attempt_log_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.chunks_in_flight', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.client_certificates', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.dead_letter_notification_failures', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.dead_letter_notification_failures_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.dead_letters', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.dead_letters_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.delivery_authentications', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.delivery_pauses', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.delivery_properties', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.destination_credentials', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.domain_topic_entries', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.domains', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.endpoint_validations', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.event_subscriptions', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.event_subscriptions_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.events_0', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.events_1', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.events_2', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.events_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.expired_event_subscriptions', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.expired_event_subscriptions_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.http_publish_counts', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.ordering_keys', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.queue_batches', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.queue_batches_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.queue_counters', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.queue_events', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.queue_events_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.receive_grants', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.rejected_events', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.rejected_events_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.replication_progress', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.retries', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.retries_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.signing_secrets', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.subscription_counters', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.subscription_metric_counts', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.subscription_positions', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.table_publications', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.topic_access_keys', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.topic_counters', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.topic_positions', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.topics', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.unknown_topic_events', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.wal_source_definitions', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.wal_source_definitions_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.wal_source_rejects', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.wal_source_rejects_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.wal_source_tables', '');
