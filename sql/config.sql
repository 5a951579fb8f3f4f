-- Configuration API: topics, event subscriptions, retry policy, batching,
-- dead-lettering and custom delivery properties.  Every range bound of
-- SPEC sections 4, 5 and 8 is tried on both sides.
CREATE EXTENSION eventgrid;

-- err(sql): runs sql and shows "SQLSTATE: message (hint: ...)" or "ok".
CREATE FUNCTION err(q text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    st text; msg text; hint text;
BEGIN
    EXECUTE q;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, hint = PG_EXCEPTION_HINT;
    RETURN st || ': ' || msg || CASE WHEN hint <> '' THEN ' (hint: ' || hint || ')' ELSE '' END;
END $$;

-- Errors as psql shows them: SQLSTATE, message, DETAIL and HINT, and no
-- CONTEXT lines from eventgrid's own helper functions
SELECT eventgrid.create_topic('ab');
SELECT eventgrid.create_topic(NULL);
SELECT eventgrid.drop_topic('no-such-topic');
SELECT eventgrid.create_event_subscription('no-such-topic', 'sub', 'http://127.0.0.1/');
SELECT eventgrid.set_retry_policy('no-such-topic', 'sub', 31);
-- the frames of the caller's own function stay
CREATE FUNCTION my_setup() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM eventgrid.create_topic('x');
END $$;
SELECT my_setup();
DROP FUNCTION my_setup();

-- Topics
SELECT eventgrid.create_topic('orders');
SELECT eventgrid.create_topic('cloud-orders', 'CloudEventSchemaV1_0');
SELECT eventgrid.create_topic('custom-orders', input_schema => 'CustomEventSchema');
SELECT err($$SELECT eventgrid.create_topic('ab')$$);
SELECT err($$SELECT eventgrid.create_topic('abc')$$);
SELECT err($$SELECT eventgrid.create_topic(repeat('t', 50))$$);
SELECT err($$SELECT eventgrid.create_topic(repeat('t', 51))$$);
SELECT err($$SELECT eventgrid.create_topic('bad_name')$$);
SELECT err($$SELECT eventgrid.create_topic(NULL)$$);
SELECT err($$SELECT eventgrid.create_topic('orders')$$);
SELECT err($$SELECT eventgrid.create_topic('avro-orders', 'AvroSchema')$$);
SELECT err($$SELECT eventgrid.drop_topic('abc')$$);
SELECT err($$SELECT eventgrid.drop_topic(repeat('t', 50))$$);
SELECT err($$SELECT eventgrid.drop_topic('no-such-topic')$$);
SELECT name, input_schema FROM eventgrid.topics ORDER BY name;

-- Event subscriptions: defaults
SELECT eventgrid.create_event_subscription('orders', 'sub-default', 'https://example.com/hook') > 0 AS created;
SELECT name, endpoint, event_delivery_schema, max_delivery_attempts, event_ttl,
       max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter
  FROM eventgrid.event_subscriptions WHERE name = 'sub-default';

-- names and endpoints
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'ab', 'https://example.com/')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', repeat('s', 64), 'https://example.com/')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', repeat('s', 65), 'https://example.com/')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'sub-default', 'https://example.com/')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('no-such-topic', 'sub-x', 'https://example.com/')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'sub-ftp', 'ftp://example.com/')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'sub-rel', '/relative/path')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'sub-words', 'not a url')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'sub-empty-host', 'http://')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'sub-space', 'http://example.com/a b')$$);
-- a scheme and a path but no host
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'sub-no-host', 'http:///x')$$);
-- endpoints are at most 2048 bytes: one longer did not fit the endpoint health index and stopped every record
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'sub-long', 'http://127.0.0.1:9/' || repeat('a', 1048576))$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'sub-long', 'http://127.0.0.1:9/' || repeat('a', 2048 - 19 + 1))$$);
SELECT eventgrid.create_event_subscription('orders', 'sub-longest', 'http://127.0.0.1:9/' || repeat('a', 2048 - 19)) IS NOT NULL AS longest_accepted;
SELECT octet_length(endpoint) FROM eventgrid.event_subscriptions WHERE name = 'sub-longest';
SELECT eventgrid.drop_event_subscription('orders', 'sub-longest');
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'sub-null', NULL)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'sub-http', 'HTTP://127.0.0.1:8080/x?y=1')$$);

-- max_delivery_attempts 1..30
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'mda-0', 'https://example.com/', max_delivery_attempts => 0)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'mda-1', 'https://example.com/', max_delivery_attempts => 1)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'mda-30', 'https://example.com/', max_delivery_attempts => 30)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'mda-31', 'https://example.com/', max_delivery_attempts => 31)$$);
-- NULL means the profile's default (30 attempts, 1440 minutes)
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'mda-null', 'https://example.com/', max_delivery_attempts => NULL, event_ttl => NULL)$$);
SELECT max_delivery_attempts, event_ttl FROM eventgrid.event_subscriptions WHERE name = 'mda-null';
-- event_ttl 1..1440 minutes
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'ttl-0', 'https://example.com/', event_ttl => 0)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'ttl-1', 'https://example.com/', event_ttl => 1)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'ttl-1440', 'https://example.com/', event_ttl => 1440)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'ttl-1441', 'https://example.com/', event_ttl => 1441)$$);
-- max_events_per_batch 1..5000
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'meb-0', 'https://example.com/', max_events_per_batch => 0)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'meb-1', 'https://example.com/', max_events_per_batch => 1)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'meb-5000', 'https://example.com/', max_events_per_batch => 5000)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'meb-5001', 'https://example.com/', max_events_per_batch => 5001)$$);
-- preferred_batch_size_in_kilobytes 1..1024
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'pbs-0', 'https://example.com/', preferred_batch_size_in_kilobytes => 0)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'pbs-1', 'https://example.com/', preferred_batch_size_in_kilobytes => 1)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'pbs-1024', 'https://example.com/', preferred_batch_size_in_kilobytes => 1024)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'pbs-1025', 'https://example.com/', preferred_batch_size_in_kilobytes => 1025)$$);
-- filters
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'types-empty', 'https://example.com/', included_event_types => '{}')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'types-null', 'https://example.com/', included_event_types => ARRAY[NULL::text])$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'types-blank', 'https://example.com/', included_event_types => ARRAY[''])$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'types-blank', 'https://example.com/', included_event_types => ARRAY['A.B', ' '])$$);
-- delivery schema mapping
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'eg-to-ce', 'https://example.com/', event_delivery_schema => 'CloudEventSchemaV1_0')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('cloud-orders', 'ce-to-eg', 'https://example.com/', event_delivery_schema => 'EventGridSchema')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'eg-to-custom', 'https://example.com/', event_delivery_schema => 'CustomEventSchema')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('custom-orders', 'custom-to-eg', 'https://example.com/', event_delivery_schema => 'EventGridSchema')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'bad-schema', 'https://example.com/', event_delivery_schema => 'Xml')$$);
SELECT name, event_delivery_schema FROM eventgrid.event_subscriptions
 WHERE topic IN ('cloud-orders', 'custom-orders') OR name LIKE '%-to-%' ORDER BY name;

-- set_retry_policy: NULL leaves a setting unchanged
SELECT eventgrid.set_retry_policy('orders', 'sub-default', max_delivery_attempts => 10);
SELECT eventgrid.set_retry_policy('orders', 'sub-default', event_ttl => 30);
SELECT max_delivery_attempts, event_ttl FROM eventgrid.event_subscriptions WHERE name = 'sub-default';
SELECT err($$SELECT eventgrid.set_retry_policy('orders', 'sub-default', 0, NULL)$$);
SELECT err($$SELECT eventgrid.set_retry_policy('orders', 'sub-default', 31, NULL)$$);
SELECT err($$SELECT eventgrid.set_retry_policy('orders', 'sub-default', NULL, 0)$$);
SELECT err($$SELECT eventgrid.set_retry_policy('orders', 'sub-default', NULL, 1441)$$);
SELECT err($$SELECT eventgrid.set_retry_policy('orders', 'no-such-sub', 5, 5)$$);

-- update_event_subscription: refused as at creation, as psql shows it
SELECT eventgrid.update_event_subscription('orders', 'sub-default', endpoint => 'ftp://x/');
SELECT eventgrid.update_event_subscription('orders', 'sub-default', max_delivery_attempts => 31);
SELECT eventgrid.update_event_subscription('orders', 'sub-default', max_events_per_batch => -1);
SELECT eventgrid.update_event_subscription('orders', 'sub-default', event_time_to_live => 'PT5M');
SELECT eventgrid.update_event_subscription('orders', 'no-such-sub');
-- the rate limit: 1-100,000 events a second; update's 0 clears it
SELECT eventgrid.create_event_subscription('orders', 'rated', 'http://127.0.0.1/', max_events_per_second => 0);
SELECT eventgrid.create_event_subscription('orders', 'rated', 'http://127.0.0.1/', max_events_per_second => 100001);
SELECT eventgrid.update_event_subscription('orders', 'sub-default', max_events_per_second => 100001);
SELECT eventgrid.update_event_subscription('orders', 'sub-default', max_events_per_second => 250);
SELECT max_events_per_second FROM eventgrid.event_subscription_batching WHERE subscription = 'sub-default';
SELECT eventgrid.update_event_subscription('orders', 'sub-default', max_events_per_second => 0);
SELECT max_events_per_second IS NULL AS no_limit FROM eventgrid.event_subscription_batching WHERE subscription = 'sub-default';
SELECT max_delivery_attempts, event_ttl FROM eventgrid.event_subscriptions WHERE name = 'sub-default';

-- set_batching
SELECT eventgrid.set_batching('orders', 'sub-default', 1000, 512);
SELECT max_events_per_batch, preferred_batch_size_in_kilobytes FROM eventgrid.event_subscriptions WHERE name = 'sub-default';
SELECT err($$SELECT eventgrid.set_batching('orders', 'sub-default', 5001, NULL)$$);
SELECT err($$SELECT eventgrid.set_batching('orders', 'sub-default', NULL, 1025)$$);
SELECT max_events_per_batch, preferred_batch_size_in_kilobytes FROM eventgrid.event_subscriptions WHERE name = 'sub-default';
SELECT eventgrid.set_batching('orders', 'sub-default', NULL, NULL);
SELECT max_events_per_batch, preferred_batch_size_in_kilobytes FROM eventgrid.event_subscriptions WHERE name = 'sub-default';

-- set_deadletter
SELECT eventgrid.set_deadletter('orders', 'sub-default', true);
SELECT deadletter FROM eventgrid.event_subscriptions WHERE name = 'sub-default';
SELECT err($$SELECT eventgrid.set_deadletter('orders', 'sub-default', NULL)$$);

-- Constraints hold even for direct writes
SELECT err($$UPDATE eventgrid.event_subscriptions SET max_delivery_attempts = 31 WHERE name = 'sub-default'$$);
SELECT err($$UPDATE eventgrid.event_subscriptions SET event_ttl = 0 WHERE name = 'sub-default'$$);
SELECT err($$UPDATE eventgrid.event_subscriptions SET max_events_per_batch = 5001 WHERE name = 'sub-default'$$);
SELECT err($$UPDATE eventgrid.event_subscriptions SET preferred_batch_size_in_kilobytes = 0 WHERE name = 'sub-default'$$);
SELECT err($$UPDATE eventgrid.event_subscriptions SET endpoint = 'gopher://x' WHERE name = 'sub-default'$$);
SELECT err($$INSERT INTO eventgrid.topics (name, input_schema) VALUES ('direct', 'Xml')$$);
SELECT err($$INSERT INTO eventgrid.delivery_properties (subscription_id, header, value) SELECT id, 'aeg-x', 'v' FROM eventgrid.event_subscriptions WHERE name = 'sub-default'$$);
SELECT err($$INSERT INTO eventgrid.delivery_properties (subscription_id, header, value) SELECT id, 'X-Big', repeat('v', 4097) FROM eventgrid.event_subscriptions WHERE name = 'sub-default'$$);

-- Custom delivery properties: at most 10, values at most 4096 bytes
SELECT eventgrid.set_delivery_property('orders', 'sub-default', 'X-Header-' || n, 'value-' || n)
  FROM generate_series(1, 8) AS n;
SELECT eventgrid.set_delivery_property('orders', 'sub-default', 'Authorization', 'Bearer s3cr3t', is_secret => true);
SELECT eventgrid.set_dynamic_delivery_property('orders', 'sub-default', 'X-Order-Id', 'data.orderId');
SELECT err($$SELECT eventgrid.set_delivery_property('orders', 'sub-default', 'X-Eleventh', 'v')$$);
-- replacing an existing header does not count twice (names are case-insensitive)
SELECT err($$SELECT eventgrid.set_delivery_property('orders', 'sub-default', 'x-header-1', 'replaced')$$);
SELECT err($$SELECT eventgrid.set_delivery_property('orders', 'sub-default', 'X-Header-2', repeat('v', 4096))$$);
SELECT err($$SELECT eventgrid.set_delivery_property('orders', 'sub-default', 'X-Header-2', repeat('v', 4097))$$);
SELECT err($$SELECT eventgrid.set_delivery_property('orders', 'sub-default', 'X-Header-2', repeat('é', 2049))$$);
SELECT err($$SELECT eventgrid.set_delivery_property('orders', 'sub-default', 'aeg-custom', 'v')$$);
SELECT err($$SELECT eventgrid.set_delivery_property('orders', 'sub-default', 'Bad Header', 'v')$$);
SELECT err($$SELECT eventgrid.set_delivery_property('orders', 'sub-default', 'X-Header-3', E'line\r\nInjected: yes')$$);
SELECT err($$SELECT eventgrid.set_delivery_property('orders', 'sub-default', 'X-Header-3', NULL)$$);
SELECT err($$SELECT eventgrid.set_dynamic_delivery_property('orders', 'sub-default', 'X-Order-Id', 'data..orderId')$$);
SELECT err($$SELECT eventgrid.set_delivery_property('orders', 'no-such-sub', 'X-A', 'v')$$);
SELECT subscription, header, kind, left(value, 20) AS value, source_field
  FROM eventgrid.event_subscription_delivery_properties ORDER BY lower(header);
SELECT eventgrid.remove_delivery_property('orders', 'sub-default', 'X-HEADER-8');
SELECT err($$SELECT eventgrid.remove_delivery_property('orders', 'sub-default', 'X-HEADER-8')$$);
SELECT err($$SELECT eventgrid.set_delivery_property('orders', 'sub-default', 'X-Tenth', 'v')$$);
SELECT count(*) FROM eventgrid.delivery_properties;

-- Secrets and configuration are not readable by roles without eventgrid_admin (see security.sql)
CREATE ROLE eventgrid_reader;
SET ROLE eventgrid_reader;
SELECT err($$SELECT value FROM eventgrid.delivery_properties$$);
SELECT err($$SELECT * FROM eventgrid.event_subscription_delivery_properties$$);
SELECT err($$SELECT count(*) FROM eventgrid.topics$$);
RESET ROLE;
DROP ROLE eventgrid_reader;

-- Dropping
SELECT eventgrid.drop_event_subscription('orders', 'mda-1');
SELECT err($$SELECT eventgrid.drop_event_subscription('orders', 'mda-1')$$);
SELECT eventgrid.drop_topic('custom-orders');
SELECT count(*) FROM eventgrid.event_subscriptions WHERE topic = 'custom-orders';

-- Namespace topics: CloudEvents only, their own retry policy arguments
SELECT err($$SELECT eventgrid.create_topic('ns-orders', topic_type => 'namespace')$$);
SELECT err($$SELECT eventgrid.create_topic('ns-orders', 'CloudEventSchemaV1_0', 'domain')$$);
SELECT err($$SELECT eventgrid.create_topic('ns-orders', 'CloudEventSchemaV1_0', NULL)$$);
SELECT eventgrid.create_topic('ns-orders', 'CloudEventSchemaV1_0', topic_type => 'namespace');
SELECT name, input_schema, topic_type FROM eventgrid.topics WHERE name IN ('orders', 'ns-orders') ORDER BY 1;
SELECT err($$SELECT eventgrid.create_event_subscription('ns-orders', 'ns-eg', 'https://example.com/', event_delivery_schema => 'EventGridSchema')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('ns-orders', 'ns-mda', 'https://example.com/', max_delivery_attempts => 5)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('ns-orders', 'ns-ttl', 'https://example.com/', event_ttl => 5)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'cu-mdc', 'https://example.com/', max_delivery_count => 5)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'cu-etl', 'https://example.com/', event_time_to_live => 'PT5M')$$);
-- max_delivery_count 1..10
SELECT err($$SELECT eventgrid.create_event_subscription('ns-orders', 'mdc-0', 'https://example.com/', max_delivery_count => 0)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('ns-orders', 'mdc-1', 'https://example.com/', max_delivery_count => 1)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('ns-orders', 'mdc-10', 'https://example.com/', max_delivery_count => 10)$$);
SELECT err($$SELECT eventgrid.create_event_subscription('ns-orders', 'mdc-11', 'https://example.com/', max_delivery_count => 11)$$);
-- event_time_to_live: ISO 8601 with minute precision, PT1M..P7D
SELECT v AS event_time_to_live,
       err(format('SELECT eventgrid.create_event_subscription(%L, %L, %L, event_time_to_live => %L)',
                  'ns-orders', 'etl-' || n, 'https://example.com/', v)) AS result
  FROM unnest(ARRAY['PT1M', 'PT0M', 'PT20M', 'PT1H30M', 'P1DT2H', 'P1W', 'P7D', 'P7DT1M', 'P8D', 'PT30S',
                    'PT1M30S', 'P1M', 'P1Y', 'PT', 'P', '20', 'pt20m', 'PT-5M']) WITH ORDINALITY AS t(v, n);
SELECT name, max_delivery_attempts, event_ttl, max_delivery_count, event_time_to_live
  FROM eventgrid.event_subscriptions WHERE topic = 'ns-orders' ORDER BY id;
-- set_retry_policy takes the profile's own arguments
SELECT eventgrid.set_retry_policy('ns-orders', 'etl-3', max_delivery_count => 3, event_time_to_live => 'PT45M');
SELECT err($$SELECT eventgrid.set_retry_policy('ns-orders', 'etl-3', max_delivery_attempts => 3)$$);
SELECT err($$SELECT eventgrid.set_retry_policy('ns-orders', 'etl-3', event_time_to_live => 'P8D')$$);
SELECT err($$SELECT eventgrid.set_retry_policy('orders', 'sub-default', event_time_to_live => 'PT5M')$$);
SELECT name, max_delivery_count, event_time_to_live FROM eventgrid.event_subscriptions WHERE name = 'etl-3';

-- Advanced filters: set, shown, replaced, removed; bad ones refused and nothing changed
SELECT eventgrid.create_event_subscription('orders', 'adv-filters', 'https://example.com/',
       advanced_filters => '[{"operatorType": "NumberGreaterThan", "key": "data.total", "value": 100}]') > 0 AS created;
SELECT advanced_filters, enable_advanced_filtering_on_arrays FROM eventgrid.event_subscriptions WHERE name = 'adv-filters';
SELECT eventgrid.set_advanced_filters('orders', 'adv-filters',
       '[{"operatorType": "StringIn", "key": "data.tags", "values": ["red"]}]', enable_advanced_filtering_on_arrays => true);
SELECT advanced_filters, enable_advanced_filtering_on_arrays FROM eventgrid.event_subscriptions WHERE name = 'adv-filters';
SELECT err($$SELECT eventgrid.set_advanced_filters('orders', 'adv-filters', '[{"operatorType": "StringIn", "key": "data.tags", "values": [1]}]')$$);
SELECT err($$SELECT eventgrid.set_advanced_filters('orders', 'no-such', '[]')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'adv-bad', 'https://example.com/', advanced_filters => '[{"operatorType": "Nope", "key": "a"}]')$$);
SELECT err($$SELECT eventgrid.create_event_subscription('orders', 'adv-bad', 'https://example.com/', enable_advanced_filtering_on_arrays => NULL)$$);
SELECT err($$UPDATE eventgrid.event_subscriptions SET advanced_filters = '[{"operatorType": "Nope", "key": "a"}]' WHERE name = 'adv-filters'$$);
SELECT advanced_filters, enable_advanced_filtering_on_arrays FROM eventgrid.event_subscriptions WHERE name = 'adv-filters';
SELECT eventgrid.set_advanced_filters('orders', 'adv-filters', '[]');
SELECT advanced_filters IS NULL AS removed, enable_advanced_filtering_on_arrays FROM eventgrid.event_subscriptions WHERE name = 'adv-filters';

-- Batching as the worker applies it: the GUC default fills in the setting a subscription left out
SELECT eventgrid.set_batching('orders', 'sub-default', max_events_per_batch => 50);
SELECT * FROM eventgrid.event_subscription_batching
 WHERE subscription IN ('sub-default', 'adv-filters') ORDER BY subscription;
SELECT eventgrid.set_batching('orders', 'sub-default', preferred_batch_size_in_kilobytes => 128);
SELECT * FROM eventgrid.event_subscription_batching WHERE subscription = 'sub-default';
SELECT eventgrid.set_batching('orders', 'sub-default', 20, 256);
SELECT * FROM eventgrid.event_subscription_batching WHERE subscription = 'sub-default';
SELECT eventgrid.set_batching('orders', 'sub-default');

-- Dead letters: the filters of redeliver_dead_letters and purge_dead_letters
SELECT err($$SELECT eventgrid.purge_dead_letters(reason => 'Bored')$$);
SELECT err($$SELECT eventgrid.redeliver_dead_letters(dead_lettered_after => now(), dead_lettered_before => now() - interval '1 day')$$);
-- an unknown topic or subscription is an error, as in drop_topic(); purging
-- may name one that is gone but that dead letters still name
SELECT err($$SELECT eventgrid.purge_dead_letters(topic => 'no-such-topic')$$);
SELECT err($$SELECT eventgrid.redeliver_dead_letters(topic => 'no-such-topic')$$);
SELECT err($$SELECT eventgrid.redeliver_dead_letters(topic => 'orders', subscription => 'no-such-sub')$$);
SELECT err($$SELECT eventgrid.purge_dead_letters(subscription => 'no-such-sub')$$);
INSERT INTO eventgrid.dead_letters (topic, subscription_name, subscription_id, input_schema, event_delivery_schema,
       event, dead_letter_reason, delivery_attempts, last_delivery_outcome, publish_time, last_delivery_attempt_time)
VALUES ('gone-topic', 'gone-sub', 999, 'EventGridSchema', 'EventGridSchema', '{}', 'NonRetriableError', 1, 'BadRequest',
        now(), now());
SELECT err($$SELECT eventgrid.redeliver_dead_letters(topic => 'gone-topic')$$);
SELECT eventgrid.purge_dead_letters(topic => 'gone-topic', subscription => 'gone-sub') AS purged;

-- Attempt history and metrics: the settings, their ranges, the views' shape
SELECT name, setting, unit, min_val, max_val, enumvals, context FROM pg_settings
 WHERE name LIKE 'eventgrid.attempt\_history%' ORDER BY name;
ALTER SYSTEM SET eventgrid.attempt_history = 'sometimes';
-- PostgreSQL's range message differs by major (17 adds units): SQLSTATE only
\set VERBOSITY sqlstate
ALTER SYSTEM SET eventgrid.attempt_history_retention = '1min';
\set VERBOSITY default
ALTER SYSTEM SET eventgrid.attempt_history_max_rows = 10;
-- eventgrid.entra_authority: https, or plain http to this machine only, as
-- the whole host (the client secret goes to it)
ALTER SYSTEM SET eventgrid.entra_authority = 'http://localhost.evil.example';
ALTER SYSTEM SET eventgrid.entra_authority = 'http://localhost@127.0.0.2:8443/';
ALTER SYSTEM SET eventgrid.entra_authority = 'http://127.0.0.1:/';
ALTER SYSTEM SET eventgrid.entra_authority = 'http://[::1]:8443';
ALTER SYSTEM SET eventgrid.entra_authority = 'http://localhost/';
ALTER SYSTEM SET eventgrid.entra_authority = 'https://login.microsoftonline.us';
ALTER SYSTEM RESET eventgrid.entra_authority;
SELECT err($$SET eventgrid.attempt_history = 'off'$$);
SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
 WHERE attrelid = 'eventgrid.delivery_attempts'::regclass AND attnum > 0 ORDER BY attnum;
SELECT metric_name, aggregation, unit FROM eventgrid.metrics
 WHERE topic = 'orders' AND (event_subscription IS NULL OR event_subscription = 'sub-default')
 ORDER BY event_subscription NULLS FIRST, metric_name, aggregation;

-- Scaling out: the publication of events, its checks, the retention setting
SELECT name, setting, unit, min_val, max_val, context FROM pg_settings WHERE name = 'eventgrid.event_retention';
SELECT err($$SELECT eventgrid.create_event_publication(NULL)$$);
SELECT err($$SELECT eventgrid.create_event_publication('')$$);
SELECT err($$SELECT eventgrid.create_event_publication('pub_x', ARRAY[]::text[])$$);
SELECT err($$SELECT eventgrid.create_event_publication('pub_x', ARRAY['orders', 'nope'])$$);
SET client_min_messages = error;    -- wal_level need not be logical to create one
SELECT eventgrid.create_event_publication('pub_orders', ARRAY['orders']);
SELECT pubname, pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot FROM pg_publication WHERE pubname = 'pub_orders';
SELECT pg_get_expr(prqual, prrelid) AS row_filter, prattrs FROM pg_publication_rel r
  JOIN pg_publication p ON p.oid = r.prpubid WHERE p.pubname = 'pub_orders';
SELECT err($$ALTER PUBLICATION pub_orders SET (publish = 'insert, truncate')$$);
SELECT err($$CREATE PUBLICATION pub_bad FOR TABLE eventgrid.events$$);
SELECT err($$CREATE PUBLICATION pub_bad FOR TABLE eventgrid.events_0 WITH (publish = 'insert')$$);
SELECT err($$CREATE PUBLICATION pub_bad FOR TABLE eventgrid.events_1 WITH (publish = 'insert', publish_via_partition_root = true)$$);
CREATE PUBLICATION pub_ok FOR TABLE eventgrid.events WITH (publish = 'insert', publish_via_partition_root = true);
SELECT err($$ALTER PUBLICATION pub_ok SET TABLE eventgrid.events_2$$);
SELECT err($$ALTER PUBLICATION pub_ok ADD TABLE eventgrid.events_0$$);
SELECT pubname, count(*) AS tables FROM pg_publication_tables WHERE pubname = 'pub_ok' GROUP BY 1;
DROP PUBLICATION pub_ok;
-- the replication role's grants
SELECT err($$SELECT eventgrid.grant_event_replication(NULL)$$);
SELECT err($$SELECT eventgrid.grant_event_replication('no_such_role')$$);
CREATE ROLE regress_replicator LOGIN REPLICATION;
SELECT eventgrid.grant_event_replication('regress_replicator');
SELECT has_table_privilege('regress_replicator', 'eventgrid.events', 'SELECT') AS can_copy,
       has_database_privilege('regress_replicator', current_database(), 'CONNECT') AS can_connect;
CREATE ROLE regress_no_replication LOGIN;
SELECT eventgrid.grant_event_replication('regress_no_replication');
REVOKE ALL ON eventgrid.events FROM regress_replicator, regress_no_replication;
DO $$ BEGIN EXECUTE format('REVOKE ALL ON DATABASE %I FROM regress_replicator, regress_no_replication', current_database()); END $$;
DROP ROLE regress_replicator, regress_no_replication;
DROP PUBLICATION pub_orders;
RESET client_min_messages;
