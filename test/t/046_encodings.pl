# UTF-8 on the wire from databases of other encodings (issue "Trust, third
# pass", item 6):
#  - a LATIN1 database: an event whose data holds "é ü" reaches a receiver
#    as UTF-8 (the receiver decodes the body as UTF-8 and finds the two
#    characters, not replacement characters), labelled charset=utf-8; a
#    delivery property's value with "é" is sent as UTF-8 bytes; the
#    Standard Webhooks signature covers the UTF-8 body (the npm
#    standardwebhooks library verifies it);
#  - a SQL_ASCII database: valid UTF-8 is sent as it is; bytes that are not
#    UTF-8 are never sent under charset=utf-8: the delivery ends at once
#    with outcome InvalidEncoding (dead-lettered), logged, and the next
#    event is delivered; no worker crashes on it.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('encodings');
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;
my $verifier = "$FindBin::RealBin/../verifier/verify.js";

sub sql
{
	my ($db, $q, $client) = @_;
	return $node->safe_psql($db, "SET client_encoding = '" . ($client // 'UTF8') . "'; $q");
}

# An Event Grid event whose data.text is $bytes, as a byte string (JSON::PP
# would give a character string, written to psql in Perl's internal form)
sub byte_event
{
	my ($id, $bytes) = @_;
	return qq({"id": "$id", "subject": "/s/$id", "eventType": "T", "eventTime": "2024-05-01T12:00:00Z",)
	  . qq( "dataVersion": "1", "data": {"text": "$bytes"}});
}

# --- LATIN1
sql('postgres', "CREATE DATABASE latin ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
sql('latin', 'CREATE EXTENSION eventgrid');
sql('latin', "SELECT eventgrid.create_topic('top')");
sql('latin', "SELECT eventgrid.create_event_subscription('top', 'egs', '$u/status/200/latin-eg')");
sql('latin', "SELECT eventgrid.create_topic('cee', 'CloudEventSchemaV1_0')");
sql('latin', "SELECT eventgrid.create_event_subscription('cee', 'cee', '$u/status/200/latin-ce')");
sql('latin', "SELECT eventgrid.set_delivery_property('top', 'egs', 'X-Greeting', 'caf\xc3\xa9')");
my $secret = sql('latin', "SELECT eventgrid.set_signing_secret('top', 'egs')");
# the client sends UTF-8 bytes; the database stores LATIN1
sql('latin', "INSERT INTO eventgrid.events (topic, event) VALUES ('top', '" . byte_event('l-1', "\xc3\xa9 \xc3\xbc") . "')");
sql('latin', "INSERT INTO eventgrid.events (topic, event) VALUES ('cee', "
	  . "'{\"specversion\": \"1.0\", \"id\": \"c-1\", \"source\": \"/s\", \"type\": \"T\", \"data\": {\"text\": \"\xc3\xa9 \xc3\xbc\"}}')");
my ($eg) = wait_for_requests($r, '/status/200/latin-eg', 1, 20);
my ($ce) = wait_for_requests($r, '/status/200/latin-ce', 1, 20);
ok($eg && $ce, 'both events delivered from the LATIN1 database');
is($json->decode($eg->{body})->[0]{data}{text}, "\x{e9} \x{fc}", 'Event Grid schema: the body is UTF-8 and holds "é ü"');
is($json->decode($ce->{body})->{data}{text}, "\x{e9} \x{fc}", 'CloudEvents: the same');
like($eg->{headers}{'content-type'}, qr/charset=utf-8/, 'labelled charset=utf-8');
# (the receiver reads header bytes as ISO-8859-1: UTF-8's two bytes of é show as two characters)
is($eg->{headers}{'x-greeting'}, "caf\x{c3}\x{a9}", 'a delivery property with "é" is sent as UTF-8 bytes');
my ($out, $err) = ('', '');
IPC::Run::run([ 'node', $verifier, $secret, $r->{log}, '/status/200/latin-eg' ], '>', \$out, '2>', \$err)
  or die "node verify.js failed: $err";
is($out, "ok $eg->{headers}{'webhook-id'}\n", 'the signature covers the UTF-8 body (standardwebhooks verifies it)');

# --- SQL_ASCII
sql('postgres', "CREATE DATABASE bytes ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
sql('bytes', 'CREATE EXTENSION eventgrid', 'SQL_ASCII');
sql('bytes', "SELECT eventgrid.create_topic('top')", 'SQL_ASCII');
sql('bytes', "SELECT eventgrid.create_event_subscription('top', 'egs', '$u/status/200/bytes', deadletter => true)", 'SQL_ASCII');
sql('bytes', "INSERT INTO eventgrid.events (topic, event) VALUES ('top', '" . byte_event('b-1', "\xe9") . "')", 'SQL_ASCII');
sql('bytes', "INSERT INTO eventgrid.events (topic, event) VALUES ('top', '" . byte_event('b-2', "\xc3\xa9") . "')", 'SQL_ASCII');
my @got = wait_for_requests($r, '/status/200/bytes', 1, 20);
ok(wait_for_sql($node, "SELECT last_delivery_outcome || ' ' || delivery_attempts FROM eventgrid.dead_letters",
		'InvalidEncoding 0', 20, 'bytes'),
	'an event whose bytes are not UTF-8 is dead-lettered at once with outcome InvalidEncoding, no attempt made');
is(scalar(@got), 1, 'one request was sent');
is($json->decode($got[0]{body})->[0]{id}, 'b-2', 'for the valid UTF-8 event');
is($json->decode($got[0]{body})->[0]{data}{text}, "\x{e9}", 'as it was');
like(slurp_file($node->logfile), qr/was not sent: its body or a header value has no UTF-8 form/, 'the log says why');
# (a worker whose only deliveries ended unsent crashed in its first record:
# the endpoint table it swept had never been made)
unlike(slurp_file($node->logfile), qr/terminated by signal/, 'and no worker crashed');

$node->stop;
done_testing();
