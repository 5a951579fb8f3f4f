# The README's five-minute tutorial, as a user types it: its SQL block is
# read from README.md and run with the psql variable receiver set to this
# test's receiver (the demo's connect command sets it to the demo's), step
# by step (the "-- N." comments), checking after each step what the README
# says happens: delivered, failed and due again, dead-lettered, delivered
# again, the clock back to the real one; and pasted whole into another
# cluster, where its own waits must be enough.  If the README changes,
# this runs what it says now.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('tutorial');
my $r = start_receiver();
my $u = $r->{url};

my $readme = slurp_file("$FindBin::RealBin/../../README.md");
my ($block) = $readme =~ /^## Tutorial: five minutes\n.*?^```sql\n(.*?)^```\n/ms;
ok(defined $block, 'README.md has the tutorial\'s SQL block');
unlike($block, qr{127\.0\.0\.1:\d+}, 'the block names no port: the receiver comes from the psql variable');
my @steps = split /^(?=-- \d+\. )/m, $block;
is(scalar(@steps), 7, 'in seven steps');

sub step
{
	my ($n) = @_;
	my ($ret, $out, $err) = $node->psql('postgres', $steps[ $n - 1 ], extra_params => [ '-v', "receiver=$u" ]);
	is($ret . $err, '0', "step $n runs without an error");
	return $out;
}

sub attempts
{
	return $node->safe_psql('postgres',
		"SELECT string_agg(coalesce(http_status::text, '-') || ' ' || outcome, ', ' ORDER BY id)"
		  . " FROM eventgrid.delivery_attempts WHERE subscription = 'inbox'");
}

step(1);
step(2);
ok(wait_for_sql($node, "SELECT count(*) FROM eventgrid.delivery_attempts WHERE subscription = 'inbox'", '1'),
	'step 2: the event is delivered');
like(step(3), qr/^1\|200\|Delivered$/m, 'step 3 shows the attempt: 1, 200, Delivered');
is(scalar(requests($r, '/status/200/inbox')), 1, 'and the receiver got it');
step(4);
ok(wait_recorded($node, 'inbox', 1), 'step 4: the second event failed once and waits for a retry');
is(attempts(), '200 Delivered, 503 Busy', 'its attempt: 503, Busy');
step(5);
ok(wait_for_sql($node, "SELECT dead_letter_reason || ' ' || delivery_attempts FROM eventgrid.dead_letter_events",
		'MaxDeliveryAttemptsExceeded 2'), 'step 5: the second attempt failed too and the event is dead-lettered');
like(step(5), qr/MaxDeliveryAttemptsExceeded\|2\|Busy\|\{/, 'step 5\'s query shows the dead letter');
step(6);
ok(wait_for_sql($node, "SELECT delivered || ' ' || pending || ' ' || dead_lettered || ' ' || redelivered"
		  . " FROM eventgrid.delivery_statistics WHERE subscription = 'inbox'", '2 0 1 1'),
	'step 6: replayed and delivered: 2 delivered, 0 pending, as the README says');
is(scalar(requests($r, '/status/200/inbox')), 2, 'the receiver got both events');
step(7);
is($node->safe_psql('postgres', 'SHOW eventgrid.clock_offset'), '0', 'step 7: the clock offset is back to 0');

$node->stop;

# pasted whole: each step's own wait is enough for what the next one reads
my $whole = new_node('tutorial_whole');
my $r2 = start_receiver();
my ($ret, $out, $err) = $whole->psql('postgres', $block, extra_params => [ '-v', "receiver=$r2->{url}" ]);
is($ret . $err, '0', 'pasted whole, the block runs without an error');
like($out, qr/^1\|200\|Delivered$/m, 'pasted whole: step 3 shows the first event delivered');
like($out, qr/^1\|200\|Delivered\n1\|503\|Busy\n/m, 'pasted whole: step 4 shows the failed attempt');
like($out, qr/^MaxDeliveryAttemptsExceeded\|2\|Busy\|\{/m, 'pasted whole: step 5 shows the dead letter');
like($out, qr/^2\|0\|1\|1$/m, 'pasted whole: step 6 shows 2 delivered, 0 pending, 1 dead-lettered, 1 redelivered');
$whole->stop;
done_testing();
