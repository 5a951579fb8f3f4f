-- eventgrid 0.8.0 -> 0.9.0: trust, second pass.
--
-- Table change publications check the privileges of the role current where
-- publish_table_changes() is called (a C entry point reads it before the
-- privileged part runs as the extension's owner), never the session user,
-- refuse eventgrid's own tables and security-restricted operations (an
-- index expression run by ANALYZE), follow column renames, leave dropped
-- columns out, and cover the partitions of a partitioned table, also those
-- created or attached later (eventgrid._table_ddl(), a ddl_command_end
-- event trigger).
\echo Use "ALTER EXTENSION eventgrid UPDATE" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Table change publications: whose privileges, which tables, which columns

COMMENT ON FUNCTION eventgrid._caller() IS
    'Internal: the role that called a SECURITY DEFINER function (the role SET ROLE chose, else the session user), named in log lines only; privilege checks use the role current at the call.';

-- Checks that role caller may publish the changes of source_table: not one
-- of eventgrid's own tables, TRIGGER on it (or owning it) and SELECT on
-- every column an event would carry or an UPDATE would be compared on; the
-- columns named must exist.
DROP FUNCTION eventgrid._check_table_publication(regclass, text[], text[]);
CREATE FUNCTION eventgrid._check_table_publication(caller regrole, source_table regclass, columns text[],
        update_columns text[]) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    kind "char";
    nsp oid;
    missing text;
    unreadable text;
BEGIN
    SELECT c.relkind, c.relnamespace INTO kind, nsp FROM pg_class c WHERE c.oid = source_table;
    IF kind IS NULL OR kind NOT IN ('r', 'p') THEN
        RAISE EXCEPTION '% is not a table', source_table
            USING ERRCODE = 'wrong_object_type',
                  HINT = 'Table changes are published from ordinary and partitioned tables, not from views, foreign tables or other relations.';
    END IF;
    IF nsp = 'eventgrid'::regnamespace THEN
        RAISE EXCEPTION 'the changes of eventgrid''s own table % cannot be published', source_table
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Tables in schema eventgrid hold its queue, configuration and secrets; publish your application''s tables.';
    END IF;
    IF NOT has_table_privilege(caller, source_table, 'TRIGGER') THEN
        RAISE EXCEPTION 'permission denied to publish the changes of table %', source_table
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('Publishing needs the TRIGGER privilege on the table or its ownership: GRANT TRIGGER ON %s TO %I;',
                                source_table, caller);
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
COMMENT ON FUNCTION eventgrid._check_table_publication(caller regrole, source_table regclass, columns text[], update_columns text[]) IS
    'Internal: raises 42809 unless source_table is a table, 42501 for a table of schema eventgrid or unless role caller has TRIGGER on it and SELECT on the columns an event carries or compares, 42703 for a column it does not have.';

-- A table and the partitions below it at every level; a table and the
-- partitioned tables above it, nearest first (depth 0: the table).  The
-- catalog functions give nothing for a table outside any partition tree.
CREATE FUNCTION eventgrid._table_tree(rel regclass) RETURNS SETOF regclass
    LANGUAGE sql STABLE
    BEGIN ATOMIC
        SELECT rel
        UNION
        SELECT t.relid FROM pg_catalog.pg_partition_tree(rel) t;
    END;
COMMENT ON FUNCTION eventgrid._table_tree(rel regclass) IS
    'Internal: table rel and the partitions below it, at every level.';

CREATE FUNCTION eventgrid._table_ancestry(rel regclass, OUT relid regclass, OUT depth bigint) RETURNS SETOF record
    LANGUAGE sql STABLE
    BEGIN ATOMIC
        SELECT rel, 0
        UNION ALL
        SELECT a.relid, a.depth FROM pg_catalog.pg_partition_ancestors(rel) WITH ORDINALITY a(relid, depth)
         WHERE a.relid OPERATOR(pg_catalog.<>) rel;
    END;
COMMENT ON FUNCTION eventgrid._table_ancestry(rel regclass) IS
    'Internal: table rel (depth 0) and the partitioned tables above it, nearest first.';

-- The tables a publication of source_table writes its triggers on: the
-- table, and, for a partitioned table, every partition below it that has
-- no publication of its own to the topic (whose own triggers serve it).
CREATE FUNCTION eventgrid._publication_members(source_table regclass, topic text) RETURNS SETOF regclass
    LANGUAGE sql STABLE
    BEGIN ATOMIC
        SELECT m.relid FROM eventgrid._table_tree(source_table) m(relid)
         WHERE m.relid OPERATOR(pg_catalog.=) source_table
            OR NOT EXISTS (SELECT 1 FROM eventgrid.table_publications o
                            WHERE o.topic OPERATOR(pg_catalog.=) _publication_members.topic
                              AND o.source_table OPERATOR(pg_catalog.<>) _publication_members.source_table
                              AND o.source_table IN (SELECT a.relid FROM eventgrid._table_ancestry(m.relid) a)
                              AND o.source_table NOT IN (SELECT a.relid FROM eventgrid._table_ancestry(source_table) a));
    END;
COMMENT ON FUNCTION eventgrid._publication_members(source_table regclass, topic text) IS
    'Internal: the tables whose writes a publication of source_table to topic publishes: the table and the partitions below it (at every level) that do not publish to the topic themselves.';

-- Drops the statement triggers of ours for topic on table rel (a trigger
-- of the table owner's own that has the name stays, and CREATE TRIGGER
-- then says the name is taken).
CREATE FUNCTION eventgrid._drop_topic_triggers(rel regclass, topic text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    op text;
BEGIN
    FOREACH op IN ARRAY ARRAY['INSERT', 'UPDATE', 'DELETE'] LOOP
        IF EXISTS (SELECT 1 FROM pg_trigger t WHERE t.tgrelid = rel
                      AND t.tgname = eventgrid._table_change_trigger_name(topic, op)
                      AND t.tgfoid = 'eventgrid._table_change_trigger()'::regprocedure) THEN
            EXECUTE format('DROP TRIGGER %I ON %s', eventgrid._table_change_trigger_name(topic, op), rel);
        END IF;
    END LOOP;
END $$;
COMMENT ON FUNCTION eventgrid._drop_topic_triggers(rel regclass, topic text) IS
    'Internal: drops eventgrid''s statement triggers that publish table rel''s changes to topic.';

-- Creates the statement triggers of a publication on table rel.
CREATE FUNCTION eventgrid._create_topic_triggers(rel regclass, topic text, operations text[]) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    op text;
BEGIN
    PERFORM eventgrid._drop_topic_triggers(rel, topic);
    FOREACH op IN ARRAY operations LOOP
        EXECUTE format('CREATE TRIGGER %I AFTER %s ON %s REFERENCING %s TABLE AS eventgrid_rows %s'
                       ' FOR EACH STATEMENT EXECUTE FUNCTION eventgrid._table_change_trigger(%L)',
                       eventgrid._table_change_trigger_name(topic, op), op, rel,
                       CASE op WHEN 'DELETE' THEN 'OLD' ELSE 'NEW' END,
                       CASE op WHEN 'UPDATE' THEN 'OLD TABLE AS eventgrid_old_rows' ELSE '' END, topic);
    END LOOP;
END $$;
COMMENT ON FUNCTION eventgrid._create_topic_triggers(rel regclass, topic text, operations text[]) IS
    'Internal: creates the AFTER ... FOR EACH STATEMENT triggers (with transition tables) that publish table rel''s changes of operations to topic.';

-- The triggers of a publication on every table it covers, or off them.
DROP FUNCTION eventgrid._drop_table_change_triggers(regclass, text);
CREATE FUNCTION eventgrid._drop_table_change_triggers(source_table regclass, topic text) RETURNS void
    LANGUAGE sql
    BEGIN ATOMIC
        SELECT eventgrid._drop_topic_triggers(m.m, topic) FROM eventgrid._publication_members(source_table, topic) m(m);
    END;
COMMENT ON FUNCTION eventgrid._drop_table_change_triggers(source_table regclass, topic text) IS
    'Internal: drops the statement triggers that publish source_table''s changes to topic, from the table and the partitions it covers.';

CREATE FUNCTION eventgrid._create_table_change_triggers(source_table regclass, topic text, operations text[])
    RETURNS void
    LANGUAGE sql
    BEGIN ATOMIC
        SELECT eventgrid._create_topic_triggers(m.m, topic, operations)
          FROM eventgrid._publication_members(source_table, topic) m(m);
    END;
COMMENT ON FUNCTION eventgrid._create_table_change_triggers(source_table regclass, topic text, operations text[]) IS
    'Internal: creates the statement triggers that publish source_table''s changes of operations to topic, on the table and the partitions it covers.';

-- publish_table_changes() and stop_publishing_table_changes() are C entry
-- points (not SECURITY DEFINER) that pass the role current at the call to
-- these privileged parts; only the extension's owner may call them directly.
CREATE FUNCTION eventgrid._publish_table_changes(caller regrole, source_table regclass, topic text,
        operations text[], columns text[], update_columns text[], event_type_prefix text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    ops text[];
BEGIN
    PERFORM eventgrid._check_not_null('source_table', source_table);
    PERFORM eventgrid._check_not_null('topic', topic);
    PERFORM eventgrid._check_not_null('operations', operations);
    IF NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = _publish_table_changes.topic FOR KEY SHARE) THEN
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
    PERFORM eventgrid._check_table_publication(caller, source_table, columns, update_columns);
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
    PERFORM eventgrid._create_table_change_triggers(source_table, topic, ops);
END $$;
COMMENT ON FUNCTION eventgrid._publish_table_changes(caller regrole, source_table regclass, topic text, operations text[], columns text[], update_columns text[], event_type_prefix text) IS
    'Internal: publish_table_changes() for role caller, the role current where it was called.';

CREATE OR REPLACE FUNCTION eventgrid.publish_table_changes(source_table regclass, topic text,
        operations text[] DEFAULT ARRAY['INSERT', 'UPDATE', 'DELETE'],
        columns text[] DEFAULT NULL, update_columns text[] DEFAULT NULL,
        event_type_prefix text DEFAULT NULL) RETURNS void
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_publish_table_changes';
COMMENT ON FUNCTION eventgrid.publish_table_changes(source_table regclass, topic text, operations text[], columns text[], update_columns text[], event_type_prefix text) IS
    'Publishes the changes of a table to a topic: every row an INSERT, UPDATE or DELETE on it changes becomes one event, in the changing transaction (statement triggers with transition tables; COPY and INSERT ... ON CONFLICT included; TRUNCATE publishes nothing). A partitioned table''s publication covers its partitions, also those created or attached later, and writes that name a partition. operations: any of INSERT, UPDATE, DELETE (all three). columns: the columns an event carries (NULL: all). update_columns: an UPDATE publishes a row only when one of these changed (NULL: when any column changed). Renamed columns are followed; dropped ones leave the lists. event_type_prefix: 1-200 characters (NULL: <schema>.<table>); event types <prefix>.Inserted, .Updated, .Deleted. Called again for the same table and topic it replaces the settings. The role current at the call (not the session user) needs eventgrid_admin, TRIGGER on the table (or owning it) and SELECT on the columns carried and compared; tables of schema eventgrid are refused, and so is a call during a security-restricted operation (an index expression, ANALYZE). Errors: 22004 NULL, 42704 no such topic, 22023, 42809 not a table, 42501, 42703.';

CREATE FUNCTION eventgrid._stop_publishing_table_changes(caller regrole, source_table regclass, topic text)
    RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    PERFORM eventgrid._check_not_null('source_table', source_table);
    PERFORM eventgrid._check_not_null('topic', topic);
    IF NOT has_table_privilege(caller, source_table, 'TRIGGER') THEN
        RAISE EXCEPTION 'permission denied to stop publishing the changes of table %', source_table
            USING ERRCODE = 'insufficient_privilege',
                  HINT = format('Stopping a publication needs the TRIGGER privilege on the table or its ownership: GRANT TRIGGER ON %s TO %I;',
                                source_table, caller);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM eventgrid.table_publications p
                    WHERE p.source_table = _stop_publishing_table_changes.source_table
                      AND p.topic = _stop_publishing_table_changes.topic) THEN
        RAISE EXCEPTION 'the changes of table % are not published to topic %', source_table, eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object', HINT = 'eventgrid.table_change_publications lists the publications.';
    END IF;
    PERFORM eventgrid._drop_table_change_triggers(source_table, topic);
    DELETE FROM eventgrid.table_publications p
     WHERE p.source_table = _stop_publishing_table_changes.source_table AND p.topic = _stop_publishing_table_changes.topic;
    -- partitions that have publications of their own to the topic keep them
END $$;
COMMENT ON FUNCTION eventgrid._stop_publishing_table_changes(caller regrole, source_table regclass, topic text) IS
    'Internal: stop_publishing_table_changes() for role caller, the role current where it was called.';

CREATE OR REPLACE FUNCTION eventgrid.stop_publishing_table_changes(source_table regclass, topic text) RETURNS void
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_stop_publishing_table_changes';
COMMENT ON FUNCTION eventgrid.stop_publishing_table_changes(source_table regclass, topic text) IS
    'Stops publishing the changes of a table to a topic (drops its triggers, from its partitions too); events already published stay queued. The role current at the call needs eventgrid_admin and TRIGGER on the table (or owning it). Errors: 22004 NULL, 42501, 42704 no such publication.';


-- The publication a table change trigger on table rel for topic belongs
-- to: the table's own, or that of the nearest partitioned table above it.
CREATE FUNCTION eventgrid._table_publication_of(rel regclass, topic text) RETURNS eventgrid.table_publications
    LANGUAGE sql STABLE
    BEGIN ATOMIC
        SELECT p.* FROM eventgrid.table_publications p, eventgrid._table_ancestry(rel) a
         WHERE p.source_table OPERATOR(pg_catalog.=) a.relid AND p.topic OPERATOR(pg_catalog.=) _table_publication_of.topic
         ORDER BY a.depth LIMIT 1;
    END;
COMMENT ON FUNCTION eventgrid._table_publication_of(rel regclass, topic text) IS
    'Internal: the publication to topic that covers table rel: its own, or the nearest partitioned table''s above it.';

-- The trigger in C (src/table_change_trigger.c): each row's event built
-- directly, in the topic's input schema and stamped, and stored with its
-- publish time and size, so that the publish trigger does not validate it
-- again; one INSERT per thousand events.  The statements PL/pgSQL kept per
-- table shape are no longer made.
CREATE OR REPLACE FUNCTION eventgrid._table_change_trigger() RETURNS trigger
    LANGUAGE c SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS 'MODULE_PATHNAME', 'eventgrid_table_change_trigger';
COMMENT ON FUNCTION eventgrid._table_change_trigger() IS
    'Internal: AFTER ... FOR EACH STATEMENT trigger of a table change publication (argument: the topic), on the published table and on the partitions it covers; publishes one event per row of the statement''s transition tables (an UPDATE that changes none of update_columns: none), naming the published table, built in C and stored with its publish time and size. Each event at most 1 MB (54000). Refuses (42501) to run as any trigger publish_table_changes() did not make.';
DROP FUNCTION eventgrid._table_change_statements(regclass, text[], text[]);
DROP FUNCTION eventgrid._row_json(regclass, text, text[]);
DROP FUNCTION eventgrid._row_subject(regclass, text, text[]);
DROP FUNCTION eventgrid._column_json(text, name, oid);
DROP FUNCTION eventgrid._table_change_event(text, text, text, text, text, jsonb);
DROP FUNCTION eventgrid._table_shape(regclass);
COMMENT ON COLUMN eventgrid.table_publications.shape IS 'Not used since 0.9.0 (the trigger reads the table''s columns at each statement); always NULL.';
COMMENT ON COLUMN eventgrid.table_publications.statements IS 'Not used since 0.9.0 (the trigger builds events in C); always NULL.';
UPDATE eventgrid.table_publications SET shape = NULL, statements = NULL;

-- Following DDL on published tables.  A column renamed is renamed in the
-- publications' lists (so a left-out column renamed to a listed name stays
-- out); a dropped column leaves them (dropping the last column a list
-- names is refused); a partition created or attached below a published
-- table gets its triggers, one detached loses them.
CREATE FUNCTION eventgrid._rename_published_column(rel regclass, recurse boolean, old_name text, new_name text)
    RETURNS void
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
        UPDATE eventgrid.table_publications p
           SET columns = (SELECT pg_catalog.array_agg(c ORDER BY c)
                            FROM pg_catalog.unnest(pg_catalog.array_replace(p.columns, old_name, new_name)) c),
               update_columns = (SELECT pg_catalog.array_agg(c ORDER BY c)
                                   FROM pg_catalog.unnest(pg_catalog.array_replace(p.update_columns, old_name, new_name)) c),
               shape = NULL, statements = NULL
         WHERE (p.source_table OPERATOR(pg_catalog.=) rel
                OR (recurse AND p.source_table IN (SELECT t.t FROM eventgrid._table_tree(rel) t(t))))
           AND (old_name OPERATOR(pg_catalog.=) ANY (p.columns) OR old_name OPERATOR(pg_catalog.=) ANY (p.update_columns));
    END;
COMMENT ON FUNCTION eventgrid._rename_published_column(rel regclass, recurse boolean, old_name text, new_name text) IS
    'Internal: follows ALTER TABLE ... RENAME COLUMN in the columns and update_columns of the publications of table rel (and of its partitions when recurse).';

CREATE FUNCTION eventgrid._forget_dropped_columns(rel regclass) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    p record;
BEGIN
    FOR p IN SELECT t.source_table, t.topic, t.columns, t.update_columns,
                    ARRAY(SELECT c FROM unnest(t.columns) c
                           WHERE EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.source_table
                                            AND a.attname = c AND a.attnum > 0 AND NOT a.attisdropped)
                           ORDER BY c) AS live,
                    ARRAY(SELECT c FROM unnest(t.update_columns) c
                           WHERE EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = t.source_table
                                            AND a.attname = c AND a.attnum > 0 AND NOT a.attisdropped)
                           ORDER BY c) AS live_update
               FROM eventgrid.table_publications t
              WHERE t.source_table IN (SELECT m.m FROM eventgrid._table_tree(rel) m(m))
             FOR UPDATE LOOP
        IF (p.columns IS NOT NULL AND p.live IS DISTINCT FROM p.columns)
           OR (p.update_columns IS NOT NULL AND p.live_update IS DISTINCT FROM p.update_columns) THEN
            IF (p.columns IS NOT NULL AND cardinality(p.live) = 0)
               OR (p.update_columns IS NOT NULL AND cardinality(p.live_update) = 0) THEN
                RAISE EXCEPTION 'cannot drop the last column that the publication of table % to topic % names', p.source_table, eventgrid._quote(p.topic)
                    USING ERRCODE = 'dependent_objects_still_exist',
                          HINT = 'Publish other columns first with eventgrid.publish_table_changes(), or stop the publication with eventgrid.stop_publishing_table_changes().';
            END IF;
            UPDATE eventgrid.table_publications t
               SET columns = CASE WHEN p.columns IS NULL THEN NULL ELSE p.live END,
                   update_columns = CASE WHEN p.update_columns IS NULL THEN NULL ELSE p.live_update END,
                   shape = NULL, statements = NULL
             WHERE t.source_table = p.source_table AND t.topic = p.topic;
        END IF;
    END LOOP;
END $$;
COMMENT ON FUNCTION eventgrid._forget_dropped_columns(rel regclass) IS
    'Internal: after ALTER TABLE on table rel, removes the columns that no longer exist from the columns and update_columns of the publications of rel and its partitions; 2BP01 when a list would be left empty.';

CREATE FUNCTION eventgrid._cover_partitions(rel regclass) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    p record;
BEGIN
    -- every publication of a table above rel (or of rel itself, for the partitions below it)
    FOR p IN SELECT t.source_table, t.topic, t.operations FROM eventgrid.table_publications t
              WHERE t.source_table IN (SELECT a.relid FROM eventgrid._table_ancestry(rel) a) LOOP
        PERFORM eventgrid._create_topic_triggers(m.m, p.topic, p.operations)
           FROM eventgrid._publication_members(p.source_table, p.topic) m(m)
          WHERE m.m IN (SELECT d.d FROM eventgrid._table_tree(rel) d(d)) AND m.m <> p.source_table;
    END LOOP;
END $$;
COMMENT ON FUNCTION eventgrid._cover_partitions(rel regclass) IS
    'Internal: after rel was created as or attached as a partition, gives it and the partitions below it the triggers of the publications of the tables above it.';

CREATE FUNCTION eventgrid._uncover_partitions(rel regclass) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    t record;
BEGIN
    -- triggers of ours below rel that no publication covers any more
    FOR t IN SELECT DISTINCT g.tgrelid::regclass AS rel, g.tgargs
               FROM pg_trigger g
              WHERE g.tgrelid IN (SELECT d.d FROM eventgrid._table_tree(rel) d(d))
                AND g.tgfoid = 'eventgrid._table_change_trigger()'::regprocedure AND g.tgnargs = 1 LOOP
        IF (eventgrid._table_publication_of(t.rel, convert_from(substr(t.tgargs, 1, length(t.tgargs) - 1), 'UTF8'))).source_table IS NULL THEN
            PERFORM eventgrid._drop_topic_triggers(t.rel, convert_from(substr(t.tgargs, 1, length(t.tgargs) - 1), 'UTF8'));
        END IF;
    END LOOP;
END $$;
COMMENT ON FUNCTION eventgrid._uncover_partitions(rel regclass) IS
    'Internal: after rel was detached, drops from it and the partitions below it the triggers of publications that no longer cover them.';

CREATE FUNCTION eventgrid._table_ddl() RETURNS event_trigger
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_table_ddl';
COMMENT ON FUNCTION eventgrid._table_ddl() IS
    'Internal: ddl_command_end event trigger function: follows RENAME COLUMN and DROP COLUMN in the publications of table changes, and gives partitions created or attached below a published table its triggers (detached ones lose them).';

-- a 0.8.0 publication of a partitioned table covers its partitions from now on
SELECT eventgrid._create_table_change_triggers(p.source_table, p.topic, p.operations)
  FROM eventgrid.table_publications p
 WHERE (SELECT c.relkind FROM pg_catalog.pg_class c WHERE c.oid = p.source_table) = 'p';

REVOKE ALL ON FUNCTION eventgrid._table_tree(regclass) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._table_ancestry(regclass) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._publication_members(regclass, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._drop_topic_triggers(regclass, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._create_topic_triggers(regclass, text, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._drop_table_change_triggers(regclass, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._create_table_change_triggers(regclass, text, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._check_table_publication(regrole, regclass, text[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._publish_table_changes(regrole, regclass, text, text[], text[], text[], text) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._stop_publishing_table_changes(regrole, regclass, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._table_publication_of(regclass, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._rename_published_column(regclass, boolean, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._forget_dropped_columns(regclass) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._cover_partitions(regclass) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._uncover_partitions(regclass) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._table_ddl() FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid.publish_table_changes(regclass, text, text[], text[], text[], text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.publish_table_changes(regclass, text, text[], text[], text[], text) TO eventgrid_admin;
REVOKE ALL ON FUNCTION eventgrid.stop_publishing_table_changes(regclass, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.stop_publishing_table_changes(regclass, text) TO eventgrid_admin;

CREATE EVENT TRIGGER eventgrid_table_ddl ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE', 'ALTER TABLE')
    EXECUTE FUNCTION eventgrid._table_ddl();
COMMENT ON EVENT TRIGGER eventgrid_table_ddl IS
    'eventgrid: follows column renames and drops in the publications of table changes, and covers partitions created or attached below a published table.';

-- ---------------------------------------------------------------------------
-- A change takes effect when it commits: pausing, dropping or updating an
-- event subscription (or dropping its topic) tells the delivery workers,
-- which put back unsent what they had claimed for it and not yet started:
-- back in the queue, uncharged, for the new endpoint once it is resumed.

CREATE FUNCTION eventgrid._subscriptions_changed_at_commit() RETURNS void
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_subscriptions_changed_at_commit';
COMMENT ON FUNCTION eventgrid._subscriptions_changed_at_commit() IS
    'Internal: when the current transaction commits, tells the delivery workers that event subscriptions were paused, resumed, updated or dropped (requests they claimed and did not start yet go back unsent; their status lines read the pauses again), and wakes them; no-op without shared_preload_libraries.';

-- A log line without the statement that caused it (which may hold a secret
-- URL) and without context.
CREATE FUNCTION eventgrid._log(message text) RETURNS void
    LANGUAGE c STRICT
    AS 'MODULE_PATHNAME', 'eventgrid_log';
COMMENT ON FUNCTION eventgrid._log(message text) IS
    'Internal: writes message to the server log (LOG), without the STATEMENT and CONTEXT lines.';

CREATE OR REPLACE FUNCTION eventgrid.pause_delivery(topic text DEFAULT NULL::text, subscription text DEFAULT NULL::text) RETURNS void
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
        PERFORM eventgrid._log(format('eventgrid: delivery paused for %s by %s', t.label, eventgrid._caller()));
        -- requests claimed and not sent yet go back; the workers' status lines say so
        PERFORM eventgrid._subscriptions_changed_at_commit();
    END IF;
END $$;

CREATE OR REPLACE FUNCTION eventgrid.resume_delivery(topic text DEFAULT NULL::text, subscription text DEFAULT NULL::text) RETURNS void
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
        PERFORM eventgrid._log(format('eventgrid: delivery resumed for %s by %s', t.label, eventgrid._caller()));
        PERFORM eventgrid._subscriptions_changed_at_commit();   -- and they take up what waited
    END IF;
END $$;

CREATE OR REPLACE FUNCTION eventgrid.drop_event_subscription(topic text, name text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sid bigint;
BEGIN
    -- the subscription first (the delivery worker's lock order), then its retries;
    -- its position and counters go with it (ON DELETE CASCADE)
    sid := eventgrid._subscription_id(topic, name, true);
    DELETE FROM eventgrid.retries r WHERE r.subscription_id = sid;
    DELETE FROM eventgrid.event_subscriptions s WHERE s.id = sid;
    -- its requests claimed and not sent yet are not sent
    PERFORM eventgrid._subscriptions_changed_at_commit();
END $$;

-- ---------------------------------------------------------------------------
-- Dead-letter notifications: an event subscription may name a topic to which
-- each event it dead-letters or drops is published, in the transaction that
-- records it.

ALTER TABLE eventgrid.event_subscriptions
    ADD COLUMN dead_letter_topic text REFERENCES eventgrid.topics (name) ON DELETE SET NULL;
COMMENT ON COLUMN eventgrid.event_subscriptions.dead_letter_topic IS
    'The topic each event this subscription dead-letters or drops is published to as a notification (NULL: none); set by create_event_subscription() and update_event_subscription(); dropping that topic sets it NULL.';

CREATE FUNCTION eventgrid._check_dead_letter_topic(dead_letter_topic text) RETURNS void
    LANGUAGE plpgsql STABLE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    IF dead_letter_topic IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = dead_letter_topic) THEN
        RAISE EXCEPTION 'dead_letter_topic % does not exist', eventgrid._quote(dead_letter_topic)
            USING ERRCODE = 'undefined_object',
                  HINT = 'Create the topic that takes the notifications first, with eventgrid.create_topic(), and subscribe the receiver to be notified to it.';
    END IF;
END $$;
COMMENT ON FUNCTION eventgrid._check_dead_letter_topic(text) IS
    'Internal: refuses (42704) a dead_letter_topic that is not a topic of this database.';

CREATE FUNCTION eventgrid._dead_letter_notification(target_topic text, topic text, subscription text,
        event jsonb, input_schema text, dead_lettered boolean, reason text, attempts integer, outcome text,
        http_status integer, publish_time timestamp with time zone, attempted_at timestamp with time zone)
    RETURNS TABLE (notification_topic text, notification jsonb)
    LANGUAGE sql VOLATILE
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 WITH src AS (
     SELECT CASE WHEN _dead_letter_notification.input_schema = 'CloudEventSchemaV1_0'
                 THEN _dead_letter_notification.event ->> 'type'
                 ELSE _dead_letter_notification.event ->> 'eventType' END AS event_type
 ), d AS (
     SELECT jsonb_strip_nulls(jsonb_build_object(
                'topic', _dead_letter_notification.topic,
                'eventSubscription', _dead_letter_notification.subscription,
                'id', _dead_letter_notification.event ->> 'id',
                'eventType', src.event_type,
                'subject', _dead_letter_notification.event ->> 'subject',
                'deadLetterReason', _dead_letter_notification.reason,
                'deliveryAttempts', _dead_letter_notification.attempts,
                'lastDeliveryOutcome', _dead_letter_notification.outcome,
                'lastHttpStatusCode', nullif(_dead_letter_notification.http_status, 0),
                'publishTime', eventgrid.rfc3339(_dead_letter_notification.publish_time),
                'lastDeliveryAttemptTime', eventgrid.rfc3339(_dead_letter_notification.attempted_at)))
            || CASE WHEN octet_length(_dead_letter_notification.event::text) <= 900 * 1024
                    THEN jsonb_build_object('event', _dead_letter_notification.event)
                    ELSE jsonb_build_object('eventOmitted', 'larger than 900 kB: the notification must stay within the 1 MB event limit') END
            AS data,
            CASE WHEN _dead_letter_notification.dead_lettered THEN 'Eventgrid.EventSubscription.EventDeadLettered'
                 ELSE 'Eventgrid.EventSubscription.EventDropped' END AS type,
            '/topics/' || _dead_letter_notification.topic || '/eventSubscriptions/' || _dead_letter_notification.subscription AS source
       FROM src
 )
 SELECT t.name AS notification_topic,
        CASE WHEN t.input_schema = 'CloudEventSchemaV1_0' THEN
            jsonb_build_object('specversion', '1.0', 'id', gen_random_uuid()::text, 'source', d.source,
                               'type', d.type, 'subject', coalesce(_dead_letter_notification.event ->> 'id', ''),
                               'time', eventgrid.rfc3339(now()), 'datacontenttype', 'application/json',
                               'data', d.data)
        ELSE
            jsonb_build_object('id', gen_random_uuid()::text, 'subject', d.source || '/events/' || coalesce(_dead_letter_notification.event ->> 'id', ''),
                               'eventType', d.type, 'eventTime', eventgrid.rfc3339(now()), 'dataVersion', '1.0',
                               'data', d.data)
        END AS notification
   FROM d, src, eventgrid.topics t
  WHERE t.name = _dead_letter_notification.target_topic
    -- no loops: a notification that ends undelivered notifies no one
    AND src.event_type IS DISTINCT FROM 'Eventgrid.EventSubscription.EventDeadLettered'
    AND src.event_type IS DISTINCT FROM 'Eventgrid.EventSubscription.EventDropped';
END;
COMMENT ON FUNCTION eventgrid._dead_letter_notification(text, text, text, jsonb, text, boolean, text, integer, text, integer, timestamp with time zone, timestamp with time zone) IS
    'Internal: the notification event of an event dead-lettered (or, dead_lettered false, dropped) by an event subscription whose dead_letter_topic is target_topic, in that topic''s input schema, with what the dead letter records and the event itself (up to 900 kB); no row for a notification that itself ended undelivered, or when the topic is gone. The delivery workers publish it in the transaction that records the dead letter.';

DROP FUNCTION eventgrid.create_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text);
CREATE FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text, event_delivery_schema text DEFAULT NULL::text, included_event_types text[] DEFAULT NULL::text[], subject_begins_with text DEFAULT NULL::text, subject_ends_with text DEFAULT NULL::text, is_subject_case_sensitive boolean DEFAULT false, max_delivery_attempts integer DEFAULT NULL::integer, event_ttl integer DEFAULT NULL::integer, max_events_per_batch integer DEFAULT NULL::integer, preferred_batch_size_in_kilobytes integer DEFAULT NULL::integer, deadletter boolean DEFAULT false, advanced_filters jsonb DEFAULT NULL::jsonb, enable_advanced_filtering_on_arrays boolean DEFAULT false, max_delivery_count integer DEFAULT NULL::integer, event_time_to_live text DEFAULT NULL::text, max_events_per_second integer DEFAULT NULL::integer, endpoint_validation text DEFAULT 'none'::text, dead_letter_topic text DEFAULT NULL::text) RETURNS bigint
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
    PERFORM eventgrid._check_dead_letter_topic(dead_letter_topic);
    IF EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s
                WHERE s.topic = create_event_subscription.topic AND s.name = create_event_subscription.name) THEN
        RAISE EXCEPTION 'event subscription "%" already exists for topic "%"', name, topic
            USING ERRCODE = 'duplicate_object';
    END IF;
    INSERT INTO eventgrid.event_subscriptions AS s
        (topic, name, endpoint, event_delivery_schema, included_event_types, subject_begins_with,
         subject_ends_with, is_subject_case_sensitive, max_delivery_attempts, event_ttl,
         max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter, topic_type,
         advanced_filters, enable_advanced_filtering_on_arrays, max_events_per_second, dead_letter_topic)
    VALUES (topic, name, endpoint, event_delivery_schema, included_event_types, subject_begins_with,
            subject_ends_with, is_subject_case_sensitive, coalesce(attempts, CASE ttype WHEN 'namespace' THEN 10 ELSE 30 END),
            coalesce(ttl, CASE ttype WHEN 'namespace' THEN 10080 ELSE 1440 END),
            max_events_per_batch, preferred_batch_size_in_kilobytes, deadletter, ttype,
            advanced_filters, enable_advanced_filtering_on_arrays, max_events_per_second, dead_letter_topic)
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

COMMENT ON FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text) IS 'Creates an event subscription and returns its id. endpoint: http(s) URL that libcurl parses, with a host, at most 2048 bytes (no user name or password). event_delivery_schema: defaults to the topic''s input schema (namespace topics: CloudEvents only). Filters: included_event_types (case-insensitive), subject_begins_with / subject_ends_with (case-insensitive unless is_subject_case_sensitive), advanced_filters (Event Grid JSON, see set_advanced_filters) with enable_advanced_filtering_on_arrays (false). Retry policy of a custom topic: max_delivery_attempts 1-30 (30), event_ttl 1-1440 minutes (1440); of a namespace topic: max_delivery_count 1-10 (10), event_time_to_live ISO 8601 PT1M-P7D (P7D); the other profile''s arguments are refused. max_events_per_batch 1-5000, preferred_batch_size_in_kilobytes 1-1024 (either turns batching on), deadletter (false). max_events_per_second 1-100,000 (NULL: no rate limit; a batch counts its events, retries count; events over the rate wait in the queue). endpoint_validation: none (default) or handshake (Event Grid''s SubscriptionValidationEvent, or for CloudEvents the webhook OPTIONS request; nothing is delivered until the endpoint is validated, see event_subscription_validation). dead_letter_topic: a topic (of this database) to which each event this subscription dead-letters or drops is published as a notification, in the transaction that records it (see README, Dead-letter notifications; NULL: none). Requires eventgrid_admin. Errors: 42704 (also no such dead_letter_topic), 42602, 22023, 22003, 22004, 54000, 42710. SPEC 1, 4, 5, 7, 9.';
REVOKE ALL ON FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.create_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text) TO eventgrid_admin;

DROP FUNCTION eventgrid.update_event_subscription(text, text, text, text, text[], text, text, boolean, integer, integer, integer, integer, boolean, jsonb, boolean, integer, text, integer, text);
CREATE FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text DEFAULT NULL::text, event_delivery_schema text DEFAULT NULL::text, included_event_types text[] DEFAULT NULL::text[], subject_begins_with text DEFAULT NULL::text, subject_ends_with text DEFAULT NULL::text, is_subject_case_sensitive boolean DEFAULT NULL::boolean, max_delivery_attempts integer DEFAULT NULL::integer, event_ttl integer DEFAULT NULL::integer, max_events_per_batch integer DEFAULT NULL::integer, preferred_batch_size_in_kilobytes integer DEFAULT NULL::integer, deadletter boolean DEFAULT NULL::boolean, advanced_filters jsonb DEFAULT NULL::jsonb, enable_advanced_filtering_on_arrays boolean DEFAULT NULL::boolean, max_delivery_count integer DEFAULT NULL::integer, event_time_to_live text DEFAULT NULL::text, max_events_per_second integer DEFAULT NULL::integer, endpoint_validation text DEFAULT NULL::text, dead_letter_topic text DEFAULT NULL::text) RETURNS void
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
    dead_letter_topic := CASE WHEN dead_letter_topic IS NULL THEN cur.dead_letter_topic
                              ELSE nullif(dead_letter_topic, '') END;
    PERFORM eventgrid._check_dead_letter_topic(dead_letter_topic);
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
           max_events_per_second = update_event_subscription.max_events_per_second,
           dead_letter_topic = update_event_subscription.dead_letter_topic
     WHERE s.id = sid;
    IF event_delivery_schema <> cur.event_delivery_schema THEN
        -- a retry keeps the text it is sent as: made again in the new schema
        UPDATE eventgrid.retries r
           SET payload = eventgrid.convert_event(r.event, in_schema, update_event_subscription.event_delivery_schema,
                                                 r.publish_time)::text
         WHERE r.subscription_id = sid;
    END IF;
    IF endpoint <> cur.endpoint THEN
        -- without the statement, which holds the URL
        PERFORM eventgrid._log(format('eventgrid: endpoint of event subscription "%s" of topic "%s" changed by %s',
                                      name, topic, eventgrid._caller()));
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
    -- requests claimed with the old settings and not sent yet go back
    PERFORM eventgrid._subscriptions_changed_at_commit();
END $$;
COMMENT ON FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text) IS 'Changes an event subscription in place (as az eventgrid event-subscription update); the arguments are create_event_subscription''s, with the same ranges, checks and SQLSTATEs. A NULL argument keeps the setting; to clear one pass an empty array (included_event_types: all types), an empty string (subject_begins_with, subject_ends_with, dead_letter_topic), [] (advanced_filters) or 0 (max_events_per_batch, preferred_batch_size_in_kilobytes: both cleared turns batching off; max_events_per_second: no rate limit). endpoint_validation: handshake validates the endpoint again (so does a new endpoint or delivery schema of a subscription that validates), none stops validating. The position, the first attempts in flight and the retries are kept, and the next claim uses the new settings: a new endpoint gets its own health state; with a new event_delivery_schema the retries are converted. A changed endpoint is logged, without the URL. Requires eventgrid_admin. Errors: 22004, 42704, 22023, 22003, 54000. SPEC 1, 4, 5, 7, 9.';
REVOKE ALL ON FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid.update_event_subscription(topic text, name text, endpoint text, event_delivery_schema text, included_event_types text[], subject_begins_with text, subject_ends_with text, is_subject_case_sensitive boolean, max_delivery_attempts integer, event_ttl integer, max_events_per_batch integer, preferred_batch_size_in_kilobytes integer, deadletter boolean, advanced_filters jsonb, enable_advanced_filtering_on_arrays boolean, max_delivery_count integer, event_time_to_live text, max_events_per_second integer, endpoint_validation text, dead_letter_topic text) TO eventgrid_admin;


-- drop_topic's requests claimed and not sent yet are not sent either
CREATE OR REPLACE FUNCTION eventgrid.drop_topic(name text) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    sids bigint[];
BEGIN
    PERFORM eventgrid._check_not_null('topic name', name);
    IF NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = drop_topic.name FOR UPDATE) THEN
        RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(name)
            USING ERRCODE = 'undefined_object', HINT = 'List the topics with: SELECT name FROM eventgrid.topics;';
    END IF;
    -- publications of table changes to it stop: their triggers go
    PERFORM eventgrid._drop_topic_triggers(t.tgrelid::regclass, name)
       FROM (SELECT DISTINCT m.m AS tgrelid
               FROM eventgrid.table_publications p, eventgrid._publication_members(p.source_table, p.topic) m(m)
              WHERE p.topic = drop_topic.name) t;
    -- the subscriptions first (the delivery worker's lock order), then their retries
    SELECT array_agg(s.id ORDER BY s.id) INTO sids
      FROM (SELECT s.id FROM eventgrid.event_subscriptions s WHERE s.topic = drop_topic.name
             ORDER BY s.id FOR UPDATE) s;
    DELETE FROM eventgrid.retries r WHERE r.subscription_id = ANY (sids);
    -- subscriptions, positions, counters and publications go with the topic
    -- (ON DELETE CASCADE); its events stay in the event tables until they are emptied
    DELETE FROM eventgrid.topics t WHERE t.name = drop_topic.name;
    IF sids IS NOT NULL THEN
        PERFORM eventgrid._subscriptions_changed_at_commit();
    END IF;
END $$;

DROP FUNCTION eventgrid._pauses_changed_at_commit();
REVOKE ALL ON FUNCTION eventgrid._subscriptions_changed_at_commit() FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._log(text) FROM PUBLIC;


-- ---------------------------------------------------------------------------
-- What a held event subscription keeps: a paused one, or one whose endpoint
-- awaits validation, keeps its events as its own retries when they would
-- hold the event tables (store_rotation.c); one whose validation failed
-- keeps what waited for it when it failed, and nothing published while it
-- stays Failed (Event Grid never creates it).

-- Moves event subscription sid's position to the current snapshot; with
-- keep, the events it passes that match its filters and whose transactions
-- committed become its retries first (no attempt made, due at due), else
-- they are passed over.  Events of transactions still in progress stay
-- ahead of the position.  Returns how many became retries.
CREATE FUNCTION eventgrid._position_to_retries(sid bigint, due timestamp with time zone, keep boolean) RETURNS bigint
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    snap pg_snapshot := pg_current_snapshot();
    n bigint := 0;
BEGIN
    IF keep THEN
        INSERT INTO eventgrid.retries (subscription_id, event_id, event, payload, publish_time, event_bytes,
                                       attempts, next_attempt_at)
        SELECT s.id, e.id, e.event,
               (CASE WHEN t.input_schema = s.event_delivery_schema THEN e.event
                     ELSE eventgrid.convert_event(e.event, t.input_schema, s.event_delivery_schema, e.publish_time) END)::text,
               e.publish_time, coalesce(e.event_bytes, 0), 0, due
          FROM eventgrid.subscription_positions p
          JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id
          JOIN eventgrid.topics t ON t.name = s.topic
         CROSS JOIN LATERAL eventgrid._unpassed_events(s.topic, p.done, p.upto, p.after_txid, p.after_id) e
         WHERE p.subscription_id = sid AND pg_visible_in_snapshot(e.txid, snap)
           AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with, s.subject_ends_with,
                                  s.is_subject_case_sensitive, s.advanced_filters, s.enable_advanced_filtering_on_arrays);
        GET DIAGNOSTICS n = ROW_COUNT;
        UPDATE eventgrid.subscription_counters c SET matched = c.matched + n WHERE c.subscription_id = sid AND n > 0;
    END IF;
    UPDATE eventgrid.subscription_positions p SET done = snap, upto = NULL, after_txid = NULL, after_id = NULL
     WHERE p.subscription_id = sid;
    RETURN n;
END $$;
COMMENT ON FUNCTION eventgrid._position_to_retries(sid bigint, due timestamp with time zone, keep boolean) IS
    'Internal: moves an event subscription''s position to the current snapshot; with keep, the committed events it passes that match its filters become its retries (no attempt made, due at due) first, else they are passed over. Returns how many became retries. The upkeep worker calls it for held subscriptions whose events would keep an event table from being emptied.';

-- An endpoint validation that failed: what waited for the subscription
-- stays, as its retries; from now on its position passes everything.
CREATE FUNCTION eventgrid._fail_validation(sid bigint, why text) RETURNS void
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
BEGIN
    UPDATE eventgrid.endpoint_validations x SET state = 'Failed', last_error = left(why, 512)
     WHERE x.subscription_id = sid;
    PERFORM eventgrid._position_to_retries(sid, eventgrid._now(), true);
END $$;
COMMENT ON FUNCTION eventgrid._fail_validation(sid bigint, why text) IS
    'Internal: an endpoint validation has failed (provisioning state Failed, why in last_error); the events that waited at its position become its retries, and from now on its position passes everything published (the upkeep worker moves it along): a subscription whose validation failed keeps nothing new.';

CREATE OR REPLACE FUNCTION eventgrid.validate_event_subscription(topic text, subscription text, validation_code text) RETURNS void
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
        PERFORM eventgrid._fail_validation(sid, 'not validated manually within 10 minutes');
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

REVOKE ALL ON FUNCTION eventgrid._position_to_retries(bigint, timestamp with time zone, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._fail_validation(bigint, text) FROM PUBLIC;
-- ---------------------------------------------------------------------------
-- A hostile validation answer is a failed try of its own subscription only:
-- an answer body jsonb cannot hold is no validationResponse (the upkeep
-- worker also records each answer in a subtransaction of its own).

CREATE OR REPLACE FUNCTION eventgrid._record_validation(sid bigint, sent_code text, http_status integer, body text,
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
        -- whatever the receiver sent: a body that is not JSON jsonb can hold
        -- (\u0000, a number beyond numeric's range, not JSON at all) is a
        -- failed try; an empty one asks for manual validation
        BEGIN
            answer := nullif(body, '')::jsonb ->> 'validationResponse';
        EXCEPTION WHEN data_exception OR program_limit_exceeded OR statement_too_complex THEN
            GET STACKED DIAGNOSTICS problem = MESSAGE_TEXT;
            problem := 'the answer is not JSON eventgrid can read: ' || problem;
        END;
        IF problem IS NOT NULL THEN
            NULL;   -- tried again below
        ELSIF answer = sent_code THEN
            validated := true;
        ELSIF answer IS NULL THEN
            UPDATE eventgrid.endpoint_validations x SET state = 'AwaitingManualAction', manual_since = eventgrid._now(),
                   tries = x.tries + 1, last_error = NULL
             WHERE x.subscription_id = sid;
            RETURN 'AwaitingManualAction';
        ELSE
            UPDATE eventgrid.endpoint_validations x SET tries = x.tries + 1 WHERE x.subscription_id = sid;
            PERFORM eventgrid._fail_validation(sid, 'validationResponse is not the validation code sent');
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
           next_try_at = eventgrid._now() + interval '5 seconds'
     WHERE x.subscription_id = sid
    RETURNING CASE WHEN x.tries >= 3 THEN 'Failed' ELSE 'Creating' END INTO answer;
    IF answer = 'Failed' THEN
        PERFORM eventgrid._fail_validation(sid, problem);
    END IF;
    RETURN answer;
END $$;

-- ---------------------------------------------------------------------------
-- redeliver_dead_letters() and purge_dead_letters() name topics and
-- subscriptions that exist (purging: or that dead letters still name).

DROP FUNCTION eventgrid._dead_letter_ids(text, text, text, timestamp with time zone, timestamp with time zone);
CREATE FUNCTION eventgrid._dead_letter_ids(topic text, subscription text, reason text, dead_lettered_after timestamp with time zone, dead_lettered_before timestamp with time zone, existing_only boolean) RETURNS bigint[]
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    ids bigint[];
BEGIN
    IF reason IS NOT NULL AND reason NOT IN ('MaxDeliveryAttemptsExceeded', 'TimeToLiveExceeded', 'NonRetriableError') THEN
        RAISE EXCEPTION 'reason must be MaxDeliveryAttemptsExceeded, TimeToLiveExceeded or NonRetriableError, got %',
                        eventgrid._quote(reason)
            USING ERRCODE = 'invalid_parameter_value', HINT = 'Pass NULL for any reason.';
    END IF;
    IF dead_lettered_after IS NOT NULL AND dead_lettered_before IS NOT NULL
       AND dead_lettered_after >= dead_lettered_before THEN
        RAISE EXCEPTION 'dead_lettered_after must be earlier than dead_lettered_before'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- a name that is nowhere is a mistake, as in drop_topic(); purging may
    -- name a topic or subscription dropped since, whose dead letters stay
    IF topic IS NOT NULL AND NOT EXISTS (SELECT 1 FROM eventgrid.topics t WHERE t.name = _dead_letter_ids.topic)
       AND (existing_only OR NOT EXISTS (SELECT 1 FROM eventgrid.dead_letters d WHERE d.topic = _dead_letter_ids.topic)) THEN
        RAISE EXCEPTION 'topic % does not exist', eventgrid._quote(topic)
            USING ERRCODE = 'undefined_object',
                  HINT = CASE WHEN existing_only
                              THEN 'Dead letters are redelivered to existing topics only; eventgrid.dead_letter_events lists them.'
                              ELSE 'No topic and no dead letter has this name; eventgrid.dead_letter_events lists the dead letters.' END;
    END IF;
    IF subscription IS NOT NULL
       AND NOT EXISTS (SELECT 1 FROM eventgrid.event_subscriptions s
                        WHERE s.name = _dead_letter_ids.subscription
                          AND (_dead_letter_ids.topic IS NULL OR s.topic = _dead_letter_ids.topic))
       AND (existing_only OR NOT EXISTS (SELECT 1 FROM eventgrid.dead_letters d
                                          WHERE d.subscription_name = _dead_letter_ids.subscription
                                            AND (_dead_letter_ids.topic IS NULL OR d.topic = _dead_letter_ids.topic))) THEN
        RAISE EXCEPTION 'event subscription % does not exist%', eventgrid._quote(subscription),
                        CASE WHEN topic IS NULL THEN '' ELSE format(' for topic %s', eventgrid._quote(topic)) END
            USING ERRCODE = 'undefined_object',
                  HINT = CASE WHEN existing_only
                              THEN 'Dead letters are redelivered to existing event subscriptions only; eventgrid.dead_letter_events lists them.'
                              ELSE 'No event subscription and no dead letter has this name; eventgrid.dead_letter_events lists the dead letters.' END;
    END IF;
    SELECT array_agg(d.id ORDER BY d.id) INTO ids
      FROM (SELECT d.id FROM eventgrid.dead_letters d
             WHERE (_dead_letter_ids.topic IS NULL OR d.topic = _dead_letter_ids.topic)
               AND (_dead_letter_ids.subscription IS NULL OR d.subscription_name = _dead_letter_ids.subscription)
               AND (_dead_letter_ids.reason IS NULL OR d.dead_letter_reason = _dead_letter_ids.reason)
               AND (dead_lettered_after IS NULL OR d.dead_lettered_at >= dead_lettered_after)
               AND (dead_lettered_before IS NULL OR d.dead_lettered_at < dead_lettered_before)
             ORDER BY d.id FOR UPDATE) d;
    RETURN coalesce(ids, '{}');
END $$;
COMMENT ON FUNCTION eventgrid._dead_letter_ids(topic text, subscription text, reason text, dead_lettered_after timestamp with time zone, dead_lettered_before timestamp with time zone, existing_only boolean) IS
    'Internal: ids of the dead letters a filter selects (NULL: any), locked FOR UPDATE; 22023 for an unknown reason or an empty time range, 42704 for a topic or subscription that does not exist (unless existing_only is false and dead letters name it).';
REVOKE ALL ON FUNCTION eventgrid._dead_letter_ids(text, text, text, timestamp with time zone, timestamp with time zone, boolean) FROM PUBLIC;

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
    ids := eventgrid._dead_letter_ids(topic, subscription, reason, dead_lettered_after, dead_lettered_before, true);
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
COMMENT ON FUNCTION eventgrid.redeliver_dead_letters(topic text, subscription text, reason text, dead_lettered_after timestamp with time zone, dead_lettered_before timestamp with time zone) IS
    'Queues dead letters for delivery again and returns how many: each becomes a delivery with no attempts made and its time-to-live counted from now, due at once, and leaves eventgrid.dead_letters (if it fails again it is dead-lettered again). Filters (NULL: any): topic, subscription name, reason (MaxDeliveryAttemptsExceeded, TimeToLiveExceeded, NonRetriableError), dead_lettered_at >= dead_lettered_after and < dead_lettered_before. Dead letters of dropped subscriptions stay. Running it twice queues nothing the second time. Counted in subscription_counters.redelivered. Requires eventgrid_admin. Errors: 22023 unknown reason or empty time range, 42704 no such topic or subscription. SPEC 7.';

CREATE OR REPLACE FUNCTION eventgrid.purge_dead_letters(topic text DEFAULT NULL::text, subscription text DEFAULT NULL::text, reason text DEFAULT NULL::text, dead_lettered_after timestamp with time zone DEFAULT NULL::timestamp with time zone, dead_lettered_before timestamp with time zone DEFAULT NULL::timestamp with time zone) RETURNS bigint
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
DECLARE
    ids bigint[] := eventgrid._dead_letter_ids(topic, subscription, reason, dead_lettered_after,
                                               dead_lettered_before, false);
    n bigint;
BEGIN
    DELETE FROM eventgrid.dead_letters d WHERE d.id = ANY (ids);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;
COMMENT ON FUNCTION eventgrid.purge_dead_letters(topic text, subscription text, reason text, dead_lettered_after timestamp with time zone, dead_lettered_before timestamp with time zone) IS
    'Deletes the dead letters a filter selects and returns how many; the same filters as redeliver_dead_letters (NULL: any), where topic and subscription may also name ones dropped since that dead letters still name. Running it twice deletes nothing the second time. Requires eventgrid_admin. Errors: 22023, 42704 a topic or subscription that neither exists nor is named by a dead letter. SPEC 7.';
COMMENT ON FUNCTION eventgrid._record_validation(sid bigint, sent_code text, http_status integer, body text,
        allowed_origin text, allowed_rate text, origin text, error text) IS
    'Internal: records the answer to an endpoint validation request and returns the new provisioning state (NULL when the validation was started again meanwhile). Event Grid schema: HTTP 200 with {"validationResponse": code} validates, 200 with an empty body or JSON without it awaits validate_event_subscription() for 10 minutes, another code fails, a body that is not JSON eventgrid can read is a failed try. CloudEvents: a 2xx answer whose WebHook-Allowed-Origin is * or the origin sent validates, and WebHook-Allowed-Rate (requests a minute) becomes max_events_per_second. Otherwise tried again 5 s later, three tries in all, then Failed.';

-- ---------------------------------------------------------------------------
-- Every database: with the library preloaded, any database where the
-- extension is created is served, its workers started while it has work
-- (eventgrid.database_name is no longer used).  The launcher's view of all
-- databases, for a superuser or a role with pg_monitor.

COMMENT ON FUNCTION eventgrid._check_install_database() IS
    'Internal: run first by the install script; warns when the library is not preloaded (nothing is delivered until it is). Every database where the extension is created is served.';

CREATE FUNCTION eventgrid._served_databases(OUT database text, OUT state text, OUT delivery_workers integer,
        OUT upkeep_worker boolean, OUT delivery_wanted_at timestamp with time zone,
        OUT upkeep_wanted_at timestamp with time zone, OUT waiting_since timestamp with time zone,
        OUT held_by integer, OUT last_active timestamp with time zone) RETURNS SETOF record
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_served_databases';
COMMENT ON FUNCTION eventgrid._served_databases() IS
    'Internal: the launcher''s view of every database it knows; read eventgrid.served_databases.';
CREATE VIEW eventgrid.served_databases AS SELECT * FROM eventgrid._served_databases();
COMMENT ON VIEW eventgrid.served_databases IS
    'The launcher''s view of every database of the cluster (that allows connections and is not a template): database, state (served: the extension in this library''s version; no extension; other version: waits for ALTER EXTENSION eventgrid UPDATE; looking: a worker is finding out), delivery_workers and upkeep_worker running now, when they are wanted next (delivery_wanted_at, upkeep_wanted_at; NULL: running, or not until work comes), waiting_since (wanted, but every background worker slot was taken), held_by (the pid of a backend whose DDL needs the database to itself), last_active (when a worker last had work). Readable by superusers and members of pg_monitor; the same in every database.';
REVOKE ALL ON FUNCTION eventgrid._served_databases() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid._served_databases() TO pg_monitor;
REVOKE ALL ON TABLE eventgrid.served_databases FROM PUBLIC;
GRANT SELECT ON TABLE eventgrid.served_databases TO pg_monitor;

COMMENT ON VIEW eventgrid.worker_status IS
    'Each eventgrid worker of this database (delivery worker 1..eventgrid.delivery_workers, upkeep worker): pid (NULL when it does not run: workers run only while the database has work), state (idle or active), activity (its status line: what it delivers, waits for or failed at), state_since, wait_event_type, wait_event, backend_start. Readable by eventgrid_admin, which pg_stat_activity would show only <insufficient privilege>. eventgrid.served_databases shows every database''s.';

-- ---------------------------------------------------------------------------
-- Monitoring: the counters and histograms behind the Prometheus metrics,
-- kept by the delivery workers in the transaction that records the outcomes
-- they count, and views for an exporter's role (pg_monitor).

CREATE TABLE eventgrid.subscription_metric_counts (
    subscription_id bigint NOT NULL REFERENCES eventgrid.event_subscriptions (id) ON DELETE CASCADE,
    metric text NOT NULL CHECK (metric IN ('attempt_fail', 'dead_lettered', 'dropped', 'processing_bucket',
                                           'processing_sum', 'latency_bucket', 'latency_sum')),
    label text NOT NULL,
    value double precision NOT NULL,
    PRIMARY KEY (subscription_id, metric, label)
);
COMMENT ON TABLE eventgrid.subscription_metric_counts IS
    'Internal: per event subscription, failed delivery attempts by outcome (attempt_fail), events dead-lettered and dropped by reason, and the histograms of the destination''s processing duration per request and of publish-to-delivery latency per event (label: the bucket''s upper bound in seconds; *_sum: seconds in all); kept by the delivery workers with the outcomes. Read it through eventgrid.event_subscription_metrics, event_subscription_metric_labels and event_subscription_histograms.';
SELECT pg_catalog.pg_extension_config_dump('eventgrid.subscription_metric_counts', '');
GRANT SELECT ON TABLE eventgrid.subscription_metric_counts TO eventgrid_admin;

CREATE FUNCTION eventgrid._histogram_buckets(histogram text) RETURNS double precision[]
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN CASE histogram
        WHEN 'destination_processing_duration_seconds' THEN
            '{0.005,0.01,0.025,0.05,0.1,0.25,0.5,1,2.5,5,10,30,Infinity}'::float8[]
        WHEN 'delivery_latency_seconds' THEN
            '{0.005,0.01,0.025,0.05,0.1,0.25,0.5,1,2.5,5,10,30,60,300,900,3600,21600,86400,Infinity}'::float8[]
        END;
COMMENT ON FUNCTION eventgrid._histogram_buckets(text) IS
    'Internal: the upper bounds (seconds) of the buckets of a histogram, the same as the delivery workers count with (src/store_metrics.c), +Inf last.';

CREATE FUNCTION eventgrid._backlog(subscription_id bigint, OUT pending bigint,
        OUT oldest timestamp with time zone, OUT due_since timestamp with time zone) RETURNS record
    LANGUAGE sql STABLE PARALLEL SAFE
    BEGIN ATOMIC
 SELECT u.n + c.n + r.n AS pending,
        LEAST(u.oldest, c.oldest, r.oldest) AS oldest,
        LEAST(u.oldest, c.oldest, r.due_since) AS due_since
   FROM (SELECT count(*) AS n, min(e.publish_time) AS oldest
           FROM eventgrid.subscription_positions p
           JOIN eventgrid.event_subscriptions s ON s.id = p.subscription_id
          CROSS JOIN LATERAL eventgrid._unpassed_events(s.topic, p.done, p.upto, p.after_txid, p.after_id) e
          WHERE p.subscription_id = _backlog.subscription_id
            AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with, s.subject_ends_with,
                                   s.is_subject_case_sensitive, s.advanced_filters,
                                   s.enable_advanced_filtering_on_arrays)) u,
        (SELECT count(*) AS n, min(e.publish_time) AS oldest
           FROM eventgrid.chunks_in_flight c
           JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id
          CROSS JOIN LATERAL eventgrid._chunk_events(c.topic, c.done, c.upto, c.after_txid, c.after_id, c.last_txid,
                                                     c.last_id) e
          WHERE c.subscription_id = _backlog.subscription_id
            AND eventgrid._matches(e.event, s.included_event_types_lower, s.subject_begins_with, s.subject_ends_with,
                                   s.is_subject_case_sensitive, s.advanced_filters,
                                   s.enable_advanced_filtering_on_arrays)) c,
        (SELECT count(*) AS n, min(r.publish_time) AS oldest,
                min(r.next_attempt_at) FILTER (WHERE r.next_attempt_at <= eventgrid._now()) AS due_since
           FROM eventgrid.retries r
          WHERE r.subscription_id = _backlog.subscription_id) r;
END;
COMMENT ON FUNCTION eventgrid._backlog(bigint) IS
    'Internal: in one pass, the deliveries of an event subscription not finished yet (pending: events its position has not passed, first attempts in flight, and retries; eventgrid._pending() returns it), the publish time of the oldest of their events (oldest), and since when the delivery due longest has been due (due_since: an event not attempted yet since its publish, a retry since its next attempt time if that has come); NULL times when there is none.';

-- _pending() counts through _backlog(): one definition of what a
-- subscription still owes, for delivery_statistics and the metrics
CREATE OR REPLACE FUNCTION eventgrid._pending(subscription_id bigint) RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    BEGIN ATOMIC
 SELECT b.pending FROM eventgrid._backlog(_pending.subscription_id) b;
END;

CREATE FUNCTION eventgrid._topic_metrics(OUT topic text, OUT publish_success_total bigint,
        OUT unmatched_events_total bigint) RETURNS SETOF record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT t.name AS topic, coalesce(c.published, 0) AS publish_success_total,
        coalesce(c.unmatched, 0) AS unmatched_events_total
   FROM eventgrid.topics t LEFT JOIN eventgrid.topic_counters c ON c.topic = t.name;
END;
CREATE VIEW eventgrid.topic_metrics AS SELECT * FROM eventgrid._topic_metrics();
COMMENT ON VIEW eventgrid.topic_metrics IS
    'Prometheus counters per topic: publish_success_total (events published, counted by the upkeep worker about a second after commit; Event Grid''s PublishSuccessCount) and unmatched_events_total (events no event subscription''s filters took; UnmatchedEventCount). Totals since the topic was created. Readable by pg_monitor and eventgrid_admin. README "Monitoring".';

CREATE FUNCTION eventgrid._event_subscription_metrics(OUT topic text, OUT event_subscription text,
        OUT matched_events_total bigint, OUT delivery_success_total bigint,
        OUT pending_events bigint, OUT oldest_pending_event_age_seconds double precision,
        OUT overdue_seconds double precision, OUT paused integer, OUT endpoint_on_probation integer) RETURNS SETOF record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT s.topic, s.name AS event_subscription, coalesce(c.matched, 0) AS matched_events_total,
        coalesce(c.delivered, 0) AS delivery_success_total,
        b.pending AS pending_events,
        coalesce(extract(epoch FROM eventgrid._now() - b.oldest)::float8, 0) AS oldest_pending_event_age_seconds,
        coalesce(extract(epoch FROM eventgrid._now() - b.due_since)::float8, 0) AS overdue_seconds,
        (s.id IN (SELECT p.p FROM eventgrid._paused_subscriptions() p(p)))::integer AS paused,
        (coalesce(h.state, 'healthy') <> 'healthy')::integer AS endpoint_on_probation
   FROM eventgrid.event_subscriptions s
   LEFT JOIN eventgrid.subscription_counters c ON c.subscription_id = s.id
   LEFT JOIN eventgrid.endpoint_states h ON h.endpoint = s.endpoint
  CROSS JOIN LATERAL eventgrid._backlog(s.id) b;
END;
CREATE VIEW eventgrid.event_subscription_metrics AS SELECT * FROM eventgrid._event_subscription_metrics();
COMMENT ON VIEW eventgrid.event_subscription_metrics IS
    'Prometheus metrics per event subscription: counters matched_events_total (MatchedEventCount) and delivery_success_total (events delivered, DeliverySuccessCount); gauges pending_events (deliveries not finished, as delivery_statistics.pending), oldest_pending_event_age_seconds (since the oldest of them was published; 0 when none), overdue_seconds (how long the delivery due longest has been due: an event not attempted yet since its publish, a retry since its next attempt time; 0 when none is due; grows when nothing delivers), paused (1 when pause_delivery() holds it) and endpoint_on_probation (1 while its endpoint is on probation or probing, SPEC 6). Readable by pg_monitor and eventgrid_admin. README "Monitoring".';

-- plain views: a view reads its tables with its owner's rights, and the planner
-- takes the exporter's WHERE into the query (a function would compute every row)
CREATE VIEW eventgrid.event_subscription_metric_labels AS
 SELECT s.topic, s.name AS event_subscription, 'delivery_attempt_fail_total' AS metric, m.label, m.value
   FROM eventgrid.event_subscriptions s
   JOIN eventgrid.subscription_metric_counts m ON m.subscription_id = s.id AND m.metric = 'attempt_fail'
 UNION ALL
 SELECT s.topic, s.name AS event_subscription, k.metric || '_total' AS metric, r.reason AS label,
        coalesce(m.value, 0) AS value
   FROM eventgrid.event_subscriptions s
  CROSS JOIN (VALUES ('dead_lettered'), ('dropped')) k(metric)
  CROSS JOIN (VALUES ('MaxDeliveryAttemptsExceeded'), ('TimeToLiveExceeded'), ('NonRetriableError')) r(reason)
   LEFT JOIN eventgrid.subscription_metric_counts m
          ON m.subscription_id = s.id AND m.metric = k.metric AND m.label = r.reason;
COMMENT ON VIEW eventgrid.event_subscription_metric_labels IS
    'Prometheus counters per event subscription and label: delivery_attempt_fail_total by outcome (label: the lastDeliveryOutcome of each failed attempt, one per event; DeliveryAttemptFailCount; a row once an attempt failed so), dead_lettered_total and dropped_total by reason (label: deadLetterReason; DeadLetteredCount, DroppedEventCount; every reason always, 0 until it happens). Counted from 0.9.0 on. Readable by pg_monitor and eventgrid_admin. README "Monitoring".';

CREATE VIEW eventgrid.event_subscription_histograms AS
 SELECT x.topic, x.name AS event_subscription, x.histogram, x.le_text AS le,
        sum(x.n) OVER (PARTITION BY x.id, x.histogram ORDER BY x.le) AS bucket,
        x.total AS sum,
        sum(x.n) OVER (PARTITION BY x.id, x.histogram) AS count
   FROM (SELECT s.id, s.topic, s.name, h.histogram, b.le, l.le_text, coalesce(m.value, 0) AS n,
                coalesce(ms.value, 0) AS total
           FROM eventgrid.event_subscriptions s
          CROSS JOIN (VALUES ('destination_processing_duration_seconds', 'processing'),
                             ('delivery_latency_seconds', 'latency')) h(histogram, kind)
          CROSS JOIN LATERAL unnest(eventgrid._histogram_buckets(h.histogram)) b(le)
          CROSS JOIN LATERAL (SELECT CASE WHEN b.le = 'Infinity' THEN '+Inf' ELSE b.le::text END) l(le_text)
           LEFT JOIN eventgrid.subscription_metric_counts m
                  ON m.subscription_id = s.id AND m.metric = h.kind || '_bucket' AND m.label = l.le_text
           LEFT JOIN eventgrid.subscription_metric_counts ms
                  ON ms.subscription_id = s.id AND ms.metric = h.kind || '_sum' AND ms.label = '') x;
COMMENT ON VIEW eventgrid.event_subscription_histograms IS
    'Prometheus histograms per event subscription, one row per bucket: histogram destination_processing_duration_seconds (each request that got an HTTP answer, from sending to the answer: DestinationProcessingDurationInMs) or delivery_latency_seconds (each event delivered, from publish to the successful answer); le (the bucket''s upper bound in seconds, +Inf last), bucket (observations up to le, cumulative), sum (seconds in all) and count (observations; the +Inf bucket). Kept by the delivery workers as they record outcomes, not computed from the attempt history. Readable by pg_monitor and eventgrid_admin. README "Monitoring".';

CREATE FUNCTION eventgrid._worker_metrics(OUT delivery_workers_running integer, OUT upkeep_workers_running integer,
        OUT waiting_for_worker_slot_seconds double precision)
    RETURNS record
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    BEGIN ATOMIC
 SELECT (SELECT count(w.pid) FILTER (WHERE w.worker <> 'upkeep worker') FROM eventgrid._worker_pids() w)::integer,
        (SELECT count(w.pid) FILTER (WHERE w.worker = 'upkeep worker') FROM eventgrid._worker_pids() w)::integer,
        coalesce((SELECT extract(epoch FROM now() - d.waiting_since)::float8 FROM eventgrid._served_databases() d
                   WHERE d.database = current_database()), 0);
END;
CREATE VIEW eventgrid.worker_metrics AS SELECT * FROM eventgrid._worker_metrics();
COMMENT ON VIEW eventgrid.worker_metrics IS
    'Prometheus gauges of this database''s eventgrid workers: delivery_workers_running and upkeep_workers_running (workers run while the database has work and leave after eventgrid.worker_idle_timeout: 0 is normal when idle), and waiting_for_worker_slot_seconds (how long the database has wanted a worker that no background worker slot was free for, 0 when it does not: see max_worker_processes). Readable by pg_monitor and eventgrid_admin. README "Monitoring".';

DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY ARRAY['_topic_metrics', '_event_subscription_metrics', '_worker_metrics'] LOOP
        EXECUTE format('REVOKE ALL ON FUNCTION eventgrid.%I FROM PUBLIC', f);
        EXECUTE format('GRANT EXECUTE ON FUNCTION eventgrid.%I TO pg_monitor, eventgrid_admin', f);
        EXECUTE format('COMMENT ON FUNCTION eventgrid.%I IS %L', f,
                       'Internal: the rows of the view eventgrid.' || substr(f, 2) || ', for pg_monitor and eventgrid_admin.');
    END LOOP;
    FOREACH f IN ARRAY ARRAY['topic_metrics', 'event_subscription_metrics', 'event_subscription_metric_labels',
                             'event_subscription_histograms', 'worker_metrics'] LOOP
        EXECUTE format('REVOKE ALL ON TABLE eventgrid.%I FROM PUBLIC', f);
        EXECUTE format('GRANT SELECT ON TABLE eventgrid.%I TO pg_monitor, eventgrid_admin', f);
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION eventgrid._histogram_buckets(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid._histogram_buckets(text) TO pg_monitor, eventgrid_admin;
REVOKE ALL ON FUNCTION eventgrid._backlog(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION eventgrid._backlog(bigint) TO eventgrid_admin;
-- (delivery_statistics, read by eventgrid_admin, counts through _backlog, which reads the workers' clock)
GRANT EXECUTE ON FUNCTION eventgrid._now() TO eventgrid_admin;
REVOKE ALL ON FUNCTION eventgrid._check_dead_letter_topic(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION eventgrid._dead_letter_notification(text, text, text, jsonb, text, boolean, text, integer, text, integer, timestamp with time zone, timestamp with time zone) FROM PUBLIC;

-- The system identifier from memory: pg_control_system() read the control
-- file at every claim round.
CREATE OR REPLACE FUNCTION eventgrid._system_identifier() RETURNS bigint
    LANGUAGE c STABLE PARALLEL SAFE
    AS 'MODULE_PATHNAME', 'eventgrid_system_identifier';
COMMENT ON FUNCTION eventgrid._system_identifier() IS
    'Internal: this cluster''s system identifier (as pg_control_system() reports it, read from memory), stamped on positions.';
