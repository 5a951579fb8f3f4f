# RedisStream destinations (SPEC 18), against a real redis-server started
# here and read back with redis-cli:
#   - endpoint_type on create_event_subscription() / update_event_subscription():
#     the redis:// URL's rules (22023), the type goes with the scheme,
#     no handshake, none for a queue
#     subscription; the column survives as stored;
#   - stream_from=subject: each event into the stream its subject names;
#     stream_from=ordering_key: into the one its ordering key names;
#   - rediss:// (where hiredis has TLS): verified against
#     eventgrid.ssl_ca_file and the host name; else refused (22023);
#   - each event one entry (fields id and event: the event's JSON object in
#     the delivery schema), in publish order per subscription and per
#     ordering key, a database
#     other than 0 SELECTed first, MAXLEN ~ trims, batching settings do not
#     make arrays, filters apply;
#   - credentials: a password (requirepass) and an ACL user in the URL are
#     stored apart (destination_credentials, not readable by an admin),
#     never in the stored endpoint, an error or the log; a wrong one and
#     none are Unauthorized; a new endpoint replaces them;
#   - outcomes: a stopped server SocketError then delivered on the retry; a
#     missing stream with mkstream=false NotFound; a database SELECT refuses
#     NotFound (nothing written to database 0); requirepass NOAUTH
#     Unauthorized (dead-lettered at once); maxmemory OOM Full, then
#     delivered; a server that stops answering TimedOut; the history keeps
#     Redis's error text and no HTTP status;
#   - kill -9 of the delivery worker during a run of 3,000 events: every
#     event is in the stream afterwards.
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

my $node = new_node('redis', 'eventgrid.response_timeout' => "'2s'", restart_after_crash => 'on');
my $rport = PostgreSQL::Test::Cluster::get_free_port();
my $rdir = PostgreSQL::Test::Utils::tempdir();
my $redis;

sub start_redis
{
	my @extra = @_;
	my ($out, $err) = ('', '');
	$redis = IPC::Run::start([ 'redis-server', '--port', $rport, '--bind', '127.0.0.1', '--save', '',
			'--appendonly', 'no', '--dir', $rdir, @extra ], '>', \$out, '2>', \$err);
	for (1 .. 100)
	{
		return if rcli('PING') eq 'PONG';
		usleep(100_000);
	}
	die "redis-server did not start: $out $err";
}

sub stop_redis
{
	return unless $redis;
	$redis->signal('TERM');
	$redis->finish;
	undef $redis;
}

END { stop_redis() }

# redis-cli's answer to one command (its arguments), without the trailing newline
sub rcli
{
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'redis-cli', '-p', $rport, @_ ], '>', \$out, '2>', \$err);
	chomp $out;
	return $out;
}

# the entries of a stream as [id field, event field] pairs, via XRANGE (--no-raw off: one value a line)
sub entries
{
	my ($stream, @db) = @_;
	my @lines = split /\n/, rcli(@db, '--raw', 'XRANGE', $stream, '-', '+');
	my @got;
	while (@lines)
	{
		my $entry_id = shift @lines;
		my %f;
		while (@lines && $lines[0] !~ /^\d+-\d+$/)
		{
			my ($k, $v) = (shift @lines, shift @lines);
			$f{$k} = $v;
		}
		push @got, [ $f{id}, $f{event} ];
	}
	return @got;
}

sub sql { return $node->safe_psql('postgres', shift) }
sub fails { return sql_error($node, @_) }

sub outcome_of
{
	my ($sub) = @_;
	return sql("SELECT string_agg(outcome || ':' || coalesce(http_status::text, 'null'), ',' ORDER BY id) "
		  . "FROM eventgrid.delivery_attempts WHERE subscription = '$sub'");
}

start_redis();
my $base = "redis://127.0.0.1:$rport";
sql("SELECT eventgrid.create_topic('orders')");
sql("SELECT eventgrid.create_topic('ce-topic', 'CloudEventSchemaV1_0')");

# --- the interface ------------------------------------------------------------
for my $bad (
	[ "$base", 'names no stream' ],
	[ "$base/0?stream=", 'empty' ],
	[ "redis://127.0.0.1:0/?stream=s", 'Port number' ],
	[ "redis://127.0.0.1:70000/?stream=s", 'Port number' ],
	[ "redis://user\@127.0.0.1/?stream=s", 'user name or password' ],
	[ "$base/x?stream=s", 'database number' ],
	[ "$base/?stream=s&maxlen=0", 'maxlen must be' ],
	[ "$base/?stream=s&mkstream=no", 'mkstream must be true or false' ],
	[ "$base/?stream=s&other=1", 'takes stream (or stream_from=subject or ordering_key), maxlen and mkstream' ],
	[ "$base/?stream=s&stream=t", 'each once' ],
	[ "$base/?stream=s&stream_from=subject", 'each once' ],
	[ "$base/?stream_from=data", 'stream_from takes subject or ordering_key' ],
	[ "$base/?stream=s#frag", 'fragment' ],
	[ "redis:///?stream=s", 'no host after its scheme' ])
{
	like(fails("SELECT eventgrid.create_event_subscription('orders', 'bad', endpoint => '$bad->[0]', endpoint_type => 'RedisStream')"),
		qr/22023.*\Q$bad->[1]\E.*HINT:.*RedisStream endpoint is redis\[s\]:\/\//s, "refused: $bad->[0]");
}
like(fails("SELECT eventgrid.create_event_subscription('orders', 'bad', endpoint => '$base/?stream=s')"),
	qr/22023.*endpoint of type WebHook must be an http/s, 'a redis:// endpoint needs endpoint_type RedisStream');
like(fails("SELECT eventgrid.create_event_subscription('orders', 'bad', endpoint => 'http://127.0.0.1/x', endpoint_type => 'RedisStream')"),
	qr/22023.*endpoint of type RedisStream must be a redis:\/\/ or rediss:\/\/ URL/s, 'RedisStream needs a redis:// endpoint');
like(fails("SELECT eventgrid.create_event_subscription('orders', 'bad', endpoint => '$base/?stream=s', endpoint_type => 'RabbitMQ')"),
	qr/22023.*endpoint of type RabbitMQ must be an amqp:\/\/ or amqps:\/\/ URL/s, 'a redis:// endpoint is not a RabbitMQ one');
like(fails("SELECT eventgrid.create_event_subscription('orders', 'bad', endpoint => '$base/?stream=s', endpoint_type => 'redis')"),
	qr/22023.*endpoint_type must be WebHook, RedisStream, StorageQueue or RabbitMQ/s, 'an unknown endpoint type');
like(fails("SELECT eventgrid.create_event_subscription('orders', 'bad', endpoint => '$base/?stream=s', endpoint_type => 'RedisStream', endpoint_validation => 'handshake')"),
	qr/22023.*handshake is for WebHook endpoints only/s, 'a destination is not validated by a handshake');

# --- delivered: one entry per event, in order, its JSON object ----------------
sql("SELECT eventgrid.create_event_subscription('orders', 'r-plain', endpoint => '$base/?stream=orders', endpoint_type => 'RedisStream', max_events_per_batch => 10)");
sql("SELECT eventgrid.create_event_subscription('orders', 'r-db3', endpoint => '$base/3?stream=orders3&maxlen=100', endpoint_type => 'RedisStream', subject_begins_with => '/orders/a')");
sql("SELECT eventgrid.create_event_subscription('ce-topic', 'r-ce', endpoint => '$base?stream=ce', endpoint_type => 'RedisStream')");
is(sql("SELECT string_agg(name || '=' || endpoint_type, ',' ORDER BY name) FROM eventgrid.event_subscriptions"),
	'r-ce=RedisStream,r-db3=RedisStream,r-plain=RedisStream', 'endpoint_type is stored');
like(fails("UPDATE eventgrid.event_subscriptions SET endpoint_type = 'WebHook' WHERE name = 'r-ce'"),
	qr/23514.*event_subscriptions_endpoint_type_check/s, 'the table constraint holds type and scheme together');
publish_events($node, 'orders', map { "a$_" } 1 .. 300);
publish_events($node, 'orders', 'b1');
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('ce-topic', '"
	  . encode_json({ specversion => '1.0', id => 'c1', source => '/shop', type => 'Shop.Order', data => { n => 1 } }) . "')");
ok(wait_for_sql($node, "SELECT sum(delivered) FROM eventgrid.delivery_statistics WHERE topic <> 'ordered'", '602'), 'all delivered');
my @plain = entries('orders');
is(scalar @plain, 301, 'one entry per event (no batch arrays)');
is(join(',', map { $_->[0] } @plain), join(',', (map { "a$_" } 1 .. 300), 'b1'), 'in publish order, field id is the event id');
my $first = decode_json($plain[0][1]);
is(ref $first, 'HASH', 'field event is the event object itself');
is($first->{id} . '|' . $first->{subject} . '|' . $first->{data}{orderId}, 'a1|/orders/a1|a1', 'its content');
my $len3 = rcli('-n', 3, 'XLEN', 'orders3');
ok($len3 >= 100 && $len3 < 300, "maxlen=100 trims (MAXLEN ~): $len3 of 300 entries left");
is(rcli('-n', 3, 'XLEN', 'orders'), '0', 'database 3 got no other stream');
is(rcli('EXISTS', 'orders3'), '0', 'and database 0 not that one (SELECT came first)');
my @ce = entries('ce');
is(scalar @ce, 1, 'the CloudEvents subscription got its event');
is(decode_json($ce[0][1])->{specversion} . '|' . $ce[0][0], '1.0|c1', 'as a CloudEvent');
is(sql("SELECT count(*) FROM eventgrid.delivery_attempts WHERE http_status IS NOT NULL"), '0',
	'the history records no HTTP status for a Redis reply');

# --- ordering per key (SPEC 13): each key's entries in publish order ----------------
sql("SELECT eventgrid.create_topic('ordered')");
sql("SELECT eventgrid.create_event_subscription('ordered', 'r-ordered', endpoint => '$base/?stream=ordered', "
	  . "endpoint_type => 'RedisStream', ordering_key => 'data.key')");
for my $round (1 .. 3)
{
	sql("INSERT INTO eventgrid.events (topic, event) SELECT 'ordered', jsonb_build_object('id', 'o' || $round || '-' || g, "
		  . "'subject', '/o', 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', "
		  . "'data', jsonb_build_object('key', 'k' || (g % 3), 'n', $round * 1000 + g)) FROM generate_series(1, 100) g");
}
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'r-ordered'", '300'),
	'an ordered subscription\'s 300 events delivered');
my %last;
my $in_order = 1;
for my $e (map { decode_json($_->[1]) } entries('ordered'))
{
	my ($k, $n) = ($e->{data}{key}, $e->{data}{n});
	$in_order = 0 if defined $last{$k} && $n < $last{$k};
	$last{$k} = $n;
}
ok($in_order && keys %last == 3, 'each key\'s entries are in publish order');

# --- a stopped server: SocketError, then delivered on the retry ---------------
stop_redis();
publish_events($node, 'orders', 'b2');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries", '1'), 'with Redis down, the event waits in the retries');
like(outcome_of('r-plain'), qr/SocketError:null$/, 'the attempt was a SocketError');
like(sql("SELECT error FROM eventgrid.delivery_attempts WHERE outcome = 'SocketError' ORDER BY id DESC LIMIT 1"),
	qr/refused|connect/i, 'with hiredis\'s reason');
start_redis();
advance_clock($node, 400);    # past the endpoint's probation and the retry's 10 s
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries", '0'), 'retried once Redis is back');
is(rcli('XLEN', 'orders'), '1', 'the new server has the event (it kept no data)');
is((entries('orders'))[0][0], 'b2', 'b2');

# --- NotFound: a missing stream with mkstream=false; a database that does not exist
sql("SELECT eventgrid.drop_event_subscription('orders', 'r-plain'); SELECT eventgrid.drop_event_subscription('orders', 'r-db3')");
sql("SELECT eventgrid.create_event_subscription('orders', 'r-nomk', endpoint => '$base/?stream=absent&mkstream=false', endpoint_type => 'RedisStream', max_delivery_attempts => 1, deadletter => true)");
sql("SELECT eventgrid.create_event_subscription('orders', 'r-nodb', endpoint => '$base/99?stream=s', endpoint_type => 'RedisStream', max_delivery_attempts => 1, deadletter => true)");
publish_events($node, 'orders', 'n1');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letter_events WHERE last_delivery_outcome = 'NotFound'", '2'),
	'a missing stream (mkstream=false) and a missing database are NotFound, dead-lettered');
is(rcli('EXISTS', 'absent'), '0', 'NOMKSTREAM made no stream');
is(rcli('EXISTS', 's'), '0', 'nothing was written to database 0 for database 99');
like(sql("SELECT response_body FROM eventgrid.delivery_attempts WHERE subscription = 'r-nodb'"),
	qr/DB index is out of range/, 'the history keeps Redis\'s error');
is(sql("SELECT last_http_status_code IS NULL FROM eventgrid.dead_letter_events WHERE subscription_name = 'r-nomk'"), 't',
	'no HTTP status in the dead letter');
sql("SELECT eventgrid.drop_event_subscription('orders', 'r-nomk'); SELECT eventgrid.drop_event_subscription('orders', 'r-nodb')");

# --- credentials: requirepass and an ACL user; Unauthorized without -----------------
rcli('CONFIG', 'SET', 'requirepass', 'sesame');
rcli('-a', 'sesame', '--no-auth-warning', 'ACL', 'SETUSER', 'app', 'on', '>app-secret', '~app:*', '+xadd', '+select', '+ping');
rcli('-a', 'sesame', '--no-auth-warning', 'CLIENT', 'KILL', 'TYPE', 'normal');    # the worker's connection was let in before
sub rauth { return rcli('-a', 'sesame', '--no-auth-warning', @_) }
sql("SELECT eventgrid.create_event_subscription('orders', 'r-auth', endpoint => '$base/?stream=locked', endpoint_type => 'RedisStream', deadletter => true)");
sql("SELECT eventgrid.create_event_subscription('orders', 'r-pass', endpoint => 'redis://:sesame\@127.0.0.1:$rport/?stream=open', endpoint_type => 'RedisStream')");
sql("SELECT eventgrid.create_event_subscription('orders', 'r-user', endpoint => 'redis://app:app-secret\@127.0.0.1:$rport/2?stream=app:s', endpoint_type => 'RedisStream')");
sql("SELECT eventgrid.create_event_subscription('orders', 'r-wrong', endpoint => 'redis://app:nope\@127.0.0.1:$rport/?stream=app:t', endpoint_type => 'RedisStream', deadletter => true)");
is(sql("SELECT string_agg(endpoint, ' ' ORDER BY name) FROM eventgrid.event_subscriptions WHERE name IN ('r-pass', 'r-user')"),
	"redis://127.0.0.1:$rport/?stream=open redis://127.0.0.1:$rport/2?stream=app:s", 'the stored endpoints hold no credentials');
is(sql("SELECT string_agg(coalesce(c.user_name, '-') || ':' || c.secret, ' ' ORDER BY s.name) FROM eventgrid.destination_credentials c "
	  . "JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id"), '-:sesame app:app-secret app:nope',
	'they are in destination_credentials');
sql("CREATE ROLE redis_admin LOGIN IN ROLE eventgrid_admin");
like(fails("SELECT * FROM eventgrid.destination_credentials", 'redis_admin'), qr/42501/, 'which an admin cannot read');
my $leak = fails("SELECT eventgrid.create_event_subscription('orders', 'bad', endpoint => 'redis://:sesame\@127.0.0.1:70000/?stream=s', endpoint_type => 'RedisStream')");
like($leak, qr/22023.*redis:\/\/\*\*\*\@127/s, 'a malformed URL\'s error masks its credentials');
unlike($leak, qr/sesame/, 'and never shows the password');
publish_events($node, 'orders', 'u1');
ok(wait_for_sql($node, "SELECT last_delivery_outcome || '/' || dead_letter_reason FROM eventgrid.dead_letter_events WHERE subscription_name = 'r-auth'",
	'Unauthorized/NonRetriableError'), 'without credentials NOAUTH is Unauthorized, not retried');
ok(wait_for_sql($node, "SELECT last_delivery_outcome || '/' || dead_letter_reason FROM eventgrid.dead_letter_events WHERE subscription_name = 'r-wrong'",
	'Unauthorized/NonRetriableError'), 'a refused AUTH (WRONGPASS) is Unauthorized');
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'r-pass'", '1'), 'with the password: delivered');
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'r-user'", '1'), 'as the ACL user: delivered');
is(rauth('XLEN', 'open') . '/' . rauth('-n', '2', 'XLEN', 'app:s'), '1/1', 'the entries are there');
unlike(slurp_file($node->logfile) =~ s/statement: [^\n]*//gir, qr/sesame|app-secret/, 'no credential in the server log but the statements themselves');
# a new endpoint brings its own credentials, or none
sql("SELECT eventgrid.update_event_subscription('orders', 'r-pass', endpoint => '$base/?stream=open')");
is(sql("SELECT count(*) FROM eventgrid.destination_credentials c JOIN eventgrid.event_subscriptions s ON s.id = c.subscription_id WHERE s.name = 'r-pass'"),
	'0', 'an endpoint without credentials removes them');
sql("SELECT eventgrid.update_event_subscription('orders', 'r-pass', endpoint => 'redis://:sesame\@127.0.0.1:$rport/?stream=open')");
publish_events($node, 'orders', 'u2');
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'r-pass'", '2'), 'and one with them delivers again');
rauth('CONFIG', 'SET', 'requirepass', '');
sql("SELECT eventgrid.drop_event_subscription('orders', '$_')") for qw(r-auth r-pass r-user r-wrong);
is(sql("SELECT count(*) FROM eventgrid.destination_credentials"), '0', 'dropped with their subscriptions');

# --- Full: maxmemory with noeviction, then room -----------------------------------
rcli('CONFIG', 'SET', 'maxmemory-policy', 'noeviction');
rcli('CONFIG', 'SET', 'maxmemory', '1');
sql("SELECT eventgrid.create_event_subscription('orders', 'r-full', endpoint => '$base/?stream=full', endpoint_type => 'RedisStream')");
publish_events($node, 'orders', 'f1');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries r JOIN eventgrid.event_subscriptions s ON s.id = r.subscription_id "
	  . "WHERE s.name = 'r-full' AND r.last_outcome = 'Full'", '1'), 'OOM is Full, retried');
like(sql("SELECT response_body FROM eventgrid.delivery_attempts WHERE subscription = 'r-full'"), qr/^OOM/, 'with Redis\'s OOM text');
rcli('CONFIG', 'SET', 'maxmemory', '0');
advance_clock($node, 400);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries", '0'), 'delivered once Redis has room');
is((entries('full'))[0][0], 'f1', 'f1 is in the stream');

# --- TimedOut: a server that stops answering --------------------------------------
$redis->signal('STOP');
publish_events($node, 'orders', 't1');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.delivery_attempts WHERE subscription = 'r-full' AND outcome = 'TimedOut'", '1'),
	'no reply within eventgrid.response_timeout is TimedOut');
$redis->signal('CONT');
advance_clock($node, 400);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries", '0'), 'and delivered on the retry');
ok(scalar(grep { $_->[0] eq 't1' } entries('full')) >= 1, 't1 is in the stream (at least once)');

# --- kill -9 of the delivery worker: nothing lost ----------------------------------
# Redis holds writes back (CLIENT PAUSE ... WRITE): the worker's XADDs are
# on the wire, unanswered, when it is killed
sql("SELECT eventgrid.create_event_subscription('orders', 'r-many', endpoint => '$base/?stream=many', endpoint_type => 'RedisStream')");
rcli('CLIENT', 'PAUSE', '4000', 'WRITE');
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'orders', jsonb_build_object('id', 'k' || g, 'subject', '/k', "
	  . "'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', 'data', g) FROM generate_series(1, 3000) g");
ok(wait_for_sql($node, "SELECT count(*) > 0 FROM eventgrid.chunks_in_flight", 't', 10), 'requests are in flight');
is(rcli('XLEN', 'many'), '0', 'and none answered yet');
my $pid = sql("SELECT pid FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker' AND datname = 'postgres' LIMIT 1");
ok($pid =~ /^\d+$/ && kill('KILL', $pid), "the delivery worker ($pid) killed mid-run");
# the postmaster restarts every process after a crashed worker
ok(wait_for_sql($node, "SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'eventgrid delivery worker' AND pid <> $pid", 't', 60),
	'a new delivery worker runs');
sleep(4);                     # the pause ends
advance_clock($node, 400);    # what the crash charged an attempt is due again
ok(wait_for_sql($node, "SELECT pending || '/' || retrying FROM eventgrid.delivery_statistics WHERE subscription = 'r-many'", '0/0', 180),
	'the run finished after the restart');
my %seen = map { $_->[0] => 1 } entries('many');
is(scalar(grep { !$seen{"k$_"} } 1 .. 3000), 0, 'every one of the 3,000 events is in the stream');

# --- update: the type changes with the endpoint -----------------------------------
my $r = start_receiver();
like(fails("SELECT eventgrid.update_event_subscription('orders', 'r-many', endpoint_type => 'WebHook')"),
	qr/22023.*endpoint of type WebHook must be an http/s, 'the type alone cannot change');
sql("SELECT eventgrid.update_event_subscription('orders', 'r-many', endpoint => '$r->{url}/hook', endpoint_type => 'WebHook')");
publish_events($node, 'orders', 'w1');
ok(wait_for_requests($r, '/hook', 1), 'back to a webhook: delivered over HTTP');
sql("SELECT eventgrid.update_event_subscription('orders', 'r-many', endpoint => '$base/?stream=again', endpoint_type => 'RedisStream')");
publish_events($node, 'orders', 'w2');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries", '0'), 'and again to Redis');
for (1 .. 50) { last if rcli('XLEN', 'again') eq '1'; usleep(100_000) }
is((entries('again'))[0][0], 'w2', 'the stream has w2');

# --- stream_from=subject: each event's subject is its stream's key ----------------
sql("SELECT eventgrid.create_event_subscription('orders', 'r-subject', endpoint => '$base/?stream_from=subject', "
	  . "endpoint_type => 'RedisStream', subject_begins_with => '/orders/sub', max_delivery_attempts => 1, deadletter => true)");
publish_events($node, 'orders', 'sub1', 'sub2', 'sub1b');
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('orders', '" . eg_event('sub3', subject => '/orders/sub' . ('x' x 600)) . "')");
ok(wait_for_sql($node, "SELECT delivered || '/' || dead_lettered FROM eventgrid.delivery_statistics WHERE subscription = 'r-subject'", '3/1'),
	'three delivered, one dead-lettered');
is(join(',', map { rcli('XLEN', $_) } '/orders/sub1', '/orders/sub2', '/orders/sub1b'), '1,1,1', 'each into the stream its subject names');
is(sql("SELECT last_delivery_outcome FROM eventgrid.dead_letter_events WHERE subscription_name = 'r-subject'"), 'InvalidHeader',
	'a subject over 512 bytes cannot name a stream: InvalidHeader');

# --- stream_from=ordering_key: each event's ordering key is its stream's key -------
like(fails("SELECT eventgrid.create_event_subscription('ordered', 'r-bykey', endpoint => '$base/?stream_from=ordering_key', endpoint_type => 'RedisStream')"),
	qr/22023.*routes by the ordering key needs an ordering_key.*HINT:.*ordering_key =>/s,
	'stream_from=ordering_key needs the subscription\'s ordering_key');
sql("SELECT eventgrid.drop_event_subscription('ordered', 'r-ordered')");
sql("SELECT eventgrid.create_event_subscription('ordered', 'r-bykey', endpoint => '$base/?stream_from=ordering_key', "
	  . "endpoint_type => 'RedisStream', ordering_key => 'data.key', deadletter => true)");
like(fails("SELECT eventgrid.update_event_subscription('ordered', 'r-bykey', ordering_key => '')"),
	qr/22023.*needs an ordering_key/s, 'nor may an update take the ordering_key away');
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'ordered', jsonb_build_object('id', 'ok' || g, 'subject', '/ok', "
	  . "'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('key', 'okey-' || (g % 3), 'n', g)) "
	  . "FROM generate_series(1, 60) g");
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('ordered', '" . eg_event('ok-nokey') . "')");
ok(wait_for_sql($node, "SELECT delivered || '/' || dead_lettered FROM eventgrid.delivery_statistics WHERE subscription = 'r-bykey'", '60/1'),
	'60 keyed events delivered, the one without a key dead-lettered');
is(join(' | ', map { my $k = $_; join(',', map { my $e = decode_json($_->[1]); $e->{data}{key} eq "okey-$k" ? $e->{data}{n} : 'wrong' } entries("okey-$k")) } 0 .. 2),
	join(' | ', map { my $k = $_; join(',', grep { $_ % 3 == $k } 1 .. 60) } 0 .. 2),
	'each into the stream its ordering key names, in publish order');
is(sql("SELECT last_delivery_outcome FROM eventgrid.dead_letter_events WHERE subscription_name = 'r-bykey'"), 'InvalidHeader',
	'an event without an ordering key names no stream: InvalidHeader');

# --- rediss://: TLS verified against eventgrid.ssl_ca_file, the host name checked ---
# (only where this build's hiredis has TLS: 1.0 or later; Debian 12's has none)
if (sql("SELECT eventgrid._endpoint_problem('rediss://localhost/?stream=s') IS NULL") ne 't')
{
	like(fails("SELECT eventgrid.create_event_subscription('orders', 'r-tls', endpoint => 'rediss://localhost:6380/?stream=tls', endpoint_type => 'RedisStream')"),
		qr/22023.*needs hiredis 1\.0 or later with TLS/s, 'a build whose hiredis has no TLS refuses rediss:// (22023)');
}
else
{
	my $tdir = PostgreSQL::Test::Utils::tempdir();
	make_ca($tdir, 'ca', 2);
	issue_certificate($tdir, 'ca', 'redis', 'DNS:localhost', '-days', 2);    # localhost only: 127.0.0.1 must fail
	my $tport = PostgreSQL::Test::Cluster::get_free_port();
	my ($tout, $terr) = ('', '');
	my $tls_redis = IPC::Run::start([ 'redis-server', '--port', '0', '--tls-port', $tport, '--bind', '127.0.0.1',
			'--tls-cert-file', "$tdir/redis.pem", '--tls-key-file', "$tdir/redis.key", '--tls-ca-cert-file', "$tdir/ca.pem",
			'--tls-auth-clients', 'no', '--save', '', '--appendonly', 'no', '--dir', $tdir ], '>', \$tout, '2>', \$terr);
	my @tcli = ('redis-cli', '--tls', '--cacert', "$tdir/ca.pem", '-h', 'localhost', '-p', $tport);
	my $tcli = sub { my ($o, $e) = ('', ''); IPC::Run::run([ @tcli, @_ ], '>', \$o, '2>', \$e); chomp $o; return $o };
	for (1 .. 100) { last if $tcli->('PING') eq 'PONG'; usleep(100_000) }
	is($tcli->('PING'), 'PONG', 'a redis-server with TLS runs');
	sql("ALTER SYSTEM SET eventgrid.ssl_ca_file = '$tdir/ca.pem'; SELECT pg_reload_conf()");
	sql("SELECT eventgrid.create_event_subscription('orders', 'r-tls', endpoint => 'rediss://localhost:$tport/?stream=tls', endpoint_type => 'RedisStream', subject_begins_with => '/orders/tls')");
	sql("SELECT eventgrid.create_event_subscription('orders', 'r-tls-ip', endpoint => 'rediss://127.0.0.1:$tport/?stream=tls', endpoint_type => 'RedisStream', subject_begins_with => '/orders/tls')");
	publish_events($node, 'orders', 'tls1');
	ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'r-tls'", '1'),
		'rediss:// verified against eventgrid.ssl_ca_file: delivered');
	ok(wait_for_sql($node, "SELECT count(*) > 0 FROM eventgrid.delivery_attempts WHERE subscription = 'r-tls-ip' AND outcome = 'SocketError'", 't'),
		'a certificate that does not name the host is refused (SocketError)');
	is($tcli->('XLEN', 'tls'), '1', 'only the verified connection wrote');
	sql("SELECT eventgrid.drop_event_subscription('orders', '$_')") for qw(r-tls r-tls-ip);
	sql("ALTER SYSTEM RESET eventgrid.ssl_ca_file; SELECT pg_reload_conf()");
	$tls_redis->signal('TERM');
	$tls_redis->finish;
}

# --- a queue subscription takes no endpoint type ------------------------------------
sql("SELECT eventgrid.create_topic('ns-topic', 'CloudEventSchemaV1_0', 'namespace')");
like(fails("SELECT eventgrid.create_event_subscription('ns-topic', 'q', delivery_mode => 'queue', endpoint_type => 'RedisStream')"),
	qr/22023.*queue event subscription: it has no endpoint type/s, 'a queue subscription takes no endpoint type');

done_testing();
