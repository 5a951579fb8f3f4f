-- eventgrid 0.12.0 -> 0.13.0: protected receivers, second part: bearer
-- tokens (OAuth 2.0 client credentials and Microsoft Entra ID).
\echo Use "ALTER EXTENSION eventgrid UPDATE" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Delivery authentication: the credentials of a client of a token endpoint,
-- kept where signing secrets are kept (readable by the extension's owner
-- only, dumped with the data).  The workers ask the token endpoint for a
-- token (RFC 6749 4.4) and keep it in shared memory only.
CREATE TABLE eventgrid.delivery_authentications (
    subscription_id bigint PRIMARY KEY REFERENCES eventgrid.event_subscriptions (id) ON DELETE CASCADE,
    method text NOT NULL CHECK (method IN ('oauth2', 'entra')),
    token_endpoint text,
    tenant_id text,
    client_id text NOT NULL,
    client_secret text NOT NULL,
    scope text,
    audience text,
    set_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CHECK ((method = 'oauth2') = (token_endpoint IS NOT NULL)),
    CHECK ((method = 'entra') = (tenant_id IS NOT NULL))
);
REVOKE ALL ON TABLE eventgrid.delivery_authentications FROM PUBLIC;
COMMENT ON TABLE eventgrid.delivery_authentications IS 'Internal: the OAuth 2.0 and Microsoft Entra ID client credentials whose bearer tokens event subscriptions send; readable by the extension''s owner only (eventgrid.event_subscription_authentication shows them without the secret).';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.delivery_authentications', '');

CREATE FUNCTION eventgrid._check_credential_text(field text, val text, max_bytes integer, required boolean)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF val IS NULL THEN
        IF required THEN
            RAISE EXCEPTION '% must not be NULL', field USING ERRCODE = 'null_value_not_allowed';
        END IF;
        RETURN;
    END IF;
    IF val = '' OR octet_length(val) > max_bytes THEN
        RAISE EXCEPTION '% must be 1 to % bytes long, got %', field, max_bytes, octet_length(val)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF val ~ '[\x01-\x1f\x7f]' THEN
        RAISE EXCEPTION '% must not hold control characters', field
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Line breaks and tabs are not part of client ids, secrets, scopes or audiences; check what was pasted.';
    END IF;
END $$;
REVOKE ALL ON FUNCTION eventgrid._check_credential_text(text, text, integer, boolean) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._check_credential_text(text, text, integer, boolean) IS 'Internal: raises 22004 when a required credential field is NULL, 22023 when it is empty, longer than max_bytes or holds a control character (never quoting it).';

CREATE FUNCTION eventgrid._set_delivery_authentication(topic text, subscription text, method text,
        token_endpoint text, tenant_id text, client_id text, client_secret text, scope text, audience text)
    RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, subscription, true);
BEGIN
    PERFORM eventgrid._check_credential_text('client_id', client_id, 500, true);
    PERFORM eventgrid._check_credential_text('client_secret', client_secret, 1000, true);
    PERFORM eventgrid._check_credential_text('scope', scope, 500, false);
    PERFORM eventgrid._check_credential_text('audience', audience, 500, false);
    IF EXISTS (SELECT 1 FROM eventgrid.delivery_properties p
                WHERE p.subscription_id = sid AND lower(p.header) = 'authorization') THEN
        RAISE EXCEPTION 'event subscription % of topic % has an Authorization delivery property',
                        eventgrid._quote(subscription), eventgrid._quote(topic)
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'The bearer token goes in the Authorization header; remove the property first with eventgrid.remove_delivery_property().';
    END IF;
    INSERT INTO eventgrid.delivery_authentications AS a
           (subscription_id, method, token_endpoint, tenant_id, client_id, client_secret, scope, audience)
    VALUES (sid, method, token_endpoint, tenant_id, client_id, client_secret, scope, audience)
    ON CONFLICT (subscription_id) DO UPDATE
       SET method = excluded.method, token_endpoint = excluded.token_endpoint, tenant_id = excluded.tenant_id,
           client_id = excluded.client_id, client_secret = excluded.client_secret, scope = excluded.scope,
           audience = excluded.audience, set_at = clock_timestamp();
END $$;
REVOKE ALL ON FUNCTION eventgrid._set_delivery_authentication(text, text, text, text, text, text, text, text, text) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._set_delivery_authentication(text, text, text, text, text, text, text, text, text) IS 'Internal: checks and stores the delivery authentication of an event subscription for set_oauth2_authentication() and set_entra_authentication(); refuses (55000) one whose subscription has an Authorization delivery property.';

CREATE FUNCTION eventgrid.set_oauth2_authentication(topic text, subscription text, token_endpoint text,
        client_id text, client_secret text, scope text DEFAULT NULL, audience text DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM eventgrid._check_not_null('token_endpoint', token_endpoint);
    PERFORM eventgrid._check_endpoint(token_endpoint);
    IF octet_length(token_endpoint) > 1000 THEN
        RAISE EXCEPTION 'token_endpoint must be at most 1000 bytes long, got %', octet_length(token_endpoint)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF token_endpoint !~* '^https://' AND token_endpoint !~* '^http://(127\.0\.0\.1|localhost|\[::1\])(:[0-9]+)?(/|$)' THEN
        RAISE EXCEPTION 'token_endpoint % must be an https URL', eventgrid._quote(token_endpoint)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The client secret goes to it: plain http is allowed only to this machine (127.0.0.1, localhost, [::1]), for tests.';
    END IF;
    PERFORM eventgrid._set_delivery_authentication(topic, subscription, 'oauth2', token_endpoint, NULL,
                                                   client_id, client_secret, scope, audience);
END $$;
REVOKE ALL ON FUNCTION eventgrid.set_oauth2_authentication(text, text, text, text, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.set_oauth2_authentication(text, text, text, text, text, text, text) TO eventgrid_admin;
COMMENT ON FUNCTION eventgrid.set_oauth2_authentication(text, text, text, text, text, text, text) IS 'Makes every request of an event subscription (deliveries, retries, batches, validation handshakes) carry Authorization: Bearer <access token>, the token got from token_endpoint (an http or https URL of at most 1000 bytes) with the OAuth 2.0 client-credentials grant (RFC 6749 4.4); http only to 127.0.0.1, localhost or [::1]: client_id and client_secret (1-500 and 1-1000 bytes) sent with HTTP Basic, scope and audience (each at most 500 bytes, NULL: not sent) in the form. A token serves until expires_in less min(10 %, 60 s), shared by the subscriptions with the same endpoint, client, scope and audience; a 401 to a token that was not new drops it and sends the event again at once. SPEC 12. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription, 22023 a bad URL or field, 55000 the subscription has an Authorization delivery property.';

CREATE FUNCTION eventgrid.set_entra_authentication(topic text, subscription text, tenant_id text,
        application_id_or_uri text, client_id text, client_secret text)
    RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM eventgrid._check_not_null('tenant_id', tenant_id);
    PERFORM eventgrid._check_not_null('application_id_or_uri', application_id_or_uri);
    IF tenant_id !~ '^[A-Za-z0-9][A-Za-z0-9.-]{0,99}$' THEN
        RAISE EXCEPTION 'invalid tenant_id %', eventgrid._quote(tenant_id)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Give the directory (tenant) ID, a GUID, or a domain name of the tenant such as contoso.onmicrosoft.com.';
    END IF;
    IF octet_length(application_id_or_uri) > 480 OR application_id_or_uri !~ '^[!-~]+$' THEN
        RAISE EXCEPTION 'invalid application_id_or_uri %', eventgrid._quote(application_id_or_uri)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Give the application (client) ID or the application ID URI of the receiver''s app registration, such as api://orders-webhook: 1 to 480 printable characters without spaces.';
    END IF;
    PERFORM eventgrid._set_delivery_authentication(topic, subscription, 'entra', NULL, tenant_id, client_id,
                                                   client_secret, rtrim(application_id_or_uri, '/') || '/.default', NULL);
END $$;
REVOKE ALL ON FUNCTION eventgrid.set_entra_authentication(text, text, text, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.set_entra_authentication(text, text, text, text, text, text) TO eventgrid_admin;
COMMENT ON FUNCTION eventgrid.set_entra_authentication(text, text, text, text, text, text) IS 'Makes every request of an event subscription carry a Microsoft Entra ID bearer token, as Event Grid does for Entra-protected endpoints: the client-credentials grant at {eventgrid.entra_authority}/{tenant_id}/oauth2/v2.0/token for scope {application_id_or_uri}/.default, client_id and client_secret sent in the form. tenant_id: a GUID or domain (1-100 characters); application_id_or_uri: the receiver app''s ID or ID URI (1-480 printable characters). Otherwise as set_oauth2_authentication(). SPEC 12. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription, 22023 a bad field, 55000 the subscription has an Authorization delivery property.';

CREATE FUNCTION eventgrid.remove_delivery_authentication(topic text, subscription text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM eventgrid.delivery_authentications a
     WHERE a.subscription_id = eventgrid._subscription_id(topic, subscription, true);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'event subscription % of topic % has no delivery authentication', eventgrid._quote(subscription), eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object', HINT = 'eventgrid.event_subscription_authentication lists the subscriptions that have one.';
    END IF;
END $$;
REVOKE ALL ON FUNCTION eventgrid.remove_delivery_authentication(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.remove_delivery_authentication(text, text) TO eventgrid_admin;
COMMENT ON FUNCTION eventgrid.remove_delivery_authentication(text, text) IS 'Removes the delivery authentication (OAuth 2.0 or Entra ID) of an event subscription: its requests carry no bearer token from the next claim on. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription or none set.';

-- an Authorization delivery property and delivery authentication exclude each other
CREATE OR REPLACE FUNCTION eventgrid._put_delivery_property(p_topic text, p_subscription text, p_header text, p_value text, p_source_field text, p_is_secret boolean) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(p_topic, p_subscription, true);
    problem text;
BEGIN
    PERFORM eventgrid._check_not_null('header', p_header);
    PERFORM eventgrid._check_not_null('is_secret', p_is_secret);
    IF p_source_field IS NULL AND p_value IS NULL THEN
        RAISE EXCEPTION 'delivery property value must not be NULL'
            USING ERRCODE = 'null_value_not_allowed',
                  HINT = 'Remove a header with eventgrid.remove_delivery_property().';
    END IF;
    IF lower(p_header) LIKE 'aeg-%' THEN
        RAISE EXCEPTION 'delivery property header name % must not start with "aeg-"', eventgrid._quote(p_header)
            USING ERRCODE = 'reserved_name', HINT = 'Headers starting with aeg- are set by eventgrid itself.';
    END IF;
    IF lower(p_header) = 'authorization'
       AND EXISTS (SELECT 1 FROM eventgrid.delivery_authentications a WHERE a.subscription_id = sid) THEN
        RAISE EXCEPTION 'event subscription % of topic % sends bearer tokens: it cannot have an Authorization delivery property',
                        eventgrid._quote(p_subscription), eventgrid._quote(p_topic)
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Its Authorization header carries the token of its delivery authentication; remove that first with eventgrid.remove_delivery_authentication().';
    END IF;
    IF octet_length(p_value) > 4096 THEN
        RAISE EXCEPTION 'delivery property value of header % is % bytes; at most 4096 bytes are allowed',
                        eventgrid._quote(p_header), octet_length(p_value)
            USING ERRCODE = 'string_data_right_truncation';
    END IF;
    problem := eventgrid._header_problem(p_header, p_value);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'invalid delivery property %: %', eventgrid._quote(p_header), problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Names are HTTP tokens of at most 256 characters other than Content-Length, Transfer-Encoding, Host, Connection, Upgrade, TE, Trailer, Expect, Keep-Alive, Content-Type and Proxy-*; values hold no control characters.';
    END IF;
    IF p_source_field IS NOT NULL AND NOT eventgrid._is_source_field(p_source_field) THEN
        RAISE EXCEPTION 'invalid source_field %', eventgrid._quote(p_source_field)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Name a field of the event as a dotted path such as data.orderId (at most 512 characters).';
    END IF;
    INSERT INTO eventgrid.delivery_properties AS p (subscription_id, header, value, source_field, is_secret)
    VALUES (sid, p_header, p_value, p_source_field, p_is_secret)
    ON CONFLICT (subscription_id, lower(header)) DO UPDATE
        SET header = EXCLUDED.header, value = EXCLUDED.value,
            source_field = EXCLUDED.source_field, is_secret = EXCLUDED.is_secret;
    IF (SELECT count(*) FROM eventgrid.delivery_properties p WHERE p.subscription_id = sid) > 10 THEN
        RAISE EXCEPTION 'event subscription "%" of topic "%" would have more than 10 delivery properties',
                        p_subscription, p_topic
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Remove one with eventgrid.remove_delivery_property() first.';
    END IF;
END $$;

CREATE FUNCTION eventgrid._delivery_tokens(OUT token_endpoint text, OUT client_id text, OUT scope text,
        OUT audience text, OUT token_obtained_at timestamptz, OUT token_expires_at timestamptz,
        OUT token_serves_until timestamptz,
        OUT token_requests bigint, OUT token_failures bigint, OUT last_failure_at timestamptz,
        OUT last_error text)
    RETURNS SETOF record
    LANGUAGE c VOLATILE
    AS 'MODULE_PATHNAME', 'eventgrid_delivery_tokens';
REVOKE ALL ON FUNCTION eventgrid._delivery_tokens() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid._delivery_tokens() TO eventgrid_admin, pg_monitor;
COMMENT ON FUNCTION eventgrid._delivery_tokens() IS 'Internal: the bearer tokens this database''s workers keep in shared memory, per token endpoint, client, scope and audience: when obtained, when they expire, until when they serve, token requests and failures counted since the slot was made, the last failure; never a token or secret.';

CREATE VIEW eventgrid.event_subscription_authentication AS
 SELECT s.topic,
    s.name AS subscription,
    a.method,
    e.token_endpoint,
    a.client_id,
    a.scope,
    a.audience,
    a.set_at,
    t.token_obtained_at,
    t.token_expires_at,
    t.token_serves_until,
    coalesce(t.token_requests, 0) AS token_requests,
    coalesce(t.token_failures, 0) AS token_failures,
    t.last_failure_at,
    t.last_error
   FROM eventgrid.delivery_authentications a
     JOIN eventgrid.event_subscriptions s ON s.id = a.subscription_id
     CROSS JOIN LATERAL (SELECT CASE a.method WHEN 'entra'
              THEN rtrim(current_setting('eventgrid.entra_authority', true), '/') || '/' || a.tenant_id || '/oauth2/v2.0/token'
              ELSE a.token_endpoint END AS token_endpoint) e
     LEFT JOIN LATERAL (SELECT d.* FROM eventgrid._delivery_tokens() d
            WHERE d.token_endpoint = e.token_endpoint AND d.client_id = a.client_id
              AND d.scope IS NOT DISTINCT FROM a.scope AND d.audience IS NOT DISTINCT FROM a.audience) t ON true;
GRANT SELECT ON eventgrid.event_subscription_authentication TO eventgrid_admin;
COMMENT ON VIEW eventgrid.event_subscription_authentication IS 'The event subscriptions that send bearer tokens (SPEC 12): topic, subscription, method (oauth2 or entra), token_endpoint, client_id, scope, audience, set_at, and from the workers'' shared memory token_obtained_at, token_expires_at and token_serves_until (expires_in less min(10 %, 60 s); NULL: no token now), token_requests and token_failures (since the server started or the token was last asked for after a while unused), last_failure_at and last_error (what the token endpoint answered; NULL once a token came); never the secret or a token. Readable by eventgrid_admin.';

-- ---------------------------------------------------------------------------
-- Token requests for Prometheus (monitoring/)
CREATE VIEW eventgrid.delivery_token_metrics AS
 SELECT d.token_endpoint,
    d.client_id,
    d.token_requests AS token_requests_total,
    d.token_failures AS token_failures_total,
    coalesce(extract(epoch FROM d.token_expires_at)::double precision, 0) AS token_expiry_timestamp_seconds
   FROM eventgrid._delivery_tokens() d;
GRANT SELECT ON eventgrid.delivery_token_metrics TO pg_monitor, eventgrid_admin;
COMMENT ON VIEW eventgrid.delivery_token_metrics IS 'Prometheus counters per token endpoint and client of delivery authentication: token_requests_total and token_failures_total (since the server started), and token_expiry_timestamp_seconds, when the token now kept expires (0: none). Readable by pg_monitor and eventgrid_admin. README "Monitoring".';

-- ---------------------------------------------------------------------------
-- Ordered delivery per key (SPEC 13).  An ordered event
-- subscription's events leave the event stream for its retries table as
-- soon as a claim sees them (_position_to_retries), in publish order (the
-- retries' id), each with its key; of each key only the oldest row is ever
-- due (its head), the others wait with next_attempt_at 'infinity' until the
-- head is delivered, dead-lettered or dropped (_promote_ordering_keys); the
-- heads are kept in eventgrid.ordering_keys.
-- A transfer holds the subscription's position; a transfer and a
-- promotion meet on the key's row of eventgrid.ordering_keys.
ALTER TABLE eventgrid.event_subscriptions ADD COLUMN ordering_key text
    CONSTRAINT event_subscriptions_ordering_key_check CHECK (eventgrid._is_source_field(ordering_key));
COMMENT ON COLUMN eventgrid.event_subscriptions.ordering_key IS 'Ordered delivery per key (SPEC 13): the dotted field path of each event whose value (a string, number or boolean) is its key; events of one key are delivered one at a time in publish order. NULL: unordered.';

ALTER TABLE eventgrid.retries ADD COLUMN ordering_key text,
    ADD COLUMN ordering_key_hash bigint GENERATED ALWAYS AS (hashtextextended(ordering_key, 0)) STORED;
COMMENT ON COLUMN eventgrid.retries.ordering_key IS 'For an ordered event subscription: the event''s key (NULL: it has none and goes unordered). Of the rows of one key only the one with the lowest id is ever due; the others wait with next_attempt_at ''infinity''.';
COMMENT ON COLUMN eventgrid.retries.ordering_key_hash IS 'Internal: the hash the rows of one key are found by (keys of equal hash wait for each other).';
CREATE INDEX retries_ordering_idx ON eventgrid.retries (subscription_id, ordering_key_hash, id)
    WHERE ordering_key IS NOT NULL;

CREATE FUNCTION eventgrid._ordering_key(event jsonb, path text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN CASE WHEN jsonb_typeof(event #> string_to_array(path, '.')) IN ('string', 'number', 'boolean')
                THEN event #>> string_to_array(path, '.') END;
REVOKE ALL ON FUNCTION eventgrid._ordering_key(jsonb, text) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._ordering_key(jsonb, text) IS 'Internal: the ordering key of an event: the value at the dotted field path when it is a string, number or boolean (as text), else NULL (unordered).';

-- The key of each ordered subscription that has rows in its retries, and
-- the one of them that is due or in flight (its head).  Found by primary
-- key: the retries of a key that went are dead rows an index scan by key
-- would visit one by one until VACUUM.
CREATE TABLE eventgrid.ordering_keys (
    subscription_id bigint NOT NULL REFERENCES eventgrid.event_subscriptions (id) ON DELETE CASCADE,
    ordering_key_hash bigint NOT NULL,
    head_id bigint NOT NULL,
    PRIMARY KEY (subscription_id, ordering_key_hash)
);
REVOKE ALL ON TABLE eventgrid.ordering_keys FROM PUBLIC;
COMMENT ON TABLE eventgrid.ordering_keys IS 'Internal: per ordered event subscription, each key with events in its retries and the id of the one due or in flight (head_id); the others of the key wait with next_attempt_at ''infinity''. Read it through eventgrid.blocked_ordering_keys.';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.ordering_keys', '');

CREATE FUNCTION eventgrid._start_ordering_keys(sids bigint[], key_hashes bigint[], ids bigint[], due timestamptz)
    RETURNS integer
    LANGUAGE sql
    BEGIN ATOMIC
    WITH firsts AS (
        SELECT k.sid, k.h, min(k.id) AS id FROM unnest(sids, key_hashes, ids) AS k(sid, h, id) GROUP BY k.sid, k.h
    ), started AS (
        -- a key that has a head keeps it (its row locked, as a promotion locks it: one waits for
        -- the other); one that had none, or whose promotion just found nothing left, starts here
        INSERT INTO eventgrid.ordering_keys AS k (subscription_id, ordering_key_hash, head_id)
        SELECT f.sid, f.h, f.id FROM firsts f ORDER BY f.sid, f.h
        ON CONFLICT (subscription_id, ordering_key_hash) DO UPDATE SET head_id = k.head_id
        RETURNING k.head_id, k.xmax = 0 AS started
    ), due_now AS (
        UPDATE eventgrid.retries r SET next_attempt_at = due FROM started
         WHERE started.started AND r.id = started.head_id RETURNING 1
    )
    SELECT count(*)::integer FROM due_now;
END;
REVOKE ALL ON FUNCTION eventgrid._start_ordering_keys(bigint[], bigint[], bigint[], timestamptz) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._start_ordering_keys(bigint[], bigint[], bigint[], timestamptz) IS 'Internal: retries ids (subscription sids, key key_hashes) were just written waiting (next_attempt_at ''infinity''): of each key that had no head, the oldest becomes its head, due at due; returns how many. Locks the keys'' rows of eventgrid.ordering_keys, in order, as _promote_ordering_keys does.';

CREATE FUNCTION eventgrid._promote_ordering_keys(sids bigint[], key_hashes bigint[], finished_ids bigint[],
                                                 due timestamptz)
    RETURNS integer
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    n integer;
BEGIN
    -- first the keys' rows, in order: a transfer adding to a key holds its row until it commits,
    -- and what it added is seen by the next statement
    PERFORM 1 FROM eventgrid.ordering_keys k
      JOIN unnest(sids, key_hashes) AS f(sid, h) ON k.subscription_id = f.sid AND k.ordering_key_hash = f.h
     ORDER BY k.subscription_id, k.ordering_key_hash FOR UPDATE OF k;
    WITH f AS (
        SELECT * FROM unnest(sids, key_hashes, finished_ids) AS f(sid, h, id)
    ), nxt AS (
        -- the key's next row: after the finished one, past the dead rows of those before
        SELECT f.sid, f.h, n.id
          FROM f LEFT JOIN LATERAL (SELECT r.id FROM eventgrid.retries r
                                     WHERE r.subscription_id = f.sid AND r.ordering_key_hash = f.h
                                       AND r.ordering_key IS NOT NULL AND r.id > f.id
                                     ORDER BY r.id LIMIT 1) n ON true
    ), gone AS (
        DELETE FROM eventgrid.ordering_keys k USING nxt
         WHERE k.subscription_id = nxt.sid AND k.ordering_key_hash = nxt.h AND nxt.id IS NULL
    ), moved AS (
        INSERT INTO eventgrid.ordering_keys AS k (subscription_id, ordering_key_hash, head_id)
        SELECT nxt.sid, nxt.h, nxt.id FROM nxt WHERE nxt.id IS NOT NULL ORDER BY nxt.sid, nxt.h
        ON CONFLICT (subscription_id, ordering_key_hash) DO UPDATE SET head_id = EXCLUDED.head_id
        RETURNING k.head_id
    ), due_now AS (
        UPDATE eventgrid.retries r SET next_attempt_at = due FROM moved
         WHERE r.id = moved.head_id AND r.next_attempt_at = 'infinity' RETURNING 1
    )
    SELECT count(*)::integer INTO n FROM due_now;
    RETURN n;
END $$;
REVOKE ALL ON FUNCTION eventgrid._promote_ordering_keys(bigint[], bigint[], bigint[], timestamptz) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._promote_ordering_keys(bigint[], bigint[], bigint[], timestamptz) IS 'Internal: the heads finished_ids of keys key_hashes of subscriptions sids were delivered, dead-lettered or dropped (and deleted in this transaction): the next row of each key becomes its head, due at due, or the key is forgotten when none is left; returns how many became due. Locks the keys'' rows first, so that a transfer adding to a key (_start_ordering_keys) has committed and is seen.';

CREATE OR REPLACE FUNCTION eventgrid._position_to_retries(sid bigint, due timestamp with time zone, keep boolean)
    RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    snap pg_snapshot := pg_current_snapshot();
    n bigint := 0;
    path text;
    hashes bigint[];
    ids bigint[];
BEGIN
    IF keep THEN
        SELECT s.ordering_key INTO path FROM eventgrid.event_subscriptions s WHERE s.id = sid;
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
COMMENT ON FUNCTION eventgrid._position_to_retries(sid bigint, due timestamp with time zone, keep boolean) IS 'Internal: moves an event subscription''s position to the current snapshot; with keep, the committed events it passes that match its filters become its retries (no attempt made, due at due) first, in publish order, else they are passed over; of an ordered subscription each with its key, due only when it is the oldest of its key (_start_ordering_keys). Returns how many became retries. The upkeep worker calls it for held subscriptions whose events would keep an event table from being emptied, a delivery worker''s claim for ordered ones; the caller holds the position''s lock.';


CREATE FUNCTION eventgrid._check_ordering_key(ordering_key text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF ordering_key IS NOT NULL AND NOT eventgrid._is_source_field(ordering_key) THEN
        RAISE EXCEPTION 'invalid ordering_key %', eventgrid._quote(left(ordering_key, 100))
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'ordering_key is a dotted field path of 1 to 512 characters, such as subject, data.orderId or partitionkey.';
    END IF;
END $$;
REVOKE ALL ON FUNCTION eventgrid._check_ordering_key(text) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._check_ordering_key(text) IS 'Internal: raises 22023 for an ordering_key that is not a dotted field path of at most 512 characters.';

-- create_event_subscription() and update_event_subscription() take ordering_key
DROP FUNCTION eventgrid.create_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text, text);
DROP FUNCTION eventgrid.update_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text, text);
CREATE FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text, event_delivery_schema text DEFAULT NULL::text, included_event_types text[] DEFAULT NULL::text[], subject_begins_with text DEFAULT NULL::text, subject_ends_with text DEFAULT NULL::text, is_subject_case_sensitive boolean DEFAULT false, max_delivery_attempts integer DEFAULT NULL::integer, event_ttl integer DEFAULT NULL::integer, max_events_per_batch integer DEFAULT NULL::integer, preferred_batch_size_in_kilobytes integer DEFAULT NULL::integer, deadletter boolean DEFAULT false, advanced_filters jsonb DEFAULT NULL::jsonb, enable_advanced_filtering_on_arrays boolean DEFAULT false, max_delivery_count integer DEFAULT NULL::integer, event_time_to_live text DEFAULT NULL::text, max_events_per_second integer DEFAULT NULL::integer, endpoint_validation text DEFAULT 'none'::text, dead_letter_topic text DEFAULT NULL::text, ordering_key text DEFAULT NULL::text) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    in_schema text;
    ttype text;
    attempts integer;
    ttl integer;
    sid bigint;
BEGIN
    PERFORM eventgrid._check_not_null('topic', topic);
    SELECT t.input_schema, t.topic_type INTO in_schema, ttype
      FROM eventgrid.topics t WHERE t.name = topic FOR KEY SHARE;
    IF in_schema IS NULL THEN
        RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object', HINT = 'Create it first with eventgrid.create_topic().';
    END IF;
    IF name IS NULL OR endpoint IS NULL THEN
        RAISE EXCEPTION 'event subscription name and endpoint must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT eventgrid._is_subscription_name(name) THEN
        RAISE EXCEPTION 'invalid event subscription name %', eventgrid._quote(name)
            USING ERRCODE = 'invalid_name',
                  HINT = 'An event subscription name has 3 to 64 characters: letters, digits and hyphens.';
    END IF;
    event_delivery_schema := coalesce(event_delivery_schema, in_schema);
    PERFORM eventgrid._check_subscription_settings(in_schema, ttype, endpoint, event_delivery_schema,
        included_event_types, is_subject_case_sensitive, deadletter, enable_advanced_filtering_on_arrays,
        max_events_per_batch, preferred_batch_size_in_kilobytes, max_events_per_second);
    SELECT r.attempts, r.ttl INTO attempts, ttl
      FROM eventgrid._retry_policy_args(ttype, max_delivery_attempts, event_ttl, max_delivery_count,
                                        event_time_to_live) r;
    advanced_filters := eventgrid._advanced_filters_arg(advanced_filters);
    PERFORM eventgrid._check_endpoint_validation(endpoint_validation);
    PERFORM eventgrid._check_dead_letter_topic(dead_letter_topic);
    PERFORM eventgrid._check_ordering_key(ordering_key);
    IF EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s
                WHERE s.topic = create_event_subscription.topic AND s.name = create_event_subscription.name) THEN
        RAISE EXCEPTION 'event subscription "%" already exists for topic "%"', name, topic
            USING ERRCODE = 'duplicate_object';
    END IF;
    INSERT INTO eventgrid.event_subscriptions AS s
        (topic, name, endpoint, event_delivery_schema, included_event_types, subject_begins_with,
         subject_ends_with, is_subject_case_sensitive, max_delivery_attempts, event_ttl,
         max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter, topic_type,
         advanced_filters, enable_advanced_filtering_on_arrays, max_events_per_second, dead_letter_topic, ordering_key)
    VALUES (topic, name, endpoint, event_delivery_schema, included_event_types, subject_begins_with,
            subject_ends_with, is_subject_case_sensitive, coalesce(attempts, CASE ttype WHEN 'namespace' THEN 10 ELSE 30 END),
            coalesce(ttl, CASE ttype WHEN 'namespace' THEN 10080 ELSE 1440 END),
            max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter, ttype,
            advanced_filters, enable_advanced_filtering_on_arrays, max_events_per_second, dead_letter_topic, ordering_key)
    RETURNING s.id INTO sid;
    INSERT INTO eventgrid.subscription_counters (subscription_id) VALUES (sid);
    -- events of transactions that commit after this one's snapshot are for it
    INSERT INTO eventgrid.subscription_positions (subscription_id, since, done)
    VALUES (sid, pg_current_snapshot(), pg_current_snapshot());
    IF endpoint_validation = 'handshake' THEN
        -- nothing is delivered until the endpoint answers the handshake
        PERFORM eventgrid._start_validation(sid);
        PERFORM eventgrid._wake_worker_at_commit();
    END IF;
    RETURN sid;
END $$;
CREATE FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text DEFAULT NULL::text, event_delivery_schema text DEFAULT NULL::text, included_event_types text[] DEFAULT NULL::text[], subject_begins_with text DEFAULT NULL::text, subject_ends_with text DEFAULT NULL::text, is_subject_case_sensitive boolean DEFAULT NULL::boolean, max_delivery_attempts integer DEFAULT NULL::integer, event_ttl integer DEFAULT NULL::integer, max_events_per_batch integer DEFAULT NULL::integer, preferred_batch_size_in_kilobytes integer DEFAULT NULL::integer, deadletter boolean DEFAULT NULL::boolean, advanced_filters jsonb DEFAULT NULL::jsonb, enable_advanced_filtering_on_arrays boolean DEFAULT NULL::boolean, max_delivery_count integer DEFAULT NULL::integer, event_time_to_live text DEFAULT NULL::text, max_events_per_second integer DEFAULT NULL::integer, endpoint_validation text DEFAULT NULL::text, dead_letter_topic text DEFAULT NULL::text, ordering_key text DEFAULT NULL::text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, name, true);
    cur eventgrid.event_subscriptions;
    in_schema text;
    attempts integer;
    ttl integer;
BEGIN
    SELECT s.* INTO cur FROM eventgrid.event_subscriptions s WHERE s.id = sid;
    SELECT t.input_schema INTO in_schema FROM eventgrid.topics t WHERE t.name = cur.topic;
    -- NULL keeps a setting; an empty array, '' or 0 clears one that may be unset
    endpoint := coalesce(endpoint, cur.endpoint);
    event_delivery_schema := coalesce(event_delivery_schema, cur.event_delivery_schema);
    included_event_types := CASE WHEN included_event_types IS NULL THEN cur.included_event_types
                                 WHEN cardinality(included_event_types) = 0 THEN NULL
                                 ELSE included_event_types END;
    subject_begins_with := CASE WHEN subject_begins_with IS NULL THEN cur.subject_begins_with
                                ELSE nullif(subject_begins_with, '') END;
    subject_ends_with := CASE WHEN subject_ends_with IS NULL THEN cur.subject_ends_with
                              ELSE nullif(subject_ends_with, '') END;
    is_subject_case_sensitive := coalesce(is_subject_case_sensitive, cur.is_subject_case_sensitive);
    deadletter := coalesce(deadletter, cur.deadletter);
    enable_advanced_filtering_on_arrays := coalesce(enable_advanced_filtering_on_arrays,
                                                    cur.enable_advanced_filtering_on_arrays);
    max_events_per_batch := CASE WHEN max_events_per_batch IS NULL THEN cur.max_events_per_batch
                                 ELSE nullif(max_events_per_batch, 0) END;
    preferred_batch_size_in_kilobytes := CASE WHEN preferred_batch_size_in_kilobytes IS NULL
                                              THEN cur.preferred_batch_size_in_kilobytes
                                              ELSE nullif(preferred_batch_size_in_kilobytes, 0) END;
    max_events_per_second := CASE WHEN max_events_per_second IS NULL THEN cur.max_events_per_second
                                  ELSE nullif(max_events_per_second, 0) END;
    PERFORM eventgrid._check_subscription_settings(in_schema, cur.topic_type, endpoint, event_delivery_schema,
        included_event_types, is_subject_case_sensitive, deadletter, enable_advanced_filtering_on_arrays,
        max_events_per_batch, preferred_batch_size_in_kilobytes, max_events_per_second);
    SELECT r.attempts, r.ttl INTO attempts, ttl
      FROM eventgrid._retry_policy_args(cur.topic_type, max_delivery_attempts, event_ttl, max_delivery_count,
                                        event_time_to_live) r;
    advanced_filters := CASE WHEN advanced_filters IS NULL THEN cur.advanced_filters
                             ELSE eventgrid._advanced_filters_arg(advanced_filters) END;
    IF endpoint_validation IS NOT NULL THEN
        PERFORM eventgrid._check_endpoint_validation(endpoint_validation);
    END IF;
    dead_letter_topic := CASE WHEN dead_letter_topic IS NULL THEN cur.dead_letter_topic
                              ELSE nullif(dead_letter_topic, '') END;
    PERFORM eventgrid._check_dead_letter_topic(dead_letter_topic);
    ordering_key := CASE WHEN ordering_key IS NULL THEN cur.ordering_key ELSE nullif(ordering_key, '') END;
    PERFORM eventgrid._check_ordering_key(ordering_key);
    IF ordering_key IS DISTINCT FROM cur.ordering_key THEN
        -- after the claim or record that holds the position: events it moved are in the retries
        PERFORM 1 FROM eventgrid.subscription_positions p WHERE p.subscription_id = sid FOR UPDATE;
        IF ordering_key IS NULL THEN
            -- unordered from now on: what waited for its key is due at once
            UPDATE eventgrid.retries r
               SET ordering_key = NULL,
                   next_attempt_at = CASE WHEN r.next_attempt_at = 'infinity' THEN eventgrid._now()
                                          ELSE r.next_attempt_at END
             WHERE r.subscription_id = sid AND r.ordering_key IS NOT NULL;
            DELETE FROM eventgrid.ordering_keys k WHERE k.subscription_id = sid;
        END IF;
    END IF;
    UPDATE eventgrid.event_subscriptions s
       SET endpoint = update_event_subscription.endpoint,
           event_delivery_schema = update_event_subscription.event_delivery_schema,
           included_event_types = update_event_subscription.included_event_types,
           subject_begins_with = update_event_subscription.subject_begins_with,
           subject_ends_with = update_event_subscription.subject_ends_with,
           is_subject_case_sensitive = update_event_subscription.is_subject_case_sensitive,
           max_delivery_attempts = coalesce(attempts, s.max_delivery_attempts),
           event_ttl = coalesce(ttl, s.event_ttl),
           max_events_per_batch = update_event_subscription.max_events_per_batch,
           preferred_batch_size_in_kilobytes = update_event_subscription.preferred_batch_size_in_kilobytes,
           deadletter = update_event_subscription.deadletter,
           advanced_filters = update_event_subscription.advanced_filters,
           enable_advanced_filtering_on_arrays = update_event_subscription.enable_advanced_filtering_on_arrays,
           max_events_per_second = update_event_subscription.max_events_per_second,
           dead_letter_topic = update_event_subscription.dead_letter_topic,
           ordering_key = update_event_subscription.ordering_key
     WHERE s.id = sid;
    IF event_delivery_schema <> cur.event_delivery_schema THEN
        -- a retry keeps the text it is sent as: made again in the new schema
        UPDATE eventgrid.retries r
           SET payload = eventgrid.convert_event(r.event, in_schema, update_event_subscription.event_delivery_schema,
                                                 r.publish_time)::text
         WHERE r.subscription_id = sid;
    END IF;
    IF endpoint <> cur.endpoint THEN
        -- without the statement, which holds the URL
        PERFORM eventgrid._log(format('eventgrid: endpoint of event subscription "%s" of topic "%s" changed by %s',
                                      name, topic, eventgrid._caller()));
    END IF;
    -- a new endpoint, or a new handshake, is validated again; none ends validation
    IF endpoint_validation = 'none' THEN
        DELETE FROM eventgrid.endpoint_validations v WHERE v.subscription_id = sid;
    ELSIF endpoint_validation = 'handshake'
          OR (endpoint <> cur.endpoint
              AND EXISTS (SELECT 1 FROM eventgrid.endpoint_validations v WHERE v.subscription_id = sid))
          OR (event_delivery_schema <> cur.event_delivery_schema
              AND EXISTS (SELECT 1 FROM eventgrid.endpoint_validations v WHERE v.subscription_id = sid)) THEN
        PERFORM eventgrid._start_validation(sid);
    END IF;
    -- requests claimed with the old settings and not sent yet go back
    PERFORM eventgrid._subscriptions_changed_at_commit();
END $$;
REVOKE ALL ON FUNCTION eventgrid.create_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.create_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text, text, text) TO eventgrid_admin;
COMMENT ON FUNCTION eventgrid.create_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text, text, text) IS 'Creates an event subscription and returns its id. endpoint: http(s) URL that libcurl parses, with a host, at most 2048 bytes (no user name or password). event_delivery_schema: defaults to the topic''s input schema (namespace topics: CloudEvents only). Filters: included_event_types (case-insensitive), subject_begins_with / subject_ends_with (case-insensitive unless is_subject_case_sensitive), advanced_filters (Event Grid JSON, see set_advanced_filters) with enable_advanced_filtering_on_arrays (false). Retry policy of a custom topic: max_delivery_attempts 1-30 (30), event_ttl 1-1440 minutes (1440); of a namespace topic: max_delivery_count 1-10 (10), event_time_to_live ISO 8601 PT1M-P7D (P7D); the other profile''s arguments are refused. max_events_per_batch 1-5000, preferred_batch_size_in_kilobytes 1-1024 (either turns batching on), deadletter (false). max_events_per_second 1-100,000 (NULL: no rate limit; a batch counts its events, retries count; events over the rate wait in the queue). endpoint_validation: none (default) or handshake (Event Grid''s SubscriptionValidationEvent, or for CloudEvents the webhook OPTIONS request; nothing is delivered until the endpoint is validated, see event_subscription_validation). dead_letter_topic: a topic (of this database) to which each event this subscription dead-letters or drops is published as a notification, in the transaction that records it (see README, Dead-letter notifications; NULL: none). ordering_key: a dotted field path (1-512 characters, as a dynamic delivery property''s source_field: subject, data.orderId, partitionkey) whose value (string, number or boolean) is each event''s key: events of one key are delivered in publish order, one request at a time across all delivery workers, the next only once the one before is delivered, dead-lettered or dropped; events without it go unordered (NULL: unordered; see README, Ordered delivery). Requires eventgrid_admin. Errors: 42704 (also no such dead_letter_topic), 42602, 22023, 22003, 22004, 54000, 42710. SPEC 1, 4, 5, 7, 9, 13.';
REVOKE ALL ON FUNCTION eventgrid.update_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.update_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text, text, text) TO eventgrid_admin;
COMMENT ON FUNCTION eventgrid.update_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text, text, text) IS 'Changes an event subscription in place (as az eventgrid event-subscription update); the arguments are create_event_subscription''s, with the same ranges, checks and SQLSTATEs. A NULL argument keeps the setting; to clear one pass an empty array (included_event_types: all types), an empty string (subject_begins_with, subject_ends_with, dead_letter_topic), [] (advanced_filters) or 0 (max_events_per_batch, preferred_batch_size_in_kilobytes: both cleared turns batching off; max_events_per_second: no rate limit). endpoint_validation: handshake validates the endpoint again (so does a new endpoint or delivery schema of a subscription that validates), none stops validating. The position, the first attempts in flight and the retries are kept, and the next claim uses the new settings: a new endpoint gets its own health state; with a new event_delivery_schema the retries are converted. ordering_key: a new path keys the events claimed from now on (those waiting keep their keys); '''' makes the subscription unordered and what waited for its key due at once. A changed endpoint is logged, without the URL. Requires eventgrid_admin. Errors: 22004, 42704, 22023, 22003, 54000. SPEC 1, 4, 5, 7, 9, 13.';

CREATE OR REPLACE FUNCTION eventgrid.redeliver_dead_letters(topic text DEFAULT NULL::text, subscription text DEFAULT NULL::text, reason text DEFAULT NULL::text, dead_lettered_after timestamp with time zone DEFAULT NULL::timestamp with time zone, dead_lettered_before timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sids bigint[];
    ids bigint[];
    n bigint;
    ksids bigint[];
    khashes bigint[];
    kids bigint[];
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
             ORDER BY g.id) x
        RETURNING id, subscription_id, ordering_key_hash, ordering_key IS NOT NULL AS keyed
    ), keyed AS (
        SELECT array_agg(q.subscription_id) AS sids, array_agg(q.ordering_key_hash) AS hashes,
               array_agg(q.id) AS ids
          FROM queued q WHERE q.keyed
    ), counted AS (
        SELECT q.subscription_id, count(*) AS n FROM queued q GROUP BY q.subscription_id
    ), bumped AS (
        UPDATE eventgrid.subscription_counters c SET redelivered = c.redelivered + counted.n
          FROM counted WHERE c.subscription_id = counted.subscription_id
    )
    SELECT coalesce(sum(counted.n), 0), (SELECT k.sids FROM keyed k), (SELECT k.hashes FROM keyed k),
           (SELECT k.ids FROM keyed k)
      INTO n, ksids, khashes, kids FROM counted;
    IF ksids IS NOT NULL THEN
        PERFORM eventgrid._start_ordering_keys(ksids, khashes, kids, eventgrid._now());
    END IF;
    IF n > 0 THEN
        PERFORM eventgrid._wake_worker_at_commit();
    END IF;
    RETURN n;
END $$;
COMMENT ON FUNCTION eventgrid.redeliver_dead_letters(text, text, text, timestamptz, timestamptz) IS 'Queues dead letters for delivery again and returns how many: each becomes a delivery with no attempts made and its time-to-live counted from now, due at once, and leaves eventgrid.dead_letters (if it fails again it is dead-lettered again). Filters (NULL: any): topic, subscription name, reason (MaxDeliveryAttemptsExceeded, TimeToLiveExceeded, NonRetriableError), dead_lettered_at >= dead_lettered_after and < dead_lettered_before. Of an ordered subscription (ordering_key) each goes after the events of its key that wait, in the order the dead letters were written: not back in its place. Dead letters of dropped subscriptions stay. Running it twice queues nothing the second time. Counted in subscription_counters.redelivered. Requires eventgrid_admin. Errors: 22023 unknown reason or empty time range, 42704 no such topic or subscription. SPEC 7.';

-- What ordered delivery holds back: keys whose oldest event has failed and
-- has events waiting behind it, and per subscription how many.
CREATE VIEW eventgrid.blocked_ordering_keys AS
SELECT s.topic, s.name AS subscription, h.ordering_key, h.event_id, h.publish_time, h.attempts,
       h.last_outcome, h.last_http_status, h.last_attempt_at, h.next_attempt_at,
       w.waiting, w.oldest_waiting_publish_time
  FROM eventgrid.ordering_keys k
  JOIN eventgrid.retries h ON h.id = k.head_id
  JOIN eventgrid.event_subscriptions s ON s.id = k.subscription_id
 CROSS JOIN LATERAL (SELECT count(*) AS waiting, min(x.publish_time) AS oldest_waiting_publish_time
                       FROM eventgrid.retries x
                      WHERE x.subscription_id = k.subscription_id AND x.ordering_key_hash = k.ordering_key_hash
                        AND x.ordering_key IS NOT NULL AND x.id > k.head_id) w
 WHERE h.attempts > 0 AND w.waiting > 0;
GRANT SELECT ON eventgrid.blocked_ordering_keys TO eventgrid_admin;
COMMENT ON VIEW eventgrid.blocked_ordering_keys IS 'Ordered delivery (SPEC 13): one row per key of an ordered event subscription whose oldest event has failed at least once and holds later events of its key back: topic, subscription, ordering_key (the key''s value), the holding event (event_id, publish_time, attempts made, last_outcome, last_http_status, last_attempt_at, next_attempt_at) and how many events wait behind it (waiting, oldest_waiting_publish_time). The key goes on once that event is delivered, dead-lettered or dropped. Readable by eventgrid_admin.';

CREATE VIEW eventgrid.ordering_metrics AS
SELECT s.topic, s.name AS subscription, s.ordering_key,
       coalesce(b.blocked_keys, 0) AS blocked_keys, coalesce(w.waiting_events, 0) AS waiting_events
  FROM eventgrid.event_subscriptions s
  LEFT JOIN (SELECT k.subscription_id, count(*) AS blocked_keys
               FROM eventgrid.ordering_keys k JOIN eventgrid.retries h ON h.id = k.head_id
              WHERE h.attempts > 0
                AND EXISTS (SELECT 1 FROM eventgrid.retries x
                             WHERE x.subscription_id = k.subscription_id AND x.ordering_key_hash = k.ordering_key_hash
                               AND x.ordering_key IS NOT NULL AND x.id > k.head_id)
              GROUP BY k.subscription_id) b ON b.subscription_id = s.id
  LEFT JOIN (SELECT x.subscription_id, count(*) AS waiting_events
               FROM eventgrid.retries x WHERE x.ordering_key IS NOT NULL AND x.next_attempt_at = 'infinity'
              GROUP BY x.subscription_id) w ON w.subscription_id = s.id
 WHERE s.ordering_key IS NOT NULL;
GRANT SELECT ON eventgrid.ordering_metrics TO pg_monitor, eventgrid_admin;
COMMENT ON VIEW eventgrid.ordering_metrics IS 'Prometheus gauges per ordered event subscription (SPEC 13): blocked_keys, the keys whose oldest event has failed and holds others back (eventgrid.blocked_ordering_keys lists them), and waiting_events, the events waiting for an earlier one of their key. Readable by pg_monitor and eventgrid_admin. README "Monitoring".';
