# Per-subscription rate limits (issue "Receivers can verify and push back",
# item 3): max_events_per_second holds a subscription's deliveries to its
# rate, measured at a real receiver over 10 s, while another subscription
# on the same host runs at full speed; a batch counts its events; retries
# count; events over the rate wait in the queue, not in the worker.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP;
use Time::HiRes qw(usleep);

my $node = new_node('rate');
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', shift) }

sub publish
{
	my ($topic, $prefix, $n) = @_;
	for (my $k = 1; $k <= $n; $k += 500)
	{
		my $last = $k + 499 < $n ? $k + 499 : $n;
		sql("SELECT eventgrid.publish('$topic', '[" . join(',', map { eg_event("$prefix-$_") } $k .. $last) . "]')");
	}
}

# events a request carried: a batch counts its events
sub events_of { my $b = $json->decode($_[0]{body}); return ref($b) eq 'ARRAY' ? scalar(@$b) : 1 }

# events received at $path between $from and $to seconds after its first request
sub window
{
	my ($path, $from, $to) = @_;
	my @reqs = requests($r, $path);
	return 0 unless @reqs;
	my $t0 = $reqs[0]{time};
	my $n = 0;
	$n += events_of($_) for grep { $_->{time} >= $t0 + $from && $_->{time} < $t0 + $to } @reqs;
	return $n;
}

sql("SELECT eventgrid.create_topic('work')");
sql("SELECT eventgrid.create_event_subscription('work', 'slow', '$u/status/200/slow', max_events_per_second => 50)");
sql("SELECT eventgrid.create_event_subscription('work', 'fast', '$u/status/200/fast')");

# --- 50 a second over 10 s, beside a subscription on the same host at full speed
my $t_publish = time;
publish('work', 'e', 1000);
my @fast = wait_for_requests($r, '/status/200/fast', 1000, 60);
is(scalar(@fast), 1000, 'fast: all 1000 events delivered');
my $fast_secs = $fast[-1]{time} - $fast[0]{time};
cmp_ok($fast_secs, '<', 5, sprintf('fast: in %.1f s, not held to the slow one\'s rate (it would take 20 s)', $fast_secs));
is(sql("SELECT count(*) FROM eventgrid.retries"), '0', 'slow: the events over the rate are not retries');
cmp_ok(sql("SELECT pending FROM eventgrid.delivery_statistics WHERE subscription = 'slow'"), '>', 500,
	'slow: they wait at its position');
# the status line (not the name of a unit of work that runs at that moment)
my $line = '';
for (1 .. 100)
{
	$line = sql("SELECT activity FROM eventgrid.worker_status WHERE worker = 'delivery worker 1'");
	last if $line =~ /^eventgrid: (idle|delivering)/;
	usleep(50_000);
}
like($line, qr/^eventgrid: (idle|delivering: \d+ requests in flight, \d{1,2} waiting to be sent)/,
	'and not in the worker: at most a few dozen requests wait there');
wait_for_requests($r, '/status/200/slow', 1, 30);
sleep 13;
my $rate = window('/status/200/slow', 2, 12) / 10;
cmp_ok(abs($rate - 50), '<=', 7.5, "slow: $rate events a second over 10 s, within 15 % of 50");
ok(wait_for_sql($node, "SELECT sum(delivered) || '/' || sum(pending) FROM eventgrid.delivery_statistics", '2000/0', 40),
	'slow: all its events arrive in the end, none lost');
my %ids;
$ids{ $json->decode($_->{body})->[0]{id} }++ for requests($r, '/status/200/slow');
is(scalar(keys %ids) . ' ' . (grep { $_ > 1 } values %ids), '1000 0', 'slow: each event once');

# --- a batch counts its events: 20 a second in batches of up to 10
sql("SELECT eventgrid.create_event_subscription('work', 'batched', '$u/status/200/batched', max_events_per_second => 20,"
	  . " max_events_per_batch => 10)");
publish('work', 'b', 200);
wait_for_requests($r, '/status/200/batched', 1, 30);
sleep 8;
my $batched = window('/status/200/batched', 2, 7) / 5;
cmp_ok(abs($batched - 20), '<=', 3, "batched: $batched events a second, within 15 % of 20");
cmp_ok((sort { $b <=> $a } map { events_of($_) } requests($r, '/status/200/batched'))[0], '>', 1,
	'batched: in batches of more than one event');

# --- retries count: 100 retries due at once go out at 20 a second
sql("SELECT eventgrid.create_event_subscription('work', 'again', '$u/status/500/again', max_events_per_second => 100)");
publish('work', 'a', 100);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries WHERE attempts = 1 AND lease_owner IS NULL", '100', 30),
	'again: 100 events failed once');
sql("SELECT eventgrid.update_event_subscription('work', 'again', endpoint => '$u/status/200/again', max_events_per_second => 20)");
advance_clock($node, 15);
my @again = wait_for_requests($r, '/status/200/again', 100, 30);
is(scalar(@again), 100, 'again: all 100 retries delivered');
my $span = $again[-1]{time} - $again[0]{time};
# a full bucket (20) at once, then 80 at 20 a second: 4 s
cmp_ok($span, '>=', 3.4, sprintf('again: over %.1f s, at the rate (4 s at 20 a second)', $span));
cmp_ok($span, '<=', 6, 'and not much slower');

$node->stop;
done_testing();
