# Ordered delivery under late answers (issue "Trust, fourth pass", item 7):
# the receiver (test/ordered_receiver.py, late_first_ms) answers the first
# request of each key only after the response timeout, so that request
# counts as TimedOut although the receiver took its event.  Each key must
# then arrive as 1, 1, 2, 3, ... by first arrivals: the event again (at
# least once), and never a later event of its key before it.  Six
# keys of ten events (six timeouts: fewer than the ten in a row that put an
# endpoint on probation), single events and batches, two delivery workers.
# And commit order, not id order, within a key while its head fails: while
# a key's first event fails, a transaction that took a smaller event id
# commits after one that took a larger; once the failing event is
# dead-lettered the two arrive in commit order (an audit's planted defect,
# the promotion choosing by event id, left one of them waiting for ever).
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use HTTP::Tiny;
use IPC::Run;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('late', 'eventgrid.delivery_workers' => 2, 'eventgrid.response_timeout' => "'1s'",
	'eventgrid.retry_jitter_percent' => 0);
sub sql { return $node->safe_psql('postgres', shift) }
# a receiver each (endpoint health is per host and port: twelve timeouts to one would put it on probation)
my %url = map { $_ => start_python_server('ordered_receiver.py', undef)->{url} } qw(single batched commit);
# what the receiver of path $p saw; {} until its first request arrived
sub report { my $p = shift; return decode_json(HTTP::Tiny->new->get("$url{$p}/report")->{content})->{"/$p"} // {} }

sql("SELECT eventgrid.create_topic('orders')");
sql("SELECT eventgrid.create_event_subscription('orders', 'single', '$url{single}/single?key=data.k&seq=data.seq&late_first_ms=2500',"
	  . " ordering_key => 'data.k')");
sql("SELECT eventgrid.create_event_subscription('orders', 'batched', '$url{batched}/batched?key=data.k&seq=data.seq&late_first_ms=2500',"
	  . " ordering_key => 'data.k', max_events_per_batch => 4)");
# ten keys, ten events each, published in three transactions interleaving the keys
for my $part ([ 1, 3 ], [ 4, 7 ], [ 8, 10 ])
{
	sql("SELECT eventgrid.publish('orders', jsonb_agg(jsonb_build_object('id', 'k' || k || '-' || n, 'subject', '/o',"
		  . " 'eventType', 'Shop.Order', 'eventTime', '2024-05-01T12:00:00Z', 'data', jsonb_build_object('k', 'k' || k, 'seq', n))"
		  . " ORDER BY n, k)) FROM generate_series(1, 6) k, generate_series($part->[0], $part->[1]) n");
}
my $want = join(',', 1 .. 10);
for my $path ('single', 'batched')
{
	my $done = 0;
	for (1 .. 1200)
	{
		my $keys = report($path)->{keys} // {};
		$done = grep { my @s = @{ $keys->{"k$_"} // [] }; @s && $s[-1] == 10 } 1 .. 6;
		last if $done == 6;
		select(undef, undef, undef, 0.1);
	}
	is($done, 6, "$path: every key's last event arrived")
	  or diag(sql("SELECT string_agg(format('%s %s attempts %s next %s', event_id, last_outcome, attempts, next_attempt_at), '; ')"
			  . " FROM eventgrid.retries"));
	my $keys = report($path)->{keys};
	my @bad;
	my $again = 0;
	for my $k (map { "k$_" } 1 .. 6)
	{
		my @seen = @{ $keys->{$k} // [] };
		my %first;
		my @once = grep { !$first{$_}++ } @seen;
		$again += @seen - @once;
		push @bad, "$k: " . join(',', @seen) if join(',', @once) ne $want;
	}
	is(join('; ', @bad), '', "$path: each key in order by first arrivals");
	cmp_ok($again, '>=', 6, "$path: each key's late first answer made its first request come again ($again events twice)");
	is(report($path)->{overlaps}, 0, "$path: never two requests of one key in flight");
}

# --- commit order within a key while its head fails
sql("SELECT eventgrid.create_event_subscription('orders', 'commit-order', '$url{commit}/commit?key=data.k&seq=data.seq',"
	  . " ordering_key => 'data.k', max_delivery_attempts => 2, deadletter => true)");
sub keyed
{
	my ($k, $seq, $fail) = @_;
	return "jsonb_build_object('id', 'c-$seq', 'subject', '/o', 'eventType', 'Shop.Order', 'eventTime', '2024-05-01T12:00:00Z',"
	  . " 'data', jsonb_build_object('k', '$k', 'seq', $seq, 'fail', $fail))";
}
sql("SELECT eventgrid.publish('orders', " . keyed('x', 0, 'true') . ")");
ok(wait_for_sql($node, "SELECT attempts FROM eventgrid.retries r JOIN eventgrid.event_subscriptions s ON s.id = r.subscription_id"
		  . " WHERE s.name = 'commit-order'", '1'), 'the head of key x failed once and waits for its retry');
# the first transaction takes the smaller event id and commits last
my ($in, $out, $err) = ("BEGIN;\nINSERT INTO eventgrid.events (topic, event) VALUES ('orders', " . keyed('x', 2, 'false')
	  . ") RETURNING id;\n", '', '');
my $t1 = IPC::Run::start([ 'psql', '-X', '-At', '-d', $node->connstr('postgres') ], '<', \$in, '>', \$out, '2>', \$err);
$t1->pump until $out =~ /^\d+$/m || !$t1->pumpable;
my ($smaller) = $out =~ /^(\d+)$/m;
my ($larger) = sql("SELECT eventgrid.publish('orders', " . keyed('x', 1, 'false') . ")") =~ /(\d+)/;
ok(defined $smaller && $larger > $smaller, "the later commit took the larger event id ($larger > " . ($smaller // '?') . ')');
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.retries r JOIN eventgrid.event_subscriptions s ON s.id = r.subscription_id"
		  . " WHERE s.name = 'commit-order'", '2'), 'the committed one waits behind the failing head');
$in .= "COMMIT;\n";
$t1->finish;
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.dead_letters WHERE subscription_name = 'commit-order'", '1', 60),
	'the head is dead-lettered after its two attempts');
my $got = '';
for (1 .. 300)
{
	$got = join(',', @{ report('commit')->{keys}{x} // [] });
	last if $got eq '1,2';
	select(undef, undef, undef, 0.1);
}
is($got, '1,2', 'then the two arrive in commit order: the larger id first, the smaller id after it');

done_testing();
