-- eventgrid 0.14.0 -> 0.15.0: trust, fourth pass (pull delivery):
-- receive rights per queue subscription (grant_receive, revoke_receive),
-- waiting consumers woken by their own subscription only, and the
-- subscriber operations as SECURITY INVOKER C functions that check the
-- caller's right and run their SQL bodies (eventgrid._acknowledge() ...) as
-- the extension's owner.

\echo Use "ALTER EXTENSION eventgrid UPDATE TO '0.15.0'" to load this file. \quit

-- --- waking the consumers of given subscriptions only
CREATE FUNCTION eventgrid._wake_receivers_at_commit(subscription_ids bigint[]) RETURNS void
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_wake_receivers_at_commit';
COMMENT ON FUNCTION eventgrid._wake_receivers_at_commit(subscription_ids bigint[]) IS 'Internal: wakes the consumers waiting in eventgrid.receive() for these queue event subscriptions (NULL: every one of the database) when the current transaction commits; no-op without shared_preload_libraries.';
REVOKE ALL ON FUNCTION eventgrid._wake_receivers_at_commit(subscription_ids bigint[]) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._wake_receivers_at_commit() IS 'Internal: wakes the consumers waiting in eventgrid.receive() for every queue event subscription of this database when the current transaction commits; no-op without shared_preload_libraries.';

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

CREATE OR REPLACE FUNCTION eventgrid.redeliver_dead_letters(topic text DEFAULT NULL::text, subscription text DEFAULT NULL::text, reason text DEFAULT NULL::text, dead_lettered_after timestamp with time zone DEFAULT NULL::timestamp with time zone, dead_lettered_before timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS bigint
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

CREATE OR REPLACE FUNCTION eventgrid.drop_event_subscription(topic text, name text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint;
BEGIN
    -- the subscription first (the delivery worker's lock order), then its retries;
    -- its position and counters go with it (ON DELETE CASCADE)
    sid := eventgrid._subscription_id(topic, name, true);
    DELETE FROM eventgrid.retries r WHERE r.subscription_id = sid;
    DELETE FROM eventgrid.event_subscriptions s WHERE s.id = sid;
    -- its requests claimed and not sent yet are not sent; its waiting consumers are told
    PERFORM eventgrid._subscriptions_changed_at_commit();
    PERFORM eventgrid._wake_receivers_at_commit(ARRAY[sid]);
END $$;

CREATE OR REPLACE FUNCTION eventgrid.drop_topic(name text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sids bigint[];
BEGIN
    PERFORM eventgrid._check_not_null('topic name', name);
    IF NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = drop_topic.name FOR UPDATE) THEN
        RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(name)
            USING ERRCODE = 'undefined_object', HINT = 'List the topics with: SELECT name FROM eventgrid.topics;';
    END IF;
    -- publications of table changes to it stop: their triggers go
    PERFORM eventgrid._drop_topic_triggers(t.tgrelid::regclass, name)
       FROM (SELECT DISTINCT m.m AS tgrelid
               FROM eventgrid.table_publications p, eventgrid._publication_members(p.source_table, p.topic) m(m)
              WHERE p.topic = drop_topic.name) t;
    -- the subscriptions first (the delivery worker's lock order), then their retries
    SELECT array_agg(s.id ORDER BY s.id) INTO sids
      FROM (SELECT s.id FROM eventgrid.event_subscriptions s WHERE s.topic = drop_topic.name
             ORDER BY s.id FOR UPDATE) s;
    DELETE FROM eventgrid.retries r WHERE r.subscription_id = ANY (sids);
    -- subscriptions, positions, counters and publications go with the topic
    -- (ON DELETE CASCADE); its events stay in the event tables until they are emptied
    DELETE FROM eventgrid.topics t WHERE t.name = drop_topic.name;
    IF sids IS NOT NULL THEN
        PERFORM eventgrid._subscriptions_changed_at_commit();
        PERFORM eventgrid._wake_receivers_at_commit(sids);
    END IF;
END $$;

-- --- receive rights per queue subscription
CREATE TABLE eventgrid.receive_grants (
    topic text NOT NULL,
    subscription_id bigint,
    role_name name NOT NULL,
    granted_at timestamp with time zone DEFAULT now() NOT NULL,
    granted_by name NOT NULL,
    CONSTRAINT receive_grants_topic_fkey FOREIGN KEY (topic) REFERENCES eventgrid.topics(name) ON UPDATE CASCADE ON DELETE CASCADE,
    CONSTRAINT receive_grants_subscription_id_fkey FOREIGN KEY (subscription_id) REFERENCES eventgrid.event_subscriptions(id) ON DELETE CASCADE,
    CONSTRAINT receive_grants_topic_subscription_id_role_name_key UNIQUE NULLS NOT DISTINCT (topic, subscription_id, role_name)
);
COMMENT ON TABLE eventgrid.receive_grants IS 'Internal: what grant_receive() granted: role role_name may receive from queue event subscription subscription_id of topic (NULL: every queue event subscription of the topic, present and future). The role is named: renamed, it loses the right; the view event_subscription_receivers shows it.';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.receive_grants', '');

CREATE VIEW eventgrid.event_subscription_receivers AS
 SELECT g.topic,
    s.name AS subscription,
    g.role_name,
    (EXISTS ( SELECT 1
           FROM pg_catalog.pg_roles r
          WHERE (r.rolname = g.role_name))) AS role_exists,
    g.granted_at,
    g.granted_by
   FROM (eventgrid.receive_grants g
     LEFT JOIN eventgrid.event_subscriptions s ON ((s.id = g.subscription_id)))
  ORDER BY g.topic, s.name NULLS FIRST, g.role_name;
COMMENT ON VIEW eventgrid.event_subscription_receivers IS 'The receive rights grant_receive() gave (SPEC 14): per row, a role that may call receive(), acknowledge(), release(), reject() and renew_locks() on queue event subscription subscription of topic (NULL: every queue event subscription of the topic), whether that role exists now, when and by whom it was granted. Members of eventgrid_receiver reach every queue without a row here. For eventgrid_admin.';
GRANT SELECT ON TABLE eventgrid.event_subscription_receivers TO eventgrid_admin;

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
             JOIN pg_catalog.pg_roles r ON r.rolname = g.role_name
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
REVOKE ALL ON FUNCTION eventgrid._receive_subscription_id(topic text, subscription text, role oid) FROM PUBLIC;

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
COMMENT ON FUNCTION eventgrid._receive_grant_target(topic text, subscription text, role_name text) IS 'Internal: what grant_receive() and revoke_receive() name: the subscription id (NULL: every queue subscription of the topic) and how log lines name it; 22004 NULL topic or role, 42704 no such topic or subscription, 42809 a push subscription.';
REVOKE ALL ON FUNCTION eventgrid._receive_grant_target(topic text, subscription text, role_name text) FROM PUBLIC;

CREATE FUNCTION eventgrid.grant_receive(topic text, subscription text, role_name text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    t record := eventgrid._receive_grant_target(topic, subscription, role_name);
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = role_name) THEN
        RAISE EXCEPTION 'role % does not exist', eventgrid._quote(role_name)
            USING ERRCODE = 'undefined_object', HINT = 'Create the role first (CREATE ROLE), then grant it.';
    END IF;
    INSERT INTO eventgrid.receive_grants (topic, subscription_id, role_name, granted_by)
    VALUES (topic, t.sid, role_name, eventgrid._caller())
    ON CONFLICT ON CONSTRAINT receive_grants_topic_subscription_id_role_name_key DO NOTHING;
    IF FOUND THEN
        PERFORM eventgrid._log(format('eventgrid: role %s may receive from %s, granted by %s',
                                      eventgrid._quote(role_name), t.label, eventgrid._caller()));
    END IF;
END $$;
COMMENT ON FUNCTION eventgrid.grant_receive(topic text, subscription text, role_name text) IS 'Pull delivery rights for one queue (SPEC 14, as Event Grid''s Data Receiver role scoped to a subscription or a topic): role role_name (and its members) may call receive(), acknowledge(), release(), reject() and renew_locks() on queue event subscription subscription of topic (NULL: on every queue event subscription of the topic, present and future), without being a member of eventgrid_receiver; elsewhere they get 42501. Granting what is granted does nothing; logged once. The grant goes with its subscription or topic, is dumped and restored, and names the role (a renamed role loses it). Shown in event_subscription_receivers. Requires eventgrid_admin. Errors: 22004 NULL topic or role_name, 42704 no such topic, subscription or role, 42809 a push subscription.';
REVOKE ALL ON FUNCTION eventgrid.grant_receive(topic text, subscription text, role_name text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.grant_receive(topic text, subscription text, role_name text) TO eventgrid_admin;

CREATE FUNCTION eventgrid.revoke_receive(topic text, subscription text, role_name text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    t record := eventgrid._receive_grant_target(topic, subscription, role_name);
BEGIN
    DELETE FROM eventgrid.receive_grants g
     WHERE g.topic = revoke_receive.topic AND g.subscription_id IS NOT DISTINCT FROM t.sid
       AND g.role_name = revoke_receive.role_name;
    IF FOUND THEN
        PERFORM eventgrid._log(format('eventgrid: role %s may no longer receive from %s, revoked by %s',
                                      eventgrid._quote(role_name), t.label, eventgrid._caller()));
    ELSE
        RAISE NOTICE 'role % had no receive right on %: nothing revoked', eventgrid._quote(role_name), t.label
            USING HINT = 'SELECT * FROM eventgrid.event_subscription_receivers; lists the grants.';
    END IF;
END $$;
COMMENT ON FUNCTION eventgrid.revoke_receive(topic text, subscription text, role_name text) IS 'Takes back what grant_receive(topic, subscription, role_name) gave (the same three: a topic-wide grant is revoked with subscription NULL); a NOTICE when there was none. A consumer already waiting in receive() gets 42501 when it next looks. Logged once. Requires eventgrid_admin. Errors: 22004 NULL topic or role_name, 42704 no such topic or subscription, 42809 a push subscription.';
REVOKE ALL ON FUNCTION eventgrid.revoke_receive(topic text, subscription text, role_name text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.revoke_receive(topic text, subscription text, role_name text) TO eventgrid_admin;

-- --- the subscriber operations: SECURITY INVOKER C entry points (the caller's right is checked), their SQL bodies internal
ALTER FUNCTION eventgrid.acknowledge(topic text, subscription text, lock_tokens text[]) RENAME TO _acknowledge;
REVOKE ALL ON FUNCTION eventgrid._acknowledge(topic text, subscription text, lock_tokens text[]) FROM eventgrid_receiver, eventgrid_admin;
COMMENT ON FUNCTION eventgrid._acknowledge(topic text, subscription text, lock_tokens text[]) IS 'Internal: the body of eventgrid.acknowledge(), which checks the caller''s right and runs it as the extension''s owner.';
ALTER FUNCTION eventgrid.reject(topic text, subscription text, lock_tokens text[]) RENAME TO _reject;
REVOKE ALL ON FUNCTION eventgrid._reject(topic text, subscription text, lock_tokens text[]) FROM eventgrid_receiver, eventgrid_admin;
COMMENT ON FUNCTION eventgrid._reject(topic text, subscription text, lock_tokens text[]) IS 'Internal: the body of eventgrid.reject(), which checks the caller''s right and runs it as the extension''s owner.';
ALTER FUNCTION eventgrid.renew_locks(topic text, subscription text, lock_tokens text[]) RENAME TO _renew_locks;
REVOKE ALL ON FUNCTION eventgrid._renew_locks(topic text, subscription text, lock_tokens text[]) FROM eventgrid_receiver, eventgrid_admin;
COMMENT ON FUNCTION eventgrid._renew_locks(topic text, subscription text, lock_tokens text[]) IS 'Internal: the body of eventgrid.renew_locks(), which checks the caller''s right and runs it as the extension''s owner.';
ALTER FUNCTION eventgrid.release(topic text, subscription text, lock_tokens text[], release_delay integer) RENAME TO _release;
REVOKE ALL ON FUNCTION eventgrid._release(topic text, subscription text, lock_tokens text[], release_delay integer) FROM eventgrid_receiver, eventgrid_admin;
COMMENT ON FUNCTION eventgrid._release(topic text, subscription text, lock_tokens text[], release_delay integer) IS 'Internal: the body of eventgrid.release(), which checks the caller''s right and runs it as the extension''s owner.';
CREATE OR REPLACE FUNCTION eventgrid._release(topic text, subscription text, lock_tokens text[], release_delay integer DEFAULT 0) RETURNS TABLE(lock_token text, succeeded boolean, error text)
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

CREATE FUNCTION eventgrid.acknowledge(topic text, subscription text, lock_tokens text[]) RETURNS TABLE(lock_token text, succeeded boolean, error text)
    LANGUAGE c
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS 'MODULE_PATHNAME', 'eventgrid_queue_settle';
COMMENT ON FUNCTION eventgrid.acknowledge(topic text, subscription text, lock_tokens text[]) IS 'Pull delivery (SPEC 14): the events whose locks lock_tokens (at most 1000, from receive()) name are delivered and leave the queue subscription. One row per token, in order: (lock_token, succeeded, error); a token that is malformed, unknown, expired or already settled fails only itself (error: InvalidLockToken or TokenLost, and why). Requires eventgrid_receiver or eventgrid_admin, or a grant_receive() for the subscription or its topic. Errors: 42501 no right to the subscription, 22004 NULL, 54000 over 1000 tokens, 42704, 42809.';
CREATE FUNCTION eventgrid.reject(topic text, subscription text, lock_tokens text[]) RETURNS TABLE(lock_token text, succeeded boolean, error text)
    LANGUAGE c
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS 'MODULE_PATHNAME', 'eventgrid_queue_settle';
COMMENT ON FUNCTION eventgrid.reject(topic text, subscription text, lock_tokens text[]) IS 'Pull delivery (SPEC 14): the events whose locks lock_tokens (at most 1000) name are dead-lettered at once with reason Rejected (dropped when the subscription does not dead-letter; a dead_letter_topic gets its notification). One row per token, in order: (lock_token, succeeded, error); a malformed, unknown, expired or settled token fails only itself. Requires eventgrid_receiver or eventgrid_admin, or a grant_receive() for the subscription or its topic. Errors: 42501 no right to the subscription, 22004, 54000, 42704, 42809.';
CREATE FUNCTION eventgrid.renew_locks(topic text, subscription text, lock_tokens text[]) RETURNS TABLE(lock_token text, succeeded boolean, error text)
    LANGUAGE c
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS 'MODULE_PATHNAME', 'eventgrid_queue_settle';
COMMENT ON FUNCTION eventgrid.renew_locks(topic text, subscription text, lock_tokens text[]) IS 'Pull delivery (SPEC 14): the locks lock_tokens (at most 1000) name last the subscription''s receive_lock_duration again from now, within 1 hour of the receive that took them (after that: LockRenewalLimitExceeded). One row per token, in order: (lock_token, succeeded, error); a malformed, unknown, expired or settled token fails only itself. Requires eventgrid_receiver or eventgrid_admin, or a grant_receive() for the subscription or its topic. Errors: 42501 no right to the subscription, 22004, 54000, 42704, 42809.';
CREATE FUNCTION eventgrid.release(topic text, subscription text, lock_tokens text[], release_delay integer DEFAULT 0) RETURNS TABLE(lock_token text, succeeded boolean, error text)
    LANGUAGE c
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS 'MODULE_PATHNAME', 'eventgrid_queue_settle';
COMMENT ON FUNCTION eventgrid.release(topic text, subscription text, lock_tokens text[], release_delay integer) IS 'Pull delivery (SPEC 14): the events whose locks lock_tokens (at most 1000) name are unlocked and can be received again after release_delay seconds (0, 10, 60, 600 or 3600; default 0), with their delivery count raised by the next receive (past max_delivery_count they are dead-lettered). One row per token, in order: (lock_token, succeeded, error); a malformed, unknown, expired or settled token fails only itself. Requires eventgrid_receiver or eventgrid_admin, or a grant_receive() for the subscription or its topic. Errors: 42501 no right to the subscription, 22004, 22023 another release_delay, 54000, 42704, 42809.';
ALTER FUNCTION eventgrid.receive(topic text, subscription text, max_events integer, max_wait_time integer) SECURITY INVOKER;
REVOKE ALL ON FUNCTION eventgrid.receive(topic text, subscription text, max_events integer, max_wait_time integer) FROM eventgrid_receiver, eventgrid_admin;
GRANT EXECUTE ON FUNCTION eventgrid.receive(topic text, subscription text, max_events integer, max_wait_time integer) TO PUBLIC;
COMMENT ON FUNCTION eventgrid.receive(topic text, subscription text, max_events integer, max_wait_time integer) IS 'Pull delivery (SPEC 14): receives up to max_events (1-100, default 1) events of a queue event subscription, each locked to the caller for the subscription''s receive_lock_duration: rows (lock_token, delivery_count: how many times it was received, this one included, event: the CloudEvent). Returns as soon as any event is receivable (a long poll woken by the commit that published it) or empty after max_wait_time seconds (10-120, default 60); while it waits it holds its connection and no lock (DROP EXTENSION, ALTER EXTENSION UPDATE and drop_event_subscription() do not wait for it; it then fails with 55000 or 42704), and only a commit for its own subscription wakes it. Settle each event with acknowledge(), release() or reject(), or renew_locks(); an expired lock makes the event receivable again. Events past their time to live, or received max_delivery_count times, are dead-lettered (or dropped) instead of returned. READ COMMITTED only. Requires eventgrid_receiver or eventgrid_admin, or a grant_receive() for the subscription or its topic. Errors: 42501 no right to the subscription, 22004 NULL, 22003 out of range, 42704 no such subscription, 42809 a push subscription, 0A000 REPEATABLE READ or SERIALIZABLE, 55000 not in shared_preload_libraries.';

-- --- an acknowledged event of a queue subscription counts as delivered (delivery_statistics.delivered,
-- the exporter's delivery_success_total, Event Grid's DeliverySuccessCount)
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
        END AS lock_expired
   FROM ((eventgrid.event_subscriptions s
     LEFT JOIN eventgrid.subscription_counters c ON ((c.subscription_id = s.id)))
     LEFT JOIN LATERAL ( SELECT (sum(x.received))::bigint AS received,
            (sum(x.acknowledged))::bigint AS acknowledged,
            (sum(x.released))::bigint AS released,
            (sum(x.rejected))::bigint AS rejected,
            (sum(x.lock_expired))::bigint AS lock_expired
           FROM eventgrid.queue_counters x
          WHERE ((x.subscription_id = s.id) AND (s.delivery_mode = 'queue'::text))) k ON (true));

COMMENT ON VIEW eventgrid.delivery_statistics IS 'Per event subscription: deliveries pending (not yet delivered, dead-lettered or dropped, retries included), of which waiting for a retry, events delivered, failed delivery attempts (requests sent that failed; attempts held back by probation are not counted), events dead-lettered, events dropped (undeliverable with dead-lettering off), dead letters queued again by redeliver_dead_letters, whether pause_delivery() paused it (itself, its topic or everything; the GUC eventgrid.delivery_paused is not shown here), and its delivery_mode (push or queue). Of a queue event subscription (pull delivery, SPEC 14) delivered counts the events acknowledged, pending the events not yet acknowledged or dead-lettered, and received, acknowledged, released, rejected and lock_expired count the subscriber operations (NULL for push).';

CREATE OR REPLACE VIEW eventgrid.metrics AS
 SELECT t.name AS topic,
    NULL::text AS event_subscription,
    m.metric_name,
    m.aggregation,
    m.unit,
    m.value
   FROM ((eventgrid.topics t
     LEFT JOIN eventgrid.topic_counters c ON ((c.topic = t.name)))
     CROSS JOIN LATERAL ( VALUES ('PublishSuccessCount'::text,'Total'::text,'Count'::text,(COALESCE(c.published, (0)::bigint))::double precision), ('UnmatchedEventCount'::text,'Total'::text,'Count'::text,(COALESCE(c.unmatched, (0)::bigint))::double precision)) m(metric_name, aggregation, unit, value))
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
     CROSS JOIN LATERAL ( VALUES ('MatchedEventCount'::text,'Total'::text,'Count'::text,(COALESCE(c.matched, (0)::bigint))::double precision), ('DeliverySuccessCount'::text,'Total'::text,'Count'::text,((COALESCE(c.delivered, (0)::bigint) + (SELECT COALESCE(sum(x.acknowledged), (0)::numeric) FROM eventgrid.queue_counters x WHERE (x.subscription_id = s.id))::bigint))::double precision), ('DeliveryAttemptFailCount'::text,'Total'::text,'Count'::text,(COALESCE(c.failed_attempts, (0)::bigint))::double precision), ('DeadLetteredCount'::text,'Total'::text,'Count'::text,(COALESCE(c.dead_lettered, (0)::bigint))::double precision), ('DroppedEventCount'::text,'Total'::text,'Count'::text,(COALESCE(c.dropped, (0)::bigint))::double precision), ('DestinationProcessingDurationInMs'::text,'Average'::text,'Milliseconds'::text,d.average), ('DestinationProcessingDurationInMs'::text,'P95'::text,'Milliseconds'::text,d.p95)) m(metric_name, aggregation, unit, value));

CREATE OR REPLACE FUNCTION eventgrid._event_subscription_metrics(OUT topic text, OUT event_subscription text, OUT matched_events_total bigint, OUT delivery_success_total bigint, OUT pending_events bigint, OUT oldest_pending_event_age_seconds double precision, OUT overdue_seconds double precision, OUT paused integer, OUT endpoint_on_probation integer) RETURNS SETOF record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT s.topic,
     s.name AS event_subscription,
     COALESCE(c.matched, (0)::bigint) AS matched_events_total,
     (COALESCE(c.delivered, (0)::bigint) + (SELECT COALESCE(sum(x.acknowledged), (0)::numeric) FROM eventgrid.queue_counters x WHERE (x.subscription_id = s.id))::bigint) AS delivery_success_total,
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

-- --- one rule for key values: a key is text; a string is its text, a number its value in plain decimal
-- without trailing zeros (1, 1.0, 1e0 are key 1), a boolean true or false; so 1 and "1" are one key
CREATE OR REPLACE FUNCTION eventgrid._ordering_key(event jsonb, path text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE jsonb_typeof(event #> string_to_array(path, '.'))
               WHEN 'string' THEN event #>> string_to_array(path, '.')
               WHEN 'boolean' THEN event #>> string_to_array(path, '.')
               WHEN 'number' THEN pg_catalog.trim_scale((event #> string_to_array(path, '.'))::numeric)::text
           END;
COMMENT ON FUNCTION eventgrid._ordering_key(event jsonb, path text) IS 'Internal: the ordering key of an event (SPEC 13): the value at the dotted field path as text when it is a string (its text), a number (its value in plain decimal without trailing zeros: 1, 1.0 and 1e0 are key 1, as is the string "1") or a boolean (true, false); else NULL (unordered). Events that waited at the update keep the key they were given.';
