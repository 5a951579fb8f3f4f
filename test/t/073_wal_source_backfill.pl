# A WAL source's backfill (SPEC 16 of the issue, docs/SPEC.md 19):
# create_wal_source(..., backfill => true) publishes every row of the tables
# mapped in its creating transaction, as of the snapshot its slot was made
# at, before the changes after it.
#   - the rows as they were at the slot's snapshot, though the source
#     changes them while the backfill runs (the worker held between two
#     chunks by the pause point wal-backfill-chunk), in key order, as
#     <table>.Backfilled events (data.operation BACKFILL, data.new the row,
#     the subject and types of table changes), with ids derived from the
#     source, the slot, the table and the key; then the changes made
#     meanwhile, from the stream; a composite key with quotes and commas;
#     a table without a primary key is a reject and the others go on; the
#     view shows backfilling and the rows done;
#   - kill -9 of the worker mid-backfill (the server's crash restart): it
#     goes on after the last chunk committed, every row published once by
#     the backfill, and every row of the table is in the backfill or in a
#     later change.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use Digest::MD5 qw(md5_hex);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my ($app, $conn) = source_cluster('app', q{
	CREATE TABLE public.items (id int PRIMARY KEY, name text, qty int);
	INSERT INTO public.items SELECT g, 'item ' || g, g FROM generate_series(1, 2500) g;
	CREATE TABLE public.pairs (a text, b int, v jsonb, PRIMARY KEY (a, b));
	INSERT INTO public.pairs SELECT CASE WHEN g = 1 THEN 'o''neil, jr' ELSE 'p' || g END, g % 3, jsonb_build_object('g', g)
	  FROM generate_series(1, 30) g;
	CREATE TABLE public.nokey (x int);
	INSERT INTO public.nokey VALUES (1), (2);
	CREATE PUBLICATION app_pub FOR TABLE public.items, public.pairs, public.nokey;
});
my $sysid = $app->safe_psql('postgres', 'SELECT system_identifier FROM pg_control_system()');

my $node = new_node('backfill', restart_after_crash => 'on');
my $r = start_receiver();
sub sql { return $node->safe_psql('postgres', shift) }
sql(q{CREATE ROLE ops LOGIN; GRANT eventgrid_admin TO ops;});
sub ops { return $node->safe_psql('postgres', 'SET ROLE ops; ' . shift) }
for my $t ('items', 'pairs', 'items2')
{
	sql("SELECT eventgrid.create_topic('$t')");
	# items: one ordering key (data.schema), so that the order of publishing is the order of arrival
	sql("SELECT eventgrid.create_event_subscription('$t', 'hook', '$r->{url}/status/200/$t', max_events_per_batch => 500"
		  . ($t eq 'items' ? ", ordering_key => 'data.schema'" : '') . ')');
}

# the id the README gives a backfilled row: a UUID of the MD5 of source/slot/table and each key value with its length
sub derived_id
{
	my $h = md5_hex(shift);
	return sprintf('%s-%s-3%s-%s%s-%s', substr($h, 0, 8), substr($h, 8, 4), substr($h, 13, 3),
		substr('89ab', hex(substr($h, 16, 1)) & 3, 1), substr($h, 17, 3), substr($h, 20, 12));
}

like(sql_error($node, "SELECT eventgrid.create_wal_source('app', '$conn', 'app_pub', backfill => NULL)", 'ops'),
	qr/22004/, 'backfill NULL: 22004');

# --- a backfill held after its first chunk while the source changes rows
sql("ALTER SYSTEM SET eventgrid.debug_pause_points = 'wal-backfill-chunk'; SELECT pg_reload_conf()");
my $hold = $node->background_psql('postgres');
$hold->query_safe("SELECT pg_advisory_lock(1162301520, hashtext('wal-backfill-chunk'))");
ops("BEGIN; SELECT eventgrid.create_wal_source('app', '$conn', 'app_pub', backfill => true);"
	  . " SELECT eventgrid.publish_table_changes('public.items', 'items', source => 'app');"
	  . " SELECT eventgrid.publish_table_changes('public.pairs', 'pairs', source => 'app');"
	  . " SELECT eventgrid.publish_table_changes('public.nokey', 'items', source => 'app');"
	  . " COMMIT;");
# the role may not read the tables yet: the source fails, saying what to grant, before its slot is made
ok(wait_for_sql($node, "SET ROLE ops; SELECT state || ' ' || (last_error LIKE '%GRANT SELECT ON public.items TO%') FROM eventgrid.wal_sources",
		'failing true', 60), 'a role that may not read a table to backfill: failing, with the GRANT to run');
is($app->safe_psql('postgres', "SELECT count(*) FROM pg_replication_slots"), 0, 'and no slot made yet');
$app->safe_psql('postgres', 'GRANT SELECT ON public.items, public.pairs, public.nokey TO app_repl');
ok(wait_for_sql($node, "SET ROLE ops; SELECT state || ' ' || backfilled_rows FROM eventgrid.wal_sources WHERE name = 'app'",
		'backfilling 1000', 60), 'granted: the view shows the source backfilling, its first chunk of 1,000 rows done');
$app->safe_psql('postgres', q{
	UPDATE public.items SET qty = -1 WHERE id IN (5, 1500);
	DELETE FROM public.items WHERE id = 1600;
	INSERT INTO public.items VALUES (3000, 'late', 3000);
});
$hold->query_safe("SELECT pg_advisory_unlock(1162301520, hashtext('wal-backfill-chunk'))");

my @items = wait_for_events($r, '/status/200/items', 2504, 120);
is(scalar(@items), 2504, '2,500 rows backfilled and 4 changes on topic items');
my @types = map { $_->{eventType} } @items;
is(scalar(grep { $_ eq 'public.items.Backfilled' } @types[0 .. 2499]), 2500, 'the backfill first');
is(join(',', @types[2500 .. 2503]), 'public.items.Updated,public.items.Updated,public.items.Deleted,public.items.Inserted',
	'then the changes made meanwhile, from the stream');
is(join(',', map { $_->{data}{new}{id} } @items[0 .. 4]), '1,2,3,4,5', 'the rows in key order');
my %backfilled = map { ($_->{data}{new}{id} => $_) } @items[0 .. 2499];
is($backfilled{1500}{data}{new}{qty}, 1500, 'a row changed after the slot\'s snapshot is backfilled as it was then');
ok($backfilled{1600}, 'a row deleted after it is backfilled');
ok(!$backfilled{3000}, 'a row inserted after it is not (its INSERT is in the stream)');
is_deeply($backfilled{5}{data}, { operation => 'BACKFILL', schema => 'public', table => 'items', old => undef,
		new => { id => 5, name => 'item 5', qty => 5 } }, 'data: operation BACKFILL, the row typed in data.new');
is($backfilled{5}{subject}, '/public/items/5', 'the subject of table changes');
is($backfilled{5}{id}, derived_id("$sysid/eventgrid_app/public.items/1:5"),
	'the id derived from the source, the slot, the table and the key');
like($backfilled{5}{eventTime}, qr/^\d{4}-\d\d-\d\dT/, 'eventTime: the snapshot\'s time');
my @pairs = wait_for_events($r, '/status/200/pairs', 30);
is(scalar(@pairs), 30, 'a table with a composite key: its 30 rows');
my %pair_ids = map { ($_->{id} => 1) } @pairs;
is(scalar(keys %pair_ids), 30, 'each with an id of its own');
is((grep { $_->{data}{new}{a} eq "o'neil, jr" } @pairs)[0]{data}{new}{v}{g}, 1, 'a key value with a quote and a comma');
is(ops("SELECT reason FROM eventgrid.wal_source_rejects"),
	'table public.nokey has no primary key: it is not backfilled (its changes are published)',
	'a table without a primary key: a reject, and the others went on');
is(ops("SELECT state || ' ' || backfilled_rows || ' ' || events_published FROM eventgrid.wal_sources WHERE name = 'app'"),
	'streaming 2530 2534', 'streaming: 2,530 rows backfilled, 2,534 events published');

# --- kill -9 of the worker mid-backfill
$hold->query_safe("SELECT pg_advisory_lock(1162301520, hashtext('wal-backfill-chunk'))");
ops("BEGIN; SELECT eventgrid.create_wal_source('app2', '$conn', 'app_pub', backfill => true);"
	  . " SELECT eventgrid.publish_table_changes('public.items', 'items2', source => 'app2');"
	  . " COMMIT;");
ok(wait_for_sql($node, "SET ROLE ops; SELECT state || ' ' || backfilled_rows FROM eventgrid.wal_sources WHERE name = 'app2'",
		'backfilling 1000', 60), 'a second source held after its first chunk');
$app->safe_psql('postgres', q{
	DELETE FROM public.items WHERE id = 1700;
	UPDATE public.items SET qty = -2 WHERE id = 1800;
	INSERT INTO public.items VALUES (3001, 'later', 3001);
});
my $pid = sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid WAL source' AND query LIKE '%backfilling%'");
ok($pid, "its worker (pid $pid)");
kill 'KILL', $pid;
eval { $hold->quit };    # the crash restart ends the session holding the pause
my $after = $app->safe_psql('postgres', 'SELECT count(*) FROM public.items WHERE id > 1000');
ok(wait_for_sql($node, "SET ROLE ops; SELECT state || ' ' || backfilled_rows FROM eventgrid.wal_sources WHERE name = 'app2'",
		'streaming ' . (1000 + $after), 120),
	'after the crash it went on after the last chunk committed: ' . (1000 + $after) . ' rows backfilled, none twice')
  or diag(ops("SELECT * FROM eventgrid.wal_sources"));
my $expected = 1000 + $after + 3;
my @items2;
my %by_id;
for (1 .. scaled(120) * 10)
{
	@items2 = received_events($r, '/status/200/items2');
	%by_id = map { ($_->{id} => $_) } @items2;    # a crash may deliver a batch again: the ids count
	last if keys(%by_id) >= $expected;
	select(undef, undef, undef, 0.1);
}
is(scalar(keys %by_id), $expected, "every row backfilled once and the 3 changes: $expected events");
my %seen;
for my $e (values %by_id)
{
	my $row = $e->{data}{new} // $e->{data}{old};
	push @{ $seen{ $row->{id} } }, $e->{data}{operation};
}
my @missing = grep { !$seen{$_} } split /\n/, $app->safe_psql('postgres', 'SELECT id FROM public.items ORDER BY id');
is(scalar(@missing), 0, 'every row of the table is in the backfill or a later change') or diag("missing: @missing[0 .. 9]");
is(join(',', sort @{ $seen{1700} // [] }), 'DELETE', 'a row deleted mid-backfill, after its chunk: its DELETE alone');
is(join(',', sort @{ $seen{1800} // [] }), 'BACKFILL,UPDATE', 'a row changed before the restart\'s snapshot: in both');
is($app->safe_psql('postgres', "SELECT count(*) FROM pg_replication_slots WHERE slot_name IN ('eventgrid_app', 'eventgrid_app2')"),
	2, 'both slots on the source');

unlike(slurp_file($node->logfile), qr/terminated by signal (11|6)/, 'no worker crashed (a kill -9 aside)');
done_testing();
