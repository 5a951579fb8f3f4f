# Operating the workers (issue "Trust", items 12, 13 and 15; issue "Every
# database"):
# 15. a configuration from before 0.9.0 that sets eventgrid.database_name
#     still loads, and the launcher says once that the setting is not used;
#     a database created after the server started, with the extension
#     created in it, is served without a restart; beyond
#     eventgrid.max_databases, a database is not served, logged once;
# 13. a schema of another version than the library: one clear LOG line,
#     the workers leave instead of crashing, and delivery resumes after
#     ALTER EXTENSION eventgrid UPDATE;
# 12. COMMIT PREPARED of a publishing transaction wakes the worker; a reload
#     of eventgrid.max_concurrent_requests reaches libcurl's connection
#     cache; a busy worker notices the postmaster's death.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = PostgreSQL::Test::Cluster->new('operations');
$node->init;
$node->append_conf('postgresql.conf', join('', map { "$_\n" }
	"shared_preload_libraries = 'eventgrid'",
	"eventgrid.database_name = 'later'",
	"eventgrid.retry_jitter_percent = 0",
	"eventgrid.response_timeout = '30s'",
	"eventgrid.max_concurrent_requests = 2",
	"eventgrid.worker_idle_timeout = '1h'",
	"eventgrid.max_databases = 2",
	"max_prepared_transactions = 5"));
$node->start;
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('later', shift) }
sub count_log { my $re = shift; my @m = slurp_file($node->logfile) =~ /$re/g; return scalar @m }
sub worker_pid { return sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker' AND datname = 'later'") }

# --- 15. the old setting, and a database created later
ok(wait_for_sql($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'eventgrid launcher'", '1', 30, 'postgres'),
	'old setting: the launcher runs');
sleep 1;
is(count_log(qr/eventgrid\.database_name \("later"\) is no longer used; every database where the extension is created is served/), 1,
	'old setting: logged once that eventgrid.database_name is no longer used');
is(count_log(qr/FATAL/), 0, 'no FATAL, no restart loop');
$node->safe_psql('postgres', 'CREATE DATABASE later');
sql('CREATE EXTENSION eventgrid');
sql("SELECT eventgrid.create_topic('ops')");
sql("SELECT eventgrid.create_event_subscription('ops', 'fast', '$u/status/200/fast')");
sql("SELECT eventgrid.publish('ops', '" . eg_event('first') . "')");
is(scalar(wait_for_requests($r, '/status/200/fast', 1, 30)), 1, 'a database created after start is served once the extension is created');

# --- 13. library and schema of different versions
# what a library older or newer than the schema looks like to the workers
sql("UPDATE pg_extension SET extversion = '0.0.9' WHERE extname = 'eventgrid'");
sql("SELECT eventgrid.publish('ops', '" . eg_event('skew-1') . "')");
ok(wait_for_sql($node, "SELECT count(*) FROM pg_stat_activity WHERE datname = 'later' AND backend_type LIKE 'eventgrid % worker'",
	'0', 30, 'later'), 'version skew: the workers leave');
sql("SELECT eventgrid.publish('ops', '" . eg_event('skew-2') . "')");
sleep 2;
is(scalar(requests($r, '/status/200/fast')), 1, 'version skew: nothing is delivered');
is(count_log(qr/the extension in database "later" is version 0\.0\.9 but the loaded library is version \S+; nothing is delivered there/), 1,
	'version skew: one clear LOG line');
is(count_log(qr/FATAL/), 0, 'version skew: no worker crashed');
is(sql("SELECT state FROM eventgrid.served_databases WHERE database = 'later'"), 'other version',
	'version skew: served_databases says so');
sql("UPDATE pg_extension SET extversion = (SELECT default_version FROM pg_available_extensions WHERE name = 'eventgrid') WHERE extname = 'eventgrid'");
sql("ALTER EXTENSION eventgrid UPDATE");
is(scalar(wait_for_requests($r, '/status/200/fast', 3, 30)), 3, 'version skew: delivery resumes after ALTER EXTENSION ... UPDATE');
like(slurp_file($node->logfile), qr/is ready in database "later"; delivery resumes/, 'version skew: the resumption is logged');

# --- 12a. COMMIT PREPARED wakes the worker (its idle sleep is a minute)
sleep 2;
$node->safe_psql('later', "BEGIN; SELECT eventgrid.publish('ops', '" . eg_event('prepared') . "'); PREPARE TRANSACTION 'p1'");
sleep 1;
is(scalar(requests($r, '/status/200/fast')), 3, 'prepared: nothing delivered before COMMIT PREPARED');
$node->safe_psql('later', "COMMIT PREPARED 'p1'");
is(scalar(wait_for_requests($r, '/status/200/fast', 4, 10)), 4, 'prepared: COMMIT PREPARED wakes the worker');

# --- 12b. a reload of max_concurrent_requests (and of the per-host limit) reaches libcurl's connection cache
sql("ALTER SYSTEM SET eventgrid.max_concurrent_requests = 40; ALTER SYSTEM SET eventgrid.max_requests_per_endpoint = 40; SELECT pg_reload_conf()");
sleep 1;
sql("SELECT eventgrid.create_event_subscription('ops', 'wide', '$u/status/200/wide?delay_ms=500')");
sub wave
{
	my ($tag, $n) = @_;
	sql("INSERT INTO eventgrid.events (topic, event) SELECT 'ops', jsonb_build_object('id', '$tag-' || i, 'subject', '/s',"
		  . " 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z') FROM generate_series(1, 40) i");
	wait_for_requests($r, '/status/200/wide', $n, 60);
	ok(wait_for_sql($node, "SELECT coalesce(sum(pending), 0) FROM eventgrid.delivery_statistics", '0', 60, 'later'), "connections: wave $tag delivered");
}
wave('w1', 40);
wave('w2', 80);
my @wide = requests($r, '/status/200/wide');
my %first = map { $_->{peer_port} => 1 } grep { $json->decode($_->{body})->[0]{id} =~ /^w1-/ } @wide;
my %second = map { $_->{peer_port} => 1 } grep { $json->decode($_->{body})->[0]{id} =~ /^w2-/ } @wide;
my $reused = scalar(grep { $first{$_} } keys %second);
note("connections of the first wave reused by the second: $reused of " . scalar(keys %second));
cmp_ok($reused, '>', 16, 'connections: the connection cache grew with max_concurrent_requests (more than the 8 it started with)');

# --- 15b. eventgrid.max_databases (2: postgres and later) taken: a third database is not served, said once
$node->safe_psql('postgres', 'CREATE DATABASE beyond');
$node->safe_psql('beyond', "CREATE EXTENSION eventgrid; SELECT eventgrid.create_topic('ops');"
	  . " SELECT eventgrid.create_event_subscription('ops', 'beyond', '$u/status/200/beyond')");
$node->safe_psql('beyond', "SELECT eventgrid.publish('ops', '" . eg_event('beyond-1') . "')");
my $beyond_logged = 0;
for (1 .. 100)
{
	last if ($beyond_logged = count_log(qr/LOG:  eventgrid: all 2 database slots are taken; database "beyond" is not served/));
	usleep(100_000);
}
is($beyond_logged, 1, 'max_databases: a database beyond the slots is logged, by name');
like(slurp_file($node->logfile), qr/database "beyond" is not served\n.*DETAIL:  Every database that allows connections takes a slot[^\n]*\n.*HINT:  Raise eventgrid\.max_databases/,
	'max_databases: with a DETAIL and a HINT');
$node->safe_psql('beyond', "SELECT eventgrid.publish('ops', '" . eg_event('beyond-2') . "')");
sleep 3;
is(count_log(qr/LOG:  eventgrid: all \d+ database slots are taken/), 1, 'max_databases: logged once');
is(scalar(requests($r, '/status/200/beyond')), 0, 'max_databases: nothing is delivered from it');
is(sql("SELECT count(*) FROM eventgrid.served_databases WHERE database = 'beyond'"), '0',
	'max_databases: served_databases does not list it');

# --- 12c. a busy worker notices the postmaster's death
sql("SELECT eventgrid.create_event_subscription('ops', 'hang', '$u/status/200/hang?delay_ms=25000')");
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'ops', jsonb_build_object('id', 'h-' || i, 'subject', '/s',"
	  . " 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z') FROM generate_series(1, 60) i");
wait_for_requests($r, '/status/200/hang', 40, 30);
my $pid = worker_pid();
$node->kill9;
my $gone = 0;
for (1 .. 100)
{
	if (!kill(0, $pid)) { $gone = 1; last; }
	usleep(100_000);
}
ok($gone, 'postmaster death: the busy worker exits within 10 s, without waiting for its requests (25 s)');

done_testing();
