-- eventgrid 0.20.0 -> 0.21.0: pull delivery without a second copy of each
-- event (SPEC 14).  What becomes visible to a queue event subscription is
-- no longer copied into eventgrid.queue_events: the delivery workers write
-- one row of event references per 100 events (eventgrid.queue_batches:
-- which event table, and each event's txid and id), and receive() reads
-- the events where they are, in the event tables, writing a narrow lock row
-- (queue_events, with no copy of the event) for each event it returns.
-- Only what is still unsettled when its event table is to be emptied is
-- copied, then (_queue_set_aside, called by the rotation).  Events already
-- in queue_events keep their copies.

\echo Use "ALTER EXTENSION eventgrid UPDATE TO '0.21.0'" to load this file. \quit

CREATE TABLE eventgrid.queue_batches (
    id bigserial PRIMARY KEY,
    subscription_id bigint NOT NULL REFERENCES eventgrid.event_subscriptions (id) ON DELETE CASCADE,
    event_table smallint NOT NULL,
    txids xid8[] NOT NULL,
    event_ids bigint[] NOT NULL,
    oldest_publish_time timestamp with time zone NOT NULL,
    receivable_at timestamp with time zone NOT NULL,
    CONSTRAINT queue_batches_events_check CHECK (cardinality(txids) = cardinality(event_ids) AND cardinality(event_ids) > 0)
);
CREATE INDEX queue_batches_subscription_idx ON eventgrid.queue_batches (subscription_id, id);
COMMENT ON TABLE eventgrid.queue_batches IS 'Internal: events of queue event subscriptions (pull delivery, SPEC 14) that no consumer has received yet, by reference: up to 100 per row, all in one event table (event_table), each by its publishing transaction (txids) and id (event_ids), in publish order; oldest_publish_time: the earliest publish time among them; receivable_at: when they became receivable. The delivery workers write a row for what becomes visible to a subscription; receive() takes a row''s events from the front (FOR UPDATE SKIP LOCKED: one consumer at a time per row), reads them in the event table and writes a lock row in eventgrid.queue_events for each. Before an event table is emptied, the rows reading it are moved into queue_events with copies of their events (_queue_set_aside()). Counted by eventgrid.queue_metrics.';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.queue_batches', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.queue_batches_id_seq', '');
-- delivery_statistics' pending counts read it as the caller
GRANT SELECT ON eventgrid.queue_batches TO eventgrid_admin;

ALTER TABLE eventgrid.queue_events ALTER COLUMN event DROP NOT NULL;
ALTER TABLE eventgrid.queue_events ADD COLUMN event_table smallint;
ALTER TABLE eventgrid.queue_events ADD COLUMN event_txid xid8;
ALTER TABLE eventgrid.queue_events ADD CONSTRAINT queue_events_event_check
    CHECK (event IS NOT NULL OR (event_table IS NOT NULL AND event_txid IS NOT NULL));
COMMENT ON TABLE eventgrid.queue_events IS 'The events of queue event subscriptions (pull delivery, SPEC 14) that were received at least once, or set aside, and are neither acknowledged nor dead-lettered (those not received yet are in eventgrid.queue_batches): how many times each was received (delivery_count), and when it can be received (receivable_at: now or earlier when available, the end of its lock or of its release delay otherwise). event: a copy of the event, or NULL while it is in event table event_table (by event_txid and event_id; the copy is made when that table is to be emptied). lock_secret: the random part of its last receive''s lock token (id:lock_secret; the lock is valid while receivable_at is later than now); received_at: when that receive took it. Read through eventgrid.queue_metrics; consumers use receive() and the other subscriber operations.';
COMMENT ON COLUMN eventgrid.queue_events.event IS 'A copy of the event, or NULL while it is read in its event table (event_table, event_txid, event_id).';
GRANT SELECT (event_table, event_txid) ON eventgrid.queue_events TO eventgrid_admin;

CREATE FUNCTION eventgrid._queue_event(topic text, event_table smallint, txid xid8, event_id bigint) RETURNS jsonb
    LANGUAGE sql STABLE PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    RETURN (SELECT e.event FROM eventgrid.events e
             WHERE e.event_table = _queue_event.event_table AND e.topic = _queue_event.topic
               AND e.txid = _queue_event.txid AND e.id = _queue_event.event_id);
COMMENT ON FUNCTION eventgrid._queue_event(topic text, event_table smallint, txid xid8, event_id bigint) IS 'Internal: the event a queue_events row without a copy refers to, read in its event table through the (topic, txid, id) index; NULL if it is not there.';
REVOKE ALL ON FUNCTION eventgrid._queue_event(topic text, event_table smallint, txid xid8, event_id bigint) FROM PUBLIC;

CREATE FUNCTION eventgrid._batch_events(topic text, event_table smallint, txids xid8[], event_ids bigint[]) RETURNS SETOF eventgrid.events
    LANGUAGE sql STABLE
    BEGIN ATOMIC
 SELECT e.*
    FROM unnest(_batch_events.txids, _batch_events.event_ids) u(txid, id)
   CROSS JOIN LATERAL ( SELECT x.*
            FROM eventgrid.events x
           WHERE x.event_table = _batch_events.event_table AND x.topic = _batch_events.topic
             AND x.txid = u.txid AND x.id = u.id
          OFFSET 0) e;
END;
COMMENT ON FUNCTION eventgrid._batch_events(topic text, event_table smallint, txids xid8[], event_ids bigint[]) IS 'Internal: the events a row of eventgrid.queue_batches names (or a slice of its arrays), each found by its own probe of the (topic, txid, id) index of its event table (OFFSET 0: statistics of an emptier event table would otherwise make a scan of the topic''s events look cheaper); those no longer there are left out. Sort by id for publish order.';
REVOKE ALL ON FUNCTION eventgrid._batch_events(topic text, event_table smallint, txids xid8[], event_ids bigint[]) FROM PUBLIC;

-- what becomes visible to a queue subscription: references, 100 a row, per event table
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
REVOKE ALL ON FUNCTION eventgrid._position_to_queue(sid bigint, due timestamp with time zone) FROM PUBLIC;

-- before an event table is emptied: what queue subscriptions still need of it gets copies
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
REVOKE ALL ON FUNCTION eventgrid._queue_set_aside(event_table smallint) FROM PUBLIC;

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

CREATE OR REPLACE FUNCTION eventgrid._queue_expire(now timestamp with time zone) RETURNS bigint
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

CREATE OR REPLACE FUNCTION eventgrid._backlog(subscription_id bigint, OUT pending bigint, OUT oldest timestamp with time zone, OUT due_since timestamp with time zone) RETURNS record
    LANGUAGE sql STABLE PARALLEL SAFE
    BEGIN ATOMIC
 SELECT (((u.n + c.n) + r.n) + q.n + qb.n) AS pending,
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
     ( SELECT COALESCE(sum(cardinality(b.event_ids)), 0)::bigint AS n,
             min(b.oldest_publish_time) AS oldest,
             min(b.receivable_at) FILTER (WHERE (b.receivable_at <= eventgrid._now())) AS due_since
            FROM eventgrid.queue_batches b
           WHERE (b.subscription_id = _backlog.subscription_id)) qb;
END;
COMMENT ON FUNCTION eventgrid._backlog(subscription_id bigint, OUT pending bigint, OUT oldest timestamp with time zone, OUT due_since timestamp with time zone) IS 'Internal: in one pass, the deliveries of an event subscription not finished yet (pending: events its position has not passed, first attempts in flight, retries, and of a queue subscription its unsettled events in eventgrid.queue_events and eventgrid.queue_batches; eventgrid._pending() returns it), the publish time of the oldest of their events (oldest), and since when the delivery due longest has been due (due_since: an event not attempted yet since its publish, a retry since its next attempt time if that has come); NULL times when there is none.';

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
    q.receivable + b.receivable AS receivable_events,
    q.locked AS locked_events,
    q.delayed AS delayed_events,
    COALESCE((EXTRACT(epoch FROM (eventgrid._now() - LEAST(q.oldest, b.oldest))))::double precision, (0)::double precision) AS oldest_receivable_event_age_seconds
   FROM eventgrid.event_subscriptions s
     LEFT JOIN ( SELECT x.subscription_id,
            (sum(x.received))::bigint AS received,
            (sum(x.acknowledged))::bigint AS acknowledged,
            (sum(x.released))::bigint AS released,
            (sum(x.rejected))::bigint AS rejected,
            (sum(x.lock_expired))::bigint AS lock_expired
           FROM eventgrid.queue_counters x
          GROUP BY x.subscription_id) k ON k.subscription_id = s.id
     LEFT JOIN eventgrid.subscription_counters c ON c.subscription_id = s.id
     CROSS JOIN LATERAL ( SELECT count(*) FILTER (WHERE (e.receivable_at <= eventgrid._now())) AS receivable,
            count(*) FILTER (WHERE ((e.lock_secret IS NOT NULL) AND (e.receivable_at > eventgrid._now()))) AS locked,
            count(*) FILTER (WHERE ((e.lock_secret IS NULL) AND (e.receivable_at > eventgrid._now()))) AS delayed,
            min(e.publish_time) FILTER (WHERE (e.receivable_at <= eventgrid._now())) AS oldest
           FROM eventgrid.queue_events e
          WHERE (e.subscription_id = s.id)) q
     CROSS JOIN LATERAL ( SELECT COALESCE(sum(cardinality(x.event_ids)), 0)::bigint AS receivable,
            min(x.oldest_publish_time) AS oldest
           FROM eventgrid.queue_batches x
          WHERE (x.subscription_id = s.id)) b
  WHERE (s.delivery_mode = 'queue'::text);

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
COMMENT ON FUNCTION eventgrid._event_table_holders(event_table smallint) IS 'Internal: what still needs events of event table eventgrid.events_<event_table> (event subscriptions, first attempts in flight, unmatched counts, queue event subscriptions'' events read there that a consumer held while the rotation copied the others, a logical replication subscriber''s initial copy in progress or possibly to come); NULL when it may be emptied.';
