# A change takes effect when it commits, and a held subscription holds only
# its own (issue "Trust, second pass", items 3 and 4):
#  - after update_event_subscription(endpoint => ...), pause_delivery() or
#    drop_event_subscription() commits, no new request starts to the old
#    endpoint, the paused or the dropped subscription within about a
#    second; what was claimed and not sent goes back unsent and uncharged,
#    to the new endpoint, or once resumed;
#  - a paused subscription, or one whose endpoint waits for validation,
#    does not keep the event tables (and with them every topic's events)
#    from being emptied: its own events become its retries; one whose
#    validation failed keeps nothing.
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

# two requests at a time to the receiver, so that claimed requests wait in the worker
my $node = new_node('effect',
	'eventgrid.max_requests_per_endpoint' => 2,
	'eventgrid.response_timeout' => "'30s'",
	'eventgrid.event_table_rotation' => "'1s'");
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', shift) }

sub publish
{
	my ($topic, $prefix, $n) = @_;
	sql("SELECT eventgrid.publish('$topic', '[" . join(',', map { eg_event("$prefix-$_") } 1 .. $n) . "]')");
}

# arrival times at a path, and the distinct event ids that arrived there
sub times_at { return map { $_->{time} } requests($r, shift) }
sub ids_at { return map { $json->decode($_->{body})->[0]{id} } requests($r, shift) }

sub commit_time
{
	my ($sql) = @_;
	sql($sql);
	return time();
}

# --- a new endpoint: requests claimed for the old one and not started go to the new one
sql("SELECT eventgrid.create_topic('moves')");
sql("SELECT eventgrid.create_event_subscription('moves', 'moving', '$u/status/200/old?delay_ms=300')");
publish('moves', 'mv', 60);
wait_for_requests($r, '/status/200/old', 2, 30);
my $t0 = commit_time("SELECT eventgrid.update_event_subscription('moves', 'moving', endpoint => '$u/status/200/new')");
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'moving'", '60', 60),
	'new endpoint: all 60 delivered');
my @late = grep { $_ > $t0 + 1.0 } times_at('/status/200/old');
is(scalar(@late), 0, 'new endpoint: no request started to the old endpoint a second after the commit');
my %seen = map { $_ => 1 } ids_at('/status/200/old'), ids_at('/status/200/new');
is(scalar(keys %seen), 60, 'new endpoint: every event arrived, at the old or the new endpoint');
cmp_ok(scalar(requests($r, '/status/200/new')), '>=', 40, 'new endpoint: most went to the new endpoint');
is(sql("SELECT count(*) FROM eventgrid.delivery_attempts WHERE subscription = 'moving' AND (attempt > 1 OR outcome <> 'Delivered')"),
	'0', 'new endpoint: those put back were not charged an attempt');

# --- paused: nothing more starts; once resumed the rest goes
sql("SELECT eventgrid.create_topic('pauses')");
sql("SELECT eventgrid.create_event_subscription('pauses', 'pausing', '$u/status/200/pausing?delay_ms=300')");
publish('pauses', 'pa', 40);
wait_for_requests($r, '/status/200/pausing', 2, 30);
$t0 = commit_time("SELECT eventgrid.pause_delivery('pauses', 'pausing')");
sleep 3;
@late = grep { $_ > $t0 + 1.0 } times_at('/status/200/pausing');
is(scalar(@late), 0, 'paused: no request started a second after the commit');
my $before = scalar(requests($r, '/status/200/pausing'));
cmp_ok($before, '<', 40, "paused: $before of 40 went before the pause");
is(sql("SELECT pending FROM eventgrid.delivery_statistics WHERE subscription = 'pausing'"), 40 - $before,
	'paused: the others wait, none lost');
sql("SELECT eventgrid.resume_delivery('pauses', 'pausing')");
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'pausing'", '40', 60),
	'resumed: all 40 delivered');
%seen = ();
$seen{$_}++ for ids_at('/status/200/pausing');
is(scalar(keys %seen) . ' ' . scalar(grep { $_ > 1 } values %seen), '40 0', 'resumed: each event arrived once');

# --- dropped: nothing more starts
sql("SELECT eventgrid.create_topic('drops')");
sql("SELECT eventgrid.create_event_subscription('drops', 'dropping', '$u/status/200/dropping?delay_ms=300')");
publish('drops', 'dr', 40);
wait_for_requests($r, '/status/200/dropping', 2, 30);
$t0 = commit_time("SELECT eventgrid.drop_event_subscription('drops', 'dropping')");
sleep 3;
@late = grep { $_ > $t0 + 1.0 } times_at('/status/200/dropping');
is(scalar(@late), 0, 'dropped: no request started a second after the commit');
cmp_ok(scalar(requests($r, '/status/200/dropping')), '<', 40, 'dropped: the rest was never sent');

# --- held subscriptions do not pin the event tables
sql("SELECT eventgrid.create_topic('quiet'); SELECT eventgrid.create_topic('busy')");
sql("SELECT eventgrid.create_event_subscription('quiet', 'held', '$u/status/200/held')");
sql("SELECT eventgrid.pause_delivery('quiet', 'held')");
sql("SELECT eventgrid.create_event_subscription('quiet', 'manual', '$u/validate/manual/m', endpoint_validation => 'handshake')");
sql("SELECT eventgrid.create_event_subscription('quiet', 'refused', '$u/status/404/r', endpoint_validation => 'handshake')");
sql("SELECT eventgrid.create_event_subscription('busy', 'fast', '$u/status/200/fast')");
ok(wait_for_sql($node, "SELECT provisioning_state FROM eventgrid.event_subscription_validation WHERE subscription = 'manual'",
	'AwaitingManualAction', 30), 'held: one subscription awaits manual validation');
ok(wait_for_sql($node, "SELECT provisioning_state FROM eventgrid.event_subscription_validation WHERE subscription = 'refused'",
	'Failed', 40), 'held: one subscription\'s validation failed');
publish('quiet', 'q', 5);
for my $b (1 .. 10)
{
	sql("INSERT INTO eventgrid.events (topic, event) SELECT 'busy', jsonb_build_object('id', 'b-$b-' || i, 'subject', '/b',"
		  . " 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('pad', repeat('x', 500)))"
		  . " FROM generate_series(1, 2000) i");
}
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'fast'", '20000', 120),
	'held: the busy topic\'s 20,000 events are delivered');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.events", '0', 30),
	'held: the event tables are emptied while one subscription is paused and one awaits validation');
is(sql("SELECT string_agg(subscription || ' ' || pending || ' ' || retrying, ', ' ORDER BY subscription)"
		  . " FROM eventgrid.delivery_statistics WHERE topic = 'quiet'"),
	'held 5 5, manual 5 5, refused 0 0',
	'held: their own events became their retries; the one whose validation failed keeps nothing');
sql("SELECT eventgrid.resume_delivery('quiet', 'held')");
is(scalar(wait_for_requests($r, '/status/200/held', 5, 30)), 5, 'held: resumed, its 5 events arrive');
ok(wait_for_sql($node, "SELECT pending FROM eventgrid.delivery_statistics WHERE subscription = 'held'", '0', 30),
	'held: and nothing is left');
is(scalar(requests($r, '/status/200/held')), 5, 'held: each once');
my $code = $json->decode((requests($r, '/validate/manual/m'))[0]{body})->[0]{data}{validationCode};
sql("SELECT eventgrid.validate_event_subscription('quiet', 'manual', '$code')");
is(scalar(grep { ($_->{headers}{'aeg-event-type'} // '') eq 'Notification' } wait_for_requests($r, '/validate/manual/m', 6, 30)), 5,
	'held: validated by hand, the 5 events that waited arrive');

$node->stop;
done_testing();
