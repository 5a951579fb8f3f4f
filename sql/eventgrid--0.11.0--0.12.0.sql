-- eventgrid 0.11.0 -> 0.12.0: protected receivers, first part: client
-- certificates (mutual TLS).
\echo Use "ALTER EXTENSION eventgrid UPDATE" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Client certificates: kept where signing secrets are kept (readable by the
-- extension's owner only, dumped with the data), checked with OpenSSL when
-- they are set, presented by libcurl to HTTPS endpoints.
CREATE FUNCTION eventgrid._client_certificate_info(certificate text, private_key text,
        OUT subject text, OUT not_before timestamptz, OUT not_after timestamptz)
    LANGUAGE c VOLATILE
    AS 'MODULE_PATHNAME', 'eventgrid_client_certificate_info';
REVOKE ALL ON FUNCTION eventgrid._client_certificate_info(text, text) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._client_certificate_info(text, text) IS 'Internal: the subject (RFC 2253) and validity of a PEM client certificate whose PEM private key (unencrypted) matches it; 22023 when either does not parse, the key is not the certificate''s, or the certificate is not valid now (never quoting either text); 22004 NULL.';

CREATE TABLE eventgrid.client_certificates (
    subscription_id bigint PRIMARY KEY REFERENCES eventgrid.event_subscriptions (id) ON DELETE CASCADE,
    certificate text NOT NULL,
    private_key text NOT NULL,
    subject text NOT NULL,
    not_after timestamptz NOT NULL,
    set_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
REVOKE ALL ON TABLE eventgrid.client_certificates FROM PUBLIC;
COMMENT ON TABLE eventgrid.client_certificates IS 'Internal: the client certificates (PEM, with any chain) and private keys event subscriptions present to HTTPS endpoints; readable by the extension''s owner only (eventgrid.event_subscription_certificates shows subject and expiry).';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.client_certificates', '');

CREATE FUNCTION eventgrid.set_client_certificate(topic text, subscription text, certificate text, private_key text)
    RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, subscription, true);
    info record;
BEGIN
    SELECT i.subject, i.not_after INTO info FROM eventgrid._client_certificate_info(certificate, private_key) i;
    INSERT INTO eventgrid.client_certificates AS c (subscription_id, certificate, private_key, subject, not_after)
    VALUES (sid, certificate, private_key, info.subject, info.not_after)
    ON CONFLICT (subscription_id) DO UPDATE
       SET certificate = excluded.certificate, private_key = excluded.private_key, subject = excluded.subject,
           not_after = excluded.not_after, set_at = clock_timestamp();
END $$;
REVOKE ALL ON FUNCTION eventgrid.set_client_certificate(text, text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.set_client_certificate(text, text, text, text) TO eventgrid_admin;
COMMENT ON FUNCTION eventgrid.set_client_certificate(text, text, text, text) IS 'Sets the client certificate an event subscription presents to its HTTPS endpoint (mutual TLS; SPEC 12), for deliveries, retries, batches and validation handshakes alike. certificate: PEM, the client certificate first, then any chain; private_key: its PEM private key, unencrypted. The key is never shown (event_subscription_certificates shows subject and expiry); a certificate within 7 days of expiry is warned about in the server log. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription, 22023 a certificate or key that does not parse, a key that is not the certificate''s, a certificate not valid now.';

CREATE FUNCTION eventgrid.remove_client_certificate(topic text, subscription text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM eventgrid.client_certificates c WHERE c.subscription_id = eventgrid._subscription_id(topic, subscription, true);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'event subscription % of topic % has no client certificate', eventgrid._quote(subscription), eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object', HINT = 'eventgrid.event_subscription_certificates lists the subscriptions that have one.';
    END IF;
END $$;
REVOKE ALL ON FUNCTION eventgrid.remove_client_certificate(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.remove_client_certificate(text, text) TO eventgrid_admin;
COMMENT ON FUNCTION eventgrid.remove_client_certificate(text, text) IS 'Removes the client certificate of an event subscription: its requests present none from the next claim on. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription or no certificate.';

CREATE VIEW eventgrid.event_subscription_certificates AS
 SELECT s.topic,
    s.name AS subscription,
    c.subject,
    c.not_after,
    c.not_after < now() + interval '7 days' AS expires_within_7_days,
    c.set_at
   FROM eventgrid.client_certificates c
     JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id;
GRANT SELECT ON eventgrid.event_subscription_certificates TO eventgrid_admin;
COMMENT ON VIEW eventgrid.event_subscription_certificates IS 'The event subscriptions that present a client certificate (mutual TLS): topic, subscription, the certificate''s subject (RFC 2253) and not_after, expires_within_7_days, set_at; never the key. Readable by eventgrid_admin.';
