# WAL sources (SPEC 16; issue "Events from any PostgreSQL"): an
# application's server with nothing of eventgrid installed publishes by
# pg_logical_emit_message() and by ordinary writes to its tables, and this
# server's WAL source worker reads them from its write-ahead log.
#   - the source is a plain cluster (wal_level = logical), reached over TCP
#     with password authentication (scram-sha-256) as a role with
#     REPLICATION and nothing else, as a managed service has it; the WAL
#     source is created by an eventgrid_admin that is not a superuser (its
#     connection must carry a password; the view masks it);
#   - row changes of a mapped table become table change events (subject,
#     type, data.new, data.old: the key columns without REPLICA IDENTITY
#     FULL, the whole row with it), with ids derived from the source's
#     commit, its commit time as eventTime; a transactional message with
#     the prefix becomes its events, keeping their ids; what cannot be
#     published (unknown topic, not JSON, not transactional) is a reject,
#     and the rest of its transaction is published; other prefixes are not
#     ours;
#   - exactly once, in commit order, through a kill -9 of the WAL source
#     worker (the delivery server's crash restart), a restart of the source
#     and a pause: every change counted once (events_published and at the
#     receiver), each key's events in order;
#   - dropping the source drops its slot on the source.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP qw(decode_json);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use File::Spec;
use HTTP::Tiny;
use IPC::Run;

# --- the application's server: no eventgrid, logical WAL, password over TCP
my ($app, $conn) = source_cluster('app', q{
	CREATE TABLE public.orders (id int PRIMARY KEY, region text, note text);
	CREATE TABLE public.audit (id int PRIMARY KEY, what text);
	CREATE TABLE public.txlog (t int);
	ALTER TABLE public.audit REPLICA IDENTITY FULL;
	CREATE PUBLICATION app_pub FOR TABLE public.orders, public.audit;
});
my $port = $app->port;

# --- the delivery server
my $node = new_node('walsrc', restart_after_crash => 'on');
my $r = start_receiver();
sub sql { return $node->safe_psql('postgres', shift) }
sql(q{CREATE ROLE ops LOGIN; GRANT eventgrid_admin TO ops;});
# a database default search_path with a schema of someone's first: the worker's statements
# (status updates call now()) must still run only the built-in functions
sql(q{CREATE SCHEMA evil; CREATE FUNCTION evil.now() RETURNS timestamptz LANGUAGE plpgsql
	AS $$ BEGIN RAISE EXCEPTION 'evil.now() ran'; END $$; GRANT USAGE ON SCHEMA evil TO PUBLIC;
	ALTER DATABASE postgres SET search_path = evil, pg_catalog, public;});
sub ops { return $node->safe_psql('postgres', 'SET ROLE ops; ' . shift) }
sql("SELECT eventgrid.create_topic('orders')");
sql("SELECT eventgrid.create_topic('audit')");
# one ordering key for every event (data.schema): delivered one at a time, in publish order
sql("SELECT eventgrid.create_event_subscription('orders', 'hook', '$r->{url}/status/200/orders', ordering_key => 'data.schema')");
sql("SELECT eventgrid.create_event_subscription('audit', 'hook', '$r->{url}/status/200/audit', ordering_key => 'subject')");

like(sql_error($node, "SELECT eventgrid.create_wal_source('app', 'host=127.0.0.1 port=$port dbname=postgres user=app_repl', 'app_pub')", 'ops'),
	qr/28000.*must connect with a password/s, 'a WAL source of a role that is not a superuser without a password: 28000');
like(sql_error($node, "SELECT eventgrid.create_wal_source('a', '$conn', 'app_pub')", 'ops'),
	qr/42602.*invalid WAL source name/s, 'a name of 1 character: 42602');
like(sql_error($node, "SELECT eventgrid.create_wal_source('app', 'not a connection string', 'app_pub')", 'ops'),
	qr/22023|invalid connection string/s, 'a connection string that does not parse: 22023');
ops("BEGIN; SELECT eventgrid.create_wal_source('app', '$conn', 'app_pub');"
	  . " SELECT eventgrid.publish_table_changes('public.orders', 'orders', source => 'app');"
	  . " SELECT eventgrid.publish_table_changes('public.audit', 'audit', source => 'app', operations => ARRAY['UPDATE', 'DELETE']);"
	  . " COMMIT;");
sql("SELECT eventgrid.create_domain('tenants')");
like(sql_error($node, "SELECT eventgrid.publish_table_changes('public.orders', 'tenants', source => 'app')", 'ops'),
	qr/42809.*event domain/s, 'an event domain: 42809');
like(sql_error($node, "SELECT eventgrid.publish_table_changes('orders', 'orders', source => 'app')", 'ops'),
	qr/22023.*schema\.table/s, 'a table name without its schema: 22023');
like(sql_error($node, "SELECT eventgrid.publish_table_changes('public.orders', 'orders', source => 'nope')", 'ops'),
	qr/42704.*WAL source "nope" does not exist/s, 'an unknown source: 42704');
ok(wait_for_sql($node, "SET ROLE ops; SELECT state FROM eventgrid.wal_sources WHERE name = 'app'", 'streaming', 60),
	'the WAL source streams');
like(ops("SELECT connection FROM eventgrid.wal_sources"), qr/password=\*{8}/, 'the view masks the password');
unlike(ops("SELECT connection FROM eventgrid.wal_sources"), qr/repl-secret/, 'and never shows it');
is($app->safe_psql('postgres', "SELECT plugin FROM pg_replication_slots WHERE slot_name = 'eventgrid_app'"), 'pgoutput',
	'its slot eventgrid_app was made on the source');
like(sql_error($node, "SELECT * FROM eventgrid.wal_source_definitions", 'ops'), qr/permission denied/,
	'the stored connection string is not readable by an admin');

# --- table changes and messages
my $event = sub { my ($id, $subject) = @_; return qq({"id": "$id", "subject": "$subject", "eventType": "App.Note", "eventTime": "2024-05-01T12:00:00Z", "data": {"schema": "public", "n": 1}}) };
$app->safe_psql('postgres', "BEGIN;"
	  . " INSERT INTO public.orders VALUES (1, 'eu', 'first'), (2, 'us', 'second'), (3, 'eu', 'third');"
	  . " SELECT pg_logical_emit_message(true, 'eventgrid', '{\"topic\": \"orders\", \"events\": [" . $event->('m-1', '/notes/1') . "]}');"
	  . " SELECT pg_logical_emit_message(true, 'eventgrid', '{\"topic\": \"nowhere\", \"events\": [" . $event->('m-x', '/x') . "]}');"
	  . " SELECT pg_logical_emit_message(true, 'eventgrid', 'not json');"
	  . " SELECT pg_logical_emit_message(true, 'other', '{\"topic\": \"orders\", \"event\": " . $event->('m-other', '/o') . "}');"
	  . " COMMIT;");
$app->safe_psql('postgres', "SELECT pg_logical_emit_message(false, 'eventgrid', '{\"topic\": \"orders\", \"event\": " . $event->('m-nt', '/nt') . "}')");
$app->safe_psql('postgres', "UPDATE public.orders SET note = 'changed' WHERE id = 2");
$app->safe_psql('postgres', "DELETE FROM public.orders WHERE id = 3");
$app->safe_psql('postgres', "SELECT pg_logical_emit_message(true, 'eventgrid', '{\"topic\": \"orders\", \"event\": " . $event->('m-2', '/notes/2') . "}')");
$app->safe_psql('postgres', "INSERT INTO public.audit VALUES (1, 'a'); UPDATE public.audit SET what = 'b' WHERE id = 1; DELETE FROM public.audit WHERE id = 1");

my @got = map { my $b = decode_json($_->{body}); @$b } wait_for_requests($r, '/status/200/orders', 7);
is(scalar(@got), 7, 'seven events on orders: three inserts, a message, an update, a delete, a message');
is(join(',', map { $_->{eventType} } @got),
	'public.orders.Inserted,public.orders.Inserted,public.orders.Inserted,App.Note,public.orders.Updated,public.orders.Deleted,App.Note',
	'in commit order, the first transaction\'s in its own order');
is(join(',', map { $_->{subject} } @got), '/public/orders/1,/public/orders/2,/public/orders/3,/notes/1,/public/orders/2,/public/orders/3,/notes/2',
	'subjects: the key values, as in-database table changes');
is_deeply($got[0]{data}, { operation => 'INSERT', schema => 'public', table => 'orders', old => undef,
		new => { id => 1, region => 'eu', note => 'first' } }, 'an insert carries the new row, typed (id a number)');
is_deeply($got[4]{data}{old}, { id => 2 }, 'an update without REPLICA IDENTITY FULL: data.old is the key');
is($got[4]{data}{new}{note}, 'changed', 'and data.new the new row');
is_deeply($got[5]{data}{old}, { id => 3 }, 'a delete: data.old is the key');
is($got[3]{id}, 'm-1', 'a message\'s event keeps its id');
like($got[0]{id}, qr/^[0-9a-f]{8}-[0-9a-f]{4}-3[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/, 'a change\'s id is a UUID');
isnt($got[0]{id}, $got[1]{id}, 'one per change');
is(scalar(grep { $_->{id} eq 'm-other' || $_->{id} eq 'm-nt' } @got), 0,
	'another prefix is not ours; a message that is not transactional is not published');
is(ops("SELECT string_agg(reason, ' | ' ORDER BY id) FROM eventgrid.wal_source_rejects"),
	join(' | ', 'topic "nowhere" does not exist', 'invalid input syntax for type json',
		'the message is not transactional: pg_logical_emit_message(true, ...) publishes with its transaction'),
	'the rejects: the unknown topic, the text that is not JSON, the message outside a transaction')
  or diag(ops("SELECT reason FROM eventgrid.wal_source_rejects"));
my @audit = map { my $b = decode_json($_->{body}); @$b } wait_for_requests($r, '/status/200/audit', 2);
is(join(',', map { $_->{eventType} } @audit), 'public.audit.Updated,public.audit.Deleted', 'operations: only those mapped');
is_deeply($audit[0]{data}{old}, { id => 1, what => 'a' }, 'REPLICA IDENTITY FULL: data.old is the whole row');
is(ops("SELECT events_published || ' ' || rejects FROM eventgrid.wal_sources"), '9 3', 'counted once each: 9 events, 3 rejects');
is($audit[0]{subject}, '/public/audit', 'a table whose every column is its identity: the subject names the table');
my $commit_time = $app->safe_psql('postgres', "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD')");
like($got[0]{eventTime}, qr/^$commit_time/, 'eventTime is the source commit\'s time');

# --- exactly once, in commit order, through faults
my $n_before = ops("SELECT events_published FROM eventgrid.wal_sources");
my $bg = $app->background_psql('postgres');
# transactions of 10 changes each (public.txlog, not published, counts those committed)
my $writer = q{DO $$ BEGIN
	FOR t IN 1 .. 200 LOOP
		IF t = 1 THEN
			INSERT INTO public.orders SELECT 100 + k, 'eu', 'v0' FROM generate_series(1, 10) k;
		ELSE
			UPDATE public.orders SET note = 'v' || t WHERE id BETWEEN 101 AND 110;
		END IF;
		INSERT INTO public.txlog VALUES (t);
		COMMIT;
		PERFORM pg_sleep(0.01);
	END LOOP; END $$;};
$bg->query_until(qr/started/, "\\echo started\n$writer\n");
sleep 1;
my $pid = sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid WAL source'");
ok($pid, "the WAL source worker runs (pid $pid)");
kill 'KILL', $pid;
sleep 1;
$app->restart;    # the source restarts mid-stream too (its writer with it)
eval { $bg->quit };
my $first = $app->safe_psql('postgres', 'SELECT count(*) FROM public.txlog');
cmp_ok($first, '>', 0, "$first transactions committed before the source restarted");
$bg = $app->background_psql('postgres');
$bg->query_safe($writer =~ s/FOR t IN 1 \.\. 200/FOR t IN 201 .. 300/r);
$bg->quit;
my $changes = 10 * $app->safe_psql('postgres', 'SELECT count(*) FROM public.txlog');
ok(wait_for_sql($node, "SET ROLE ops; SELECT events_published - $n_before FROM eventgrid.wal_sources", $changes, 120),
	"after a kill -9 of the worker and a restart of the source: each change published once ($changes)")
  or diag(ops("SELECT * FROM eventgrid.wal_sources"));
# (a crash restart sends some deliveries again: the distinct ids count)
my @all;
my %seen;
for (1 .. scaled(120) * 10)
{
	@all = received_events($r, '/status/200/orders');
	%seen = ();
	$seen{ $_->{id} }++ for @all;
	last if keys(%seen) >= 7 + $changes;
	usleep(100_000);
}
is(scalar(keys %seen), 7 + $changes, 'every change arrived');
my $out_of_order = 0;
my %last;
my %first;
for my $e (grep { ($_->{subject} // '') =~ m{^/public/orders/1\d\d$} && !$first{ $_->{id} }++ } @all)
{
	my ($v) = ($e->{data}{new}{note} // '') =~ /^v(\d+)$/;
	next unless defined $v;
	$out_of_order++ if defined $last{ $e->{subject} } && $v < $last{ $e->{subject} };
	$last{ $e->{subject} } = $v;
}
is($out_of_order, 0, 'each row\'s changes in commit order (first arrivals: a crash may send again)');
is($last{'/public/orders/105'}, 300, 'up to the last');

# --- a cut connection and a kill -9 of this server's postmaster, mid-stream
$n_before = ops("SELECT events_published FROM eventgrid.wal_sources");
my $txns_before = $app->safe_psql('postgres', 'SELECT count(*) FROM public.txlog');
$bg = $app->background_psql('postgres');
$bg->query_until(qr/started/, "\\echo started\n" . ($writer =~ s/FOR t IN 1 \.\. 200/FOR t IN 301 .. 500/r) . "\n");
sleep 1;
is($app->safe_psql('postgres', "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_replication WHERE application_name = 'eventgrid'"),
	'1', 'the source cuts the WAL source\'s connection (its walsender terminated)');
sleep 1;
$node->kill9;    # this server's postmaster, with its workers after it
sleep 2;
$node->start;
$bg->query_safe('SELECT 1');    # the writer is done
$bg->quit;
$changes = 10 * ($app->safe_psql('postgres', 'SELECT count(*) FROM public.txlog') - $txns_before);
is($changes, 2000, 'the writer committed its 200 transactions meanwhile');
ok(wait_for_sql($node, "SET ROLE ops; SELECT events_published - $n_before FROM eventgrid.wal_sources", $changes, 120),
	"after a cut connection and a kill -9 of the postmaster: each change published once ($changes)")
  or diag(ops("SELECT * FROM eventgrid.wal_sources"));
my $distinct_before = scalar(keys %seen);
for (1 .. scaled(120) * 10)
{
	%seen = ();
	$seen{ $_->{id} }++ for received_events($r, '/status/200/orders');
	last if keys(%seen) >= $distinct_before + $changes;
	usleep(100_000);
}
is(scalar(keys %seen), $distinct_before + $changes, 'every change arrived');
my %v500 = map { ($_->{subject} => 1) } grep { ($_->{data}{new}{note} // '') eq 'v500' } received_events($r, '/status/200/orders');
is(scalar(keys %v500), 10, 'each row\'s last change among them');

# --- pause and resume
ops("SELECT eventgrid.pause_wal_source('app')");
is(ops("SELECT state FROM eventgrid.wal_sources"), 'paused', 'paused');
ok(wait_for_sql($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'eventgrid WAL source'", '0', 30),
	'its worker is gone');
my $published = ops("SELECT events_published FROM eventgrid.wal_sources");
$app->safe_psql('postgres', "INSERT INTO public.orders VALUES (500, 'eu', 'while paused')");
sleep 1;
is(ops("SELECT events_published FROM eventgrid.wal_sources"), $published, 'nothing read while paused');
ops("SELECT eventgrid.resume_wal_source('app')");
my $arrived = 0;
for (1 .. scaled(60) * 10)
{
	last if $arrived = grep { ($_->{body} // '') =~ /"while paused"/ } requests($r, '/status/200/orders');
	usleep(100_000);
}
ok($arrived, 'resumed: what was written meanwhile is published');

# --- a column added on the source mid-stream appears in the events after it
$app->safe_psql('postgres', "BEGIN; SELECT pg_logical_emit_message(true, 'eventgrid', '{\"topic\": \"orders\", \"event\": "
	  . $event->('m-rolled-back', '/rb') . "}'); ROLLBACK;");
$app->safe_psql('postgres', "ALTER TABLE public.orders ADD COLUMN qty int; INSERT INTO public.orders VALUES (600, 'us', 'added', 7)");
my $added;
for (1 .. scaled(60) * 10)
{
	($added) = grep { $_->{data}{new} && ($_->{data}{new}{id} // 0) == 600 }
	  received_events($r, '/status/200/orders');
	last if $added;
	usleep(100_000);
}
is_deeply($added ? $added->{data}{new} : undef, { id => 600, region => 'us', note => 'added', qty => 7 },
	'a column added on the source appears in the next events, and nothing stopped');
is(scalar(grep { ($_->{body} // '') =~ /m-rolled-back/ } requests($r, '/status/200/orders')), 0,
	'a message of a transaction that rolled back is not published (it would have come first: one ordering key)');

# --- what Debian's prometheus-postgres-exporter shows with monitoring/'s queries, as a pg_monitor role
# (the source wrote WAL with nothing to publish after the last published commit: the rolled-back
# message; the view's position goes past it once the worker has read it, within a status write)
ok(wait_for_sql($node, "SET ROLE ops; SELECT lag_bytes || ' ' || lag_seconds FROM eventgrid.wal_sources", '0 0', 30),
	'caught up: no lag in bytes or seconds, though the source wrote WAL with nothing to publish since')
  or diag(ops("SELECT * FROM eventgrid.wal_sources"));
sql('CREATE ROLE exporter LOGIN IN ROLE pg_monitor');
my $monitoring = File::Spec->rel2abs("$FindBin::RealBin/../../monitoring");
my $mport = PostgreSQL::Test::Cluster::get_free_port();
my $exporter = IPC::Run::start(
	[ 'env', sprintf('DATA_SOURCE_NAME=host=%s port=%d user=exporter dbname=postgres sslmode=disable', $node->host, $node->port),
		'prometheus-postgres-exporter', "--web.listen-address=127.0.0.1:$mport",
		"--extend.query-path=$monitoring/postgres_exporter.yml", '--auto-discover-databases', '--include-databases=postgres' ],
	'>', \my $eout, '2>', \my $eerr);
my $scraped = '';
for (1 .. 100)
{
	my $res = HTTP::Tiny->new(timeout => 5)->get("http://127.0.0.1:$mport/metrics");
	if ($res->{success} && $res->{content} =~ /^eventgrid_wal_source/m)
	{
		$scraped = $res->{content};
		last;
	}
	usleep(200_000);
}
$exporter->kill_kill;
like($scraped, qr/^eventgrid_wal_source_streaming\{[^}]*wal_source="app"[^}]*\} 1$/m, 'the exporter shows the WAL source streaming');
my ($scraped_n) = $scraped =~ /^eventgrid_wal_source_events_published_total\{[^}]*wal_source="app"[^}]*\} (\S+)$/m;
is($scraped_n, ops("SELECT events_published FROM eventgrid.wal_sources"), 'and the events it published');
like($scraped, qr/^eventgrid_wal_source_rejects_total\{[^}]*wal_source="app"[^}]*\} 3$/m, 'and its rejects');
unlike($scraped, qr/repl-secret/, 'and never the password');

# --- an admin's source on a server that does not ask for the password (the application's,
# trusting its local connections, as its superuser): the worker refuses it, and
# drop_wal_source() does not drop a slot through it
my $superuser = sql('SELECT current_user');
ops("SELECT eventgrid.create_wal_source('trusting', 'host=" . $app->host . " port=" . $app->port
	  . " dbname=postgres user=$superuser password=not-asked', 'app_pub')");
ok(wait_for_sql($node, "SET ROLE ops; SELECT state || ': ' || (last_error LIKE '%did not ask for the password%')"
		  . " FROM eventgrid.wal_sources WHERE name = 'trusting'", 'failing: true', 60),
	'a source that does not ask for the password: failing, and says why');
is($app->safe_psql('postgres', "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'eventgrid_trusting'"), '0',
	'no slot was made through it');
like(sql_error($node, "SELECT eventgrid.drop_wal_source('trusting')", 'ops'), qr/28000.*did not ask for the password/s,
	'dropping it with its slot: 28000, nothing is dropped through that connection');
ops("SELECT eventgrid.drop_wal_source('trusting', drop_slot => false)");
is(ops("SELECT string_agg(name, ',') FROM eventgrid.wal_sources"), 'app', 'drop_slot => false drops it here alone');

# --- a slot gone from the source after the source was read from it: failing, never a new slot
# (which would start at its own creation: the changes meanwhile would be lost)
ops("SELECT eventgrid.create_wal_source('lost', '$conn', 'app_pub', message_prefix => 'lost')");
ok(wait_for_sql($node, "SET ROLE ops; SELECT state FROM eventgrid.wal_sources WHERE name = 'lost'", 'streaming', 60),
	'a second source streams');
$app->safe_psql('postgres', "SELECT pg_logical_emit_message(true, 'lost', '{\"topic\": \"audit\", \"event\": "
	  . $event->('m-lost', '/lost') . "}')");
ok(wait_for_sql($node, "SET ROLE ops; SELECT events_published FROM eventgrid.wal_sources WHERE name = 'lost'", '1', 60),
	'and published its message');
ops("SELECT eventgrid.pause_wal_source('lost')");
ok(wait_for_sql($app, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'eventgrid_lost' AND NOT active", '1', 30),
	'paused: its slot is let go');
$app->safe_psql('postgres', "SELECT pg_drop_replication_slot('eventgrid_lost')");
ops("SELECT eventgrid.resume_wal_source('lost')");
ok(wait_for_sql($node, "SET ROLE ops; SELECT state || ': ' || (last_error LIKE '%slot \"eventgrid_lost\" is gone from the source%')"
		  . " FROM eventgrid.wal_sources WHERE name = 'lost'", 'failing: true', 60),
	'its slot dropped on the source: failing, and says why');
is($app->safe_psql('postgres', "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'eventgrid_lost'"), '0',
	'no new slot was made');
ops("SELECT eventgrid.drop_wal_source('lost')");

# --- drop: the slot goes on the source
ops("SELECT eventgrid.drop_wal_source('app')");
is($app->safe_psql('postgres', "SELECT count(*) FROM pg_replication_slots"), '0', 'dropped: its slot is gone from the source');
is(ops("SELECT count(*) FROM eventgrid.wal_sources"), '0', 'and the source from the view');

# (a client's line names its application before ERROR; a worker's does not)
unlike(slurp_file($node->logfile), qr/^\S+ \S+ UTC \[\d+\] ERROR:  evil\.now\(\) ran/m,
	'the worker never ran a function of the database\'s search_path');

$node->stop;
$app->stop;
unlike(slurp_file($node->logfile), qr/terminated by signal (11|6)/, 'no worker crashed (a kill -9 aside)');
done_testing();
