# pg_dump of one cluster restored into another (issue "Queue storage"):
# positions hold the first cluster's transaction ids, which mean nothing in
# the second.  The upkeep worker notices the other system identifier, turns
# what the positions had not passed into retries, empties the event tables
# and starts the positions afresh: the pending events are delivered once,
# and new events after them.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

# --- cluster A: five events wait while delivery is paused
my $a = new_node('first', 'eventgrid.delivery_paused' => 'on');
$a->safe_psql('postgres', "SELECT eventgrid.create_topic('shop')");
$a->safe_psql('postgres', "SELECT eventgrid.create_event_subscription('shop', 'sink', '$u/status/200/sink')");
$a->safe_psql('postgres', "SELECT eventgrid.publish('shop', '[" . join(',', map { eg_event("a-$_") } 1 .. 5) . "]')");
is($a->safe_psql('postgres', "SELECT pending FROM eventgrid.delivery_statistics WHERE subscription = 'sink'"), '5',
	'cluster A: five deliveries pending');
# and three events of a queue subscription (pull delivery) at its position
$a->safe_psql('postgres', "SELECT eventgrid.create_topic('jobs', 'CloudEventSchemaV1_0', 'namespace');"
	  . " SELECT eventgrid.create_event_subscription('jobs', 'workers', delivery_mode => 'queue');"
	  . " INSERT INTO eventgrid.events (topic, event) SELECT 'jobs', jsonb_build_object('specversion', '1.0', 'id', 'j-' || g,"
	  . " 'source', '/a', 'type', 'Job.Queued') FROM generate_series(1, 3) g");
my $dump = "$PostgreSQL::Test::Utils::tmp_check/elsewhere.dump";
$a->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $a->connstr('postgres') ], 'pg_dump of cluster A');
$a->stop;

# --- cluster B: another system identifier
my $b = PostgreSQL::Test::Cluster->new('second');
$b->init;
$b->append_conf('postgresql.conf',
	"shared_preload_libraries = 'eventgrid'\neventgrid.database_name = 'restored'\neventgrid.delivery_paused = on\n");
$b->start;
$b->safe_psql('postgres', 'CREATE DATABASE restored');
$b->command_ok([ 'pg_restore', '--exit-on-error', '-d', $b->connstr('restored'), $dump ], 'pg_restore into cluster B');
isnt($b->safe_psql('restored', "SELECT DISTINCT system_identifier FROM eventgrid.subscription_positions"),
	$b->safe_psql('restored', "SELECT system_identifier FROM pg_control_system()"),
	'the restored positions carry cluster A\'s system identifier');

$b->safe_psql('restored', "ALTER SYSTEM SET eventgrid.delivery_paused = off; SELECT pg_reload_conf()");
my @got = wait_for_requests($r, '/status/200/sink', 5, 60);
is_deeply([ sort map { $json->decode($_->{body})->[0]{id} } @got ], [ map { "a-$_" } 1 .. 5 ],
	'cluster B delivers the five pending events');
like(slurp_file($b->logfile),
	qr/positions restored from another cluster start afresh; 8 pending deliveries became retries or receivable queue events/,
	'the log says the positions started afresh');
is($b->safe_psql('restored', "SELECT string_agg(event->>'id' || ':' || delivery_count, ' ' ORDER BY event->>'id')"
		  . " FROM eventgrid.receive('jobs', 'workers', 10, 10)"), 'j-1:1 j-2:1 j-3:1',
	'the queue subscription\'s three events are receivable in cluster B');
$b->safe_psql('restored', "SELECT eventgrid.acknowledge('jobs', 'workers', ARRAY(SELECT id || ':' || lock_secret FROM eventgrid.queue_events))");
is($b->safe_psql('restored', "SELECT count(DISTINCT system_identifier) FROM eventgrid.subscription_positions"
	  . " WHERE system_identifier = eventgrid._system_identifier()"), '1', 'the positions are cluster B\'s now');

$b->safe_psql('restored', "SELECT eventgrid.publish('shop', '" . eg_event('b-1') . "')");
@got = wait_for_requests($r, '/status/200/sink', 6, 30);
is_deeply([ sort map { $json->decode($_->{body})->[0]{id} } @got ], [ (map { "a-$_" } 1 .. 5), 'b-1' ],
	'a new event in cluster B is delivered, and nothing twice');
ok(wait_for_sql($b, "SELECT coalesce(sum(pending), 0) || '/' || coalesce(sum(delivered), 0) FROM eventgrid.delivery_statistics", '0/9', 30, 'restored'),
	'nothing pending; nine delivered (six pushed, the three pulled ones acknowledged)');

# --- while delivery is paused (as during a pg_restore, which commits each
# table on its own), an event table whose rows no position has been
# restored for yet is not emptied; once resumed it is
$b->safe_psql('restored', "ALTER SYSTEM SET eventgrid.delivery_paused = on; SELECT pg_reload_conf()");
$b->safe_psql('restored', "SELECT eventgrid.create_topic('later')");
my $other = $b->safe_psql('restored', "SELECT (eventgrid._event_table() + 2) % 3");
$b->safe_psql('restored', "INSERT INTO eventgrid.events (topic, event, publish_time, event_bytes, event_table)"
	  . " VALUES ('later', '" . eg_event('r-1') . "', now(), 10, $other)");
$b->safe_psql('restored', "SELECT eventgrid._wake_worker_at_commit()");
sleep 4;
# (the row alone: a rotation meanwhile can make $other the table b-1 went to)
is($b->safe_psql('restored', "SELECT count(*) FROM eventgrid.events_$other WHERE topic = 'later'"), '1',
	'paused: a restored event table that no position holds yet is kept');
$b->safe_psql('restored', "ALTER SYSTEM SET eventgrid.delivery_paused = off; SELECT pg_reload_conf()");
ok(wait_for_sql($b, "SELECT count(*) FROM eventgrid.events_$other", '0', 90, 'restored'),
	'resumed: nothing holds it, and it is emptied');

$b->stop;
done_testing();
