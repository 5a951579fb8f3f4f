# Event subscriptions that expire (Event Grid's expirationTimeUtc, SPEC
# 17), against a real receiver and real consumers' calls:
#   - expiration_time on create_event_subscription() and
#     update_event_subscription(): NULL or 'infinity' never; a time not in
#     the future refused (22023, nothing written); shown in
#     event_subscriptions, delivery_statistics and
#     event_subscription_expiration_metrics;
#   - from that time on the delivery workers' clock nothing more is
#     delivered (events waiting at its position stay undelivered) or
#     received (a queue subscription's receivable events), while the other
#     subscriptions go on;
#   - the upkeep worker drops it as drop_event_subscription() would, logs
#     it once with its topic and name, and keeps its dead letters; also
#     when no worker runs at its time (the upkeep worker is started then);
#   - what it still owes then (events that waited at its position or in
#     its retries, a queue subscription's receivable and locked events) is
#     dead-lettered with reason SubscriptionExpired, or dropped and counted
#     when it does not dead-letter, and its final counts stay in
#     expired_event_subscriptions (0.21.0 lost them silently);
#   - a session holding its row does not make the upkeep worker wait: it is
#     passed over (and logged so) until the session lets go.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use JSON::PP qw(decode_json);
use Time::HiRes qw(usleep time);

my $node = new_node('expiration', 'eventgrid.worker_idle_timeout' => "'2s'");
my $r = start_receiver();
my $u = $r->{url};

sub sql { return $node->safe_psql('postgres', shift) }
sub fails { return sql_error($node, @_) }

sub publish
{
	my ($topic, $prefix, $n) = @_;
	sql("SELECT eventgrid.publish('$topic', '[" . join(',', map { eg_event("$prefix-$_") } 1 .. $n) . "]')");
}

# the ids of the events that arrived at $path
sub arrived
{
	my ($path) = @_;
	return join(',', sort map { $_->{id} } map { @{ decode_json($_->{body}) } } requests($r, $path));
}

# how many times the log says that subscription $name expired and was dropped
sub dropped_lines
{
	my ($name) = @_;
	my @lines = grep { /event subscription "\Q$name\E" of topic "\w+" expired at .* and was dropped/ }
	  split /\n/, slurp_file($node->logfile);
	return scalar @lines;
}

sql("CREATE ROLE ops LOGIN IN ROLE eventgrid_admin");
sql("SELECT eventgrid.create_topic('shop')");

# --- arguments ----------------------------------------------------------------
like(fails("SELECT eventgrid.create_event_subscription('shop', 'past', '$u/status/200/past', "
		  . "expiration_time => now() - interval '1 minute')"),
	qr/22023.*expiration time must be in the future/s, 'a time in the past is refused (22023)');
like(fails("SELECT eventgrid.create_event_subscription('shop', 'past', '$u/status/200/past', "
		  . "expiration_time => '-infinity')"),
	qr/22023.*expiration time must be in the future/s, '-infinity is refused');
is(sql("SELECT count(*) FROM eventgrid.event_subscriptions"), '0', 'nothing was written');
sql("SET ROLE ops; SELECT eventgrid.create_event_subscription('shop', 'never', '$u/status/200/never', "
	  . "expiration_time => 'infinity')");
is(sql("SELECT expiration_time IS NULL FROM eventgrid.event_subscriptions WHERE name = 'never'"), 't',
	"'infinity': never expires (NULL)");
sql("SELECT eventgrid.create_event_subscription('shop', 'keep', '$u/status/200/keep')");
sql("SELECT eventgrid.create_event_subscription('shop', 'trial', '$u/status/200/trial', deadletter => true, "
	  . "expiration_time => now() + interval '1 hour')");
like(fails("SELECT eventgrid.update_event_subscription('shop', 'trial', expiration_time => now() - interval '1 second')"),
	qr/22023.*expiration time must be in the future/s, 'update_event_subscription() refuses a past time too');
sql("SELECT eventgrid.update_event_subscription('shop', 'never', expiration_time => now() + interval '5 hours')");
is(sql("SELECT round(extract(epoch FROM expiration_time - now()) / 60) FROM eventgrid.event_subscriptions WHERE name = 'never'"),
	'300', 'update_event_subscription() sets an expiration time');
sql("SELECT eventgrid.update_event_subscription('shop', 'never', endpoint => '$u/status/200/never2')");
is(sql("SELECT expiration_time IS NOT NULL FROM eventgrid.event_subscriptions WHERE name = 'never'"), 't',
	'NULL keeps it');
sql("SELECT eventgrid.update_event_subscription('shop', 'never', expiration_time => 'infinity')");
is(sql("SELECT expiration_time IS NULL FROM eventgrid.event_subscriptions WHERE name = 'never'"), 't',
	"'infinity' clears it");
is(sql("SELECT subscription || ':' || coalesce(round(extract(epoch FROM expiration_time - now()) / 60)::text, 'never') "
		  . "FROM eventgrid.delivery_statistics ORDER BY 1"), "keep:never\nnever:never\ntrial:60",
	'delivery_statistics shows the expiration time');
is(sql("SELECT m.event_subscription || ':' || (m.expiration_timestamp_seconds = extract(epoch FROM s.expiration_time))"
		  . " FROM eventgrid.event_subscription_expiration_metrics m"
		  . " JOIN eventgrid.event_subscriptions s ON s.name = m.event_subscription"), 'trial:true',
	'event_subscription_expiration_metrics has the subscriptions that expire, as Unix time');

# --- delivered until it expires, with a dead letter ---------------------------
publish('shop', 'a', 3);
wait_for_requests($r, '/status/200/trial', 1);
wait_for_requests($r, '/status/200/keep', 3);
sql("SELECT eventgrid.update_event_subscription('shop', 'trial', endpoint => '$u/status/400/trial')");
publish('shop', 'dead', 1);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letter_events WHERE subscription_name = 'trial'", '1'),
	'trial dead-lettered an event (400)');
sql("SELECT eventgrid.update_event_subscription('shop', 'trial', endpoint => '$u/status/200/trial')");
ok(wait_for_sql($node, "SELECT sum(pending) FROM eventgrid.delivery_statistics", '0'), 'nothing pending');
is(arrived('/status/200/trial'), 'a-1,a-2,a-3', 'trial got what was published before it expired');

# --- expired on the workers' clock: nothing more is delivered ------------------
# A session holds trial's row (FOR NO KEY UPDATE: the delivery workers'
# claims and records go on, a DELETE waits), so that the upkeep worker's
# drop waits while events published after its time are delivered to the
# others: they must not reach it.
my ($in, $out) = ('', '');
my $holder = IPC::Run::start([ 'psql', '-X', '-q', '-At', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres') ],
	'<', \$in, '>', \$out, '2>', \my $err);
$in .= "BEGIN;\nSELECT 'held' FROM eventgrid.event_subscriptions WHERE name = 'trial' FOR NO KEY UPDATE;\n";
$holder->pump until $out =~ /held/;
advance_clock($node, 3600 + 60);
publish('shop', 'b', 3);
wait_for_requests($r, '/status/200/keep', 7);
ok(eventually_true(sub { slurp_file($node->logfile) =~ /event subscription "trial" of topic "shop" expired at \S+ \S+ and is not dropped yet/ }),
	'the upkeep worker passes over the subscription the session holds, and says so');
is(sql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'eventgrid upkeep worker' AND wait_event_type = 'Lock'"),
	'0', 'without waiting for its lock');
is(arrived('/status/200/trial'), 'a-1,a-2,a-3', 'expired, not dropped yet: what was published after its time did not reach it');
is(sql("SELECT pending FROM eventgrid.delivery_statistics WHERE subscription = 'trial'"), '3', 'those events wait for it');
$in .= "COMMIT;\n";
$holder->finish;
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.event_subscriptions WHERE name = 'trial'", '0'),
	'the upkeep worker dropped the expired subscription');
publish('shop', 'c', 2);
wait_for_requests($r, '/status/200/keep', 9);
usleep(500_000);
is(arrived('/status/200/trial'), 'a-1,a-2,a-3', 'nothing published after its time, nor what waited, reached it');
is(arrived('/status/200/keep'), 'a-1,a-2,a-3,b-1,b-2,b-3,c-1,c-2,dead-1', 'the other subscription got everything');
is(sql("SELECT string_agg(dead_letter_reason || ':' || (dead_letter_event->>'id') || ':' || delivery_attempts, ',' ORDER BY dead_letter_event->>'id') "
		  . "FROM eventgrid.dead_letter_events WHERE subscription_name = 'trial'"),
	'SubscriptionExpired:b-1:0,SubscriptionExpired:b-2:0,SubscriptionExpired:b-3:0,NonRetriableError:dead-1:1',
	'its dead letter is kept, and the events it still owed are dead-lettered: SubscriptionExpired');
is(sql("SELECT dead_letter_event->>'deadLetterReason' FROM eventgrid.dead_letter_events "
		  . "WHERE subscription_name = 'trial' AND dead_letter_event->>'id' = 'b-1'"), 'SubscriptionExpired',
	'the dead-letter document says so');
is(sql("SELECT concat_ws('|', topic, delivery_mode, deadletter, matched_events, delivered_events, dead_lettered_events, "
		  . "dropped_events, owed_at_expiration, expiration_time < dropped_at) FROM eventgrid.expired_event_subscriptions "
		  . "WHERE event_subscription = 'trial'"), 'shop|push|t|7|3|4|0|3|t',
	'its final counts stay in expired_event_subscriptions');
like(slurp_file($node->logfile), qr/DETAIL:  3 events it still owed were dead-lettered with reason SubscriptionExpired/,
	'the log says how many it owed');
is(sql("SELECT count(*) FROM eventgrid.subscription_positions p WHERE NOT EXISTS "
		  . "(SELECT 1 FROM eventgrid.event_subscriptions s WHERE s.id = p.subscription_id)"), '0',
	'its position went with it');
ok(eventually_true(sub { dropped_lines('trial') == 1 }), 'the drop was logged once, with its name and topic');
like(slurp_file($node->logfile), qr/event subscription "trial" of topic "shop" expired at \S+ \S+ and was dropped/,
	'the log line names it');

# --- pull: nothing more is received once it expired -----------------------------
sql("SELECT eventgrid.create_topic('shop-ns', 'CloudEventSchemaV1_0', 'namespace')");
# (an hour from now on the workers' clock, which the test moved ahead)
sql("SELECT eventgrid.create_event_subscription('shop-ns', 'q-trial', delivery_mode => 'queue', "
	  . "expiration_time => eventgrid._now() + interval '1 hour')");
sql("SELECT eventgrid.publish('shop-ns', '[" . join(',', map {
	qq({"specversion":"1.0","id":"q-$_","source":"/shop","type":"Shop.Order"}) } 1 .. 3) . "]')");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.queue_events", '3'), 'the queue subscription has 3 receivable events');
is(sql("SELECT count(*) FROM eventgrid.receive('shop-ns', 'q-trial', 1, 10)"), '1', 'received one before it expired');
# delivery_paused keeps the upkeep worker from dropping it, so that receive() meets it expired
$node->append_conf('postgresql.conf', "eventgrid.delivery_paused = on\n");
$node->reload;
usleep(500_000);
advance_clock($node, 3600 + 60);
my $t0 = time;
is(sql("SELECT count(*) FROM eventgrid.receive('shop-ns', 'q-trial', 10, 10)"), '0',
	'expired on the workers\' clock: receive() gets none of its 2 receivable events');
ok(time - $t0 >= 9, 'receive() waited its max_wait_time');
is(sql("SELECT count(*) FROM eventgrid.event_subscriptions WHERE name = 'q-trial'"), '1', 'not dropped while delivery is paused');
$node->append_conf('postgresql.conf', "eventgrid.delivery_paused = off\n");
$node->reload;
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.event_subscriptions WHERE name = 'q-trial'", '0'),
	'dropped once delivery_paused is off');
like(fails("SELECT * FROM eventgrid.receive('shop-ns', 'q-trial')"), qr/42704/, 'receive() then says it does not exist');
is(sql("SELECT count(*) FROM eventgrid.queue_events"), '0', 'its receivable events went with it');
is(sql("SELECT concat_ws('|', delivery_mode, deadletter, matched_events, delivered_events, dropped_events, owed_at_expiration) "
		  . "FROM eventgrid.expired_event_subscriptions WHERE event_subscription = 'q-trial'"), 'queue|f|3|0|3|3',
	'without dead-lettering, the 3 it owed (1 locked by a consumer, 2 receivable) are counted as dropped');
is(sql("SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'q-trial'"), '0', 'and not dead-lettered');

# --- no worker runs at its time: the upkeep worker is started then --------------
# (real time: the workers' clock is ahead by the offset the test moved it)
sql("SELECT eventgrid.create_event_subscription('shop', 'brief', '$u/status/200/brief', "
	  . "expiration_time => eventgrid._now() + interval '10 seconds')");
ok(wait_for_sql($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type LIKE 'eventgrid % worker'", '0', 9),
	'the database\'s workers left (idle) before it expired');
is(sql("SELECT count(*) FROM eventgrid.event_subscriptions WHERE name = 'brief'"), '1', 'not expired yet');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.event_subscriptions WHERE name = 'brief'", '0', 30),
	'dropped at its time by an upkeep worker started for it');
ok(eventually_true(sub { dropped_lines('brief') == 1 }), 'logged once');
is(dropped_lines('trial'), 1, 'the first drop is still logged only once');

done_testing();

# whether $check returns true within 10 seconds
sub eventually_true
{
	my ($check) = @_;
	for (1 .. 100)
	{
		return 1 if $check->();
		usleep(100_000);
	}
	return 0;
}
