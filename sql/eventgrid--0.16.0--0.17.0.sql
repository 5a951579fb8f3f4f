-- eventgrid 0.16.0 -> 0.17.0: pull delivery's statements keep their plans
-- whatever the statistics say.  Statistics taken of an emptier queue (an
-- ANALYZE before a backlog arrives) made the planner believe a queue
-- subscription has a few rows: each receive() then read and sorted every
-- receivable event (a bitmap scan), and each acknowledge walked the
-- subscription's entries of the receivable index beside the 100 it
-- settles.  A look is now an index scan in the index's order stopping at
-- its limit, and the subscriber operations find their events by primary
-- key only; the result of each lock token is made without a second look
-- when every token was settled, and the tokens are checked in C.

\echo Use "ALTER EXTENSION eventgrid UPDATE TO '0.17.0'" to load this file. \quit

CREATE FUNCTION eventgrid._queue_ids(sid bigint, ids bigint[]) RETURNS bigint[]
    LANGUAGE sql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT COALESCE(array_agg(x.id), '{}'::bigint[])
   FROM (SELECT q.id, q.subscription_id
           FROM eventgrid.queue_events q
          WHERE q.id = ANY (_queue_ids.ids)
         OFFSET 0) x
  WHERE x.subscription_id = _queue_ids.sid;
END;

COMMENT ON FUNCTION eventgrid._queue_ids(sid bigint, ids bigint[]) IS 'Internal: those of ids that are events of queue event subscription sid in eventgrid.queue_events, found by primary key only (the subscription is compared above the scan: with it in the scan, statistics of an emptier queue lead the planner to walk the subscription''s whole receivable index). The subscriber operations find their rows with it.';
REVOKE ALL ON FUNCTION eventgrid._queue_ids(sid bigint, ids bigint[]) FROM PUBLIC;

-- the check of every lock token of every call, in C (src/queue/lock_tokens.c): the regular
-- expression, split_part and casts per token cost more than the DELETE that settles it
CREATE OR REPLACE FUNCTION eventgrid._lock_token_keys(lock_tokens text[], OUT ids bigint[], OUT tokens text[]) RETURNS record
    LANGUAGE c IMMUTABLE
    AS 'MODULE_PATHNAME', 'eventgrid_lock_token_keys';

CREATE OR REPLACE FUNCTION eventgrid._acknowledge(topic text, subscription text, lock_tokens text[]) RETURNS TABLE(lock_token text, succeeded boolean, error text)
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

CREATE OR REPLACE FUNCTION eventgrid._renew_locks(topic text, subscription text, lock_tokens text[]) RETURNS TABLE(lock_token text, succeeded boolean, error text)
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

CREATE OR REPLACE FUNCTION eventgrid._queue_locked(sid bigint, key_ids bigint[], key_tokens text[], OUT ids bigint[], OUT tokens text[]) RETURNS record
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

CREATE OR REPLACE FUNCTION eventgrid._lock_token_results(sid bigint, lock_tokens text[], done text[], operation text) RETURNS TABLE(lock_token text, succeeded boolean, error text)
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

CREATE OR REPLACE FUNCTION eventgrid._queue_finish(sid bigint, ids bigint[], reason text) RETURNS integer
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
