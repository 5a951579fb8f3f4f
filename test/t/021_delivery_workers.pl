# Several delivery workers (eventgrid.delivery_workers = 2) share the queue:
# both deliver, each within its own bounds; no event is claimed by both; a
# worker that exits (SIGTERM) leaves the other's requests alone, and only
# what it had in flight is charged an attempt and sent again; after a crash
# (SIGKILL, every process restarted) both workers start together and take
# back everything exactly once.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

# The smallest byte bound (1 MB): a claim takes at most half of it, so one
# worker holds at most three 200 KB events and the other worker gets the rest.
my $node = new_node('workers',
	'eventgrid.delivery_workers' => 2,
	'eventgrid.max_bytes_in_flight' => "'1MB'",
	'eventgrid.response_timeout' => "'30s'",
	restart_after_crash => 'on');
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', shift) }

sub worker_pids
{
	return sql("SELECT string_agg(application_name || '=' || pid, ',' ORDER BY application_name)"
		  . " FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker'");
}

sub publish_big
{
	my ($topic, $n) = @_;
	sql("INSERT INTO eventgrid.events (topic, event) SELECT '$topic', jsonb_build_object("
		  . "'id', '$topic-' || i, 'subject', '/s', 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z',"
		  . " 'data', jsonb_build_object('pad', repeat('x', 200000))) FROM generate_series(1, $n) i");
}

sub arrivals
{
	my $path = shift;
	my %seen;
	$seen{ $json->decode($_->{body})->[0]{id} }++ for requests($r, $path);
	return \%seen;
}

ok(start_workers($node), 'two delivery workers run');
like(worker_pids(), qr/^eventgrid delivery worker 1 \[postgres\]=\d+,eventgrid delivery worker 2 \[postgres\]=\d+$/,
	'pg_stat_activity names them by number and database');
is(sql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'eventgrid upkeep worker'"), '1',
	'one upkeep worker serves both');

# Both deliver at once: more requests arrive within 1.5 s than one worker's
# byte bound allows (each request is answered after 2 s).
sql("SELECT eventgrid.create_topic('share')");
sql("SELECT eventgrid.create_event_subscription('share', 'share', '$u/status/200/share?delay_ms=2000')");
publish_big('share', 12);
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'share'", '12', 60),
	'share: all 12 delivered');
my @times = sort { $a <=> $b } map { $_->{time} } requests($r, '/status/200/share');
my $peak = 0;
for my $i (0 .. $#times)
{
	my $n = grep { $_ >= $times[$i] && $_ < $times[$i] + 1.5 } @times;
	$peak = $n if $n > $peak;
}
ok($peak >= 4 && $peak <= 6, "share: requests under way at once: $peak, more than one worker holds (3), at most two workers' share (6)");

# No event is claimed by both: 600 events to three event subscriptions,
# each delivered exactly once.
sql("SELECT eventgrid.create_topic('many')");
for my $s (1 .. 3)
{
	sql("SELECT eventgrid.create_event_subscription('many', 'many-$s', '$u/status/200/many-$s')");
}
for my $b (0 .. 5)
{
	sql("INSERT INTO eventgrid.events (topic, event) SELECT 'many', jsonb_build_object("
		  . "'id', 'm-' || i, 'subject', '/s', 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z')"
		  . " FROM generate_series($b * 100 + 1, $b * 100 + 100) i");
}
ok(wait_for_sql($node, "SELECT sum(delivered) FROM eventgrid.delivery_statistics WHERE topic = 'many'", '1800', 60),
	'every delivery recorded');
for my $s (1 .. 3)
{
	my $seen = arrivals("/status/200/many-$s");
	is(scalar(keys %$seen) . '/' . scalar(grep { $_ != 1 } values %$seen), '600/0',
		"many-$s: each of 600 events arrived exactly once");
}

# A worker that exits on SIGTERM: its requests in flight are charged and
# sent again; the other worker's finish untouched.
#
# The receiver answers after delay_ms, so the requests that have arrived
# when the worker is stopped are still in flight then, however slowly this
# script runs under load, as long as it reacts within that delay.
sub interrupt_case
{
	my ($name, $delay_ms, $interrupt) = @_;
	my $path = "/status/200/$name";
	sql("SELECT eventgrid.create_topic('$name')");
	sql("SELECT eventgrid.create_event_subscription('$name', '$name', '$u$path?delay_ms=$delay_ms')");
	publish_big($name, 12);
	my @first = wait_for_requests($r, $path, 4, 30);
	ok(@first >= 4, "$name: both workers have requests in flight");
	my $before = worker_pids();
	$interrupt->($before);
	ok(wait_for_sql($node, "SELECT delivered || '/' || pending FROM eventgrid.delivery_statistics WHERE subscription = '$name'",
		'12/0', 90), "$name: all 12 delivered, none pending");
	my $seen = arrivals($path);
	my $twice = grep { $_ >= 2 } values %$seen;
	is(scalar(keys %$seen), 12, "$name: every event reached the receiver");
	my $aborted = sql("SELECT count(*) FROM eventgrid.delivery_attempts WHERE subscription = '$name' AND outcome = 'Aborted'");
	is($aborted, $twice, "$name: exactly the events sent again were charged an Aborted attempt");
	return ($before, $twice, scalar(@first));
}

my ($before, $twice) = interrupt_case('sigterm', 8000, sub {
	my ($pid2) = $_[0] =~ /worker 2 \[postgres\]=(\d+)/;
	sql("SELECT pg_terminate_backend($pid2)");
});
ok($twice >= 1 && $twice <= 3, "sigterm: only the stopped worker's requests were sent again ($twice, at most 3)");
my ($pid1) = $before =~ /worker 1 \[postgres\]=(\d+)/;
like(worker_pids(), qr/^eventgrid delivery worker 1 \[postgres\]=$pid1,eventgrid delivery worker 2 \[postgres\]=\d+$/,
	'sigterm: worker 1 ran on; worker 2 was started again');

my ($b2, $twice2, $first2) = interrupt_case('sigkill', 8000, sub {
	my ($pid2) = $_[0] =~ /worker 2 \[postgres\]=(\d+)/;
	kill 'KILL', $pid2;
	# the postmaster restarts every process after a crashed worker
	ok(wait_for_sql($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker'"
		  . " AND pid NOT IN (" . join(',', $_[0] =~ /=(\d+)/g) . ")", '2', 60),
		'sigkill: both delivery workers were started again');
});
ok($twice2 >= 4, "sigkill: both workers' requests in flight were sent again ($twice2)");

my $log = slurp_file($node->logfile);
unlike($log, qr/deadlock detected/, 'no deadlock between the workers');
like($log, qr/LOG:  eventgrid: .*\(database "postgres"\)/, 'the workers\' log lines name their database');

$node->stop;
done_testing();
