# Pull delivery on a delivery server fed by logical replication (README
# "Scaling out", "Pull delivery"): an application cluster publishes to a
# namespace topic across several event-table rotations and a delivery
# cluster subscribed to it (create_event_publication(), CREATE
# SUBSCRIPTION) has a queue subscription on the same topic, from which a
# consumer receives every event exactly once, with a waiting receive()
# woken by what replication applies; a restart of the delivery server
# loses no event and settles none twice.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $app = PostgreSQL::Test::Cluster->new('app');
$app->init(allows_streaming => 'logical');
$app->append_conf('postgresql.conf', "shared_preload_libraries = 'eventgrid'\neventgrid.event_table_rotation = '2s'\n");
$app->start;
$app->safe_psql('postgres', 'CREATE EXTENSION eventgrid');
my $d = new_node('delivery', 'eventgrid.event_table_rotation' => "'2s'");
my $json = JSON::PP->new;

$app->safe_psql('postgres', q{
	SELECT eventgrid.create_topic('jobs', 'CloudEventSchemaV1_0', 'namespace');
	SELECT eventgrid.create_event_publication('pub_jobs', ARRAY['jobs']);
});
$d->safe_psql('postgres', q{
	SELECT eventgrid.create_topic('jobs', 'CloudEventSchemaV1_0', 'namespace');
	SELECT eventgrid.create_event_subscription('jobs', 'workers', delivery_mode => 'queue');
	CREATE TABLE got (id text, delivery_count int);
});
$d->safe_psql('postgres', sprintf("CREATE SUBSCRIPTION sub_jobs CONNECTION 'host=%s port=%d dbname=postgres' PUBLICATION pub_jobs",
	$app->host, $app->port));

sub publish
{
	my ($from, $to) = @_;
	$app->safe_psql('postgres', "INSERT INTO eventgrid.events (topic, event) SELECT 'jobs', jsonb_build_object("
		  . "'specversion', '1.0', 'id', 'j' || g, 'source', '/app', 'type', 'Job.Queued') FROM generate_series($from, $to) g");
}

# receives up to 100 events and acknowledges them, recording those acknowledged
sub drain
{
	$d->safe_psql('postgres', q{
		WITH r AS (SELECT * FROM eventgrid.receive('jobs', 'workers', 100, 10)),
		     a AS (SELECT * FROM eventgrid.acknowledge('jobs', 'workers',
		                                               coalesce((SELECT array_agg(lock_token) FROM r), '{}')))
		INSERT INTO got SELECT r.event->>'id', r.delivery_count FROM r JOIN a ON a.lock_token = r.lock_token AND a.succeeded});
}

# a waiting receive() is woken by what replication applies
my ($out, $err) = ('', '');
my $h = IPC::Run::start([ 'psql', '-X', '-At', '-d', $d->connstr('postgres'), '-c',
	"SELECT event->>'id' FROM eventgrid.receive('jobs', 'workers', 1, 60)" ], '>', \$out, '2>', \$err);
sleep 2;
my $t0 = time;
publish(0, 0);
$h->finish;
is($out, "j0\n", 'a receive() waiting on the delivery server gets the event published on the application server');
ok(time - $t0 < 10, sprintf('%.0f ms after the publish', (time - $t0) * 1000));
$d->safe_psql('postgres', "SELECT eventgrid.acknowledge('jobs', 'workers', ARRAY(SELECT id || ':' || lock_secret FROM eventgrid.queue_events))");

# 600 events over several rotations, drained as they come; a restart in the middle
for my $round (1 .. 6)
{
	publish(($round - 1) * 100 + 1, $round * 100);
	drain();
	if ($round == 3)
	{
		$d->restart;
	}
	usleep(700_000);
}
ok(wait_for_sql($d, "SELECT c.matched FROM eventgrid.subscription_counters c JOIN eventgrid.event_subscriptions s"
		  . " ON s.id = c.subscription_id WHERE s.name = 'workers'", '601', 60),
	'the delivery server moved all 601 replicated events into the queue');
for (1 .. 30)
{
	last if $d->safe_psql('postgres', 'SELECT count(*) FROM got') == 600;
	drain();
}
is($d->safe_psql('postgres', "SELECT count(*) || ' ' || count(DISTINCT id) || ' ' || max(delivery_count) FROM got"),
	'600 600 1', 'every event received and acknowledged once, none received twice');
is($d->safe_psql('postgres', "SELECT received_total || ' ' || acknowledged_total || ' ' || (receivable_events + locked_events)"
		  . " FROM eventgrid.queue_metrics"), '601 601 0', 'queue_metrics agrees; nothing is left');

done_testing();
