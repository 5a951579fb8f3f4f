-- Trust: roles and grants, header and endpoint rules, NULL arguments,
-- bounded error messages, publish size, restore mode, and CREATE EXTENSION
-- in another database.
DROP EXTENSION eventgrid;
CREATE EXTENSION eventgrid;
SET client_min_messages = warning;

-- err(sql), from the config suite, shows "SQLSTATE: message (hint: ...)" or "ok"
GRANT EXECUTE ON FUNCTION err(text) TO PUBLIC;

SELECT eventgrid.create_topic('shop');
SELECT eventgrid.create_event_subscription('shop', 'billing', 'http://127.0.0.1:9/hook', deadletter => true) > 0 AS created;
SELECT eventgrid.set_delivery_property('shop', 'billing', 'Authorization', 'Bearer s3cret', is_secret => true);

-- Nothing internal is executable by PUBLIC; only publish() and the five pull
-- functions are, and each checks the caller's right itself (SECURITY INVOKER).
SELECT p.proname FROM pg_proc p
 WHERE p.pronamespace = 'eventgrid'::regnamespace
   AND has_function_privilege('public', p.oid, 'EXECUTE')
 ORDER BY 1;
SELECT c.relname FROM pg_class c
 WHERE c.relnamespace = 'eventgrid'::regnamespace AND c.relkind IN ('r', 'v', 'S')
   AND (has_table_privilege('public', c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE')
        OR has_any_column_privilege('public', c.oid, 'SELECT, INSERT, UPDATE'))
 ORDER BY 1;
SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname LIKE 'eventgrid\_%' ORDER BY 1;

CREATE ROLE eg_alice;                       -- an administrator
CREATE ROLE eg_bob;                         -- an application that publishes
CREATE ROLE eg_carol;                       -- neither
GRANT eventgrid_admin TO eg_alice;
GRANT eventgrid_publisher TO eg_bob;

-- A role with neither role
SET ROLE eg_carol;
SELECT err($$SELECT eventgrid.publish('shop', '{"id": "c1", "subject": "s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z"}')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{}')$$);
SELECT err($$SELECT eventgrid.create_topic('carol-topic')$$);
SELECT err($$SELECT eventgrid._wake_worker_at_commit()$$);
SELECT err($$SELECT eventgrid._endpoint_problem('http://x/')$$);
SELECT err($$SELECT * FROM eventgrid.topics$$);
SELECT err($$SELECT * FROM eventgrid.dead_letter_events$$);
-- PostgreSQL's own permission errors get a hint naming the role to grant
\set VERBOSITY default
SELECT eventgrid.create_topic('carol-topic');
INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{}');
SELECT count(*) FROM eventgrid.dead_letter_events;
SELECT eventgrid._wake_worker_at_commit();
RESET ROLE;
-- and errors that are not about eventgrid's objects get none
CREATE TABLE not_eventgrid_events (x int);
SET ROLE eg_carol;
SELECT * FROM not_eventgrid_events;
INSERT INTO not_eventgrid_events SELECT count(*) FROM eventgrid.topics;
RESET ROLE;
DROP TABLE not_eventgrid_events;
-- a publisher is told which columns it may set, or read
SET ROLE eg_bob;
INSERT INTO eventgrid.events (topic, event, publish_time) VALUES ('shop', '{}', now());
INSERT INTO eventgrid.events (id, topic, event) OVERRIDING SYSTEM VALUE VALUES (1, 'shop', '{}');
SELECT * FROM eventgrid.topics;
SELECT count(*) FROM eventgrid.dead_letters;
RESET ROLE;
-- an admin reading a table it may read only in part is not told to become an admin
SET ROLE eg_alice;
SELECT * FROM eventgrid.queue_events;
RESET ROLE;

-- The publisher: INSERT (topic, event) and publish(), nothing else
SET ROLE eg_bob;
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{"id": "b1", "subject": "s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z"}')$$);
SELECT err($$SELECT eventgrid.publish('shop', '{"id": "b2", "subject": "s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z"}')$$);
SELECT err($$INSERT INTO eventgrid.events (id, topic, event) OVERRIDING SYSTEM VALUE VALUES (1000000, 'shop', '{"id": "b3", "subject": "s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z"}')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event, publish_time) VALUES ('shop', '{"id": "b4", "subject": "s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z"}', now() - interval '1 day')$$);
-- nor the transaction id or event table that decide when and whether it is delivered
SELECT err($$INSERT INTO eventgrid.events (topic, event, txid) VALUES ('shop', '{"id": "b5", "subject": "s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z"}', '1')$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event, event_table) VALUES ('shop', '{"id": "b6", "subject": "s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z"}', 2)$$);
SELECT err($$SELECT * FROM eventgrid.events$$);
SELECT err($$UPDATE eventgrid.events SET topic = 'shop'$$);
SELECT err($$DELETE FROM eventgrid.events$$);
SELECT err($$INSERT INTO eventgrid.retries (subscription_id, event_id, event, payload, publish_time, event_bytes, next_attempt_at) VALUES (1, 1, '{}', '{}', now(), 2, now())$$);
SELECT err($$SELECT eventgrid.create_topic('bob-topic')$$);
SELECT err($$SELECT * FROM eventgrid.dead_letters$$);
SELECT err($$SELECT eventgrid._validate_event()$$);
-- the publisher gets its events' ids back, and reads nothing else of events
SELECT cardinality(eventgrid.publish('shop', '[{"id": "b7", "subject": "s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z"}, {"id": "b8", "subject": "s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z"}]')) AS ids_back;
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{"id": "b9", "subject": "s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z"}') RETURNING id$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{"id": "b10", "subject": "s", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z"}') RETURNING event$$);
SELECT err($$SELECT event FROM eventgrid.events$$);
SELECT err($$SELECT eventgrid.set_advanced_filters('shop', 'billing', '[]')$$);
SELECT err($$SELECT eventgrid.redeliver_dead_letters()$$);
SELECT err($$SELECT eventgrid.purge_dead_letters()$$);
SELECT err($$SELECT eventgrid._advanced_match('{}', '[]', false)$$);
SELECT err($$SELECT * FROM eventgrid.delivery_attempts$$);
SELECT err($$SELECT * FROM eventgrid.attempt_log$$);
SELECT err($$SELECT * FROM eventgrid.metrics$$);
SELECT name, input_schema FROM eventgrid.topics;
RESET ROLE;
SELECT count(*) AS bobs_events FROM eventgrid.events WHERE event->>'id' LIKE 'b%';

-- The administrator: configuration, statistics, dead letters; no secrets, no publishing
SET ROLE eg_alice;
SELECT err($$SELECT eventgrid.create_topic('alice-topic')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('alice-topic', 'alice-sub', 'https://example.com/x')$$);
SELECT err($$SELECT eventgrid.set_retry_policy('alice-topic', 'alice-sub', 5, 60)$$);
SELECT err($$SELECT eventgrid.set_advanced_filters('alice-topic', 'alice-sub', '[{"operatorType": "IsNotNull", "key": "data.a"}]')$$);
SELECT err($$UPDATE eventgrid.event_subscriptions SET advanced_filters = NULL$$);
SELECT err($$SELECT eventgrid.create_topic('alice-ns', 'CloudEventSchemaV1_0', 'namespace')$$);
SELECT err($$SELECT eventgrid.set_delivery_property('alice-topic', 'alice-sub', 'X-Key', 'v')$$);
SELECT subscription, header, kind, value FROM eventgrid.event_subscription_delivery_properties ORDER BY 1, 2;
SELECT err($$SELECT value FROM eventgrid.delivery_properties$$);
SELECT topic, subscription, pending FROM eventgrid.delivery_statistics ORDER BY 1, 2;
SELECT err($$DELETE FROM eventgrid.dead_letters WHERE false$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{}')$$);
SELECT err($$UPDATE eventgrid.event_subscriptions SET endpoint = 'http://evil/'$$);
SELECT err($$DELETE FROM eventgrid.retries$$);
SELECT err($$SELECT eventgrid._put_delivery_property('shop', 'billing', 'X-A', 'v', NULL, false)$$);
SELECT err($$SELECT eventgrid.drop_topic('alice-topic')$$);
-- attempt history and metrics: readable, not writable
SELECT err($$SELECT count(*) FROM eventgrid.delivery_attempts$$);
SELECT err($$SELECT count(*) FROM eventgrid.metrics WHERE metric_name = 'PublishSuccessCount'$$);
SELECT err($$SELECT history_table FROM eventgrid.attempt_log_rotation$$);
SELECT err($$DELETE FROM eventgrid.attempt_log$$);
SELECT err($$UPDATE eventgrid.attempt_log_rotation SET history_table = 1$$);
RESET ROLE;

-- Endpoints: what libcurl cannot use is refused with its parser's reason
SELECT err($$SELECT eventgrid.create_event_subscription('shop', 'ep-1', 'http://127.0.0.1:99999/')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('shop', 'ep-2', 'http://[zz/')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('shop', 'ep-3', 'http://a@b@127.0.0.1:56350/')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('shop', 'ep-4', E'http://127.0.0.1\x01:8080/')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('shop', 'ep-5', 'http://user:pw@127.0.0.1/')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('shop', 'ep-6', 'http://127.0.0.1:0/')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('shop', 'ep-7', 'http://127.0.0.1:65535/ok')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('shop', 'ep-8', 'https://[::1]:8443/ok?a=b')$$);
SELECT err($$UPDATE eventgrid.event_subscriptions SET endpoint = 'http://[zz/' WHERE name = 'ep-7'$$);

-- Delivery properties: framing and routing headers, control characters
SELECT h, err(format($$SELECT eventgrid.set_delivery_property('shop', 'billing', %L, 'v')$$, h))
  FROM unnest(ARRAY['Content-Length', 'transfer-encoding', 'Host', 'Connection', 'Upgrade', 'TE',
                    'Trailer', 'Expect', 'Keep-Alive', 'Proxy-Authorization', 'proxy-x',
                    'Content-Type', 'aeg-x', 'X-Fine']) AS h;
SELECT c, err(format($$SELECT eventgrid.set_delivery_property('shop', 'billing', 'X-Ctl', %L)$$, 'a' || chr(c) || 'b'))
  FROM unnest(ARRAY[1, 9, 10, 11, 13, 27, 31, 127]) AS c;
SELECT err($$SELECT eventgrid.set_delivery_property('shop', 'billing', 'X-Utf8', 'café ok')$$);
-- header names: at most 256 characters
SELECT err($$SELECT eventgrid.set_delivery_property('shop', 'billing', 'X-' || repeat('n', 254), 'v')$$);
SELECT err($$SELECT eventgrid.set_delivery_property('shop', 'billing', 'X-' || repeat('n', 255), 'v')$$);
SELECT err($$SELECT eventgrid.remove_delivery_property('shop', 'billing', 'X-' || repeat('n', 254))$$);
SELECT err($$SELECT eventgrid.set_dynamic_delivery_property('shop', 'billing', 'Host', 'data.host')$$);
SELECT err($$INSERT INTO eventgrid.delivery_properties (subscription_id, header, value) SELECT id, 'X-Raw', E'a\x0bb' FROM eventgrid.event_subscriptions WHERE name = 'billing'$$);
SELECT err($$INSERT INTO eventgrid.delivery_properties (subscription_id, header, value) SELECT id, 'Transfer-Encoding', 'chunked' FROM eventgrid.event_subscriptions WHERE name = 'billing'$$);

-- Publishing refuses control characters in fields that become headers
SELECT eventgrid.create_topic('cloud', 'CloudEventSchemaV1_0');
SELECT eventgrid.create_topic('raw', 'CustomEventSchema');
SELECT err($$SELECT eventgrid.publish('shop', jsonb_build_object('id', E'x\r\nContent-Length: 0\r\n\r\nGET /smuggled HTTP/1.1', 'subject', 's', 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z'))$$);
SELECT err($$SELECT eventgrid.publish('shop', jsonb_build_object('id', 'ok', 'dataVersion', E'1\x7f', 'subject', 's', 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z'))$$);
SELECT err($$SELECT eventgrid.publish('shop', jsonb_build_object('id', E'tab\there', 'subject', 's', 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z'))$$);
SELECT err($$SELECT eventgrid.publish('cloud', jsonb_build_object('id', E'a\nb', 'source', 's', 'specversion', '1.0', 'type', 'T'))$$);
SELECT err($$SELECT eventgrid.publish('raw', jsonb_build_object('id', E'a\x0bb'))$$);
SELECT err($$SELECT eventgrid.publish('raw', jsonb_build_object('id', jsonb_build_object('nested', E'a\nb')))$$);
SELECT err($$SELECT eventgrid.publish('shop', jsonb_build_object('id', 'fine', 'subject', E'line\nbreaks are fine here', 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', 'data', E'and\nhere'))$$);

-- NULL topic and subscription arguments: 22004
SELECT err($$SELECT eventgrid.drop_topic(NULL)$$);
SELECT err($$SELECT eventgrid.create_event_subscription(NULL, 'x-sub', 'http://x/')$$);
SELECT err($$SELECT eventgrid.drop_event_subscription('shop', NULL)$$);
SELECT err($$SELECT eventgrid.set_retry_policy(NULL, 'billing', 3)$$);
SELECT err($$SELECT eventgrid.set_batching('shop', NULL, 3)$$);
SELECT err($$SELECT eventgrid.set_deadletter('shop', 'billing', NULL)$$);
SELECT err($$SELECT eventgrid.remove_delivery_property('shop', 'billing', NULL)$$);
SELECT err($$SELECT eventgrid.set_dynamic_delivery_property('shop', 'billing', 'X-D', NULL)$$);
SELECT err($$SELECT eventgrid.publish(NULL, '{}')$$);
SELECT err($$SELECT eventgrid.publish('shop', NULL)$$);

-- Errors quote at most 64 characters of an argument
SELECT length(err(format($$SELECT eventgrid.create_topic(%L)$$, repeat('t', 1048576)))) < 600 AS create_topic_bounded;
SELECT length(err(format($$SELECT eventgrid.drop_topic(%L)$$, repeat('t', 1048576)))) < 600 AS drop_topic_bounded;
SELECT length(err(format($$SELECT eventgrid.create_event_subscription('shop', %L, 'http://x/')$$, repeat('s', 1048576)))) < 600 AS subscription_bounded;
SELECT length(err(format($$SELECT eventgrid.set_delivery_property('shop', 'billing', %L, 'v')$$, repeat('h', 1048576)))) < 600 AS header_bounded;
SELECT length(err(format($$SELECT eventgrid.set_dynamic_delivery_property('shop', 'billing', 'X-D', %L)$$, repeat('f', 1048576)))) < 600 AS source_field_bounded;
DO $$
DECLARE msg text;
BEGIN
    INSERT INTO eventgrid.events (topic, event) VALUES (repeat('t', 1048576), '{}');
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS msg = MESSAGE_TEXT;
    RAISE WARNING 'INSERT with a 1 MB topic: % (% characters)', left(msg, 40), length(msg);
END $$;

-- publish() takes an object of exactly 1 MB, as INSERT does; one byte more is refused
SELECT octet_length(jsonb_build_object('d', repeat('x', 1048567))::text) AS object_bytes;
SELECT err($$SELECT eventgrid.publish('raw', jsonb_build_object('d', repeat('x', 1048567)))$$);
SELECT err($$SELECT eventgrid.publish('raw', jsonb_build_array(jsonb_build_object('d', repeat('x', 1048567))))$$);
SELECT err($$SELECT eventgrid.publish('raw', jsonb_build_object('d', repeat('x', 1048568)))$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('raw', jsonb_build_object('d', repeat('x', 1048567)))$$);
SELECT err($$INSERT INTO eventgrid.events (topic, event) VALUES ('raw', jsonb_build_object('d', repeat('x', 1048568)))$$);

-- Restore mode: a row written with publish_time (pg_restore) is stored as it is
SELECT coalesce(sum(pending), 0) AS pending_before FROM eventgrid.delivery_statistics \gset
INSERT INTO eventgrid.events (topic, event, publish_time, event_bytes)
VALUES ('not-restored-yet', '{"anything": true}', '2024-05-01 12:00:00+00', 18);
SELECT topic, event, publish_time = '2024-05-01 12:00:00+00' AS publish_time_kept, event_bytes FROM eventgrid.events WHERE topic = 'not-restored-yet';
SELECT coalesce(sum(pending), 0) - :pending_before AS new_deliveries FROM eventgrid.delivery_statistics;
SELECT event_bytes > 0 AS stamped FROM eventgrid.events WHERE event->>'id' = 'b1';

-- Table change publications check the role current at the call, never the
-- session user.  A hostile administrator's SECURITY DEFINER function that
-- the owner of a table runs publishes nothing of it:
CREATE SCHEMA victim;
CREATE ROLE eg_dave;                        -- owns victim.private
GRANT USAGE ON SCHEMA victim TO eg_dave, eg_alice;
GRANT CREATE ON SCHEMA victim TO eg_dave, eg_alice;
SET ROLE eg_dave;
CREATE TABLE victim.private (id int PRIMARY KEY, secret text);
RESET ROLE;
SET ROLE eg_alice;
SELECT eventgrid.create_topic('evetopic');
CREATE FUNCTION victim.trap() RETURNS text LANGUAGE plpgsql SECURITY DEFINER AS $f$
BEGIN
    PERFORM eventgrid.publish_table_changes('victim.private', 'evetopic');
    RETURN 'published';
EXCEPTION WHEN insufficient_privilege THEN
    RETURN 'refused: ' || SQLERRM;
END $f$;
GRANT EXECUTE ON FUNCTION victim.trap() TO eg_dave;
RESET ROLE;
SET ROLE eg_dave;
SELECT victim.trap();
RESET ROLE;
-- nor does an index expression that a superuser's ANALYZE runs (as the
-- table's owner, in a security-restricted operation), even on a table of
-- eventgrid's own
SET ROLE eg_alice;
CREATE FUNCTION victim.imm(x int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $f$
BEGIN
    BEGIN
        PERFORM eventgrid.publish_table_changes('eventgrid.signing_secrets', 'evetopic');
    EXCEPTION WHEN OTHERS THEN
        RAISE NOTICE 'refused: %', SQLERRM;
    END;
    RETURN x;
END $f$;
CREATE TABLE victim.mine (x int);
INSERT INTO victim.mine VALUES (1);
SET client_min_messages = notice;
CREATE INDEX ON victim.mine (victim.imm(x));
RESET ROLE;
ANALYZE victim.mine;
SET client_min_messages = warning;
SELECT count(*) AS publications FROM eventgrid.table_publications;
-- eventgrid's own tables are refused to everyone, the superuser included
SELECT err($$SELECT eventgrid.publish_table_changes('eventgrid.signing_secrets', 'evetopic')$$);
SELECT err($$SELECT eventgrid.publish_table_changes('eventgrid.events', 'evetopic')$$);
-- the owner's privileges do count when the owner calls it
GRANT eventgrid_admin TO eg_dave;
SET ROLE eg_dave;
SELECT err($$SELECT eventgrid.publish_table_changes('victim.private', 'evetopic', columns => ARRAY['id'])$$);
SELECT err($$SELECT eventgrid.stop_publishing_table_changes('victim.private', 'evetopic')$$);
RESET ROLE;
-- and the privileged parts are not the administrator's to call
SET ROLE eg_alice;
SELECT err($$SELECT eventgrid._publish_table_changes('eg_dave', 'victim.private', 'evetopic', '{INSERT}', NULL, NULL, NULL)$$);
SELECT err($$SELECT eventgrid._stop_publishing_table_changes('eg_dave', 'victim.private', 'evetopic')$$);
RESET ROLE;
REVOKE eventgrid_admin FROM eg_dave;
DROP SCHEMA victim CASCADE;
SELECT eventgrid.drop_topic('evetopic');

-- Every admin function refused to a role without eventgrid_admin says
-- which role to grant; a role that has it is pointed to the masked views
SET ROLE eg_carol;
SELECT eventgrid.pause_delivery();
SELECT eventgrid.resume_delivery();
SELECT eventgrid.redeliver_dead_letters();
SELECT eventgrid.purge_dead_letters();
SELECT eventgrid.set_signing_secret('shop', 'billing');
SELECT eventgrid.remove_signing_secret('shop', 'billing');
SELECT eventgrid.update_event_subscription('shop', 'billing');
SELECT eventgrid.set_advanced_filters('shop', 'billing', '[]');
SELECT eventgrid.publish_table_changes('pg_class', 'shop');
SELECT eventgrid.stop_publishing_table_changes('pg_class', 'shop');
SELECT eventgrid.validate_event_subscription('shop', 'billing', 'x');
SELECT eventgrid.probation_duration('Busy');
RESET ROLE;
SET ROLE eg_alice;
SELECT * FROM eventgrid.delivery_properties;
SELECT * FROM eventgrid.signing_secrets;
SELECT * FROM eventgrid.client_certificates;
SELECT * FROM eventgrid.delivery_authentications;
SELECT * FROM eventgrid.endpoint_validations;
DELETE FROM eventgrid.topics;
RESET ROLE;

-- An event or filter refused says what and why, without CONTEXT lines
-- naming eventgrid's internal statements and helpers
SELECT eventgrid.publish('shop', '{"id": 1}');
INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '{"id": 1}');
SELECT eventgrid.create_event_subscription('shop', 'filtered', 'http://127.0.0.1:9/f',
       advanced_filters => '[{"operatorType": "Bad"}]');
SELECT eventgrid.set_advanced_filters('shop', 'billing', '[{"operatorType": "NumberIn", "key": "data.n"}]');
-- a caller's own function keeps its frames
CREATE FUNCTION publish_for_me() RETURNS bigint[] LANGUAGE plpgsql AS $f$
BEGIN
    RETURN eventgrid.publish('shop', '{"id": 1}');
END $f$;
SELECT publish_for_me();
DROP FUNCTION publish_for_me();

-- The trigger function called directly
SELECT err($$SELECT eventgrid._validate_event()$$);

-- Every table with user data and its identity sequence is dumped by pg_dump
SELECT c.relname FROM pg_extension x, unnest(x.extconfig) AS cfg(oid) JOIN pg_class c ON c.oid = cfg.oid
 WHERE x.extname = 'eventgrid' ORDER BY 1;

-- Preloaded, CREATE EXTENSION works in any database (each is served), and
-- DROP DATABASE is not held up by its workers
CREATE DATABASE eventgrid_elsewhere;
\c eventgrid_elsewhere
SET client_min_messages = warning;
CREATE EXTENSION eventgrid;
SELECT extversion = default_version AS installed FROM pg_extension x JOIN pg_available_extensions a ON a.name = x.extname
 WHERE x.extname = 'eventgrid';
\c contrib_regression
DROP DATABASE eventgrid_elsewhere;
-- the launcher's view of every database: superusers and pg_monitor only
SET ROLE eg_alice;
SELECT count(*) FROM eventgrid.served_databases;
RESET ROLE;
GRANT pg_monitor TO eg_alice;
SET ROLE eg_alice;
SELECT count(*) > 0 AS sees_them FROM eventgrid.served_databases WHERE database = current_database();
RESET ROLE;
REVOKE pg_monitor FROM eg_alice;

DROP EXTENSION eventgrid;
DROP ROLE eg_alice;
DROP ROLE eg_bob;
DROP ROLE eg_carol;
DROP ROLE eg_dave;
