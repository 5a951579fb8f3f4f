-- eventgrid 0.5.0 -> 0.6.0: the pending count behind delivery_statistics
-- reads only what is pending.
--
-- eventgrid._pending() counted an event subscription's pending events with
-- one scan from the oldest transaction of its position's last batch
-- ("done"), and left out the part of the open batch already passed by a
-- filter on each row: in the middle of a large batch it read every event
-- already delivered to count those not yet.  Its chunks in flight were read
-- through eventgrid._in_batch(), a SQL function the planner cannot inline
-- (STRICT around an AND), from each chunk's start to the end of its last
-- transaction.  Now each part is an index range scan bounded where the
-- position or the chunk stands, the way the delivery workers read them.
-- The counts are the same.  _in_batch() is no longer used by anything, and
-- is dropped.
\echo Use "ALTER EXTENSION eventgrid UPDATE" to load this file. \quit

CREATE OR REPLACE FUNCTION eventgrid._pending(subscription_id bigint) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
    SELECT
      -- events its position has not passed: those after its last event
      -- (in (txid, id) order) that its last batch did not hold, and, before
      -- that event, those of transactions its open batch does not hold
      -- either (they were in progress when the batch was taken)
      (SELECT count(*)
         FROM eventgrid.subscription_positions p
         JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id
         CROSS JOIN LATERAL (
             SELECT e.event FROM eventgrid.events e
              WHERE e.topic = s.topic AND e.txid >= pg_snapshot_xmin(p.done)
                AND (e.txid, e.id) > (coalesce(p.after_txid, '0'::xid8), coalesce(p.after_id, 0))
                AND NOT pg_visible_in_snapshot(e.txid, p.done)
             UNION ALL
             SELECT e.event FROM eventgrid.events e
              WHERE p.upto IS NOT NULL AND e.topic = s.topic
                AND e.txid >= greatest(pg_snapshot_xmin(p.done), pg_snapshot_xmin(p.upto))
                AND e.txid < p.after_txid
                AND NOT pg_visible_in_snapshot(e.txid, p.done)
                AND NOT pg_visible_in_snapshot(e.txid, p.upto)) e
        WHERE p.subscription_id = _pending.subscription_id
          AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with,
                                 s.subject_ends_with, s.is_subject_case_sensitive,
                                 s.advanced_filters, s.enable_advanced_filtering_on_arrays))
      -- first attempts claimed and not recorded yet: each chunk's events,
      -- read up to its last transaction and then within it up to its last event
      + (SELECT count(*)
           FROM eventgrid.chunks_in_flight c
           JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id
           CROSS JOIN LATERAL (
               SELECT e.txid, e.event FROM eventgrid.events e
                WHERE e.topic = c.topic AND e.txid >= pg_snapshot_xmin(c.done) AND e.txid < c.last_txid
                  AND (e.txid, e.id) > (coalesce(c.after_txid, '0'::xid8), coalesce(c.after_id, 0))
               UNION ALL
               SELECT e.txid, e.event FROM eventgrid.events e
                WHERE e.topic = c.topic AND e.txid = c.last_txid AND e.id <= c.last_id
                  AND (e.txid, e.id) > (coalesce(c.after_txid, '0'::xid8), coalesce(c.after_id, 0))) e
          WHERE c.subscription_id = _pending.subscription_id
            AND pg_visible_in_snapshot(e.txid, c.upto) AND NOT pg_visible_in_snapshot(e.txid, c.done)
            AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with,
                                   s.subject_ends_with, s.is_subject_case_sensitive,
                                   s.advanced_filters, s.enable_advanced_filtering_on_arrays))
      + (SELECT count(*) FROM eventgrid.retries r WHERE r.subscription_id = _pending.subscription_id);
END;

DROP FUNCTION eventgrid._in_batch(xid8, pg_snapshot, pg_snapshot);
