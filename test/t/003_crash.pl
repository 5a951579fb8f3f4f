# At-least-once delivery across crashes (SPEC 2): events in flight when the
# server stops with "pg_ctl stop -m immediate", or when the delivery worker is
# killed with SIGKILL, are delivered again after restart; nothing is lost.
# Both for first attempts and for retries in flight.
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

# retries in flight: every event failed once (500), the subscription now
# points at a receiver that holds each request 3 s, the retries come due and
# are sent, and the crash finds them all in flight (20: more than the 32
# requests a host may have at once would leave some waiting, answered and
# recorded before the crash)
sub run_retry_case
{
	my ($name, $crash) = @_;
	# fewer than eventgrid.max_requests_per_endpoint (32): all in flight at once
	my $n = 20;
	my $path = "/status/200/r-$name";
	sql("SELECT eventgrid.create_topic('r-$name')");
	sql("SELECT eventgrid.create_event_subscription('r-$name', 's-r-$name', '$u/status/500/r-$name')");
	sql("INSERT INTO eventgrid.events (topic, event) SELECT 'r-$name', jsonb_build_object("
		  . "'id', 'r-$name-' || i, 'subject', '/s', 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z') "
		  . "FROM generate_series(1, $n) i");
	ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries r JOIN eventgrid.event_subscriptions s ON s.id = r.subscription_id"
		  . " WHERE s.name = 's-r-$name' AND r.attempts = 1 AND r.lease_owner IS NULL", $n, 30),
		"retries, $name: all $n events failed once and wait");
	sql("SELECT eventgrid.update_event_subscription('r-$name', 's-r-$name', endpoint => '$u$path?delay_ms=3000')");
	advance_clock($node, 15);
	my @first = wait_for_requests($r, $path, $n, 30);
	is(scalar @first, $n, "retries, $name: all $n retries in flight");
	$crash->();
	ok(wait_for_sql($node, "SELECT coalesce(sum(pending), 0) FROM eventgrid.delivery_statistics WHERE topic = 'r-$name'", '0', 90),
		"retries, $name: every event finished after restart");
	my $seen = delivered_ids($path);
	is(scalar(grep { ($seen->{"r-$name-$_"} // 0) >= 2 } 1 .. $n), $n,
		"retries, $name: every interrupted retry was made again");
	is(sql("SELECT delivered || '/' || pending || '/' || dead_lettered || '/' || dropped FROM eventgrid.delivery_statistics"
		  . " WHERE subscription = 's-r-$name'"), "$n/0/0/0", "retries, $name: all recorded as delivered, none lost");
	my @again = grep { $json->decode($_->{body})->[0]{id} eq "r-$name-1" } requests($r, $path);
	is($again[-1]{headers}{'aeg-delivery-count'}, '2',
		"retries, $name: the redelivery counts the failed attempt and the interrupted one");
	is(sql("SELECT count(*) FROM eventgrid.retries r JOIN eventgrid.event_subscriptions s ON s.id = r.subscription_id"
		  . " WHERE s.name = 's-r-$name'"), '0', "retries, $name: no retry is left behind");
}

sub crash_immediate
{
	$node->stop('immediate');
	$node->start;
}

sub crash_sigkill
{
	my $pid = sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker'");
	ok($pid =~ /^\d+$/, 'found the delivery worker');
	kill 'KILL', $pid;
	# the postmaster restarts every process after a crashed worker
	ok(wait_for_sql($node, "SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker' AND pid <> $pid", 't', 60),
		'a new delivery worker runs');
}

run_case('immediate', \&crash_immediate);
run_case('sigkill', \&crash_sigkill);
run_retry_case('immediate', \&crash_immediate);
run_retry_case('sigkill', \&crash_sigkill);

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
