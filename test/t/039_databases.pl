# Every database in the cluster (issue "Every database"): with the library
# preloaded and no eventgrid setting at all, CREATE EXTENSION eventgrid in
# any database serves it, with no restart:
#  - a database created after the server started, one cloned with CREATE
#    DATABASE ... TEMPLATE from one that has the extension, one renamed
#    while it delivers (served under its new name), each delivering to a
#    real receiver;
#  - DROP DATABASE (without FORCE), ALTER DATABASE ... SET TABLESPACE and
#    CREATE DATABASE ... TEMPLATE of a database that is delivering succeed
#    within about 5 s: its workers leave when asked;
#  - workers on demand: a database idle for eventgrid.worker_idle_timeout
#    gives its workers back, and the next commit, or a retry coming due,
#    brings them again; a database without the extension costs no worker;
#  - DROP EXTENSION in one stops only its workers; one database on an older
#    extension version idles with a HINT while the others deliver;
#  - the per-host limit holds across databases;
#  - every worker's lines in the log, its application_name, worker_status
#    and served_databases name the database (served_databases readable by
#    pg_monitor);
#  - kill -9 of one database's worker and of the launcher: nothing lost
#    anywhere, nothing sent again beyond what was in flight.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $node = PostgreSQL::Test::Cluster->new('databases');
$node->init;
$node->append_conf('postgresql.conf', join('', map { "$_\n" }
	"shared_preload_libraries = 'eventgrid'",
	"eventgrid.retry_jitter_percent = 0",
	"eventgrid.worker_idle_timeout = '4s'",
	# the upkeep worker stays while an event table holds rows: with 2 s
	# turns a published event's table is emptied within seconds, so that
	# "idle" below depends on the workers, not on where in a 10 s turn the
	# event fell
	"eventgrid.event_table_rotation = '2s'",
	"eventgrid.max_requests_per_endpoint = 3",
	"restart_after_crash = on"));
$node->start;
my $r = start_receiver();
my $u = $r->{url};
my $hanging = start_receiver();			# a host of its own: its requests hold its connections
my $json = JSON::PP->new;

sub sql { my ($db, $q) = @_; return $node->safe_psql($db, $q) }
sub count_log { my $re = shift; my @m = slurp_file($node->logfile) =~ /$re/g; return scalar @m }

# the ids that arrived at a path, each with how often
sub arrivals
{
	my %seen;
	$seen{ $json->decode($_->{body})->[0]{id} }++ for requests($r, shift);
	return \%seen;
}

# waits until event $id arrived at $path (at most $secs seconds)
sub arrived
{
	my ($path, $id, $secs) = @_;
	for (1 .. ($secs // 15) * 10)
	{
		return 1 if arrivals($path)->{$id};
		usleep(100_000);
	}
	return 0;
}

sub workers_in
{
	my ($db) = @_;
	return sql('postgres', "SELECT count(*) FROM pg_stat_activity WHERE datname = '$db'"
		  . " AND backend_type IN ('eventgrid delivery worker', 'eventgrid upkeep worker')");
}

# sets up database $db with topic t and a subscription to /status/200/$db[$suffix]
sub set_up
{
	my ($db, %o) = @_;
	sql('postgres', "CREATE DATABASE $db") unless $o{exists};
	sql($db, 'CREATE EXTENSION eventgrid') unless $o{has_extension};
	sql($db, "SELECT eventgrid.create_topic('top')");
	sql($db, "SELECT eventgrid.create_event_subscription('top', 'sub', '$u/status/200/$db" . ($o{path} // '') . "')");
}

sub publish
{
	my ($db, $prefix, $n) = @_;
	sql($db, "SELECT eventgrid.publish('top', '[" . join(',', map { eg_event("$prefix-$_") } 1 .. $n) . "]')");
}

# --- no setting at all: databases created after the start are served
ok(wait_for_sql($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'eventgrid launcher'", '1'),
	'the launcher runs');
set_up('alpha');
my $t0 = time();
publish('alpha', 'a', 1);
is(scalar(wait_for_requests($r, '/status/200/alpha', 1, 10)), 1, 'a database created after the start delivers');
cmp_ok(time() - $t0, '<', 3, 'within a few seconds of the first commit');
set_up('beta');
publish('beta', 'b', 2);
is(scalar(wait_for_requests($r, '/status/200/beta', 2, 10)), 2, 'a second database delivers too');

# --- a database without the extension costs no worker; an idle one gives them back
sql('postgres', 'CREATE DATABASE plain');
sleep 3;
is(workers_in('plain'), '0', 'a database without the extension has no worker');
is(sql('alpha', "SELECT state FROM eventgrid.served_databases WHERE database = 'plain'"), 'no extension',
	'served_databases says it has no extension');
ok(wait_for_sql($node, "SELECT count(*) FROM pg_stat_activity WHERE datname IN ('alpha', 'beta')"
	  . " AND backend_type LIKE 'eventgrid % worker'", '0', 30),
	'idle for eventgrid.worker_idle_timeout (4 s), both databases give their workers back');
$t0 = time();
publish('alpha', 'a2', 1);
ok(arrived('/status/200/alpha', 'a2-1', 10), 'the next commit brings the workers back and delivers');
cmp_ok(time() - $t0, '<', 2, 'within a second or so');

# --- a retry coming due brings the workers back by itself (no commit)
sql('beta', "SELECT eventgrid.create_event_subscription('top', 'later', '$u/seq/503,200/beta-later')");
publish('beta', 'r', 1);
is(scalar(wait_for_requests($r, '/seq/503,200/beta-later', 1, 10)), 1, 'a first attempt fails (503): a retry is due in 10 s');
ok(wait_for_sql($node, "SELECT count(*) FROM pg_stat_activity WHERE datname = 'beta'"
	  . " AND backend_type LIKE 'eventgrid % worker'", '0', 12),
	'the workers leave idle before the retry is due')
  or diag(sql('postgres', "SELECT string_agg(backend_type || ': ' || coalesce(query, ''), '; ') FROM pg_stat_activity"
		  . " WHERE datname = 'beta' AND backend_type LIKE 'eventgrid % worker'"),
	"\n", sql('beta', "SELECT string_agg(r::text, '; ') FROM eventgrid.retries r"),
	"\n", sql('beta', "SELECT string_agg(e::text, '; ') FROM eventgrid.endpoint_health e"));
like(sql('beta', "SELECT delivery_wanted_at IS NOT NULL FROM eventgrid.served_databases WHERE database = 'beta'"), qr/^t$/,
	'served_databases says when they are wanted again');
is(scalar(wait_for_requests($r, '/seq/503,200/beta-later', 2, 30)), 2, 'the retry is sent when due, with no commit to wake anyone');
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'later'", '1', 10, 'beta'),
	'and recorded as delivered');
sql('beta', "SELECT eventgrid.drop_event_subscription('top', 'later')");

# --- CREATE DATABASE ... TEMPLATE of a database that has the extension, while it delivers
sql('alpha', "SELECT eventgrid.create_event_subscription('top', 'slow', '$u/status/200/alpha-slow?delay_ms=300')");
publish('alpha', 'busy', 30);
wait_for_requests($r, '/status/200/alpha-slow', 2, 20);
# the fast subscription has delivered its 30 (on a busy machine it may lag):
# the clone then starts with nothing of them due, and its one new event is all it sends
ok(wait_for_sql($node, "SELECT pending || '/' || retrying FROM eventgrid.delivery_statistics WHERE subscription = 'sub'", '0/0', 60, 'alpha'),
	'alpha\'s fast subscription has nothing left to send (the slow one goes on)');
$t0 = time();
sql('postgres', 'CREATE DATABASE gamma TEMPLATE alpha');
cmp_ok(time() - $t0, '<', 6, 'CREATE DATABASE ... TEMPLATE of a delivering database succeeds within about 5 s');
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'slow'", '30', 60, 'alpha'),
	'the template database goes on delivering afterwards, every event');
sql('gamma', "SELECT eventgrid.update_event_subscription('top', 'sub', endpoint => '$u/status/200/gamma');"
	  . " SELECT eventgrid.drop_event_subscription('top', 'slow')");
publish('gamma', 'g', 1);
is(scalar(wait_for_requests($r, '/status/200/gamma', 1, 15)), 1, 'the clone is served within a few seconds');

# --- ALTER DATABASE ... RENAME TO while delivering: served under the new name
set_up('delta', path => '?delay_ms=200');
publish('delta', 'd', 20);
wait_for_requests($r, '/status/200/delta', 2, 20);
$t0 = time();
sql('postgres', 'ALTER DATABASE delta RENAME TO epsilon');
cmp_ok(time() - $t0, '<', 6, 'ALTER DATABASE ... RENAME TO a delivering database succeeds within about 5 s');
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'sub'", '20', 60, 'epsilon'),
	'the renamed database delivers the rest, every event');
is(scalar(grep { $_ > 1 } values %{ arrivals('/status/200/delta') }), 0, '... none twice')
  or diag(explain(arrivals('/status/200/delta')));
like(sql('epsilon', "SELECT string_agg(application_name, ',') FROM pg_stat_activity WHERE datname = 'epsilon'"
	  . " AND backend_type LIKE 'eventgrid % worker'"), qr/\[epsilon\]/, 'its workers are named for its new name');

# --- ALTER DATABASE ... SET TABLESPACE while delivering
my $ts = "$PostgreSQL::Test::Utils::tmp_check/ts_zeta";
mkdir $ts;
sql('postgres', "CREATE TABLESPACE zeta_space LOCATION '$ts'");
set_up('zeta', path => '?delay_ms=200');
publish('zeta', 'z', 20);
wait_for_requests($r, '/status/200/zeta', 2, 20);
$t0 = time();
sql('postgres', 'ALTER DATABASE zeta SET TABLESPACE zeta_space');
cmp_ok(time() - $t0, '<', 6, 'ALTER DATABASE ... SET TABLESPACE of a delivering database succeeds within about 5 s');
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'sub'", '20', 60, 'zeta'),
	'and it delivers the rest');

# --- plain DROP DATABASE while delivering
set_up('omega', path => '?delay_ms=500');
publish('omega', 'o', 30);
wait_for_requests($r, '/status/200/omega', 2, 20);
$t0 = time();
my ($ret, $out, $err) = $node->psql('postgres', 'DROP DATABASE omega');
is($ret . $err, '0', 'plain DROP DATABASE (without FORCE) of a delivering database succeeds');
cmp_ok(time() - $t0, '<', 6, 'within about 5 s');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.served_databases WHERE database = 'omega'", '0', 10, 'alpha'),
	'its slot is gone');

# --- DROP EXTENSION in one database stops only its workers
publish('alpha', 'a3', 1);
publish('beta', 'b3', 1);
arrived('/status/200/beta', 'b3-1', 10);
sql('beta', 'DROP EXTENSION eventgrid');
ok(wait_for_sql($node, "SELECT count(*) FROM pg_stat_activity WHERE datname = 'beta' AND backend_type LIKE 'eventgrid % worker'",
	'0', 10), 'DROP EXTENSION: its workers leave');
publish('alpha', 'a4', 1);
ok(arrived('/status/200/alpha', 'a4-1', 10), 'another database delivers on');

# --- one database on an older version idles with a HINT while the others deliver
sql('postgres', 'CREATE DATABASE oldver');
sql('oldver', "CREATE EXTENSION eventgrid VERSION '0.8.0'");
sql('oldver', "SELECT eventgrid.create_topic('top'); SELECT eventgrid.create_event_subscription('top', 'sub', '$u/status/200/oldver')");
publish('oldver', 'ov', 1);
ok(wait_for_sql($node, "SELECT state FROM eventgrid.served_databases WHERE database = 'oldver'", 'other version', 15, 'alpha'),
	'an older version: served_databases says so');
like(slurp_file($node->logfile), qr/the extension in database "oldver" is version 0\.8\.0 but the loaded library is version [\d.]+; nothing is delivered there.*\n.*HINT:  Run ALTER EXTENSION eventgrid UPDATE TO/,
	'and the log says it once, with a HINT');
publish('alpha', 'a5', 1);
ok(arrived('/status/200/alpha', 'a5-1', 10), 'while the others deliver');
is(scalar(requests($r, '/status/200/oldver')), 0, 'nothing is delivered from the older version');
sql('oldver', 'ALTER EXTENSION eventgrid UPDATE');
is(scalar(wait_for_requests($r, '/status/200/oldver', 1, 15)), 1, 'after ALTER EXTENSION ... UPDATE its event is delivered');

# --- the per-host limit protects a receiver whichever database the requests come from
sql('alpha', "SELECT eventgrid.create_event_subscription('top', 'held', '$hanging->{url}/hang/shared')");
sql('gamma', "SELECT eventgrid.create_event_subscription('top', 'held', '$hanging->{url}/hang/shared')");
publish('alpha', 'h', 6);
publish('gamma', 'h', 6);
wait_for_requests($hanging, '/hang/shared', 3, 15);
sleep 2;
my @hang = requests($hanging, '/hang/shared');
my $most = 0;
$most = $_->{concurrent} > $most ? $_->{concurrent} : $most for @hang;
cmp_ok($most, '<=', 3, "the hanging host had at most eventgrid.max_requests_per_endpoint (3) requests at once from two databases ($most)");
sql('alpha', "SELECT eventgrid.drop_event_subscription('top', 'held')");
sql('gamma', "SELECT eventgrid.drop_event_subscription('top', 'held')");

# --- seen: worker_status and served_databases name the database
publish('alpha', 'a6', 1);
arrived('/status/200/alpha', 'a6-1', 10);
like(sql('alpha', "SELECT string_agg(worker || '=' || (pid IS NOT NULL), ',' ORDER BY worker) FROM eventgrid.worker_status"),
	qr/^delivery worker 1=true,upkeep worker=(true|false)$/, 'worker_status shows the database\'s own workers');
like(sql('alpha', "SELECT string_agg(database || ':' || state, ',' ORDER BY database) FROM eventgrid.served_databases"),
	qr/alpha:served.*epsilon:served.*gamma:served.*oldver:served.*plain:no extension.*postgres:/,
	'served_databases shows every database, for a superuser');
sql('postgres', 'CREATE ROLE watcher LOGIN IN ROLE pg_monitor; CREATE ROLE nobody LOGIN');
like(sql('alpha', "SET ROLE watcher; SELECT count(*) > 5 FROM eventgrid.served_databases"), qr/^t$/,
	'a member of pg_monitor reads served_databases');
like(($node->psql('alpha', "SET ROLE nobody; SELECT * FROM eventgrid.served_databases"))[2] // '',
	qr/permission denied/, 'a role without pg_monitor may not');

# --- kill -9 of one database's worker, then of the launcher: nothing lost anywhere
sql('alpha', "SELECT eventgrid.create_event_subscription('top', 'crash', '$u/status/200/crash-alpha?delay_ms=300')");
sql('gamma', "SELECT eventgrid.create_event_subscription('top', 'crash', '$u/status/200/crash-gamma?delay_ms=300')");
publish('alpha', 'k', 20);
publish('gamma', 'k', 20);
wait_for_requests($r, '/status/200/crash-alpha', 2, 20);
my $victim = sql('alpha', "SELECT pid FROM pg_stat_activity WHERE datname = 'alpha' AND backend_type = 'eventgrid delivery worker'");
kill 'KILL', $victim;
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'crash'", '20', 90, 'alpha'),
	'kill -9 of a worker: every event of its database is delivered');
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'crash'", '20', 90, 'gamma'),
	'and every event of the other database');
publish('gamma', 'l', 10);
wait_for_requests($r, '/status/200/crash-gamma', 22, 20);
my $launcher = sql('postgres', "SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid launcher'");
kill 'KILL', $launcher;
ok(wait_for_sql($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'eventgrid launcher'", '1', 60),
	'kill -9 of the launcher: a new launcher runs');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.delivery_statistics WHERE subscription = 'crash' AND delivered >= 20 AND pending = 0",
	'1', 90, 'gamma'), 'the events in flight are delivered');
for my $db ('alpha', 'gamma')
{
	my $seen = arrivals("/status/200/crash-$db");
	my $twice = grep { $_ > 1 } values %$seen;
	my $aborted = sql($db, "SELECT count(*) FROM eventgrid.delivery_attempts WHERE subscription = 'crash' AND outcome = 'Aborted'");
	is(scalar(keys %$seen), $db eq 'alpha' ? 20 : 30, "$db: every event arrived");
	cmp_ok($twice, '<=', $aborted, "$db: only what was in flight (charged Aborted) arrived twice ($twice, $aborted)");
}
like(slurp_file($node->logfile), qr/LOG:  eventgrid: \d+ deliveries left in flight by .* will be retried.* \(database "alpha"\)/,
	'a worker\'s log line names its database');
is(count_log(qr/could not start/), 0, 'no worker failed to start');

$node->stop;
done_testing();
