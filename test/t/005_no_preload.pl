# Without shared_preload_libraries the extension still installs, configures
# and publishes (the library loads on demand, the commit-time wake-up is a
# no-op); nothing is delivered until the library is preloaded, and then the
# waiting deliveries go out.  Issue: CREATE EXTENSION with and without preload.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('nopreload');
$node->init;
$node->append_conf('postgresql.conf', "eventgrid.retry_jitter_percent = 0\n");
$node->start;
my $r = start_receiver();

sub sql { return $node->safe_psql('postgres', shift) }

my ($ret, $out, $err) = $node->psql('postgres', 'CREATE EXTENSION eventgrid');
is($ret, 0, 'CREATE EXTENSION works without preload');
like($err, qr/WARNING:  eventgrid is not in shared_preload_libraries.*\n.*serve every database where the extension is created/,
	'a warning says that nothing is delivered yet, and that every database with the extension will be served');
is(sql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker'"), '0',
	'no delivery worker without preload');
sql("SELECT eventgrid.create_topic('shop')");
sql("SELECT eventgrid.create_event_subscription('shop', 'later', '$r->{url}/status/200/later', max_events_per_batch => 10)");
sql("SELECT eventgrid.set_delivery_property('shop', 'later', 'X-Key', 'v')");
is(sql("SELECT cardinality(eventgrid.publish('shop', '[" . eg_event('n-1') . "," . eg_event('n-2') . "]'))"), '2',
	'publishing works without preload');
is(sql("SELECT coalesce(sum(pending), 0) FROM eventgrid.delivery_statistics"), '2', 'the deliveries wait');
($ret, $out, $err) = $node->psql('postgres', "SELECT eventgrid.create_topic('x')");
like($err, qr/invalid topic name/, 'validation works without preload');
is(sql("SELECT eventgrid.retry_delay(1) IS NOT NULL; SHOW eventgrid.response_timeout"), "t\n30s",
	'GUCs are defined when the library loads on demand');
sleep 1;
is(scalar(requests($r)), 0, 'nothing is delivered without the worker');

$node->append_conf('postgresql.conf', "shared_preload_libraries = 'eventgrid'\n");
$node->restart;
ok(wait_for_sql($node, "SELECT coalesce(sum(pending), 0) FROM eventgrid.delivery_statistics", '0'), 'delivered once preloaded');
is(scalar(wait_for_requests($r, '/status/200/later', 1)), 1, 'both events in one batch');

$node->stop;
done_testing();
