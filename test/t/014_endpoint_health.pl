# Delayed delivery (SPEC 6): an endpoint whose delivery attempts keep failing
# is put on probation; nothing is sent to it meanwhile, retries and new
# events alike, which are recorded with outcome Probation; after the
# probation one request probes it; a failed probe starts a longer probation,
# a successful one ends it.  Probation length by the error that caused it,
# time-to-live and maximum attempts running out while held, the view
# eventgrid.endpoint_health, and one log line per change of state.  The
# worker's clock is moved with eventgrid.clock_offset.
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

my $node = new_node('health');
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', shift) }

sub health
{
	my ($sub, $cols) = @_;
	return sql("SELECT $cols FROM eventgrid.endpoint_health WHERE subscription = '$sub'");
}

sub publish
{
	my ($topic, @ids) = @_;
	sql("SELECT eventgrid.publish('$topic', '[" . join(',', map { eg_event($_) } @ids) . "]')");
}

sub log_lines
{
	my $pattern = shift;
	return scalar(grep { /$pattern/ } split /\n/, slurp_file($node->logfile));
}

sub retry_of
{
	my ($sub, $id, $cols) = @_;
	return sql("SELECT $cols FROM eventgrid.retries d JOIN eventgrid.event_subscriptions s ON s.id = d.subscription_id"
		  . " WHERE s.name = '$sub' AND d.event->>'id' = '$id'");
}

# --- 1. the contract's example: the first 10 events to an endpoint all fail
# 11 answers 503 (Busy), then 200
my $busy_path = '/seq/' . join(',', (503) x 11, 200) . '/busy';
sql("SELECT eventgrid.create_topic('shop')");
sql("SELECT eventgrid.create_event_subscription('shop', 'busy', '$u$busy_path')");
is(health('busy', 'state'), 'healthy', 'a new endpoint is healthy');
publish('shop', map { "b-$_" } 1 .. 9);
ok(wait_for_sql($node, "SELECT consecutive_failures FROM eventgrid.endpoint_health WHERE subscription = 'busy'", '9'),
	'nine failures in a row are counted');
is(health('busy', 'state'), 'healthy', 'nine failures: not yet on probation');
publish('shop', 'b-10');
ok(wait_for_sql($node, "SELECT state FROM eventgrid.endpoint_health WHERE subscription = 'busy'", 'probation'),
	'the tenth failure in a row puts the endpoint on probation');
is(health('busy', "consecutive_failures || ' ' || probation_cause || ' ' || probations || ' '"
		  . " || extract(epoch FROM probation_until - probation_started_at)::int"),
	'10 Busy 1 10', 'Busy: probation of 10 s, cause and count shown');
is(log_lines('the endpoint of event subscription "busy" \(http://127.0.0.1:\d+\) is on probation for 10 s after 10 consecutive failed delivery attempts \(last outcome Busy\)'),
	1, 'entering probation is logged once');

# a new event is held: recorded with outcome Probation, nothing sent
publish('shop', 'b-11');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries d JOIN eventgrid.event_subscriptions s ON s.id = d.subscription_id"
		  . " WHERE s.name = 'busy' AND d.event->>'id' = 'b-11' AND d.lease_owner IS NULL", '1'),
	'a new event for an endpoint on probation becomes a retry');
is(retry_of('busy', 'b-11', "attempts || ' ' || last_outcome || ' ' || coalesce(last_http_status::text, '-') || ' '"
		  . " || extract(epoch FROM next_attempt_at - last_attempt_at)::int"),
	'1 Probation - 10', 'held: one attempt with outcome Probation, no status, due on the schedule (10 s)');
is(scalar(requests($r, $busy_path)), 10, 'held: nothing was sent');
is(sql("SELECT failed_attempts FROM eventgrid.delivery_statistics WHERE subscription = 'busy'"), '10',
	'held attempts are not counted as failed requests');

# the probation is over at +10 s: b-11 is due again and goes alone, as the probe; it fails
advance_clock($node, 10);
ok(scalar(wait_for_requests($r, $busy_path, 11, 30)) == 11, 'after the probation one request probes the endpoint');
ok(wait_for_sql($node, "SELECT probations FROM eventgrid.endpoint_health WHERE subscription = 'busy'", '2'),
	'the failed probe starts the next probation');
is(health('busy', "state || ' ' || probation_cause"), 'probation Busy', 'still on probation');
ok(wait_for_sql($node, "SELECT attempts || ' ' || last_outcome FROM eventgrid.retries d JOIN eventgrid.event_subscriptions s"
		  . " ON s.id = d.subscription_id WHERE s.name = 'busy' AND d.event->>'id' = 'b-11' AND d.lease_owner IS NULL",
		'2 Busy'), 'the probe is an attempt like any other');
is(retry_of('busy', 'b-11', "extract(epoch FROM (SELECT probation_until FROM eventgrid.endpoint_states) - last_attempt_at)::int"),
	'20', 'growth: the second probation in a row lasts twice the first (20 s)');
sleep 1;
is(scalar(requests($r, $busy_path)), 11, 'the probe went alone');
is(log_lines('subscription "busy" .* is on probation'), 1, 'a renewed probation is not logged again');

# +30 s: the ten Busy retries are due, the probation is over; the first is the probe and succeeds
advance_clock($node, 20);
ok(wait_for_sql($node, "SELECT state FROM eventgrid.endpoint_health WHERE subscription = 'busy'", 'healthy'),
	'a successful probe ends the probation');
is(health('busy', "consecutive_failures || ' ' || probations || ' ' || (probation_until IS NULL)"), '0 0 true',
	'healthy: the counts start again');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.endpoint_states", '0'), 'a healthy endpoint needs no row');
is(log_lines('the endpoint of event subscription "busy" \(http://127.0.0.1:\d+\) is healthy again: a delivery attempt succeeded after 2 probations'), 1,
	'leaving probation is logged once');
# the others, held while the probe was in flight, go at their next due time
advance_clock($node, 60);
ok(wait_for_sql($node, "SELECT delivered || '/' || pending FROM eventgrid.delivery_statistics WHERE subscription = 'busy'", '11/0'),
	'every event is delivered once the endpoint is healthy');
is(scalar(grep { $_->{status} == 200 } requests($r, $busy_path)), 11, 'each event was delivered exactly once');
my @health_lines = grep { /eventgrid: the endpoint of/ } split /\n/, slurp_file($node->logfile);
ok(@health_lines == 2 && !(grep { m{/seq/} } @health_lines), 'log lines show the endpoint\'s host, never its path or query');
sql("SELECT eventgrid.drop_event_subscription('shop', 'busy')");

# --- 2. probation length by the error that caused it (2 failures in a row suffice here)
sql("ALTER SYSTEM SET eventgrid.probation_failures = 2; SELECT pg_reload_conf()");
my $refused = PostgreSQL::Test::Cluster::get_free_port();
my %cases = (
	'p-busy' => [ "$u/status/429/p-busy", 'Busy', 10 ],
	'p-notfound' => [ "$u/status/404/p-notfound", 'NotFound', 300 ],
	'p-socket' => [ "http://127.0.0.1:$refused/p-socket", 'SocketError', 30 ],
	'p-timeout' => [ "$u/hang/p-timeout", 'TimedOut', 10 ],
	'p-unauthorized' => [ "$u/status/401/p-unauthorized", 'Unauthorized', 300 ],
	'p-forbidden' => [ "$u/status/403/p-forbidden", 'Forbidden', 300 ],
	'p-generic' => [ "$u/status/500/p-generic", 'GenericError', 10 ],);
sql("SELECT eventgrid.create_topic('probe')");
sql("SELECT eventgrid.create_event_subscription('probe', '$_', '$cases{$_}[0]')") for sort keys %cases;
sql("SELECT eventgrid.create_event_subscription('probe', 'p-bad-request', '$u/status/400/p-bad-request')");
publish('probe', 'q-1', 'q-2');
for my $sub (sort keys %cases)
{
	ok(wait_for_sql($node, "SELECT state FROM eventgrid.endpoint_health WHERE subscription = '$sub'", 'probation'),
		"$sub: on probation after 2 failures");
	is(health($sub, "probation_cause || ' ' || extract(epoch FROM probation_until - probation_started_at)::int"),
		"$cases{$sub}[1] $cases{$sub}[2]", "$cases{$sub}[1]: probation of $cases{$sub}[2] s");
}
ok(wait_for_sql($node, "SELECT dropped FROM eventgrid.delivery_statistics WHERE subscription = 'p-bad-request'", '2'),
	'400: both events dropped');
is(health('p-bad-request', "state || ' ' || consecutive_failures"), 'healthy 0',
	'BadRequest is the event\'s problem, not the endpoint\'s: no failure counted');
sql("SELECT eventgrid.drop_event_subscription('probe', name) FROM eventgrid.event_subscriptions WHERE topic = 'probe'");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.endpoint_states", '0'),
	'the health of endpoints no subscription uses is forgotten');

# --- 3. time-to-live and maximum attempts run out while held (the worker's clock is 90 s ahead)
sql("SELECT eventgrid.create_topic('held')");
sql("SELECT eventgrid.create_event_subscription('held', 'ttl', '$u/status/404/ttl', event_ttl => 3, deadletter => true)");
sql("SELECT eventgrid.create_event_subscription('held', 'max2', '$u/status/404/max2', max_delivery_attempts => 2, deadletter => true)");
publish('held', 'h-1', 'h-2');
ok(wait_for_sql($node, "SELECT string_agg(state, ' ' ORDER BY subscription) FROM eventgrid.endpoint_health WHERE topic = 'held'",
		'probation probation'), 'both endpoints on probation (NotFound: 5 min)');
publish('held', 'h-3');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries WHERE event->>'id' = 'h-3' AND last_outcome = 'Probation'", '2'),
	'the new event is held for both');
is(retry_of('max2', 'h-3', "next_attempt_at = (SELECT probation_until FROM eventgrid.endpoint_health WHERE subscription = 'max2')"),
	't', 'a held delivery is due again when the probation ends, not before (the schedule alone says 10 s)');
# +10 s: max2's h-1 and h-2 are due for their second attempt, which is held: attempts run out
advance_clock($node, 10);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letter_events WHERE subscription_name = 'max2'", '2'),
	'max2: dead-lettered');
is(sql("SELECT string_agg(dead_letter_event->>'id' || ':' || (dead_letter_event->>'deadLetterReason') || ':'"
		  . " || (dead_letter_event->>'deliveryAttempts') || ':' || (dead_letter_event->>'lastDeliveryOutcome'), ' '"
		  . " ORDER BY dead_letter_event->>'id') FROM eventgrid.dead_letter_events WHERE subscription_name = 'max2'"),
	'h-1:MaxDeliveryAttemptsExceeded:2:Probation h-2:MaxDeliveryAttemptsExceeded:2:Probation',
	'attempts that run out while held: MaxDeliveryAttemptsExceeded, lastDeliveryOutcome Probation');
sql("SELECT eventgrid.drop_event_subscription('held', 'max2')");
# +5 min: the probation is over and ttl's events are due; they are past their
# time-to-live (3 min), checked at this attempt: dead-lettered, nothing sent (no probe)
advance_clock($node, 300);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letter_events WHERE subscription_name = 'ttl'", '3'),
	'ttl: every event dead-lettered');
is(sql("SELECT string_agg(dead_letter_event->>'id' || ':' || (dead_letter_event->>'deadLetterReason') || ':'"
		  . " || (dead_letter_event->>'lastDeliveryOutcome'), ' ' ORDER BY dead_letter_event->>'id')"
		  . " FROM eventgrid.dead_letter_events WHERE subscription_name = 'ttl'"),
	'h-1:TimeToLiveExceeded:Probation h-2:TimeToLiveExceeded:Probation h-3:TimeToLiveExceeded:Probation',
	'time-to-live runs on while held and is checked at the next due attempt');
is(scalar(requests($r, '/status/404/ttl')) . ' ' . scalar(requests($r, '/status/404/max2')), '2 2',
	'nothing was sent to either endpoint after its first two failures');

# --- 4. probation survives a restart of the worker
# (publish times come from the worker's clock too: ttl's new events are fresh, and held as well)
sql("SELECT eventgrid.create_event_subscription('held', 'restart', '$u/status/404/restart')");
publish('held', 'h-5', 'h-6');
ok(wait_for_sql($node, "SELECT state FROM eventgrid.endpoint_health WHERE subscription = 'restart'", 'probation'),
	'restart: on probation');
my $states = sql("SELECT endpoint || ' ' || state || ' ' || probations FROM eventgrid.endpoint_states ORDER BY 1");
sql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker'");
publish('held', 'h-7');
ok(wait_for_sql($node, "SELECT string_agg(s.name || ' ' || d.attempts || ' ' || d.last_outcome, ', ' ORDER BY s.name)"
		  . " FROM eventgrid.retries d"
		  . " JOIN eventgrid.event_subscriptions s ON s.id = d.subscription_id WHERE d.event->>'id' = 'h-7'",
		'restart 1 Probation, ttl 1 Probation'),
	'after a restart of the worker the endpoint is still on probation: a new event is held');
is(sql("SELECT endpoint || ' ' || state || ' ' || probations FROM eventgrid.endpoint_states ORDER BY 1"), $states,
	'the health is taken over as it was');
is(scalar(requests($r, '/status/404/restart')), 2, 'nothing sent after the restart');

$node->stop;
done_testing();
