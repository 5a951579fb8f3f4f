-- eventgrid 0.7.0 -> 0.8.0: table changes published as events, and
-- Standard Webhooks signatures.
--
-- eventgrid.publish_table_changes(table, topic, ...) makes every INSERT,
-- UPDATE and DELETE on an application table publish one event per changed
-- row to a topic, in the changing transaction: AFTER ... FOR EACH STATEMENT
-- triggers with transition tables (REFERENCING NEW TABLE / OLD TABLE) run
-- eventgrid._table_change_trigger(), which turns the statement's rows into
-- events with one INSERT ... SELECT into eventgrid.events.  The publications
-- are rows of eventgrid.table_publications, shown by the view
-- eventgrid.table_change_publications; an event trigger forgets those of a
-- dropped table, and drop_topic() stops those of a dropped topic.
--
-- eventgrid.set_signing_secret(topic, subscription, ...) gives a
-- subscription a Standard Webhooks secret (eventgrid.signing_secrets, which
-- no role but the extension's owner may read; a previous secret may keep
-- signing beside it for a while); the delivery workers sign each of its
-- requests (webhook-id, webhook-timestamp, webhook-signature).
--
-- The attempt history keeps the first 512 bytes of a failed answer's body
-- (attempt_log.response_body, delivery_attempts.response_body), and the
-- view eventgrid.worker_status shows the admin role what the workers do;
-- eventgrid.pause_delivery() / resume_delivery() pause without a superuser;
-- eventgrid.update_event_subscription() edits a subscription in place;
-- max_events_per_second limits a subscription's rate; endpoint_validation
-- => 'handshake' validates its endpoint first (Event Grid's handshake,
-- eventgrid.validate_event_subscription(), event_subscription_validation);
-- and every time written about a delivery is on the workers' clock
-- (eventgrid._now()).
\echo Use "ALTER EXTENSION eventgrid UPDATE" to load this file. \quit

CREATE TABLE eventgrid.table_publications (
    source_table regclass NOT NULL,
    topic text NOT NULL REFERENCES eventgrid.topics (name) ON UPDATE CASCADE ON DELETE CASCADE,
    operations text[] NOT NULL
        CHECK (operations <@ ARRAY['INSERT', 'UPDATE', 'DELETE'] AND cardinality(operations) > 0),
    columns text[] CHECK (cardinality(columns) > 0),
    update_columns text[] CHECK (cardinality(update_columns) > 0),
    event_type_prefix text,
    created_at timestamp with time zone NOT NULL DEFAULT now(),
    -- the trigger's statements, made for the table's shape (columns, types,
    -- primary key) it was in: made again when the shape differs
    shape text,
    statements jsonb,
    PRIMARY KEY (source_table, topic)
);
COMMENT ON TABLE eventgrid.table_publications IS
    'Internal: the table change publications (eventgrid.publish_table_changes); read eventgrid.table_change_publications.';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.table_publications', '');

CREATE FUNCTION eventgrid._uri_escape(value text) RETURNS text
    LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
    AS 'MODULE_PATHNAME', 'eventgrid_uri_escape';
COMMENT ON FUNCTION eventgrid._uri_escape(value text) IS
    'Internal: value percent-encoded as one URI path segment (RFC 3986 unreserved characters kept), by libcurl.';

-- The role a SECURITY DEFINER function was called by: the SET ROLE role, or
-- the session user.  (current_user is the function's owner there.)
CREATE FUNCTION eventgrid._caller() RETURNS name
    LANGUAGE sql STABLE PARALLEL SAFE
    RETURN CASE WHEN pg_catalog.current_setting('role') OPERATOR(pg_catalog.<>) 'none'
                THEN pg_catalog.current_setting('role')::name
                ELSE session_user END;
COMMENT ON FUNCTION eventgrid._caller() IS
    'Internal: the role that called a SECURITY DEFINER function (the role SET ROLE chose, else the session user), whose privileges publish_table_changes() checks.';

-- Checks that the caller may publish the changes of source_table: TRIGGER on
-- it (or owning it) and SELECT on every column an event would carry or an
-- UPDATE would be compared on; the columns named must exist.
CREATE FUNCTION eventgrid._check_table_publication(source_table regclass, columns text[], update_columns text[])
    RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    caller name := eventgrid._caller();
    kind "char";
    missing text;
    unreadable text;
BEGIN
    SELECT c.relkind INTO kind FROM pg_class c WHERE c.oid = source_table;
    IF kind IS NULL OR kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION '% is not a table', source_table
            USING ERRCODE = 'wrong_object_type',
                  HINT = 'Table changes are published from ordinary and partitioned tables, not from views, foreign tables or other relations.';
    END IF;
    IF NOT has_table_privilege(caller, source_table, 'TRIGGER') THEN
        RAISE EXCEPTION 'permission denied to publish the changes of table %', source_table
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('Publishing needs the TRIGGER privilege on the table or its ownership: GRANT TRIGGER ON %s TO %I;', source_table, caller);
    END IF;
    SELECT string_agg(format('%I', c), ', ') INTO missing
      FROM unnest(columns || update_columns) c
     WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a
                        WHERE a.attrelid = source_table AND a.attname = c AND a.attnum > 0 AND NOT a.attisdropped);
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'table % has no column %', source_table, missing
            USING ERRCODE = 'undefined_column',
                  HINT = 'columns and update_columns name columns of the table.';
    END IF;
    SELECT string_agg(format('%I', a.attname), ', ' ORDER BY a.attnum) INTO unreadable
      FROM pg_attribute a
     WHERE a.attrelid = source_table AND a.attnum > 0 AND NOT a.attisdropped
       AND (columns IS NULL OR a.attname = ANY (columns) OR a.attname = ANY (update_columns))
       AND NOT has_column_privilege(caller, source_table, a.attnum, 'SELECT');
    IF unreadable IS NOT NULL THEN
        RAISE EXCEPTION 'permission denied to publish column % of table %', unreadable, source_table
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'An event carries only what its publisher may read: name the readable columns in columns and update_columns, or get SELECT on these.';
    END IF;
END $$;
COMMENT ON FUNCTION eventgrid._check_table_publication(source_table regclass, columns text[], update_columns text[]) IS
    'Internal: raises 42809 unless source_table is a table, 42501 unless the caller has TRIGGER on it and SELECT on the columns an event carries or compares, 42703 for a column it does not have.';

-- The names of the triggers a publication of a table to a topic uses.
CREATE FUNCTION eventgrid._table_change_trigger_name(topic text, operation text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    RETURN 'eg_' || topic || '_' || pg_catalog.lower(operation);
COMMENT ON FUNCTION eventgrid._table_change_trigger_name(topic text, operation text) IS
    'Internal: name of the statement trigger that publishes a table''s changes of one operation (INSERT, UPDATE, DELETE) to a topic: eg_<topic>_<insert|update|delete>, at most 60 bytes.';

CREATE FUNCTION eventgrid._drop_table_change_triggers(source_table regclass, topic text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    op text;
BEGIN
    FOREACH op IN ARRAY ARRAY['INSERT', 'UPDATE', 'DELETE'] LOOP
        -- only a trigger of ours: one of the table owner's own that has the
        -- name stays, and CREATE TRIGGER then says the name is taken
        IF EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = source_table
                      AND t.tgname = eventgrid._table_change_trigger_name(topic, op)
                      AND t.tgfoid = 'eventgrid._table_change_trigger()'::regprocedure) THEN
            EXECUTE format('DROP TRIGGER %I ON %s', eventgrid._table_change_trigger_name(topic, op), source_table);
        END IF;
    END LOOP;
END $$;
COMMENT ON FUNCTION eventgrid._drop_table_change_triggers(source_table regclass, topic text) IS
    'Internal: drops the statement triggers that publish source_table''s changes to topic.';

CREATE FUNCTION eventgrid.publish_table_changes(source_table regclass, topic text,
        operations text[] DEFAULT ARRAY['INSERT', 'UPDATE', 'DELETE'],
        columns text[] DEFAULT NULL, update_columns text[] DEFAULT NULL,
        event_type_prefix text DEFAULT NULL) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    ops text[];
    op text;
BEGIN
    PERFORM eventgrid._check_not_null('source_table', source_table);
    PERFORM eventgrid._check_not_null('topic', topic);
    PERFORM eventgrid._check_not_null('operations', operations);
    IF NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = publish_table_changes.topic FOR KEY SHARE) THEN
        RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object', HINT = 'Create it first with eventgrid.create_topic().';
    END IF;
    SELECT array_agg(DISTINCT upper(o) ORDER BY upper(o)) INTO ops FROM unnest(operations) o;
    IF ops IS NULL OR NOT ops <@ ARRAY['INSERT', 'UPDATE', 'DELETE'] OR array_position(ops, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'operations must be one or more of INSERT, UPDATE and DELETE, got %', eventgrid._quote(operations::text)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'TRUNCATE publishes nothing; pass for example ARRAY[''INSERT'', ''UPDATE''].';
    END IF;
    IF cardinality(columns) = 0 OR cardinality(update_columns) = 0
       OR array_position(columns, NULL) IS NOT NULL OR array_position(update_columns, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'columns and update_columns must be NULL or name at least one column, without NULLs'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'NULL columns carries every column; NULL update_columns publishes an UPDATE that changed any column.';
    END IF;
    IF event_type_prefix IS NOT NULL AND (length(event_type_prefix) NOT BETWEEN 1 AND 200 OR event_type_prefix ~ '[[:cntrl:]]') THEN
        RAISE EXCEPTION 'event_type_prefix must have 1 to 200 characters and no control characters, got %', eventgrid._quote(event_type_prefix)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'NULL gives <schema>.<table>; the event types are the prefix and .Inserted, .Updated or .Deleted.';
    END IF;
    PERFORM eventgrid._check_table_publication(source_table, columns, update_columns);
    SELECT array_agg(DISTINCT c ORDER BY c) INTO columns FROM unnest(columns) c;
    SELECT array_agg(DISTINCT c ORDER BY c) INTO update_columns FROM unnest(update_columns) c;

    PERFORM eventgrid._drop_table_change_triggers(source_table, topic);
    INSERT INTO eventgrid.table_publications AS p
           (source_table, topic, operations, columns, update_columns, event_type_prefix)
    VALUES (source_table, topic, ops, columns, update_columns, event_type_prefix)
    ON CONFLICT ON CONSTRAINT table_publications_pkey DO UPDATE
       SET operations = excluded.operations, columns = excluded.columns,
           update_columns = excluded.update_columns, event_type_prefix = excluded.event_type_prefix,
           shape = NULL, statements = NULL;
    FOREACH op IN ARRAY ops LOOP
        EXECUTE format('CREATE TRIGGER %I AFTER %s ON %s REFERENCING %s TABLE AS eventgrid_rows %s'
                       ' FOR EACH STATEMENT EXECUTE FUNCTION eventgrid._table_change_trigger(%L)',
                       eventgrid._table_change_trigger_name(topic, op), op, source_table,
                       CASE op WHEN 'DELETE' THEN 'OLD' ELSE 'NEW' END,
                       CASE op WHEN 'UPDATE' THEN 'OLD TABLE AS eventgrid_old_rows' ELSE '' END, topic);
    END LOOP;
END $$;
COMMENT ON FUNCTION eventgrid.publish_table_changes(source_table regclass, topic text, operations text[], columns text[], update_columns text[], event_type_prefix text) IS
    'Publishes the changes of a table to a topic: every row an INSERT, UPDATE or DELETE on it changes becomes one event, in the changing transaction (statement triggers with transition tables; COPY and INSERT ... ON CONFLICT included; TRUNCATE publishes nothing). operations: any of INSERT, UPDATE, DELETE (all three). columns: the columns an event carries (NULL: all). update_columns: an UPDATE publishes a row only when one of these changed (NULL: when any column changed). event_type_prefix: 1-200 characters (NULL: <schema>.<table>); event types <prefix>.Inserted, .Updated, .Deleted. Called again for the same table and topic it replaces the settings. Requires eventgrid_admin, TRIGGER on the table (or owning it) and SELECT on the columns carried and compared. Errors: 22004 NULL, 42704 no such topic, 22023, 42809 not a table, 42501, 42703.';

CREATE FUNCTION eventgrid.stop_publishing_table_changes(source_table regclass, topic text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM eventgrid._check_not_null('source_table', source_table);
    PERFORM eventgrid._check_not_null('topic', topic);
    IF NOT has_table_privilege(eventgrid._caller(), source_table, 'TRIGGER') THEN
        RAISE EXCEPTION 'permission denied to stop publishing the changes of table %', source_table
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Stopping a publication needs the TRIGGER privilege on the table or its ownership.';
    END IF;
    DELETE FROM eventgrid.table_publications p
     WHERE p.source_table = stop_publishing_table_changes.source_table AND p.topic = stop_publishing_table_changes.topic;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the changes of table % are not published to topic %', source_table, eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object', HINT = 'eventgrid.table_change_publications lists the publications.';
    END IF;
    PERFORM eventgrid._drop_table_change_triggers(source_table, topic);
END $$;
COMMENT ON FUNCTION eventgrid.stop_publishing_table_changes(source_table regclass, topic text) IS
    'Stops publishing the changes of a table to a topic (drops its triggers); events already published stay queued. Requires eventgrid_admin and TRIGGER on the table (or owning it). Errors: 22004 NULL, 42501, 42704 no such publication.';

-- The event of one changed row, in the topic's input schema.
CREATE FUNCTION eventgrid._table_change_event(input_schema text, event_type text, event_time text, source text,
        subject text, data jsonb) RETURNS jsonb
    LANGUAGE sql VOLATILE PARALLEL SAFE
    RETURN CASE input_schema
        WHEN 'CloudEventSchemaV1_0' THEN
            pg_catalog.jsonb_build_object('specversion', '1.0', 'id', pg_catalog.gen_random_uuid()::text,
                'source', source, 'subject', subject, 'type', event_type, 'time', event_time,
                'datacontenttype', 'application/json', 'data', data)
        WHEN 'CustomEventSchema' THEN data
        ELSE pg_catalog.jsonb_build_object('id', pg_catalog.gen_random_uuid()::text, 'subject', subject,
                'eventType', event_type, 'eventTime', event_time, 'dataVersion', '1', 'data', data)
    END;
COMMENT ON FUNCTION eventgrid._table_change_event(input_schema text, event_type text, event_time text, source text, subject text, data jsonb) IS
    'Internal: a table change event in a topic''s input schema: Event Grid (id, subject, eventType, eventTime, dataVersion "1", data), CloudEvents 1.0 (specversion, id, source, subject, type, time, datacontenttype, data) or custom (the data object).';

-- The SQL expression giving the JSON value of column col of row alias r.
-- Built-in types (and domains over them) go through to_jsonb; a value of a
-- user-defined type is carried as its text (its output function, through
-- format()), since to_jsonb would run a cast to json that the type's owner
-- wrote, and the trigger runs as the extension's owner.
CREATE FUNCTION eventgrid._column_json(r text, col name, typ oid) RETURNS text
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    base oid := typ;
    t pg_type;
BEGIN
    LOOP
        SELECT * INTO t FROM pg_type WHERE oid = base;
        EXIT WHEN t.typtype <> 'd';
        base := t.typbasetype;
    END LOOP;
    IF base < 16384 THEN	-- FirstNormalObjectId: made by initdb
        RETURN format('%s.%I', r, col);
    END IF;
    RETURN format('CASE WHEN %1$s.%2$I IS NULL THEN NULL ELSE pg_catalog.format(''%%s'', %1$s.%2$I) END', r, col);
END $$;
COMMENT ON FUNCTION eventgrid._column_json(r text, col name, typ oid) IS
    'Internal: SQL expression of a column''s JSON value in a table change event (to_jsonb''s for built-in types, the text form for user-defined types).';

-- The SQL expression of a JSON object of the given columns of row alias r.
CREATE FUNCTION eventgrid._row_json(source_table regclass, r text, cols text[]) RETURNS text
    LANGUAGE sql STABLE
    BEGIN ATOMIC
        SELECT COALESCE(pg_catalog.string_agg(part, ' OPERATOR(pg_catalog.||) ' ORDER BY chunk), '''{}''::jsonb')
          FROM (SELECT n.chunk, 'pg_catalog.jsonb_build_object(' OPERATOR(pg_catalog.||)
                       pg_catalog.string_agg(pg_catalog.format('%L, %s', n.attname, eventgrid._column_json(r, n.attname, n.atttypid)),
                                             ', ' ORDER BY n.attnum) OPERATOR(pg_catalog.||) ')' AS part
                  FROM (SELECT a.attname, a.atttypid, a.attnum,
                               (pg_catalog.row_number() OVER (ORDER BY a.attnum) OPERATOR(pg_catalog.-) 1) OPERATOR(pg_catalog./) 50 AS chunk
                          FROM pg_catalog.pg_attribute a
                         WHERE a.attrelid OPERATOR(pg_catalog.=) source_table AND a.attnum OPERATOR(pg_catalog.>) 0
                           AND NOT a.attisdropped
                           AND (cols IS NULL OR a.attname OPERATOR(pg_catalog.=) ANY (cols))) n
                 GROUP BY n.chunk) p;
    END;
COMMENT ON FUNCTION eventgrid._row_json(source_table regclass, r text, cols text[]) IS
    'Internal: SQL expression of the JSON object of a row''s columns cols (NULL: all), at most 50 columns per jsonb_build_object.';

-- The SQL expression of a row's subject: /<schema>/<table>/<key values>, the
-- key values (primary key, in key order, as text) percent-encoded; without
-- a primary key, or when a key column is not carried, /<schema>/<table>.
-- /<schema>/<table> is parameter $9, so a renamed table needs no new SQL.
CREATE FUNCTION eventgrid._row_subject(source_table regclass, r text, cols text[]) RETURNS text
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    keys text[];
BEGIN
    SELECT array_agg(a.attname::text ORDER BY k.i) INTO keys
      FROM pg_index x, unnest(x.indkey) WITH ORDINALITY k(attnum, i), pg_attribute a
     WHERE x.indrelid = source_table AND x.indisprimary
       AND a.attrelid = source_table AND a.attnum = k.attnum;
    IF keys IS NULL OR NOT keys <@ COALESCE(cols, keys) THEN
        RETURN '$9';
    END IF;
    RETURN '$9' || (SELECT string_agg(format(' || ''/'' || eventgrid._uri_escape(pg_catalog.format(''%%s'', %s.%I))', r, k), '' ORDER BY i)
                                     FROM unnest(keys) WITH ORDINALITY u(k, i));
END $$;
COMMENT ON FUNCTION eventgrid._row_subject(source_table regclass, r text, cols text[]) IS
    'Internal: SQL expression of a table change event''s subject: parameter $9 (/<schema>/<table>, percent-encoded) and the primary key values, percent-encoded, each after a /; $9 alone without a primary key or when columns leaves a key column out.';

-- What the statements of a publication depend on: the table's columns
-- (number, name, type) and primary key.
CREATE FUNCTION eventgrid._table_shape(source_table regclass) RETURNS text
    LANGUAGE sql STABLE
    BEGIN ATOMIC
        SELECT pg_catalog.concat(
                 (SELECT pg_catalog.string_agg(pg_catalog.concat_ws(':', a.attnum, a.attname, a.atttypid), ',' ORDER BY a.attnum)
                    FROM pg_catalog.pg_attribute a
                   WHERE a.attrelid OPERATOR(pg_catalog.=) source_table AND a.attnum OPERATOR(pg_catalog.>) 0
                     AND NOT a.attisdropped),
                 '|',
                 (SELECT x.indkey::text FROM pg_catalog.pg_index x
                   WHERE x.indrelid OPERATOR(pg_catalog.=) source_table AND x.indisprimary));
    END;
COMMENT ON FUNCTION eventgrid._table_shape(source_table regclass) IS
    'Internal: the columns (number, name, type) and primary key of a table, which the statements of its publications are made for.';

-- The statement each operation's trigger runs, by operation: one INSERT ...
-- SELECT into eventgrid.events over the transition tables.  Parameters: $1
-- topic, $2 input schema, $3 event type, $4 time, $5 source, $6 operation,
-- $7 schema, $8 table, $9 /<schema>/<table> for the subject.
CREATE FUNCTION eventgrid._table_change_statements(source_table regclass, columns text[], update_columns text[])
    RETURNS jsonb
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    q text := 'INSERT INTO eventgrid.events (topic, event) SELECT $1, eventgrid._table_change_event($2, $3, $4, $5, %s,'
              ' pg_catalog.jsonb_build_object(''operation'', $6, ''schema'', $7, ''table'', $8, ''new'', %s, ''old'', %s)) FROM %s';
BEGIN
    RETURN jsonb_build_object(
        'INSERT', format(q, eventgrid._row_subject(source_table, 'n', columns), eventgrid._row_json(source_table, 'n', columns),
                         'NULL::jsonb', 'eventgrid_rows n'),
        'DELETE', format(q, eventgrid._row_subject(source_table, 'o', columns), 'NULL::jsonb',
                         eventgrid._row_json(source_table, 'o', columns), 'eventgrid_rows o'),
        -- the old and the new version of each row, paired by their place in
        -- the transition tables, which PostgreSQL fills in step
        'UPDATE', format(q, 'n.subject', 'n.row', 'o.row', format(
                 '(SELECT pg_catalog.row_number() OVER () AS i, %s AS row, %s AS watched FROM eventgrid_old_rows o) o'
                 ' JOIN (SELECT pg_catalog.row_number() OVER () AS i, %s AS row, %s AS watched, %s AS subject FROM eventgrid_rows n) n'
                 ' ON n.i OPERATOR(pg_catalog.=) o.i WHERE n.watched IS DISTINCT FROM o.watched',
                 eventgrid._row_json(source_table, 'o', columns), eventgrid._row_json(source_table, 'o', update_columns),
                 eventgrid._row_json(source_table, 'n', columns), eventgrid._row_json(source_table, 'n', update_columns),
                 eventgrid._row_subject(source_table, 'n', columns))));
END $$;
COMMENT ON FUNCTION eventgrid._table_change_statements(source_table regclass, columns text[], update_columns text[]) IS
    'Internal: the INSERT ... SELECT into eventgrid.events that the trigger of each operation (INSERT, UPDATE, DELETE) of a publication runs over its transition tables.';

CREATE FUNCTION eventgrid._table_change_trigger() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    pub_topic text := TG_ARGV[0];
    p eventgrid.table_publications;
    input_schema text;
    cur_shape text;
    etype text;
    head text := '/' || eventgrid._uri_escape(TG_TABLE_SCHEMA) || '/' || eventgrid._uri_escape(TG_TABLE_NAME);
BEGIN
    SELECT * INTO p FROM eventgrid.table_publications t
     WHERE t.source_table = TG_RELID::regclass AND t.topic = pub_topic;
    IF NOT FOUND OR TG_NARGS <> 1 OR TG_LEVEL <> 'STATEMENT' OR TG_WHEN <> 'AFTER' OR TG_OP <> ALL (p.operations)
       OR TG_NAME <> eventgrid._table_change_trigger_name(pub_topic, TG_OP) THEN
        RAISE EXCEPTION 'trigger % on table % does not belong to a publication of its changes to topic %',
                        TG_NAME, TG_RELID::regclass, eventgrid._quote(pub_topic)
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Only eventgrid.publish_table_changes() sets up publications; drop this trigger.';
    END IF;
    -- the statements are made once per shape of the table and kept in the
    -- publication; when another transaction is writing that row (or wrote
    -- it after this one's snapshot), this one uses its own rather than wait
    -- or fail
    cur_shape := eventgrid._table_shape(TG_RELID);
    IF p.shape IS DISTINCT FROM cur_shape THEN
        p.statements := eventgrid._table_change_statements(TG_RELID, p.columns, p.update_columns);
        BEGIN
            UPDATE eventgrid.table_publications t SET shape = cur_shape, statements = p.statements
             WHERE t.ctid = (SELECT l.ctid FROM eventgrid.table_publications l
                              WHERE l.source_table = p.source_table AND l.topic = p.topic FOR NO KEY UPDATE SKIP LOCKED);
        EXCEPTION WHEN serialization_failure THEN
            NULL;
        END;
    END IF;
    SELECT t.input_schema INTO input_schema FROM eventgrid.topics t WHERE t.name = pub_topic;
    etype := COALESCE(p.event_type_prefix, TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME)
             || CASE TG_OP WHEN 'INSERT' THEN '.Inserted' WHEN 'UPDATE' THEN '.Updated' ELSE '.Deleted' END;
    EXECUTE p.statements ->> TG_OP
      USING pub_topic, input_schema, etype, eventgrid.rfc3339(statement_timestamp()),
            '/postgresql/' || eventgrid._uri_escape(current_database()) || head,
            TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME, head;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION eventgrid._table_change_trigger() IS
    'Internal: AFTER ... FOR EACH STATEMENT trigger of a table change publication (argument: the topic); publishes one event per row of the statement''s transition tables with one INSERT ... SELECT, made for the table''s shape and kept in the publication. Refuses (42501) to run as any trigger publish_table_changes() did not make.';

CREATE FUNCTION eventgrid._forget_dropped_tables() RETURNS event_trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM eventgrid.table_publications p
     USING pg_event_trigger_dropped_objects() d
     WHERE d.classid = 'pg_class'::regclass AND d.objsubid = 0 AND d.objid = p.source_table::oid;
END $$;
COMMENT ON FUNCTION eventgrid._forget_dropped_tables() IS
    'Internal: sql_drop event trigger function; a dropped table''s publications go with it.';
CREATE EVENT TRIGGER eventgrid_forget_dropped_tables ON sql_drop
    EXECUTE FUNCTION eventgrid._forget_dropped_tables();
COMMENT ON EVENT TRIGGER eventgrid_forget_dropped_tables IS
    'eventgrid: forgets the table change publications of a dropped table (its triggers go with it).';

CREATE VIEW eventgrid.table_change_publications AS
SELECT p.source_table, p.topic, p.operations, p.columns, p.update_columns,
       COALESCE(p.event_type_prefix, n.nspname || '.' || c.relname) AS event_type_prefix,
       p.event_type_prefix IS NULL AS default_prefix, p.created_at
  FROM eventgrid.table_publications p
  JOIN pg_catalog.pg_class c ON c.oid = p.source_table
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace;
COMMENT ON VIEW eventgrid.table_change_publications IS
    'The table change publications: source_table, topic, operations, columns carried (NULL: all), update_columns (NULL: any column), event_type_prefix (default_prefix: <schema>.<table>, following renames), created_at. Readable by eventgrid_admin.';

-- drop_topic stops the topic's publications first (their triggers would refuse to run)
CREATE OR REPLACE FUNCTION eventgrid.drop_topic(name text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sids bigint[];
    pub record;
BEGIN
    PERFORM eventgrid._check_not_null('topic name', name);
    IF NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = drop_topic.name FOR UPDATE) THEN
        RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(name) USING ERRCODE = 'undefined_object';
    END IF;
    -- publications of table changes to it stop: their triggers go
    FOR pub IN SELECT p.source_table FROM eventgrid.table_publications p WHERE p.topic = drop_topic.name LOOP
        PERFORM eventgrid._drop_table_change_triggers(pub.source_table, name);
    END LOOP;
    -- the subscriptions first (the delivery worker's lock order), then their retries
    SELECT array_agg(s.id ORDER BY s.id) INTO sids
      FROM (SELECT s.id FROM eventgrid.event_subscriptions s WHERE s.topic = drop_topic.name
             ORDER BY s.id FOR UPDATE) s;
    DELETE FROM eventgrid.retries r WHERE r.subscription_id = ANY (sids);
    -- subscriptions, positions, counters and publications go with the topic
    -- (ON DELETE CASCADE); its events stay in the event tables until they are emptied
    DELETE FROM eventgrid.topics t WHERE t.name = drop_topic.name;
END $$;
COMMENT ON FUNCTION eventgrid.drop_topic(name text) IS 'Drops a topic with its event subscriptions and their pending deliveries and retries, and stops the publications of table changes to it. Dead letters are kept. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such topic.';

-- Standard Webhooks signing secrets.
CREATE FUNCTION eventgrid._random_bytes(n integer) RETURNS bytea
    LANGUAGE c STRICT
    AS 'MODULE_PATHNAME', 'eventgrid_random_bytes';
COMMENT ON FUNCTION eventgrid._random_bytes(n integer) IS
    'Internal: n (1-1024) bytes from pg_strong_random(), the server''s cryptographically strong source.';

-- Why secret is not a Standard Webhooks secret, or NULL: "whsec_" and the
-- base64 of 24 to 64 bytes.  Never names the secret.
CREATE FUNCTION eventgrid._signing_secret_problem(secret text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    key bytea;
BEGIN
    IF secret IS NULL THEN
        RETURN NULL;
    END IF;
    IF left(secret, 6) <> 'whsec_' OR substr(secret, 7) !~ '^[A-Za-z0-9+/]+={0,2}$' THEN
        RETURN 'a signing secret is "whsec_" followed by base64';
    END IF;
    BEGIN
        key := decode(substr(secret, 7), 'base64');
    EXCEPTION WHEN OTHERS THEN
        RETURN 'the part after "whsec_" is not valid base64';
    END;
    IF length(key) NOT BETWEEN 24 AND 64 THEN
        RETURN format('the key must be 24 to 64 bytes, got %s', length(key));
    END IF;
    RETURN NULL;
END $$;
COMMENT ON FUNCTION eventgrid._signing_secret_problem(secret text) IS
    'Internal: NULL for a Standard Webhooks secret ("whsec_" and the base64 of a 24-64 byte key), else why not (never quoting it).';

CREATE TABLE eventgrid.signing_secrets (
    subscription_id bigint PRIMARY KEY REFERENCES eventgrid.event_subscriptions (id) ON DELETE CASCADE,
    secret text NOT NULL CHECK (eventgrid._signing_secret_problem(secret) IS NULL),
    previous_secret text CHECK (eventgrid._signing_secret_problem(previous_secret) IS NULL),
    previous_valid_until timestamp with time zone,
    set_at timestamp with time zone NOT NULL DEFAULT now(),
    CHECK ((previous_secret IS NULL) = (previous_valid_until IS NULL))
);
COMMENT ON TABLE eventgrid.signing_secrets IS
    'Internal: the Standard Webhooks signing secrets of event subscriptions; readable by the extension''s owner only (eventgrid.event_subscription_signing shows them masked).';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.signing_secrets', '');

CREATE FUNCTION eventgrid.set_signing_secret(topic text, subscription text, secret text DEFAULT NULL,
        previous_valid_for interval DEFAULT '0') RETURNS text
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, subscription, true);
    problem text := eventgrid._signing_secret_problem(secret);
    old text;
BEGIN
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'invalid signing secret: %', problem
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass NULL to have one generated, or "whsec_" and the base64 of 24 to 64 random bytes.';
    END IF;
    PERFORM eventgrid._check_not_null('previous_valid_for', previous_valid_for);
    IF previous_valid_for < interval '0' OR previous_valid_for > interval '30 days' THEN
        RAISE EXCEPTION 'previous_valid_for must be between 0 and 30 days, got %', previous_valid_for
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'How long the secret being replaced keeps signing beside the new one; 0 replaces it at once.';
    END IF;
    secret := COALESCE(secret, 'whsec_' || encode(eventgrid._random_bytes(32), 'base64'));
    SELECT k.secret INTO old FROM eventgrid.signing_secrets k WHERE k.subscription_id = sid FOR UPDATE;
    INSERT INTO eventgrid.signing_secrets AS k (subscription_id, secret, previous_secret, previous_valid_until)
    VALUES (sid, secret, NULL, NULL)
    ON CONFLICT (subscription_id) DO UPDATE
       SET secret = excluded.secret,
           previous_secret = CASE WHEN previous_valid_for > interval '0' AND old <> excluded.secret THEN old END,
           previous_valid_until = CASE WHEN previous_valid_for > interval '0' AND old <> excluded.secret
                                       THEN now() + previous_valid_for END,
           set_at = now();
    RETURN secret;
END $$;
COMMENT ON FUNCTION eventgrid.set_signing_secret(topic text, subscription text, secret text, previous_valid_for interval) IS
    'Sets the Standard Webhooks signing secret of an event subscription and returns it; every request to it then carries webhook-id, webhook-timestamp and webhook-signature (v1, HMAC-SHA256 of "id.timestamp.body"). secret: "whsec_" and the base64 of 24-64 bytes; NULL generates one (32 bytes from pg_strong_random). previous_valid_for: 0-30 days (0); when more than 0, the secret being replaced keeps signing beside the new one for that long (both signatures in webhook-signature). Secrets are never shown (event_subscription_signing masks them). Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription, 22023 bad secret or interval.';

CREATE FUNCTION eventgrid.remove_signing_secret(topic text, subscription text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    DELETE FROM eventgrid.signing_secrets k WHERE k.subscription_id = eventgrid._subscription_id(topic, subscription, true);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'event subscription % of topic % has no signing secret', eventgrid._quote(subscription), eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object', HINT = 'eventgrid.event_subscription_signing lists the signed subscriptions.';
    END IF;
END $$;
COMMENT ON FUNCTION eventgrid.remove_signing_secret(topic text, subscription text) IS
    'Removes the signing secret of an event subscription (and a previous one still signing): its requests are no longer signed. Requires eventgrid_admin. Errors: 22004 NULL, 42704 no such subscription or no secret.';

CREATE VIEW eventgrid.event_subscription_signing AS
SELECT s.topic, s.name AS subscription, '********'::text AS secret,
       CASE WHEN k.previous_valid_until > now() THEN '********' END AS previous_secret,
       CASE WHEN k.previous_valid_until > now() THEN k.previous_valid_until END AS previous_valid_until,
       k.set_at
  FROM eventgrid.signing_secrets k JOIN eventgrid.event_subscriptions s ON s.id = k.subscription_id;
COMMENT ON VIEW eventgrid.event_subscription_signing IS
    'The signed event subscriptions: topic, subscription, secret (always ********), previous_secret (******** while a replaced secret still signs) and previous_valid_until, set_at. Readable by eventgrid_admin.';

-- The attempt history keeps the first 512 bytes of a failed answer's body.
ALTER TABLE eventgrid.attempt_log ADD COLUMN response_body text;
CREATE OR REPLACE VIEW eventgrid.delivery_attempts AS
SELECT a.id, a.attempted_at, a.topic, a.subscription_name AS subscription, a.event_ids, a.attempt,
       a.http_status, a.outcome, a.duration_ms, a.error, a.response_body
  FROM eventgrid.attempt_log a;
COMMENT ON VIEW eventgrid.delivery_attempts IS 'Delivery attempt history: one row per attempt (one HTTP request; a batch names all its events): id, when it started (attempted_at, on the worker''s clock), topic, event subscription, event_ids (the ids publish() returned), attempt (1 for the first; for a batch, its first event''s, the aeg-delivery-count header plus 1), http_status (NULL: no HTTP answer), outcome (the outcome names of SPEC 3: Delivered, GenericError, Busy, NotFound, TimedOut, SocketError, ResolutionError, ...; Probation for an attempt that delayed delivery held back; Aborted for a request in flight when the worker stopped), duration_ms (libcurl''s total time of the request), error (libcurl''s message when there was no HTTP answer; for a failed answer with Retry-After, what it asked for), response_body (the first 512 bytes of a failed answer''s body, bytes outside printable ASCII as ?; NULL for a success or no body). Kept per GUC eventgrid.attempt_history (all, failures, off) for eventgrid.attempt_history_retention and eventgrid.attempt_history_max_rows. An attempt whose outcome was not yet written when the worker stopped shows as Aborted.';

-- What each eventgrid worker is doing, for the admin role (pg_stat_activity
-- hides other roles' processes from roles without pg_read_all_stats).
CREATE FUNCTION eventgrid._worker_status(OUT worker text, OUT pid integer, OUT state text, OUT activity text,
        OUT state_since timestamp with time zone, OUT wait_event_type text, OUT wait_event text,
        OUT backend_start timestamp with time zone) RETURNS SETOF record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
        SELECT w.worker, w.pid, a.state, a.query, a.state_change, a.wait_event_type, a.wait_event, a.backend_start
          FROM eventgrid._worker_pids() w
          LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) w.pid;
    END;
COMMENT ON FUNCTION eventgrid._worker_status() IS
    'Internal: each eventgrid worker with its pg_stat_activity state, status line and wait; read eventgrid.worker_status.';
CREATE VIEW eventgrid.worker_status AS SELECT * FROM eventgrid._worker_status();
COMMENT ON VIEW eventgrid.worker_status IS
    'Each eventgrid worker (delivery worker 1..eventgrid.delivery_workers, upkeep worker): pid (NULL when it does not run), state (idle or active), activity (its status line: what it delivers, waits for or failed at), state_since, wait_event_type, wait_event, backend_start. Readable by eventgrid_admin, which pg_stat_activity would show only <insufficient privilege>.';

-- Pausing delivery without a superuser: everything, a topic, or one
-- event subscription.  The delivery workers claim nothing for a paused
-- subscription; its events wait at its position and its retries stay due.
CREATE TABLE eventgrid.delivery_pauses (
    topic text REFERENCES eventgrid.topics (name) ON UPDATE CASCADE ON DELETE CASCADE,
    subscription_id bigint REFERENCES eventgrid.event_subscriptions (id) ON DELETE CASCADE,
    paused_at timestamp with time zone NOT NULL DEFAULT now(),
    paused_by name NOT NULL,
    CHECK (subscription_id IS NULL OR topic IS NOT NULL),
    UNIQUE NULLS NOT DISTINCT (topic, subscription_id)
);
COMMENT ON TABLE eventgrid.delivery_pauses IS
    'Internal: what pause_delivery() paused: everything (topic and subscription_id NULL), a topic (subscription_id NULL) or one event subscription.';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.delivery_pauses', '');

CREATE FUNCTION eventgrid._pause_target(topic text, subscription text, OUT target_topic text, OUT target_sid bigint,
        OUT label text)
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF topic IS NULL AND subscription IS NOT NULL THEN
        RAISE EXCEPTION 'a subscription is named with its topic'
            USING ERRCODE = 'null_value_not_allowed', HINT = 'Pass the topic too, or both NULL for all delivery.';
    END IF;
    IF subscription IS NOT NULL THEN
        target_sid := eventgrid._subscription_id(topic, subscription);
        label := format('event subscription "%s" of topic "%s"', subscription, topic);
    ELSIF topic IS NOT NULL THEN
        IF NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = _pause_target.topic) THEN
            RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(topic) USING ERRCODE = 'undefined_object';
        END IF;
        label := format('topic "%s"', topic);
    ELSE
        label := 'all event subscriptions';
    END IF;
    target_topic := topic;
END $$;
COMMENT ON FUNCTION eventgrid._pause_target(topic text, subscription text) IS
    'Internal: what pause_delivery() and resume_delivery() name (both NULL: everything), checked to exist.';

CREATE FUNCTION eventgrid._pauses_changed_at_commit() RETURNS void
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_pauses_changed_at_commit';
COMMENT ON FUNCTION eventgrid._pauses_changed_at_commit() IS
    'Internal: when the current transaction commits, tells the delivery workers that what pause_delivery() paused changed, and wakes them; no-op without shared_preload_libraries.';

CREATE FUNCTION eventgrid.pause_delivery(topic text DEFAULT NULL, subscription text DEFAULT NULL) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    t record := eventgrid._pause_target(topic, subscription);
BEGIN
    INSERT INTO eventgrid.delivery_pauses (topic, subscription_id, paused_by)
    VALUES (t.target_topic, t.target_sid, eventgrid._caller())
    ON CONFLICT ON CONSTRAINT delivery_pauses_topic_subscription_id_key DO NOTHING;
    IF FOUND THEN
        RAISE LOG 'eventgrid: delivery paused for % by %', t.label, eventgrid._caller();
        PERFORM eventgrid._pauses_changed_at_commit();   -- the workers' status lines say so
    END IF;
END $$;
COMMENT ON FUNCTION eventgrid.pause_delivery(topic text, subscription text) IS
    'Pauses delivery: both NULL everything (as the GUC eventgrid.delivery_paused, which stays), a topic its event subscriptions, a subscription itself. The delivery workers claim nothing more for it: its events wait at its position and its retries stay due (nothing is lost; time-to-live runs); requests already sent finish. Pausing what is paused does nothing. Logged once. Shown in delivery_statistics.paused. Requires eventgrid_admin. Errors: 22004 a subscription without its topic, 42704 no such topic or subscription.';

CREATE FUNCTION eventgrid.resume_delivery(topic text DEFAULT NULL, subscription text DEFAULT NULL) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    t record := eventgrid._pause_target(topic, subscription);
BEGIN
    IF t.target_topic IS NULL THEN
        DELETE FROM eventgrid.delivery_pauses;   -- everything: every pause
    ELSE
        DELETE FROM eventgrid.delivery_pauses p
         WHERE p.topic = t.target_topic AND p.subscription_id IS NOT DISTINCT FROM t.target_sid;
    END IF;
    IF FOUND THEN
        RAISE LOG 'eventgrid: delivery resumed for % by %', t.label, eventgrid._caller();
        PERFORM eventgrid._pauses_changed_at_commit();   -- and they take up what waited
    END IF;
END $$;
COMMENT ON FUNCTION eventgrid.resume_delivery(topic text, subscription text) IS
    'Resumes what pause_delivery() paused at the same level: a subscription, a topic (its subscriptions paused one by one stay paused), or, both NULL, every pause. The delivery workers take up the waiting events and due retries at once. Logged once. Requires eventgrid_admin. Errors: 22004, 42704.';

-- The paused event subscriptions, one rule for the delivery workers' claims
-- and the views: a set-returning function the planner inlines (SQL-standard
-- body, not STRICT, no SET clause), so a claim reads it once, as a hashed
-- set, not once per row.
CREATE FUNCTION eventgrid._paused_subscriptions() RETURNS SETOF bigint
    LANGUAGE sql STABLE
    BEGIN ATOMIC
        SELECT s.id FROM eventgrid.event_subscriptions s
         WHERE EXISTS (SELECT 1 FROM eventgrid.delivery_pauses dp
                        WHERE dp.subscription_id OPERATOR(pg_catalog.=) s.id
                           OR (dp.subscription_id IS NULL
                               AND (dp.topic IS NULL OR dp.topic OPERATOR(pg_catalog.=) s.topic)));
    END;
COMMENT ON FUNCTION eventgrid._paused_subscriptions() IS
    'Internal: the ids of the event subscriptions pause_delivery() paused (itself, its topic or everything). The delivery workers'' claims and delivery_statistics use it.';

CREATE OR REPLACE VIEW eventgrid.delivery_statistics AS
SELECT s.topic, s.name AS subscription, eventgrid._pending(s.id) AS pending,
       (SELECT count(*) FROM eventgrid.retries r WHERE r.subscription_id = s.id) AS retrying,
       COALESCE(c.delivered, 0::bigint) AS delivered, COALESCE(c.failed_attempts, 0::bigint) AS failed_attempts,
       COALESCE(c.dead_lettered, 0::bigint) AS dead_lettered, COALESCE(c.dropped, 0::bigint) AS dropped,
       COALESCE(c.redelivered, 0::bigint) AS redelivered,
       s.id IN (SELECT p FROM eventgrid._paused_subscriptions() p) AS paused
  FROM eventgrid.event_subscriptions s
  LEFT JOIN eventgrid.subscription_counters c ON c.subscription_id = s.id;
COMMENT ON VIEW eventgrid.delivery_statistics IS 'Per event subscription: deliveries pending (not yet delivered, dead-lettered or dropped, retries included), of which waiting for a retry, events delivered, failed delivery attempts (requests sent that failed; attempts held back by probation are not counted), events dead-lettered, events dropped (undeliverable with dead-lettering off), dead letters queued again by redeliver_dead_letters, and whether pause_delivery() paused it (itself, its topic or everything; the GUC eventgrid.delivery_paused is not shown here).';

-- Per-subscription rate limits: the delivery workers claim no more of a
-- subscription's events a second than max_events_per_second (a token
-- bucket per subscription in shared memory); the others wait at its
-- position or in eventgrid.retries.
ALTER TABLE eventgrid.event_subscriptions ADD COLUMN max_events_per_second integer
    CONSTRAINT event_subscriptions_max_events_per_second_check
    CHECK (max_events_per_second >= 1 AND max_events_per_second <= 100000);
COMMENT ON COLUMN eventgrid.event_subscriptions.max_events_per_second IS
    'Rate limit: events delivered a second at most (1-100,000; a batch counts its events, retries count), or NULL for none.';

-- Editing an event subscription in place.  The checks of a subscription's
-- settings are one function, which create_event_subscription() and
-- update_event_subscription() both call, so both refuse the same values
-- with the same SQLSTATEs and messages.
CREATE FUNCTION eventgrid._check_subscription_settings(input_schema text, topic_type text, endpoint text,
        event_delivery_schema text, included_event_types text[], is_subject_case_sensitive boolean,
        deadletter boolean, enable_advanced_filtering_on_arrays boolean, max_events_per_batch integer,
        preferred_batch_size_in_kilobytes integer, max_events_per_second integer) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM eventgrid._check_endpoint(endpoint);
    PERFORM eventgrid._check_schema('event_delivery_schema', event_delivery_schema);
    IF (input_schema = 'CustomEventSchema') <> (event_delivery_schema = 'CustomEventSchema') THEN
        RAISE EXCEPTION 'event_delivery_schema % is not available for a topic with input schema %',
                        event_delivery_schema, input_schema
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'EventGridSchema and CloudEventSchemaV1_0 map to each other; CustomEventSchema is delivered only as CustomEventSchema.';
    END IF;
    IF topic_type = 'namespace' AND event_delivery_schema <> 'CloudEventSchemaV1_0' THEN
        RAISE EXCEPTION 'event_delivery_schema % is not available for a namespace topic', event_delivery_schema
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A namespace topic delivers CloudEvents 1.0 only: omit event_delivery_schema.';
    END IF;
    IF included_event_types IS NOT NULL AND
       (cardinality(included_event_types) = 0 OR array_position(included_event_types, NULL) IS NOT NULL) THEN
        RAISE EXCEPTION 'included_event_types must be NULL (all types) or a non-empty array without NULLs'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF is_subject_case_sensitive IS NULL OR deadletter IS NULL OR enable_advanced_filtering_on_arrays IS NULL THEN
        RAISE EXCEPTION 'is_subject_case_sensitive, deadletter and enable_advanced_filtering_on_arrays must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM eventgrid._check_range('max_events_per_batch', max_events_per_batch, 1, 5000);
    PERFORM eventgrid._check_range('preferred_batch_size_in_kilobytes', preferred_batch_size_in_kilobytes, 1, 1024, ' kilobytes');
    PERFORM eventgrid._check_range('max_events_per_second', max_events_per_second, 1, 100000, ' events a second');
END $$;
COMMENT ON FUNCTION eventgrid._check_subscription_settings(input_schema text, topic_type text, endpoint text,
        event_delivery_schema text, included_event_types text[], is_subject_case_sensitive boolean,
        deadletter boolean, enable_advanced_filtering_on_arrays boolean, max_events_per_batch integer,
        preferred_batch_size_in_kilobytes integer, max_events_per_second integer) IS
    'Internal: checks an event subscription''s settings for a topic of input_schema and topic_type, as create_event_subscription() and update_event_subscription() take them: endpoint (22023), event_delivery_schema (22023), included_event_types (22023), the switches not NULL (22004), batching and rate ranges (22003).';

DROP FUNCTION eventgrid.create_event_subscription(text, text, text, text, text[], text, text, boolean, integer,
        integer, integer, integer, boolean, jsonb, boolean, integer, text);
CREATE FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text,
        event_delivery_schema text DEFAULT NULL::text, included_event_types text[] DEFAULT NULL::text[],
        subject_begins_with text DEFAULT NULL::text, subject_ends_with text DEFAULT NULL::text,
        is_subject_case_sensitive boolean DEFAULT false, max_delivery_attempts integer DEFAULT NULL::integer,
        event_ttl integer DEFAULT NULL::integer, max_events_per_batch integer DEFAULT NULL::integer,
        preferred_batch_size_in_kilobytes integer DEFAULT NULL::integer, deadletter boolean DEFAULT false,
        advanced_filters jsonb DEFAULT NULL::jsonb, enable_advanced_filtering_on_arrays boolean DEFAULT false,
        max_delivery_count integer DEFAULT NULL::integer, event_time_to_live text DEFAULT NULL::text,
        max_events_per_second integer DEFAULT NULL::integer, endpoint_validation text DEFAULT 'none'::text) RETURNS bigint
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
    IF EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s
                WHERE s.topic = create_event_subscription.topic AND s.name = create_event_subscription.name) THEN
        RAISE EXCEPTION 'event subscription "%" already exists for topic "%"', name, topic
            USING ERRCODE = 'duplicate_object';
    END IF;
    INSERT INTO eventgrid.event_subscriptions AS s
        (topic, name, endpoint, event_delivery_schema, included_event_types, subject_begins_with,
         subject_ends_with, is_subject_case_sensitive, max_delivery_attempts, event_ttl,
         max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter, topic_type,
         advanced_filters, enable_advanced_filtering_on_arrays, max_events_per_second)
    VALUES (topic, name, endpoint, event_delivery_schema, included_event_types, subject_begins_with,
            subject_ends_with, is_subject_case_sensitive, coalesce(attempts, CASE ttype WHEN 'namespace' THEN 10 ELSE 30 END),
            coalesce(ttl, CASE ttype WHEN 'namespace' THEN 10080 ELSE 1440 END),
            max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter, ttype,
            advanced_filters, enable_advanced_filtering_on_arrays, max_events_per_second)
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

COMMENT ON FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text) IS 'Creates an event subscription and returns its id. endpoint: http(s) URL that libcurl parses, with a host, at most 2048 bytes (no user name or password). event_delivery_schema: defaults to the topic''s input schema (namespace topics: CloudEvents only). Filters: included_event_types (case-insensitive), subject_begins_with / subject_ends_with (case-insensitive unless is_subject_case_sensitive), advanced_filters (Event Grid JSON, see set_advanced_filters) with enable_advanced_filtering_on_arrays (false). Retry policy of a custom topic: max_delivery_attempts 1-30 (30), event_ttl 1-1440 minutes (1440); of a namespace topic: max_delivery_count 1-10 (10), event_time_to_live ISO 8601 PT1M-P7D (P7D); the other profile''s arguments are refused. max_events_per_batch 1-5000, preferred_batch_size_in_kilobytes 1-1024 (either turns batching on), deadletter (false). max_events_per_second 1-100,000 (NULL: no rate limit; a batch counts its events, retries count; events over the rate wait in the queue). endpoint_validation: none (default) or handshake (Event Grid''s SubscriptionValidationEvent, or for CloudEvents the webhook OPTIONS request; nothing is delivered until the endpoint is validated, see event_subscription_validation). Requires eventgrid_admin. Errors: 42704, 42602, 22023, 22003, 22004, 54000, 42710. SPEC 1, 4, 5, 7, 9.';

CREATE FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text DEFAULT NULL,
        event_delivery_schema text DEFAULT NULL, included_event_types text[] DEFAULT NULL,
        subject_begins_with text DEFAULT NULL, subject_ends_with text DEFAULT NULL,
        is_subject_case_sensitive boolean DEFAULT NULL, max_delivery_attempts integer DEFAULT NULL,
        event_ttl integer DEFAULT NULL, max_events_per_batch integer DEFAULT NULL,
        preferred_batch_size_in_kilobytes integer DEFAULT NULL, deadletter boolean DEFAULT NULL,
        advanced_filters jsonb DEFAULT NULL, enable_advanced_filtering_on_arrays boolean DEFAULT NULL,
        max_delivery_count integer DEFAULT NULL, event_time_to_live text DEFAULT NULL,
        max_events_per_second integer DEFAULT NULL, endpoint_validation text DEFAULT NULL) RETURNS void
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
           max_events_per_second = update_event_subscription.max_events_per_second
     WHERE s.id = sid;
    IF event_delivery_schema <> cur.event_delivery_schema THEN
        -- a retry keeps the text it is sent as: made again in the new schema
        UPDATE eventgrid.retries r
           SET payload = eventgrid.convert_event(r.event, in_schema, update_event_subscription.event_delivery_schema,
                                                 r.publish_time)::text
         WHERE r.subscription_id = sid;
    END IF;
    IF endpoint <> cur.endpoint THEN
        RAISE LOG 'eventgrid: endpoint of event subscription "%" of topic "%" changed by %',
                  name, topic, eventgrid._caller();
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
    PERFORM eventgrid._wake_worker_at_commit();
END $$;
COMMENT ON FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text,
        event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text,
        is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer,
        max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean,
        advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer,
        event_time_to_live text, max_events_per_second integer, endpoint_validation text) IS
    'Changes an event subscription in place (as az eventgrid event-subscription update); the arguments are create_event_subscription''s, with the same ranges, checks and SQLSTATEs. A NULL argument keeps the setting; to clear one pass an empty array (included_event_types: all types), an empty string (subject_begins_with, subject_ends_with), [] (advanced_filters) or 0 (max_events_per_batch, preferred_batch_size_in_kilobytes: both cleared turns batching off; max_events_per_second: no rate limit). endpoint_validation: handshake validates the endpoint again (so does a new endpoint or delivery schema of a subscription that validates), none stops validating. The position, the first attempts in flight and the retries are kept, and the next claim uses the new settings: a new endpoint gets its own health state; with a new event_delivery_schema the retries are converted. A changed endpoint is logged, without the URL. Requires eventgrid_admin. Errors: 22004, 42704, 22023, 22003, 54000. SPEC 1, 4, 5, 7, 9.';

REVOKE ALL ON FUNCTION eventgrid._uri_escape(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._caller() FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._check_table_publication(regclass, text[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._table_change_trigger_name(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._drop_table_change_triggers(regclass, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._table_change_event(text, text, text, text, text, jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._column_json(text, name, oid) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._row_json(regclass, text, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._row_subject(regclass, text, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._table_shape(regclass) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._table_change_statements(regclass, text[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._table_change_trigger() FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._forget_dropped_tables() FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid.publish_table_changes(regclass, text, text[], text[], text[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid.stop_publishing_table_changes(regclass, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.publish_table_changes(regclass, text, text[], text[], text[], text) TO eventgrid_admin;
GRANT EXECUTE ON FUNCTION eventgrid.stop_publishing_table_changes(regclass, text) TO eventgrid_admin;
REVOKE ALL ON TABLE eventgrid.table_publications FROM PUBLIC;
GRANT SELECT ON TABLE eventgrid.table_publications TO eventgrid_admin;
GRANT SELECT ON TABLE eventgrid.table_change_publications TO eventgrid_admin;
REVOKE ALL ON FUNCTION eventgrid._random_bytes(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._signing_secret_problem(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid.set_signing_secret(text, text, text, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid.remove_signing_secret(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.set_signing_secret(text, text, text, interval) TO eventgrid_admin;
GRANT EXECUTE ON FUNCTION eventgrid.remove_signing_secret(text, text) TO eventgrid_admin;
REVOKE ALL ON TABLE eventgrid.signing_secrets FROM PUBLIC;
GRANT SELECT ON TABLE eventgrid.event_subscription_signing TO eventgrid_admin;
REVOKE ALL ON FUNCTION eventgrid._worker_status() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid._worker_status() TO eventgrid_admin;
GRANT SELECT ON TABLE eventgrid.worker_status TO eventgrid_admin;
REVOKE ALL ON FUNCTION eventgrid._pause_target(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._paused_subscriptions() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid._paused_subscriptions() TO eventgrid_admin;
REVOKE ALL ON FUNCTION eventgrid.pause_delivery(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid.resume_delivery(text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.pause_delivery(text, text) TO eventgrid_admin;
GRANT EXECUTE ON FUNCTION eventgrid.resume_delivery(text, text) TO eventgrid_admin;
REVOKE ALL ON TABLE eventgrid.delivery_pauses FROM PUBLIC;
GRANT SELECT ON TABLE eventgrid.delivery_pauses TO eventgrid_admin;
REVOKE ALL ON FUNCTION eventgrid._check_subscription_settings(text, text, text, text, text[], boolean, boolean, boolean, integer, integer, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid.update_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.update_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text) TO eventgrid_admin;

-- One clock: what eventgrid writes about deliveries comes from the delivery
-- workers' clock, the real one moved ahead by eventgrid.clock_offset (a
-- testing aid, 0 in production): attempts and next attempts (the workers),
-- publish times (the event trigger), dead letters and the retries
-- redeliver_dead_letters() queues (eventgrid._now()).
CREATE FUNCTION eventgrid._now() RETURNS timestamp with time zone
    LANGUAGE c STABLE PARALLEL SAFE
    AS 'MODULE_PATHNAME', 'eventgrid_now';
COMMENT ON FUNCTION eventgrid._now() IS
    'Internal: now() on the delivery workers'' clock (moved ahead by eventgrid.clock_offset): the time eventgrid writes about deliveries from SQL.';
ALTER TABLE eventgrid.dead_letters ALTER COLUMN dead_lettered_at SET DEFAULT eventgrid._now();
CREATE OR REPLACE FUNCTION eventgrid.redeliver_dead_letters(topic text DEFAULT NULL::text, subscription text DEFAULT NULL::text, reason text DEFAULT NULL::text, dead_lettered_after timestamp with time zone DEFAULT NULL::timestamp with time zone, dead_lettered_before timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sids bigint[];
    ids bigint[];
    n bigint;
BEGIN
    -- the subscriptions first (the delivery worker's lock order), then the dead letters
    SELECT array_agg(s.id ORDER BY s.id) INTO sids
      FROM (SELECT s.id FROM eventgrid.event_subscriptions s
             WHERE (redeliver_dead_letters.topic IS NULL OR s.topic = redeliver_dead_letters.topic)
               AND (redeliver_dead_letters.subscription IS NULL OR s.name = redeliver_dead_letters.subscription)
             ORDER BY s.id FOR KEY SHARE) s;
    ids := eventgrid._dead_letter_ids(topic, subscription, reason, dead_lettered_after, dead_lettered_before);
    WITH gone AS (
        DELETE FROM eventgrid.dead_letters d
         WHERE d.id = ANY (ids) AND d.subscription_id = ANY (sids)
        RETURNING d.*
    ), queued AS (
        -- a fresh start: no attempts made, the time-to-live counted from now
        INSERT INTO eventgrid.retries (subscription_id, event_id, event, payload, publish_time, event_bytes,
                                       attempts, next_attempt_at)
        SELECT g.subscription_id, coalesce(g.event_id, 0), g.event,
               eventgrid.convert_event(g.event, g.input_schema, s.event_delivery_schema, g.publish_time)::text,
               eventgrid._now(), octet_length(g.event::text), 0, eventgrid._now()
          FROM gone g JOIN eventgrid.event_subscriptions s ON s.id = g.subscription_id
        RETURNING subscription_id
    ), counted AS (
        SELECT q.subscription_id, count(*) AS n FROM queued q GROUP BY q.subscription_id
    ), bumped AS (
        UPDATE eventgrid.subscription_counters c SET redelivered = c.redelivered + counted.n
          FROM counted WHERE c.subscription_id = counted.subscription_id
    )
    SELECT coalesce(sum(counted.n), 0) INTO n FROM counted;
    IF n > 0 THEN
        PERFORM eventgrid._wake_worker_at_commit();
    END IF;
    RETURN n;
END $$;
REVOKE ALL ON FUNCTION eventgrid._now() FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid.create_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.create_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text) TO eventgrid_admin;

CREATE OR REPLACE VIEW eventgrid.event_subscription_batching AS
 SELECT s.topic,
    s.name AS subscription,
    ((s.max_events_per_batch IS NOT NULL) OR (s.preferred_batch_size_in_kilobytes IS NOT NULL)) AS batching,
        CASE
            WHEN ((s.max_events_per_batch IS NOT NULL) OR (s.preferred_batch_size_in_kilobytes IS NOT NULL)) THEN COALESCE(s.max_events_per_batch, COALESCE(( SELECT (g.setting)::integer AS setting
               FROM pg_settings g
              WHERE (g.name = 'eventgrid.default_max_events_per_batch'::text)), 10))
            ELSE 1
        END AS max_events_per_batch,
        CASE
            WHEN ((s.max_events_per_batch IS NOT NULL) OR (s.preferred_batch_size_in_kilobytes IS NOT NULL)) THEN COALESCE(s.preferred_batch_size_in_kilobytes, COALESCE(( SELECT (g.setting)::integer AS setting
               FROM pg_settings g
              WHERE (g.name = 'eventgrid.default_preferred_batch_size_in_kilobytes'::text)), 64))
            ELSE NULL::integer
        END AS preferred_batch_size_in_kilobytes,
        CASE
            WHEN (s.max_events_per_batch IS NOT NULL) THEN 'subscription'::text
            WHEN (s.preferred_batch_size_in_kilobytes IS NOT NULL) THEN 'eventgrid.default_max_events_per_batch'::text
            ELSE 'batching off'::text
        END AS max_events_per_batch_from,
        CASE
            WHEN (s.preferred_batch_size_in_kilobytes IS NOT NULL) THEN 'subscription'::text
            WHEN (s.max_events_per_batch IS NOT NULL) THEN 'eventgrid.default_preferred_batch_size_in_kilobytes'::text
            ELSE 'batching off'::text
        END AS preferred_batch_size_from,
    s.max_events_per_second
   FROM eventgrid.event_subscriptions s;
COMMENT ON VIEW eventgrid.event_subscription_batching IS 'Per event subscription, the output batching the delivery worker applies (SPEC 5): off (one event per request), or the event count and size ceiling it uses, each from the subscription or, where the subscription set only the other one, from GUC eventgrid.default_max_events_per_batch / eventgrid.default_preferred_batch_size_in_kilobytes (the server''s values; 10 and 64 when the library is not loaded), and the rate limit, max_events_per_second (NULL: none).';

-- Endpoint validation (Event Grid's handshake), opt-in per event
-- subscription: endpoint_validation => 'handshake'.  The upkeep worker
-- sends Event Grid's SubscriptionValidationEvent (Event Grid and custom
-- schemas) or the CloudEvents webhook OPTIONS request (CloudEvents); until
-- the endpoint is validated nothing is delivered to it and its events wait
-- at its position.  A row here means the subscription validates its
-- endpoint; the validation code is readable by the extension's owner only.
CREATE TABLE eventgrid.endpoint_validations (
    subscription_id bigint PRIMARY KEY REFERENCES eventgrid.event_subscriptions (id) ON DELETE CASCADE,
    state text NOT NULL
        CHECK (state IN ('Creating', 'AwaitingManualAction', 'Succeeded', 'Failed')),
    code text NOT NULL,
    started_at timestamp with time zone NOT NULL,
    tries integer NOT NULL DEFAULT 0,
    next_try_at timestamp with time zone NOT NULL,
    manual_since timestamp with time zone,
    last_error text,
    validated_at timestamp with time zone
);
COMMENT ON TABLE eventgrid.endpoint_validations IS
    'Internal: the endpoint validation of each event subscription that asked for it (endpoint_validation => ''handshake''): Event Grid''s provisioning state, the validation code sent (readable by the extension''s owner only), tries, errors. Read through eventgrid.event_subscription_validation.';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.endpoint_validations', '');

CREATE FUNCTION eventgrid._start_validation(sid bigint) RETURNS void
    LANGUAGE sql
    BEGIN ATOMIC
        INSERT INTO eventgrid.endpoint_validations AS v (subscription_id, state, code, started_at, next_try_at)
        VALUES (sid, 'Creating', upper(gen_random_uuid()::text), eventgrid._now(), eventgrid._now())
            ON CONFLICT (subscription_id) DO UPDATE
           SET state = 'Creating', code = excluded.code, started_at = excluded.started_at, tries = 0,
               next_try_at = excluded.next_try_at, manual_since = NULL, last_error = NULL, validated_at = NULL;
    END;
COMMENT ON FUNCTION eventgrid._start_validation(sid bigint) IS
    'Internal: (re)starts the endpoint validation of an event subscription with a new random validation code: provisioning state Creating, the upkeep worker sends the handshake at once.';

CREATE FUNCTION eventgrid._check_endpoint_validation(v text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF v IS NULL OR v NOT IN ('none', 'handshake') THEN
        RAISE EXCEPTION 'endpoint_validation must be none or handshake, got %', coalesce(eventgrid._quote(v), 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'handshake sends Event Grid''s SubscriptionValidationEvent (CloudEvents: the webhook OPTIONS request) and delivers only once the endpoint answers it.';
    END IF;
END $$;
COMMENT ON FUNCTION eventgrid._check_endpoint_validation(v text) IS
    'Internal: raises 22023 unless v is none or handshake.';

-- What the upkeep worker found: the new provisioning state (NULL: the
-- validation changed meanwhile and this answer is not for it).
CREATE FUNCTION eventgrid._record_validation(sid bigint, sent_code text, http_status integer, body text,
        allowed_origin text, allowed_rate text, origin text, error text) RETURNS text
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    v eventgrid.endpoint_validations;
    cloudevents boolean;
    answer text;
    problem text;
    per_minute bigint;
    validated boolean := false;
BEGIN
    SELECT * INTO v FROM eventgrid.endpoint_validations x
     WHERE x.subscription_id = sid AND x.code = sent_code AND x.state = 'Creating' FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT s.event_delivery_schema = 'CloudEventSchemaV1_0' INTO cloudevents
      FROM eventgrid.event_subscriptions s WHERE s.id = sid;
    IF error IS NOT NULL THEN
        problem := error;
    ELSIF cloudevents THEN
        IF http_status NOT BETWEEN 200 AND 299 THEN
            problem := format('the OPTIONS request was answered with HTTP %s', http_status);
        ELSIF allowed_origin IS NULL THEN
            problem := 'the answer has no WebHook-Allowed-Origin header';
        ELSIF allowed_origin <> '*' AND lower(allowed_origin) <> lower(origin) THEN
            problem := format('WebHook-Allowed-Origin %s is neither * nor %s', eventgrid._quote(allowed_origin),
                              eventgrid._quote(origin));
        ELSE
            -- WebHook-Allowed-Rate: requests a minute; one event per request unless batched
            IF allowed_rate ~ '^[0-9]{1,12}$' AND allowed_rate::bigint > 0 THEN
                per_minute := allowed_rate::bigint;
                UPDATE eventgrid.event_subscriptions s
                   SET max_events_per_second = least(100000, greatest(1, ceil(per_minute / 60.0)))::integer
                 WHERE s.id = sid;
            END IF;
            validated := true;
        END IF;
    ELSIF http_status <> 200 THEN
        problem := format('the SubscriptionValidationEvent was answered with HTTP %s', http_status);
    ELSE
        BEGIN
            answer := body::jsonb ->> 'validationResponse';
        EXCEPTION WHEN invalid_text_representation THEN
            answer := NULL;
        END;
        IF answer = sent_code THEN
            validated := true;
        ELSIF answer IS NULL THEN
            UPDATE eventgrid.endpoint_validations x SET state = 'AwaitingManualAction', manual_since = eventgrid._now(),
                   tries = x.tries + 1, last_error = NULL
             WHERE x.subscription_id = sid;
            RETURN 'AwaitingManualAction';
        ELSE
            UPDATE eventgrid.endpoint_validations x SET state = 'Failed', tries = x.tries + 1,
                   last_error = 'validationResponse is not the validation code sent'
             WHERE x.subscription_id = sid;
            RETURN 'Failed';
        END IF;
    END IF;
    IF validated THEN
        UPDATE eventgrid.endpoint_validations x SET state = 'Succeeded', validated_at = eventgrid._now(),
               tries = x.tries + 1, last_error = NULL
         WHERE x.subscription_id = sid;
        RETURN 'Succeeded';
    END IF;
    -- not validated: again 5 s later, three tries in all
    UPDATE eventgrid.endpoint_validations x
       SET tries = x.tries + 1, last_error = left(problem, 512),
           state = CASE WHEN x.tries + 1 >= 3 THEN 'Failed' ELSE 'Creating' END,
           next_try_at = eventgrid._now() + interval '5 seconds'
     WHERE x.subscription_id = sid
    RETURNING x.state INTO answer;
    RETURN answer;
END $$;
COMMENT ON FUNCTION eventgrid._record_validation(sid bigint, sent_code text, http_status integer, body text,
        allowed_origin text, allowed_rate text, origin text, error text) IS
    'Internal: records the answer to an endpoint validation request and returns the new provisioning state (NULL when the validation was started again meanwhile). Event Grid schema: HTTP 200 with {"validationResponse": code} validates, 200 without it awaits validate_event_subscription() for 10 minutes, another code fails. CloudEvents: a 2xx answer whose WebHook-Allowed-Origin is * or the origin sent validates, and WebHook-Allowed-Rate (requests a minute) becomes max_events_per_second. Otherwise tried again 5 s later, three tries in all, then Failed.';

CREATE FUNCTION eventgrid.validate_event_subscription(topic text, subscription text, validation_code text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint := eventgrid._subscription_id(topic, subscription, true);
    v eventgrid.endpoint_validations;
BEGIN
    PERFORM eventgrid._check_not_null('validation_code', validation_code);
    SELECT * INTO v FROM eventgrid.endpoint_validations x WHERE x.subscription_id = sid FOR UPDATE;
    IF NOT FOUND OR v.state <> 'AwaitingManualAction' THEN
        RAISE EXCEPTION 'event subscription "%" of topic "%" is not awaiting manual validation', subscription, topic
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  DETAIL = format('Its provisioning state is %s.', coalesce(v.state, 'Succeeded (no endpoint validation)')),
                  HINT = 'See eventgrid.event_subscription_validation.';
    END IF;
    IF v.manual_since + interval '10 minutes' <= eventgrid._now() THEN
        UPDATE eventgrid.endpoint_validations x SET state = 'Failed',
               last_error = 'not validated manually within 10 minutes'
         WHERE x.subscription_id = sid;
        RAISE EXCEPTION 'the manual validation of event subscription "%" of topic "%" expired', subscription, topic
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Start it again: eventgrid.update_event_subscription(topic, name, endpoint_validation => ''handshake'').';
    END IF;
    IF validation_code <> v.code THEN
        RAISE EXCEPTION 'validation_code is not the code sent to the endpoint'
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Use the validationCode of the SubscriptionValidationEvent the endpoint received.';
    END IF;
    UPDATE eventgrid.endpoint_validations x SET state = 'Succeeded', validated_at = eventgrid._now()
     WHERE x.subscription_id = sid;
    PERFORM eventgrid._wake_worker_at_commit();
END $$;
COMMENT ON FUNCTION eventgrid.validate_event_subscription(topic text, subscription text, validation_code text) IS
    'Validates an event subscription''s endpoint by hand, as Event Grid''s validationUrl does: when the endpoint answered the SubscriptionValidationEvent with HTTP 200 but no validationResponse (provisioning state AwaitingManualAction), the validationCode it received, within 10 minutes of its answer. Delivery starts once it commits. Requires eventgrid_admin. Errors: 22004, 42704, 55000 not awaiting manual validation or expired (then Failed), 22023 another code.';

CREATE VIEW eventgrid.event_subscription_validation AS
SELECT s.topic, s.name AS subscription,
       CASE WHEN v.subscription_id IS NULL THEN 'none' ELSE 'handshake' END AS endpoint_validation,
       CASE WHEN v.subscription_id IS NULL THEN NULL
            WHEN s.event_delivery_schema = 'CloudEventSchemaV1_0' THEN 'CloudEvents OPTIONS'
            ELSE 'SubscriptionValidationEvent' END AS handshake,
       coalesce(v.state, 'Succeeded') AS provisioning_state,
       v.started_at, v.tries, v.last_error, v.validated_at,
       v.manual_since + interval '10 minutes' AS manual_validation_until
  FROM eventgrid.event_subscriptions s
  LEFT JOIN eventgrid.endpoint_validations v ON v.subscription_id = s.id;
COMMENT ON VIEW eventgrid.event_subscription_validation IS
    'Per event subscription, its endpoint validation: endpoint_validation (none or handshake), the handshake sent (SubscriptionValidationEvent, or the CloudEvents OPTIONS request), Event Grid''s provisioning_state (Creating, AwaitingManualAction, Succeeded, Failed; Succeeded without validation), when it started, tries, the last error, when it was validated and until when validate_event_subscription() is accepted. Nothing is delivered to a subscription until Succeeded. Readable by eventgrid_admin; the validation code is not shown.';

-- What the delivery workers do not claim for: paused, or not validated.
CREATE FUNCTION eventgrid._held_subscriptions() RETURNS SETOF bigint
    LANGUAGE sql STABLE
    BEGIN ATOMIC
        SELECT ps FROM eventgrid._paused_subscriptions() ps
        UNION ALL
        SELECT v.subscription_id FROM eventgrid.endpoint_validations v
         WHERE v.state OPERATOR(pg_catalog.<>) 'Succeeded';
    END;
COMMENT ON FUNCTION eventgrid._held_subscriptions() IS
    'Internal: the ids of the event subscriptions the delivery workers claim nothing for: paused by pause_delivery() (eventgrid._paused_subscriptions()), or whose endpoint is not validated yet (eventgrid.endpoint_validations). Inlined into the claims, read once per statement.';

REVOKE ALL ON TABLE eventgrid.endpoint_validations FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._start_validation(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._check_endpoint_validation(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._record_validation(bigint, text, integer, text, text, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._held_subscriptions() FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid.validate_event_subscription(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.validate_event_subscription(text, text, text) TO eventgrid_admin;
GRANT SELECT ON TABLE eventgrid.event_subscription_validation TO eventgrid_admin;
REVOKE ALL ON FUNCTION eventgrid._pauses_changed_at_commit() FROM PUBLIC;
