# Ordered delivery follows commit order, not event ids (issue "Trust, fifth
# pass", item 10: a key's next head chosen by event id instead of commit
# order passed every test).  One key: H's first attempt fails (500) and H
# waits for its retry as the key's head; then A is published (the lower
# event id) in a transaction that commits after B's, so both wait behind H,
# B before A.  H's retry succeeds, and the key's next head is B (the next in
# commit order), then A.  Chosen by event id, A would go before B.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use IPC::Run;
use JSON::PP qw(decode_json);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = new_node('ordered_commit');
my $r = start_receiver();
my $path = '/seq/500,200/ordered';
sub sql { return $node->safe_psql('postgres', shift) }

sql("SELECT eventgrid.create_topic('orders')");
sql("SELECT eventgrid.create_event_subscription('orders', 'ordered', '$r->{url}$path', ordering_key => 'subject')");
my ($h, $a, $b) = map { eg_event($_, subject => '/orders/k') } qw(H A B);

# H: its first attempt fails, and it waits for its retry as the key's head
sql("SELECT eventgrid.publish('orders', '$h')");
ok(wait_for_requests($r, $path, 1), "H's first attempt (500)");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries", '1'), 'H waits for its retry');
# A, in a transaction left open
my ($in, $out) = ('', '');
my $session = IPC::Run::start([ 'psql', '-X', '-q', '-At', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres') ],
	'<', \$in, '>', \$out, '2>', \my $err);
$in .= "BEGIN;\nSELECT 'published:' || eventgrid.publish('orders', '$a')::text;\n";
$session->pump until $out =~ /published:\{(\d+)\}/;
my $a_id = $1;
# then B, committed at once
my ($b_id) = sql("SELECT eventgrid.publish('orders', '$b')") =~ /(\d+)/;
cmp_ok($a_id, '<', $b_id, "A has the lower event id ($a_id < $b_id)");
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries", '2'), 'B waits behind H');
$in .= "COMMIT;\n";
$session->finish;
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries", '3'), 'and A, committed after B, behind them');
is(scalar(requests($r, $path)), 1, 'nothing else was sent meanwhile');

advance_clock($node, 15);
ok(wait_for_requests($r, $path, 4), "H's retry, then B and A");
is(join(',', map { decode_json($_->{body})->[0]{id} . ':' . $_->{status} } requests($r, $path)), 'H:500,H:200,B:200,A:200',
	'in commit order: H (failed, then delivered), B, then A');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.ordering_keys", '0'), 'the key is done');

$node->stop;
done_testing();
