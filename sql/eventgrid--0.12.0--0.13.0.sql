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
