-- eventgrid 0.6.0 -> 0.7.0: the queue's reading rules written once, in the
-- schema, for the delivery workers and the views alike; endpoint URLs of at
-- most 2048 bytes.
--
-- Three SQL functions the planner inlines (SQL-standard bodies, not STRICT,
-- no SET clause) hold the rules the workers' statements and
-- eventgrid._pending() used to write out each on its own:
--  - eventgrid._in_batch(): is a transaction in the snapshot batch
--    (since, upto]?  0.5.0's function of that name was STRICT around an
--    AND, which the planner cannot inline; this one can, so calling it
--    costs nothing over writing its body out;
--  - eventgrid._chunk_events(): the events of a chunk in flight, as the
--    claim took them (its key range in its batch), read in two index
--    ranges that stop at the chunk's end;
--  - eventgrid._unpassed_events(): the events a position has not passed,
--    read in two index ranges bounded where the position stands.
-- eventgrid._pending() now counts with them.
--
-- Endpoints longer than 2048 bytes are refused from now on (the rule is
-- eventgrid._endpoint_problem(), in the library): one such endpoint's health
-- row was too large for its index and stopped every outcome from being
-- recorded.  An event subscription that already has one must be dropped or
-- given a shorter endpoint first: its rows would not restore from a dump.
\echo Use "ALTER EXTENSION eventgrid UPDATE" to load this file. \quit

DO $$
DECLARE
    bad text;
BEGIN
    SELECT string_agg(format('%s/%s', s.topic, s.name), ', ') INTO bad
      FROM eventgrid.event_subscriptions s WHERE octet_length(s.endpoint) > 2048;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'event subscriptions with an endpoint longer than 2048 bytes: %', bad
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Drop them (eventgrid.drop_event_subscription) or re-create them with a shorter endpoint, then update again.';
    END IF;
END $$;

CREATE FUNCTION eventgrid._in_batch(txid xid8, since pg_snapshot, upto pg_snapshot) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN pg_visible_in_snapshot(txid, upto) AND NOT pg_visible_in_snapshot(txid, since);

CREATE FUNCTION eventgrid._chunk_events(topic text, done pg_snapshot, upto pg_snapshot, after_txid xid8,
                                        after_id bigint, last_txid xid8, last_id bigint)
RETURNS SETOF eventgrid.events
LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
    -- the transactions before the chunk's last one, and then the last one up
    -- to its last event: a single scan bounded above by the row comparison
    -- (txid, id) <= (last_txid, last_id) does not stop at that bound when the
    -- transaction goes on (PostgreSQL 15's btree ends a scan on a row
    -- comparison only where its first column passes the bound)
    SELECT e.* FROM eventgrid.events e
     WHERE e.topic = _chunk_events.topic AND e.txid >= pg_snapshot_xmin(_chunk_events.done)
       AND e.txid < _chunk_events.last_txid
       AND (e.txid, e.id) > (coalesce(_chunk_events.after_txid, '0'::xid8), coalesce(_chunk_events.after_id, 0))
       AND eventgrid._in_batch(e.txid, _chunk_events.done, _chunk_events.upto)
    UNION ALL
    SELECT e.* FROM eventgrid.events e
     WHERE e.topic = _chunk_events.topic AND e.txid >= pg_snapshot_xmin(_chunk_events.done)
       AND e.txid = _chunk_events.last_txid AND e.id <= _chunk_events.last_id
       AND (e.txid, e.id) > (coalesce(_chunk_events.after_txid, '0'::xid8), coalesce(_chunk_events.after_id, 0))
       AND eventgrid._in_batch(e.txid, _chunk_events.done, _chunk_events.upto);
END;

CREATE FUNCTION eventgrid._unpassed_events(topic text, done pg_snapshot, upto pg_snapshot, after_txid xid8,
                                           after_id bigint)
RETURNS SETOF eventgrid.events
LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
    -- those after the position's last event (in (txid, id) order) that its
    -- last batch did not hold, and, before that event, those of transactions
    -- its open batch (upto) does not hold either: they were in progress
    -- when the batch was taken
    SELECT e.* FROM eventgrid.events e
     WHERE e.topic = _unpassed_events.topic AND e.txid >= pg_snapshot_xmin(_unpassed_events.done)
       AND (e.txid, e.id) > (coalesce(_unpassed_events.after_txid, '0'::xid8),
                             coalesce(_unpassed_events.after_id, 0))
       AND NOT pg_visible_in_snapshot(e.txid, _unpassed_events.done)
    UNION ALL
    SELECT e.* FROM eventgrid.events e
     WHERE _unpassed_events.upto IS NOT NULL AND e.topic = _unpassed_events.topic
       AND e.txid >= greatest(pg_snapshot_xmin(_unpassed_events.done), pg_snapshot_xmin(_unpassed_events.upto))
       AND e.txid < _unpassed_events.after_txid
       AND NOT pg_visible_in_snapshot(e.txid, _unpassed_events.done)
       AND NOT pg_visible_in_snapshot(e.txid, _unpassed_events.upto);
END;

CREATE OR REPLACE FUNCTION eventgrid._pending(subscription_id bigint) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
BEGIN ATOMIC
    SELECT
      -- events its position has not passed
      (SELECT count(*)
         FROM eventgrid.subscription_positions p
         JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id
         CROSS JOIN LATERAL eventgrid._unpassed_events(s.topic, p.done, p.upto, p.after_txid, p.after_id) e
        WHERE p.subscription_id = _pending.subscription_id
          AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with,
                                 s.subject_ends_with, s.is_subject_case_sensitive,
                                 s.advanced_filters, s.enable_advanced_filtering_on_arrays))
      -- first attempts claimed and not recorded yet
      + (SELECT count(*)
           FROM eventgrid.chunks_in_flight c
           JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id
           CROSS JOIN LATERAL eventgrid._chunk_events(c.topic, c.done, c.upto, c.after_txid, c.after_id,
                                                      c.last_txid, c.last_id) e
          WHERE c.subscription_id = _pending.subscription_id
            AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with,
                                   s.subject_ends_with, s.is_subject_case_sensitive,
                                   s.advanced_filters, s.enable_advanced_filtering_on_arrays))
      + (SELECT count(*) FROM eventgrid.retries r WHERE r.subscription_id = _pending.subscription_id);
END;

CREATE OR REPLACE FUNCTION eventgrid._check_endpoint(endpoint text) RETURNS void
LANGUAGE plpgsql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    problem text := eventgrid._endpoint_problem(endpoint);
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'invalid endpoint %: %', eventgrid._quote(endpoint), problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use an absolute http:// or https:// URL of at most 2048 bytes with a host and no user name or password; send credentials as a secret delivery property.';
    END IF;
END $$;

-- installations made from 0.1.0 had another wording (test/t/023 found it)
COMMENT ON TABLE eventgrid.topic_counters IS
    'Running totals per topic: events that matched no event subscription.';
COMMENT ON FUNCTION eventgrid._in_batch(xid8, pg_snapshot, pg_snapshot) IS
    'Internal: is an event of transaction txid in the snapshot batch (since, upto]: visible in upto and not in since (PgQ''s rule)? Inlined by the planner.';
COMMENT ON FUNCTION eventgrid._chunk_events(text, pg_snapshot, pg_snapshot, xid8, bigint, xid8, bigint) IS
    'Internal: the events of a chunk in flight (eventgrid.chunks_in_flight), as the claim took them: its key range in its batch, before filters. Inlined by the planner; the delivery workers and eventgrid._pending() read chunks through it.';
COMMENT ON FUNCTION eventgrid._unpassed_events(text, pg_snapshot, pg_snapshot, xid8, bigint) IS
    'Internal: the events of a topic that a position (done, upto, last event) has not passed, before filters. Inlined by the planner; the upkeep worker''s backlog count and eventgrid._pending() read through it.';
COMMENT ON FUNCTION eventgrid._endpoint_problem(text) IS
    'Internal: NULL when libcurl''s URL parser accepts the endpoint (http or https, a host, port 1-65535, no user name or password, at most 2048 bytes), else why not.';

-- Which eventgrid workers run, from their shared-memory slots (superuser only).
CREATE FUNCTION eventgrid._worker_pids(OUT worker text, OUT pid integer) RETURNS SETOF record
AS 'MODULE_PATHNAME', 'eventgrid_worker_pids' LANGUAGE C VOLATILE;
REVOKE EXECUTE ON FUNCTION eventgrid._worker_pids() FROM PUBLIC;
COMMENT ON FUNCTION eventgrid._worker_pids() IS
    'Internal: each delivery worker and the upkeep worker with the pid in its shared-memory slot, NULL when it does not run. A worker sets its slot once its exit callback is registered and that callback clears it, so a pid here is a running process.';

-- PUBLIC may execute only publish(); the views call these with the caller's privileges
REVOKE EXECUTE ON FUNCTION
    eventgrid._in_batch(xid8, pg_snapshot, pg_snapshot),
    eventgrid._chunk_events(text, pg_snapshot, pg_snapshot, xid8, bigint, xid8, bigint),
    eventgrid._unpassed_events(text, pg_snapshot, pg_snapshot, xid8, bigint)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    eventgrid._in_batch(xid8, pg_snapshot, pg_snapshot),
    eventgrid._chunk_events(text, pg_snapshot, pg_snapshot, xid8, bigint, xid8, bigint),
    eventgrid._unpassed_events(text, pg_snapshot, pg_snapshot, xid8, bigint)
    TO eventgrid_admin;

COMMENT ON FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text) IS 'Creates an event subscription and returns its id. endpoint: http(s) URL that libcurl parses, with a host, at most 2048 bytes (no user name or password). event_delivery_schema: defaults to the topic''s input schema (namespace topics: CloudEvents only). Filters: included_event_types (case-insensitive), subject_begins_with / subject_ends_with (case-insensitive unless is_subject_case_sensitive), advanced_filters (Event Grid JSON, see set_advanced_filters) with enable_advanced_filtering_on_arrays (false). Retry policy of a custom topic: max_delivery_attempts 1-30 (30), event_ttl 1-1440 minutes (1440); of a namespace topic: max_delivery_count 1-10 (10), event_time_to_live ISO 8601 PT1M-P7D (P7D); the other profile''s arguments are refused. max_events_per_batch 1-5000, preferred_batch_size_in_kilobytes 1-1024 (either turns batching on), deadletter (false). Requires eventgrid_admin. Errors: 42704, 42602, 22023, 22003, 22004, 54000, 42710. SPEC 1, 4, 5, 7, 9.';
