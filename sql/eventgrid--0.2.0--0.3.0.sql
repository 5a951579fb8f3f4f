-- eventgrid 0.2.0 -> 0.3.0: endpoint health (delayed delivery).
--
-- An endpoint whose delivery attempts keep failing is put on probation:
-- nothing is sent to it until the probation ends and one request (the
-- probe) succeeds.  The delivery worker keeps each endpoint's state in
-- eventgrid.endpoint_states and shows it per event subscription in the view
-- eventgrid.endpoint_health.  CREATE EXTENSION installs 0.2.0 and runs this
-- script, so a fresh installation and an updated one are the same.
\echo Use "CREATE EXTENSION eventgrid" or "ALTER EXTENSION eventgrid UPDATE" to load this file. \quit

-- Health of one endpoint URL, written by the delivery worker only.  A URL
-- without a row is healthy with no failures in a row.  Runtime state, not
-- configuration: not dumped, and after a restore every endpoint starts
-- healthy.
CREATE TABLE eventgrid.endpoint_states (
    endpoint             text PRIMARY KEY,
    state                text NOT NULL CHECK (state IN ('healthy', 'probation', 'probing')),
    consecutive_failures integer NOT NULL CHECK (consecutive_failures >= 0),
    last_failure_outcome text,
    probation_cause      text,
    probation_started_at timestamptz,
    probation_until      timestamptz,
    probations           integer NOT NULL DEFAULT 0 CHECK (probations >= 0),
    updated_at           timestamptz NOT NULL,
    CHECK ((state = 'healthy') = (probation_started_at IS NULL))
);
COMMENT ON TABLE eventgrid.endpoint_states IS
    'Internal: health of each endpoint URL as the delivery worker keeps it (delayed delivery, SPEC 6); read it through eventgrid.endpoint_health.';

CREATE VIEW eventgrid.endpoint_health AS
SELECT s.topic, s.name AS subscription, s.endpoint,
       coalesce(h.state, 'healthy') AS state,
       h.probation_until,
       h.probation_started_at,
       h.probation_cause,
       coalesce(h.probations, 0) AS probations,
       coalesce(h.consecutive_failures, 0) AS consecutive_failures,
       h.last_failure_outcome,
       h.updated_at
  FROM eventgrid.event_subscriptions s
  LEFT JOIN eventgrid.endpoint_states h ON h.endpoint = s.endpoint;
COMMENT ON VIEW eventgrid.endpoint_health IS
    'Per event subscription, the health of its endpoint (subscriptions with the same endpoint URL share it): state healthy, probation (nothing is sent until probation_until) or probing (probation is over and one request is testing the endpoint); consecutive failed delivery attempts; the outcome that started the probation and when; probations in a row since the last success (each lasts twice the one before, at most 4 hours). Times are the delivery worker''s clock (eventgrid.clock_offset included). SPEC 6.';

CREATE FUNCTION eventgrid.probation_duration(outcome text, probation integer DEFAULT 1)
RETURNS interval AS 'MODULE_PATHNAME', 'eventgrid_probation_duration' LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION eventgrid.probation_duration(text, integer) IS
    'How long an endpoint stays on probation when a failure with lastDeliveryOutcome outcome puts it there for the probation-th time in a row (1-1000, default 1): Busy and TimedOut 10 s, SocketError 30 s, NotFound, ResolutionError, Unauthorized, Forbidden, Disabled and Full 5 min, any other failure 10 s; each further probation in a row twice the one before, at most 4 hours. NULL for Delivered, BadRequest, PayloadTooLarge and Probation, which do not count against an endpoint. Errors: 22023 unknown outcome name, 22003 probation outside 1-1000. SPEC 6.';

REVOKE ALL ON eventgrid.endpoint_states, eventgrid.endpoint_health FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION eventgrid.probation_duration(text, integer) FROM PUBLIC;
GRANT SELECT ON eventgrid.endpoint_states, eventgrid.endpoint_health TO eventgrid_admin;
GRANT EXECUTE ON FUNCTION eventgrid.probation_duration(text, integer) TO eventgrid_admin, eventgrid_publisher;

-- Held deliveries (outcome Probation) are not failed requests: the counter
-- failed_attempts counts only requests that were sent.
COMMENT ON VIEW eventgrid.delivery_statistics IS
    'Per event subscription: deliveries pending (not yet delivered, dead-lettered or dropped, retries included), of which waiting for a retry, events delivered, failed delivery attempts (requests sent that failed; attempts held back by probation are not counted), events dead-lettered and events dropped (undeliverable with dead-lettering off).';
