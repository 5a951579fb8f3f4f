-- eventgrid 0.11.0 -> 0.12.0: protected receivers, first part: client
-- certificates (mutual TLS); the dead-letter notifications' INSERT written
-- once.
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

-- ---------------------------------------------------------------------------
-- Dead-letter notifications: the INSERT written once, for the whole set and
-- for each notice alone (0.11.0 wrote it twice)
CREATE FUNCTION eventgrid._insert_dead_letter_notifications(notices eventgrid._dead_letter_notice[]) RETURNS void
    LANGUAGE sql
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 INSERT INTO eventgrid.events (topic, event, source)
 SELECT n.notification_topic, n.notification, '(dead-letter notification)'
   FROM unnest(notices) x
  CROSS JOIN LATERAL eventgrid._dead_letter_notification(x.dead_letter_topic, x.topic, x.subscription, x.event,
        x.input_schema, x.dead_lettered, x.reason, x.attempts, x.outcome, x.http_status, x.publish_time,
        x.attempted_at, x.event_source) n;
END;
REVOKE ALL ON FUNCTION eventgrid._insert_dead_letter_notifications(eventgrid._dead_letter_notice[]) FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._insert_dead_letter_notifications(eventgrid._dead_letter_notice[]) IS 'Internal: publishes the dead-letter notifications of the notices (eventgrid._dead_letter_notification builds each) into eventgrid.events, source ''(dead-letter notification)''; eventgrid._publish_dead_letter_notifications calls it for the whole set, then for each notice alone.';

CREATE OR REPLACE FUNCTION eventgrid._publish_dead_letter_notifications(notices eventgrid._dead_letter_notice[])
    RETURNS TABLE(failed_subscription_id bigint, failed_topic text, failed_subscription text, failed_event_id bigint,
                  failed_dead_letter_topic text, failed_sqlstate text, failed_error text)
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    d eventgrid._dead_letter_notice;
    state text;
    msg text;
    failed integer := 0;
    first_state text;
BEGIN
    IF coalesce(cardinality(notices), 0) = 0 THEN
        RETURN;
    END IF;
    BEGIN
        PERFORM eventgrid._insert_dead_letter_notifications(notices);
        RETURN;
    EXCEPTION WHEN OTHERS THEN
        NULL;   -- one at a time below, so that only those that cannot be made are left out
    END;
    FOREACH d IN ARRAY notices LOOP
        BEGIN
            PERFORM eventgrid._insert_dead_letter_notifications(ARRAY[d]);
        EXCEPTION WHEN OTHERS THEN
            GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
            failed := failed + 1;
            first_state := coalesce(first_state, state);
            failed_subscription_id := d.subscription_id;
            failed_topic := d.topic;
            failed_subscription := d.subscription;
            failed_event_id := d.event_id;
            failed_dead_letter_topic := d.dead_letter_topic;
            failed_sqlstate := state;
            failed_error := left(msg, 1000);
            RETURN NEXT;
        END;
    END LOOP;
    IF failed > 0 THEN
        -- counts and SQLSTATE only: the message may quote the event
        PERFORM eventgrid._log(format('eventgrid: %s dead-letter notification(s) could not be published (SQLSTATE %s first); the dead letters are recorded; see eventgrid.dead_letter_notification_failures',
                                      failed, first_state));
    END IF;
END $$;

-- ---------------------------------------------------------------------------
-- The client certificates' expiry for Prometheus (monitoring/): what an
-- alert on a certificate about to expire needs, and nothing of the key or
-- subject
CREATE VIEW eventgrid.client_certificate_metrics AS
 SELECT s.topic,
    s.name AS event_subscription,
    extract(epoch FROM c.not_after)::double precision AS expiry_timestamp_seconds
   FROM eventgrid.client_certificates c
     JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id;
GRANT SELECT ON eventgrid.client_certificate_metrics TO pg_monitor, eventgrid_admin;
COMMENT ON VIEW eventgrid.client_certificate_metrics IS 'Prometheus gauge per event subscription with a client certificate (mutual TLS): expiry_timestamp_seconds, the certificate''s not_after as Unix time. Readable by pg_monitor and eventgrid_admin. README "Monitoring".';
