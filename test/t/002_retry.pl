# The retry schedule and retry policy on the wire (SPEC 3 and 4), with the
# worker's clock moved forward through eventgrid.clock_offset instead of
# waiting real minutes: the schedule with its 503 and 408 floors, maximum
# delivery attempts, and the worked example of SPEC 4 (TTL 30 min, 10
# attempts allowed: 6 attempts, then TimeToLiveExceeded at 46 min 40 s).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(sleep);

my $node = new_node('retry');
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', shift) }

sql("SELECT eventgrid.create_topic('shop')");

# --- schedule with floors: 500 -> 10 s, 503 -> 30 s, 408 -> 2 min, then 200 ---
sql("SELECT eventgrid.create_event_subscription('shop', 'sched', '$u/seq/500,503,408,200/sched')");
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '" . eg_event('s-1') . "')");
ok(wait_recorded($node, 'sched', 1), 'attempt 1 made and recorded');
is(planned_wait($node, 'sched'), 10, 'after failure 1 (500): 10 s');
# real time passes too: 5 s ahead plus the second of waiting and the
# test's own steps (a few seconds on a loaded machine) stays short of 10 s
advance_clock($node, 5);
sleep 1;
is(scalar(requests($r, '/seq/500,503,408,200/sched')), 1, 'no attempt before the retry is due');
advance_clock($node, 5);
ok(wait_recorded($node, 'sched', 2), 'attempt 2 made when due');
is(planned_wait($node, 'sched'), 30, 'after failure 2 (503): 30 s');
advance_clock($node, 30);
ok(wait_recorded($node, 'sched', 3), 'attempt 3 made when due');
is(planned_wait($node, 'sched'), 120, 'after failure 3 (408, schedule says 1 min): the 2 min floor');
advance_clock($node, 120);
ok(wait_for_sql($node, "SELECT delivered || '/' || pending || '/' || failed_attempts FROM eventgrid.delivery_statistics WHERE subscription = 'sched'", '1/0/3'),
	'attempt 4 delivered');
my @sched = requests($r, '/seq/500,503,408,200/sched');
is_deeply([ map { $_->{headers}{'aeg-delivery-count'} } @sched ], [ 0, 1, 2, 3 ], 'aeg-delivery-count counts previous attempts');
is_deeply([ map { $json->decode($_->{body})->[0]{id} } @sched ], [ ('s-1') x 4 ], 'the same event each time');

# --- 503 floor on the first retry: 30 s instead of 10 s ------------------------
sql("SELECT eventgrid.create_event_subscription('shop', 'busy', '$u/status/503/busy')");
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '" . eg_event('b-1') . "')");
ok(wait_recorded($node, 'busy', 1), '503: attempt 1 recorded');
is(planned_wait($node, 'busy'), 30, 'after a first failure with 503: 30 s floor');
sql("SELECT eventgrid.drop_event_subscription('shop', 'busy')");

# --- maximum delivery attempts, dead-lettered ------------------------------------
sql("SELECT eventgrid.create_event_subscription('shop', 'max3', '$u/status/500/max3', max_delivery_attempts => 3, deadletter => true)");
sql("SELECT eventgrid.create_event_subscription('shop', 'max1-drop', '$u/status/500/max1', max_delivery_attempts => 1)");
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '" . eg_event('m-1') . "')");
ok(wait_recorded($node, 'max3', 1), 'max3: attempt 1');
ok(wait_for_sql($node, "SELECT dropped FROM eventgrid.delivery_statistics WHERE subscription = 'max1-drop'", '1'),
	'max_delivery_attempts 1 without dead-lettering: dropped after one failure');
advance_clock($node, 10);
ok(wait_recorded($node, 'max3', 2), 'max3: attempt 2');
advance_clock($node, 30);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'max3'", '1'),
	'max3: dead-lettered after attempt 3');
is(scalar(requests($r, '/status/500/max3')), 3, 'exactly 3 attempts');
my $dl = $json->decode(sql("SELECT dead_letter_event FROM eventgrid.dead_letter_events WHERE subscription_name = 'max3'"));
is_deeply([ @{$dl}{qw(id deadLetterReason deliveryAttempts lastDeliveryOutcome lastHttpStatusCode)} ],
	[ 'm-1', 'MaxDeliveryAttemptsExceeded', 3, 'GenericError', 500 ], 'dead letter: reason, attempts, last outcome and status');
is(scalar(requests($r, '/status/500/max1')), 1, 'max1-drop: one attempt');
ok(wait_for_sql($node, "SELECT coalesce(sum(pending), 0) FROM eventgrid.delivery_statistics WHERE topic = 'shop'", '0'), 'nothing is pending once finished');

# --- SPEC 4 worked example: TTL 30 min, 10 attempts allowed ----------------------
sql("SELECT eventgrid.create_event_subscription('shop', 'ttl', '$u/status/500/ttl', event_ttl => 30, max_delivery_attempts => 10, deadletter => true)");
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '" . eg_event('t-1') . "')");
my $base = advance_clock($node, 0);
my @at = (0, 10, 40, 100, 400, 1000);    # attempt times in seconds after publish
for my $i (0 .. $#at)
{
	advance_clock($node, $at[$i] - ($i ? $at[ $i - 1 ] : 0)) if $i;
	ok(wait_recorded($node, 'ttl', $i + 1), "attempt " . ($i + 1) . " at $at[$i] s");
}
is(planned_wait($node, 'ttl'), 1800, 'after failure 6: 30 min, due at 46 min 40 s, past the TTL');
# 10 s short of the 7th attempt (the clock also runs while the test waits:
# 2 s short failed once under load)
advance_clock($node, 1790);
sleep 1;
is(sql("SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'ttl'"), '0',
	'TTL ran out at 30 min, but expiry is checked only at the next scheduled attempt');
advance_clock($node, 10);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'ttl'", '1'),
	'dead-lettered when the 7th attempt comes due');
is(scalar(requests($r, '/status/500/ttl')), 6, 'the 7th attempt is not sent');
$dl = $json->decode(sql("SELECT dead_letter_event FROM eventgrid.dead_letter_events WHERE subscription_name = 'ttl'"));
is_deeply([ @{$dl}{qw(id deadLetterReason deliveryAttempts lastDeliveryOutcome lastHttpStatusCode)} ],
	[ 't-1', 'TimeToLiveExceeded', 6, 'GenericError', 500 ], 'dead letter after 6 attempts: TimeToLiveExceeded');

# --- jitter: 0 to eventgrid.retry_jitter_percent of the step, floors kept -------
sql("ALTER SYSTEM SET eventgrid.retry_jitter_percent = 50; SELECT pg_reload_conf()");
sleep 1;
sql("SELECT eventgrid.create_topic('jitter')");
for my $i (1 .. 5)
{
	sql("SELECT eventgrid.create_event_subscription('jitter', 'jit-$i', '$u/status/500/jit-$i')");
	sql("SELECT eventgrid.create_event_subscription('jitter', 'jit503-$i', '$u/status/503/jit-$i')");
}
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('jitter', '" . eg_event('j-1') . "')");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries d JOIN eventgrid.event_subscriptions s ON s.id = d.subscription_id "
	  . "WHERE s.topic = 'jitter' AND d.attempts = 1 AND d.lease_owner IS NULL", '10'),
	'jitter: first attempts recorded');
my @waits = split /\n/, sql("SELECT extract(epoch FROM d.next_attempt_at - d.last_attempt_at) FROM eventgrid.retries d "
	  . "JOIN eventgrid.event_subscriptions s ON s.id = d.subscription_id WHERE s.name LIKE 'jit-%'");
# The wait runs from the attempt's start (last_attempt_at) to the failure's
# record plus the drawn delay: the request's own time comes on top of the 15 s
# (under a loaded CI machine it reached 0.01 s).
is(scalar(grep { $_ >= 10 && $_ <= 15.5 } @waits), 5, 'after failure 1 with 50 % jitter: between 10 and 15 s (plus the attempt\'s own time)')
  or diag("waits: @waits");
# (with no jitter all five would wait 10 s exactly; that five draws of up to
# 5 s all stay under 0.5 s is a chance of 1 in 100,000)
my %distinct = map { $_ => 1 } @waits;
ok(keys(%distinct) > 1 && (grep { $_ > 10.5 } @waits) > 0, 'the jitter is drawn: the five waits differ, and one is over 10.5 s')
  or diag("waits: @waits");
my @waits503 = split /\n/, sql("SELECT extract(epoch FROM d.next_attempt_at - d.last_attempt_at) FROM eventgrid.retries d "
	  . "JOIN eventgrid.event_subscriptions s ON s.id = d.subscription_id WHERE s.name LIKE 'jit503-%'");
is(scalar(grep { $_ >= 30 && $_ <= 45.5 } @waits503), 5, '503 with jitter: never below the 30 s floor')
  or diag("waits: @waits503");

$node->stop;
done_testing();
