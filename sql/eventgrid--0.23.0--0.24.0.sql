-- eventgrid 0.23.0 -> 0.24.0: a WAL source's backfill (SPEC 19).
-- create_wal_source(..., backfill => true) publishes every row the tables
-- mapped in its creating transaction hold, as of the snapshot its slot is
-- made at, before it streams the changes after it: each row is in the
-- backfill or in a later change.  The progress (the last primary key
-- published, per table) is committed with the events, so a restart goes
-- on from there.

\echo Use "ALTER EXTENSION eventgrid UPDATE TO '0.24.0'" to load this file. \quit

ALTER TABLE eventgrid.wal_source_definitions
    ADD COLUMN backfill boolean NOT NULL DEFAULT false,
    -- the creating transaction: the mappings it makes are backfilled
    ADD COLUMN created_xact xid8;
ALTER TABLE eventgrid.wal_source_definitions ALTER COLUMN created_xact SET DEFAULT pg_catalog.pg_current_xact_id();
COMMENT ON TABLE eventgrid.wal_source_definitions IS 'WAL sources (create_wal_source()): the source database''s libpq connection string (a password in it is never shown: the view wal_sources masks it), its publication, the logical replication slot read there, the message prefix taken as events, whether it is paused, the role that created it (a non-superuser''s connection must authenticate with a password), whether the tables mapped in its creating transaction (created_xact) are backfilled. Read by the WAL source workers. SPEC 19.';

ALTER TABLE eventgrid.wal_source_tables
    -- pending: its rows are to be published before the stream; done: they are; NULL: no backfill
    ADD COLUMN backfill_state text CHECK (backfill_state IN ('pending', 'done')),
    -- the primary key's values (as text, in the key's order) of the last row published by the backfill
    ADD COLUMN backfill_after text[],
    ADD COLUMN backfilled_rows bigint NOT NULL DEFAULT 0;
COMMENT ON TABLE eventgrid.wal_source_tables IS 'Tables of WAL sources whose changes are published (publish_table_changes(..., source => ...)): the table as the source names it (schema.table), the topic, the options of in-database table changes, and its backfill''s progress (pending or done, the primary key of the last row published, the rows published). SPEC 19.';

-- the source position the worker is done with (published and flushed here, or
-- nothing to publish): beyond the origin's, which moves only with a commit here
ALTER TABLE eventgrid.wal_source_status ADD COLUMN confirmed_lsn pg_lsn;
ALTER TABLE eventgrid.wal_source_status DROP CONSTRAINT wal_source_status_state_check;
ALTER TABLE eventgrid.wal_source_status ADD CONSTRAINT wal_source_status_state_check
    CHECK (state IN ('connecting', 'backfilling', 'streaming', 'paused', 'failing'));

DROP FUNCTION eventgrid.create_wal_source(text, text, text, text, text);
CREATE FUNCTION eventgrid.create_wal_source(name text, connection text, publication text, slot_name text DEFAULT NULL,
                                            message_prefix text DEFAULT 'eventgrid',
                                            backfill boolean DEFAULT false) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint;
    slot text := coalesce(slot_name, 'eventgrid_' || lower(replace(name, '-', '_')));
BEGIN
    PERFORM eventgrid._check_not_null('WAL source name', name);
    PERFORM eventgrid._check_not_null('connection', connection);
    PERFORM eventgrid._check_not_null('publication', publication);
    PERFORM eventgrid._check_not_null('message_prefix', message_prefix);
    PERFORM eventgrid._check_not_null('backfill', backfill);
    IF NOT eventgrid._is_topic_name(name) THEN  -- the same shape as a topic's name
        RAISE EXCEPTION 'invalid WAL source name %', eventgrid._quote(name)
            USING ERRCODE = 'invalid_name',
                  HINT = 'A WAL source name has 3 to 50 characters: letters, digits and hyphens.';
    END IF;
    IF publication = '' OR length(publication) > 63 THEN
        RAISE EXCEPTION 'publication must be 1 to 63 characters, got %', eventgrid._quote(publication)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'The name of a publication of the source database.';
    END IF;
    IF slot !~ '^[a-z0-9_]{1,63}$' THEN
        RAISE EXCEPTION 'invalid slot_name %', eventgrid._quote(slot)
            USING ERRCODE = 'invalid_name',
                  HINT = 'A replication slot name has 1 to 63 lower-case letters, digits and underscores.';
    END IF;
    IF message_prefix = '' OR length(message_prefix) > 200 THEN
        RAISE EXCEPTION 'message_prefix must be 1 to 200 characters, got %', eventgrid._quote(message_prefix)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'The prefix of pg_logical_emit_message() taken as events (default eventgrid).';
    END IF;
    IF EXISTS (SELECT 1 FROM eventgrid.wal_source_definitions w WHERE w.name = create_wal_source.name) THEN
        RAISE EXCEPTION 'WAL source "%" already exists', name USING ERRCODE = 'duplicate_object';
    END IF;
    IF EXISTS (SELECT 1 FROM eventgrid.wal_source_definitions w WHERE w.slot_name = slot
                  AND w.connection = create_wal_source.connection) THEN
        RAISE EXCEPTION 'WAL source of slot "%" on that connection already exists', slot
            USING ERRCODE = 'duplicate_object', HINT = 'Give each WAL source of one source database a slot of its own.';
    END IF;
    -- the role that called (SET ROLE's, else the session's): a superuser's may use any authentication
    PERFORM eventgrid._wal_source_check_connection(connection, eventgrid._caller()::text::regrole::oid);
    INSERT INTO eventgrid.wal_source_definitions (name, connection, publication, slot_name, message_prefix, owner_role, backfill)
    VALUES (name, connection, publication, slot, message_prefix, eventgrid._caller()::text::regrole::oid, backfill)
    RETURNING id INTO sid;
    INSERT INTO eventgrid.wal_source_status (source_id) VALUES (sid);
    PERFORM eventgrid._wake_worker_at_commit();
    RETURN sid;
END $$;
COMMENT ON FUNCTION eventgrid.create_wal_source(text, text, text, text, text, boolean) IS 'Creates a WAL source: a background worker of this server reads the source database''s write-ahead log through the logical replication slot slot_name (default eventgrid_<name>, hyphens as underscores; created with pgoutput if missing, else resumed) for publication, and publishes the pg_logical_emit_message(true, message_prefix, ''{"topic": ..., "events": [...]}'') messages and the changes of the tables mapped with publish_table_changes(..., source => name). name: 3-50 letters, digits and hyphens. connection: a libpq connection string to the source (PostgreSQL 14 or later, with wal_level = logical, a role with REPLICATION); for a role that is not a superuser it must hold a password. Mappings made in the same transaction are in place before it first reads; with backfill, every row their tables hold is published first (<prefix>.Backfilled events, data.operation BACKFILL), as of the snapshot the slot is made at: each row is in the backfill or in a later change (state backfilling, progress in wal_sources.backfilled_rows; a restart goes on after the last row published). Returns its id. Requires eventgrid_admin. Errors: 22004 NULL, 42602 name or slot_name, 22023, 42710 exists, 28000 no password. SPEC 19.';
REVOKE ALL ON FUNCTION eventgrid.create_wal_source(text, text, text, text, text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.create_wal_source(text, text, text, text, text, boolean) TO eventgrid_admin;

CREATE OR REPLACE FUNCTION eventgrid.publish_table_changes(table_name text, topic text, source text,
                                                operations text[] DEFAULT ARRAY['INSERT', 'UPDATE', 'DELETE'],
                                                columns text[] DEFAULT NULL, update_columns text[] DEFAULT NULL,
                                                event_type_prefix text DEFAULT NULL) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._wal_source_named(source);
    ops text[];
BEGIN
    PERFORM eventgrid._check_not_null('table_name', table_name);
    PERFORM eventgrid._check_not_null('topic', topic);
    PERFORM eventgrid._check_not_null('operations', operations);
    IF table_name !~ '^[^.]+\.[^.]+$' OR length(table_name) > 127 THEN
        RAISE EXCEPTION 'table_name must be schema.table as the source names it, got %', eventgrid._quote(table_name)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'For example public.orders (names as they are, unquoted).';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = publish_table_changes.topic FOR KEY SHARE) THEN
        RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object', HINT = 'Create it first with eventgrid.create_topic().';
    END IF;
    IF EXISTS (SELECT 1 FROM eventgrid.domains d WHERE d.name = publish_table_changes.topic) THEN
        RAISE EXCEPTION '% is an event domain: table changes are published to a topic', eventgrid._quote(topic)
            USING ERRCODE = 'wrong_object_type', HINT = 'Publish them to a topic of their own (eventgrid.create_topic()).';
    END IF;
    SELECT array_agg(DISTINCT upper(o) ORDER BY upper(o)) INTO ops FROM unnest(operations) o;
    IF ops IS NULL OR NOT ops <@ ARRAY['INSERT', 'UPDATE', 'DELETE'] OR array_position(ops, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'operations must be one or more of INSERT, UPDATE and DELETE, got %', eventgrid._quote(operations::text)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'TRUNCATE publishes nothing; pass for example ARRAY[''INSERT'', ''UPDATE''].';
    END IF;
    IF event_type_prefix IS NOT NULL AND (length(event_type_prefix) NOT BETWEEN 1 AND 200) THEN
        RAISE EXCEPTION 'event_type_prefix must be 1 to 200 characters' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- mapped in the transaction that created a source with backfill: its rows are backfilled
    INSERT INTO eventgrid.wal_source_tables AS m (source_id, table_name, topic, operations, columns, update_columns,
                                                  event_type_prefix, backfill_state)
    SELECT sid, table_name, topic, ops, columns, update_columns, event_type_prefix,
           CASE WHEN d.backfill AND d.created_xact = pg_current_xact_id() THEN 'pending' END
      FROM eventgrid.wal_source_definitions d WHERE d.id = sid
    ON CONFLICT ON CONSTRAINT wal_source_tables_pkey DO UPDATE
       SET operations = EXCLUDED.operations, columns = EXCLUDED.columns, update_columns = EXCLUDED.update_columns,
           event_type_prefix = EXCLUDED.event_type_prefix;
END $$;
COMMENT ON FUNCTION eventgrid.publish_table_changes(text, text, text, text[], text[], text[], text) IS 'Publishes the changes of a table of a WAL source to a topic (SPEC 19): each row an INSERT, UPDATE or DELETE there changes becomes one event, with the same subject, event types and data as in-database table changes; the table is named as the source names it (schema.table) and must be in the source''s publication. data.old is the whole row when the source table has REPLICA IDENTITY FULL, else its key columns; a large value an UPDATE left unchanged is not in the WAL and is left out of data.new. Called again for the same table and topic it replaces the settings; takes effect for the transactions the source''s worker reads from then on. Mapped in the transaction that created the source with backfill => true, the table''s existing rows are published first. Requires eventgrid_admin. Errors: 22004, 42704 no such source or topic, 42809 an event domain, 22023. SPEC 19.';
REVOKE ALL ON FUNCTION eventgrid.publish_table_changes(text, text, text, text[], text[], text[], text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.publish_table_changes(text, text, text, text[], text[], text[], text) TO eventgrid_admin;

CREATE OR REPLACE VIEW eventgrid.wal_sources AS
 SELECT d.name,
    eventgrid._wal_source_check_connection(d.connection, 10) AS connection,
    d.publication,
    d.slot_name,
    CASE WHEN d.paused THEN 'paused' ELSE coalesce(s.state, 'connecting') END AS state,
    greatest(eventgrid._wal_source_origin_lsn(d.id), s.confirmed_lsn) AS confirmed_lsn,
    s.source_lsn,
    greatest(s.source_lsn - greatest(eventgrid._wal_source_origin_lsn(d.id), s.confirmed_lsn), 0)::bigint AS lag_bytes,
    CASE WHEN s.source_lsn > greatest(eventgrid._wal_source_origin_lsn(d.id), s.confirmed_lsn) AND s.last_commit_time IS NOT NULL
         THEN greatest(extract(epoch FROM now() - s.last_commit_time), 0) ELSE 0 END::double precision AS lag_seconds,
    coalesce(s.events_published, 0) AS events_published,
    coalesce(s.rejects, 0) AS rejects,
    s.last_error,
    s.last_error_time,
    coalesce((SELECT sum(m.backfilled_rows) FROM eventgrid.wal_source_tables m WHERE m.source_id = d.id), 0)::bigint
        AS backfilled_rows
   FROM eventgrid.wal_source_definitions d
   LEFT JOIN eventgrid.wal_source_status s ON s.source_id = d.id;
COMMENT ON VIEW eventgrid.wal_sources IS 'WAL sources (SPEC 19): name, connection (its password as ********), publication, slot_name, state (connecting, backfilling, streaming, paused, failing), confirmed_lsn (the source position whose events are committed here: the last source transaction published, or beyond it what had nothing to publish), source_lsn (the source''s WAL end last reported), lag_bytes (source_lsn less confirmed_lsn), lag_seconds (while lag_bytes is above 0: how long ago the source committed the last transaction published here; else 0), events_published, rejects (rows in wal_source_rejects), the last error with its time, and backfilled_rows (rows of the source''s tables published by its backfill so far: create_wal_source(..., backfill => true)).';
REVOKE ALL ON eventgrid.wal_sources FROM PUBLIC;
GRANT SELECT ON eventgrid.wal_sources TO eventgrid_admin;

CREATE OR REPLACE VIEW eventgrid.wal_source_metrics AS
 SELECT w.name AS wal_source,
    w.state,
    (w.state = 'streaming')::integer AS streaming,
    coalesce(w.lag_bytes, 0) AS lag_bytes,
    w.lag_seconds,
    w.events_published AS events_published_total,
    w.rejects AS rejects_total,
    w.backfilled_rows AS backfilled_rows_total
   FROM eventgrid.wal_sources w;
COMMENT ON VIEW eventgrid.wal_source_metrics IS 'What the Prometheus exporter reads of each WAL source (SPEC 19; monitoring/postgres_exporter.yml): its name and state, 1 while streaming, lag_bytes, lag_seconds, and the counters events_published_total, rejects_total and backfilled_rows_total; no connection string. Readable by pg_monitor.';
REVOKE ALL ON eventgrid.wal_source_metrics FROM PUBLIC;
GRANT SELECT ON eventgrid.wal_source_metrics TO pg_monitor, eventgrid_admin;
