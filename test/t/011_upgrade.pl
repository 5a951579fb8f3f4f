# ALTER EXTENSION eventgrid UPDATE from 0.1.0 (a row per delivery) to 0.2.0
# (event tables, positions, retries) and on to the current version (0.3.0:
# endpoint health; 0.4.0: advanced filters and namespace topics; 0.5.0:
# attempt history and metrics; 0.6.0: the pending count by index ranges):
# configuration, queued deliveries, attempts already made and dead letters
# survive, and the queue is delivered.  Issues: "Queue storage" (0.2.0 with
# an upgrade script) and "Endpoint health" (0.3.0).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('upgrade');
$node->init;
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'eventgrid'\neventgrid.retry_jitter_percent = 0\n");
$node->start;
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', shift) }

# --- a 0.1.0 installation: the library (of a later version) waits for the update meanwhile
sql("CREATE EXTENSION eventgrid VERSION '0.1.0'");
sql("SELECT eventgrid.create_topic('shop')");
sql("SELECT eventgrid.create_topic('lonely')");
sql("SELECT eventgrid.create_event_subscription('shop', 'all', '$u/status/200/all')");
sql("SELECT eventgrid.create_event_subscription('shop', 'created', '$u/status/200/created', included_event_types => ARRAY['Shop.OrderCreated'], deadletter => true)");
sql("SELECT eventgrid.set_delivery_property('shop', 'all', 'X-Key', 'k1', is_secret => true)");
sql("SELECT eventgrid.publish('shop', '[" . join(',', map { eg_event("old-$_") } 1 .. 4) . "]')");
sql("SELECT eventgrid.publish('lonely', '" . eg_event('alone') . "')");
# one delivery had failed twice already, another was in flight when the worker stopped
sql("UPDATE eventgrid.deliveries d SET attempts = 2, last_outcome = 'GenericError', last_http_status = 500,"
	  . " last_attempt_at = now() - interval '1 minute', next_attempt_at = now() - interval '1 second'"
	  . " FROM eventgrid.events e, eventgrid.event_subscriptions s"
	  . " WHERE e.id = d.event_id AND s.id = d.subscription_id AND s.name = 'all' AND e.event->>'id' = 'old-1'");
sql("UPDATE eventgrid.deliveries d SET lease_owner = 424242, next_attempt_at = now() + interval '1 hour'"
	  . " FROM eventgrid.events e, eventgrid.event_subscriptions s"
	  . " WHERE e.id = d.event_id AND s.id = d.subscription_id AND s.name = 'all' AND e.event->>'id' = 'old-2'");
sql("INSERT INTO eventgrid.requests_in_flight (lease_owner, wave, delivery_ids)"
	  . " SELECT 424242, 1, array_agg(id) FROM eventgrid.deliveries WHERE lease_owner = 424242");
# and an earlier dead letter
sql("INSERT INTO eventgrid.dead_letters (topic, subscription_name, subscription_id, input_schema, event_delivery_schema,"
	  . " event, dead_letter_reason, delivery_attempts, last_delivery_outcome, last_http_status_code, publish_time,"
	  . " last_delivery_attempt_time) VALUES ('shop', 'created', 2, 'EventGridSchema', 'EventGridSchema', '"
	  . eg_event('dead-1') . "', 'NonRetriableError', 1, 'BadRequest', 400, now(), now())");
is(sql("SELECT count(*) FROM eventgrid.deliveries"), '9', '0.1.0: four events for two subscriptions and one unmatched queued');
sleep 1;
is(scalar(requests($r)), 0, '0.1.0 schema with a later library: the worker waits, nothing is sent');
my $max_id = sql("SELECT max(id) FROM eventgrid.events");

# --- the update
sql("ALTER EXTENSION eventgrid UPDATE TO '0.2.0'");
is(sql("SELECT extversion FROM pg_extension WHERE extname = 'eventgrid'"), '0.2.0', 'updated to 0.2.0');
is(sql("SELECT string_agg(subscription || ':' || pending, ' ' ORDER BY subscription) FROM eventgrid.delivery_statistics"),
	'all:4 created:4', 'every queued delivery is pending after the update');
is(sql("SELECT attempts || ' ' || last_outcome FROM eventgrid.retries WHERE event->>'id' = 'old-1' AND subscription_id = 1"),
	'2 GenericError', 'attempts already made are kept');
is(sql("SELECT attempts || ' ' || last_outcome || ' ' || (next_attempt_at <= now()) FROM eventgrid.retries WHERE event->>'id' = 'old-2' AND subscription_id = 1"),
	'1 Aborted true', 'a delivery sent when the worker stopped is charged (Aborted) and due at once');
is(sql("SELECT unmatched_events FROM eventgrid.topic_statistics WHERE topic = 'lonely'"), '1', 'the unmatched event is counted');
is(sql("SELECT count(*) FROM eventgrid.dead_letter_events"), '1', 'dead letters are kept');
my @fresh = split /\n/, sql("SELECT c.relname FROM pg_extension x, unnest(x.extconfig) AS cfg(oid) JOIN pg_class c ON c.oid = cfg.oid"
	  . " WHERE x.extname = 'eventgrid' ORDER BY 1");
is(join(' ', @fresh),
	'chunks_in_flight dead_letters dead_letters_id_seq delivery_properties event_subscriptions event_subscriptions_id_seq events_0 events_1 events_2 '
	  . 'events_id_seq retries retries_id_seq subscription_counters subscription_positions topic_counters topic_positions topics',
	'pg_dump takes the same tables as after CREATE EXTENSION');

# --- then to the current version, which the library waits for
is(scalar(requests($r)), 0, '0.2.0 schema with the current library: the worker waits, nothing is sent');
sql("ALTER EXTENSION eventgrid UPDATE");
is(sql("SELECT extversion = default_version FROM pg_extension x JOIN pg_available_extensions a ON a.name = x.extname"
	  . " WHERE x.extname = 'eventgrid'"), 't', 'updated to the version of the library');
is(sql("SELECT string_agg(subscription || ':' || state, ' ' ORDER BY subscription) FROM eventgrid.endpoint_health"),
	'all:healthy created:healthy', 'endpoint health is shown for every subscription');
is(sql("SELECT string_agg(s.name || ':' || t.topic_type || ':' || s.topic_type || ':' || s.max_delivery_attempts || ':' || s.event_ttl"
	  . " || ':' || coalesce(s.advanced_filters::text, 'none'), ' ' ORDER BY s.name)"
	  . " FROM eventgrid.event_subscriptions s JOIN eventgrid.topics t ON t.name = s.topic"),
	'all:custom:custom:30:1440:none created:custom:custom:30:1440:none',
	'subscriptions keep their retry policy, as custom topics without advanced filters');
is(sql("SELECT string_agg(DISTINCT topic_type, ',') FROM eventgrid.dead_letters"), 'custom', 'dead letters keep the custom shape');

# --- the worker resumes by itself and delivers the queue, then new events
my @all = wait_for_requests($r, '/status/200/all', 4, 60);
is_deeply([ sort map { $json->decode($_->{body})->[0]{id} } @all ], [ map { "old-$_" } 1 .. 4 ], 'the queue of subscription all is delivered');
ok(!(grep { ($_->{headers}{'x-key'} // '') ne 'k1' } @all), 'with its secret delivery property');
my %count = map { $json->decode($_->{body})->[0]{id} => $_->{headers}{'aeg-delivery-count'} } @all;
is($count{'old-1'}, '2', 'aeg-delivery-count goes on from the attempts made before');
is(scalar(wait_for_requests($r, '/status/200/created', 4, 60)), 4, 'the queue of subscription created is delivered');
sql("SELECT eventgrid.publish('shop', '" . eg_event('new-1') . "')");
my @new = grep { $json->decode($_->{body})->[0]{id} eq 'new-1' } wait_for_requests($r, '/status/200/all', 5, 30);
is(scalar @new, 1, 'a new event is delivered');
cmp_ok(sql("SELECT max(id) FROM eventgrid.events"), '>', $max_id, 'event ids go on after the old ones');
ok(wait_for_sql($node, "SELECT sum(pending) || '/' || sum(delivered) FROM eventgrid.delivery_statistics", '0/10', 30),
	'nothing pending; every delivery counted');
is(sql("SELECT count(*) FROM eventgrid.delivery_attempts WHERE outcome = 'Delivered'"), '10',
	'the attempt history shows the deliveries made after the update');
is(sql("SELECT value FROM eventgrid.metrics WHERE event_subscription = 'all' AND metric_name = 'DeliverySuccessCount'"), '5',
	'the metrics show the counters kept across the update');

$node->stop;
done_testing();
