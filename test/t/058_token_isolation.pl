# Bearer tokens isolated per database (issue "Trust, fourth pass", item 3):
# one database with 70 OAuth 2.0 event subscriptions, each with its own
# client of a token endpoint that accepts connections and never answers,
# holds more token requests in flight than the cluster keeps token slots
# (64); another database's subscription, whose token endpoint answers,
# still gets its token and its events at once (before, every slot was taken
# by a request in flight, which could not be reused, and the second
# database waited until those requests timed out).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use IO::Socket::INET;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $node = new_node('tokens', 'eventgrid.response_timeout' => "'20s'");
my $r = start_receiver();
my $u = $r->{url};

# a token endpoint that never answers: the kernel completes the connections, nobody reads them
my $hang = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => 0, Proto => 'tcp', Listen => 1024, ReuseAddr => 1)
  or die "listen: $!";
my $hang_url = 'http://127.0.0.1:' . $hang->sockport . '/token';
# one that answers with a token (the receiver answers a POST with the body it is told)
my $token_url = "$u/status/200/token?body="
  . ('{"access_token":"victim-token-1","token_type":"Bearer","expires_in":3600}' =~ s/([^A-Za-z0-9_.~-])/sprintf('%%%02X', ord $1)/ger);

sub sql { my ($db, $q) = @_; return $node->safe_psql($db, $q) }

sql('postgres', 'CREATE DATABASE hog');
sql('hog', 'CREATE EXTENSION eventgrid');
sql('hog', "SELECT eventgrid.create_topic('hogs')");
sql('hog', "SELECT eventgrid.create_event_subscription('hogs', 'hog-' || i, '$u/status/200/hog-' || i)"
	  . "  FROM generate_series(1, 70) i");
sql('hog', "SELECT eventgrid.set_oauth2_authentication('hogs', 'hog-' || i, '$hang_url', 'client-' || i, 'secret-' || i)"
	  . "  FROM generate_series(1, 70) i");
sql('postgres', "SELECT eventgrid.create_topic('orders')");
sql('postgres', "SELECT eventgrid.create_event_subscription('orders', 'victim', '$u/status/200/victim')");
sql('postgres', "SELECT eventgrid.set_oauth2_authentication('orders', 'victim', '$token_url', 'victim-client', 'victim-secret')");

# the hog's 70 token requests go out and hang
sql('hog', "SELECT eventgrid.publish('hogs', '" . eg_event('h1') . "')");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid._delivery_tokens() WHERE token_requests > 0 AND token_obtained_at IS NULL", '64', 30, 'hog'),
	'the database with hanging token endpoints has a token request in flight in each of the 64 slots');

# the other database: each event arrives at once, with its token
my @took;
for my $i (1 .. 5)
{
	my $t0 = time();
	sql('postgres', "SELECT eventgrid.publish('orders', '" . eg_event("v$i") . "')");
	my @got = wait_for_requests($r, '/status/200/victim', $i, 15);
	push @took, time() - $t0;
	last if @got < $i;
}
is(scalar(@took), 5, 'five events of the other database arrived');
my $worst = (sort { $b <=> $a } @took)[0];
ok($worst < 3, sprintf('each within 3 s of its commit (%s s) while the hog\'s token requests hang',
	join(', ', map { sprintf('%.2f', $_) } @took)));
my @req = requests($r, '/status/200/victim');
is($req[0]{headers}{Authorization} // $req[0]{headers}{authorization}, 'Bearer victim-token-1', 'with the token its own endpoint gave');
is(scalar(requests($r, '/status/200/token')), 1, 'fetched once');
is(scalar(grep { $_->{path} =~ m{^/status/200/hog-\d} } requests($r)), 0, 'the hog delivered nothing: no token came');

done_testing();
