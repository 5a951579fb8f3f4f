# At-least-once delivery across crashes (SPEC 2): events in flight when the
# server stops with "pg_ctl stop -m immediate", or when the delivery worker is
# killed with SIGKILL, are delivered again after restart; nothing is lost.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('crash', 'eventgrid.response_timeout' => "'30s'", restart_after_crash => 'on');
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;
my $n = 40;

sub sql { return $node->safe_psql('postgres', shift) }

sub delivered_ids
{
	my $path = shift;
	my %seen;
	$seen{ $json->decode($_->{body})->[0]{id} }++ for requests($r, $path);
	return \%seen;
}

sub run_case
{
	my ($name, $crash) = @_;
	my $path = "/status/200/$name";
	sql("SELECT eventgrid.create_topic('t-$name')");
	# the receiver holds every request 3 s, so the crash finds them in flight
	sql("SELECT eventgrid.create_event_subscription('t-$name', 's-$name', '$u$path?delay_ms=3000')");
	sql("INSERT INTO eventgrid.events (topic, event) SELECT 't-$name', jsonb_build_object("
		  . "'id', '$name-' || i, 'subject', '/s', 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z') "
		  . "FROM generate_series(1, $n) i");
	my @first = wait_for_requests($r, $path, $n, 30);
	is(scalar @first, $n, "$name: all $n events in flight");
	$crash->();
	ok(wait_for_sql($node, "SELECT coalesce(sum(pending), 0) FROM eventgrid.delivery_statistics WHERE topic = 't-$name'", '0', 90),
		"$name: every event finished after restart");
	my $seen = delivered_ids($path);
	is(scalar(grep { $seen->{"$name-$_"} } 1 .. $n), $n, "$name: every event reached the receiver");
	is(scalar(grep { $seen->{"$name-$_"} >= 2 } 1 .. $n), $n, "$name: the interrupted attempts were made again");
	is(sql("SELECT delivered || '/' || pending || '/' || dead_lettered || '/' || dropped FROM eventgrid.delivery_statistics WHERE subscription = 's-$name'"),
		"$n/0/0/0", "$name: all recorded as delivered, none lost");
	my @again = grep { $json->decode($_->{body})->[0]{id} eq "$name-1" } requests($r, $path);
	is($again[-1]{headers}{'aeg-delivery-count'}, '1', "$name: the redelivery counts the interrupted attempt");
	is(sql("SELECT count(*) FILTER (WHERE outcome = 'Aborted' AND attempt = 1 AND error IS NOT NULL) || '/' ||"
		  . " count(*) FILTER (WHERE outcome = 'Delivered' AND attempt = 2) FROM eventgrid.delivery_attempts"
		  . " WHERE subscription = 's-$name'"), "$n/$n",
		"$name: the attempt history shows each interrupted attempt as Aborted, then the delivery");
}

run_case('immediate', sub {
	$node->stop('immediate');
	$node->start;
});

run_case('sigkill', sub {
	my $pid = sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker'");
	ok($pid =~ /^\d+$/, 'found the delivery worker');
	kill 'KILL', $pid;
	# the postmaster restarts every process after a crashed worker
	ok(wait_for_sql($node, "SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker' AND pid <> $pid", 't', 60),
		'a new delivery worker runs');
});

like(slurp_file($node->logfile), qr/deliveries left in flight by (an earlier run of the delivery workers|a delivery worker that no longer exists) will be retried/,
	'the worker logs the interrupted deliveries it takes back');

# SIGTERM stops a worker promptly; the next work brings a new one
start_workers($node);
my $pid = sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker'");
sql("SELECT pg_terminate_backend($pid)");
ok(wait_for_sql($node, "SELECT count(*) FROM pg_stat_activity WHERE pid = $pid", '0', 30), 'SIGTERM stops the worker');
sql("SELECT eventgrid.create_topic('after')");
sql("SELECT eventgrid.create_event_subscription('after', 'after', '$u/status/200/after')");
sql("SELECT eventgrid.publish('after', '" . eg_event('after-sigterm') . "')");
is(scalar(wait_for_requests($r, '/status/200/after', 1, 30)), 1, 'a new worker delivers what comes next');

$node->stop;
done_testing();
