# Standard Webhooks signatures (issue "Receivers can verify and push back",
# item 1): every request of a signed subscription carries webhook-id,
# webhook-timestamp and webhook-signature, and the Standard Webhooks
# reference library for JavaScript (npm standardwebhooks, test/verifier)
# verifies each one as a receiver would: a generated secret, retries and
# batches (stable ids), a rotation during which both keys sign, the
# previous key refused once the rotation ends, nothing signed once the
# secret is removed.  Secrets are shown masked, readable by no role, and
# copied by pg_dump.
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

my $node = new_node('signing');
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;
my $verifier = "$FindBin::RealBin/../verifier/verify.js";

sub sql { return $node->safe_psql('postgres', shift) }

sub fails { return sql_error($node, @_) }

# what the library says of each request to $path, verified with $secret
sub verified
{
	my ($secret, $path) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'node', $verifier, $secret, $r->{log}, $path ], '>', \$out, '2>', \$err)
	  or die "node verify.js failed: $err";
	return [ split /\n/, $out ];
}

sql("SELECT eventgrid.create_topic('signed')");
sql("SELECT eventgrid.create_event_subscription('signed', 'hooks', '$u/seq/500,200/hooks', subject_begins_with => '/hooks')");
sql("SELECT eventgrid.create_event_subscription('signed', 'batched', '$u/status/200/batched', subject_begins_with => '/batched',"
	  . " max_events_per_batch => 10)");
sql("SELECT eventgrid.create_event_subscription('signed', 'plain', '$u/status/200/plain', subject_begins_with => '/plain')");

# --- a generated secret
my $secret = sql("SELECT eventgrid.set_signing_secret('signed', 'hooks')");
like($secret, qr/^whsec_[A-Za-z0-9+\/]{43}=$/, 'a generated secret: whsec_ and the base64 of 32 bytes');
sql("SELECT eventgrid.set_delivery_property('signed', 'hooks', 'webhook-id', 'forged')");
sql("SELECT eventgrid.publish('signed', '" . eg_event('h-1', subject => '/hooks/1') . "')");
my @got = wait_for_requests($r, '/seq/500,200/hooks', 1);
advance_clock($node, 11);
@got = wait_for_requests($r, '/seq/500,200/hooks', 2);
is(scalar(@got), 2, 'the first attempt failed (500) and the retry was delivered');
is_deeply(verified($secret, '/seq/500,200/hooks'), [ ('ok ' . $got[0]{headers}{'webhook-id'}) x 2 ],
	'the library verifies both requests, which carry the same webhook-id');
like($got[0]{headers}{'webhook-id'}, qr/^msg_\d+_\d+$/, 'webhook-id: msg_, the subscription\'s id and the event\'s id in eventgrid.events');
like($got[0]{headers}{'webhook-timestamp'}, qr/^\d{10}$/, 'webhook-timestamp: Unix seconds');
ok(abs($got[1]{headers}{'webhook-timestamp'} - time()) < 60, 'of the real clock, not the workers\' (clock_offset)');
is($got[0]{headers}{'webhook-signature'} =~ tr/ //, 0, 'one signature');
like(join(' ', @{ verified('whsec_' . ('A' x 43) . '=', '/seq/500,200/hooks') }), qr/^fail No matching signature found fail/,
	'another key does not verify them');

# --- batches: one stable id for the batch's content
my $bsecret = sql("SELECT eventgrid.set_signing_secret('signed', 'batched', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw')");
is($bsecret, 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', 'a secret given is returned as it is');
sql("SELECT eventgrid.publish('signed', '[" . join(',', map { eg_event("b-$_", subject => "/batched/$_") } 1 .. 5) . "]')");
my @batch = wait_for_requests($r, '/status/200/batched', 1);
like(verified($bsecret, '/status/200/batched')->[0], qr/^ok msg_[0-9a-f]{32}$/,
	'a batch verifies, its webhook-id from the SHA-256 of its events\' ids');

# --- two signed subscriptions to one receiver: one message id per subscription
sql("SELECT eventgrid.create_event_subscription('signed', 'twin-a', '$u/status/200/twins', subject_begins_with => '/twins');"
	  . " SELECT eventgrid.create_event_subscription('signed', 'twin-b', '$u/status/200/twins', subject_begins_with => '/twins')");
my $tsecret = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
sql("SELECT eventgrid.set_signing_secret('signed', 'twin-a', '$tsecret'); SELECT eventgrid.set_signing_secret('signed', 'twin-b', '$tsecret')");
sql("SELECT eventgrid.publish('signed', '" . eg_event('t-1', subject => '/twins/1') . "')");
my @twins = wait_for_requests($r, '/status/200/twins', 2);
is(scalar(@twins), 2, 'twins: the event went to both subscriptions');
isnt($twins[0]{headers}{'webhook-id'}, $twins[1]{headers}{'webhook-id'},
	'twins: the two messages carry different webhook-ids, so a receiver that deduplicates keeps both');
is_deeply([ sort @{ verified($tsecret, '/status/200/twins') } ], [ sort map { "ok $_->{headers}{'webhook-id'}" } @twins ],
	'twins: both verify');
sql("SELECT eventgrid.drop_event_subscription('signed', 'twin-a'); SELECT eventgrid.drop_event_subscription('signed', 'twin-b')");

# --- two batching subscriptions with the same events: still one message id per subscription
sql("SELECT eventgrid.create_event_subscription('signed', 'btwin-a', '$u/status/200/btwins', subject_begins_with => '/btwins',"
	  . " max_events_per_batch => 10);"
	  . " SELECT eventgrid.create_event_subscription('signed', 'btwin-b', '$u/status/200/btwins', subject_begins_with => '/btwins',"
	  . " max_events_per_batch => 10)");
sql("SELECT eventgrid.set_signing_secret('signed', 'btwin-a', '$tsecret'); SELECT eventgrid.set_signing_secret('signed', 'btwin-b', '$tsecret')");
sql("SELECT eventgrid.publish('signed', '[" . join(',', map { eg_event("bt-$_", subject => "/btwins/$_") } 1 .. 3) . "]')");
my @btwins = wait_for_requests($r, '/status/200/btwins', 2);
is(join(' ', map { scalar @{ $json->decode($_->{body}) } } @btwins), '3 3', 'batched twins: each subscription got the three events in one batch');
isnt($btwins[0]{headers}{'webhook-id'}, $btwins[1]{headers}{'webhook-id'},
	'batched twins: the two batches of the same events carry different webhook-ids');
is_deeply([ sort @{ verified($tsecret, '/status/200/btwins') } ], [ sort map { "ok $_->{headers}{'webhook-id'}" } @btwins ],
	'batched twins: both verify');
sql("SELECT eventgrid.drop_event_subscription('signed', 'btwin-a'); SELECT eventgrid.drop_event_subscription('signed', 'btwin-b')");

# --- rotation: both keys sign while the previous one is valid
my $new = sql("SELECT eventgrid.set_signing_secret('signed', 'hooks', NULL, previous_valid_for => '1 hour')");
isnt($new, $secret, 'a new secret');
is(sql("SELECT concat_ws(' ', secret, previous_secret, previous_valid_until > now()) FROM eventgrid.event_subscription_signing"
		  . " WHERE subscription = 'hooks'"), '******** ******** t', 'the view shows both masked, and until when the old one signs');
sql("SELECT eventgrid.publish('signed', '" . eg_event('h-2', subject => '/hooks/2') . "')");
@got = wait_for_requests($r, '/seq/500,200/hooks', 3);
is($got[2]{headers}{'webhook-signature'} =~ tr/ //, 1, 'during the rotation: two signatures, space-separated');
is(verified($new, '/seq/500,200/hooks')->[2], "ok $got[2]{headers}{'webhook-id'}", 'the new key verifies the request');
is(verified($secret, '/seq/500,200/hooks')->[2], "ok $got[2]{headers}{'webhook-id'}", 'and so does the old one');

# --- the rotation over: only the new key
my $third = sql("SELECT eventgrid.set_signing_secret('signed', 'hooks', NULL)");
sql("SELECT eventgrid.publish('signed', '" . eg_event('h-3', subject => '/hooks/3') . "')");
@got = wait_for_requests($r, '/seq/500,200/hooks', 4);
is(verified($third, '/seq/500,200/hooks')->[3], "ok $got[3]{headers}{'webhook-id'}", 'replaced at once: the newest key verifies');
like(verified($new, '/seq/500,200/hooks')->[3], qr/^fail No matching signature found/, 'the one before does not');

# --- removed: nothing signed, and a custom webhook-id goes out again
sql("SELECT eventgrid.remove_signing_secret('signed', 'hooks')");
sql("SELECT eventgrid.publish('signed', '" . eg_event('h-4', subject => '/hooks/4') . "')");
@got = wait_for_requests($r, '/seq/500,200/hooks', 5);
ok(!defined $got[4]{headers}{'webhook-signature'}, 'after remove_signing_secret: no signature');
is($got[4]{headers}{'webhook-id'}, 'forged', 'a custom webhook-id is sent only to an unsigned subscription');
is($got[0]{headers}{'webhook-id'} =~ /^msg_/ ? 1 : 0, 1, 'while signed, the signature\'s own webhook-id replaced it');
like(verified($third, '/seq/500,200/hooks')->[4], qr/^fail Missing required headers/, 'the library refuses the unsigned request');
sql("SELECT eventgrid.publish('signed', '" . eg_event('p-1', subject => '/plain/1') . "')");
@got = wait_for_requests($r, '/status/200/plain', 1);
ok(!defined $got[0]{headers}{'webhook-signature'}, 'a subscription never signed sends no signature');

# --- the secrets: checked, masked, readable by nobody, copied by pg_dump
like(fails("SELECT eventgrid.set_signing_secret('signed', 'plain', 'whsec_c2hvcnQ=')"),
	qr/22023: invalid signing secret: the key must be 24 to 64 bytes, got 5/, 'a key of 5 bytes: 22023');
like(fails("SELECT eventgrid.set_signing_secret('signed', 'plain', 'hunter2-hunter2-hunter2-hunter2')"),
	qr/22023: invalid signing secret: a signing secret is "whsec_" followed by base64/, 'not whsec_: 22023');
unlike(fails("SELECT eventgrid.set_signing_secret('signed', 'plain', 'hunter2-hunter2-hunter2-hunter2')"), qr/hunter2.*hunter2.*hunter2.*hunter2/s,
	'the error does not repeat the secret');
like(fails("SELECT eventgrid.set_signing_secret('signed', 'plain', NULL, previous_valid_for => '-1 s')"),
	qr/22023: previous_valid_for must be between 0 and 30 days/, 'a negative previous_valid_for: 22023');
like(fails("SELECT eventgrid.remove_signing_secret('signed', 'plain')"), qr/42704: event subscription "plain" of topic "signed" has no signing secret/,
	'removing what is not there: 42704');
like(fails("SELECT eventgrid.set_signing_secret('signed', 'nope')"), qr/42704/, 'no such subscription: 42704');
sql("CREATE ROLE ops LOGIN IN ROLE eventgrid_admin; CREATE ROLE app LOGIN IN ROLE eventgrid_publisher");
like(fails("SELECT * FROM eventgrid.signing_secrets", 'ops'), qr/42501: permission denied for table signing_secrets/,
	'not even an admin reads the secrets table (42501)');
is($node->safe_psql('postgres', "SET ROLE ops; SELECT string_agg(subscription || ' ' || secret, ', ' ORDER BY subscription)"
		  . " FROM eventgrid.event_subscription_signing"), 'batched ********', 'an admin sees the signed subscriptions, masked');
like(fails("SELECT eventgrid.set_signing_secret('signed', 'plain')", 'app'), qr/42501: permission denied for function set_signing_secret/,
	'a publisher cannot set one (42501)');
my ($dump, $err) = ('', '');
IPC::Run::run([ 'pg_dump', '--data-only', '--table=eventgrid.signing_secrets', '-d', $node->connstr('postgres') ], '>', \$dump, '2>', \$err)
  or die "pg_dump: $err";
like($dump, qr/\Q$bsecret\E/, 'pg_dump copies the secrets (a configuration table of the extension)');
unlike(slurp_file($node->logfile), qr/\Q$secret\E|\Q$new\E|\Q$third\E/, 'no generated secret appears in the server log');

$node->stop;
done_testing();
