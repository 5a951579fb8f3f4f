# StorageQueue destinations (SPEC 21), against Microsoft's Azure Storage
# emulator (Azurite's Queue service, test/azurite) started here, the
# messages read back with Microsoft's Python client (azure.storage.queue):
#   - the endpoint: a queue's URL (path-style for the emulator), its
#     queueMessageTimeToLiveInSeconds (22003 out of range), a SAS token in
#     its query stored apart (22023 for a query that is not one), the
#     queue name's rule; set_storage_account_key() (22023 for what is not
#     a key or a subscription that is not a StorageQueue one);
#   - an account key: each event one message, base64 of the event's JSON
#     object in the delivery schema, in order, with the time to live asked
#     for; CloudEvents too;
#   - a SAS token: delivered, and neither the stored endpoint, the views,
#     the history nor the log shows its signature;
#   - outcomes: a missing queue NotFound (dead-lettered after its one
#     attempt), a wrong key Unauthorized (the service's 403
#     AuthenticationFailed), a SAS token without add permission Forbidden
#     and a message over 64 KB PayloadTooLarge (dead-lettered at once,
#     NonRetriableError);
#   - ordering per key through kill -9 of the delivery worker mid-run: every
#     one of 1,000 events on the queue, each key's in publish order;
#   - Microsoft Entra ID: a second Azurite over HTTPS with --oauth basic (its
#     certificate made here), the bearer token from the OAuth 2.0 token
#     server of test/oauth standing in for Entra ID (eventgrid.entra_authority),
#     for scope https://storage.azure.com/.default: delivered, read back.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP qw(decode_json encode_json);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = new_node('storage', restart_after_crash => 'on');
my $qport = PostgreSQL::Test::Cluster::get_free_port();
my $qdir = PostgreSQL::Test::Utils::tempdir();
my ($qout, $qerr) = ('', '');
my $azurite = IPC::Run::start(
	[ 'node', "$FindBin::RealBin/../azurite/azurite-queue.js", '--queueHost', '127.0.0.1', '--queuePort', $qport,
		'--location', $qdir, '--skipApiVersionCheck', '--disableTelemetry' ],
	'>', \$qout, '2>', \$qerr);
END { if ($azurite) { $azurite->signal('TERM'); $azurite->finish } }
for (1 .. 100)
{
	last if $qout =~ /successfully listens/;
	usleep(100_000);
	$azurite->pump_nb;
}
like($qout, qr/successfully listens/, 'Azurite\'s Queue service runs') or BAIL_OUT("Azurite: $qout $qerr");

our $account = "http://127.0.0.1:$qport/devstoreaccount1";
my $key = 'Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==';

# Microsoft's Python client: create, sas, receive (test/storage_queue.py)
sub client
{
	my ($out, $err) = ('', '');
	IPC::Run::run([ '/usr/bin/python3', "$FindBin::RealBin/../storage_queue.py", $account, @_ ], '>', \$out, '2>', \$err)
	  or die "storage_queue.py @_: $err";
	chomp $out;
	return $out;
}

sub received { return map { decode_json($_) } grep { length } split /\n/, client('receive', shift) }

sub sql { return $node->safe_psql('postgres', shift) }
sub fails { return sql_error($node, @_) }

client('create', $_) for qw(orders-q ce-q sas-q);
sql("SELECT eventgrid.create_topic('orders')");
sql("SELECT eventgrid.create_topic('ce-topic', 'CloudEventSchemaV1_0')");

# --- the interface ------------------------------------------------------------
for my $bad (
	[ "$account", 'must be a queue' ],
	[ "$account/Bad_Name", 'must be a queue' ],
	[ "$account/orders-q/messages", 'must be a queue' ],
	[ "$account/orders-q?foo=1", 'not a SAS token' ])
{
	like(fails("SELECT eventgrid.create_event_subscription('orders', 'bad', '$bad->[0]', endpoint_type => 'StorageQueue')"),
		qr/22023.*\Q$bad->[1]\E/s, "refused: $bad->[0]");
}
like(fails("SELECT eventgrid.create_event_subscription('orders', 'bad', '$account/orders-q?queueMessageTimeToLiveInSeconds=9999999999', endpoint_type => 'StorageQueue')"),
	qr/22003.*queueMessageTimeToLiveInSeconds must be/s, 'a time to live out of range');
like(fails("SELECT eventgrid.create_event_subscription('orders', 'bad', 'http://127.0.0.1:10001/devstoreaccount1/q1', endpoint_type => 'RabbitMQ')"),
	qr/22023.*endpoint of type RabbitMQ must be an amqp/s, 'a queue URL is not a RabbitMQ endpoint');
sql("SELECT eventgrid.create_event_subscription('orders', 'hook', 'http://127.0.0.1:1/x')");
like(fails("SELECT eventgrid.set_storage_account_key('orders', 'hook', '$key')"), qr/22023.*not a StorageQueue subscription/s,
	'set_storage_account_key() takes StorageQueue subscriptions only');
sql("SELECT eventgrid.drop_event_subscription('orders', 'hook')");

# --- an account key: one message per event, base64 JSON, in order, its TTL ------
sql("SELECT eventgrid.create_event_subscription('orders', 'to-queue', '$account/orders-q?queueMessageTimeToLiveInSeconds=3600', "
	  . "endpoint_type => 'StorageQueue', max_events_per_batch => 10)");
like(fails("SELECT eventgrid.set_storage_account_key('orders', 'to-queue', 'not a key')"), qr/22023.*base64 of at least 16 bytes/s,
	'what is not a key is refused');
sql("SELECT eventgrid.set_storage_account_key('orders', 'to-queue', '$key')");
sql("SELECT eventgrid.create_event_subscription('ce-topic', 'ce-queue', '$account/ce-q', endpoint_type => 'StorageQueue')");
sql("SELECT eventgrid.set_storage_account_key('ce-topic', 'ce-queue', '$key')");
publish_events($node, 'orders', 'o1', 'o2', 'o3');
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('ce-topic', '"
	  . encode_json({ specversion => '1.0', id => 'c1', source => '/shop', type => 'Shop.Order', data => { n => 1 } }) . "')");
ok(wait_for_sql($node, "SELECT sum(delivered) FROM eventgrid.delivery_statistics", '4'), 'delivered');
my @got = received('orders-q');
is(join(',', map { $_->{event}{id} } @got), 'o1,o2,o3', 'one message per event, in publish order (no batch array)');
is($got[0]{event}{subject} . '|' . $got[0]{event}{data}{orderId}, '/orders/o1|o1', 'the event\'s JSON object, base64 in the message');
is($got[0]{ttl}, 3600, 'queueMessageTimeToLiveInSeconds became the message\'s time to live');
my @ce = received('ce-q');
is(($ce[0]{event}{specversion} // '') . '|' . ($ce[0]{event}{id} // ''), '1.0|c1', 'a CloudEvents subscription\'s message is the CloudEvent');
is($ce[0]{ttl}, 7 * 24 * 3600, 'without a time to live, the service\'s default (7 days)');
is(sql("SELECT kind FROM eventgrid.destination_credentials"), "shared_key\nshared_key", 'the keys are stored apart');

# --- a SAS token: delivered; its signature nowhere an admin or the log shows ------
my $sas = client('sas', 'sas-q');
like($sas, qr/sig=/, 'the client made a SAS token');
sql("SELECT eventgrid.create_event_subscription('orders', 'sas-queue', '$account/sas-q?$sas', endpoint_type => 'StorageQueue')");
is(sql("SELECT endpoint FROM eventgrid.event_subscriptions WHERE name = 'sas-queue'"), "$account/sas-q",
	'the stored endpoint holds no SAS token');
is(sql("SELECT kind || ' ' || (secret = '$sas') FROM eventgrid.destination_credentials c JOIN eventgrid.event_subscriptions s "
	  . "ON s.id = c.subscription_id WHERE s.name = 'sas-queue'"), 'sas true', 'the token is in destination_credentials');
publish_events($node, 'orders', 's1');
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'sas-queue'", '1'),
	'delivered with the SAS token');
is(join(',', map { $_->{event}{id} } received('sas-q')), 's1', 'the message is on the queue');
my ($sig) = $sas =~ /sig=([^&]+)/;
is(sql("SELECT count(*) FROM eventgrid.endpoint_health WHERE endpoint LIKE '%sig=%'"), '0', 'endpoint_health shows no signature');
unlike(slurp_file($node->logfile) =~ s/statement: [^\n]*//gir, qr/\Q$sig\E/, 'nor the server log, but the statement that set it');

# --- outcomes ----------------------------------------------------------------------
sql("SELECT eventgrid.create_event_subscription('orders', 'no-queue', '$account/absent-q', endpoint_type => 'StorageQueue', "
	  . "max_delivery_attempts => 1, deadletter => true)");
sql("SELECT eventgrid.set_storage_account_key('orders', 'no-queue', '$key')");
my $wrong = $key =~ s/^Eby8/Xby8/r;
sql("SELECT eventgrid.create_event_subscription('orders', 'wrong-key', '$account/orders-q', endpoint_type => 'StorageQueue', deadletter => true)");
sql("SELECT eventgrid.set_storage_account_key('orders', 'wrong-key', '$wrong')");
# a SAS token that may read but not add: the credentials are taken, the permission lacks
my $read_sas = client('sas', 'orders-q', 'r');
sql("SELECT eventgrid.create_event_subscription('orders', 'read-sas', '$account/orders-q?$read_sas', endpoint_type => 'StorageQueue', deadletter => true)");
publish_events($node, 'orders', 'x1');
ok(wait_for_sql($node, "SELECT string_agg(subscription_name || ':' || last_delivery_outcome || ':' || dead_letter_reason || ':' || "
	  . "coalesce(last_http_status_code::text, '-'), ',' ORDER BY subscription_name) FROM eventgrid.dead_letter_events",
	'no-queue:NotFound:MaxDeliveryAttemptsExceeded:404,read-sas:Forbidden:NonRetriableError:403,wrong-key:Unauthorized:NonRetriableError:403'),
	'a missing queue is NotFound; a wrong key (the service\'s 403 AuthenticationFailed) Unauthorized, a SAS token without add permission Forbidden, neither retried');
like(sql("SELECT response_body FROM eventgrid.delivery_attempts WHERE subscription = 'wrong-key'"), qr/AuthenticationFailed/,
	'the history keeps the service\'s 403 and its answer');
like(sql("SELECT response_body FROM eventgrid.delivery_attempts WHERE subscription = 'no-queue'"), qr/QueueNotFound/,
	'the history keeps the service\'s answer');
sql("SELECT eventgrid.drop_event_subscription('orders', '$_')") for qw(no-queue wrong-key read-sas sas-queue);
# over 64 KB once base64-encoded
sql("SELECT eventgrid.update_event_subscription('orders', 'to-queue', deadletter => true)");
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('orders', jsonb_build_object('id', 'big', 'subject', '/big', "
	  . "'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', 'data', repeat('x', 60000)))");
ok(wait_for_sql($node, "SELECT last_delivery_outcome || ':' || dead_letter_reason FROM eventgrid.dead_letter_events "
	  . "WHERE subscription_name = 'to-queue'", 'PayloadTooLarge:NonRetriableError'),
	'a message over the queue\'s 64 KB is PayloadTooLarge, not retried');

# --- ordering per key, through kill -9 of the delivery worker mid-run --------------
client('create', 'ordered-q');
sql("SELECT eventgrid.create_topic('ordered')");
sql("SELECT eventgrid.create_event_subscription('ordered', 'sq-ordered', '$account/ordered-q', endpoint_type => 'StorageQueue', ordering_key => 'data.key')");
sql("SELECT eventgrid.set_storage_account_key('ordered', 'sq-ordered', '$key')");
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'ordered', jsonb_build_object('id', 'o' || g, 'subject', '/o', "
	  . "'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('key', 'k' || (g % 3), 'n', g)) "
	  . "FROM generate_series(1, 1000) g");
ok(wait_for_sql($node, "SELECT count(*) > 0 FROM eventgrid.chunks_in_flight", 't', 10), 'requests are in flight');
my $pid = sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker' AND datname = 'postgres' LIMIT 1");
ok($pid =~ /^\d+$/ && kill('KILL', $pid), "the delivery worker ($pid) killed mid-run");
ok(wait_for_sql($node, "SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker' AND pid <> $pid", 't', 60),
	'a new delivery worker runs');
advance_clock($node, 400);    # what the crash charged an attempt is due again
ok(wait_for_sql($node, "SELECT pending || '/' || retrying FROM eventgrid.delivery_statistics WHERE subscription = 'sq-ordered'", '0/0', 180),
	'the run finished after the restart');
my (%seen, %last);
my $in_order = 1;
for my $e (map { $_->{event} } received('ordered-q'))
{
	next if $seen{ $e->{id} }++;    # at least once: a message the crash left unrecorded comes again
	my ($k, $n) = ($e->{data}{key}, $e->{data}{n});
	$in_order = 0 if defined $last{$k} && $n < $last{$k};
	$last{$k} = $n;
}
is(scalar(grep { !$seen{"o$_"} } 1 .. 1000), 0, 'every one of the 1,000 events is on the queue');
ok($in_order && keys %last == 3, 'each key\'s messages in publish order');

# --- Microsoft Entra ID: a bearer token for https://storage.azure.com ---------------
# Azurite takes OAuth tokens only over HTTPS (--oauth basic: it checks the
# token's issuer, audience and lifetime, not its signature); the token server
# of test/oauth stands in for Entra ID, its tokens issued as Entra ID's are
my $tdir = PostgreSQL::Test::Utils::tempdir();
make_ca($tdir, 'server-ca', 2);
issue_certificate($tdir, 'server-ca', 'server', 'IP:127.0.0.1', '-days', 2);
my $tenant = '11111111-2222-3333-4444-555555555555';
open(my $cfh, '>', "$tdir/clients.json") or die $!;
print $cfh encode_json({ 'storage-app' => 'storage-secret-9c1e' });
close $cfh;
my ($tport, $hport, $sport) = map { PostgreSQL::Test::Cluster::get_free_port() } 1 .. 3;
my ($oout, $oerr) = ('', '');
my $oauth;
{
	local $ENV{NODE_PATH} = '/usr/share/nodejs';
	local $ENV{NODE_EXTRA_CA_CERTS} = "$tdir/server-ca.pem";
	local $ENV{OAUTH_TOKEN_ISSUER} = "https://sts.windows.net/$tenant/";
	$oauth = IPC::Run::start([ 'node', "$FindBin::RealBin/../oauth/server.js", $tdir, $tport, $hport ], '>', \$oout, '2>', \$oerr);
}
my ($sout, $serr) = ('', '');
my $secure = IPC::Run::start(
	[ 'node', "$FindBin::RealBin/../azurite/azurite-queue.js", '--queueHost', '127.0.0.1', '--queuePort', $sport,
		'--location', PostgreSQL::Test::Utils::tempdir(), '--skipApiVersionCheck', '--disableTelemetry',
		'--oauth', 'basic', '--cert', "$tdir/server.pem", '--key', "$tdir/server.key" ],
	'>', \$sout, '2>', \$serr);
END { for my $p ($oauth, $secure) { if ($p) { $p->signal('TERM'); $p->finish } } }
for (1 .. 100)
{
	last if -f "$tdir/ready" && $sout =~ /successfully listens/;
	usleep(100_000);
	$secure->pump_nb;
}
ok(-f "$tdir/ready" && $sout =~ /successfully listens/, 'the token server and Azurite over HTTPS run')
  or BAIL_OUT("token server: $oerr; Azurite: $sout $serr");
{
	local $ENV{REQUESTS_CA_BUNDLE} = "$tdir/server-ca.pem";
	local $account = "https://127.0.0.1:$sport/devstoreaccount1";
	client('create', 'entra-q');
}
sql("ALTER SYSTEM SET eventgrid.ssl_ca_file = '$tdir/server-ca.pem'; ALTER SYSTEM SET eventgrid.entra_authority = 'https://127.0.0.1:$tport'; SELECT pg_reload_conf()");
sql("SELECT eventgrid.create_event_subscription('orders', 'sq-entra', endpoint => 'https://127.0.0.1:$sport/devstoreaccount1/entra-q', endpoint_type => 'StorageQueue')");
sql("SELECT eventgrid.set_entra_authentication('orders', 'sq-entra', '$tenant', 'https://storage.azure.com', 'storage-app', 'storage-secret-9c1e')");
publish_events($node, 'orders', 'e1', 'e2');
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'sq-entra'", '2', 60),
	'with an Entra ID token: delivered');
my @requests = map { decode_json($_) } grep { /\S/ } split /\n/, slurp_file("$tdir/token_requests.jsonl");
is(join(',', map { $_->{scope} // '' } grep { ($_->{client_id} // '') eq 'storage-app' } @requests), 'https://storage.azure.com/.default',
	'one token request, for scope https://storage.azure.com/.default');
{
	local $ENV{REQUESTS_CA_BUNDLE} = "$tdir/server-ca.pem";
	local $account = "https://127.0.0.1:$sport/devstoreaccount1";
	is(join(',', map { $_->{event}{id} } received('entra-q')), 'e1,e2', 'the queue has both');
}
sql("SELECT eventgrid.create_event_subscription('orders', 'sq-no-token', endpoint => 'https://127.0.0.1:$sport/devstoreaccount1/entra-q', endpoint_type => 'StorageQueue', deadletter => true)");
publish_events($node, 'orders', 'e3');
# (Azurite answers 403 AuthenticationFailed to a request without credentials,
# Azure Storage 401 or 403 AuthenticationFailed: Unauthorized, not retried)
ok(wait_for_sql($node, "SELECT last_delivery_outcome || '/' || dead_letter_reason FROM eventgrid.dead_letter_events WHERE subscription_name = 'sq-no-token'",
	'Unauthorized/NonRetriableError', 60), 'without a token or a key the service refuses the request: Unauthorized, dead-lettered');

done_testing();
