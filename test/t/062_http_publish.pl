# Event Grid's HTTP data plane, custom topics (issue "Event Grid's HTTP
# data plane", items 1, 2, 4, 5, 6; SPEC 14), with Python's Azure SDK
# (azure-eventgrid's EventGridPublisherClient) and the JavaScript one
# (@azure/eventgrid's, test/azure-sdk), unchanged but for the endpoint and
# the key, over HTTPS with a private CA that openssl makes here:
#  - every topic has two access keys (topic_keys, for eventgrid_admin only);
#    the SDK publishes Event Grid events, CloudEvents and custom events with
#    a key (aeg-sas-key) and with SAS tokens (Python's generate_sas, its
#    expiry format and JavaScript's "11/28/2026 5:15:33 PM";
#    JavaScript's generateSharedAccessSignature); an expired token, a
#    tampered one, one for another topic's URL or signed with another
#    topic's key, and a wrong key are 401 with {"error":{"code","message"}};
#  - regenerate_topic_key(): the old key is refused at once, the other
#    still works, the new one works;
#  - raw requests: a bad event is 400 naming its index and field and
#    publishes none of the request's events; bad JSON, a wrong Content-Type,
#    an unknown database or topic (401, as a wrong key: nothing tells which
#    exist), an unknown path (404), GET (405), a Content-Length
#    over 1 MB (413, answered without the body being sent);
#  - a client sending a byte a second holds only its own connection (others
#    publish meanwhile) and is cut off after eventgrid.http_connection_timeout;
#    with eventgrid.http_max_connections (10) connections held, another is
#    not accepted, and is served once they are closed;
#  - a second database with the extension is served at its own URL, one
#    without it is 401 as an unknown one;
#  - the listener killed (kill -9) mid-way: every publish it acknowledged is
#    there after the restart, and it serves again;
#  - no key and no event reaches the server's log, though the test's own
#    sessions log every statement.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use IO::Socket::INET;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $dir = PostgreSQL::Test::Utils::tempdir;
make_ca($dir, 'ca', 2);
issue_certificate($dir, 'ca', 'listener', 'IP:127.0.0.1,DNS:localhost', '-days', '2');
$ENV{REQUESTS_CA_BUNDLE} = "$dir/ca.pem";

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $node = new_node('http',
	'eventgrid.http_port' => $port,
	'eventgrid.http_ssl_cert_file' => "'$dir/listener.pem'",
	'eventgrid.http_ssl_key_file' => "'$dir/listener.key'",
	'eventgrid.http_connection_timeout' => "'3s'",
	'eventgrid.http_max_connections' => 10,
	# the events stay in the event tables for the test to count (no table takes its turn)
	'eventgrid.event_table_rotation' => "'1h'",
	restart_after_crash => 'on');
my $base = "https://127.0.0.1:$port/postgres/topics";

sub sql { return $node->safe_psql('postgres', $_[0]); }

sub run_py
{
	my ($script, @args) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ '/usr/bin/python3', "$FindBin::RealBin/../$script", @args ], '>', \$out, '2>', \$err);
	chomp $out;
	diag($err) if $err ne '';
	return $out;
}
sub publish { return run_py('http_publisher.py', @_); }

# the same with the JavaScript SDK (test/azure-sdk)
$ENV{NODE_EXTRA_CA_CERTS} = "$dir/ca.pem";
sub publish_js
{
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'node', "$FindBin::RealBin/../azure-sdk/publisher.js", @_ ], '>', \$out, '2>', \$err);
	chomp $out;
	diag($err) if $err ne '';
	return $out;
}
sub raw { return run_py('http_request.py', @_); }
sub key { return sql("SELECT $_[1] FROM eventgrid.topic_keys WHERE topic = '$_[0]'"); }
sub count { return sql("SELECT count(*) FROM eventgrid.events WHERE topic = '$_[0]'"); }

# wait for the listener
my $up = 0;
for (1 .. 100)
{
	my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port);
	if ($s) { $up = 1; close($s); last; }
	usleep(100_000);
}
ok($up, 'the listener accepts connections on eventgrid.http_port');

sql("SELECT eventgrid.create_topic('orders')");
sql("SELECT eventgrid.create_topic('cloud', 'CloudEventSchemaV1_0')");
sql("SELECT eventgrid.create_topic('custom', 'CustomEventSchema')");
sql("SELECT eventgrid.create_topic('ns-topic', 'CloudEventSchemaV1_0', 'namespace')");
sql("CREATE ROLE app LOGIN; GRANT eventgrid_publisher TO app; CREATE ROLE ops LOGIN; GRANT eventgrid_admin TO ops");

# --- keys
is(sql("SELECT count(*) FILTER (WHERE length(key1) = 44 AND length(key2) = 44 AND key1 <> key2
                                  AND decode(key1, 'base64') IS NOT NULL)
          FROM eventgrid.topic_keys"), '4', 'every topic has two distinct 32-byte base64 keys');
like(sql_error($node, 'SELECT * FROM eventgrid.topic_keys', 'app'), qr/42501/, 'a publisher cannot read the keys');
is($node->safe_psql('postgres', "SET ROLE ops; SELECT count(*) FROM eventgrid.topic_keys"), '4', 'eventgrid_admin reads them');
like(sql_error($node, "SELECT eventgrid.regenerate_topic_key('orders', 'key3')"), qr/22023.*key_name must be key1 or key2/,
	'a key name other than key1 or key2 is 22023');
like(sql_error($node, "SELECT eventgrid.regenerate_topic_key('nope', 'key1')"), qr/42704/, 'an unknown topic is 42704');
like(sql_error($node, "SELECT eventgrid.regenerate_topic_key(NULL, 'key1')"), qr/22004/, 'NULL is 22004');
like(sql_error($node, "SELECT eventgrid.regenerate_topic_key('orders', 'key1')", 'app'), qr/42501/,
	'a publisher cannot regenerate a key');

my ($k1, $k2) = (key('orders', 'key1'), key('orders', 'key2'));
my $unauthorized = qr/^error 401 Unauthorized The request must carry/;

# --- the SDK: keys and SAS tokens
is(publish("$base/orders/api/events", 'key', $k1, 'eventgrid', 3), 'sent 3', 'EventGridEvents with key1');
is(publish("$base/orders/api/events", 'key', $k2, 'eventgrid', 2), 'sent 2', 'EventGridEvents with key2');
is(count('orders'), '5', 'they are in eventgrid.events');
is(sql("SELECT count(*) FROM eventgrid.events WHERE topic = 'orders' AND event->>'eventType' = 'Contoso.Orders.Created'
          AND event->>'subject' LIKE 'orders/%' AND event->'data' ? 'n'"), '5', 'as the SDK wrote them');
is(publish("$base/cloud/api/events", 'key', key('cloud', 'key1'), 'cloudevent', 4), 'sent 4',
	'CloudEvents (application/cloudevents-batch+json)');
is(sql("SELECT count(*) FROM eventgrid.events WHERE topic = 'cloud' AND event->>'specversion' = '1.0'
          AND event->>'source' = '/contoso/orders'"), '4', 'stored as CloudEvents');
# an event domain (0.20.0): the SDK's EventGridEvent names its domain topic in topic
sql("SELECT eventgrid.create_domain('tenants')");
is(publish("$base/tenants/api/events", 'key', key('tenants', 'key1'), 'domain:acme', 3), 'sent 3',
	'EventGridEvents naming a domain topic, published to an event domain');
is(sql("SELECT count(*) || ' ' || min(domain_topic) || ' ' || min(event->>'topic') FROM eventgrid.events WHERE topic = 'tenants'"),
	'3 acme /domains/tenants/topics/acme', 'routed to their domain topic, their topic stamped as its path');
like(publish("$base/tenants/api/events", 'key', key('tenants', 'key1'), 'eventgrid', 2),
	qr/^error 400 BadRequest Event at index 0: the event names no domain topic of domain "tenants"/,
	'events naming no domain topic are 400, naming the first');
is(count('tenants'), '3', 'and nothing of that request is published');
is(publish("$base/custom/api/events", 'sas', key('custom', 'key2'), 'custom', 5), 'sent 5',
	'custom events with a SAS token (Python\'s expiry format)');
is(count('custom'), '5', 'stored');
is(publish("$base/orders/api/events", 'sas', $k1, 'eventgrid', 1, '11/28/2099 5:15:33 PM'), 'sent 1',
	'a SAS token with the JavaScript SDK\'s expiry format');
like(publish("$base/orders/api/events", 'sas', $k1, 'eventgrid', 1, '11/28/2020 5:15:33 PM'), $unauthorized,
	'an expired SAS token (JavaScript format) is 401');
like(publish("$base/orders/api/events", 'sas', $k1, 'eventgrid', 1, '2020-11-28T00:00:00+00:00'), $unauthorized,
	'an expired SAS token (Python format) is 401');
like(publish("$base/orders/api/events", 'sas', key('custom', 'key1'), 'eventgrid', 1), $unauthorized,
	'a SAS token signed with another topic\'s key is 401');
like(publish("$base/orders/api/events", 'key', key('custom', 'key1'), 'eventgrid', 1), $unauthorized,
	'another topic\'s key is 401');
# one character changed (a random key begins with 'x' once in 64 keys: then it is 'y')
like(publish("$base/orders/api/events", 'key', (substr($k1, 0, 1) eq 'x' ? 'y' : 'x') . substr($k1, 1), 'eventgrid', 1),
	$unauthorized, 'a wrong key is 401');

# the JavaScript SDK: its own SAS token format (expiry "11/28/2026 5:15:33 PM")
is(publish_js("$base/orders/api/events", 'key', $k1, 'eventgrid', 2), 'sent 2', 'JavaScript: EventGridEvents with a key');
is(publish_js("$base/orders/api/events", 'sas', $k2, 'eventgrid', 2), 'sent 2',
	'JavaScript: a SAS token of generateSharedAccessSignature()');
like(publish_js("$base/orders/api/events", 'sas', $k2, 'eventgrid', 1, '2020-01-01T00:00:00Z'), $unauthorized,
	'JavaScript: an expired SAS token is 401');
is(publish_js("$base/cloud/api/events", 'key', key('cloud', 'key2'), 'cloudevent', 3), 'sent 3', 'JavaScript: CloudEvents');
is(publish_js("$base/custom/api/events", 'key', key('custom', 'key1'), 'custom', 2), 'sent 2', 'JavaScript: custom events');
is(sql("SELECT count(*) FROM eventgrid.events WHERE topic IN ('cloud', 'custom')"), '14', 'stored');

# a token for another topic's URL, signed with this topic's key; and a tampered expiry
my $py = q{
import sys, datetime
from azure.eventgrid import generate_sas
print(generate_sas(sys.argv[1], sys.argv[2], datetime.datetime(2099, 1, 1, tzinfo=datetime.timezone.utc)))
};
my ($tok, $err) = ('', '');
IPC::Run::run([ '/usr/bin/python3', '-c', $py, "$base/custom/api/events", $k1 ], '>', \$tok, '2>', \$err);
chomp $tok;
like(publish("$base/orders/api/events", 'token', $tok, 'eventgrid', 1), $unauthorized,
	'a SAS token naming another topic\'s URL is 401, though signed with this topic\'s key');
IPC::Run::run([ '/usr/bin/python3', '-c', $py, "$base/orders/api/events", $k1 ], '>', \($tok = ''), '2>', \$err);
chomp $tok;
is(publish("$base/orders/api/events", 'token', $tok, 'eventgrid', 1), 'sent 1', 'the same token for its own URL publishes');
(my $tampered = $tok) =~ s/2099/2098/;
like(publish("$base/orders/api/events", 'token', $tampered, 'eventgrid', 1), $unauthorized,
	'a token whose expiry was changed is 401');
is(count('orders'), '11', 'nothing refused was stored');

# --- key rotation
my $new1 = sql("SELECT eventgrid.regenerate_topic_key('orders', 'key1')");
isnt($new1, $k1, 'regenerate_topic_key returns a new key');
is(key('orders', 'key1'), $new1, 'topic_keys shows it');
like(publish("$base/orders/api/events", 'key', $k1, 'eventgrid', 1), $unauthorized, 'the old key1 is refused at once');
like(publish("$base/orders/api/events", 'token', $tok, 'eventgrid', 1), $unauthorized,
	'and so is a SAS token it signed');
is(publish("$base/orders/api/events", 'key', $k2, 'eventgrid', 1), 'sent 1', 'key2 still publishes');
is(publish("$base/orders/api/events", 'key', $new1, 'eventgrid', 1), 'sent 1', 'the new key1 publishes');

# --- raw requests: what the SDKs never send
my $ev = '{"id":"1","eventType":"a.b","subject":"s","eventTime":"2026-11-28T00:00:00Z","data":{},"dataVersion":"1"}';
my @auth = ("aeg-sas-key:$k2", 'Content-Type:application/json; charset=utf-8');
my $before = count('orders');
like(raw('POST', "$base/orders/api/events", @auth, '--body', "[$ev,$ev,{\"id\":\"3\",\"eventType\":\"a\"}]"),
	qr/^400 \{"error": \{"code": "BadRequest", "message": "Event at index 2: event is missing required field \\"subject\\""\}\}$/,
	'a bad event is 400 naming its index and field');
is(count('orders'), $before, 'and none of the request\'s events is published');
like(raw('POST', "$base/orders/api/events", @auth, '--body', "[$ev"), qr/^400 .*"BadRequest".*not valid JSON/, 'bad JSON is 400');
like(raw('POST', "$base/orders/api/events", "aeg-sas-key:$k2", 'Content-Type:text/plain', '--body', "[$ev]"),
	qr/^400 .*Content-Type must be application\/json/, 'a wrong Content-Type is 400');
like(raw('POST', "$base/orders/api/events", "aeg-sas-key:$k2", 'Content-Type:application/cloudevents-batch+json', '--body', "[$ev]"),
	qr/^400 .*Content-Type must be application\/json/, 'CloudEvents to an Event Grid schema topic is 400');
like(raw('POST', "$base/nope/api/events", @auth, '--body', "[$ev]"), qr/^401 .*"Unauthorized"/,
	'an unknown topic is 401, as a wrong key');
like(raw('POST', "$base/ns-topic/api/events", 'aeg-sas-key:' . key('ns-topic', 'key1'), 'Content-Type:application/json',
		'--body', "[$ev]"), qr/^404 .*"NotFound"/, 'a namespace topic has no custom topic endpoint: 404 (with its key)');
like(raw('POST', "https://127.0.0.1:$port/nodb/topics/orders/api/events", @auth, '--body', "[$ev]"),
	qr/^401 .*"Unauthorized"/, 'an unknown database is 401, as a wrong key');
like(raw('POST', "https://127.0.0.1:$port/postgres/topics/orders/api", @auth, '--body', "[$ev]"),
	qr/^404 .*"NotFound"/, 'another path is 404');
like(raw('GET', "$base/orders/api/events"), qr/^405 .*"MethodNotAllowed"/, 'GET is 405');
like(raw('POST', "$base/orders/api/events", @auth, '--declare-length', 1048577),
	qr/^413 \{"error": \{"code": "PayloadTooLarge"/, 'a Content-Length over 1 MB is 413, answered before any body is sent');
like(raw('POST', "$base/orders/api/events", @auth), qr/^400 .*not valid JSON/, 'an empty body is 400');
is(count('orders'), $before, 'nothing was published by them');

# --- a slow client holds only its own connection
my $slow = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die "connect: $!";
my $t0 = time;
my @sent;
for my $i (1 .. 3)
{
	print $slow "\x16";    # a byte of a TLS handshake, then nothing more for a second
	push @sent, publish("$base/orders/api/events", 'key', $k2, 'eventgrid', 1);
	sleep 1;
}
is_deeply(\@sent, [ ('sent 1') x 3 ], 'others publish while a client sends a byte a second');
my $buf;
$slow->blocking(1);
my $closed_at;
{
	local $SIG{ALRM} = sub { die "timeout\n" };
	alarm 30;
	eval { 1 while sysread($slow, $buf, 1024); $closed_at = time; };
	alarm 0;
}
ok(defined $closed_at && $closed_at - $t0 < 20, 'the silent client is cut off (eventgrid.http_connection_timeout 3 s)');

# --- eventgrid.http_max_connections (10): an 11th connection waits (not accepted) while ten are held
my @held = map { IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port) or die "connect: $!" } 1 .. 10;
my $lim_out = '';
my $lim = IPC::Run::start([ '/usr/bin/python3', "$FindBin::RealBin/../http_request.py", 'POST', "$base/orders/api/events",
	@auth, '--body', "[$ev]" ], '>', \$lim_out, '2>', \my $lim_err);
usleep(1_500_000);
$lim->pump_nb;
is($lim_out, '', 'with ten connections held, another is not served');
close($_) for @held;
$lim->finish;
like($lim_out, qr/^200 /, 'once they are closed, it is');

# --- every database with the extension is served, at its own URL
$node->safe_psql('postgres', 'CREATE DATABASE other');
$node->safe_psql('postgres', 'CREATE DATABASE plain');
$node->safe_psql('other', "CREATE EXTENSION eventgrid; SELECT eventgrid.create_topic('orders')");
my $other_key = $node->safe_psql('other', "SELECT key1 FROM eventgrid.topic_keys");
my $got = '';
for (1 .. 50)
{
	$got = publish("https://127.0.0.1:$port/other/topics/orders/api/events", 'key', $other_key, 'eventgrid', 2);
	last if $got eq 'sent 2';
	sleep 1;
}
is($got, 'sent 2', 'a second database is served at /other/...');
is($node->safe_psql('other', "SELECT count(*) FROM eventgrid.events"), '2', 'its events are in its own tables');
like(publish("https://127.0.0.1:$port/other/topics/orders/api/events", 'key', $k2, 'eventgrid', 1), $unauthorized,
	'a key of the same-named topic of another database is 401');
like(raw('POST', "https://127.0.0.1:$port/plain/topics/orders/api/events", @auth, '--body', "[$ev]"),
	qr/^401 .*"Unauthorized"/, 'a database without the extension is 401, as an unknown one');

# --- the listener killed mid-way: what it acknowledged stays
my $pid = sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid HTTP listener'");
ok($pid > 0, 'the listener is a background worker ("eventgrid HTTP listener")');
$before = count('orders');
my $pub = IPC::Run::start([ '/bin/sh', '-c',
	"for i in \$(seq 1 40); do /usr/bin/python3 $FindBin::RealBin/../http_publisher.py $base/orders/api/events key '$k2' eventgrid 10; done" ],
	'>', \my $pub_out, '2>', \my $pub_err);
usleep(1_500_000);
kill 'KILL', $pid;
$pub->finish;
my $acked = () = $pub_out =~ /^sent 10$/mg;
ok($acked > 0, "publishes were acknowledged before the kill ($acked)");
$node->poll_query_until('postgres', "SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'eventgrid HTTP listener'")
  or die 'the listener did not come back';
cmp_ok(count('orders') - $before, '>=', 10 * $acked, 'every acknowledged publish is there after the restart');
$got = '';
for (1 .. 50)
{
	$got = publish("$base/orders/api/events", 'key', $k2, 'eventgrid', 1);
	last if $got eq 'sent 1';
	sleep 1;
}
is($got, 'sent 1', 'the restarted listener serves again');

# the test's own sessions log every statement (log_statement = all): the listener's log none
my $log = PostgreSQL::Test::Utils::slurp_file($node->logfile);
my @leaked = grep { index($log, $_) >= 0 } ($k1, $k2, $new1, $other_key, '"subject": "orders/0"');
is(scalar(@leaked), 0, 'no key and no event of a request reaches the server log');

done_testing();
