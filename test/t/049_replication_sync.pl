# No event lost while a delivery server synchronizes (issue "Trust, third
# pass", item 4), as a new user's scale-out lost one: the delivery server
# subscribes with a replication role that lacks the grant the initial copy
# needs, so the copy of eventgrid.events fails ("permission denied") again
# and again while the application server publishes and its event tables
# rotate every 2 s; the apply worker passes over the rows it is sent for the
# table not yet synchronized.  Before that, the subscription is made
# disabled and left so for three rotations: its slot exists from CREATE
# SUBSCRIPTION, its copy (and its synchronization slot) only once it
# streams, and the events committed between are the copy's to bring.  The
# application server keeps its event tables meanwhile (event_table_rotations
# says why); once
# eventgrid.grant_event_replication() grants what is missing, the copy
# succeeds and every event published since the subscription, and before it,
# reaches the receiver.
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

my $app = PostgreSQL::Test::Cluster->new('app');
$app->init(allows_streaming => 'logical');
$app->append_conf('postgresql.conf', join('', map { "$_\n" }
	"shared_preload_libraries = 'eventgrid'",
	"eventgrid.event_table_rotation = '2s'",
	"eventgrid.replication_sync_wait = '10s'"));
$app->start;
$app->safe_psql('postgres', 'CREATE EXTENSION eventgrid');
my $d = new_node('delivery', wal_retrieve_retry_interval => "'500ms'");
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

$app->safe_psql('postgres', "SELECT eventgrid.create_topic('orders'); SELECT eventgrid.create_event_publication('pub');"
	  . " CREATE ROLE replicator LOGIN REPLICATION");
$d->safe_psql('postgres', "SELECT eventgrid.create_topic('orders');"
	  . " SELECT eventgrid.create_event_subscription('orders', 'sink', '$u/status/200/sink')");

my $n = 0;
sub publish
{
	my $k = shift;
	my @ids = map { 'e-' . ++$n } 1 .. $k;
	$app->safe_psql('postgres', "SELECT eventgrid.publish('orders', '[" . join(',', map { eg_event($_) } @ids) . "]')");
}

# Three events before the subscription, in the event tables when its slot
# is made (and so when the copy runs): no rotation until then. (With the
# 2 s rotation throughout, a loaded machine once took longer than that to
# make the slot, and the three were emptied away before it existed, as the
# README says events before a subscription may be.)
$app->safe_psql('postgres', "ALTER SYSTEM SET eventgrid.event_table_rotation = '1h'");
$app->safe_psql('postgres', "SELECT pg_reload_conf()");
sleep 1;
publish(3);
my $conn = sprintf('host=%s port=%d dbname=postgres user=replicator', $app->host, $app->port);
$d->safe_psql('postgres', "CREATE SUBSCRIPTION sub_app CONNECTION '$conn' PUBLICATION pub WITH (enabled = false)");
$app->safe_psql('postgres', "ALTER SYSTEM RESET eventgrid.event_table_rotation");
$app->safe_psql('postgres', "SELECT pg_reload_conf()");

# the slot exists, its subscriber streams nothing yet: three rotations go by
my $until = time() + 6;
while (time() < $until)
{
	publish(2);
	usleep(250_000);
}
like($app->safe_psql('postgres', "SELECT string_agg(DISTINCT last_failure, '; ') FROM eventgrid.event_table_rotations"),
	qr/waiting for .*logical replication slot sub_app/,
	'the application server keeps its event tables for a slot whose subscriber has not streamed yet, and says so');
like($app->safe_psql('postgres', "SELECT string_agg(array_to_string(waiting_for, '; '), '; ') FROM eventgrid.event_tables WHERE NOT current"),
	qr/logical replication slot sub_app/, 'eventgrid.event_tables says so too');
$d->safe_psql('postgres', "ALTER SUBSCRIPTION sub_app ENABLE");

# the copy fails for 20 s while events are published and the tables turn ten times
$until = time() + 20;
while (time() < $until)
{
	publish(2);
	usleep(250_000);
}
like(slurp_file($d->logfile), qr/permission denied for table events/, 'the initial copy failed: the role lacks SELECT');
is($d->safe_psql('postgres', "SELECT count(*) FROM eventgrid.events"), '0', 'nothing reached the delivery server meanwhile');
like($app->safe_psql('postgres', "SELECT string_agg(DISTINCT last_failure, '; ') FROM eventgrid.event_table_rotations"),
	qr/waiting for (?:.*; )?(?:the initial copy of logical replication slot pg_\d+_sync_\d+_\d+|logical replication slot sub_app, whose subscriber has not streamed)/,
	'the application server kept its event tables for the copy (its synchronization slot, or the subscription\'s own slot, which a copy in progress keeps from counting as streamed), and says so');

$app->safe_psql('postgres', "SELECT eventgrid.grant_event_replication('replicator')");
publish(3);
my @want = map { "e-$_" } 1 .. $n;
my %seen;
for (1 .. 600)
{
	%seen = ();
	$seen{ $json->decode($_->{body})->[0]{id} }++ for requests($r, '/status/200/sink');
	last unless grep { !$seen{$_} } @want;
	usleep(100_000);
}
is(scalar(grep { $seen{$_} } @want), scalar(@want), "once granted, all $n events arrived: none lost while the copy failed")
  or diag('missing: ' . join(' ', grep { !$seen{$_} } @want));
ok(wait_for_sql($app, "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'pg\\_%\\_sync\\_%'", '0', 30),
	'the copy is done: no synchronization slot is left');
publish(1);
my $last = "e-$n";
my $arrived = 0;
for (1 .. 300)
{
	$arrived = grep { $json->decode($_->{body})->[0]{id} eq $last } requests($r, '/status/200/sink');
	last if $arrived;
	usleep(100_000);
}
ok($arrived, 'and replication goes on');
ok(wait_for_sql($app, "SELECT count(*) > 0 FROM eventgrid.event_table_rotations WHERE truncated_at > now() - interval '10 s'",
		't', 30), 'the application server empties its event tables again');

$d->safe_psql('postgres', 'DROP SUBSCRIPTION sub_app');
$d->stop;
$app->stop;
done_testing();
