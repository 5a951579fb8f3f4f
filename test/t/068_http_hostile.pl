# The HTTP data plane against hostile clients (issue "Trust, fifth pass",
# item 3), each written here with raw sockets, while a probe from another
# address publishes with a good key and must be answered within a second:
#   - connections that send one byte (or a partial request) and close, 100
#     a second: each frees its slot at once (0.21.0 kept them until
#     eventgrid.http_connection_timeout: libmicrohttpd's edge-triggered
#     epoll missed the FIN that came with the data);
#   - slowloris (a header line a second, never a whole request): cut after
#     eventgrid.http_request_timeout, and one address holds at most
#     eventgrid.http_max_connections_per_address connections;
#   - long polls of one topic's key hold at most their share of
#     eventgrid.http_max_requests_in_flight: a publish to another database
#     and to another topic is answered at once;
#   - an unauthenticated client cannot tell existing databases and topics
#     from missing ones: the same 401, byte for byte; a prefix of a key, an
#     empty key, a SAS token whose expiry is 'infinity', 'tomorrow' or
#     'epoch' (signed right) are refused;
#   - JSON nested 100,000 deep is 400 (no ERROR in the log); a body of
#     exactly 1 MB is taken, one byte more is 413;
#   - one bad event among 5,000 is 400 naming its index, nothing is stored,
#     and it costs no transaction id per event (0.21.0 tried each event in a
#     subtransaction of its own);
#   - a domain event whose topic is a path of another domain, or not a
#     domain topic name, is 400;
#   - libmicrohttpd's messages about such clients are rate-limited in the
#     log.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use Digest::SHA qw(hmac_sha256);
use IO::Select;
use IO::Socket::INET;
use JSON::PP;
use MIME::Base64 qw(decode_base64 encode_base64);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $port = PostgreSQL::Test::Cluster::get_free_port();
my $node = new_node('http_hostile',
	'eventgrid.http_port' => $port,
	'eventgrid.http_max_connections' => 60,
	'eventgrid.http_max_connections_per_address' => 20,
	'eventgrid.http_request_timeout' => "'3s'",
	'eventgrid.http_max_requests_in_flight' => 8,
	'eventgrid.event_table_rotation' => "'1h'");
my $json = JSON::PP->new->canonical;
sub sql { return $node->safe_psql('postgres', shift) }

sql("SELECT eventgrid.create_topic('orders')");
sql("SELECT eventgrid.create_topic('custom', 'CustomEventSchema')");
sql("SELECT eventgrid.create_domain('tenants')");
sql("SELECT eventgrid.create_topic('jobs', 'CloudEventSchemaV1_0', 'namespace')");
sql("SELECT eventgrid.create_event_subscription('jobs', 'workers', delivery_mode => 'queue')");
sql("CREATE DATABASE other");
$node->safe_psql('other', "CREATE EXTENSION eventgrid; SELECT eventgrid.create_topic('billing')");
my %key = map { $_ => sql("SELECT key1 FROM eventgrid.topic_keys WHERE topic = '$_'") } qw(orders custom tenants jobs);
my $billing_key = $node->safe_psql('other', "SELECT key1 FROM eventgrid.topic_keys WHERE topic = 'billing'");

# One HTTP request over a new connection from address $from: (status, body, seconds); status 0 when the
# connection was refused or closed without an answer.
sub http
{
	my (%a) = @_;
	my $t0 = time;
	my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, LocalAddr => $a{from} // '127.0.0.2',
		Proto => 'tcp', Timeout => 10) or return (0, "connect: $!", time - $t0);
	my $body = $a{body} // '';
	my $headers = $a{headers} // {};
	my $req = ($a{method} // 'POST') . " $a{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
	  . 'Content-Length: ' . length($body) . "\r\n" . join('', map { "$_: $headers->{$_}\r\n" } sort keys %$headers)
	  . "\r\n" . $body;
	while (length $req)
	{
		my $n = syswrite($s, $req);
		last unless defined $n;
		substr($req, 0, $n, '');
	}
	my $resp = '';
	my $sel = IO::Select->new($s);
	my $deadline = $t0 + ($a{timeout} // 30);
	while (time < $deadline && $sel->can_read($deadline - time))
	{
		my $n = sysread($s, my $buf, 65536);
		last unless $n;
		$resp .= $buf;
	}
	close $s;
	my ($status) = $resp =~ m{^HTTP/1\.\d (\d{3})};
	my ($rbody) = $resp =~ /\r\n\r\n(.*)\z/s;
	return ($status // 0, $rbody // '', time - $t0);
}

my $event = $json->encode([ { id => 'p', subject => 's', eventType => 'T', eventTime => '2026-01-01T00:00:00Z',
	data => {}, dataVersion => '1' } ]);
sub publish_orders
{
	my (%a) = @_;
	return http(path => '/postgres/topics/orders/api/events', body => $event,
		headers => { 'aeg-sas-key' => $key{orders}, 'Content-Type' => 'application/json' }, %a);
}

# probes from 127.0.0.2 every 0.4 s while $attack runs; returns the slowest answer's seconds (99 if one failed)
sub probe_during
{
	my ($attack, $seconds) = @_;
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		$SIG{TERM} = $SIG{INT} = 'DEFAULT';
		$attack->(time + $seconds);
		POSIX::_exit(0);
	}
	my $worst = 0;
	my $n = 0;
	my $t_end = time + $seconds;
	usleep(500_000);
	while (time < $t_end)
	{
		my ($status, undef, $took) = publish_orders(timeout => 10);
		$n++;
		$took = 99 if $status != 200;
		$worst = $took if $took > $worst;
		usleep(400_000);
	}
	waitpid($pid, 0);
	return ($worst, $n);
}
use POSIX ();

my ($status, $body, $took) = publish_orders();
is($status, 200, 'the probe publishes with a good key');

# --- one byte and close, 100 connections a second
my ($worst, $n) = probe_during(sub {
	my ($until) = @_;
	while (time < $until)
	{
		my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, LocalAddr => '127.0.0.3', Proto => 'tcp');
		if ($s) { syswrite($s, 'P'); close $s; }
		usleep(10_000);
	}
}, 8);
cmp_ok($worst, '<', 1, "one byte and a close, 100 a second for 8 s: each of $n probes answered within a second (slowest ${worst} s)");

# --- a partial request and close
($worst, $n) = probe_during(sub {
	my ($until) = @_;
	while (time < $until)
	{
		my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, LocalAddr => '127.0.0.3', Proto => 'tcp');
		if ($s) { syswrite($s, "POST /postgres/topics/orders/api/events HTTP/1.1\r\nContent-Le"); close $s; }
		usleep(10_000);
	}
}, 5);
cmp_ok($worst, '<', 1, "a partial request and a close, 100 a second: $n probes each answered within a second (slowest ${worst} s)");

# --- slowloris from one address: 100 clients, a header line a second
my $cut_after = 0;
($worst, $n) = probe_during(sub {
	my ($until) = @_;
	my @socks;
	my %opened;
	while (time < $until)
	{
		while (@socks < 100)
		{
			my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, LocalAddr => '127.0.0.4', Proto => 'tcp')
			  or last;
			syswrite($s, "POST /postgres/topics/orders/api/events HTTP/1.1\r\nHost: x\r\n");
			$opened{$s} = time;
			push @socks, $s;
		}
		@socks = grep { defined syswrite($_, "X-Slow-" . int(rand(1e6)) . ": 1\r\n") } @socks;
		sleep 1;
	}
	close $_ for @socks;
}, 12);
cmp_ok($worst, '<', 1, "slowloris, 100 clients from one address: $n probes each answered within a second (slowest ${worst} s)");

# a slowloris connection is cut after eventgrid.http_request_timeout (3 s), not http_connection_timeout (30 s)
{
	my $s = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, LocalAddr => '127.0.0.5', Proto => 'tcp');
	my $t0 = time;
	syswrite($s, "POST /postgres/topics/orders/api/events HTTP/1.1\r\n");
	my $closed;
	my $sel = IO::Select->new($s);
	while (time - $t0 < 20)
	{
		last unless defined syswrite($s, "X-Slow: 1\r\n");
		if ($sel->can_read(0.5))
		{
			my $n = sysread($s, my $buf, 1024);
			if (!$n) { $closed = time - $t0; last; }
		}
	}
	ok(defined $closed && $closed < 6, sprintf('a client sending a header line every half second is cut after the request timeout (%.1f s)',
		$closed // -1));
}

# eventgrid.http_max_connections_per_address: the 21st connection from one address is closed at once
{
	my @held = map { IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, LocalAddr => '127.0.0.6', Proto => 'tcp') } 1 .. 20;
	usleep(300_000);
	my $extra = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, LocalAddr => '127.0.0.6', Proto => 'tcp');
	my $sel = IO::Select->new($extra);
	my $gone = $sel->can_read(2) && !sysread($extra, my $buf, 10);
	ok($gone, 'a 21st connection from one address is closed at once (eventgrid.http_max_connections_per_address = 20)');
	($status, undef, $took) = publish_orders();
	ok($status == 200 && $took < 1, 'while another address publishes');
	close $_ for grep { defined } @held, $extra;
}

# --- long polls of one key hold at most their share of the requests in flight (8: a quarter is 2)
my @polls;
for my $i (1 .. 32)
{
	my $pid = fork();
	die "fork: $!" unless defined $pid;
	if ($pid == 0)
	{
		$SIG{TERM} = $SIG{INT} = 'DEFAULT';
		http(from => '127.0.0.' . (10 + $i % 4), path => '/postgres/topics/jobs/eventsubscriptions/workers:receive?maxEvents=1&maxWaitTime=10',
			body => '', headers => { 'aeg-sas-key' => $key{jobs} }, timeout => 200);
		POSIX::_exit(0);
	}
	push @polls, $pid;
}
ok($node->poll_query_until('postgres', "SELECT count(*) = 2 FROM pg_stat_activity WHERE application_name = 'eventgrid HTTP listener'"
		  . " AND state = 'active' AND query LIKE '%_http_namespace%'"), 'the long polls of one key run two at a time (their share)');
sleep 1;
is(sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'eventgrid HTTP listener'"
		  . " AND state = 'active' AND query LIKE '%_http_namespace%'"), '2', 'and no more while 30 others wait');
($status, undef, $took) = http(path => '/other/topics/billing/api/events', body => $event,
	headers => { 'aeg-sas-key' => $billing_key, 'Content-Type' => 'application/json' });
ok($status == 200 && $took < 1, sprintf('a publish to another database is answered at once (%d, %.2f s)', $status, $took));
($status, undef, $took) = publish_orders();
ok($status == 200 && $took < 1, sprintf('and to another topic of the same database (%d, %.2f s)', $status, $took));
# (KILL: a child that dies of a caught TERM would run the test's END blocks, which stop the node)
kill 'KILL', @polls;
waitpid($_, 0) for @polls;

# --- nothing tells an unauthenticated client which databases and topics exist
my @answers = (
	[ 'no key, existing topic', http(path => '/postgres/topics/orders/api/events', body => $event, headers => { 'Content-Type' => 'application/json' }) ],
	[ 'wrong key, existing topic', http(path => '/postgres/topics/orders/api/events', body => $event,
		headers => { 'aeg-sas-key' => $key{custom}, 'Content-Type' => 'application/json' }) ],
	[ 'missing topic', http(path => '/postgres/topics/nosuch/api/events', body => $event,
		headers => { 'aeg-sas-key' => $key{orders}, 'Content-Type' => 'application/json' }) ],
	[ 'missing database', http(path => '/nosuchdb/topics/orders/api/events', body => $event,
		headers => { 'aeg-sas-key' => $key{orders}, 'Content-Type' => 'application/json' }) ],
	[ 'missing namespace topic', http(path => '/postgres/topics/nosuch/eventsubscriptions/workers:receive', body => '',
		headers => { 'aeg-sas-key' => $key{jobs} }) ],
	[ 'no key, existing namespace topic', http(path => '/postgres/topics/jobs/eventsubscriptions/workers:receive', body => '') ],
	[ 'a prefix of the key', http(path => '/postgres/topics/orders/api/events', body => $event,
		headers => { 'aeg-sas-key' => substr($key{orders}, 0, 43), 'Content-Type' => 'application/json' }) ],
	[ 'an empty key', http(path => '/postgres/topics/orders/api/events', body => $event,
		headers => { 'aeg-sas-key' => '', 'Content-Type' => 'application/json' }) ]);
my $first = $answers[0][2];
like($first, qr/^\{"error": \{"code": "Unauthorized"/, 'no key: 401 Unauthorized');
for my $a (@answers)
{
	is("$a->[1] $a->[2]", "401 $first", "$a->[0]: the same 401, byte for byte");
}

# --- SAS tokens: signed right, with an expiry that is not a date and time
sub sas
{
	my ($resource, $expiry, $k) = @_;
	my $enc = sub { my $v = shift; $v =~ s/([^A-Za-z0-9\-_.~])/sprintf('%%%02X', ord($1))/ge; return $v };
	my $signed = 'r=' . $enc->($resource) . '&e=' . $enc->($expiry);
	my $sig = encode_base64(hmac_sha256($signed, decode_base64($k)), '');
	return $signed . '&s=' . $enc->($sig);
}
my $resource = "http://127.0.0.1:$port/postgres/topics/orders/api/events";
for my $e ('11/28/2099 5:15:33 PM', '2099-11-28 17:15:33.201349+00:00')
{
	($status) = http(path => '/postgres/topics/orders/api/events', body => $event,
		headers => { 'aeg-sas-token' => sas($resource, $e, $key{orders}), 'Content-Type' => 'application/json' });
	is($status, 200, "a SAS token expiring '$e' is taken");
}
for my $e ('infinity', 'tomorrow', 'epoch', 'now', '2099-11-28', '99999999999')
{
	($status) = http(path => '/postgres/topics/orders/api/events', body => $event,
		headers => { 'aeg-sas-token' => sas($resource, $e, $key{orders}), 'Content-Type' => 'application/json' });
	is($status, 401, "a signed SAS token expiring '$e' is refused");
}

# --- deeply nested JSON is 400, without an ERROR
my $log_at = -s $node->logfile;
($status, $body) = publish_orders(body => ('[' x 100000) . (']' x 100000));
is($status, 400, 'JSON nested 100,000 deep is 400');
unlike(slurp_file($node->logfile, $log_at), qr/ERROR/, 'and no ERROR in the server log');
($status, $body) = http(path => '/postgres/topics/jobs/eventsubscriptions/workers:acknowledge',
	body => '{"lockTokens": ' . ('[' x 100000) . (']' x 100000) . '}',
	headers => { 'aeg-sas-key' => $key{jobs}, 'Content-Type' => 'application/json' });
is($status, 400, 'so is a namespace operation\'s body');

# --- exactly 1 MB is taken (a custom event written as jsonb prints it), one byte more is 413
my $pad = 1048576 - length('[{"p": ""}]');
my $mb = '[{"p": "' . ('x' x $pad) . '"}]';
is(length($mb), 1048576, 'a body of exactly 1 MB');
($status, $body) = http(path => '/postgres/topics/custom/api/events', body => $mb,
	headers => { 'aeg-sas-key' => $key{custom}, 'Content-Type' => 'application/json' });
is("$status $body", '200 ', 'is taken');
($status) = http(path => '/postgres/topics/custom/api/events', body => $mb . ' ',
	headers => { 'aeg-sas-key' => $key{custom}, 'Content-Type' => 'application/json' });
is($status, 413, 'one byte more is 413');

# --- one bad event among 5,000: validated first, nothing stored, no transaction id per event
my @events = map { { id => "b$_", subject => 's', eventType => 'T', eventTime => '2026-01-01T00:00:00Z', data => {},
	dataVersion => '1' } } 1 .. 5000;
delete $events[4999]{subject};
my $count_before = sql("SELECT count(*) FROM eventgrid.events WHERE topic = 'orders'");
my $xid_before = sql("SELECT pg_current_xact_id()");
($status, $body) = publish_orders(body => $json->encode(\@events));
my $xid_after = sql("SELECT pg_current_xact_id()");
is($status, 400, 'one bad event among 5,000 is 400');
like($body, qr/Event at index 4999: event is missing required field \\"subject\\"/, 'naming its index');
is(sql("SELECT count(*) FROM eventgrid.events WHERE topic = 'orders'"), $count_before, 'none of the request\'s events is stored');
cmp_ok($xid_after - $xid_before, '<', 50, sprintf('and it took %d transaction ids, not one per event', $xid_after - $xid_before));

# --- a domain event names a domain topic of this domain
sub publish_domain
{
	my ($topic) = @_;
	return http(path => '/postgres/topics/tenants/api/events',
		body => $json->encode([ { id => 'd', subject => 's', eventType => 'T', eventTime => '2026-01-01T00:00:00Z',
			data => {}, dataVersion => '1', topic => $topic } ]),
		headers => { 'aeg-sas-key' => $key{tenants}, 'Content-Type' => 'application/json' });
}
is((publish_domain('acme'))[0], 200, 'a domain topic by name');
is((publish_domain('/domains/tenants/topics/acme'))[0], 200, 'by its path in this domain');
($status, $body) = publish_domain('/domains/other/topics/acme');
is($status, 400, 'a path of another domain is 400');
like($body, qr/Event at index 0: the event names its domain topic by a path that is not of domain/, 'saying why');
is((publish_domain('a/b'))[0], 400, 'a name with a slash is 400');
is((publish_domain('x' x 51))[0], 400, 'a name of 51 characters is 400');
is(sql("SELECT string_agg(DISTINCT domain_topic, ',') FROM eventgrid.events WHERE topic = 'tenants'"), 'acme',
	'only the good ones were stored');

# --- what was refused is counted (PublishFailCount by reason; written by the listener every 5 s)
my $failures = 'custom:PayloadTooLarge=1,nosuch:Unauthorized=1,orders:BadRequest=2,orders:Unauthorized=10,tenants:BadRequest=3';
my $got_failures = '';
for (1 .. 100)
{
	$got_failures = join(',', sort split /\n/, sql("SELECT coalesce(topic, 'nosuch') || ':' || outcome || '=' || requests_total"
		  . " FROM eventgrid.topic_publish_metrics WHERE outcome <> 'Success'"));
	last if $got_failures eq $failures;
	usleep(200_000);
}
is($got_failures, $failures, 'the refused publish requests are counted per topic (none for a missing one) and reason');
is(sql("SELECT value FROM eventgrid.metrics WHERE topic = 'orders' AND metric_name = 'PublishFailCount'"), '12',
	'metrics: PublishFailCount of orders');
like(sql("SELECT requests_total || ' ' || (latency_seconds_sum > 0) FROM eventgrid.topic_publish_metrics WHERE topic = 'orders'"
		  . " AND outcome = 'Success'"), qr/^\d+ true$/, 'the successes with their latency (PublishSuccessLatencyInMs)');

# --- the log: libmicrohttpd's messages about clients rate-limited
my @lines = grep { /eventgrid HTTP listener: (?!serving)/ } split /\n/, slurp_file($node->logfile);
cmp_ok(scalar(@lines), '<=', 40, sprintf('the listener logged %d lines about thousands of hostile connections', scalar @lines));

$node->stop;
done_testing();
