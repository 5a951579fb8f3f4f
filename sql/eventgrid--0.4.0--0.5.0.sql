-- eventgrid 0.4.0 -> 0.5.0: delivery attempt history and metrics with
-- Event Grid's names.
--
-- Attempt history: the delivery worker writes one row per delivery attempt
-- (one HTTP request, carrying one event or a batch) to one of three
-- history tables that take turns, as the event tables do; the upkeep
-- worker empties the oldest with TRUNCATE when the current one has been
-- taking rows for half of eventgrid.attempt_history_retention or holds
-- half of eventgrid.attempt_history_max_rows, so history is kept without
-- DELETE, UPDATE or VACUUM.  GUC eventgrid.attempt_history chooses what is
-- kept: all (default), failures, or off.
--
-- Metrics: counters of published events (per topic) and matched events
-- (per event subscription), and the view eventgrid.metrics that shows
-- them with the other counters under Event Grid's metric names.
\echo Use "CREATE EXTENSION eventgrid" or "ALTER EXTENSION eventgrid UPDATE" to load this file. \quit

----------------------------------------------------------------------------
-- Attempt history
----------------------------------------------------------------------------

CREATE SEQUENCE eventgrid.attempt_log_id_seq;

CREATE TABLE eventgrid.attempt_log (
    history_table     smallint NOT NULL,
    id                bigint NOT NULL DEFAULT nextval('eventgrid.attempt_log_id_seq'),
    attempted_at      timestamptz NOT NULL,
    topic             text,
    subscription_id   bigint,      -- the subscription (which may since be dropped)
    subscription_name text NOT NULL,
    event_ids         bigint[] NOT NULL,
    attempt           integer NOT NULL,
    http_status       integer,
    outcome           text NOT NULL,
    duration_ms       double precision,
    error             text
) PARTITION BY LIST (history_table);
ALTER SEQUENCE eventgrid.attempt_log_id_seq OWNED BY eventgrid.attempt_log.id;

CREATE TABLE eventgrid.attempt_log_0 PARTITION OF eventgrid.attempt_log FOR VALUES IN (0);
CREATE TABLE eventgrid.attempt_log_1 PARTITION OF eventgrid.attempt_log FOR VALUES IN (1);
CREATE TABLE eventgrid.attempt_log_2 PARTITION OF eventgrid.attempt_log FOR VALUES IN (2);

-- Which history table takes rows now, since when and from which id on; the
-- upkeep worker's last rotation and why its last try failed.
CREATE TABLE eventgrid.attempt_log_rotation (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    history_table  smallint NOT NULL CHECK (history_table BETWEEN 0 AND 2),
    started_at     timestamptz NOT NULL,
    first_id       bigint NOT NULL,
    last_try_at    timestamptz,
    last_failure   text
);
INSERT INTO eventgrid.attempt_log_rotation (history_table, started_at, first_id) VALUES (0, now(), 1);

COMMENT ON TABLE eventgrid.attempt_log IS
    'Internal: the delivery attempt history, in three tables eventgrid.attempt_log_0..2 that take turns; read it through eventgrid.delivery_attempts.';
COMMENT ON TABLE eventgrid.attempt_log_rotation IS
    'Which attempt history table takes rows now (history_table), since when (started_at) and from which id (first_id); when the upkeep worker last tried to rotate and, if that failed, why (e.g. a session reading the history held a lock).';

CREATE VIEW eventgrid.delivery_attempts AS
SELECT a.id, a.attempted_at, a.topic, a.subscription_name AS subscription, a.event_ids, a.attempt,
       a.http_status, a.outcome, a.duration_ms, a.error
  FROM eventgrid.attempt_log a;
COMMENT ON VIEW eventgrid.delivery_attempts IS
    'Delivery attempt history: one row per attempt (one HTTP request; a batch names all its events): id, when it started (attempted_at, on the worker''s clock), topic, event subscription, event_ids (the ids publish() returned), attempt (1 for the first; for a batch, its first event''s, the aeg-delivery-count header plus 1), http_status (NULL: no HTTP answer), outcome (the outcome names of SPEC 3: Delivered, GenericError, Busy, NotFound, TimedOut, SocketError, ResolutionError, ...; Probation for an attempt that delayed delivery held back; Aborted for a request in flight when the worker stopped), duration_ms (libcurl''s total time of the request), error (libcurl''s message when there was no HTTP answer). Kept per GUC eventgrid.attempt_history (all, failures, off) for eventgrid.attempt_history_retention and eventgrid.attempt_history_max_rows. An attempt whose outcome was not yet written when the worker stopped shows as Aborted.';

SELECT pg_catalog.pg_extension_config_dump('eventgrid.attempt_log_0', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.attempt_log_1', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.attempt_log_2', '');
SELECT pg_catalog.pg_extension_config_dump('eventgrid.attempt_log_id_seq', '');

----------------------------------------------------------------------------
-- Counters for the metrics
----------------------------------------------------------------------------

-- published: counted by the upkeep worker as it passes each topic's events;
-- matched: counted as each event subscription's first attempts are recorded.
ALTER TABLE eventgrid.topic_counters ADD COLUMN published bigint NOT NULL DEFAULT 0;
ALTER TABLE eventgrid.subscription_counters ADD COLUMN matched bigint NOT NULL DEFAULT 0;

CREATE VIEW eventgrid.metrics AS
SELECT t.name AS topic, NULL::text AS event_subscription, m.metric_name, m.aggregation, m.unit, m.value
  FROM eventgrid.topics t
  LEFT JOIN eventgrid.topic_counters c ON c.topic = t.name
 CROSS JOIN LATERAL (VALUES
        ('PublishSuccessCount', 'Total', 'Count', coalesce(c.published, 0)::double precision),
        ('UnmatchedEventCount', 'Total', 'Count', coalesce(c.unmatched, 0)::double precision))
        AS m(metric_name, aggregation, unit, value)
UNION ALL
SELECT s.topic, s.name, m.metric_name, m.aggregation, m.unit, m.value
  FROM eventgrid.event_subscriptions s
  LEFT JOIN eventgrid.subscription_counters c ON c.subscription_id = s.id
  LEFT JOIN (SELECT a.subscription_id, avg(a.duration_ms) AS average,
                    percentile_cont(0.95) WITHIN GROUP (ORDER BY a.duration_ms) AS p95
               FROM eventgrid.attempt_log a
              WHERE a.http_status IS NOT NULL AND a.duration_ms IS NOT NULL
              GROUP BY a.subscription_id) d ON d.subscription_id = s.id
 CROSS JOIN LATERAL (VALUES
        ('MatchedEventCount', 'Total', 'Count', coalesce(c.matched, 0)::double precision),
        ('DeliverySuccessCount', 'Total', 'Count', coalesce(c.delivered, 0)::double precision),
        ('DeliveryAttemptFailCount', 'Total', 'Count', coalesce(c.failed_attempts, 0)::double precision),
        ('DeadLetteredCount', 'Total', 'Count', coalesce(c.dead_lettered, 0)::double precision),
        ('DroppedEventCount', 'Total', 'Count', coalesce(c.dropped, 0)::double precision),
        ('DestinationProcessingDurationInMs', 'Average', 'Milliseconds', d.average),
        ('DestinationProcessingDurationInMs', 'P95', 'Milliseconds', d.p95))
        AS m(metric_name, aggregation, unit, value);
COMMENT ON VIEW eventgrid.metrics IS
    'Event Grid''s metrics, one row per metric and topic (event_subscription NULL: PublishSuccessCount, UnmatchedEventCount) or event subscription (MatchedEventCount, DeliverySuccessCount, DeliveryAttemptFailCount, DeadLetteredCount, DroppedEventCount, DestinationProcessingDurationInMs Average and P95). Counts are totals since the topic or subscription was created; published events are counted by the upkeep worker, about a second after commit. Durations: libcurl''s total time of the retained attempts that had an HTTP answer (NULL when there are none); they follow eventgrid.attempt_history.';

----------------------------------------------------------------------------
-- Privileges
----------------------------------------------------------------------------

REVOKE ALL ON eventgrid.attempt_log, eventgrid.attempt_log_rotation, eventgrid.delivery_attempts,
    eventgrid.metrics FROM PUBLIC;
GRANT SELECT ON eventgrid.attempt_log_rotation, eventgrid.delivery_attempts, eventgrid.metrics
    TO eventgrid_admin;
