-- eventgrid 0.25.0 -> 0.26.0: scale in subscriptions, continued (SPEC 20).
-- What a scrape or a look at delivery_statistics costs follows the event
-- subscriptions that have something pending, not how many exist: the
-- backlog (pending events, the oldest one's age, how long one has been due)
-- is computed only for the subscriptions that may have one.

\echo Use "ALTER EXTENSION eventgrid UPDATE TO '0.26.0'" to load this file. \quit

-- The upkeep worker forgets the health of endpoint URLs no subscription
-- uses any more, at every round: without an index that read every
-- subscription (1,000,000 of them in a second's round).
CREATE INDEX event_subscriptions_endpoint_idx ON eventgrid.event_subscriptions (endpoint);

-- The event subscriptions that may have a backlog: those whose topic or
-- domain topic has events in the event tables, and those with first
-- attempts in flight, retries, or (queue subscriptions) events or batches
-- not settled.  Every other one has nothing pending (eventgrid._backlog()
-- would find nothing): loose scans of the tables' indexes, so the cost
-- follows the topics with events and the subscriptions with work.
CREATE FUNCTION eventgrid._backlogged_subscriptions() RETURNS SETOF bigint
    LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
    WITH RECURSIVE table_topics(topic) AS (
        (SELECT e.topic FROM eventgrid.events e ORDER BY e.topic LIMIT 1)
        UNION ALL
        SELECT (SELECT e.topic FROM eventgrid.events e
                 WHERE e.topic > r.topic ORDER BY e.topic LIMIT 1)
          FROM table_topics r WHERE r.topic IS NOT NULL
    ), table_domain_topics(read_key) AS (
        (SELECT (e.topic || '/') || e.domain_topic FROM eventgrid.events e
          WHERE e.domain_topic IS NOT NULL
          ORDER BY (e.topic || '/') || e.domain_topic LIMIT 1)
        UNION ALL
        SELECT (SELECT (e.topic || '/') || e.domain_topic FROM eventgrid.events e
                 WHERE e.domain_topic IS NOT NULL
                   AND (e.topic || '/') || e.domain_topic > d.read_key
                 ORDER BY (e.topic || '/') || e.domain_topic LIMIT 1)
          FROM table_domain_topics d WHERE d.read_key IS NOT NULL
    ), retried(id) AS (
        (SELECT r.subscription_id FROM eventgrid.retries r
          ORDER BY r.subscription_id LIMIT 1)
        UNION ALL
        SELECT (SELECT r.subscription_id FROM eventgrid.retries r
                 WHERE r.subscription_id > x.id ORDER BY r.subscription_id LIMIT 1)
          FROM retried x WHERE x.id IS NOT NULL
    ), queued(id) AS (
        (SELECT q.subscription_id FROM eventgrid.queue_events q
          ORDER BY q.subscription_id LIMIT 1)
        UNION ALL
        SELECT (SELECT q.subscription_id FROM eventgrid.queue_events q
                 WHERE q.subscription_id > x.id ORDER BY q.subscription_id LIMIT 1)
          FROM queued x WHERE x.id IS NOT NULL
    )
    SELECT s.id FROM table_topics k JOIN eventgrid.event_subscriptions s
        ON s.topic = k.topic AND s.domain_topic IS NULL
    UNION
    SELECT s.id FROM table_domain_topics k JOIN eventgrid.event_subscriptions s
        ON s.topic = split_part(k.read_key, '/', 1)
       AND s.domain_topic = substr(k.read_key, strpos(k.read_key, '/') + 1)
    UNION
    SELECT c.subscription_id FROM eventgrid.chunks_in_flight c
    UNION
    SELECT x.id FROM retried x WHERE x.id IS NOT NULL
    UNION
    SELECT x.id FROM queued x WHERE x.id IS NOT NULL
    UNION
    SELECT b.subscription_id FROM eventgrid.queue_batches b;
END;
COMMENT ON FUNCTION eventgrid._backlogged_subscriptions() IS 'Internal: the ids of the event subscriptions that may have a backlog (eventgrid._backlog()): whose topic or domain topic has events in the event tables, or with first attempts in flight, retries, or queue events or batches not settled; any other has nothing pending. Loose scans of indexes: its cost follows the topics with events and the subscriptions with work, not how many subscriptions exist. event_subscription_metrics and delivery_statistics compute backlogs for these only.';
REVOKE ALL ON FUNCTION eventgrid._backlogged_subscriptions() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid._backlogged_subscriptions() TO eventgrid_admin;

-- event_subscription_metrics: a backlog only where there may be one (a
-- scrape of 100,000 idle subscriptions took 16 s), computed for those and
-- joined, and the queue subscriptions' acknowledgements summed once, not
-- looked up per subscription (1,000,000 subscriptions: 0.4 s).
CREATE OR REPLACE FUNCTION eventgrid._event_subscription_metrics(OUT topic text, OUT event_subscription text, OUT matched_events_total bigint, OUT delivery_success_total bigint, OUT pending_events bigint, OUT oldest_pending_event_age_seconds double precision, OUT overdue_seconds double precision, OUT paused integer, OUT endpoint_on_probation integer) RETURNS SETOF record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
BEGIN ATOMIC
    SELECT s.read_key AS topic,
           s.name AS event_subscription,
           COALESCE(c.matched, 0) AS matched_events_total,
           (COALESCE(c.delivered, 0) + COALESCE(q.acknowledged, 0))::bigint AS delivery_success_total,
           COALESCE(b.pending, 0) AS pending_events,
           COALESCE(EXTRACT(epoch FROM eventgrid._now() - b.oldest)::double precision, 0) AS oldest_pending_event_age_seconds,
           COALESCE(EXTRACT(epoch FROM eventgrid._now() - b.due_since)::double precision, 0) AS overdue_seconds,
           (s.id IN (SELECT p.p FROM eventgrid._paused_subscriptions() p(p)))::integer AS paused,
           (COALESCE(h.state, 'healthy') <> 'healthy')::integer AS endpoint_on_probation
      FROM eventgrid.event_subscriptions s
      LEFT JOIN eventgrid.subscription_counters c ON c.subscription_id = s.id
      LEFT JOIN (SELECT x.subscription_id, sum(x.acknowledged) AS acknowledged
                   FROM eventgrid.queue_counters x GROUP BY x.subscription_id) q ON q.subscription_id = s.id
      LEFT JOIN eventgrid.endpoint_states h ON h.endpoint = s.endpoint
      LEFT JOIN (SELECT a.id, x.pending, x.oldest, x.due_since
                   FROM eventgrid._backlogged_subscriptions() a(id)
                  CROSS JOIN LATERAL eventgrid._backlog(a.id) x(pending, oldest, due_since)) b ON b.id = s.id;
END;

-- delivery_statistics: a backlog only where there may be one too (its
-- pending column called _pending() per subscription, which planned
-- _backlog() again at every call: 3 ms each), tested per row, so that a
-- look at one topic computes that topic's only.  OFFSET 0 keeps the
-- planner from pulling the test up into a join filter, which would call
-- _backlog() for every row and filter afterwards.
CREATE OR REPLACE VIEW eventgrid.delivery_statistics AS
SELECT s.topic,
    s.name AS subscription,
    COALESCE(b.pending, (0)::bigint) AS pending,
    ( SELECT count(*) AS count
           FROM eventgrid.retries r
          WHERE (r.subscription_id = s.id)) AS retrying,
    (COALESCE(c.delivered, (0)::bigint) + COALESCE(k.acknowledged, (0)::bigint)) AS delivered,
    COALESCE(c.failed_attempts, (0)::bigint) AS failed_attempts,
    COALESCE(c.dead_lettered, (0)::bigint) AS dead_lettered,
    COALESCE(c.dropped, (0)::bigint) AS dropped,
    COALESCE(c.redelivered, (0)::bigint) AS redelivered,
    (s.id IN ( SELECT p.p
           FROM eventgrid._paused_subscriptions() p(p))) AS paused,
    s.delivery_mode,
        CASE
            WHEN (s.delivery_mode = 'queue'::text) THEN COALESCE(k.received, (0)::bigint)
            ELSE NULL::bigint
        END AS received,
        CASE
            WHEN (s.delivery_mode = 'queue'::text) THEN COALESCE(k.acknowledged, (0)::bigint)
            ELSE NULL::bigint
        END AS acknowledged,
        CASE
            WHEN (s.delivery_mode = 'queue'::text) THEN COALESCE(k.released, (0)::bigint)
            ELSE NULL::bigint
        END AS released,
        CASE
            WHEN (s.delivery_mode = 'queue'::text) THEN COALESCE(k.rejected, (0)::bigint)
            ELSE NULL::bigint
        END AS rejected,
        CASE
            WHEN (s.delivery_mode = 'queue'::text) THEN COALESCE(k.lock_expired, (0)::bigint)
            ELSE NULL::bigint
        END AS lock_expired,
    s.expiration_time,
    s.domain_topic
   FROM ((((eventgrid.event_subscriptions s
     LEFT JOIN eventgrid.subscription_counters c ON ((c.subscription_id = s.id)))
     LEFT JOIN eventgrid._backlogged_subscriptions() a(id) ON ((a.id = s.id)))
     LEFT JOIN LATERAL ( SELECT x.pending
           FROM eventgrid._backlog(s.id) x(pending, oldest, due_since)
          WHERE (a.id IS NOT NULL)
         OFFSET 0) b ON (true))
     LEFT JOIN LATERAL ( SELECT (sum(x.received))::bigint AS received,
            (sum(x.acknowledged))::bigint AS acknowledged,
            (sum(x.released))::bigint AS released,
            (sum(x.rejected))::bigint AS rejected,
            (sum(x.lock_expired))::bigint AS lock_expired
           FROM eventgrid.queue_counters x
          WHERE ((x.subscription_id = s.id) AND (s.delivery_mode = 'queue'::text))) k ON (true));

-- Metrics per topic (SPEC 20): with the GUC eventgrid.metrics_per_topic on
-- (say, ALTER ROLE eventgrid_exporter SET eventgrid.metrics_per_topic =
-- on), the per-subscription metric views give one row per topic instead
-- (a domain's domain topics count as the domain), event_subscription '',
-- so that a scrape's series follow the topics, not the subscriptions.
CREATE FUNCTION eventgrid._metrics_per_topic() RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN COALESCE(current_setting('eventgrid.metrics_per_topic', true), 'off')::boolean;
COMMENT ON FUNCTION eventgrid._metrics_per_topic() IS 'Internal: whether the GUC eventgrid.metrics_per_topic is on in this session (off when the library is not loaded): event_subscription_metrics, event_subscription_metric_labels and event_subscription_histograms then give one row per topic.';
REVOKE ALL ON FUNCTION eventgrid._metrics_per_topic() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid._metrics_per_topic() TO pg_monitor, eventgrid_admin;

CREATE OR REPLACE VIEW eventgrid.event_subscription_metrics AS
 SELECT m.topic, m.event_subscription, m.matched_events_total, m.delivery_success_total,
        m.pending_events, m.oldest_pending_event_age_seconds, m.overdue_seconds,
        m.paused, m.endpoint_on_probation
   FROM eventgrid._event_subscription_metrics() m
  WHERE NOT eventgrid._metrics_per_topic()
 UNION ALL
 SELECT split_part(m.topic, '/', 1), '',
        sum(m.matched_events_total)::bigint, sum(m.delivery_success_total)::bigint,
        sum(m.pending_events)::bigint,
        COALESCE(max(m.oldest_pending_event_age_seconds) FILTER (WHERE m.paused = 0), 0),
        COALESCE(max(m.overdue_seconds) FILTER (WHERE m.paused = 0), 0),
        min(m.paused), sum(m.endpoint_on_probation)::integer
   FROM eventgrid._event_subscription_metrics() m
  WHERE eventgrid._metrics_per_topic()
  GROUP BY 1;
COMMENT ON VIEW eventgrid.event_subscription_metrics IS 'Prometheus metrics per event subscription: counters matched_events_total (MatchedEventCount) and delivery_success_total (events delivered, DeliverySuccessCount); gauges pending_events (deliveries not finished, as delivery_statistics.pending), oldest_pending_event_age_seconds (since the oldest of them was published; 0 when none), overdue_seconds (how long the delivery due longest has been due: an event not attempted yet since its publish, a retry since its next attempt time; 0 when none is due; grows when nothing delivers), paused (1 when pause_delivery() holds it) and endpoint_on_probation (1 while its endpoint is on probation or probing, SPEC 6). With the GUC eventgrid.metrics_per_topic on, one row per topic (a domain for all its domain topics) with event_subscription '''': the sums, the oldest age and overdue time of its subscriptions not paused, paused 1 when every one is, endpoint_on_probation the number on probation (SPEC 20). Readable by pg_monitor and eventgrid_admin. README "Monitoring".';

-- the reasons a subscription's dead_lettered_total and dropped_total are
-- always reported by (0 until one happens), for both views' branches
CREATE FUNCTION eventgrid._dead_letter_reasons(delivery_mode text) RETURNS text[]
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN CASE delivery_mode
               WHEN 'queue' THEN ARRAY['MaxDeliveryCountExceeded', 'TimeToLiveExceeded', 'Rejected']
               ELSE ARRAY['MaxDeliveryAttemptsExceeded', 'TimeToLiveExceeded', 'NonRetriableError']
           END;
COMMENT ON FUNCTION eventgrid._dead_letter_reasons(delivery_mode text) IS 'Internal: the deadLetterReason values event_subscription_metric_labels reports for a subscription of this delivery_mode (queue: MaxDeliveryCountExceeded, TimeToLiveExceeded, Rejected; push: MaxDeliveryAttemptsExceeded, TimeToLiveExceeded, NonRetriableError), each always, 0 until it happens.';
REVOKE ALL ON FUNCTION eventgrid._dead_letter_reasons(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid._dead_letter_reasons(text) TO pg_monitor, eventgrid_admin;

CREATE OR REPLACE VIEW eventgrid.event_subscription_metric_labels AS
 WITH per_subscription AS (
 SELECT s.read_key AS topic,
    s.name AS event_subscription,
    'delivery_attempt_fail_total'::text AS metric,
    m.label,
    m.value
   FROM (eventgrid.event_subscriptions s
     JOIN eventgrid.subscription_metric_counts m ON (((m.subscription_id = s.id) AND (m.metric = 'attempt_fail'::text))))
UNION ALL
 SELECT s.read_key AS topic,
    s.name AS event_subscription,
    (k.metric || '_total'::text) AS metric,
    r.reason AS label,
    COALESCE(m.value, (0)::double precision) AS value
   FROM (((eventgrid.event_subscriptions s
     CROSS JOIN ( VALUES ('dead_lettered'::text), ('dropped'::text)) k(metric))
     CROSS JOIN LATERAL unnest(eventgrid._dead_letter_reasons(s.delivery_mode)) r(reason))
     LEFT JOIN eventgrid.subscription_metric_counts m ON (((m.subscription_id = s.id) AND (m.metric = k.metric) AND (m.label = r.reason))))
 )
 SELECT p.topic, p.event_subscription, p.metric, p.label, p.value
   FROM per_subscription p
  WHERE NOT eventgrid._metrics_per_topic()
 UNION ALL
 SELECT s.topic, '', 'delivery_attempt_fail_total', m.label, sum(m.value)
   FROM eventgrid.event_subscriptions s
   JOIN eventgrid.subscription_metric_counts m ON m.subscription_id = s.id AND m.metric = 'attempt_fail'
  WHERE eventgrid._metrics_per_topic()
  GROUP BY s.topic, m.label
 UNION ALL
 SELECT r.topic, '', k.metric || '_total', r.reason, COALESCE(m.value, 0)
   FROM (SELECT DISTINCT t.topic, x.reason
           FROM (SELECT DISTINCT s.topic, s.delivery_mode FROM eventgrid.event_subscriptions s
                  WHERE eventgrid._metrics_per_topic()) t
          CROSS JOIN LATERAL unnest(eventgrid._dead_letter_reasons(t.delivery_mode)) x(reason)) r
  CROSS JOIN (VALUES ('dead_lettered'), ('dropped')) k(metric)
   LEFT JOIN (SELECT s.topic, c.metric, c.label, sum(c.value) AS value
                FROM eventgrid.subscription_metric_counts c
                JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id
               WHERE c.metric IN ('dead_lettered', 'dropped') AND eventgrid._metrics_per_topic()
               GROUP BY 1, 2, 3) m ON m.topic = r.topic AND m.metric = k.metric AND m.label = r.reason;
COMMENT ON VIEW eventgrid.event_subscription_metric_labels IS 'Prometheus counters per event subscription and label: delivery_attempt_fail_total by outcome (label: the lastDeliveryOutcome of each failed attempt, one per event; DeliveryAttemptFailCount; a row once an attempt failed so), dead_lettered_total and dropped_total by reason (label: deadLetterReason; DeadLetteredCount, DroppedEventCount; every reason always, 0 until it happens). Counted from 0.9.0 on. With the GUC eventgrid.metrics_per_topic on, one row per topic (a domain for all its domain topics), metric and label, with event_subscription '''' and the sum (SPEC 20). Readable by pg_monitor and eventgrid_admin. README "Monitoring".';

-- the histograms per topic are summed from the counts kept (only the
-- subscriptions that observed something have rows), not from each
-- subscription's 32 buckets
CREATE OR REPLACE VIEW eventgrid.event_subscription_histograms AS
 SELECT x.topic,
    x.name AS event_subscription,
    x.histogram,
    x.le_text AS le,
    sum(x.n) OVER (PARTITION BY x.id, x.histogram ORDER BY x.le) AS bucket,
    x.total AS sum,
    sum(x.n) OVER (PARTITION BY x.id, x.histogram) AS count
   FROM ( SELECT s.id::text AS id,
            s.read_key AS topic,
            s.name,
            h.histogram,
            b.le,
            l.le_text,
            COALESCE(m.value, (0)::double precision) AS n,
            COALESCE(ms.value, (0)::double precision) AS total
           FROM (((((eventgrid.event_subscriptions s
             CROSS JOIN ( VALUES ('destination_processing_duration_seconds'::text,'processing'::text), ('delivery_latency_seconds'::text,'latency'::text)) h(histogram, kind))
             CROSS JOIN LATERAL unnest(eventgrid._histogram_buckets(h.histogram)) b(le))
             CROSS JOIN LATERAL ( SELECT
                        CASE
                            WHEN (b.le = 'Infinity'::double precision) THEN '+Inf'::text
                            ELSE (b.le)::text
                        END AS le) l(le_text))
             LEFT JOIN eventgrid.subscription_metric_counts m ON (((m.subscription_id = s.id) AND (m.metric = (h.kind || '_bucket'::text)) AND (m.label = l.le_text))))
             LEFT JOIN eventgrid.subscription_metric_counts ms ON (((ms.subscription_id = s.id) AND (ms.metric = (h.kind || '_sum'::text)) AND (ms.label = ''::text))))
          WHERE NOT eventgrid._metrics_per_topic()
        UNION ALL
         SELECT t.topic AS id,
            t.topic,
            '' AS name,
            h.histogram,
            b.le,
            l.le_text,
            COALESCE(m.value, (0)::double precision) AS n,
            COALESCE(ms.value, (0)::double precision) AS total
           FROM (SELECT DISTINCT s.topic FROM eventgrid.event_subscriptions s
                  WHERE eventgrid._metrics_per_topic()) t
             CROSS JOIN ( VALUES ('destination_processing_duration_seconds'::text,'processing'::text), ('delivery_latency_seconds'::text,'latency'::text)) h(histogram, kind)
             CROSS JOIN LATERAL unnest(eventgrid._histogram_buckets(h.histogram)) b(le)
             CROSS JOIN LATERAL ( SELECT
                        CASE
                            WHEN (b.le = 'Infinity'::double precision) THEN '+Inf'::text
                            ELSE (b.le)::text
                        END AS le) l(le_text)
             LEFT JOIN ( SELECT s.topic, c.metric, c.label, sum(c.value) AS value
                           FROM eventgrid.subscription_metric_counts c
                           JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id
                          WHERE c.metric IN ('processing_bucket', 'latency_bucket')
                            AND eventgrid._metrics_per_topic()
                          GROUP BY 1, 2, 3) m ON m.topic = t.topic AND m.metric = h.kind || '_bucket' AND m.label = l.le_text
             LEFT JOIN ( SELECT s.topic, c.metric, sum(c.value) AS value
                           FROM eventgrid.subscription_metric_counts c
                           JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id
                          WHERE c.metric IN ('processing_sum', 'latency_sum') AND c.label = ''
                            AND eventgrid._metrics_per_topic()
                          GROUP BY 1, 2) ms ON ms.topic = t.topic AND ms.metric = h.kind || '_sum') x;
COMMENT ON VIEW eventgrid.event_subscription_histograms IS 'Prometheus histograms per event subscription, one row per bucket: histogram destination_processing_duration_seconds (each request that got an HTTP answer, from sending to the answer: DestinationProcessingDurationInMs) or delivery_latency_seconds (each event delivered, from publish to the successful answer); le (the bucket''s upper bound in seconds, +Inf last), bucket (observations up to le, cumulative), sum (seconds in all) and count (observations; the +Inf bucket). Kept by the delivery workers as they record outcomes, not computed from the attempt history. With the GUC eventgrid.metrics_per_topic on, one histogram per topic (a domain for all its domain topics), event_subscription '''', summed over its subscriptions (SPEC 20). Readable by pg_monitor and eventgrid_admin. README "Monitoring".';
