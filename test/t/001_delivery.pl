# Delivery through the worker against a real receiver: success codes, request
# shape per delivery schema, aeg-* and custom headers, no-retry codes
# (dead-lettered or dropped), retried failures and their outcome names,
# timeouts and connection failures, wake-up at commit.  SPEC 2, 3, 7, 8.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('delivery');
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', shift) }

sql("SELECT eventgrid.create_topic('shop')");
sql("SELECT eventgrid.create_topic('ce-shop', 'CloudEventSchemaV1_0')");
sql("SELECT eventgrid.create_topic('raw-shop', 'CustomEventSchema')");

# --- each success code is a success, delivered once --------------------------
for my $code (200 .. 204)
{
	sql("SELECT eventgrid.create_event_subscription('shop', 'ok-$code', '$u/status/$code')");
}
# --- request shape and headers ------------------------------------------------
sql("SELECT eventgrid.create_event_subscription('shop', 'Hdrs-Sub', '$u/status/200/hdrs')");
sql("SELECT eventgrid.set_delivery_property('shop', 'Hdrs-Sub', 'X-Static', 'static-value')");
sql("SELECT eventgrid.set_delivery_property('shop', 'Hdrs-Sub', 'Authorization', 'Bearer s3cr3t', is_secret => true)");
sql("SELECT eventgrid.set_dynamic_delivery_property('shop', 'Hdrs-Sub', 'X-Order-Id', 'data.orderId')");
sql("SELECT eventgrid.set_dynamic_delivery_property('shop', 'Hdrs-Sub', 'X-Missing', 'data.nothing')");
sql("SELECT eventgrid.create_event_subscription('shop', 'as-cloudevents', '$u/status/200/eg-as-ce', event_delivery_schema => 'CloudEventSchemaV1_0')");
# --- no-retry codes, dead-lettered; and dropped without dead-lettering ---------
for my $code (400, 401, 403, 413)
{
	sql("SELECT eventgrid.create_event_subscription('shop', 'dl-$code', '$u/status/$code', deadletter => true)");
}
sql("SELECT eventgrid.create_event_subscription('shop', 'drop-400', '$u/status/400/drop')");
# --- retried failures ----------------------------------------------------------
for my $code (404, 408, 429, 500, 503)
{
	sql("SELECT eventgrid.create_event_subscription('shop', 'retry-$code', '$u/status/$code')");
}
my $unused = PostgreSQL::Test::Cluster::get_free_port();
sql("SELECT eventgrid.create_event_subscription('shop', 'refused', 'http://127.0.0.1:$unused/')");
sql("SELECT eventgrid.create_event_subscription('shop', 'reset', '$u/reset')");
sql("SELECT eventgrid.create_event_subscription('shop', 'slow', '$u/status/200/slow?delay_ms=4000')");
sql("SELECT eventgrid.create_event_subscription('shop', 'dns', 'http://nonexistent.invalid/')");

sql("INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '" . eg_event('o-1') . "')");
ok(wait_for_sql($node, "SELECT (SELECT sum(pending - retrying) FROM eventgrid.delivery_statistics) + (SELECT count(*) FROM eventgrid.retries WHERE lease_owner IS NOT NULL)", '0'),
	'every delivery was attempted');

for my $code (200 .. 204)
{
	my @got = requests($r, "/status/$code");
	is(scalar @got, 1, "status $code: one request, not retried");
}
is(sql("SELECT string_agg(subscription || '=' || delivered || '/' || pending, ',' ORDER BY subscription) FROM eventgrid.delivery_statistics WHERE subscription LIKE 'ok-%'"),
	'ok-200=1/0,ok-201=1/0,ok-202=1/0,ok-203=1/0,ok-204=1/0', 'statuses 200-204 count as delivered');

# request shape, Event Grid schema
my ($h) = requests($r, '/status/200/hdrs');
is($h->{headers}{'content-type'}, 'application/json; charset=utf-8', 'Event Grid schema content type');
is($h->{headers}{'aeg-event-type'}, 'Notification', 'aeg-event-type');
is($h->{headers}{'aeg-subscription-name'}, 'HDRS-SUB', 'aeg-subscription-name is upper-cased');
is($h->{headers}{'aeg-delivery-count'}, '0', 'aeg-delivery-count starts at 0');
is($h->{headers}{'aeg-metadata-version'}, '1', 'aeg-metadata-version');
is($h->{headers}{'aeg-data-version'}, '', 'aeg-data-version is the stamped empty dataVersion');
is($h->{headers}{'aeg-output-event-id'}, 'o-1', 'aeg-output-event-id');
is($h->{headers}{'user-agent'},
	'eventgrid-postgresql/' . sql("SELECT default_version FROM pg_available_extensions WHERE name = 'eventgrid'"),
	'User-Agent names the library and its version');
is($h->{headers}{'x-static'}, 'static-value', 'static delivery property sent');
is($h->{headers}{'authorization'}, 'Bearer s3cr3t', 'secret delivery property sent');
is($h->{headers}{'x-order-id'}, 'o-1', 'dynamic delivery property taken from data.orderId');
ok(!exists $h->{headers}{'x-missing'}, 'dynamic property of a missing field is left out');
my $body = $json->decode($h->{body});
is(ref $body, 'ARRAY', 'Event Grid schema body is a JSON array');
is(scalar @$body, 1, 'holding one event');
is($body->[0]{id}, 'o-1', 'the published event');
is($body->[0]{topic}, 'shop', 'stamped with its topic');
is($body->[0]{dataVersion}, '', 'stamped dataVersion');
is($body->[0]{metadataVersion}, '1', 'stamped metadataVersion');

# Event Grid schema delivered as CloudEvents
my ($ce) = requests($r, '/status/200/eg-as-ce');
is($ce->{headers}{'content-type'}, 'application/cloudevents+json; charset=utf-8', 'CloudEvents content type for one event');
is($ce->{headers}{'aeg-metadata-version'}, '1.0', 'aeg-metadata-version is the specversion');
ok(!exists $ce->{headers}{'aeg-data-version'}, 'no aeg-data-version for CloudEvents');
my $ceb = $json->decode($ce->{body});
is(ref $ceb, 'HASH', 'one CloudEvent is sent as a bare object');
is_deeply([ @{$ceb}{qw(specversion id source type subject)} ], [ '1.0', 'o-1', 'shop', 'Shop.OrderCreated', '/orders/o-1' ],
	'Event Grid fields mapped to CloudEvents attributes');

# no-retry codes
for my $code (400, 401, 403, 413)
{
	is(scalar(requests($r, "/status/$code")), 1, "status $code: not retried");
}
my %outcome = (400 => 'BadRequest', 401 => 'Unauthorized', 403 => 'Forbidden', 413 => 'PayloadTooLarge');
for my $code (sort keys %outcome)
{
	my $dl = $json->decode(sql("SELECT dead_letter_event FROM eventgrid.dead_letter_events WHERE subscription_name = 'dl-$code'"));
	is_deeply([ @{$dl}{qw(id deadLetterReason deliveryAttempts lastDeliveryOutcome lastHttpStatusCode)} ],
		[ 'o-1', 'NonRetriableError', 1, $outcome{$code}, $code ], "status $code dead-lettered at once");
	ok(defined $dl->{publishTime} && defined $dl->{lastDeliveryAttemptTime} && $dl->{subject} eq '/orders/o-1',
		"status $code dead letter keeps the event and its times");
}
is(sql("SELECT dropped || '/' || dead_lettered || '/' || pending FROM eventgrid.delivery_statistics WHERE subscription = 'drop-400'"),
	'1/0/0', 'no-retry status without dead-lettering: dropped and counted');

# retried failures keep their outcome and status, and wait
my %retry = (404 => 'NotFound', 408 => 'TimedOut', 429 => 'Busy', 500 => 'GenericError', 503 => 'Busy');
for my $code (sort keys %retry)
{
	is(sql("SELECT d.attempts || ' ' || d.last_outcome || ' ' || d.last_http_status FROM eventgrid.retries d JOIN eventgrid.event_subscriptions s ON s.id = d.subscription_id WHERE s.name = 'retry-$code'"),
		"1 $retry{$code} $code", "status $code: retried later, outcome $retry{$code}");
}
is(sql("SELECT string_agg(s.name || ' ' || d.last_outcome || ' ' || coalesce(d.last_http_status::text, '-'), ', ' ORDER BY s.name) FROM eventgrid.retries d JOIN eventgrid.event_subscriptions s ON s.id = d.subscription_id WHERE s.name IN ('refused', 'reset', 'slow', 'dns')"),
	'dns ResolutionError -, refused SocketError -, reset SocketError -, slow TimedOut -',
	'connection refused, reset, no answer in time and DNS failure');
is(sql("SELECT count(*) FROM eventgrid.retries WHERE event->>'id' = 'o-1' AND payload::jsonb->>'id' = 'o-1'"), '9',
	'only failures become retries, each with a copy of the event and of the text its receiver gets');

# --- CloudEvents and custom schema topics ------------------------------------
sql("SELECT eventgrid.create_event_subscription('ce-shop', 'ce-native', '$u/status/202/ce')");
sql("SELECT eventgrid.create_event_subscription('ce-shop', 'ce-as-eg', '$u/status/202/ce-as-eg', event_delivery_schema => 'EventGridSchema')");
sql("SELECT eventgrid.create_event_subscription('raw-shop', 'raw', '$u/status/200/raw')");
sql(q{INSERT INTO eventgrid.events (topic, event) VALUES
  ('ce-shop', '{"id": "c-1", "source": "/shop", "specversion": "1.0", "type": "Shop.OrderCreated", "subject": "orders/1", "data": {"n": 1}}'),
  ('raw-shop', '{"prop1": "my property", "prop2": 5}')});
my ($c1) = wait_for_requests($r, '/status/202/ce', 1);
is($c1->{headers}{'content-type'}, 'application/cloudevents+json; charset=utf-8', 'CloudEvents topic: structured content type');
is($json->decode($c1->{body})->{id}, 'c-1', 'CloudEvent delivered as published');
my ($c2) = wait_for_requests($r, '/status/202/ce-as-eg', 1);
my $c2b = $json->decode($c2->{body});
is_deeply([ ref $c2b, @{ $c2b->[0] }{qw(id topic eventType subject)} ], [ 'ARRAY', 'c-1', '/shop', 'Shop.OrderCreated', 'orders/1' ],
	'CloudEvent delivered in the Event Grid schema');
my ($raw) = wait_for_requests($r, '/status/200/raw', 1);
is_deeply($json->decode($raw->{body}), { prop1 => 'my property', prop2 => 5 }, 'custom schema event delivered as is');

# --- delivered events leave no residue ---------------------------------------
ok(wait_for_sql($node, "SELECT coalesce(sum(pending), 0) FROM eventgrid.delivery_statistics WHERE topic IN ('ce-shop', 'raw-shop')", '0'),
	'nothing is pending once delivered');

# --- a commit wakes the idle worker ------------------------------------------
# The idle worker sleeps until the next due retry (minutes away here) or 60 s;
# only the commit-time latch can bring this event over quickly.
sleep 2;
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('raw-shop', '{\"wake\": true}')");
my @woke = wait_for_requests($r, '/status/200/raw', 2, 20);
is(scalar @woke, 2, 'a committed INSERT wakes the worker');

# --- an event matching nothing is counted as unmatched ------------------------
sql("SELECT eventgrid.create_topic('lonely')");
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('lonely', '" . eg_event('l-1') . "')");
ok(wait_for_sql($node, "SELECT unmatched_events FROM eventgrid.topic_statistics WHERE topic = 'lonely'", '1'),
	'unmatched event counted');

# --- eventgrid.delivery_paused holds deliveries back until it is turned off ---
sql("ALTER SYSTEM SET eventgrid.delivery_paused = on; SELECT pg_reload_conf()");
sleep 1;
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('raw-shop', '{\"paused\": true}')");
sleep 2;
is(scalar(requests($r, '/status/200/raw')), 2, 'nothing is delivered while paused');
is(sql("SELECT pending || '/' || retrying FROM eventgrid.delivery_statistics WHERE subscription = 'raw'"),
	'1/0', 'the delivery waits, unattempted');
sql("ALTER SYSTEM SET eventgrid.delivery_paused = off; SELECT pg_reload_conf()");
is(scalar(wait_for_requests($r, '/status/200/raw', 3, 20)), 3, 'delivered once unpaused');

# --- the worker reports itself in pg_stat_activity -----------------------------
is(sql("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker'"), '1',
	'the delivery worker is visible in pg_stat_activity');

$node->stop;
done_testing();
