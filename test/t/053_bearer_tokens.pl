# Bearer tokens (SPEC 12): a real OAuth 2.0 token server (the npm package
# oauth2-mock-server, over HTTPS with a CA openssl makes here) and a
# receiver that verifies every token with jose against the server's JWKS
# (test/oauth/server.js).
#
#  - set_oauth2_authentication() / set_entra_authentication() refuse bad
#    fields (22004, 22023), an Authorization delivery property excludes
#    delivery authentication and the other way round (55000), and only
#    eventgrid_admin may call them; the secret is readable by nobody else;
#  - 3,000 events over several token lifetimes, through two delivery
#    workers and two subscriptions (one batching) with the same
#    credentials: every request carries a valid token of the right client
#    and audience, and one token request is made per lifetime, not one per
#    worker or subscription (HTTP Basic, scope and audience in the form);
#  - with a steady flow, the next token is asked for while the last serves;
#  - a token the receiver revokes (401): dropped, the events sent again at
#    once with a new token, no attempt charged; a 401 to a new token is the
#    attempt's outcome (Unauthorized, not retried);
#  - the token endpoint refusing the client (its answer in the attempt's
#    error, never the secret), and down then back: attempts fail with
#    GenericError and are retried on the schedule, then delivered;
#  - Microsoft Entra ID through eventgrid.entra_authority (client secret in
#    the form, scope {application ID URI}/.default, the token's audience);
#  - a validation handshake carries the token;
#  - a client certificate and a bearer token together, through nginx
#    demanding the certificate in front of the receiver;
#  - 2,100 subscriptions with a client each (more than the workers keep,
#    and than the 64 token slots of shared memory): two rounds, every
#    request with a token of its own client, at most a token request per
#    client, worker and round;
#  - no secret or token in the server log, the attempt history, the views or
#    a dump; pg_dump/pg_restore keeps the credentials; the metrics view
#    counts token requests and failures; remove_delivery_authentication().
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
use MIME::Base64 ();
use Time::HiRes qw(time usleep);

my $dir = PostgreSQL::Test::Utils::tempdir;
my $json = JSON::PP->new;
my $tenant = '11111111-2222-3333-4444-555555555555';
my %secret = (orders => 'orders-secret-7f3a9c21', 'entra-app' => 'entra-secret-51d2e8b4',
	map { ("many-$_" => "many-secret-$_") } 1 .. 2100);    # a client each, more than the workers keep (below)

# --- the token server and the receiver
make_ca($dir, 'server-ca', 30);
issue_certificate($dir, 'server-ca', 'server', 'IP:127.0.0.1', '-days', '30');
issue_certificate($dir, 'server-ca', 'eventgrid-client', undef, '-days', '30');    # mutual TLS, below
open(my $fh, '>', "$dir/clients.json") or die;
print $fh $json->encode(\%secret);
close($fh);
my ($tport, $rport) = map { PostgreSQL::Test::Cluster::get_free_port() } 1 .. 2;
my ($out, $err) = ('', '');
local $ENV{NODE_PATH} = '/usr/share/nodejs';    # Debian's express, cors, basic-auth
local $ENV{NODE_EXTRA_CA_CERTS} = "$dir/server-ca.pem";    # the receiver fetches the JWKS over HTTPS
my $oauth = IPC::Run::start([ 'node', "$FindBin::RealBin/../oauth/server.js", $dir, $tport, $rport ],
	'>', \$out, '2>', \$err);
for (1 .. 100) { last if -f "$dir/ready"; usleep(100_000); }
ok(-f "$dir/ready", 'the token server and the receiver run') or BAIL_OUT("node: $err");
my $token_endpoint = "https://127.0.0.1:$tport/$tenant/oauth2/v2.0/token";
my $hook = "http://127.0.0.1:$rport/hook";
my $http = HTTP::Tiny->new;
sub control { my $r = $http->get("http://127.0.0.1:$rport/control/$_[0]"); die "control $_[0]" unless $r->{success}; }

sub jsonl
{
	my ($file) = @_;
	return () unless -f "$dir/$file";
	return map { $json->decode($_) } grep { /\S/ } split /\n/, slurp_file("$dir/$file");
}
sub token_requests { my ($client, $scope) = @_; grep { ($_->{client_id} // '') eq $client && ($_->{scope} // '') eq $scope } jsonl('token_requests.jsonl') }
sub received { my ($path) = @_; grep { $_->{path} eq $path } jsonl('receiver.jsonl') }

my $node = new_node('tokens',
	'eventgrid.ssl_ca_file' => "'$dir/server-ca.pem'",
	'eventgrid.entra_authority' => "'https://127.0.0.1:$tport'",
	'eventgrid.delivery_workers' => 2,
	'eventgrid.response_timeout' => "'10s'",
	log_statement => "'none'");    # the README: statements that set secrets must not be logged
$node->safe_psql('postgres', q{
	CREATE ROLE tok_admin LOGIN IN ROLE eventgrid_admin;
	CREATE ROLE tok_nobody LOGIN;
	SELECT eventgrid.create_topic('orders');
	SELECT eventgrid.create_event_subscription('orders', 'refused', 'http://127.0.0.1:9/');
});

# --- refusals
like(sql_error($node, "SELECT eventgrid.set_oauth2_authentication('orders', 'refused', NULL, 'c', 's')"),
	qr/22004.*token_endpoint must not be NULL/s, 'NULL token endpoint: 22004');
like(sql_error($node, "SELECT eventgrid.set_oauth2_authentication('orders', 'refused', 'ftp://x/token', 'c', 's')"),
	qr/22023.*invalid endpoint/s, 'a token endpoint that is not http(s): 22023');
like(sql_error($node, "SELECT eventgrid.set_oauth2_authentication('orders', 'refused', 'http://auth.example.com/token', 'c', 's')"),
	qr/22023.*must be an https URL/s, 'a plain http token endpoint elsewhere than this machine: 22023 (the secret goes to it)');
like(sql_error($node, "SELECT eventgrid.set_oauth2_authentication('orders', 'refused', '$token_endpoint', 'c', E'pass\\nword')"),
	qr/22023.*client_secret must not hold control characters/s, 'a secret with a line break: 22023');
unlike(sql_error($node, "SELECT eventgrid.set_oauth2_authentication('orders', 'refused', '$token_endpoint', 'c', E'pass\\nword')"),
	qr/pass/, 'the refused secret is not quoted');
like(sql_error($node, "SELECT eventgrid.set_oauth2_authentication('orders', 'refused', '$token_endpoint', '', 's')"),
	qr/22023.*client_id must be 1 to 500 bytes/s, 'an empty client id: 22023');
like(sql_error($node, "SELECT eventgrid.set_entra_authentication('orders', 'refused', 'not a tenant', 'api://x', 'c', 's')"),
	qr/22023.*invalid tenant_id/s, 'a tenant id with spaces: 22023');
like(sql_error($node, "SELECT eventgrid.set_oauth2_authentication('orders', 'nosuch', '$token_endpoint', 'c', 's')"),
	qr/42704/, 'no such subscription: 42704');
like(sql_error($node, "SELECT eventgrid.remove_delivery_authentication('orders', 'refused')"),
	qr/42704.*has no delivery authentication/s, 'removing what is not there: 42704');
like(sql_error($node, "SELECT eventgrid.set_oauth2_authentication('orders', 'refused', '$token_endpoint', 'c', 's')", 'tok_nobody'),
	qr/42501/, 'a role without eventgrid_admin may not set credentials');
$node->safe_psql('postgres', "SELECT eventgrid.set_delivery_property('orders', 'refused', 'Authorization', 'Bearer static', true)");
like(sql_error($node, "SELECT eventgrid.set_oauth2_authentication('orders', 'refused', '$token_endpoint', 'c', 's')"),
	qr/55000.*has an Authorization delivery property/s, 'an Authorization delivery property excludes bearer tokens');
$node->safe_psql('postgres', "SELECT eventgrid.remove_delivery_property('orders', 'refused', 'Authorization')");
is(sql_error($node, "SELECT eventgrid.set_oauth2_authentication('orders', 'refused', '$token_endpoint', 'c', 's')", 'tok_admin'),
	'no error', 'eventgrid_admin sets OAuth 2.0 credentials');
like(sql_error($node, "SELECT eventgrid.set_delivery_property('orders', 'refused', 'authorization', 'x')"),
	qr/55000.*sends bearer tokens/s, 'and then an Authorization delivery property is refused');
like(sql_error($node, "SELECT * FROM eventgrid.delivery_authentications", 'tok_admin'),
	qr/permission denied.*event_subscription_authentication/s, 'the secrets are not readable by eventgrid_admin');
$node->safe_psql('postgres', "SELECT eventgrid.drop_event_subscription('orders', 'refused')");

# --- several token lifetimes: one token request per lifetime, shared
# (tokens of 3 s on a quiet machine, longer by EG_TEST_TIME_FACTOR: a token
# must outlive its way to a busy receiver; the publishing stretches alike)
my $ttl = int(scaled(3) + 0.5);
control("ttl/$ttl");
$node->safe_psql('postgres', qq{
	SELECT eventgrid.create_event_subscription('orders', 'shipping', '$hook/orders/events-api');
	SELECT eventgrid.create_event_subscription('orders', 'billing', '$hook/orders/events-api',
	                                           max_events_per_batch => 10);
	SELECT eventgrid.set_oauth2_authentication('orders', s, '$token_endpoint', 'orders', '$secret{orders}',
	                                           scope => 'events.write', audience => 'events-api')
	  FROM unnest(ARRAY['shipping', 'billing']) s;
});
my $started = time;
for my $round (0 .. 7)
{
	$node->safe_psql('postgres', "INSERT INTO eventgrid.events (topic, event) SELECT 'orders', jsonb_build_object("
		  . "'id', 'life-' || g, 'subject', '/orders/' || g, 'eventType', 'Shop.OrderCreated', 'eventTime', now(),"
		  . " 'data', jsonb_build_object('n', g), 'dataVersion', '1') FROM generate_series($round * 375 + 1, $round * 375 + 375) g");
	usleep(int(1_000_000 * $ttl / 3));
}
ok(wait_for_sql($node, "SELECT sum(delivered) FROM eventgrid.delivery_statistics WHERE subscription IN ('shipping', 'billing')",
	'6000', 120), 'the 3,000 events reached both subscriptions');
my $elapsed = time - $started;
my @reqs = received('/hook/orders/events-api');
my %got;
for my $r (grep { $_->{status} == 200 } @reqs) { $got{$_}++ for @{ $r->{ids} } }
is(scalar(grep { /^life-/ } keys %got), 3000, 'the receiver verified a token on the requests of every event');
# a request sent just before its token's refresh time may reach a busy receiver
# after the expiry (0.3 s later): refused, it is sent again with a new token
my @expired = grep { $_->{status} == 401 && ($_->{reason} // '') eq 'ERR_JWT_EXPIRED' } @reqs;
is(scalar(grep { $_->{status} != 200 && ($_->{reason} // '') ne 'ERR_JWT_EXPIRED' } @reqs), 0,
	'no request carried a token the receiver refused for its signature, client or audience (' . scalar(@expired)
	  . ' expired on the way)')
  or diag(explain([ grep { $_->{status} != 200 } @reqs ]));
# a new token that expired on the way is refused as a new token is: that 401 is the attempt's
# outcome, and the events go again by the retry schedule (the tokens here live $ttl s, so a busy
# machine sees this); every other event was delivered at its first attempt
my ($unauthorized, $not_first) = split / /, $node->safe_psql('postgres', q{
	WITH a AS (SELECT * FROM eventgrid.delivery_attempts WHERE subscription IN ('shipping', 'billing')),
	     refused AS (SELECT DISTINCT a.subscription, unnest(a.event_ids) AS id FROM a WHERE a.http_status = 401)
	SELECT (SELECT count(*) FROM a WHERE a.http_status = 401) || ' '
	    || (SELECT count(*) FROM a
	         WHERE (a.attempt > 1 OR a.outcome <> 'Delivered') AND a.http_status IS DISTINCT FROM 401
	           AND NOT EXISTS (SELECT 1 FROM refused r WHERE r.subscription = a.subscription AND r.id = ANY (a.event_ids)))});
is($not_first, '0', 'every event was delivered at its first attempt, but those refused with a token expired on the way');
cmp_ok($unauthorized, '<=', scalar(@expired), "each attempt charged a 401 ($unauthorized) is one the receiver refused as expired");
my @tok = token_requests('orders', 'events.write');
my %jtis = map { $_->{jti} => 1 } grep { $_->{status} == 200 } @reqs;
cmp_ok(scalar(@tok), '>=', 3, 'several token lifetimes passed (' . scalar(@tok) . " token requests in ${elapsed}s)");
cmp_ok(scalar(@tok), '<=', int($elapsed / (0.81 * $ttl)) + 2 + scalar(@expired),
	"one token request per lifetime ($ttl s tokens serve 90 %; the next is asked for from 81 % on), shared by both workers and subscriptions");
# (the last may have been asked for ahead, near the end, and not used yet)
ok(scalar(keys %jtis) == scalar(@tok) || scalar(keys %jtis) == scalar(@tok) - 1,
	'each token asked for was used (' . scalar(keys %jtis) . ' of ' . scalar(@tok) . ')');
is(scalar(grep { $_->{how} eq 'basic' && $_->{ok} && ($_->{audience} // '') eq 'events-api' && $_->{grant_type} eq 'client_credentials' } @tok),
	scalar(@tok), 'the client authenticated with HTTP Basic; grant_type, scope and audience in the form');

# --- the next token is asked for while the last still serves: with an event
# every 50 ms, the second token request comes before the first token's
# refresh time (6 s tokens serve 5.4 s; the next is asked for in the last
# 0.54 s), so no request waits for it (longer by EG_TEST_TIME_FACTOR)
my $ttl6 = int(scaled(6) + 0.5);
control("ttl/$ttl6");
$node->safe_psql('postgres', qq{
	SELECT eventgrid.create_topic('steady');
	SELECT eventgrid.create_event_subscription('steady', 'steady', '$hook/orders/events-api');
	SELECT eventgrid.set_oauth2_authentication('steady', 'steady', '$token_endpoint', 'orders', '$secret{orders}',
	                                           scope => 'steady.scope', audience => 'events-api');
});
$node->safe_psql('postgres', qq{
	DO \$\$ BEGIN FOR i IN 1 .. 140 LOOP
	    INSERT INTO eventgrid.events (topic, event) VALUES ('steady', jsonb_build_object('id', 'steady-' || i,
	        'subject', 's', 'eventType', 't', 'eventTime', now(), 'data', '{}'::jsonb, 'dataVersion', '1'));
	    COMMIT;
	    PERFORM pg_sleep(0.05 * $ttl6 / 6);
	END LOOP; END \$\$;
});
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'steady'", '140', 60),
	'a steady flow delivered');
my @steady = token_requests('orders', 'steady.scope');
cmp_ok(scalar(@steady), '>=', 2, 'over more than one token lifetime');
cmp_ok($steady[1]{t} - $steady[0]{t}, '<', 0.9 * $ttl6, 'the second token was asked for before the first stopped serving ('
	  . sprintf('%.2f', $steady[1]{t} - $steady[0]{t}) . ' s)');
is($node->safe_psql('postgres', "SELECT extract(epoch FROM token_serves_until - token_obtained_at) FROM eventgrid.event_subscription_authentication WHERE subscription = 'steady'"),
	sprintf('%.6f', 0.9 * $ttl6), "a token of $ttl6 s serves 90 %: expires_in less min(10 %, 60 s)");
$node->safe_psql('postgres', "SELECT eventgrid.drop_topic('steady')");

# --- a token the receiver revokes: dropped, the events sent again with a new one
control('ttl/3600');
$node->safe_psql('postgres', "SELECT eventgrid.drop_event_subscription('orders', 'billing')");
usleep($ttl * 1_000_000);    # the last token of $ttl s is gone
$node->safe_psql('postgres', "INSERT INTO eventgrid.events (topic, event) VALUES ('orders', '{\"id\": \"warm-up\", \"subject\": \"s\", \"eventType\": \"t\", \"eventTime\": \"2024-05-01T12:00:00Z\", \"data\": {}, \"dataVersion\": \"1\"}')");
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'shipping'", '3001', 60),
	'a token of an hour is taken');
# an hour's token serves until 60 s before its expiry (10 % would be 6 minutes)
is($node->safe_psql('postgres', "SELECT extract(epoch FROM token_expires_at - token_obtained_at) || ' ' || extract(epoch FROM token_serves_until - token_obtained_at) FROM eventgrid.event_subscription_authentication WHERE subscription = 'shipping'"),
	'3600.000000 3540.000000', 'a token of 3,600 s serves 3,540 s: expires_in less min(10 %, 60 s)');
my $before = token_requests('orders', 'events.write');
control('revoke-next');
$node->safe_psql('postgres', "INSERT INTO eventgrid.events (topic, event) SELECT 'orders', jsonb_build_object("
	  . "'id', 'revoked-' || g, 'subject', 's', 'eventType', 't', 'eventTime', now(), 'data', '{}'::jsonb, 'dataVersion', '1')"
	  . " FROM generate_series(1, 50) g");
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'shipping'", '3051', 60),
	'every event of the revoked token was delivered');
my @revoked = grep { ($_->{reason} // '') eq 'revoked' } received('/hook/orders/events-api');
cmp_ok(scalar(@revoked), '>=', 1, 'the receiver refused the revoked token (' . scalar(@revoked) . ' requests)');
is(scalar(token_requests('orders', 'events.write')), $before + 1, 'one new token was asked for');
is($node->safe_psql('postgres', "SELECT count(*) FROM eventgrid.delivery_attempts WHERE subscription = 'shipping' AND (attempt > 1 OR outcome <> 'Delivered')"),
	'0', 'the 401 to a token that was not new cost no attempt');

# --- an answer without expires_in: a token of 3,600 s
control('expires-in/off');
$node->safe_psql('postgres', qq{
	SELECT eventgrid.create_topic('no-expiry');
	SELECT eventgrid.create_event_subscription('no-expiry', 'no-expiry', '$hook/orders/events-api');
	SELECT eventgrid.set_oauth2_authentication('no-expiry', 'no-expiry', '$token_endpoint', 'orders', '$secret{orders}',
	                                           scope => 'no-expiry.scope', audience => 'events-api');
	INSERT INTO eventgrid.events (topic, event) VALUES ('no-expiry', '{"id": "no-expiry-1", "subject": "s", "eventType": "t",
	    "eventTime": "2024-05-01T12:00:00Z", "data": {}, "dataVersion": "1"}');
});
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'no-expiry'", '1', 60),
	'a token without expires_in serves');
is($node->safe_psql('postgres', "SELECT extract(epoch FROM token_expires_at - token_obtained_at) FROM eventgrid.event_subscription_authentication WHERE subscription = 'no-expiry'"),
	'3600.000000', 'for 3,600 s');
control('expires-in/on');
$node->safe_psql('postgres', "SELECT eventgrid.drop_topic('no-expiry')");

# --- a 401 to a new token is the outcome: Unauthorized, not retried
$node->safe_psql('postgres', qq{
	SELECT eventgrid.create_event_subscription('orders', 'elsewhere', '$hook/somebody-else');
	SELECT eventgrid.set_oauth2_authentication('orders', 'elsewhere', '$token_endpoint', 'orders', '$secret{orders}',
	                                           scope => 'other.scope');
	INSERT INTO eventgrid.events (topic, event) VALUES ('orders', '{"id": "unauth-1", "subject": "s", "eventType": "t",
	    "eventTime": "2024-05-01T12:00:00Z", "data": {}, "dataVersion": "1"}');
});
ok(wait_for_sql($node, "SELECT dropped FROM eventgrid.delivery_statistics WHERE subscription = 'elsewhere'", '1', 60),
	'a receiver refusing a new token: the event is dropped (no dead-lettering configured)');
is($node->safe_psql('postgres', "SELECT string_agg(attempt || ':' || outcome || ':' || http_status, ',') FROM eventgrid.delivery_attempts WHERE subscription = 'elsewhere'"),
	'1:Unauthorized:401', 'after one attempt with outcome Unauthorized, as SPEC 3 says');

# --- a token a receiver refused is dropped at once, even one new for the attempt:
# the next event's request carries a new token, never the refused one again
$node->safe_psql('postgres', qq{
	SELECT eventgrid.create_topic('refusing');
	SELECT eventgrid.create_event_subscription('refusing', 'refusing', '$hook/somebody-other');
	SELECT eventgrid.set_oauth2_authentication('refusing', 'refusing', '$token_endpoint', 'orders', '$secret{orders}',
	                                           scope => 'refusing.scope');
});
for my $n (1, 2)
{
	$node->safe_psql('postgres', qq{INSERT INTO eventgrid.events (topic, event) VALUES ('refusing', '{"id": "refused-$n",
		"subject": "s", "eventType": "t", "eventTime": "2024-05-01T12:00:00Z", "data": {}, "dataVersion": "1"}')});
	ok(wait_for_sql($node, "SELECT dropped FROM eventgrid.delivery_statistics WHERE subscription = 'refusing'", $n, 60),
		"refused-$n: dropped after its 401");
}
my @refused = received('/hook/somebody-other');
is(scalar(@refused), 2, 'one request for each event: the refused token was not sent again');
isnt($refused[0]{jti}, $refused[1]{jti}, 'each with a token of its own');
is(scalar(token_requests('orders', 'refusing.scope')), 2, 'two token requests');

# --- the token endpoint refuses the client; then it is down, and back
$node->safe_psql('postgres', qq{
	SELECT eventgrid.create_event_subscription('orders', 'bad-secret', '$hook/orders?case=bad-secret');
	SELECT eventgrid.set_oauth2_authentication('orders', 'bad-secret', '$token_endpoint', 'orders', 'not-the-secret-93xq',
	                                           scope => 'bad.scope');
	INSERT INTO eventgrid.events (topic, event) VALUES ('orders', '{"id": "bad-1", "subject": "s", "eventType": "t",
	    "eventTime": "2024-05-01T12:00:00Z", "data": {}, "dataVersion": "1"}');
});
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.delivery_attempts WHERE subscription = 'bad-secret'", '1', 60),
	'a client the token endpoint refuses: an attempt');
my ($outcome, $error) = split /\|/, $node->safe_psql('postgres',
	"SELECT outcome, error FROM eventgrid.delivery_attempts WHERE subscription = 'bad-secret'");
is($outcome, 'GenericError', 'with outcome GenericError');
like($error, qr{^token endpoint \Q$token_endpoint\E answered HTTP 401: invalid_client \(Client authentication failed for orders\)$},
	'its error says what the token endpoint answered');
is($node->safe_psql('postgres', "SELECT count(*) FROM eventgrid.retries r JOIN eventgrid.event_subscriptions s ON s.id = r.subscription_id WHERE s.name = 'bad-secret'"),
	'1', 'and it is retried on the schedule');

control('token-server/stop');
$node->safe_psql('postgres', qq{
	SELECT eventgrid.create_event_subscription('orders', 'down-and-back', '$hook/orders?case=down');
	SELECT eventgrid.set_oauth2_authentication('orders', 'down-and-back', '$token_endpoint', 'orders', '$secret{orders}',
	                                           scope => 'later');
	INSERT INTO eventgrid.events (topic, event) SELECT 'orders', jsonb_build_object('id', 'down-' || g, 'subject', 's',
	    'eventType', 't', 'eventTime', now(), 'data', '{}'::jsonb, 'dataVersion', '1') FROM generate_series(1, 3) g;
});
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.delivery_attempts WHERE subscription = 'down-and-back' AND outcome = 'GenericError' AND error LIKE 'token request to \%: Failed to connect%'",
	'3', 60), 'the token endpoint down: each event fails an attempt that says so');
is($node->safe_psql('postgres', "SELECT count(*) FROM eventgrid.delivery_attempts WHERE subscription = 'shipping' AND outcome <> 'Delivered'"),
	'0', 'other subscriptions, whose token serves, are not held up');
control('token-server/start');
usleep(1_200_000);           # attempts within 1 s of a failed token request fail with its error
advance_clock($node, 11);    # the first retry is due 10 s later
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'down-and-back'", '3', 60),
	'back: the retries are delivered with a token');
is($node->safe_psql('postgres', "SELECT string_agg(DISTINCT attempt || ':' || outcome, ',') FROM eventgrid.delivery_attempts WHERE subscription = 'down-and-back'"),
	'1:GenericError,2:Delivered', 'at their first retry');

# --- Microsoft Entra ID through eventgrid.entra_authority
$node->safe_psql('postgres', qq{
	SELECT eventgrid.create_event_subscription('orders', 'entra', '$hook/entra-app/api%3A%2F%2Feventgrid-test');
	SELECT eventgrid.set_entra_authentication('orders', 'entra', '$tenant', 'api://eventgrid-test', 'entra-app',
	                                          '$secret{"entra-app"}');
	INSERT INTO eventgrid.events (topic, event) SELECT 'orders', jsonb_build_object('id', 'entra-' || g, 'subject', 's',
	    'eventType', 't', 'eventTime', now(), 'data', '{}'::jsonb, 'dataVersion', '1') FROM generate_series(1, 5) g;
});
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'entra'", '5', 60),
	'Entra ID: delivered');
my @entra = token_requests('entra-app', 'api://eventgrid-test/.default');
is(scalar(@entra), 1, 'one token request, for scope {application ID URI}/.default');
is($entra[0]{how}, 'body', 'the client id and secret in the form, as Entra ID takes them');
is(scalar(grep { $_->{status} == 200 && $_->{aud} eq 'api://eventgrid-test' } received('/hook/entra-app/api%3A%2F%2Feventgrid-test')),
	5, 'each request carried a token for the application ID URI');
is($node->safe_psql('postgres', "SELECT method || ' ' || token_endpoint || ' ' || scope || ' ' || (token_expires_at > now()) FROM eventgrid.event_subscription_authentication WHERE subscription = 'entra'"),
	"entra https://127.0.0.1:$tport/$tenant/oauth2/v2.0/token api://eventgrid-test/.default true",
	'event_subscription_authentication shows the method, the token endpoint the authority makes, the scope and the token expiry');

# --- a validation handshake carries the token; credentials of their own, so
# that the upkeep worker asks for the token itself (a blocking request)
$node->safe_psql('postgres', qq{
	BEGIN;
	SELECT eventgrid.create_event_subscription('orders', 'validated', '$hook/orders?case=validated', endpoint_validation => 'handshake');
	SELECT eventgrid.set_oauth2_authentication('orders', 'validated', '$token_endpoint', 'orders', '$secret{orders}',
	                                           scope => 'handshake.scope', audience => 'events-api');
	COMMIT;
});
ok(wait_for_sql($node, "SELECT provisioning_state FROM eventgrid.event_subscription_validation WHERE subscription = 'validated'",
	'Succeeded', 60), 'the handshake succeeded');
is(scalar(grep { $_->{validation} && $_->{status} == 200 && $_->{client} eq 'orders' } received('/hook/orders?case=validated')), 1,
	'with a token the receiver verified');
is(join(',', map { "$_->{how}:$_->{ok}" } token_requests('orders', 'handshake.scope')), 'basic:1',
	'which the upkeep worker asked for, with HTTP Basic');

# --- a client certificate and a bearer token together: nginx demands the
# certificate (400 without), then passes the request to the receiver, which
# checks the token
my $mtls = PostgreSQL::Test::Cluster::get_free_port();
start_nginx($dir, <<"HTTP");
    log_format mtls '\$uri \$status "\$ssl_client_verify" "\$ssl_client_s_dn"';
    access_log $dir/access.log mtls;
    server { listen 127.0.0.1:$mtls ssl http2; ssl_certificate $dir/server.pem; ssl_certificate_key $dir/server.key;
             ssl_client_certificate $dir/server-ca.pem; ssl_verify_client on;
             location / { proxy_pass http://127.0.0.1:$rport; } }
HTTP
my ($cert, $key) = map { my $t = slurp_file("$dir/eventgrid-client.$_"); $t =~ s/'/''/g; $t } qw(pem key);
$node->safe_psql('postgres', qq{
	SELECT eventgrid.create_event_subscription('orders', 'both', 'https://127.0.0.1:$mtls/hook/orders/events-api',
	                                           max_events_per_batch => 5);
	SELECT eventgrid.set_client_certificate('orders', 'both', '$cert', '$key');
	SELECT eventgrid.set_oauth2_authentication('orders', 'both', '$token_endpoint', 'orders', '$secret{orders}',
	                                           scope => 'events.write', audience => 'events-api');
	INSERT INTO eventgrid.events (topic, event) SELECT 'orders', jsonb_build_object('id', 'both-' || g, 'subject', 's',
	    'eventType', 't', 'eventTime', now(), 'data', '{}'::jsonb, 'dataVersion', '1') FROM generate_series(1, 20) g;
});
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'both'", '20', 60),
	'a subscription with a client certificate and a bearer token is delivered through nginx demanding the certificate');
my @nginx = split /\n/, slurp_file("$dir/access.log");
cmp_ok(scalar(@nginx), '>=', 4, 'in ' . scalar(@nginx) . ' requests (batches of at most 5)');
# (the status may be another than 200 under load: a request libcurl gave
# up on after the response timeout is logged 499 and sent again)
my @unverified = grep { !/^\/hook\/orders\/events-api \d+ "SUCCESS" "CN=eventgrid-client"$/ } @nginx;
is(scalar(@unverified), 0, 'nginx verified the certificate on each') or diag(join("\n", @unverified));
my %both;
$both{$_}++ for map { @{ $_->{ids} } } grep { $_->{status} == 200 && grep { /^both-/ } @{ $_->{ids} } } received('/hook/orders/events-api');
is(scalar(keys %both), 20, 'and the receiver verified the token on each');

# --- remove_delivery_authentication(): no token from the next claim on
$node->safe_psql('postgres', qq{
	SELECT eventgrid.remove_delivery_authentication('orders', 'entra');
	INSERT INTO eventgrid.events (topic, event) VALUES ('orders', '{"id": "untokened", "subject": "s", "eventType": "t",
	    "eventTime": "2024-05-01T12:00:00Z", "data": {}, "dataVersion": "1"}');
});
ok(wait_for_sql($node, "SELECT dropped FROM eventgrid.delivery_statistics WHERE subscription = 'entra'", '1', 60),
	'removed: the next event goes without a token');
is((grep { ($_->{reason} // '') eq 'no bearer token' } received('/hook/entra-app/api%3A%2F%2Feventgrid-test'))[0]{ids}[0],
	'untokened', 'and the receiver saw none');

# --- metrics
my $metrics = $node->safe_psql('postgres', "SET ROLE pg_monitor; SELECT string_agg(client_id || ':' || (token_requests_total > 0) || ':' || (token_failures_total > 0), ',' ORDER BY client_id, token_failures_total) FROM eventgrid.delivery_token_metrics WHERE client_id = 'entra-app' OR token_failures_total > 0");
like($metrics, qr/^entra-app:true:false,orders:true:true/, 'delivery_token_metrics counts token requests and failures for pg_monitor');

# --- more subscriptions with credentials of their own than the two workers
# keep (1,024 each, least recently used out first): 2,100, so one worker
# meets more than it keeps in each round; a use of credentials no kept
# subscription names is freed once no claim's request may name it
$node->safe_psql('postgres', qq{
	SELECT eventgrid.create_topic('many');
	DO \$\$ BEGIN FOR i IN 1 .. 2100 LOOP
	  PERFORM eventgrid.create_event_subscription('many', 'sub-' || i, '$hook/many-' || i);
	  PERFORM eventgrid.set_oauth2_authentication('many', 'sub-' || i, '$token_endpoint', 'many-' || i, 'many-secret-' || i);
	END LOOP; END \$\$;
});
for my $round (1 .. 2)
{
	$node->safe_psql('postgres', "INSERT INTO eventgrid.events (topic, event) VALUES ('many', '{\"id\": \"many-$round\","
		  . " \"subject\": \"s\", \"eventType\": \"t\", \"eventTime\": \"2024-05-01T12:00:00Z\", \"data\": {}, \"dataVersion\": \"1\"}')");
	ok(wait_for_sql($node, "SELECT sum(delivered) FROM eventgrid.delivery_statistics WHERE topic = 'many'", 2100 * $round, 180),
		"round $round: each of 2,100 subscriptions delivered its event");
}
my %many;
for my $r (grep { $_->{path} =~ m{^/hook/many-\d+$} } jsonl('receiver.jsonl'))
{
	$many{ $r->{status} == 200 ? 'verified' : 'refused' }++;
}
is($many{refused} // 0, 0, 'no request carried a token of another client (the receiver checks the path\'s client)');
is($many{verified} // 0, 4200, 'each carried one of its own, in both rounds');
# 64 token slots in shared memory for 2,100 sets of credentials: a worker
# uses the token it asked for even when the slot is another's by then (it
# asked again and again when it only looked in the slot: 268,000 requests)
my $asked = grep { ($_->{client_id} // '') =~ /^many-/ } jsonl('token_requests.jsonl');
cmp_ok($asked, '<=', 2 * 2 * 2100, "at most one token request per client, worker and round ($asked)");
$node->safe_psql('postgres', "SELECT eventgrid.drop_topic('many')");

# --- a token endpoint that quotes the secret back, in each form the request sent it in
my $echo_secret = 'echo&secret=42/+x';
(my $echo_url = $echo_secret) =~ s/([^A-Za-z0-9\-._~])/sprintf('%%%02X', ord($1))/ge;
my %echo_forms = (plain => $echo_secret, url => $echo_url);
$node->safe_psql('postgres', "SELECT eventgrid.create_topic('echo')");
for my $form (qw(plain url basic))
{
	$node->safe_psql('postgres', qq{
		SELECT eventgrid.create_event_subscription('echo', 'echo-$form', '$hook/orders?case=echo');
		SELECT eventgrid.set_oauth2_authentication('echo', 'echo-$form', '$token_endpoint', 'echo-$form', '$echo_secret');
	});
}
$node->safe_psql('postgres', q{INSERT INTO eventgrid.events (topic, event) VALUES ('echo', '{"id": "echo-1",
	"subject": "s", "eventType": "t", "eventTime": "2024-05-01T12:00:00Z", "data": {}, "dataVersion": "1"}')});
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.delivery_attempts WHERE topic = 'echo'", '3', 60),
	'three clients whose token endpoint quotes their secret back: an attempt each');
is($node->safe_psql('postgres', "SELECT string_agg(DISTINCT error, ' / ') FROM eventgrid.delivery_attempts WHERE topic = 'echo'"),
	"token endpoint $token_endpoint answered HTTP 401 (its error text quoted the client secret: left out)",
	'the secret as sent, form-urlencoded, or in the Basic credentials\' base64: left out of each error');
my $basic_b64 = MIME::Base64::encode_base64("echo-basic:$echo_url", '');
$echo_forms{basic} = $basic_b64 =~ s/=+$//r;
my $echo_texts = join("\n", slurp_file($node->logfile),
	$node->safe_psql('postgres', "SELECT string_agg(coalesce(error, ''), ' ') FROM eventgrid.delivery_attempts"),
	$node->safe_psql('postgres', "SELECT string_agg(t::text, ' ') FROM eventgrid._delivery_tokens() t"));
is(join(' ', grep { index($echo_texts, $echo_forms{$_}) >= 0 } sort keys %echo_forms), '',
	'no form of the secret in the server log, the attempt history or _delivery_tokens()');

# --- secrets and tokens: nowhere
my @tokens = do { my %u = map { $_ => 1 } grep { /\S/ } split /\n/, slurp_file("$dir/tokens.txt"); keys %u };
cmp_ok(scalar(@tokens), '>=', 5, 'the receiver saw ' . scalar(@tokens) . ' tokens');
$node->command_ok([ 'pg_dump', '-f', "$dir/dump.sql", '-d', $node->connstr('postgres') ], 'pg_dump');
my $dump = slurp_file("$dir/dump.sql");
my $texts = join("\n",
	slurp_file($node->logfile),
	$node->safe_psql('postgres', "SELECT string_agg(coalesce(error, '') || coalesce(response_body, ''), ' ') FROM eventgrid.delivery_attempts"),
	$node->safe_psql('postgres', "SELECT string_agg(a::text, ' ') FROM eventgrid.event_subscription_authentication a"),
	$node->safe_psql('postgres', "SELECT string_agg(m::text, ' ') FROM eventgrid.delivery_token_metrics m"),
	$node->safe_psql('postgres', "SELECT string_agg(w::text, ' ') FROM eventgrid.worker_status w"));
is(scalar(grep { index($texts, $_) >= 0 } @tokens), 0, 'no token in the server log, attempt history or views');
is(scalar(grep { index($dump, $_) >= 0 } @tokens), 0, 'nor in a dump');
is(scalar(grep { index($texts, $_) >= 0 } values %secret, 'not-the-secret-93xq'), 0, 'no secret in the server log, attempt history or views');
like($dump, qr/\Q$secret{orders}\E/, 'pg_dump keeps the secret, as it keeps signing secrets');

# --- dump and restore: the restored database delivers with the credentials
$node->command_ok([ 'pg_dump', '-Fc', '-f', "$dir/dump.custom", '-d', $node->connstr('postgres') ], 'pg_dump -Fc');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'pg_restore', '-d', $node->connstr('restored'), "$dir/dump.custom" ], 'pg_restore');
is($node->safe_psql('restored', "SELECT string_agg(s.name || ':' || a.method || ':' || a.client_id || ':' || a.client_secret, ',' ORDER BY s.name) FROM eventgrid.delivery_authentications a JOIN eventgrid.event_subscriptions s ON s.id = a.subscription_id WHERE s.name IN ('shipping', 'validated')"),
	"shipping:oauth2:orders:$secret{orders},validated:oauth2:orders:$secret{orders}", 'the restored database has the credentials');
$node->safe_psql('restored', q{
	SELECT eventgrid.drop_event_subscription(s.topic, s.name) FROM eventgrid.event_subscriptions s WHERE s.name <> 'shipping';
	INSERT INTO eventgrid.events (topic, event) VALUES ('orders', '{"id": "restored-1", "subject": "s", "eventType": "t",
	    "eventTime": "2024-05-01T12:00:00Z", "data": {}, "dataVersion": "1"}');
});
my $restored = 0;
for (1 .. 600)
{
	$restored = grep { $_->{status} == 200 && $_->{ids}[0] eq 'restored-1' } received('/hook/orders/events-api');
	last if $restored;
	usleep(100_000);
}
is($restored, 1, 'the restored database delivers, with a token the receiver verified');

$oauth->kill_kill;
done_testing();
