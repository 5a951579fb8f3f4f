-- eventgrid 0.24.0 -> 0.25.0: scale in subscriptions (SPEC 20).  A
-- delivery worker's claim looks only at the event subscriptions whose topic
-- or domain topic has new events, and at those it kept, not at every
-- position; what walked every subscription (the event table rotation's
-- look at what holds a table, the queue subscriptions' transfer) looks at
-- what the event tables hold.

\echo Use "ALTER EXTENSION eventgrid UPDATE TO '0.25.0'" to load this file. \quit

-- the queue subscriptions, found without reading every subscription
-- (the event table rotation's holders, the claims' transfer)
CREATE INDEX event_subscriptions_queue_idx ON eventgrid.event_subscriptions (id)
    WHERE delivery_mode = 'queue';

-- A new subscription's position is a change the delivery workers follow:
-- their next claims sweep (look at every topic with events), since events
-- of transactions that committed before the subscription did may be older
-- than their last look.
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

COMMENT ON FUNCTION eventgrid._subscriptions_changed_at_commit() IS 'Internal: when the current transaction commits, tells the delivery workers that event subscriptions were created, paused, resumed, updated or dropped (requests they claimed and did not start yet go back unsent; their status lines read the pauses again; their next claims look at every topic with events, README "Scale in subscriptions"), and wakes them; no-op without shared_preload_libraries.';

COMMENT ON FUNCTION eventgrid._wake_worker_at_commit() IS 'Internal: sets the delivery workers'' latches when the current transaction commits, and counts as a change to event subscriptions (their next claims look at every topic with events); called by configuration changes that give them work without publishing. No-op without shared_preload_libraries.';

-- What holds an event table: the positions and unmatched counts of the
-- topics and domain topics it holds events of (loose scans of its indexes),
-- not every subscription's; a domain topic's subscription only for its own
-- domain topic's events.  The upkeep worker runs the same query as a
-- statement of its own (src/store/store_rotation.c).
CREATE OR REPLACE FUNCTION eventgrid._event_table_holders(event_table smallint) RETURNS text[]
    LANGUAGE sql STABLE PARALLEL SAFE
    BEGIN ATOMIC
 WITH RECURSIVE table_topics(topic) AS (
         ( SELECT e.topic FROM eventgrid.events e
            WHERE e.event_table = _event_table_holders.event_table ORDER BY e.topic LIMIT 1)
         UNION ALL
          SELECT ( SELECT e.topic FROM eventgrid.events e
                    WHERE e.event_table = _event_table_holders.event_table AND e.topic > r.topic
                    ORDER BY e.topic LIMIT 1) AS topic
            FROM table_topics r WHERE r.topic IS NOT NULL
        ), table_domain_topics(read_key) AS (
         ( SELECT e.topic || '/' || e.domain_topic FROM eventgrid.events e
            WHERE e.event_table = _event_table_holders.event_table AND e.domain_topic IS NOT NULL
            ORDER BY e.topic || '/' || e.domain_topic LIMIT 1)
         UNION ALL
          SELECT ( SELECT e.topic || '/' || e.domain_topic FROM eventgrid.events e
                    WHERE e.event_table = _event_table_holders.event_table AND e.domain_topic IS NOT NULL
                      AND e.topic || '/' || e.domain_topic > d.read_key
                    ORDER BY e.topic || '/' || e.domain_topic LIMIT 1)
            FROM table_domain_topics d WHERE d.read_key IS NOT NULL
        )
 SELECT array_agg(DISTINCT h.holder ORDER BY h.holder)
    FROM ( SELECT format('event subscription %s of topic %s', s.name, s.read_key) AS holder
            FROM table_topics k
            JOIN eventgrid.event_subscriptions s ON s.topic = k.topic AND s.domain_topic IS NULL
            JOIN eventgrid.subscription_positions p ON p.subscription_id = s.id
           WHERE EXISTS ( SELECT 1 FROM eventgrid.events e
                   WHERE e.event_table = _event_table_holders.event_table AND e.topic = s.topic
                     AND e.txid >= pg_snapshot_xmin(p.done) AND NOT pg_visible_in_snapshot(e.txid, p.done))
         UNION ALL
          SELECT format('event subscription %s of topic %s', s.name, s.read_key)
            FROM table_domain_topics k
            JOIN eventgrid.event_subscriptions s
              ON s.topic = split_part(k.read_key, '/', 1) AND s.domain_topic = substr(k.read_key, strpos(k.read_key, '/') + 1)
            JOIN eventgrid.subscription_positions p ON p.subscription_id = s.id
           WHERE EXISTS ( SELECT 1 FROM eventgrid.events e
                   WHERE e.event_table = _event_table_holders.event_table
                     AND e.domain_topic IS NOT NULL AND (e.topic || '/' || e.domain_topic) = s.read_key
                     AND e.txid >= pg_snapshot_xmin(p.done) AND NOT pg_visible_in_snapshot(e.txid, p.done))
         UNION ALL
          SELECT format('first attempts in flight for topic %s', split_part(c.topic, '/', 1))
            FROM eventgrid.chunks_in_flight c
           WHERE EXISTS ( SELECT 1 FROM eventgrid.events e
                   WHERE e.event_table = _event_table_holders.event_table AND e.topic = split_part(c.topic, '/', 1)
                     AND e.txid >= pg_snapshot_xmin(c.done) AND NOT pg_visible_in_snapshot(e.txid, c.done))
         UNION ALL
          SELECT format('unmatched count of topic %s', tp.topic)
            FROM table_topics k JOIN eventgrid.topic_positions tp ON tp.topic = k.topic
           WHERE EXISTS ( SELECT 1 FROM eventgrid.events e
                   WHERE e.event_table = _event_table_holders.event_table AND e.topic = tp.topic
                     AND e.txid >= pg_snapshot_xmin(tp.done) AND NOT pg_visible_in_snapshot(e.txid, tp.done))
         UNION ALL
          SELECT format('events of queue event subscription %s of topic %s', s.name, s.topic)
            FROM eventgrid.event_subscriptions s
           WHERE s.delivery_mode = 'queue'
             AND (EXISTS ( SELECT 1 FROM eventgrid.queue_batches b
                   WHERE b.subscription_id = s.id AND b.event_table = _event_table_holders.event_table)
               OR EXISTS ( SELECT 1 FROM eventgrid.queue_events q
                   WHERE q.subscription_id = s.id AND q.event_table = _event_table_holders.event_table))
         UNION ALL
          SELECT format('the initial copy of logical replication slot %s', r.slot_name)
            FROM pg_replication_slots r
           WHERE r.database = current_database() AND r.slot_type = 'logical'
             AND r.slot_name ~ '^pg_[0-9]+_sync_[0-9]+_[0-9]+$'
             AND EXISTS ( SELECT 1 FROM eventgrid.events e WHERE e.event_table = _event_table_holders.event_table)
         UNION ALL
          SELECT format('logical replication slot %s, whose subscriber has not streamed for eventgrid.replication_sync_wait yet (its initial copy may be to come)', r.slot_name)
            FROM pg_replication_slots r
            LEFT JOIN eventgrid.replication_slot_sightings g ON g.slot_name = r.slot_name
           WHERE r.database = current_database() AND r.slot_type = 'logical' AND r.plugin = 'pgoutput'
             AND r.slot_name !~ '^pg_[0-9]+_sync_[0-9]+_[0-9]+$'
             AND (g.streaming_since IS NULL
                  OR g.streaming_since > now() - coalesce(current_setting('eventgrid.replication_sync_wait', true), '300s')::interval)
             AND EXISTS ( SELECT 1 FROM eventgrid.events e WHERE e.event_table = _event_table_holders.event_table)) h;
END;

COMMENT ON FUNCTION eventgrid._event_table_holders(event_table smallint) IS 'Internal: what still needs events of event table eventgrid.events_<event_table> (event subscriptions of the topics and domain topics it holds events of, first attempts in flight, unmatched counts, queue event subscriptions'' events read there that a consumer held while the rotation copied the others, a logical replication subscriber''s initial copy in progress or possibly to come); NULL when it may be emptied. Its cost follows the topics and domain topics the table holds, not the number of subscriptions (SPEC 20).';

-- The paused subscriptions, read from what pause_delivery() paused, not by
-- a look at every subscription (the claims and the upkeep read them often).
CREATE OR REPLACE FUNCTION eventgrid._paused_subscriptions() RETURNS SETOF bigint
    LANGUAGE sql STABLE
    BEGIN ATOMIC
 SELECT dp.subscription_id
    FROM eventgrid.delivery_pauses dp
   WHERE dp.subscription_id IS NOT NULL
 UNION
  SELECT s.id
    FROM eventgrid.delivery_pauses dp
    JOIN eventgrid.event_subscriptions s ON s.topic = dp.topic
   WHERE dp.subscription_id IS NULL AND dp.topic IS NOT NULL
 UNION
  SELECT s.id
    FROM eventgrid.delivery_pauses dp
    CROSS JOIN eventgrid.event_subscriptions s
   WHERE dp.subscription_id IS NULL AND dp.topic IS NULL;
END;

COMMENT ON FUNCTION eventgrid._paused_subscriptions() IS 'Internal: the ids of the event subscriptions pause_delivery() paused (itself, its topic or domain, or everything), each once, read from eventgrid.delivery_pauses: its cost follows what is paused, not the number of subscriptions. The delivery workers'' claims and delivery_statistics use it.';

-- Asked at every upkeep round: whether any position was restored from
-- another cluster (its lowest and highest system identifier), and whether
-- a worker that no longer runs holds an ordered subscription's lease.
CREATE INDEX subscription_positions_system_identifier_idx
    ON eventgrid.subscription_positions (system_identifier);
CREATE INDEX subscription_positions_lease_owner_idx
    ON eventgrid.subscription_positions (lease_owner) WHERE lease_owner IS NOT NULL;

-- A domain topic's events are read by their read key ('domain/topic', the
-- subscription's read_key): an index on that expression, which only a
-- domain topic's branch can use.  Read through the index on (topic,
-- domain_topic, txid, id), the planner, which knows nothing of a freshly
-- emptied event table, took the (topic, txid, id) index as often, and each
-- chunk of a domain topic's subscription read every event of its domain in
-- the batch's range (1.3 s a claim of 1,000 chunks beside 100,000 domain
-- topics).
CREATE INDEX events_read_key_idx ON eventgrid.events (((topic || '/') || domain_topic), txid, id)
    WHERE domain_topic IS NOT NULL;
DROP INDEX eventgrid.events_domain_topic_idx;

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
