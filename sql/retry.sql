-- The retry schedule, outcome names, schema conversion and dead-letter shapes
-- (SPEC sections 3, 4 and 7) through the pure SQL functions.

-- Topic profile schedule: 10 s, 30 s, 1 min, 5 min, 10 min, 30 min, 1 h, 3 h, 6 h, then 12 h
SELECT n AS failed_attempt, eventgrid.retry_delay(n) AS delay FROM generate_series(1, 12) AS n;
SELECT eventgrid.retry_delay(30) AS last_step;
-- floors: 408 at least 2 minutes, 503 at least 30 seconds, others the schedule
SELECT s AS status, eventgrid.retry_delay(1, s) AS after_1st, eventgrid.retry_delay(2, s) AS after_2nd,
       eventgrid.retry_delay(5, s) AS after_5th
  FROM unnest(ARRAY[404, 408, 429, 500, 503, 504, 302]) AS s;
-- no retry for 400, 401, 403, 413, and nothing to retry after success
SELECT s AS status, eventgrid.retry_delay(1, s) IS NULL AS not_retried
  FROM unnest(ARRAY[200, 201, 202, 203, 204, 205, 400, 401, 403, 404, 413]) AS s;
SELECT err($$SELECT eventgrid.retry_delay(0)$$);
SELECT err($$SELECT eventgrid.retry_delay(31)$$);
SELECT err($$SELECT eventgrid.retry_delay(1, 99)$$);
SELECT err($$SELECT eventgrid.retry_delay(1, 600)$$);

-- lastDeliveryOutcome per status
SELECT s AS status, eventgrid.delivery_outcome(s) AS outcome
  FROM unnest(ARRAY[200, 204, 205, 400, 401, 403, 404, 408, 413, 429, 500, 503]) AS s;
SELECT err($$SELECT eventgrid.delivery_outcome(1000)$$);

-- SPEC 4 worked example: TTL 30 minutes, 10 attempts allowed.  Attempts at
-- 0 s, 10 s, 40 s, 1 min 40 s, 6 min 40 s, 16 min 40 s; the 7th would be due
-- at 46 min 40 s, past the TTL, so the event is dead-lettered after 6.
WITH RECURSIVE attempt(n, due) AS (
    SELECT 1, interval '0'
  UNION ALL
    SELECT n + 1, due + eventgrid.retry_delay(n, 500) FROM attempt WHERE n < 10 AND due < interval '30 minutes'
)
SELECT n AS attempt, due, CASE WHEN due >= interval '30 minutes' THEN 'TimeToLiveExceeded' ELSE 'sent' END AS what
  FROM attempt;

-- Schema conversion between Event Grid schema and CloudEvents 1.0
SELECT eventgrid.convert_event('{"id": "1", "topic": "shop", "subject": "/a", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z", "data": {"k": null}, "dataVersion": "2", "metadataVersion": "1"}',
                               'EventGridSchema', 'CloudEventSchemaV1_0');
SELECT eventgrid.convert_event('{"id": "1", "source": "/shop", "specversion": "1.0", "type": "T"}',
                               'CloudEventSchemaV1_0', 'EventGridSchema', '2024-05-01 12:00:00+00');
SELECT eventgrid.convert_event('{"a": 1}', 'CustomEventSchema', 'CustomEventSchema');
SELECT eventgrid.convert_event('{"a": 1}', 'CustomEventSchema', 'EventGridSchema') IS NULL AS not_offered;

-- Dead-letter documents per delivery schema (SPEC 7)
INSERT INTO eventgrid.dead_letters (envelope_id, topic, subscription_name, input_schema, event_delivery_schema, event,
       dead_letter_reason, delivery_attempts, last_delivery_outcome, last_http_status_code, publish_time, last_delivery_attempt_time)
VALUES ('8bc07e6f-0885-4729-90e4-7c3f052bd754', 'shop', 'sub-eg', 'EventGridSchema', 'EventGridSchema',
        '{"id": "1", "topic": "shop", "subject": "/a", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z", "data": {"x": 1}, "dataVersion": "", "metadataVersion": "1"}',
        'MaxDeliveryAttemptsExceeded', 1, 'NotFound', 404, '2024-05-01 12:00:01+00', '2024-05-01 12:00:02+00'),
       ('8bc07e6f-0885-4729-90e4-7c3f052bd755', 'ce-shop', 'sub-ce', 'CloudEventSchemaV1_0', 'CloudEventSchemaV1_0',
        '{"id": "c1", "source": "mysource", "specversion": "1.0", "type": "fooEventType", "data": {"prop1": "value1"}}',
        'TimeToLiveExceeded', 3, 'TimedOut', NULL, '2024-05-01 12:00:01+00', '2024-05-01 12:30:02+00'),
       ('8bc07e6f-0885-4729-90e4-7c3f052bd756', 'raw-shop', 'sub-raw', 'CustomEventSchema', 'CustomEventSchema',
        '{"prop1": "my property", "prop2": 5}',
        'NonRetriableError', 1, 'BadRequest', 400, '2024-05-01 12:00:01+00', '2024-05-01 12:00:02+00');
SELECT subscription_name, jsonb_pretty(dead_letter_event) FROM eventgrid.dead_letter_events ORDER BY id;
SELECT err($$INSERT INTO eventgrid.dead_letters (topic, subscription_name, input_schema, event_delivery_schema, event, dead_letter_reason, delivery_attempts, publish_time)
             VALUES ('t', 's', 'EventGridSchema', 'EventGridSchema', '{}', 'Bored', 1, now())$$);

-- Delayed delivery: probation by the outcome that caused it, growth, bounds (SPEC 6)
SELECT o AS outcome, eventgrid.probation_duration(o) AS first,
       eventgrid.probation_duration(o, 2) AS second, eventgrid.probation_duration(o, 3) AS third
  FROM unnest(ARRAY['Busy', 'NotFound', 'SocketError', 'ResolutionError', 'Disabled', 'Full',
                    'TimedOut', 'Unauthorized', 'Forbidden', 'GenericError', 'Aborted']) AS o;
-- outcomes that say nothing about the endpoint: no probation
SELECT o AS outcome, eventgrid.probation_duration(o) IS NULL AS no_probation
  FROM unnest(ARRAY['Delivered', 'BadRequest', 'PayloadTooLarge', 'Probation']) AS o;
-- growth doubles each probation in a row, up to 4 hours
SELECT n AS probation, eventgrid.probation_duration('Busy', n) AS busy, eventgrid.probation_duration('NotFound', n) AS not_found
  FROM generate_series(1, 13) AS n;
SELECT eventgrid.probation_duration('SocketError', 1000) AS longest;
SELECT eventgrid.probation_duration(NULL) IS NULL AS null_in_null_out;
SELECT err($$SELECT eventgrid.probation_duration('busy')$$);
SELECT err($$SELECT eventgrid.probation_duration('Busy', 0)$$);
SELECT err($$SELECT eventgrid.probation_duration('Busy', 1001)$$);

-- Namespace topics (SPEC 4): retries 10 s, 30 s, 1 min, 5 min after the
-- first attempt, then every 5 minutes; retry_delay gives the wait after each
-- failed attempt (the difference between offsets).
SELECT n AS failed_attempt, eventgrid.retry_delay(n, NULL, 'namespace') AS delay
  FROM generate_series(1, 10) AS n;
-- not retried: 400, 401, 403, 404, 413, 414; floors for 408 and 503 as in the topic profile
SELECT s AS status, eventgrid.retry_delay(1, s, 'namespace') AS namespace_after_1st,
       eventgrid.retry_delay(1, s) AS custom_after_1st
  FROM unnest(ARRAY[400, 401, 403, 404, 408, 413, 414, 429, 500, 503]) AS s;
SELECT err($$SELECT eventgrid.retry_delay(11, NULL, 'namespace')$$);
SELECT err($$SELECT eventgrid.retry_delay(1, NULL, 'basic')$$);
-- SPEC 4's namespace worked example: retention 20 minutes, 10 deliveries at most.
-- Attempts at 0 s, 10 s, 30 s, 1 min, 5 min, 10 min, 15 min; the 8th is due
-- at 20 minutes, when the event has expired: it is dead-lettered, not sent.
WITH RECURSIVE attempt(n, due) AS (
    SELECT 1, interval '0'
  UNION ALL
    SELECT n + 1, due + eventgrid.retry_delay(n, 500, 'namespace') FROM attempt
     WHERE n < 10 AND due < interval '20 minutes'
)
SELECT n AS attempt, due, CASE WHEN due >= interval '20 minutes' THEN 'TimeToLiveExceeded' ELSE 'sent' END AS what
  FROM attempt;

-- Dead letters of namespace topics: deadLetterProperties and the event
INSERT INTO eventgrid.dead_letters (topic, subscription_name, input_schema, event_delivery_schema, event,
       dead_letter_reason, delivery_attempts, last_delivery_outcome, last_http_status_code, publish_time,
       last_delivery_attempt_time, topic_type)
VALUES ('ns-shop', 'ns-max', 'CloudEventSchemaV1_0', 'CloudEventSchemaV1_0',
        '{"id": "A234-1234-1234", "source": "/mycontext", "specversion": "1.0", "type": "com.example.someevent", "comexampleextension1": "value1"}',
        'MaxDeliveryAttemptsExceeded', 1, 'GenericError', 500, '2023-11-01 20:33:51.452146+00', '2023-11-01 20:33:52.369207+00', 'namespace'),
       ('ns-shop', 'ns-ttl', 'CloudEventSchemaV1_0', 'CloudEventSchemaV1_0', '{"id": "n2", "source": "/s", "specversion": "1.0", "type": "T"}',
        'TimeToLiveExceeded', 0, NULL, NULL, '2023-11-01 20:33:51+00', NULL, 'namespace'),
       ('ns-shop', 'ns-socket', 'CloudEventSchemaV1_0', 'CloudEventSchemaV1_0', '{"id": "n3", "source": "/s", "specversion": "1.0", "type": "T"}',
        'NonRetriableError', 1, 'SocketError', NULL, '2023-11-01 20:33:51+00', '2023-11-01 20:33:52+00', 'namespace');
SELECT subscription_name, jsonb_pretty(dead_letter_event) FROM eventgrid.dead_letter_events
 WHERE topic = 'ns-shop' ORDER BY id;
