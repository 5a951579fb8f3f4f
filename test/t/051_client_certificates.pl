# Client certificates (mutual TLS, SPEC 12): nginx on 127.0.0.1 demanding
# a client certificate from a CA that openssl makes here.
#
#  - set_client_certificate() refuses, with 22023 and without quoting them,
#    a certificate or key that does not parse, an encrypted key (an empty
#    passphrase too), a key that is not the certificate's, an expired
#    certificate; 22004 NULL, 42704 no such
#    subscription; only eventgrid_admin may call it, and not even
#    eventgrid_admin can read the stored key;
#  - a subscription with a certificate the receiver trusts is delivered
#    (nginx logs the certificate's subject), one by one and in batches; one
#    without a certificate, or with one from a CA the receiver does not
#    trust, gets nginx's 400 on the same host at the same time (no TLS
#    session or connection made with another certificate serves it);
#  - a key stored with an empty passphrase (as 0.14.0 accepted) is used
#    without a crash;
#  - a certificate set after a failed attempt is presented by the retry, and
#    one removed is no longer presented;
#  - the key is in no log line, view or attempt history; pg_dump keeps it
#    and a restored database delivers with it;
#  - a certificate that expires within 7 days is warned about in the log.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $dir = PostgreSQL::Test::Utils::tempdir;

# --- three CAs: the server's, the clients' (which nginx trusts) and a stranger's
make_ca($dir, $_, 30) for qw(server-ca client-ca stranger-ca);
issue_certificate($dir, 'server-ca', 'server', 'IP:127.0.0.1', '-days', '30');
issue_certificate($dir, 'client-ca', 'alice', undef, '-days', '3');    # expires within 7 days: warned about
issue_certificate($dir, 'client-ca', 'carol', undef, '-days', '30');
issue_certificate($dir, 'stranger-ca', 'mallory', undef, '-days', '30');
issue_certificate($dir, 'client-ca', 'expired', undef, '-startdate', '20200101000000Z', '-enddate', '20200102000000Z');

# --- nginx: one port that demands a trusted client certificate (400
# otherwise), one that asks for one and answers 503 without it
my ($strict, $optional) = map { PostgreSQL::Test::Cluster::get_free_port() } 1 .. 2;
my $receiver = start_receiver();    # answers validation handshakes, behind nginx
start_nginx($dir, <<"HTTP");
    log_format mtls '\$server_port \$uri \$status "\$ssl_client_verify" "\$ssl_client_s_dn" \$ssl_session_reused';
    access_log $dir/access.log mtls;
    ssl_certificate $dir/server.pem;
    ssl_certificate_key $dir/server.key;
    ssl_client_certificate $dir/client-ca.pem;
    ssl_session_cache shared:mtls:1m;
    server { listen 127.0.0.1:$strict ssl http2; ssl_verify_client on; location / { return 204; } }
    server { listen 127.0.0.1:$optional ssl; ssl_verify_client optional;
             location / { if (\$ssl_client_verify != SUCCESS) { return 503; } return 204; }
             location /validate/ { if (\$ssl_client_verify != SUCCESS) { return 503; }
                                   proxy_pass http://127.0.0.1:$receiver->{port}; } }
HTTP

# the requests nginx logged: [port, uri, status, verify, subject]
sub logged
{
	return () unless -f "$dir/access.log";
	return map { /^(\d+) (\S+) (\d+) "([^"]*)" "([^"]*)"/ ? [ $1, $2, $3, $4, $5 ] : () }
	  split /\n/, slurp_file("$dir/access.log");
}

# Statements are not logged (a failing one's text would be, as PostgreSQL
# does: the README says how to pass a key), so that any key text in the
# log would be eventgrid's doing.
my $node = new_node('mtls', 'eventgrid.ssl_ca_file' => "'$dir/server-ca.pem'",
	log_statement => "'none'", log_min_error_statement => 'panic');
sub sql { return $node->safe_psql('postgres', shift) }
sub pem { my $t = slurp_file("$dir/$_[0]"); $t =~ s/'/''/g; return "'$t'" }

sql("SELECT eventgrid.create_topic('mtls')");
sql("SELECT eventgrid.create_event_subscription('mtls', 'alice', 'https://127.0.0.1:$strict/alice')");
sql("SELECT eventgrid.create_event_subscription('mtls', 'batched', 'https://127.0.0.1:$strict/batched', max_events_per_batch => 10)");
sql("SELECT eventgrid.create_event_subscription('mtls', 'none', 'https://127.0.0.1:$strict/none')");
sql("SELECT eventgrid.create_event_subscription('mtls', 'mallory', 'https://127.0.0.1:$strict/mallory')");
sql("SELECT eventgrid.create_topic('mtls-late')");
sql("SELECT eventgrid.create_event_subscription('mtls-late', 'late', 'https://127.0.0.1:$optional/late')");
sql("SELECT eventgrid.pause_delivery('mtls')");

# --- refusals ----------------------------------------------------------------
my $err = sql_error($node, "SELECT eventgrid.set_client_certificate('mtls', 'alice', " . pem('alice.pem') . ", " . pem('carol.key') . ")");
like($err, qr/22023.*private_key does not belong to the certificate/, 'a key that is not the certificate\'s: 22023');
my ($alice_line) = grep { /^[A-Za-z0-9+\/]{40,}$/ } split /\n/, slurp_file("$dir/alice.pem");
my ($carol_key_line) = grep { /^[A-Za-z0-9+\/]{40,}$/ } split /\n/, slurp_file("$dir/carol.key");
ok(index($err, $alice_line) < 0 && index($err, $carol_key_line) < 0, 'the refusal quotes neither text');
like(sql_error($node, "SELECT eventgrid.set_client_certificate('mtls', 'alice', 'not a certificate', " . pem('alice.key') . ")"),
	qr/22023.*certificate is not a PEM certificate/, 'a certificate that does not parse: 22023');
like(sql_error($node, "SELECT eventgrid.set_client_certificate('mtls', 'alice', " . pem('alice.pem') . ", 'not a key')"),
	qr/22023.*private_key is not an unencrypted PEM private key/, 'a key that does not parse: 22023');
# an encrypted key, even with an empty passphrase: libcurl would ask for a password
for my $pass ('', 'secret')
{
	system("openssl pkey -in $dir/alice.key -aes256 -passout pass:$pass -out $dir/alice-encrypted.key") == 0
	  or die 'openssl pkey';
	like(sql_error($node, "SELECT eventgrid.set_client_certificate('mtls', 'alice', " . pem('alice.pem') . ", " . pem('alice-encrypted.key') . ")"),
		qr/22023.*private_key is encrypted: it must have no passphrase, not even an empty one/,
		"a key encrypted with " . ($pass eq '' ? 'an empty passphrase' : 'a passphrase') . ': 22023');
}
like(sql_error($node, "SELECT eventgrid.set_client_certificate('mtls', 'alice', " . pem('expired.pem') . ", " . pem('expired.key') . ")"),
	qr/22023.*certificate expired at 2020-01-02/, 'an expired certificate: 22023, with its expiry');
like(sql_error($node, "SELECT eventgrid.set_client_certificate('mtls', 'alice', NULL, " . pem('alice.key') . ")"),
	qr/22004/, 'NULL: 22004');
like(sql_error($node, "SELECT eventgrid.set_client_certificate('mtls', 'nobody', " . pem('alice.pem') . ", " . pem('alice.key') . ")"),
	qr/42704/, 'no such subscription: 42704');
like(sql_error($node, "SELECT eventgrid.remove_client_certificate('mtls', 'alice')"), qr/42704.*has no client certificate/,
	'removing a certificate that is not there: 42704');
sql("CREATE ROLE admin LOGIN IN ROLE eventgrid_admin; CREATE ROLE somebody LOGIN");
like(sql_error($node, "SELECT eventgrid.set_client_certificate('mtls', 'alice', " . pem('alice.pem') . ", " . pem('alice.key') . ")", 'somebody'),
	qr/42501/, 'a role without eventgrid_admin may not set one');
is(sql_error($node, "SELECT eventgrid.set_client_certificate('mtls', 'alice', " . pem('alice.pem') . ", " . pem('alice.key') . ")", 'admin'),
	'no error', 'eventgrid_admin sets one');
like(sql_error($node, "SELECT private_key FROM eventgrid.client_certificates", 'admin'), qr/42501/,
	'not even eventgrid_admin reads the stored key');
sql("SELECT eventgrid.set_client_certificate('mtls', 'batched', " . pem('carol.pem') . ", " . pem('carol.key') . ")");
sql("SELECT eventgrid.set_client_certificate('mtls', 'mallory', " . pem('mallory.pem') . ", " . pem('mallory.key') . ")");
is(sql("SELECT string_agg(subscription || ' ' || subject || ' ' || expires_within_7_days, ', ' ORDER BY subscription)"
	  . " FROM eventgrid.event_subscription_certificates"),
	'alice CN=alice true, batched CN=carol false, mallory CN=mallory false',
	'event_subscription_certificates: subject (RFC 2253) and whether it expires within 7 days');

# --- delivery ----------------------------------------------------------------
sql("INSERT INTO eventgrid.events (topic, event) SELECT 'mtls', jsonb_build_object('id', 'e-' || i,"
	  . " 'subject', '/s', 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z') FROM generate_series(1, 50) i");
sql("SELECT eventgrid.resume_delivery('mtls')");
ok(wait_for_sql($node, "SELECT sum(delivered) FILTER (WHERE subscription IN ('alice', 'batched')) || ' '"
	  . " || sum(dead_lettered + dropped) FILTER (WHERE subscription IN ('none', 'mallory'))"
	  . " FROM eventgrid.delivery_statistics WHERE topic = 'mtls'", '100 100'),
	'trusted certificates delivered every event; no certificate and an untrusted one: nothing');
my @got = logged();
# a request nginx answered whose answer libcurl did not read is a failed
# attempt, sent again (at least once, README "HTTPS"): counted here
my $alice_failed = sql("SELECT failed_attempts FROM eventgrid.delivery_statistics WHERE subscription = 'alice'");
my $alice_ok = scalar(grep { $_->[1] eq '/alice' && $_->[2] eq '204' && $_->[3] eq 'SUCCESS' && $_->[4] eq 'CN=alice' } @got);
ok($alice_ok >= 50 && $alice_ok <= 50 + $alice_failed,
	"alice: 50 requests (at most $alice_failed more, sent again after a failed attempt), each verified with her certificate")
  or diag("$alice_ok requests, $alice_failed failed attempts");
is(scalar(grep { $_->[1] eq '/alice' && ($_->[2] ne '204' || $_->[4] ne 'CN=alice') } @got), 0,
	'alice: no request without her certificate');
my @batches = grep { $_->[1] eq '/batched' } @got;
ok(@batches >= 5 && @batches < 50 && !grep({ $_->[2] ne '204' || $_->[4] ne 'CN=carol' } @batches),
	'batched: batches of up to 10, each with carol\'s certificate') or diag(scalar(@batches) . ' batches');
is(scalar(grep { $_->[1] eq '/none' && $_->[2] eq '400' && $_->[3] eq 'NONE' } @got), 50,
	'no certificate on the same host at the same time: nginx\'s 400, 50 times');
is(scalar(grep { $_->[1] eq '/mallory' && $_->[2] eq '400' && $_->[3] =~ /^FAILED/ } @got), 50,
	'a certificate from a CA nginx does not trust: 400, 50 times');
like(sql("SELECT outcome || ' ' || http_status FROM eventgrid.delivery_attempts WHERE subscription = 'none' LIMIT 1"),
	qr/^BadRequest 400$/, 'the attempt history says what the receiver answered');

# --- a key stored with an empty passphrase (0.14.0 took one) crashes nothing ----
# (an attack on 0.14.0 saw the delivery worker die with SIGSEGV here, libcurl's
# password callback given no password; not reproduced with libcurl 7.88 or
# 8.23, the worker now always gives libcurl an empty one)
system("openssl pkey -in $dir/alice.key -aes256 -passout pass: -out $dir/alice-empty.key") == 0 or die 'openssl pkey';
# (one transaction: no worker ever sees the key set_client_certificate() stored)
sql("BEGIN; SELECT eventgrid.create_topic('mtls-legacy');"
	  . " SELECT eventgrid.create_event_subscription('mtls-legacy', 'legacy', 'https://127.0.0.1:$strict/legacy');"
	  . " SELECT eventgrid.set_client_certificate('mtls-legacy', 'legacy', " . pem('alice.pem') . ", " . pem('alice.key') . ");"
	  . " UPDATE eventgrid.client_certificates SET private_key = " . pem('alice-empty.key')
	  . " WHERE subscription_id = (SELECT id FROM eventgrid.event_subscriptions WHERE name = 'legacy'); COMMIT");
my $started = sql("SELECT pg_postmaster_start_time()");
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('mtls-legacy', '" . eg_event('legacy-1') . "')");
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'legacy'", '1'),
	'a stored key with an empty passphrase: delivered with it');
is(sql("SELECT pg_postmaster_start_time()"), $started, 'and the cluster did not restart');
unlike(slurp_file($node->logfile), qr/terminated by signal/, 'no process died');
ok((grep { $_->[1] eq '/legacy' && $_->[2] eq '204' && $_->[4] eq 'CN=alice' } logged()), 'nginx saw alice\'s certificate');

# --- set after a failed attempt, then removed -----------------------------------
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('mtls-late', '" . eg_event('late-1') . "')");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries r JOIN eventgrid.event_subscriptions s ON s.id = r.subscription_id"
	  . " WHERE s.name = 'late' AND r.attempts = 1 AND r.lease_owner IS NULL", '1'), 'late: the first attempt failed (503)');
sql("SELECT eventgrid.set_client_certificate('mtls-late', 'late', " . pem('carol.pem') . ", " . pem('carol.key') . ")");
advance_clock($node, 60);
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'late'", '1'),
	'the retry presents the certificate set since');
sql("SELECT eventgrid.remove_client_certificate('mtls-late', 'late')");
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('mtls-late', '" . eg_event('late-2') . "')");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries r JOIN eventgrid.event_subscriptions s ON s.id = r.subscription_id"
	  . " WHERE s.name = 'late' AND r.attempts = 1 AND r.lease_owner IS NULL", '1'), 'removed: the next event goes without it (503)');
is(join(' ', map { "$_->[2]:$_->[3]" } grep { $_->[1] eq '/late' } logged()), '503:NONE 204:SUCCESS 503:NONE',
	'late: without, with, without');

# --- a validation handshake presents it too ------------------------------------
sql("BEGIN; SELECT eventgrid.create_event_subscription('mtls-late', 'shake', 'https://127.0.0.1:$optional/validate/auto/shake',"
	  . " endpoint_validation => 'handshake');"
	  . " SELECT eventgrid.set_client_certificate('mtls-late', 'shake', " . pem('carol.pem') . ", " . pem('carol.key') . "); COMMIT");
ok(wait_for_sql($node, "SELECT provisioning_state FROM eventgrid.event_subscription_validation WHERE subscription = 'shake'",
		'Succeeded', 60), 'the handshake presented the certificate and the subscription is validated');
is(join(' ', map { "$_->[2]:$_->[3]" } grep { $_->[1] =~ m{^/validate/} } logged()), '200:SUCCESS',
	'one handshake request, verified');

# --- secrets stay secret -------------------------------------------------------
my ($key_line) = grep { /^[A-Za-z0-9+\/]{40,}$/ } split /\n/, slurp_file("$dir/alice.key");
my $log = slurp_file($node->logfile);
ok(index($log, $key_line) < 0, 'no part of the key in the server log');
ok(index(sql("SELECT string_agg(coalesce(error, '') || coalesce(response_body, ''), '') FROM eventgrid.delivery_attempts"),
		$key_line) < 0, 'nor in the attempt history');
$node->restart;
ok(wait_for_sql($node, "SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'eventgrid upkeep worker'", 't'),
	'the upkeep worker runs again');
my $warned = 0;
for (1 .. 100)
{
	$warned = slurp_file($node->logfile) =~ /WARNING:  eventgrid: the client certificate of event subscription "alice" of topic "mtls" expires at [^\n]*\n[^\n]*HINT:  Give it a new certificate with eventgrid.set_client_certificate\(\)/;
	last if $warned;
	select(undef, undef, undef, 0.1);
}
ok($warned, 'a certificate that expires within 7 days is warned about, with a hint');
unlike(slurp_file($node->logfile), qr/"batched" of topic "mtls" expires/, 'one that expires later is not');

# --- more subscriptions with certificates than a worker keeps (1,024, least
# recently used out first): each evicted one is loaded again when named
sql("SELECT eventgrid.create_topic('mtls-many')");
sql("DO \$\$ BEGIN FOR i IN 1 .. 1100 LOOP"
	  . " PERFORM eventgrid.create_event_subscription('mtls-many', 'sub-' || i, 'https://127.0.0.1:$strict/many/' || i);"
	  . " PERFORM eventgrid.set_client_certificate('mtls-many', 'sub-' || i,"
	  . "   CASE WHEN i % 2 = 0 THEN " . pem('alice.pem') . " ELSE " . pem('carol.pem') . " END,"
	  . "   CASE WHEN i % 2 = 0 THEN " . pem('alice.key') . " ELSE " . pem('carol.key') . " END);"
	  . " END LOOP; END \$\$");
for my $round (1 .. 2)
{
	sql("INSERT INTO eventgrid.events (topic, event) VALUES ('mtls-many', '" . eg_event("many-$round") . "')");
	ok(wait_for_sql($node, "SELECT sum(delivered) FROM eventgrid.delivery_statistics WHERE topic = 'mtls-many'",
			1100 * $round, 120), "round $round: each of 1,100 subscriptions delivered its event");
}
my %many;
for (grep { $_->[1] =~ m{^/many/(\d+)$} && $_->[2] eq '204' } logged())
{
	my ($i) = $_->[1] =~ m{(\d+)$};
	$many{ $_->[4] eq ($i % 2 ? 'CN=carol' : 'CN=alice') ? 'right' : 'wrong' }++;
}
is($many{wrong} // 0, 0, 'no request went with another subscription\'s certificate');
cmp_ok($many{right} // 0, '>=', 2200, 'each went with its own, in both rounds');
sql("SELECT eventgrid.drop_topic('mtls-many')");

# --- pg_dump keeps it; the restored database delivers with it -------------------
my $dump = "$dir/mtls.dump";
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('postgres') ], 'pg_dump');
sql("CREATE DATABASE restored");
$node->command_ok([ 'pg_restore', '-d', $node->connstr('restored'), $dump ], 'pg_restore');
is($node->safe_psql('restored', "SELECT count(*) FROM eventgrid.client_certificates WHERE private_key LIKE '-----BEGIN PRIVATE KEY-----%'"),
	'4', 'the certificates and keys are restored');
$node->safe_psql('restored', "SELECT eventgrid.update_event_subscription('mtls', 'alice', endpoint => 'https://127.0.0.1:$strict/restored')");
$node->safe_psql('restored', "INSERT INTO eventgrid.events (topic, event) VALUES ('mtls', '" . eg_event('restored-1') . "')");
ok(wait_for_sql($node, "SELECT delivered FROM eventgrid.delivery_statistics WHERE subscription = 'alice'", '51', 60, 'restored'),
	'the restored database delivers with the restored certificate');
ok((grep { $_->[1] eq '/restored' && $_->[2] eq '204' && $_->[4] eq 'CN=alice' } logged()),
	'nginx saw alice\'s certificate');

$node->stop;
done_testing();
