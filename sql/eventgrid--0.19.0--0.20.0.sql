-- eventgrid 0.19.0 -> 0.20.0: event domains (SPEC 18): a domain is a
-- topic whose events each name their domain topic (Event Grid schema:
-- "topic"; CloudEvents: "source"); subscriptions at domain scope see every
-- domain topic's events, at domain-topic scope ('domain/topic') only that
-- topic's, read through an index on (topic, domain_topic, txid, id).

\echo Use "ALTER EXTENSION eventgrid UPDATE TO '0.20.0'" to load this file. \quit

CREATE TABLE eventgrid.domains (
    name text PRIMARY KEY REFERENCES eventgrid.topics (name) ON DELETE CASCADE,
    auto_create_topic_with_first_subscription boolean NOT NULL DEFAULT true,
    auto_delete_topic_with_last_subscription boolean NOT NULL DEFAULT true,
    created_at timestamp with time zone NOT NULL DEFAULT now()
);
COMMENT ON TABLE eventgrid.domains IS 'Event domains (SPEC 18): each is a topic (eventgrid.topics, same name: it has the topic''s input schema and access keys) whose events name their domain topic; with its autoCreateTopicWithFirstSubscription and autoDeleteTopicWithLastSubscription. Made by create_domain(), dropped by drop_domain().';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.domains', '');
GRANT SELECT ON eventgrid.domains TO eventgrid_admin;
-- the publish trigger runs as the publisher: which topics are domains
GRANT SELECT (name) ON eventgrid.domains TO eventgrid_publisher;

CREATE TABLE eventgrid.domain_topic_entries (
    domain text NOT NULL REFERENCES eventgrid.domains (name) ON DELETE CASCADE,
    name text NOT NULL,
    created_automatically boolean NOT NULL DEFAULT false,
    created_at timestamp with time zone NOT NULL DEFAULT now(),
    PRIMARY KEY (domain, name)
);
COMMENT ON TABLE eventgrid.domain_topic_entries IS 'Internal: the domain topics of each domain (SPEC 18), created by create_domain_topic() or with their first subscription (created_automatically); read them through eventgrid.domain_topics.';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.domain_topic_entries', '');

ALTER TABLE eventgrid.events ADD COLUMN domain_topic text;
COMMENT ON COLUMN eventgrid.events.domain_topic IS 'The domain topic an event published to a domain names (its "topic" in the Event Grid schema, its "source" in CloudEvents; SPEC 18); NULL for a topic''s events.';
CREATE INDEX events_domain_topic_idx ON eventgrid.events (topic, domain_topic, txid, id) WHERE domain_topic IS NOT NULL;

ALTER TABLE eventgrid.event_subscriptions ADD COLUMN domain_topic text;
COMMENT ON COLUMN eventgrid.event_subscriptions.domain_topic IS 'Of a subscription of a domain (topic): the domain topic it is scoped to, NULL at domain scope (it sees every domain topic''s events). Functions name it ''domain/topic''. SPEC 18.';
ALTER TABLE eventgrid.event_subscriptions ADD COLUMN read_key text
    GENERATED ALWAYS AS (CASE WHEN domain_topic IS NULL THEN topic ELSE topic || '/' || domain_topic END) STORED;
COMMENT ON COLUMN eventgrid.event_subscriptions.read_key IS 'Internal: what the subscription reads of the event tables: its topic, or ''domain/topic'' for a domain-topic subscription (eventgrid._unpassed_events(), eventgrid._chunk_events()).';
ALTER TABLE eventgrid.event_subscriptions DROP CONSTRAINT event_subscriptions_topic_name_key;
ALTER TABLE eventgrid.event_subscriptions
    ADD CONSTRAINT event_subscriptions_topic_name_key UNIQUE NULLS NOT DISTINCT (topic, domain_topic, name);
ALTER TABLE eventgrid.event_subscriptions
    ADD CONSTRAINT event_subscriptions_domain_topic_fkey FOREIGN KEY (topic, domain_topic)
        REFERENCES eventgrid.domain_topic_entries (domain, name);

CREATE OR REPLACE FUNCTION eventgrid._unpassed_events(topic text, done pg_snapshot, upto pg_snapshot, after_txid xid8, after_id bigint) RETURNS SETOF eventgrid.events
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
   WHERE ((strpos(_unpassed_events.topic, '/'::text) > 0) AND (e.topic = split_part(_unpassed_events.topic, '/'::text, 1)) AND (e.domain_topic = substr(_unpassed_events.topic, (strpos(_unpassed_events.topic, '/'::text) + 1))) AND (e.txid >= pg_snapshot_xmin(_unpassed_events.done)) AND (ROW(e.txid, e.id) > ROW(GREATEST(_unpassed_events.after_txid, pg_snapshot_xmin(_unpassed_events.done)),
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
   WHERE ((_unpassed_events.upto IS NOT NULL) AND (strpos(_unpassed_events.topic, '/'::text) > 0) AND (e.topic = split_part(_unpassed_events.topic, '/'::text, 1)) AND (e.domain_topic = substr(_unpassed_events.topic, (strpos(_unpassed_events.topic, '/'::text) + 1))) AND (e.txid >= GREATEST(pg_snapshot_xmin(_unpassed_events.done), pg_snapshot_xmin(_unpassed_events.upto))) AND (e.txid < _unpassed_events.after_txid) AND (NOT pg_visible_in_snapshot(e.txid, _unpassed_events.done)) AND (NOT pg_visible_in_snapshot(e.txid, _unpassed_events.upto)));
END;

CREATE OR REPLACE FUNCTION eventgrid._chunk_events(topic text, done pg_snapshot, upto pg_snapshot, after_txid xid8, after_id bigint, last_txid xid8, last_id bigint) RETURNS SETOF eventgrid.events
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
   WHERE ((strpos(_chunk_events.topic, '/'::text) > 0) AND (e.topic = split_part(_chunk_events.topic, '/'::text, 1)) AND (e.domain_topic = substr(_chunk_events.topic, (strpos(_chunk_events.topic, '/'::text) + 1))) AND (e.txid >= pg_snapshot_xmin(_chunk_events.done)) AND (e.txid < _chunk_events.last_txid) AND (ROW(e.txid, e.id) > ROW(GREATEST(_chunk_events.after_txid, pg_snapshot_xmin(_chunk_events.done)),
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
   WHERE ((strpos(_chunk_events.topic, '/'::text) > 0) AND (e.topic = split_part(_chunk_events.topic, '/'::text, 1)) AND (e.domain_topic = substr(_chunk_events.topic, (strpos(_chunk_events.topic, '/'::text) + 1))) AND (e.txid >= pg_snapshot_xmin(_chunk_events.done)) AND (e.txid = _chunk_events.last_txid) AND (e.id <= _chunk_events.last_id) AND (ROW(e.txid, e.id) > ROW(GREATEST(_chunk_events.after_txid, pg_snapshot_xmin(_chunk_events.done)),
         CASE
             WHEN (_chunk_events.after_txid >= pg_snapshot_xmin(_chunk_events.done)) THEN _chunk_events.after_id
             ELSE (0)::bigint
         END)) AND eventgrid._in_batch(e.txid, _chunk_events.done, _chunk_events.upto));
END;

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
           WHERE (q_1.subscription_id = _backlog.subscription_id)) q;
END;

CREATE OR REPLACE FUNCTION eventgrid._position_to_retries(sid bigint, due timestamp with time zone, keep boolean) RETURNS bigint
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

CREATE OR REPLACE FUNCTION eventgrid._subscription_id(topic text, name text, lock boolean DEFAULT false) RETURNS bigint
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
REVOKE ALL ON FUNCTION eventgrid._domain_topic_for_subscription(domain text, domain_topic text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text DEFAULT NULL::text, event_delivery_schema text DEFAULT NULL::text, included_event_types text[] DEFAULT NULL::text[], subject_begins_with text DEFAULT NULL::text, subject_ends_with text DEFAULT NULL::text, is_subject_case_sensitive boolean DEFAULT false, max_delivery_attempts integer DEFAULT NULL::integer, event_ttl integer DEFAULT NULL::integer, max_events_per_batch integer DEFAULT NULL::integer, preferred_batch_size_in_kilobytes integer DEFAULT NULL::integer, deadletter boolean DEFAULT false, advanced_filters jsonb DEFAULT NULL::jsonb, enable_advanced_filtering_on_arrays boolean DEFAULT false, max_delivery_count integer DEFAULT NULL::integer, event_time_to_live text DEFAULT NULL::text, max_events_per_second integer DEFAULT NULL::integer, endpoint_validation text DEFAULT 'none'::text, dead_letter_topic text DEFAULT NULL::text, ordering_key text DEFAULT NULL::text, delivery_mode text DEFAULT 'push'::text, receive_lock_duration integer DEFAULT NULL::integer, expiration_time timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS bigint
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
         delivery_mode, receive_lock_duration, expiration_time, domain_topic)
    VALUES (topic, name, endpoint, event_delivery_schema, included_event_types, subject_begins_with,
            subject_ends_with, is_subject_case_sensitive, coalesce(attempts, CASE ttype WHEN 'namespace' THEN 10 ELSE 30 END),
            coalesce(ttl, CASE ttype WHEN 'namespace' THEN 10080 ELSE 1440 END),
            max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter, ttype,
            advanced_filters, enable_advanced_filtering_on_arrays, max_events_per_second, dead_letter_topic, ordering_key,
            delivery_mode, receive_lock_duration, expiration_time, dt)
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

CREATE OR REPLACE FUNCTION eventgrid.drop_event_subscription(topic text, name text) RETURNS void
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
REVOKE ALL ON FUNCTION eventgrid._drop_topic(name text) FROM PUBLIC;

CREATE OR REPLACE FUNCTION eventgrid.drop_topic(name text) RETURNS void
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


CREATE FUNCTION eventgrid.create_domain(name text, input_schema text DEFAULT 'EventGridSchema'::text,
                                        auto_create_topic_with_first_subscription boolean DEFAULT true,
                                        auto_delete_topic_with_last_subscription boolean DEFAULT true) RETURNS void
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
REVOKE ALL ON FUNCTION eventgrid.create_domain(name text, input_schema text, auto_create_topic_with_first_subscription boolean, auto_delete_topic_with_last_subscription boolean) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.create_domain(name text, input_schema text, auto_create_topic_with_first_subscription boolean, auto_delete_topic_with_last_subscription boolean) TO eventgrid_admin;

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
REVOKE ALL ON FUNCTION eventgrid._domain_of(name text) FROM PUBLIC;

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
REVOKE ALL ON FUNCTION eventgrid.drop_domain(name text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.drop_domain(name text) TO eventgrid_admin;

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
REVOKE ALL ON FUNCTION eventgrid.create_domain_topic(domain text, name text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.create_domain_topic(domain text, name text) TO eventgrid_admin;

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
REVOKE ALL ON FUNCTION eventgrid.drop_domain_topic(domain text, name text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.drop_domain_topic(domain text, name text) TO eventgrid_admin;

CREATE VIEW eventgrid.domain_topics AS
 SELECT e.domain,
    e.name AS domain_topic,
    (SELECT count(*) FROM eventgrid.event_subscriptions s WHERE s.topic = e.domain AND s.domain_topic = e.name) AS subscriptions,
    e.created_automatically,
    e.created_at
   FROM eventgrid.domain_topic_entries e;
COMMENT ON VIEW eventgrid.domain_topics IS 'Per domain topic (SPEC 18): its domain, name, how many event subscriptions it has, and whether its first subscription created it (created_automatically) or create_domain_topic() did.';
GRANT SELECT ON eventgrid.domain_topics TO eventgrid_admin;

CREATE VIEW eventgrid.domain_statistics AS
 SELECT d.name AS domain,
    t.input_schema,
    d.auto_create_topic_with_first_subscription,
    d.auto_delete_topic_with_last_subscription,
    (SELECT count(*) FROM eventgrid.domain_topic_entries e WHERE e.domain = d.name) AS domain_topics,
    (SELECT count(*) FROM eventgrid.event_subscriptions s WHERE s.topic = d.name AND s.domain_topic IS NULL) AS domain_scope_subscriptions,
    (SELECT count(*) FROM eventgrid.event_subscriptions s WHERE s.topic = d.name AND s.domain_topic IS NOT NULL) AS domain_topic_subscriptions,
    coalesce(c.published, 0) AS published
   FROM eventgrid.domains d
   JOIN eventgrid.topics t ON t.name = d.name
   LEFT JOIN eventgrid.topic_counters c ON c.topic = d.name;
COMMENT ON VIEW eventgrid.domain_statistics IS 'Per domain (SPEC 18): its input schema and auto-create / auto-delete settings, how many domain topics it has, its event subscriptions at domain scope and at domain-topic scope, and the events published to it.';
GRANT SELECT ON eventgrid.domain_statistics TO eventgrid_admin;

COMMENT ON FUNCTION eventgrid.drop_topic(name text) IS 'Drops a topic with its event subscriptions and their pending deliveries and retries, and stops the publications of table changes to it. Dead letters are kept. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such topic, 42809 a domain (drop_domain() drops those).';

COMMENT ON FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text, ordering_key text, delivery_mode text, receive_lock_duration integer, expiration_time timestamp with time zone) IS 'Creates an event subscription and returns its id. topic: a topic, a domain (domain scope: every domain topic''s events) or ''domain/topic'' (domain-topic scope: that domain topic''s events; created with it when the domain creates topics with their first subscription, else 42704; SPEC 18); names are unique per topic, domain or domain topic. endpoint (push): http(s) URL that libcurl parses, with a host, at most 2048 bytes (no user name or password). event_delivery_schema: defaults to the topic''s input schema (namespace topics: CloudEvents only). Filters: included_event_types (case-insensitive), subject_begins_with / subject_ends_with (case-insensitive unless is_subject_case_sensitive), advanced_filters (Event Grid JSON, see set_advanced_filters) with enable_advanced_filtering_on_arrays (false). Retry policy of a custom topic: max_delivery_attempts 1-30 (30), event_ttl 1-1440 minutes (1440); of a namespace topic: max_delivery_count 1-10 (10), event_time_to_live ISO 8601 PT1M-P7D (P7D); the other profile''s arguments are refused. max_events_per_batch 1-5000, preferred_batch_size_in_kilobytes 1-1024 (either turns batching on), deadletter (false). max_events_per_second 1-100,000 (NULL: no rate limit; a batch counts its events, retries count; events over the rate wait in the queue). endpoint_validation: none (default) or handshake (Event Grid''s SubscriptionValidationEvent, or for CloudEvents the webhook OPTIONS request; nothing is delivered until the endpoint is validated, see event_subscription_validation). dead_letter_topic: a topic (of this database) to which each event this subscription dead-letters or drops is published as a notification, in the transaction that records it (see README, Dead-letter notifications; NULL: none). ordering_key: a dotted field path (1-512 characters, as a dynamic delivery property''s source_field: subject, data.orderId, partitionkey) whose value (string, number or boolean) is each event''s key: events of one key are delivered in publish order, one request at a time across all delivery workers, the next only once the one before is delivered, dead-lettered or dropped; events without it go unordered (NULL: unordered; see README, Ordered delivery). delivery_mode: push (default: delivered to endpoint) or queue (pull delivery, namespace topics only: no endpoint, batching, rate limit, endpoint validation or ordering_key; consumers call receive(), see README, Pull delivery); receive_lock_duration: of a queue subscription, seconds 60-300 (60) a received event stays locked. expiration_time: when the event subscription expires (NULL or ''infinity'': never; else it must be in the future of the real clock): from then on nothing more is delivered or received for it, and the upkeep worker drops it as drop_event_subscription() would (its dead letters are kept; see README, Expiration). Requires eventgrid_admin. Errors: 42704 (also no such dead_letter_topic), 42602, 22023, 22003, 22004, 54000, 42710. SPEC 1, 4, 5, 7, 9, 13, 14, 17.';

COMMENT ON FUNCTION eventgrid.drop_event_subscription(topic text, name text) IS 'Drops an event subscription with its pending deliveries and retries. Dead letters are kept. topic may be ''domain/topic'': the last subscription of a domain topic drops it when its domain auto-deletes topics (SPEC 18). Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription.';

COMMENT ON FUNCTION eventgrid._subscription_id(topic text, name text, lock boolean) IS 'Internal: id of an event subscription (topic a topic, a domain, or ''domain/topic'') (optionally locked FOR UPDATE); raises 42704 when there is none.';

COMMENT ON FUNCTION eventgrid._unpassed_events(topic text, done pg_snapshot, upto pg_snapshot, after_txid xid8, after_id bigint) IS 'Internal: the events of a topic that a position (done, upto, last event) has not passed, before filters. Inlined by the planner; the upkeep worker''s backlog count and eventgrid._pending() read through it. topic is a subscription''s read_key: a topic or domain, or ''domain/topic'' (that domain topic''s events, through events_domain_topic_idx).';

COMMENT ON FUNCTION eventgrid._chunk_events(topic text, done pg_snapshot, upto pg_snapshot, after_txid xid8, after_id bigint, last_txid xid8, last_id bigint) IS 'Internal: the events of a chunk in flight (eventgrid.chunks_in_flight), as the claim took them: its key range in its batch, before filters. Inlined by the planner; the delivery workers and eventgrid._pending() read chunks through it. topic is the subscription''s read_key, as for _unpassed_events().';

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
    s.expiration_time,
    s.domain_topic
   FROM ((eventgrid.event_subscriptions s
     LEFT JOIN eventgrid.subscription_counters c ON ((c.subscription_id = s.id)))
     LEFT JOIN LATERAL ( SELECT (sum(x.received))::bigint AS received,
            (sum(x.acknowledged))::bigint AS acknowledged,
            (sum(x.released))::bigint AS released,
            (sum(x.rejected))::bigint AS rejected,
            (sum(x.lock_expired))::bigint AS lock_expired
           FROM eventgrid.queue_counters x
          WHERE ((x.subscription_id = s.id) AND (s.delivery_mode = 'queue'::text))) k ON (true));
COMMENT ON VIEW eventgrid.delivery_statistics IS 'Per event subscription: deliveries pending (not yet delivered, dead-lettered or dropped, retries included), of which waiting for a retry, events delivered, failed delivery attempts (requests sent that failed; attempts held back by probation are not counted), events dead-lettered, events dropped (undeliverable with dead-lettering off), dead letters queued again by redeliver_dead_letters, whether pause_delivery() paused it (itself, its topic or everything; the GUC eventgrid.delivery_paused is not shown here), and its delivery_mode (push or queue). Of a queue event subscription (pull delivery, SPEC 14) delivered counts the events acknowledged, pending the events not yet acknowledged or dead-lettered, and received, acknowledged, released, rejected and lock_expired count the subscriber operations (NULL for push); expiration_time: when it expires (NULL: never; SPEC 17); domain_topic: of a subscription at domain-topic scope, its domain topic (topic is then its domain; SPEC 18).';

-- chunks in flight name their subscription's read_key ('domain/topic' for a domain topic's)
CREATE OR REPLACE FUNCTION eventgrid._event_table_holders(event_table smallint) RETURNS text[]
    LANGUAGE sql STABLE PARALLEL SAFE
    BEGIN ATOMIC
 SELECT array_agg(DISTINCT h.holder ORDER BY h.holder) AS array_agg
    FROM ( SELECT format('event subscription %s of topic %s'::text, s.name, s.topic) AS holder
            FROM (eventgrid.subscription_positions p
              JOIN eventgrid.event_subscriptions s ON ((s.id = p.subscription_id)))
           WHERE (EXISTS ( SELECT 1
                    FROM eventgrid.events e
                   WHERE ((e.event_table = _event_table_holders.event_table) AND (e.topic = s.topic) AND (e.txid >= pg_snapshot_xmin(p.done)) AND (NOT pg_visible_in_snapshot(e.txid, p.done)))))
         UNION ALL
          SELECT format('first attempts in flight for topic %s'::text, split_part(c.topic, '/'::text, 1)) AS format
            FROM eventgrid.chunks_in_flight c
           WHERE (EXISTS ( SELECT 1
                    FROM eventgrid.events e
                   WHERE ((e.event_table = _event_table_holders.event_table) AND (e.topic = split_part(c.topic, '/'::text, 1)) AND (e.txid >= pg_snapshot_xmin(c.done)) AND (NOT pg_visible_in_snapshot(e.txid, c.done)))))
         UNION ALL
          SELECT format('unmatched count of topic %s'::text, tp.topic) AS format
            FROM eventgrid.topic_positions tp
           WHERE (EXISTS ( SELECT 1
                    FROM eventgrid.events e
                   WHERE ((e.event_table = _event_table_holders.event_table) AND (e.topic = tp.topic) AND (e.txid >= pg_snapshot_xmin(tp.done)) AND (NOT pg_visible_in_snapshot(e.txid, tp.done)))))
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

CREATE OR REPLACE FUNCTION eventgrid._pause_target(topic text, subscription text, OUT target_topic text, OUT target_sid bigint, OUT label text) RETURNS record
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

CREATE OR REPLACE FUNCTION eventgrid._drop_expired_subscriptions() RETURNS TABLE(topic text, name text, expiration_time timestamp with time zone)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    s record;
BEGIN
    -- read_key: its topic, or 'domain/topic' for a domain topic's subscription (SPEC 18)
    FOR s IN SELECT x.read_key AS topic, x.name, x.expiration_time FROM eventgrid.event_subscriptions x
              WHERE x.expiration_time <= eventgrid._now() ORDER BY x.expiration_time, x.id LIMIT 1000
    LOOP
        PERFORM eventgrid.drop_event_subscription(s.topic, s.name);
        topic := s.topic;
        name := s.name;
        expiration_time := s.expiration_time;
        RETURN NEXT;
    END LOOP;
END $$;

-- the metrics name a domain topic's subscription by 'domain/topic' (SPEC 18): unique label sets for postgres_exporter
CREATE OR REPLACE VIEW eventgrid.event_subscription_metric_labels AS
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
     CROSS JOIN LATERAL unnest(
        CASE s.delivery_mode
            WHEN 'queue'::text THEN ARRAY['MaxDeliveryCountExceeded'::text, 'TimeToLiveExceeded'::text, 'Rejected'::text]
            ELSE ARRAY['MaxDeliveryAttemptsExceeded'::text, 'TimeToLiveExceeded'::text, 'NonRetriableError'::text]
        END) r(reason))
     LEFT JOIN eventgrid.subscription_metric_counts m ON (((m.subscription_id = s.id) AND (m.metric = k.metric) AND (m.label = r.reason))));

CREATE OR REPLACE VIEW eventgrid.client_certificate_metrics AS
 SELECT s.read_key AS topic,
    s.name AS event_subscription,
    (EXTRACT(epoch FROM c.not_after))::double precision AS expiry_timestamp_seconds
   FROM (eventgrid.client_certificates c
     JOIN eventgrid.event_subscriptions s ON ((s.id = c.subscription_id)));

CREATE OR REPLACE VIEW eventgrid.event_subscription_expiration_metrics AS
 SELECT s.read_key AS topic,
    s.name AS event_subscription,
    (EXTRACT(epoch FROM s.expiration_time))::double precision AS expiration_timestamp_seconds
   FROM eventgrid.event_subscriptions s
  WHERE (s.expiration_time IS NOT NULL);

CREATE OR REPLACE VIEW eventgrid.ordering_metrics AS
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

CREATE OR REPLACE VIEW eventgrid.queue_metrics AS
 SELECT s.read_key AS topic,
    s.name AS event_subscription,
    COALESCE(k.received, (0)::bigint) AS received_total,
    COALESCE(k.acknowledged, (0)::bigint) AS acknowledged_total,
    COALESCE(k.released, (0)::bigint) AS released_total,
    COALESCE(k.rejected, (0)::bigint) AS rejected_total,
    COALESCE(k.lock_expired, (0)::bigint) AS lock_expired_total,
    COALESCE(c.dead_lettered, (0)::bigint) AS dead_lettered_total,
    COALESCE(c.dropped, (0)::bigint) AS dropped_total,
    q.receivable AS receivable_events,
    q.locked AS locked_events,
    q.delayed AS delayed_events,
    COALESCE((EXTRACT(epoch FROM (eventgrid._now() - q.oldest)))::double precision, (0)::double precision) AS oldest_receivable_event_age_seconds
   FROM (((eventgrid.event_subscriptions s
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
  WHERE (s.delivery_mode = 'queue'::text);

CREATE OR REPLACE VIEW eventgrid.event_subscription_histograms AS
 SELECT x.topic,
    x.name AS event_subscription,
    x.histogram,
    x.le_text AS le,
    sum(x.n) OVER (PARTITION BY x.id, x.histogram ORDER BY x.le) AS bucket,
    x.total AS sum,
    sum(x.n) OVER (PARTITION BY x.id, x.histogram) AS count
   FROM ( SELECT s.id,
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
             LEFT JOIN eventgrid.subscription_metric_counts ms ON (((ms.subscription_id = s.id) AND (ms.metric = (h.kind || '_sum'::text)) AND (ms.label = ''::text))))) x;

CREATE OR REPLACE FUNCTION eventgrid._event_subscription_metrics(OUT topic text, OUT event_subscription text, OUT matched_events_total bigint, OUT delivery_success_total bigint, OUT pending_events bigint, OUT oldest_pending_event_age_seconds double precision, OUT overdue_seconds double precision, OUT paused integer, OUT endpoint_on_probation integer) RETURNS SETOF record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT s.read_key AS topic,
     s.name AS event_subscription,
     COALESCE(c.matched, (0)::bigint) AS matched_events_total,
     (COALESCE(c.delivered, (0)::bigint) + (( SELECT COALESCE(sum(x.acknowledged), (0)::numeric) AS "coalesce"
            FROM eventgrid.queue_counters x
           WHERE (x.subscription_id = s.id)))::bigint) AS delivery_success_total,
     b.pending AS pending_events,
     COALESCE((EXTRACT(epoch FROM (eventgrid._now() - b.oldest)))::double precision, (0)::double precision) AS oldest_pending_event_age_seconds,
     COALESCE((EXTRACT(epoch FROM (eventgrid._now() - b.due_since)))::double precision, (0)::double precision) AS overdue_seconds,
     ((s.id IN ( SELECT p.p
            FROM eventgrid._paused_subscriptions() p(p))))::integer AS paused,
     ((COALESCE(h.state, 'healthy'::text) <> 'healthy'::text))::integer AS endpoint_on_probation
    FROM (((eventgrid.event_subscriptions s
      LEFT JOIN eventgrid.subscription_counters c ON ((c.subscription_id = s.id)))
      LEFT JOIN eventgrid.endpoint_states h ON ((h.endpoint = s.endpoint)))
      CROSS JOIN LATERAL eventgrid._backlog(s.id) b(pending, oldest, due_since));
END;


CREATE OR REPLACE FUNCTION eventgrid._publish_table_changes(caller regrole, source_table regclass, topic text, operations text[], columns text[], update_columns text[], event_type_prefix text) RETURNS void
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

CREATE OR REPLACE FUNCTION eventgrid._check_dead_letter_topic(dead_letter_topic text) RETURNS void
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
