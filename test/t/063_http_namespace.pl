# Namespace topics over Event Grid's HTTP data plane (issue "Event Grid's
# HTTP data plane", items 3, 5, 6; SPEC 16) with the JavaScript Azure SDK
# (@azure/eventgrid-namespaces' EventGridSenderClient and
# EventGridReceiverClient, test/azure-sdk/namespace.js), unchanged but for
# the endpoint and the key, over HTTPS with a private CA:
#  - send one CloudEvent and a batch (:publish); receive them with lock
#    tokens and delivery counts (:receive), acknowledge (:acknowledge),
#    settle again: every token in failedLockTokens (TokenLost) and 200;
#  - release with a delay (releaseDelayInSeconds 60): not receivable
#    during it, then (the delay cut short) received again with
#    deliveryCount 2; reject: dead-lettered
#    (reason Rejected); renewLock: succeeded for a live token, failed for a
#    settled one;
#  - a long poll: a receive waiting on an empty queue returns the event
#    published during its wait (woken by the commit), while other requests
#    (publishes to another topic) are answered meanwhile; an empty receive
#    returns {"value": []} after maxWaitTime;
#  - errors with Event Grid's body: 404 for an unknown subscription, 401
#    for an unknown topic (as for a wrong key) and another topic's key, 400
#    for maxEvents 0 and a body without lockTokens;
#  - eventgrid.http_max_requests_in_flight (2): a topic's long polls take
#    at most their share (one), so a second waits for the first, while a
#    publish meanwhile is answered at once;
#  - DROP DATABASE of a database where a receive waits succeeds at once:
#    the listener cancels the statement (503 ServiceUnavailable to the
#    client) and closes its connections there; the database is then 401,
#    as an unknown one.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $dir = PostgreSQL::Test::Utils::tempdir;
make_ca($dir, 'ca', 2);
issue_certificate($dir, 'ca', 'listener', 'IP:127.0.0.1,DNS:localhost', '-days', '2');
$ENV{NODE_EXTRA_CA_CERTS} = "$dir/ca.pem";
$ENV{REQUESTS_CA_BUNDLE} = "$dir/ca.pem";

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $node = new_node('ns',
	'eventgrid.http_port' => $port,
	'eventgrid.http_ssl_cert_file' => "'$dir/listener.pem'",
	'eventgrid.http_ssl_key_file' => "'$dir/listener.key'",
	'eventgrid.http_max_requests_in_flight' => 2,
	# the listener's statements run READ COMMITTED (receive() requires it) whatever the server's default
	default_transaction_isolation => "'repeatable read'");
my $endpoint = "https://127.0.0.1:$port/postgres";
my $json = JSON::PP->new->canonical;

sub sql { return $node->safe_psql('postgres', $_[0]); }

# namespace.js COMMAND ...: its JSON line, decoded
sub ns
{
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'node', "$FindBin::RealBin/../azure-sdk/namespace.js", @_ ], '>', \$out, '2>', \$err);
	diag($err) if $err ne '';
	return eval { $json->decode($out) } // { raw => $out };
}
sub ns_start
{
	my $out = '';
	my $h = IPC::Run::start([ 'node', "$FindBin::RealBin/../azure-sdk/namespace.js", @_ ], '>', \$out, '2>', \my $err);
	return [ $h, \$out ];
}
sub ns_finish
{
	my ($h, $out) = @{ $_[0] };
	$h->finish;
	return eval { $json->decode($$out) } // { raw => $$out };
}

sql("SELECT eventgrid.create_topic('ns-orders', 'CloudEventSchemaV1_0', 'namespace')");
sql("SELECT eventgrid.create_topic('ns-other', 'CloudEventSchemaV1_0', 'namespace')");
sql("SELECT eventgrid.create_event_subscription('ns-orders', 'q-main', delivery_mode => 'queue', deadletter => true)");
sql("SELECT eventgrid.create_event_subscription('ns-other', 'q-other', delivery_mode => 'queue')");
my $key = sql("SELECT key1 FROM eventgrid.topic_keys WHERE topic = 'ns-orders'");
my $other_key = sql("SELECT key2 FROM eventgrid.topic_keys WHERE topic = 'ns-other'");
$node->poll_query_until('postgres', "SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'eventgrid HTTP listener'")
  or die 'no listener';

# --- publish, receive, acknowledge
my $got;
for (1 .. 50)
{
	$got = ns('send', $endpoint, $key, 'ns-orders', 1, 'single');
	last if ($got->{sent} // 0) == 1;
	sleep 1;
}
is_deeply($got, { sent => 1 }, 'EventGridSenderClient sends one CloudEvent (application/cloudevents+json)');
is_deeply(ns('send', $endpoint, $key, 'ns-orders', 3, 'batch'), { sent => 3 }, 'and a batch (application/cloudevents-batch+json)');
$got = ns('receive', $endpoint, $key, 'ns-orders', 'q-main', 10, 10);
is(scalar @{ $got->{events} // [] }, 4, 'EventGridReceiverClient receives the four');
is_deeply([ map { $_->{deliveryCount} } @{ $got->{events} } ], [ 1, 1, 1, 1 ], 'each with deliveryCount 1');
is_deeply([ sort map { $_->{data}{n} } @{ $got->{events} } ], [ 0, 0, 1, 2 ], 'their data as sent');
my @tokens = map { $_->{lockToken} } @{ $got->{events} };
like($tokens[0], qr/^\d+:[0-9a-f-]{36}$/, 'lock tokens as receive() makes them');
my $t_json = $json->encode(\@tokens);
is_deeply(ns('acknowledge', $endpoint, $key, 'ns-orders', 'q-main', $t_json), { succeeded => \@tokens, failed => [] },
	'acknowledgeEvents: all succeeded');
is_deeply(ns('acknowledge', $endpoint, $key, 'ns-orders', 'q-main', $t_json),
	{ succeeded => [], failed => [ map { { lockToken => $_, code => 'TokenLost' } } @tokens ] },
	'acknowledged again: 200 with every token in failedLockTokens (TokenLost)');
is(sql("SELECT acknowledged_total FROM eventgrid.queue_metrics WHERE event_subscription = 'q-main'"), '4', 'queue_metrics counts them');

# --- release with a delay, reject, renew
ns('send', $endpoint, $key, 'ns-orders', 3, 'batch');
$got = ns('receive', $endpoint, $key, 'ns-orders', 'q-main', 3, 10);
my ($r1, $r2, $r3) = map { $_->{lockToken} } @{ $got->{events} };
is_deeply(ns('release', $endpoint, $key, 'ns-orders', 'q-main', $json->encode([$r1]), 60),
	{ succeeded => [$r1], failed => [] }, 'releaseEvents with releaseDelay 60 s');
is_deeply(ns('reject', $endpoint, $key, 'ns-orders', 'q-main', $json->encode([$r2])),
	{ succeeded => [$r2], failed => [] }, 'rejectEvents');
is(sql("SELECT dead_letter_reason FROM eventgrid.dead_letter_events WHERE subscription_name = 'q-main'"), 'Rejected',
	'the rejected event is dead-lettered (Rejected)');
is_deeply(ns('renew', $endpoint, $key, 'ns-orders', 'q-main', $json->encode([$r3, $r2])),
	{ succeeded => [$r3], failed => [ { lockToken => $r2, code => 'TokenLost' } ] },
	'renewEventLocks: the live lock renewed, the settled one failed');
$got = ns('receive', $endpoint, $key, 'ns-orders', 'q-main', 10, 10);
is(scalar @{ $got->{events} }, 0, 'the released event is not receivable during its delay (an empty receive after maxWaitTime)');
cmp_ok($got->{ms}, '>=', 9000, "the empty receive waited maxWaitTime ($got->{ms} ms)");
# its delay cut short
my ($r1_id) = split /:/, $r1;
sql("UPDATE eventgrid.queue_events SET receivable_at = now() WHERE id = $r1_id");
$got = ns('receive', $endpoint, $key, 'ns-orders', 'q-main', 10, 10);
is_deeply([ map { $_->{deliveryCount} } @{ $got->{events} } ], [2], 'after its delay it is received again, deliveryCount 2');
ns('acknowledge', $endpoint, $key, 'ns-orders', 'q-main', $json->encode([ map { $_->{lockToken} } @{ $got->{events} } ]));
ns('acknowledge', $endpoint, $key, 'ns-orders', 'q-main', $json->encode([$r3]));

# --- a long poll, woken by a publish; other requests answered meanwhile
my $waiting = ns_start('receive', $endpoint, $key, 'ns-orders', 'q-main', 1, 60);
sleep 2;
my $t0 = time;
is_deeply(ns('send', $endpoint, $other_key, 'ns-other', 1, 'single'), { sent => 1 },
	'another topic is published to while a receive waits');
cmp_ok(time - $t0, '<', 10, 'without waiting for the long poll');
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('ns-orders',"
	  . " '{\"specversion\":\"1.0\",\"id\":\"late\",\"source\":\"/sql\",\"type\":\"T\",\"data\":{\"n\":7}}')");
$t0 = time;
$got = ns_finish($waiting);
is_deeply([ map { $_->{id} } @{ $got->{events} // [] } ], ['late'], 'the waiting receive returns the event published during its wait');
cmp_ok(time - $t0, '<', 10, 'soon after the commit');
ns('acknowledge', $endpoint, $key, 'ns-orders', 'q-main', $json->encode([ map { $_->{lockToken} } @{ $got->{events} } ]));

# --- eventgrid.http_max_requests_in_flight = 2: one topic's long polls hold at most one statement
my $polls_t0 = time;
my @polls = map { ns_start('receive', $endpoint, $key, 'ns-orders', 'q-main', 1, 10) } 1 .. 2;
sleep 3;
$t0 = time;
$got = ns('send', $endpoint, $other_key, 'ns-other', 1, 'single');
my $waited = time - $t0;
is_deeply($got, { sent => 1 }, 'a publish while two long polls of one topic wait is answered');
cmp_ok($waited, '<', 3, sprintf('at once: the long polls hold only their share (waited %.1f s)', $waited));
ns_finish($_) for @polls;
cmp_ok(time - $polls_t0, '>=', 18, sprintf('the second long poll ran only once the first ended (%.1f s for both)', time - $polls_t0));

# --- errors, with Event Grid's body (the SDK's RestError code and message)
$got = ns('receive', $endpoint, $key, 'ns-orders', 'nope', 1, 10);
is_deeply([ $got->{status}, $got->{code} ], [ 404, 'NotFound' ], 'an unknown subscription is 404 NotFound');
$got = ns('send', $endpoint, $key, 'ns-nope', 1, 'single');
is_deeply([ $got->{status}, $got->{code} ], [ 401, 'Unauthorized' ], 'an unknown topic is 401, as a wrong key');
$got = ns('receive', $endpoint, $other_key, 'ns-orders', 'q-main', 1, 10);
is_deeply([ $got->{status}, $got->{code} ], [ 401, 'Unauthorized' ], 'another topic\'s key is 401');
$got = ns('receive', $endpoint, $key, 'ns-orders', 'q-main', 0, 10);
is_deeply([ $got->{status}, $got->{code} ], [ 400, 'BadRequest' ], 'maxEvents 0 is 400');
like($got->{message}, qr/maxEvents must be 1-100/, 'naming the allowed range');
my ($out, $err) = ('', '');
IPC::Run::run([ '/usr/bin/python3', "$FindBin::RealBin/../http_request.py", 'POST',
	"$endpoint/topics/ns-orders/eventsubscriptions/q-main:acknowledge?api-version=2024-06-01",
	"Authorization:SharedAccessKey $key", 'Content-Type:application/json', '--body', '{"tokens":["1:x"]}' ], '>', \$out, '2>', \$err);
like($out, qr/^400 .*"BadRequest".*lockTokens/, 'a settle body without lockTokens is 400');

# --- DROP DATABASE is not kept waiting by the listener: a long poll there is cancelled (503)
$node->safe_psql('postgres', 'CREATE DATABASE dropme');
$node->safe_psql('dropme', "CREATE EXTENSION eventgrid; SELECT eventgrid.create_topic('ns-gone', 'CloudEventSchemaV1_0', 'namespace');"
	  . " SELECT eventgrid.create_event_subscription('ns-gone', 'q-gone', delivery_mode => 'queue')");
my $gone_key = $node->safe_psql('dropme', "SELECT key1 FROM eventgrid.topic_keys");
my $gone = "https://127.0.0.1:$port/dropme";
for (1 .. 50)
{
	$got = ns('send', $gone, $gone_key, 'ns-gone', 1, 'single');
	last if ($got->{sent} // 0) == 1;
	sleep 1;
}
is_deeply($got, { sent => 1 }, 'a second database serves its namespace topic');
ns('receive', $gone, $gone_key, 'ns-gone', 'q-gone', 1, 10);
# (a raw request: the SDK would retry a 503 and report what its retry got)
my $poll_out = '';
my $poll = IPC::Run::start([ '/usr/bin/python3', "$FindBin::RealBin/../http_request.py", 'POST',
	"$gone/topics/ns-gone/eventsubscriptions/q-gone:receive?api-version=2024-06-01&maxEvents=1&maxWaitTime=120",
	"Authorization:SharedAccessKey $gone_key" ], '>', \$poll_out, '2>', \my $poll_err);
$node->poll_query_until('postgres', "SELECT count(*) = 1 FROM pg_stat_activity WHERE datname = 'dropme'"
	  . " AND application_name = 'eventgrid HTTP listener' AND state = 'active'")
  or die 'the long poll did not start';
$t0 = time;
my ($ret, $drop_out, $drop_err) = $node->psql('postgres', 'DROP DATABASE dropme');
is($ret, 0, 'DROP DATABASE succeeds while a receive waits in it') or diag($drop_err);
cmp_ok(time - $t0, '<', 10, sprintf('without waiting for the long poll (%.1f s)', time - $t0));
$poll->finish;
like($poll_out, qr/^503 \{"error": \{"code": "ServiceUnavailable"/, 'the waiting receive is answered 503 ServiceUnavailable');
$got = ns('send', $gone, $gone_key, 'ns-gone', 1, 'single');
is($got->{status}, 401, 'the dropped database is 401 afterwards, as an unknown one');

done_testing();
