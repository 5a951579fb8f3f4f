# The upkeep worker never stalls on one object (issue "Trust, fifth pass",
# item 4).  A consumer holds BEGIN; SELECT eventgrid.renew_locks(...) open
# on a queue event subscription that then expires, for a minute; 0.21.0's
# upkeep waited for its lock timeout on the drop, abandoned the round and
# tried the drop first again the next round, so no event table of any
# topic was emptied meanwhile.  Here:
#   - the expired subscription is passed over (logged so, without waiting
#     for its lock) while the consumer's transaction is open;
#   - the event tables keep turning meanwhile: each one the consumer's
#     transaction does not hold is emptied, again and again, while another
#     topic publishes and is delivered;
#   - once the consumer lets go, the subscription is dropped at the next
#     round, the event it held locked and the ones still receivable settled
#     as SubscriptionExpired dead letters, and the consumer's late
#     acknowledgement finds no subscription.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep time);

my $hold_seconds = 60;
my $node = new_node('upkeep_locks', 'eventgrid.event_table_rotation' => "'2s'");
my $r = start_receiver();
sub sql { return $node->safe_psql('postgres', shift) }

sql("SELECT eventgrid.create_topic('jobs', 'CloudEventSchemaV1_0', 'namespace')");
sql("SELECT eventgrid.create_event_subscription('jobs', 'workers', delivery_mode => 'queue', deadletter => true, "
	  . "expiration_time => eventgrid._now() + interval '1 hour')");
sql("SELECT eventgrid.create_topic('orders')");
sql("SELECT eventgrid.create_event_subscription('orders', 'hook', '$r->{url}/status/200/hook')");
sql("SELECT eventgrid.publish('jobs', '[" . join(',', map {
	qq({"specversion":"1.0","id":"j$_","source":"/jobs","type":"Job"}) } 1 .. 3) . "]')");
ok(wait_for_sql($node, "SELECT receivable_events FROM eventgrid.queue_metrics WHERE event_subscription = 'workers'", '3'),
	'3 events receivable');
my $token = sql("SELECT lock_token FROM eventgrid.receive('jobs', 'workers', 1, 10)");
like($token, qr/\S/, 'a consumer received one');

# the consumer renews its lock in a transaction it keeps open
my ($in, $out) = ('', '');
my $consumer = IPC::Run::start([ 'psql', '-X', '-q', '-At', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres') ],
	'<', \$in, '>', \$out, '2>', \my $err);
$in .= "BEGIN;\nSELECT 'renewed:' || succeeded FROM eventgrid.renew_locks('jobs', 'workers', ARRAY['$token']);\n";
$consumer->pump until $out =~ /renewed:(\w+)/;
is($1, 'true', 'and renews its lock in a transaction it keeps open');

advance_clock($node, 3600 + 60);
my $t0 = time;
my %truncations;	# event table => how many different truncated_at it showed
my %seen;
my $n = 0;
while (time - $t0 < $hold_seconds)
{
	$n++;
	sql("SELECT eventgrid.publish('orders', '[" . eg_event("o$n") . "]')");
	for my $row (split /\n/, sql("SELECT event_table || '|' || coalesce(truncated_at::text, '') FROM eventgrid.event_tables"))
	{
		my ($t, $at) = split /\|/, $row, 2;
		$truncations{$t}++ if $at ne '' && !$seen{"$t|$at"}++;
	}
	usleep(500_000);
}
is(sql("SELECT count(*) FROM eventgrid.event_subscriptions WHERE name = 'workers'"), '1',
	"expired a minute ago, held by the consumer's transaction: not dropped yet");
like(slurp_file($node->logfile), qr/event subscription "workers" of topic "jobs" expired at \S+ \S+ and is not dropped yet/,
	'the log says why');
is(sql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'eventgrid upkeep worker' AND wait_event_type = 'Lock'"),
	'0', 'the upkeep worker does not wait for the lock');
my $emptied = grep { $truncations{$_} >= 3 } keys %truncations;
ok($emptied >= 2, "meanwhile the event tables kept turning: $emptied tables emptied 3 times or more in $hold_seconds s")
  or diag(explain(\%truncations));
ok(wait_for_requests($r, '/status/200/hook', $n), "and the other topic's $n events were delivered");

$in .= "COMMIT;\n";
$consumer->finish;
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.event_subscriptions WHERE name = 'workers'", '0', 30),
	'the consumer let go: the subscription is dropped');
is(sql("SELECT string_agg((dead_letter_event->'event'->>'id') || ':' || dead_letter_reason, ',' ORDER BY dead_letter_event->'event'->>'id') "
		  . "FROM eventgrid.dead_letter_events WHERE subscription_name = 'workers'"),
	'j1:SubscriptionExpired,j2:SubscriptionExpired,j3:SubscriptionExpired',
	'the event the consumer held and the two still receivable are dead-lettered: SubscriptionExpired');
is(sql("SELECT concat_ws('|', matched_events, dead_lettered_events, owed_at_expiration) FROM eventgrid.expired_event_subscriptions"),
	'3|3|3', 'its final counts are kept');
like(sql_error($node, "SELECT * FROM eventgrid.acknowledge('jobs', 'workers', ARRAY['$token'])"), qr/42704/,
	'the late acknowledgement finds no subscription');

$node->stop;
done_testing();
