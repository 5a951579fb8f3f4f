-- eventgrid 0.17.0 -> 0.18.0: Event Grid's HTTP data plane (SPEC 16):
-- every topic has two access keys (key1, key2), and the HTTP listener
-- (eventgrid.http_port) serves what the Azure SDKs send: publishing to a
-- custom topic (POST /{database}/topics/{topic}/api/events) and a namespace
-- topic's operations (:publish, and :receive, :acknowledge, :release,
-- :reject, :renewLock of its queue subscriptions), with aeg-sas-key,
-- aeg-sas-token or Authorization: SharedAccessKey.  The listener's
-- connections run as eventgrid_http, which may call eventgrid._http_publish()
-- and eventgrid._http_namespace() and nothing else.

\echo Use "ALTER EXTENSION eventgrid UPDATE TO '0.18.0'" to load this file. \quit

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'eventgrid_http') THEN
        CREATE ROLE eventgrid_http NOLOGIN;
    END IF;
END $$;
COMMENT ON ROLE eventgrid_http IS
    'eventgrid: the role of the HTTP listener''s connections (eventgrid.http_port): may run Event Grid''s data plane (eventgrid._http_publish() and eventgrid._http_namespace(), which check the topic''s access keys) and nothing else. Grant it to no one.';

CREATE FUNCTION eventgrid._new_access_key() RETURNS text
    LANGUAGE sql VOLATILE
    SET search_path TO 'pg_catalog', 'pg_temp'
    RETURN encode(eventgrid._random_bytes(32), 'base64');

COMMENT ON FUNCTION eventgrid._new_access_key() IS 'Internal: a new topic access key: the base64 of 32 bytes from pg_strong_random() (44 characters, as Event Grid''s keys).';
REVOKE ALL ON FUNCTION eventgrid._new_access_key() FROM PUBLIC;

CREATE TABLE eventgrid.topic_access_keys (
    topic text PRIMARY KEY REFERENCES eventgrid.topics (name) ON UPDATE CASCADE ON DELETE CASCADE,
    key1 text NOT NULL DEFAULT eventgrid._new_access_key(),
    key2 text NOT NULL DEFAULT eventgrid._new_access_key(),
    key1_set_at timestamptz NOT NULL DEFAULT now(),
    key2_set_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT topic_access_keys_key1_check CHECK (length(key1) BETWEEN 16 AND 256),
    CONSTRAINT topic_access_keys_key2_check CHECK (length(key2) BETWEEN 16 AND 256)
);
COMMENT ON TABLE eventgrid.topic_access_keys IS 'Internal: the two access keys of each topic (SPEC 16), with which HTTP publishers authenticate (aeg-sas-key, a SAS token, Authorization: SharedAccessKey); readable by the extension''s owner only (eventgrid.topic_keys shows them to eventgrid_admin; regenerate_topic_key() replaces one).';
REVOKE ALL ON TABLE eventgrid.topic_access_keys FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('eventgrid.topic_access_keys', '');
INSERT INTO eventgrid.topic_access_keys (topic) SELECT t.name FROM eventgrid.topics t;

CREATE VIEW eventgrid.topic_keys AS
SELECT k.topic, k.key1, k.key2, k.key1_set_at, k.key2_set_at
  FROM eventgrid.topic_access_keys k;
COMMENT ON VIEW eventgrid.topic_keys IS 'Each topic''s two access keys (SPEC 16): topic, key1, key2 (base64), when each was set. A request to the HTTP listener carrying either key, or a SAS token signed with either, may publish to the topic and receive from its queue subscriptions. Readable by eventgrid_admin; eventgrid.regenerate_topic_key() replaces a key.';
REVOKE ALL ON TABLE eventgrid.topic_keys FROM PUBLIC;
GRANT SELECT ON TABLE eventgrid.topic_keys TO eventgrid_admin;

CREATE FUNCTION eventgrid.regenerate_topic_key(topic text, key_name text) RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    new_key text := eventgrid._new_access_key();
BEGIN
    PERFORM eventgrid._check_not_null('topic', topic);
    PERFORM eventgrid._check_not_null('key_name', key_name);
    IF key_name NOT IN ('key1', 'key2') THEN
        RAISE EXCEPTION 'key_name must be key1 or key2, got %', eventgrid._quote(key_name)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Regenerate one key while clients use the other, then move them over.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = regenerate_topic_key.topic) THEN
        RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(topic) USING ERRCODE = 'undefined_object';
    END IF;
    INSERT INTO eventgrid.topic_access_keys (topic) VALUES (regenerate_topic_key.topic) ON CONFLICT DO NOTHING;
    IF key_name = 'key1' THEN
        UPDATE eventgrid.topic_access_keys k SET key1 = new_key, key1_set_at = now()
         WHERE k.topic = regenerate_topic_key.topic;
    ELSE
        UPDATE eventgrid.topic_access_keys k SET key2 = new_key, key2_set_at = now()
         WHERE k.topic = regenerate_topic_key.topic;
    END IF;
    RETURN new_key;
END $$;

COMMENT ON FUNCTION eventgrid.regenerate_topic_key(topic text, key_name text) IS 'Replaces access key key_name (key1 or key2) of a topic with a new random one (the base64 of 32 bytes from pg_strong_random) and returns it (SPEC 16); requests carrying the old key, or a SAS token signed with it, are refused from the commit on. Requires eventgrid_admin. Errors: 22004 NULL, 22023 key_name not key1 or key2, 42704 no such topic.';
REVOKE ALL ON FUNCTION eventgrid.regenerate_topic_key(topic text, key_name text) FROM PUBLIC;
GRANT ALL ON FUNCTION eventgrid.regenerate_topic_key(topic text, key_name text) TO eventgrid_admin;

-- a new topic gets its keys with it
CREATE OR REPLACE FUNCTION eventgrid.create_topic(name text, input_schema text DEFAULT 'EventGridSchema'::text, topic_type text DEFAULT 'custom'::text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM eventgrid._check_not_null('topic name', name);
    IF NOT eventgrid._is_topic_name(name) THEN
        RAISE EXCEPTION 'invalid topic name %', eventgrid._quote(name)
            USING ERRCODE = 'invalid_name',
                  HINT = 'A topic name has 3 to 50 characters: letters, digits and hyphens.';
    END IF;
    PERFORM eventgrid._check_schema('input_schema', input_schema);
    PERFORM eventgrid._check_not_null('topic_type', topic_type);
    IF topic_type NOT IN ('custom', 'namespace') THEN
        RAISE EXCEPTION 'topic_type must be custom or namespace, got %', eventgrid._quote(topic_type)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'custom: Event Grid''s custom topic delivery profile (the default); namespace: the namespace topic profile.';
    END IF;
    IF topic_type = 'namespace' AND input_schema <> 'CloudEventSchemaV1_0' THEN
        RAISE EXCEPTION 'a namespace topic takes CloudEvents 1.0 only, not %', input_schema
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass input_schema => ''CloudEventSchemaV1_0''.';
    END IF;
    IF EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = create_topic.name) THEN
        RAISE EXCEPTION 'topic "%" already exists', name USING ERRCODE = 'duplicate_object';
    END IF;
    INSERT INTO eventgrid.topics (name, input_schema, topic_type) VALUES (name, input_schema, topic_type);
    INSERT INTO eventgrid.topic_counters (topic) VALUES (name);
    INSERT INTO eventgrid.topic_positions (topic, done) VALUES (name, pg_current_snapshot());
    INSERT INTO eventgrid.topic_access_keys (topic) VALUES (name);
END $$;

COMMENT ON FUNCTION eventgrid.create_topic(name text, input_schema text, topic_type text) IS 'Creates a topic, with two new access keys for HTTP publishers (eventgrid.topic_keys). name: 3-50 letters, digits, hyphens. input_schema: EventGridSchema (default), CloudEventSchemaV1_0 or CustomEventSchema. topic_type: custom (default; the topic delivery profile) or namespace (CloudEvents 1.0 only; its subscriptions get the namespace delivery profile). Requires eventgrid_admin. Errors: 22004 NULL, 42602 bad name, 22023 bad schema or type, 42710 exists. SPEC 1.';

CREATE FUNCTION eventgrid._secret_equal(a text, b text) RETURNS boolean
    LANGUAGE c IMMUTABLE STRICT
    AS 'MODULE_PATHNAME', 'eventgrid_secret_equal';

COMMENT ON FUNCTION eventgrid._secret_equal(a text, b text) IS 'Internal: whether two secrets are equal, compared in time that depends on their length only (CRYPTO_memcmp).';
REVOKE ALL ON FUNCTION eventgrid._secret_equal(a text, b text) FROM PUBLIC;

CREATE FUNCTION eventgrid._sas_token_check(token text, key1 text, key2 text, OUT resource text, OUT expiry text) RETURNS record
    LANGUAGE c STABLE
    AS 'MODULE_PATHNAME', 'eventgrid_sas_token_check';

COMMENT ON FUNCTION eventgrid._sas_token_check(token text, key1 text, key2 text, OUT resource text, OUT expiry text) IS 'Internal: when SAS token "r={resource}&e={expiry}&s={signature}" (each part percent-encoded) is signed with HMAC-SHA256 under key1 or key2 (base64, decoded), the resource and expiry it names, decoded; else NULLs. The caller checks them against the request''s path and the clock.';
REVOKE ALL ON FUNCTION eventgrid._sas_token_check(token text, key1 text, key2 text, OUT resource text, OUT expiry text) FROM PUBLIC;

CREATE FUNCTION eventgrid._http_error(code text, message text) RETURNS text
    LANGUAGE sql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    RETURN jsonb_build_object('error', jsonb_build_object('code', code, 'message', message))::text;

COMMENT ON FUNCTION eventgrid._http_error(code text, message text) IS 'Internal: the body of an error answer of the HTTP data plane, {"error":{"code":code,"message":message}}, as Event Grid''s.';
REVOKE ALL ON FUNCTION eventgrid._http_error(code text, message text) FROM PUBLIC;

CREATE FUNCTION eventgrid._http_authorized(topic text, path text, sas_key text, sas_token text, auth_header text) RETURNS boolean
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    SET "DateStyle" TO 'ISO, MDY'
    SET "TimeZone" TO 'UTC'
    AS $$
DECLARE
    k eventgrid.topic_access_keys;
    given text := sas_key;
    signed record;
    expires timestamptz;
BEGIN
    SELECT * INTO k FROM eventgrid.topic_access_keys a WHERE a.topic = _http_authorized.topic;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF given IS NULL AND auth_header ~* '^SharedAccessKey +' THEN
        given := regexp_replace(auth_header, '^SharedAccessKey +', '', 'i');
    END IF;
    IF given IS NOT NULL THEN
        RETURN eventgrid._secret_equal(given, k.key1) OR eventgrid._secret_equal(given, k.key2);
    END IF;
    IF sas_token IS NULL THEN
        RETURN false;
    END IF;
    signed := eventgrid._sas_token_check(sas_token, k.key1, k.key2);
    -- the resource's path (scheme and host as the client saw them, any query) is the request's
    IF signed.resource IS NULL OR
       rtrim(split_part(regexp_replace(signed.resource, '^[A-Za-z][A-Za-z0-9+.-]*://[^/?]*', ''), '?', 1), '/')
           IS DISTINCT FROM rtrim(path, '/') THEN
        RETURN false;
    END IF;
    BEGIN
        -- 2026-11-27 14:15:33.201349+00:00 (Python) or 11/27/2026 2:15:33 PM (JavaScript), UTC
        expires := signed.expiry::timestamptz;
    EXCEPTION WHEN data_exception THEN
        RETURN false;
    END;
    RETURN expires > clock_timestamp();
END $$;

COMMENT ON FUNCTION eventgrid._http_authorized(topic text, path text, sas_key text, sas_token text, auth_header text) IS 'Internal: whether an HTTP request to path may publish to topic (SPEC 16): its aeg-sas-key header, or its Authorization: SharedAccessKey header, is one of the topic''s keys (compared in constant time); or its aeg-sas-token is signed with one of them, names path as its resource (scheme, host and query aside) and has not expired (its expiry in UTC, as the Azure SDKs write it).';
REVOKE ALL ON FUNCTION eventgrid._http_authorized(topic text, path text, sas_key text, sas_token text, auth_header text) FROM PUBLIC;

CREATE FUNCTION eventgrid._http_publish_events(topic text, events jsonb, OUT status integer, OUT answer text) RETURNS record
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n integer;
    bad integer;
    problem text;
    state text;
BEGIN
    BEGIN
        PERFORM eventgrid.publish(topic, events);
    EXCEPTION WHEN data_exception OR program_limit_exceeded OR null_value_not_allowed THEN
        GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, problem = MESSAGE_TEXT;
        IF state = '54000' THEN
            status := 413;
            answer := eventgrid._http_error('PayloadTooLarge', problem);
            RETURN;
        END IF;
        -- the first event that fails alone (each tried in a subtransaction rolled back)
        n := CASE WHEN jsonb_typeof(events) = 'array' THEN jsonb_array_length(events) ELSE 1 END;
        FOR i IN 0 .. n - 1 LOOP
            BEGIN
                PERFORM eventgrid.publish(topic, CASE WHEN jsonb_typeof(events) = 'array' THEN events -> i ELSE events END);
                RAISE EXCEPTION USING ERRCODE = 'EG000';
            EXCEPTION
                WHEN SQLSTATE 'EG000' THEN NULL;
                WHEN data_exception OR program_limit_exceeded OR null_value_not_allowed THEN
                    GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
                    bad := i;
            END;
            EXIT WHEN bad IS NOT NULL;
        END LOOP;
        status := 400;
        answer := eventgrid._http_error('BadRequest',
            CASE WHEN bad IS NULL THEN problem ELSE format('Event at index %s: %s', bad, problem) END);
        RETURN;
    END;
    status := 200;
    answer := '';
END $$;

COMMENT ON FUNCTION eventgrid._http_publish_events(topic text, events jsonb, OUT status integer, OUT answer text) IS 'Internal: publishes the events of an HTTP request (a JSON array, or one event) to topic, all or none (publish() in a subtransaction): 200 and no body; 400 BadRequest naming the first event that fails alone, its index and field; 413 PayloadTooLarge (over 5000 events or 1 MB).';
REVOKE ALL ON FUNCTION eventgrid._http_publish_events(topic text, events jsonb, OUT status integer, OUT answer text) FROM PUBLIC;

CREATE FUNCTION eventgrid._http_publish(topic text, path text, sas_key text, sas_token text, auth_header text,
                                        content_type text, body text, OUT status integer, OUT answer text) RETURNS record
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    t eventgrid.topics;
    media text := lower(btrim(split_part(coalesce(content_type, ''), ';', 1)));
    events jsonb;
BEGIN
    SELECT * INTO t FROM eventgrid.topics x WHERE x.name = _http_publish.topic AND x.topic_type = 'custom';
    IF NOT FOUND THEN
        status := 404;
        answer := eventgrid._http_error('NotFound', format('No custom topic %s in this database.', eventgrid._quote(topic)));
        RETURN;
    END IF;
    IF NOT eventgrid._http_authorized(topic, path, sas_key, sas_token, auth_header) THEN
        -- never which part was wrong
        status := 401;
        answer := eventgrid._http_error('Unauthorized',
            'The request must carry one of the topic''s access keys (aeg-sas-key, or Authorization: SharedAccessKey) or a shared access signature signed with one (aeg-sas-token) that has not expired.');
        RETURN;
    END IF;
    IF media NOT IN ('application/json', 'application/cloudevents+json', 'application/cloudevents-batch+json') OR
       (media <> 'application/json' AND t.input_schema <> 'CloudEventSchemaV1_0') THEN
        status := 400;
        answer := eventgrid._http_error('BadRequest', format(
            'Content-Type must be %s for topic %s (input schema %s).',
            CASE WHEN t.input_schema = 'CloudEventSchemaV1_0'
                 THEN 'application/cloudevents-batch+json, application/cloudevents+json or application/json'
                 ELSE 'application/json' END,
            eventgrid._quote(topic), t.input_schema));
        RETURN;
    END IF;
    BEGIN
        events := body::jsonb;
    EXCEPTION WHEN data_exception THEN
        status := 400;
        answer := eventgrid._http_error('BadRequest', 'The request body is not valid JSON: ' || SQLERRM);
        RETURN;
    END;
    IF media = 'application/cloudevents+json' THEN
        events := jsonb_build_array(events);
    END IF;
    IF jsonb_typeof(events) <> 'array' AND NOT (t.input_schema = 'CustomEventSchema' AND jsonb_typeof(events) = 'object') THEN
        status := 400;
        answer := eventgrid._http_error('BadRequest', 'The request body must be a JSON array of events.');
        RETURN;
    END IF;
    SELECT p.status, p.answer INTO status, answer FROM eventgrid._http_publish_events(topic, events) p;
END $$;

COMMENT ON FUNCTION eventgrid._http_publish(topic text, path text, sas_key text, sas_token text, auth_header text, content_type text, body text, OUT status integer, OUT answer text) IS 'Internal: a publish request of the HTTP listener to a custom topic (SPEC 16: POST /{database}/topics/{topic}/api/events), run as eventgrid_http: checks the request''s key or SAS token (_http_authorized), its Content-Type against the topic''s input schema and its body (a JSON array of events; one CloudEvent with application/cloudevents+json; one object for CustomEventSchema), and publishes all its events in one transaction or none (_http_publish_events). Returns the HTTP status and the answer''s body: 200 and nothing; 400 BadRequest naming the first bad event''s index and field; 401 Unauthorized; 404 NotFound; 413 PayloadTooLarge (over 5000 events).';
REVOKE ALL ON FUNCTION eventgrid._http_publish(topic text, path text, sas_key text, sas_token text, auth_header text, content_type text, body text, OUT status integer, OUT answer text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid._http_publish(topic text, path text, sas_key text, sas_token text, auth_header text, content_type text, body text, OUT status integer, OUT answer text) TO eventgrid_http;

CREATE FUNCTION eventgrid._http_namespace(topic text, subscription text, operation text, path text, sas_key text,
                                          sas_token text, auth_header text, content_type text, body text,
                                          max_events text, max_wait_time text, release_delay text,
                                          OUT status integer, OUT answer text) RETURNS record
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    media text := lower(btrim(split_part(coalesce(content_type, ''), ';', 1)));
    doc jsonb;
    tokens text[];
    got text[];
    ok boolean[];
    why text[];
    n integer;
    wait integer;
    delay integer;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM eventgrid.topics x WHERE x.name = _http_namespace.topic AND x.topic_type = 'namespace') THEN
        status := 404;
        answer := eventgrid._http_error('NotFound', format('No namespace topic %s in this database.', eventgrid._quote(topic)));
        RETURN;
    END IF;
    IF subscription IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM eventgrid.event_subscriptions s
             WHERE s.topic = _http_namespace.topic AND s.name = _http_namespace.subscription AND s.delivery_mode = 'queue') THEN
        status := 404;
        answer := eventgrid._http_error('NotFound', format('No queue event subscription %s of namespace topic %s.',
                                                           eventgrid._quote(subscription), eventgrid._quote(topic)));
        RETURN;
    END IF;
    IF NOT eventgrid._http_authorized(topic, path, sas_key, sas_token, auth_header) THEN
        status := 401;
        answer := eventgrid._http_error('Unauthorized',
            'The request must carry one of the topic''s access keys (Authorization: SharedAccessKey, or aeg-sas-key) or a shared access signature signed with one (aeg-sas-token) that has not expired.');
        RETURN;
    END IF;
    IF operation = 'receive' THEN
        BEGIN
            n := coalesce(max_events, '1')::integer;
            wait := coalesce(max_wait_time, '60')::integer;
            SELECT coalesce(jsonb_agg(jsonb_build_object(
                       'brokerProperties', jsonb_build_object('lockToken', r.lock_token, 'deliveryCount', r.delivery_count),
                       'event', r.event)), '[]'::jsonb)
              INTO doc FROM eventgrid.receive(topic, subscription, n, wait) r;
        EXCEPTION WHEN data_exception THEN
            status := 400;
            answer := eventgrid._http_error('BadRequest',
                'maxEvents must be 1-100 and maxWaitTime 10-120 (seconds): ' || SQLERRM);
            RETURN;
        END;
        status := 200;
        answer := jsonb_build_object('value', doc)::text;
        RETURN;
    END IF;
    -- the others take a body: one CloudEvent or an array (publish), {"lockTokens": [...]} (settling)
    IF (operation = 'publish' AND media NOT IN ('application/cloudevents+json', 'application/cloudevents-batch+json', 'application/json'))
       OR (operation <> 'publish' AND media <> 'application/json') THEN
        status := 400;
        answer := eventgrid._http_error('BadRequest', CASE WHEN operation = 'publish'
            THEN 'Content-Type must be application/cloudevents+json (one event) or application/cloudevents-batch+json (an array).'
            ELSE 'Content-Type must be application/json.' END);
        RETURN;
    END IF;
    BEGIN
        doc := body::jsonb;
    EXCEPTION WHEN data_exception THEN
        status := 400;
        answer := eventgrid._http_error('BadRequest', 'The request body is not valid JSON: ' || SQLERRM);
        RETURN;
    END;
    IF operation = 'publish' THEN
        IF jsonb_typeof(doc) = 'object' AND media <> 'application/cloudevents-batch+json' THEN
            doc := jsonb_build_array(doc);
        END IF;
        IF jsonb_typeof(doc) <> 'array' THEN
            status := 400;
            answer := eventgrid._http_error('BadRequest', 'The request body must be one CloudEvent or a JSON array of them.');
            RETURN;
        END IF;
        SELECT p.status, CASE WHEN p.status = 200 THEN '{}' ELSE p.answer END INTO status, answer
          FROM eventgrid._http_publish_events(topic, doc) p;
        RETURN;
    END IF;
    IF jsonb_typeof(doc -> 'lockTokens') IS DISTINCT FROM 'array' OR jsonb_array_length(doc -> 'lockTokens') = 0
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(doc -> 'lockTokens') e WHERE jsonb_typeof(e) <> 'string') THEN
        status := 400;
        answer := eventgrid._http_error('BadRequest', 'The request body must be {"lockTokens": [...]}: at least one lock token, each a string.');
        RETURN;
    END IF;
    tokens := ARRAY(SELECT jsonb_array_elements_text(doc -> 'lockTokens'));
    BEGIN
        delay := coalesce(release_delay, '0')::integer;
        IF operation = 'acknowledge' THEN
            SELECT array_agg(x.lock_token), array_agg(x.succeeded), array_agg(x.error) INTO got, ok, why
              FROM eventgrid.acknowledge(topic, subscription, tokens) x;
        ELSIF operation = 'release' THEN
            SELECT array_agg(x.lock_token), array_agg(x.succeeded), array_agg(x.error) INTO got, ok, why
              FROM eventgrid.release(topic, subscription, tokens, delay) x;
        ELSIF operation = 'reject' THEN
            SELECT array_agg(x.lock_token), array_agg(x.succeeded), array_agg(x.error) INTO got, ok, why
              FROM eventgrid.reject(topic, subscription, tokens) x;
        ELSE
            SELECT array_agg(x.lock_token), array_agg(x.succeeded), array_agg(x.error) INTO got, ok, why
              FROM eventgrid.renew_locks(topic, subscription, tokens) x;
        END IF;
        SELECT jsonb_build_object(
                   'succeededLockTokens', coalesce(jsonb_agg(r.tok ORDER BY r.ord) FILTER (WHERE r.ok), '[]'::jsonb),
                   'failedLockTokens', coalesce(jsonb_agg(jsonb_build_object(
                        'lockToken', r.tok,
                        'error', jsonb_build_object('code', split_part(r.why, ': ', 1),
                                                    'message', substr(r.why, length(split_part(r.why, ': ', 1)) + 3)))
                        ORDER BY r.ord) FILTER (WHERE NOT r.ok), '[]'::jsonb))
          INTO doc FROM unnest(got, ok, why) WITH ORDINALITY AS r(tok, ok, why, ord);
    EXCEPTION WHEN data_exception OR program_limit_exceeded THEN
        status := 400;
        answer := eventgrid._http_error('BadRequest', SQLERRM);
        RETURN;
    END;
    status := 200;
    answer := doc::text;
END $$;

COMMENT ON FUNCTION eventgrid._http_namespace(topic text, subscription text, operation text, path text, sas_key text, sas_token text, auth_header text, content_type text, body text, max_events text, max_wait_time text, release_delay text, OUT status integer, OUT answer text) IS 'Internal: a namespace topic''s request of the HTTP listener (SPEC 16), run as eventgrid_http: operation publish (POST /{database}/topics/{topic}:publish: one CloudEvent or a batch, all or none; 200 {}), or for queue event subscription subscription receive (maxEvents, maxWaitTime: receive(); 200 {"value":[{"brokerProperties":{"lockToken","deliveryCount"},"event"}]}), acknowledge, release (releaseDelayInSeconds), reject and renewLock (body {"lockTokens":[...]}; 200 {"succeededLockTokens":[...],"failedLockTokens":[{"lockToken","error":{"code","message"}}]}, also when every token failed). The key or SAS token is checked as for publishing (_http_authorized); 400 BadRequest, 401 Unauthorized, 404 NotFound (no such namespace topic or queue subscription) with Event Grid''s error body.';
REVOKE ALL ON FUNCTION eventgrid._http_namespace(topic text, subscription text, operation text, path text, sas_key text, sas_token text, auth_header text, content_type text, body text, max_events text, max_wait_time text, release_delay text, OUT status integer, OUT answer text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid._http_namespace(topic text, subscription text, operation text, path text, sas_key text, sas_token text, auth_header text, content_type text, body text, max_events text, max_wait_time text, release_delay text, OUT status integer, OUT answer text) TO eventgrid_http;
