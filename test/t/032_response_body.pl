# The body of a failed answer in the attempt history (issue "Receivers can
# verify and push back", item 5): delivery_attempts.response_body keeps its
# first 512 bytes, bytes outside printable ASCII as '?', so a user sees why
# a 500 failed; nothing for a success; the text never reaches the log.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('response_body');
my $r = start_receiver();
my $u = $r->{url};

sub sql { return $node->safe_psql('postgres', shift) }

sql("SELECT eventgrid.create_topic('answers')");
my %subs = (
	'why' => '/status/500/why?body=the%20database%20is%20down%0D%0Aretry%20later',
	'long' => '/status/503/long?body=long',
	'utf' => '/status/400/utf?body=caf%C3%A9',
	'fine' => '/status/200/fine?body=thanks',
	'empty' => '/status/500/empty');
for my $s (sort keys %subs)
{
	sql("SELECT eventgrid.create_event_subscription('answers', '$s', '$u$subs{$s}', subject_begins_with => '/$s')");
	sql("SELECT eventgrid.publish('answers', '" . eg_event("$s-1", subject => "/$s") . "')");
}
ok(wait_for_sql($node, "SELECT count(DISTINCT subscription) FROM eventgrid.delivery_attempts", '5', 30),
	'each subscription made an attempt');

sub body_of
{
	my ($sub) = @_;
	return sql("SELECT coalesce(response_body, '<NULL>') FROM eventgrid.delivery_attempts WHERE subscription = '$sub'"
		  . " ORDER BY id LIMIT 1");
}
is(body_of('why'), 'the database is down??retry later', 'a 500: its body, the line break as ??');
is(length(body_of('long')), 512, 'a 2,000-byte body: its first 512 bytes');
is(body_of('utf'), 'caf??', 'bytes outside printable ASCII as ?');
is(body_of('fine'), '<NULL>', 'a success keeps nothing');
is(body_of('empty'), '<NULL>', 'an empty body: NULL');
unlike(slurp_file($node->logfile), qr/the database is down/, 'the body is not in the server log');

$node->stop;
done_testing();
