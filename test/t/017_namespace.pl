# The namespace-topic delivery profile on the wire (SPEC 4 and 7), with the
# worker's clock moved through eventgrid.clock_offset: the worked
# example (retention PT20M, 10 deliveries at most: attempts at 0 s, 10 s,
# 30 s, 1 min, 5 min, 10 min, 15 min, and the attempt due at 20 minutes
# finds the event expired), max_delivery_count, the statuses and conditions
# that are not retried (404, 414, a socket error, a timeout, where a custom
# topic retries), and dead letters in the namespace shape.
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

my $node = new_node('namespace');
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { return $node->safe_psql('postgres', shift) }

sub dead_letter
{
	my $sub = shift;
	return $json->decode(sql("SELECT dead_letter_event FROM eventgrid.dead_letter_events WHERE subscription_name = '$sub'"));
}

sub ce_event
{
	my $id = shift;
	return $json->encode({ specversion => '1.0', id => $id, source => '/mycontext', type => 'com.example.someevent',
		comexampleextension1 => 'value1', data => { n => 1 } });
}

sql("SELECT eventgrid.create_topic('ns-shop', 'CloudEventSchemaV1_0', topic_type => 'namespace')");

# --- SPEC 4's worked example ----------------------------------------------------
sql("SELECT eventgrid.create_event_subscription('ns-shop', 'example', '$u/status/500/example',"
	  . " max_delivery_count => 10, event_time_to_live => 'PT20M', deadletter => true)");
sql("SELECT eventgrid.publish('ns-shop', '" . ce_event('x-1') . "')");
my @at = (0, 10, 30, 60, 300, 600, 900);    # attempt times in seconds after the first
for my $i (0 .. $#at)
{
	advance_clock($node, $at[$i] - $at[ $i - 1 ]) if $i;
	ok(wait_recorded($node, 'example', $i + 1), "attempt " . ($i + 1) . " at $at[$i] s");
	is(planned_wait($node, 'example'), ($i < $#at ? $at[ $i + 1 ] - $at[$i] : 300),
		"then a wait of " . ($i < $#at ? $at[ $i + 1 ] - $at[$i] : 300) . " s");
}
# real time passes too: 297 s ahead plus 1 s of waiting stays short of 300 s
advance_clock($node, 297);
sleep 1;
is(sql("SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'example'"), '0',
	'nothing happens before the 8th attempt is due');
advance_clock($node, 3);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'example'", '1'),
	'the attempt due at 20 minutes finds the event expired: dead-lettered');
my @sent = requests($r, '/status/500/example');
is(scalar @sent, 7, '7 attempts sent, the 8th not');
is_deeply([ map { $_->{headers}{'aeg-delivery-count'} } @sent ], [ 0 .. 6 ], 'aeg-delivery-count counts previous attempts');
is($sent[0]{headers}{'content-type'}, 'application/cloudevents+json; charset=utf-8', 'delivered as a CloudEvent');
my $dl = dead_letter('example');
is_deeply($dl->{deadLetterProperties},
	{ deadletterreason => 'Time to live was exceeded.', deliveryattempts => 7, deliveryresult => 'GenericError (HTTP 500)',
	  publishutc => $dl->{deadLetterProperties}{publishutc}, deliveryattemptutc => $dl->{deadLetterProperties}{deliveryattemptutc} },
	'namespace dead letter: reason, attempts, result');
like($dl->{deadLetterProperties}{publishutc}, qr/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$/, 'publishutc in UTC');
like($dl->{deadLetterProperties}{deliveryattemptutc}, qr/Z$/, 'deliveryattemptutc in UTC');
is_deeply([ sort keys %$dl ], [ 'deadLetterProperties', 'event' ], 'the document holds deadLetterProperties and event');
is_deeply($dl->{event}, $json->decode(ce_event('x-1')), 'the event as published');
sql("SELECT eventgrid.drop_event_subscription('ns-shop', 'example')");

# --- max_delivery_count -----------------------------------------------------------
sql("SELECT eventgrid.create_event_subscription('ns-shop', 'twice', '$u/status/503/twice',"
	  . " max_delivery_count => 2, deadletter => true)");
sql("SELECT eventgrid.publish('ns-shop', '" . ce_event('x-2') . "')");
ok(wait_recorded($node, 'twice', 1), 'max_delivery_count 2: attempt 1');
is(planned_wait($node, 'twice'), 30, '503 keeps its 30 s floor');
advance_clock($node, 30);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'twice'", '1'),
	'dead-lettered after attempt 2');
is(dead_letter('twice')->{deadLetterProperties}{deadletterreason}, 'Maximum delivery attempts was exceeded.',
	'reason: maximum delivery attempts');
is(scalar(requests($r, '/status/503/twice')), 2, 'exactly 2 attempts');

# --- not retried: 404, 414, a socket error, a timeout -----------------------------
my $closed = PostgreSQL::Test::Cluster::get_free_port();
sql("SELECT eventgrid.create_event_subscription('ns-shop', 'gone', '$u/status/404/gone', deadletter => true)");
sql("SELECT eventgrid.create_event_subscription('ns-shop', 'long-uri', '$u/status/414/long-uri', deadletter => true)");
sql("SELECT eventgrid.create_event_subscription('ns-shop', 'refused', 'http://127.0.0.1:$closed/x', deadletter => true)");
sql("SELECT eventgrid.create_event_subscription('ns-shop', 'slow', '$u/hang/slow', deadletter => true)");
sql("SELECT eventgrid.create_event_subscription('ns-shop', 'dropped', '$u/status/401/dropped')");
sql("SELECT eventgrid.create_topic('custom-shop', 'CloudEventSchemaV1_0')");
sql("SELECT eventgrid.create_event_subscription('custom-shop', 'custom-gone', '$u/status/404/custom-gone', deadletter => true)");
sql("SELECT eventgrid.create_event_subscription('custom-shop', 'custom-refused', 'http://127.0.0.1:$closed/y', deadletter => true)");
sql("SELECT eventgrid.publish('ns-shop', '" . ce_event('x-3') . "')");
sql("SELECT eventgrid.publish('custom-shop', '" . ce_event('x-4') . "')");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name IN ('gone', 'long-uri', 'refused', 'slow')", '4'),
	'404, 414, refused connection and timeout: dead-lettered at once');
ok(wait_for_sql($node, "SELECT dropped FROM eventgrid.delivery_statistics WHERE subscription = 'dropped'", '1'),
	'401 without dead-lettering: dropped');
is(sql("SELECT string_agg(subscription_name || ':' || dead_letter_reason || ':' || delivery_attempts || ':' || last_delivery_outcome, ' ' ORDER BY subscription_name)"
	  . " FROM eventgrid.dead_letters WHERE subscription_name IN ('gone', 'long-uri', 'refused', 'slow')"),
	'gone:NonRetriableError:1:NotFound long-uri:NonRetriableError:1:GenericError refused:NonRetriableError:1:SocketError slow:NonRetriableError:1:TimedOut',
	'each after one attempt, with its outcome');
is(dead_letter('gone')->{deadLetterProperties}{deliveryresult}, 'NotFound (HTTP 404)', 'deliveryresult names the outcome and status');
is(dead_letter('refused')->{deadLetterProperties}{deliveryresult}, 'SocketError', 'no HTTP status without an answer');
ok(wait_recorded($node, 'custom-gone', 1) && wait_recorded($node, 'custom-refused', 1),
	'the same failures on a custom topic are retried');
is(sql("SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name LIKE 'custom-%'"), '0', 'and not dead-lettered');

# --- the profile survives an update of the policy ---------------------------------
sql("SELECT eventgrid.create_event_subscription('ns-shop', 'once', '$u/status/500/once', max_delivery_count => 5, deadletter => true)");
sql("SELECT eventgrid.set_retry_policy('ns-shop', 'once', max_delivery_count => 1)");
sql("SELECT eventgrid.publish('ns-shop', '" . ce_event('x-5') . "')");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'once'", '1'),
	'max_delivery_count set to 1: dead-lettered after the first failure');
is(scalar(requests($r, '/status/500/once')), 1, 'one attempt');

$node->stop;
done_testing();
