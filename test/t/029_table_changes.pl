# Table changes published as events (issue "Publish table changes"):
# eventgrid.publish_table_changes() on an application table makes each
# INSERT, UPDATE and DELETE publish one event per changed row, in the
# changing transaction, delivered to a real receiver and parsed there:
#  - the payload in each input schema (Event Grid, CloudEvents, custom),
#    subjects with percent-encoded composite keys, columns carried and
#    update_columns watched, filters on data.new.*;
#  - rollback and subtransaction rollback publish nothing;
#  - bulk INSERT ... SELECT, COPY, INSERT ... ON CONFLICT DO UPDATE (an
#    insert or an update event per row), a partitioned parent (a row moved
#    between partitions is one Updated event), UPDATE of a primary key,
#    tables without a key, rows over 1 MB; each event's event_bytes the
#    size of its text, and its values what to_jsonb() makes, for every kind
#    of column;
#  - writes naming a partition, partitions created or attached later, a
#    detached one; renamed columns followed, dropped ones leaving the lists;
#  - who may do what: admin only, TRIGGER and SELECT checked for the caller,
#    a hand-made trigger refused (42501), writers need no eventgrid role;
#  - upgrade from 0.7.0, pg_dump/pg_restore, DROP TABLE, drop_topic and
#    DROP EXTENSION.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# The test reads events back from the event tables: no rotation may empty
# them meanwhile (a topic without subscriptions keeps nothing; under load a
# read came after the rotation once), as in 044 and 048.
my $node = new_node('changes', 'eventgrid.event_table_rotation' => "'1h'");
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', shift) }

# the statement's error (psql's stderr) and its SQLSTATE
sub fails { return sql_error($node, @_) }

# the events the receiver got on a path, each decoded (a batch or one event per request)
sub events_at
{
	my ($path, $n) = @_;
	my @ev;
	for my $req (wait_for_requests($r, $path, $n, 60))
	{
		my $body = $json->decode($req->{body});
		push @ev, ref($body) eq 'ARRAY' ? @$body : $body;
	}
	return @ev;
}

# --- installed as 0.7.0 and updated: the feature comes with the update
sql('DROP EXTENSION eventgrid');
sql("CREATE EXTENSION eventgrid VERSION '0.7.0'");
sql('ALTER EXTENSION eventgrid UPDATE');
is(sql("SELECT extversion = default_version FROM pg_extension x JOIN pg_available_extensions a ON a.name = x.extname"
	  . " WHERE x.extname = 'eventgrid'"), 't', 'updated from 0.7.0 to the current version');

sql(<<'SQL');
CREATE ROLE admin1 LOGIN IN ROLE eventgrid_admin;
CREATE ROLE owner1 LOGIN;
CREATE ROLE writer1 LOGIN;
CREATE ROLE publisher1 LOGIN IN ROLE eventgrid_publisher;
CREATE SCHEMA shop AUTHORIZATION owner1;
GRANT USAGE ON SCHEMA shop TO admin1, writer1, publisher1;
SET ROLE owner1;
CREATE TABLE shop.orders (region text, id int, status text, amount numeric, secret text, placed date,
                          PRIMARY KEY (region, id));
GRANT INSERT, UPDATE, DELETE, SELECT ON shop.orders TO writer1;
GRANT TRIGGER ON shop.orders TO admin1;
GRANT SELECT (region, id, status, amount, placed) ON shop.orders TO admin1;
RESET ROLE;
SELECT eventgrid.create_topic('orders-eg');
SELECT eventgrid.create_topic('orders-ce', 'CloudEventSchemaV1_0');
SELECT eventgrid.create_topic('orders-custom', 'CustomEventSchema');
SQL
sql("SELECT eventgrid.create_event_subscription('orders-eg', 'all', '$u/status/200/eg')");
sql("SELECT eventgrid.create_event_subscription('orders-eg', 'paid', '$u/status/200/paid',"
	  . " advanced_filters => '[{\"operatorType\": \"StringIn\", \"key\": \"data.new.status\", \"values\": [\"paid\"]}]')");
sql("SELECT eventgrid.create_event_subscription('orders-ce', 'all', '$u/status/200/ce')");
sql("SELECT eventgrid.create_event_subscription('orders-custom', 'all', '$u/status/200/custom')");

# --- who may publish a table's changes
like(fails("SELECT eventgrid.publish_table_changes('shop.orders', 'orders-eg')", 'writer1'),
	qr/42501: permission denied for function publish_table_changes/, 'not an admin: 42501');
like(fails("SELECT eventgrid.publish_table_changes('shop.orders', 'orders-eg')", 'publisher1'),
	qr/42501: permission denied for function publish_table_changes/, 'nor a publisher (42501)');
like(fails("SELECT eventgrid.stop_publishing_table_changes('shop.orders', 'orders-eg')", 'publisher1'),
	qr/42501: permission denied for function stop_publishing_table_changes/, 'who cannot stop one either (42501)');
like(fails("SELECT * FROM eventgrid.table_change_publications", 'publisher1'),
	qr/42501: permission denied for view table_change_publications/, 'nor read the publications (42501)');
like(fails("SELECT eventgrid.publish_table_changes('shop.orders', 'orders-eg')", 'admin1'),
	qr/42501: permission denied to publish column secret of table shop.orders/,
	'an admin may not publish a column it cannot read (42501)');
sql("CREATE TABLE public.other (id int PRIMARY KEY)");
like(fails("SELECT eventgrid.publish_table_changes('public.other', 'orders-eg')", 'admin1'),
	qr/42501: permission denied to publish the changes of table public.other.*HINT:  .*GRANT TRIGGER ON public.other TO admin1;/s,
	'nor a table it has no TRIGGER privilege on (42501, with the GRANT to ask for)');
like(fails("SELECT eventgrid.publish_table_changes('shop.orders', 'orders-eg', columns => ARRAY['nope'])", 'admin1'),
	qr/42703: table shop.orders has no column nope/, 'a column the table does not have: 42703');
like(fails("SELECT eventgrid.publish_table_changes('shop.orders', 'orders-eg', operations => ARRAY['TRUNCATE'])", 'admin1'),
	qr/22023: operations must be one or more of INSERT, UPDATE and DELETE/, 'TRUNCATE is not an operation: 22023');
like(fails("SELECT eventgrid.publish_table_changes('shop.orders', 'nope-topic')", 'admin1'),
	qr/42704: topic "nope-topic" does not exist/, 'no such topic: 42704');

$node->safe_psql('postgres', <<'SQL');
SET ROLE admin1;
SELECT eventgrid.publish_table_changes('shop.orders', 'orders-eg', columns => ARRAY['region', 'id', 'status', 'amount', 'placed']);
SELECT eventgrid.publish_table_changes('shop.orders', 'orders-ce', columns => ARRAY['region', 'id', 'status'],
                                       update_columns => ARRAY['status'], event_type_prefix => 'Shop.Order');
SELECT eventgrid.publish_table_changes('shop.orders', 'orders-custom', operations => ARRAY['delete'], columns => ARRAY['id']);
SQL
is(sql("SELECT string_agg(concat_ws(' ', source_table, topic, operations, coalesce(columns::text, '-'),"
		  . " coalesce(update_columns::text, '-'), event_type_prefix), E'\\n' ORDER BY topic) FROM eventgrid.table_change_publications"),
	"shop.orders orders-ce {DELETE,INSERT,UPDATE} {id,region,status} {status} Shop.Order\n"
	  . "shop.orders orders-custom {DELETE} {id} - shop.orders\n"
	  . "shop.orders orders-eg {DELETE,INSERT,UPDATE} {amount,id,placed,region,status} - shop.orders",
	'eventgrid.table_change_publications lists them');

# --- a writer with no eventgrid role changes rows; rolled-back changes publish nothing
$node->safe_psql('postgres', <<'SQL');
SET ROLE writer1;
INSERT INTO shop.orders VALUES ('eu/west', 1, 'new', 10.50, 'top secret', '2024-05-01'), ('us', 2, 'new', 3, 'hidden', NULL);
BEGIN;
INSERT INTO shop.orders VALUES ('eu', 3, 'new', 1, 's', NULL);
ROLLBACK;
BEGIN;
UPDATE shop.orders SET amount = 11 WHERE id = 1;
SAVEPOINT s;
DELETE FROM shop.orders WHERE id = 2;
ROLLBACK TO SAVEPOINT s;
UPDATE shop.orders SET status = 'paid', id = 12 WHERE id = 2;
COMMIT;
DELETE FROM shop.orders WHERE id = 12;
SQL

# requests may arrive in any order: events are sorted by subject, then type
my %rank = (Inserted => 1, Updated => 2, Deleted => 3);
sub by_key
{
	my ($type) = @_;
	return sort { $a->{subject} cmp $b->{subject} || $rank{ ($a->{$type} =~ /(\w+)$/)[0] } <=> $rank{ ($b->{$type} =~ /(\w+)$/)[0] } } @_[1 .. $#_];
}
my @eg = by_key('eventType', events_at('/status/200/eg', 5));
is(join(' ', map { "$_->{eventType}:$_->{subject}" } @eg),
	'shop.orders.Inserted:/shop/orders/eu%2Fwest/1 shop.orders.Updated:/shop/orders/eu%2Fwest/1'
	  . ' shop.orders.Updated:/shop/orders/us/12 shop.orders.Deleted:/shop/orders/us/12'
	  . ' shop.orders.Inserted:/shop/orders/us/2',
	'Event Grid schema: one event per changed row, percent-encoded composite keys, nothing rolled back');
is_deeply($eg[0]{data},
	{ operation => 'INSERT', schema => 'shop', table => 'orders', old => undef,
	  new => { region => 'eu/west', id => 1, status => 'new', amount => 10.5, placed => '2024-05-01' } },
	'data: operation, schema, table, new (the columns carried, as to_jsonb gives them), old null');
is_deeply([ $eg[1]{data}{old}{amount}, $eg[1]{data}{new}{amount} ], [ 10.5, 11 ], 'an UPDATE carries old and new');
is_deeply([ $eg[2]{data}{old}{id}, $eg[2]{data}{new}{id}, $eg[2]{data}{new}{status} ], [ 2, 12, 'paid' ],
	'an UPDATE of the primary key: one Updated event with the old and the new key');
is_deeply([ $eg[3]{data}{new}, $eg[3]{data}{old}{id} ], [ undef, 12 ], 'a DELETE carries old only');
ok(!(grep { $_->{body} =~ /secret|hidden/ } requests($r)), 'a column left out of columns appears in no request');
is(scalar(grep { $_->{dataVersion} eq '1' && $_->{eventTime} =~ /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/ } @eg), 5,
	'dataVersion "1", eventTime in RFC 3339');
my %ids = map { $_->{id} => 1 } @eg;
is(scalar(keys %ids), 5, 'every event has its own id');

my @paid = events_at('/status/200/paid', 1);
is(join(' ', map { $_->{subject} } @paid), '/shop/orders/us/12', 'an advanced filter on data.new.status selects the paid order');

# CloudEvents: the UPDATE of amount only (not watched) publishes nothing
my @ce = by_key('type', events_at('/status/200/ce', 4));
is(join(' ', map { "$_->{type}:$_->{subject}" } @ce),
	'Shop.Order.Inserted:/shop/orders/eu%2Fwest/1 Shop.Order.Updated:/shop/orders/us/12'
	  . ' Shop.Order.Deleted:/shop/orders/us/12 Shop.Order.Inserted:/shop/orders/us/2',
	'CloudEvents: the prefix chosen, and an UPDATE of an unwatched column publishes nothing');
is_deeply([ @{ $ce[0] }{qw(specversion source datacontenttype)} ], [ '1.0', '/postgresql/postgres/shop/orders', 'application/json' ],
	'CloudEvents attributes: specversion, source /postgresql/<database>/<schema>/<table>, datacontenttype');
my @custom = events_at('/status/200/custom', 1);
is_deeply(\@custom, [ { operation => 'DELETE', schema => 'shop', table => 'orders', new => undef, old => { id => 12 } } ],
	'custom schema: the data object itself, DELETE only');

# --- bulk statements: one set-based insert of events per statement
sql("SELECT eventgrid.create_topic('bulk')");
sql("CREATE TABLE bulk (id int PRIMARY KEY, a int, b text, c text, d int)");
sql("SELECT eventgrid.publish_table_changes('bulk', 'bulk')");
sql("INSERT INTO bulk SELECT i, i, 'b' || i, 'c', i FROM generate_series(1, 10000) i");
is(sql("SELECT count(*), count(DISTINCT event->>'subject') FROM eventgrid.events WHERE topic = 'bulk'"), '10000|10000',
	'INSERT ... SELECT of 10,000 rows: 10,000 events');
$node->safe_psql('postgres', "COPY bulk FROM STDIN;\n" . join('', map { "$_\t1\tb\tc\t1\n" } 20001 .. 20100) . "\\.\n");
is(sql("SELECT count(*) FROM eventgrid.events WHERE topic = 'bulk' AND event->>'subject' ~ '^/public/bulk/20(0[0-9][0-9]|100)\$'"), '100',
	'COPY: an event per row');
sql("INSERT INTO bulk VALUES (1, 0, 'x', 'x', 0), (2, 0, 'x', 'x', 0), (30001, 0, 'x', 'x', 0)"
	  . " ON CONFLICT (id) DO UPDATE SET a = -1");
is(sql("SELECT string_agg(event->>'eventType' || ' ' || (event->'data'->'new'->>'id'), ', ' ORDER BY event->>'eventType', event->'data'->'new'->>'id')"
		  . " FROM eventgrid.events WHERE topic = 'bulk' AND (event->'data'->'new'->>'a' IN ('-1', '0'))"),
	'public.bulk.Inserted 30001, public.bulk.Updated 1, public.bulk.Updated 2',
	'INSERT ... ON CONFLICT DO UPDATE: an Inserted or an Updated event per row, as happened');
is(sql("SELECT count(*) FROM eventgrid.events e WHERE topic = 'bulk' AND event->>'eventType' = 'public.bulk.Updated'"
		  . " AND (event->'data'->'old'->>'id') = (event->'data'->'new'->>'id')"), '2', 'each Updated event pairs a row\'s old and new version');

# the statements are made again when the table changes shape
sql("ALTER TABLE bulk ADD COLUMN extra text DEFAULT 'e'; ALTER TABLE bulk RENAME COLUMN d TO dd;"
	  . " INSERT INTO bulk (id, a, b, c, dd) VALUES (50000, 1, 'b', 'c', 4)");
is(sql("SELECT event->'data'->'new' FROM eventgrid.events WHERE topic = 'bulk' AND event->>'subject' = '/public/bulk/50000'"),
	'{"a": 1, "b": "b", "c": "c", "dd": 4, "id": 50000, "extra": "e"}',
	'after ALTER TABLE (a column added, one renamed) the events follow the new columns');

# --- a partitioned table: the publication on the parent covers rows in its partitions
sql("SELECT eventgrid.create_topic('parts')");
sql("CREATE TABLE measures (site text, id int, v int, PRIMARY KEY (site, id)) PARTITION BY LIST (site);"
	  . " CREATE TABLE measures_a PARTITION OF measures FOR VALUES IN ('a');"
	  . " CREATE TABLE measures_b PARTITION OF measures FOR VALUES IN ('b');");
sql("SELECT eventgrid.publish_table_changes('measures', 'parts')");
sql("INSERT INTO measures VALUES ('a', 1, 1), ('b', 2, 2); UPDATE measures SET site = 'b' WHERE id = 1; UPDATE measures SET v = 5 WHERE id = 2");
is(sql("SELECT string_agg(event->>'eventType' || ' ' || (event->>'subject') || ' ' || coalesce(event->'data'->'old'->>'site', '-'), ', ' ORDER BY id)"
		  . " FROM eventgrid.events WHERE topic = 'parts'"),
	'public.measures.Inserted /public/measures/a/1 -, public.measures.Inserted /public/measures/b/2 -,'
	  . ' public.measures.Updated /public/measures/b/1 a, public.measures.Updated /public/measures/b/2 b',
	'partitions: inserts routed there, a row moved between partitions is one Updated event');
# writes that name a partition publish too, as the parent's events; so do
# partitions created or attached later, and a detached one stops
sql("DELETE FROM eventgrid.events WHERE topic = 'parts'");
sql("CREATE TABLE measures_c PARTITION OF measures FOR VALUES IN ('c');"
	  . " CREATE TABLE measures_d (site text NOT NULL, id int NOT NULL, v int);"
	  . " ALTER TABLE measures ATTACH PARTITION measures_d FOR VALUES IN ('d');"
	  . " CREATE TABLE measures_e (site text NOT NULL, id int NOT NULL, v int) PARTITION BY RANGE (id);"
	  . " CREATE TABLE measures_e1 PARTITION OF measures_e FOR VALUES FROM (0) TO (100);"
	  . " ALTER TABLE measures ATTACH PARTITION measures_e FOR VALUES IN ('e')");
sql("INSERT INTO measures_a VALUES ('a', 10, 1); INSERT INTO measures_c VALUES ('c', 11, 1);"
	  . " INSERT INTO measures_d VALUES ('d', 12, 1); INSERT INTO measures_e1 VALUES ('e', 13, 1);"
	  . " UPDATE measures_a SET v = 2 WHERE id = 10; DELETE FROM measures_d WHERE id = 12");
is(sql("SELECT string_agg(event->>'eventType' || ' ' || (event->>'subject'), ', ' ORDER BY id)"
		  . " FROM eventgrid.events WHERE topic = 'parts'"),
	'public.measures.Inserted /public/measures/a/10, public.measures.Inserted /public/measures/c/11,'
	  . ' public.measures.Inserted /public/measures/d/12, public.measures.Inserted /public/measures/e/13,'
	  . ' public.measures.Updated /public/measures/a/10, public.measures.Deleted /public/measures/d/12',
	'partitions: writes naming a partition (one created later, one attached, a sub-partition) publish as the parent');
sql("ALTER TABLE measures DETACH PARTITION measures_d");
sql("DELETE FROM eventgrid.events WHERE topic = 'parts'; INSERT INTO measures_d VALUES ('d', 14, 1)");
is(sql("SELECT count(*) FROM eventgrid.events WHERE topic = 'parts'") . ' '
	  . sql("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'measures_d'::regclass"), '0 0',
	'partitions: a detached partition publishes nothing and keeps no trigger');

# --- renamed columns are followed; a left-out column never appears
sql("SELECT eventgrid.create_topic('renames')");
sql("CREATE TABLE people (id int PRIMARY KEY, name text, secret text, note text);"
	  . " SELECT eventgrid.publish_table_changes('people', 'renames', columns => ARRAY['id', 'name'], update_columns => ARRAY['name'])");
sql("ALTER TABLE people RENAME COLUMN name TO full_name; ALTER TABLE people RENAME COLUMN secret TO name");
is(sql("SELECT columns::text || ' ' || update_columns::text FROM eventgrid.table_change_publications WHERE topic = 'renames'"),
	'{full_name,id} {full_name}', 'renames: the lists follow the renamed column, not the name');
sql("INSERT INTO people VALUES (1, 'Ann', 'hush', 'n'); UPDATE people SET full_name = 'Anne'; UPDATE people SET name = 'still hush'");
is(sql("SELECT string_agg((event->>'eventType') || ' ' || (event->'data'->'new')::text, ', ' ORDER BY id)"
		  . " FROM eventgrid.events WHERE topic = 'renames'"),
	'public.people.Inserted {"id": 1, "full_name": "Ann"}, public.people.Updated {"id": 1, "full_name": "Anne"}',
	'renames: events carry the renamed column, an UPDATE of it publishes, the left-out column renamed to a listed name never appears');
sql("ALTER TABLE people DROP COLUMN note");
like(fails("ALTER TABLE people DROP COLUMN full_name"), qr/2BP01: cannot drop the last column that the publication of table public.people to topic "renames" names/,
	'a dropped column the lists name is refused when it is the last one (2BP01)');
sql("ALTER TABLE people ADD COLUMN nick text;"
	  . " SELECT eventgrid.publish_table_changes('people', 'renames', columns => ARRAY['id', 'full_name', 'nick'])");
sql("ALTER TABLE people DROP COLUMN nick");
is(sql("SELECT columns FROM eventgrid.table_change_publications WHERE topic = 'renames'"), '{full_name,id}',
	'a dropped column leaves the lists');

# --- no primary key; a key column not carried; a row over 1 MB
sql("CREATE TABLE nokey (v text); SELECT eventgrid.publish_table_changes('nokey', 'parts')");
sql("CREATE TABLE keyed (id int PRIMARY KEY, v text); SELECT eventgrid.publish_table_changes('keyed', 'parts', columns => ARRAY['v'])");
sql("INSERT INTO nokey VALUES ('x'); INSERT INTO keyed VALUES (7, 'y')");
is(sql("SELECT string_agg(event->>'subject', ' ' ORDER BY id) FROM eventgrid.events WHERE topic = 'parts' AND event->>'eventType' ~ 'nokey|keyed'"),
	'/public/nokey /public/keyed', 'without a key, or with the key not carried, the subject is /<schema>/<table>');
like(fails("INSERT INTO nokey VALUES (repeat('x', 1100000))"), qr/54000: .*1 MB|54000: .*1048576/,
	'a row whose event is over 1 MB fails the statement (54000)');
my ($alone) = fails("INSERT INTO nokey VALUES (repeat('x', 1048500))") =~ /54000: event is (\d+) bytes/;
my ($later) = fails("INSERT INTO nokey VALUES ('small'), (repeat('x', 1048500)), ('small')") =~ /54000: event is (\d+) bytes/;
ok(defined $alone && $alone > 1048576 && defined $later && $later == $alone,
	'so does a later row of a statement, sized from its values as exactly as the first from its text'
	  . ' (1,048,500 characters and the envelope: ' . ($later // 'no error') . ' bytes)');
is(sql("SELECT count(*) FROM nokey"), '1', 'and the rows are not written');

# --- each event's recorded size is the size of its JSON text, whatever its
# values (the trigger sizes events after the first of a statement from
# their values alone)
$node->safe_psql('postgres', <<'SQL');
SELECT eventgrid.create_topic('sizes-eg');
SELECT eventgrid.create_topic('sizes-ce', 'CloudEventSchemaV1_0');
SELECT eventgrid.create_topic('sizes-custom', 'CustomEventSchema');
CREATE TYPE mood AS ENUM ('ok', 'sad "really"');
CREATE DOMAIN small AS int2 CHECK (VALUE > -1000);
CREATE DOMAIN label AS varchar(30);
CREATE TABLE sized (k text, n int, PRIMARY KEY (k, n), t text, num numeric, f float8, b bool, j json, jb jsonb,
	a int[], ts timestamptz, m mood, v varchar(20), sm small, l bigint, lb label, c char(3));
SELECT eventgrid.publish_table_changes('sized', 'sizes-eg');
SELECT eventgrid.publish_table_changes('sized', 'sizes-ce');
SELECT eventgrid.publish_table_changes('sized', 'sizes-custom');
INSERT INTO sized
SELECT CASE WHEN i % 3 = 0 THEN 'k/é ' || i ELSE 'k' || repeat('x', i) END, i,
       CASE i % 5 WHEN 0 THEN NULL WHEN 1 THEN E'quote " back \\ nl \n tab \t ctl \x01 é 😀' ELSE repeat('t', i * 7) END,
       CASE WHEN i % 2 = 0 THEN 1e300::numeric * i ELSE -i / 7.0 END, i / 3.0, i % 2 = 0,
       CASE WHEN i % 4 = 0 THEN NULL ELSE json_build_object('x', i, 's', repeat('"', i)) END,
       jsonb_build_array(i, 'é', NULL, jsonb_build_object('deep', repeat('\', i))),
       ARRAY[i, -i, NULL], '2024-05-01 12:00+02'::timestamptz + i * interval '1 minute',
       CASE WHEN i % 2 = 0 THEN 'ok'::mood ELSE 'sad "really"' END, left(repeat('ü', i), 20),
       -i * 20, CASE WHEN i % 2 = 0 THEN 9223372036854775807 - i ELSE -9223372036854775807 - 1 + i END, E'l\\' || i, 'c' || i % 3
  FROM generate_series(1, 40) i;
UPDATE sized SET t = CASE WHEN n % 2 = 0 THEN repeat(E'\n', n) END, j = NULL WHERE n <= 20;
DELETE FROM sized WHERE n > 30;
SQL
is(sql("SELECT string_agg(topic || ' ' || count || ' ' || wrong, ', ' ORDER BY topic) FROM"
		  . " (SELECT topic, count(*), count(*) FILTER (WHERE event_bytes <> octet_length(event::text)) AS wrong"
		  . "    FROM eventgrid.events WHERE topic LIKE 'sizes-%' GROUP BY topic) s"),
	'sizes-ce 70 0, sizes-custom 70 0, sizes-eg 70 0',
	'every event\'s event_bytes is the length of its JSON text: escapes, non-ASCII, nulls, numbers, nested values, text forms');
is(sql("SELECT count(*), count(*) FILTER (WHERE EXISTS (SELECT 1 FROM eventgrid.events e WHERE e.topic = 'sizes-custom'"
		  . " AND e.event->'new' = to_jsonb(s) AND (e.event->'new')::text = to_jsonb(s)::text)) FROM sized s"),
	'30|30', 'each row\'s values are the JSON to_jsonb() makes of them (numbers, booleans, strings, domains, user-defined types)');
sql("DROP TABLE sized; DROP TYPE mood; DROP DOMAIN small, label");

# --- a trigger made by hand cannot publish
sql("CREATE TABLE owned (id int); ALTER TABLE owned OWNER TO owner1");
like(fails("CREATE TRIGGER hijack AFTER INSERT ON owned REFERENCING NEW TABLE AS eventgrid_rows FOR EACH STATEMENT"
		  . " EXECUTE FUNCTION eventgrid._table_change_trigger('orders-eg')", 'owner1'),
	qr/42501: permission denied for function eventgrid._table_change_trigger/, 'a table owner cannot attach the trigger function (42501)');
sql("CREATE TRIGGER hijack AFTER INSERT ON owned REFERENCING NEW TABLE AS eventgrid_rows FOR EACH STATEMENT"
	  . " EXECUTE FUNCTION eventgrid._table_change_trigger('orders-eg')");
like(fails("INSERT INTO owned VALUES (1)", 'owner1'),
	qr/42501: trigger hijack on table public.owned does not belong to a publication of its changes to topic "orders-eg"/,
	'and one attached by a superuser refuses to run (42501)');
sql("DROP TRIGGER hijack ON owned");
# a trigger of the owner's own that has a publication trigger's name is left alone
$node->safe_psql('postgres', "SET ROLE owner1; CREATE FUNCTION shop.mine() RETURNS trigger LANGUAGE plpgsql AS 'BEGIN RETURN NULL; END';"
	  . " CREATE TRIGGER \"eg_orders-eg_insert\" AFTER INSERT ON owned FOR EACH STATEMENT EXECUTE FUNCTION shop.mine()");
like(fails("SELECT eventgrid.publish_table_changes('owned', 'orders-eg')"), qr/42710: trigger "eg_orders-eg_insert" for relation "owned" already exists/,
	'a publication does not drop a trigger of the owner\'s that has its name (42710)');
is(sql("SELECT tgfoid::regprocedure FROM pg_trigger WHERE tgrelid = 'owned'::regclass"), "shop.mine()", "which stays");
is(sql("SELECT count(*) FROM eventgrid.table_publications WHERE source_table = 'owned'::regclass"), '0', 'and nothing is half set up');

# --- stopping; DROP TABLE and drop_topic end publications
like(fails("SELECT eventgrid.stop_publishing_table_changes('bulk', 'bulk')", 'admin1'),
	qr/42501: permission denied to stop publishing the changes of table public.bulk/, 'stopping needs TRIGGER on the table (42501)');
sql("SELECT eventgrid.stop_publishing_table_changes('bulk', 'bulk')");
my $before = sql("SELECT count(*) FROM eventgrid.events WHERE topic = 'bulk'");
sql("INSERT INTO bulk VALUES (40000, 1, 'b', 'c', 1)");
is(sql("SELECT count(*) FROM eventgrid.events WHERE topic = 'bulk'"), $before, 'a stopped publication publishes nothing');
is(sql("SELECT count(*) FROM pg_trigger WHERE tgrelid = 'bulk'::regclass"), '0', 'and its triggers are gone');
sql("DROP TABLE nokey");
is(sql("SELECT count(*) FROM eventgrid.table_change_publications WHERE topic = 'parts'"), '2', 'DROP TABLE ends its publication');
sql("SELECT eventgrid.drop_topic('parts')");
is(sql("SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'eg_parts_%'"), '0', 'drop_topic stops the publications to it, on every partition');
sql("INSERT INTO keyed VALUES (8, 'z')");
is(sql("SELECT v || ' ' || (SELECT count(*) FROM pg_trigger WHERE tgrelid = 'keyed'::regclass) FROM keyed WHERE id = 8"), 'z 0',
	'and writes to their tables go on, with no trigger left');

# --- pg_dump / pg_restore keeps publications working
my $dump = "$PostgreSQL::Test::Utils::tmp_check/changes.dump";
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ], 'pg_dump -Fc');
$node->append_conf('postgresql.conf', "eventgrid.database_name = 'restored'\n");
$node->restart;
sql('CREATE DATABASE restored');
$node->command_ok([ 'pg_restore', '--exit-on-error', '-d', $node->connstr('restored'), $dump ], 'pg_restore into a new database');
is($node->safe_psql('restored', "SELECT string_agg(source_table || ' ' || topic, ', ' ORDER BY topic) FROM eventgrid.table_change_publications"),
	'shop.orders orders-ce, shop.orders orders-custom, shop.orders orders-eg, people renames', 'the publications are restored');
$node->safe_psql('restored', "SET ROLE writer1; INSERT INTO shop.orders VALUES ('eu', 99, 'new', 1, 'x', NULL)");
is($node->safe_psql('restored', "SELECT string_agg(topic || ' ' || (event->>'subject'), ', ' ORDER BY topic) FROM eventgrid.events"
		  . " WHERE topic LIKE 'orders-%' AND coalesce(event->>'subject', '') LIKE '%/99'"),
	'orders-ce /shop/orders/eu/99, orders-eg /shop/orders/eu/99', 'and publish from the restored database');

# --- one session keeps what it looked up of a publication between its
# statements; a change by another session, or its own, is seen at the next one
sql("SELECT eventgrid.create_topic('kept')");
sql("CREATE TABLE kept_t (id int PRIMARY KEY, a int, b text)");
sql("SELECT eventgrid.publish_table_changes('kept_t', 'kept')");
my $writer = $node->background_psql('postgres');
my $kept_new = sub {
	return sql("SELECT (event->'data'->'new')::text || ' ' || (event->>'subject') FROM eventgrid.events"
		  . " WHERE topic = 'kept' ORDER BY id DESC LIMIT 1");
};
$writer->query_safe("INSERT INTO kept_t VALUES (1, 1, 'x')");
is($kept_new->(), '{"a": 1, "b": "x", "id": 1} /public/kept_t/1', 'a session publishes its first change');
sql("SELECT eventgrid.publish_table_changes('kept_t', 'kept', columns => ARRAY['id', 'b'])");
$writer->query_safe("INSERT INTO kept_t VALUES (2, 2, 'y')");
is($kept_new->(), '{"b": "y", "id": 2} /public/kept_t/2', "the same session's next statement follows another session's new columns");
sql("ALTER TABLE kept_t RENAME COLUMN b TO bee");
$writer->query_safe("INSERT INTO kept_t VALUES (3, 3, 'z')");
is($kept_new->(), '{"id": 3, "bee": "z"} /public/kept_t/3', 'and a column renamed');
sql("CREATE SCHEMA kept_s; ALTER TABLE kept_t SET SCHEMA kept_s; ALTER SCHEMA kept_s RENAME TO kept_s2");
$writer->query_safe("INSERT INTO kept_s2.kept_t VALUES (4, 4, 'w')");
is($kept_new->(), '{"id": 4, "bee": "w"} /kept_s2/kept_t/4', 'and the table moved to a schema renamed since');
$writer->query_safe("BEGIN; SELECT eventgrid.publish_table_changes('kept_s2.kept_t', 'kept', columns => ARRAY['id']);"
	  . " INSERT INTO kept_s2.kept_t VALUES (5, 5, 'v'); COMMIT");
is($kept_new->(), '{"id": 5} /kept_s2/kept_t/5', 'and its own change, in the same transaction');
# (a change of the publication's row alone, which no supported call makes
# without also changing the table's triggers, is followed too)
$writer->query_safe("INSERT INTO kept_s2.kept_t VALUES (50, 50, 'v')");
is($kept_new->(), '{"id": 50} /kept_s2/kept_t/50', 'the next statement uses what it keeps');
sql("UPDATE eventgrid.table_publications SET columns = ARRAY['id', 'a'] WHERE topic = 'kept'");
$writer->query_safe("INSERT INTO kept_s2.kept_t VALUES (7, 7, 't')");
is($kept_new->(), '{"a": 7, "id": 7} /kept_s2/kept_t/7', 'and a change of the publication row alone');
sql("SELECT eventgrid.stop_publishing_table_changes('kept_s2.kept_t', 'kept')");
$writer->query_safe("INSERT INTO kept_s2.kept_t VALUES (6, 6, 'u')");
is($kept_new->(), '{"a": 7, "id": 7} /kept_s2/kept_t/7', 'and publishes nothing once the publication stopped');
$writer->quit;

# --- DROP EXTENSION says what depends on it
like(fails_in('restored', 'DROP EXTENSION eventgrid'), qr/2BP01: .*trigger eg_orders-ce_insert on table shop.orders depends on function eventgrid._table_change_trigger\(\)/s,
	'DROP EXTENSION with publications names the triggers that depend on it (2BP01)');

sub fails_in
{
	my ($db, $sql) = @_;
	my ($ret, $out, $err) = $node->psql($db, "\\set VERBOSITY verbose\n" . $sql);
	return $ret == 0 ? 'no error' : $err;
}

$node->stop;
done_testing();
