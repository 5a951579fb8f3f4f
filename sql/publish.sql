-- Publishing: validation and stamping per input schema (SPEC 8), size and
-- count limits, set-based fan-out to matching subscriptions (SPEC 2, 9),
-- unmatched events, transactionality.
SELECT eventgrid.create_topic('shop');
SELECT eventgrid.create_topic('ce-shop', 'CloudEventSchemaV1_0');
SELECT eventgrid.create_topic('raw-shop', 'CustomEventSchema');

-- Event Grid schema: stamped topic, dataVersion and metadataVersion, publish_time
INSERT INTO eventgrid.events (topic, event) VALUES
  ('shop', '{"id": "e1", "subject": "/orders/1", "eventType": "Shop.OrderCreated", "eventTime": "2024-05-01T12:00:00Z", "data": {"orderId": 1}}')
RETURNING event, publish_time = now() AS publish_time_is_now;
INSERT INTO eventgrid.events (topic, event) VALUES
  ('shop', '{"id": "e2", "subject": "", "eventType": "Shop.OrderCreated", "eventTime": "2024-05-01T12:00:00.1234567+02:00", "dataVersion": "2.0", "metadataVersion": "1", "topic": "spoofed"}')
RETURNING event;
-- The stamp equals the event joined (||) with topic, and dataVersion and
-- metadataVersion where absent, whatever the event's shape: nested objects
-- and arrays, a topic that is itself an object, keys before and after the
-- stamped ones in jsonb's order (shorter keys first, then bytewise), keys
-- of each stamp's length on either side of it
WITH given(n, ev) AS (VALUES
  (1, '{"id": "s1", "subject": "/s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z", "data": {"a": [1, {"b": null}], "z": {}}}'::jsonb),
  (2, '{"id": "s2", "subject": "/s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z", "topic": {"nested": [1, 2]}, "aaaa": [], "zzzzzzzzzzzzzzzzz": 1.5}'),
  (3, '{"id": "s3", "subject": "/s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z", "dataVersion": "7", "metadataVersion": "1", "topic": "shop"}'),
  (4, '{"id": "s4", "subject": "/s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z", "dataVersion": "", "data": [[], [[]], {"topic": "inner"}]}'),
  (5, '{"id": "s5", "subject": "/s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z", "alpha": 1, "topic": 2, "zeta0": 3, "aaaaaaaaaaa": 4, "zzzzzzzzzzz": 5, "aaaaaaaaaaaaaaa": 6, "zzzzzzzzzzzzzzz": 7}')
), stored AS (
  INSERT INTO eventgrid.events (topic, event) SELECT 'shop', ev FROM given RETURNING event
)
SELECT g.n, s.event = g.ev || jsonb_build_object('topic', 'shop')
                          || CASE WHEN g.ev ? 'dataVersion' THEN '{}'::jsonb ELSE '{"dataVersion": ""}' END
                          || '{"metadataVersion": "1"}' AS stamped_as_joined,
       s.event::text = (s.event::text)::jsonb::text AS canonical
  FROM given g JOIN stored s ON s.event->>'id' = g.ev->>'id' ORDER BY g.n;
-- each required field
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{"subject": "/s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z"}')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{"id": "x", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z"}')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{"id": "x", "subject": "/s", "eventTime": "2024-05-01T12:00:00Z"}')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{"id": "x", "subject": "/s", "eventType": "T"}')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{"id": 7, "subject": "/s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z"}')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{"id": "", "subject": "/s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z"}')$$);
-- eventTime must be RFC 3339
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{"id": "x", "subject": "/s", "eventType": "T", "eventTime": "2024-05-01 12:00:00"}')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{"id": "x", "subject": "/s", "eventType": "T", "eventTime": "2023-02-29T12:00:00Z"}')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{"id": "x", "subject": "/s", "eventType": "T", "eventTime": "2024-02-29T23:59:60.5-01:30"}')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{"id": "x", "subject": "/s", "eventType": "T", "eventTime": "2024-13-01T00:00:00Z"}')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{"id": "x", "subject": "/s", "eventType": "T", "eventTime": "yesterday"}')$$);
-- metadataVersion must be "1"; dataVersion a string
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{"id": "x", "subject": "/s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z", "metadataVersion": "2"}')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{"id": "x", "subject": "/s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z", "dataVersion": 1}')$$);
-- not an object, NULL, unknown topic
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '[{"id": "x"}]')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '"text"')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', NULL)$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES (NULL, '{}')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('nowhere', '{}')$$);

-- CloudEvents 1.0
INSERT INTO eventgrid.events (topic, event) VALUES
  ('ce-shop', '{"id": "c1", "source": "/shop", "specversion": "1.0", "type": "Shop.OrderCreated", "time": "2024-05-01T12:00:00Z", "subject": "orders/1", "data": {"orderId": 1}}')
RETURNING event;
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('ce-shop', '{"source": "/s", "specversion": "1.0", "type": "T"}')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('ce-shop', '{"id": "x", "specversion": "1.0", "type": "T"}')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('ce-shop', '{"id": "x", "source": "/s", "type": "T"}')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('ce-shop', '{"id": "x", "source": "/s", "specversion": "1.0"}')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('ce-shop', '{"id": "x", "source": "/s", "specversion": "0.3", "type": "T"}')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('ce-shop', '{"id": "x", "source": "/s", "specversion": "1.0", "type": "T", "time": "noon"}')$$);

-- Custom schema: any JSON object, as is
INSERT INTO eventgrid.events (topic, event) VALUES ('raw-shop', '{"prop1": "my property", "prop2": 5}') RETURNING event;
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('raw-shop', '[1, 2]')$$);

-- 1 MB per event (1048576 bytes of JSON text): exactly 1 MB passes, one byte more fails
SELECT err(format($$INSERT INTO eventgrid.events (topic, event) VALUES ('raw-shop', jsonb_build_object('d', repeat('x', %s)))$$, 1048576 - 9));
SELECT err(format($$INSERT INTO eventgrid.events (topic, event) VALUES ('raw-shop', jsonb_build_object('d', repeat('x', %s)))$$, 1048576 - 8));
SELECT max(octet_length(event::text)) FROM eventgrid.events WHERE topic = 'raw-shop';
-- the limit is on the JSON text, however small the stored jsonb: 1100 numbers
-- 1e1000 take about 13 kB as jsonb and 1.1 MB as text
SELECT err(format($$INSERT INTO eventgrid.events (topic, event) VALUES ('raw-shop', jsonb_build_object('n', %s::jsonb))$$,
                  quote_literal('[' || array_to_string(array_fill('1e1000'::text, ARRAY[1100]), ',') || ']')));
-- event_bytes is the JSON text's size exactly, which bounds the delivery workers' memory
INSERT INTO eventgrid.events (topic, event)
VALUES ('raw-shop', jsonb_build_object('n', ('[' || array_to_string(array_fill('1e1000'::text, ARRAY[100]), ',') || ']')::jsonb,
                                       's', E'tab\there \u0001'));
SELECT count(*) AS events, count(*) FILTER (WHERE event_bytes = octet_length(event::text)) AS exact
  FROM eventgrid.events WHERE topic = 'raw-shop';

-- publish(): one event or an array; at most 5000 events and 1 MB per call
SELECT cardinality(eventgrid.publish('raw-shop', '{"one": 1}')) AS ids;
-- publish() returns the ids the events were stored under, in the order given
SELECT eventgrid.publish('raw-shop', '[{"a": 3}, {"a": 1}, {"a": 2}]') AS ids \gset
SELECT cardinality(:'ids'::bigint[]) AS ids,
       (SELECT array_agg(e.event->>'a' ORDER BY i.n) FROM unnest(:'ids'::bigint[]) WITH ORDINALITY AS i(id, n)
          JOIN eventgrid.events e ON e.id = i.id) AS events_in_order;
SELECT cardinality(eventgrid.publish('raw-shop', (SELECT jsonb_agg(jsonb_build_object('n', n)) FROM generate_series(1, 5000) n))) AS ids;
SELECT err($$SELECT eventgrid.publish('raw-shop', (SELECT jsonb_agg(jsonb_build_object('n', n)) FROM generate_series(1, 5001) n))$$);
SELECT err($$SELECT eventgrid.publish('raw-shop', (SELECT jsonb_agg(jsonb_build_object('d', repeat('x', 600000))) FROM generate_series(1, 2)))$$);
SELECT err($$SELECT eventgrid.publish('raw-shop', '[]')$$);
SELECT err($$SELECT eventgrid.publish('raw-shop', NULL)$$);
-- a bad event anywhere in a call rejects the whole call
SELECT count(*) AS before FROM eventgrid.events WHERE topic = 'shop';
SELECT err($$SELECT eventgrid.publish('shop', '[{"id": "ok", "subject": "/s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z"}, {"id": "bad"}]')$$);
SELECT count(*) AS after FROM eventgrid.events WHERE topic = 'shop';

-- Published events are immutable
SELECT err($$UPDATE eventgrid.events SET event = '{}' WHERE topic = 'shop'$$);

-- Fan-out with filters
SELECT eventgrid.create_topic('fanout');
SELECT eventgrid.create_event_subscription('fanout', 'all-events', 'http://127.0.0.1:1/all') IS NOT NULL;
SELECT eventgrid.create_event_subscription('fanout', 'created-only', 'http://127.0.0.1:1/created',
       included_event_types => ARRAY['shop.ordercreated']) IS NOT NULL;
SELECT eventgrid.create_event_subscription('fanout', 'blob-prefix', 'http://127.0.0.1:1/prefix',
       subject_begins_with => '/blobServices/default/containers/images/') IS NOT NULL;
SELECT eventgrid.create_event_subscription('fanout', 'jpg-suffix', 'http://127.0.0.1:1/suffix',
       subject_ends_with => '.JPG') IS NOT NULL;
SELECT eventgrid.create_event_subscription('fanout', 'jpg-exact-case', 'http://127.0.0.1:1/exact',
       subject_ends_with => '.JPG', is_subject_case_sensitive => true) IS NOT NULL;
SELECT eventgrid.create_event_subscription('fanout', 'typed-and-prefixed', 'http://127.0.0.1:1/both',
       included_event_types => ARRAY['Shop.OrderShipped', 'Shop.OrderCreated'], subject_begins_with => '/orders/') IS NOT NULL;
INSERT INTO eventgrid.events (topic, event)
SELECT 'fanout', jsonb_build_object('id', id, 'subject', subject, 'eventType', type, 'eventTime', '2024-05-01T12:00:00Z')
  FROM (VALUES ('f1', '/orders/1', 'Shop.OrderCreated'),
               ('f2', '/blobServices/default/containers/images/blobs/cat.jpg', 'Microsoft.Storage.BlobCreated'),
               ('f3', '/blobServices/default/containers/docs/blobs/a.JPG', 'Microsoft.Storage.BlobCreated'),
               ('f4', '/orders/2', 'Shop.OrderShipped')) AS v(id, subject, type);
-- which subscriptions each event is for: the filters the delivery worker applies
SELECT e.event->>'id' AS event, string_agg(coalesce(s.name, '(unmatched)'), ', ' ORDER BY s.name) AS subscriptions
  FROM eventgrid.events e
  LEFT JOIN eventgrid.event_subscriptions s ON s.topic = e.topic
       AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with,
                              s.subject_ends_with, s.is_subject_case_sensitive, s.advanced_filters, s.enable_advanced_filtering_on_arrays)
 WHERE e.topic = 'fanout' GROUP BY 1 ORDER BY 1;
-- publishing writes the events and nothing per delivery; each subscription has its deliveries pending
SELECT subscription, pending FROM eventgrid.delivery_statistics WHERE topic = 'fanout' ORDER BY 1;

-- Events that match no subscription (here: of topics without any) are counted
-- as unmatched by the upkeep worker within about a second: 5013 of them
DO $$
BEGIN
    FOR i IN 1 .. 200 LOOP
        EXIT WHEN (SELECT sum(unmatched_events) FROM eventgrid.topic_statistics) >= 5013;
        PERFORM pg_sleep(0.05);
    END LOOP;
END $$;
SELECT topic, event_subscriptions, unmatched_events FROM eventgrid.topic_statistics ORDER BY topic;

-- Rollback leaves no event and no delivery
SELECT count(*) AS events FROM eventgrid.events \gset before_
SELECT sum(pending) AS pending FROM eventgrid.delivery_statistics \gset before_
BEGIN;
INSERT INTO eventgrid.events (topic, event) VALUES
  ('fanout', '{"id": "r1", "subject": "/orders/9", "eventType": "Shop.OrderCreated", "eventTime": "2024-05-01T12:00:00Z"}');
SELECT count(*) = :before_events + 1 AS event_inside_transaction FROM eventgrid.events;
ROLLBACK;
SELECT count(*) = :before_events AS events_unchanged FROM eventgrid.events;
SELECT sum(pending) = :before_pending AS pending_unchanged FROM eventgrid.delivery_statistics;
-- A failing row aborts the whole statement: nothing half-written
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES
  ('fanout', '{"id": "ok1", "subject": "/orders/9", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z"}'),
  ('fanout', '{"id": "bad1"}')$$);
SELECT count(*) = :before_events AS events_unchanged FROM eventgrid.events;
SELECT sum(pending) = :before_pending AS pending_unchanged FROM eventgrid.delivery_statistics;

-- Dropping a subscription drops its position and retries; dropping a topic its subscriptions
SELECT eventgrid.drop_event_subscription('fanout', 'all-events');
SELECT subscription FROM eventgrid.delivery_statistics WHERE topic = 'fanout' ORDER BY 1;
SELECT count(*) AS orphans FROM eventgrid.retries r
 WHERE NOT EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s WHERE s.id = r.subscription_id);
SELECT count(*) AS orphans FROM eventgrid.subscription_positions p
 WHERE NOT EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s WHERE s.id = p.subscription_id);
SELECT eventgrid.drop_topic('fanout');
SELECT (SELECT count(*) FROM eventgrid.event_subscriptions WHERE topic = 'fanout') AS subscriptions,
       (SELECT count(*) FROM eventgrid.topic_positions WHERE topic = 'fanout') AS positions,
       (SELECT count(*) FROM eventgrid.retries r
         WHERE NOT EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s WHERE s.id = r.subscription_id)) AS orphan_retries;

-- Ordering keys (SPEC 13): one rule for key values: a string is its text, a
-- number its plain decimal value without trailing zeros, a boolean its name;
-- so 1, "1", 1.0 and 1e0 are one key; an object, array or null is no key
SELECT v AS value, eventgrid._ordering_key(jsonb_build_object('k', v), 'k') AS ordering_key
  FROM (VALUES ('1'::jsonb), ('"1"'), ('1.0'), ('1e0'), ('10.50'), ('1e21'), ('-0.0'), ('" 1"'), ('true'), ('"true"'),
               ('null'), ('{}'), ('[1]')) x(v);
