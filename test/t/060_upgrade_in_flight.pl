# ALTER EXTENSION eventgrid UPDATE from 0.14.0 with work in flight (issue
# "Ordered and pull delivery at their peers' speed", item 5): 0.16.0 claims
# ordered subscriptions from their positions, where 0.14.0 moved every event
# of them into the retries first.  Made under 0.14.0 (whose workers wait for
# the update meanwhile, the library being of a later version):
#   - an ordered subscription's events moved into the retries by 0.14.0's
#     own transfer (eventgrid._position_to_retries()), key /a's head having
#     failed once and due in ten minutes, key /b's due now;
#   - a queue subscription's events in its queue: one available, one locked
#     by a receive (its lock token), one whose release delay runs an hour.
# After the update: key /b arrives in order at once, key /a not before its
# head is due and then in order, followed by what is published after the
# update; the available queue event is received, the locked one is still
# locked and its token acknowledges it, the delayed one waits.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use HTTP::Tiny;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = PostgreSQL::Test::Cluster->new('upgrade_in_flight');
$node->init;
$node->append_conf('postgresql.conf',
	"shared_preload_libraries = 'eventgrid'\neventgrid.retry_jitter_percent = 0\neventgrid.worker_idle_timeout = '1h'\n");
$node->start;
sub sql { return $node->safe_psql('postgres', shift) }

my $url = start_python_server('ordered_receiver.py', undef)->{url};
sub arrived
{
	my ($key) = @_;
	my $got = decode_json(HTTP::Tiny->new->get("$url/report")->{content});
	return join(',', @{ $got->{'/up'}{keys}{$key} // [] });
}

# --- 0.14.0, with work in flight ----------------------------------------------
sql("CREATE EXTENSION eventgrid VERSION '0.14.0'");
sql("SELECT eventgrid.create_topic('ord')");
sql("SELECT eventgrid.create_event_subscription('ord', 'ord-sub', '$url/up?key=subject&seq=data.seq', ordering_key => 'subject')");
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'ord', jsonb_build_object('id', k || i, 'subject', k, "
	  . "'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('seq', i)) "
	  . "FROM unnest(ARRAY['/a', '/b']) k, generate_series(1, 3) i ORDER BY i, k");
is(sql("SELECT eventgrid._position_to_retries(s.id, now(), true) FROM eventgrid.event_subscriptions s WHERE s.name = 'ord-sub'"),
	'6', "0.14.0's transfer moved the ordered subscription's six events into its retries");
sql("UPDATE eventgrid.retries r SET attempts = 1, last_outcome = 'GenericError', last_http_status = 500, "
	  . "last_attempt_at = now(), next_attempt_at = now() + interval '10 minutes' "
	  . "WHERE r.id = (SELECT k.head_id FROM eventgrid.ordering_keys k JOIN eventgrid.retries h ON h.id = k.head_id "
	  . "WHERE h.ordering_key = '/a')");

sql("SELECT eventgrid.create_topic('jobs', 'CloudEventSchemaV1_0', 'namespace')");
sql("SELECT eventgrid.create_event_subscription('jobs', 'job-queue', delivery_mode => 'queue')");
my $json = JSON::PP->new->canonical;
my $events = join(',', map { $json->encode({ specversion => '1.0', id => $_, source => '/jobs', type => 'Job', data => {} }) }
	qw(available locked delayed));
sql("SELECT eventgrid.publish('jobs', '[$events]')");
is(sql("SELECT eventgrid._position_to_retries(s.id, now(), true) FROM eventgrid.event_subscriptions s WHERE s.name = 'job-queue'"),
	'3', 'the queue subscription has three events in its queue');
my $token = sql("UPDATE eventgrid.queue_events SET lock_secret = gen_random_uuid(), receivable_at = now() + interval '2 minutes', "
	  . "delivery_count = 1, received_at = now() WHERE event->>'id' = 'locked' RETURNING id || ':' || lock_secret");
sql("UPDATE eventgrid.queue_events SET receivable_at = now() + interval '1 hour', delivery_count = 1 WHERE event->>'id' = 'delayed'");
usleep(1_500_000);
is(arrived('/b'), '', 'nothing is delivered while the extension waits for its update');

# --- the update -----------------------------------------------------------------
# the retries read in the update's transaction: the workers, which start delivering key /b at its
# commit, cannot have taken any of them yet
is(sql("ALTER EXTENSION eventgrid UPDATE; "
	  . "SELECT string_agg(ordering_key || ':' || (next_attempt_at = 'infinity'), ' ' ORDER BY id) FROM eventgrid.retries"),
	'/a:false /b:false /a:true /b:true /a:true /b:true', 'the waiting ordered events kept their keys and order through the update');
is(sql("SELECT extversion FROM pg_extension WHERE extname = 'eventgrid'"), sql("SELECT default_version FROM pg_available_extensions WHERE name = 'eventgrid'"),
	'updated to the default version');

is(sql("SELECT string_agg(x.event->>'id', ',') FROM eventgrid.receive('jobs', 'job-queue', 10, 10) x"), 'available',
	'receive() after the update: the available event only');
is(sql("SELECT succeeded FROM eventgrid.acknowledge('jobs', 'job-queue', ARRAY['$token'])"), 't',
	'the lock token of 0.14.0 acknowledges its event');
is(sql("SELECT string_agg(event->>'id' || ':' || (receivable_at > now() + interval '50 minutes'), ',') FROM eventgrid.queue_events "
	  . "WHERE event->>'id' <> 'available'"), 'delayed:true', 'the delayed event still waits out its release delay');


ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries WHERE ordering_key = '/b'", '0'), 'key /b was delivered');
is(arrived('/b'), '1,2,3', 'key /b arrived in order');
is(arrived('/a'), '', 'key /a waits for its failed head');
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('ord', '{\"id\": \"/a4\", \"subject\": \"/a\", \"eventType\": \"T\", "
	  . "\"eventTime\": \"2024-05-01T12:00:00Z\", \"data\": {\"seq\": 4}}')");
usleep(1_500_000);
is(arrived('/a'), '', 'an event of key /a published after the update waits behind it too');
advance_clock($node, 660);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries WHERE ordering_key = '/a'", '0'), 'key /a drained once due');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.chunks_in_flight", '0'), 'nothing in flight');
is(arrived('/a'), '1,2,3,4', 'key /a arrived in order, the new event last');

$node->stop;
done_testing();
