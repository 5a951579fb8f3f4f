-- The pending count of delivery_statistics (eventgrid._pending())
-- against its definition, in queue states made by hand: an event is pending
-- for an event subscription when its filters take it and either its
-- position has not passed it (its transaction is not visible in the
-- position's "done" snapshot, and it is not among the events of the open
-- batch, "upto", up to the position's last event) or it is in a chunk in
-- flight (visible in the chunk's "upto", not in its "done", after the
-- chunk's start and up to its last event).  Everything happens in one
-- transaction that is rolled back: the delivery worker never sees it.
BEGIN;
SELECT eventgrid.create_topic('pending-topic');
SELECT eventgrid.create_event_subscription('pending-topic', 'all', 'http://127.0.0.1:9/all');
SELECT eventgrid.create_event_subscription('pending-topic', 'typed', 'http://127.0.0.1:9/typed',
                                           included_event_types => ARRAY['A']);

-- Three events in each of the transactions 1000-1005 (ids in order), of
-- type A or B.  publish_time given: stored as they are, with these txids.
INSERT INTO eventgrid.events (topic, event, publish_time, txid)
SELECT 'pending-topic',
       jsonb_build_object('id', 't' || t || '-' || k, 'subject', '/s',
                          'eventType', CASE WHEN t IN (1001, 1004) THEN 'B' ELSE 'A' END,
                          'eventTime', '2024-05-01T12:00:00Z'),
       now(), t::text::xid8
  FROM generate_series(1000, 1005) t CROSS JOIN generate_series(1, 3) k
 ORDER BY t, k;

CREATE TEMP TABLE states (n int, label text, done pg_snapshot, upto pg_snapshot, after_event text) ON COMMIT DROP;
INSERT INTO states VALUES
  (1, 'no batch open, nothing done', '1000:1000:', NULL, NULL),
  (2, 'no batch open, 1000-1002 done', '1003:1003:', NULL, NULL),
  (3, 'batch open, position before its first event', '1002:1002:', '1004:1006:1004', NULL),
  (4, 'batch 1002, 1003, 1005; 1004 in progress; mid 1003', '1002:1002:', '1004:1006:1004', 't1003-2'),
  (5, '1001 in progress at done and upto, 1004 at upto; mid 1005', '1001:1003:1001', '1001:1006:1001,1004', 't1005-1'),
  (6, 'the same, at the batch''s last event', '1001:1003:1001', '1001:1006:1001,1004', 't1005-3'),
  (7, 'everything done', '1006:1006:', NULL, NULL);

-- The definition, written out.
CREATE TEMP VIEW pending_by_definition AS
SELECT s.name,
       (SELECT count(*) FROM eventgrid.events e JOIN eventgrid.subscription_positions p ON p.subscription_id = s.id
         WHERE e.topic = s.topic
           AND NOT pg_visible_in_snapshot(e.txid, p.done)
           AND NOT (p.upto IS NOT NULL AND pg_visible_in_snapshot(e.txid, p.upto)
                    AND (e.txid, e.id) <= (coalesce(p.after_txid, '0'::xid8), coalesce(p.after_id, 0)))
           AND (s.included_event_types_lower IS NULL OR lower(e.event->>'eventType') = ANY (s.included_event_types_lower)))
     + (SELECT count(*) FROM eventgrid.events e JOIN eventgrid.chunks_in_flight c ON c.subscription_id = s.id
         WHERE e.topic = c.topic
           AND pg_visible_in_snapshot(e.txid, c.upto) AND NOT pg_visible_in_snapshot(e.txid, c.done)
           AND (e.txid, e.id) > (coalesce(c.after_txid, '0'::xid8), coalesce(c.after_id, 0))
           AND (e.txid, e.id) <= (c.last_txid, c.last_id)
           AND (s.included_event_types_lower IS NULL OR lower(e.event->>'eventType') = ANY (s.included_event_types_lower))) AS pending
  FROM eventgrid.event_subscriptions s WHERE s.topic = 'pending-topic';

CREATE TEMP TABLE results (n int, name text, pending bigint, by_definition bigint) ON COMMIT DROP;
DO $$
DECLARE
    st record;
BEGIN
    FOR st IN SELECT * FROM states ORDER BY n LOOP
        UPDATE eventgrid.subscription_positions p
           SET done = st.done, upto = st.upto,
               after_txid = (SELECT e.txid FROM eventgrid.events e WHERE e.event->>'id' = st.after_event),
               after_id = (SELECT e.id FROM eventgrid.events e WHERE e.event->>'id' = st.after_event)
          FROM eventgrid.event_subscriptions s
         WHERE s.id = p.subscription_id AND s.topic = 'pending-topic';
        INSERT INTO results
        SELECT st.n, d.name, eventgrid._pending(s.id), d.pending
          FROM pending_by_definition d JOIN eventgrid.event_subscriptions s ON s.name = d.name AND s.topic = 'pending-topic';
    END LOOP;
END $$;
SELECT r.n, st.label, r.name, r.pending, r.pending = r.by_definition AS as_defined
  FROM results r JOIN states st USING (n) ORDER BY r.n, r.name;

-- Chunks in flight: in state 5, a worker holds the events after t1003-1 up
-- to t1005-2 of the batch (t1003-2, t1003-3, t1005-1, t1005-2; 1004 is not
-- in it), and the position has moved past them.
UPDATE eventgrid.subscription_positions p
   SET done = '1001:1003:1001', upto = '1001:1006:1001,1004',
       after_txid = (SELECT txid FROM eventgrid.events WHERE event->>'id' = 't1005-2'),
       after_id = (SELECT id FROM eventgrid.events WHERE event->>'id' = 't1005-2')
  FROM eventgrid.event_subscriptions s
 WHERE s.id = p.subscription_id AND s.topic = 'pending-topic';
INSERT INTO eventgrid.chunks_in_flight (lease_owner, chunk, subscription_id, topic, done, upto,
                                        after_txid, after_id, last_txid, last_id)
SELECT 1, s.id, s.id, s.topic, '1001:1003:1001', '1001:1006:1001,1004',
       a.txid, a.id, l.txid, l.id
  FROM eventgrid.event_subscriptions s,
       (SELECT txid, id FROM eventgrid.events WHERE event->>'id' = 't1003-1') a,
       (SELECT txid, id FROM eventgrid.events WHERE event->>'id' = 't1005-2') l
 WHERE s.topic = 'pending-topic';
SELECT d.name, eventgrid._pending(s.id) AS pending, eventgrid._pending(s.id) = d.pending AS as_defined
  FROM pending_by_definition d JOIN eventgrid.event_subscriptions s ON s.name = d.name AND s.topic = 'pending-topic'
 ORDER BY 1;
-- The view shows the same
SELECT subscription, pending FROM eventgrid.delivery_statistics WHERE topic = 'pending-topic' ORDER BY 1;
ROLLBACK;
