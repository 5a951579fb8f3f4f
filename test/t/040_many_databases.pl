# Many databases within the default max_worker_processes (8) (issue "Every
# database", items 3 and 5): 20 databases with the extension, one event
# published in each, are all delivered within 30 s, the databases taking
# turns for the background worker slots; the log says so once, with a HINT
# naming max_worker_processes; idle databases hold no worker afterwards.
# And a backlog of 100,000 events in one database does not hold up a
# steady trickle in another: each trickle event arrives while the backlog
# drains (the commit-to-arrival figures are printed; bench figure 16
# measures them).
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

my $node = PostgreSQL::Test::Cluster->new('many');
$node->init;
$node->append_conf('postgresql.conf', join('', map { "$_\n" }
	"shared_preload_libraries = 'eventgrid'",
	"eventgrid.worker_idle_timeout = '10s'",
	# (a database's upkeep worker stays while an event table holds rows:
	# 2 s turns empty a published event's table within seconds)
	"eventgrid.event_table_rotation = '2s'",
	"max_worker_processes = 8"));
$node->start;
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { my ($db, $q) = @_; return $node->safe_psql($db, $q) }
sub count_log { my $re = shift; my @m = slurp_file($node->logfile) =~ /$re/g; return scalar @m }

my @dbs = map { sprintf('db%02d', $_) } 1 .. 20;
for my $db (@dbs)
{
	sql('postgres', "CREATE DATABASE $db");
	sql($db, 'CREATE EXTENSION eventgrid');
	sql($db, "SELECT eventgrid.create_topic('top'); SELECT eventgrid.create_event_subscription('top', 'sub', '$u/status/200/$db')");
}
is(sql('postgres', 'SHOW max_worker_processes'), '8', 'the default max_worker_processes (8)');

my $t0 = time();
sql($_, "SELECT eventgrid.publish('top', '" . eg_event("e-$_") . "')") for @dbs;
my $all = 1;
for my $db (@dbs)
{
	my $left = 30 - (time() - $t0);
	$all &&= scalar(wait_for_requests($r, "/status/200/$db", 1, $left > 1 ? $left : 1)) == 1;
}
ok($all, 'one event published in each of 20 databases: all delivered');
my $took = time() - $t0;
cmp_ok($took, '<', 30, sprintf('within 30 s (%.1f s)', $took));
is(count_log(qr/LOG:  eventgrid: \d+ databases? with work wait(s)? for a free background worker slot; databases take turns/), 1,
	'running out of worker slots is logged once');
like(slurp_file($node->logfile), qr/HINT:  Raise max_worker_processes \(now 8\) to at least \d+ so that every busy database runs at once/,
	'with a HINT naming max_worker_processes and how many would do');
ok(wait_for_sql($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'eventgrid % worker'", '0', 60),
	'idle, the 20 databases give every worker back');
is(count_log(qr/could not start/), 0, 'no worker start was reported as failed');

# --- a backlog in one database beside a trickle in another
my $sink = start_receiver();		# the backlog's receiver: the trickle's does not queue behind it
sql('db01', "SELECT eventgrid.create_event_subscription('top', 'bulk', '$sink->{url}/status/200/bulk', max_events_per_batch => 5)");
# the backlog is published while its subscription is paused, and resumed just before the trickle
sql('db01', "SELECT eventgrid.pause_delivery('top', 'bulk'); SELECT eventgrid.drop_event_subscription('top', 'sub')");
my $bulk_left;
sub trickle
{
	my ($tag, $n) = @_;
	my %commit;
	for my $i (1 .. $n)
	{
		sql('db02', "SELECT eventgrid.publish('top', '" . eg_event("$tag-$i") . "')");
		$commit{"$tag-$i"} = time();
		$bulk_left = sql('db01', "SELECT pending FROM eventgrid.delivery_statistics WHERE subscription = 'bulk'")
		  if $i == $n / 2;
		usleep(100_000);
	}
	my %arrived;
	for (1 .. 300)
	{
		%arrived = map { $json->decode($_->{body})->[0]{id} => $_->{time} } requests($r, '/status/200/db02');
		last unless grep { !defined $arrived{$_} } keys %commit;
		usleep(100_000);
	}
	my @lat = sort { $a <=> $b } map { ($arrived{$_} // 1e9) - $commit{$_} } keys %commit;
	return (\@lat, scalar(grep { defined $arrived{$_} } keys %commit));
}
sleep 1;
my ($solo) = trickle('solo', 30);
sql('db01', "INSERT INTO eventgrid.events (topic, event) SELECT 'top', jsonb_build_object('id', 'bulk-' || i, 'subject', '/s',"
	  . " 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('n', i)) FROM generate_series(1, 100000) i");
sql('db01', "SELECT eventgrid.resume_delivery('top', 'bulk')");
my ($busy, $arrived) = trickle('busy', 30);
is($arrived, 30, 'the trickle arrived while the other database drained its backlog');
cmp_ok($bulk_left, '>', 0, "the backlog was still draining halfway through the trickle ($bulk_left left)");
my $p95 = sub { my $l = shift; return $l->[int(0.95 * $#$l)] * 1000 };
note(sprintf('trickle commit-to-arrival p95: %.1f ms alone, %.1f ms beside a 100,000-event backlog in another database',
	$p95->($solo), $p95->($busy)));
ok(wait_for_sql($node, "SELECT pending FROM eventgrid.delivery_statistics WHERE subscription = 'bulk'", '0', 180, 'db01'),
	'the backlog is delivered');

$node->stop;
done_testing();
