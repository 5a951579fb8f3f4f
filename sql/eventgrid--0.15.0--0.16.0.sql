-- eventgrid 0.15.0 -> 0.16.0: ordered delivery from the position.  An
-- ordered event subscription's first attempts are claimed from its
-- position like an unordered one's, by one delivery worker at a time (the
-- position's lease_owner), which sends each key's events one after another;
-- only a key whose oldest event fails is parked in eventgrid.retries
-- (with what follows it), as before.  Events waiting in the retries keep
-- their keys and order.

\echo Use "ALTER EXTENSION eventgrid UPDATE TO '0.16.0'" to load this file. \quit

ALTER TABLE eventgrid.subscription_positions ADD COLUMN lease_owner integer;
COMMENT ON COLUMN eventgrid.subscription_positions.lease_owner IS 'Internal: of an ordered event subscription (SPEC 13), the pid of the delivery worker that holds first attempts of it in flight (NULL: none); only that worker claims from the position until it has recorded them, so that one worker orders each key''s events. Cleared when it has, or by the recovery when it no longer runs.';

CREATE FUNCTION eventgrid._park_ordering_keys(sids bigint[], key_hashes bigint[], ids bigint[], dues timestamp with time zone[]) RETURNS integer
    LANGUAGE sql
    BEGIN ATOMIC
 WITH firsts AS (
          SELECT DISTINCT ON (k.sid, k.h) k.sid,
             k.h,
             k.id,
             k.due
            FROM UNNEST(_park_ordering_keys.sids, _park_ordering_keys.key_hashes, _park_ordering_keys.ids, _park_ordering_keys.dues) k(sid, h, id, due)
           ORDER BY k.sid, k.h, k.id
         ), started AS (
          INSERT INTO eventgrid.ordering_keys AS k (subscription_id, ordering_key_hash, head_id)  SELECT f.sid,
                     f.h,
                     f.id
                    FROM firsts f
                   ORDER BY f.sid, f.h ON CONFLICT(subscription_id, ordering_key_hash) DO UPDATE SET head_id = k.head_id
           RETURNING k.head_id,
             (k.xmax = 0) AS started
         ), due_now AS (
          UPDATE eventgrid.retries AS r SET next_attempt_at = f.due
            FROM started
              JOIN firsts f ON f.id = started.head_id
           WHERE (started.started AND (r.id = started.head_id))
           RETURNING 1 AS "?column?"
         )
  SELECT (count(*))::integer AS count
    FROM due_now;
END;
COMMENT ON FUNCTION eventgrid._park_ordering_keys(sids bigint[], key_hashes bigint[], ids bigint[], dues timestamp with time zone[]) IS 'Internal: first attempts ids of ordered event subscriptions (subscription sids, key key_hashes) were just written into the retries waiting (next_attempt_at ''infinity''), a key''s in publish order: an attempt failed, or an event waits behind one that did; of each key that had no head, the oldest becomes its head, due at its own time in dues; returns how many. Locks the keys'' rows of eventgrid.ordering_keys, in order, as _promote_ordering_keys does.';
REVOKE ALL ON FUNCTION eventgrid._park_ordering_keys(sids bigint[], key_hashes bigint[], ids bigint[], dues timestamp with time zone[]) FROM PUBLIC;
