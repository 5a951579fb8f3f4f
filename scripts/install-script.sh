#!/usr/bin/env bash
# Writes sql/eventgrid--<version>.sql, the full install script of the
# version in eventgrid.control, from what the upgrade chain builds: a
# throwaway cluster installs the oldest full script and every upgrade
# script up to that version, the extension's objects are released from it
# and dumped (pg_dump --schema-only), and the dump becomes the install
# script, with what a dump does not hold added back: the install-database
# check first, the roles, the rows the scripts insert and the tables
# pg_dump must copy (pg_extension_config_dump).  Run it (as root, like the
# other scripts) after writing a new upgrade script; test/t/023 checks that
# both ways of installing give the same schema.
set -euo pipefail
. "$(dirname "$0")/common.sh"
eg_setup "$@"
work=$EG_WORK
trap 'eg_as_postgres pg_ctl -D "$work/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

version=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$EG_SRC/eventgrid.control")
out="$EG_SRC/sql/eventgrid--$version.sql"
# the installed copy of the script being made must not be used to make it
rm -f "$($PG_CONFIG --sharedir)/extension/eventgrid--$version.sql"

eg_as_postgres initdb -D "$work/data" -A trust -U postgres >/dev/null
printf "port = 55499\nlisten_addresses = ''\nunix_socket_directories = '%s'\n" "$work" >> "$work/data/postgresql.conf"
eg_as_postgres pg_ctl -D "$work/data" -l "$work/server.log" -w start >/dev/null
psql() { eg_as_postgres psql -h "$work" -p 55499 -X -q -v ON_ERROR_STOP=1 -d postgres "$@"; }

psql -c "SET client_min_messages = error; CREATE EXTENSION eventgrid" >/dev/null
[ "$(psql -At -c "SELECT extversion FROM pg_extension WHERE extname = 'eventgrid'")" = "$version" ]
# (tables an upgrade dropped stay in extconfig as bare OIDs: left out)
config=$(psql -At -c "
    SELECT string_agg(format('SELECT pg_catalog.pg_extension_config_dump(%L, %L);', c::regclass::text, w), E'\n'
                      ORDER BY c::regclass::text)
      FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS x(c, w)
     WHERE e.extname = 'eventgrid'
       AND EXISTS (SELECT 1 FROM pg_class r WHERE r.oid = x.c AND r.relnamespace = 'eventgrid'::regnamespace)")
# released from the extension, its objects are dumped like any others
psql -At -c "
    SELECT format('ALTER EXTENSION eventgrid DROP %s %s;', o.type, o.identity)
      FROM pg_depend d, LATERAL pg_identify_object(d.classid, d.objid, d.objsubid) o
     WHERE d.refclassid = 'pg_extension'::regclass
       AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'eventgrid') AND d.deptype = 'e'" \
    | psql >/dev/null
# privileges the scripts gave count as initial privileges, which pg_dump
# leaves out; forgotten here, they are dumped as GRANT and REVOKE
psql -c "DELETE FROM pg_init_privs WHERE privtype = 'e'" >/dev/null
eg_as_postgres pg_dump -h "$work" -p 55499 --schema-only --schema=eventgrid --no-owner postgres > "$work/dump.sql"
# event triggers belong to no schema: they come from a dump of the database
eg_as_postgres pg_dump -h "$work" -p 55499 --schema-only --no-owner postgres > "$work/all.sql"

python3 - "$work/dump.sql" "$out" "$version" "$config" "$work/all.sql" <<'PY'
import re, sys
dump, out, version, config, alldump = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
text = open(dump).read()
event_triggers = ''.join(
    re.sub(r'^--\n-- (Name|Data for Name): .*\n--\n', '', block.rstrip('\n') + '\n\n', flags=re.M)
    for block in re.split(r'\n(?=--\n-- )', open(alldump).read())
    if re.match(r'--\n-- Name: (EVENT TRIGGER )?\S+; Type: (EVENT TRIGGER|COMMENT);', block)
    and ('Type: EVENT TRIGGER;' in block.split('\n')[1] or 'Name: EVENT TRIGGER ' in block.split('\n')[1]))
event_triggers = re.sub(r'\n{3,}', '\n\n', event_triggers)
# pg_dump's session settings, section banners and the schema itself go
body = []
for block in re.split(r'\n(?=--\n-- )', text):
    if block.startswith('--\n-- PostgreSQL database dump') or 'Type: SCHEMA;' in block.split('\n--\n', 1)[0]:
        continue
    body.append(block)
text = '\n'.join(body)
text = re.sub(r'^SET .*\n|^SELECT pg_catalog\.set_config.*\n|^\\(un)?restrict .*\n', '', text, flags=re.M)
text = re.sub(r'^--\n-- (Name|Data for Name): .*\n--\n', '', text, flags=re.M)
text = re.sub(r'^-- (PostgreSQL database dump complete|Dumped (from|by) .*)\n', '', text, flags=re.M)
text = text.replace("'$libdir/eventgrid'", "'MODULE_PATHNAME'")
# the install-database check runs first (below): not created twice
text = re.sub(r"CREATE FUNCTION eventgrid\._check_install_database\(\) RETURNS void\n.*?;\n", '', text, flags=re.S)
text = re.sub(r'\n{3,}', '\n\n', text).strip() + '\n'
head = f'''-- eventgrid {version}: the full install script of this version.
--
-- Made by scripts/install-script.sh from what the upgrade scripts build
-- (sql/eventgrid--A--B.sql, from the oldest full script on): edit those,
-- never this file, and make it again.  test/t/023_install_script.pl checks
-- that installing this script and updating from the oldest version give
-- the same schema, privileges and comments.
--
-- Safety rules every object here follows, whoever calls it: SQL functions
-- have SQL-standard bodies (RETURN / BEGIN ATOMIC), bound to pg_catalog's
-- functions and operators when the extension is created; PL/pgSQL functions
-- run with search_path = pg_catalog, pg_temp; PUBLIC may execute only
-- publish(), which checks the caller's privileges, and the internal
-- functions that read with the caller's own privileges.  Three roles carry
-- the privileges: eventgrid_admin (configuration, statistics, dead letters),
-- eventgrid_publisher (publishing) and eventgrid_receiver (pull delivery);
-- a fourth, eventgrid_http, is the HTTP listener's (SPEC 16) and is
-- granted to no one.

\\echo Use "CREATE EXTENSION eventgrid" to load this file. \\quit

-- Preloaded, the worker serves one database: refuse to install anywhere else.
CREATE FUNCTION eventgrid._check_install_database() RETURNS void
    LANGUAGE c
    AS 'MODULE_PATHNAME', 'eventgrid_check_install_database';
SELECT eventgrid._check_install_database();

-- The roles (cluster-wide; kept if the extension is dropped): three administrators grant, and the HTTP listener's.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'eventgrid_admin') THEN
        CREATE ROLE eventgrid_admin NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'eventgrid_publisher') THEN
        CREATE ROLE eventgrid_publisher NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'eventgrid_receiver') THEN
        CREATE ROLE eventgrid_receiver NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'eventgrid_http') THEN
        CREATE ROLE eventgrid_http NOLOGIN;
    END IF;
END $$;
COMMENT ON ROLE eventgrid_admin IS
    'eventgrid: may configure topics and event subscriptions, read statistics, and read and delete dead letters. Grant it to administrators.';
COMMENT ON ROLE eventgrid_publisher IS
    'eventgrid: may publish events (INSERT INTO eventgrid.events (topic, event), eventgrid.publish()). Grant it to applications.';
COMMENT ON ROLE eventgrid_receiver IS
    'eventgrid: may receive the events of queue event subscriptions and acknowledge, release or reject them or renew their locks (eventgrid.receive() and the other subscriber operations). Grant it to consumers.';
COMMENT ON ROLE eventgrid_http IS
    'eventgrid: the role of the HTTP listener''s connections (eventgrid.http_port): may run Event Grid''s data plane (eventgrid._http_publish() and eventgrid._http_namespace(), which check the topic''s access keys) and nothing else. Grant it to no one.';

'''
tail = f'''
-- The rows the rotations start from.
INSERT INTO eventgrid.event_table_rotations (event_table) VALUES (0), (1), (2);
INSERT INTO eventgrid.attempt_log_rotation (history_table, started_at, first_id) VALUES (0, now(), 1);

-- Event triggers (no schema holds them).
{event_triggers}
-- What pg_dump copies of the extension's tables (user data and the queue).
{config}
'''
open(out, 'w').write(head + text + tail)
PY
echo "== wrote $out"
