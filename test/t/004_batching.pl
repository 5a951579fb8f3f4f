# Output batching (SPEC 5) and batched delivery schemas (SPEC 8) against a
# receiver that counts events and bytes per request: max_events_per_batch is
# never exceeded, preferred_batch_size_in_kilobytes is a ceiling except for a
# lone oversize event, defaults come from GUCs when one setting is given, a
# lone event is not held back, and a failing batch is retried and
# dead-lettered as a whole.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use List::Util qw(max sum);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('batching', 'eventgrid.default_max_events_per_batch' => 3,
	'eventgrid.default_preferred_batch_size_in_kilobytes' => "'8kB'");
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', shift) }

# Publishes $n Event Grid events of about $bytes bytes each to $topic.
sub publish_many
{
	my ($topic, $prefix, $n, $bytes) = @_;
	sql("INSERT INTO eventgrid.events (topic, event) SELECT '$topic', jsonb_build_object("
		  . "'id', '$prefix-' || i, 'subject', '/s/' || i, 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', "
		  . "'data', jsonb_build_object('pad', repeat('x', $bytes))) FROM generate_series(1, $n) i");
}

sub batches
{
	my $path = shift;
	return map { { n => scalar(@{ $json->decode($_->{body}) }), bytes => length($_->{body}), req => $_ } } requests($r, $path);
}

sub wait_done
{
	my $topic = shift;
	return wait_for_sql($node, "SELECT coalesce(sum(pending), 0) FROM eventgrid.delivery_statistics WHERE topic = '$topic'", '0', 120);
}

sql("SELECT eventgrid.create_topic('shop')");

# --- max_events_per_batch is never exceeded ----------------------------------
# the subscriptions are created while the worker is busy elsewhere, so that
# the whole backlog is due at once
sql("SELECT eventgrid.create_event_subscription('shop', 'max10', '$u/status/200/max10', max_events_per_batch => 10)");
publish_many('shop', 'm', 95, 100);
ok(wait_done('shop'), 'max10: all events delivered');
my @b = batches('/status/200/max10');
is(sum(map { $_->{n} } @b), 95, 'max10: every event arrived once');
ok(max(map { $_->{n} } @b) <= 10, 'max10: no batch above 10 events');
ok(max(map { $_->{n} } @b) == 10, 'max10: full batches of 10 when the events are there');
is($b[0]{req}{headers}{'content-type'}, 'application/json; charset=utf-8', 'Event Grid batch content type');
sql("SELECT eventgrid.drop_event_subscription('shop', 'max10')");

# --- preferred size is a ceiling; a lone oversize event goes alone ------------
sql("SELECT eventgrid.create_event_subscription('shop', 'size4k', '$u/status/200/size4k', max_events_per_batch => 100, preferred_batch_size_in_kilobytes => 4)");
publish_many('shop', 's', 40, 1000);
publish_many('shop', 'big', 1, 10 * 1024);
ok(wait_done('shop'), 'size4k: all events delivered');
@b = batches('/status/200/size4k');
is(sum(map { $_->{n} } @b), 41, 'size4k: every event arrived once');
ok(!grep({ $_->{n} > 1 && $_->{bytes} > 4096 } @b), 'size4k: no multi-event batch above 4 KB');
ok(max(map { $_->{n} } @b) >= 3, 'size4k: batches fill up to the ceiling');
my ($big) = grep { $json->decode($_->{req}{body})->[0]{id} eq 'big-1' } @b;
ok($big && $big->{n} == 1 && $big->{bytes} > 10 * 1024, 'the 10 KB event with a 4 KB preference arrives alone, not dropped');
sql("SELECT eventgrid.drop_event_subscription('shop', 'size4k')");

# --- only one setting: the other from the GUC defaults ------------------------
sql("SELECT eventgrid.create_event_subscription('shop', 'only-size', '$u/status/200/only-size', preferred_batch_size_in_kilobytes => 1024)");
sql("SELECT eventgrid.create_event_subscription('shop', 'only-count', '$u/status/200/only-count', max_events_per_batch => 1000)");
publish_many('shop', 'd', 20, 1000);
ok(wait_done('shop'), 'defaults: all events delivered');
@b = batches('/status/200/only-size');
is(sum(map { $_->{n} } @b), 20, 'only-size: every event arrived');
is(max(map { $_->{n} } @b), 3, 'only-size: eventgrid.default_max_events_per_batch (3) applies');
@b = batches('/status/200/only-count');
is(sum(map { $_->{n} } @b), 20, 'only-count: every event arrived');
ok(!grep({ $_->{n} > 1 && $_->{bytes} > 8192 } @b) && max(map { $_->{n} } @b) > 3,
	'only-count: eventgrid.default_preferred_batch_size_in_kilobytes (8 kB) applies');
sql("SELECT eventgrid.drop_event_subscription('shop', s) FROM unnest(ARRAY['only-size', 'only-count']) s");

# --- a lone event is not held back to fill a batch ----------------------------
sql("SELECT eventgrid.create_event_subscription('shop', 'lone', '$u/status/200/lone', max_events_per_batch => 5000, preferred_batch_size_in_kilobytes => 1024)");
publish_many('shop', 'l', 1, 10);
my @lone = wait_for_requests($r, '/status/200/lone', 1, 20);
is(scalar(@lone), 1, 'a lone event goes out at once in a batch of one');
ok(wait_done('shop'), 'lone: delivered');
sql("SELECT eventgrid.drop_event_subscription('shop', 'lone')");

# --- all or none: a failing batch is retried and dead-lettered whole -----------
sql("SELECT eventgrid.create_event_subscription('shop', 'failing', '$u/status/500/failing', max_events_per_batch => 10, max_delivery_attempts => 2, deadletter => true)");
publish_many('shop', 'f', 5, 10);
my @first = wait_for_requests($r, '/status/500/failing', 1, 20);
is(scalar(@first), 1, 'failing: one request for the five events');
is(scalar(@{ $json->decode($first[0]{body}) }), 5, 'failing: the batch holds all five');
ok(wait_for_sql($node, "SELECT count(*) || ' ' || min(attempts) || ' ' || max(attempts) || ' ' || count(DISTINCT next_attempt_at) FROM eventgrid.retries", '5 1 1 1'),
	'failing: every event of the batch advanced together to the same retry time');
advance_clock($node, 10);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'failing'", '5'),
	'failing: dead-lettered as a whole after the second attempt');
my @second = requests($r, '/status/500/failing');
is(scalar(@second), 2, 'failing: retried as one request');
is(scalar(@{ $json->decode($second[1]{body}) }), 5, 'failing: the retry carries the whole batch');
is($second[1]{headers}{'aeg-delivery-count'}, '1', 'failing: retry counted');
is(sql("SELECT string_agg(DISTINCT dead_letter_event->>'deadLetterReason' || ' ' || (dead_letter_event->>'deliveryAttempts') || ' ' || (dead_letter_event->>'lastDeliveryOutcome'), ',') FROM eventgrid.dead_letter_events WHERE subscription_name = 'failing'"),
	'MaxDeliveryAttemptsExceeded 2 GenericError', 'each batched event is its own dead letter with the batch attempts and outcome');
is(sql("SELECT string_agg(dead_letter_event->>'id', ',' ORDER BY dead_letter_event->>'id') FROM eventgrid.dead_letter_events WHERE subscription_name = 'failing'"),
	'f-1,f-2,f-3,f-4,f-5', 'the dead letters are the five events');

# --- batched CloudEvents and custom schema -------------------------------------
sql("SELECT eventgrid.create_topic('ce-topic', 'CloudEventSchemaV1_0')");
sql("SELECT eventgrid.create_topic('raw-topic', 'CustomEventSchema')");
sql("SELECT eventgrid.create_event_subscription('ce-topic', 'ce-batch', '$u/status/200/ce-batch', max_events_per_batch => 50)");
sql("SELECT eventgrid.create_event_subscription('raw-topic', 'raw-batch', '$u/status/200/raw-batch', max_events_per_batch => 50)");
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'ce-topic', jsonb_build_object('id', 'c' || i, 'source', '/s', 'specversion', '1.0', 'type', 'T') FROM generate_series(1, 4) i");
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'raw-topic', jsonb_build_object('n', i) FROM generate_series(1, 4) i");
ok(wait_done('ce-topic') && wait_done('raw-topic'), 'batched CloudEvents and custom events delivered');
my @ce = requests($r, '/status/200/ce-batch');
ok(@ce && !grep({ $_->{headers}{'content-type'} ne ($json->decode($_->{body}) && ref($json->decode($_->{body})) eq 'ARRAY' ? 'application/cloudevents-batch+json; charset=utf-8' : 'application/cloudevents+json; charset=utf-8') } @ce),
	'CloudEvents: a batch is a JSON array sent as application/cloudevents-batch+json');
is(sum(map { my $b = $json->decode($_->{body}); ref $b eq 'ARRAY' ? scalar @$b : 1 } @ce), 4, 'CloudEvents: every event arrived');
my @raw = requests($r, '/status/200/raw-batch');
is(sum(map { my $b = $json->decode($_->{body}); ref $b eq 'ARRAY' ? scalar @$b : 1 } @raw), 4, 'custom schema: every event arrived');
ok(grep({ ref($json->decode($_->{body})) eq 'ARRAY' } @raw), 'custom schema: a batch is a JSON array');

# --- the documentation's CLI example under load: 1000 events, 512 KB -------------
sql("SELECT eventgrid.create_event_subscription('shop', 'cli', '$u/status/200/cli', max_events_per_batch => 1000, preferred_batch_size_in_kilobytes => 512)");
publish_many('shop', 'cli', 5000, 900);
ok(wait_done('shop'), 'cli: 5000 events delivered');
@b = batches('/status/200/cli');
is(sum(map { $_->{n} } @b), 5000, 'cli: every event arrived once');
ok(max(map { $_->{n} } @b) <= 1000, 'cli: no batch above 1000 events');
ok(!grep({ $_->{n} > 1 && $_->{bytes} > 512 * 1024 } @b), 'cli: no batch above 512 KB');
ok(max(map { $_->{bytes} } @b) > 256 * 1024, 'cli: batches of hundreds of kilobytes under load');

$node->stop;
done_testing();
