# RabbitMQ destinations (SPEC 18), against a real rabbitmq-server started
# here (plain and TLS listeners, a certificate made by openssl here) and
# read back with pika (test/rabbitmq.py):
#   - endpoint_type RabbitMQ: the amqp:// URL's rules (22023), the type goes
#     with the scheme, the user name and password stored apart;
#   - each event one persistent message (the event's JSON object, its id
#     as message id, application/json or application/cloudevents+json), in
#     publish order, through the default exchange or a named one; with
#     max_events_per_batch a batch is one message holding a JSON array;
#     routing_key_from=subject: each event's subject its routing key;
#     routing_key_from=ordering_key: its ordering key (first attempts,
#     retries, retries from before the subscription was keyed), needing
#     the subscription's ordering_key;
#   - outcomes: unroutable (mandatory) and a missing exchange NotFound; a
#     wrong password and a user without write permission Unauthorized; a
#     queue at x-max-length with reject-publish Full (nack), then delivered
#     once it has room; a message over max_message_size PayloadTooLarge
#     (the others on the channel delivered); a stopped broker SocketError
#     then delivered; a broker that stops answering TimedOut; no HTTP
#     status in the history; secrets in no view, error or log;
#   - amqps:// verified against eventgrid.ssl_ca_file, the host name checked;
#   - ordering per key: each key's messages in publish order;
#   - kill -9 of the delivery worker during a run of 3,000 events: every
#     event is in the queue afterwards.
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

my $dir = PostgreSQL::Test::Utils::tempdir();
my $port = PostgreSQL::Test::Cluster::get_free_port();
my $tls_port = PostgreSQL::Test::Cluster::get_free_port();
my $dist_port = PostgreSQL::Test::Cluster::get_free_port();
my $epmd_port = PostgreSQL::Test::Cluster::get_free_port();
my $nodename = "eventgrid$port\@localhost";
my %env = (HOME => $dir, RABBITMQ_NODENAME => $nodename, ERL_EPMD_PORT => $epmd_port);
my $broker;

# the broker's certificate names localhost only: 127.0.0.1 must fail the host name check
make_ca($dir, 'ca', 2);
issue_certificate($dir, 'ca', 'broker', 'DNS:localhost', '-days', 2);
open(my $conf, '>', "$dir/rabbitmq.conf") or die $!;
print $conf <<"CONF";
listeners.tcp.default = 127.0.0.1:$port
listeners.ssl.default = 127.0.0.1:$tls_port
ssl_options.cacertfile = $dir/ca.pem
ssl_options.certfile = $dir/broker.pem
ssl_options.keyfile = $dir/broker.key
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
max_message_size = 65536
CONF
close $conf;

sub ctl
{
	my ($out, $err) = ('', '');
	local @ENV{ keys %env } = values %env;
	IPC::Run::run([ '/usr/lib/rabbitmq/bin/rabbitmqctl', '-n', $nodename, @_ ], '>', \$out, '2>', \$err);
	return $out;
}

sub start_broker
{
	my ($out, $err) = ('', '');
	local @ENV{ keys %env } = values %env;
	local $ENV{RABBITMQ_DIST_PORT} = $dist_port;
	local $ENV{RABBITMQ_MNESIA_BASE} = "$dir/mnesia";
	local $ENV{RABBITMQ_LOG_BASE} = "$dir/log";
	local $ENV{RABBITMQ_CONFIG_FILE} = "$dir/rabbitmq.conf";
	local $ENV{RABBITMQ_ENABLED_PLUGINS_FILE} = "$dir/enabled_plugins";
	local $ENV{RABBITMQ_ADVANCED_CONFIG_FILE} = "$dir/advanced.config";
	local $ENV{RABBITMQ_PID_FILE} = "$dir/rabbitmq.pid";
	$broker = IPC::Run::start([ '/usr/lib/rabbitmq/bin/rabbitmq-server' ], '>', \$out, '2>', \$err);
	for (1 .. scaled(120))
	{
		my ($o, $e) = ('', '');
		IPC::Run::run([ '/usr/lib/rabbitmq/bin/rabbitmqctl', '-n', $nodename, '-q', 'await_startup' ], '>', \$o, '2>', \$e);
		return if $? == 0;
		sleep 1;
	}
	die "rabbitmq-server did not start: $out $err";
}

sub stop_broker
{
	return unless $broker;
	ctl('stop');
	$broker->finish;
	undef $broker;
}

END
{
	my $status = $?;
	stop_broker();
	# epmd, which the broker started, outlives it
	local $ENV{ERL_EPMD_PORT} = $epmd_port;
	system('epmd', '-port', $epmd_port, '-kill');
	$? = $status;
}

# pika's answer: test/rabbitmq.py <url> @args, as lines
sub mq
{
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'python3', "$FindBin::RealBin/../rabbitmq.py", "amqp://guest:guest\@127.0.0.1:$port/%2F", @_ ],
		'>', \$out, '2>', \$err)
	  or die "rabbitmq.py @_: $err";
	return $out;
}

# the messages of a queue (taken), decoded
sub messages { return map { decode_json($_) } split /\n/, mq('get', shift) }

my $node = new_node('rabbitmq', 'eventgrid.response_timeout' => "'3s'", restart_after_crash => 'on',
	'eventgrid.ssl_ca_file' => "'$dir/ca.pem'");
sub sql { return $node->safe_psql('postgres', shift) }
sub fails { return sql_error($node, @_) }

start_broker();
my $base = "amqp://127.0.0.1:$port";
sql("SELECT eventgrid.create_topic('orders')");
sql("SELECT eventgrid.create_topic('ce-topic', 'CloudEventSchemaV1_0')");

# --- the interface ------------------------------------------------------------
for my $bad (
	[ "$base/", 'names no exchange or routing key' ],
	[ "$base/?exchange=x&other=1", 'takes exchange and routing_key' ],
	[ "$base/?routing_key=a&routing_key=b", 'each once' ],
	[ "amqp://127.0.0.1:0/?routing_key=q", 'Port number' ],
	[ "amqp://user\@127.0.0.1/?routing_key=q", 'user name or password' ],
	[ "$base/a/b?routing_key=q", 'virtual host' ],
	[ "$base/?routing_key=" . ('k' x 256), 'longer than 255 bytes' ],
	[ "$base/?routing_key=q#frag", 'fragment' ],
	[ "$base/?routing_key_from=data", 'routing_key_from takes subject or ordering_key' ],
	[ "$base/?routing_key=q&routing_key_from=subject", 'each once' ],
	[ "amqp:///?routing_key=q", 'no host after its scheme' ])
{
	like(fails("SELECT eventgrid.create_event_subscription('orders', 'bad', endpoint => '$bad->[0]', endpoint_type => 'RabbitMQ')"),
		qr/22023.*\Q$bad->[1]\E.*HINT:.*RabbitMQ endpoint is amqp/s, "refused: " . substr($bad->[0], 0, 60));
}
like(fails("SELECT eventgrid.create_event_subscription('orders', 'bad', endpoint => '$base/?routing_key=q')"),
	qr/22023.*endpoint of type WebHook must be an http/s, 'an amqp:// endpoint needs endpoint_type RabbitMQ');
like(fails("SELECT eventgrid.create_event_subscription('orders', 'bad', endpoint => 'http://127.0.0.1/x', endpoint_type => 'RabbitMQ')"),
	qr/22023.*endpoint of type RabbitMQ must be an amqp:\/\/ or amqps:\/\/ URL/s, 'RabbitMQ needs an amqp(s):// endpoint');
like(fails("SELECT eventgrid.create_event_subscription('orders', 'bad', endpoint => '$base/?routing_key=q', endpoint_type => 'RabbitMQ', endpoint_validation => 'handshake')"),
	qr/22023.*handshake is for WebHook endpoints only/s, 'a broker is not validated by a handshake');

# --- delivered: one message per event, in order; a named exchange; a batch ----
mq('queue', 'q1');
mq('queue', 'q2');
mq('exchange', 'shop', 'q2', 'order.created');
mq('queue', 'qce');
mq('queue', 'qbatch');
sql("SELECT eventgrid.create_event_subscription('orders', 'm-plain', endpoint => '$base/?routing_key=q1', endpoint_type => 'RabbitMQ', deadletter => true)");
sql("SELECT eventgrid.create_event_subscription('orders', 'm-exchange', endpoint => '$base/%2F?exchange=shop&routing_key=order.created', endpoint_type => 'RabbitMQ', subject_begins_with => '/orders/a1')");
sql("SELECT eventgrid.create_event_subscription('orders', 'm-batch', endpoint => '$base?routing_key=qbatch', endpoint_type => 'RabbitMQ', max_events_per_batch => 50)");
sql("SELECT eventgrid.create_event_subscription('ce-topic', 'm-ce', endpoint => '$base/?routing_key=qce', endpoint_type => 'RabbitMQ')");
is(sql("SELECT string_agg(DISTINCT endpoint_type, ',') FROM eventgrid.event_subscriptions"), 'RabbitMQ', 'endpoint_type is stored');
like(fails("UPDATE eventgrid.event_subscriptions SET endpoint_type = 'RedisStream' WHERE name = 'm-ce'"),
	qr/23514.*event_subscriptions_endpoint_type_check/s, 'the table constraint holds type and scheme together');
publish_events($node, 'orders', map { "a$_" } 1 .. 300);
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('ce-topic', '"
	  . encode_json({ specversion => '1.0', id => 'c1', source => '/shop', type => 'Shop.Order', data => { n => 1 } }) . "')");
ok(wait_for_sql($node, "SELECT sum(delivered) FROM eventgrid.delivery_statistics", '712'), 'all delivered (300 + 111 + 300 + 1)');
my @plain = messages('q1');
is(scalar @plain, 300, 'one message per event');
is(join(',', map { $_->{message_id} } @plain), join(',', map { "a$_" } 1 .. 300), 'in publish order, the event id as message id');
is(ref $plain[0]{body}, 'HASH', 'the body is the event object itself');
is(join('|', $plain[0]{body}{id}, $plain[0]{body}{data}{orderId}, $plain[0]{content_type}, $plain[0]{delivery_mode}),
	'a1|a1|application/json; charset=utf-8|2', 'its content, content type, persistent');
my @routed = messages('q2');
is(scalar @routed, 111, 'the named exchange routed the filtered events (a1, a10-a19, a100-a199)');
my @batches = messages('qbatch');
is(scalar(@batches) . '/' . (grep { ref $_->{body} eq 'ARRAY' } @batches), '6/6', 'a batch is one message, a JSON array (6 of 50)');
is(join(',', map { $_->{id} } map { @{ $_->{body} } } @batches), join(',', map { "a$_" } 1 .. 300), 'in order');
my @ce = messages('qce');
is(join('|', scalar @ce, $ce[0]{body}{specversion}, $ce[0]{content_type}), '1|1.0|application/cloudevents+json; charset=utf-8',
	'a CloudEvent in structured mode');
is(sql("SELECT count(*) FROM eventgrid.delivery_attempts WHERE http_status IS NOT NULL"), '0',
	'the history records no HTTP status for a confirm');

# --- NotFound: unroutable (mandatory), a missing exchange ------------------------
sql("SELECT eventgrid.drop_event_subscription('orders', '$_')") for qw(m-exchange m-batch);
sql("SELECT eventgrid.create_event_subscription('orders', 'm-noroute', endpoint => '$base/?routing_key=nosuchqueue', endpoint_type => 'RabbitMQ', max_delivery_attempts => 1, deadletter => true)");
sql("SELECT eventgrid.create_event_subscription('orders', 'm-noexchange', endpoint => '$base/?exchange=nosuch&routing_key=k', endpoint_type => 'RabbitMQ', max_delivery_attempts => 1, deadletter => true)");
publish_events($node, 'orders', 'n1', 'n2');
ok(wait_for_sql($node, "SELECT string_agg(subscription_name || ':' || last_delivery_outcome, ',' ORDER BY subscription_name, event_id) "
	  . "FROM eventgrid.dead_letter_events",
	'm-noexchange:NotFound,m-noexchange:NotFound,m-noroute:NotFound,m-noroute:NotFound'),
	'unroutable and a missing exchange are NotFound, dead-lettered');
like(sql("SELECT response_body FROM eventgrid.delivery_attempts WHERE subscription = 'm-noroute' LIMIT 1"),
	qr/NO_ROUTE.*returned/, 'the history keeps the broker\'s return');
like(sql("SELECT response_body FROM eventgrid.delivery_attempts WHERE subscription = 'm-noexchange' LIMIT 1"),
	qr/NOT_FOUND - no exchange 'nosuch'/, 'and its channel.close');
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'm-plain'", '302'),
	'the routable subscription beside them delivered');
mq('purge', 'q1');
sql("SELECT eventgrid.drop_event_subscription('orders', '$_')") for qw(m-noroute m-noexchange);

# --- routing_key_from=subject: each event's subject is its routing key (no batches) ----
mq('queue', 'qsubj');
mq('exchange', 'by-subject', 'qsubj', '/orders/s1');
sql("SELECT eventgrid.create_event_subscription('orders', 'm-subject', endpoint => '$base/?exchange=by-subject&routing_key_from=subject', "
	  . "endpoint_type => 'RabbitMQ', max_events_per_batch => 10, max_delivery_attempts => 1, deadletter => true, subject_begins_with => '/orders/s')");
publish_events($node, 'orders', 's1', 's2');
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('orders', '"
	  . eg_event('s3', subject => '/orders/s' . ('x' x 300)) . "')");
ok(wait_for_sql($node, "SELECT string_agg(last_delivery_outcome, ',' ORDER BY event_id) FROM eventgrid.dead_letter_events "
	  . "WHERE subscription_name = 'm-subject'", 'NotFound,InvalidHeader'),
	'a subject no binding takes is NotFound, one over 255 bytes InvalidHeader');
my @by_subject = messages('qsubj');
is(join(',', map { $_->{message_id} . ':' . ref($_->{body}) } @by_subject), 's1:HASH', 'the event whose subject the binding names is routed, alone in its message');
sql("SELECT eventgrid.drop_event_subscription('orders', 'm-subject')");
sql("DELETE FROM eventgrid.dead_letter_events");
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'm-plain'", '305'),
	'the fixed-key subscription beside it delivered the three');
mq('purge', 'q1');

# --- credentials: a user with a password; Unauthorized when wrong or not allowed ----
ctl('add_user', 'writer', 'w-secret');
ctl('set_permissions', '-p', '/', 'writer', '', '.*', '');
ctl('add_user', 'reader', 'r-secret');
ctl('set_permissions', '-p', '/', 'reader', '', '', '.*');
sql("SELECT eventgrid.create_event_subscription('orders', 'm-writer', endpoint => 'amqp://writer:w-secret\@127.0.0.1:$port/?routing_key=q1', endpoint_type => 'RabbitMQ')");
sql("SELECT eventgrid.create_event_subscription('orders', 'm-reader', endpoint => 'amqp://reader:r-secret\@127.0.0.1:$port/?routing_key=q1', endpoint_type => 'RabbitMQ', deadletter => true)");
sql("SELECT eventgrid.create_event_subscription('orders', 'm-wrong', endpoint => 'amqp://writer:nope\@127.0.0.1:$port/?routing_key=q1', endpoint_type => 'RabbitMQ', deadletter => true)");
is(sql("SELECT string_agg(endpoint, ' ' ORDER BY name) FROM eventgrid.event_subscriptions WHERE name IN ('m-reader', 'm-writer')"),
	"amqp://127.0.0.1:$port/?routing_key=q1 amqp://127.0.0.1:$port/?routing_key=q1", 'the stored endpoints hold no credentials');
is(sql("SELECT string_agg(c.user_name || ':' || c.secret, ' ' ORDER BY s.name) FROM eventgrid.destination_credentials c "
	  . "JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id"), 'reader:r-secret writer:w-secret writer:nope',
	'they are in destination_credentials');
my $leak = fails("SELECT eventgrid.create_event_subscription('orders', 'bad', endpoint => 'amqp://writer:w-secret\@127.0.0.1:70000/?routing_key=q', endpoint_type => 'RabbitMQ')");
like($leak, qr/22023.*amqp:\/\/\*\*\*\@127/s, 'a malformed URL\'s error masks its credentials');
unlike($leak, qr/w-secret/, 'and never shows the password');
publish_events($node, 'orders', 'u1');
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'm-writer'", '1'), 'as writer: delivered');
ok(wait_for_sql($node, "SELECT last_delivery_outcome || '/' || dead_letter_reason FROM eventgrid.dead_letter_events WHERE subscription_name = 'm-wrong'",
	'Unauthorized/NonRetriableError'), 'a refused login is Unauthorized, not retried');
ok(wait_for_sql($node, "SELECT last_delivery_outcome || '/' || dead_letter_reason FROM eventgrid.dead_letter_events WHERE subscription_name = 'm-reader'",
	'Unauthorized/NonRetriableError'), 'a user without write permission is Unauthorized');
like(sql("SELECT response_body FROM eventgrid.delivery_attempts WHERE subscription = 'm-reader'"), qr/ACCESS_REFUSED/, 'with the broker\'s reason');
my @got = messages('q1');
is(join(',', map { $_->{message_id} } @got), 'u1,u1', 'm-plain and m-writer put u1 on q1, the others nothing');
unlike(slurp_file($node->logfile) =~ s/statement: [^\n]*//gir, qr/w-secret|r-secret/, 'no credential in the server log but the statements themselves');
sql("SELECT eventgrid.drop_event_subscription('orders', '$_')") for qw(m-writer m-reader m-wrong);
is(sql("SELECT count(*) FROM eventgrid.destination_credentials"), '0', 'dropped with their subscriptions');

# --- Full: a queue at its x-max-length with reject-publish, then room ----------------
mq('queue', 'qfull', 5);
sql("SELECT eventgrid.create_event_subscription('orders', 'm-full', endpoint => '$base/?routing_key=qfull', endpoint_type => 'RabbitMQ')");
publish_events($node, 'orders', map { "f$_" } 1 .. 8);
ok(wait_for_sql($node, "SELECT delivered || '/' || retrying FROM eventgrid.delivery_statistics WHERE subscription = 'm-full'", '5/3'),
	'5 fit the queue, 3 were refused and wait in the retries');
is(sql("SELECT DISTINCT last_outcome FROM eventgrid.retries"), 'Full', 'a nack is Full');
is(mq('count', 'qfull'), "5\n", 'the queue holds 5');
mq('purge', 'qfull');
advance_clock($node, 400);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries", '0'), 'delivered once the queue has room');
is(join(',', sort map { $_->{message_id} } messages('qfull')), 'f6,f7,f8', 'the 3 are in the queue');

# --- PayloadTooLarge: over the broker's max_message_size (64 KB here) -----------------
my $big = encode_json({ id => 'big', subject => '/big', eventType => 'T', eventTime => '2024-05-01T12:00:00Z', dataVersion => '1',
		data => { pad => 'x' x 70000 } });
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('orders', '$big')");
publish_events($node, 'orders', 's1');
ok(wait_for_sql($node, "SELECT string_agg(last_delivery_outcome || '/' || dead_letter_reason || '/' || delivery_attempts, ',') FROM eventgrid.dead_letter_events WHERE subscription_name = 'm-plain'",
	'PayloadTooLarge/NonRetriableError/1'), 'a message over max_message_size is PayloadTooLarge, not retried');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries", '0'), 'the events beside it went, or went again');
is(join(',', grep { $_ eq 's1' } map { $_->{message_id} } messages('q1')), 's1', 's1 is in the queue');
sql("DELETE FROM eventgrid.dead_letter_events");

# --- a stopped broker: SocketError, then delivered on the retry ---------------------
stop_broker();
publish_events($node, 'orders', 'b2');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries r JOIN eventgrid.event_subscriptions s ON s.id = r.subscription_id "
	  . "WHERE s.name = 'm-plain' AND r.last_outcome = 'SocketError'", '1'), 'with the broker down the event waits as a SocketError');
like(sql("SELECT error FROM eventgrid.delivery_attempts WHERE outcome = 'SocketError' ORDER BY id DESC LIMIT 1"),
	qr/could not connect to RabbitMQ|closed|refused/i, 'with the reason');
start_broker();
advance_clock($node, 400);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries", '0'), 'retried once the broker is back');
is(join(',', map { $_->{message_id} } messages('q1')), 'b2', 'b2 is in the queue (durable queue, persistent message)');

# --- TimedOut: a broker that stops answering ------------------------------------------
my $beam = slurp_file("$dir/rabbitmq.pid");
chomp $beam;
ok($beam =~ /^\d+$/ && kill('STOP', $beam), 'the broker stopped (SIGSTOP)');
publish_events($node, 'orders', 't1');
ok(wait_for_sql($node, "SELECT count(*) > 0 FROM eventgrid.delivery_attempts WHERE subscription = 'm-plain' AND outcome = 'TimedOut'", 't'),
	'no confirm within eventgrid.response_timeout is TimedOut');
kill('CONT', $beam);
advance_clock($node, 400);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries", '0'), 'and delivered on the retry');
ok(scalar(grep { $_->{message_id} eq 't1' } messages('q1')) >= 1, 't1 is in the queue (at least once)');

# --- amqps:// with a private CA, the host name checked --------------------------------
mq('queue', 'qtls');
sql("SELECT eventgrid.create_event_subscription('orders', 'm-tls', endpoint => 'amqps://localhost:$tls_port/?routing_key=qtls', endpoint_type => 'RabbitMQ')");
sql("SELECT eventgrid.create_event_subscription('orders', 'm-tls-ip', endpoint => 'amqps://127.0.0.1:$tls_port/?routing_key=qtls', endpoint_type => 'RabbitMQ')");
publish_events($node, 'orders', 'tls1');
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'm-tls'", '1'),
	'amqps:// verified against eventgrid.ssl_ca_file: delivered');
ok(wait_for_sql($node, "SELECT count(*) > 0 FROM eventgrid.delivery_attempts WHERE subscription = 'm-tls-ip' AND outcome = 'SocketError'", 't'),
	'a certificate that does not name the host is refused (SocketError)');
is(join(',', map { $_->{message_id} } messages('qtls')), 'tls1', 'only the verified connection published');
sql("SELECT eventgrid.drop_event_subscription('orders', '$_')") for qw(m-tls m-tls-ip m-full);
mq('purge', 'q1');

# --- ordering per key (SPEC 13): each key's messages in publish order ---------------
mq('queue', 'qordered');
sql("SELECT eventgrid.create_topic('ordered')");
sql("SELECT eventgrid.create_event_subscription('ordered', 'm-ordered', endpoint => '$base/?routing_key=qordered', "
	  . "endpoint_type => 'RabbitMQ', ordering_key => 'data.key')");
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'ordered', jsonb_build_object('id', 'o' || g, 'subject', '/o', "
	  . "'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('key', 'k' || (g % 3), 'n', g)) "
	  . "FROM generate_series(1, 300) g");
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'm-ordered'", '300'),
	'an ordered subscription\'s 300 events delivered');
my (%last, $in_order);
$in_order = 1;
for my $m (messages('qordered'))
{
	my ($k, $n) = ($m->{body}{data}{key}, $m->{body}{data}{n});
	$in_order = 0 if defined $last{$k} && $n < $last{$k};
	$last{$k} = $n;
}
ok($in_order && keys %last == 3, 'each key\'s messages in publish order');

# --- routing_key_from=ordering_key: each event's ordering key is its routing key ----
# first attempts, retries, and retries that waited unordered before the
# subscription was keyed: each message under its event's key
sql("SELECT eventgrid.drop_event_subscription('ordered', 'm-ordered')");
my $bykey = "$base/?exchange=by-key&routing_key_from=ordering_key";
like(fails("SELECT eventgrid.create_event_subscription('ordered', 'm-bykey', endpoint => '$bykey', endpoint_type => 'RabbitMQ')"),
	qr/22023.*routes by the ordering key needs an ordering_key.*HINT:.*ordering_key =>/s,
	'routing_key_from=ordering_key needs the subscription\'s ordering_key');
for my $k (0 .. 2)
{
	mq('queue', "qkey$k");
	mq('exchange', 'by-key', "qkey$k", "key-$k");
}
sql("SELECT eventgrid.create_event_subscription('ordered', 'm-bykey', endpoint => '$bykey', endpoint_type => 'RabbitMQ', "
	  . "ordering_key => 'data.key', max_events_per_batch => 10, deadletter => true)");
like(fails("SELECT eventgrid.update_event_subscription('ordered', 'm-bykey', ordering_key => '')"),
	qr/22023.*needs an ordering_key/s, 'nor may an update take the ordering_key away');
# events $from..$to of keys key-0..key-2 (data.n their number)
sub keyed_events
{
	my ($from, $to) = @_;
	sql("INSERT INTO eventgrid.events (topic, event) SELECT 'ordered', jsonb_build_object('id', 'rk' || g, 'subject', '/rk', "
		  . "'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('key', 'key-' || (g % 3), 'n', g)) "
		  . "FROM generate_series($from, $to) g");
}
# each queue's messages as "n,n,..." (one event a message, its key the queue's)
sub by_key
{
	my @got;
	for my $k (0 .. 2)
	{
		my @m = messages("qkey$k");
		push @got, join(',', map { ref($_->{body}) eq 'HASH' && $_->{body}{data}{key} eq "key-$k" ? $_->{body}{data}{n} : 'wrong' } @m);
	}
	return join(' | ', @got);
}
keyed_events(1, 30);
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('ordered', '" . eg_event('rk-nokey') . "')");
ok(wait_for_sql($node, "SELECT delivered || '/' || dead_lettered FROM eventgrid.delivery_statistics WHERE subscription = 'm-bykey'", '30/1'),
	'30 keyed events delivered, the one without a key dead-lettered');
is(by_key(), join(' | ', map { my $k = $_; join(',', grep { $_ % 3 == $k } 1 .. 30) } 0 .. 2),
	'each key\'s events in its queue, one a message, in publish order');
is(sql("SELECT last_delivery_outcome FROM eventgrid.dead_letter_events WHERE subscription_name = 'm-bykey'"), 'InvalidHeader',
	'an event without an ordering key has no routing key: InvalidHeader');
# retries: a missing exchange (NotFound) first, then the exchange
sql("SELECT eventgrid.update_event_subscription('ordered', 'm-bykey', endpoint => '$base/?exchange=by-key-2&routing_key_from=ordering_key')");
keyed_events(31, 36);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries", '6'), 'with the exchange missing, the six wait in the retries');
mq('exchange', 'by-key-2', "qkey$_", "key-$_") for 0 .. 2;
advance_clock($node, 400);
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'm-bykey'", '36'),
	'retried once the exchange is there');
is(by_key(), '33,36 | 31,34 | 32,35', 'a retry goes under its event\'s key');
# retries that waited unordered, under a fixed key, before the subscription was keyed
sql("SELECT eventgrid.update_event_subscription('ordered', 'm-bykey', endpoint => '$base/?exchange=by-key-3&routing_key=x', ordering_key => '')");
keyed_events(37, 39);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries WHERE ordering_key IS NULL", '3'), 'three wait unordered');
sql("SELECT eventgrid.update_event_subscription('ordered', 'm-bykey', endpoint => '$bykey', ordering_key => 'data.key')");
advance_clock($node, 800);
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'm-bykey'", '39'),
	'once keyed, they are delivered');
is(by_key(), '39 | 37 | 38', 'each under the key the subscription now gives it');
is(sql("SELECT count(*) FROM eventgrid.dead_letter_events WHERE subscription_name = 'm-bykey'"), '1', 'none dead-lettered');
sql("SELECT eventgrid.drop_event_subscription('ordered', 'm-bykey')");

# --- kill -9 of the delivery worker: nothing lost ----------------------------------
mq('queue', 'qmany');
sql("SELECT eventgrid.create_event_subscription('orders', 'm-many', endpoint => '$base/?routing_key=qmany', endpoint_type => 'RabbitMQ')");
kill('STOP', $beam);    # the broker holds the confirms back: messages are on the wire when the worker dies
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'orders', jsonb_build_object('id', 'k' || g, 'subject', '/k', "
	  . "'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', 'data', g) FROM generate_series(1, 3000) g");
ok(wait_for_sql($node, "SELECT count(*) > 0 FROM eventgrid.chunks_in_flight", 't', 10), 'requests are in flight');
my $pid = sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker' AND datname = 'postgres' LIMIT 1");
ok($pid =~ /^\d+$/ && kill('KILL', $pid), "the delivery worker ($pid) killed mid-run");
kill('CONT', $beam);
ok(wait_for_sql($node, "SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker' AND pid <> $pid", 't', 60),
	'a new delivery worker runs');
advance_clock($node, 400);    # what the crash charged an attempt is due again
ok(wait_for_sql($node, "SELECT pending || '/' || retrying FROM eventgrid.delivery_statistics WHERE subscription = 'm-many'", '0/0', 180),
	'the run finished after the restart');
my %seen = map { $_->{message_id} => 1 } messages('qmany');
is(scalar(grep { !$seen{"k$_"} } 1 .. 3000), 0, 'every one of the 3,000 events is in the queue');

# --- update: the type changes with the endpoint -----------------------------------
my $r = start_receiver();
sql("SELECT eventgrid.update_event_subscription('orders', 'm-many', endpoint => '$r->{url}/hook', endpoint_type => 'WebHook')");
publish_events($node, 'orders', 'w1');
ok(wait_for_requests($r, '/hook', 1), 'to a webhook: delivered over HTTP');
sql("SELECT eventgrid.update_event_subscription('orders', 'm-many', endpoint => 'amqp://writer:w-secret\@127.0.0.1:$port/?routing_key=qmany', endpoint_type => 'RabbitMQ')");
publish_events($node, 'orders', 'w2');
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'm-many'", '3002'), 'and back to RabbitMQ, as writer');
is(join(',', map { $_->{message_id} } messages('qmany')), 'w2', 'the queue has w2');

done_testing();
